"""A language model's knobs on TRL's own SFT script (`python -m trl.scripts.sft`, the installed package's, as it
ships: no line changed), a
random-init Llama trained on generated texts (tests/programs/trl_sft_data.py): tokens/s, MFU and peak memory, as
torchtitan's benchmark files give them (benchmarks/llama3_h100_202412_torchtitan.md).

Each row is one config of the script, measured as a search's trial is (a fresh process, the instrumented
Trainer, warm-up untimed, then a timed window: autotune.execution.launcher.run_in_process):
- `baseline`: the script as invoked (its own kernel, sdpa; TRL's activation checkpointing of every layer; padded
  batches; on a CPU fp32, TRL's bf16 elsewhere);
- each language-model knob alone (the `lm` preset's values, search_spaces/lm.yaml), and the micro-batch halved
  with two micro-batches accumulated per step (the same effective batch);
- `search winner`: `autotune search` on the script with the `lm` preset (keep_effective_batch, loss parity for the
  numerics knobs), its best_config.yaml's knobs measured here like the other rows (or `--found` one);
- `recipe`: the hand-tuned recipe of the Liger and TRL docs: bf16, flash attention where flash-attn is installed
  (else sdpa), Liger's kernels, fused AdamW, padding-free batches, torch.compile; `recipe (this device)`: what of
  it the device runs, where it cannot run all.
A row this device or install cannot run says why (autotune's registry: "not run: ..."); nothing is installed.

MFU: against the device's peak for the precision (unknown on a CPU: no peak, never a guess). Peak memory: on CUDA
the allocator's peak allocated bytes, on a CPU the process's peak RSS over the window (libraries included: only
differences between rows say something there). tokens/s: the trained (non-padding) tokens per second. host busy:
the other processes' share of the host's CPUs during each run's window (autotune's `host_other_cpu_frac`): on a
shared host, a row measured beside others' work reads slow.

    python scripts/bench/bench_llm.py --size cpu --reps 2 --search-min 5      # the committed CPU table
    python scripts/bench/bench_llm.py --size gpu --parts search               # GPU day: the search, its winner
    python scripts/bench/bench_llm.py --size gpu --parts found,recipe --found RUN/best_config.yaml
    python scripts/bench/bench_llm.py --smoke                                 # CI: seconds of training, no search

Prints a table; the last line of stdout is one JSON object.
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
PROGRAMS = ROOT / "tests" / "programs"

# the model and data per size (trl_sft_data.py's flags), the script's batch and max_length, a trial's window
SIZES = {
    "smoke": {
        "data": ["--rows", "200", "--hidden", "64", "--layers", "2"],
        "batch": 4,
        "max_length": 128,
        "trial": {"warmup_steps": 2, "measure_steps": 4, "min_window_s": 0.3, "max_window_s": 1.0},
    },
    "cpu": {
        "data": ["--rows", "2000", "--hidden", "256", "--layers", "4"],
        "batch": 8,
        "max_length": 256,
        "trial": {"warmup_steps": 5, "min_window_s": 3.0, "max_window_s": 8.0},
    },
    "gpu": {  # ~134M non-embedding parameters (8 x 16.8M), Llama 2's vocabulary: the output layer a real one has
        "data": ["--rows", "20000", "--hidden", "1024", "--layers", "8", "--heads", "16", "--model_vocab", "32000"],
        "batch": 32,
        "max_length": 512,
        "trial": {"warmup_steps": 10, "min_window_s": 3.0, "max_window_s": 10.0},
    },
}
TIMEOUT_S = {"smoke": 240, "cpu": 420, "gpu": 420}  # one trial, start-up and compilation included
# what TRL's script runs with on its own (SFTConfig's defaults, transformers' default kernel): a knob's value here
# is the baseline's, not a row
OWN = {
    "attention": "sdpa",
    "activation_checkpointing": "full",
    "padding_free": False,
    "packing": False,
    "liger_kernels": False,
    "float8": "off",
    "expandable_segments": False,
}
# the hand-tuned recipe (Liger's README and TRL's docs): the attention kernel is flash where it runs
RECIPE = {
    "precision": "bf16-mixed",
    "attention": "flash_attention_2",
    "liger_kernels": True,
    "fused_optimizer": True,
    "padding_free": True,
    "compile": "default",
}
PARTS = ("knobs", "search", "found", "recipe")


@dataclass
class Row:
    name: str
    knobs: dict = field(default_factory=dict)
    accum: int = 1
    why_not: str | None = None  # set: not run, and why
    runs: list = field(default_factory=list)  # each measurement's metrics (or its failure)


def command(size: str, cuda: bool) -> list[str]:
    """TRL's script as trl_sft.yaml runs it, at this size (fp32 on a CPU: SFTConfig's bf16 is refused there)."""
    s = SIZES[size]
    cmd = ["python", "-m", "trl.scripts.sft", "--model_name_or_path", "tiny_llama", "--dataset_name", "tiny_text"]
    cmd += ["--output_dir", "out", "--max_steps", "100000", "--per_device_train_batch_size", str(s["batch"])]
    cmd += ["--max_length", str(s["max_length"]), "--packing", "false", "--report_to", "none"]
    cmd += ["--logging_steps", "100000", "--disable_tqdm", "true"]
    return cmd + ([] if cuda else ["--bf16", "false"])


def unavailable(knobs: dict, device) -> str | None:
    """Why this device or install cannot run `knobs` (the registry's reasons), or None."""
    from autotune import knobs as K

    why = [f"{k}={v}: {r}" for k, v in knobs.items() if (r := K.KNOBS[k].unavailable(v, device))]
    return "; ".join(why) or None


def knob_rows(size: str, device) -> list[Row]:
    """Each language-model knob alone (the `lm` preset's values other than the script's own), and the micro-batch
    halved at the same effective batch."""
    import yaml

    preset = yaml.safe_load((ROOT / "search_spaces" / "lm.yaml").read_text())
    rows = []
    for name, own in OWN.items():
        for value in preset[name]:
            if value != own:
                knobs = {name: value}
                rows.append(Row(f"{name}={value}", knobs, why_not=unavailable(knobs, device)))
    batch = SIZES[size]["batch"]
    rows.append(Row(f"micro-batch {batch // 2} x 2", {"batch_size": batch // 2}, accum=2))
    return rows


def recipe_rows(device) -> list[Row]:
    """The recipe, with sdpa where flash attention cannot run; and what of it this device runs, where not all."""
    from autotune import knobs as K

    recipe = dict(RECIPE)
    if K.KNOBS["attention"].unavailable("flash_attention_2", device):
        recipe["attention"] = "sdpa"
    rows = [Row("recipe", recipe, why_not=unavailable(recipe, device))]
    runs = {k: v for k, v in recipe.items() if not K.KNOBS[k].unavailable(v, device)}
    if rows[0].why_not:
        rows.append(Row("recipe (this device)", runs))
    return rows


def found_row(path: Path) -> Row:
    """A search's winner: the knobs its best_config.yaml changed, the micro-batches it accumulates (the search
    kept the effective batch: the baseline's batch over the winner's)."""
    from autotune.export.load import read

    data = read(path)
    changed = {f["knob"]: f for f in data.get("safety") or [] if isinstance(f, dict) and "tuned" in f}
    knobs = {k: f["tuned"] for k, f in changed.items() if not k.startswith("workload.")}
    accum = 1
    if "batch_size" in changed:
        accum = max(1, int(changed["batch_size"]["baseline"]) // int(changed["batch_size"]["tuned"]))
    return Row("search winner", knobs, accum=accum)


def prepare(work: Path, size: str) -> None:
    """The script's model and texts in `work` (as a user's directory holds them; the script is the installed
    package's)."""
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy2(PROGRAMS / "trl_sft_data.py", work / "trl_sft_data.py")
    if not (work / "tiny_llama").exists():
        made = subprocess.run(
            [sys.executable, "trl_sft_data.py", ".", *SIZES[size]["data"]], cwd=work, capture_output=True, text=True
        )
        if made.returncode != 0:
            raise SystemExit(f"trl_sft_data.py exit {made.returncode}: {made.stderr[-2000:]}")


def model_size(work: Path) -> dict:
    """The Llama's parameters (its config on the meta device: nothing allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(work / "tiny_llama")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    return {
        "params": total,
        "non_embedding_params": total - embedding,
        "hidden": config.hidden_size,
        "layers": config.num_hidden_layers,
        "heads": config.num_attention_heads,
        "vocab": config.vocab_size,
    }


def measure(row: Row, work: Path, a, device, label: str) -> dict:
    from autotune.execution.launcher import Launch, run_in_process

    config = {
        "workload": {"command": command(a.size, device.type == "cuda"), "dir": str(work)},
        "knobs": row.knobs,
        "accum_steps": row.accum,
        **SIZES[a.size]["trial"],
        "profile_steps": 0,
        "diagnose": False,
        "device": device.type,
        "seed": 0,
    }
    started = time.perf_counter()
    result = run_in_process(config, work / "trials" / label, TIMEOUT_S[a.size], str(ROOT), launch=Launch("spawn"))
    m = result.metrics or {}
    memory = m.get("mem_peak_allocated_gib") if device.type == "cuda" else m.get("mem_rss_peak_gib")
    return {
        "status": result.status,
        "tokens_per_s": m.get("tokens_per_s"),
        "samples_per_s": m.get("samples_per_s"),
        "mfu": m.get("mfu"),
        "mem_peak_gib": memory,
        "seq_len_mean": m.get("seq_len_mean"),
        "host_busy": m.get("host_other_cpu_frac"),  # other processes' share of the host's CPUs in the window
        "trial_s": round(time.perf_counter() - started, 1),
        "error": None if result.status == "ok" else f"{result.error_type}: {str(result.error)[-600:]}",
    }


def summary(row: Row, base: float | None) -> dict:
    ok = [r for r in row.runs if r["status"] == "ok" and r["tokens_per_s"]]
    out = {"name": row.name, "knobs": row.knobs, "accum": row.accum}
    if row.why_not:
        return {**out, "status": "not run", "reason": row.why_not}
    if not ok:
        errors = [r["error"] or r["status"] for r in row.runs]
        return {**out, "status": row.runs[0]["status"] if row.runs else "not run", "reason": errors[-1:] or None}
    tps = statistics.median(r["tokens_per_s"] for r in ok)
    mfus = [r["mfu"] for r in ok if r["mfu"] is not None]
    mems = [r["mem_peak_gib"] for r in ok if r["mem_peak_gib"] is not None]
    busy = [r["host_busy"] for r in ok if r.get("host_busy") is not None]
    return {
        **out,
        "status": "ok",
        "tokens_per_s": round(tps, 1),
        "tokens_per_s_runs": [round(r["tokens_per_s"], 1) for r in ok],
        "speedup_x": round(tps / base, 3) if base else None,
        "mfu": round(statistics.median(mfus), 4) if mfus else None,
        "mem_peak_gib": round(max(mems), 3) if mems else None,
        "samples_per_s": round(statistics.median(r["samples_per_s"] for r in ok), 2),
        "host_busy": [round(b, 2) for b in busy],
    }


def table(rows: list[dict], device) -> str:
    mem = "peak allocated" if device.type == "cuda" else "peak RSS"
    lines = [
        f"| config | tokens/s | vs baseline | MFU | {mem} (GiB) | host busy | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | | | | | | {r['status']}: {r['reason']} |")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "unknown"
        runs = ", ".join(f"{t:,.0f}" for t in r["tokens_per_s_runs"])
        note = f"runs {runs}" + (f"; {r['accum']} micro-batches a step" if r["accum"] > 1 else "")
        if r["name"].startswith(("search", "recipe")):
            note = f"{', '.join(f'{k}={v}' for k, v in r['knobs'].items())}; {note}"
        mem_cell = f"{r['mem_peak_gib']:.2f}" if r["mem_peak_gib"] is not None else ""
        busy = "/".join(f"{b:.0%}" for b in r["host_busy"])
        lines.append(
            f"| {r['name']} | {r['tokens_per_s']:,.0f} | {r['speedup_x']:.2f}x | {mfu} | {mem_cell} | {busy} | {note} |"
        )
    return "\n".join(lines)


def search(work: Path, a, device) -> tuple[Path, dict]:
    """`autotune search` on the script: the `lm` preset at the script's effective batch, loss parity for the
    numerics knobs, `--search-min` minutes. Returns best_config.yaml's path and the search's summary."""
    import yaml

    from autotune.export.load import read

    spec = {
        "name": f"bench-llm-{a.size}",
        "workload": {"command": " ".join(command(a.size, device.type == "cuda"))},
        "search_space": {"preset": "lm"},
        "trial": {**SIZES[a.size]["trial"], "timeout_s": TIMEOUT_S[a.size]},
        "search": {"n_trials": 200, "seed": 0},
        "safety": {"level": "dynamics", "keep_effective_batch": True},
    }
    (work / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run = work / "run"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "search", str(work / "spec.yaml"), "-o", str(run)]
        + ["--backend", "local", "--quiet", "--budget", f"{a.search_min}m"],
        capture_output=True,
        text=True,
        # the repo first, the rest kept (on the GPU host, the staged wheels: gpu_day.sh's /tmp/site)
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)},
    )
    (work / "search.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not (run / "best_config.yaml").exists():
        raise SystemExit(f"the search failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    best = read(run / "best_config.yaml")
    return run / "best_config.yaml", {
        "wall_s": round(time.perf_counter() - started, 1),
        "budget_min": a.search_min,
        "run_dir": str(run),
        "measured": best.get("measured"),
        "safety_status": best.get("safety_status"),
        "changed": {f["knob"]: f["tuned"] for f in best.get("safety") or [] if "tuned" in f},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=["cpu", "gpu"], default=None, help="the model's size (default: the device's)")
    p.add_argument("--smoke", action="store_true", help="the smallest run: a tiny model, two rows, no search")
    p.add_argument("--parts", default=None, help=f"comma-separated, of {', '.join(PARTS)} (default: all but found)")
    p.add_argument("--found", type=Path, default=None, help="a search's best_config.yaml: its winner as a row")
    p.add_argument("--reps", type=int, default=1, help="rounds over the rows (each row's median reported)")
    p.add_argument("--search-min", type=float, default=5.0, help="the search's time budget (minutes)")
    p.add_argument("--work", type=Path, default=None, help="where the script, its data and the trials go")
    a = p.parse_args(argv)
    parts = set((a.parts or ("found" if a.found else "knobs,search,recipe")).split(","))
    if parts - set(PARTS):
        p.error(f"--parts: {', '.join(sorted(parts - set(PARTS)))} not allowed; parts: {', '.join(PARTS)}")
    if "found" in parts and a.found is None:
        p.error("--parts found needs --found BEST_CONFIG_YAML")
    if a.found is not None and not a.found.exists():
        p.error(f"--found {a.found}: no such file")

    from autotune.trial.runner import detect_device

    device = detect_device()
    a.size = "smoke" if a.smoke else a.size or ("gpu" if device.type == "cuda" else "cpu")
    work = a.work or Path(tempfile.mkdtemp(prefix="bench_llm_"))
    prepare(work, a.size)
    os.environ["HF_DATASETS_CACHE"] = str(work / "hf_datasets")  # the trials' datasets cache: not the user's
    model = model_size(work)
    print(
        f"TRL's SFT script (trl.scripts.sft) on a random-init Llama: {model['non_embedding_params'] / 1e6:.1f}M "
        f"non-embedding parameters ({model['layers']} layers, hidden {model['hidden']}, vocab {model['vocab']}); "
        f"{device.type} ({device.name}); batch {SIZES[a.size]['batch']}, max_length {SIZES[a.size]['max_length']}; "
        f"work dir {work}",
        flush=True,
    )
    rows = [Row("baseline")]
    if a.smoke:
        rows.append(Row("padding_free=True", {"padding_free": True}))
    elif "knobs" in parts:
        rows += knob_rows(a.size, device)
    searched = None
    if "search" in parts and not a.smoke:
        print(f"the search: {a.search_min:g} minutes on the `lm` preset ...", flush=True)
        found, searched = search(work, a, device)
        rows.append(found_row(found))
    if a.found is not None:
        rows.append(found_row(a.found))
    if "recipe" in parts and not a.smoke:
        rows += recipe_rows(device)
    load = os.getloadavg()
    for rep in range(a.reps):
        for i, row in enumerate(rows):
            if row.why_not:
                continue
            r = measure(row, work, a, device, f"{rep}-{i:02d}")
            row.runs.append(r)
            shown = f"{r['tokens_per_s']:,.0f} tokens/s" if r["tokens_per_s"] else f"{r['status']}: {r['error']}"
            print(f"  round {rep + 1}: {row.name}: {shown} ({r['trial_s']:.0f} s)", flush=True)
    base = summary(rows[0], None)
    out = [summary(r, base.get("tokens_per_s")) for r in rows]
    load_after = os.getloadavg()
    print()
    print(table(out, device))
    print(
        f"\nload average (1, 5, 15 min): before {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
        f"after {load_after[0]:.1f} {load_after[1]:.1f} {load_after[2]:.1f}"
    )
    import torch

    print(
        json.dumps(
            {
                "size": a.size,
                "model": model,
                "device": {"type": device.type, "name": device.name, "cpus": os.cpu_count()},
                "torch": torch.__version__,
                "batch": SIZES[a.size]["batch"],
                "max_length": SIZES[a.size]["max_length"],
                "reps": a.reps,
                "load_avg": {"before": [round(x, 2) for x in load], "after": [round(x, 2) for x in load_after]},
                "search": searched,
                "rows": out,
            }
        )
    )
    return 0 if base["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
