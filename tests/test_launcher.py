"""Trials start warm (a fork server) and still start clean: nothing one trial
leaves in its process reaches the next."""

import json
import os
import subprocess
import sys

import pytest

from autotune.execution.launcher import SharedForkServer, _servers, run_in_process, trial_env

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
        # the server's imports are frozen out of the collector: a full collection in a
        # trial would touch every page it shares with the server (a ~200-ms copy-on-write
        # stall inside a tiny_cnn window: step-time CV 1.2 against 0.1 spawned)
        assert all(s["frozen"] > 10_000 for s in seen)


@pytest.mark.timeout(120)
def test_a_hung_trial_is_killed_at_its_timeout_with_the_fork_server(tmp_path):
    config = {"workload": {"factory": "tests.workloads:make_faulty"}, "knobs": {"batch_size": 64}, "warmup_steps": 1,
              "measure_steps": 3, "profile_steps": 0, "diagnose": False}
    result = run_in_process(config, tmp_path, 8, str(tmp_path.cwd()), {}, launcher="fork")
    assert (result["status"], result["error"]) == ("timeout", "trial ran past timeout_s=8 and was killed")
    assert 8 <= result["trial_wall_s"] < 30


@pytest.mark.timeout(200)
def test_one_shared_fork_server_serves_every_process_of_a_search(tmp_path):
    """A local search's driver starts one server (autotune.driver); its trials'
    actors and the driver itself fork from it. Each trial is a fresh child of a
    handler, with exactly its request's environment (not the server's), and
    nothing outlives the server's lifeline."""
    cwd = str(tmp_path.cwd())
    server = SharedForkServer({**trial_env(cwd, {}), "AUTOTUNE_TEST_SERVER_ONLY": "1"}, ("tests.workloads",))
    try:
        results = [run_in_process(CONFIG, tmp_path / str(i), 120, cwd, {}, env={"AUTOTUNE_TEST_MARK": str(i)},
                                  shared=server.path) for i in range(2)]
        # another process of the search (a Ray actor's, in a search)
        script = (f"from autotune.execution.launcher import run_in_process; import json; print(json.dumps(run_in_process("
                  f"{CONFIG!r}, {str(tmp_path / '2')!r}, 120, {cwd!r}, {{}}, env={{'AUTOTUNE_TEST_MARK': '2'}}, "
                  f"shared={server.path!r})))")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=cwd)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        assert [(r["status"], r["launcher"]) for r in results] == [("ok", "shared")] * 3, results
        seen = [json.loads((tmp_path / str(i) / "seen.json").read_text()) for i in range(3)]
        assert [s["mark"] for s in seen] == ["0", "1", "2"] and not any(s["server_only"] for s in seen)
        assert len({s["pid"] for s in seen}) == 3 and {s["grandparent"] for s in seen} == {server.proc.pid}
        for s in seen:  # every trial finds the defaults the trial before it changed
            assert (s["cudnn_benchmark"], s["matmul_precision"], s["leaked_tensors"]) == (False, "highest", 0)
        handlers = {s["ppid"] for s in seen}
        assert len(handlers) == 2  # one per connection: this process's (reused), the other process's
    finally:
        server.close()
    assert server.proc.returncode is not None and not os.path.exists(server.dir)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in handlers)


def test_a_shared_server_that_is_not_there_falls_back_to_this_process_own(tmp_path):
    result = run_in_process(CONFIG, tmp_path, 120, str(tmp_path.cwd()), {}, shared=str(tmp_path / "no-socket"))
    assert (result["status"], result["launcher"]) == ("ok", "fork"), result
