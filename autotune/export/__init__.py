"""What production runs: best_config.yaml written from a search, read (`load.read`; the config that applies it is
`autotune.config`'s, which `autotune.load_config` returns too) and rendered in the forms training is launched with
(Hugging Face, torchrun, Lightning); what a search answers (`answer`) and everything its report says, as data
(`analysis`: per-knob effects, medians, the answer's parts).

May import: `autotune.knobs`, `autotune.safety` (the levels' names), `autotune.decide` (the choice of the best,
the rate model's error), `autotune.records` (the re-measurement's line, as the run dir keeps it),
`autotune.trial` (a program's command and environment, as its trials ran them).
"""
