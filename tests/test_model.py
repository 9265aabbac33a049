"""The rate model's predictions against real (tiny) trials, and the strategy
skipping what it predicts clearly below the incumbent."""

import optuna
import pytest

from autotune.decide import model
from autotune.knobs import pytorch_defaults
from autotune.decide.strategy import Strategy
from autotune.trial.runner import run_trial

# a fixed cost per step: overhead-bound, and steady while other work loads the host
WINDOW = {
    "workload": {"factory": "tests.workloads:make_sleepy"},
    "warmup_steps": 2,
    "measure_steps": 20,
    "min_window_s": 1.0,
    "max_window_s": 2.0,
    "profile_steps": 0,
}
BASE = {**pytorch_defaults(8), "num_threads": 1}


@pytest.fixture(scope="module")
def diagnosed():
    """A diagnosed trial: its knobs and the rates it measured apart."""
    return BASE, model.rates_of(run_trial({**WINDOW, "knobs": BASE}).metrics)


def test_the_model_predicts_a_batch_change_from_the_measured_rates(diagnosed):
    knobs, rates = diagnosed
    assert rates["compute_ceiling_samples_per_s"] > 0 and rates["batch2x_step_ratio"] > 0
    point = {**knobs, "batch_size": 16}
    guess = model.predict(point, [diagnosed])
    measured = run_trial({**WINDOW, "knobs": point, "diagnose": False}).metrics["samples_per_s"]
    error = guess["samples_per_s"] / measured - 1
    print(f"batch 8 -> 16: predicted {guess['samples_per_s']:.1f}, measured {measured:.1f} samples/s ({error:+.0%})")
    assert abs(error) < 0.25  # a doubling from the probe's own doubling
    assert model.predict(knobs, [diagnosed])["samples_per_s"] == pytest.approx(rates["samples_per_s"])  # calibrated


def test_the_model_says_nothing_of_knobs_it_does_not_model(diagnosed):
    knobs, _ = diagnosed
    # compute-side knobs no diagnosed trial ran, and knobs outside the model (never assumed free)
    for other in (
        {"precision": "bf16-mixed"},
        {"activation_checkpointing": True},
        {"ddp_bucket_cap_mb": 1},
        {"pin_memory": not knobs["pin_memory"]},
    ):
        assert model.predict({**knobs, **other}, [diagnosed]) is None, other
        assert model.predict({**knobs, **other, "batch_size": 16}, [diagnosed]) is None, other
    assert model.predict({**knobs, "batch_size": 16}, [(knobs, {**diagnosed[1], "batch2x_step_ratio": None})]) is None


def test_the_strategy_skips_a_point_predicted_clearly_below_the_incumbent(diagnosed):
    knobs, rates = diagnosed
    search = {"batch_size": [1, 8, 16], "num_threads": [1]}
    study = optuna.create_study(direction="maximize")
    strategy = Strategy(study, search, {"batch_size": 8, "num_threads": 1})
    base = strategy.ask()
    assert base.source == "baseline"
    # the baseline is diagnosed overhead-bound: a larger batch first; the model predicts batch 1 far below
    strategy.tell(
        base.trial, "ok", rates["samples_per_s"], diagnosis={"bottleneck": "overhead"}, attrs={"rates": rates}
    )
    nxt = strategy.ask()
    assert nxt.params["batch_size"] == 16 and nxt.predicted > rates["samples_per_s"]  # its prediction goes along
    strategy.tell(nxt.trial, "ok", rates["samples_per_s"] * 0.9)  # no gain: the climb's last move is a rung down
    assert strategy.ask() is None  # batch 1, predicted far below: not run, and nothing is left
    skipped = [t for t in study.trials if str(t.user_attrs.get("error", "")).startswith("skipped: predicted")]
    assert [t.params["batch_size"] for t in skipped] == [1]
    assert skipped[0].user_attrs["predicted"] < model.SKIP_BELOW * rates["samples_per_s"]
    named = strategy.skipped_predicted()  # what the search keeps in search.json and the report names
    assert [(s["config"]["batch_size"], s["predicted"]) for s in named] == [(1, skipped[0].user_attrs["predicted"])]


def test_the_model_error_is_measured_over_predicted():
    e = model.error([(1, 100.0, 110.0), (2, 100.0, 70.0), (3, 100.0, 95.0), (4, None, 50.0)])
    assert e["trials"] == 3 and e["median_abs_error"] == pytest.approx(0.1)
    assert e["worst_trial"] == 2 and e["worst_error"] == pytest.approx(-0.3)


def test_the_climb_runs_the_move_the_model_predicts_fastest_first(diagnosed):
    """Two next moves: the diagnosis names loader workers first, the model
    predicts the larger batch faster (a fixed cost per step): v2 runs the
    batch first, and its real trial records the prediction beside the
    measurement."""
    knobs, rates = diagnosed
    search = {"num_workers": [0, 1], "batch_size": [8, 16], "num_threads": [1]}
    study = optuna.create_study(direction="maximize")
    strategy = Strategy(study, search, {"num_workers": 0, "batch_size": 8, "num_threads": 1})
    base = strategy.ask()
    strategy.tell(
        base.trial,
        "ok",
        rates["samples_per_s"],
        attrs={"rates": rates},
        diagnosis={"bottleneck": "input", "moves": [{"knob": "num_workers", "to": "up"}]},
    )
    ranked = strategy.ask()
    workers = strategy.predicted({"num_workers": 1, "batch_size": 8, "num_threads": 1})[
        "samples_per_s"
    ]  # the diagnosis's
    assert ranked.params == {"num_workers": 0, "batch_size": 16, "num_threads": 1} and ranked.predicted > workers
    result = run_trial(
        {**WINDOW, "knobs": {**knobs, **ranked.params}, "diagnose": False, "predicted": ranked.predicted}
    )
    m = result.metrics
    assert result.status == "ok" and m["predicted_samples_per_s"] == ranked.predicted
    print(
        f"the model's pick: predicted {ranked.predicted:.1f}, measured {m['samples_per_s']:.1f} samples/s; "
        f"workers=1 predicted {workers:.1f}"
    )


