"""torch.compile's cost and its results, in a trial and in production.

- `compile_seconds()`: the seconds this process has spent compiling, as torch itself accounts them (Dynamo's
  frames and AOTAutograd's backward: `torch._dynamo.utils.calculate_time_spent`'s `total_wall_time`); 0 before
  anything compiled. The timed window reads it at its start (`compile_s`: the compile paid in set-up and warm-up)
  and at each step (a step that compiled is warm-up, never window: `autotune.trial.measure.Window`).
- The compiled artifacts: a trial that compiled saves what it compiled (`save`: torch's portable mega-cache,
  `torch.compiler.save_cache_artifacts`, with the torch version and the device it was made on) to its trial dir;
  the search puts its winner's beside best_config.yaml (`bundle`: the mega-cache and the kernels the search's
  compile cache built, which on a CPU the mega-cache leaves out: C++ kernels are compiled again without them,
  measured 12.6 s of a 13.3-s first step on a tiny MLP, 1.4 s with them); production loads it before its first
  compile (`load`), and one made with another torch or on another device is stale: one line says so, and the
  program compiles as usual.

A search's trials share one inductor and Triton cache (autotune.execution.launcher), so a graph compiled by one
trial is a cache hit in the next: what `compile_s` then records is what a warm cache costs, which is what
production pays with the artifacts loaded.

Needs torch on call only.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path

ARTIFACTS_FILE = "compile_artifacts.bin"  # a trial's: torch's mega-cache bytes
META_FILE = "compile_artifacts.json"  # beside it: the torch version and device it was made with
BUNDLE_FILE = "compile_artifacts.tar"  # beside best_config.yaml: the winner's mega-cache, meta and kernels
# the inductor cache's graph entries (the mega-cache carries them); every other entry is a kernel it built
GRAPH_DIRS = ("fxgraph", "aotautograd")
# a trial's cache dirs, as the variables that place them (the search's compile cache holds one of each)
CACHE_DIRS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
KERNELS_MAX_BYTES = 256 * 2**20  # a larger cache's kernels are left out of the bundle (the reason in its meta)


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile (see the module doc); 0.0 before Dynamo is imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0.0
    spent = utils.cumulative_time_spent_ns
    return (spent.get("entire_frame_compile", 0.0) + spent.get("entire_backward_compile", 0.0)) / 1e9


def made_on(device_name: str) -> dict[str, str]:
    """What artifacts are good for: this torch, and this device (a GPU's name; a CPU's model, whose kernels
    are built for its instruction set)."""
    import torch

    if device_name == "cpu":
        from autotune.host.procfs import cpu_model

        device_name = f"cpu: {cpu_model()}"
    return {"torch": str(torch.__version__), "device": device_name}


def save(trial_dir: Path, device_name: str) -> bool:
    """What this process compiled, into `trial_dir` (ARTIFACTS_FILE and META_FILE); False where it compiled
    nothing (or torch could not serialize it)."""
    if compile_seconds() == 0.0:
        return False
    import torch

    try:
        saved = torch.compiler.save_cache_artifacts()
    except Exception:  # torch's own serializer failed: production compiles as usual
        return False
    if not saved:
        return False
    (Path(trial_dir) / ARTIFACTS_FILE).write_bytes(saved[0])
    (Path(trial_dir) / META_FILE).write_text(json.dumps(made_on(device_name)) + "\n")
    return True


def bundle(trial_dir: Path, cache_dir: Path | None, out: Path) -> dict | None:
    """The winner's artifacts (its trial dir's) and the kernels of the search's compile cache (`cache_dir`:
    its inductor cache; None: none kept) as one file `out`; what best_config.yaml records of it (the file's
    name, the torch and device it was made with, whether its kernels are in), None where the trial saved none."""
    source = Path(trial_dir) / ARTIFACTS_FILE
    if not source.exists():
        return None
    meta = json.loads((Path(trial_dir) / META_FILE).read_text())
    kernels = list(_kernel_files(cache_dir)) if cache_dir else []
    size = sum(p.stat().st_size for p in kernels)
    if size > KERNELS_MAX_BYTES:
        meta["kernels"], kernels = f"left out: {size / 2**20:.0f} MiB, over {KERNELS_MAX_BYTES / 2**20:.0f}", []
    else:
        meta["kernels"] = len(kernels)
    with tarfile.open(out, "w") as tar:
        tar.add(source, arcname=ARTIFACTS_FILE)
        data = json.dumps(meta).encode()
        info = tarfile.TarInfo(META_FILE)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for path in kernels:
            tar.add(path, arcname=f"kernels/{path.relative_to(cache_dir)}")
    return {"file": out.name, **{k: meta[k] for k in ("torch", "device", "kernels")}}


def _kernel_files(cache_dir: Path):
    """The files of an inductor cache that are kernels it built (not its graph entries, not a lock)."""
    if not cache_dir.is_dir():
        return
    for entry in sorted(cache_dir.iterdir()):
        if entry.name in GRAPH_DIRS or not entry.is_dir():
            continue
        for path in sorted(entry.rglob("*")):
            if path.is_file() and not path.name.endswith(".lock"):
                yield path


def stale(meta: dict, device_name: str) -> str | None:
    """Why artifacts made as `meta` says cannot serve this process on `device_name` (None: they can)."""
    here = made_on(device_name)
    if meta.get("torch") != here["torch"]:
        return f"made with torch {meta.get('torch')}, this is torch {here['torch']}"
    if meta.get("device") != here["device"]:
        return f"made on {meta.get('device')}, this is {here['device']}"
    return None


_loaded: set[str] = set()


def load(path: str | os.PathLike, device_name: str) -> str:
    """The artifacts bundle at `path` loaded into this process before its first compile (once a path): its
    kernels added to inductor's cache where missing, its mega-cache loaded. Returns the one line that says what
    happened (stale, missing or loaded); nothing raises: production compiles as usual where they do not serve."""
    path = str(path)
    if path in _loaded:
        return ""
    _loaded.add(path)
    try:
        with tarfile.open(path) as tar:
            meta = json.loads(tar.extractfile(META_FILE).read())
            why = stale(meta, device_name)
            if why:
                return f"autotune: {Path(path).name} is stale ({why}): compiling as usual"
            import torch
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            kernels = [m for m in tar.getmembers() if m.name.startswith("kernels/") and m.isfile()]
            root = Path(cache_dir())
            for member in kernels:
                target = root / member.name.removeprefix("kernels/")
                if not target.exists() and ".." not in Path(member.name).parts:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(member).read())
                    target.chmod(member.mode & 0o777 or 0o644)
            torch.compiler.load_cache_artifacts(tar.extractfile(ARTIFACTS_FILE).read())
    except FileNotFoundError:
        return f"autotune: {path} not found: compiling as usual"
    except Exception as e:  # a damaged or foreign file: production runs all the same
        return f"autotune: {Path(path).name} could not be loaded ({type(e).__name__}: {e}): compiling as usual"
    return f"autotune: compiled artifacts loaded from {Path(path).name} ({len(kernels)} kernels)"
