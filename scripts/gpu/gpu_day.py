"""The GPU day's steps (scripts/gpu/gpu_day.sh is the entry; its header says how to run
it on a lent GPU): each step a command under a time cap, run in priority order while
the budget lasts, its result written as it finishes: NN-step.json (command, commit,
status, wall time, the script's JSON line) and NN-step.log (its output). The running
day writes under /tmp/gpu_day/<gpu>-<date>/, outside the repo: the device tool makes
each command's tree a copy of the checkout's, which deletes what the day wrote there
since the last copy (it lost a search's log on the first H100 day). Each --wait (or
the day's end) packs that folder as scripts/measurements/<gpu>-<date>/ into
$OUT/gpu_day.tar.gz; a day started on a fresh machine begins from what was unpacked
in the tree. A step whose .json exists is skipped (--redo reruns
it); a failed or timed-out step is recorded as such and the rest still run. A step
starts only when its whole cap fits in what is left of the budget; the landscape
takes the rest.

    python scripts/gpu/gpu_day.py [--budget-min 40] [--dry-run] [--detach] [--wait S] [--redo STEP]
                              [--only STEP] [--search-min 15]

On a loan shorter than the plan (15 minutes of device time), --only picks the steps
and --search-min shortens the search: e.g. --only 3 --only 3b --search-min 5; the
language-model step (TRL's SFT script on a 134M Llama) is --only 3c (its search, a
loan alone), then --only 3d --only 4 (its winner beside the hand-tuned recipe, then
the parity rows).

The last line of stdout is one JSON object (the steps' statuses, or with --dry-run
the plan and its checks).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = ROOT / "scripts" / "measurements"  # where the days' results are unpacked and committed
LIVE = Path("/tmp/gpu_day")  # where a running day writes (a folder per day, as in MEASUREMENTS)
PY = sys.executable
SEARCH_BUDGET_S = 900  # the 15 minutes; --search-min fits it to a shorter loan
# the language-model search's budget (3c). After it the search checks its winner's loss parity (five runs of TRL's
# script) and re-measures it against the baseline (three pairs of fresh processes), and the bench measures both:
# about 8 minutes more on top, so 3c takes a 15-minute loan alone, and 3d follows with the parity rows
LM_SEARCH_S = 240


def search_spec(budget_s: float = SEARCH_BUDGET_S) -> dict:
    """The search on the classic case: resnet18_cifar batch 32, the default space, gpu_normalize searchable."""
    return {
        "name": "gpu-day-classic",
        "workload": {"name": "resnet18_cifar", "args": {"batch_size": 32}},
        "search_space": {
            "preset": "default",
            "workload_args": {"gpu_normalize": {"values": [False, True], "safety": "safe", "stage": "loader"}},
        },
        "safety": {"level": "dynamics"},
        "search": {"n_trials": 200, "time_budget_s": budget_s, "seed": 0},
    }


# the realistic landscape (record_landscape.py's docstring), every point diagnosed
LANDSCAPE_GRID = [
    "num_workers=0,4,8,16",
    "pin_memory=false,true",
    "batch_size=32,128,512,1024",
    "precision=32-true,bf16-mixed,16-mixed",
    "channels_last=false,true",
    "compile=none,default",
]


@dataclass
class Step:
    key: str  # NN-name: the result's file name
    what: str
    cap_s: float
    argv: list[str]
    writes: list[str] = field(default_factory=list)  # beside NN-name.json and .log, in the day's folder
    spec: dict | None = None  # the search's spec, written as search_spec.yaml before the step runs
    again: bool = False  # runs on every day with time left (the landscape continues where it stopped)
    result: Callable[[], dict] | None = None  # the step's result, where its command ends with no JSON line


def landscape_of(gpu: str) -> Path:
    """The GPU model's landscape (h100-80gb-hbm3 -> h100_resnet18_gpunorm.csv), continued by each lent one."""
    return ROOT / "scripts" / "bench" / "landscapes" / f"{gpu.split('-')[0]}_resnet18_gpunorm.csv"


