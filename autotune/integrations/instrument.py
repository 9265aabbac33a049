"""Zero-code instrumentation of a Trainer script, as `opentelemetry-instrument` does it: installed by the
`sitecustomize` of `autotune/integrations/sitecustomize/` (put on the child's PYTHONPATH by a program trial
and by `autotune run`), active only when the process is a trial (`AUTOTUNE_TRIAL`) or runs a best config
(`AUTOTUNE_CONFIG`). Nothing heavy is imported here: each patch is applied when the script itself imports
the module it patches.

- `transformers.hf_argparser`: `HfArgumentParser.parse_args_into_dataclasses()` reads the script's command
  line with the knobs' flags after it (autotune.export.hf_args), when the parser builds
  `TrainingArguments`; in a trial also the flags that keep the script from leaving anything behind;
  `trl.scripts._hf_argparser` the same: TRL's own copy of that parser, under its `TrlParser`;
- `transformers.trainer`: every `Trainer` gets the measured loop's callback (huggingface_callback.attach);
- `lightning.pytorch` (and `pytorch_lightning`): every `Trainer` gets its precision, the trial's
  side-effect settings and the callback; its train loaders the loader knobs (lightning_callback).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

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
    import autotune

    return autotune.config()


def with_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the instrumentation's directory first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH")) if p)
    return env


# the config's methods whose knobs the script's flags carry (the usage record: knobs of the others are "not
# used by your program"): the loader's and the batch, precision, compile and the fused optimizer, activation
# checkpointing and DDP's
HF_REACHES = ("dataloader_kwargs", "autocast", "prepare", "wrap")


def reached(cfg, *methods: str) -> None:
    """Records in `cfg`'s usage record that the instrumentation applies these methods' knobs."""
    cfg.used.update(methods)


# --- the patches, one per module the script imports ------------------------------------------------------


def _hf_argparser(module) -> None:
    """`module.HfArgumentParser`'s parse: transformers', or a copy of it (TRL's `TrlParser` subclasses its own,
    `trl/scripts/_hf_argparser.py`). Once per method: a class that inherits it, or re-exports transformers', is
    patched where the method is."""
    from autotune.export import hf_args

    parse = vars(module.HfArgumentParser).get("parse_args_into_dataclasses")
    if parse is None or getattr(parse, "autotune", False):
        return

    @functools.wraps(parse)
    def parse_args_into_dataclasses(self, args=None, *rest, **kwargs):
        from transformers import TrainingArguments

        if any(isinstance(t, type) and issubclass(t, TrainingArguments) for t in self.dataclass_types):
            cfg = config()
            args = [*(sys.argv[1:] if args is None else args), *hf_args.flags(hf_fields(cfg))]
            reached(cfg, *HF_REACHES)
        return parse(self, args, *rest, **kwargs)

    parse_args_into_dataclasses.autotune = True
    module.HfArgumentParser.parse_args_into_dataclasses = parse_args_into_dataclasses


def hf_fields(cfg) -> dict[str, Any]:
    """The TrainingArguments fields a process gets: its config's knobs', and in a trial its side-effect
    settings."""
    from autotune.export import hf_args

    fields = hf_args.fields(cfg.knobs, cfg.device_type)
    where = trial_dir()
    if where is not None:
        fields.update(hf_args.TRIAL_FIELDS, output_dir=str(where / "output"))
    return fields


def _hf_trainer(module) -> None:
    init = module.Trainer.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        from autotune.integrations import huggingface_callback

        huggingface_callback.attach(self, config())

    module.Trainer.__init__ = __init__


def _lightning_trainer(module) -> None:
    init = module.Trainer.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        from autotune.integrations import lightning_callback

        cfg = config()
        reached(cfg, *lightning_callback.REACHES)
        init(self, *args, **lightning_callback.trainer_kwargs(kwargs, cfg, trial_dir()))

    module.Trainer.__init__ = __init__


PATCHES: dict[str, Callable] = {
    "transformers.hf_argparser": _hf_argparser,
    "trl.scripts._hf_argparser": _hf_argparser,
    "transformers.trainer": _hf_trainer,
    "lightning.pytorch.trainer.trainer": _lightning_trainer,
    "pytorch_lightning.trainer.trainer": _lightning_trainer,
}


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
            PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """The patches, applied as the script imports their modules (once; nothing when not `active()`)."""
    if active() and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