# what jpeg_pipeline's baseline measured apart on 2 CPUs (fp32, batch 64): compute ceiling, one worker's rate
JPEG = {
    "compute_ceiling_samples_per_s": 160.0,
    "loader_samples_per_s_per_worker": 230.0,
    "batch2x_step_ratio": 2.0,
    "host_cpus_per_gpu": 2.0,
}
NO_WORKERS = {"num_workers": 0, "batch_size": 64, "num_threads": None}


def test_on_a_cpu_the_workers_share_the_cores_with_the_compute():
    taking_turns = 1 / (1 / 160 + 1 / 230)
    ref = (NO_WORKERS, {**JPEG, "samples_per_s": taking_turns})  # calibrated on itself: x1
    one = {**NO_WORKERS, "num_workers": 1}
    assert model.predict(one, [ref])["samples_per_s"] == pytest.approx(160)  # a GPU's host: they overlap
    # two threads of compute (2/160 core-seconds a sample) and the worker (1/230) on 2 cores
    assert model.predict(one, [ref], shared=True)["samples_per_s"] == pytest.approx(2 / (2 / 160 + 1 / 230))
    one_thread = {**NO_WORKERS, "num_threads": 1}  # the compute leaves a core to the worker: they overlap again
    ref1 = (one_thread, {**JPEG, "samples_per_s": taking_turns})
    assert model.predict({**one_thread, "num_workers": 1}, [ref1], shared=True)["samples_per_s"] == pytest.approx(160)
    assert model.predict(NO_WORKERS, [ref], shared=True)["samples_per_s"] == pytest.approx(taking_turns)


def test_a_prediction_across_the_workers_line_is_corrected_by_what_such_predictions_missed():
    ref = (NO_WORKERS, {**JPEG, "samples_per_s": 1 / (1 / 160 + 1 / 230)})
    one, two = {**NO_WORKERS, "num_workers": 1}, {**NO_WORKERS, "num_workers": 2, "batch_size": 128}
    shares = model.predict(one, [ref], shared=True)["samples_per_s"]
    measured = [ref, (one, {"samples_per_s": 0.6 * shares})]  # one worker measured 40% below the shares
    guess = model.predict(two, measured, shared=True)
    assert guess["samples_per_s"] == pytest.approx(0.6 * model.predict(two, [ref], shared=True)["samples_per_s"])
    assert guess["from"] == NO_WORKERS
    plain = model.predict(
        two, measured, shared=True, learn=False
    )  # scripts/bench/bench_model.py's "before": uncorrected
    assert plain["samples_per_s"] == pytest.approx(model.predict(two, [ref], shared=True)["samples_per_s"])
    # the other way round: a config without workers, from a diagnosed one with them, by what such a prediction missed
    with_workers = ({**one, "batch_size": 32}, {**JPEG, "samples_per_s": 100.0})
    small = {**NO_WORKERS, "batch_size": 32}
    said = model.predict(small, [with_workers], shared=True)["samples_per_s"]
    plain = model.predict(NO_WORKERS, [with_workers], shared=True)["samples_per_s"]
    corrected = model.predict(NO_WORKERS, [with_workers, (small, {"samples_per_s": 1.3 * said})], shared=True)
    assert corrected["samples_per_s"] == pytest.approx(1.3 * plain) and corrected["from"] == with_workers[0]
    assert model.predict(NO_WORKERS, [with_workers, ref], shared=True)["from"] == NO_WORKERS  # the nearest says it


def test_a_batch_is_predicted_from_the_diagnosed_trial_at_the_closest_batch():
    """The H200 classic search (fp32, 8 workers, gpu_normalize): batch 1024 predicted from
    batch 64's probe, compounded four doublings, said 9932 samples/s; it measured 5354. Batch
    512's own probe (ratio 1.99: the GPU saturated) says 5469."""
    gpu = {"loader_samples_per_s_per_worker": 4000.0, "host_cpus_per_gpu": 16.0}
    at = {b: {"num_workers": 8, "batch_size": b} for b in (64, 512, 1024)}
    measured = [
        (
            at[64],
            {**gpu, "compute_ceiling_samples_per_s": 4121.0, "batch2x_step_ratio": 1.616, "samples_per_s": 4231.0},
        ),
        (
            at[512],
            {**gpu, "compute_ceiling_samples_per_s": 5530.0, "batch2x_step_ratio": 1.986, "samples_per_s": 5431.0},
        ),
    ]
    guess = model.predict(at[1024], measured)
    assert guess["from"] == at[512] and guess["samples_per_s"] == pytest.approx(5431 * 2 / 1.986)
    assert model.predict(at[1024], measured[:1])["samples_per_s"] > 9000  # from 64 alone: the overshoot
