"""The reference a search weighs its trials against while the host's speed drifts, and the best's figure freed of
its selection.

Why: a trial's ratio to the baseline used to be its throughput over the baseline's one read at the search's start.
On a shared 2-core VM that read moves: the baseline re-read against its own trial at the search's end +19%, +17%,
-27% (issue 53), and the trials' ratio of the best read 0-40% above its side-by-side pairs over 9 program searches.
Two causes: the host drifts (its speed moves +-20% over tens of seconds), and the best of many noisy trials reads
high because it is the best (the winner's curse).

The model (this module; the standard library only, no Optuna, no torch):
- `Reference`: the baseline config read again as the search goes (`Read`: the middle of its window in Unix seconds,
  its samples/s, its window's relative 95% CI). The host's speed is a random walk in log space (its rate `q` per
  second: the prior DRIFT_PER_S, pulled toward what the reads show), each read one fresh process off it by the
  process spread (stats.PROCESS_CV) and its window's CI. A Kalman filter and its Rauch-Tung-Striebel smoother give
  the level at every read from all of them; between two reads the level is interpolated (a Brownian bridge: the
  mean linear in log, its variance the ends' plus w(1-w) q dt); beyond the last read it is the last, its variance
  growing by q a second. `at(t)`: the level, its log standard deviation, and the part of it no other trial shares.
- `Ratio`: a trial's throughput over the level at its own window's time: `x`, `ci` (95%, relative: the trial's
  window and the drift since the nearest reads, what the search compares trials with) and `interval` (95%: the
  whole reference's uncertainty and the spread between fresh processes added, that spread as this search's reads
  show it, `Reference.spread`, at Student's t for the few pairs it stands on, and a side by side's own noise: where
  a side by side should land).
- `confirmed`: the selection's correction. A trial that becomes the incumbent is read again in a fresh process
  beside a reference read (`Schedule`); those fresh reads were not selected, so their ratios, and not the trial's,
  are its figure: the live "xN" and the one the final pairs are expected to reproduce.
- `Schedule`: when to read. A read costs a fresh process (a warm fork of a built-in trial: ~1-3 s on 2 cores); the
  search reads while the reads so far, and the next, stay within SHARE of its time (issue 53's target: at most 15%).
- `Judge`: the strategy's hook (`autotune.decide.strategy.Strategy`): a study trial's figure in the baseline's
  units (its ratio x the baseline trial's samples/s) and its CI, from the study alone (the reads are study user
  attributes), so a resumed search judges as it did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autotune.stats import PROCESS_CV, T95, Z95, promote_floor

# The host's drift as a prior, the variance per second of ln(speed) as a random walk: on this 2-core VM the baseline
# re-read +19%, +17% and -27% off its own trial's read 2-6 minutes later (issue 53), a standard deviation of ~20% over
# 300 s: 0.2^2 / 300 (6% over 30 s). A GPU host: not measured (0: the reads alone say).
DRIFT_PER_S = {"cpu": 0.2**2 / 300}
PRIOR_S = 60.0  # the prior weighs as much as this many seconds of reads (`Reference.q`)
# The spread between fresh processes of one config, as a prior (a log sd) and the pairs of reads it weighs as much
# as (`Reference.spread`; the figures' intervals: where a side by side lands). The middle of what this project
# measured on 2-core CPU hosts (jpeg_pipeline 4.6-8.5%, tiny_cnn 5.2-17.6%: scripts/bench/bench_window.py; the
# quickstart's baseline 18% over 28 processes; 13-18% on this VM), not their least (stats.PROCESS_CV, 5%: the floor
# the search's comparisons keep, where two trials are compared by one machinery). Worth 3 pairs: worth one, the
# baseline's two reads 27% apart alone set a quiet search's spread to 26%, and with its t quantile an interval of
# 0.4-10x. With 5% worth 3 pairs, 9 of 12 fresh bench_drift searches' pairs landed inside (median |z| 1.28, a
# calibrated interval 0.67); with 10%, 12 of 12 fresh ones after, and 59 of the 60 kept (median |z| 0.65)
# (scripts/measurements/cpu-2026-12-07e-landing). A GPU host: none measured (the reads alone say).
SPREAD_PRIOR = ({"cpu": 0.10}, 3)
# the side by side a figure's interval says where it lands: this many pairs, each a fresh process of the best and one
# of the baseline, their median ratio (search.confirm_rounds' default; `autotune confirm` takes at least as many)
SIDE_BY_SIDE = 3
SHARE = 0.10  # the reads' share of the search the schedule keeps to (issue 53's target: at most 15%)
READS_KEY, CONFIRMS_KEY = "reference_reads", "confirm_reads"  # the study's user attributes (`Judge`)
ANCHOR_KEY = "anchor"  # the baseline trial's user attribute: its two reads (`anchor_reads`), for the spread


def anchor_reads(metrics: dict[str, Any]) -> list[dict[str, float]] | None:
    """The baseline trial's two reads in fresh processes (autotune.decide.confirm.reread_anchor: its metrics
    `anchor_first_<unit>`, `anchor_reread_<unit>`, their CIs and times) as `Read` dicts, or None where it was read
    once."""
    first, second = (
        next((v for k, v in metrics.items() if k.startswith(f"{name}_") and k.endswith("_per_s") and v), None)
        for name in ("anchor_first", "anchor_reread")
    )
    at, again = metrics.get("window_mid_unix"), metrics.get("anchor_reread_unix")
    if not (first and second and at and again):
        return None
    cis = (metrics.get("anchor_first_ci95") or metrics.get("step_mean_ci95"), metrics.get("anchor_reread_ci95"))
    return [Read(at, first, capped(cis[0])).as_dict(), Read(again, second, capped(cis[1])).as_dict()]


def capped(ci: float | None) -> float:
    """A window's CI as a read carries it: CI_CAP at most, none (NaN, unknown) as 0."""
    return min(ci, CI_CAP) if ci and ci == ci else 0.0


