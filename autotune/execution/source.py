"""Where a search's workload comes from, behind one interface (`WorkloadSource`), chosen once (`source_of`): a
factory, built-in or the user's (`FactorySource`: autotune owns the training step), or the user's own program
(`ProgramSource`: each trial runs the program, autotune.execution.program). The search asks it what differs
between the two (the user knobs' baseline, how the workload is built or probed, its own settings, the space it can
take, the late loss-parity check, what the records keep of it) and never branches on which it is."""

from __future__ import annotations

import time
from typing import Callable

from autotune import knobs as K
from autotune import workload as W
from autotune.execution import program as PG
from autotune.execution import startup
from autotune.launch_command import own_knobs as launched_knobs
from autotune.safety import program_parity
from autotune.spec import SpecError
from autotune.plan import SearchPlan
from autotune.trial import ranks as R
from autotune.trial.result import TrialResult


class WorkloadSource:
    """The workload's side of a search (see the module doc). `pickled`: a factory given in Python, by value."""

    pickled: bytes | None = None

    def user_baseline(self) -> dict:
        """The searched user arguments' own values (search_space.workload_args), checked without torch."""
        raise NotImplementedError

    def cache_question(self) -> dict | None:
        """The question an earlier identical search answered (autotune.records.cache), or None: never looked up."""
        return None

    def build(self, forks, started: float, on_probe) -> tuple[object, str | None]:
        """(the workload, its optimizer's class): run beside the backend's start."""
        raise NotImplementedError

    def own(self, workload) -> dict:
        """The knob values the workload states itself (a program's, as its probe found them)."""
        return dict(getattr(workload, "baseline", None) or {})

    def lists(self, lists: dict, baseline: dict, workload) -> tuple[dict, list[str]]:
        """The space's lists this workload can fill, and what was dropped, with why."""
        return lists, []

    def problem(self, device: K.Device, workload, lists: dict, baseline: dict) -> str | None:
        """Why this workload cannot be searched on `device` as asked (None: it can)."""
        return None

    def settle_baseline(self, baseline: dict, own: dict, device: K.Device, given: dict) -> None:
        """The baseline where the device cannot run the workload's own values (in place)."""

    def settle_space(self, space: K.Space, workload) -> None:
        """The space less what the workload cannot take (in place)."""

    def record(self, workload) -> dict | None:
        """What search.json keeps of the workload (`SearchState.program`)."""
        return None

    def step_p95_ms(self, workload) -> float | None:
        """The p95 step time measured before the trials (a program's probe), the baseline's stall limit before it
        has its own (autotune.decide.deadlines); None: none measured."""
        return None

    def check(self, runner, resources: Callable, knobs: dict, label: str, context: dict) -> TrialResult:
        """A late loss-parity check of `knobs` (autotune.decide.checked): `runner(resources, parity_only=True,
        noise=...)` runs one; `context`: the baseline, the parity settings, the device, the run dir, the seed."""
        return runner(resources(knobs), parity_only=True)(knobs, label)


class FactorySource(WorkloadSource):
    """A factory: built-in (workload.name) or the user's (workload.factory, or a callable given in Python)."""

    def __init__(self, plan: SearchPlan, factory: Callable | None, resume: bool):
        self.plan = plan
        self.ref, self.pickled = startup.source(plan.workload, factory=factory, run_dir=plan.run_dir, resume=resume)

    def user_baseline(self) -> dict:
        try:
            return W.user_knob_baseline(self.ref, self.plan.workload.args, self.plan.space.user())
        except W.WorkloadError as e:
            raise SpecError(f"workload: {e}") from e

    def cache_question(self) -> dict | None:
        from autotune.records import cache

        return cache.question(self.plan)

    def build(self, forks, started: float, on_probe) -> tuple[object, str | None]:
        try:
            workload = W.load(self.ref, self.plan.workload.args)
        except W.WorkloadError as e:
            raise SpecError(f"workload: {e}") from e
        return workload, K.optimizer_of(workload)

    def lists(self, lists: dict, baseline: dict, workload) -> tuple[dict, list[str]]:
        return startup.fit_batches(lists, baseline["batch_size"], len(workload.dataset))

    def problem(self, device: K.Device, workload, lists: dict, baseline: dict) -> str | None:
        from autotune.execution import spread as SP

        resources = self.plan.resources
        node = SP.one_node(device, resources.rank_placement)
        return R.search_problem(node, workload, resources.blocks, lists, baseline)


class ProgramSource(WorkloadSource):
    """The user's own program (workload.command): probed once at its own settings before the trials."""

    def __init__(self, plan: SearchPlan, user_path: str | None):
        self.plan, self.user_path = plan, user_path

    def user_baseline(self) -> dict:
        return PG.flag_baseline(self.plan.workload.command, self.plan.space.workload_args)

    def build(self, forks, started: float, on_probe) -> tuple[object, str | None]:
        plan = self.plan
        # its first-step limit never past the budget: what this run has left of it (a resumed search's earlier runs
        # not counted, so one stopped near its budget can still be probed, and finish)
        limits = PG.probe_limits(plan.trial.first_step_s, plan.search.time_budget_s, time.perf_counter() - started)
        on_probe(True, limits.first_step_s)
        try:
            program = PG.probe(
                plan.workload,
                plan.run_dir,
                self.user_path,
                ranks=plan.resources.ranks_per_trial,
                timeout_s=plan.trial.timeout_s,
                shared=forks.path if forks else None,
                limits=limits,
            )
        finally:
            on_probe(False, limits.first_step_s)
        return program, None

    def own(self, workload) -> dict:
        # its launcher's flags (accelerate's --mixed_precision), then what its probe found
        launcher = self.plan.workload.launcher
        return {**(launched_knobs(launcher.env) if launcher else {}), **(workload.baseline or {})}

    def settle_baseline(self, baseline: dict, own: dict, device: K.Device, given: dict) -> None:
        # an own value the device cannot run (a Trainer's pinned memory on a CPU) does nothing there: PyTorch's
        # default stands for it, no baseline replaced (the program keeps its own; no trial sets it)
        baseline.update(PG.inert(own, device, given))

    def settle_space(self, space: K.Space, workload) -> None:
        keep = self.plan.safety.keep_effective_batch
        PG.fix_unused(space, workload.used, workload.cannot, keep_effective_batch=keep)  # what it never calls

    def record(self, workload) -> dict | None:
        return workload.record()

    def step_p95_ms(self, workload) -> float | None:
        return (workload.result.metrics or {}).get("step_ms_p95")

    def check(self, runner, resources: Callable, knobs: dict, label: str, context: dict) -> TrialResult:
        def run(k: dict, lab: str, noise: dict | None = None) -> TrialResult:
            return runner(resources(k), parity_only=True, noise=noise)(k, lab)

        parity, failed = program_parity.check(
            run,
            knobs,
            dict(context["baseline"]),
            context["parity"],
            device_type=context["device_type"],
            path=context["run_dir"] / program_parity.REFERENCE_FILE,
            label=label,
            seed=context["seed"],
        )
        return failed or TrialResult(status="ok", knobs=knobs, parity=parity)


def source_of(plan: SearchPlan, *, factory: Callable | None, resume: bool, user_path: str | None) -> WorkloadSource:
    """The one place that tells a program from a factory."""
    return ProgramSource(plan, user_path) if plan.program else FactorySource(plan, factory, resume)
