"""Convergence safety: loss parity (per step from identical state, multi-step, the
reference once per search), planted faults, fp16 overflow, batch-size advice,
safety levels, and that an unsafe config is never the one exported."""

import pandas as pd
import pytest
import torch
import yaml

from autotune import knobs as K
from autotune import load_config
from autotune import spec as S
from autotune import workload as W
from autotune.safety import levels as safety
from autotune.safety import stepping
from autotune.export.best_config import safety_flags
from autotune.safety.parity import verdict_key
from autotune.safety.summary import parity_summary
from autotune.records.trial_record import TrialRecord
from autotune.records.best import pick_best
from autotune.safety.levels import LEVELS, STEP_METRICS, batch_advice, loss_parity, needs_parity, trial_parity
from autotune.execution.driver import run
from autotune.trial.runner import prepare, run_trial
from autotune.safety import parity

CPU = K.Device("cpu", 2)


@pytest.mark.parametrize("change", [{"channels_last": True}, {"set_to_none": False}])
def test_safe_knobs_pass_parity(change):
    base = K.pytorch_defaults(32)
    r = loss_parity(W.load("tiny_cnn"), base, {**base, **change}, CPU, steps=6)
    assert r["passed"] and not r["nonfinite"], r["reason"]
    ps = r["per_step"]
    assert ps["loss"]["max"] <= 1e-5 and ps["grad"]["max"] <= 1e-3 and ps["grad"]["cos_min"] > 0.9999
    assert all(ps[m]["max"] <= ps[m]["band"] for m in STEP_METRICS)


def test_loader_knobs_need_no_parity():
    """num_workers and pin_memory move data, not numerics: parity would compare the
    baseline with itself (its batches are loaded in the main process), so none is run."""
    base = K.pytorch_defaults(32)
    for change in ({"num_workers": 2}, {"pin_memory": True}, {"batch_size": 64}):
        assert not needs_parity({**base, **change}, base)
    for knob, value in (
        ("precision", "bf16-mixed"),
        ("compile", "default"),
        ("channels_last", True),
        ("cudnn_benchmark", True),
        ("set_to_none", False),
    ):
        assert needs_parity({**base, knob: value}, base)


def test_bf16_passes_on_a_transformer_with_dict_batches():
    """No false alarm: bf16's per-step errors sit inside its band (rtol 1.6e-2 or the
    noise reference), far above fp32's."""
    wl = W.load("tiny_transformer")
    base = K.pytorch_defaults(wl.batch_size)
    r = loss_parity(wl, base, {**base, "precision": "bf16-mixed"}, CPU, steps=6)
    assert r["passed"], r["reason"]
    ps = r["per_step"]
    assert ps["rtol"] == 1.6e-2 and ps["roundoff"] == 2.0**-8
    assert 1e-4 < ps["grad"]["max"] <= ps["grad"]["band"]  # bf16 does change the gradient, within its band
    assert r["moved"]["candidate"] > 0.5 * r["moved"]["baseline"] > 0


# AdamW, SGD with momentum, and SGD on a channels_last model (the baseline's contiguous
# momentum loaded into it: laid out like the parameters, else fused SGD updates wrongly)
@pytest.mark.parametrize("ref, layout", [("tiny_transformer", False), ("tiny_cnn", False), ("tiny_cnn", True)])
def test_a_fused_optimizer_passes_parity_with_its_update_checked(ref, layout):
    """fused_optimizer is a numerics knob: the candidate steps with the fused kernel
    (still fused after each reset to the baseline's state) and its update, from the
    same gradient and state, matches the baseline optimizer's within fp32's rtol."""
    wl = W.load(ref)
    base = K.pytorch_defaults(wl.batch_size)
    assert needs_parity({**base, "fused_optimizer": True}, base)
    r = loss_parity(wl, base, {**base, "fused_optimizer": True, "channels_last": layout}, CPU, steps=6)
    assert r["passed"], r["reason"]
    update = r["per_step"]["update"]
    assert update["band"] == parity.UPDATE_FLOOR and update["max"] <= update["band"]
    if ref == "tiny_transformer":  # fused AdamW rounds its update differently (SGD's is bitwise the same on the CPU)
        assert update["max"] > 0
    if not layout:
        assert r["per_step"]["loss"]["max"] == 0.0  # the forward is the baseline's: same weights, same loss
        # every error inside fp32's rtol and every deviation inside the tolerance: no band can fail it, and
        # no noise reference was paid for
        assert r["noise"] == {"step": "not needed", "multi": "not needed"} and r["noise_s"] == 0.0
        assert r["noise_floor"] is None and r["multi_step"]["loss_dev"]["noise"] is None


