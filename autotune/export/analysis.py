"""Everything `autotune report` says of a search, as plain data (`as_dict`: its JSON format, which its text and
markdown formats render, autotune.cli.report): the answer's parts (autotune.export.answer), the baseline and the
best, the per-knob effects (the median rate of each value's trials), the compile trials' first steps, the safety
flags, the trials not exported, hung (and what their hang ruled out), failed, disturbed or run on another device, the rate model's error and the files.

Read from a `records.SearchResult`, as the answer is: a run dir read back reports what the search found."""

from __future__ import annotations

from pathlib import Path

from autotune.trial.result import SAMPLES, TOKENS, Unit


def as_dict(result, importance: dict | None = None) -> dict:
    """Everything the report says, as plain data (the JSON format; the text and
    markdown formats render this)."""
    from autotune.decide import model as M
    from autotune.export.best_config import safety_flags
    from autotune.records.run_dir import pruning_savings
    from autotune.records.trial_record import same_device

    base, best, unit = result.baseline, result.best, result.unit
    measured = [r for r in result.records if r.throughput]
    ok = [r for r in measured if same_device(base, r)]  # comparisons never mix device types
    compared = base is not None and base.throughput and best is not None
    tied = next((r for r in result.records if best and best.tie and r.number == best.tie["faster_trial"]), None)
    return {
        "run_dir": str(result.run_dir),
        "unit": unit.name,  # what the throughputs below count (trial.result.unit_of): tokens, samples
        "device": {"type": result.device.type, "name": result.device.name, "cpus": result.device.cpus},
        "answer": _answer(result),
        "trials": len(result.records),
        "trials_ok": len(ok),
        "wall_s": result.wall_s,
        "stopped_reason": result.stopped_reason,
        "ended": result.ended,
        "pruning": pruning_savings(result.records),
        "compile": _compiled(result, ok),
        "baseline": _trial(base),
        "best": _trial(best),
        "tied": _trial(tied) if tied is not None and best is base else None,  # the faster config the baseline kept
        "tie": best.tie if best else None,
        "speedup_x": result.speedup if compared else None,  # re-measured side by side where it was
        "speedup_unknown": result.speedup_unknown if compared else None,  # why a re-measurement could not say
        # why the pairs, taken again too, still disagreed with the search's reads (autotune.decide.confirm)
        "speedup_unsettled": result.speedup_unsettled if compared else None,
        # the search's own figure of the best: its fresh reads' or its ratio to the reference read near its time
        # (autotune.decide.reference), else the two trials' ratio
        "search_speedup_x": result.search_speedup if compared else None,
        "search_speedup_interval": result.search_interval if compared else None,  # its 95% interval, where it has one
        # whether the best was read again afresh (its figure freed of its selection); None: a search without reads
        # (None too where the reads never started: the host showed no drift, execution.reads)
        "search_speedup_read_again": (result.search_figure or {}).get("confirmed")
        if compared and (result.reads_note or {}).get("on", True)
        else None,
        "reads_note": result.reads_note,  # whether the reads were taken, and why (execution.reads.Reads.note)
        "reads": result.reads_share,  # the reference reads: how many, their seconds, their share of the search
        "confirm": result.confirm,
        "break_even": result.break_even if compared else None,
        "batch": _batch(result),
        "knob_effects": knob_effects(result),
        "importance": importance,
        "safety": safety_flags(best.knobs, base.knobs, best.parity, result.user_knobs) if compared else [],
        "unsafe": [
            {"trial": r.number, unit.metric: r.throughput, "reason": r.parity.get("reason")}
            for r in result.records
            if r.throughput and not r.safe
        ],
        "fixed": result.space.fixed,
        "other_devices": _other_devices(result, measured),
        "failed": [
            {"trial": r.number, "status": r.status, "error_type": r.error_type, "error": r.error}
            for r in result.records
            if r.status not in ("ok", "pruned")
        ],
        "hung": result.hangs,  # what each hang ruled out, and the values not tried for it (autotune.trial.hung)
        "disturbed": [
            {"trial": r.number, "why": r.info["disturbed"]} for r in result.records if r.info.get("disturbed")
        ],
        "rate_model": M.error((r.number, r.metrics.get(unit.key("predicted")), r.measured) for r in result.records),
        "skipped_predicted": result.skipped,
        # what chose each move of the climb: the measurement behind it (a language model's padding, kernel, memory)
        "chosen": [
            {"trial": r.number, "knobs": changed_knobs(r.knobs, result.baseline), "by": r.info["chosen_by"]}
            for r in result.records
            if r.info.get("chosen_by") and result.baseline
        ],
        "replaced": [line.removeprefix("baseline ") for line in result.space.dropped if line.startswith("baseline ")],
        "files": _files(result),
    }


