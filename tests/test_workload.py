import pytest

from autotune import workload as W


def test_builtins_load_and_return_workloads():
    for name in W.BUILTINS:
        wl = W.load(name)
        assert isinstance(wl, W.Workload) and wl.batch_size >= 1


@pytest.mark.parametrize(
    "ref, message",
    [
        (
            "nope",
            "workload `nope` is neither a built-in (tiny_cnn, resnet18_cifar, jpeg_pipeline, tiny_transformer) nor a factory path `pkg.module:function`",
        ),
        (
            "no_such_pkg.mod:fn",
            "workload factory `no_such_pkg.mod:fn`: cannot import `no_such_pkg.mod`: ModuleNotFoundError: "
            "No module named 'no_such_pkg'; run the search from the directory that contains `no_such_pkg` "
            "(trials import it the same way), or add that directory to PYTHONPATH",
        ),
        (
            "tests.no_such_module:fn",
            "workload factory `tests.no_such_module:fn`: cannot import `tests.no_such_module`: "
            "ModuleNotFoundError: No module named 'tests.no_such_module'; run the search from the "
            "directory that contains `tests` (trials import it the same way), or add that directory "
            "to PYTHONPATH",
        ),
        # the package imports, but something it imports is missing: no hint about the directory
        (
            "tests.workloads_broken:fn",
            "workload factory `tests.workloads_broken:fn`: cannot import `tests.workloads_broken`: "
            "ModuleNotFoundError: No module named 'a_dependency_not_installed'",
        ),
        (
            "tests.workloads:missing",
            "workload factory `tests.workloads:missing`: `tests.workloads` has no function `missing`",
        ),
        (
            "tests.workloads:not_a_workload",
            "workload factory `tests.workloads:not_a_workload` returned dict; it must return autotune.Workload",
        ),
    ],
)
def test_bad_references_say_what_is_wrong(ref, message):
    with pytest.raises(W.WorkloadError) as e:
        W.load(ref)
    assert str(e.value) == message


def test_factory_args_are_passed_and_checked():
    assert W.load("tiny_cnn", {"batch_size": 7}).batch_size == 7
    with pytest.raises(W.WorkloadError, match=r"rejected its args \{'bogus': 1\}"):
        W.load("tiny_cnn", {"bogus": 1})


def test_count_samples_handles_nested_batches():
    import torch

    wl = W.load("tiny_cnn")
    assert W.count_samples(wl, {"x": (torch.zeros(5, 2), 1)}) == 5


def test_builtin_datasets_make_the_documented_samples():
    image, label = W.load("resnet18_cifar").dataset[0]
    assert image.shape == (3, 224, 224) and image.dtype.is_floating_point
    raw, _ = W.load("resnet18_cifar", {"gpu_normalize": True}).dataset[0]
    assert raw.dtype.itemsize == 1  # uint8 on the host, normalized on the device
    yuv, _ = W.load("jpeg_pipeline").dataset[3]
    assert yuv.shape == (3, 256, 256)


def test_tiny_transformer_trains_on_dict_batches():
    """The built-in transformer: dict batches, AdamW, and a real trial of it runs
    (warm-up, timed window) with the loss going down on a repeated batch."""
    import torch

    from autotune.trial.runner import run_trial

    wl = W.load("tiny_transformer", {"batch_size": 8})
    sample = wl.dataset[0]
    assert set(sample) == {"input_ids", "labels"} and sample["input_ids"].dtype == torch.int64
    batch = torch.utils.data.default_collate([wl.dataset[i] for i in range(8)])
    assert W.count_samples(wl, batch) == 8
    torch.manual_seed(0)
    model = wl.model()
    opt = wl.build_optimizer(model.parameters())
    assert isinstance(opt, torch.optim.AdamW)
    losses = []
    for _ in range(10):
        loss = wl.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0]  # it learns (2.06 -> 1.23 in 10 steps)
    result = run_trial(
        {
            "workload": {"name": "tiny_transformer", "args": {"batch_size": 8}},
            "warmup_steps": 1,
            "measure_steps": 3,
            "min_window_s": 0,
            "max_window_s": 1,
            "profile_steps": 0,
            "diagnose": False,
            "device": "cpu",
        }
    )
    assert result.status == "ok" and result.metrics["samples_per_s"] > 0
