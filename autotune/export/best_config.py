"""best_config.yaml, the production contract, written; `autotune.load_config` applies it (autotune.config.Config).

    cfg = autotune.load_config("best_config.yaml")
    workload = make_workload(**cfg.workload_args)     # your searched factory arguments, if any
    loader = DataLoader(dataset, **cfg.dataloader_kwargs())
    model, optimizer = cfg.prepare(model, optimizer)  # threads, backend flags, layout, compile, fused optimizer
    for batch in loader:
        batch = cfg.to_device(batch, preprocess)
        with cfg.autocast():
            loss = ...
        ...
        cfg.zero_grad(optimizer)

Every setting a trial had in effect while it was timed is in best_config.yaml
(the knobs, threads included, and the searched workload arguments), so what was
measured is what production runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from autotune._version import __version__
from autotune import knobs as K
from autotune.export import formats as scale_out
from autotune.decide.checked import status
from autotune.records.run_dir import compiled_artifacts
from autotune.records.verdicts import describe
from autotune.safety.levels import batch_advice


def safety_flags(
    knobs: dict[str, Any],
    baseline: dict[str, Any],
    parity: dict | None = None,
    user_knobs: K.UserKnobs | None = None,
    *,
    kept_batch: int | None = None,
) -> list[dict[str, Any]]:
    """Each knob the best config changes from the baseline, with its safety class (a user knob's as the search's
    `user_knobs` declare it), and the measured loss parity for the knobs that can change numerics. `kept_batch`:
    the effective batch keep_effective_batch held (a batch_size change is then micro-batches, not a new batch)."""
    from autotune.safety.levels import PARITY_KNOBS, parity_summary

    flags, lookup = [], (user_knobs or K.UserKnobs()).lookup
    for name, value in knobs.items():
        if value != baseline.get(name):
            knob = lookup(name)
            flag = {
                "knob": name,
                "baseline": baseline.get(name),
                "tuned": value,
                "safety": knob.safety,
                "note": knob.safety_reason,
            }
            if name == "batch_size" and kept_batch:
                flag["note"] = f"the effective batch stays {kept_batch} ({value} x {kept_batch // value} accumulated)"
            if name == "compile":
                flag["note"] += "; compiled kernels are not bitwise reproducible across runs and versions"
            if parity is not None and (name in PARITY_KNOBS or knob.user and knob.numerics):
                flag["parity"] = parity_summary(parity)
            flags.append(flag)
    return flags


def _program(workload, flags: dict[str, dict], knobs: dict[str, Any]) -> dict[str, Any]:
    """A program's (workload.command) production command: its own, with the best's searched flags (a
    launcher's line as the user gave it, `torchrun ... train.py`, the flags on its script's);
    run it with AUTOTUNE_CONFIG=best_config.yaml for the knobs autotune.config() applies."""
    if not workload.command:
        return {}
    from autotune.trial.request import env_of, with_flags

    args = K.workload_args(knobs)
    return {
        "command": workload.line(with_flags(workload.command, args, flags)),
        "dir": workload.dir,
        **({"env": env_of(args, flags)} if env_of(args, flags) else {}),
    }


def _rates(best, base, unit) -> dict[str, Any]:
    """The baseline's and the best's throughput in the search's unit (trial.result.unit_of); a language model's
    samples/s beside its tokens/s, and the best's MFU where the device's peak is known."""
    out = {unit.key("baseline"): round(base.throughput, 2), unit.key("best"): round(best.throughput, 2)}
    if unit.name != "samples":
        out["unit"] = unit.name
        for role, r in (("baseline", base), ("best", best)):
            if r.metrics.get("samples_per_s") is not None:
                out[f"{role}_samples_per_s"] = round(r.metrics["samples_per_s"], 2)
        if best.metrics.get("mfu") is not None:
            out["best_mfu"] = round(best.metrics["mfu"], 4)
    return out


def production(
    data: dict[str, Any], path: Path, flags: dict[str, dict] | None = None, program: dict | None = None
) -> dict[str, Any]:
    """How a program's best runs in production, from best_config.yaml's content (`data`) at `path`: `command`,
    `autotune run BEST -- <its command>` (autotune.export.answer.command, as the last screen says it), run from
    `dir`, the program's own directory; `adds`, the flags that puts on the program's own command line (its
    searched arguments, written as `flags` says: SearchSpaceSpec.flags; and, for a script whose
    TrainingArguments the knobs reach (`program`: the probe's record, SearchState.program), the changed knobs as
    TrainingArguments flags, as the instrumentation appends them); `applies`, the changed knobs no flag carries,
    which autotune.config() applies in the process."""
    from autotune.export import hf_args
    from autotune.export.answer import command
    from autotune.trial.request import with_flags

    changed = {f["knob"]: f["tuned"] for f in data.get("safety") or []}
    args = K.workload_args(changed)
    knobs = {k: v for k, v in changed.items() if k in K.KNOBS}
    flags = flags or {}
    adds = with_flags([], {n: v for n, v in args.items() if n in flags}, flags)  # an environment one: not a flag
    applies = dict(knobs)
    if "training_arguments" in (program or {}).get("used", ()):
        accum = int((data.get("batch") or {}).get("grad_accumulation_steps") or 1)
        adds += hf_args.flags(hf_args.fields(knobs, (data.get("device") or {}).get("type"), accum))
        applies = {k: v for k, v in knobs.items() if k in hf_args.UNREACHABLE}
    where = Path(data["workload"].get("dir") or ".")
    return {"command": command(path, data, where), "dir": str(where), "adds": adds, "applies": applies}


@dataclass(frozen=True)
class ExportSettings:
    """What best_config.yaml records of the search beside its result (`write_best_config`): its plan's settings
    (`ExportSettings.of(plan)`, an `autotune.plan.SearchPlan`)."""

    workload: Any
    """the plan's workload section (`autotune.spec.WorkloadSpec`: ref, args, a program's command and dir)"""
    name: str | None = None
    """the search's name"""
    flags: dict[str, dict] = field(default_factory=dict)
    """a program's searched flags (`SearchSpaceSpec.flags`)"""
    ranks: int = 1
    """the trials' ranks (what cfg.wrap, torchrun and -f hf need)"""
    blocks: list[str] | None = None
    """the trials' repeated blocks (FSDP, checkpointing)"""
    keep_effective_batch: bool = False
    """the safety setting: the batch advice's gradient accumulation keeps the baseline's effective batch"""

    @classmethod
    def of(cls, plan) -> "ExportSettings":
        """A search plan's (`autotune.plan.SearchPlan`)."""
        return cls(
            workload=plan.workload,
            name=plan.name,
            flags=plan.space.flags(),
            ranks=plan.resources.ranks_per_trial,
            blocks=plan.resources.blocks,
            keep_effective_batch=plan.safety.keep_effective_batch,
        )