@pytest.mark.slow  # CI tier: the multi-step deviations go unjudged in the stale-cast and diverging-baseline tests
def test_chaotic_training_is_judged_per_step():
    """The classic case (ResNet-18, SGD lr 0.1, momentum 0.9; tiny images): rounding
    noise alone moves the loss far within a few steps, so the multi-step deviation is
    reported, not judged, and the per-step errors decide."""
    wl = W.load("resnet18_cifar", {"batch_size": 8, "image_size": 8})
    base = K.pytorch_defaults(8)
    r = loss_parity(wl, base, {**base, "channels_last": True}, CPU, steps=8)
    loss = r["multi_step"]["loss_dev"]
    assert loss["noise"] > 0.05 and not loss["judged"]  # chaos: noise alone is past the tolerance
    assert r["noise"]["multi"] == "computed"  # its deviation is past the tolerance: the noise runs decide
    assert r["passed"], r["reason"]
    assert r["per_step"]["loss"]["max"] < 1e-5 and r["per_step"]["grad"]["max"] <= r["per_step"]["grad"]["band"]
    assert "chaotic: noise alone" in safety.describe(r)


def test_fp16_overflow_is_flagged():
    """Planted fault: activations of ~1e6 overflow fp16 (max 65504), at every loss scale.
    (fp16 autocast runs on a CPU, though the knob registry offers it on CUDA only.)"""
    base = K.pytorch_defaults(32)
    wl = W.load("tests.workloads:make_fp16_overflow")
    r = loss_parity(wl, base, {**base, "precision": "16-mixed"}, CPU, steps=6)
    assert not r["passed"] and r["nonfinite"]
    assert r["reason"].startswith("NaN/inf in the loss, gradients or weights (fp16 overflow)")
    assert "the GradScaler skipped 6 of 6 steps (fp16 overflow)" in r["reason"]
    assert r["per_step"]["at"][0]["backoffs"] == stepping.MAX_BACKOFF - 1  # no loss scale made it finite
    assert loss_parity(wl, base, {**base, "precision": "bf16-mixed"}, CPU, steps=6)["passed"]  # bf16 has fp32's range


def test_fp16_without_overflow_passes_after_the_scaler_backs_off():
    """A GradScaler's first steps overflow (scale 2^16) and are skipped: normal
    dynamics, not a failure. Parity starts the scaler where its back-off would
    reach, so the run is not a step behind, and counts the skips after that."""
    wl = W.load("tests.workloads:make_vanishing", {"offset": 0.0})  # a plain linear regression
    base = K.pytorch_defaults(32)
    r = loss_parity(wl, base, {**base, "precision": "16-mixed"}, CPU, steps=6)
    assert r["passed"], r["reason"]
    assert r["initial_scale"] < 2.0**16 and r["skipped_steps"] == 0


def test_a_model_that_does_not_train_under_bf16_is_caught():
    """Planted fault: the loss is a difference of two large nearly equal terms; in bf16
    the residuals round to zero, so there is no gradient and the loss never moves."""
    wl = W.load("tests.workloads:make_vanishing")
    base = K.pytorch_defaults(32)
    r = loss_parity(wl, base, {**base, "precision": "bf16-mixed"}, CPU, steps=6)
    assert not r["passed"] and not r["nonfinite"]
    assert r["per_step"]["grad"]["max"] > 0.5 > r["per_step"]["grad"]["band"]
    assert r["overfit"]["candidate"] == 0 and r["overfit"]["baseline"] > parity.MIN_FALL
    assert {"per-step grad", "does not train"} <= set(r["failed"])  # caught by several checks
    assert f"does not train: on one fixed batch its loss fell 0.00% in {parity.OVERFIT_STEPS} steps" in r["reason"]
    assert loss_parity(wl, base, {**base, "channels_last": True}, CPU, steps=6)["passed"]  # fp32 trains


