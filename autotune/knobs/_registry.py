"""The knob registry: every knob's domain, constraints, stage, safety class and
label in one place. The spec's models, the search space, the strategy's ladders,
the loader builder, the report's labels and the exports all derive from `KNOBS`;
adding a built-in knob is one `Knob(...)` entry below (and its tests).

Stages, in the order they act on a training job:
- `environment`: the process's environment, read before torch starts its allocator (a fresh process);
- `process`: process-wide settings (intra-op threads);
- `backend`: torch.backends flags (cuDNN autotuning, fp32 matmul precision);
- `model`: the model's memory format and compilation; a language model's attention kernel, Liger kernels,
  activation checkpointing and float8 Linear layers;
- `data`: a language model's batches: texts packed into full rows, padding-free rows;
- `loader`: DataLoader keyword arguments (one builder: `build_loader`);
- `step`: the training step (autocast, zero_grad);
- `workload`: the user's own factory arguments (`search_space.workload_args`).

This module is imported by the CLI and the spec, so it must not import torch at
load time; the `apply_*` functions import it when called (inside a trial, or in
production code through `autotune.config.Config`).

Why one module of over 600 lines: it is one definition. The `KNOBS` table is ~350 lines of data, its entries name
the availability and conflict rules above it as their fields, and the rest are the lookups over the table (canonical,
lookup, conflicts, a value as a CSV cell and as a person reads it, the defaults). Splitting the rules from the
entries that name them would split one definition across two files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from autotune._imports import installed

PRECISIONS = ("32-true", "tf32", "bf16-mixed", "16-mixed")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
SAFETY_CLASSES = ("safe", "reproducibility", "numerics", "dynamics")  # from least to most risky
STAGES = ("environment", "process", "backend", "model", "data", "loader", "step", "workload")
BOTTLENECKS = ("input", "overhead", "compute", "memory", "communication", "capacity")
SHARDINGS = ("ddp", "fsdp")
# a language model's attention kernels, as transformers names them (`attn_implementation`)
ATTENTIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
CHECKPOINTING = ("off", "full", "selective")  # activation checkpointing per repeated block
SELECTIVE_EVERY = 2  # selective: every second block (transformers' every_n_layers=2, torchtitan's selective "2")
FLOAT8 = ("off", "tensorwise", "rowwise")  # torchao's float8 training recipes
# a language model's knobs (issue 52): a value of one that a spec asks for by name must run here (knobs.asked)
LANGUAGE_MODEL = (
    "attention",
    "padding_free",
    "packing",
    "liger_kernels",
    "activation_checkpointing",
    "float8",
    "expandable_segments",
)
USER_PREFIX = "args."  # user knobs (workload factory arguments) are named args.NAME


@dataclass(frozen=True)
class Device:
    """What a trial runs on; decides which knob values apply."""

    type: str  # "cpu" or "cuda"
    cpus: int
    name: str = "cpu"
    capability: tuple[int, int] | None = None  # CUDA compute capability
    # the workload's optimizer class, "module:QualName" (None: not known); decides fused_optimizer
    optimizer: str | None = None
    ranks: int = 1  # processes per trial (resources.ranks_per_trial); decides the DDP/FSDP knobs


Why = "str | None"  # a reason a value cannot apply, or None when it can


@dataclass(frozen=True)
class Knob:
    name: str
    type: type  # int | bool | str (object: a user knob, any JSON scalar)
    pytorch_default: Any  # what plain PyTorch does (None: torch's own default; batch size: the workload's)
    safety: str  # one of SAFETY_CLASSES
    safety_reason: str  # what changes and what to watch
    help: str  # one line: what it sets
    label: str  # short column label
    stage: str  # one of STAGES
    choices: tuple | None = None
    nullable: bool = False  # None is a value: "torch's default"
    minimum: int | None = None  # ints: the smallest value
    ladder: bool = False  # ordered values: the strategy climbs them one step at a time
    none_rank: float = float("-inf")  # where None (torch's default) stands on the ladder
    host_only: bool = False  # acts on the host only: never changes device memory (memory ladder)
    numerics: bool = False  # can change the loss a step computes (measured by loss parity)
    across_ranks: bool = False  # acts only across ranks (DDP/FSDP): one rank runs the same with any value
    bottlenecks: tuple[str, ...] = ()  # what this knob can relieve (BOTTLENECKS)
    # why `value` cannot apply on `device`, or None when it can
    unavailable: Callable[[Any, Device], str | None] = lambda value, device: None
    # why `value` cannot go with the other knobs' values, or None when it can
    requires: Callable[[Any, dict], str | None] = lambda value, knobs: None
    user: bool = False  # a workload factory argument declared in the spec
    # older spellings of a value, read as it (activation_checkpointing: true -> "full", false -> "off")
    aliases: tuple[tuple[Any, Any], ...] = ()
    env: str | None = None  # an environment knob: the variable it sets (a fresh process reads it at start)

    def canonical(self, value):
        """`value`, an older spelling (`aliases`) read as the value it stands for."""
        for old, new in self.aliases:
            if type(value) is type(old) and value == old:
                return new
        return value

    def check(self, value) -> str | None:
        """Why `value` is outside this knob's domain, or None."""
        value = self.canonical(value)
        if value is None:
            return None if self.nullable else "null is not allowed"
        if self.user:
            return None if isinstance(value, (bool, int, float, str)) else "must be a bool, number or string"
        if type(value) is not self.type:
            return f"expected {self.type.__name__}"
        if self.choices and value not in self.choices:
            return "expected one of " + " | ".join(self.choices)
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {self.minimum}"
        return None

    @property
    def kwarg(self) -> str:
        """The name the knob's stage knows it by (a DataLoader kwarg, a factory argument)."""
        return self.name[len(USER_PREFIX) :] if self.user else self.name


