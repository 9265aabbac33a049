"""trl_sft in production mode, 300 steps with a step log: samples/s over the steps a trial's window covers (5-55)
and over the steps bench_program times (30-299), and over 50-step ranges, per process, baseline and best.

    python trl_windows.py RUN_DIR ROUNDS   # RUN_DIR: a trl_sft search's run dir (bench_programs.py's <out>/trl_sft/run)
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from autotune.execution.launcher import program_command  # noqa: E402
from autotune.export import load as best_config  # noqa: E402
from autotune.integrations import instrument  # noqa: E402
from autotune.trial.loop import STEP_LOG_ENV, STOP_AFTER_ENV  # noqa: E402

WINDOWS = ((5, 55), (30, 299), (55, 105), (105, 155), (155, 205), (205, 255), (255, 299))


def rate(log: dict, a: int, b: int) -> float:
    marks, samples = log["marks"], log["samples"]
    return sum(samples[a + 1 : b + 1]) / (marks[b] - marks[a])


def main() -> None:
    run, rounds = Path(sys.argv[1]), int(sys.argv[2])
    best = best_config.read(run / "best_config.yaml")
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    nothing = Path(tempfile.mkdtemp()) / "baseline.yaml"
    nothing.write_text(yaml.safe_dump({"knobs": {}, "device": best.get("device") or {}}))
    sides = {
        "baseline": (spec["workload"]["command"], nothing),
        "best": (best["workload"]["command"], run / "best_config.yaml"),
    }
    for i in range(rounds):
        for side in ("baseline", "best") if i % 2 == 0 else ("best", "baseline"):
            command, config = sides[side]
            log = Path(tempfile.mkdtemp()) / "steps.json"
            env = {
                k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "AUTOTUNE_TRIAL")
            }
            env.update(
                {
                    "AUTOTUNE_CONFIG": str(config),
                    STEP_LOG_ENV: str(log),
                    STOP_AFTER_ENV: "300",
                    "HF_DATASETS_CACHE": str(run.parent / "hf_datasets"),
                }
            )
            subprocess.run(program_command(command), cwd=run.parent, env=instrument.with_env(env), capture_output=True)
            data = json.loads(log.read_text())
            print(side, {w: round(rate(data, *w), 1) for w in WINDOWS}, flush=True)


if __name__ == "__main__":
    main()
