"""Multi-rank trials through Ray tasks on a placement group's bundles (autotune.execution.spread):
a failing rank, on the shared local Ray. One rank per node is tests/test_cluster.py's."""

import os
import time

import pytest

from autotune.trial.result import TrialResult

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("ray_local")]


def test_a_failing_rank_stops_the_other_and_the_trial_names_it(tmp_path):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from autotune.execution.spread import run_spread

    request = {
        "workload": {"factory": "tests.workloads:make_rank_one_fails"},
        "knobs": {},
        "warmup_steps": 2,
        "measure_steps": 6,
        "profile_steps": 0,
        "diagnose": False,
        "device": "cpu",
        "ranks": 2,
        "dist_timeout_s": 200,
    }
    from autotune.execution.settings import RunSettings

    # the request is the one given here (run_spread is handed it built): no request builder needed
    settings = RunSettings(request=None, timeout_s=240, run_dir=str(tmp_path), user_path=os.getcwd())
    pg = placement_group([{"CPU": 0.5}] * 2, strategy="PACK")  # one node here: the group, not the spread, is tested
    ray.get(pg.ready())
    trial_dir = tmp_path / "trials" / "0000"
    try:
        started = time.perf_counter()
        result = ray.get(
            ray.remote(run_spread)
            .options(
                num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
            )
            .remote(request, settings, trial_dir)
        )
        wall = time.perf_counter() - started
    finally:
        remove_placement_group(pg)
    assert result.status == "error" and result.error.startswith("rank 1: rank 1 cannot build its model")
    assert {r.rank: r.status for r in result.ranks} == {0: "error", 1: "error"}
    assert wall < 120  # rank 0 was stopped, not left waiting for the group's timeout (200 s)
    assert TrialResult.read(trial_dir / "result.json").error == result.error
    assert {"config.json", "trial.log", "rank1.log"} <= {p.name for p in trial_dir.iterdir()}


def test_spreading_more_ranks_than_nodes_is_a_spec_error(tmp_path):
    from autotune import spec as S
    from autotune.execution.driver import run

    data = {
        "workload": {"name": "tiny_transformer"},
        "output_dir": str(tmp_path / "run"),
        "search_space": {"preset": None, "knobs": {"ddp_static_graph": [False, True]}},
        "resources": {"device": "cpu", "ranks_per_trial": 2, "rank_placement": "spread"},
    }
    with pytest.raises(
        S.SpecError,
        match=r"resources.rank_placement: spread puts one rank per node, and the Ray "
        r"cluster has 1 node with a CPU for 2 ranks; lower resources.ranks_per_trial to 1",
    ):
        run(S.parse(data, "bad.yaml"))
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_spread_ranks_are_checked_against_one_node_s_cpus_one_rank_each():
    from autotune import knobs as K
    from autotune.trial import ranks as R
    from autotune.execution.spread import one_node

    device = K.Device("cpu", 2, "cpu", ranks=4)  # four 2-CPU nodes would run it spread, not packed
    assert R.search_problem(one_node(device, "spread"), None, None, {}, {}) is None
    assert R.search_problem(one_node(device, "pack"), None, None, {}, {}).startswith(
        "resources.ranks_per_trial: 4 ranks"
    )