def _no_cuda(what: str) -> Callable[[Any, Device], str | None]:
    def check(value, device):
        if value and device.type != "cuda":
            return f"{what}; no CUDA device"
        return None

    return check


def _at_most_cpus(value, device):
    if value is not None and value > device.cpus:
        return f"only {device.cpus} CPUs per trial host"
    return None


def _needs_workers(value, knobs):
    if value not in (None, False) and knobs.get("num_workers", 0) == 0:
        return "needs loader workers (num_workers > 0)"
    return None


def _grads_in_graphs(value, knobs):
    if value is False and knobs.get("compile") == "reduce-overhead":
        return (
            "compile=reduce-overhead keeps the gradients in CUDA graph memory, and zeroing them in place "
            "touches an output a later replay overwrote (a RuntimeError on an H100, torch 2.11)"
        )
    return None


def _precision(value, device):
    cc = device.capability or (0, 0)
    if device.type != "cuda":
        if value == "tf32":
            return "TF32 is a tensor-core mode of CUDA GPUs; no CUDA device"
        if value == "16-mixed":
            return "fp16 mixed precision with GradScaler needs a CUDA device"
        return None
    if value in ("tf32", "bf16-mixed") and cc < (8, 0):
        return f"{value} needs compute capability >= 8.0 (this GPU: {cc[0]}.{cc[1]})"
    return None


def _compile(value, device):
    if value == "reduce-overhead" and device.type != "cuda":
        return "reduce-overhead captures CUDA graphs; no CUDA device"
    return None


def _fused(value, device):
    if not value or device.optimizer is None:  # not known: the trial finds out (and says)
        return None
    return fused_unavailable(device.optimizer, device.type)  # imports torch: only where a workload was built


def fused_unavailable(optimizer: str, device_type: str) -> str | None:
    """Why torch cannot fuse this optimizer class ("module:QualName") on this
    device type, or None (also when the class cannot be imported here)."""
    import importlib
    import inspect

    import torch
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    module, _, qualname = optimizer.partition(":")
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except Exception:
        return None
    if "fused" not in inspect.signature(cls.__init__).parameters:
        have = sorted(
            n
            for n, c in vars(torch.optim).items()
            if isinstance(c, type)
            and issubclass(c, torch.optim.Optimizer)
            and "fused" in inspect.signature(c.__init__).parameters
        )
        return (
            f"the workload's optimizer {qualname} has no fused implementation in torch {torch.__version__} "
            f"(torch.optim has one for {', '.join(have)})"
        )
    if device_type not in _get_fused_kernels_supported_devices():
        return f"torch {torch.__version__} has no fused optimizer kernels for {device_type}"
    return None


def _multi_rank(default):
    """A knob of gradient synchronization: only a trial of two or more ranks has one."""

    def check(value, device):
        if value != default and device.ranks < 2:
            return "acts on the gradient all-reduce of two or more ranks; resources.ranks_per_trial is 1"
        return None

    return check


def _fsdp_only(value, knobs):
    if value is not True and knobs.get("sharding", "ddp") != "fsdp":
        return "an FSDP setting; needs sharding=fsdp"
    return None


