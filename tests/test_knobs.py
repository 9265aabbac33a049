"""Each knob, applied for real by the trial's `prepare`, shows its effect."""

import pytest
import torch
from torch import nn

from autotune import knobs as K
from autotune.trial.runner import prepare
from tests.workloads import make_model_bound_optimizer, make_recording, make_with_optimizer

CPU = K.Device("cpu", 2)


def run_steps(n=2, workload=None, **overrides):
    knobs = {**K.pytorch_defaults(8), **overrides}
    session = prepare(workload or make_recording(), knobs, CPU, steps=n)
    batches = iter(session.loader)
    for _ in range(n):
        session.step(next(batches))
    return session


@pytest.fixture(autouse=True)
def restore_flags():
    yield
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")


def test_num_workers_loads_batches_in_worker_processes():
    session = run_steps(num_workers=2)
    assert session.loader.num_workers == 2
    worker_ids = {int(w) for _, _, ids in session.loader for w in ids}
    assert worker_ids <= {0, 1} and worker_ids


def test_num_workers_zero_loads_in_the_main_process():
    session = run_steps(num_workers=0)
    assert {int(w) for _, _, ids in session.loader for w in ids} == {-1}


def test_pin_memory_reaches_the_dataloader():
    assert run_steps(pin_memory=True).loader.pin_memory is True
    assert run_steps(pin_memory=False).loader.pin_memory is False


def test_batch_size_is_what_forward_sees():
    session = run_steps(batch_size=16)
    assert session.loader.batch_size == 16
    assert {s["batch"] for s in session.model.seen} == {16}


def test_bf16_autocast_is_active_inside_forward():
    seen = run_steps(precision="bf16-mixed").model.seen
    assert all(s["autocast"] and s["autocast_dtype"] == torch.bfloat16 for s in seen)


def test_fp32_runs_without_autocast():
    assert not any(s["autocast"] for s in run_steps(precision="32-true").model.seen)
    assert torch.get_float32_matmul_precision() == "highest"


def test_tf32_sets_matmul_precision():
    K.apply_backend_flags({**K.pytorch_defaults(8), "precision": "tf32"})
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cudnn.allow_tf32


def test_fp16_gets_a_grad_scaler_and_others_none():
    assert isinstance(K.grad_scaler({"precision": "16-mixed"}, "cuda"), torch.amp.GradScaler)
    assert K.grad_scaler({"precision": "bf16-mixed"}, "cpu") is None


def test_set_to_none_leaves_no_grads_after_the_step():
    session = run_steps(set_to_none=True)
    assert all(p.grad is None for p in session.model.parameters())


def test_set_to_none_off_leaves_zeroed_grads():
    session = run_steps(set_to_none=False)
    grads = [p.grad for p in session.model.parameters()]
    assert all(g is not None and torch.count_nonzero(g) == 0 for g in grads)


def test_channels_last_converts_weights_and_inputs():
    session = run_steps(channels_last=True)
    weight = session.model.conv.weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    assert all(s["channels_last"] for s in session.model.seen)


def test_contiguous_by_default():
    session = run_steps(channels_last=False)
    assert session.model.conv.weight.is_contiguous()
    assert not any(s["channels_last"] for s in session.model.seen)


def test_cudnn_benchmark_flag_is_set():
    run_steps(cudnn_benchmark=True)
    assert torch.backends.cudnn.benchmark is True
    run_steps(cudnn_benchmark=False)
    assert torch.backends.cudnn.benchmark is False


@pytest.mark.slow  # inductor's C++ build, ~25 s on 2 cores; in CI: test_report's load_config wraps the model
@pytest.mark.timeout(240)
def test_compile_wraps_the_model_and_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    session = run_steps(n=2, compile="default")
    assert isinstance(session.model, torch._dynamo.eval_frame.OptimizedModule)
    assert session.model._orig_mod.seen  # forward ran (traced, then compiled)


