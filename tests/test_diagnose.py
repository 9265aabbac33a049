"""Bottleneck classes and recommendations from planted metrics."""

from autotune.diagnose import diagnose
from autotune.knobs import Device, pytorch_defaults

H100 = Device("cuda", 16, "NVIDIA H100 80GB HBM3", (9, 0))
CPU = Device("cpu", 2)
KNOBS = pytorch_defaults(32)


def test_input_bound_when_the_loader_takes_over_5_percent():
    d = diagnose({"dataloader_frac": 0.35, "gpu_util_frac": 0.3, "batch2x_step_ratio": 1.9}, KNOBS, H100)
    assert d["bottleneck"] == "input"
    assert d["evidence"][0] == "data loading takes 35.0% of the step (> 5%)"
    assert d["recommendations"][:2] == ["more DataLoader workers (num_workers=0 now)", "pin_memory=True with non_blocking copies"]


def test_overhead_bound_when_doubling_the_batch_is_nearly_free():
    d = diagnose({"dataloader_frac": 0.01, "batch2x_step_ratio": 1.1, "cpu_compute_op_frac": 0.8}, KNOBS, CPU)
    assert d["bottleneck"] == "overhead"
    assert "2x the batch takes 1.10x the step time" in d["evidence"]
    assert d["recommendations"][0].startswith("a larger batch")


def test_overhead_bound_when_the_gpu_idles():
    d = diagnose({"dataloader_frac": 0.0, "gpu_util_frac": 0.3, "gpu_compute_kernel_frac": 0.9}, KNOBS, H100)
    assert d["bottleneck"] == "overhead"
    assert "torch.compile with mode reduce-overhead (CUDA graphs) to cut per-op overhead" in d["recommendations"]


def test_compute_bound_fp32_without_tensor_cores_gets_mixed_precision():
    m = {"dataloader_frac": 0.0, "gpu_util_frac": 0.97, "batch2x_step_ratio": 2.0,
         "gpu_compute_kernel_frac": 0.8, "tensor_core_frac": 0.0}
    d = diagnose(m, KNOBS, H100)
    assert d["bottleneck"] == "compute"
    assert "no tensor-core kernels" in d["evidence"]
    assert d["recommendations"][0] == "mixed precision (bf16-mixed, or 16-mixed with a GradScaler) for tensor cores"


def test_memory_bound_when_pointwise_work_dominates():
    d = diagnose({"dataloader_frac": 0.0, "gpu_util_frac": 0.95, "gpu_compute_kernel_frac": 0.2}, KNOBS, H100)
    assert d["bottleneck"] == "memory"
    assert d["recommendations"] == ["torch.compile to fuse pointwise ops (fewer round trips to memory)"]


def test_near_full_memory_is_flagged():
    m = {"dataloader_frac": 0.0, "gpu_util_frac": 0.95, "gpu_compute_kernel_frac": 0.9, "tensor_core_frac": 0.5,
         "mem_peak_reserved_gib": 76.0, "mem_device_gib": 79.6, "batch2x_oom": 1.0}
    d = diagnose(m, {**KNOBS, "precision": "bf16-mixed"}, H100)
    assert "peak memory 76.0 of 79.6 GiB (> 90%)" in d["evidence"]
    assert "2x the batch runs out of memory: the batch is at the memory limit" in d["evidence"]
    assert d["recommendations"][-1] == "a smaller batch, activation checkpointing or mixed precision to free memory"