def _ddp_only(default):
    def check(value, knobs):
        if value != default and knobs.get("sharding", "ddp") != "ddp":
            return "a DistributedDataParallel setting; needs sharding=ddp"
        return None

    return check


# the package each value needs: (import name, what `pip install` takes)
PACKAGES = {
    "flash_attention_2": ("flash_attn", "flash-attn"),
    "flash_attention_3": ("flash_attn_interface", "flash-attn-3"),
    "liger_kernels": ("liger_kernel", "liger-kernel"),
    "float8": ("torchao", "torchao"),
}


def _not_installed(what: str) -> str | None:
    module, dist = PACKAGES[what]
    if installed(module):
        return None
    return f"{dist} is not installed (`pip install {dist}` where the trials run; autotune installs nothing)"


def _attention(value, device):
    if value in (None, "eager", "sdpa"):
        return None
    if device.type != "cuda":
        if value == "flex_attention":
            return "FlexAttention has no backward pass on the CPU (torch 2.14: NotImplementedError); no CUDA device"
        return "FlashAttention is CUDA only; no CUDA device"
    if value == "flex_attention":
        return None
    cc = device.capability or (0, 0)
    if cc < (8, 0):
        return f"{value} needs compute capability >= 8.0 (this GPU: {cc[0]}.{cc[1]})"
    return _not_installed(value)


def _liger(value, device):
    if not value:
        return None
    if device.type != "cuda":
        return "Liger's kernels are Triton kernels, CUDA only; no CUDA device"
    return _not_installed("liger_kernels")


def _float8(value, device):
    if value in (None, "off"):
        return None
    if device.type != "cuda":
        return "float8 matmuls (torch._scaled_mm) are CUDA only; no CUDA device"
    cc = device.capability or (0, 0)
    if cc < (8, 9):
        return f"float8 matmuls need compute capability >= 8.9 (Ada, Hopper; this GPU: {cc[0]}.{cc[1]})"
    return _not_installed("float8")


