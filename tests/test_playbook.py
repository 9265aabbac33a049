"""The playbook's moves and the advice rendered from them, for diagnoses of planted metrics."""

from autotune.decide.playbook import PLAYBOOK, advise, playbook_moves, render
from autotune.knobs import Device, pytorch_defaults
from autotune.trial.diagnose import diagnose

H100 = Device("cuda", 16, "NVIDIA H100 80GB HBM3", (9, 0))
CPU = Device("cpu", 2)
KNOBS = pytorch_defaults(32)


def advised(m, knobs, device, batch_kind=None):
    """A trial's diagnosis of `m` with the playbook's advice, as the search stores it (`execution.trials.advised`)."""
    return advise(diagnose(m, knobs, device, batch_kind), knobs)


def test_input_bound_when_the_loader_takes_over_5_percent():
    d = advised({"dataloader_frac": 0.35, "gpu_util_frac": 0.3, "batch2x_step_ratio": 1.9}, KNOBS, H100)
    assert d["bottleneck"] == "input"
    assert d["evidence"][0] == "profiled window: data loading 35.0% of the step"
    assert d["recommendations"][:2] == [
        "more DataLoader workers (num_workers=0 now)",
        "pin_memory=True with non_blocking copies",
    ]
    assert [(m["knob"], m["to"]) for m in d["moves"][:2]] == [("num_workers", "up"), ("pin_memory", True)]


def test_input_judged_on_the_timed_window_not_the_profiled_one():
    # the live H100 case: the loader kept up under the profiler (slower steps), not in the timed window
    m = {
        "data_wait_frac": 0.65,
        "dataloader_frac": 0.01,
        "gpu_util_frac": 0.3,
        "batch2x_step_ratio": 1.2,
        "gpu_compute_kernel_frac": 0.4,
    }
    d = advised(m, {**KNOBS, "num_workers": 4, "pin_memory": True}, H100)
    assert d["bottleneck"] == "input"
    assert d["evidence"][:2] == [
        "timed window: waiting on data 65.0% of the step (> 5%)",
        "profiled window: data loading 1.0% of the step (the profiler slows each step, so there the loader keeps up)",
    ]
    assert d["moves"][0]["knob"] == "num_workers"  # pinning is on already: no pin move
    assert all(mv["knob"] != "pin_memory" for mv in d["moves"])


def test_two_rates_size_the_loader_within_the_cpus_per_gpu():
    m = {
        "data_wait_frac": 0.4,
        "compute_ceiling_samples_per_s": 10000.0,
        "loader_samples_per_s_per_worker": 1500.0,
        "host_cpus_per_gpu": 16,
    }
    d = advised(m, {**KNOBS, "num_workers": 4}, H100)
    assert d["moves"][0] == {
        "knob": "num_workers",
        "to": 8,
        "why": "more DataLoader workers",
    }  # ceil(1.2 * 10000 / 1500)
    assert d["recommendations"][0] == "more DataLoader workers (num_workers=4 now, about 8 needed)"
    assert any(e.startswith("two sides apart: compute ceiling 10000 samples/s") for e in d["evidence"])
    assert "(about 8 workers needed, of 16 CPUs per GPU)" in d["evidence"][-1]
    capped = advised({**m, "host_cpus_per_gpu": 6}, {**KNOBS, "num_workers": 4}, H100)
    assert capped["moves"][0]["to"] == 6
    on_cpu = advised({**m, "host_cpus_per_gpu": None}, {**KNOBS, "num_workers": 1}, CPU)  # no GPU: no "per GPU"
    assert [e for e in on_cpu["evidence"] if e.startswith("two sides apart")][0].endswith(
        "(about 2 workers needed, of 2 CPUs)"
    )


def test_loader_workers_beside_every_core_in_threads_cap_the_threads_on_a_cpu():
    # jpeg_pipeline on 2 CPUs: 1 worker beside torch's 2 threads; 1 thread ran channels_last 12.6% faster
    m = {"data_wait_frac": 0.02, "batch2x_step_ratio": 1.9, "cpu_compute_op_frac": 0.56, "host_cpus_per_gpu": 2}
    d = advised(m, {**KNOBS, "num_workers": 1}, CPU)
    assert d["bottleneck"] == "compute" and d["moves"][0] == {
        "knob": "num_threads",
        "to": 1,
        "why": "fewer intra-op threads, so the loader workers keep cores of their own",
    }
    assert "host: 1 loader worker beside 2 intra-op threads on 2 CPUs (oversubscribed)" in d["evidence"]
    assert d["recommendations"][0].endswith("(num_threads=torch's default now, about 1 needed)")
    eight = {**m, "host_cpus_per_gpu": 8}
    assert advised(eight, {**KNOBS, "num_workers": 2}, CPU)["moves"][0]["to"] == 6  # each worker keeps a core
    for m, knobs, device in [
        (m, {**KNOBS, "num_workers": 1, "num_threads": 1}, CPU),
        (m, KNOBS, CPU),
        (eight, {**KNOBS, "num_workers": 2, "num_threads": 6}, CPU),
        (m, {**KNOBS, "num_workers": 1}, H100),
    ]:  # capped; no workers; fits; a GPU step
        assert all(mv["knob"] != "num_threads" for mv in advised(m, knobs, device)["moves"])