@dataclass(frozen=True)
class Read:
    """One read of a config: where in time (the middle of its window, Unix seconds), its throughput, and its
    window's relative 95% CI (`step_mean_ci95`)."""

    at: float
    value: float
    ci: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"at": self.at, "value": self.value, "ci": self.ci}

    @classmethod
    def of(cls, d: dict[str, Any]) -> "Read":
        ci = d.get("ci")
        return cls(float(d["at"]), float(d["value"]), float(ci) if ci is not None and math.isfinite(ci) else 0.0)


@dataclass(frozen=True)
class Level:
    """The reference's level at a time: samples/s, the standard deviation of its log (relative), and the part of it
    that two trials at different times do not share (`between`: the drift since the nearest reads, not those reads'
    own noise, which every trial near them shares: what a comparison of two trials adds)."""

    value: float
    sd: float
    between: float = 0.0

    @property
    def ci(self) -> float:
        return Z95 * self.sd


@dataclass(frozen=True)
class Ratio:
    """A throughput over the reference at its time: `x`; `ci` its relative 95% half-width as the search compares
    trials (the window's and the drift since the nearest reads: `Level.between`); `interval` its 95% half-width
    against the baseline, where a side by side is expected to land (the window's, the whole reference's, the
    spread between fresh processes, and the side by side's own: `Reference._side_by_side`)."""

    x: float
    ci: float
    interval: float

    @property
    def low(self) -> float:
        return self.x * math.exp(-self.interval)

    @property
    def high(self) -> float:
        return self.x * math.exp(self.interval)


def _sd(ci: float) -> float:
    """A relative 95% half-width as a log standard deviation (an infinite or unknown one: none)."""
    return ci / Z95 if ci and math.isfinite(ci) else 0.0


