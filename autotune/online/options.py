"""The online loader tuner's options: what a user sets (`OnlineLoader(loader, **options)`, or best_config.yaml's
`online:` mapping), one typed object that the iterator (`autotune.online.loader`) and its move policy
(`autotune.online.moves`) read. The standard library only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class Options:
    """The online loader tuner's options, each a keyword of `OnlineLoader`."""

    cpu_budget: float | None = None
    """cores of CPU time the workers may use (None: none set; the host's idle cores measured in each window, shared
    by the node's ranks, bound a move up)"""
    ram_budget_gib: float | None = None
    """the job's PSS (main + workers) it may reach (None: no limit beyond the host's available memory)"""
    threshold: float = 0.05
    """the data wait's share of the step above which it moves up (under half of it, down)"""
    log: str | Path | Callable[[str], None] | None = None
    """a path (lines appended), a callable (given each line) or None (stderr)"""
    tracker: Any = None
    """anything with `log_metric(key, value, step=...)`, e.g. the `mlflow` module inside a run"""
    window_s: float = 2.0
    """a window lasts at least this long"""
    window_steps: int = 8
    """and at least this many steps"""
    settle_s: float | None = None
    """a move is weighed on the setting's last `settle_s` against windows after it that go on, up to `settle_s`,
    until the difference is clear of their noise (None: 4 windows, 4 x `window_s`)"""
    warmup_steps: int = 2
    """steps after a rebuild before a window opens (at least a batch from each worker)"""
    backoff_s: float = 30.0
    """a setting that lost is not tried again for this long, doubled at each loss"""
    min_gain: float = 0.03
    """a move down is kept when it does not lose more than this against where the run of moves down began"""
    max_workers: int | None = None
    """the most loader workers a move up tries (None: 4 per CPU, at least 8)"""
    max_prefetch: int = 8
    """the deepest prefetch a move up tries"""

    @classmethod
    def of(cls, given: dict[str, Any]) -> "Options":
        """`OnlineLoader`'s keyword options; an unknown one is refused as a keyword argument is."""
        unknown = [k for k in given if k not in cls.__dataclass_fields__]
        if unknown:
            raise TypeError(f"OnlineLoader.__init__() got an unexpected keyword argument '{unknown[0]}'")
        return cls(**given)

    @property
    def settle(self) -> float:
        """The seconds a move is weighed over: `settle_s`, else 4 windows."""
        return 4 * self.window_s if self.settle_s is None else self.settle_s