def _answer(result) -> dict:
    """The answer's parts (autotune.export.answer): its verdict, its two lines, its command, what limits the
    trust in it, its unit."""
    from autotune.export import answer as A

    answer = A.of(result)
    return {
        "verdict": answer.verdict,
        "headline": answer.headline(),
        "command": answer.command,
        "trust": list(answer.trust),
        "unit": answer.unit,
    }


def _trial(r) -> dict | None:
    if r is None:
        return None
    return {"trial": r.number, "status": r.status, "knobs": r.knobs, "metrics": r.metrics, "diagnosis": r.diagnosis}


def knob_effects(result) -> dict[str, list[dict]]:
    """For each searched knob, each of its values: how many trials on the baseline's device had it, how many of
    those were pruned, and their median rate (pruned trials count too, at the rate of their shortened window)."""
    from autotune.records.trial_record import same_device

    unit = result.unit
    seen = [r for r in result.records if r.measured and same_device(result.baseline, r)]
    effects = {}
    for knob, values in result.space.search.items():
        effects[knob] = []
        for value in values:
            group = [r for r in seen if r.knobs[knob] == value]
            ys = sorted(r.measured for r in group)
            effects[knob].append(
                {
                    "value": value,
                    "trials": len(ys),
                    "pruned": sum(r.status == "pruned" for r in group),
                    unit.key("median"): ys[len(ys) // 2] if ys else None,
                }
            )
    return effects


def changed_knobs(knobs: dict, baseline) -> dict:
    """The knobs a config changes from the baseline's (a record's)."""
    return {k: v for k, v in knobs.items() if v != baseline.knobs.get(k)}


def _compiled(result, ok: list) -> list[dict]:
    """The compiled trials (`ok`: those on the baseline's device): what their compile took (`compile_s`: torch's
    own account, with the search's shared cache), time to their first step beside the eager baseline's, and
    their rate."""
    base, unit = result.baseline, result.unit
    eager_first = base.metrics.get("first_step_s") if base else None
    return [
        {
            "trial": r.number,
            "compile": r.knobs["compile"],
            "compile_s": r.metrics.get("compile_s"),
            "first_step_s": r.metrics.get("first_step_s"),
            "eager_first_step_s": eager_first,
            unit.metric: r.throughput,
        }
        for r in ok
        if r.knobs["compile"] != "none"
    ]


def _other_devices(result, measured: list) -> list[dict]:
    """The measured trials that ran on another device type than the baseline's (never compared with it)."""
    from autotune.records.trial_record import same_device

    return [
        {
            "trial": r.number,
            "device_name": r.info.get("device_name"),
            "host": r.info.get("host"),
            result.unit.metric: r.throughput,
        }
        for r in measured
        if not same_device(result.baseline, r)
    ]


def _batch(result) -> dict | None:
    """best_config.yaml's advice for a batch-size change (the learning rate, accumulation)."""
    from autotune.export import load

    return load.read(result.best_config_path).get("batch") if result.best_config_path else None


def _files(result) -> dict[str, str]:
    """The run dir's files by label, those that exist (a path relative to where the report runs, as its run dir was
    given), and MLflow's URI where there is one."""
    return {
        label: str(path)
        for label, path in result.paths.items()
        if label != "run_dir" and (bool(path) if label == "mlflow_uri" else Path(path).exists())
    }


def data_unit(d: dict) -> Unit:
    """The unit (trial.result.Unit) a report's data counts in (`as_dict`'s `unit`, its name)."""
    return TOKENS if d["unit"] == TOKENS.name else SAMPLES


def tied_speedup(d: dict) -> float:
    """Where the baseline kept its place in a tie (`tied`), the faster config's speedup: side by side where it was
    re-measured, else its trial's rate over the baseline's."""
    c = d["confirm"] or {}
    if c.get("best_trial") == d["tied"]["trial"] and c.get("speedup_x"):
        return c["speedup_x"]
    metric = data_unit(d).metric
    return d["tied"]["metrics"][metric] / d["baseline"]["metrics"][metric]


def table_flags(d: dict, user_knobs=None) -> list[dict]:
    """The safety rows of the baseline-vs-best table: the best's changes (`safety`), or where the baseline kept its
    place in a tie, the faster config's against it (`user_knobs`: the search's, `SearchResult.user_knobs`)."""
    if not d["tied"]:
        return d["safety"]
    from autotune.export.best_config import safety_flags

    return safety_flags(d["tied"]["knobs"], d["baseline"]["knobs"], user_knobs=user_knobs)
