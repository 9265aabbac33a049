"""Trials start warm (a fork server) and still start clean: nothing one trial
leaves in its process reaches the next."""

import json

import pytest

from autotune.launcher import _servers, run_in_process

CONFIG = {"workload": {"factory": "tests.workloads:make_leaky"}, "knobs": {}, "warmup_steps": 1, "measure_steps": 3,
          "min_window_s": 0.1, "max_window_s": 0.3, "profile_steps": 0, "diagnose": False}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", ["fork", "spawn"])
def test_each_trial_starts_from_a_clean_process(tmp_path, launcher):
    seen = []
    for i in range(3):
        result = run_in_process(CONFIG, tmp_path / str(i), 120, str(tmp_path.cwd()), {}, launcher=launcher)
        assert result["status"] == "ok" and result["launcher"] == launcher, result
        seen.append(json.loads((tmp_path / str(i) / "seen.json").read_text()))
    assert len({s["pid"] for s in seen}) == 3  # a process per trial
    for s in seen:  # every trial finds the defaults the trial before it changed
        assert (s["cudnn_benchmark"], s["cuda_matmul_tf32"], s["matmul_precision"]) == (False, False, "highest")
        assert s["leaked_tensors"] == 0 and s["threads"] == seen[0]["threads"]  # the leak set 1
    if launcher == "fork":  # one warm server served them all, and never ran a trial itself
        [server] = [s for key, s in _servers.items() if "tests.workloads" in key[1]]
        assert server.alive() and server.proc.pid not in {s["pid"] for s in seen}


@pytest.mark.timeout(120)
def test_a_hung_trial_is_killed_at_its_timeout_with_the_fork_server(tmp_path):
    config = {"workload": {"factory": "tests.workloads:make_faulty"}, "knobs": {"batch_size": 64}, "warmup_steps": 1,
              "measure_steps": 3, "profile_steps": 0, "diagnose": False}
    result = run_in_process(config, tmp_path, 8, str(tmp_path.cwd()), {}, launcher="fork")
    assert (result["status"], result["error"]) == ("timeout", "trial ran past timeout_s=8 and was killed")
    assert 8 <= result["trial_wall_s"] < 30
