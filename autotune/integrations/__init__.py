"""The tools around the search: MLflow tracking (one parent run per search, one nested run per trial); the
zero-code instrumentation of Trainer scripts (instrument, its sitecustomize directory, the Hugging Face and
Lightning callbacks).

May import: `autotune.knobs`, `autotune.spec`, `autotune.export` (the forms the instrumentation applies, so a
trial runs what is exported), `autotune.config` (the object the callbacks report to), `autotune.trial` (the measured loop's
batch counting).
"""
