"""The workload contract, and loading a workload factory ("pkg.module:fn", or a
callable given in Python, which trials get pickled by value: `dump_factory`).

A factory returns the *pieces* of a training job, not a loop: autotune owns the
training step, because it must apply the knobs (loader, copies, memory format,
autocast, zero_grad). A step is:

    batch = to_device(next(loader)); batch = preprocess(batch)
    with autocast: loss = workload.loss(model, batch)
    backward; clip(model, optimizer, precision)
    optimizer.step(); scheduler.step(); optimizer.zero_grad(set_to_none=...)

Batches may be tensors, tuples, lists or dicts (nested).
"""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Union

BUILTINS = {
    "tiny_cnn": "trials.tiny_cnn:make_workload",
    "resnet18_cifar": "trials.resnet18_cifar:make_workload",
    "jpeg_pipeline": "trials.jpeg_pipeline:make_workload",
    "tiny_transformer": "trials.tiny_transformer:make_workload",
}


PICKLE_FILE = "workload.pkl"  # a pickled factory, in the run dir
# a factory: a built-in name, "pkg.module:function", or the callable itself
Source = Union[str, Callable[..., "Workload"]]


class WorkloadError(Exception):
    """A workload reference or factory that cannot be used; the message says why."""


@dataclass
class Workload:
    """What a workload factory returns."""

    model: Callable[[], Any]
    """Builds a fresh `torch.nn.Module` (on the CPU; autotune moves it)."""
    dataset: Any
    """A map-style `torch.utils.data.Dataset` (samples are read in random order)."""
    loss: Callable[[Any, Any], Any]
    """`loss(model, batch) -> scalar tensor`, with `batch` already on the device."""
    batch_size: int
    """The batch size the user trains with today (the baseline's)."""
    optimizer: Callable[[Any], Any] | None = None
    """`optimizer(params) -> torch.optim.Optimizer`; default SGD(lr=0.01, momentum=0.9)."""
    collate_fn: Callable | None = None
    """DataLoader collate_fn; default torch's."""
    preprocess: Callable[[Any], Any] | None = None
    """On-device preprocessing of a batch, e.g. uint8 -> normalized float on the GPU."""
    count_samples: Callable[[Any], int] | None = None
    """Samples in a batch; default: the first dimension of the batch's first tensor."""
    count_tokens: Callable[[Any], tuple[int, int] | None] | None = None
    """A language model's (tokens, sequences) in a batch, where its batches are no dicts with `input_ids`
    (default: `autotune.trial.tokens.count`, the non-padding tokens of such a dict; None: not a language model)."""
    clip: Callable[[Any, Any, str], None] | None = None
    """`clip(model, optimizer, precision)`: your gradient clipping, run on every optimizer step between
    backward (gradients unscaled) and `optimizer.step()`; `precision` is the trial's knob value."""
    scheduler: Callable[[Any], Any] | None = None
    """`scheduler(optimizer) -> LR scheduler` over the trial's optimizer, stepped after every optimizer step."""
    baseline: dict[str, Any] | None = None
    """Knob values your program runs with today (an adapter reads them from your Trainer); the spec's
    `baseline` wins over them."""

    def build_optimizer(self, params):
        if self.optimizer is not None:
            return self.optimizer(params)
        import torch

        return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def name_of(source: Source) -> str:
    """How messages and records name a factory: its ref, or a callable's qualified name."""
    if isinstance(source, str):
        return source
    return f"{getattr(source, '__module__', None) or '?'}.{getattr(source, '__qualname__', type(source).__name__)}"


