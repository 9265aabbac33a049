"""What to try next: the search strategy, on an Optuna study, without Ray.

The same `Strategy` drives a real search (`autotune.execution.driver`, and the search
without Ray) and the replays of recorded landscapes (`scripts/bench/bench_search.py`).
Its state is the study alone (every decision is recomputed from its trials), so
a resumed search continues where it stopped.

Samplers:
- `autotune` (default): the baseline, then knowledge first, as a performance
  engineer does by hand: local moves from the incumbent (the best config so far,
  moved only by a gain above `min_improvement`), starting with the moves its own
  diagnosis names (`autotune.decide.playbook.PLAYBOOK`: input-bound: loader workers,
  sized from the measured rates, and pinning; overhead-bound: batch size and
  compile; compute-bound: precision, channels_last, cudnn), every new incumbent
  diagnosed again, because fixing one bottleneck exposes the next. When no move
  around the incumbent gains, TPE (multivariate, constant liar) explores, and
  any new incumbent it finds is explored around again.
- `tpe`, `random`: Optuna's samplers, after the baseline.
- `grid`: every point, the baseline first.

All of them: a config already measured (or running) is not run again (its known
value is told to the sampler instead: a "virtual" trial); a batch size at or
above one that ran out of memory with the same device-side knobs is not run
(predicted OOM: the memory ladder); failed, OOM and unsafe (loss parity failed)
trials are FAIL for the sampler. Where the baseline waits on its loader for
under DATA_WAIT_FLOOR of its window, the loader knobs the spec did not list
itself get one probe (`loader_held`; not for grid, which maps every point).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from autotune.decide import model
from autotune.decide.climb import Climb, key
from autotune.knobs import KNOBS

SAMPLERS = ("autotune", "tpe", "random", "grid")
# knobs that only change the host side: they never change device memory
HOST_KNOBS = tuple(n for n, k in KNOBS.items() if k.host_only)
# knobs of the loader alone (not the batch): what a diagnosis measures apart does not depend on them (diagnose.APART)
LOADER_KNOBS = tuple(n for n, k in KNOBS.items() if k.stage == "loader" and n != "batch_size")
MAX_REDRAWS = 16  # sampler draws per ask before falling back to an unmeasured point
# the baseline waits on data less than this share of its window: the loader is no bottleneck, and its knobs get one
# probe (the profiler plugin's rule, DataLoader time above 5% of the step -> more workers: docs/design.md)
DATA_WAIT_FLOOR = 0.05


@dataclass
class Proposal:
    trial: optuna.trial.Trial
    params: dict[str, Any]  # the searched knobs
    source: str  # baseline | plan | sampler | grid | fallback
    predicted: float | None = None  # in the study's unit, by the rate model (autotune.decide.model), where it can say


MAX_INCUMBENT_CI = 0.5  # an incumbent known worse than +-50% (a window of a few steps) screens and promotes nothing


def told(result, baseline: dict) -> dict:
    """What `Strategy.tell` keeps of a trial's result (`attrs`) beyond its
    value: `unchecked` (its loss parity skipped but needed: the climb does not
    build on it), `tie_kept` (its window tied with a safer incumbent, which
    stayed: `incumbent_bar`), the `rates` the model predicts from and what its diagnosis
    measured `apart` (a diagnosed trial), and `ci`, its throughput's relative
    95% CI (`incumbent_ci`, once it leads)."""
    from autotune.trial.diagnose import APART
    from autotune.safety.parity import needs_parity

    knobs = result.knobs or {}  # an autotune.trial.result.TrialResult
    needed = result.skipped and all(k in knobs and k in baseline for k in KNOBS) and needs_parity(knobs, baseline)
    metrics = result.metrics or {}
    rates = model.rates_of(metrics) if result.diagnosis else None
    apart = {k: metrics[k] for k in APART if k in metrics} if result.diagnosis else None
    ci = metrics.get("step_mean_ci95")  # how well its throughput is known, were it the incumbent
    wait = metrics.get("data_wait_frac")  # the baseline's decides the loader knobs' probes (`loader_held`)
    return {
        **({"unchecked": True} if needed else {}),
        **({"tie_kept": True} if metrics.get("tie_kept") else {}),
        **({"data_wait": wait} if wait is not None else {}),
        **({"rates": rates} if rates else {}),
        **({"apart": apart} if apart else {}),
        **({"ci": min(ci, MAX_INCUMBENT_CI)} if ci is not None and ci == ci else {}),
    }


class Strategy:
    def __init__(
        self,
        study: optuna.Study,
        search: dict[str, list],
        baseline: dict[str, Any],
        sampler: str = "autotune",
        *,
        min_improvement: float = 0.02,
        seed: int = 0,
        cuda: bool | None = None,
        listed=(),
    ):
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler {sampler!r}; allowed: {', '.join(SAMPLERS)}")
        self.study, self.search, self.kind = study, search, sampler
        self.names = list(search)
        self.baseline = {k: baseline[k] for k in self.names}
        self.min_improvement, self.seed = min_improvement, seed
        self.rng = random.Random(seed)
        # the device decides which playbook moves apply; pinning and cuDNN are searched on CUDA only
        self.cuda = cuda if cuda is not None else bool({"pin_memory", "cudnn_benchmark"} & set(self.names))
        # the loader knobs searched though the spec did not list them (a preset's): `loader_held`
        self.loader = [n for n in LOADER_KNOBS if n in self.names and n not in set(listed)]
        # the rate model orders the climb's moves, and skips what it predicts clearly below
        self.climb = Climb(search, self.baseline, min_improvement, self.cuda, self.diagnosis_of, self.fastest_first)

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

    @staticmethod
    def _contends(t) -> bool:
        """Complete and measured, and not a window that tied with a safer incumbent
        (`tie_kept`): what can lead, as `TrialRecord.contends` says of a record."""
        return t.state == TrialState.COMPLETE and bool(t.values) and not t.user_attrs.get("tie_kept")

    def _best(self):
        """The fastest trial that can lead (`_contends`) so far: the incumbent, or None."""
        done = [t for t in self._trials() if self._contends(t)]
        return max(done, key=lambda t: t.values[0]) if done else None

    def best_value(self) -> float | None:
        best = self._best()
        return best.values[0] if best else None

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

    def plan(self, free, infeasible) -> dict | None:
        """The climb's next point (`autotune.decide.climb.Climb.plan`) over what the
        study knows: each measured config's value (None: failed, unsafe, or its
        loss parity unknown: the search does not build on it)."""
        values: dict[tuple, float | None] = {}
        for t in self._trials():
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and self._counts(t):
                good = self._contends(t) and not t.user_attrs.get("unchecked")
                values.setdefault(key(t.params, self.names), t.values[0] if good else None)
        bounds = self.oom_bounds()
        return self.climb.plan(values, free, infeasible, lambda p: bool(self.predicted_oom(p, bounds)))

    def loader_held(self) -> set[tuple] | None:
        """The loader settings (of `self.loader`, the loader knobs the spec did
        not list) left to run, or None: all. Where the baseline waited on data
        under DATA_WAIT_FLOOR of its window, once one trial has probed other
        loader settings, only those measured (or running) so far: the search
        builds on the probe where it gained, and spends no more trials on a
        loader that is not the bottleneck."""
        if not self.loader or self.kind == "grid":
            return None
        real = [t for t in self.real_trials() if self._counts(t)]
        base = next((t for t in real if key(t.params, self.names) == key(self.baseline, self.names)), None)
        wait = base.user_attrs.get("data_wait") if base else None
        seen = {key(t.params, self.loader) for t in real}
        return seen if wait is not None and wait < DATA_WAIT_FLOOR and len(seen) > 1 else None

    def _feasibility(self, fits):
        """`free(p)`: p may run now (not measured, running or infeasible);
        `infeasible(p)`: predicted OOM, over the budget, or a loader setting
        past its probe (`loader_held`); the configs taken; the OOM bounds."""
        taken, bounds, held = self.taken(), self.oom_bounds(), self.loader_held()

        def infeasible(p) -> bool:
            return (
                bool(self.predicted_oom(p, bounds))
                or not fits(p)
                or (held is not None and key(p, self.loader) not in held)
            )

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
        while point is not None and source == "plan" and self._skip_predicted(point):
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
                held = self.loader_held()
                why = (
                    "repeat of a failed or running trial"
                    if known is not None or k in taken
                    else f"predicted OOM: batch_size >= {oom} ran out of memory"
                    if oom
                    else f"the loader had its probe: the baseline waits on data under {DATA_WAIT_FLOOR:.0%}"
                    if held is not None and key(params, self.loader) not in held
                    else "cannot run: knobs in conflict, or over the time budget"
                )
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
        predicted = self.predicted(point)
        return Proposal(trial, point, source, predicted and predicted["samples_per_s"])

    def predicted(self, point: dict) -> dict | None:
        """The rate model's throughput for `point`, from the measured trials: the diagnosed ones' rates (`tell`'s
        `rates`), the others' throughput; on a CPU the loader workers share the compute's cores."""
        measured = [
            (t.params, t.user_attrs.get("rates") or {"samples_per_s": t.values[0]})
            for t in self.real_trials()
            if t.user_attrs.get("rates") or (t.state == TrialState.COMPLETE and t.values)
        ]
        return model.predict(point, measured, shared=not self.cuda) if measured else None

    def fastest_first(self, points: list[dict], above: float) -> dict:
        """Of the climb's next moves (in its order), the one the rate model
        predicts fastest, where that beats `above` (the incumbent and
        min_improvement); else the climb's first (the model cannot say, or
        predicts no gain: the playbook's order stands)."""
        guesses = [(g["samples_per_s"], -i) for i, p in enumerate(points) if (g := self.predicted(p))]
        top = max(guesses, default=None)
        return points[-top[1]] if top and top[0] > above else points[0]

    def _skip_predicted(self, point: dict) -> bool:
        """A point the model predicts clearly below the best so far is not run:
        a virtual FAIL trial, `skipped: predicted`, with the prediction."""
        best, guess = self.best_value(), self.predicted(point)
        if not best or guess is None or guess["samples_per_s"] >= best * model.SKIP_BELOW:
            return False
        self.study.enqueue_trial(
            point,
            user_attrs={
                "source": "plan",
                "virtual": True,
                "status": "skipped",
                "predicted": guess["samples_per_s"],
                "error": f"skipped: predicted {guess['samples_per_s']:.1f} "
                f"{self.study.user_attrs.get('unit', 'samples')}/s, below {model.SKIP_BELOW:.0%} of the best "
                f"({best:.1f})",
            },
            skip_if_exists=False,
        )
        trial = self.study.ask()
        self._suggest(trial)
        self.study.tell(trial, state=TrialState.FAIL)
        return True

    def skipped_predicted(self) -> list[dict]:
        """The configs the rate model kept from running (`_skip_predicted`): {"config", "predicted", "error"}."""
        return [
            {"config": t.params, "predicted": t.user_attrs["predicted"], "error": t.user_attrs["error"]}
            for t in self._trials()
            if t.user_attrs.get("virtual") and "predicted" in t.user_attrs
        ]

    def _suggest(self, trial) -> dict:
        return {n: trial.suggest_categorical(n, self.search[n]) for n in self.names}

    def _known(self, k: tuple):
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
        bottleneck: str | None = None,
        diagnosis: dict | None = None,
        attrs: dict | None = None,
        unit: str | None = None,
    ) -> None:
        """A trial finished: ok (with its throughput; unsafe ones count as
        failed), pruned (a partial throughput, below the best), oom, error or
        timeout. Its diagnosis (bottleneck and moves; or a `bottleneck` alone)
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
        if diagnosis or bottleneck:
            diagnosis = {
                k: v for k, v in (diagnosis or {"bottleneck": bottleneck}).items() if k in ("bottleneck", "moves")
            }
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

    def incumbent_bar(self, point: dict | None = None) -> dict:
        """What a trial must beat to become the incumbent, as its config takes it:
        `incumbent_above`, in the study's unit (the best so far and min_improvement; at or
        below it a trial pays for its window alone), `incumbent_ci`, how well
        the best is known (its throughput's relative 95% CI, 0 where its trial
        recorded none), and `incumbent_trial`, its number (a tie kept names it).
        None and 0 before any best, and then `anchor` (the trial that becomes
        the first incumbent whatever it measures: its window is sized as a
        promoted one's, `TrialSettings.config`); with `point`, `carry`: what the trial
        need not measure again to be diagnosed (`carried`), and `tie_keeps_incumbent`:
        `point` changes the numerics from the incumbent's and is riskier than it
        (`records.risk`: a higher safety class, or more changed knobs above the
        safe class), so a window that ties with it, reading inside the
        incumbent's interval above the bar (autotune.trial's `_not_incumbent`),
        leaves the incumbent as it is: `records.pick_best`
        exports the safer side of a tie, and adopting it would pay a loss-parity
        check and a diagnosis that nothing uses (on jpeg_pipeline 22-24 s, in 2 of
        3 searches). A tie in loader knobs alone is still adopted: it pays little
        (the diagnosis `carried`, the parity verdict reused) and the climb goes on."""
        from autotune.safety.parity import PARITY_KNOBS
        from autotune.records.run_dir import risk

        best = self._best()
        riskier = (
            best is not None
            and point is not None
            and any(point[k] != best.params[k] for k in PARITY_KNOBS if k in point)
            and risk(point, self.baseline) > risk(best.params, self.baseline)
        )
        return {
            "incumbent_above": best.values[0] * (1 + self.min_improvement) if best else None,
            "incumbent_ci": best.user_attrs.get("ci", 0.0) if best else 0.0,
            **({"incumbent_trial": best.number} if best else {}),
            **({"anchor": True} if best is None else {}),
            **({"carry": self.carried(point)} if point is not None else {}),
            **({"tie_keeps_incumbent": True} if riskier else {}),
        }

    def carried(self, point: dict) -> dict | None:
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

    def real_trials(self) -> list:
        return [t for t in self._trials() if not t.user_attrs.get("virtual")]
