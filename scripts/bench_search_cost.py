"""What a search costs, the search before issue 25 (`search.strategy: v1`: every
trial profiled, diagnosed and parity-checked, full windows) against the one that
pays for information only where a decision needs it (`v2`), in one run on one
host: per case, the wall time of `autotune search` (start-up included), the
time until the trial of the final winner finished, and the winner's speedup as
its own search re-measured it side by side against the baseline (`confirm`).
Then, where the two searches chose different winners, the two winners side by
side (`winners`): `--pairs` interleaved rounds (A B, B A, ...), a fresh trial
process each, the old search's confirm windows at +-`--pair-ci`; the ratio new
over old per pair, their median and range. Two searches' confirm reads are
different processes minutes apart (5-18% apart on 2 cores for one config), so
only these pairs compare the winners.

Cases: `jpeg_pipeline` (batch 64, the `quick` preset, 10 trials, CLI defaults:
the issue's search) and the quickstart (search_spaces/examples/quickstart.yaml);
`smoke` (two tiny trials, not run by default) is the test's.
Each search runs as a user runs it: `autotune search SPEC -q -o DIR`, one at a
time, old then new per case.

    python scripts/bench_search_cost.py [--cases jpeg_pipeline quickstart] [--out DIR]

Readable table; the last line of stdout is one JSON object:
{"cases": {"<name>": {"old": {"wall_s", "to_winner_s", "speedup_x"}, "new": {...}, "winners": {...}}}}; each
side also has `best_samples_per_s` and `baseline_samples_per_s`, the confirm's medians (a speedup carries
its baseline's read as well as its winner's); `winners`: `same` (one config), or the pairs with
`new_over_old` (the median ratio), `low`, `high` and `verdict` (faster, slower or tie: every pair's side).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = {
    "jpeg_pipeline": {"workload": {"name": "jpeg_pipeline", "args": {"batch_size": 64}}, "search_space": "quick",
                      "search": {"n_trials": 10}},
    "quickstart": yaml.safe_load((ROOT / "search_spaces" / "examples" / "quickstart.yaml").read_text()),
    # the smoke test's (tests/test_scripts.py): two trials of a two-point space, short windows, one confirm round
    "smoke": {"workload": {"name": "tiny_cnn", "args": {"batch_size": 16}},
              "search_space": {"preset": None, "knobs": {"channels_last": [False, True]}},
              "trial": {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.2, "max_window_s": 0.5,
                        "profile_steps": 2, "timeout_s": 120},
              "safety": {"parity_steps": 4}, "search": {"n_trials": 2, "confirm_rounds": 1}},
}
STRATEGIES = {"old": "v1", "new": "v2"}


def run_search(name: str, spec: dict, strategy: str, out: Path) -> dict:
    spec = {**spec, "name": f"{name}-{strategy}", "search": {**spec.get("search", {}), "strategy": strategy}}
    path = out / f"{name}-{strategy}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run_dir = out / f"{name}-{strategy}"
    autotune = Path(sys.executable).parent / "autotune"
    started = time.time()
    proc = subprocess.run([str(autotune), "search", str(path), "-q", "-o", str(run_dir)], capture_output=True, text=True)
    wall = time.time() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{name} ({strategy}): autotune search exited {proc.returncode}")
    from autotune.records.run_dir import read_run

    result = read_run(run_dir)
    best = result.best
    ended = best.info.get("ended_unix") if best else None
    state = json.loads((run_dir / "search.json").read_text())
    from autotune.decide.model import error

    rate_model = error((r.number, r.metrics.get("predicted_samples_per_s"), r.measured) for r in result.records)
    return {"wall_s": round(wall, 1), "to_winner_s": round(ended - started, 1) if ended else None,
            "speedup_x": round(result.speedup, 3) if result.speedup else None,
            "winner_trial": best.number if best else None, "trials": len(result.records),
            "trial_s": round(sum(r.info.get("trial_wall_s") or 0 for r in result.records), 1),
            "winner": {k: v for k, v in (best.knobs if best else {}).items() if v != result.baseline.knobs.get(k)},
            "confirm": (state.get("confirm") or {}).get("verdict"),
            # the re-measured throughputs themselves: two searches' speedups also differ by their baselines' reads
            # (jpeg_pipeline's baseline read 81-102 samples/s over four confirm processes of one run)
            **{k: (state.get("confirm") or {}).get(k) for k in ("baseline_samples_per_s", "best_samples_per_s")},
            "rejected": len(state.get("confirm_rejected") or []),
            "rate_model": rate_model, "run_dir": str(run_dir),
            "winner_knobs": best.knobs if best else result.baseline.knobs}


def timed_config(*run_dirs) -> dict:
    """A re-measurement's trial config (a timed window alone): the first search's confirm config; where
    neither search re-measured (its winner was its baseline), the first's baseline trial config, without
    profile, diagnosis, parity or the per-trial settings of a search."""
    from autotune.trial.request import DEFAULTS, TrialSettings

    for run_dir in run_dirs:
        path = Path(run_dir) / "confirm" / "00-best" / "config.json"
        if path.exists():
            return json.loads(path.read_text())
    config = json.loads((Path(run_dirs[0]) / "trials" / "0000" / "config.json").read_text())
    return {**config, "profile_steps": 0, "diagnose": False, "parity": None,
            **{k: DEFAULTS[k] for k in TrialSettings.PER_TRIAL if k in DEFAULTS}}


def winners_side_by_side(old: dict, new: dict, out: Path, rounds: int, ci: float) -> dict:
    """The two searches' winners in `rounds` interleaved pairs of fresh trial processes (confirm.remeasure),
    each a timed window only, at +-`ci`, from a confirm config (`timed_config`)."""
    from autotune.decide.confirm import remeasure
    from autotune.execution.launcher import run_in_process, user_thread_env
    from autotune.trial.result import TrialResult

    if old["winner_knobs"] == new["winner_knobs"]:
        return {"same": True}
    config = timed_config(old["run_dir"], new["run_dir"])
    config.update(target_ci=ci, max_window_s=min(config.get("max_window_s") or 30.0, 15.0), flops_cache=None)
    env, where = user_thread_env(), out / f"{Path(old['run_dir']).name}-winners"

    def run(knobs: dict, label: str):
        return TrialResult.from_dict(run_in_process({**config, "knobs": knobs}, where / label, 600, None, env))

    r = remeasure(run, old["winner_knobs"], new["winner_knobs"], rounds)
    return {"same": False, "rounds": r["rounds"], "pairs": [[p["baseline"], p["best"]] for p in r["pairs"]],
            "old_samples_per_s": r.get("baseline_samples_per_s"), "new_samples_per_s": r.get("best_samples_per_s"),
            "new_over_old": r.get("speedup_x"), "low": r.get("speedup_low"), "high": r.get("speedup_high"),
            "verdict": r.get("verdict"), "error": r.get("error")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=["jpeg_pipeline", "quickstart"])
    p.add_argument("--only", choices=list(STRATEGIES), help="run one side alone (no comparison)")
    p.add_argument("--out", type=Path, default=None, help="where the searches' run dirs go (default: a temp dir)")
    p.add_argument("--pairs", type=int, default=5, help="rounds of the winners side by side (default 5; 0: none)")
    p.add_argument("--pair-ci", type=float, default=0.05, help="their windows' target CI (default 0.05)")
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_search_cost-", dir=os.environ.get("TMPDIR")))
    out.mkdir(parents=True, exist_ok=True)
    cases: dict[str, dict] = {}
    print(f"run dirs: {out}")
    print(f"{'case':14} {'search':6} {'wall s':>8} {'to winner s':>12} {'trials s':>9} {'speedup':>8}  winner")
    for name in args.cases:
        cases[name] = {}
        for label, strategy in STRATEGIES.items():
            if args.only and label != args.only:
                continue
            r = cases[name][label] = run_search(name, CASES[name], strategy, out)
            speed = f"{r['speedup_x']:.2f}x" if r["speedup_x"] else "-"
            print(f"{name:14} {label + ' ' + strategy:6} {r['wall_s']:8.1f} {r['to_winner_s'] or 0:12.1f} "
                  f"{r['trial_s']:9.1f} {speed:>8}  #{r['winner_trial']} {r['winner']} "
                  f"(confirm: {r['confirm']}, rejected {r['rejected']})", flush=True)
            if r["rate_model"]:
                m = r["rate_model"]
                print(f"{'':14} rate model: {m['trials']} trial(s) predicted, median |error| {m['median_abs_error']:.1%}; "
                      f"(trial, predicted, measured): {m['per_trial']}")
        if args.only:
            continue
        old, new = cases[name]["old"], cases[name]["new"]
        best = (f", the winner's re-measured samples/s new/old {new['best_samples_per_s'] / old['best_samples_per_s']:.3f}"
                if new.get("best_samples_per_s") and old.get("best_samples_per_s") else "")
        print(f"{name:14} new/old wall {new['wall_s'] / old['wall_s']:.2f}, speedup new/old "
              f"{(new['speedup_x'] or 0) / (old['speedup_x'] or 1):.3f}{best}", flush=True)
        if args.pairs:
            w = cases[name]["winners"] = winners_side_by_side(old, new, out, args.pairs, args.pair_ci)
            if w["same"]:
                print(f"{name:14} winners side by side: the same config")
            else:
                print(f"{name:14} winners side by side, {w['rounds']} pairs (old, new samples/s): {w['pairs']}; "
                      f"new/old {w['new_over_old']} (pairs {w['low']}-{w['high']}, {w['verdict']})"
                      f"{'; ' + w['error'] if w['error'] else ''}", flush=True)
    for sides in cases.values():  # the knobs are in `winner` (what differs from the baseline)
        for side in ("old", "new"):
            sides.get(side, {}).pop("winner_knobs", None)
    print(json.dumps({"cases": cases}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
