"""Multi-rank trials (autotune.trial.ranks): real gloo process groups of 2 ranks on 127.0.0.1,
tiny models, few steps."""

import json
import os
import subprocess
import sys

import pytest

from autotune.execution.launcher import Launch, run_in_process
from autotune.trial.result import TrialResult

pytestmark = pytest.mark.timeout(300)

SHORT = {
    "warmup_steps": 2,
    "measure_steps": 6,
    "min_window_s": 0.4,
    "profile_steps": 0,
    "diagnose": False,
    "device": "cpu",
    "ranks": 2,
}


def trial(tmp_path, knobs, workload=None, launcher="fork", **extra):
    config = {
        "workload": workload or {"name": "tiny_transformer", "args": {"batch_size": 8}},
        "knobs": knobs,
        **SHORT,
        **extra,
    }
    return run_in_process(config, tmp_path, timeout_s=240, pythonpath=os.getcwd(), launch=Launch(launcher))


def test_a_two_rank_ddp_trial_is_one_result_with_its_ranks(tmp_path):
    result = trial(tmp_path, {"ddp_bucket_cap_mb": 1, "ddp_gradient_as_bucket_view": True, "ddp_static_graph": True})
    assert result.status == "ok", result
    m, ranks = result.metrics, result.ranks
    assert m["ranks"] == 2 and [r.rank for r in ranks] == [0, 1] and all(r.status == "ok" for r in ranks)
    # every rank ran the same steps, as many as min_window_s needs at the warm-up's step time (at least
    # measure_steps); the window is the slowest rank's and the throughput global
    steps = ranks[0].metrics["window_steps"]
    assert [r.metrics["window_steps"] for r in ranks] == [steps, steps] and steps >= 6
    assert m["window_s"] == max(r.metrics["window_s"] for r in ranks)
    assert steps == 6 or m["window_s"] > 0.5 * 0.4  # sized for min_window_s (0.4 s) from the warm-up's pace
    assert m["step_ms_mean"] == max(r.metrics["step_ms_mean"] for r in ranks)
    assert m["samples_per_s"] == pytest.approx(2 * 8 * steps / m["window_s"])
    assert m["rank_samples_per_s_min"] <= m["rank_samples_per_s_max"] < m["samples_per_s"]
    assert 0 <= m["comm_frac"] < 1 and m["step_ms_unsynced"] > 0
    assert 0.01 < m["mem_rss_peak_gib"] <= m["mem_rss_peak_total_gib"] < 32
    assert result.knobs["ddp_bucket_cap_mb"] == 1 and result.launcher == "fork"
    assert not list(tmp_path.glob("rank*.json"))  # read back from a temporary dir, nothing left behind


def test_fsdp_with_checkpointing_runs_spawned(tmp_path):
    result = trial(
        tmp_path,
        {"sharding": "fsdp", "fsdp_reshard_after_forward": False, "activation_checkpointing": True},
        launcher="spawn",
    )
    assert result.status == "ok", result
    assert result.metrics["ranks"] == 2 and result.metrics["samples_per_s"] > 0


def test_a_failing_rank_stops_the_others_and_names_itself(tmp_path):
    # spawned: a fork server preloading tests.workloads is test_launcher's to count
    result = trial(
        tmp_path, {}, workload={"factory": "tests.workloads:make_rank_one_fails"}, launcher="spawn", dist_timeout_s=200
    )
    assert result.status == "error"
    assert result.error.startswith("rank 1: rank 1 cannot build its model")
    assert result.trial_wall_s < 120  # rank 0 was killed, not left waiting for the group's timeout
    assert {r.rank: r.status for r in result.ranks} == {0: "error", 1: "error"}


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"ranks": 64}, "ranks=64: more ranks than CPUs"),
        ({"backend": "nccl"}, "backend='nccl' needs CUDA devices"),
        ({"knobs": {"sharding": "fsdp"}, "workload": {"name": "tiny_cnn"}}, "sharding=fsdp shards per repeated block"),
    ],
)
def test_bad_multi_rank_input_is_one_line_and_exit_2(tmp_path, extra, message):
    config = {"workload": {"name": "tiny_transformer"}, "knobs": {}, **SHORT, **extra}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.trial", str(path)], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, proc.stderr


SEARCHES = {  # the CI's 2-rank searches: what each measures, and its trials
    "tiny_transformer": dict(
        workload={"name": "tiny_transformer", "args": {"batch_size": 8}},
        knobs={
            "ddp_bucket_cap_mb": [25, 1],
            "ddp_static_graph": [False, True],
            "activation_checkpointing": [False, True],
        },
        baseline={},
        search={"n_trials": 3},
        warmup=2,
        steps=6,
    ),
    # ResNet-18 at CIFAR's 32x32, its blocks checkpointed in every trial (the baseline's), the grid's 2 points
    "resnet18_cifar": dict(
        workload={"name": "resnet18_cifar", "args": {"batch_size": 4, "image_size": 32}},
        knobs={"ddp_static_graph": [False, True]},
        baseline={"activation_checkpointing": True, "ddp_gradient_as_bucket_view": True},
        search={"n_trials": 2, "sampler": "grid"},
        warmup=1,
        steps=2,
    ),
}


