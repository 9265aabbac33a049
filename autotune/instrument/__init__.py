"""The trial-side instrumentation: a training program measured and tuned with no line changed, as
`opentelemetry-instrument` instruments an application. `install()` runs in the program's process before the
program does: the `sitecustomize` of `autotune/instrument/sitecustomize/` (put on the child's PYTHONPATH by a
program trial and by `autotune run`), or the fork server's child. It is active only when the process is a
trial (`AUTOTUNE_TRIAL`) or runs a best config (`AUTOTUNE_CONFIG`). Nothing heavy is imported here: each
framework's patch is applied when the program imports the module it patches (or at once, where that module is
already imported: the fork server imports torch before the program runs), one module per framework:

- `_torch`: torch itself (its optimizers, modules, DataLoader, autograd, GradScaler, DDP, FSDP2; in a trial,
  torch.compile's work marked for the launcher's watch): a loop of the program's own, measured and tuned with no
  line changed;
- `_accelerate` (`Accelerator`): its precision and dynamo backend;
- `_transformers` (`HfArgumentParser`, TRL's copy of it, `Trainer`; the Trainer's callback in `_hf_callback`);
- `_lightning` (`lightning.pytorch`'s and `pytorch_lightning`'s `Trainer`; the callback in `_lightning_callback`).

A framework's callback that reports steps claims them (`Config.claim`): torch's hooks then stand down, so no
step is counted twice; so do they where the program reports its own (`cfg.steps`, `cfg.step`, `cfg.data`). Each
module records the ways its knobs reach the program (`Config.record_reach`). Every patch of torch's can be undone
(`_torch.uninstall`).

May import: `autotune.config` (the object the instrumentation reports to), `autotune.knobs`, `autotune.export`
(the forms the instrumentation applies, so a trial runs what is exported), `autotune.spec`, `autotune.trial` (the
measured loop's batch counting).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

SITE_DIR = Path(__file__).with_name("sitecustomize")  # the directory a child's PYTHONPATH gets


def active() -> bool:
    return bool(os.environ.get("AUTOTUNE_TRIAL") or os.environ.get("AUTOTUNE_CONFIG"))


def trial_dir() -> Path | None:
    """The trial's directory (the program's outputs go under it), None outside a trial."""
    path = os.environ.get("AUTOTUNE_TRIAL")
    return Path(path).resolve().parent if path else None


@functools.cache
def config():
    """The process's `autotune.config()` (the trial's, or best_config.yaml's), made once (it applies the
    process-wide knobs, threads and cuDNN, itself)."""
    from autotune.config import config as made

    return made()


def with_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the instrumentation's directory first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH")) if p)
    return env


# module the program imports -> "autotune.instrument.<module>:<function>", the patch applied once it has run
PATCHES: dict[str, str] = {
    "torch": "_torch:install",
    "torch.distributed.fsdp._fully_shard._fully_shard": "_torch:fully_shard",
    "torch._dynamo.callback": "_torch:compiles",
    "accelerate.accelerator": "_accelerate:accelerator",
    "transformers.hf_argparser": "_transformers:hf_argparser",
    "trl.scripts._hf_argparser": "_transformers:hf_argparser",
    "transformers.trainer": "_transformers:trainer",
    "lightning.pytorch.trainer.trainer": "_lightning:trainer",
    "pytorch_lightning.trainer.trainer": "_lightning:trainer",
}


def patch(name: str, module) -> None:
    """Apply the patch of the imported module `name` (PATCHES) to it."""
    import importlib

    where, _, function = PATCHES[name].partition(":")
    getattr(importlib.import_module(f"autotune.instrument.{where}"), function)(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the patched modules with the other finders, then patches each once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(name, module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """The patches, applied as the program imports their modules, or at once to those already imported (a forked
    trial's torch); once, and nothing when not `active()`. In a trial, every thread's stack goes to its log on
    SIGUSR1 (the launcher's, before it ends a trial that is stuck)."""
    if not active() or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    from autotune.trial import progress

    progress.reset()
    if os.environ.get("AUTOTUNE_TRIAL"):
        import faulthandler
        import signal

        faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.meta_path.insert(0, _Finder())
    for name in PATCHES:
        if name in sys.modules:
            patch(name, sys.modules[name])
