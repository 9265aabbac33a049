"""A search's answer in the few lines a person reads first: what the best config changes (each knob with its
safety class), how much faster it is (with its range, and how that was measured), whether it is safe, and the
command that runs it (`autotune run RUN/best_config.yaml -- CMD` for a program, the `load_config` line for a
factory); then the few facts that change how far to trust it (a trial that hung or was cut at the budget's end,
a baseline replaced, a tie, pairs measured under load and not counted, loss parity not judged, the baseline
re-measured far from its trial's read). MLflow's
trials view shows the re-measured speedup and its range on the winner's row (`rows`). The terminal's last screen
(autotune.cli.report) and the MLflow parent run's description (autotune.integrations.tracking) say the same lines;
everything else a search found is in `autotune report RUN`.

Read from a `records.SearchResult` and the best_config.yaml it wrote, never from the search's objects, so a run
dir read back says what the search said.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import knobs as K
from autotune.decide.checked import status
from autotune.records.run_dir import trial_dir_of
from autotune.records.verdicts import ANCHOR_DRIFT, confirmed_unit, sig


@dataclass(frozen=True)
class Change:
    """A knob the best config sets otherwise than the baseline."""

    knob: str
    baseline: Any
    tuned: Any
    safety: str  # the registry's safety class: safe, reproducibility, numerics, dynamics


@dataclass(frozen=True)
class Answer:
    """What a search answers. `verdict`: faster | tie (a faster config did not hold up, the baseline kept) |
    baseline (nothing faster) | unknown (the re-measurement could not say) | unsettled (its pairs disagreed with the
    search's reads, taken again too: both figures, no single number) | none (no measured baseline)."""

    verdict: str
    changes: tuple[Change, ...] = ()
    speedup: float | None = None  # the claim: re-measured side by side where it was, else the search's figure
    low: float | None = None  # the pairs' range (re-measured with two or more pairs)
    high: float | None = None
    pairs: int = 0  # side-by-side pairs counted (0: not re-measured)
    # the search's figure of its best: its fresh reads' ratio to the baseline read beside them, or its trial's to
    # the baseline read near its time (autotune.decide.reference); the two trials' ratio without reads
    trials_speedup: float | None = None
    unit: str = "samples/s"  # the search's (trial.result.unit_of): a language model's tokens/s
    safety: str = "baseline"  # decide.checked.status of the best
    lr_factor: float | None = None  # a larger batch's learning-rate scaling (best_config.yaml's batch advice)
    tied: dict[str, Any] | None = None  # the faster config that tied: trial, changes, speedup, why
    command: str | None = None  # what runs the best config in production (None: nothing was exported)
    adds: str | None = None  # what that command adds to a program's own (best_config.yaml's production)
    trust: tuple[str, ...] = ()
    stuck: int = 0  # how many of `trust`'s first lines are the hung and cut trials' (`stuck`: a log's path, whole)
    log: str | None = None  # where a search with no answer says why: the baseline's trial log
    interval: tuple[float, float] | None = None  # the search's figure's 95% interval, where it has one

    def headline(self) -> list[str]:
        """The answer in two lines: how much faster and whether it is safe, then what the best config changes
        (a search with no answer: why, and where to look)."""
        if self.verdict == "none":
            return [
                "no answer: the baseline was not measured, so nothing can be compared",
                f"its log: {self.log}" if self.log else "no trial ran",
            ]
        changed = "best config: " + (self._changes(self.changes) or "the baseline's")
        if self.verdict == "unknown":
            return [
                f"speedup unknown: the pairs ran under outside load (the trials read {_x(self.trials_speedup)})"
                + self._safety(),
                changed,
            ]
        if self.verdict == "unsettled":  # both figures, neither a claim (autotune.decide.confirm.unsettled)
            within = f" (95%: {_range(*self.interval)})" if self.interval else ""
            pairs = f"{_range(self.low, self.high)} in {self.pairs} pairs side by side" if self.pairs else "no pair"
            return [
                f"speedup unsettled: {_x(self.trials_speedup)}{within} in the search, {pairs}" + self._safety(),
                changed,
            ]
        if self.verdict == "tie":
            t = self.tied
            return [
                f"a tie: trial #{t['trial']} read {t['speedup']}, {t['why']}",
                f"best config: the baseline's; trial #{t['trial']} changed " + self._changes(t["changes"]),
            ]
        if self.verdict == "baseline":
            return ["no config measured faster than the baseline", changed]
        return [self._speedup() + self._safety(), changed]

    def _changes(self, changes) -> str:
        """The knobs a config sets, as best_config.yaml names them, grouped by safety class, riskiest first:
        "batch_size=64 (dynamics: learning rate x2), precision=bf16-mixed (numerics)" (the table below gives
        each one's baseline value)."""
        groups = []
        for safety in reversed(K.SAFETY_CLASSES):
            group = [c for c in changes if c.safety == safety]
            if not group:
                continue
            why = safety
            if self.lr_factor and any(c.knob == "batch_size" for c in group):  # what the dynamics class asks
                why += f": learning rate x{self.lr_factor:.3g}"
            groups.append(", ".join(f"{c.knob}={K.shown(c.tuned)}" for c in group) + f" ({why})")
        return ", ".join(groups)

    def _speedup(self) -> str:
        head = f"speedup: {_x(self.speedup)} {self.unit}"
        if self.pairs > 1:
            return f"{head} ({_range(self.low, self.high)}, {self.pairs} pairs side by side)"
        if self.pairs == 1:
            return f"{head} (one pair side by side)"
        return f"{head} (the search's figure, not re-measured)"

    def _safety(self) -> str:
        return f"; {safety_words(self.safety, self.changes)}" if self.safety != "baseline" else ""


def _x(value: float | None) -> str:
    return "?" if value is None else f"{sig(value)}x"


def _range(low: float, high: float) -> str:
    return f"{sig(low)}-{sig(high)}x"


def safety_words(safety: str, changes) -> str:
    """A config's safety status (decide.checked.status) as the answer says it: "loss parity passed", "numerics
    unchanged", "changes the training dynamics" (a safe status where a dynamics knob changed: no parity asked)."""
    if safety == "safe" and any(c.safety == "dynamics" for c in changes):
        return "changes the training dynamics"
    return {
        "parity passed": "loss parity passed",
        "safe": "numerics unchanged",
        "unchecked": "loss parity not run",
        "parity not judged": "loss parity not judged",
        "parity not measured": "loss parity not measured",
    }.get(safety, safety)


def changes_of(
    knobs: dict[str, Any], baseline: dict[str, Any], user_knobs: K.UserKnobs | None = None
) -> tuple[Change, ...]:
    """The knobs `knobs` changes from `baseline`, each with its safety class (a user knob's as the search's
    `user_knobs` declare it)."""
    lookup = (user_knobs or K.UserKnobs()).lookup
    return tuple(Change(k, baseline.get(k), v, lookup(k).safety) for k, v in knobs.items() if v != baseline.get(k))


def shown(path: Path, base: Path | None = None) -> str:
    """A path as a person types it: relative to `base` (the working dir) where it is under it; None: absolute."""
    path = Path(path).resolve()
    if base is None or not path.is_relative_to(base.resolve()):
        return str(path)
    return str(path.relative_to(base.resolve()))


def command(best_config: Path, data: dict[str, Any], cwd: Path | None = None) -> str:
    """What runs a best config: a program's own command under `autotune run`, with the best's flags, from its
    directory; else the `load_config` line of the code that builds the model and loader. Paths relative to
    `cwd` where they are under it (None: absolute, and a program's directory always named)."""
    workload = data.get("workload") or {}
    program = workload.get("command")
    if not program:
        return f'cfg = autotune.load_config("{shown(best_config, cwd)}")'
    where = Path(workload["dir"]) if workload.get("dir") else cwd
    line = f"autotune run {shown(best_config, where)} -- {shlex.join(program)}"
    if where is None or (cwd is not None and where.resolve() == cwd.resolve()):
        return line
    return f"cd {shlex.quote(str(where))} && {line}"


def adds(production: dict[str, Any] | None) -> str | None:
    """What `autotune run` adds to a program's own command line and process (best_config.yaml's `production`:
    autotune.export.best_config.production), in one line; None for a factory's, or a best that adds nothing."""
    if not production:
        return None
    parts = [shlex.join(production["adds"])] if production.get("adds") else []
    applies = production.get("applies") or {}
    if applies:  # where the program makes its model, optimizer and loader (autotune.instrument), or its cfg's calls
        parts.append("set in its process: " + ", ".join(f"{k}={K.shown(v)}" for k, v in applies.items()))
    return "; ".join(parts) or None


def of(result, *, absolute: bool = False) -> Answer:
    """The answer of a finished or stopped search (`records.SearchResult`), its paths relative to the working
    dir where they are under it (`absolute`: never, for a reader elsewhere, MLflow's)."""
    from autotune.export import load

    cwd = None if absolute else Path.cwd()
    base, best = result.baseline, result.best
    run_dir = Path(result.run_dir)
    if not (base and base.throughput and best):
        log = Path(base.trial_dir or trial_dir_of(run_dir, base.number)) / "trial.log" if base else None
        shown_log = shown(log, cwd) if log is not None and log.exists() else None
        hung = stuck(result, cwd)
        return Answer("none", log=shown_log, trust=tuple(hung), stuck=len(hung))
    path = result.best_config_path
    data = load.read(path) if path else {}
    changes = changes_of(best.knobs, base.knobs, result.user_knobs)
    verdict = "faster"
    if result.speedup_unknown:
        verdict = "unknown"
    elif result.speedup_unsettled:
        verdict = "unsettled"
    elif best is base:
        verdict = "tie" if best.tie else "baseline"
    confirmed = result.confirmed or (result.confirm if verdict == "unsettled" else None)
    lr = ((data.get("batch") or {}).get("lr_scaling") or {}).get("factor")
    hung = stuck(result, cwd)
    return Answer(
        verdict=verdict,
        changes=changes,
        speedup=result.speedup,
        low=confirmed.get("speedup_low") if confirmed else None,
        high=confirmed.get("speedup_high") if confirmed else None,
        pairs=confirmed["rounds"] if confirmed else 0,
        interval=tuple(result.search_interval) if result.search_interval else None,
        trials_speedup=result.search_speedup,
        unit=result.unit.label,
        safety=status(best, base),
        lr_factor=lr if lr and lr != 1 else None,
        tied=_tied(result) if verdict == "tie" else None,
        command=command(path, data, cwd) if path else None,
        adds=adds(data.get("production")),
        trust=tuple(hung + trust(result, verdict, absolute)),
        stuck=len(hung),
    )


def _tied(result) -> dict[str, Any]:
    """The faster config the baseline kept its place against: its changes, its figure and why it tied."""
    tie, base, confirm = result.best.tie, result.baseline, result.confirm or {}
    faster = next(r for r in result.records if r.number == tie["faster_trial"])
    if confirm.get("best_trial") == faster.number and confirm.get("verdict") not in (None, "faster", "unknown"):
        pairs = _range(confirm["speedup_low"], confirm["speedup_high"])
        figure, why = f"{_x(confirm['speedup_x'])} side by side", f"but not faster in every pair ({pairs})"
    else:  # a tie of the trials' windows (records.pick_best)
        figure, why = (
            f"{_x((faster.figure or {}).get('x') or faster.throughput / base.throughput)} in its trial",
            "inside the measured noise",
        )
    return {
        "trial": faster.number,
        "changes": changes_of(faster.knobs, base.knobs, result.user_knobs),
        "speedup": figure,
        "why": why,
    }


def stuck(result, cwd: Path | None = None) -> list[str]:
    """The trials that hung (`SearchResult.hangs`) or that the budget's end cut, a line for each kind: "1 trial
    hung: num_workers=1 (loader worker 0 in Corpus.__getitem__): see runs/x/trials/0002/trial.log" (paths relative
    to `cwd` where they are under it). What a hang ruled out was not tried and is never exported."""
    lines, base = [], result.baseline.knobs if result.baseline else {}
    hangs = result.hangs
    if hangs:
        named = ", ".join(f"{_knobs(h['knobs']) or 'the baseline'} ({h['where'] or 'no step in time'})" for h in hangs)
        logs = ", ".join(shown(Path(h["log"]), cwd) for h in hangs)
        lines.append(f"{len(hangs)} trial{'s' * (len(hangs) > 1)} hung: {named}: see {logs}")
    cut = [r for r in result.records if r.status == "cut"]
    if cut:
        named = ", ".join(
            _knobs({k: v for k, v in r.knobs.items() if v != base.get(k)}) or f"trial #{r.number}" for r in cut
        )
        lines.append(f"{len(cut)} trial{'s' * (len(cut) > 1)} cut at the time budget's end: {named}")
    return lines


def _knobs(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={K.shown(v)}" for k, v in knobs.items())


def trust(result, verdict: str = "faster", absolute: bool = False) -> list[str]:
    """One line for each fact that changes how far to trust the answer: an unsettled claim's why and the command
    that re-measures it (its run dir relative to the working dir unless `absolute`); pairs taken again because
    the first ones were no claim; a baseline not run as the spec gave it (the device cannot); a tie the best won;
    side-by-side pairs measured under outside load and not counted; loss parity not judged, not measured or not
    run; the baseline re-measured far from its trial's read (every trial was compared with that read)."""
    best, base, confirm, unit = result.best, result.baseline, result.confirm or {}, result.unit
    lines = []
    if verdict == "unsettled":
        lines.append(f"unsettled: {confirm['unsettled']}")
        run = shown(result.run_dir, None if absolute else Path.cwd())
        lines.append(f"re-measure it on a quiet host: autotune confirm {shlex.quote(run)}")
    elif confirm.get("taken_again"):
        taken = confirm["taken_again"]
        lines.append(
            f"the pairs were taken again, {sig(taken['spacing_s'], 2)} s apart; the first ones were no claim: {taken['why']}"
        )
    lines += [
        f"baseline replaced: {line.removeprefix('baseline ')}"
        for line in result.space.dropped
        if line.startswith("baseline ")
    ]
    if best is not None and best.tie and verdict != "tie":
        t = best.tie
        lines.append(
            f"tie: trial #{t['faster_trial']} read {sig(t[unit.key('faster')] / t[unit.key('chosen')])}x "
            f"this config, inside the measured noise: the safer config kept it"
        )
    disturbed = confirm.get("disturbed_pairs") or []
    if disturbed:
        shares = sorted(int(s) for d in disturbed for s in _shares(d.get("why", "")))
        load = f" (other processes took {shares[0]}-{shares[-1]}% of the CPU)" if shares else ""
        lines.append(
            f"{len(disturbed)} pair{'s' if len(disturbed) > 1 else ''} ran under outside load{load}: not counted"
        )
    safety = status(best, base) if best is not None and base is not None else "baseline"
    if safety in ("parity not judged", "parity not measured"):
        lines.append(f"loss parity {safety.removeprefix('parity ')}: {_short((best.parity or {}).get('reason'))}")
    elif safety == "unchecked":
        lines.append("loss parity not run (the search stopped first): resume the search to check it")
    drift, ci = confirm.get("baseline_drift"), confirm.get("baseline_trial_ci95") or 0.0
    if drift is not None and abs(drift) > max(ANCHOR_DRIFT, 2 * ci) and verdict != "unsettled":  # (its why says it)
        lines.append(
            f"the baseline re-measured {drift:+.0%} off the "
            f"{sig(confirm[confirmed_unit(confirm).key('baseline_trial')])} {confirmed_unit(confirm).label} "
            "every trial was compared with"
        )
    return lines


def _shares(why: str) -> list[str]:
    """The load shares in a disturbed pair's reason ("other processes used 48% of the host's CPU time ...")."""
    import re

    return re.findall(r"used (\d+)% of the host", why)


def _short(reason: str | None, limit: int = 80) -> str:
    """A reason's first clause, for one line (the whole of it is in `autotune report`)."""
    text = (reason or "no reason recorded").split("; ")[0]
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def rows(result) -> list[tuple[Any, bool, dict[str, str], dict[str, float]]]:
    """What the trials' rows on MLflow's first screen say of the answer, each cell short enough for its column
    (about 11 characters at 1600 pixels): (record, whether it is the best, cells, metrics). The trial re-measured
    side by side: its speedup (`remeasured`: "1.44x"; a tie's "1.45x, tie") and the pairs' range (`pairs`:
    "1.34-1.53x"), with the figures as metrics; the best, where that is another row (the baseline kept in a tie:
    "kept, tie")."""
    best, base, confirm = result.best, result.baseline, result.confirm or {}
    if best is None or base is None or not base.throughput:
        return []
    out = []
    measured = next((r for r in result.records if r.number == confirm.get("best_trial")), None)
    if measured is not None and confirm.get("verdict") == "unknown":
        out.append((measured, measured is best, {"remeasured": "unknown", "pairs": "under load"}, {}))
    elif measured is not None and confirm.get("verdict") == "unsettled":
        pairs = _range(confirm["speedup_low"], confirm["speedup_high"]) if confirm.get("speedup_low") else "none"
        out.append((measured, measured is best, {"remeasured": "unsettled", "pairs": pairs}, {}))
    elif measured is not None and confirm.get("speedup_x"):
        n = confirm["rounds"]
        metrics = {"remeasured_speedup_x": confirm["speedup_x"]}
        if n > 1:
            metrics |= {
                "remeasured_speedup_low_x": confirm["speedup_low"],
                "remeasured_speedup_high_x": confirm["speedup_high"],
            }
        cells = {
            "remeasured": _x(confirm["speedup_x"]) + ("" if measured is best else ", tie"),
            "pairs": _range(confirm["speedup_low"], confirm["speedup_high"]) if n > 1 else "one pair",
        }
        out.append((measured, measured is best, cells, metrics))
    if best is not measured:
        cells = {"remeasured": "kept, tie"} if best is base and best.tie else {}
        if best is not base and confirm.get("verdict") is None:
            cells = {"remeasured": "not run"}
        out.append((best, True, cells, {}))
    return out


def description(answer: Answer, report: str) -> str:
    """The answer as markdown, for the MLflow parent run's description (`report`: the command for the rest)."""
    lines = answer.headline()
    out = [f"**{lines[0]}**", "", *lines[1:]]
    if answer.command:
        out += ["", "```", answer.command, "```"]
    if answer.trust:
        out += ["", *(f"- {t}" for t in answer.trust)]
    return "\n".join([*out, "", f"details: `{report}`"])
