"""torch.compile paid once: its cost measured apart (compile_s), the search's trials sharing one compile cache, and
the winner's compiled artifacts bundled for production and loaded there, a stale one said in one line."""

import json
import tarfile
from pathlib import Path

import pytest

from autotune.execution.launcher import Launch, compile_caches, run_in_process
from autotune.trial import compiled

ROOT = str(Path(__file__).resolve().parent.parent)


def test_a_search_shares_one_compile_cache_and_a_trial_alone_keeps_its_own(tmp_path):
    shared = compile_caches(tmp_path / "trials" / "0003", str(tmp_path / "compile-cache"))
    assert shared == {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "compile-cache" / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "compile-cache" / "triton"),
    }
    own = compile_caches(tmp_path / "trials" / "0003")
    assert own["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "trials" / "0003" / "inductor-cache")


def _trial_with_artifacts(trial_dir: Path, meta: dict) -> None:
    trial_dir.mkdir(parents=True)
    (trial_dir / compiled.ARTIFACTS_FILE).write_bytes(b"not torch's: only carried")
    (trial_dir / compiled.META_FILE).write_text(json.dumps(meta))


def test_the_winners_artifacts_are_bundled_with_the_caches_kernels_not_its_graph_entries(tmp_path):
    _trial_with_artifacts(tmp_path / "trial", {"torch": "2.14.1", "device": "cpu: X"})
    cache = tmp_path / "inductor"
    for name in ("ab/cab.so", "ab/cab.cpp", "fxgraph/x/entry", "aotautograd/y/entry", "ab/cab.so.lock"):
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(b"x")
    said = compiled.bundle(tmp_path / "trial", cache, tmp_path / compiled.BUNDLE_FILE)
    assert said == {"file": compiled.BUNDLE_FILE, "torch": "2.14.1", "device": "cpu: X", "kernels": 2}
    with tarfile.open(tmp_path / compiled.BUNDLE_FILE) as tar:
        assert sorted(tar.getnames()) == sorted(
            [compiled.ARTIFACTS_FILE, compiled.META_FILE, "kernels/ab/cab.cpp", "kernels/ab/cab.so"]
        )
    assert compiled.bundle(tmp_path / "nothing", cache, tmp_path / "other.tar") is None  # the best compiled nothing


def test_a_stale_artifact_is_one_line_and_production_compiles_as_usual(tmp_path):
    _trial_with_artifacts(tmp_path / "trial", {"torch": "1.0.0", "device": "cpu: another"})
    compiled.bundle(tmp_path / "trial", None, tmp_path / compiled.BUNDLE_FILE)
    line = compiled.load(tmp_path / compiled.BUNDLE_FILE, "cpu")
    assert line.startswith(f"autotune: {compiled.BUNDLE_FILE} is stale (made with torch 1.0.0, this is torch 2.")  # noqa: E501
    assert line.endswith("): compiling as usual") and "\n" not in line
    assert compiled.load(tmp_path / compiled.BUNDLE_FILE, "cpu") == ""  # once a process
    assert (
        compiled.load(tmp_path / "gone.tar", "cpu")
        == f"autotune: {tmp_path / 'gone.tar'} not found: compiling as usual"
    )


@pytest.mark.slow  # two compiles (~15-30 s cold on this CPU); in CI: the window's compile (test_measure), the cache's
# dirs and the bundle above (bench_compile.py's smoke, slow too: a compile, its artifacts loaded in production)
@pytest.mark.timeout(600)
def test_a_repeat_of_a_compiled_graph_compiles_from_the_searchs_cache(tmp_path):
    config = {
        "workload": {"factory": "tests.workloads:make_recording"},
        "knobs": {"compile": "default"},
        "warmup_steps": 2,
        "measure_steps": 5,
        "min_window_s": 0.1,
        "max_window_s": 0.3,
        "profile_steps": 0,
        "diagnose": False,
    }
    launch = Launch(compile_cache=str(tmp_path / "compile-cache"))
    graphs = tmp_path / "compile-cache" / "inductor" / "fxgraph"
    first = run_in_process(config, tmp_path / "0", 400, ROOT, {}, launch=launch)
    made = sorted(p.relative_to(graphs) for p in graphs.rglob("*") if p.is_file())
    again = run_in_process(config, tmp_path / "1", 400, ROOT, {}, launch=launch)
    assert first.status == again.status == "ok", (first.error, again.error)
    assert first.metrics["compile_s"] > 0 and again.metrics["compile_s"] > 0  # each measured its own compile
    # the repeat compiled nothing new: its graphs are the first one's cache entries (its seconds, at most a third
    # of the first's, are bench_compile.py's figure: no timing here)
    assert made and sorted(p.relative_to(graphs) for p in graphs.rglob("*") if p.is_file()) == made
    meta = json.loads((tmp_path / "1" / compiled.META_FILE).read_text())
    assert (
        meta["torch"]
        and meta["device"].startswith("cpu: ")
        and (tmp_path / "1" / compiled.ARTIFACTS_FILE).stat().st_size
    )
    assert not (tmp_path / "0" / "inductor-cache").exists()
