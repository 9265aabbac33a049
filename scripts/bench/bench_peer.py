"""autotune against a peer, loadtune 0.3.0 (PyPI), on jpeg_pipeline: how good is autotune's incumbent when the peer
finishes, and how good is its final pick (issue 62)?

1. loadtune 0.3.0 is installed by this script alone, into a `pip install --target` dir of its own (never the
   project's dependencies; torch and numpy are the venv's), and tunes jpeg_pipeline (a loadtune `Workload` over
   autotune's built-in: its dataset, model, loss and optimizer) from its defaults: its finish time T and its pick;
2. `autotune search` on the same workload (a spec of the default preset, a time budget), started afresh: its
   incumbent at T (the trials finished by then, chosen as the run dir chooses the best) and its final pick
   (best_config.yaml);
3. each pick timed in a plain loop (scripts/bench/bench_exported.py's: a fresh process each, interleaved, the
   same window), and the baseline with them.

Done when (issue 62): at loadtune's finish, autotune's incumbent is >= 75% of its final pick, both over
loadtune's pick, and the final pick no worse (measured before: 1.19x of 2.48x, 48%).

    python scripts/bench/bench_peer.py --budget 300 --reps 3          # a quiet host, ~15 minutes
    python scripts/bench/bench_peer.py --smoke                        # CI: the install, tiny runs, one rep

Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from autotune.export import load as best_config  # noqa: E402

PEER = "loadtune==0.3.0"
EXPORTED = ROOT / "scripts" / "bench" / "bench_exported.py"
ENV = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

# loadtune's run, in a process of its own: a loadtune Workload over autotune's built-in jpeg_pipeline
PEER_RUN = """
import json, sys, time
import torch
from loadtune import Workload, tune
from autotune.workload import load

wl = load("jpeg_pipeline", json.loads(sys.argv[1]))

