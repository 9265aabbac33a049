"""scripts/search_no_ray.py: the same strategy and trial runner with torch and
optuna only, where `import ray`, `import mlflow` and `import pydantic` fail."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.decide.confirm import RERUNS, describe
from tests.conftest import write_spec

ROOT = Path(__file__).resolve().parent.parent
BLOCK = '''import sys
for name in ("ray", "mlflow", "pydantic"):
    sys.modules[name] = None  # `import name` raises ImportError, here and in every trial process
'''


@pytest.mark.timeout(300)
def test_a_search_without_ray_mlflow_or_pydantic_writes_a_run_dir_the_report_reads(tmp_path):
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCK)
    spec = write_spec(tmp_path / "spec.yaml", search={"n_trials": 3, "seed": 0})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(block), str(ROOT)])}
    probe = subprocess.run([sys.executable, "-c", "import ray"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "import of ray halted" in probe.stderr  # the block works
    proc = subprocess.run([sys.executable, "scripts/search_no_ray.py", str(spec), "--output-dir", str(tmp_path / "run")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["trials"] == 3 and summary["spec_reader"].startswith("plain YAML reader")
    assert summary["best_samples_per_s"] >= summary["baseline_samples_per_s"]

    from autotune.records.run_dir import read_run

    run = read_run(tmp_path / "run")  # the run-dir format `autotune report` reads
    assert len(run.records) == 3 and run.baseline.number == 0 and run.best is not None
    assert run.baseline.diagnosis["moves"] and run.ended == "3 trials"
    assert (tmp_path / "run" / "best_config.yaml").exists() and (tmp_path / "run" / "optuna.db").exists()
    for r in run.records:  # each trial ran in its own process, under the block too
        assert (Path(r.trial_dir) / "result.json").exists()
    # v2's anchor, read again in a fresh process (confirm.reread_anchor): its throughput the two reads' mean
    reads = [run.baseline.metrics[k] for k in ("anchor_first_samples_per_s", "anchor_reread_samples_per_s")]
    assert (Path(run.baseline.trial_dir) / "reread" / "result.json").exists()
    assert run.baseline.throughput == pytest.approx(sum(reads) / 2)
    # the best re-measured against the baseline (confirm_rounds: 2 by default), as `autotune search` does
    state = json.loads((tmp_path / "run" / "search.json").read_text())
    if state.get("confirm"):
        confirm = state["confirm"]
        rounds = 1 if confirm.get("settled") else 2  # v2: a first pair may settle the verdict
        aside = confirm.get("disturbed_pairs", [])  # measured under the host's other load: again, not counted
        assert confirm["rounds"] == rounds or (confirm["rounds"] < rounds and len(aside) > RERUNS)
        assert describe(confirm) in proc.stdout
        assert summary["speedup_x"] == (run.speedup and pytest.approx(run.speedup, abs=1e-3))  # None: unknown
        runs = {p.parent.name for p in (tmp_path / "run" / "confirm").glob("*/result.json")}
        # the rounds, and a late loss-parity check (parity-NNNN) where the best's trial did not run it
        expected = {f"{i:02d}-{role}" for i in range(rounds) for role in ("baseline", "best")}
        assert {r for r in runs if not r.startswith("parity-") and "-again" not in r} == expected
    else:
        assert run.best is run.baseline


def test_the_plain_reader_searches_workload_args_as_the_spec_does(tmp_path):
    import runpy

    script = runpy.run_path(str(ROOT / "scripts" / "search_no_ray.py"), run_name="search_no_ray")
    spec = write_spec(tmp_path / "spec.yaml", search_space={
        "preset": "default", "workload_args": {"gpu_normalize": {"values": [False, True], "safety": "safe",
                                                                 "stage": "loader"}, "width": [8, 16]}})
    plain = script["_read_plain"](spec)["search_space"]
    typed = script["read_spec"](spec)[0]["search_space"]  # autotune.spec, pydantic installed here
    assert plain["user"] == typed["user"] == {"gpu_normalize": {"safety": "safe", "stage": "loader"},
                                              "width": {"safety": "dynamics", "stage": None}}
    assert plain["lists"] == typed["lists"] and plain["lists"]["args.gpu_normalize"] == [False, True]
    bad = write_spec(tmp_path / "bad.yaml", search_space={"workload_args": {"width": {"values": [8], "stage": "gpu"}}})
    with pytest.raises(script["SpecError"], match="search_space.workload_args.width: give a list of values or"):
        script["_read_plain"](bad)


def test_ranks_spread_over_nodes_are_refused_without_ray(tmp_path):
    spec = write_spec(tmp_path / "spread.yaml", output_dir=str(tmp_path / "run"),
                      resources={"device": "cpu", "ranks_per_trial": 2, "rank_placement": "spread"})
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "search_no_ray.py"), str(spec)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    assert proc.stderr.strip().splitlines()[-1].startswith("error: resources.rank_placement: spread puts ranks on")
