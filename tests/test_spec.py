"""Spec errors name the field path and what is allowed; the plan a spec is read into."""

from pathlib import Path

import pytest
import yaml

from autotune import knobs as K
from autotune import spec as S
from autotune.plan import SearchPlan
from autotune.trial.request import PerTrial

WL = {"workload": {"name": "tiny_cnn"}}


def error_of(data) -> str:
    with pytest.raises(S.SpecError) as e:
        S.parse(data, "s.yaml")
    return str(e.value)


def test_minimal_spec_gets_embedded_defaults():
    spec = S.parse(WL, "runs/my-search.yaml")
    assert spec.name == "my-search"
    assert spec.search.sampler == "autotune" and spec.search.n_trials is None and spec.search.patience is None
    assert spec.search_space.preset == "default"
    assert spec.resources.ray_address is None and spec.tracking.uri is None
    # every built-in knob that acts within a single-rank trial (persistent_workers only between epochs); the
    # multi-rank knobs and checkpointing (a model with repeated blocks) are named in a spec (examples/ddp_cpu.yaml),
    # a language model's in the lm preset (search_spaces/lm.yaml)
    multi_rank = {
        "ddp_bucket_cap_mb",
        "ddp_gradient_as_bucket_view",
        "ddp_static_graph",
        "sharding",
        "fsdp_reshard_after_forward",
        "activation_checkpointing",
    }
    lm = {"attention", "padding_free", "packing", "liger_kernels", "float8", "expandable_segments"}
    assert set(spec.search_space.lists()) == set(K.KNOBS) - {"persistent_workers"} - multi_rank - lm


def plan(tmp_path, **sections) -> SearchPlan:
    return SearchPlan.of(S.parse({**WL, "output_dir": str(tmp_path / "run"), **sections}, "runs/x.yaml"))


def test_the_window_step_floor_is_the_strategys_unless_the_spec_names_one(tmp_path):
    def floor(**sections) -> int:
        knobs = {**K.pytorch_defaults(None), "batch_size": 32}
        return plan(tmp_path, **sections).trial_settings("cpu", knobs).config(knobs)["measure_steps"]

    assert S.parse(WL, "runs/x.yaml").trial.measure_steps is None
    assert floor() == 10  # min_window_s and the CI do the rest (scripts/bench/bench_window.py)
    assert floor(trial={"measure_steps": 40}) == 40
    knobs = {**K.pytorch_defaults(None), "batch_size": 32}
    assert plan(tmp_path).trial_settings("cpu", knobs).config(knobs)["warmup_min_s"] == 1.0  # warm by time on a CPU


def test_strategy_v2_is_noted_and_v1_is_refused_in_one_line(capsys):
    """search.strategy left the spec: autotune searches one way (what v2 was)."""
    spec = S.parse({**WL, "search": {"strategy": "v2", "n_trials": 5}}, "runs/x.yaml")
    assert spec.search.n_trials == 5 and "strategy" not in spec.model_dump()["search"]
    assert (
        capsys.readouterr().err == "note: runs/x.yaml: search.strategy: v2 is how autotune searches now; "
        "the line can go\n"
    )
    with pytest.raises(S.SpecError) as e:
        S.parse({**WL, "search": {"strategy": "v1"}}, "runs/x.yaml")
    assert str(e.value) == (
        "runs/x.yaml: search.strategy: `v1` is gone; autotune searches one way (what v2 was): remove the line"
    )


def test_the_anchor_of_a_v2_search_is_measured_to_the_promoted_windows_floor(tmp_path):
    from autotune.stats import PROCESS_SPREAD, PROMOTE_FACTOR

    knobs = {**K.pytorch_defaults(None), "batch_size": 32}
    settings = plan(tmp_path, trial={"target_ci": 0.06}).trial_settings("cpu", knobs)
    assert settings.config(knobs)["target_ci"] == 0.06
    assert settings.config(knobs, PerTrial(anchor=True))["target_ci"] == pytest.approx(PROMOTE_FACTOR * 0.06)
    # a tight target: never tighter than the spread between fresh processes on a CPU (none assumed on a GPU)
    tight = plan(tmp_path, trial={"target_ci": 0.01})
    assert tight.trial_settings("cpu", knobs).config(knobs, PerTrial(anchor=True))["target_ci"] == PROCESS_SPREAD["cpu"]
    assert (
        tight.trial_settings("cuda", knobs).config(knobs, PerTrial(anchor=True))["target_ci"] == PROMOTE_FACTOR * 0.01
    )


def test_inline_knobs_override_the_preset():
    spec = S.parse({**WL, "search_space": {"preset": "quick", "knobs": {"batch_size": [8, 16]}}})
    lists = spec.search_space.lists()
    assert lists["batch_size"] == [8, 16] and lists["num_workers"] == [0, 1, 2]


