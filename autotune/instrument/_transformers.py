"""The transformers patches (and TRL's copy of its parser), applied as the script imports their modules
(autotune.instrument's finder):

- `transformers.hf_argparser`: `HfArgumentParser.parse_args_into_dataclasses()` reads the script's command
  line with the knobs' flags after it (autotune.export.hf_args: those its dataclasses have fields for,
  `attn_implementation` and `packing` of TRL's among them), when the parser builds `TrainingArguments`; in a
  trial also the flags that keep the script from leaving anything behind; `trl.scripts._hf_argparser` the
  same: TRL's own copy of that parser, under its `TrlParser`. The parsed arguments are the program's own
  knob values (`Config.own`: checkpointing, Liger, packing, and its loader, batch, precision, compile and
  optimizer);
- `transformers.trainer`: every `Trainer` gets the measured loop's callback (autotune.instrument._hf_callback.attach),
  and the language-model knobs no flag carried (_hf_callback.apply_lm: the attention kernel on its model,
  padding-free batches from its collator, float8).

Nothing of transformers is imported here: each patch runs once its module has.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from autotune.instrument import config


def hf_argparser(module) -> None:
    """`module.HfArgumentParser`'s parse: transformers', or a copy of it (TRL's `TrlParser` subclasses its own,
    `trl/scripts/_hf_argparser.py`). Once per method: a class that inherits it, or re-exports transformers', is
    patched where the method is."""
    from autotune.config import HF_REACHES, hf_fields
    from autotune.export import hf_args

    parse = vars(module.HfArgumentParser).get("parse_args_into_dataclasses")
    if parse is None or getattr(parse, "autotune", False):
        return

    @functools.wraps(parse)
    def parse_args_into_dataclasses(self, args=None, *rest, **kwargs):
        import dataclasses

        from transformers import TrainingArguments

        if not any(isinstance(t, type) and issubclass(t, TrainingArguments) for t in self.dataclass_types):
            return parse(self, args, *rest, **kwargs)
        cfg = config()
        known = {f.name for t in self.dataclass_types if dataclasses.is_dataclass(t) for f in dataclasses.fields(t)}
        mine = list(sys.argv[1:] if args is None else args)
        cfg.flag_knobs = hf_args.carried(cfg.knobs, known)  # the rest reach the Trainer (_hf_callback.apply_lm)
        own_kwargs = own_json(mine, ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"))
        args = [*mine, *hf_args.flags(hf_fields(cfg, known, own_kwargs))]
        cfg.record_reach(*HF_REACHES, *(["packing"] if "packing" in known else []))
        out = parse(self, args, *rest, **kwargs)
        for parsed in out if isinstance(out, tuple) else ():
            if isinstance(parsed, TrainingArguments):
                own_of(cfg, parsed)
        return out

    parse_args_into_dataclasses.autotune = True
    module.HfArgumentParser.parse_args_into_dataclasses = parse_args_into_dataclasses


def own_json(argv: list[str], names: tuple[str, ...]) -> dict[str, Any]:
    """The JSON object a command line gives for the first of the flags `names` (`--name {...}` or
    `--name={...}`), {} where none does (or it is no JSON object)."""
    import json

    for name in names:
        flag = f"--{name}"
        for i, arg in enumerate(argv):
            text = None
            if arg == flag and i + 1 < len(argv):
                text = argv[i + 1]
            elif arg.startswith(flag + "="):
                text = arg[len(flag) + 1 :]
            if text is not None:
                try:
                    value = json.loads(text)
                except ValueError:
                    return {}
                return value if isinstance(value, dict) else {}
    return {}


def own_of(cfg, args) -> None:
    """The knob values a script's parsed TrainingArguments (or TRL's config) run with: the language-model knobs',
    and the loader's, the batch, precision, compile and the fused optimizer (hf_args.knobs_of)."""
    from autotune.export import hf_args

    own: dict[str, Any] = hf_args.knobs_of(args)
    if getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None):
        kwargs = getattr(args, "activation_checkpointing_kwargs", None) or getattr(
            args, "gradient_checkpointing_kwargs", None
        )
        every = kwargs.get("every_n_layers", 1) if isinstance(kwargs, dict) else 1
        own["activation_checkpointing"] = "full" if every == 1 else "selective"  # every k-th layer: selective
    else:
        own["activation_checkpointing"] = "off"
    own["liger_kernels"] = bool(getattr(args, "use_liger_kernel", False))
    from autotune.knobs import ACCUMULATION

    own[ACCUMULATION] = int(getattr(args, "gradient_accumulation_steps", 1) or 1)  # its effective batch's factor
    if hasattr(args, "packing"):
        own["packing"] = bool(args.packing)
        # TRL's best-fit packing makes its rows padding-free (SFTTrainer: padding_free or bfd packing)
        bfd = args.packing and getattr(args, "packing_strategy", "bfd") in ("bfd", "bfd_split")
        own["padding_free"] = bool(getattr(args, "padding_free", False) or bfd)
    cfg.record_own(own)


def trainer(module) -> None:
    init = module.Trainer.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        config().claim("transformers")  # before its own Accelerator is made: that one is the Trainer's (its flags)
        init(self, *args, **kwargs)
        from autotune.instrument import _hf_callback as huggingface_callback

        huggingface_callback.attach(self, config())
        huggingface_callback.apply_lm(self, config())

    module.Trainer.__init__ = __init__