def test_resolve_space_on_cpu_fixes_gpu_only_knobs_and_says_why():
    lists = {
        "pin_memory": [False, True],
        "cudnn_benchmark": [False, True],
        "precision": ["32-true", "tf32", "bf16-mixed", "16-mixed"],
        "compile": ["none", "reduce-overhead"],
        "num_workers": [0, 2, 8],
        "batch_size": [64, 128],
    }
    space = K.resolve_space(lists, K.pytorch_defaults(32), CPU)
    assert space.search == {"precision": ["32-true", "bf16-mixed"], "num_workers": [0, 2], "batch_size": [32, 64, 128]}
    assert space.fixed["pin_memory"] == "pinned memory only speeds host-to-GPU copies; no CUDA device"
    assert space.fixed["cudnn_benchmark"] == "cuDNN runs only on CUDA devices; no CUDA device"
    assert space.fixed["compile"] == "reduce-overhead captures CUDA graphs; no CUDA device"
    assert space.fixed["set_to_none"] == "not in the search space"
    assert "num_workers=8: only 2 CPUs per trial host" in space.dropped


def test_resolve_space_on_a_gpu_keeps_them():
    lists = {"pin_memory": [False, True], "precision": ["32-true", "tf32", "16-mixed"]}
    space = K.resolve_space(lists, K.pytorch_defaults(32), K.Device("cuda", 8, "H100", (9, 0)))
    assert space.search == {"pin_memory": [False, True], "precision": ["32-true", "tf32", "16-mixed"]}
    old = K.resolve_space(
        {"precision": ["32-true", "bf16-mixed"]}, K.pytorch_defaults(32), K.Device("cuda", 8, "V100", (7, 0))
    )
    assert old.fixed["precision"] == "bf16-mixed needs compute capability >= 8.0 (this GPU: 7.0)"


def test_a_language_models_knob_asked_for_must_run_here_where_a_presets_value_is_dropped():
    asked = {"attention": ["sdpa", "flash_attention_2"], "num_workers": [64]}  # workers: dropped, as ever
    assert K.asked(asked, CPU) == (
        "search_space.knobs.attention: flash_attention_2 cannot run here: FlashAttention is CUDA only; no CUDA "
        "device; here it runs eager, sdpa: ask for those, or leave attention out (the lm preset tries what runs)"
    )
    assert K.asked({"liger_kernels": [True]}, CPU).startswith("search_space.knobs.liger_kernels: true cannot run")
    assert K.asked({"attention": ["eager", "sdpa"], "padding_free": [False, True]}, CPU) is None
    space = K.resolve_space(asked, K.pytorch_defaults(32), CPU)  # the same values from a preset: dropped, said why
    assert space.search["attention"] == [None, "sdpa"]
    assert "attention='flash_attention_2': FlashAttention is CUDA only; no CUDA device" in space.dropped


def test_unavailable_baseline_value_falls_back_to_pytorch_default():
    baseline = {**K.pytorch_defaults(32), "pin_memory": True}
    space = K.resolve_space({}, baseline, CPU)
    assert space.baseline["pin_memory"] is False
    assert space.dropped[0].startswith("baseline pin_memory=True: pinned memory only speeds")


# --- the registry: one place per knob, everything else derived ------------------------


def test_every_knob_is_in_the_spec_the_loader_the_report_and_the_cells():
    from autotune import spec as S
    from autotune.safety.parity import PARITY_KNOBS
    from autotune.cli.report import short

    for name, knob in K.KNOBS.items():
        assert name in S.KnobSettings.model_fields and name in S.KnobLists.model_fields
        assert knob.stage in K.STAGES and knob.safety in K.SAFETY_CLASSES and short(name) == knob.label
        assert set(knob.bottlenecks) <= set(K.BOTTLENECKS)
        assert (name in PARITY_KNOBS) == knob.numerics  # what can change the loss is checked for loss parity
        assert knob.unavailable(knob.pytorch_default, CPU) is None  # PyTorch's default runs anywhere
        if knob.stage == "loader":
            assert knob.kwarg in K.loader_kwargs({**K.pytorch_defaults(8), "num_workers": 1, "prefetch_factor": 2})
        for value in {knob.pytorch_default, *(knob.choices or ())}:
            assert K.from_cell(name, K.to_cell(value)) == value


