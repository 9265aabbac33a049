"""search.json, the search's own record (device, space, plan, MLflow ids, why it ended): `SearchState` is its only
reader and writer. Fields a run dir written by an older autotune lacks read as their defaults; fields this one does
not know are kept as they were (`extra`), so a resume writes back what it read."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "search.json"


@dataclass
class SearchState:
    name: str = ""
    device: dict[str, Any] = field(default_factory=dict)
    space: dict[str, Any] = field(default_factory=dict)
    n_trials: int = 0
    time_budget_s: float | None = None
    mlflow_uri: str | None = None
    mlflow_experiment: str = "autotune"
    mlflow_parent_run_id: str | None = None
    optuna_study: str = ""
    started: str = ""
    cache_key: dict[str, Any] | None = None  # the cache's question and machine (autotune.records.cache)
    wall_before_s: float | None = None  # seconds spent before this run of a resumed search, until it ends
    wall_s: float | None = None  # set when the search ends (a finished or stopped search)
    stopped_reason: str | None = None
    ended: str | None = None
    confirm: dict[str, Any] | None = None
    confirm_rejected: list | None = None
    # the re-measurements `autotune confirm` replaced, oldest first, each with when (`replaced`)
    confirm_history: list | None = None
    # whether the reference reads were taken, and why (autotune.execution.reads.Reads.note; issue 64)
    reference_reads: dict[str, Any] | None = None
    skipped_predicted: list = field(default_factory=list)
    # a program (workload.command): its probe run's autotune.config() methods and its own knob values
    program: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def path(run_dir: Path) -> Path:
        return Path(run_dir) / STATE_FILE

    @classmethod
    def exists(cls, run_dir: Path) -> bool:
        return cls.path(run_dir).exists()

    @classmethod
    def read(cls, run_dir: Path) -> SearchState:
        """The state in `run_dir` (FileNotFoundError without one; ValueError when it is not JSON)."""
        raw = json.loads(cls.path(run_dir).read_text())
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in raw.items() if k in names}
        return cls(**known, extra={k: v for k, v in raw.items() if k not in names})

    @classmethod
    def read_or_none(cls, run_dir: Path) -> SearchState | None:
        """The state in `run_dir`, or None where there is none or it cannot be read."""
        try:
            return cls.read(run_dir)
        except (OSError, ValueError, TypeError):
            return None

    @classmethod
    def under(cls, runs_dir: Path) -> list[tuple[Path, SearchState]]:
        """Each run dir directly in `runs_dir` with a readable state, and that state."""
        dirs = [f.parent for f in Path(runs_dir).glob(f"*/{STATE_FILE}")] if Path(runs_dir).is_dir() else []
        return [(d, state) for d in dirs if (state := cls.read_or_none(d)) is not None]

    @property
    def finished(self) -> bool:
        """Ended by its own stop rules (not interrupted, not stopped by a failure)."""
        return self.wall_s is not None and not self.stopped_reason

    @property
    def wall_so_far(self) -> float:
        return self.wall_s or self.wall_before_s or 0.0

    def write(self, run_dir: Path) -> None:
        raw = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        for unset in (
            "wall_before_s",
            "wall_s",
            "stopped_reason",
            "ended",
            "confirm",
            "confirm_rejected",
            "confirm_history",
            "reference_reads",
        ):
            if raw[unset] is None:  # as written before: a key only once it means something
                del raw[unset]
        tmp = self.path(run_dir).with_suffix(".json.tmp")
        tmp.write_text(json.dumps({**self.extra, **raw}, indent=2) + "\n")
        tmp.replace(self.path(run_dir))  # atomic: a reader never sees half a file