def test_a_candidate_that_does_not_train_beside_a_diverging_baseline_is_caught():
    """Planted fault only the "does it train" check catches: a bf16 forward on a
    stale weight copy (tests.workloads.StaleCast) beside a chaotic baseline (SGD
    lr 10) whose loss over fresh batches diverges. Each step from identical state
    is exact (per-step checks pass), the multi-step deviations are not judged
    (rounding noise alone is past the tolerance), and on one fixed batch the
    baseline's loss falls while the candidate's never moves."""
    wl = W.load("tests.workloads:make_stale_cast")
    base = K.pytorch_defaults(wl.batch_size)
    r = loss_parity(wl, base, {**base, "precision": "bf16-mixed"}, CPU, steps=20)
    assert r["failed"] == ["does not train"], r["reason"]
    assert r["moved"]["baseline"] > 1.0  # the baseline's first-batch loss rose over 2x (measured 163%)
    assert not any(e["judged"] for e in r["multi_step"].values())
    assert r["overfit"]["candidate"] == 0 and r["overfit"]["baseline"] > 0.1
    tried = r["overfit"]["tried"]  # asked at every learning rate: it falls at none, the baseline at each
    assert [t["lr_scale"] for t in tried] == list(parity.OVERFIT_LR_SCALES) and all(t["judged"] for t in tried)
    assert all(t["candidate"] == 0 for t in tried), tried
    assert loss_parity(wl, base, {**base, "channels_last": True}, CPU, steps=20)["passed"]  # an fp32 knob trains