@pytest.mark.usefixtures("ray_local")
@pytest.mark.slow  # CI tier: test_program's 2-rank torchrun program search, test_a_two_rank_ddp_trial_is_one_result
@pytest.mark.parametrize("name", SEARCHES)
def test_a_two_rank_search_through_ray_records_ranks_throughput_comm_and_memory(tmp_path, name):
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from autotune import spec as S
    from autotune.execution.driver import run

    case = SEARCHES[name]
    spec = S.parse(
        {
            "name": "ddp",
            "workload": case["workload"],
            "baseline": case["baseline"],
            "search_space": {"preset": None, "knobs": case["knobs"]},
            "resources": {"device": "cpu", "ranks_per_trial": 2},
            "trial": {
                "warmup_steps": case["warmup"],
                "measure_steps": case["steps"],
                "profile_steps": 0,
                "diagnose": False,
                "timeout_s": 120,
            },
            "search": {**case["search"], "seed": 0, "confirm_rounds": 0},
            "output_dir": str(tmp_path / "run"),
        },
        "ddp.yaml",
    )
    result = run(spec)
    assert all(r.status == "ok" for r in result.records), [(r.error_type, r.error) for r in result.records]
    assert len(result.records) == case["search"]["n_trials"] and result.device.ranks == 2
    rows = pd.read_csv(result.run_dir / "trials.csv")
    for column in (
        "ranks",
        "samples_per_s",
        "rank_samples_per_s_min",
        "rank_samples_per_s_max",
        "comm_frac",
        "mem_rss_peak_gib",
        "mem_rss_peak_total_gib",
        "mem_inuse_peak_gib",
        "mem_inuse_step_gib",
        "ddp_bucket_cap_mb",
        "ddp_static_graph",
        "activation_checkpointing",
    ):
        assert rows[column].notna().all(), column
    assert (rows["ranks"] == 2).all() and (rows["rank_samples_per_s_max"] < rows["samples_per_s"]).all()
    # scaling efficiency: the baseline measured once more on one rank (one rank's thread), recorded with it;
    # every trial whose knobs differ from the baseline's in DDP arguments alone gets the efficiency, others none
    base = rows[rows["baseline"]].iloc[0]
    reference = TrialResult.read(result.run_dir / "trials" / "0000" / "scaling-reference" / "result.json")
    assert reference.ok and reference.knobs["num_threads"] == 1 and reference.ranks is None
    from autotune.knobs import KNOBS
    from autotune.records.scaling import ACROSS_RANKS

    # one rank runs with the DDP/FSDP knobs at their defaults (the resnet case's baseline sets one: it cannot apply)
    assert all(reference.knobs[k] == KNOBS[k].pytorch_default for k in ACROSS_RANKS)
    assert base["scaling_reference_samples_per_s"] == pytest.approx(reference.metrics["samples_per_s"])
    for _, row in rows.iterrows():
        same = row["activation_checkpointing"] == base["activation_checkpointing"]
        assert pd.isna(row["scaling_efficiency"]) != same, row.to_dict()
        if same:
            assert row["scaling_efficiency"] == pytest.approx(
                row["samples_per_s"] / (2 * base["scaling_reference_samples_per_s"])
            )
    from autotune.cli import report

    assert "scaling efficiency" in report.as_markdown(result)  # the baseline has it (the best too, or "-")
    client = MlflowClient(f"sqlite:///{result.run_dir}/mlflow.db")
    run_id = result.records[0].mlflow_run_id
    metrics = client.get_run(run_id).data.metrics
    assert metrics["ranks"] == 2 and {
        "comm_frac",
        "mem_rss_peak_gib",
        "mem_inuse_peak_gib",
        "rank_samples_per_s_min",
        "scaling_efficiency",
        "scaling_reference_samples_per_s",
    } <= set(metrics)
    if name == "resnet18_cifar":  # the grid's two points, both with checkpointed blocks
        assert set(rows["ddp_static_graph"]) == {False, True} and rows["activation_checkpointing"].all()
        return
    # exported = measured: cfg.wrap in a torchrun-launched plain loop (scripts/bench/bench_exported.py), a smoke run
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/bench/bench_exported.py",
            str(result.run_dir),
            "--reps",
            "1",
            "--warmup",
            "2",
            "--window-s",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ranks"] == 2 and report["plain"]["best"] > 0 and report["plain"]["baseline"] > 0


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"resources": {"device": "cpu", "ranks_per_trial": 64}},
            "resources.ranks_per_trial: 64 ranks, but the largest node",
        ),
        (
            {
                "workload": {"name": "tiny_cnn"},
                "resources": {"device": "cpu", "ranks_per_trial": 2},
                "search_space": {"preset": None, "knobs": {"sharding": ["ddp", "fsdp"]}},
            },
            "sharding='fsdp' needs the model's repeated blocks, and it has no module class with two or more instances",
        ),
    ],
)
def test_bad_multi_rank_specs_are_spec_errors(tmp_path, overrides, message):
    from autotune import spec as S
    from autotune.execution.driver import run

    data = {
        "workload": {"name": "tiny_transformer"},
        "output_dir": str(tmp_path / "run"),
        "search_space": {"preset": None, "knobs": {"ddp_static_graph": [False, True]}},
        **overrides,
    }
    with pytest.raises(S.SpecError, match=message.replace("(", r"\(")):
        run(S.parse(data, "bad.yaml"))