def write_best_config(result, path: Path, settings: ExportSettings, *, program: dict | None = None) -> dict[str, Any]:
    """best_config.yaml for `result` (a `SearchResult`), written to `path`, with what `settings` records of the
    search; `program`, a program's probe record (SearchState.program), for its `production` command
    (`production`)."""
    best, base, unit, workload = result.best, result.baseline, result.unit, settings.workload
    data = {
        "autotune": {
            "version": __version__,
            "search": settings.name,
            "run_dir": str(result.run_dir),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "workload": {"ref": workload.ref, "args": workload.args, **_program(workload, settings.flags, best.knobs)},
        "device": {"type": result.device.type, "name": result.device.name, "torch": best.info.get("torch")},
        "knobs": {k: v for k, v in best.knobs.items() if k in K.KNOBS},
        "workload_args": K.workload_args(best.knobs),
        "measured": {
            **_rates(best, base, unit),
            # re-measured side by side where it was (autotune.decide.confirm); None: unknown (`confirmed.unknown`
            # says why) or unsettled (`unsettled` below: both figures, why, and the command that re-measures it)
            "speedup_x": None if result.speedup is None else round(result.speedup, 3),
            "best_trial": best.number,
            "baseline_trial": base.number,
            "trials": len(result.records),
            "trials_ok": sum(1 for r in result.records if r.status == "ok"),
        },
        "safety": safety_flags(
            best.knobs, base.knobs, best.parity, result.user_knobs, kept_batch=_kept_batch(result, settings)
        ),
        "fixed": result.space.fixed,
    }
    if settings.ranks > 1 or settings.blocks:  # what cfg.wrap, torchrun and -f hf need
        data["parallel"] = {"ranks": settings.ranks, "blocks": settings.blocks}
    _add_verdicts(data, result, settings.keep_effective_batch)
    artifacts = compiled_artifacts(result, path.parent)  # what production loads before it compiles
    if artifacts:
        data["compile_artifacts"] = artifacts
    if workload.command:
        data["production"] = production(data, path, settings.flags, program)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return data


def _kept_batch(result, settings: ExportSettings) -> int | None:
    """The baseline's effective batch where keep_effective_batch held it (micro-batch x accumulation)."""
    return result.baseline.knobs["batch_size"] * result.space.accumulation if settings.keep_effective_batch else None


def _add_verdicts(data: dict[str, Any], result, keep_effective_batch: bool) -> None:
    """best_config.yaml's sections past the measured config, each where it applies, in their order: the batch
    advice, the faster configs rejected as unsafe, the search's own figure and the re-measurement, the break-even,
    the tie, the trials that hung (with what each ruled out and the values not tried for it), and the safety
    status."""
    best, base, unit = result.best, result.baseline, result.unit
    effective = base.knobs["batch_size"] * result.space.accumulation  # the baseline's effective batch
    accum = effective // best.knobs["batch_size"] if keep_effective_batch else 1
    advice = batch_advice(
        effective if keep_effective_batch else base.knobs["batch_size"],
        best.knobs["batch_size"],
        best.info.get("optimizer"),
        bool(best.info.get("has_batchnorm")),
        accum,
    )
    if advice:
        data["batch"] = advice
    rejected = [
        {"trial": r.number, unit.metric: round(r.throughput, 2), "reason": r.parity.get("reason")}
        for r in result.records
        if r.throughput and not r.safe and r.throughput > best.throughput
    ]
    if rejected:
        data["rejected_faster_but_unsafe"] = rejected
    figure = result.search_figure
    if figure:  # the search's own figure, with its 95% interval: its fresh reads' against the reference read beside
        # them, or its trial's against the reference at its time (autotune.decide.reference)
        data["measured"]["search_speedup_x"] = round(figure["x"], 3)
        if result.search_interval:
            data["measured"]["search_speedup_interval"] = [round(v, 3) for v in result.search_interval]
        data["measured"]["search_speedup_read_again"] = figure["confirmed"]
    if result.confirm:
        data["measured"]["trials_speedup_x"] = round(best.throughput / base.throughput, 3)
        data["confirmed"] = {**result.confirm, "note": describe(result.confirm)}
    if result.speedup_unsettled:  # no single number: the search's figure (above) and the pairs', and why
        c = result.confirm
        data["measured"]["unsettled"] = {
            "why": c["unsettled"],
            "pairs_speedup_range": [c.get("speedup_low"), c.get("speedup_high")],
            "pairs": c["rounds"],
            "command": f"autotune confirm {result.run_dir}",
        }
    if result.break_even:
        data["break_even"] = result.break_even  # the search's time against the winner's per-step saving
    if not data["workload_args"]:
        del data["workload_args"]
    if best.tie:  # a tie inside the measured uncertainty, won by the safer config (records.pick_best)
        data["tie"] = best.tie
    if result.hangs:  # trials that took no step in time: what each ruled out was not tried, and is not this config
        data["hung"] = [{k: v for k, v in h.items() if k != "kind"} for h in result.hangs]
    data["safety_status"] = status(best, base)  # baseline | safe | parity passed | unchecked
    if data["safety_status"] == "unchecked":  # never exported as safe: the search stopped before its late check
        data["unchecked"] = (
            "loss parity was not run for this config (the search stopped before checking it): "
            "its training numerics are unknown; resume the search to check it before adopting it"
        )


# --- other forms of the same config ----------------------------------------------------


def with_online(data: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """best_config.yaml's content with the loader settings an online run ended with (`autotune export
    --from-online`); each knob it changes is listed in `safety` (loader knobs: no numerics), since
    `autotune.config` applies only the knobs listed there."""
    data = {**data, "knobs": {**(data.get("knobs") or {}), **settings}}
    if isinstance(data.get("safety"), list):
        listed = {f.get("knob") for f in data["safety"] if isinstance(f, dict)}
        data["safety"] = data["safety"] + [
            {"knob": k, "tuned": v, "safety": K.lookup(k).safety, "note": "re-tuned online (autotune.online)"}
            for k, v in settings.items()
            if k not in listed
        ]
    return data


FORMATS = ("yaml", "json", "python", "lightning", "hf", "hf-args", "torchrun")


def render(data: dict[str, Any], fmt: str) -> str:
    """best_config.yaml's content as yaml, json, a runnable plain-PyTorch snippet,
    or the matching Lightning Trainer/DataLoader arguments."""
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False)
    if fmt == "json":
        import json

        return json.dumps(data, indent=2) + "\n"
    if fmt == "python":
        return _python(data)
    if fmt == "lightning":
        return _lightning(data)
    if fmt == "hf":
        return _hf(data)
    if fmt == "hf-args":  # the HfArgumentParser script's flags (autotune.export.hf_args)
        from autotune.export import hf_args

        return hf_args.render(data)
    if fmt == "torchrun":
        return scale_out.torchrun(data)
    raise ValueError(f"unknown format `{fmt}`; formats: {', '.join(FORMATS)}")


def _header(data) -> str:
    m = data.get("measured", {})
    unit = m.get("unit", "samples")  # a language model's search: tokens (`_rates`)
    speedup = f"{m['speedup_x']}x" if m.get("speedup_x") else "unknown x"
    if m.get("unsettled"):  # no single number (`_add_verdicts`): the pairs' range, and the command
        low, high = m["unsettled"]["pairs_speedup_range"]
        pairs = f"{low:.2f}-{high:.2f}x side by side" if low else "no pair side by side"
        speedup = (
            f"speedup unsettled ({m.get('trials_speedup_x')}x in the search, {pairs}; {m['unsettled']['command']})"
        )
    gain = f"{speedup} over the baseline ({m.get(f'baseline_{unit}_per_s')} -> {m.get(f'best_{unit}_per_s')} {unit}/s)"
    if m.get("best_trial") is not None and m.get("best_trial") == m.get("baseline_trial"):  # nothing faster held
        gain = f"the baseline's own settings ({m.get(f'baseline_{unit}_per_s')} {unit}/s): nothing faster held up"
    return f"# autotune: {gain}, measured on {data.get('device', {}).get('name', '?')}\n" + "".join(
        f"# {f['safety']}: {f['knob']} {f['baseline']} -> {f['tuned']}: {f['note']}\n"
        for f in data.get("safety", [])
        if f["safety"] != "safe"
    )


def _python(data) -> str:
    """A plain-PyTorch module for a loop written against the workload contract:
    `loss(model, batch)` on a device batch of tensors, tuples, lists or dicts."""
    k = {**K.pytorch_defaults(None), **data["knobs"]}
    device = data.get("device", {}).get("type", "cpu")
    dtype = {"bf16-mixed": "torch.bfloat16", "16-mixed": "torch.float16"}.get(k["precision"])
    compile_line = (
        ""
        if k["compile"] == "none"
        else f"    model = torch.compile(model{'' if k['compile'] == 'default' else ', mode=' + repr(k['compile'])})\n"
    )
    threads = (
        ""
        if k["num_threads"] is None
        else f"torch.set_num_threads({k['num_threads']})  # intra-op threads, as measured\n"
    )
    tf32 = "torch.backends.cudnn.allow_tf32 = True\n" if k["precision"] == "tf32" else ""
    args = data.get("workload_args")
    args_line = f"WORKLOAD_ARGS = {args!r}  # your factory's searched arguments, as tuned\n" if args else ""
    lm = _how_to_apply(k, baseline_knobs(data), LM_HOW)
    lm_lines = "".join(
        line + "\n" for line in ["# a language model's knobs: apply them to your model first", *lm] if lm
    )
    return f'''{_header(data)}{lm_lines}import torch
from torch.utils.data import DataLoader

DEVICE = {device!r}
{threads}torch.backends.cudnn.benchmark = {k["cudnn_benchmark"]}
torch.set_float32_matmul_precision({"'high'" if k["precision"] == "tf32" else "'highest'"})
{tf32}{args_line}LOADER_KWARGS = {K.loader_kwargs(k)!r}


def make_loader(dataset, **kwargs):
    """The tuned DataLoader; your own arguments (shuffle, sampler, collate_fn,
    drop_last, ...) pass through and win."""
    return DataLoader(dataset, **{{**LOADER_KWARGS, **kwargs}})


def prepare(model):
    model = model.to(DEVICE{", memory_format=torch.channels_last" if k["channels_last"] else ""})
{compile_line}    return model


def prepare_optimizer(optimizer):
    """Your optimizer, built over the prepared model's parameters, as measured."""
    return {"fuse_optimizer(optimizer)" if k["fused_optimizer"] else "optimizer  # fused_optimizer: false"}
{_fuse_source(k)}

SCALER = {"torch.amp.GradScaler(DEVICE)" if k["precision"] == "16-mixed" else "None"}


{_python_step(k, dtype)}'''


def _python_step(k: dict[str, Any], dtype: str | None) -> str:
    """The snippet's step: `to_device` and `train_step`, with the tuned knobs written in."""
    layout = ", then 4-D float inputs in channels_last" if k["channels_last"] else ""
    return f'''def to_device(batch, preprocess=None):
    """A batch (tensors, tuples, lists, dicts) on the device, then your on-device
    preprocessing{layout}."""
    def move(x, fn):
        if isinstance(x, torch.Tensor):
            return fn(x)
        if isinstance(x, dict):
            return {{key: move(v, fn) for key, v in x.items()}}
        if isinstance(x, (tuple, list)):
            return type(x)(move(v, fn) for v in x)
        return x

    batch = move(batch, lambda t: t.to(DEVICE, non_blocking={k["pin_memory"]}))
    if preprocess is not None:
        batch = preprocess(batch)
    return {"move(batch, lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t)" if k["channels_last"] else "batch"}


def train_step(model, optimizer, batch, loss, preprocess=None):
    """One optimizer step: `loss(model, batch)` (the workload contract) on the device batch."""
    batch = to_device(batch, preprocess)
    with torch.autocast(DEVICE, dtype={dtype}, enabled={dtype is not None}):
        value = loss(model, batch)
    if SCALER is not None:
        SCALER.scale(value).backward()
        SCALER.step(optimizer)
        SCALER.update()
    else:
        value.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none={k["set_to_none"]})
    return value
'''


def _fuse_source(knobs: dict[str, Any]) -> str:
    """The function the trials rebuilt the optimizer with, for a snippet (fused_optimizer on)."""
    import inspect

    if not knobs["fused_optimizer"]:
        return ""
    return "".join("\n\n" + inspect.getsource(f) for f in (K.fuse_optimizer, K.lay_out_state_like_params))


def baseline_knobs(data: dict[str, Any]) -> dict[str, Any]:
    """The baseline's knobs: the tuned ones, less each change the safety flags record."""
    k = {**K.pytorch_defaults(None), **data["knobs"]}
    return {**k, **{f["knob"]: f["baseline"] for f in data.get("safety", [])}}


def changed(tuned: dict[str, Any], base: dict[str, Any], pairs=()) -> dict[str, Any]:
    """The fields of `tuned` that differ from `base`; a field of a pair that
    changed brings its partners (bf16 with fp16: one switches the other off)."""
    out = {k: v for k, v in tuned.items() if base.get(k) != v}
    for pair in pairs:
        if any(k in out for k in pair):
            out.update({k: tuned[k] for k in pair if k in tuned})
    return {k: v for k, v in tuned.items() if k in out}  # in the fields' own order


def _how_to_apply(k: dict, base: dict, how: dict) -> list[str]:
    """A comment line for each changed knob `how` knows how to apply."""
    return [f"# {name}={k[name]!r}: {how[name](k[name])}" for name in how if k[name] != base[name]]


# a language model's knobs where a format has no field for them: how to apply each to your model or script
LM_HOW = {
    "attention": lambda v: (
        f"model.set_attn_implementation({v!r}) (or from_pretrained(..., attn_implementation={v!r}))"
        if v is not None
        else "the model's own attention implementation"
    ),
    "padding_free": lambda v: (
        "each padded batch as one row with position ids (transformers' DataCollatorWithFlattening; `autotune run` "
        "wraps a Trainer's collator)"
        if v
        else "padded batches, as your collator makes them"
    ),
    "packing": lambda v: f"--packing {str(v).lower()} (TRL's SFTConfig)",
    "liger_kernels": lambda v: (
        "liger_kernel.transformers._apply_liger_kernel_to_instance(model=model) (transformers: use_liger_kernel)"
        if v
        else "no Liger kernels"
    ),
    "float8": lambda v: (
        "torchao.float8.convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("
        f"{v!r})), Linear layers with dimensions multiples of 16 (or `model, _ = cfg.prepare(model)`)"
        if v != "off"
        else "no float8 conversion"
    ),
    "activation_checkpointing": lambda v: (
        "`model, _ = cfg.prepare(model)` (cfg = autotune.config()): torch.utils.checkpoint around "
        + ("each repeated block" if v == "full" else "every second repeated block from the first")
        if v != "off"
        else "no activation checkpointing"
    ),
    "expandable_segments": lambda v: (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the process starts (`autotune run` sets it)"
        if v
        else "the allocator's default segments"
    ),
}

HF_HOW = {
    "set_to_none": lambda v: (
        "the Trainer zeroes gradients with model.zero_grad(); before Trainer(model=model): "
        f"model.zero_grad = functools.partial(torch.nn.Module.zero_grad, model, set_to_none={v})"
    ),
    "channels_last": lambda v: (
        "model = model.to(memory_format=torch.channels_last) before Trainer(model=model), and "
        "4-D inputs likewise in your data_collator"
        if v
        else "drop your channels_last conversion of the model and inputs"
    ),
    "num_threads": lambda v: (
        f"torch.set_num_threads({v}) at the top of your script (intra-op threads, as measured)"
        if v is not None
        else "drop your torch.set_num_threads() (torch's default: every core)"
    ),
    "cudnn_benchmark": lambda v: f"torch.backends.cudnn.benchmark = {v} at the top of your script",
    **{name: how for name, how in LM_HOW.items() if name not in ("liger_kernels", "activation_checkpointing")},
}


def _hf(data) -> str:
    """The TrainingArguments that differ from the baseline, as a dict that merges
    over the user's own keyword arguments; the knobs TrainingArguments cannot
    carry, with how to apply each."""
    k, base = {**K.pytorch_defaults(None), **data["knobs"]}, baseline_knobs(data)
    tuned = changed(
        scale_out.hf_kwargs(data),
        scale_out.hf_kwargs(data, base, accum=1),
        pairs=[("bf16", "fp16"), ("torch_compile", "torch_compile_mode")],
    )
    lines = [
        _header(data).rstrip("\n"),
        "# The TrainingArguments that differ from the baseline; merge them over your own (tuned values win):",
        "#   args = TrainingArguments(**{**your_kwargs, **TUNED})",
        f"TUNED = {tuned!r}" + ("" if tuned else "  # the baseline's arguments measured best"),
    ]
    rest = _how_to_apply(k, base, HF_HOW)
    if data.get("workload_args"):
        rest.append(f"# workload_args={data['workload_args']!r}: your factory's searched arguments, as tuned")
    if rest:
        lines += ["# Not TrainingArguments fields; apply them in your script:", *rest]
    return "\n".join(lines) + "\n"


LIGHTNING_HOW = {
    "channels_last": lambda v: (
        "in your LightningModule, self.to(memory_format=torch.channels_last), and the same for 4-D inputs"
        if v
        else "drop your channels_last conversion of the module and inputs"
    ),
    "compile": lambda v: (
        "model = torch.compile(model" + ("" if v == "default" else f", mode={v!r}") + ") before trainer.fit(model)"
        if v != "none"
        else "drop your torch.compile(model)"
    ),
    "fused_optimizer": lambda v: (
        "in configure_optimizers, return fuse_optimizer(your optimizer), below (or build it with fused=True)"
        if v
        else "build your optimizer without fused=True"
    ),
    "set_to_none": lambda v: (
        "Lightning calls optimizer.zero_grad() (set_to_none=True); override "
        f"LightningModule.optimizer_zero_grad to call optimizer.zero_grad(set_to_none={v})"
    ),
    **{name: how for name, how in LM_HOW.items() if name not in ("packing", "padding_free")},
}


def _lightning(data) -> str:
    """The Trainer and DataLoader keyword arguments that differ from the
    baseline, as dicts that merge over the user's own; the rest as code or
    comments."""
    k, base = {**K.pytorch_defaults(None), **data["knobs"]}, baseline_knobs(data)

    def trainer(knobs):
        return {
            "precision": "32-true" if knobs["precision"] == "tf32" else knobs["precision"],
            "benchmark": knobs["cudnn_benchmark"],
        }

    lines = [_header(data).rstrip("\n"), "import torch", ""]
    if k["precision"] == "tf32" and base["precision"] != "tf32":
        lines.append('torch.set_float32_matmul_precision("high")  # tf32: Lightning precision "32-true" + TF32 matmuls')
    if k["num_threads"] != base["num_threads"] and k["num_threads"] is not None:
        lines.append(f"torch.set_num_threads({k['num_threads']})  # intra-op threads, as measured")
    lines += [
        "# what differs from the baseline; merge over your own arguments (tuned values win):",
        f"trainer_kwargs = {changed(trainer(k), trainer(base))!r}",
        f"dataloader_kwargs = {changed(K.loader_kwargs(k), K.loader_kwargs(base))!r}",
        "# trainer = lightning.Trainer(**{**your_trainer_kwargs, **trainer_kwargs})",
        "# loader = DataLoader(dataset, **{**your_loader_kwargs, **dataloader_kwargs})",
    ]
    if data.get("workload_args"):
        lines.append(f"workload_args = {data['workload_args']!r}  # your factory's searched arguments, as tuned")
    lines += _how_to_apply(k, base, LIGHTNING_HOW)
    if k["fused_optimizer"] and not base["fused_optimizer"]:
        lines.append(_fuse_source(k).strip() + "\n")
    lines += scale_out.lightning_strategy(data)
    return "\n".join(lines) + "\n"