def test_a_diverging_baseline_does_not_make_a_healthy_candidate_fail():
    """Issue 39's false alarm, reproduced small: a baseline whose loss over fresh
    batches diverges (tiny CNN, SGD lr 50) beside bf16, trained for real on one
    thread. Which of the two diverges further is chaos: it follows the reduction
    order, which the thread count and the CPU's kernels set (seed 4 showed the
    false alarm on one host, baseline 5.3e4x its start against bf16's 89x; on an
    AVX-512-bf16 host bf16 moved 1.9e6x, the baseline 133x, and seed 6 showed it
    instead, 2.1e5x against 166x). So the seeds are walked until one shows the
    old rule's false alarm (moved less than a tenth of the baseline's movement)
    far past its line; each seed on the way must pass too. On one fixed batch at
    the optimizer's lr the baseline cannot overfit (lr 50); at a tenth of it both
    fall alike (9-49% over these seeds): the check judges, and bf16 trains."""
    import torch

    wl = W.load("tests.workloads:make_chaotic", {"lr": 50.0})
    base = K.pytorch_defaults(wl.batch_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    walked = []
    try:
        for seed in range(40):  # 1 seed in 8 showed it on this host (seeds 0-7): at that rate 40 miss it 1 time in 200
            r = loss_parity(wl, base, {**base, "precision": "bf16-mixed"}, CPU, steps=20, seed=seed)
            moved = r["moved"]
            walked.append((seed, moved["baseline"], moved["candidate"]))
            assert r["passed"], (seed, r["reason"])
            falls = r["overfit"]
            assert falls["judged"] and falls["lr_scale"] == 0.1, falls  # it judges, at a tenth of the lr
            assert falls["candidate"] >= 0.9 * falls["baseline"] >= 0.9 * parity.MIN_FALL
            if moved["baseline"] > 1e3 and moved["candidate"] < 1e-2 * moved["baseline"]:
                break  # the old rule's verdict here: "does not train", and far past its line
        else:
            pytest.fail(f"no seed of 40 showed the diverging baseline beside bf16 on this CPU: {walked}")
    finally:
        torch.set_num_threads(threads)


def test_a_candidate_past_the_edge_of_stability_at_the_baseline_lr_still_trains():
    """The false alarm of the battery (ResNet-18 at 224 px, bf16, seed 1: the
    baseline's loss fell 46% on one batch at the optimizer's lr, bf16's rose 12%),
    reproduced small: the tiny CNN at SGD lr 13, seed 47, sits at its edge of
    stability on one batch, and rounding decides which side falls in 8 steps.
    Measured on two CPUs (one with AVX-512 bf16; 1 and 2 threads): at lr x1 the
    baseline's loss fell 26% and bf16's rose 52-64% (the rule before parity.RULE 5
    called bf16 "does not train", its only failed check); at lr x0.1 both fall
    16.6%. The candidate is asked again at the lower scale, the baseline measured
    there too, and trains. Where rounding tips seed 47 the other way, the next
    case found by a scan here (lr 11, seed 47: 18% against -11%) is asked."""
    walked = []
    for lr, seed in [(13.0, 47), (11.0, 47)]:
        wl = W.load("tests.workloads:make_chaotic", {"lr": lr})
        base = K.pytorch_defaults(wl.batch_size)
        r = loss_parity(wl, base, {**base, "precision": "bf16-mixed"}, CPU, steps=20, seed=seed)
        assert r["passed"], (lr, seed, r["reason"])
        at_lr = r["overfit"]["tried"][0]
        walked.append((lr, seed, at_lr))
        # the old rule's verdict, far from its line: the baseline fell, bf16 rose
        if at_lr["lr_scale"] == 1.0 and not at_lr["trains"] and at_lr["baseline"] > 0.1 and at_lr["candidate"] < 0:
            break
    else:
        pytest.fail(f"neither case sits at its edge of stability on this CPU: {walked}")
    assert at_lr["judged"]
    lower = r["overfit"]["tried"][1]
    assert lower["lr_scale"] == 0.1 and lower["trains"] and lower["candidate"] >= 0.9 * lower["baseline"] > 0.1
    assert r["overfit"]["lr_scale"] == 0.1
    summary = parity_summary(r)["overfit"]
    assert [t["lr_scale"] for t in summary["tried"]] == [1.0, 0.1]  # what best_config.yaml shows


def test_stored_references_and_verdicts_carry_the_rule_version(tmp_path, monkeypatch):
    """A reference or verdict stored under other parity rules is not served."""
    wl = W.load("tiny_cnn", {"batch_size": 16})
    base = K.pytorch_defaults(16)
    cfg = {"baseline": base, "steps": 4, "tolerance": 0.05, "reference": str(tmp_path / safety.REFERENCE_FILE)}
    ref = {"name": "tiny_cnn", "args": {"batch_size": 16}}
    bf16 = {**base, "precision": "bf16-mixed"}
    assert trial_parity(wl, ref, cfg, bf16, CPU)["reference"] == "computed and stored"
    assert trial_parity(wl, ref, cfg, bf16, CPU)["reference"] == "verdict reused (same numerics knobs)"
    assert f"rule={parity.RULE}" in verdict_key(bf16, 0.05)
    monkeypatch.setattr(parity, "RULE", parity.RULE + 1)  # the next version of the rules
    assert trial_parity(wl, ref, cfg, bf16, CPU)["reference"] == "computed"  # neither the verdict nor the reference


def test_a_numerics_bug_under_bf16_is_caught():
    """Planted fault: a variance computed as E[x^2] - E[x]^2 on features with mean 100:
    exact enough in fp32, catastrophic cancellation in bf16."""
    wl = W.load("tests.workloads:make_naive_variance")
    base = K.pytorch_defaults(32)
    r = loss_parity(wl, base, {**base, "precision": "bf16-mixed"}, CPU, steps=6)
    assert not r["passed"] and not r["nonfinite"]
    assert r["per_step"]["loss"]["max"] > 10 * r["per_step"]["loss"]["band"]
    assert r["reason"].startswith("per-step loss error ")


def test_a_precision_sensitive_model_fails_bf16_parity():
    base = K.pytorch_defaults(32)
    r = loss_parity(
        W.load("tests.workloads:make_precision_sensitive"),
        base,
        {**base, "precision": "bf16-mixed"},
        CPU,
        steps=5,
        tolerance=0.05,
    )
    assert not r["passed"] and r["per_step"]["loss"]["max"] > r["per_step"]["loss"]["band"]
    assert r["reason"].startswith("per-step loss error ")


def test_the_reference_is_computed_once_and_reused(tmp_path):
    """A search's first trial needing parity stores the baseline's reference in the
    run dir; later trials load it, pay less, and get the same numbers; a trial
    with numerics knobs already checked takes that verdict."""
    wl = W.load("tiny_cnn", {"batch_size": 16})
    base = K.pytorch_defaults(16)
    cfg = {"baseline": base, "steps": 6, "tolerance": 0.05, "reference": str(tmp_path / safety.REFERENCE_FILE)}
    ref = {"name": "tiny_cnn", "args": {"batch_size": 16}}
    first = trial_parity(wl, ref, cfg, {**base, "precision": "bf16-mixed"}, CPU)
    assert first["reference"] == "computed and stored" and (tmp_path / safety.REFERENCE_FILE).exists()
    assert 0 < first["reference_s"] < first["parity_s"]  # the one-time share, apart (budget estimates leave it out)
    again = trial_parity(wl, ref, cfg, {**base, "precision": "bf16-mixed", "set_to_none": False}, CPU)
    assert again["reference"] == "cached" and again["parity_s"] < first["parity_s"] and "reference_s" not in again
    assert again["per_step"]["at"] == first["per_step"]["at"] and again["passed"]
    # the per-step noise its errors needed was stored with the reference; bf16's deviations over 6 steps sit
    # inside the tolerance, so the multi-step noise runs were never paid for
    assert first["noise"] == {"step": "computed", "multi": "not needed"} and again["noise"]["step"] == "cached"
    # the same numerics knobs (a loader knob apart): the same computation, its verdict taken, not run again
    same = trial_parity(wl, ref, cfg, {**base, "precision": "bf16-mixed", "num_workers": 2}, CPU)
    assert same["reference"] == "verdict reused (same numerics knobs)" and "reference_s" not in same
    assert same["max_rel_dev"] == first["max_rel_dev"] and same["per_step"] == first["per_step"]
    verdicts = torch.load(cfg["reference"], weights_only=True)["verdicts"]
    assert len(verdicts) == 2 and verdict_key({**base, "precision": "bf16-mixed"}, 0.05) in verdicts
    # bf16's noise level only so far: an fp32 knob's level is added by the first trial that needs it
    levels = lambda: set(torch.load(cfg["reference"], weights_only=True)["reference"]["noise"])  # noqa: E731
    assert levels() == {repr(2.0**-8)}
    added = trial_parity(wl, ref, cfg, {**base, "channels_last": True}, CPU)
    assert added["reference"] == f"noise level {2.0**-16:.3g} added and stored" and added["reference_s"] > 0
    assert levels() == {repr(2.0**-8), repr(2.0**-16)} and added["passed"]
    assert (
        trial_parity(wl, ref, cfg, {**base, "channels_last": True, "set_to_none": False}, CPU)["reference"] == "cached"
    )
    assert trial_parity(wl, ref, cfg, {**base, "channels_last": True}, CPU)["max_rel_dev"] == added["max_rel_dev"]
    other = trial_parity(wl, ref, {**cfg, "steps": 4}, {**base, "channels_last": True}, CPU)  # another key
    assert other["reference"] == "computed" and other["steps"] == 4
    alone = trial_parity(
        wl, ref, {k: v for k, v in cfg.items() if k != "reference"}, {**base, "channels_last": True}, CPU
    )
    assert alone["reference"] == "computed" and alone["passed"]


def test_a_trial_run_alone_computes_its_own_reference():
    base = K.pytorch_defaults(16)
    result = run_trial(
        {
            "workload": {"name": "tiny_cnn", "args": {"batch_size": 16}},
            "knobs": {"channels_last": True},
            "warmup_steps": 1,
            "measure_steps": 3,
            "min_window_s": 0,
            "max_window_s": 1,
            "profile_steps": 0,
            "diagnose": False,
            "device": "cpu",
            "parity": {"baseline": base, "steps": 4},
        }
    )
    assert result.status == "ok", result.error
    assert result.parity["passed"] and result.parity["reference"] == "computed"
    assert result.metrics["parity_s"] == result.parity["parity_s"] > 0


def test_the_verdict_carries_its_numbers():
    base = K.pytorch_defaults(32)
    parity = loss_parity(W.load("tiny_cnn"), base, {**base, "channels_last": True}, CPU, steps=4)
    [flag] = safety_flags({**base, "channels_last": True}, base, parity)
    numbers = flag["parity"]
    assert numbers["passed"] and set(numbers["per_step"]) >= {"loss", "grad", "update", "rtol", "points"}
    assert numbers["per_step"]["grad"]["max"] <= numbers["per_step"]["grad"]["band"]
    assert numbers["multi_step"]["loss_dev"]["band"] >= 0.05
    assert safety.describe(numbers).startswith("per-step errors: loss ")


def test_a_batch_size_flag_under_keep_effective_batch_says_the_effective_batch_stays():
    base = K.pytorch_defaults(2)
    [free] = safety_flags({**base, "batch_size": 8}, base)
    assert free["note"].startswith("changes optimization")  # a new batch: scale the learning rate
    [kept] = safety_flags({**base, "batch_size": 8}, base, kept_batch=8)  # 2 x 4 -> 8 x 1
    assert kept["note"] == "the effective batch stays 8 (8 x 1 accumulated)"


def test_batch_size_advice():
    smaller = batch_advice(256, 64, "SGD", has_batchnorm=True)
    assert smaller["grad_accumulation_steps"] == 4
    assert smaller["note"] == "accumulate 4 steps of 64 to keep the effective batch 256"
    assert "batchnorm" not in smaller
    sgd = batch_advice(32, 128, "SGD", has_batchnorm=False)
    assert sgd["lr_scaling"] == {"rule": "linear", "factor": 4.0, "optimizer": "SGD"}
    adam = batch_advice(32, 128, "AdamW", has_batchnorm=False)
    assert adam["lr_scaling"] == {"rule": "sqrt", "factor": 2.0, "optimizer": "AdamW"}
    tiny = batch_advice(64, 8, "SGD", has_batchnorm=True)
    assert tiny["batchnorm"].startswith("BatchNorm normalizes over 8 samples per step")
    kept = batch_advice(32, 8, "SGD", has_batchnorm=False, accumulation_steps=4)
    assert kept["effective"] == 32 and kept["grad_accumulation_steps"] == 4
    assert batch_advice(32, 32, "SGD", has_batchnorm=True) is None


def test_strict_searches_only_safe_knobs():
    lists = S.load_preset("default").given()
    space = K.resolve_space(lists, K.pytorch_defaults(32), K.Device("cuda", 16, "H100", (9, 0)), LEVELS["strict"])
    assert set(space.search) == {
        "num_workers",
        "pin_memory",
        "prefetch_factor",
        "num_threads",
        "set_to_none",
        "channels_last",
    }
    for knob in ("batch_size", "precision", "compile", "cudnn_benchmark"):
        assert "safety.level allows only safe knobs" in space.fixed[knob]
    numerics = K.resolve_space(lists, K.pytorch_defaults(32), K.Device("cuda", 16, "H100", (9, 0)), LEVELS["numerics"])
    assert "batch_size" not in numerics.search and "precision" in numerics.search


def test_keep_effective_batch_searches_divisors_and_accumulates():
    space = K.resolve_space(
        {"batch_size": [8, 16, 48, 64]}, K.pytorch_defaults(32), CPU, LEVELS["numerics"], keep_effective_batch=True
    )
    assert space.search["batch_size"] == [32, 8, 16]
    assert (
        "batch_size=48: keep_effective_batch: a micro-batch must divide the baseline's effective batch 32"
        in space.dropped
    )
    session = prepare(W.load("tiny_cnn"), {**K.pytorch_defaults(8)}, CPU, steps=4, accum_steps=4)
    before = [p.detach().clone() for p in session.model.parameters()]
    batches = iter(session.loader)
    for _ in range(3):
        session.step(next(batches))
    assert all(torch.equal(a, b) for a, b in zip(before, session.model.parameters()))  # still accumulating
    session.step(next(batches))
    assert not all(torch.equal(a, b) for a, b in zip(before, session.model.parameters()))  # one optimizer step


def test_the_fastest_unsafe_trial_is_never_best():
    knobs = K.pytorch_defaults(32)
    fast_unsafe = TrialRecord(1, "ok", knobs, {"samples_per_s": 900.0}, parity={"passed": False, "reason": "x"})
    safe = TrialRecord(2, "ok", knobs, {"samples_per_s": 500.0}, parity={"passed": True})
    untested = TrialRecord(0, "ok", knobs, {"samples_per_s": 400.0})
    assert pick_best([untested, fast_unsafe, safe]) is safe


@pytest.mark.timeout(300)
def test_a_search_exports_the_best_safe_config(tmp_path, ray_local):
    spec = S.parse(
        {
            "name": "parity",
            "workload": {"factory": "tests.workloads:make_precision_sensitive"},
            "search_space": {
                "preset": None,
                "knobs": {"precision": ["32-true", "bf16-mixed"], "set_to_none": [True, False]},
            },
            "trial": {
                "warmup_steps": 2,
                "measure_steps": 5,
                "min_window_s": 0.2,
                "max_window_s": 0.5,
                "profile_steps": 0,
                "prune_margin": 0,
            },  # every trial measured to the end: parity on each
            "search": {"sampler": "grid", "n_trials": 4, "confirm_rounds": 0},
            "safety": {"parity_steps": 5},
            "output_dir": str(tmp_path / "run"),
        }
    )
    result = run(spec)
    by = {(r.knobs["precision"], r.knobs["set_to_none"]): r for r in result.records}
    assert len(by) == 4 and all(r.status == "ok" for r in result.records)
    # bf16: checked where it would have become the incumbent (faster), and unsafe there; never the best
    assert all(r.parity is None or not r.safe for k, r in by.items() if k[0] == "bf16-mixed")
    assert by["32-true", True].parity is None  # the baseline
    assert by["32-true", False].parity is None or by["32-true", False].parity["passed"]  # set_to_none: fp32 noise
    # the baseline's reference: computed by the first trial that needs parity, reused by the rest
    measured = sorted((r for r in result.records if r.parity), key=lambda r: r.number)
    assert (result.run_dir / safety.REFERENCE_FILE).exists() == bool(measured)
    # ... at its noise level; another level (bf16's, fp32's) is added by the first trial that needs it
    seen, expected = set(), []
    for r in measured:
        level = r.parity["per_step"]["roundoff"]
        expected.append(
            "cached"
            if level in seen
            else "computed and stored"
            if not seen
            else f"noise level {level:.3g} added and stored"
        )
        seen.add(level)
    assert [r.parity["reference"] for r in measured] == expected
    assert all(r.metrics["parity_s"] > 0 for r in measured)
    assert result.best.knobs["precision"] == "32-true"
    best = yaml.safe_load((result.run_dir / "best_config.yaml").read_text())
    assert best["knobs"]["precision"] == "32-true"
    rejected = {r["trial"] for r in best.get("rejected_faster_but_unsafe", [])}
    faster_bf16 = {r.number for r in result.records if not r.safe and r.throughput > result.best.throughput}
    assert rejected == faster_bf16
    table = pd.read_csv(result.run_dir / "trials.csv")
    assert set(table.loc[table.precision == "bf16-mixed", "parity"].dropna()) <= {"failed"}
    assert load_config(result.run_dir / "best_config.yaml").accumulation_steps == 1


@pytest.mark.slow  # CI tier: parity_table.py's smoke run (test_scripts) and this module's parity tests
@pytest.mark.timeout(300)
def test_parity_table_has_no_false_alarm_and_catches_every_planted_fault():
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "scripts/bench/parity_table.py",
            "--workloads",
            "tiny_transformer",
            "--steps",
            "6",
            "--skip-compile",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=True,
    ).stdout
    table = json.loads(out.strip().splitlines()[-1])
    assert {(r["knob"], r["value"]) for r in table["rows"] if not r.get("planted")} == {
        ("precision", "bf16-mixed"),
        ("channels_last", True),
        ("set_to_none", False),
        ("fused_optimizer", True),
    }  # what a CPU has
    assert table["false_alarms"] == 0, table["false_alarm_rows"]
    assert table["planted_total"] == 4 and table["planted_caught"] == 4
    assert {r["workload"]: r["caught_by"] for r in table["rows"] if r.get("planted")}[
        "tests.workloads:make_stale_cast"
    ] == ["does not train"]
