"""trl_sft in production mode, 300 steps with a step log: samples/s over the steps a trial's window covers (5-55)
and over the steps bench_program times (30-300), per process, baseline and best."""
import json, os, subprocess, sys, tempfile, time
from pathlib import Path
import yaml
sys.path.insert(0, "/work/main")
from autotune.execution.launcher import program_command
from autotune.integrations import instrument
from autotune.trial.loop import STEP_LOG_ENV, STOP_AFTER_ENV
run = Path("/work/runs/s7/pl/trl2/trl_sft/run"); cwd = run.parent
best = yaml.safe_load((run / "best_config.yaml").read_text()); spec = yaml.safe_load((run / "spec.yaml").read_text())
nothing = Path(tempfile.mkdtemp()) / "b.yaml"; nothing.write_text(yaml.safe_dump({"knobs": {}, "device": best.get("device") or {}}))
sides = {"baseline": (spec["workload"]["command"], nothing), "best": (best["workload"]["command"], (run / "best_config.yaml"))}
def rate(d, a, b):
    m, s = d["marks"], d["samples"]; return sum(s[a + 1:b + 1]) / (m[b] - m[a])
out = {}
for i in range(int(sys.argv[1])):
    for side in (("baseline", "best") if i % 2 == 0 else ("best", "baseline")):
        cmd, cfg = sides[side]
        log = Path(tempfile.mkdtemp()) / "s.json"
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "AUTOTUNE_TRIAL")}
        env.update({"AUTOTUNE_CONFIG": str(cfg), STEP_LOG_ENV: str(log), STOP_AFTER_ENV: "300", "PYTHONPATH": "/work/main", "HF_DATASETS_CACHE": str(cwd / "hf_datasets")})
        subprocess.run(program_command(cmd), cwd=cwd, env=instrument.with_env(env), capture_output=True, timeout=900)
        d = json.loads(log.read_text())
        r = {w: round(rate(d, *w), 1) for w in ((5, 55), (30, 299), (55, 105), (105, 155), (155, 205), (205, 255), (255, 299))}
        print(side, r, flush=True)
        out.setdefault(side, []).append(r)
