"""Multi-rank trials across nodes through Ray (`resources.rank_placement: spread`).

The Tune trial asks for a STRICT_SPREAD placement group of one bundle per rank
(1/ranks of the trial's resources each) and an empty head bundle, so the trial
itself holds nothing and runs on the first bundle's node, rank 0's. There it
picks MASTER_ADDR (its node's IP) and a port free there, and starts each rank as
a Ray task on its bundle (PlacementGroupSchedulingStrategy): the runner in a
fresh process from that node's warm launcher, with the environment torchrun
sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; one local rank per node).
Each rank joins the process group and runs its window between the same
barriers as on one node (`autotune.trial.ranks`); their results merge into one.

When a rank fails, or its worker or node dies, the other ranks' tasks are
cancelled (their processes killed), and the trial fails with that rank named.

Ray Train's TorchTrainer would do the same inside the trial, at a start-up cost
measured in scripts/bench/bench_rank_startup.py; these tasks reuse the launcher's
warm fork server on each node, which TorchTrainer's fresh workers cannot.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path

from autotune.trial import ranks as R
from autotune.execution.launcher import run_in_process
from autotune.execution.settings import RunSettings
from autotune.trial.result import TrialResult, failed
from autotune.workload import PICKLE_FILE

SPREAD = "STRICT_SPREAD"
STOP_GRACE_S = 10.0  # once a rank failed, how long the others may take to report before they are stopped


def spreads(rank_placement: str, ranks: int) -> bool:
    return rank_placement == "spread" and ranks > 1


def rank_bundles(resources: dict[str, float], ranks: int) -> list[dict[str, float]]:
    """One bundle per rank: 1/ranks of the trial's resources each."""
    return [{k: v / ranks for k, v in resources.items() if v}] * ranks


def placement(resources: dict[str, float], rank_placement: str, ranks: int):
    """The Tune trial's reservation: `resources` in one bundle (one node), or,
    spread, an empty head bundle and one bundle per rank on distinct nodes (a Ray Tune
    `PlacementGroupFactory`)."""
    from ray import tune

    if not spreads(rank_placement, ranks):
        return tune.PlacementGroupFactory([resources])
    return tune.PlacementGroupFactory([{}] + rank_bundles(resources, ranks), strategy=SPREAD)


def problem(rank_placement: str, device) -> str | None:
    """Why the device's ranks cannot be spread over this Ray cluster (bad input), or None."""
    ranks = device.ranks
    if not spreads(rank_placement, ranks):
        return None
    import ray

    kind = "GPU" if device.type == "cuda" else "CPU"
    nodes = sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get(kind, 0) > 0)
    if nodes < ranks:
        return (
            f"resources.rank_placement: spread puts one rank per node, and the Ray cluster has {nodes} node"
            f"{'s' * (nodes != 1)} with a {kind} for {ranks} ranks; lower resources.ranks_per_trial to {nodes}, "
            "run on a cluster with more nodes (resources.ray_address), or use rank_placement: pack"
        )
    return None


def one_node(device, rank_placement: str):
    """The device as one node sees it: spread, one rank (for the checks of a node's CPUs)."""
    import dataclasses

    return dataclasses.replace(device, ranks=1) if spreads(rank_placement, device.ranks) else device


def node_env(r: int, ranks: int, addr: str, port: int) -> dict[str, str]:
    """What torchrun sets for rank `r` of `ranks`, one rank per node."""
    return {
        "RANK": str(r),
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(r),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }


def _rank(r: int, request: dict, settings: RunSettings, env: dict, where: tuple[str, str]) -> tuple[TrialResult, str]:
    """A Ray task on rank `r`'s bundle: the runner as that rank in a fresh process,
    in a temporary copy of the run dir's layout (`where`: its last two levels, so
    a pickled factory's relative path resolves); its result and its log."""
    import ray

    root = Path(tempfile.mkdtemp(prefix=f"autotune-{where[1]}-r{r}-"))
    work = root / where[0] / where[1]
    try:
        if settings.workload_pickle:
            (root / PICKLE_FILE).write_bytes(settings.workload_pickle)
        result = run_in_process(
            request,
            work,
            settings.timeout_s,
            settings.user_path,
            settings.thread_env,
            env=env,
            limits=settings.limits(request),
        )
        log = work / "trial.log"
        text = log.read_text(errors="replace") if log.exists() else ""
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result.rank = r if result.rank is None else result.rank
    result.node_ip, result.node_id = ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()
    return result, text


