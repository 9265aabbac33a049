"""Bottleneck classes, evidence and the facts the moves need, from planted metrics; the two sides measured."""

from autotune.decide.playbook import advise, render
from autotune.knobs import Device, pytorch_defaults
from autotune.trial.diagnose import diagnose

H100 = Device("cuda", 16, "NVIDIA H100 80GB HBM3", (9, 0))
CPU = Device("cpu", 2)
KNOBS = pytorch_defaults(32)


def test_the_timed_window_clears_a_profiled_reader_ratio():
    d = diagnose({"data_wait_frac": 0.01, "dataloader_frac": 0.2, "batch2x_step_ratio": 1.1}, KNOBS, CPU)
    assert d["bottleneck"] == "overhead"


def test_two_rates_decide_when_there_is_no_timed_wait():
    m = {
        "compute_ceiling_samples_per_s": 5000.0,
        "loader_samples_per_s_per_worker": 500.0,
        "batch2x_step_ratio": 1.9,
        "gpu_compute_kernel_frac": 0.9,
    }
    assert diagnose(m, {**KNOBS, "num_workers": 2}, H100)["bottleneck"] == "input"
    assert diagnose(m, {**KNOBS, "num_workers": 16}, H100)["bottleneck"] == "compute"


def test_the_diagnosis_reports_the_facts_the_moves_need_and_no_moves():
    m = {
        "data_wait_frac": 0.4,
        "compute_ceiling_samples_per_s": 10000.0,
        "loader_samples_per_s_per_worker": 1500.0,
        "host_cpus_per_gpu": 16,
        "batch2x_oom": 1.0,
        "mem_peak_reserved_gib": 76.0,
        "mem_device_gib": 79.6,
    }
    d = diagnose(m, {**KNOBS, "num_workers": 4}, H100, "images")
    assert d["bottleneck"] == "input" and "moves" not in d and "recommendations" not in d  # the search's to decide
    assert d["facts"] == {
        "cuda": True,
        "batch_kind": "images",
        "workers_needed": 8,
        "batch2x_oom": True,
        "memory_near_full": True,
    }
    cpu = {"data_wait_frac": 0.02, "batch2x_step_ratio": 1.9, "cpu_compute_op_frac": 0.56, "host_cpus_per_gpu": 8}
    assert diagnose(cpu, {**KNOBS, "num_workers": 2}, CPU)["facts"] == {"cuda": False, "threads_spare": 6}
    assert "threads_spare" not in diagnose(cpu, {**KNOBS, "num_workers": 2, "num_threads": 6}, CPU)["facts"]


# --- the two sides, measured on a real tiny model (CPU) ------------------------------


class CountingDataset:
    """A map-style dataset that counts its reads."""

    def __init__(self, inner):
        self.inner, self.reads = inner, 0

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        self.reads += 1
        return self.inner[i]


def recording(batch_size=8, model=None):
    from autotune import Workload
    from tests.workloads import Recorder, WorkerTagged, recorder_loss

    return Workload(
        model=model or Recorder, dataset=CountingDataset(WorkerTagged()), loss=recorder_loss, batch_size=batch_size
    )


def test_the_compute_side_runs_on_a_cached_batch_without_the_loader():
    import torch

    from autotune.trial import sides as S
    from autotune.trial.runner import prepare

    wl = recording()
    session = prepare(wl, pytorch_defaults(8), CPU, steps=4)
    batch = next(iter(session.loader))
    reads, before = wl.dataset.reads, [p.detach().clone() for p in session.model.parameters()]
    out = S.compute_ceiling(session, batch, min_steps=5, min_s=0.0)
    assert wl.dataset.reads == reads  # no loader
    seen = session.model.seen
    assert len(seen) == 6 and {s["batch"] for s in seen} == {8}  # one untimed step, then the window, one shape
    assert any(not torch.equal(a, b) for a, b in zip(before, session.model.parameters()))  # real training steps
    assert out["compute_ceiling_samples_per_s"] > 0 and out["compute_ceiling_step_ms"] > 0


def test_the_input_side_runs_the_loader_without_a_model_on_one_thread():
    import torch

    from autotune.trial import sides as S

    def no_model():
        raise AssertionError("the loader side must not build the model")

    wl = recording(model=no_model)
    threads = torch.get_num_threads()
    out = S.loader_rate(wl, batch_size=64, min_batches=3, min_s=0.0)
    assert torch.get_num_threads() == threads  # restored
    assert wl.dataset.reads == 4 * 32  # one untimed batch, then 3, at the probe's batch of 32
    assert out["loader_batches_per_s_per_worker"] == out["loader_samples_per_s_per_worker"] / 64


def test_a_diagnosed_trial_measures_both_sides_and_compares_them():
    from autotune.trial.runner import run_trial

    result = run_trial(
        {
            "workload": {"name": "tiny_cnn"},
            "warmup_steps": 2,
            "measure_steps": 5,
            "min_window_s": 0.2,
            "max_window_s": 1.0,
            "profile_steps": 2,
            "knobs": {"batch_size": 16, "num_threads": 1},
        }
    )
    assert result.status == "ok", result
    m = result.metrics
    assert m["compute_ceiling_samples_per_s"] > 0 and m["loader_samples_per_s_per_worker"] > 0
    assert m["host_cpus_per_gpu"] == result.device.cpus  # a CPU host: all of them
    evidence = result.diagnosis["evidence"]
    assert evidence[0].startswith("timed window: waiting on data") and evidence[1].startswith("profiled window:")
    assert any(e.startswith("two sides apart: compute ceiling") for e in evidence)
    assert "moves" not in result.diagnosis and result.diagnosis["facts"]["cuda"] is False  # the search advises
    advice = advise(result.diagnosis, result.knobs)
    assert advice["moves"] and advice["recommendations"] == [render(mv, result.knobs) for mv in advice["moves"]]
