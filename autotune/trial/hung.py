"""What a hung trial rules out for the rest of its search (a trial its watch ended with no step in time:
autotune.execution.watch, status `hung`). Its hang's kind says why it hung:

- `loader`: its main thread waited for a DataLoader worker that never returned a batch (a Dataset that is not
  safe in a worker process: a lock, a file handle or a connection made in `__init__`): loader workers are ruled
  out, `num_workers > 0` (where the baseline itself ran with workers, the hung count and more, the baseline's own
  count kept);
- `rank`: one rank stopped while the others waited for it in a collective: the parallel setting it ran with is
  ruled out (the multi-rank knobs it set otherwise than the baseline, together);
- `main`: its main thread waited elsewhere: its own config alone, which is never run again anyway.

The same rule for every reader: the strategy, which runs no such config again (autotune.decide.limits), and the
choice of the best, which never exports one (autotune.records.best.pick_best), however early it was measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.knobs import KNOBS

LOADER, RANK, MAIN = "loader", "rank", "main"
PARALLEL = tuple(n for n, k in KNOBS.items() if k.across_ranks)  # the multi-rank knobs: a rank's parallel setting


@dataclass(frozen=True)
class Hung:
    """One hung trial: its number, its hang (`kind`, `where` it waited: TrialResult.hung), the knobs it ran and the
    baseline's."""

    trial: int
    kind: str
    where: str
    knobs: dict[str, Any]
    baseline: dict[str, Any]

    @classmethod
    def of(cls, trial: int, hung: dict | None, knobs: dict, baseline: dict) -> Hung | None:
        """From a trial's `hung` (TrialResult.hung; None: it did not hang)."""
        if not hung:
            return None
        return cls(trial, hung.get("kind", MAIN), hung.get("where", ""), {**baseline, **knobs}, dict(baseline))

    def _workers(self) -> tuple[int, int]:
        """(the fewest workers ruled out, the baseline's own count)."""
        own = self.baseline.get("num_workers") or 0
        return (max(1, self.knobs.get("num_workers") or 1) if own else 1), own

    def parallel(self) -> dict[str, Any]:
        """The parallel setting a stopped rank ran with: its multi-rank knobs set otherwise than the baseline."""
        return {k: self.knobs[k] for k in PARALLEL if k in self.knobs and self.knobs[k] != self.baseline.get(k)}

    def rules_out(self, knobs: dict[str, Any]) -> bool:
        """Whether `knobs` (a config: the searched knobs, the rest as the baseline's) is ruled out by this hang."""
        knobs = {**self.baseline, **knobs}
        if self.kind == LOADER:
            fewest, own = self._workers()
            workers = knobs.get("num_workers") or 0
            return workers >= fewest and workers != own
        setting = self.parallel()
        return self.kind == RANK and bool(setting) and all(knobs.get(k) == v for k, v in setting.items())

    @property
    def rule(self) -> str | None:
        """What it rules out, in words ("num_workers > 0", "sharding=fsdp"); None: only its own config."""
        if self.kind == LOADER:
            fewest, own = self._workers()
            return "num_workers > 0" if not own else f"num_workers >= {fewest} (the baseline's {own} kept)"
        setting = self.parallel()
        if self.kind == RANK and setting:
            return ", ".join(f"{k}={v}" for k, v in setting.items())
        return None

    def not_tried(self, search: dict[str, list], ran: list[dict]) -> dict[str, list]:
        """The searched values it kept from running (`search`: the space's lists; `ran`: the knobs of the trials
        that ran): for a loader hang, each worker count ruled out that no trial ran; for a rank's, its setting."""
        if self.kind == LOADER:
            values = [v for v in search.get("num_workers", []) if self.rules_out({"num_workers": v})]
            return {"num_workers": [v for v in values if all(r.get("num_workers") != v for r in ran)]}
        return {k: [v] for k, v in self.parallel().items() if k in search} if self.kind == RANK else {}

    def describe(self) -> str:
        """The hang in a few words: "trial #2 hung: loader worker 0 in Corpus.__getitem__ (num_workers > 0 ruled
        out)"."""
        rule = self.rule
        return f"trial #{self.trial} hung: {self.where or 'no step in time'}" + (f" ({rule} ruled out)" if rule else "")


def ruled_out(hangs: list[Hung], knobs: dict[str, Any]) -> Hung | None:
    """The first hang that rules `knobs` out, or None."""
    return next((h for h in hangs if h.rules_out(knobs)), None)
