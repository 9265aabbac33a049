"""Accelerate, instrumented: an `Accelerator` takes its mixed precision and its dynamo backend from the
environment that `accelerate launch` sets for them (`ACCELERATE_MIXED_PRECISION`, `ACCELERATE_DYNAMO_BACKEND`,
`ACCELERATE_DYNAMO_MODE`), where the program passes none itself: the `precision` and `compile` knobs go that way.
What the Accelerator then runs with is the program's own value (its baseline), and a value the program passes in
code cannot be changed from outside (`cannot`). Its steps, samples, loss and model reach the measured loop
through torch's own hooks (autotune.instrument._torch: an `AcceleratedOptimizer` steps the torch optimizer
inside it), which leave the precision to the Accelerator (it autocasts the model it prepares). An Accelerator
a Trainer makes itself (transformers' Trainer, which claims the program first) is left as it is: the Trainer's
arguments carry those knobs.
"""

from __future__ import annotations

import functools
import inspect
import os

from autotune.instrument import config

MIXED = {"32-true": "no", "tf32": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}
OWN = {"no": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def environment(knobs: dict) -> dict[str, str]:
    """The variables `accelerate launch` would set for these knobs' precision and compile."""
    env = {}
    if knobs.get("precision") in MIXED:
        env["ACCELERATE_MIXED_PRECISION"] = MIXED[knobs["precision"]]
    mode = knobs.get("compile")
    if mode is not None:
        env["ACCELERATE_DYNAMO_BACKEND"] = "NO" if mode == "none" else "INDUCTOR"
        if mode not in ("none",):
            env["ACCELERATE_DYNAMO_MODE"] = mode
    return env


def accelerator(module) -> None:
    """`module.Accelerator.__init__` (accelerate.accelerator) patched (see the module doc)."""
    init = module.Accelerator.__init__
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        cfg = config()
        if cfg.framework is not None:  # a Trainer's own Accelerator: its precision is the Trainer's arguments'
            return init(self, *args, **kwargs)
        given = signature.bind(self, *args, **kwargs).arguments
        env = environment(cfg.knobs)
        if given.get("mixed_precision") is not None:
            env.pop("ACCELERATE_MIXED_PRECISION", None)
            cfg.cannot.setdefault("precision", "your Accelerator(mixed_precision=...) sets it in code")
        if given.get("dynamo_backend") is not None or given.get("dynamo_plugin") is not None:
            env = {k: v for k, v in env.items() if not k.startswith("ACCELERATE_DYNAMO_")}
            cfg.cannot.setdefault("compile", "your Accelerator's dynamo_backend or dynamo_plugin sets it in code")
        os.environ.update(env)
        init(self, *args, **kwargs)
        cfg.record_reach("autocast", "accelerate")  # its precision is the Accelerator's: torch's autocast stands down
        backend = str(getattr(self.state.dynamo_plugin.backend, "value", "no")).lower()
        cfg.record_own(
            {
                "precision": OWN.get(str(self.mixed_precision), "32-true"),
                "compile": "none" if backend == "no" else (self.state.dynamo_plugin.mode or "default"),
            }
        )

    module.Accelerator.__init__ = __init__
