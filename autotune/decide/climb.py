"""The climb: what a performance engineer does by hand, as an Optuna sampler (`Climb`, the `autotune` row of
`autotune.decide.samplers.SAMPLERS`). From the baseline, local moves from the incumbent (the best config so far,
moved only by a gain above `min_improvement`), starting with the moves its own diagnosis names
(`autotune.decide.playbook.PLAYBOOK`); every new incumbent is moved from in turn. Where no move is left (a local
optimum, or the next move still running), its explorer (TPE) draws, and a better point found that way is climbed
from in turn. It reads what the search knows through `autotune.decide.naming.Known` (the strategy).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import optuna
from optuna.samplers import BaseSampler

from autotune.decide.limits import graph_of, key
from autotune.decide.naming import Known, Naming
from autotune.decide.playbook import STEP_COST_KNOBS, playbook_moves, user_moves
from autotune.knobs import KNOBS, ladder_key

# knobs whose values are ordered (a ladder: try the next value up, then down)
LADDERS = tuple(n for n, k in KNOBS.items() if k.ladder)
# the knobs in the order the bottleneck usually moves through them (input ->
# overhead -> compute -> memory, the playbook's): the registry's order, the order of
# the moves no diagnosis asked for. A knob of the space not listed (a user knob) is
# tried after these.
DEFAULT_ORDER = tuple(KNOBS)
# what chose a compiled config's eager twin in its place: the climb's (`Climb._eager_first`), the explorer's
# (`autotune.decide.strategy.Strategy.eager_twin`)
EAGER_FIRST = "eager first (compiled, it is a new graph)"


@dataclass
class _Path:
    """What the climb did so far: per knob, the step it last moved at, and the
    values it moved away from."""

    moved: dict = field(default_factory=dict)
    left: dict = field(default_factory=dict)
    steps: int = 0

    def record(self, before: dict, after: dict) -> None:
        self.steps += 1
        for n in after:
            if after[n] != before[n]:
                self.moved[n] = self.steps
                self.left.setdefault(n, set()).add(before[n])


class Climb(Naming):
    """The climb's sampler: names the next point of the hand-tuning procedure (`plan`) for a trial, else its
    `explore` sampler draws. It plans once under each `Known.limits` (what may run now, which the strategy sets
    before each ask): a climb with no point there leaves the trial, and any drawn again before the limits change
    (a draw that was a repeat, told as a virtual trial), to the explorer."""

    source = "plan"

    def __init__(self, known: Known, explore: BaseSampler):
        super().__init__(known, explore)
        self.search, self.names, self.baseline = known.search, list(known.search), known.baseline
        self.min_improvement, self.cuda, self.user_knobs = known.min_improvement, known.cuda, known.user_knobs
        self._planned = None  # the limits the climb last planned under
        self.priors: dict[tuple, dict] = {}  # a point's key -> the playbook move that named it (its `by`, `gain`)

    def name(self, study: optuna.Study) -> dict | None:
        limits = self.known.limits
        if limits is self._planned:
            return None
        self._planned = limits
        return self.plan(
            self.known.measured(), limits.free, limits.infeasible, lambda p: bool(limits.ladder.predicted_oom(p))
        )

    def _is_ladder(self, name: str) -> bool:
        """Ordered values (workers, batch size, threads, any integer knob): step up or down."""
        return name in LADDERS or all(isinstance(v, int) and not isinstance(v, bool) for v in self.search[name])

    def _rungs(self, name: str) -> list:
        """A ladder's values in order (None, torch's default, where the registry places it)."""
        return sorted(self.search[name], key=ladder_key(name))

    def _step(self, center: dict, name: str, direction: int) -> dict | None:
        rungs = self._rungs(name)
        i = rungs.index(center[name]) + direction
        return {**center, name: rungs[i]} if 0 <= i < len(rungs) else None

    def _targets(self, center: dict, move: dict) -> list[dict]:
        """The points a diagnosis move names, from `center`, best guess first:
        the next rung of a ladder ("up"/"down"); the smallest rung at or above a
        sized target (workers from the two measured rates), else the top one;
        one point per listed value. A move `with` other knobs (a capacity move:
        the batch a rung up) names each point with those moved too, then alone."""
        points = self._alone(center, move)
        if move.get("with"):
            joint = []
            for point in points:
                for other, to in move["with"].items():
                    moved = self._alone(point, {"knob": other, "to": to})
                    point = moved[0] if moved else None
                    if point is None:
                        break
                if point is not None:
                    joint.append(point)
            return joint + points
        return points

    def _alone(self, center: dict, move: dict) -> list[dict]:
        name, to = move.get("knob"), move.get("to")
        if name not in self.search:
            return []
        options = self.search[name]
        if to in ("up", "down"):
            point = self._step(center, name, 1 if to == "up" else -1) if self._is_ladder(name) else None
            return [point] if point else []
        if isinstance(to, int) and not isinstance(to, bool) and self._is_ladder(name):
            rungs, rank = self._rungs(name), ladder_key(name)
            pick = next((r for r in rungs if rank(r) >= to), rungs[-1])
            return [{**center, name: pick}] if pick != center[name] else []
        if to == "other":  # a user knob: each of its other values
            return [{**center, name: v} for v in options if v != center[name]]
        wanted = to if isinstance(to, list) else [to]
        return [{**center, name: v} for v in wanted if v in options and v != center[name]]

    def why(self, point: dict) -> str | None:
        """The measurement that chose `point` (its playbook move's `by`; a diagnosis's bottleneck), or None."""
        return (self.priors.get(key(point, self.names)) or {}).get("by")

    def candidates(
        self,
        center: dict,
        came_from: dict | None,
        path: "_Path | None" = None,
        capped=None,
        evidence=None,
        values: dict | None = None,
    ) -> list[dict]:
        """The local moves from an incumbent, in the order they are tried:
        1. what its own diagnosis says (each move alone; all of them at once only where each of their knobs
           helped alone, `evidence`'s `helped`: a combination is built from knobs that each helped);
           where the batch a rung up ran out of memory (`capped(point)`: it, or a
           smaller batch with the same device-side knobs, did), the capacity moves
           too: each knob that frees memory with that batch, then alone (a
           program's trials have no diagnosis: the OOM is what says so);
        2. after a change in step cost (precision, layout, compile): the batch
           ladder again, since a cheaper step brings overhead back; then, for each knob
           the incumbent changes whose change made no difference beyond the noise
           (not in `evidence`'s `counted`), the incumbent without it: what the export
           falls back to (`autotune.records.best.pick_best`) must be measured;
        3. every other neighbour (a rung up, another value), knobs never moved
           on the climb first, in DEFAULT_ORDER (then any other knob of the
           space), then the knobs moved longest ago: each knob gets its turn
           before one is moved again, unless a diagnosis asks for it (step 1);
        4. last: a rung down, and the values the climb moved away from
           (`path.left`; undoing the move that led here among them).
        From a compiled center, every move but the knobs dropped for the export goes by its eager twin's
        (`_eager_first`, from what is measured: `values`): its own diagnosis names what the twin's named (padding,
        the loader), and the twin answered it without a compile. From an eager one, a compile move leaves out the
        center's knobs that did not count (`_lean`)."""
        path = path or _Path()
        helped, counted = evidence or (set(), set())
        changed = [n for n in self.names if came_from is not None and came_from[n] != center[n]]
        out = self._diagnosed(center, helped)
        up = self._step(center, "batch_size", 1) if "batch_size" in self.search else None
        if up is not None and capped is not None and capped(up):
            out += [
                p
                for mv in playbook_moves("capacity", center, self.cuda, user_knobs=self.user_knobs)
                for p in self._targets(center, mv)
            ]
        if "batch_size" in self.search and any(n in STEP_COST_KNOBS for n in changed):
            out.append(self._step(center, "batch_size", 1))
        out = self._eager_first(center, out, values, counted)
        out += [
            {**center, n: self.baseline[n]} for n in self.names if center[n] != self.baseline[n] and n not in counted
        ]
        more, last = self._neighbours(center, came_from, changed, path)
        out += self._eager_first(center, more, values, counted)
        seen, ordered = {key(center, self.names)}, []
        for p in out + self._eager_first(center, last, values, counted):
            p = p and self._lean(center, p, counted)
            if p is not None and key(p, self.names) not in seen:
                seen.add(key(p, self.names))
                ordered.append(p)
        return ordered

    def _diagnosed(self, center: dict, helped: set) -> list[dict]:
        """Step 1 of `candidates`: the moves `center`'s own diagnosis names, each alone, after all of them at
        once where each of their knobs helped alone (`helped`); each point's playbook move noted (`priors`)."""
        diagnosis = self.known.diagnosis_of(center)
        if diagnosis is None:
            return []
        moves = diagnosis.get("moves")
        if moves is None:  # a bottleneck alone (a replay, an old study): the playbook's moves
            moves = playbook_moves(diagnosis.get("bottleneck"), center, self.cuda, user_knobs=self.user_knobs)
        else:  # the trial knows no user knobs: the driver adds those declared for this bottleneck
            moves = moves + user_moves(diagnosis.get("bottleneck"), self.user_knobs)
        by = f"{diagnosis['bottleneck']}-bound" if diagnosis.get("bottleneck") else None
        targets = []
        for mv in moves:
            points = self._targets(center, mv)
            for p in points:  # what named it, and what it may gain (Strategy.fastest_first)
                self.priors.setdefault(key(p, self.names), {"by": mv.get("by") or by, "gain": mv.get("gain")})
            if points:
                targets.append(points)
        joint = {n: t[0][n] for t in targets for n in self.names if t[0][n] != center[n]}
        together = [{**center, **joint}] if len(targets) > 1 and all((n, v) in helped for n, v in joint.items()) else []
        return together + [p for t in targets for p in t]

    def _neighbours(self, center: dict, came_from: dict | None, changed: list[str], path: _Path):
        """Steps 3 and 4 of `candidates`: (every other neighbour, knobs never moved first, then those moved
        longest ago; a rung down and the values the climb moved away from)."""
        order = [n for n in DEFAULT_ORDER if n in self.search] + [n for n in self.names if n not in DEFAULT_ORDER]
        order.sort(key=lambda n: path.moved.get(n, -1))  # stable: DEFAULT_ORDER among equals
        more: list[dict | None] = []
        last: list[dict | None] = []
        for name in order:
            if self._is_ladder(name):
                more.append(self._step(center, name, 1))
                last.append(self._step(center, name, -1))
            else:
                for v in self.search[name]:
                    undo = v in path.left.get(name, ()) or (name in changed and v == came_from[name])
                    if v != center[name]:
                        (last if undo else more).append({**center, name: v})
        return more, last

    def _lean(self, center: dict, point: dict, counted: set) -> dict:
        """A compile move from an eager center (compile turned on) without the center's knobs that made no
        difference beyond the noise (not `counted`): the export leaves those out (`autotune.records.best`), and
        compiled with them the search would compile the graph it exports a second time, to measure it."""
        if center.get("compile", "none") != "none" or point.get("compile", "none") == "none":
            return point
        idle = {n: self.baseline[n] for n in self.names if center[n] != self.baseline[n] and n not in counted}
        return {**point, **{n: v for n, v in idle.items() if point[n] == center[n] and n != "compile"}}

    def _eager_first(
        self, center: dict, points: list[dict | None], values: dict | None, counted: set
    ) -> list[dict | None]:
        """From a compiled center, each move as the same move from its eager twin (the center with compile off)
        answers it, where the twin was measured: measured there, the move is tried compiled only where it gained
        above min_improvement and each knob it changes counted (a difference beyond the noise, `counted`: the
        export keeps no other); not measured, a move that changes the graph runs eager first (compiled, it pays a
        new graph's compile: every knob but the loader's changes the graph, `graph_of`), one that keeps it runs
        compiled (the search's cache has its graph). Another compile mode is as it was."""
        mode = center.get("compile", "none")
        twin = values.get(key({**center, "compile": "none"}, self.names)) if values and mode != "none" else None
        if twin is None:
            return points
        out = []
        for p in points:
            if p is None or p["compile"] != mode:
                out.append(p)
                continue
            eager = {**p, "compile": "none"}
            k = key(eager, self.names)
            if k in values:
                moved = [n for n in self.names if p[n] != center[n]]
                if values[k] is not None and values[k] > twin * (1 + self.min_improvement) and set(moved) <= counted:
                    out.append(p)
            elif graph_of(p) == graph_of(center):
                out.append(p)
            else:
                self.priors.setdefault(k, {"by": EAGER_FIRST, "gain": None})
                out.append(eager)
        return out

    def plan(self, values: dict[tuple, float | None], free, infeasible, capped=None) -> dict | None:
        """The next point of the hand-tuning procedure, replayed over what is
        known (`values`: each measured config's key -> its value, None for a
        failed or unsafe one): from the baseline, try the incumbent's local
        moves (`candidates`: its own diagnosis first); the first that gains more
        than min_improvement is the new incumbent, which is diagnosed again and
        moved from in turn, so a ladder re-opens whenever its bottleneck comes
        back. None when no move gains (a local optimum: the sampler explores
        from there), when the next point waits on a running trial, or before the
        baseline is measured (the strategy runs it first). The incumbent's
        measured moves are weighed first (any that gained moves the climb on),
        then the rate model (`Known.fastest_first`) names which of its
        unmeasured moves runs next. `free(p)`: p may run now; `infeasible(p)`:
        it never will (predicted OOM, over the budget, past the loader's probe); `capped(p)`: p ran out of
        memory, or is predicted to (the capacity moves, `candidates`)."""
        center, came_from, path = self.baseline, None, _Path()
        best = values.get(key(center, self.names))
        if best is None:
            return None  # the baseline failed, runs, or waits to: nothing to climb from yet
        evidence = self.known.helped(), self.known.counted()
        while True:
            ready, waiting = [], False  # the moves not measured yet, and one running
            for point in self.candidates(center, came_from, path, capped, evidence, values):
                k = key(point, self.names)
                if k not in values:
                    if free(point):
                        ready.append(point)
                    waiting = waiting or not infeasible(point) and not free(point)
                    continue
                v = values[k]
                if v is not None and v > best * (1 + self.min_improvement):
                    path.record(center, point)
                    came_from, center, best = center, point, v
                    break
            else:
                if ready:  # any measured move that gained moved the climb on; else the one the rate model names
                    return self.known.fastest_first(ready, best * (1 + self.min_improvement), self.priors)
                if waiting:
                    return None  # wait on the running move
                # a local optimum; a better point found elsewhere (the sampler) is climbed from in turn
                top = max(((v, k) for k, v in values.items() if v is not None), default=None, key=lambda x: x[0])
                if top is None or top[0] <= best * (1 + self.min_improvement):
                    return None
                came_from, center, best = None, dict(zip(self.names, top[1])), top[0]