def test_num_threads_sets_torch_threads_and_null_leaves_torch_default():
    default = torch.get_num_threads()
    try:
        run_steps(num_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(default)
    run_steps(num_threads=None)
    assert torch.get_num_threads() == default


def test_prefetch_factor_and_persistent_workers_reach_the_dataloader():
    session = run_steps(num_workers=1, prefetch_factor=4, persistent_workers=True)
    assert (session.loader.prefetch_factor, session.loader.persistent_workers) == (4, True)
    assert run_steps(num_workers=0).loader.prefetch_factor is None  # torch's own default


def test_prefetch_and_persistent_workers_need_workers():
    base = K.pytorch_defaults(32)
    assert K.conflicts({**base, "prefetch_factor": 4}) == ["prefetch_factor=4: needs loader workers (num_workers > 0)"]
    assert K.conflicts({**base, "num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}) == []
    # with the workers fixed at 0 the values can never run: left out of the space, with the reason
    space = K.resolve_space({"prefetch_factor": [2, 4], "persistent_workers": [False, True]}, base, CPU)
    assert space.search == {} and space.fixed["prefetch_factor"] == "needs loader workers (num_workers > 0)"
    # with workers searched they stay, and the space says which combinations cannot run
    space = K.resolve_space({"num_workers": [0, 1], "prefetch_factor": [2, 4]}, base, CPU)
    assert space.search["prefetch_factor"] == [None, 2, 4]
    assert space.conflicts({"num_workers": 0, "prefetch_factor": 2}) and not space.conflicts(
        {"num_workers": 1, "prefetch_factor": 2}
    )


def test_cuda_graphs_need_gradients_set_to_none():
    """Measured on the H100 classic search: reduce-overhead with zero_grad(set_to_none=False)
    raised 'accessing tensor output of CUDAGraphs that has been overwritten'."""
    h100, base = K.Device("cuda", 16, "H100", (9, 0)), K.pytorch_defaults(32)
    (why,) = K.conflicts({**base, "compile": "reduce-overhead", "set_to_none": False})
    assert why.startswith("set_to_none=False: compile=reduce-overhead keeps the gradients in CUDA graph memory")
    assert K.conflicts({**base, "compile": "default", "set_to_none": False}) == []
    space = K.resolve_space({"compile": ["none", "reduce-overhead"], "set_to_none": [False, True]}, base, h100)
    assert space.search["compile"] == ["none", "reduce-overhead"] and space.search["set_to_none"] == [False, True]
    assert space.conflicts({"compile": "reduce-overhead", "set_to_none": False})
    assert not space.conflicts({"compile": "reduce-overhead", "set_to_none": True})


def test_user_knobs_resolve_with_their_declared_class():
    base = {**K.pytorch_defaults(32), "args.gpu_normalize": False}
    space = K.resolve_space(
        {"args.gpu_normalize": [False, True], "args.size": [32, 64]},
        {**base, "args.size": 32},
        CPU,
        allowed_classes={"safe", "numerics", "reproducibility"},
        user={"gpu_normalize": {"safety": "safe", "stage": "loader"}, "size": {"safety": "dynamics", "stage": None}},
    )
    assert space.search == {"args.gpu_normalize": [False, True]}  # `size` is dynamics (the default): not at this level
    assert "a dynamics knob" in space.fixed["args.size"]
    user = K.UserKnobs.of(space.user)
    assert user.lookup("args.gpu_normalize").safety == "safe" and user.lookup("args.gpu_normalize").bottlenecks == (
        "input",
    )
    assert K.workload_args({"num_workers": 0, "args.gpu_normalize": True}) == {"gpu_normalize": True}


# --- fused_optimizer: the workload's optimizer rebuilt with fused=True ------------------


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_fused_optimizer_takes_the_same_step_with_a_fused_kernel(name):
    plain = run_steps(n=3, workload=make_with_optimizer(name))
    fused = run_steps(n=3, workload=make_with_optimizer(name), fused_optimizer=True)
    assert type(fused.optimizer) is type(plain.optimizer)
    assert all(g["fused"] is True and g["foreach"] is None for g in fused.optimizer.param_groups)
    assert not any(g["fused"] for g in plain.optimizer.param_groups)
    assert fused.optimizer.defaults["lr"] == plain.optimizer.defaults["lr"]  # the user's hyper-parameters
    start = make_with_optimizer(name)
    torch.manual_seed(0)
    initial = start.model().state_dict()
    for p, q, p0 in zip(fused.model.parameters(), plain.model.parameters(), initial.values()):
        assert not torch.equal(p, p0)  # 3 real steps moved the weights
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)  # as the unfused optimizer moves them


def test_fuse_optimizer_keeps_groups_and_state():
    model = torch.nn.Linear(4, 2)
    adam = torch.optim.Adam(
        [{"params": [model.weight], "lr": 0.1}, {"params": [model.bias]}], lr=0.01, betas=(0.8, 0.9)
    )
    model(torch.randn(3, 4)).sum().backward()
    adam.step()
    fused = K.fuse_optimizer(adam)
    assert [g["lr"] for g in fused.param_groups] == [0.1, 0.01] and fused.param_groups[1]["betas"] == (0.8, 0.9)
    assert fused.param_groups[0]["params"][0] is model.weight
    assert torch.equal(fused.state[model.weight]["exp_avg"], adam.state[model.weight]["exp_avg"])
    assert K.fuse_optimizer(fused) is fused  # already fused: as it is
    fused.step()  # the fused kernel runs on the carried state
    assert float(fused.state[model.weight]["step"]) == 2


def test_an_optimizer_torch_cannot_fuse_is_dropped_with_the_reason():
    for name, cls in (("rmsprop", "RMSprop"), ("lbfgs", "LBFGS")):
        device = K.Device("cpu", 2, optimizer=K.optimizer_of(make_with_optimizer(name)))
        assert device.optimizer == f"torch.optim.{name}:{cls}"
        space = K.resolve_space({"fused_optimizer": [False, True]}, K.pytorch_defaults(8), device)
        why = (
            f"the workload's optimizer {cls} has no fused implementation in torch {torch.__version__} "
            "(torch.optim has one for Adagrad, Adam, AdamW, SGD)"
        )
        assert space.fixed["fused_optimizer"] == why and f"fused_optimizer=True: {why}" in space.dropped
        with pytest.raises(ValueError, match=f"torch.optim.{name}.{cls} has no fused implementation"):
            run_steps(workload=make_with_optimizer(name), fused_optimizer=True)
    # an optimizer that wants its own model's parameters is known from a model built for it
    assert K.optimizer_of(make_model_bound_optimizer()) == "torch.optim.rmsprop:RMSprop"
    adamw = K.Device("cpu", 2, optimizer=K.optimizer_of(make_with_optimizer("adamw")))
    space = K.resolve_space({"fused_optimizer": [False, True]}, K.pytorch_defaults(8), adamw)
    assert space.search == {"fused_optimizer": [False, True]}


def test_a_trial_of_an_optimizer_torch_cannot_fuse_says_why():
    from autotune.trial.runner import check_config, run_trial

    config = check_config(
        {
            "workload": {"factory": "tests.workloads:make_with_optimizer", "args": {"optimizer": "rmsprop"}},
            "knobs": {"fused_optimizer": True},
            "device": "cpu",
        }
    )
    result = run_trial(config)
    assert result.status == "error" and result.error_type == "TrialConfigError"
    assert result.error.startswith(
        "knobs.fused_optimizer=True cannot apply on cpu: the workload's optimizer RMSprop has no fused implementation"
    )


def test_loading_another_runs_state_keeps_the_fused_kernel():
    plain = run_steps(n=2, workload=make_with_optimizer("adamw"))
    fused = run_steps(n=1, workload=make_with_optimizer("adamw"), fused_optimizer=True)
    K.load_optimizer_state(fused.optimizer, plain.optimizer.state_dict())  # loss parity resets the candidate so
    assert all(g["fused"] for g in fused.optimizer.param_groups)
    assert float(next(iter(fused.optimizer.state.values()))["step"]) == 2


@pytest.mark.parametrize("load", ["load_optimizer_state", "fuse_optimizer"])
def test_state_from_a_run_without_channels_last_is_laid_out_like_the_parameters(load):
    """torch's fused CPU SGD updates wrongly when a momentum buffer's layout is not
    its parameter's (a contiguous run's state loaded into a channels_last model:
    1.18 relative update error measured). Loaded state is laid out as a fresh run
    lays it out, and the fused step then matches the unfused one."""
    import copy

    def model(channels_last):
        torch.manual_seed(0)
        m = nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)
        )
        return m.to(memory_format=torch.channels_last) if channels_last else m

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 12, 12, generator=g), torch.randint(0, 4, (8,), generator=g)
    base = model(False)
    opt = torch.optim.SGD(base.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        nn.functional.cross_entropy(base(x), y).backward()
        opt.step()
        opt.zero_grad()

    def update(fused):
        m = model(True)
        m.load_state_dict(base.state_dict())
        o = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        if load == "fuse_optimizer":  # state loaded by the user, then the config's prepare fuses
            o.load_state_dict(copy.deepcopy(opt.state_dict()))
            o = K.prepare_optimizer(o, {"fused_optimizer": fused})
        else:  # loss parity: the candidate reset to the baseline's state
            o = K.prepare_optimizer(o, {"fused_optimizer": fused})
            K.load_optimizer_state(o, copy.deepcopy(opt.state_dict()))
        before = [p.detach().clone() for p in m.parameters()]
        nn.functional.cross_entropy(m(x.to(memory_format=torch.channels_last)), y).backward()
        o.step()
        conv = next(iter(m.parameters()))
        assert o.state[conv]["momentum_buffer"].stride() == conv.stride() or not fused  # unfused: as loaded
        return [p.detach() - b for p, b in zip(m.parameters(), before)]

    for a, b in zip(update(False), update(True)):
        assert (a - b).abs().max() <= 1e-5 * a.abs().max()


def test_blocks_are_the_repeated_class_holding_the_most_parameters():
    from torchvision.models import resnet18

    from autotune import knobs as K
    from trials.tiny_cnn import tiny_cnn
    from trials.tiny_transformer import TinyTransformer

    assert {type(b).__name__ for b in K.find_blocks(TinyTransformer())} == {"TransformerEncoderLayer"}
    assert len(K.find_blocks(TinyTransformer(layers=3))) == 3
    assert {type(b).__name__ for b in K.find_blocks(resnet18())} == {"BasicBlock"}
    assert K.find_blocks(tiny_cnn()) == []
    assert len(K.find_blocks(TinyTransformer(), ["LayerNorm"])) == 5  # named: 2 per layer and the final norm


def test_keep_effective_batch_lets_the_micro_batch_grow_as_the_accumulation_shrinks():
    """A program's baseline of 2 x 4 (micro-batch x its own accumulation, issue 62): 4 x 2 and 8 x 1 keep its
    effective batch of 8; before, only divisors of its micro-batch of 2 were tried."""
    lists = {"batch_size": [1, 2, 4, 8, 16, 32]}
    space = K.resolve_space(lists, {"batch_size": 2}, K.Device("cpu", 2), keep_effective_batch=True, accumulation=4)
    assert space.search["batch_size"] == [1, 2, 4, 8] and space.accumulation == 4
    assert (
        "batch_size=16: keep_effective_batch: a micro-batch must divide the baseline's effective batch 2 x 4 "
        "accumulated" in space.dropped
    )
    alone = K.resolve_space(lists, {"batch_size": 2}, K.Device("cpu", 2), keep_effective_batch=True)
    assert alone.search["batch_size"] == [1, 2] and alone.accumulation == 1
