"""Memory in use on the CPU (autotune.trial.memory): the allocator's sampled peak, and the
forced memory limit the batch ladder climbs past with activation checkpointing."""

import pytest

from autotune.trial import memory

pytestmark = pytest.mark.timeout(240)

# tiny_transformer where a step's activations are most of what it holds: 8 layers, short and narrow
LADDER_ARGS = {"seq_len": 128, "dim": 32, "layers": 8}


def test_the_peak_in_use_sees_an_allocation_and_its_free():
    import time

    import numpy as np

    sampler = memory.PeakInUse().start()
    try:
        block = np.ones(64 * 2**20 // 8)  # 64 MiB, held a while, then freed
        time.sleep(0.05)
        del block
        time.sleep(0.01)
    finally:
        sampler.stop()
    assert sampler.peak_gib - sampler.start_gib >= 63 / 1024 > memory.in_use_gib() - sampler.start_gib


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_the_ladder_climbs_past_an_oom_with_checkpointing_under_a_memory_limit(tmp_path):
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from autotune import spec as S
    from autotune.execution.driver import run

    spec = S.parse(
        {
            "name": "ladder",
            "workload": {"name": "tiny_transformer", "args": {"batch_size": 32, **LADDER_ARGS}},
            "search_space": {
                "preset": None,
                "knobs": {"batch_size": [32, 64], "activation_checkpointing": [False, True]},
            },
            "baseline": {"num_threads": 1},
            # batch 32 holds ~0.18 GiB in use at its peak, 64 ~0.23 without checkpointing, ~0.16 with it
            "resources": {"device": "cpu", "memory_limit_gib": 0.2},
            "trial": {
                "warmup_steps": 1,
                "measure_steps": 2,
                "min_window_s": 0,
                "max_window_s": 0.001,
                "profile_steps": 0,
                "timeout_s": 120,
                "prune_margin": 0,
            },  # no pruning: every trial's memory window runs
            "search": {"sampler": "grid", "n_trials": 4, "seed": 0, "confirm_rounds": 0},
            "safety": {"level": "dynamics"},
            "output_dir": str(tmp_path / "run"),
        },
        "ladder.yaml",
    )
    result = run(spec)
    by = {(r.knobs["batch_size"], r.knobs["activation_checkpointing"] == "full"): r for r in result.records}
    print({k: (r.status, r.metrics.get("mem_inuse_peak_gib")) for k, r in by.items()})
    base, oom, climbed = by[32, False], by[64, False], by[64, True]
    assert base.is_baseline and base.status == "ok" and climbed.status == "ok", climbed.error
    # without checkpointing, twice the batch is over the limit: recorded, and the search went on
    assert oom.status == "oom" and oom.error_type == "MemoryCapExceeded" and oom.metrics["mem_inuse_peak_gib"] > 0.2
    # the baseline's 2x-batch probe ran out of memory: capacity-bound, and checkpointing is the move
    assert base.metrics["batch2x_oom"] == 1
    assert any(m["knob"] == "activation_checkpointing" and "full" in m["to"] for m in base.diagnosis["moves"])
    # with checkpointing, the batch that did not fit does, and a step adds less
    assert climbed.metrics["mem_inuse_peak_gib"] < 0.2 < oom.metrics["mem_inuse_peak_gib"]
    assert by[32, True].metrics["mem_inuse_step_gib"] < base.metrics["mem_inuse_step_gib"]
    rows = pd.read_csv(result.run_dir / "trials.csv")
    assert rows.loc[rows["status"] == "ok", "mem_inuse_peak_gib"].notna().all()
    metrics = MlflowClient(f"sqlite:///{result.run_dir}/mlflow.db").get_run(climbed.mlflow_run_id).data.metrics
    assert {"mem_inuse_peak_gib", "mem_inuse_step_gib", "mem_rss_peak_gib"} <= set(metrics)


def test_an_allocation_the_cpu_refuses_is_an_out_of_memory():
    import torch

    with pytest.raises(RuntimeError) as refused:
        torch.empty(2**50, dtype=torch.uint8)  # a petabyte: the CPU allocator refuses it (no OutOfMemoryError)
    assert memory.is_oom(refused.value) and not memory.is_oom(RuntimeError("shape mismatch"))


def test_a_programs_out_of_memory_is_an_oom_trial_with_its_reason_and_memory(tmp_path):
    """A program whose step the allocator refuses: status `oom` (the search's strategy then runs no larger batch
    with the same device-side knobs), the allocator's words, and the memory at the failure."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from autotune.trial.result import TrialResult

    root = Path(__file__).parent.parent
    request = {"workload": {"command": ["python", "tiny_steps.py"]}, "knobs": {}, "warmup_steps": 5}
    (tmp_path / "config.json").write_text(json.dumps(request))
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_TRIAL", "AUTOTUNE_CONFIG")}
    env.update(PYTHONPATH=str(root), AUTOTUNE_TRIAL=str(tmp_path / "config.json"))
    proc = subprocess.run(
        [sys.executable, str(root / "tests" / "programs" / "tiny_steps.py"), "--mode", "oom"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = TrialResult.read(tmp_path / "result.json")
    assert proc.returncode != 0 and result.status == "oom", proc.stderr[-2000:]
    assert "can't allocate memory" in result.error and result.metrics["mem_rss_peak_gib"] > 0
