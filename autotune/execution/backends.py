"""Where a search's trials run: the backend object `autotune.execution.driver` is given. The driver's loop is
one (strategy, recorder, stoppers); a backend only starts what it needs, finds the device, runs the trials it
is handed and the late re-measurements:

- `local` (`autotune.execution.local`): one trial at a time, on this host, each in a fresh process; needs
  neither Ray nor MLflow (the GPU hosts);
- `ray` (`autotune.execution.raytune`): Ray Tune places trials on this host or a cluster's nodes.

`choose` picks one for a search's `resources` and `tracking` (its plan's sections, `autotune.plan.SearchPlan`): the
one asked for, else Ray where it is installed. A backend's methods take the `resources` section. What the plan asks
of the host and the host lacks (a cluster without Ray, an MLflow server without MLflow) is the user's to fix: one line
(`SpecError`), never a quiet fallback.

What both backends run of the loop is in `autotune.execution.proposer`.
"""

from __future__ import annotations

from autotune._imports import installed
from autotune.execution.spread import spreads
from autotune.spec import Resources, SpecError, Tracking

BACKENDS = ("auto", "local", "ray")


def choose(name: str = "auto", *, resources: Resources, tracking: Tracking):
    """The backend `name` asks for (`auto`: Ray where it is installed, else local), checked against what the
    search's `resources` and `tracking` ask of the host."""
    if name not in BACKENDS:
        raise SpecError(f"backend `{name}` is not one of: {', '.join(BACKENDS)}")
    if tracking.uri and not installed("mlflow"):
        raise SpecError(
            f"tracking.uri: `{tracking.uri}` needs MLflow, which is not installed here "
            "(pip install mlflow); leave tracking.uri out to keep the search's records in its run dir"
        )
    has_ray = installed("ray")
    if name == "ray" or (name == "auto" and has_ray):
        if not has_ray:
            raise SpecError(
                "backend `ray`: Ray is not installed here (pip install 'ray[tune]'); "
                "`--backend local` runs the trials on this host"
            )
        from autotune.execution.raytune import RayBackend

        return RayBackend()
    if resources.ray_address:
        raise SpecError(
            f"resources.ray_address: `{resources.ray_address}` is a Ray cluster, and "
            + (
                "this search runs on this host (`--backend local`)"
                if has_ray
                else "Ray is not installed here (pip install 'ray[tune]')"
            )
            + "; leave it out to search here"
        )
    if spreads(resources.rank_placement, resources.ranks_per_trial):
        raise SpecError(
            "resources.rank_placement: spread puts ranks on a cluster's nodes, which needs Ray; "
            "use pack (one node) here, or search with Ray on the cluster"
        )
    from autotune.execution.local import LocalBackend

    return LocalBackend()
