"""What starting a multi-rank trial through Ray costs: autotune.execution.spread's Ray
tasks on a placement group's bundles (each rank the runner in a fresh process
from that node's warm fork server) against Ray Train's TorchTrainer (its worker
actors set up the process group, each runs the runner as one rank), side by side.

One short 2-rank trial of the same config per approach and round, interleaved
(a drift of the machine hits both alike), on a local Ray (one node, ranks packed:
the start-up path is the same as across nodes, less the network). Per trial:
`wall_s` (call to result), `runner_s` (rank 0's runner, group joined to result:
the same work in both) and `startup_s` = wall_s - runner_s, what the approach
adds. Round 1 is cold (fresh workers, the fork server's imports); later rounds
show what a search pays per trial: the tasks' Ray workers (and their warm fork
servers) are reused when still idle, while the trainer starts fresh worker
actors every time. Median and minimum of the warm rounds.

    python scripts/bench/bench_rank_startup.py --rounds 4
    python scripts/bench/bench_rank_startup.py --rounds 1 --approaches tasks   # the smallest run

Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local Ray on 127.0.0.1 (docs/design.md)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

import ray  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from autotune.execution.settings import RunSettings  # noqa: E402
from autotune.execution.spread import run_spread  # noqa: E402
from autotune.trial.result import TrialResult  # noqa: E402

CONFIG = {
    "workload": {"name": "tiny_transformer", "args": {"batch_size": 8}},
    "knobs": {},
    "warmup_steps": 2,
    "measure_steps": 4,
    "profile_steps": 0,
    "diagnose": False,
    "device": "cpu",
    "ranks": 2,
}


def by_tasks(tmp: Path, i: int) -> dict:
    settings = RunSettings(request=None, timeout_s=300, run_dir=str(tmp), user_path=str(ROOT))
    pg = placement_group([{"CPU": 0.5}] * 2, strategy="PACK")
    ray.get(pg.ready())
    try:
        started = time.perf_counter()
        result = ray.get(
            ray.remote(run_spread)
            .options(
                num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
            )
            .remote(CONFIG, settings, tmp / "tasks" / f"{i:04d}")
        )
        wall = time.perf_counter() - started
    finally:
        remove_placement_group(pg)
    return {"status": result.status, "wall_s": wall, "runner_s": result.trial_s}


def _train_loop(config: dict) -> None:
    """In a TorchTrainer worker: its process group is up; the runner runs this rank."""
    import torch.distributed as dist

    from autotune.trial.runner import run_trial

    result = run_trial(CONFIG)
    result.write(Path(config["out"], f"rank{dist.get_rank()}.json"))


def by_trainer(tmp: Path, i: int) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = tmp / "trainer" / f"{i:04d}"
    out.mkdir(parents=True)
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"out": str(out)},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name=f"t{i}", storage_path=str(tmp / "ray_train")),
    )
    started = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - started
    result = TrialResult.read(out / "rank0.json")
    return {"status": result.status, "wall_s": wall, "runner_s": result.trial_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4, help="trials per approach (the first is cold)")
    p.add_argument("--approaches", default="tasks,trainer", help="comma-separated, of: tasks, trainer")
    args = p.parse_args()
    approaches = [a for a in args.approaches.split(",") if a]
    if not approaches or set(approaches) - {"tasks", "trainer"}:
        p.error(f"--approaches {args.approaches}: allowed: tasks, trainer")
    tmp = Path(tempfile.mkdtemp(prefix="rankstart", dir=os.environ.get("TMPDIR")))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    rows = {name: [] for name in approaches}
    print(f"{'round':>5}  {'approach':<8}  {'wall_s':>7}  {'runner_s':>8}  {'startup_s':>9}")
    try:
        for i in range(args.rounds):
            for name in approaches if i % 2 == 0 else approaches[::-1]:
                r = (by_tasks if name == "tasks" else by_trainer)(tmp, i)
                if r["status"] != "ok":
                    raise SystemExit(f"{name}: the trial failed ({r['status']})")
                r["startup_s"] = r["wall_s"] - r["runner_s"]
                rows[name].append(r)
                print(
                    f"{i + 1:>5}  {name:<8}  {r['wall_s']:>7.2f}  {r['runner_s']:>8.2f}  {r['startup_s']:>9.2f}",
                    flush=True,
                )
    finally:
        ray.shutdown()
    summary = {
        name: {
            "cold_startup_s": rs[0]["startup_s"],
            "warm_startup_s_median": statistics.median(r["startup_s"] for r in rs[1:]) if len(rs) > 1 else None,
            "warm_startup_s_min": min(r["startup_s"] for r in rs[1:]) if len(rs) > 1 else None,
            "warm_wall_s_median": statistics.median(r["wall_s"] for r in rs[1:]) if len(rs) > 1 else None,
        }
        for name, rs in rows.items()
    }
    print(f"\n{'approach':<8}  {'cold startup_s':>14}  {'warm startup_s: median':>22}  {'min':>6}")
    for name, s in summary.items():
        median, low = (
            None if v is None else round(v, 2) for v in (s["warm_startup_s_median"], s["warm_startup_s_min"])
        )
        print(f"{name:<8}  {s['cold_startup_s']:>14.2f}  {median!s:>22}  {low!s:>6}")
    print(json.dumps({"rounds": args.rounds, "workload": CONFIG["workload"]["name"], "ranks": 2, **summary}))


if __name__ == "__main__":
    main()