def resolve(ref: Source) -> Callable[..., Workload]:
    """A built-in name or "pkg.module:function" -> the factory function; a callable is its own factory."""
    if not isinstance(ref, str):
        return ref
    target = BUILTINS.get(ref, ref)
    if ":" not in target:
        raise WorkloadError(
            f"workload `{ref}` is neither a built-in ({', '.join(BUILTINS)}) nor a factory path `pkg.module:function`"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module may fail in any way while importing
        raise WorkloadError(
            f"workload factory `{target}`: cannot import `{module_name}`: {type(e).__name__}: {e}"
            + _import_hint(module_name, e)
        ) from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise WorkloadError(f"workload factory `{target}`: `{module_name}` has no function `{attr}`")
    return factory


def importable_paths() -> str:
    """Make this process's working dir importable, and return what trials need
    on their PYTHONPATH to import what this (the driver's) process imports: the
    working dir first, then every directory the user put on sys.path (a
    notebook's `sys.path.insert(0, "../lib")`, made absolute), less the
    interpreter's own (stdlib, site-packages), which every trial has."""
    import sys

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return os.pathsep.join(_user_dirs())


def _user_dirs() -> list[str]:
    import sys
    import sysconfig

    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values())}
    out: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        inside = any(path == o or path.startswith(o + os.sep) for o in own)
        if os.path.isdir(path) and not inside and "site-packages" not in path and path not in out:
            out.append(path)
    return out


def by_value_modules() -> list[str]:
    """The top-level modules this process imported from the user's own directories
    (`_user_dirs`: not installed, not the interpreter's): what a trial on another
    node cannot import, so a pickled factory carries them by value."""
    import sys
    from importlib.metadata import packages_distributions

    dirs, installed = _user_dirs(), set(packages_distributions())
    out = []
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if "." in name or name == "__main__" or name in installed or not origin:
            continue
        origin = os.path.realpath(origin)
        if any(origin.startswith(d + os.sep) for d in dirs):
            out.append(name)
    return sorted(out)


def _import_hint(module_name: str, e: Exception) -> str:
    """What to do when the factory's own package is not importable (not when
    it imports and something inside it fails)."""
    if not isinstance(e, ModuleNotFoundError) or not e.name or not (module_name + ".").startswith(e.name + "."):
        return ""
    top = module_name.split(".")[0]
    return (
        f"; run the search from the directory that contains `{top}` (trials import it the same way), "
        f"or add that directory to PYTHONPATH"
    )


def check_factory(factory) -> None:
    """A factory given in Python must be a callable."""
    if isinstance(factory, str) or not callable(factory):
        raise WorkloadError(
            f"workload: expected a factory callable returning autotune.Workload, got "
            f"{type(factory).__name__}; or leave it out and name the factory in the spec "
            "(workload.name or workload.factory)"
        )


def dump_factory(factory) -> bytes:
    """A factory callable pickled by value (cloudpickle), so a trial process, the
    fork server or another node can call it without importing where it was
    defined (a notebook's `__main__`, a function's locals), with the user's own
    modules it uses (`by_value_modules`: a helper the notebook imported through
    sys.path) by value too."""
    check_factory(factory)
    import cloudpickle

    import sys

    # what the factory uses from the user's own modules travels with it (another node has no ../lib)
    modules = [sys.modules[name] for name in by_value_modules()]
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(factory)
    except Exception as e:  # whatever it closes over may refuse: a lock, an open file, a CUDA stream
        raise WorkloadError(
            f"workload factory `{name_of(factory)}` cannot be pickled for the trial processes "
            f"({type(e).__name__}: {e}); build such objects inside the factory, not around it"
        ) from e
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def pickled_ref(blob: bytes) -> dict[str, str]:
    """How a trial config names a pickled factory: the run dir's file, relative to
    the trial's dir (runs/<search>/trials/NNNN), and its digest."""
    return {"file": os.path.join("..", "..", PICKLE_FILE), "sha256": hashlib.sha256(blob).hexdigest()}


def load_factory(path: str, sha256: str | None = None) -> Callable[..., Workload]:
    """A pickled factory from `path` (checked against its digest when given)."""
    import pickle

    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise WorkloadError(
            f"workload: the pickled factory `{path}` cannot be read ({e.strerror}); it is the "
            f"search's {PICKLE_FILE}, kept in its run dir"
        ) from None
    if sha256 and hashlib.sha256(blob).hexdigest() != sha256:
        raise WorkloadError(f"workload: `{path}` is not the pickled factory this trial was run with (sha256 differs)")
    try:
        return pickle.loads(blob)
    except Exception as e:  # a module the factory needs by reference, or another Python
        hint = (
            (
                f"; it uses `{e.name}` by reference: run from the directory the search ran from, or add that "
                "directory to PYTHONPATH"
            )
            if isinstance(e, ModuleNotFoundError) and e.name
            else ""
        )
        raise WorkloadError(
            f"workload: the pickled factory `{path}` cannot be loaded: {type(e).__name__}: {e}" + hint
        ) from e


