"""One trial, in its own process: the request it is given, the knobs applied, the measured loop (warm-up, timed
windows with the device synchronized at their ends, the profiled and memory windows, the two sides of a step), the
diagnosis of what bounds it, the ranks of a multi-rank trial, and the typed `TrialResult` it reports; and the
same measured loop on a user's own program (`loop`, behind `autotune.config()`'s `steps`/`step`/`data`).
The loader re-tuned in a production program (`OnlineLoader`) is not a trial: it is `autotune.online`.

Runs with torch alone (no Ray, MLflow, Optuna or pydantic): `python -m autotune.trial CONFIG.json`.
May import: `autotune.knobs`, `autotune.workload`, `autotune.safety` (a trial runs its own loss parity),
`autotune.host` (/proc), `autotune.stats` (a window's confidence interval).
"""
