"""The run dir: what a search leaves there (trials.csv, search.json, each trial's result.json), written as each
trial ends (the recorder) and read back; the cache of finished searches; plots. The only readers and writers of
those files.

May import: `autotune.knobs`, `autotune.trial` (the typed result), `autotune.workload`, `autotune.safety` (the parity
rule's version, in the cache's key).
"""