def trial_source(wl: dict[str, Any], base_dir: str = ".") -> Source:
    """The factory a trial config's `workload` names: a ref, or a pickled factory
    (`file` relative to `base_dir`, the config's own dir)."""
    if wl.get("file"):
        return load_factory(os.path.join(base_dir, wl["file"]), wl.get("sha256"))
    return wl.get("factory") or wl["name"]


def load(ref: Source, args: dict[str, Any] | None = None) -> Workload:
    """Call the factory with `args` and check that it returned a Workload."""
    factory = resolve(ref)
    ref = name_of(ref)
    try:
        workload = factory(**(args or {}))
    except TypeError as e:
        raise WorkloadError(f"workload factory `{ref}` rejected its args {args or {}}: {e}") from e
    except Exception as e:  # the user's factory may fail in any way: one line, the traceback with --debug
        raise WorkloadError(
            f"workload factory `{ref}` raised {type(e).__name__}: {e}; fix the factory or its "
            f"arguments (workload.args: {args or {}}); --debug shows the traceback"
        ) from e
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload factory `{ref}` returned {type(workload).__name__}; it must return autotune.Workload"
        )
    if not isinstance(workload.batch_size, int) or workload.batch_size < 1:
        raise WorkloadError(f"workload factory `{ref}`: batch_size must be a positive int, got {workload.batch_size!r}")
    try:
        n = len(workload.dataset)
    except TypeError:
        raise WorkloadError(
            f"workload factory `{ref}`: the dataset ({type(workload.dataset).__name__}) has no len(); "
            "it must be a map-style Dataset (samples read in random order)"
        ) from None
    if n == 0:
        raise WorkloadError(f"workload factory `{ref}`: the dataset is empty; nothing to train on")
    return workload


def user_knob_baseline(ref: Source, args: dict[str, Any], names) -> dict[str, Any]:
    """The current value of each searched factory argument: from the spec's
    workload.args, else the factory's default. A name the factory does not take,
    or one with no value anywhere, is a WorkloadError naming it. With none
    searched, nothing is imported (the workload's module imports torch: 1.7 s
    before Ray could start, where the driver builds it beside Ray's start)."""
    import inspect

    if not names:
        return {}
    params = inspect.signature(resolve(ref)).parameters
    ref = name_of(ref)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    out = {}
    for name in names:
        if name not in params and not takes_any:
            raise WorkloadError(
                f"search_space.workload_args.{name}: the factory `{ref}` takes no argument `{name}`; "
                f"it takes: {', '.join(params) or 'none'}"
            )
        if name in args:
            out[name] = args[name]
        elif name in params and params[name].default is not inspect.Parameter.empty:
            out[name] = params[name].default
        else:
            raise WorkloadError(
                f"search_space.workload_args.{name}: the factory `{ref}` has no default for `{name}`; "
                f"give your current value in workload.args"
            )
    return out


def batch_kind(batch) -> str:
    """What a batch holds, for advice that only fits some models: "images" (a 4-D
    float or uint8 tensor), "tokens" (integer ids, no 4-D tensor), else "other"."""
    import torch

    tensors = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v)

    walk(batch)
    if any(t.dim() == 4 and (t.is_floating_point() or t.dtype == torch.uint8) for t in tensors):
        return "images"
    if tensors and any(not t.is_floating_point() and t.dim() >= 2 for t in tensors):
        return "tokens"
    return "other"


def count_samples(workload: Workload, batch) -> int:
    if workload.count_samples is not None:
        return int(workload.count_samples(batch))
    first = batch
    while isinstance(first, (tuple, list, dict)):
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    return int(first.shape[0])


def count_tokens(workload: Workload, batch) -> tuple[Any, Any] | None:
    """A language model's (tokens, sequences) in a batch (`Workload.count_tokens`, else
    autotune.trial.tokens.count); None: the workload's throughput is counted in samples."""
    if workload.count_tokens is not None:
        return workload.count_tokens(batch)
    from autotune.trial.tokens import count

    return count(batch)