def train_step(model, optimizer, batch, device):
    batch = [b.to(device) if hasattr(b, "to") else b for b in batch] if isinstance(batch, (list, tuple)) else batch
    loss = wl.loss(model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss

peer = Workload(name="jpeg_pipeline", make_dataset=lambda: wl.dataset, make_model=wl.model, train_step=train_step,
                make_optimizer=lambda model: wl.build_optimizer(model.parameters()), default_batch_size=wl.batch_size,
                collate_fn=wl.collate_fn)
started = time.perf_counter()
result = tune(peer, steps=int(sys.argv[2]), warmup=int(sys.argv[3]), max_trials=int(sys.argv[4]), verbose=True)
knobs = result.best.knobs.to_dict() if result.best and result.speedup > 1 else dict(result.baseline.knobs)
print(json.dumps({"tune_s": time.perf_counter() - started, "knobs": knobs, "speedup": result.speedup}))
"""


def install(target: Path) -> str | None:
    """loadtune 0.3.0 into `target` (its own dir, no dependencies: the venv's torch and numpy serve), psutil too
    where the venv lacks it. The error's last line where pip fails (None: installed)."""
    if (target / "loadtune" / "__init__.py").exists():
        return None
    wanted = [PEER] + ([] if _importable("psutil") else ["psutil"])
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), *wanted],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode:
        return (proc.stderr.strip().splitlines() or [f"pip exited with {proc.returncode}"])[-1]
    return None


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def run_peer(target: Path, args) -> dict:
    """loadtune's tune() from its defaults: its elapsed seconds, its pick's knobs (loadtune's names)."""
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(target), ENV["PYTHONPATH"]])}
    cmd = [sys.executable, "-c", PEER_RUN, json.dumps(args.workload_args), str(args.peer_steps), str(args.peer_warmup)]
    started = time.perf_counter()  # from the process's start, as autotune's search is timed: imports included
    proc = subprocess.run([*cmd, "6"], capture_output=True, text=True, env=env, timeout=3600, cwd=args.out)
    if proc.returncode:
        raise SystemExit(f"loadtune failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "elapsed_s": time.perf_counter() - started}


def as_knobs(peer: dict) -> dict:
    """loadtune's knobs as autotune's (amp: bf16 autocast on a CPU, fp16 on CUDA, as its profiler runs it)."""
    import torch

    knobs = {k: peer[k] for k in ("num_workers", "pin_memory", "num_threads") if peer.get(k) is not None}
    if peer.get("num_workers"):
        knobs["persistent_workers"] = bool(peer.get("persistent_workers"))
        if peer.get("prefetch_factor"):
            knobs["prefetch_factor"] = peer["prefetch_factor"]
    if peer.get("batch_size"):
        knobs["batch_size"] = peer["batch_size"]
    if peer.get("compile"):
        knobs["compile"] = "default"
    if peer.get("amp"):
        knobs["precision"] = "16-mixed" if torch.cuda.is_available() else "bf16-mixed"
    return knobs


def run_search(args) -> tuple[Path, float]:
    """autotune's search of jpeg_pipeline, its time budget `args.budget`: (its run dir, its start, Unix time)."""
    spec = {
        "name": "peer",
        "workload": {"name": "jpeg_pipeline", "args": args.workload_args},
        "search_space": {"preset": "default"},
        "search": {"time_budget_s": args.budget, "seed": args.seed},
        "output_dir": str(args.out / "search"),
    }
    if args.smoke:
        spec["trial"] = {"min_window_s": 0.2, "max_window_s": 0.5, "profile_steps": 0, "warmup_steps": 1}
        spec["search"].update(n_trials=2, confirm_rounds=0, reference_share=0.0)
    (args.out / "spec.yaml").write_text(yaml.safe_dump(spec))
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli.main", "search", str(args.out / "spec.yaml"), "-q", "--backend", "local"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=args.budget * 3 + 600,
    )
    if proc.returncode:
        raise SystemExit(f"autotune search failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return args.out / "search", started


def incumbent_at(run_dir: Path, started: float, seconds: float):
    """The best of the trials finished `seconds` into the search (as the run dir chooses it: records.pick_best)."""
    from autotune.records.run_dir import read_run
    from autotune.records.best import pick_best

    result = read_run(run_dir)
    done = [r for r in result.records if (r.info.get("ended_unix") or float("inf")) <= started + seconds]
    return pick_best(done, result.user_knobs) or result.baseline, result


def plain(configs: dict[str, dict], workload: dict, args) -> dict[str, list[float]]:
    """Each config timed in bench_exported.py's plain loop, a fresh process each, interleaved."""
    measured: dict[str, list[float]] = {name: [] for name in configs}
    for rep in range(args.reps):
        for name in list(configs) if rep % 2 == 0 else list(configs)[::-1]:
            path = args.out / f"{name}.yaml"
            path.write_text(yaml.safe_dump(configs[name], sort_keys=False))
            cmd = [sys.executable, str(EXPORTED), str(args.out), "--warmup", "3", "--window-s", str(args.window_s)]
            cmd += ["--child", str(path), json.dumps(workload)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
            if proc.returncode:
                raise SystemExit(f"plain loop of {name} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
            measured[name].append(json.loads(proc.stdout.strip().splitlines()[-1])["samples_per_s"])
            print(f"{rep:>3}  {name:<20}  {measured[name][-1]:>10.1f} samples/s", flush=True)
    return measured


def changed(knobs: dict, base: dict) -> dict:
    """What a pick sets apart from the baseline's knobs."""
    return {k: v for k, v in knobs.items() if base.get(k) != v}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=300.0, help="autotune's time budget, seconds")
    p.add_argument("--reps", type=int, default=3, help="plain-loop measurements per pick")
    p.add_argument("--window-s", type=float, default=20.0, help="each plain loop's timed seconds")
    p.add_argument("--peer-steps", type=int, default=100, help="loadtune's measured steps a trial (its default)")
    p.add_argument("--peer-warmup", type=int, default=10, help="loadtune's warm-up steps a trial (its default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_peer")
    p.add_argument("--smoke", action="store_true", help="the smallest run: 2 trials, one short rep, tiny images")
    args = p.parse_args()
    args.workload_args = {"crop": 32, "length": 512, "batch_size": 16} if args.smoke else {}
    if args.smoke:
        args.budget, args.reps, args.window_s, args.peer_steps, args.peer_warmup = 60.0, 1, 0.5, 4, 1
    args.out.mkdir(parents=True, exist_ok=True)
    why = install(args.out / "peer")
    if why:
        print(f"loadtune 0.3.0 did not install: {why}")
        print(json.dumps({"peer": PEER, "installed": False, "error": why}))
        return
    peer = run_peer(args.out / "peer", args)
    print(f"loadtune: {peer['elapsed_s']:.0f} s, its pick {peer['knobs']} ({peer['speedup']:.2f}x its baseline)")
    run_dir, started = run_search(args)
    at_peer, result = incumbent_at(run_dir, started, peer["elapsed_s"])
    final = best_config.read(run_dir / "best_config.yaml") if (run_dir / "best_config.yaml").exists() else {}
    base = {k: v for k, v in result.baseline.knobs.items()}
    device = {"type": result.device.type}
    configs = {
        "baseline": {"knobs": base, "device": device},
        "loadtune": {"knobs": {**base, **as_knobs(peer["knobs"])}, "device": device},
        "autotune_at_peer": {"knobs": at_peer.knobs, "device": device},
        "autotune_final": {"knobs": final.get("knobs") or base, "device": device},
    }
    workload = {"ref": "jpeg_pipeline", "args": args.workload_args}
    print(f"{'rep':>3}  {'pick':<20}  {'plain':>10}")
    measured = plain(configs, workload, args)
    median = {name: sorted(v)[len(v) // 2] for name, v in measured.items()}
    over = {name: median[name] / median["loadtune"] for name in ("autotune_at_peer", "autotune_final")}
    share = median["autotune_at_peer"] / median["autotune_final"]
    print(f"at loadtune's finish ({peer['elapsed_s']:.0f} s): autotune's incumbent (trial #{at_peer.number}) "
          f"{over['autotune_at_peer']:.2f}x loadtune's pick; its final pick {over['autotune_final']:.2f}x; "
          f"{share:.0%} of the way")  # fmt: skip
    print(
        json.dumps(
            {
                "peer": PEER,
                "installed": True,
                "peer_s": round(peer["elapsed_s"], 1),
                "picks": {name: changed(c["knobs"], base) for name, c in configs.items() if name != "baseline"},
                "samples_per_s": {k: round(v, 2) for k, v in median.items()},
                "over_peer": {k: round(v, 3) for k, v in over.items()},
                "incumbent_share_of_final": round(share, 3),
                "done": share >= 0.75 and over["autotune_at_peer"] > 1 and over["autotune_final"] >= 1,
            }
        )
    )


if __name__ == "__main__":
    main()
