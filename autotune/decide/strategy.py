"""What to try next: the search strategy, on an Optuna study, without Ray.

The same `Strategy` drives a real search (`autotune.execution.driver`, on either backend) and the replays of
recorded landscapes (`scripts/bench/bench_search.py`). Its state is the study alone (every decision is recomputed
from its trials), so a resumed search continues where it stopped.

The sampler is chosen by name from `autotune.decide.samplers.SAMPLERS` (the climb, TPE, random, grid) and asked
through the study. What every sampler shares is here, each a part of its own:
- the baseline first, and a trial cut short by an interruption again (`_first`);
- what may run now (`autotune.decide.limits.Limits`: a config measured or running is not run again; the memory
  ladder, a batch size at or above one that ran out of memory with the same device-side knobs is predicted OOM;
  the loader probe, where the baseline waits on its loader for under DATA_WAIT_FLOOR of its window, the loader
  knobs the spec did not list itself get one probe, not for an exhaustive sampler; the time budget);
- what a hang rules out (autotune.trial.hung: loader workers after a worker never returned a batch, a parallel
  setting after a rank stopped): never run, and a trial measured with it before leads nothing;
- the virtual trials: a drawn config that cannot run is told to the sampler (its known value, or FAIL with why:
  `tell_virtual`), and drawn again; failed, OOM, hung, cut and unsafe (loss parity failed) trials are FAIL for
  the sampler;
- the rate model's skip: a planned point predicted clearly below the best is not run (`skip_predicted`);
- the incumbent's bar a trial must beat (`autotune.decide.bar`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from autotune.decide import model
from autotune.decide.budget import trial_cost
from autotune.decide.climb import EAGER_FIRST
from autotune.decide.bar import Incumbent, incumbent_bar
from autotune.decide.limits import (
    LOADER_KNOBS,
    Limits,
    MemoryLadder,
    counts,
    graph_of,
    hung_trials,
    key,
    loader_held,
    ruled_out,
    taken,
)
from autotune.decide.naming import space
from autotune.decide.reference import ANCHOR_KEY, Raw, anchor_reads
from autotune.decide.samplers import kind
from autotune.knobs import KNOBS, UserKnobs
from autotune.records.best import beyond_noise
from autotune.safety.parity import needs_parity
from autotune.trial.diagnose import APART

MAX_REDRAWS = 16  # sampler draws per ask before falling back to an unmeasured point


@dataclass(frozen=True)
class Facts:
    """What the strategy knows of a search beyond its space's lists: the device's kind, and what the plan says of
    the knobs (the ones its spec listed, its user knobs)."""

    cuda: bool | None = None
    """the device is CUDA: which playbook moves apply (None: guessed from the space, as pinning and cuDNN are
    searched on CUDA only)"""
    listed: tuple[str, ...] = ()
    """the knobs the spec listed itself: a loader knob searched though it did not list it (a preset's) gets one
    probe (`limits.loader_held`), not for a sampler that maps every point"""
    user_knobs: UserKnobs = field(default_factory=UserKnobs)
    """the search's user knobs (`autotune.plan.SearchPlan.user_knobs`): their playbook moves, their risk"""


@dataclass
class Proposal:
    trial: optuna.trial.Trial
    params: dict[str, Any]  # the searched knobs
    source: str  # baseline | plan | sampler | grid | fallback
    predicted: float | None = None  # in the study's unit, by the rate model (autotune.decide.model), where it can say
    chosen_by: str | None = None  # the measurement that chose a move of the climb (its playbook move's `by`)


MAX_INCUMBENT_CI = 0.5  # an incumbent known worse than +-50% (a window of a few steps) screens and promotes nothing


def trial_attrs(result, baseline: dict) -> dict:
    """What `Strategy.tell` keeps of a trial's result (`attrs`) beyond its
    value: `unchecked` (its loss parity skipped but needed: the climb does not
    build on it), `tie_kept` (its window tied with a safer incumbent, which
    stayed: `incumbent_bar`), the `rates` the model predicts from and what its diagnosis
    measured `apart` (a diagnosed trial), `ci`, its throughput's relative
    95% CI (`incumbent_ci`, once it leads), and `window_unix`, when its window ran
    (the reference it is judged against is read there: `reference.Judge`); a hung trial's `hung` (its hang's kind:
    what it rules out, autotune.trial.hung); the baseline's `anchor`, its two reads (`reference.anchor_reads`)."""
    knobs = result.knobs or {}  # an autotune.trial.result.TrialResult
    needed = result.skipped and all(k in knobs and k in baseline for k in KNOBS) and needs_parity(knobs, baseline)
    metrics = result.metrics or {}
    rates = model.rates_of(metrics) if result.diagnosis else None
    apart = {k: metrics[k] for k in APART if k in metrics} if result.diagnosis else None
    ci = metrics.get("step_mean_ci95")  # how well its throughput is known, were it the incumbent
    # what it cost (the rate model's price of the next trials, `Strategy.cost`): its wall less a parity reference
    wall = (result.trial_wall_s or 0.0) - (metrics.get("parity_reference_s") or 0.0)
    wait = metrics.get("data_wait_frac")  # the baseline's decides the loader knobs' probes (`loader_held`)
    at = metrics.get("window_mid_unix")  # when it was read: its ratio is to the reference then (decide.reference)
    anchor = anchor_reads(metrics)  # the baseline's two reads: the spread between processes they show
    return {
        **({ANCHOR_KEY: anchor} if anchor else {}),
        **({"hung": result.hung} if result.hung else {}),  # what its hang rules out (`limits.hung_trials`)
        **({"window_unix": at} if at else {}),
        **({"unchecked": True} if needed else {}),
        **({"tie_kept": True} if metrics.get("tie_kept") else {}),
        **({"data_wait": wait} if wait is not None else {}),
        **({"rates": rates} if rates else {}),
        **({"apart": apart} if apart else {}),
        **({"ci": min(ci, MAX_INCUMBENT_CI)} if ci is not None and ci == ci else {}),
        **({"wall_s": wall} if wall > 0 else {}),
        **({"compile_s": metrics["compile_s"]} if metrics.get("compile_s") else {}),
    }


class Strategy:
    """The search's decisions on `study`: installs the sampler `sampler` names (`SAMPLERS`) on it, and asks it
    for configs (`ask`) within what may run now; `tell` keeps what each trial measured in the study. `facts`: what
    it knows of the search beyond the space (`Facts`)."""

    def __init__(
        self,
        study: optuna.Study,
        search: dict[str, list],
        baseline: dict[str, Any],
        sampler: str = "autotune",
        *,
        min_improvement: float = 0.02,
        seed: int = 0,
        judge=None,
        facts: Facts | None = None,
    ):
        row, facts = kind(sampler), facts or Facts()
        self.study, self.search = study, search
        self.names = list(search)
        self.baseline = {k: baseline[k] for k in self.names}
        self.min_improvement, self.seed = min_improvement, seed
        self.rng = random.Random(seed)
        self.cuda = facts.cuda if facts.cuda is not None else bool({"pin_memory", "cudnn_benchmark"} & set(self.names))
        self.user_knobs = facts.user_knobs
        listed = set(facts.listed)
        self.loader = [] if row.exhaustive else [n for n in LOADER_KNOBS if n in self.names and n not in listed]
        self.combines_helped = row.combines_helped  # a drawn combination of knobs that did not help alone: skipped
        self.eager_first = row.eager_first  # a draw compiled on a new graph: its eager twin first (`eager_twin`)
        self.limits = self._limits(lambda params: True)  # what may run now: made again before each ask
        self.sources: dict[int, str] = {}  # trial number -> what named its config (`named`); else the sampler drew it
        study.sampler = self.sampler = row.make(self, seed)
        # how a measured trial is judged: its figure and CI (`reference.Judge`: against the baseline read near its
        # window's time, an incumbent by its fresh reads too; `reference.Raw`: its own window). The one place the
        # strategy reads a trial's value: the incumbent, the climb's values, the bar and pruning go through it
        self.judge = judge or Raw()

    # --- what the study says ---------------------------------------------------

    def _trials(self):
        return self.study.get_trials(deepcopy=False)

    def real_trials(self) -> list:
        return [t for t in self._trials() if not t.user_attrs.get("virtual")]

    def _counts(self, t) -> bool:
        return counts(t, self.names)

    def predicted_oom(self, params) -> int | None:
        """The batch size that ran out of memory at or below `params`' (the memory ladder), or None."""
        return MemoryLadder(self._trials(), self.names).predicted_oom(params)

    def _limits(self, fits: Callable[[dict], bool]) -> Limits:
        trials = self._trials()
        held = loader_held(self.real_trials(), self.names, self.loader, self.baseline)
        ladder, hung = MemoryLadder(trials, self.names), hung_trials(trials, self.baseline)
        return Limits(self.names, self.loader, taken(trials, self.names), ladder, held, fits, hung)

    def _contends(self, t) -> bool:
        """Complete and measured, not a window that tied with a safer incumbent (`tie_kept`), and not a config a
        hang has ruled out since (autotune.trial.hung): what can lead, as `records.best.pick_best` says of a
        record."""
        complete = t.state == TrialState.COMPLETE and bool(t.values) and not t.user_attrs.get("tie_kept")
        return complete and ruled_out(self.limits.hung, t.params) is None

    def _best(self):
        """The fastest trial that can lead (`_contends`) so far, as judged (`judge`): the incumbent, or None."""
        done = [t for t in self._trials() if self._contends(t)]
        return max(done, key=self.judge.value) if done else None

    def best_value(self) -> float | None:
        best = self._best()
        return self.judge.value(best) if best else None

    def measured(self) -> dict[tuple, float | None]:
        """Each measured config's key -> its value (None: failed, unsafe, or its loss parity unknown: the search
        does not build on it): what the climb plans over."""
        values: dict[tuple, float | None] = {}
        for t in self._trials():
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and self._counts(t):
                good = self._contends(t) and not t.user_attrs.get("unchecked")
                values.setdefault(key(t.params, self.names), self.judge.value(t) if good else None)
        return values

    def bottleneck(self) -> str | None:
        """The baseline's diagnosed bottleneck."""
        return (self.diagnosis_of(self.baseline) or {}).get("bottleneck")

    def diagnosis_of(self, point: dict) -> dict | None:
        """The diagnosis of the trial that measured `point` (bottleneck and
        moves; stored with the trial by `tell`); for the baseline of a study
        from before per-trial diagnoses, its stored bottleneck."""
        k = key(point, self.names)
        for t in self._trials():
            if (
                t.user_attrs.get("diagnosis")
                and not t.user_attrs.get("virtual")
                and self._counts(t)
                and key(t.params, self.names) == k
            ):
                return t.user_attrs["diagnosis"]
        if point == self.baseline and self.study.user_attrs.get("bottleneck"):
            return {"bottleneck": self.study.user_attrs["bottleneck"]}
        return None

    # --- proposals ---------------------------------------------------------------

    def _first(self) -> tuple[dict | None, str]:
        """What runs before any sampler's choice: the baseline, then a trial cut short by an interruption."""
        if self.limits.free(self.baseline):
            return self.baseline, "baseline"
        for t in self._trials():
            if t.user_attrs.get("interrupted") and len(t.params) == len(self.names) and self.limits.free(t.params):
                return dict(t.params), "resume"
        return None, ""

    def ask(self, fits: Callable[[dict], bool] = lambda params: True) -> Proposal | None:
        """The next config to run, as a RUNNING study trial; None when every
        point of the space is measured or known infeasible. `fits(params)`: can
        this config still finish within the time budget (compile trials cost
        the most). The sampler is asked through the study; a config it names
        that the rate model predicts clearly below the best is skipped
        (`skip_predicted`), one that cannot run is told as a virtual trial
        (`tell_virtual`) and drawn again, MAX_REDRAWS times at most before an
        unmeasured point is taken at random."""
        self.limits = self._limits(fits)
        redraws = 0
        while True:
            point, source = self._first()
            if point is not None:
                return self._enqueue(point, source)
            if not any(self.limits.free(p) for p in space(self.search)):
                return None
            if redraws >= MAX_REDRAWS:  # the sampler keeps repeating itself: an unmeasured point at random
                left = [p for p in space(self.search) if self.limits.free(p) and not self.unproven(p)]
                if not left:
                    return None
                pick = self.rng.choice(left)
                twin = self.eager_twin(pick)
                return self._enqueue(twin or pick, "fallback", twin and EAGER_FIRST)
            trial = self.study.ask()
            params = self._suggest(trial)
            source = self.sources.pop(trial.number, "sampler")
            trial.set_user_attr("source", source)
            if source == "plan" and skip_predicted(self, trial, params):
                self.limits = self._limits(fits)  # the climb plans again over what the skip added
                continue
            if source == "sampler" and self.limits.free(params) and skip_combination(self, trial, params):
                redraws += 1
                continue
            twin = self.eager_twin(params) if source == "sampler" and self.limits.free(params) else None
            if twin is not None:
                tell_skipped(self, trial, f"{EAGER_FIRST}: its eager twin ran in its place")
                return self._enqueue(twin, "sampler", EAGER_FIRST)
            if self.limits.free(params):
                return self._proposal(trial, params, source)
            tell_virtual(self, trial, params)
            redraws += 1

    def _proposal(self, trial, params: dict, source: str) -> Proposal:
        """A named or drawn config as the next proposal: the rate model's prediction (not for a sampler's draw,
        unless a combination ran on it) and what chose it (a climb's move: the measurement its move came from)."""
        by = trial.user_attrs.get("chosen_by")
        if source == "plan":
            by = self.sampler.why(params) if hasattr(self.sampler, "why") else None
        predicted = self.predicted(params) if source != "sampler" or by else None
        if by:
            trial.set_user_attr("chosen_by", by)
        return Proposal(trial, params, source, predicted and predicted["samples_per_s"], by)

    def unproven(self, point: dict) -> list[str]:
        """The changes of `point` from the baseline that did not help alone (`helped`), where it combines two or
        more such with others ([]: a single move on knobs that helped, or the rule is not this sampler's)."""
        if not self.combines_helped:
            return []
        helped = self.helped()
        changes = [(n, point[n]) for n in self.names if point[n] != self.baseline[n]]
        unproven = [f"{n}={v}" for n, v in changes if (n, v) not in helped]
        return unproven if len(unproven) > 1 else []

    def _enqueue(self, point: dict, source: str, by: str | None = None) -> Proposal:
        """Run `point` next: an enqueued study trial, asked at once (`by`: what chose it, where it says)."""
        attrs = {"source": source, **({"chosen_by": by} if by else {})}
        self.study.enqueue_trial(point, user_attrs=attrs, skip_if_exists=False)
        trial = self.study.ask()
        self._suggest(trial)
        predicted = self.predicted(point)
        return Proposal(trial, point, source, predicted and predicted["samples_per_s"], by)

    def eager_twin(self, point: dict) -> dict | None:
        """What runs first in place of a drawn `point` (the explorer's, `Kind.eager_first`): its eager twin
        (compile off), where `point` is compiled on a graph no trial of this search compiled (`graph_of`: a new
        compile, where the twin costs none and says what the other knobs do) and the twin may run now (never
        measured). None: `point` runs as drawn."""
        if not self.eager_first or point.get("compile", "none") == "none":
            return None
        graph, ran = graph_of(point), (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        compiled = [
            t.params for t in self.real_trials() if t.state in ran and t.params.get("compile", "none") != "none"
        ]
        if any(graph_of(p) == graph for p in compiled):
            return None  # the search's compile cache has its graph
        twin = {**point, "compile": "none"}
        return twin if self.limits.free(twin) else None

    def predicted(self, point: dict) -> dict | None:
        """The rate model's throughput for `point`, from the measured trials: the diagnosed ones' rates (`tell`'s
        `rates`), the others' throughput; on a CPU the loader workers share the compute's cores."""
        measured = [
            (t.params, t.user_attrs.get("rates") or {"samples_per_s": t.values[0]})
            for t in self.real_trials()
            if t.user_attrs.get("rates") or (t.state == TrialState.COMPLETE and t.values)
        ]
        return model.predict(point, measured, shared=not self.cuda) if measured else None

    def fastest_first(self, points: list[dict], above: float, priors: dict | None = None) -> dict:
        """Of the climb's next moves (in its order), the one with the largest predicted gain per second of its
        trial, where it beats `above` (the incumbent and min_improvement): the gain the rate model predicts, else
        the one its move's measurement bounds (`priors`: a point's key -> its playbook move, whose `gain` is that
        bound: a language model's padding, kernel, memory), over the trial's predicted seconds (`cost`: a compile
        priced at what the search's cache makes it). Else the climb's first (nothing predicts a gain: the
        playbook's order stands)."""
        best = above / (1 + self.min_improvement)
        rated = []
        for i, p in enumerate(points):
            guess, prior = self.predicted(p), (priors or {}).get(key(p, self.names)) or {}
            value = guess["samples_per_s"] if guess else best * prior["gain"] if prior.get("gain") else None
            if value is not None and value > above:
                rated.append(((value / best - 1) / (self.cost(p) or 1.0), -i))
        top = max(rated, default=None)
        return points[-top[1]] if top else points[0]

    def cost(self, point: dict) -> float | None:
        """Seconds a trial of `point` will take (autotune.decide.budget.trial_cost: the trials so far, a compile
        at what the search's shared cache makes it); None before any trial finished."""
        spent = [
            ({**self.baseline, **t.params}, t.user_attrs["wall_s"], t.user_attrs.get("compile_s"))
            for t in self.real_trials()
            if t.user_attrs.get("wall_s")
        ]
        return trial_cost({**self.baseline, **point}, spent)

    def helped(self) -> set[tuple[str, Any]]:
        """The knob values that helped alone: measured against a config that differs in that knob alone (at
        the value it moved from), faster by more than min_improvement (a gain, as the climb counts one)."""
        return {(n, v) for n, v, gain in self._alone() if gain > 1 + self.min_improvement}

    def counted(self) -> set[str]:
        """The knobs whose change from the baseline's value made a difference beyond the noise
        (autotune.records.best.beyond_noise: the two windows' 95% intervals apart), measured against a config
        that differs in that knob alone, at the baseline's value: an exported knob counts (`pick_best`); the
        incumbent is tried without one that does not (the climb)."""
        return {n for n, _, gain in self._alone(baseline_side=True) if gain is None}

    def _alone(self, baseline_side: bool = False) -> list[tuple[str, Any, float | None]]:
        """(knob, value, gain) for each pair of measured configs that differ in one knob: its gain over the config
        it moved from; with `baseline_side`, pairs whose other side has the baseline's value, and a gain of None
        where the two differ beyond the noise."""
        done = [t for t in self.real_trials() if self._contends(t) and self._counts(t)]
        out = []
        for a in done:
            for b in done:
                diff = [n for n in self.names if a.params[n] != b.params[n]]
                if len(diff) != 1 or (baseline_side and a.params[diff[0]] != self.baseline[diff[0]]):
                    continue
                va, vb = self.judge.value(a), self.judge.value(b)
                if baseline_side:
                    apart = beyond_noise(va, a.user_attrs.get("ci") or 0.0, vb, b.user_attrs.get("ci") or 0.0)
                    out.append((diff[0], b.params[diff[0]], None if apart and vb > va else vb / va))
                else:
                    out.append((diff[0], b.params[diff[0]], vb / va))
        return out

    def skipped_predicted(self) -> list[dict]:
        """The configs the rate model kept from running (`skip_predicted`), and the combinations of knobs that did
        not each help alone (`skip_combination`): {"config", "predicted", "error"}."""
        return [
            {"config": t.params, "predicted": t.user_attrs["predicted"], "error": t.user_attrs["error"]}
            for t in self._trials()
            if t.user_attrs.get("virtual") and "predicted" in t.user_attrs
        ]

    def skipped_combination(self, point: dict) -> int | None:
        """The trial that skipped `point` as a combination of knobs that did not each help alone, or None."""
        k = key(point, self.names)
        for t in self._trials():
            if str(t.user_attrs.get("error", "")).startswith("skipped: combines") and key(t.params, self.names) == k:
                return t.number
        return None

    def named(self, number: int, source: str) -> None:
        """Trial `number`'s config was named by the sampler (`naming.Naming`): `source` is what named it."""
        self.sources[number] = source

    def _suggest(self, trial) -> dict:
        return {n: trial.suggest_categorical(n, self.search[n]) for n in self.names}

    def known(self, k: tuple):
        """The trial that ran the config of key `k` and finished, or None."""
        for t in self._trials():
            if (
                t.state in (TrialState.COMPLETE, TrialState.FAIL)
                and not t.user_attrs.get("virtual")
                and self._counts(t)
                and key(t.params, self.names) == k
            ):
                return t
        return None

    def tell(
        self,
        trial: optuna.trial.Trial,
        status: str,
        value: float | None = None,
        *,
        safe: bool = True,
        error: str | None = None,
        diagnosis: dict | None = None,
        attrs: dict | None = None,
        unit: str | None = None,
    ) -> None:
        """A trial finished: ok (with its throughput; unsafe ones count as
        failed), pruned (a partial throughput, below the best), oom, error,
        timeout, hung (no step in time; what its hang rules out: `attrs`' `hung`) or cut (the budget's end). Its
        diagnosis (bottleneck and moves; or {"bottleneck": ...} alone)
        is kept with the trial: the local moves from it, when it becomes the
        incumbent, start with what it says. `unit`: what `value` counts
        (trial.result.unit_of: tokens, samples); the first one told is the
        study's, and a value in another is no throughput of this search (an
        error naming both: a program that reported tokens in some steps only)."""
        known = self.study.user_attrs.get("unit")
        if unit and value is not None and known and unit != known:
            value, status = None, "error"
            error = f"its throughput is counted in {unit}, the search's in {known}; report the same at every step"
        elif unit and value is not None and not known:
            self.study.set_user_attr("unit", unit)
        trial.set_user_attr("status", status if safe else "unsafe")
        for k, v in (attrs or {}).items():
            trial.set_user_attr(k, v)
        if error:
            trial.set_user_attr("error", error[:1000])
        if diagnosis:
            diagnosis = {k: v for k, v in diagnosis.items() if k in ("bottleneck", "moves")}
            trial.set_user_attr("diagnosis", diagnosis)
            if (
                key(trial.params, self.names) == key(self.baseline, self.names)
                and "bottleneck" not in self.study.user_attrs
            ):
                self.study.set_user_attr("bottleneck", diagnosis["bottleneck"])
        if status in ("ok", "pruned") and value is not None and safe:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def incumbent(self) -> Incumbent | None:
        """The incumbent as the bar reads it (`bar.Incumbent`: its value and CI as judged), or None before any."""
        best = self._best()
        return Incumbent(best.number, best.params, self.judge.value(best), self.judge.ci(best)) if best else None

    def incumbent_bar(self, point: dict | None = None) -> dict:
        """What a trial of `point` must beat to become the incumbent (`bar.incumbent_bar`), with, for `point`,
        what it need not measure again to be diagnosed (`carry_for`)."""
        carry = self.carry_for(point) if point is not None else None
        return incumbent_bar(
            self.incumbent(),
            point,
            baseline=self.baseline,
            min_improvement=self.min_improvement,
            carry=carry,
            user_knobs=self.user_knobs,
        )

    def carry_for(self, point: dict) -> dict | None:
        """{"trial": N, "metrics": what trial N's diagnosis measured apart from its
        window} for a diagnosed trial whose config differs from `point` in loader
        knobs alone (`LOADER_KNOBS`): none of those numbers depends on them
        (`diagnose.APART`), so `point`'s trial, should it become the incumbent, is
        diagnosed from them and its own window. None where no such trial ran."""
        for t in self.real_trials():
            apart = t.user_attrs.get("apart")
            if apart and self._counts(t) and all(t.params[n] == point[n] for n in self.names if n not in LOADER_KNOBS):
                return {"trial": t.number, "metrics": apart}
        return None

    def prune_below(self, margin: float) -> float | None:
        """A trial whose throughput is clearly below this (the best so far, less
        `margin`) stops its measurement early."""
        best = self.best_value()
        return best * (1 - margin) if best and margin else None


def skip_predicted(strategy: Strategy, trial: optuna.trial.Trial, point: dict) -> bool:
    """The rate model's skip: a point the climb named (`trial`, asked with it) that the model predicts clearly
    below the best so far (under model.SKIP_BELOW of it) is not run: the trial is told FAIL, virtual, `skipped:
    predicted`, with the prediction. False (nothing told) where the model cannot say or predicts no such loss."""
    best, guess = strategy.best_value(), strategy.predicted(point)
    if not best or guess is None or guess["samples_per_s"] >= best * model.SKIP_BELOW:
        return False
    unit = strategy.study.user_attrs.get("unit", "samples")
    error = f"skipped: predicted {guess['samples_per_s']:.1f} {unit}/s, below {model.SKIP_BELOW:.0%} of the best"
    tell_skipped(strategy, trial, f"{error} ({best:.1f})", predicted=guess["samples_per_s"])
    return True


def skip_combination(strategy: Strategy, trial: optuna.trial.Trial, point: dict) -> bool:
    """A drawn combination of knobs that did not each help alone (`Strategy.unproven`) is not run, unless the rate
    model predicts it beats the best by min_improvement (then it runs, and says so: `chosen_by`). Skipped: told
    FAIL, virtual, `skipped: combines ...`, with the model's prediction where it had one. False: it runs."""
    unproven = strategy.unproven(point)
    if not unproven:
        return False
    best, guess = strategy.best_value(), strategy.predicted(point)
    unit = strategy.study.user_attrs.get("unit", "samples")
    if best and guess and guess["samples_per_s"] > best * (1 + strategy.min_improvement):
        trial.set_user_attr(
            "chosen_by",
            f"the rate model: {guess['samples_per_s']:.1f} {unit}/s predicted, though "
            f"{', '.join(unproven)} did not each help alone",
        )
        return False
    earlier = strategy.skipped_combination(point)
    if earlier is not None:  # drawn again: told as a repeat of that skip, not a second skip
        tell_skipped(strategy, trial, f"repeat of skipped trial {earlier}")
        return True
    error = f"skipped: combines {', '.join(unproven)}, which did not each help alone"
    error += f" (the rate model predicts {guess['samples_per_s']:.1f} {unit}/s: no gain)" if guess else ""
    tell_skipped(strategy, trial, error, predicted=guess and guess["samples_per_s"])
    return True


def tell_skipped(strategy: Strategy, trial: optuna.trial.Trial, error: str, **attrs) -> None:
    """`trial` not run: told FAIL (TPE's model leaves a failed trial out), virtual, status `skipped`, `error` why
    (and `attrs`, e.g. the rate model's prediction)."""
    for name, value in {"virtual": True, "status": "skipped", **attrs, "error": error}.items():
        trial.set_user_attr(name, value)
    strategy.study.tell(trial, state=TrialState.FAIL)


def tell_virtual(strategy: Strategy, trial: optuna.trial.Trial, params: dict) -> None:
    """A drawn config that does not run (measured, running or infeasible), told to the sampler as a virtual
    trial: a measured one's value again (`repeat_of`), else FAIL with why (`Limits.why_not`)."""
    known = strategy.known(key(params, strategy.names))
    trial.set_user_attr("virtual", True)
    if known is not None and known.state == TrialState.COMPLETE:
        trial.set_user_attr("repeat_of", known.number)
        strategy.study.tell(trial, known.values[0])
        return
    tell_skipped(strategy, trial, strategy.limits.why_not(params, known))
