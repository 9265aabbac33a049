"""`autotune.search`: the Python API, also what `autotune search` calls.

    import autotune

    def make_workload(batch_size=32):          # in a notebook, a test, anywhere
        return autotune.Workload(model=..., dataset=..., loss=..., batch_size=batch_size)

    result = autotune.search({"search": {"n_trials": 10}}, workload=make_workload)
    autotune.load_config(result.best_config_path)  # a TunedConfig, for production code
    result.trials               # a pandas DataFrame, one row per trial
    result.run_dir

Cheap to import: the driver (Ray, Optuna, MLflow) is imported only when a search
runs, so a search answered by an earlier one (`reuse=True`) never starts them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Union

if TYPE_CHECKING:
    from autotune.execution.callbacks import SearchCallback
    from autotune.records.run_dir import SearchResult
    from autotune.spec import Spec


def search(
    spec: Union[str, Path, dict, "Spec"],
    workload: Callable | None = None,
    *,
    reuse: bool = False,
    refresh: bool = False,
    resume: bool = False,
    callbacks: Iterable["SearchCallback"] | None = None,
    backend: str = "auto",
) -> "SearchResult":
    """Run a search (see README "The spec") and return its result.

    spec: a spec file's path, the spec as a dict, or a typed `autotune.spec.Spec`.
    workload: a factory callable returning `autotune.Workload`, instead of the
        spec's workload.name / workload.factory (the spec's workload.args are its
        arguments). It may live in a notebook's `__main__` or in a function: trials
        get it pickled by value (cloudpickle); the run dir keeps it as workload.pkl.
    reuse: return an earlier finished search of the same question on this machine
        (README "Winners are remembered") without running a trial; else search.
    refresh: search even when an earlier one matches, and say nothing of it.
    resume: continue the stopped search in the spec's output_dir.
    callbacks: what hears the search's progress (`autotune.execution.callbacks.SearchCallback` objects: the CLI's
        live view, a notebook's progress); default: the line naming a matching earlier search printed.
    backend: where trials run (`autotune.execution.backends`): "local" (one at a
        time on this host, without Ray), "ray", or "auto" (Ray where installed).
    """
    from autotune import workload as W
    from autotune.execution.callbacks import Callbacks, Printing
    from autotune.records import cache
    from autotune.records.run_dir import read_run
    from autotune.spec import SpecError, as_spec
    from autotune.plan import SearchPlan

    if sum((reuse, refresh, resume)) > 1:
        raise ValueError("give at most one of reuse, refresh and resume")
    if workload is not None:
        W.check_factory(workload)
    spec = as_spec(spec, W.name_of(workload) if workload is not None else None)
    callbacks = [Printing()] if callbacks is None else list(callbacks)
    if reuse and (workload is not None or not spec.workload.pickled):
        plan = SearchPlan.of(spec)  # the driver reads it again, to the same output dir
        try:
            found = cache.find(plan, workload if workload is not None else plan.workload.ref)
        except W.WorkloadError as e:
            raise SpecError(f"workload: {e}") from e
        if found:
            Callbacks(callbacks).on_match(cache.describe(found, reused=True))
            return dataclasses.replace(read_run(found), reused=True)
    from autotune.execution import driver

    return driver.run(spec, backend=backend, callbacks=callbacks, resume=resume, refresh=refresh, factory=workload)
