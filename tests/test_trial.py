"""One trial, in process and as `python -m autotune.trial`."""

import json
import subprocess
import sys

import pytest

from autotune import stats
from autotune.trial import measure as M
from autotune.knobs import pytorch_defaults
from autotune.trial.result import TrialResult
from autotune.trial.runner import TrialConfigError, check_config, run_trial

TINY = {
    "workload": {"name": "tiny_cnn"},
    "warmup_steps": 2,
    "measure_steps": 5,
    "min_window_s": 0.2,
    "max_window_s": 1.0,
    "profile_steps": 2,
}


def test_a_trial_reports_measured_metrics():
    result = run_trial({**TINY, "knobs": {"batch_size": 16, "num_threads": 1}})
    assert result.status == "ok", result
    m = result.metrics
    assert result.knobs["batch_size"] == 16 and result.device.torch_threads == 1
    assert m["window_steps"] >= 5 and m["window_s"] >= 0.2
    # the window's numbers agree with each other
    assert m["samples_per_s"] == pytest.approx(16 * m["window_steps"] / m["window_s"])
    assert m["step_ms_mean"] == pytest.approx(1e3 / m["steps_per_s"])
    assert m["step_ms_p50"] <= m["step_ms_p95"]
    assert 0 <= m["data_wait_frac"] < 1 and m["step_time_cv"] >= 0
    # precise enough, or the cap. The rule decides on every step the window records, the last one included (its
    # end is read again microseconds later, when the window closes)
    assert m["step_mean_ci95"] <= 1.01 * 0.02 or m["window_s"] >= 1.0
    # GPU-only fields are absent on a CPU, not zero; the process's peak RSS is measured on a CPU too, and the
    # allocator's bytes in use at their peak (a memory window of their own): above what the step adds
    assert 0.01 < m["mem_rss_peak_gib"] < 16 and 0 < m["mem_inuse_step_gib"] < m["mem_inuse_peak_gib"] < 16
    assert not {
        k
        for k in m
        if k.startswith(("gpu_", "mem_", "tensor_core", "breakdown_kernel", "h2d", "mfu"))
        and k not in ("mem_rss_peak_gib", "mem_inuse_peak_gib", "mem_inuse_step_gib")
    }
    # profiled window, FLOPs, 2x-batch probe and diagnosis
    assert set(result.profile["breakdown"]) == {"dataloader", "cpu_exec", "other"}
    assert 0 <= m["dataloader_frac"] <= 1 and m["cpu_compute_op_frac"] > 0
    assert m["flops_per_sample"] > 0 and m["achieved_tflops"] > 0 and m["batch2x_step_ratio"] > 0
    assert result.diagnosis["bottleneck"] in {"input", "overhead", "memory", "compute"}
    assert 0 < m["first_step_s"] < result.trial_s  # time to first step: imports, model, loader, compile
    # where the trial's seconds went, phase by phase, within its own time
    phases = result.phases_s
    assert list(phases) == ["setup", "warmup", "window", "profile", "two_sides", "flops", "probe"]
    assert min(phases.values()) >= 0 and sum(phases.values()) <= result.trial_s + 1e-3  # each rounded to 0.1 ms
    assert phases["window"] >= m["window_s"] and phases["warmup"] == pytest.approx(m["warmup_s"], abs=0.05)


def test_a_trial_clearly_below_prune_below_stops_early_and_skips_the_rest():
    config = {
        **TINY,
        "knobs": {"batch_size": 16, "num_threads": 1},
        "min_window_s": 2.0,
        "max_window_s": 4.0,
        "measure_steps": 20,
    }
    fast = run_trial({**config, "prune_below": 1.0})  # far below anything: a complete trial
    assert fast.status == "ok" and fast.metrics["window_s"] >= 2.0
    slow = run_trial({**config, "prune_below": 1e9})
    assert slow.status == "pruned"
    assert slow.metrics["samples_per_s"] > 0 and slow.metrics["window_s"] < 2.0  # measured, but cut short
    assert slow.profile is None and slow.diagnosis is None and slow.parity is None


