"""How well does the rate model (autotune.decide.model) predict? Replays recorded
searches (their trials.csv): each trial is predicted from the trials before it,
as the search predicted it when it ran, and compared with what it measured.
Two models side by side, on the same trials: `before`, the model as it was until
the shared-host rule (the diagnosed trials alone, workers apart from compute) and
`now`, autotune.decide.model as the search runs it (every measured trial: the diagnosed
ones' rates, the others' throughput, which corrects the loader-worker term; on a
CPU host, the workers and the compute share its cores). Needs no torch.

    python scripts/bench/bench_model.py RUN_DIR [RUN_DIR ...]

Readable table (per run: trials predicted by both, median |error| of each); the
last line is one JSON object: {"runs": {...}, "all": {"trials", "before", "now"}}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.decide import model as M  # noqa: E402
from autotune.records.run_dir import read_run  # noqa: E402
from autotune.records.state import SearchState  # noqa: E402


def trials(run_dir: Path) -> list[dict]:
    """The run's measured trials, in order (records.read_run, the report's reader): knobs, rates (diagnosed
    ones) or throughput, device type."""
    result = read_run(run_dir)
    out = []
    for r in sorted(result.records, key=lambda r: r.number):
        if r.status not in ("ok", "pruned") or not r.metrics.get("samples_per_s"):
            continue
        diagnosed = M.rates_of(r.metrics)
        out.append(
            {
                "number": r.number,
                "knobs": r.knobs,
                "measured": r.metrics["samples_per_s"],
                "rates": diagnosed or {"samples_per_s": r.metrics["samples_per_s"]},
                "cpu": result.device.type == "cpu",
            }
        )
    return out


def replay(rows: list[dict]) -> list[tuple[int, float, float, float]]:
    """(trial, before, now, measured) for every trial both models predict from the ones before it."""
    out = []
    for i, row in enumerate(rows):
        earlier = rows[:i]
        measured = [(r["knobs"], r["rates"]) for r in earlier]
        before = M.predict(row["knobs"], measured, learn=False)  # the diagnosed trials alone, workers apart
        now = M.predict(row["knobs"], measured, shared=row["cpu"])
        if before and now:
            out.append((row["number"], before["samples_per_s"], now["samples_per_s"], row["measured"]))
    return out


def median_error(pairs) -> float | None:
    return statistics.median(abs(m / p - 1) for p, m in pairs) if pairs else None


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{e:.1%}"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="search output dirs (each with a trials.csv)")
    args = ap.parse_args(argv)
    report, everything = {}, []
    print(f"{'run':48s} {'trials':>6s} {'before':>8s} {'now':>8s}")
    for run in args.runs:
        if not (run / "trials.csv").is_file() or not SearchState.exists(run):
            print(f"{str(run)[-48:]:48s} skipped: no trials.csv and search.json (not a search's output dir)")
            continue
        rows = replay(trials(run))
        everything += rows
        before, now = median_error([(b, m) for _, b, _, m in rows]), median_error([(n, m) for _, _, n, m in rows])
        report[str(run)] = {
            "trials": len(rows),
            "before": before,
            "now": now,
            "per_trial": [[n, round(b, 1), round(w, 1), round(m, 1)] for n, b, w, m in rows],
        }
        print(f"{str(run)[-48:]:48s} {len(rows):6d} {_pct(before):>8s} {_pct(now):>8s}")
    if not report:
        ap.error("none of the dirs holds a trials.csv and search.json: pass search output dirs")
    total = {
        "trials": len(everything),
        "before": median_error([(b, m) for _, b, _, m in everything]),
        "now": median_error([(n, m) for _, _, n, m in everything]),
    }
    print(f"{'all':48s} {total['trials']:6d} {total['before'] or 0:8.1%} {total['now'] or 0:8.1%}")
    result = {"runs": report, "all": total}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