def steps(day: Path, gpu: str, search_s: float = SEARCH_BUDGET_S, lm_search_s: float = LM_SEARCH_S) -> list[Step]:
    """The plan, its files in `day` (the landscape's copy too, beside the results); the search's
    budget `search_s` seconds, the language-model search's `lm_search_s`."""
    rel = show(day)
    landscape = f"{rel}/{landscape_of(gpu).name}"
    run = f"{rel}/run"  # the search's run dir (traces, per-trial files): not collected
    return [
        Step(
            "1-fidelity",
            "trial fidelity on a GPU-bound config (CV over fresh trials, trial vs plain loop, profiler)",
            270,
            [
                PY,
                "scripts/bench/bench_fidelity.py",
                "--workload",
                "resnet18_cifar",
                "--args",
                '{"gpu_normalize": true}',
                "--set",
                "num_workers=12",
                "--set",
                "pin_memory=true",
                "--set",
                "batch_size=256",
                "--set",
                "precision=bf16-mixed",
            ],
        ),
        Step(
            "2-classic",
            "the classic case: defaults, 8 workers + pinned, the hand-tuned end state",
            240,
            [PY, "scripts/gpu/classic_case.py"],
        ),
        Step(
            "3-search",
            f"the live search on the classic case ({search_s / 60:g}-minute budget, dynamics, "
            "gpu_normalize searchable), the local backend: no Ray or MLflow",
            search_s + 180,
            [
                PY,
                "-m",
                "autotune.cli",
                "search",
                f"{rel}/search_spec.yaml",
                "--backend",
                "local",
                "--quiet",
                "--output-dir",
                run,
            ],
            ["search_spec.yaml", "search/trials.csv", "search/search.json", "search/best_config.yaml"],
            spec=search_spec(search_s),
            result=lambda: search_summary(Path(run)),
        ),
        Step(
            "3b-classic-found",
            "the classic case with the search's winner, side by side with the hand-tuned end state",
            270,
            [PY, "scripts/gpu/classic_case.py", "--found", f"{rel}/search/best_config.yaml"],
        ),
        Step(
            "3c-lm-search",
            f"the language-model search: TRL's SFT script on a random-init 134M Llama, the `lm` preset "
            f"({lm_search_s / 60:g}-minute budget, keep_effective_batch), its winner measured beside the baseline",
            lm_search_s + 480,
            [
                PY,
                "scripts/bench/bench_llm.py",
                "--size",
                "gpu",
                "--parts",
                "search",
                "--search-min",
                f"{lm_search_s / 60:g}",
            ]
            + ["--work", f"{rel}/lm"],
            ["lm-search/trials.csv", "lm-search/search.json", "lm-search/best_config.yaml"],
        ),
        Step(
            "3d-lm-found",
            "the language-model search's winner side by side with the hand-tuned recipe (bf16, flash or sdpa, "
            "Liger, fused AdamW, padding-free, compile) and the baseline",
            270,
            [PY, "scripts/bench/bench_llm.py", "--size", "gpu", "--parts", "found,recipe"]
            + ["--found", f"{rel}/lm-search/best_config.yaml", "--work", f"{rel}/lm"],
        ),
        Step(
            "4-parity",
            "loss parity's GPU rows on ResNet-18 at 224 px (tf32, bf16, fp16, channels_last, cudnn, ...)",
            180,
            [PY, "scripts/bench/parity_table.py", "--workloads", "resnet18_cifar", "--image-size", "224"],
        ),
        Step(
            "5-fused",
            "fused vs unfused optimizers (SGD, AdamW, Adagrad), ResNet-18 at 224 px",
            240,
            [PY, "scripts/bench/bench_fused.py", "--optimizers", "sgd,adamw,adagrad"],
        ),
        Step(
            "6-overhead",
            "first_step_s and fixed cost per trial: fork server vs from scratch, with CUDA",
            120,
            [
                PY,
                "scripts/bench/bench_overhead.py",
                "--workload",
                "resnet18_cifar",
                "--args",
                '{"gpu_normalize": true}',
                "--set",
                "num_workers=8",
                "--set",
                "pin_memory=true",
            ],
        ),
        Step(
            "6b-lm-knobs",
            "each language-model knob alone against the baseline on TRL's SFT script (the 134M Llama): attention "
            "kernels, padding-free, packing, Liger, checkpointing off/selective, float8, expandable_segments, "
            "micro-batch x accumulation",
            900,
            [PY, "scripts/bench/bench_llm.py", "--size", "gpu", "--parts", "knobs", "--work", f"{rel}/lm"],
        ),
        Step(
            "7-landscape",
            f"the realistic GPU landscape, appended point by point to {show(landscape_of(gpu))}",
            60,
            [
                PY,
                "scripts/dev/record_landscape.py",
                "-o",
                landscape,
                "--workload",
                "resnet18_cifar",
                "--args",
                '{"gpu_normalize": true}',
                "--diagnose-all",
                *(a for g in LANDSCAPE_GRID for a in ("--grid", g)),
            ],
            [landscape_of(gpu).name],
            again=True,
        ),
    ]