NO_NUMERICS = "no effect on numerics"
# In the strategy's default order: one knob at a time, the cheapest big levers first.
KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "num_workers",
            int,
            0,
            "safe",
            f"{NO_NUMERICS}; each worker costs RAM and shared memory",
            "DataLoader worker processes",
            "workers",
            "loader",
            minimum=0,
            ladder=True,
            host_only=True,
            bottlenecks=("input",),
            unavailable=_at_most_cpus,
        ),
        Knob(
            "pin_memory",
            bool,
            False,
            "safe",
            NO_NUMERICS,
            "page-locked host batches + non_blocking host-to-device copies",
            "pin",
            "loader",
            host_only=True,
            bottlenecks=("input",),
            unavailable=_no_cuda("pinned memory only speeds host-to-GPU copies"),
        ),
        Knob(
            "prefetch_factor",
            int,
            None,
            "safe",
            f"{NO_NUMERICS}; each batch prefetched costs host memory",
            "batches each loader worker loads ahead (null: torch's default, 2)",
            "prefetch",
            "loader",
            nullable=True,
            minimum=1,
            ladder=True,
            none_rank=2,
            host_only=True,
            bottlenecks=("input",),
            requires=_needs_workers,
        ),
        Knob(
            "persistent_workers",
            bool,
            False,
            "safe",
            NO_NUMERICS,
            "loader workers kept alive between epochs (no restart cost per epoch)",
            "persist",
            "loader",
            host_only=True,
            bottlenecks=("input",),
            requires=_needs_workers,
        ),
        Knob(
            "num_threads",
            int,
            None,
            "safe",
            "reductions may split differently (rounding only); the loader workers share the cores",
            "intra-op threads of the training process, torch.set_num_threads (null: torch's default)",
            "threads",
            "process",
            nullable=True,
            minimum=1,
            ladder=True,
            none_rank=float("inf"),  # torch's default: every core
            host_only=True,
            bottlenecks=("input", "overhead"),
            unavailable=_at_most_cpus,
        ),
        Knob(
            "batch_size",
            int,
            None,
            "dynamics",
            "changes optimization; scale the learning rate or accumulate gradients to keep the effective batch",
            "samples per optimizer step",
            "batch",
            "loader",
            minimum=1,
            ladder=True,
            bottlenecks=("overhead", "input"),
        ),
        Knob(
            "precision",
            str,
            "32-true",
            "numerics",
            "changes rounding; check loss parity (fp16 can overflow)",
            "autocast dtype / matmul precision",
            "precision",
            "step",
            choices=PRECISIONS,
            numerics=True,
            bottlenecks=("compute", "memory"),
            unavailable=_precision,
        ),
        Knob(
            "channels_last",
            bool,
            False,
            "safe",
            "different memory layout, rounding-level differences only",
            "model and 4-D inputs in torch.channels_last",
            "ch-last",
            "model",
            numerics=True,
            bottlenecks=("compute",),
        ),
        Knob(
            "cudnn_benchmark",
            bool,
            False,
            "reproducibility",
            "cuDNN picks algorithms by timing, so runs are not bitwise reproducible",
            "torch.backends.cudnn.benchmark",
            "cudnn-bm",
            "backend",
            numerics=True,
            bottlenecks=("compute",),
            unavailable=_no_cuda("cuDNN runs only on CUDA devices"),
        ),
        Knob(
            "compile",
            str,
            "none",
            "numerics",
            "fused kernels round differently; check loss parity",
            "torch.compile mode",
            "compile",
            "model",
            choices=COMPILE_MODES,
            numerics=True,
            bottlenecks=("overhead", "memory"),
            unavailable=_compile,
        ),
        Knob(
            "set_to_none",
            bool,
            True,
            "safe",
            "safe unless your code reads .grad after zero_grad",
            "optimizer.zero_grad(set_to_none=...)",
            "none-grad",
            "step",
            numerics=True,
            bottlenecks=("overhead",),
            requires=_grads_in_graphs,
        ),
        Knob(
            "fused_optimizer",
            bool,
            False,
            "numerics",
            "the update runs as fused kernels, which may round differently; check loss parity",
            "your optimizer rebuilt with fused=True (torch's SGD, Adam, AdamW, Adagrad)",
            "fused-opt",
            "step",
            numerics=True,
            bottlenecks=("overhead", "memory"),
            unavailable=_fused,
        ),
        # a language model's (autotune.knobs._lm): each reaches a program the way it already goes (an HF/TRL
        # script's own arguments, cfg.prepare, the Lightning callback); a model or program that cannot take one
        # says so in the probe (`autotune.config.Config.cannot`)
        Knob(
            "attention",
            str,
            None,
            "numerics",
            "another attention kernel: the same softmax(QK^T)V, rounded differently (flash kernels in fp16/bf16); "
            "check loss parity",
            "the model's attention implementation, transformers' attn_implementation (null: the model's own)",
            "attention",
            "model",
            choices=ATTENTIONS,
            nullable=True,
            numerics=True,
            bottlenecks=("compute", "memory", "capacity"),
            unavailable=_attention,
        ),
        Knob(
            "padding_free",
            bool,
            False,
            "numerics",
            "the same tokens, a batch's texts in one row without padding, each document's positions restarting at "
            "0 so attention stays inside it: other rounding; check loss parity",
            "each padded batch flattened into one row with position ids (HF's DataCollatorWithFlattening, TRL's "
            "padding_free)",
            "pad-free",
            "data",
            numerics=True,
            bottlenecks=("compute", "memory", "capacity"),
        ),
        Knob(
            "packing",
            bool,
            False,
            "dynamics",
            "texts packed into full rows: a step trains on other texts together, more tokens per step (TRL's packing; "
            "its best-fit packing is padding-free whatever padding_free says)",
            "texts packed into rows of the sequence length (TRL's SFTConfig packing)",
            "packing",
            "data",
            numerics=True,
            bottlenecks=("overhead", "compute"),
        ),
        Knob(
            "liger_kernels",
            bool,
            False,
            "numerics",
            "Liger's Triton kernels (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy) round differently; check "
            "loss parity",
            "Liger kernels patched into the model (transformers' use_liger_kernel, apply_liger_kernel_to_*)",
            "liger",
            "model",
            numerics=True,
            bottlenecks=("memory", "capacity"),
            unavailable=_liger,
        ),
        Knob(
            "float8",
            str,
            "off",
            "numerics",
            "the Linear layers' matmuls in float8 with per-tensor or per-row scales (torchao): a lower-precision "
            "step; check loss parity",
            "torchao's float8 training (convert_to_float8_training, recipe tensorwise or rowwise)",
            "float8",
            "model",
            choices=FLOAT8,
            numerics=True,
            bottlenecks=("compute",),
            unavailable=_float8,
        ),
        # multi-rank (resources.ranks_per_trial > 1): DDP or FSDP2 per repeated block (autotune.knobs._parallel)
        Knob(
            "ddp_bucket_cap_mb",
            int,
            25,
            "safe",
            "gradients are all-reduced in other groups; the averaged gradient is the same up to rounding",
            "DistributedDataParallel(bucket_cap_mb=...): MiB of gradients per all-reduce",
            "bucket-mb",
            "model",
            minimum=1,
            bottlenecks=("communication",),
            across_ranks=True,
            unavailable=_multi_rank(25),
            requires=_ddp_only(25),
        ),
        Knob(
            "ddp_gradient_as_bucket_view",
            bool,
            False,
            "safe",
            "gradients are views into the all-reduce buckets (saves a copy and its memory); safe unless your "
            "code replaces .grad tensors",
            "DistributedDataParallel(gradient_as_bucket_view=...)",
            "grad-view",
            "model",
            bottlenecks=("communication", "memory"),
            across_ranks=True,
            unavailable=_multi_rank(False),
            requires=_ddp_only(False),
        ),
        Knob(
            "ddp_static_graph",
            bool,
            False,
            "safe",
            "the same parameters take part in every step; wrong (an error) for a model whose used parameters vary",
            "DistributedDataParallel(static_graph=...)",
            "static",
            "model",
            bottlenecks=("communication",),
            across_ranks=True,
            unavailable=_multi_rank(False),
            requires=_ddp_only(False),
        ),
        Knob(
            "sharding",
            str,
            "ddp",
            "numerics",
            "fsdp shards parameters, gradients and optimizer state per repeated block; reductions round differently",
            "ddp: DistributedDataParallel; fsdp: FSDP2 fully_shard per repeated block",
            "sharding",
            "model",
            choices=SHARDINGS,
            numerics=True,
            bottlenecks=("memory", "capacity", "communication"),
            across_ranks=True,
            unavailable=_multi_rank("ddp"),
        ),
        Knob(
            "fsdp_reshard_after_forward",
            bool,
            True,
            "safe",
            "false keeps the gathered parameters from forward to backward: less communication, more memory",
            "fully_shard(reshard_after_forward=...)",
            "reshard",
            "model",
            bottlenecks=("communication",),
            across_ranks=True,
            unavailable=_multi_rank(True),
            requires=_fsdp_only,
        ),
        Knob(
            "activation_checkpointing",
            str,
            "off",
            "safe",
            "activations of the checkpointed blocks are recomputed in backward: the same values, more compute, "
            "less memory; a block with BatchNorm updates its running statistics again in the recompute",
            f"torch.utils.checkpoint around each repeated block (full) or every {SELECTIVE_EVERY}nd one "
            "(selective); true/false: full/off",
            "act-ckpt",
            "model",
            choices=CHECKPOINTING,
            bottlenecks=("memory", "capacity"),
            aliases=((True, "full"), (False, "off")),
        ),
        Knob(
            "expandable_segments",
            bool,
            False,
            "safe",
            f"{NO_NUMERICS}; the CUDA caching allocator maps growable segments: less fragmentation (a batch that "
            "ran out of memory in fragments may fit)",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, set before the trial's process starts",
            "exp-seg",
            "environment",
            bottlenecks=("capacity",),
            unavailable=_no_cuda("a setting of the CUDA caching allocator, CUDA only"),
            env="PYTORCH_CUDA_ALLOC_CONF",
        ),
    )
}


