"""Issue 64: every bench_drift search whose run dir was kept, its best's figure and 95% interval as this checkout's
Judge gives them (the baseline trial's two reads told to it, as the search tells them), against the side-by-side
re-measurement the search took then: the log error, the interval's half-width and its parts, the z-score.

    python recompute_landing.py BENCH_DRIFT_OUTPUT.txt...   # the JSON rows bench_drift.py printed (run dirs kept)

The rows' last line: how many lie inside, the RMS and median |z| (a calibrated 95% interval: ~1 and 0.67).
"""

import json
import math
import pathlib
import shutil
import sqlite3
import statistics
import sys
import tempfile

import optuna

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from autotune.decide import reference as R  # noqa: E402
from autotune.records.run_dir import read_run  # noqa: E402


def rows(paths):
    out = []
    for path in paths:
        out += [dict(json.loads(line), src=path) for line in open(path) if line.startswith('{"kind"')]
    return [r for r in out if r.get("interval") and r.get("remeasured_x")]


def judge(run: pathlib.Path, work: pathlib.Path) -> R.Judge:
    """The run's Judge from a copy of its study, the anchor attr added where the search predates it."""
    db = work / f"{abs(hash(str(run)))}.db"
    shutil.copy(run / "optuna.db", db)
    base = next(x for x in read_run(run).records if x.is_baseline)
    con = sqlite3.connect(db)
    (tid,) = con.execute("select trial_id from trials where number=?", (base.number,)).fetchone()
    if not con.execute(
        "select 1 from trial_user_attributes where trial_id=? and key=?", (tid, R.ANCHOR_KEY)
    ).fetchone():
        anchor = json.dumps(R.anchor_reads(base.metrics))
        con.execute(
            "insert into trial_user_attributes (trial_id, key, value_json) values (?,?,?)", (tid, R.ANCHOR_KEY, anchor)
        )
    con.commit()
    con.close()
    j = R.Judge(optuna.load_study(study_name=None, storage=f"sqlite:///{db}"))
    j.refresh()
    return j


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    zs, inside = [], 0
    with tempfile.TemporaryDirectory() as work:
        for r in rows(sys.argv[1:]):
            j = judge(pathlib.Path(r["run_dir"]), pathlib.Path(work))
            read, ref = j.trial_reads[r["best_trial"]], j.reference
            ratio = ref.ratio(read.value, read.at, read.ci)
            err = math.log(ratio.x / r["remeasured_x"])
            z = err / (ratio.interval / R.Z95)
            zs.append(z)
            inside += abs(err) <= ratio.interval
            print(
                f"{r['kind']:14} {pathlib.Path(r['src']).parent.name}/{pathlib.Path(r['src']).name:16} "
                f"{ratio.x:6.3f} [{ratio.low:6.3f}, {ratio.high:6.3f}] re-measured {r['remeasured_x']:6.3f} "
                f"log error {err:+.3f} spread {ref.spread:.3f} ({getattr(ref, 'spread_dof', '-')} pairs) z {z:+.2f} "
                + ("inside" if abs(err) <= ratio.interval else "OUT")
            )
    rms = math.sqrt(sum(z * z for z in zs) / len(zs))
    median = statistics.median(abs(z) for z in zs)
    print(f"inside {inside}/{len(zs)}, RMS z {rms:.2f}, median |z| {median:.2f}")
    print(json.dumps({"inside": inside, "searches": len(zs), "rms_z": round(rms, 3), "median_abs_z": round(median, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
