"""The run dir: what a search leaves there (trials.csv, search.json, each trial's result.json), written as each
trial ends (the recorder) and read back; the cache of finished searches; plots. The only readers and writers of
those files. best_config.yaml is export's to write and read: the run dir says where it is (`run_paths`,
`SearchResult.best_config_path`).

May import: `autotune.knobs`, `autotune.trial` (the typed result), `autotune.workload`, `autotune.safety` (the parity
rule's version, in the cache's key), `autotune.host` (the CPU model, in the cache's key). Never `autotune.decide`:
what the search decided is read back from what it stored (`verdicts`: the re-measurement's verdict applied, its line,
the break-even). Nor `autotune.export`, which reads the run dir.
"""
