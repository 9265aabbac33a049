"""Convergence safety: measured loss parity, fp16 overflow, batch-size advice,
safety levels, and that an unsafe config is never the one exported."""

import pandas as pd
import pytest
import torch
import yaml

from autotune import knobs as K
from autotune import load_config
from autotune import spec as S
from autotune import workload as W
from autotune.records import TrialRecord, pick_best
from autotune.safety import LEVELS, batch_advice, loss_parity
from autotune.search import run
from autotune.trial import prepare

CPU = K.Device("cpu", 2)


@pytest.mark.parametrize("change", [{"channels_last": True}, {"set_to_none": False}, {"num_workers": 2},
                                    {"pin_memory": True}])
def test_safe_knobs_pass_parity(change):
    base = K.pytorch_defaults(32)
    r = loss_parity(W.load("tiny_cnn"), base, {**base, **change}, CPU, steps=10)
    assert r["passed"] and r["max_rel_dev"] <= 1e-4 and not r["nonfinite"], r


def test_fp16_overflow_is_flagged():
    base = K.pytorch_defaults(32)
    wl = W.load("tests.workloads:make_fp16_overflow")
    r = loss_parity(wl, base, {**base, "precision": "16-mixed"}, CPU, steps=6)
    assert not r["passed"] and r["nonfinite"]
    assert r["reason"].startswith("NaN/inf in the loss, gradients or weights (fp16 overflow)")
    assert loss_parity(wl, base, {**base, "precision": "bf16-mixed"}, CPU, steps=6)["passed"]  # bf16 has fp32's range


def test_a_precision_sensitive_model_fails_bf16_parity():
    base = K.pytorch_defaults(32)
    r = loss_parity(W.load("tests.workloads:make_precision_sensitive"), base, {**base, "precision": "bf16-mixed"}, CPU,
                    steps=5, tolerance=0.05)
    assert not r["passed"] and r["max_rel_dev"] > 0.05
    assert r["reason"].startswith("loss deviates ")


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
    assert set(space.search) == {"num_workers", "pin_memory", "set_to_none", "channels_last"}
    for knob in ("batch_size", "precision", "compile", "cudnn_benchmark"):
        assert "safety.level allows only safe knobs" in space.fixed[knob]
    numerics = K.resolve_space(lists, K.pytorch_defaults(32), K.Device("cuda", 16, "H100", (9, 0)), LEVELS["numerics"])
    assert "batch_size" not in numerics.search and "precision" in numerics.search


def test_keep_effective_batch_searches_divisors_and_accumulates():
    space = K.resolve_space({"batch_size": [8, 16, 48, 64]}, K.pytorch_defaults(32), CPU, LEVELS["numerics"],
                            keep_effective_batch=True)
    assert space.search["batch_size"] == [32, 8, 16]
    assert "batch_size=48: keep_effective_batch: a micro-batch must divide the baseline batch 32" in space.dropped
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
    spec = S.parse({
        "name": "parity", "workload": {"factory": "tests.workloads:make_precision_sensitive"},
        "search_space": {"preset": None, "knobs": {"precision": ["32-true", "bf16-mixed"], "set_to_none": [True, False]}},
        "trial": {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.2, "max_window_s": 0.5, "profile_steps": 0,
                  "prune_margin": 0},  # every trial measured to the end: parity on each
        "search": {"sampler": "grid", "n_trials": 4}, "safety": {"parity_steps": 5},
        "output_dir": str(tmp_path / "run"),
    })
    result = run(spec)
    by = {(r.knobs["precision"], r.knobs["set_to_none"]): r for r in result.records}
    assert len(by) == 4 and all(r.status == "ok" for r in result.records)
    assert not by["bf16-mixed", True].safe and not by["bf16-mixed", False].safe
    assert by["32-true", True].parity is None and by["32-true", False].parity["passed"]  # set_to_none: parity measured
    assert result.best.knobs["precision"] == "32-true"
    best = yaml.safe_load((result.run_dir / "best_config.yaml").read_text())
    assert best["knobs"]["precision"] == "32-true"
    rejected = {r["trial"] for r in best.get("rejected_faster_but_unsafe", [])}
    faster_bf16 = {r.number for r in result.records if not r.safe and r.throughput > result.best.throughput}
    assert rejected == faster_bf16
    table = pd.read_csv(result.run_dir / "trials.csv")
    assert set(table.loc[table.precision == "bf16-mixed", "parity"]) == {"failed"}
    assert load_config(result.run_dir / "best_config.yaml").accumulation_steps == 1
