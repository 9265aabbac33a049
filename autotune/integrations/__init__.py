"""The tools around the search: MLflow tracking (one parent run per search, one nested run per trial). The
instrumentation of the user's program is `autotune.instrument`.

May import: `autotune.knobs`, `autotune.spec`, `autotune.export`, `autotune.trial` (the typed result).
"""
