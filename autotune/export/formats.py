"""A best_config.yaml in the forms distributed training is launched with: Hugging
Face `TrainingArguments` keyword arguments, the `torchrun` command line, and
Lightning's DDPStrategy / FSDPStrategy. Plain data in, text or a dict out (no
torch, transformers or Lightning imported).

    autotune export runs/<search> -f hf         # the TrainingArguments that differ from the baseline
    autotune export runs/<search> -f torchrun   # the command line for `cfg.wrap` in your script
"""

from __future__ import annotations

from typing import Any

from autotune import knobs as K
from autotune.export import hf_args


def parallel(data: dict[str, Any]) -> dict[str, Any]:
    """best_config.yaml's `parallel` part: ranks per trial and the repeated block classes."""
    return {"ranks": 1, "blocks": None, **(data.get("parallel") or {})}


def hf_kwargs(data: dict[str, Any], knobs: dict[str, Any] | None = None, accum: int | None = None) -> dict[str, Any]:
    """`transformers.TrainingArguments` keyword arguments for every knob that has
    one (the rest: threads, channels_last, cuDNN, set_to_none, have none), for
    `knobs` (default: the tuned ones) at `accum` micro-batches a step (default:
    the tuned accumulation). Every field is given, False ones too, so that two
    configs' fields can be compared."""
    k = {**K.pytorch_defaults(None), **(data["knobs"] if knobs is None else knobs)}
    par = parallel(data)
    if accum is None:
        accum = int((data.get("batch") or {}).get("grad_accumulation_steps") or 1)
    out: dict[str, Any] = {
        "per_device_train_batch_size": k["batch_size"],
        "gradient_accumulation_steps": accum,
        "dataloader_num_workers": k["num_workers"],
        "dataloader_pin_memory": k["pin_memory"],
        "dataloader_persistent_workers": k["persistent_workers"] if k["num_workers"] else False,
        "dataloader_prefetch_factor": k["prefetch_factor"] if k["num_workers"] else None,
        "bf16": k["precision"] == "bf16-mixed",
        "fp16": k["precision"] == "16-mixed",
        "tf32": True if k["precision"] == "tf32" else None,
        "torch_compile": k["compile"] != "none",
        "torch_compile_mode": None if k["compile"] in ("none", "default") else k["compile"],
        "optim": "adamw_torch_fused" if k["fused_optimizer"] else "adamw_torch",
        "use_liger_kernel": k["liger_kernels"],
        # transformers 5 (gradient_checkpointing: its deprecated alias); selective: every_n_layers
        "activation_checkpointing_kwargs": None,
        **hf_args.checkpointing(k["activation_checkpointing"]),
    }
    if par["ranks"] > 1 and k["sharding"] == "fsdp":
        out["fsdp"] = "full_shard auto_wrap" if k["fsdp_reshard_after_forward"] else "shard_grad_op auto_wrap"
        out["fsdp_config"] = {
            "version": 2,
            "reshard_after_forward": k["fsdp_reshard_after_forward"],
            **({"transformer_layer_cls_to_wrap": par["blocks"]} if par["blocks"] else {}),
        }
    elif par["ranks"] > 1:
        out["ddp_bucket_cap_mb"] = k["ddp_bucket_cap_mb"]
        out["ddp_static_graph"] = k["ddp_static_graph"]
    if data.get("device", {}).get("type") == "cpu":
        out["use_cpu"] = True
    return out


def torchrun(data: dict[str, Any], script: str = "train.py") -> str:
    """The torchrun command line for the measured ranks on one node (OMP_NUM_THREADS
    as the trials ran: torchrun's 1 per rank unless num_threads was tuned)."""
    k = {**K.pytorch_defaults(None), **data["knobs"]}
    ranks = parallel(data)["ranks"]
    threads = f"OMP_NUM_THREADS={k['num_threads']} " if k["num_threads"] is not None else ""
    return (
        f"{threads}torchrun --standalone --nnodes=1 --nproc-per-node={ranks} {script}"
        "  # in train.py: dist.init_process_group(); model = cfg.wrap(model); then build the optimizer\n"
    )


def lightning_strategy(data: dict[str, Any]) -> list[str]:
    """The Lightning strategy lines for a multi-rank config ([] for one rank)."""
    k = {**K.pytorch_defaults(None), **data["knobs"]}
    par = parallel(data)
    if par["ranks"] < 2:
        return []
    if k["sharding"] == "fsdp":
        policy = f"{{{', '.join(par['blocks'])}}}" if par["blocks"] else "{YourBlock}"
        return [
            "from lightning.pytorch.strategies import FSDPStrategy",
            f"strategy = FSDPStrategy(auto_wrap_policy={policy}, "
            f"sharding_strategy={'FULL_SHARD' if k['fsdp_reshard_after_forward'] else 'SHARD_GRAD_OP'!r}"
            + (f", activation_checkpointing_policy={policy}" if k["activation_checkpointing"] != "off" else "")
            + ")",
            f"# trainer = lightning.Trainer(strategy=strategy, devices={par['ranks']}, **{{**your_trainer_kwargs, **trainer_kwargs}})",
        ]
    return [
        "from lightning.pytorch.strategies import DDPStrategy",
        f"strategy = DDPStrategy(bucket_cap_mb={k['ddp_bucket_cap_mb']}, "
        f"gradient_as_bucket_view={k['ddp_gradient_as_bucket_view']}, static_graph={k['ddp_static_graph']})",
        f"# trainer = lightning.Trainer(strategy=strategy, devices={par['ranks']}, **{{**your_trainer_kwargs, **trainer_kwargs}})",
    ]