@dataclass
class Reference:
    """The baseline's level over time, from its reads (see the module doc)."""

    reads: list[Read]
    device: str = "cpu"
    # two reads of one config in fresh processes that inform the spread alone (`_spread`): the baseline trial's
    # anchor, whose mean is its one read in `reads`
    pairs: list[tuple[Read, Read]] = field(default_factory=list)
    prior: tuple[dict[str, float], int] = SPREAD_PRIOR  # the spread's prior: a log sd by device, worth so many pairs
    _smoothed: list[tuple[float, float, float]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        self.reads = sorted((r for r in self.reads if r.value > 0), key=lambda r: r.at)
        self.process = PROCESS_CV.get(self.device, 0.0)
        self.q = self._drift()
        self.spread, self.spread_dof = self._spread()
        self._smooth()

    def _noise(self, r: Read) -> float:
        """A read's variance around the host's level (log): its window's, and one process's spread."""
        return _sd(r.ci) ** 2 + self.process**2

    def _spread(self) -> tuple[float, int]:
        """The spread between fresh processes of one config (a log standard deviation) as this search's reads show
        it: consecutive reads' log-difference beyond their windows' noise and the prior's drift between them is
        twice a process's variance; pooled with the prior (`prior`: SPREAD_PRIOR, worth its pairs). On this 2-core
        VM the quickstart's baseline read 2,992-6,255 samples/s over 28 processes (CV 18%): with the 5% prior
        alone, 6 of 16 searches' re-measurements fell outside their best's 95% interval; with the spread their
        reads showed, 2 (issue 53). It widens the figures' intervals
        (`Ratio.interval`: where a side by side lands) only: whether reads tens of seconds apart differ by the host's
        drift or by the process cannot be told apart from reads at one spacing, so the level follows them as before
        (`_noise`, `_drift`), and the search's comparisons keep their floor (stats.PROCESS_SPREAD). The baseline
        trial's own two reads (`pairs`) count: on a quiet host they are the only pair (issue 64: a quickstart's
        baseline read 27% apart in its trial, and its best's interval, drawn from the prior alone, missed its pairs).
        Also how many pairs it stands on, the prior's counted (`interval`: its Student's t)."""
        (priors, n), drift = self.prior, DRIFT_PER_S.get(self.device, 0.0)
        total = n * priors.get(self.device, 0.0) ** 2
        pairs = [(a, b, abs(b.at - a.at), math.log(b.value / a.value) ** 2) for a, b in self.pairs]
        for a, b, dt, moved in [*self._steps(), *pairs]:
            total, n = total + max(moved - _sd(a.ci) ** 2 - _sd(b.ci) ** 2 - drift * dt, 0.0) / 2, n + 1
        return math.sqrt(total / n), n

    def _steps(self):
        """Consecutive reads: the earlier, the later, the seconds between them, and the square of their log-ratio."""
        for a, b in zip(self.reads, self.reads[1:]):
            yield a, b, b.at - a.at, math.log(b.value / a.value) ** 2

    def _drift(self) -> float:
        """The random walk's variance per second: the prior (DRIFT_PER_S, worth PRIOR_S seconds) and what
        consecutive reads moved beyond their own noise."""
        prior = DRIFT_PER_S.get(self.device, 0.0)
        moved, span = prior * PRIOR_S, PRIOR_S
        for a, b, dt, step in self._steps():
            if dt > 0:
                moved, span = moved + max(0.0, step - self._noise(a) - self._noise(b)), span + dt
        return moved / span

    def _smooth(self) -> None:
        """The level at each read from every read: a Kalman filter forward, Rauch-Tung-Striebel backward;
        `_smoothed`: (mean of ln, its variance, the gain that ties it to the next read's)."""
        forward: list[tuple[float, float]] = []
        for i, r in enumerate(self.reads):
            y, noise = math.log(r.value), self._noise(r)
            if not i:
                m, p = y, noise
            else:
                m, p = forward[-1][0], forward[-1][1] + self.q * (r.at - self.reads[i - 1].at)
                gain = p / (p + noise) if p + noise > 0 else 1.0
                m, p = m + gain * (y - m), (1 - gain) * p
            forward.append((m, p))
        out = [(*forward[-1], 0.0)] if forward else []
        for i in range(len(forward) - 2, -1, -1):
            m, p = forward[i]
            predicted = p + self.q * (self.reads[i + 1].at - self.reads[i].at)
            gain = p / predicted if predicted > 0 else 0.0
            m_next, p_next, _ = out[0]
            out.insert(0, (m + gain * (m_next - m), p + gain**2 * (p_next - predicted), gain))
        self._smoothed = out

    def at(self, t: float) -> Level | None:
        """The level at Unix time `t` (None: no read yet)."""
        s, reads = self._smoothed, self.reads
        if not s:
            return None
        if t <= reads[0].at:
            m, v, between = s[0][0], s[0][1], self.q * (reads[0].at - t)
        elif t >= reads[-1].at:
            m, v, between = s[-1][0], s[-1][1], self.q * (t - reads[-1].at)
        else:
            i = max(j for j in range(len(reads)) if reads[j].at <= t)
            (m0, v0, gain), (m1, v1, _) = s[i], s[i + 1]
            dt = reads[i + 1].at - reads[i].at
            w = (t - reads[i].at) / dt if dt > 0 else 0.0
            cov = gain * v1  # the two smoothed levels' covariance (RTS)
            m = (1 - w) * m0 + w * m1
            v = (1 - w) ** 2 * v0 + w**2 * v1 + 2 * w * (1 - w) * cov
            between = w * (1 - w) * self.q * dt
        return Level(math.exp(m), math.sqrt(max(v, 0.0) + between), math.sqrt(between))

    def ratio(self, value: float, t: float, ci: float = 0.0) -> Ratio | None:
        """`value` (samples/s, its window's relative 95% CI `ci`), read at `t`, over the level then."""
        own = self._own(value, t, ci)
        return Ratio(own[0], own[1], math.hypot(own[2], self._side_by_side())) if own else None

    def mean_ratio(self, reads: list[Read]) -> Ratio | None:
        """Several reads of one config as one ratio: the mean of their log-ratios, its CI and interval from theirs
        (independent reads; the reference's share of each is not, which this leaves a little narrow), and the side
        by side's own noise once."""
        own = [r for r in (self._own(x.value, x.at, x.ci) for x in reads) if r is not None]
        if not own:
            return None
        n = len(own)
        x = math.exp(sum(math.log(r[0]) for r in own) / n)
        ci = math.sqrt(sum(r[1] ** 2 for r in own)) / n
        interval = math.sqrt(sum(r[2] ** 2 for r in own)) / n
        return Ratio(x, ci, math.hypot(interval, self._side_by_side()))

    def _own(self, value: float, t: float, ci: float) -> tuple[float, float, float] | None:
        """A read's ratio to the level, its CI (the window's and the drift since the nearest reads), and the 95%
        half-width of its own uncertainty: the window's, the level's, and its process's spread (at Student's t for
        the pairs the spread stands on: an sd known from a few pairs says little about the next process)."""
        level = self.at(t)
        if level is None or not value:
            return None
        window = _sd(ci)
        return (
            value / level.value,
            Z95 * math.hypot(window, level.between),
            math.hypot(Z95 * window, Z95 * level.sd, self._t() * self.spread),
        )

    def _t(self) -> float:
        return T95.get(self.spread_dof, Z95)

    def _side_by_side(self) -> float:
        """The 95% half-width of a side by side's own noise (`SIDE_BY_SIDE` pairs): each pair's log-ratio two
        fresh processes, their median's variance pi/2 over the pairs' mean's. The interval is where a side by side
        lands, not where the true ratio lies: on the 2-core host, 27 of 36 searches' pairs lay inside the interval
        without it and the t, 31 with them (and 35 with the 10% prior: scripts/measurements/cpu-2026-12-07e-landing)."""
        return self._t() * self.spread * math.sqrt(math.pi / SIDE_BY_SIDE)


def confirmed(reference: Reference, fresh: list[Read]) -> Ratio | None:
    """The selection's correction: an incumbent's figure from its fresh reads alone (not from the trial that made it
    the incumbent, which was selected for reading high); None before any."""
    return reference.mean_ratio(fresh) if fresh else None


def read_ci(target_ci: float, device: str) -> float:
    """How well a read's window knows its mean: as the anchor's (`stats.promote_floor`: never tighter than the spread
    between fresh processes, which no window removes and which each read carries anyway)."""
    return promote_floor(target_ci, device)


CI_CAP = 0.5  # a window known worse than +-50% (a few steps) counts as +-50% (strategy.MAX_INCUMBENT_CI)


def figures(reference: Reference, base_value: float, read: Read, fresh: list[Read], unit: str) -> dict[str, float]:
    """A trial's figures against the reference, as its record keeps them (trials.csv, MLflow): `reference_<unit>`
    (the level at its window's time), `speedup_x` (its own read's ratio) with `speedup_low`/`speedup_high` (its
    interval: where a side by side should land), `judged_<unit>` and `judged_ci95` (all its reads' ratio, in the
    baseline trial's units, and its CI: what picks the best, as the strategy judged), and for a trial read again,
    `confirmed_speedup_x` with its `confirmed_speedup_low`/`_high` and `confirm_reads` (its fresh reads alone:
    the figure freed of its selection). `unit`: the throughput's metric name (samples_per_s, tokens_per_s)."""
    level, mine, both = (
        reference.at(read.at),
        reference.ratio(read.value, read.at, read.ci),
        reference.mean_ratio([read, *fresh]),
    )
    if level is None or mine is None or both is None:
        return {}
    out = {
        f"reference_{unit}": level.value,
        "speedup_x": mine.x,
        "speedup_low": mine.low,
        "speedup_high": mine.high,
        f"judged_{unit}": both.x * base_value,
        "judged_ci95": both.ci,
    }
    again = confirmed(reference, fresh)
    if again is not None:
        out.update(
            confirmed_speedup_x=again.x,
            confirmed_speedup_low=again.low,
            confirmed_speedup_high=again.high,
            confirm_reads=float(len(fresh)),
        )
    return out


@dataclass
class Schedule:
    """When the search reads: `due(now, n)` while the reads so far and `n` more (each costing what the latest took,
    a fresh process from fork to result) stay within `share` of the search's time since `started`. So reads spread
    evenly over a search whatever its trials cost, and a dearer read (a program's start-up) comes less often."""

    started: float
    share: float = SHARE
    cost_s: float | None = None  # the latest read's cost (before the first: the baseline trial's second read's)
    spent_s: float = 0.0  # every read's cost, the incumbents' fresh reads too: the report's share
    reads: int = 0

    def due(self, now: float, n: int = 1) -> bool:
        return self.cost_s is not None and self.spent_s + n * self.cost_s <= self.share * (now - self.started)

    def done(self, cost_s: float) -> None:
        self.cost_s, self.spent_s, self.reads = cost_s, self.spent_s + cost_s, self.reads + 1


class Judge:
    """The strategy's figure of a study trial (`value`, `ci`): its throughput over the reference at its window's
    time (`window_unix`, stored by `strategy.trial_attrs`), in the baseline trial's samples/s; an incumbent read again by
    the mean of all its reads. The reads are the study's user attributes (READS_KEY: the baseline config's reads;
    CONFIRMS_KEY: trial number -> its fresh reads), the baseline trial's own read first, so a resumed search judges
    as it did. Without a baseline trial, or for a trial without its time, the raw figure stands. `refresh()` reads
    the study again (the search calls it once a trial or a read is told: a study read is a database query).
    `now_scale(now)`: the level at `now` over the baseline trial's read, and the part of its CI the drift since
    the last read adds: what turns a figure back into the samples/s a trial starting now would read."""

    def __init__(self, study, device: str = "cpu"):
        self.study, self.device = study, device
        self.reference: Reference | None = None
        self.base: Read | None = None
        self.base_number: int | None = None  # the baseline trial's number
        self.trial_reads: dict[int, Read] = {}  # each measured trial's own read (its window's time and figure)
        self.timed: set[int] = set()  # the trials with their window's time: those the reads judge
        self.confirms: dict[int, list[Read]] = {}

    def refresh(self) -> None:
        attrs = self.study.user_attrs
        trials = self.study.get_trials(deepcopy=False)
        self.trial_reads = {  # each measured trial's own read: what the reads judge
            t.number: Read(t.user_attrs["window_unix"], t.values[0], t.user_attrs.get("ci", 0.0))
            for t in trials
            if t.values and t.user_attrs.get("window_unix")
        }
        self.timed = set(self.trial_reads)
        baseline = next(
            (t for t in trials if t.user_attrs.get("source") == "baseline" and t.number in self.trial_reads), None
        )
        self.base_number = baseline.number if baseline else None
        self.base = self.trial_reads[baseline.number] if baseline else None
        self.confirms = {int(k): [Read.of(x) for x in v] for k, v in (attrs.get(CONFIRMS_KEY) or {}).items()}
        reads = [Read.of(r) for r in attrs.get(READS_KEY) or []]
        anchor = baseline.user_attrs.get(ANCHOR_KEY) if baseline else None
        pairs = [(Read.of(anchor[0]), Read.of(anchor[1]))] if anchor else []
        self.reference = Reference([self.base, *reads], self.device, pairs) if self.base else None

    def ratio(self, t) -> Ratio | None:
        """The trial's ratio over the reference (its fresh reads beside its own where it has them); a virtual
        repeat's (`repeat_of`: a config drawn again, told its measured value) is the measured trial's."""
        number = t.user_attrs.get("repeat_of", t.number)
        read = self.trial_reads.get(number)
        if self.reference is None or read is None:
            return None
        return self.reference.mean_ratio([read, *self.confirms.get(number, [])])

    def value(self, t) -> float:
        r = self.ratio(t)
        return r.x * self.base.value if r else t.values[0]

    def ci(self, t) -> float:
        r = self.ratio(t)
        return r.ci if r else t.user_attrs.get("ci", 0.0)

    def confirmed(self, number: int) -> bool:
        return bool(self.confirms.get(number))

    def now_scale(self, now: float) -> tuple[float, float]:
        level = self.reference.at(now) if self.reference else None
        if level is None:
            return 1.0, 0.0
        return level.value / self.base.value, Z95 * level.between


def drift_seen(records, device: str = "cpu") -> str | None:
    """Why the search's own reads show the host drifting beyond the pairs' noise, or None (issue 64: on a quiet host
    the reference reads change no decision and cost 3-32% of a search): the baseline trial's two reads (its anchor,
    `confirm.reread_anchor`) further apart than two fresh processes of one config allow at 95% (stats.PROCESS_CV and
    each window's CI), or a trial (or the baseline's second read) measured under load from outside. `records`: the
    search's trial records so far."""
    base = next((r for r in records if r.is_baseline and r.throughput), None)
    if base is not None:
        m, unit = base.metrics, base.unit
        first, second = m.get(unit.key("anchor_first")), m.get(unit.key("anchor_reread"))
        if first and second:
            process = PROCESS_CV.get(device, 0.0)
            cis = [min(c, CI_CAP) for c in (m.get("anchor_first_ci95"), m.get("anchor_reread_ci95")) if c == c and c]
            allowed = Z95 * math.sqrt(2 * process**2 + sum(_sd(c) ** 2 for c in cis))
            apart = abs(math.log(second / first))
            if apart > allowed:
                return (
                    f"the baseline's two reads were {math.exp(apart) - 1:.0%} apart, more than the "
                    f"{math.exp(allowed) - 1:.0%} two fresh processes of one config allow"
                )
        if base.metrics.get("anchor_reread_disturbed"):
            return "the baseline's second read was measured under load from outside, twice"
    loaded = next((r for r in records if r.info.get("disturbed")), None)
    if loaded is not None:
        return f"trial #{loaded.number} was measured under load from outside ({loaded.info['disturbed']})"
    return None


class Raw:
    """The judge of a search without reads: each trial's own figure and window CI."""

    @staticmethod
    def refresh() -> None:
        pass

    @staticmethod
    def value(t) -> float:
        return t.values[0]

    @staticmethod
    def ci(t) -> float:
        return t.user_attrs.get("ci", 0.0)

    @staticmethod
    def now_scale(now: float) -> tuple[float, float]:
        return 1.0, 0.0
