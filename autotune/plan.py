"""A search's plan: its spec resolved once into a typed section for each part of the search (spec -> plan ->
strategy -> request -> runner -> result -> records -> report/export)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Optional

from autotune.knobs import UserKnobs
from autotune.spec import (
    KnobSettings,
    Resources,
    Safety,
    SearchSettings,
    SearchSpaceSpec,
    Spec,
    Tracking,
    TrialSpec,
    WorkloadSpec,
)


@dataclasses.dataclass(frozen=True)
class SearchPlan:
    """A search's settings, resolved once from its spec (`SearchPlan.of`): a typed section for each part, and each
    part takes its own section, never the spec (as torchtitan parses its JobConfig once into sections, and Ray Tune
    hands TuneConfig and RunConfig to its parts). The backends take `resources`; startup the `workload` and
    `tracking`; the trial its `TrialSettings` (`trial_settings`: the `trial` window, `safety`'s parity, the ranks);
    export and the cache what they record. A plan needs no spec file: `SearchPlan.of(parse({"workload": {"command":
    [...]}}))`, or the sections given here (`name`, `run_dir` and `workload` at least; the run dir made absolute and a
    program's dir settled as `of` does, its check left to the caller: `check_output_dir`)."""

    name: Optional[str]  # the search's name (the spec file's stem by default)
    run_dir: Path  # the output dir, absolute (checked by `of`: `check_output_dir`)
    workload: WorkloadSpec  # a program's `dir` settled (default: this process's working dir)
    baseline: KnobSettings = dataclasses.field(default_factory=KnobSettings)  # type: ignore[valid-type]
    space: SearchSpaceSpec = dataclasses.field(default_factory=SearchSpaceSpec)
    trial: TrialSpec = dataclasses.field(default_factory=TrialSpec)
    search: SearchSettings = dataclasses.field(default_factory=SearchSettings)
    resources: Resources = dataclasses.field(default_factory=Resources)
    tracking: Tracking = dataclasses.field(default_factory=Tracking)
    safety: Safety = dataclasses.field(default_factory=Safety)

    def __post_init__(self):
        object.__setattr__(self, "run_dir", Path(self.run_dir).resolve())
        if self.workload.command is not None and not self.workload.dir:  # the user's own program runs from here
            object.__setattr__(self, "workload", self.workload.model_copy(update={"dir": os.getcwd()}))

    @classmethod
    def of(cls, spec: Spec) -> "SearchPlan":
        """The one reading of a spec: its output dir resolved and checked (`Spec.resolved_output_dir`: the default
        is fixed on the spec, so every later reading names the same dir), a program's `dir` settled, each section a
        copy (what changes the spec later changes no plan)."""
        copy = {
            k: getattr(spec, k).model_copy(deep=True) for k in ("trial", "search", "resources", "tracking", "safety")
        }
        return cls(
            name=spec.name,
            run_dir=spec.resolved_output_dir(),
            workload=spec.workload.model_copy(deep=True),
            baseline=spec.baseline.model_copy(deep=True),
            space=spec.search_space.model_copy(deep=True),
            **copy,
        )

    @property
    def user_knobs(self) -> UserKnobs:
        """The search's user knobs (the workload arguments its space declares searchable), as a registry: what the
        playbook's moves, a config's risk and its safety flags read of them."""
        return UserKnobs.of(self.space.user())

    @property
    def program(self) -> bool:
        """Whether the workload is the user's own program (`workload.command`, autotune.execution.program)."""
        return self.workload.command is not None

    def given(self) -> dict[str, Any]:
        """The baseline's knobs the spec gives (the others are the workload's or PyTorch's defaults)."""
        return {k: v for k, v in self.baseline.model_dump().items() if v is not None}

    def to_yaml(self) -> str:
        """The plan as a spec (the run dir's spec.yaml, which `--resume` reads back)."""
        return Spec(
            name=self.name,
            workload=self.workload,
            baseline=self.baseline,
            search_space=self.space,
            trial=self.trial,
            search=self.search,
            resources=self.resources,
            tracking=self.tracking,
            safety=self.safety,
            output_dir=self.run_dir,
        ).to_yaml()

    def trial_settings(
        self,
        device: str,
        baseline: dict[str, Any],
        *,
        parity: dict | None = None,
        flops_cache: str | None = None,
        pickled: bytes | None = None,
        accumulation: int = 1,
    ):
        """What every trial of the search shares (`autotune.trial.request.TrialSettings`), on `device` from
        `baseline` (every knob's value) and its `accumulation` (micro-batches a step: its effective batch's other
        factor); `pickled`: a factory given in Python, which trials load from the run dir's workload.pkl (the
        bytes travel in the backend's settings to other nodes)."""
        from autotune.trial.request import TRIAL_KEYS, TrialSettings, parity_against, trial_window
        from autotune.workload import pickled_ref

        workload = {k: v for k, v in self.workload.model_dump(mode="json").items() if v is not None}
        if pickled:
            workload.update(pickled_ref(pickled))
        trial = self.trial  # the runner takes its window (TRIAL_KEYS); timeout_s and prune_margin are the driver's
        return TrialSettings(
            workload=workload,
            trial=trial_window({k: getattr(trial, k) for k in TRIAL_KEYS}),
            device=device,
            seed=self.search.seed,
            base_batch=baseline["batch_size"] * accumulation,  # the effective batch a micro-batch accumulates to
            keep_effective_batch=self.safety.keep_effective_batch,
            # default: against `baseline`'s knobs, as long and within the tolerance the safety section says
            parity=parity or parity_against(baseline, self.safety.parity_steps, self.safety.tolerance),
            ranks=self.resources.ranks_per_trial,
            blocks=self.resources.blocks,
            memory_limit_gib=self.resources.memory_limit_gib,
            flops_cache=flops_cache,
            # a program's baseline is its own settings; it takes its searched arguments as flags
            program_baseline=dict(baseline) if self.program else None,
            flags=self.space.flags() if self.program else None,
        )