def test_preset_shorthand_and_no_preset():
    assert S.parse({**WL, "search_space": "safe"}).search_space.preset == "safe"
    spec = S.parse({**WL, "search_space": {"preset": None, "knobs": {"channels_last": [True, False]}}})
    assert spec.search_space.lists() == {"channels_last": [True, False]}


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"workload": {"name": "x"}},
            "s.yaml: workload.name: `x` is not a built-in workload; built-ins: tiny_cnn, resnet18_cifar, jpeg_pipeline, tiny_transformer",
        ),
        ({"workload": {"factory": "foo"}}, "s.yaml: workload.factory: `foo` is not of the form `pkg.module:function`"),
        (
            {"workload": {}},
            "s.yaml: workload: give exactly one of `name` (built-in), `factory` (pkg.module:function) "
            "or `command` (your own program)",
        ),
        ({}, "s.yaml: workload: required, missing"),
        (
            {**WL, "serch": {}},
            "s.yaml: (top level): unknown key `serch`; allowed: name, workload, baseline, search_space, trial, search, resources, tracking, safety, output_dir",
        ),
        (
            {**WL, "search": {"sampler": "bayes"}},
            "s.yaml: search.sampler: Input should be 'autotune', 'tpe', 'random' or 'grid', got 'bayes'",
        ),
        (
            {**WL, "search": {"n_trials": 0}},
            "s.yaml: search.n_trials: Input should be greater than or equal to 1, got 0",
        ),
        (
            {**WL, "baseline": {"num_workers": "2"}},
            "s.yaml: baseline.num_workers: Input should be a valid integer, got '2'",
        ),
        (
            {**WL, "baseline": {"precision": "fp16"}},
            "s.yaml: baseline.precision: Input should be '32-true', 'tf32', 'bf16-mixed' or '16-mixed', got 'fp16'",
        ),
        (
            {**WL, "search_space": "nope"},
            "s.yaml: search_space.preset: unknown preset `nope`; presets: default, lm, quick, safe",
        ),
        (
            {**WL, "search_space": {"knobs": {"batch_size": []}}},
            "s.yaml: search_space.knobs.batch_size: must not be empty; leave the knob out to keep its baseline value",
        ),
        (
            {**WL, "search_space": {"knobs": {"num_workers": [-1, 2]}}},
            "s.yaml: search_space.knobs.num_workers: values must be >= 0, got [-1, 2]",
        ),
        (
            {**WL, "search_space": {"knobs": {"compile": ["fast"]}}},
            "s.yaml: search_space.knobs.compile.0: Input should be 'none', 'default', 'reduce-overhead' or 'max-autotune', got 'fast'",
        ),
        (
            {**WL, "trial": {"measure_steps": 1}},
            "s.yaml: trial.measure_steps: Input should be greater than or equal to 2, got 1",
        ),
        ([1, 2], "s.yaml: the spec must be a YAML mapping with at least `workload`, got list"),
    ],
)
def test_errors_name_the_field_and_what_is_allowed(data, message):
    assert error_of(data) == message


def test_several_errors_are_all_listed():
    msg = error_of({**WL, "search": {"sampler": "bayes", "seed": "x"}})
    assert msg.splitlines() == [
        "s.yaml: search.sampler: Input should be 'autotune', 'tpe', 'random' or 'grid', got 'bayes'",
        "  search.seed: Input should be a valid integer, got 'x'",
    ]


def test_load_reports_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(S.SpecError, match=r"spec file `.*nope.yaml` not found"):
        S.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: [unclosed\n")
    with pytest.raises(
        S.SpecError, match=r"bad.yaml:2:1: not valid YAML: expected ',' or '\]', but got '<stream end>'$"
    ):
        S.load(bad)


def test_every_preset_and_the_quickstart_parse():
    for name in S.preset_names():
        assert S.load_preset(name).given()
    assert S.load("search_spaces/examples/quickstart.yaml").workload.name == "tiny_cnn"


def test_a_program_command_is_split_as_a_shell_would_and_runs_from_the_specs_dir(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"workload": {"command": "python train.py --name 'a b'"}}))
    spec = S.load(tmp_path / "s.yaml")
    assert spec.workload.command == ["python", "train.py", "--name", "a b"]
    assert spec.workload.dir == str(tmp_path.resolve())
    with pytest.raises(
        S.SpecError,
        match="workload.command: Value error, cannot be split as a shell would|workload.command: cannot be split",
    ):
        S.parse({"workload": {"command": "python 'unclosed"}}, "s.yaml")


def test_the_plan_is_read_once_and_needs_no_spec_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = S.parse(
        {"workload": {"command": "python train.py --lr 0.1"}, "output_dir": "run", "search": {"n_trials": 4}}, "s.yaml"
    )
    plan = SearchPlan.of(spec)
    # resolved once: the run dir absolute, a program's dir settled (this process's), the name the file's
    assert plan.run_dir == tmp_path / "run" and plan.workload.dir == str(tmp_path) and plan.name == "s"
    assert plan.program and plan.given() == {}
    spec.search.n_trials = 9  # what changes the spec later changes no plan
    assert plan.search.n_trials == 4 and spec.workload.dir is None
    # the run dir's spec.yaml reads back as the same plan
    (tmp_path / "spec.yaml").write_text(plan.to_yaml())
    again = SearchPlan.of(S.load(tmp_path / "spec.yaml"))
    assert again == plan
    # built from its sections, without a spec: resolved the same way
    built = SearchPlan(name="s", run_dir=Path("run"), workload=S.WorkloadSpec(command=["python", "train.py"]))
    assert built.run_dir == plan.run_dir and built.workload.dir == str(tmp_path) and built.search.n_trials is None