def test_overhead_bound_when_doubling_the_batch_is_nearly_free():
    d = advised({"dataloader_frac": 0.01, "batch2x_step_ratio": 1.1, "cpu_compute_op_frac": 0.8}, KNOBS, CPU)
    assert d["bottleneck"] == "overhead"
    assert "2x the batch takes 1.10x the compute step (cached batches, no loader)" in d["evidence"]
    assert d["recommendations"][0].startswith("a larger batch")
    assert [(m["knob"], m["to"]) for m in d["moves"]] == [
        ("batch_size", "up"),
        ("compile", ["default"]),
        ("fused_optimizer", True),
    ]
    fused = advised({"dataloader_frac": 0.01, "batch2x_step_ratio": 1.1}, {**KNOBS, "fused_optimizer": True}, CPU)
    assert "fused_optimizer" not in [m["knob"] for m in fused["moves"]]  # fused already


def test_overhead_bound_when_the_gpu_idles():
    d = advised({"dataloader_frac": 0.0, "gpu_util_frac": 0.3, "gpu_compute_kernel_frac": 0.9}, KNOBS, H100)
    assert d["bottleneck"] == "overhead"
    assert "torch.compile with mode reduce-overhead (CUDA graphs) to cut per-op overhead" in d["recommendations"]


def test_compute_bound_fp32_without_tensor_cores_gets_mixed_precision():
    m = {
        "dataloader_frac": 0.0,
        "gpu_util_frac": 0.97,
        "batch2x_step_ratio": 2.0,
        "gpu_compute_kernel_frac": 0.8,
        "tensor_core_frac": 0.0,
    }
    d = advised(m, KNOBS, H100)
    assert d["bottleneck"] == "compute"
    assert "no tensor-core kernels" in d["evidence"]
    assert d["recommendations"][0] == "mixed precision (bf16-mixed, or 16-mixed with a GradScaler) for tensor cores"
    # once in bf16 with channels_last, the playbook moves on to what is left
    later = advised(m, {**KNOBS, "precision": "bf16-mixed", "channels_last": True}, H100, batch_kind="images")
    assert [mv["knob"] for mv in later["moves"]] == ["cudnn_benchmark", "compile"]
    # a language model's step: its attention kernel, padding-free rows and float8 come next
    lm = advised(m, {**KNOBS, "precision": "bf16-mixed", "attention": "eager"}, H100, batch_kind="tokens")
    assert [mv["knob"] for mv in lm["moves"]] == ["cudnn_benchmark", "compile", "padding_free", "attention", "float8"]


def test_memory_bound_when_pointwise_work_dominates():
    m = {"dataloader_frac": 0.0, "gpu_util_frac": 0.95, "gpu_compute_kernel_frac": 0.2}
    d = advised(m, KNOBS, H100, batch_kind="images")
    assert d["bottleneck"] == "memory"
    assert d["recommendations"][0] == "torch.compile to fuse pointwise ops (fewer round trips to memory)"
    assert [mv["knob"] for mv in d["moves"]] == ["compile", "precision", "channels_last", "fused_optimizer"]
    lm = advised(m, {**KNOBS, "attention": "sdpa"}, H100, batch_kind="tokens")  # sdpa already: no attention move
    assert [mv["knob"] for mv in lm["moves"]] == [
        "compile",
        "precision",
        "fused_optimizer",
        "liger_kernels",
        "padding_free",
    ]


def test_near_full_memory_is_flagged():
    m = {
        "dataloader_frac": 0.0,
        "gpu_util_frac": 0.95,
        "gpu_compute_kernel_frac": 0.9,
        "tensor_core_frac": 0.5,
        "mem_peak_reserved_gib": 76.0,
        "mem_device_gib": 79.6,
        "batch2x_oom": 1.0,
    }
    d = advised(m, {**KNOBS, "precision": "bf16-mixed"}, H100)
    assert "peak memory 76.0 of 79.6 GiB (> 90%)" in d["evidence"]
    assert "2x the batch runs out of memory: the batch is at the memory limit" in d["evidence"]
    assert d["recommendations"][-1] == "a smaller batch, activation checkpointing or mixed precision to free memory"
    assert d["moves"][-1]["to"] == "down"


def test_recommendations_are_rendered_from_the_moves_and_the_playbook_is_data():
    for bottleneck in PLAYBOOK:
        moves = playbook_moves(bottleneck, KNOBS, cuda=True)
        assert moves and all(set(mv) <= {"knob", "to", "why", "with"} for mv in moves)
        assert [render(mv) for mv in moves] == [mv["why"] for mv in moves]