def canonical(knobs: dict[str, Any]) -> dict[str, Any]:
    """`knobs` with each built-in knob's older spellings read as the values they stand for
    (activation_checkpointing: true -> "full"): what a spec, a trial config or a best_config.yaml gives."""
    return {n: KNOBS[n].canonical(v) if n in KNOBS else v for n, v in knobs.items()}


def environment(knobs: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, str]:
    """The variables the environment knobs among `knobs` set, over `env`'s own (a setting of the
    allocator joins what PYTORCH_CUDA_ALLOC_CONF already holds): {} when none is on."""
    out: dict[str, str] = {}
    if knobs.get("expandable_segments"):
        own = (env or {}).get("PYTORCH_CUDA_ALLOC_CONF", "")
        kept = [p for p in own.split(",") if p.strip() and not p.strip().startswith("expandable_segments")]
        out["PYTORCH_CUDA_ALLOC_CONF"] = ",".join([*kept, "expandable_segments:True"])
    return out


def ladder_key(name: str) -> Callable[[Any], float]:
    """Sort key of a ladder's values: None (torch's default) where the knob places it."""
    rank = lookup(name).none_rank

    def key(value):
        return rank if value is None else value

    return key


def user_knob(name: str, safety: str = "dynamics", stage: str | None = None) -> Knob:
    """A workload factory argument the spec declares searchable (`search_space.workload_args`).
    It may change training unless declared `safe`; with a `stage` the diagnosis can move it."""
    bottlenecks = {
        "loader": ("input",),
        "model": ("compute", "memory"),
        "step": ("overhead",),
        "process": ("input",),
        "backend": ("compute",),
    }.get(stage or "", ())
    return Knob(
        USER_PREFIX + name,
        object,
        None,
        safety,
        f"your workload argument `{name}`, declared {safety}",
        f"workload argument {name}",
        name,
        "workload",
        nullable=True,
        user=True,
        numerics=safety != "safe",
        bottlenecks=bottlenecks,
    )


