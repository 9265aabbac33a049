"""The tools around the search: MLflow tracking (one parent run per search, one nested run per trial).

May import: `autotune.knobs`, `autotune.spec`.
"""
