"""How a parity verdict is shown (best_config.yaml's flags, the report, the last screen): the numbers behind it,
each at three significant figures (`parity_summary`), and its one line (`describe`), for the built-in workload's
checks (`autotune.safety.parity`) and a user's program's (`autotune.safety.program_parity`)."""

from __future__ import annotations

import math
from typing import Any

from autotune.safety.parity import STEP_METRICS


def _sig(x):
    return float(f"{x:.3g}") if isinstance(x, float) and math.isfinite(x) else x


def parity_summary(parity: dict[str, Any]) -> dict[str, Any]:
    """The numbers behind a parity verdict (best_config.yaml, the report): per
    step, each error at its worst point against the band there; multi-step, each
    deviation against its band."""
    out = {
        k: _sig(parity[k])
        for k in (
            "passed",
            "verdict",
            "reason",
            "steps",
            "tolerance",
            "max_rel_dev",
            "noise_floor",
            "nonfinite",
            "skipped_steps",
        )
        if k in parity
    }
    if parity.get("program") and "multi_step" in parity:  # a program's (safety.program_parity): no per-step part
        out["multi_step"] = {m: {k: _sig(v) for k, v in e.items()} for m, e in parity["multi_step"].items()}
        if "first_step" in parity:
            out["first_step"] = {k: _sig(v) for k, v in parity["first_step"].items()}
    if "per_step" in parity:
        ps = parity["per_step"]
        out["per_step"] = {m: {k: _sig(v) for k, v in ps[m].items()} for m in STEP_METRICS}
        out["per_step"].update(points=ps["points"], rtol=ps["rtol"], roundoff=_sig(ps["roundoff"]), factor=ps["factor"])
        out["multi_step"] = {m: {k: _sig(v) for k, v in e.items()} for m, e in parity["multi_step"].items()}
        out["moved"] = {k: _sig(v) for k, v in parity["moved"].items()}
    if "overfit" in parity:
        out["overfit"] = {
            k: [{a: _sig(b) for a, b in t.items()} for t in v] if k == "tried" else _sig(v)
            for k, v in parity["overfit"].items()
        }
    return out


def describe(parity: dict[str, Any]) -> str:
    """One line: the per-step errors against their bands, the multi-step loss deviation."""
    if "per_step" not in parity:
        loss = (parity.get("multi_step") or {}).get("loss_dev")
        if parity.get("program") and loss:  # safety.program_parity's
            band = f"band {loss['band']:.1%}" if loss["judged"] else "not judged"
            first, said = parity.get("first_step"), ""
            if first:
                said = f"band {first['band']:.1e}" if first["judged"] else "not judged"
                said = f"its first loss deviates {first['value']:.1e} ({said}); "
            return f"{said}the program's loss over {parity['steps']} steps deviates {loss['value']:.1%} ({band})"
        if parity.get("program"):
            return parity["reason"]
        return f"loss parity over {parity['steps']} steps: max deviation {parity['max_rel_dev']:.2%}"
    ps = parity["per_step"]
    errs = ", ".join(f"{m} {ps[m]['max']:.1e} (band {ps[m]['band']:.1e})" for m in STEP_METRICS)
    loss = parity["multi_step"]["loss_dev"]
    band = f"band {loss['band']:.1%}" if loss["judged"] else f"chaotic: noise alone {loss['noise']:.1%}, not judged"
    return f"per-step errors: {errs}; over {parity['steps']} steps: loss deviation {loss['value']:.1%} ({band})"
