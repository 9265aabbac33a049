"""Compile paid once (issue 62): what production's first step costs with the search's compiled artifacts and
without them, and what a search's compile trials cost with the shared compile cache against main's.

`--part production`: a compiled trial of a built-in workload (tiny_transformer) in a search's compile cache, its
artifacts bundled as the search bundles its winner's (autotune.trial.compiled.bundle) beside a best_config.yaml
that sets `compile`; then production, a plain loop through `load_config(...).prepare(...)` as the README tells
production code to, each in a fresh process with an empty inductor cache of its own (a production machine's),
in pairs: the artifacts loaded, and the same file without them. Its first step (compile included) is the figure.
A stale bundle (another torch) is run once: its one line, and production runs.

`--part search`: `autotune search --budget B -- python tests/programs/lm_trainer.py ...` (an HfArgumentParser
causal-LM script, a padding collator) with this checkout and with another (`--main`, main's checkout), the same
seed and budget: the compile trials' first steps summed (both record `first_step_s`; this branch its compile
seconds too, `compile_s`), and each search's winner.

    python scripts/bench/bench_compile.py --part production --pairs 5                     # quiet host, ~6 min
    python scripts/bench/bench_compile.py --part search --budget 300 --main /work/main     # quiet host, ~12 min
    python scripts/bench/bench_compile.py --smoke                                          # CI: one pair, tiny

The first compiled trial runs again in the same cache first: a search's repeat of a compiled graph.

Done when (issue 62): a repeat's compile at most a third of the first's; production's first step with the artifacts >= 2x faster than without (median of the
pairs); the search's compile seconds at least halved against main, the same winner or better.

Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from autotune.export import load as best_config  # noqa: E402

ENV = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
LM_SCRIPT = "tests/programs/lm_trainer.py --output_dir out --max_steps 100000 --per_device_train_batch_size 4"
LM_SCRIPT += " --report_to none --disable_tqdm true"


def first_steps(config_path: str, workload: dict) -> dict:
    """Production (the child): the config's model prepared, its first and second steps timed (s)."""
    import torch

    from autotune import load_config
    from autotune.workload import load

    cfg = load_config(config_path)
    wl = load(workload["ref"], workload["args"])
    torch.manual_seed(0)
    model = wl.model()
    model, optimizer = cfg.prepare(model, wl.build_optimizer(model.parameters()))
    loader = torch.utils.data.DataLoader(wl.dataset, collate_fn=wl.collate_fn, **cfg.dataloader_kwargs())
    batches, out = iter(loader), {}
    for name in ("first_step_s", "second_step_s"):
        batch = cfg.to_device(next(batches), wl.preprocess)
        t = time.perf_counter()
        wl.loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out[name] = time.perf_counter() - t
    return out


def make_bundle(out: Path, workload: dict) -> tuple[Path, list[float]]:
    """A compiled trial (the search's trial process, its compile cache the search's), then a repeat of it in the
    same cache, and the first one's artifacts bundled beside a best_config.yaml that sets `compile`, as the export
    writes them: the file's path, and the two trials' compile seconds."""
    from autotune.execution.launcher import Launch, run_in_process
    from autotune.trial import compiled

    config = {
        "workload": {"name": workload["ref"], "args": workload["args"]},
        "knobs": {"compile": "default"},
        "warmup_steps": 2,
        "measure_steps": 3,
        "min_window_s": 0.1,
        "max_window_s": 0.3,
        "profile_steps": 0,
        "diagnose": False,
    }
    cache, compile_s = out / "compile-cache", []
    for name in ("trial", "repeat"):  # the same graph twice in the search's cache: the repeat's compile is a hit
        result = run_in_process(config, out / name, 900, str(ROOT), {}, launch=Launch(compile_cache=str(cache)))
        if result.status != "ok":
            raise SystemExit(f"the compiled trial failed: {result.error}")
        compile_s.append(result.metrics["compile_s"])
    best = {"knobs": {"compile": "default", "batch_size": workload["args"]["batch_size"]}, "device": {"type": "cpu"}}
    best["workload"] = {"name": workload["ref"], "args": workload["args"]}
    best["compile_artifacts"] = compiled.bundle(out / "trial", cache / "inductor", out / compiled.BUNDLE_FILE)
    if not best["compile_artifacts"]:
        raise SystemExit("the compiled trial saved no artifacts")
    (out / "best_config.yaml").write_text(yaml.safe_dump(best, sort_keys=False))
    without = {k: v for k, v in best.items() if k != "compile_artifacts"}
    (out / "without.yaml").write_text(yaml.safe_dump(without, sort_keys=False))
    return out / "best_config.yaml", compile_s


