"""What the driver settles before a search starts, without torch: the
workload's factory (the spec's ref, or a pickled callable) and the batch sizes
the workload's dataset can fill."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from autotune import workload as W
from autotune.spec import Spec, SpecError


def fit_batches(lists: dict[str, list], base_batch: int, samples: int) -> tuple[dict[str, list], list[str]]:
    """Batch sizes larger than the dataset cannot make one batch: refused for the
    baseline, dropped from the space with the reason."""
    if base_batch > samples:
        raise SpecError(f"baseline: batch_size {base_batch} is larger than the workload's dataset ({samples} samples); "
                        "use a smaller batch or a larger dataset")
    batches = lists.get("batch_size", [])
    too_big = [f"batch_size={b}: larger than the dataset ({samples} samples)" for b in batches if b > samples]
    if batches:
        lists = {**lists, "batch_size": [b for b in batches if b <= samples]}
    return lists, too_big


def source(spec: Spec, factory: Callable | None, run_dir: Path, resume: bool) -> tuple[W.Source, bytes | None]:
    """The workload's factory: the spec's ref, or a callable (`workload.pickled`)
    with its pickled bytes; a resumed search loads the run dir's own."""
    if not spec.workload.pickled:
        return spec.workload.ref, None
    path = run_dir / W.PICKLE_FILE
    try:
        if resume or factory is None:
            if not path.exists():
                raise SpecError(f"workload.pickled: `{spec.workload.pickled}` is a factory given in Python and "
                                f"`{run_dir}` has no {W.PICKLE_FILE}; pass it: autotune.search(spec, workload=fn)")
            return W.load_factory(str(path)), path.read_bytes()
        return factory, W.dump_factory(factory)
    except W.WorkloadError as e:
        raise SpecError(str(e)) from e
