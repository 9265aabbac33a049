"""Issue 64: each earlier bench_drift search's best figure and its 95% interval as this checkout's Judge gives them,
the baseline trial's two reads told to it as the search now tells them (the study's `anchor` attr, written into a
copy of each run's optuna.db), against the side-by-side re-measurement the search took then.

    python recompute_intervals.py BENCH_DRIFT_OUTPUT.txt...   # the JSON rows bench_drift.py printed (run dirs kept)
"""

import json
import pathlib
import shutil
import sqlite3
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
        out += [json.loads(line) for line in open(path) if line.startswith('{"kind"')]
    return [r for r in out if r.get("interval") and r.get("remeasured_x")]


def judged(run: pathlib.Path, best: int, work: pathlib.Path) -> R.Ratio:
    db = work / f"{abs(hash(str(run)))}.db"
    shutil.copy(run / "optuna.db", db)
    base = next(x for x in read_run(run).records if x.is_baseline)
    con = sqlite3.connect(db)
    (tid,) = con.execute("select trial_id from trials where number=?", (base.number,)).fetchone()
    anchor = json.dumps(R.anchor_reads(base.metrics))
    con.execute(
        "insert into trial_user_attributes (trial_id, key, value_json) values (?,?,?)", (tid, R.ANCHOR_KEY, anchor)
    )
    con.commit()
    con.close()
    judge = R.Judge(optuna.load_study(study_name=None, storage=f"sqlite:///{db}"))
    judge.refresh()
    read = judge.trial_reads[best]
    return judge.reference.ratio(read.value, read.at, read.ci)


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    inside, found = 0, rows(sys.argv[1:])
    with tempfile.TemporaryDirectory() as work:
        for r in found:
            ratio = judged(pathlib.Path(r["run_dir"]), r["best_trial"], pathlib.Path(work))
            ok = ratio.low <= r["remeasured_x"] <= ratio.high
            inside += ok
            print(
                f"{r['kind']:14} {r['side']:6} {ratio.x:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] "
                f"(was {r['interval']}) re-measured {r['remeasured_x']} {'inside' if ok else 'OUT'}"
            )
    print(f"inside {inside}/{len(found)}")
    print(json.dumps({"inside": inside, "searches": len(found)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
