"""Trace analysis on synthetic Chrome traces with known overlaps: exact figures."""

import math

import pytest

from autotune import stats
from autotune.trial import measure as M
from autotune.trial import trace as T


def X(name, ts, dur, cat):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 1, "tid": 1}


GPU_TRACE = {
    "traceEvents": [
        X("ProfilerStep#1", 0, 100, "user_annotation"),
        X("ProfilerStep#2", 100, 100, "user_annotation"),
        # torch >= 2.x also marks each step on the GPU timeline: not a step of its own
        # (counting them halved step_ms on an H100: "profiler overhead" read -27% to -47%)
        X("ProfilerStep#1", 10, 50, "gpu_user_annotation"),
        X("ProfilerStep#2", 150, 60, "gpu_user_annotation"),
        X("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 8, "user_annotation"),
        X("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 8, "user_annotation"),
        X("aten::mm", 0, 100, "cpu_op"),
        X("aten::relu", 100, 40, "cpu_op"),
        X("cudaLaunchKernel", 5, 7, "cuda_runtime"),
        X("cudaLaunchKernel", 145, 7, "cuda_runtime"),
        X("elementwise_kernel", 10, 30, "kernel"),
        X("vectorized_elementwise_kernel", 30, 30, "kernel"),  # overlaps the one before: counted once
        X("Memcpy HtoD (Pinned -> Device)", 60, 10, "gpu_memcpy"),
        X("Memset (Device)", 70, 5, "gpu_memset"),
        X("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 150, 20, "kernel"),
        X("reduce_kernel", 195, 15, "kernel"),  # the last step's kernel ends after the host moved on
        X("some_marker", 0, 5, "python_function"),  # not a category: ignored
        {"ph": "i", "name": "instant", "ts": 3},
    ]
}


def test_gpu_trace_figures_are_exact():
    a = T.analyze_trace(GPU_TRACE)
    total = 210  # first step start .. last kernel end
    assert a["profiled_steps"] == 2
    assert a["step_ms"] == pytest.approx(total / 2 / 1e3)
    assert a["gpu_util"] == pytest.approx(85 / total)  # [10,60) + [150,170) + [195,210)
    assert a["breakdown"] == pytest.approx(
        {
            "kernel": 85 / total,
            "memcpy": 10 / total,
            "memset": 5 / total,
            "communication": 0.0,
            "runtime": 10 / total,  # [5,10) and [145,150): the rest is under kernels
            "dataloader": 13 / total,  # [0,5) and [100,108)
            "cpu_exec": 57 / total,  # [75,100) and [108,140)
            "other": 30 / total,  # [140,145) and [170,195)
        }
    )
    assert sum(a["breakdown"].values()) == pytest.approx(1.0)
    assert a["dataloader_frac"] == pytest.approx(16 / total)  # the reader ratio counts all loader time
    assert a["tensor_core_frac"] == pytest.approx(20 / 95)
    assert a["gpu_compute_kernel_frac"] == pytest.approx(20 / 95)
    assert a["h2d_ms_per_step"] == pytest.approx(10 / 2 / 1e3)
    assert a["cpu_compute_op_frac"] == pytest.approx(100 / 140)


def test_cpu_trace_has_no_gpu_fields():
    trace = {
        "traceEvents": [
            X("ProfilerStep#0", 0, 50, "user_annotation"),
            X("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, 10, "user_annotation"),
            X("aten::convolution", 12, 20, "cpu_op"),
            X("aten::add_", 40, 5, "cpu_op"),
        ]
    }
    a = T.analyze_trace(trace)
    assert a["breakdown"] == pytest.approx({"dataloader": 0.2, "cpu_exec": 0.5, "other": 0.3})
    assert a["cpu_compute_op_frac"] == pytest.approx(20 / 25)
    assert not {"gpu_util", "tensor_core_frac", "h2d_ms_per_step"} & set(a)


def test_nccl_kernels_count_as_communication():
    trace = {
        "traceEvents": [
            X("ProfilerStep#0", 0, 100, "user_annotation"),
            X("ncclKernel_AllReduce_RING_LL_Sum_float", 0, 40, "kernel"),
            X("ampere_sgemm_128x64_nn", 20, 40, "kernel"),
        ]
    }
    b = T.analyze_trace(trace)["breakdown"]
    assert b["kernel"] == pytest.approx(0.4) and b["communication"] == pytest.approx(0.2)


def test_a_trace_without_steps_is_refused():
    with pytest.raises(ValueError, match="no ProfilerStep# spans"):
        T.analyze_trace({"traceEvents": [X("aten::mm", 0, 1, "cpu_op")]})


def test_interval_sets():
    assert T.merge([(5, 8), (0, 2), (1, 3), (8, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert T.intersect([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert T.subtract([(0, 10), (20, 30)], [(2, 4), (8, 22)]) == [(0, 2), (4, 8), (22, 30)]
    assert T.length([(0, 3), (5, 9)]) == 7


def test_mfu_only_where_the_peak_is_known():
    assert T.peak_tflops("NVIDIA H100 80GB HBM3", "bf16-mixed") == 989.4
    assert T.peak_tflops("NVIDIA H100 PCIe", "tf32") == 378.0
    assert T.peak_tflops("NVIDIA H200", "16-mixed") == 989.4
    assert T.peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert T.peak_tflops("NVIDIA L40S", "bf16-mixed") == 362.05
    assert T.peak_tflops("NVIDIA A10", "bf16-mixed") == 125.0  # not the A100's
    assert T.peak_tflops("NVIDIA GeForce RTX 3060", "bf16-mixed") is None  # not in the table: no guess
    assert T.peak_tflops("NVIDIA H100 80GB HBM3", "32-true") is None  # no single fp32 peak
    assert T.peak_tflops("cpu", "bf16-mixed") is None
    m = T.flop_metrics(1e9, 100_000, "NVIDIA A100-SXM4-80GB", "bf16-mixed")
    assert m["achieved_tflops"] == pytest.approx(100.0) and m["mfu"] == pytest.approx(100 / 312)
    assert "mfu" not in T.flop_metrics(1e9, 1000, "cpu", "32-true")


def test_window_rule_stops_on_precision_or_caps():
    rule = M.WindowRule(min_steps=10, min_s=0.0, target_ci=0.02, max_steps=100, max_s=5.0)
    steady = lambda: [10.0, 10.1, 9.9] * 10  # noqa: E731
    noisy = lambda: [5.0, 15.0] * 15  # noqa: E731
    assert not rule.done(5, 0.1, steady)  # too few steps
    assert rule.done(30, 0.1, steady)
    assert not rule.done(30, 0.1, noisy)  # +-18%: keep measuring
    assert rule.done(100, 0.1, noisy) and rule.done(30, 5.0, noisy)  # caps


def test_a_ten_step_window_is_judged_by_students_t():
    # 10 steps of 10 ms +- 0.2: the normal CI is +-1.31%, Student's t (9 df) +-1.51% (test_stats)
    times = lambda: [10.2, 9.8] * 5  # noqa: E731
    assert not M.WindowRule(min_steps=10, min_s=0.0, target_ci=0.014).done(10, 0.1, times)  # inside z, not t
    assert M.WindowRule(min_steps=10, min_s=0.0, target_ci=0.016).done(10, 0.1, times)


def test_window_rule_prunes_only_what_is_clearly_slower():
    slow = lambda: [10.0, 10.1, 9.9] * 4  # noqa: E731
    rule = M.WindowRule(min_steps=30, min_s=5.0, prune_ms=9.0)
    assert not rule.done(10, 0.1, slow) and not rule.pruned  # 10 steps in 0.1 s: the first steps, not yet a rate
    assert rule.done(500, 5.0, slow) and rule.pruned  # min_window_s run: 10 ms is clearly above 9 (before min_steps)
    close = M.WindowRule(min_steps=30, min_s=5.0, prune_ms=9.0)
    assert not close.done(500, 5.0, lambda: [5.0, 15.0] * 6) and not close.pruned  # 10 +- 3 ms: not clearly above
    assert not M.WindowRule(min_steps=30, min_s=5.0).done(10, 0.1, slow)  # no threshold: never pruned


def test_a_screening_window_stops_once_a_config_cannot_beat_the_incumbent():
    slower = lambda: [10.0, 10.1, 9.9] * 10  # noqa: E731  (10 ms +- 0.3%)
    rule = M.WindowRule(min_steps=50, min_s=1.0, target_ci=0.001, screen_ms=9.5)
    assert not rule.done(30, 0.5, slower)  # min_window_s first
    assert rule.done(30, 1.0, slower) and rule.screened and not rule.pruned  # before measure_steps: screened
    may_win = M.WindowRule(min_steps=20, min_s=1.0, target_ci=0.001, screen_ms=10.05)
    assert not may_win.done(30, 1.0, slower) and not may_win.screened  # inside its CI: the full window


def test_a_window_that_clearly_beats_the_incumbent_is_promoted_at_a_looser_ci():
    faster = lambda: [9.0, 9.5, 8.5] * 10  # noqa: E731  (9 ms +- 1.6%, 95%)

    def rule(**kw):
        return M.WindowRule(
            **{
                "min_steps": 30,
                "min_s": 1.0,
                "target_ci": 0.01,
                "screen_ms": 10.0,
                "promote_ci": 0.02,
                **kw,
            }
        )

    promoted = rule()
    assert promoted.done(30, 1.0, faster) and promoted.promoted and not promoted.screened
    early = rule()
    assert not early.done(20, 1.0, faster) and not early.done(30, 0.5, faster) and not early.promoted  # floors first
    assert not rule(promote_ci=None).done(30, 1.0, faster)  # no promotion asked: on to +-1%
    # an 11% lead takes +-2.8% (a quarter of it), a 3.3% lead (bar 9.3 ms) its floor, +-1%: +-1.6% is not enough
    assert rule(promote_ci=0.01).done(30, 1.0, faster)
    assert not rule(promote_ci=0.01, screen_ms=9.3).done(30, 1.0, faster)
    # a large lead stops at a loose CI: 7.5 ms +- 7.3% against a 10-ms bar (a 33% lead: +-8.3% will do), not
    # against an 8.5-ms one (13%: +-3.3%), though wholly below both; never looser than GAP_CI_CAP
    noisy_fast = lambda: [6.0, 9.0] * 15  # noqa: E731
    assert rule().done(30, 1.0, noisy_fast) and not rule(screen_ms=8.5).done(30, 1.0, noisy_fast)
    # the incumbent known to +-10%: 9 +- 0.15 ms is not clearly below 10 x 0.9, so no promotion; no length of
    # window can make it one (its mean is inside the incumbent's band), and it is known to better than +-10%: a tie
    loose = rule(screen_ci=0.1)
    assert loose.done(30, 1.0, faster) and loose.tied and not loose.promoted
    # nor is 10 ms clearly slower than a 9.5-ms threshold known to +-10%: no screen; a tie likewise
    slower = lambda: [10.0, 10.1, 9.9] * 10  # noqa: E731
    tie = M.WindowRule(min_steps=50, min_s=1.0, target_ci=0.001, screen_ms=9.5, screen_ci=0.1, promote_ci=0.002)
    assert not tie.done(30, 1.0, slower) and tie.done(50, 1.0, slower) and tie.tied and not tie.screened  # floors first
    assert not M.WindowRule(min_steps=50, min_s=1.0, target_ci=0.001, screen_ms=9.5, screen_ci=0.1).done(
        50, 1.0, slower
    )


def test_a_window_inside_the_incumbents_band_stops_at_the_incumbents_precision():
    """jpeg_pipeline: the incumbent known to +-7%, a window 4% faster than it ran its 30-s cap to reach +-4%.
    Reaching into that band, it stops once known as well as the incumbent; wholly outside it, or known worse, it
    runs on."""

    def rule(**kw):
        return M.WindowRule(
            **{
                "min_steps": 10,
                "min_s": 1.0,
                "target_ci": 0.02,
                "screen_ms": 10.0,
                "screen_ci": 0.07,
                "promote_ci": 0.04,
                **kw,
            }
        )

    inside = lambda: [9.3, 10.3, 8.9, 9.8] * 5  # noqa: E731  (9.6 ms +- 2.6%, 20 steps)
    assert (r := rule()).done(20, 2.0, inside) and r.tied and not (r.promoted or r.screened)
    assert not rule(screen_ci=0.02).done(20, 2.0, inside)  # a tighter incumbent: +-2.6% is not as good, on
    assert (r := rule(screen_ci=0.0)).done(20, 2.0, inside) and r.promoted and not r.tied  # no band: clearly below 10
    assert (r := rule(screen_ms=10.5)).done(20, 2.0, inside) and r.tied  # the mean below the band, its CI into it
    # wholly below the band (9.6 x 1.035 < 11 x 0.93), not yet known to a promotion's precision: a promotion may come
    assert not rule(screen_ms=11.0, promote_ci=0.02).done(20, 2.0, inside)
    assert not rule(promote_ci=None).done(20, 2.0, inside)  # no screening window: the target
    wide = lambda: [7.0, 12.0] * 10  # noqa: E731  (9.5 ms +- 12%)
    assert not rule().done(20, 2.0, wide)  # known worse than the incumbent: on


def test_on_a_cpu_a_promoted_window_stops_at_the_spread_between_processes():
    """A promoted window need not know its mean better than the spread between fresh processes
    (`stats.promote_floor`, test_stats): the next windows are compared with it to within that spread anyway."""
    between = lambda: [8.6, 10.4] * 10  # noqa: E731  (9.5 ms +- 4.5%, t): clearly below 11 ms less a 5% band

    def rule(floor):
        return M.WindowRule(
            min_steps=10,
            min_s=0.0,
            screen_ms=11.0,
            screen_ci=0.05,
            promote_ci=floor,
        )

    assert (r := rule(stats.promote_floor(0.02, "cpu"))).done(20, 2.0, between) and r.promoted
    assert not rule(stats.PROMOTE_FACTOR * 0.02).done(20, 2.0, between)  # +-4%: the window ran on


def test_a_window_of_few_slow_steps_is_pruned_on_elapsed_time():
    # the case: ~360 ms steps against a 100 ms threshold, a 4 s window (only ~11 steps fit)
    slow = lambda: [360.0, 350.0]  # noqa: E731  (too few step times for a confidence interval)
    rule = M.WindowRule(min_steps=40, min_s=1.0, max_s=4.0, prune_ms=100.0)
    assert not rule.done(2, 0.71, slow) and not rule.pruned  # 3.6x, before min_s: not yet
    assert rule.done(3, 1.07, slow) and rule.pruned  # min_s run, the mean step clearly (>1.5x) above
    one = M.WindowRule(min_steps=40, min_s=1.0, max_s=4.0, prune_ms=100.0)
    assert one.done(1, 0.45, lambda: []) and one.pruned  # one step over 4x the threshold: no need to wait
    near = M.WindowRule(min_steps=40, min_s=1.0, max_s=4.0, prune_ms=100.0)
    noisy = lambda: [60.0, 200.0] * 3  # noqa: E731  (130 ms +- a lot)
    assert not near.done(7, 1.0, noisy) and not near.pruned  # 1.3x and noisy: keep measuring
    assert near.done(31, 4.0, noisy) and not near.pruned  # the cap: still not clearly above, a complete trial
    capped = M.WindowRule(min_steps=40, min_s=1.0, max_s=4.0, prune_ms=100.0)
    assert capped.done(31, 4.0, lambda: [125.0, 126.0, 124.0] * 10) and capped.pruned  # at the cap: 125 +- 0.3 ms


def test_a_clearly_slow_trial_is_pruned_early_and_skips_profile_diagnosis_and_parity(tmp_path):
    from autotune import knobs as K
    from autotune.trial.runner import run_trial

    baseline = K.pytorch_defaults(16)
    result = run_trial(
        {
            "workload": {"factory": "tests.workloads:make_slow_large_batches", "args": {"sleep_s": 0.3}},
            "knobs": {"batch_size": 64, "channels_last": True, "num_threads": 1},
            "warmup_steps": 1,
            "measure_steps": 40,
            "min_window_s": 1.0,
            "max_window_s": 4.0,
            "profile_steps": 2,
            "diagnose": True,
            "prune_below": 64 / 0.1,  # 100 ms a step; this config takes ~300 ms
            "parity": {"baseline": baseline, "steps": 5, "tolerance": 0.05},
        }
    )
    assert result.status == "pruned", result.error
    m = result.metrics
    assert m["window_steps"] <= 5 and 1.0 <= m["window_s"] < 2.0  # stopped once min_window_s had run
    assert m["step_ms_mean"] > 250 and m["samples_per_s"] < 64 / 0.25  # its throughput is measured
    assert not {"profile", "diagnosis", "parity"} & set(result.to_dict()) and "batch2x_step_ratio" not in m


def _clocked(rule):
    """A Window started on a clock of its own: (the window, the clock's [now] to move)."""
    now = [0.0]
    window = M.Window(rule, "cpu", lambda: None)
    window.clock = lambda: now[0]
    window.start()
    return window, now


def _fed(step_ms, rule):
    """A Window fed steps of these durations (a clock of its own), until its rule ends it."""
    window, now = _clocked(rule)
    for ms in step_ms:
        now[0] += ms / 1e3
        window.step_done(2, ms / 1e4)  # 2 samples, a tenth of the step waiting
        if window.done():
            break
    return window, window.finish()


def jitter(i: int) -> float:
    return 1 + 0.03 * math.sin(i * 1.7)  # +-3%, deterministic


def test_a_window_whose_step_time_still_falls_goes_on_until_it_settles():
    """hf_bert's baseline kept speeding up for ~100 steps past its warm-up: its window read 20% slow. A step of
    20 ms falling to 10 ms over 60 steps, then 10 ms: the first halves still falling join the warm-up, and
    the window's mean is the settled step's (the trial's defaults: 10 steps, 1 s, +-2%; without, ~13.7 ms)."""
    falling = [(max(10.0, 20 - i / 6)) * jitter(i) for i in range(400)]
    rule = M.WindowRule(min_steps=10, min_s=1.0, target_ci=0.02, max_steps=400, max_s=30.0)
    window, m = _fed(falling, rule)
    assert m["warmup_extended_steps"] >= 30 and m["warmup_extended_s"] > 0
    assert m["step_ms_mean"] == pytest.approx(10.0, rel=0.06)
    assert m["samples_per_s"] == pytest.approx(2 / m["step_ms_mean"] * 1e3)  # the window's own steps' samples
    assert m["data_wait_frac"] == pytest.approx(0.1, rel=0.01)
    assert m["window_steps"] + m["warmup_extended_steps"] <= 400


def test_a_settled_window_is_not_extended_and_the_caps_count_from_its_first_start():
    steady = [10.0 * jitter(i) for i in range(400)]
    _, m = _fed(steady, M.WindowRule(min_steps=10, min_s=1.0, target_ci=0.02, max_steps=400, max_s=30.0))
    assert "warmup_extended_steps" not in m and 100 <= m["window_steps"] <= 110  # 1 s of 10-ms steps
    forever = [100.0 * 0.97**i for i in range(400)]  # falls all the way: not a warm-up; ends at its step cap
    rule = M.WindowRule(min_steps=10, min_s=0.0, target_ci=0.0, max_steps=120, max_s=30.0)
    _, m = _fed(forever, rule)
    assert m["window_steps"] == 120 and m["window_unsettled"] == 1.0 and "warmup_extended_steps" not in m


def test_a_program_that_ends_after_a_half_was_held_out_gets_it_back_where_the_rest_is_short():
    """CI saw an HF script's trial (60 steps, tiny steps on a slow hour) end in error: its window had held out 40
    steps as still warming and the 18 left were short of min_window_s. The program's end is a cap: the held half
    comes back, and the window meets its floors on every step it timed."""
    falling = [(max(10.0, 20 - i / 6)) * jitter(i) for i in range(400)]
    rule = M.WindowRule(min_steps=10, min_s=1.0, target_ci=0.02, max_steps=400, max_s=30.0)
    window, now = _clocked(rule)
    for ms in falling:
        now[0] += ms / 1e3
        window.step_done(2)
        assert not window.done()
        if window.dropped_steps:  # a half held out, the rest short of 1 s: here the program's loop ends
            break
    held, kept = window.dropped_steps, window.steps
    assert held > 0 and window.all_steps == held + kept and now[0] - window.marks[0] < 1.0
    assert window.program_ended(min_steps=10, min_s=1.0)  # every step back: 1 s of them
    assert window.steps == held + kept and window.dropped_steps == 0
    assert window.finish()["window_unsettled"] == 1.0
    short, now = _clocked(rule)
    now[0] += 0.05
    short.step_done(2)
    assert not short.program_ended(min_steps=10, min_s=1.0) and short.all_steps == 1


def test_a_step_time_that_falls_in_cycles_is_not_a_warm_up_and_the_whole_window_counts():
    """group_by_length: each megabatch's batches longest first, a cycle of 50 steps falling from 20 to 10 ms.
    Holding out the falling halves kept a cycle's cheap end (748 samples/s against 395-598): after
    WARM_DROPS_MAX halves, or at the caps, the held steps are given back."""
    cycles = [20.0 - (i % 50) / 5 for i in range(3000)]
    long = M.WindowRule(min_steps=10, min_s=1.0, target_ci=0.02, max_steps=3000, max_s=30.0)
    _, m = _fed(cycles, long)
    assert m["step_ms_mean"] == pytest.approx(15.0, rel=0.03) and m["window_steps"] >= 300  # many whole cycles
    capped = M.WindowRule(min_steps=10, min_s=1.0, target_ci=0.02, max_steps=3000, max_s=3.0)
    _, m = _fed(cycles, capped)  # a half held out, then the cap: the held steps given back
    assert m["window_unsettled"] == 1.0 and "warmup_extended_steps" not in m
    assert m["step_ms_mean"] == pytest.approx(15.0, rel=0.05)


def test_a_step_that_compiles_is_warm_up_and_the_window_never_includes_it():
    """A recompile in the window (a new shape, a graph break's new frame): the steps up to it leave the window
    for good, and the window starts again after it. Dynamo compiles for real here (its eager backend: the
    frame is traced and accounted as inductor's would be, without C++), at the window's 15th step."""
    import torch

    from autotune.trial.compiled import compile_seconds

    now, before = [0.0], compile_seconds()
    rule = M.WindowRule(min_steps=10, min_s=0.5, target_ci=0.02, max_steps=400, max_s=30.0)
    window = M.Window(rule, "cpu", lambda: None)
    window.clock = lambda: now[0]
    window.start()
    for i in range(400):
        if i == 14:  # this step compiles: 200 ms of it in the window would read ~2% slow over 1 s
            torch.compile(lambda x: torch.sin(x) + 1, backend="eager")(torch.ones(3))
            now[0] += 0.2
        now[0] += 0.01 * jitter(i)
        window.step_done(2)
        if window.done():
            break
    m = window.finish()
    assert compile_seconds() > before and m["compile_s"] == pytest.approx(compile_seconds())
    assert m["window_recompiled_steps"] == 15 and m["window_recompiled_s"] == pytest.approx(0.35, rel=0.1)
    assert m["step_ms_mean"] == pytest.approx(10.0, rel=0.05) and m["step_ms_max"] < 15  # the compile is not in it