def search_summary(run: Path) -> dict:
    """What the search found, read from its run dir (`autotune report`'s reader)."""
    from autotune.records.run_dir import read_run

    result = read_run(run)
    base, best = result.baseline, result.best
    summary = {
        "run_dir": str(run),
        "trials": len(result.records),
        "wall_s": round(result.wall_s or 0, 1),
        "ended": result.ended,
        "device": f"{result.device.type}:{result.device.name}",
    }
    if base and base.throughput and best:
        summary.update(
            baseline_samples_per_s=round(base.throughput, 1),
            best_samples_per_s=round(best.throughput, 1),
            speedup_x=round(result.speedup, 3),
            trials_speedup_x=round(best.throughput / base.throughput, 3),
            best_knobs={k: v for k, v in best.knobs.items() if v != base.knobs.get(k)},
        )
    return summary


def gpu_name() -> str | None:
    """A slug of the GPU's name (NVIDIA H100 80GB HBM3 -> h100-80gb-hbm3), None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def day_dir(gpu: str) -> Path:
    """The running day's folder (in LIVE): the newest of this GPU, running on this machine or
    unpacked in the tree, started less than a day ago and not finished, else today's."""
    now = datetime.now(timezone.utc)
    for name in sorted({d.name for root in (LIVE, MEASUREMENTS) for d in root.glob(f"{gpu}-*")}, reverse=True):
        d = next((d for d in (LIVE / name, MEASUREMENTS / name) if (d / "day.json").exists()), None)
        if d is not None:
            started = datetime.fromisoformat(json.loads((d / "day.json").read_text())["started"])
            if now - started < timedelta(days=1) and not all((d / f"{s.key}.json").exists() for s in steps(d, gpu)):
                return LIVE / name
    return LIVE / f"{gpu}-{now:%Y-%m-%d}"


def seed(live: Path, gpu: str) -> None:
    """What the tree has of this day (unpacked from an earlier machine's tarballs) and the GPU's
    landscape so far, copied into the live folder where missing: the day goes on from there."""
    unpacked = MEASUREMENTS / live.name
    if unpacked.is_dir():
        for f in unpacked.rglob("*"):
            if f.is_file() and not (live / f.relative_to(unpacked)).exists():
                (live / f.relative_to(unpacked)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, live / f.relative_to(unpacked))
    if landscape_of(gpu).exists() and not (live / landscape_of(gpu).name).exists():
        shutil.copy2(landscape_of(gpu), live / landscape_of(gpu).name)


