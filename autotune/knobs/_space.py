"""The search space on one device: which values of each knob apply, what is fixed
and why, which combinations cannot run together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.knobs._registry import KNOBS, LANGUAGE_MODEL, Device, conflicts, registry

NOT_SEARCHED = "not in the search space"
# the micro-batches a program's own optimizer step accumulates (its TrainingArguments' gradient_accumulation_steps),
# as its probe reads them beside its knobs' own values: not a knob, the baseline's effective batch's other factor
ACCUMULATION = "grad_accumulation_steps"


@dataclass
class Space:
    """The search space on one device: what is sampled, what is fixed and why."""

    baseline: dict[str, Any]
    search: dict[str, list]  # knobs with two or more applicable values
    fixed: dict[str, str]  # knob -> why it is not sampled (it stays at the baseline value)
    dropped: list[str]  # "knob=value: why" for values that cannot apply here
    user: dict[str, dict] = field(default_factory=dict)  # user knobs: name -> {safety, stage}
    accumulation: int = 1  # the baseline's micro-batches a step: its effective batch is batch_size x this

    def nothing_to_search(self) -> str:
        """Why nothing is searched: each fixed knob's reason, the knobs merely
        left out of the search space in one group."""
        left_out = [k for k, why in self.fixed.items() if why == NOT_SEARCHED]
        parts = [f"{k} ({why})" for k, why in self.fixed.items() if why != NOT_SEARCHED]
        parts += ["not in the search space: " + ", ".join(left_out)] if left_out else []
        return "search_space: nothing to search on this device; every knob is fixed: " + "; ".join(parts)

    def conflicts(self, params: dict[str, Any]) -> list[str]:
        """Why the searched `params`, with the fixed knobs at the baseline, cannot run together."""
        return conflicts({**self.baseline, **params}, registry(self.user))


def resolve_space(
    lists: dict[str, list],
    baseline: dict[str, Any],
    device: Device,
    allowed_classes: set[str] | None = None,
    *,
    keep_effective_batch: bool = False,
    user: dict[str, dict] | None = None,
    accumulation: int = 1,
) -> Space:
    """Keep the values that apply on `device`; the baseline's value is always in
    the space, so the baseline is a point of the search and ratios compare like
    with like. A baseline value that cannot apply falls back to PyTorch's.
    `allowed_classes`: the safety classes the search may change (safety.level);
    `keep_effective_batch`: batch sizes must divide the baseline's effective batch
    (its batch x its `accumulation`: the rest is made up by gradient accumulation,
    so a micro-batch may grow as the accumulation shrinks: 4 x 2 and 8 x 1 for a
    baseline of 2 x 4), which keeps the optimization unchanged.
    `user`: user knobs (name -> {safety, stage}); their lists are under `args.NAME`
    and their baseline values under the same names. Values that conflict with the
    baseline's other knobs stay in the space (another point may allow them); the
    strategy never proposes a conflicting combination."""
    base, search, fixed, dropped = {}, {}, {}, []
    table = registry(user)
    for name, knob in table.items():
        value = baseline.get(name, knob.pytorch_default)
        why = knob.unavailable(value, device)
        if why:
            dropped.append(f"baseline {name}={value!r}: {why}; using {knob.pytorch_default!r}")
            value = knob.pytorch_default
        base[name] = value
        if name not in lists:
            fixed[name] = NOT_SEARCHED
            continue
        # with accumulation the optimization batch is kept, but BatchNorm and rounding
        # see the micro-batch: a numerics-level change rather than a dynamics one
        safety = "numerics" if name == "batch_size" and keep_effective_batch else knob.safety
        if allowed_classes is not None and safety not in allowed_classes:
            fixed[name] = f"a {knob.safety} knob; safety.level allows only {', '.join(sorted(allowed_classes))} knobs"
            continue
        values = []
        for v in lists[name]:
            why = knob.unavailable(v, device)
            effective = value * accumulation if name == "batch_size" and value else None
            if not why and effective and keep_effective_batch and (v > effective or effective % v):
                of = f"{value} x {accumulation} accumulated" if accumulation > 1 else f"{value}"
                why = f"keep_effective_batch: a micro-batch must divide the baseline's effective batch {of}"
            if why:
                dropped.append(f"{name}={v!r}: {why}")
            elif v not in values:
                values.append(v)
        if value not in values:
            values.insert(0, value)
        if len(values) > 1:
            search[name] = values
        else:
            fixed[name] = _why_one_value(name, dropped, first=True)
    for name in list(search):  # constraints between knobs (prefetch_factor needs workers)
        knob, keep = table[name], []
        for v in search[name]:
            why = knob.requires(v, {**base, name: v})
            # runs where some other searched value allows it (e.g. more workers)
            if why is None or any(
                knob.requires(v, {**base, other: ov, name: v}) is None
                for other in search
                if other != name
                for ov in search[other]
            ):
                keep.append(v)
                if why:
                    dropped.append(f"{name}={v!r} at the baseline: {why}; run only with values that allow it")
            else:
                dropped.append(f"{name}={v!r}: {why}")
        if len(keep) > 1:
            search[name] = keep
        else:
            del search[name]
            fixed[name] = _why_one_value(name, dropped, first=False)
    return Space(base, search, fixed, dropped, dict(user or {}), accumulation if keep_effective_batch else 1)


def asked(lists: dict[str, list], device: Device) -> str | None:
    """Why a language model's knob (`LANGUAGE_MODEL`) cannot run a value a spec asks for by name (`lists`: its
    search_space.knobs, not a preset's) on `device` or with this install, in one line naming what is allowed
    (None: each runs). A preset's such value is dropped with its reason, since a preset lists every kernel for
    every device; one asked for is a mistake to say before anything runs."""
    for name in (n for n in LANGUAGE_MODEL if n in lists):
        knob = KNOBS[name]
        for value in lists[name]:
            why = knob.unavailable(value, device)
            if why:
                runs = [v for v in knob.choices or (False, True) if not knob.unavailable(v, device)]
                shown = ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in runs)
                return (
                    f"search_space.knobs.{name}: {str(value).lower() if isinstance(value, bool) else value} cannot "
                    f"run here: {why}; here it runs {shown}: ask for those, or leave {name} out (the lm preset "
                    "tries what runs)"
                )
    return None


def _why_one_value(name: str, dropped: list[str], first: bool) -> str:
    """Why a knob is left with one value: a reason its other values were dropped."""
    reasons = [d.split(": ", 1)[1] for d in dropped if d.startswith(f"{name}=")]
    return (reasons[0] if first else reasons[-1]) if reasons else "one value in the search space"
