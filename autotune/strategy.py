"""What to try next: the search strategy, on an Optuna study, without Ray.

The same `Strategy` drives a real search (through Ray Tune, `autotune.search`)
and the replays of recorded landscapes (`scripts/bench_search.py`), so the
benchmark measures the code users run. Its state is the study and nothing else
(every decision is recomputed from the study's trials), so a resumed search
continues where it stopped.

Samplers:
- `autotune` (default): the baseline, then knowledge first: local moves from the
  incumbent (the best config so far, moved only by a gain above
  `min_improvement`), one knob at a time, in an order set by the baseline's
  diagnosed bottleneck (input-bound: loader workers and pinning first;
  overhead-bound: batch size and compile; compute-bound: precision and
  channels_last), as a performance engineer does by hand; when no move around
  the incumbent is left, TPE (multivariate, constant liar) explores, and any new
  incumbent it finds is explored around again.
- `tpe`, `random`: Optuna's samplers, after the baseline.
- `grid`: every point, the baseline first.

All of them: a config already measured (or running) is not run again (its known
value is told to the sampler instead: a "virtual" trial); a batch size at or
above one that ran out of memory with the same device-side knobs is not run
(predicted OOM: the memory ladder); failed, OOM and unsafe (loss parity failed)
trials are FAIL for the sampler.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from autotune.knobs import KNOBS

SAMPLERS = ("autotune", "tpe", "random", "grid")
# knobs that only change the host side: they never change device memory
HOST_KNOBS = tuple(n for n, k in KNOBS.items() if k.host_only)
# knobs whose values are ordered (a ladder: try the next value up, then down)
LADDERS = tuple(n for n, k in KNOBS.items() if k.ladder)
# local moves, by the bottleneck the baseline's diagnosis found (PLAYBOOK.md)
FIRST = {
    "input": ("num_workers", "pin_memory", "batch_size"),
    "overhead": ("batch_size", "compile", "set_to_none", "num_workers"),
    "compute": ("precision", "channels_last", "cudnn_benchmark", "compile"),
    "memory": ("precision", "compile", "channels_last"),
}
# the first move after the baseline: every change the diagnosis recommends, at
# once (a ladder goes to its upper-middle value, near CPUs/GPU for workers)
KNOWLEDGE = {
    "input": {"num_workers": "ladder", "pin_memory": True},
    "overhead": {"batch_size": "ladder"},
    "compute": {"precision": ("bf16-mixed", "16-mixed", "tf32"), "channels_last": True},
    "memory": {"precision": ("bf16-mixed", "16-mixed")},
}
DEFAULT_ORDER = tuple(KNOBS)  # the registry's order: the cheapest big levers first
MAX_REDRAWS = 16  # sampler draws per ask before falling back to an unmeasured point


@dataclass
class Proposal:
    trial: optuna.trial.Trial
    params: dict[str, Any]  # the searched knobs
    source: str  # baseline | plan | sampler | grid | fallback


def key(params: dict[str, Any], names) -> tuple:
    return tuple(params[n] for n in names)


class Strategy:
    def __init__(self, study: optuna.Study, search: dict[str, list], baseline: dict[str, Any], sampler: str = "autotune",
                 min_improvement: float = 0.02, seed: int = 0):
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler {sampler!r}; allowed: {', '.join(SAMPLERS)}")
        self.study, self.search, self.kind = study, search, sampler
        self.names = list(search)
        self.baseline = {k: baseline[k] for k in self.names}
        self.min_improvement, self.seed = min_improvement, seed
        self.rng = random.Random(seed)

    @staticmethod
    def make_sampler(kind: str, seed: int) -> optuna.samplers.BaseSampler:
        if kind in ("tpe", "autotune"):
            # multivariate: knobs interact (workers x batch); constant liar: running
            # trials count as bad guesses, so parallel trials spread out
            return optuna.samplers.TPESampler(seed=seed, multivariate=kind == "autotune", constant_liar=True)
        return optuna.samplers.RandomSampler(seed=seed)

    # --- what the study says ---------------------------------------------------

    def _trials(self):
        return self.study.get_trials(deepcopy=False)

    def taken(self) -> set[tuple]:
        """Configs measured, running, or queued: never proposed again."""
        return {key(t.params, self.names) for t in self._trials() if self._counts(t) and t.state != TrialState.WAITING}

    def _counts(self, t) -> bool:
        """A trial of this space that ran, runs, or was told (not one cut short by an interruption)."""
        return len(t.params) == len(self.names) and not t.user_attrs.get("interrupted")

    def oom_bounds(self) -> dict[tuple, int]:
        """Device-side knobs (all but batch size and the host knobs) -> the
        smallest batch size that ran out of memory with them."""
        bounds: dict[tuple, int] = {}
        if "batch_size" not in self.search:
            return bounds
        for t in self._trials():
            if t.user_attrs.get("status") == "oom" and not t.user_attrs.get("virtual"):
                k = self._memory_key(t.params)
                bounds[k] = min(bounds.get(k, t.params["batch_size"]), t.params["batch_size"])
        return bounds

    def _memory_key(self, params) -> tuple:
        return tuple(params[n] for n in self.names if n not in HOST_KNOBS and n != "batch_size")

    def predicted_oom(self, params, bounds=None) -> int | None:
        bounds = self.oom_bounds() if bounds is None else bounds
        bound = bounds.get(self._memory_key(params)) if "batch_size" in params else None
        return bound if bound is not None and params["batch_size"] >= bound else None

    def best_value(self) -> float | None:
        done = [t.values[0] for t in self._trials() if t.state == TrialState.COMPLETE and t.values]
        return max(done) if done else None

    def bottleneck(self) -> str | None:
        return self.study.user_attrs.get("bottleneck")

    # --- proposals ---------------------------------------------------------------

    def plan_order(self) -> list[str]:
        first = FIRST.get(self.bottleneck() or "", ())
        order = [n for n in first if n in self.search]
        order += [n for n in DEFAULT_ORDER if n in self.search and n not in order]
        return order + [n for n in self.search if n not in order]  # user knobs last

    def knowledge_move(self, center: dict) -> dict:
        """The baseline with every change its diagnosis recommends (KNOWLEDGE)."""
        point = dict(center)
        for name, want in KNOWLEDGE.get(self.bottleneck() or "", {}).items():
            options = self.search.get(name)
            if not options:
                continue
            if want == "ladder":
                higher = [o for o in options if o > center[name]]
                if higher:
                    point[name] = higher[(len(higher) - 1) // 2]
            elif isinstance(want, tuple):
                point[name] = next((o for o in want if o in options), center[name])
            elif want in options:
                point[name] = want
        return point

    def plan(self, free, infeasible) -> dict | None:
        """The next point of the hand-tuning procedure, replayed over what the
        study already knows. First the knowledge move (all the diagnosis's
        recommendations at once); then knob by knob in plan order, from the
        incumbent (the knobs the knowledge move set wait for the second pass). A
        ladder (workers, batch size) climbs while each step up gains more than
        min_improvement (an OOM ends the climb), and steps down only when the
        first step up gained nothing; any other knob tries each of its values and
        keeps the best. A second pass follows a pass that changed something.
        None when the procedure is done, or waits on a running trial."""
        values: dict[tuple, float | None] = {}
        for t in self._trials():
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and self._counts(t):
                values.setdefault(key(t.params, self.names), t.values[0] if t.state == TrialState.COMPLETE else None)

        class Need(Exception):
            pass

        def value(point):
            k = key(point, self.names)
            if k in values:
                return values[k]
            if not free(point):  # predicted OOM or over the budget: a failure; running: wait
                if infeasible(point):
                    return None
                raise Need(None)
            raise Need(point)

        try:
            center = self.baseline
            best = value(center)
            if best is None:
                return None  # the baseline failed: nothing to climb from
            skip: set[str] = set()
            move = self.knowledge_move(center)
            if move != center:
                v = value(move)
                if v is not None and v > best * (1 + self.min_improvement):
                    skip = {n for n in self.names if move[n] != center[n]}
                    center, best = move, v
            for sweep in range(2):
                moved = False
                for name in self.plan_order():
                    if sweep == 0 and name in skip:
                        continue
                    options = self.search[name]
                    i = options.index(center[name])
                    if name in LADDERS:
                        for direction in (1, -1):
                            j, climbed = i + direction, False
                            while 0 <= j < len(options):
                                point = {**center, name: options[j]}
                                v = value(point)
                                if v is None or v <= best * (1 + self.min_improvement):
                                    break
                                center, best, climbed, moved = point, v, True, True
                                j += direction
                            if climbed or direction == -1 or i + 1 >= len(options):
                                break
                    else:
                        scored = [(value({**center, name: o}), o) for o in options if o != center[name]]
                        top = max(((v, o) for v, o in scored if v is not None), default=None, key=lambda x: x[0])
                        if top and top[0] > best * (1 + self.min_improvement):
                            center, best, moved = {**center, name: top[1]}, top[0], True
                if not moved and not (sweep == 0 and skip):
                    break
            return None
        except Need as need:
            return need.args[0]

    def _feasibility(self, fits):
        """`free(p)`: p may run now (not measured, running or infeasible);
        `infeasible(p)`: predicted OOM or over the budget; the configs taken; the OOM bounds."""
        taken, bounds = self.taken(), self.oom_bounds()

        def infeasible(p) -> bool:
            return bool(self.predicted_oom(p, bounds)) or not fits(p)

        def free(p) -> bool:
            return key(p, self.names) not in taken and not infeasible(p)

        return free, infeasible, taken, bounds

    def _next_point(self, free, infeasible) -> tuple[dict | None, str]:
        if free(self.baseline):
            return self.baseline, "baseline"
        for t in self._trials():  # cut short by an interruption: run again first
            if t.user_attrs.get("interrupted") and len(t.params) == len(self.names) and free(t.params):
                return dict(t.params), "resume"
        if self.kind == "grid":
            return next(((p, "grid") for p in self.grid() if free(p)), (None, ""))
        if self.kind == "autotune":
            point = self.plan(free, infeasible)
            if point is not None:
                return point, "plan"
        return None, "sampler"

    def grid(self):
        return (dict(zip(self.names, values)) for values in itertools.product(*self.search.values()))

    def ask(self, fits: Callable[[dict], bool] = lambda params: True) -> Proposal | None:
        """The next config to run, as a RUNNING study trial; None when every
        point of the space is measured or known infeasible. `fits(params)`: can
        this config still finish within the time budget (compile trials cost
        the most)."""
        free, infeasible, taken, bounds = self._feasibility(fits)
        point, source = self._next_point(free, infeasible)
        if point is None and source != "sampler":
            return None
        if point is not None:
            return self._enqueue(point, source)
        for _ in range(MAX_REDRAWS):
            trial = self.study.ask()
            params = self._suggest(trial)
            if free(params):
                trial.set_user_attr("source", "sampler")
                return Proposal(trial, params, "sampler")
            # measured, running or infeasible: tell the sampler what is known, draw again
            k = key(params, self.names)
            known = self._known(k)
            trial.set_user_attr("virtual", True)
            if known is not None and known.state == TrialState.COMPLETE:
                trial.set_user_attr("repeat_of", known.number)
                self.study.tell(trial, known.values[0])
            else:
                oom = self.predicted_oom(params, bounds)
                why = ("repeat of a failed or running trial" if known is not None or k in taken
                       else f"predicted OOM: batch_size >= {oom} ran out of memory" if oom
                       else "would not finish within the time budget")
                trial.set_user_attr("status", "skipped")
                trial.set_user_attr("error", why)
                self.study.tell(trial, state=TrialState.FAIL)
        # the sampler keeps repeating itself: take an unmeasured point at random
        left = [p for p in self.grid() if free(p)]
        return self._enqueue(self.rng.choice(left), "fallback") if left else None

    def _enqueue(self, point: dict, source: str) -> Proposal:
        """Run `point` next: an enqueued study trial, asked at once."""
        self.study.enqueue_trial(point, user_attrs={"source": source}, skip_if_exists=False)
        trial = self.study.ask()
        self._suggest(trial)
        return Proposal(trial, point, source)

    def _suggest(self, trial) -> dict:
        return {n: trial.suggest_categorical(n, self.search[n]) for n in self.names}

    def _known(self, k: tuple):
        for t in self._trials():
            if (t.state in (TrialState.COMPLETE, TrialState.FAIL) and not t.user_attrs.get("virtual")
                    and self._counts(t) and key(t.params, self.names) == k):
                return t
        return None

    def tell(self, trial: optuna.trial.Trial, status: str, value: float | None = None, *, safe: bool = True,
             error: str | None = None, bottleneck: str | None = None, attrs: dict | None = None) -> None:
        """A trial finished: ok (with its throughput; unsafe ones count as
        failed), pruned (a partial throughput, below the best), oom, error or
        timeout. The baseline's bottleneck orders the local moves."""
        trial.set_user_attr("status", status if safe else "unsafe")
        for k, v in (attrs or {}).items():
            trial.set_user_attr(k, v)
        if error:
            trial.set_user_attr("error", error[:1000])
        if bottleneck and "bottleneck" not in self.study.user_attrs:
            self.study.set_user_attr("bottleneck", bottleneck)
        if status in ("ok", "pruned") and value is not None and safe:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def prune_below(self, margin: float) -> float | None:
        """A trial whose throughput is clearly below this (the best so far, less
        `margin`) stops its measurement early."""
        best = self.best_value()
        return best * (1 - margin) if best and margin else None

    def real_trials(self) -> list:
        return [t for t in self._trials() if not t.user_attrs.get("virtual")]


def no_improvement_for(values: list[float | None], min_improvement: float = 0.02) -> int:
    """Trials since the best improved by more than `min_improvement` (values in
    the order trials finished; None for failed ones)."""
    best, since = None, 0
    for v in values:
        if v is not None and (best is None or v > best * (1 + min_improvement)):
            best, since = v, 0
        else:
            since += 1
    return since
