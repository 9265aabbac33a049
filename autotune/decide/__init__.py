"""Decisions only: what to try next (the strategy on an Optuna study, its samplers chosen from one table: the climb,
TPE, random, grid; the playbook the climb moves by; the rate model), when to stop and what a budget affords, the
side-by-side re-measurement that settles the speedup, the late checks and the choice of the best. (Named `decide`: `autotune.search` is the function that runs a search.)

May import: `autotune.knobs`, `autotune.trial` (its result and diagnosis types), `autotune.safety`,
`autotune.records` (what the search has seen), `autotune.stats` (a window sized by the lead it must show).
"""
