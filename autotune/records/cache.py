"""Winners remembered: a search that asks the same question as an earlier,
finished one in the same runs directory, on the same kind of machine, is told so
before it starts, and `reuse` returns the earlier result without running a trial.

The run dirs are the cache: each search keeps its key in search.json
(`cache_key`); there is no second store. The key has two parts:

- `question` (no torch needed, compared first): the workload (its ref or a pickled
  factory's qualified name, and its args), the baseline, the search space as
  resolved from the presets (values, not the preset's name), the trial window, the
  search settings (sampler, n_trials, budget, seed, patience) and the safety
  settings, the autotune version, the version of the loss-parity rules
  (`parity.RULE`: a search judged under older rules is not reused) and this host's CPU model and count. Each of them
  changes which configs are tried, how they are timed, or which may win; where
  results go (name, output_dir, tracking) and how trials are placed (resources)
  do not, and are left out.
- `machine` (computed only when some earlier search's question matches, or once
  the workload is built for the search itself): the torch version, the device
  (`cpu`, or the GPUs' names, read without creating a CUDA context in this
  process), a fingerprint of the model's parameter names, shapes and dtypes
  (the model built on the meta device: no memory, no weights), and the
  workload's own batch size and dataset length (a factory's defaults may change
  while its name and args do not).

A search on a Ray cluster is neither remembered nor reused: its devices are known
only once Ray runs.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

from autotune._version import __version__
from autotune.host import procfs
from autotune.records.run_dir import run_paths
from autotune.records.state import SearchState
from autotune.safety.parity import RULE as PARITY_RULE


def question(plan) -> dict[str, Any] | None:
    """The cheap part of the key, from a search's plan (`autotune.plan.SearchPlan`: the question is its sections
    but where results go and how trials are placed); None for a search the cache does not cover."""
    if plan.resources.ray_address:
        return None
    return {
        "workload": plan.workload.model_dump(mode="json"),
        "baseline": plan.baseline.model_dump(mode="json"),
        "space": {"lists": plan.space.lists(), "user": plan.space.user()},
        "trial": plan.trial.model_dump(mode="json"),
        "search": plan.search.model_dump(mode="json", exclude={"keep_compile_cache"}),  # what is kept, not asked
        "safety": plan.safety.model_dump(mode="json"),
        "autotune": __version__,
        "parity_rule": PARITY_RULE,
        "host": _host(),
    }


def machine(device: str, workload) -> dict[str, Any] | None:
    """The part that needs torch and the built workload, on the `device` asked for (`resources.device`: auto, cpu,
    cuda); None when the device cannot be told."""
    import torch

    device = _device(device, torch)
    params = param_fingerprint(workload)
    if device is None or params is None:
        return None
    return {
        "torch": str(torch.__version__),
        "device": device,
        "params": params,
        "batch_size": workload.batch_size,
        "samples": len(workload.dataset),
    }


def param_fingerprint(workload) -> str | None:
    """A digest of the model's parameter names, shapes and dtypes (built on the
    meta device where the model allows it; None when it cannot be built)."""
    import torch

    try:
        with torch.device("meta"):
            model = workload.model()
    except Exception:  # a model that loads weights or checks devices while it is built
        try:
            model = workload.model()
        except Exception:
            return None
    digest = hashlib.sha256()
    for name, p in model.named_parameters():  # a lazy module's parameters have no shape until a first batch
        shape = "lazy" if isinstance(p, torch.nn.parameter.UninitializedParameter) else tuple(p.shape)
        digest.update(f"{name}:{shape}:{p.dtype};".encode())
    return digest.hexdigest()[:16]


def _host() -> dict[str, Any]:
    return {
        "cpu": procfs.cpu_model(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }


def _device(requested: str, torch) -> str | None:
    """`cpu`, or `cuda:` and the GPUs' names; None when they cannot be read. No
    CUDA context is created here: the driver's process must stay off the GPU its
    trials measure (is_available asks the driver for a count; the names come from NVML)."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return "cpu"
    names = _gpu_names()
    return "cuda:" + ",".join(names) if names else None


def _gpu_names() -> list[str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            names = [
                pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        finally:
            pynvml.nvmlShutdown()
        return [n.decode() if isinstance(n, bytes) else n for n in names]
    except Exception:  # no nvidia-ml-py, or no NVML: ask nvidia-smi
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
            )
            return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
        except (OSError, subprocess.SubprocessError):
            return []


class Lookup:
    """The finished searches in `runs_dir` whose question matches this one's."""

    def __init__(self, runs_dir: Path, asked: dict[str, Any]):
        self.asked, self.searches = asked, []  # (started, run dir, machine) of each, the newest first
        for run_dir, state in SearchState.under(runs_dir):
            key = state.cache_key or {}
            if state.finished and key.get("question") == asked and run_paths(run_dir)["best_config"].exists():
                self.searches.append((state.started or "", run_dir, key.get("machine")))
        self.searches.sort(reverse=True)  # the newest first

    def match(self, machine: dict[str, Any] | None) -> Path | None:
        """The newest earlier search that also ran on this machine's kind with this model."""
        return next((run_dir for _, run_dir, theirs in self.searches if machine and theirs == machine), None)


def find(plan, source) -> Path | None:
    """The newest finished search in the plan's runs dir (its run dir's parent) that asked this question
    on this machine; the workload is built (its model on the meta device) only
    when some earlier search's question matches."""
    from autotune import workload as W

    asked = question(plan)
    earlier = Lookup(plan.run_dir.parent, asked) if asked else None
    if not earlier or not earlier.searches:
        return None
    W.importable_paths()  # a user factory resolves as the search would resolve it
    return earlier.match(machine(plan.resources.device, W.load(source, plan.workload.args)))


def key(asked: dict[str, Any] | None, machine: dict[str, Any] | None) -> dict[str, Any] | None:
    """What search.json keeps (None: not remembered)."""
    return {"question": asked, "machine": machine} if asked and machine else None


def describe(run_dir: Path, reused: bool) -> str:
    """The line a matching search prints before it starts."""
    from autotune.records.run_dir import read_run

    earlier = read_run(run_dir)
    speedup = "an unknown speedup" if earlier.speedup is None else f"{earlier.speedup:.2f}x"
    best = f"best {speedup} over the baseline in {len(earlier.records)} trials"
    if reused:
        return (
            f"reusing `{run_dir}`: a finished search of the same workload, space and settings on this device, "
            f"torch and autotune ({best}); no trial run (--refresh / refresh=True searches again)"
        )
    return (
        f"an earlier search asked the same on this device, torch and autotune: `{run_dir}` ({best}); "
        f"searching again (--reuse / reuse=True returns it without running trials)"
    )