def test_a_trial_that_cannot_become_the_incumbent_pays_for_its_window_alone(tmp_path):
    base = {**pytorch_defaults(16), "num_threads": 1}
    config = {**TINY, "knobs": {**base, "precision": "bf16-mixed"}, "parity": {"baseline": base, "steps": 4}}
    below = run_trial({**config, "incumbent_above": 1e9})
    assert below.status == "ok" and below.metrics["samples_per_s"] > 0
    assert below.profile is None and below.diagnosis is None and below.parity is None
    assert "does not beat" in below.skipped
    above = run_trial({**config, "incumbent_above": 1.0, "profile_steps": 0, "max_window_s": 5.0})  # a new incumbent:
    assert above.diagnosis["bottleneck"] and above.parity["passed"] and above.skipped is None  # diagnosed, checked
    # clearly above (a lead of thousands of times): its window stopped once its mean was known to a quarter of its
    # lead, capped at +-GAP_CI_CAP (promoted), not +-target_ci: the CI the rule decided on is the one recorded
    assert above.metrics["promoted"] == 1 and above.metrics["step_mean_ci95"] <= 1.01 * stats.GAP_CI_CAP
    assert below.metrics.get("screened") == 1 and "promoted" not in below.metrics
    assert above.phases_s["parity"] >= above.metrics["parity_s"] * 0.99 and "window" in below.phases_s
    late = run_trial({**config, "parity_only": True})  # the late check: parity alone, no window
    assert late.status == "ok" and late.parity["passed"] and "samples_per_s" not in late.metrics


def test_a_config_differing_in_loader_knobs_alone_is_diagnosed_from_the_trial_that_measured_its_compute_side():
    from autotune.trial.diagnose import APART

    base = {**pytorch_defaults(16), "num_threads": 1}
    first = run_trial({**TINY, "knobs": base})
    apart = {k: v for k, v in first.metrics.items() if k in APART}
    assert {"compute_ceiling_samples_per_s", "loader_samples_per_s_per_worker", "batch2x_step_ratio"} <= set(apart)
    moved = run_trial({**TINY, "knobs": {**base, "num_workers": 1}, "carry": {"trial": 7, "metrics": apart}})
    m = moved.metrics
    assert moved.status == "ok" and moved.diagnosis["bottleneck"] in {"input", "overhead", "memory", "compute"}
    assert all(m[k] == v for k, v in apart.items()) and m["apart_from_trial"] == 7  # taken, not measured again
    assert any("trial #7's" in line for line in moved.diagnosis["evidence"])
    assert moved.profile is None and not {"profile", "two_sides"} & set(moved.phases_s)
    assert m["data_wait_frac"] >= 0 and m["flops_per_sample"] == first.metrics["flops_per_sample"]  # its own window
    with pytest.raises(TrialConfigError, match="`carry` must be null or"):
        check_config({**TINY, "carry": {"trial": 7, "metrics": {"x": "fast"}}})


def test_on_a_cpu_an_eager_warm_up_ends_by_time_after_two_steps():
    config = {
        **TINY,
        "knobs": {"batch_size": 16, "num_threads": 1},
        "warmup_steps": 5,
        "profile_steps": 0,
        "diagnose": False,
    }
    assert run_trial(config).metrics["warmup_steps_run"] == 5  # the runner's default: steps
    assert run_trial({**config, "warmup_min_s": 0.0}).metrics["warmup_steps_run"] == 2  # warm once it ran this long
    assert run_trial({**config, "warmup_min_s": 60.0}).metrics["warmup_steps_run"] == 5  # never more than the steps