def show(path: Path) -> str:
    """A path from the repo root (where the results are unpacked)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # the device's copy of the tree has no .git
        staged = ROOT / ".whl" / "COMMIT"
        return f"{staged.read_text().strip()} (as staged)" if staged.exists() else "unknown"


def last_json(text: str):
    lines = text.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None


def run_step(step: Step, day: Path, cap_s: float) -> dict:
    """Run one step under its cap; its output to NN-name.log, its record to NN-name.json."""
    log = day / f"{step.key}.log"
    t = time.monotonic()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with log.open("w") as out:
        proc = subprocess.Popen(
            step.argv,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            rc = proc.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step and its trial processes
            rc = proc.wait()
            status = "timeout"
        else:
            status = "ok" if rc == 0 else "failed"
    text = log.read_text(errors="replace")
    try:
        result = (step.result() if step.result else last_json(text)) if status == "ok" else None
    except Exception as e:  # noqa: BLE001 (what the step left cannot be read: the step failed)
        result, text = None, f"{text}\nits result: {type(e).__name__}: {e}"
    if status == "ok" and result is None:
        status = "failed"  # every step's script ends with one JSON line, or leaves what `result` reads
    record = {
        "step": step.key,
        "what": step.what,
        "command": shlex.join(step.argv[1:]),
        "commit": commit(),
        "started": started,
        "wall_s": round(time.monotonic() - t, 1),
        "cap_s": cap_s,
        "status": status,
        "returncode": rc,
        "result": result,
        "error": None if status == "ok" else text[-2000:],
    }
    (day / f"{step.key}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def prepare(step: Step, day: Path) -> None:
    if step.spec is not None:
        import yaml

        (day / "search_spec.yaml").write_text(yaml.safe_dump(step.spec, sort_keys=False))


def finish(step: Step, day: Path) -> None:
    """The run dir's small files beside the results (traces, trials, the LM step's model and data stay behind):
    the classic search's in search/, the language-model search's in lm-search/ (3d reads its best_config.yaml)."""
    runs = {"3-search": (Path(step.argv[-1]), "search"), "3c-lm-search": (day / "lm" / "run", "lm-search")}
    if step.key in runs:
        run, kept = runs[step.key]
        (day / kept).mkdir(exist_ok=True)
        for name in ("trials.csv", "search.json", "best_config.yaml"):
            if (run / name).exists():
                (day / kept / name).write_bytes((run / name).read_bytes())


def write_readme(day: Path, gpu: str, plan: list[Step]) -> None:
    """The day's table: every step of the plan, run today (by any command) or not."""
    rows = []
    for step in plan:
        f = day / f"{step.key}.json"
        r = json.loads(f.read_text()) if f.exists() else None
        rows.append(
            f"| {step.key} | {r.get('what', step.what) if r else step.what} | {r['status'] if r else 'not run'} | "
            f"{r['wall_s'] if r else ''} | `{r['command'] if r else shlex.join(step.argv[1:])}` | "
            f"{r['commit'] if r else ''} |"
        )
    (day / "README.md").write_text(
        f"# GPU day: {gpu}, started {json.loads((day / 'day.json').read_text())['started']}\n\n"
        "Written by `bash scripts/gpu/gpu_day.sh` (see its header). Per step: `NN-step.json` (the command, the commit, "
        "status, wall time, the script's last JSON line as `result`) and `NN-step.log` (its output).\n"
        "Commands run from the repo root with the GPU host's python3.\n\n"
        "| step | what | status | wall s | command | commit |\n|---|---|---|---:|---|---|\n" + "\n".join(rows) + "\n"
    )


def check_parses(step: Step) -> str:
    """Run the step's script up to its argument parsing (not further), in this process."""
    import argparse as ap

    class Parsed(Exception):
        pass

    original = ap.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    if step.argv[1] == "-m":  # `python -m autotune.cli SUBCOMMAND ...`: its options parsed by click
        return check_cli(step.argv[3:])
    argv, path = sys.argv, str(ROOT / step.argv[1])
    ap.ArgumentParser.parse_args = parse_then_stop
    sys.argv = [path, *step.argv[2:]]
    try:
        runpy.run_path(path, run_name="__main__")
        return "no argument parsing reached"
    except Parsed:
        return "ok"
    except SystemExit as e:
        return f"does not parse (exit {e.code})"
    finally:
        ap.ArgumentParser.parse_args, sys.argv = original, argv


def check_cli(args: list[str]) -> str:
    """An `autotune` command line parsed (not run)."""
    import typer

    from autotune.cli.main import app

    root = typer.main.get_command(app)
    try:
        ctx = root.make_context("autotune", list(args[:1]))
        root.get_command(ctx, args[0]).make_context(args[0], list(args[1:]), parent=ctx)
        return "ok"
    except Exception as e:  # noqa: BLE001 (click's usage errors, as typer raises them)
        return f"does not parse ({getattr(e, 'format_message', e.__str__)()})"


def check_spec() -> str:
    """The search's spec as the search reads it (`autotune.spec`; its wheels are staged for the GPU host), and
    the local backend's checks of what the spec asks of the host."""
    from autotune.execution.backends import choose
    from autotune.spec import SpecError, parse

    try:
        spec = parse(search_spec(), "search_spec.yaml")
        choose("local", resources=spec.resources, tracking=spec.tracking)
    except SpecError as e:
        return f"spec refused: {e}"
    return "ok" if "gpu_normalize" in spec.search_space.user() else "spec: gpu_normalize not searchable"