def run_spread(request: dict, settings: RunSettings, trial_dir: Path) -> TrialResult:
    """In the Tune trial, on rank 0's node: run request["ranks"] ranks, one per
    bundle of the trial's placement group; write config.json, result.json (the
    merged result), trial.log (rank 0's) and rank<R>.log into `trial_dir`."""
    started = time.perf_counter()
    with _group(settings) as pg:
        ranks, (addr, port) = request["ranks"], _master(pg)
        results, logs = _wait(_start(pg, ranks, request, settings, addr=addr, port=port, trial_dir=trial_dir))
    merged = R.merge(list(results.values()))
    for part in merged.ranks:  # where each rank ran
        part.node_ip, part.node_id = results[part.rank].node_ip, results[part.rank].node_id
    merged.launcher, merged.master_addr = results[0].launcher, addr
    merged.ranks_wall_s = merged.trial_wall_s = time.perf_counter() - started
    _write(trial_dir, request, merged, logs)
    return merged


@contextlib.contextmanager
def _group(settings: RunSettings):
    """The trial's placement group; outside a Tune trial (a re-measurement's
    actor, autotune.decide.confirm), one of its own from settings.rank_bundles."""
    import ray

    pg = ray.util.get_current_placement_group()
    if pg is not None:
        yield pg
        return
    pg = ray.util.placement_group(settings.rank_bundles, strategy=SPREAD)
    try:
        ray.get(pg.ready())
        yield pg
    finally:
        ray.util.remove_placement_group(pg)


def _master(pg) -> tuple[str, int]:
    """Rank 0's node IP and a port free there (MASTER_ADDR, MASTER_PORT)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if ray.util.placement_group_table(pg)["bundles_to_node_id"][0] == ray.get_runtime_context().get_node_id():
        return ray.util.get_node_ip_address(), R.free_port(ray.util.get_node_ip_address())
    probe = ray.remote(lambda: (ray.util.get_node_ip_address(), R.free_port(ray.util.get_node_ip_address())))
    return ray.get(
        probe.options(
            num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
        ).remote()
    )


def _start(pg, ranks: int, request: dict, settings: RunSettings, *, addr: str, port: int, trial_dir: Path) -> dict:
    """One Ray task per rank on its bundle; {ref: rank}."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    task = ray.remote(_rank)
    refs = {}
    for r, bundle in enumerate(pg.bundle_specs[:ranks]):
        options = {
            "num_cpus": bundle.get("CPU", 0),
            "num_gpus": bundle.get("GPU", 0),
            "max_retries": 0,
            "resources": {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")},
            "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
        }
        ref = task.options(**options).remote(
            r, request, settings, node_env(r, ranks, addr, port), (trial_dir.parent.name, trial_dir.name)
        )
        refs[ref] = r
    return refs


def _wait(refs: dict) -> tuple[dict[int, TrialResult], dict[int, str]]:
    """Every rank's result; once one fails (or its worker or node dies), the
    others have STOP_GRACE_S to report (the rank that failed first may be
    still on its way, the first to report only broken by it), then are
    cancelled, their processes killed with their Ray workers."""
    import ray

    results, logs, pending = {}, {}, list(refs)
    while pending:
        broken = any(x.status not in ("ok", "pruned") for x in results.values())
        done, pending = ray.wait(
            pending, num_returns=len(pending) if broken else 1, timeout=STOP_GRACE_S if broken else None
        )
        for ref in done:
            results[refs[ref]], logs[refs[ref]] = _collect(ref, refs[ref])
        if broken:
            for ref in pending:
                ray.cancel(ref, force=True)
                results[refs[ref]] = failed(
                    "error", "RankStopped", "stopped: another rank failed", rank=refs[ref], metrics={}
                )
            pending = []
    return results, logs


def _collect(ref, r: int) -> tuple[TrialResult, str]:
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:  # its worker or node died: the cause, before the ranks it broke
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        return failed(
            "error", type(e).__name__, f"its Ray worker or node died: {why}", rank=r, metrics={}, ended_unix=0.0
        ), ""


def _write(trial_dir: Path, request: dict, merged: TrialResult, logs: dict[int, str]) -> None:
    import json

    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "config.json").write_text(json.dumps(request, indent=2) + "\n")
    merged.write(trial_dir / "result.json")  # the contract (autotune.trial.result), checked
    for r, text in logs.items():
        (trial_dir / ("trial.log" if r == 0 else f"rank{r}.log")).write_text(text)