def test_a_loader_fed_window_starts_once_the_loaders_queue_has_turned_over():
    """2 workers x 4 batches made ahead while the first step takes 0.5 s: a window that started after 2 warm-up
    steps took 6 ready batches at once and read more than the loader can make (at most 2 workers / (4 samples x
    10 ms) = 200 samples/s; measured 267-278 in a 20-step window). The warm-up takes the queue first, and the
    window reads the loader's rate (194-202)."""
    config = {
        **TINY,
        "workload": {"factory": "tests.workloads:make_slow_reads", "args": {"read_s": 0.01, "first_step_s": 0.5}},
        "knobs": {"batch_size": 4, "num_workers": 2, "prefetch_factor": 4, "num_threads": 1},
        "warmup_min_s": 0.0,  # warm by time after 2 steps, were it not for the queue
        "target_ci": 0.5,  # a short window: 20 steps
        "diagnose": False,
        "profile_steps": 0,
    }
    m = run_trial(config).metrics
    assert m["warmup_steps_run"] == 8  # = M.loader_queue: 2 workers x 4
    assert m["samples_per_s"] <= 1.15 * 200, m
    assert M.queue_batches(2, None) == 4 and M.queue_batches(0, 4) == 0  # torch's default prefetch: 2


def test_the_trace_is_saved_where_asked(tmp_path):
    result = run_trial({**TINY, "trace_path": str(tmp_path / "trace.json"), "diagnose": False})
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert sum(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"]) == 2
    assert result.profile["profiled_steps"] == 2 and result.diagnosis is None


def test_loader_workers_are_not_limited_by_the_torch_threads():
    result = run_trial({**TINY, "knobs": {"num_workers": 2, "num_threads": 1}, "diagnose": False, "profile_steps": 0})
    assert result.status == "ok", result.error
    assert result.device.torch_threads == 1 and result.device.cpus >= 2


def test_the_workload_batch_size_is_the_default():
    assert run_trial(TINY).knobs["batch_size"] == 32


def test_a_failing_workload_is_a_result_with_the_error():
    result = run_trial({**TINY, "workload": {"factory": "tests.workloads:make_failing"}})
    assert result.status == "error"
    assert result.error_type == "ValueError"
    assert "Expected input batch_size" in result.error


def test_a_knob_that_cannot_apply_here_is_refused():
    result = run_trial({**TINY, "knobs": {"precision": "16-mixed"}, "device": "cpu"})
    assert result.status == "error"
    assert (
        result.error
        == "knobs.precision='16-mixed' cannot apply on cpu: fp16 mixed precision with GradScaler needs a CUDA device"
    )


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {**TINY, "knobs": {"warp": 1}},
            "unknown knob `warp`; knobs are: num_workers, pin_memory, prefetch_factor, "
            "persistent_workers, num_threads, batch_size, precision, channels_last, "
            "cudnn_benchmark, compile, set_to_none, fused_optimizer, attention, padding_free, packing, "
            "liger_kernels, float8, ddp_bucket_cap_mb, ddp_gradient_as_bucket_view, ddp_static_graph, sharding, "
            "fsdp_reshard_after_forward, activation_checkpointing, expandable_segments (workload arguments go in "
            "workload.args)",
        ),
        (
            {**TINY, "knobs": {"precision": "fp8"}},
            "knobs.precision: 'fp8' is not allowed: expected one of 32-true | tf32 | bf16-mixed | 16-mixed",
        ),
        ({**TINY, "knobs": {"num_workers": "2"}}, "knobs.num_workers: '2' is not allowed: expected int"),
        ({**TINY, "knobs": {"batch_size": 0}}, "knobs.batch_size: 0 is not allowed: must be >= 1"),
        (
            {**TINY, "knobs": {"prefetch_factor": 4}},
            "knobs cannot run together: prefetch_factor=4: needs loader workers (num_workers > 0)",
        ),
        (
            {**TINY, "knobs": {"persistent_workers": True, "num_workers": 0}},
            "knobs cannot run together: persistent_workers=True: needs loader workers (num_workers > 0)",
        ),
        (
            {"workload": {}},
            "`workload` must be an object with `name` (built-in), `factory` (pkg.module:fn), `file` "
            "(a pickled factory, relative to the config's dir) or `command` (your program), "
            "and optional `args`",
        ),
        (
            {**TINY, "steps": 3},
            "unknown trial config keys ['steps']; allowed: workload, knobs, warmup_steps, warmup_min_s, measure_steps, "
            "min_window_s, target_ci, max_window_s, profile_steps, trace_path, diagnose, accum_steps, parity, "
            "prune_below, incumbent_above, incumbent_ci, predicted, carry, tie_keeps_incumbent, incumbent_trial, parity_only, flops_cache, device, seed, ranks, backend, "
            "dist_timeout_s, blocks, memory_limit_gib",
        ),
        ({**TINY, "prune_below": 0}, "`prune_below` must be null or samples/s > 0, got 0"),
        ({**TINY, "warmup_min_s": "1s"}, "`warmup_min_s` must be null or seconds >= 0, got '1s'"),
        ({**TINY, "incumbent_above": -1}, "`incumbent_above` must be null or samples/s > 0, got -1"),
        ({**TINY, "parity_only": True}, "`parity_only` needs `parity` (the baseline and its steps)"),
        ({**TINY, "profile_steps": -1}, "`profile_steps` must be an int >= 0, got -1"),
        ({**TINY, "target_ci": "tight"}, "`target_ci` must be a number >= 0, got 'tight'"),
        ({**TINY, "incumbent_ci": -0.1}, "`incumbent_ci` must be a number >= 0, got -0.1"),
    ],
)
def test_bad_trial_configs(config, message):
    with pytest.raises(TrialConfigError) as e:
        check_config(config)
    assert str(e.value) == message