def dry_run(budget_s: float, gpu: str | None, search_s: float = SEARCH_BUDGET_S, only: set[str] = frozenset()) -> int:
    shown = gpu or "<gpu>"
    day = MEASUREMENTS / f"{shown}-{datetime.now(timezone.utc):%Y-%m-%d}"
    print(
        f"GPU day plan: budget {budget_s / 60:.0f} min, written in {LIVE / day.name}/ while it runs, "
        f"unpacked in {day.relative_to(ROOT)}/ "
        f"({'this machine has ' + gpu if gpu else 'no CUDA here: <gpu> is the GPU name'}); a step starts only when "
        "its cap fits in what is left"
    )
    plan, failed = [], 0
    rel, landscape = day.relative_to(ROOT), landscape_of(shown)
    for step in (s for s in steps(LIVE / day.name, shown, search_s) if chosen(s, only)):
        writes = [
            f"{rel}/{step.key}.json",
            f"{rel}/{step.key}.log",
            *(show(landscape) if w == landscape.name else f"{rel}/{w}" for w in step.writes),
        ]
        parses = check_parses(step)
        if step.key == "3-search" and parses == "ok":
            parses = check_spec()
        failed += parses != "ok"
        cap = "the rest of the budget" if step.again else f"{step.cap_s / 60:g} min"
        print(
            f"\n{step.key}: {step.what}\n  cap: {cap}\n  command: {shlex.join(['python3', *step.argv[1:]])}\n"
            f"  writes: {', '.join(writes)}\n  parses: {parses}"
        )
        plan.append(
            {
                "step": step.key,
                "cap_s": None if step.again else step.cap_s,
                "command": step.argv[1:],
                "writes": writes,
                "parses": parses,
            }
        )
    print(f"\n{len(plan) - failed} of {len(plan)} steps parse")
    print(json.dumps({"dry_run": True, "budget_s": budget_s, "dir": str(day.relative_to(ROOT)), "steps": plan}))
    return 1 if failed else 0


def collect(day: Path, gpu: str) -> None:
    """What is done, as one tarball in $OUT, its paths the tree's (unpack in the repo root): the
    day's folder as scripts/measurements/<day>/ (not the pid, the search's run dir or the
    landscape's copy), the landscape as scripts/bench/landscapes/<gpu>_resnet18_gpunorm.csv."""
    out = os.environ.get("OUT")
    if not out:
        return
    landscape, skip = day / landscape_of(gpu).name, {"day.pid", "run", "lm", landscape_of(gpu).name}
    with tarfile.open(Path(out) / "gpu_day.tar.gz", "w:gz") as tar:
        for f in sorted(day.iterdir()):
            if f.name not in skip:
                tar.add(f, arcname=str((MEASUREMENTS / day.name / f.name).relative_to(ROOT)))
        if landscape.exists():
            tar.add(landscape, arcname=str(landscape_of(gpu).relative_to(ROOT)))
    print(f"collected {show(MEASUREMENTS / day.name)} into $OUT/gpu_day.tar.gz (unpack in the repo root)")


def alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return None
    try:  # a day this process detached is its child: ended, it is a zombie that kill(0) still finds
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return None
    except ChildProcessError:  # another command's day
        pass
    try:
        os.kill(pid, 0)
        return pid
    except OSError:
        return None