def production(config: Path, workload: dict) -> tuple[dict, str]:
    """One production process, its inductor and Triton caches empty and its own: (its steps, its stderr's
    autotune lines)."""
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as cold:
        env = {**ENV, "TORCHINDUCTOR_CACHE_DIR": f"{cold}/inductor", "TRITON_CACHE_DIR": f"{cold}/triton"}
        cmd = [sys.executable, __file__, "--child", str(config), json.dumps(workload)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise SystemExit(f"production with {config.name} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    said = "; ".join(line for line in proc.stderr.splitlines() if line.startswith("autotune: "))
    return json.loads(proc.stdout.strip().splitlines()[-1]), said


def stale_copy(out: Path) -> Path:
    """The bundle as another torch made it, beside a config of its own."""
    import io
    import tarfile

    from autotune.trial import compiled

    stale = out / "stale"
    stale.mkdir(exist_ok=True)
    with tarfile.open(out / compiled.BUNDLE_FILE) as src, tarfile.open(stale / compiled.BUNDLE_FILE, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name == compiled.META_FILE:
                data = json.dumps({**json.loads(data), "torch": "1.0.0"}).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    shutil.copy(out / "best_config.yaml", stale / "best_config.yaml")
    return stale / "best_config.yaml"


def run_production(args) -> dict:
    workload = {"ref": "tiny_transformer", "args": {"batch_size": 8, "seq_len": 16, "dim": 32, "layers": 1}}
    if not args.smoke:
        workload["args"] = {"batch_size": 16, "seq_len": 64, "dim": 128, "layers": 4}
    out = args.out / "production"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config, (first, repeat) = make_bundle(out, workload)
    print(
        f"a search's compile trial: {first:.1f} s compiling; a repeat of its graph: {repeat:.1f} s ({repeat / first:.0%})"
    )
    print(f"{'pair':>4}  {'artifacts':<9}  {'first step':>10}  {'second':>8}")
    firsts: dict[str, list[float]] = {"with": [], "without": []}
    loaded = ""
    for pair in range(args.pairs):
        for side in ("with", "without") if pair % 2 == 0 else ("without", "with"):
            steps, said = production(config if side == "with" else out / "without.yaml", workload)
            loaded = said if side == "with" else loaded
            firsts[side].append(steps["first_step_s"])
            print(f"{pair:>4}  {side:<9}  {steps['first_step_s']:>9.2f}s  {steps['second_step_s']:>7.3f}s", flush=True)
    _, stale_said = production(stale_copy(out), workload)
    median = {side: statistics.median(v) for side, v in firsts.items()}
    print(f"loaded: {loaded}\nstale: {stale_said}")
    print(f"first step: {median['without']:.2f} s without the artifacts, {median['with']:.2f} s with them: "
          f"{median['without'] / median['with']:.1f}x")  # fmt: skip
    return {
        "trial_compile_s": {"first": round(first, 2), "repeat": round(repeat, 2)},
        "first_step_s": {k: round(v, 3) for k, v in median.items()},
        "faster_x": round(median["without"] / median["with"], 2),
        "loaded": loaded,
        "stale": stale_said,
        "done": median["without"] / median["with"] >= 2 and "stale" in stale_said and repeat <= first / 3,
    }


def search_side(name: str, root: Path, args) -> dict:
    """One `autotune search` of the LM script with `root`'s autotune: its compile trials and its winner."""
    out = args.out / f"search-{name}"
    shutil.rmtree(out, ignore_errors=True)
    # the program runs from a work dir holding a copy of tests/ alone (its `tests.workloads`): run from a checkout,
    # its dir would put that checkout's autotune first on the trials' path, and main's trials ran this branch's
    work = args.out / f"work-{name}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(root), str(work)]), "COLUMNS": "300"}
    cmd = [sys.executable, "-m", "autotune.cli.main", "search", "--budget", str(int(args.budget)), "--seed"]
    cmd += [str(args.seed), "-q", "--backend", "local", "-o", str(out.resolve()), "--refresh", "--", "python"]
    cmd += LM_SCRIPT.split()
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, timeout=args.budget * 3 + 900)
    if proc.returncode:
        raise SystemExit(f"the search with {name}'s autotune failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    trials = []
    for path in sorted((out / "trials").glob("*/result.json")):
        r = json.loads(path.read_text())
        if (r.get("knobs") or {}).get("compile", "none") != "none":
            m = r.get("metrics") or {}
            trials.append(
                {"status": r.get("status"), "first_step_s": m.get("first_step_s"), "compile_s": m.get("compile_s")}
            )
    best = best_config.read(out / "best_config.yaml") if (out / "best_config.yaml").exists() else {}
    measured = best.get("measured") or {}
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        "compile_trials": len(trials),
        "first_steps_s": round(sum(t["first_step_s"] or 0.0 for t in trials), 1),
        "compile_s": round(sum(t["compile_s"] or 0.0 for t in trials), 1) if name == "branch" else None,
        "winner": best.get("knobs"),
        "speedup_x": measured.get("speedup_x"),
    }


def run_search(args) -> dict:
    sides = {"branch": search_side("branch", ROOT, args)}
    if args.main:
        sides["main"] = search_side("main", args.main, args)
    print(f"{'side':<7}  {'compile trials':>14}  {'first steps':>11}  {'compile_s':>9}  {'speedup':>7}  winner")
    for name, s in sides.items():
        print(f"{name:<7}  {s['compile_trials']:>14}  {s['first_steps_s']:>10}s  {s['compile_s'] or '-':>9}  "
              f"{s['speedup_x'] or '-':>7}  {s['winner']}")  # fmt: skip
    out = {"sides": sides}
    if "main" in sides and sides["main"]["first_steps_s"]:
        out["compile_share_of_main"] = round(sides["branch"]["first_steps_s"] / sides["main"]["first_steps_s"], 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["production", "search", "both"], default="both")
    p.add_argument("--pairs", type=int, default=5, help="production runs with and without the artifacts")
    p.add_argument("--budget", type=float, default=300.0, help="each search's time budget, seconds")
    p.add_argument("--main", type=Path, help="main's checkout: its autotune's search beside this one's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_compile")
    p.add_argument("--smoke", action="store_true", help="the smallest run: one pair, a tiny model, no search")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(first_steps(args.child[0], json.loads(args.child[1]))))
        return
    if args.smoke:
        args.pairs, args.part = 1, "production"
    args.out.mkdir(parents=True, exist_ok=True)
    report = {}
    if args.part in ("production", "both"):
        report["production"] = run_production(args)
    if args.part in ("search", "both"):
        report["search"] = run_search(args)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
