"""What every trial of a search runs with, wherever it runs (`RunSettings`): the one request builder, the limits a
trial's process keeps, where its files go and how its process starts. The search (`autotune.execution.driver`)
makes it once; the backends, the trial runner and the re-measurements read it (a Ray trial gets it pickled).
A re-measurement's or a late check's is the same with another request (`again`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autotune.trial.request import TrialSettings


@dataclass(frozen=True)
class RunSettings:
    request: TrialSettings
    """The one request builder: a config's trial request (autotune.trial.request)."""
    timeout_s: float
    """A trial running longer is killed (trial.timeout_s)."""
    run_dir: str
    """The search's output dir: trials/NNNN/, confirm/."""
    user_path: str | None = None
    """The user's module path, first on every trial's PYTHONPATH (their factories import as the driver's do)."""
    thread_env: dict[str, str | None] = dataclasses.field(default_factory=dict)
    """The user's own OMP_NUM_THREADS and MKL_NUM_THREADS (Ray sets its own in its workers)."""
    first_step_s: float | None = None
    """A program's trial with no optimizer step this long after it started is ended (trial.first_step_s)."""
    workload_pickle: bytes | None = None
    """A factory given in Python, pickled by value (a trial on another node loads it from here)."""
    rank_placement: str = "pack"
    """A multi-rank trial's ranks on one node (pack) or one a node (spread)."""
    fork_socket: str | None = None
    """A local search's shared fork server (autotune.execution.launcher.SharedForkServer)."""
    compile_cache: str | None = None
    """The search's compile cache, shared by its trials on the driver's node (autotune.execution.launcher.Launch)."""
    driver_node: str | None = None
    """Ray's id of the driver's node (a trial elsewhere sends its files back)."""
    rank_bundles: list[dict] | None = None
    """A spread re-measurement's placement group bundles, a rank each."""

    def again(
        self, *, parity_only: bool = False, target_ci: float | None = None, noise: dict | None = None
    ) -> RunSettings:
        """A late check's or a re-measurement's: less profiling, diagnosis and parity, windows to `target_ci`
        where given (`parity_only`: loss parity alone, the late check of autotune.decide.checked; `noise`: a
        program's noise run, autotune.safety.program_parity)."""
        request = self.request.parity_check(noise) if parity_only else self.request.timed_only(target_ci)
        return dataclasses.replace(self, request=request)

    def placed(self, **fields) -> RunSettings:
        """These settings with `fields` replaced (a backend's own: the driver's node, a placement's bundles)."""
        return dataclasses.replace(self, **fields)