def wait(day: Path, seconds: float) -> None:
    """Follow the detached day's log until it ends or `seconds` pass."""
    log, deadline, pos = day / "day.log", time.monotonic() + seconds, 0
    while True:
        if log.exists():
            with log.open() as f:
                f.seek(pos)
                sys.stdout.write(f.read())
                pos = f.tell()
            sys.stdout.flush()
        if not alive(day / "day.pid") or time.monotonic() > deadline:
            break
        time.sleep(5)
    print(f"the day is {'still running (detached)' if alive(day / 'day.pid') else 'not running'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-min", type=float, default=75, help="the day's total time (default 75)")
    p.add_argument("--dry-run", action="store_true", help="list each step: cap, command, files; check it parses")
    p.add_argument("--detach", action="store_true", help="run the day in its own session (setsid), log to day.log")
    p.add_argument("--wait", type=float, metavar="S", help="follow a detached day up to S seconds, then collect")
    p.add_argument("--redo", action="append", default=[], metavar="STEP", help="rerun a step with a result (e.g. 4)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="STEP",
        help="run these steps alone, in the plan's order (e.g. --only 3 --only 3b on a short loan)",
    )
    p.add_argument(
        "--search-min",
        type=float,
        default=SEARCH_BUDGET_S / 60,
        help=f"the search's budget (default {SEARCH_BUDGET_S // 60}; its cap is 3 minutes more)",
    )
    args = p.parse_args()
    for name, value in (("--budget-min", args.budget_min), ("--search-min", args.search_min)):
        if value <= 0:
            print(f"error: {name} {value:g}: must be > 0 (minutes)", file=sys.stderr)
            return 2
    known = [number(s) for s in steps(MEASUREMENTS / "x", "x")]
    for flag, given in (("--redo", args.redo), ("--only", args.only)):
        if set(given) - set(known):
            print(
                f"error: {flag} {sorted(set(given) - set(known))[0]}: not a step; steps: {', '.join(known)}",
                file=sys.stderr,
            )
            return 2

    gpu = gpu_name()
    if args.dry_run:
        return dry_run(args.budget_min * 60, gpu, args.search_min * 60, set(args.only))
    if gpu is None:
        print("error: no CUDA device: the GPU day needs one (--dry-run lists the steps on a CPU)", file=sys.stderr)
        return 2
    day = day_dir(gpu)
    day.mkdir(parents=True, exist_ok=True)
    seed(day, gpu)
    if not (day / "day.json").exists():
        (day / "day.json").write_text(json.dumps({"gpu": gpu, "started": datetime.now(timezone.utc).isoformat()}))
    if args.detach:
        if alive(day / "day.pid"):
            print(f"the day is already running (pid {alive(day / 'day.pid')})")
        else:
            argv = [
                "--budget-min",
                str(args.budget_min),
                "--search-min",
                str(args.search_min),
                *(a for r in args.redo for a in ("--redo", r)),
                *(a for o in args.only for a in ("--only", o)),
            ]
            with (day / "day.log").open("a") as log:
                proc = subprocess.Popen(
                    [PY, __file__, *argv],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env={**{k: v for k, v in os.environ.items() if k != "OUT"}, "PYTHONUNBUFFERED": "1"},
                )  # $OUT is the command's: --wait collects
            (day / "day.pid").write_text(str(proc.pid))
            print(f"the day runs detached (pid {proc.pid}), log: {show(day / 'day.log')}")
    if args.detach or args.wait is not None:
        wait(day, args.wait or 0)
        collect(day, gpu)
        return 0
    return run_day(
        day, gpu, args.budget_min * 60, set(args.redo), steps(day, gpu, args.search_min * 60), set(args.only)
    )


def number(step: Step) -> str:
    """What --only and --redo name a step by: 3b for 3b-classic-found."""
    return step.key.split("-")[0]


def chosen(step: Step, only: set[str]) -> bool:
    """The step runs today: --only names it, or no --only was given."""
    return not only or number(step) in only


def run_day(
    day: Path, gpu: str, budget_s: float, redo: set[str], plan: list[Step], only: set[str] = frozenset()
) -> int:
    """Run the plan's steps (those in `only`, when given) in order; the README lists them all."""
    end = time.monotonic() + budget_s
    statuses = {}
    print(f"GPU day on {gpu}: {show(day)}, budget {budget_s / 60:.0f} min, commit {commit()}")
    for step in plan:
        done = day / f"{step.key}.json"
        if not chosen(step, only):
            continue
        if done.exists() and not step.again and number(step) not in redo:
            statuses[step.key] = json.loads(done.read_text())["status"] + " (earlier)"
            print(f"== {step.key}: done earlier ({statuses[step.key]}), skipped")
            continue
        left = end - time.monotonic()
        cap = left - 10 if step.again else step.cap_s
        if cap > left or (step.again and cap < 60):  # the landscape: a point takes more than a minute
            statuses[step.key] = "no time left"
            print(f"== {step.key}: skipped, needs {cap / 60:.1f} min, {left / 60:.1f} left (a later run does it)")
            continue
        if step.again:  # stop starting points in time for the one in flight to end under the cap
            step.argv += ["--budget-s", str(int(max(cap - 330, 30)))]
        print(f"== {step.key}: {step.what} (cap {cap / 60:.1f} min)\n   {shlex.join(step.argv[1:])}", flush=True)
        prepare(step, day)
        record = run_step(step, day, cap)
        finish(step, day)
        statuses[step.key] = record["status"]
        print(f"   {record['status']} in {record['wall_s']:.0f} s -> {step.key}.json", flush=True)
        write_readme(day, gpu, plan)
    write_readme(day, gpu, plan)
    collect(day, gpu)
    print(json.dumps({"dir": show(day), "steps": statuses}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