def test_runner_cli_writes_one_json_result(tmp_path):
    config = tmp_path / "trial.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.trial", str(config), "-o", str(out), "--set", "channels_last=true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = TrialResult.read(out)  # the contract, checked
    assert result.status == "ok" and result.knobs["channels_last"] is True


def test_runner_cli_rejects_a_bad_config_with_exit_2(tmp_path):
    config = tmp_path / "trial.json"
    config.write_text(json.dumps({**TINY, "knobs": {"compile": "fast"}}))
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.trial", str(config)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "error: knobs.compile: 'fast' is not allowed: expected one of none | default | reduce-overhead | max-autotune"
    )
    config.write_text(json.dumps({**TINY, "workload": {"command": ["python", "train.py"]}}))  # a program's config
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.trial", str(config)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: workload.command: a program's trial is the program itself, run by autotune's launcher "
        "(`autotune search SPEC`); this runner runs factories (`name`, `factory` or `file`)"
    ]


@pytest.mark.timeout(120)
def test_load_from_outside_during_the_window_is_recorded(outside_hogs):
    outside_hogs(2)  # two processes that are not the trial's burn both cores
    result = run_trial(
        {
            **TINY,
            "knobs": {"batch_size": 16},
            "min_window_s": 1.5,
            "max_window_s": 2.0,
            "profile_steps": 0,
            "diagnose": False,
        }
    )
    assert result.status == "ok" and result.metrics["host_other_cpu_frac"] > 0.25
    assert result.disturbed.startswith("other processes used ")


def test_memory_in_use_over_the_memory_limit_is_an_out_of_memory():
    result = run_trial({**TINY, "profile_steps": 0, "diagnose": False, "memory_limit_gib": 0.01, "device": "cpu"})
    assert result.status == "oom" and result.error_type == "MemoryCapExceeded", result
    assert "in use (the allocator's sampled peak) above memory_limit_gib=0.01" in result.error
    assert result.metrics["mem_inuse_peak_gib"] > 0.01 and result.metrics["mem_rss_peak_gib"] > 0.01


