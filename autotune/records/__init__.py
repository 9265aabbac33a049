"""The run dir: what a search leaves there (trials.csv, search.json, each trial's result.json), written as each
trial ends (the recorder) and read back; the cache of finished searches; plots. The only readers and writers of
those files.

May import: `autotune.knobs`, `autotune.trial` (the typed result), `autotune.workload`, `autotune.export` (its loader,
for `SearchResult.best_config`), `autotune.safety` (the parity rule's version, in the cache's key), and today
`autotune.decide` (`run_dir` applies the re-measurement's verdict and the break-even when it reads a run back: a
decision the search should store instead, so that this part needs nothing of the search).
"""
