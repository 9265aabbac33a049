"""The Lightning patch, applied as the script imports `lightning.pytorch` (or `pytorch_lightning`): every
`Trainer` gets its precision, the trial's side-effect settings and the callback; its train loaders the loader
knobs (autotune.instrument._lightning_callback)."""

from __future__ import annotations

import functools

from autotune.instrument import config, trial_dir


def trainer(module) -> None:
    init = module.Trainer.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        from autotune.instrument import _lightning_callback as lightning_callback

        cfg = config()
        cfg.claim("lightning")  # its callback reports the steps: torch's hooks stand down
        cfg.record_reach(*lightning_callback.REACHES)
        init(self, *args, **lightning_callback.trainer_kwargs(kwargs, cfg, trial_dir()))

    module.Trainer.__init__ = __init__