def registry(user: dict[str, dict] | None = None) -> dict[str, Knob]:
    """The built-in knobs and a search's user knobs (`Space.user`: name -> {safety, stage})."""
    return {**KNOBS, **{USER_PREFIX + n: user_knob(n, **d) for n, d in (user or {}).items()}}


@dataclass(frozen=True, eq=False)
class UserKnobs:
    """A search's user knobs (the workload arguments it declares searchable, `Space.user`), as a registry: each
    `args.NAME` with its declared safety class and stage. The search's plan holds it
    (`autotune.plan.SearchPlan.user_knobs`) and passes it where a knob's class or stage is read (the playbook's
    moves, a config's risk, its safety flags); a run dir's reader makes its own from search.json's space."""

    declared: dict[str, Knob] = field(default_factory=dict)  # "args.NAME" -> its knob, as declared

    @classmethod
    def of(cls, user: dict[str, dict] | None) -> "UserKnobs":
        """From a space's user knobs (name -> {safety, stage}, what `user_knob` takes)."""
        return cls({name: knob for name, knob in registry(user).items() if knob.user})

    def lookup(self, name: str) -> Knob:
        """A built-in knob, or a user knob as declared here (an undeclared `args.NAME`: a dynamics knob)."""
        return self.declared[name] if name in self.declared else lookup(name)

    def items(self):
        return self.declared.items()


def lookup(name: str) -> Knob:
    """A built-in knob, or an `args.NAME` as an undeclared user knob (a dynamics knob; a search's declared ones:
    `UserKnobs.lookup`)."""
    if name in KNOBS:
        return KNOBS[name]
    if name.startswith(USER_PREFIX):
        return user_knob(name[len(USER_PREFIX) :])
    raise KeyError(f"unknown knob `{name}`; knobs are: {', '.join(KNOBS)}")


def conflicts(knobs: dict[str, Any], table: dict[str, Knob] | None = None) -> list[str]:
    """Why these knob values cannot run together ("knob=value: reason")."""
    out = []
    for name, knob in (table or KNOBS).items():
        if name in knobs:
            why = knob.requires(knobs[name], knobs)
            if why:
                out.append(f"{name}={knobs[name]!r}: {why}")
    return out


def to_cell(value) -> str:
    """A knob value as a CSV cell (landscapes): strings as they are, the rest as JSON (true, 32, null)."""
    return value if isinstance(value, str) else json.dumps(value)


def shown(value) -> str:
    """A knob value as a person reads it: a switch on or off, None as the default, else as it is."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "default" if value is None else str(value)


def from_cell(name: str, raw) -> Any:
    """A knob value from a CSV cell: a landscape's (true, 32, null) or a trials.csv's (True, empty).
    A column an older file lacks (None) is the knob's PyTorch default."""
    knob = KNOBS[name]
    if raw is None or raw == "" or raw == "null" or (isinstance(raw, float) and raw != raw):
        return knob.pytorch_default
    legacy = bool(knob.aliases) and (isinstance(raw, bool) or str(raw).lower() in ("true", "false"))
    if knob.type is bool or legacy:  # a bool, or an older file's true/false of a knob that has values now
        return knob.canonical(raw if isinstance(raw, bool) else str(raw).lower() == "true")
    if knob.type is str:
        return raw
    return int(float(raw))


def pytorch_defaults(batch_size: int | None) -> dict[str, Any]:
    """The knobs as plain PyTorch leaves them, at the user's batch size."""
    return {name: (batch_size if name == "batch_size" else k.pytorch_default) for name, k in KNOBS.items()}


ACROSS_RANKS = tuple(name for name, k in KNOBS.items() if k.across_ranks)