def test_advice_fits_what_the_model_eats():
    import torch

    from autotune.workload import batch_kind

    tokens = {
        "input_ids": torch.randint(0, 100, (8, 16)),
        "attention_mask": torch.ones(8, 16, dtype=torch.long),
        "labels": torch.randint(0, 2, (8,)),
    }
    images = (torch.zeros(8, 3, 32, 32, dtype=torch.uint8), torch.zeros(8, dtype=torch.long))
    assert (batch_kind(tokens), batch_kind(images), batch_kind(torch.randn(8, 10))) == ("tokens", "images", "other")
    compute = {"dataloader_frac": 0.0, "gpu_util_frac": 0.95, "gpu_compute_kernel_frac": 0.9, "batch2x_step_ratio": 1.9}
    text = advised(compute, KNOBS, H100, "tokens")
    assert "channels_last" not in {m["knob"] for m in text["moves"]}
    assert not any("channels_last" in r or "uint8" in r for r in text["recommendations"])
    assert "channels_last" in {m["knob"] for m in advised(compute, KNOBS, H100, "images")["moves"]}
    loader = advised({"data_wait_frac": 0.4}, KNOBS, H100, "tokens")
    assert "tokenize ahead of time" in " ".join(loader["recommendations"]) and "uint8" not in " ".join(
        loader["recommendations"]
    )


def test_user_knobs_declared_for_the_loader_are_moves_when_input_bound():
    from autotune import knobs as K
    from autotune.decide.playbook import user_moves

    user = K.UserKnobs.of(
        {"gpu_normalize": {"safety": "safe", "stage": "loader"}, "depth": {"safety": "dynamics", "stage": "model"}}
    )
    assert [m["knob"] for m in user_moves("input", user)] == ["args.gpu_normalize"]
    assert [m["knob"] for m in user_moves("compute", user)] == ["args.depth"]
    moves = playbook_moves("input", {**KNOBS, "args.gpu_normalize": False}, cuda=True, user_knobs=user)
    assert moves[-1] == {
        "knob": "args.gpu_normalize",
        "to": "other",
        "why": "your workload argument `gpu_normalize` (declared to act on what bounds a input-bound step)",
    }


def test_communication_bound_when_the_gradient_sync_is_exposed():
    m = {
        "data_wait_frac": 0.0,
        "batch2x_step_ratio": 1.9,
        "comm_frac": 0.4,
        "step_ms_mean": 50.0,
        "step_ms_unsynced": 30.0,
    }
    d = advised(m, KNOBS, Device("cpu", 2, ranks=2))
    assert d["bottleneck"] == "communication"
    assert (
        "timed windows: gradient synchronization exposed 40% of the step (50.0 ms synced, 30.0 ms without)"
        in d["evidence"]
    )
    assert [mv["knob"] for mv in d["moves"]] == [
        "ddp_bucket_cap_mb",
        "ddp_gradient_as_bucket_view",
        "ddp_static_graph",
        "batch_size",
    ]  # fsdp_reshard: not resharding
    low = advised({**m, "comm_frac": 0.1}, KNOBS, Device("cpu", 2, ranks=2))
    assert low["bottleneck"] != "communication"


def test_capacity_bound_moves_when_2x_the_batch_runs_out_of_memory():
    m = {"data_wait_frac": 0.0, "batch2x_oom": 1.0, "cpu_compute_op_frac": 0.9}
    d = advised(m, KNOBS, CPU, batch_kind="images")
    capacity = [mv for mv in d["moves"] if mv["knob"] in ("activation_checkpointing", "sharding")]
    assert [mv["knob"] for mv in d["moves"]][-2:] == ["activation_checkpointing", "sharding"]
    # checkpointing is tried with the batch that did not fit (then alone): the chain the climb measures
    assert capacity[0]["to"] == ["selective", "full"] and capacity[0]["with"] == {"batch_size": "up"}
    assert "batch_size" not in [mv["knob"] for mv in d["moves"] if mv["to"] == "up"]
    checkpointed = advised(m, {**KNOBS, "activation_checkpointing": "full", "sharding": "fsdp"}, CPU)
    assert not {"activation_checkpointing", "sharding"} & {mv["knob"] for mv in checkpointed["moves"]}
    selective = advised(m, {**KNOBS, "activation_checkpointing": "selective"}, CPU)
    assert {"knob": "activation_checkpointing", "to": ["full"]}.items() <= next(
        mv for mv in selective["moves"] if mv["knob"] == "activation_checkpointing"
    ).items()
    # a language model's batches: the knobs that trade speed for memory, each with the batch that did not fit
    tokens = advised(m, {**KNOBS, "attention": "eager"}, Device("cuda", 8, capability=(9, 0)), batch_kind="tokens")
    freed = [mv["knob"] for mv in tokens["moves"] if mv.get("with") == {"batch_size": "up"}]
    assert freed == ["activation_checkpointing", "liger_kernels", "padding_free", "attention", "expandable_segments"]