def test_flops_are_counted_once_per_model_and_shape_in_a_search(tmp_path):
    cache = tmp_path / "flops.json"
    config = {**TINY, "profile_steps": 0, "flops_cache": str(cache)}
    first = run_trial({**config, "knobs": {"batch_size": 16, "num_threads": 1}})
    again = run_trial({**config, "knobs": {"batch_size": 16, "num_threads": 1, "channels_last": True}})
    other = run_trial({**config, "knobs": {"batch_size": 8, "num_threads": 1}})
    flops = json.loads(cache.read_text())
    assert len(flops) == 2 and sorted(json.loads(k)["batch_size"] for k in flops) == [8, 16]  # one entry per shape
    assert (
        first.metrics["flops_per_sample"]
        == again.metrics["flops_per_sample"]
        == flops[next(k for k in flops if json.loads(k)["batch_size"] == 16)]
    )  # the second trial read the first's count
    assert other.metrics["flops_per_sample"] == pytest.approx(first.metrics["flops_per_sample"], rel=0.01)
    alone = run_trial(
        {**config, "flops_cache": str(tmp_path / "absent" / "flops.json"), "knobs": {"batch_size": 8, "num_threads": 1}}
    )  # no run dir there: counted, nothing kept
    assert alone.metrics["flops_per_sample"] > 0 and not (tmp_path / "absent").exists()


def test_a_tied_window_of_a_riskier_config_pays_for_nothing_more():
    """A window that ties with the incumbent (WindowRule.tied) and reads above its bar
    would make the config the incumbent, paying profile, diagnosis and loss parity; for a config riskier than
    the incumbent that changes the numerics (`tie_keeps_incumbent`, set by Strategy.incumbent_bar) the tie
    goes to the incumbent, as records.pick_best exports it, and the trial stops at its window."""
    from autotune.trial.runner import _not_incumbent

    tied, promoted = M.WindowRule(tied=True, screen_ci=0.098), M.WindowRule(promoted=True)
    cfg = {"incumbent_above": 100.0, "tie_keeps_incumbent": True}
    metrics, result = {"samples_per_s": 104.0}, TrialResult("ok")
    assert _not_incumbent(cfg, metrics, tied, result)
    assert metrics["tie_kept"] == 1.0 and metrics["tied"] == 1.0 and "the safer config, which stays" in result.skipped
    assert "tie_kept_incumbent" not in metrics  # no incumbent named: none recorded
    named = {"samples_per_s": 104.0}
    assert (
        _not_incumbent({**cfg, "incumbent_trial": 0}, named, tied, TrialResult("ok"))
        and named["tie_kept_incumbent"] == 0.0
    )
    # a tie that reads beyond the incumbent's own interval (+-9.8%) above the bar is adopted: it may lead somewhere
    beyond, result = {"samples_per_s": 111.0}, TrialResult("ok")
    assert not _not_incumbent(cfg, beyond, tied, result) and "tie_kept" not in beyond and result.skipped is None
    metrics, result = {"samples_per_s": 104.0}, TrialResult("ok")
    assert not _not_incumbent({**cfg, "tie_keeps_incumbent": False}, metrics, tied, result)  # not riskier: adopted
    assert "tie_kept" not in metrics and result.skipped is None
    assert not _not_incumbent(cfg, {"samples_per_s": 130.0}, promoted, TrialResult("ok"))  # a clear gain: adopted
    below = TrialResult("ok")
    assert _not_incumbent(cfg, {"samples_per_s": 99.0}, tied, below) and "does not beat the 100" in below.skipped
    with pytest.raises(TrialConfigError, match="tie_keeps_incumbent"):
        check_config({"workload": {"name": "tiny_cnn"}, "tie_keeps_incumbent": "yes"})
    with pytest.raises(TrialConfigError, match="`incumbent_trial` must be null or a trial number >= 0, got -1"):
        check_config({"workload": {"name": "tiny_cnn"}, "incumbent_trial": -1})
