"""Built-in trial workloads: factories that return an `autotune.Workload`.

Each is named in a spec by its short name (see `autotune.workload.BUILTINS`). All
data is generated: nothing is downloaded, weights are random.
"""
