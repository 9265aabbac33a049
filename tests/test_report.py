"""`autotune report` and `autotune export` on a finished search, and the export
formats round-tripping into code that runs."""

import json
import re

import pytest
import torch
import yaml
from typer.testing import CliRunner

from autotune import load_config
from autotune.cli.main import app
from autotune.config import TunedConfig
from autotune.export.best_config import render
from autotune.records.state import SearchState

runner = CliRunner()
pytestmark = pytest.mark.timeout(300)


def test_report_text(finished_run):
    run_dir, _ = finished_run
    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())  # lines wrap at the terminal's width
    assert "baseline vs best (3 trials" in out and "speedup" in out
    assert "per-knob effect (median samples/s over the trials with that value, pruned ones included" in out
    assert re.search(r"baseline: \w+-bound (timed|profiled) window: ", out)  # the diagnosis with its evidence
    for name in ("throughput_per_trial", "throughput_by_knob", "parallel_coordinates"):
        assert f"plot: {run_dir / 'plots' / name}.png" in out
        assert (run_dir / "plots" / f"{name}.png").stat().st_size > 10_000


def test_report_json_matches_the_csv(finished_run):
    run_dir, _ = finished_run
    result = runner.invoke(app, ["report", str(run_dir), "--format", "json", "--no-plots"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["trials"] == 3 and data["baseline"]["trial"] == 0 and data["stopped_reason"] is None
    ratio = data["best"]["metrics"]["samples_per_s"] / data["baseline"]["metrics"]["samples_per_s"]
    # the search's figure of its best: its fresh reads' or its own ratio to the reference near its time
    best = data["best"]["metrics"]
    figure = 1.0 if data["best"]["trial"] == 0 else best.get("confirmed_speedup_x") or best.get("speedup_x") or ratio
    assert data["search_speedup_x"] == pytest.approx(figure)
    confirm = data["confirm"]  # the best re-measured against the baseline: its speedup is the one reported
    remeasured = confirm and confirm["best_trial"] == data["best"]["trial"]
    if remeasured and confirm["verdict"] == "unknown":  # its pairs disturbed by the host's other load: no figure
        assert data["speedup_x"] is None and data["speedup_unknown"] == confirm["unknown"]
    elif remeasured and confirm["verdict"] == "unsettled":  # its pairs far off the search's, twice: no one number
        assert data["speedup_x"] is None and data["speedup_unsettled"] == confirm["unsettled"]
    else:
        assert data["speedup_x"] == pytest.approx(confirm["speedup_x"] if remeasured else figure)
    assert set(data["knob_effects"]) == {"batch_size", "channels_last"}
    pruned = data["pruning"].get("trials_pruned", 0)  # counted in the effects at their measured throughput
    assert sum(e["trials"] for e in data["knob_effects"]["batch_size"]) == data["trials_ok"] + pruned
    assert sum(e["pruned"] for e in data["knob_effects"]["batch_size"]) == pruned
    assert data["fixed"]["pin_memory"] == "pinned memory only speeds host-to-GPU copies; no CUDA device"
    assert data["baseline"]["diagnosis"]["bottleneck"] in {"input", "overhead", "memory", "compute"}
    from autotune.cli.report import _study
    from autotune.records.plots import knob_importance

    assert data["importance"] == knob_importance(*_study(run_dir))  # no plots drawn: computed for the report


def test_report_markdown(finished_run):
    run_dir, _ = finished_run
    out = runner.invoke(app, ["report", str(run_dir), "-f", "markdown", "--no-plots"]).stdout
    assert out.startswith("## autotune: 3 trials on cpu")
    assert "| samples/s |" in out and out.split("\n")[2].startswith("**")  # the answer first, in bold


def test_report_and_export_say_what_to_do_without_a_search(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: `{tmp_path}` is not a search's output dir (no search.json); "
        "run `autotune search spec.yaml` first, or pass its output dir\n"
    )
    result = runner.invoke(app, ["export", str(tmp_path)])
    assert result.exit_code == 2 and "has no best_config.yaml" in result.stderr
    result = runner.invoke(app, ["report", str(tmp_path), "-f", "html"])
    assert result.stderr == "error: --format `html` is not one of: text, json, markdown\n"


def test_export_yaml_and_json_round_trip(finished_run, tmp_path):
    run_dir, _ = finished_run
    original = load_config(run_dir / "best_config.yaml")
    out = tmp_path / "best.yaml"
    assert runner.invoke(app, ["export", str(run_dir), "-o", str(out)]).exit_code == 0
    assert load_config(out) == original
    as_json = json.loads(runner.invoke(app, ["export", str(run_dir), "-f", "json"]).stdout)
    assert as_json == yaml.safe_load((run_dir / "best_config.yaml").read_text())


CONFIG = {
    "knobs": {
        "num_workers": 1,
        "pin_memory": False,
        "batch_size": 8,
        "precision": "bf16-mixed",
        "compile": "none",
        "set_to_none": False,
        "channels_last": True,
        "cudnn_benchmark": False,
    },
    "device": {"type": "cpu", "name": "cpu"},
    "measured": {"speedup_x": 1.5, "baseline_samples_per_s": 100.0, "best_samples_per_s": 150.0},
    "safety": [{"knob": "precision", "baseline": "32-true", "tuned": "bf16-mixed", "safety": "numerics", "note": "n"}],
}


def test_the_python_snippet_runs_and_applies_the_knobs():
    from tests.workloads import Recorder, WorkerTagged

    code = render({**CONFIG, "knobs": {**CONFIG["knobs"], "num_threads": 1}}, "python")
    assert code.startswith("# autotune: 1.5x over the baseline") and "# numerics: precision" in code
    ns = {}
    threads = torch.get_num_threads()
    try:
        exec(compile(code, "snippet.py", "exec"), ns)
        assert torch.get_num_threads() == 1  # what was measured is what runs
    finally:
        torch.set_num_threads(threads)
    # the user's own DataLoader arguments pass through (and win)
    loader = ns["make_loader"](WorkerTagged(), shuffle=False, drop_last=True, num_workers=0)
    assert (loader.batch_size, loader.num_workers, loader.drop_last) == (8, 0, True)
    model = ns["prepare"](Recorder())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss(model, batch):  # the workload contract: loss(model, batch) on a device batch
        images, labels, _ = batch
        return torch.nn.functional.cross_entropy(model(images), labels)

    loss = ns["train_step"](model, optimizer, next(iter(loader)), loss)
    assert torch.isfinite(loss)
    assert model.seen[0]["autocast_dtype"] == torch.bfloat16 and model.seen[0]["channels_last"]
    assert all(p.grad is not None for p in model.parameters())  # set_to_none=False


def test_the_snippets_build_the_fused_optimizer():
    from tests.workloads import Recorder, WorkerTagged, recorder_loss

    fused = {
        **CONFIG,
        "knobs": {**CONFIG["knobs"], "fused_optimizer": True},
        "safety": [
            *CONFIG["safety"],
            {"knob": "fused_optimizer", "baseline": False, "tuned": True, "safety": "numerics", "note": "n"},
        ],
    }
    ns = {}
    exec(compile(render(fused, "python"), "snippet.py", "exec"), ns)
    model = ns["prepare"](Recorder())
    optimizer = ns["prepare_optimizer"](torch.optim.Adam(model.parameters(), lr=1e-2))
    assert all(g["fused"] for g in optimizer.param_groups)
    loader = ns["make_loader"](WorkerTagged(), num_workers=0)
    assert torch.isfinite(ns["train_step"](model, optimizer, next(iter(loader)), recorder_loss))
    assert optimizer.state[model.conv.weight]["step"] == 1
    ns = {}
    exec(render(fused, "lightning"), ns)
    sgd = ns["fuse_optimizer"](torch.optim.SGD(Recorder().parameters(), lr=0.1, momentum=0.9))
    assert all(g["fused"] and g["momentum"] == 0.9 for g in sgd.param_groups)
    plain = {}
    exec(render(CONFIG, "python"), plain)
    sgd = torch.optim.SGD(Recorder().parameters(), lr=0.1)
    assert plain["prepare_optimizer"](sgd) is sgd and "fuse_optimizer" not in plain


def test_the_lightning_form_has_the_trainer_and_loader_arguments():
    ns = {}
    exec(render(CONFIG, "lightning"), ns)
    assert ns["trainer_kwargs"] == {"precision": "bf16-mixed"}  # what differs from the baseline (precision)
    assert ns["dataloader_kwargs"] == {}
    tf32 = render({**CONFIG, "knobs": {**CONFIG["knobs"], "precision": "tf32"}}, "lightning")
    assert "trainer_kwargs = {}" in tf32 and 'set_float32_matmul_precision("high")' in tf32  # 32-true: as before


def test_load_config_applies_compile_cudnn_and_tf32(tmp_path):
    knobs = {
        **CONFIG["knobs"],
        "compile": "default",
        "cudnn_benchmark": True,
        "precision": "tf32",
        "channels_last": False,
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "knobs": knobs}))
    cfg = load_config(path)
    assert isinstance(cfg, TunedConfig)
    try:
        model, _ = cfg.prepare(torch.nn.Linear(4, 2))
        assert isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
        assert torch.backends.cudnn.benchmark is True
        assert torch.get_float32_matmul_precision() == "high"
        fp16 = {**CONFIG, "knobs": {**knobs, "precision": "16-mixed"}, "batch": {"grad_accumulation_steps": 4}}
        path.write_text(yaml.safe_dump(fp16))
        cfg16 = load_config(path)
        assert isinstance(cfg16.grad_scaler(), torch.amp.GradScaler) and cfg16.accumulation_steps == 4
    finally:
        torch.backends.cudnn.benchmark = False
        torch.set_float32_matmul_precision("highest")


def _result(records, tmp_path):
    from autotune import knobs as K
    from autotune.records.run_dir import SearchResult
    from autotune.records.best import pick_best

    space = K.Space(
        baseline=records[0].knobs, search={"batch_size": [32, 64], "channels_last": [False, True]}, fixed={}, dropped=[]
    )
    return SearchResult(tmp_path, space, K.Device("cpu", 2, "cpu"), records, records[0], pick_best(records), 10.0, {})


def _records():
    from autotune import knobs as K
    from autotune.records.trial_record import TrialRecord

    def rec(number, status, samples_per_s=None, **knobs):
        return TrialRecord(
            number=number,
            status=status,
            knobs={**K.pytorch_defaults(32), **knobs},
            metrics={"samples_per_s": samples_per_s} if samples_per_s else {},
            is_baseline=number == 0,
            error_type=None if samples_per_s else "RuntimeError",
            error=None if samples_per_s else "boom",
        )

    return [
        rec(0, "ok", 100.0),
        rec(1, "ok", 150.0, channels_last=True),
        rec(2, "pruned", 40.0, batch_size=64),
        rec(3, "error", batch_size=64, channels_last=True),
    ]


def test_pruned_trials_are_drawn_at_their_measured_throughput_and_the_legend_hides_no_point(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from autotune.records.plots import PRUNED_LABEL, per_trial_figure

    fig = per_trial_figure(_result(_records(), tmp_path))
    ax = fig.axes[0]
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["trial", PRUNED_LABEL, "best so far", "baseline", "failed (oom / error / timeout)"]
    points = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
    assert points[PRUNED_LABEL] == [[2, 40.0]]  # at its measured throughput, not at 0
    assert points["failed (oom / error / timeout)"] == [[3, 0.0]] and points["trial"] == [[0, 100.0], [1, 150.0]]
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert not box.overlaps(ax.get_window_extent())  # below the axes: no point under it
    for offsets in points.values():
        for x, y in ax.transData.transform(offsets):
            assert not box.contains(x, y)


def test_per_knob_effects_count_pruned_trials_and_say_so(tmp_path):
    from autotune.cli.report import console, report
    from autotune.export.analysis import as_dict

    result = _result(_records(), tmp_path)
    d = as_dict(result)
    assert d["knob_effects"]["batch_size"] == [
        {"value": 32, "trials": 2, "pruned": 0, "median_samples_per_s": 150.0},
        {"value": 64, "trials": 1, "pruned": 1, "median_samples_per_s": 40.0},
    ]  # the pruned trial's measured 40
    with console.capture() as out:
        report(result)
    text = " ".join(out.get().split())
    assert "pruned ones included at their measured throughput" in text
    assert "64: 40 (1, 1 pruned)" in text


def test_knob_importance_is_the_share_of_throughput_variation(tmp_path):
    # the search: bf16 ran 7-9x slower (its trials pruned, told with their measured throughput);
    # Optuna's default evaluator (PedANOVA: what sets the top 10% apart) gave precision 0.03
    import optuna
    from optuna.distributions import CategoricalDistribution as C

    from autotune.records.plots import knob_importance

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    space = {
        "batch_size": C([32, 64, 128, 256]),
        "precision": C(["32-true", "bf16-mixed"]),
        "channels_last": C([False, True]),
    }
    for b, p, c, v in [
        (32, "32-true", False, 1000),
        (32, "32-true", True, 1190),
        (256, "32-true", True, 1260),
        (64, "32-true", True, 1200),
        (32, "bf16-mixed", False, 130),
        (128, "bf16-mixed", True, 150),
        (128, "32-true", True, 1230),
        (256, "32-true", False, 1100),
        (64, "32-true", False, 1050),
    ]:
        study.add_trial(
            optuna.trial.create_trial(
                params={"batch_size": b, "precision": p, "channels_last": c}, distributions=space, value=v
            )
        )
    importance = knob_importance(storage, "s")
    assert max(importance, key=importance.get) == "precision" and importance["precision"] > 0.5
    assert knob_importance(storage, "s") == importance  # seeded: the same every time
    small = optuna.create_study(study_name="small", storage=storage, direction="maximize")
    for t in study.trials[:5]:  # a forest on 5 points splits the variation by chance: no importance
        small.add_trial(t)
    assert knob_importance(storage, "small") is None


def test_a_tie_is_reported_with_both_trials_and_their_cis(tmp_path):
    from autotune.cli.report import as_markdown, console, report
    from autotune.export.analysis import as_dict

    records = _records()[:2] + [_records()[1]]
    records[2].number, records[2].knobs = 2, {**records[1].knobs, "batch_size": 256}
    for r, ci in zip(records, (0.02, 0.04, 0.06)):
        r.metrics["step_mean_ci95"] = ci
    records[2].metrics["samples_per_s"] = 158.0  # 5.3% faster than #1, inside both CIs: a tie
    result = _result(records, tmp_path)
    assert result.best.number == 1 and as_dict(result)["tie"]["faster_trial"] == 2
    note = (
        "trial #2 (158 samples/s +-6.0%) is 5.3% faster than #1 (150 +-4.0%), inside the measured "
        "uncertainty (95% CIs overlap): a tie, won by the safer config (safe, no changed knobs above the "
        "safe class vs dynamics, 1 changed knob above the safe class)"
    )
    with console.capture() as out:
        report(result)
    assert f"tie: {note}" in " ".join(out.get().split())
    assert f"**Tie:** {note}" in as_markdown(result)


def test_disturbed_trials_are_named_in_every_report(tmp_path, capsys):
    from autotune.cli.report import as_markdown, report
    from autotune.export.analysis import as_dict

    records = _records()
    records[1].info["disturbed"] = "other processes used 48% of the host's CPU time during the window"
    result = _result(records, tmp_path)
    assert as_dict(result)["disturbed"] == [{"trial": 1, "why": records[1].info["disturbed"]}]
    assert "- #1: other processes used 48% of the host's CPU time during the window" in as_markdown(result)
    report(result)
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "disturbed: 1 trial(s) measured while other work loaded the machine, their figures are suspect: "
        "#1: other processes used 48% of the host's CPU time during the window"
    ) in out


def test_break_even_is_in_the_summary_markdown_and_json(tmp_path):
    from autotune.cli.report import as_markdown, console, report
    from autotune.export.analysis import as_dict

    result = _result(_records(), tmp_path)  # 10 s of search; best 150 samples/s at batch 32, 1.5x the baseline
    note = (
        "the search (10 s) pays for itself after 94 training steps of batch 32, 20 s of training at the best "
        "config's 150 samples/s (it saves 107 ms a step, 1.50x)"
    )  # 32 x 0.5 / 150 = 0.107 s; 10 / 0.107 = 93.8
    assert as_dict(result)["break_even"]["steps"] == 94
    with console.capture() as out:
        report(result)
    assert f"break-even: {note}" in " ".join(out.get().split())
    assert f"- break-even: {note}" in as_markdown(result)
    result.best = result.baseline  # the baseline won (a tie): it never pays back, and the report says so plainly
    assert as_dict(result)["break_even"]["note"].startswith("never pays back: the best config is the baseline's own")


def test_a_language_models_search_leads_with_tokens_per_s(tmp_path):
    """Records whose trials counted tokens (trial.result.unit_of): the unit of the speedup, the table's first row,
    the per-knob effects, the break-even (tokens a step) and the plots' axes; samples/s stays beside."""
    import matplotlib

    matplotlib.use("Agg")
    from autotune.cli.report import console, report
    from autotune.export.analysis import as_dict
    from autotune.records.plots import per_trial_figure
    from autotune.trial.result import TOKENS

    records = _records()
    for r in records:  # 32 tokens a sample; the best (channels_last here) packs 2x the tokens a sample
        if r.metrics:
            per_sample = 64 if r.knobs["channels_last"] else 32
            r.metrics.update(tokens_per_s=r.metrics["samples_per_s"] * per_sample, tokens_per_step=32.0 * per_sample)
    result = _result(records, tmp_path)
    assert result.unit is TOKENS and result.best.number == 1
    assert result.speedup == 3.0  # 9,600 / 3,200 tokens/s, where samples/s say 1.5x
    d = as_dict(result)
    assert d["unit"] == "tokens" and d["knob_effects"]["batch_size"][1]["median_tokens_per_s"] == 1280.0
    assert d["break_even"]["tokens_per_step"] == 2048.0 and d["break_even"]["tokens_per_s"] == 9600.0
    with console.capture() as out:
        report(result)
    text = out.get()
    assert text.index("tokens/s") < text.index("samples/s")  # tokens/s first, samples/s beside
    assert "9,600" in text and "of 2,048 tokens" in " ".join(text.split())
    assert per_trial_figure(result).axes[0].get_ylabel() == "tokens/s"


def test_a_search_writes_its_break_even_to_best_config_and_its_report(finished_run):
    import math

    run_dir, cli = finished_run
    best = yaml.safe_load((run_dir / "best_config.yaml").read_text())
    if best["measured"]["speedup_x"] is None:
        # unknown or unsettled (autotune.decide.confirm): no break-even either
        assert "break_even" not in best and best["confirmed"]["verdict"] in {"unknown", "unsettled"}
        assert "break-even" not in runner.invoke(app, ["report", str(run_dir), "--no-plots"]).stdout
        return
    be, wall = best["break_even"], SearchState.read(run_dir).wall_s
    assert be["search_s"] == pytest.approx(wall, abs=0.1) and be["batch_size"] == best["knobs"]["batch_size"]
    assert be["speedup_x"] == pytest.approx(best["measured"]["speedup_x"], abs=1e-3)
    if be["steps"] is None:  # the winner is the baseline, or not faster
        assert be["note"].startswith("never pays back: ") and be["speedup_x"] <= 1
    else:
        saved_s = be["batch_size"] * (be["speedup_x"] - 1) / be["samples_per_s"]
        assert be["saved_ms_per_step"] == pytest.approx(saved_s * 1e3, rel=1e-3)
        assert be["steps"] == pytest.approx(math.ceil(be["search_s"] / saved_s), rel=1e-2)
        assert be["hours"] == pytest.approx(be["search_s"] / (be["speedup_x"] - 1) / 3600, rel=1e-2)
    assert f"break-even: {be['note']}" not in " ".join(cli.stdout.split())  # not on the search's last screen ...
    report = runner.invoke(app, ["report", str(run_dir), "--no-plots"])
    assert f"break-even: {be['note']}" in " ".join(report.stdout.split())  # ... in `autotune report`


def test_configs_the_rate_model_kept_from_running_are_named_with_their_prediction(tmp_path, capsys):
    from autotune.cli.report import short, report
    from autotune.export.analysis import as_dict

    result = _result(_records(), tmp_path)
    why = "skipped: predicted 80.0 samples/s, below 85% of the best (150.0)"
    result.skipped = [{"config": {"batch_size": 64, "channels_last": False}, "predicted": 80.0, "error": why}]
    assert as_dict(result)["skipped_predicted"] == result.skipped
    report(result)
    out = " ".join(capsys.readouterr().out.split())
    assert f"not run: {short('batch_size')}=64, {why}" in out  # its changes from the baseline, and why


def test_a_command_wider_than_the_terminal_is_lines_a_shell_reads_as_the_same_command():
    """The last screen's `run it:` line at a narrow width: broken between words with ` \\` (never inside a quoted
    word), so that what a user copies runs as printed; a Python line or a command that fits stays one line."""
    import subprocess

    from autotune.cli.report import command_lines

    command = (
        "cd / && printf '<%s>' autotune run 'a dir/best_config.yaml' -- python train.py "
        "--data 'x y.bin' --max_iters 400 --batch_size 16"
    )
    lines = command_lines(command, 30)
    assert len(lines) > 2 and all(line.endswith(" \\") for line in lines[:-1])
    assert all(len(line) <= 30 for line in lines)
    ran = [
        subprocess.run(["bash", "-c", text], capture_output=True, text=True).stdout
        for text in (command, "\n".join(lines))
    ]
    assert ran[0] == ran[1] and "<a dir/best_config.yaml>" in ran[0] and "<x y.bin>" in ran[0]
    assert command_lines(command, 500) == [command]
    python = 'cfg = autotune.load_config("a long way to a run dir/best_config.yaml")'
    assert command_lines(python, 20) == [python]


def test_the_search_figure_is_reported_with_its_interval(tmp_path):
    """The search's figure of its best comes with its 95% interval (decide.reference: where the side by side was
    expected to land) beside the re-measurement, in the report's text, markdown and JSON."""
    from autotune.cli.report import as_markdown, console, report
    from autotune.export.analysis import as_dict
    from autotune.decide import confirm as C
    from autotune.trial.result import TrialResult

    records = _records()
    records[1].metrics.update(confirmed_speedup_x=1.45, confirmed_speedup_low=1.21, confirmed_speedup_high=1.74)
    result = _result(records, tmp_path)
    reads = iter([100.0, 140.0, 150.0, 100.0])
    pairs = C.remeasure(lambda knobs, label: TrialResult("ok", metrics={"samples_per_s": next(reads)}), {}, {}, 2)
    result.confirm = {**pairs, "baseline_trial": 0, "best_trial": 1}
    says = "the search's figure was 1.45x (95%: 1.21-1.74x); re-measured side by side, 2 interleaved rounds"
    assert as_dict(result)["search_speedup_interval"] == [1.21, 1.74]
    with console.capture() as out:
        report(result)
    assert says in " ".join(out.get().split()) and says in " ".join(as_markdown(result).split())
    records[1].metrics = {"samples_per_s": 150.0}  # a search without reads: the trials' ratio, no interval
    plain = _result(records, tmp_path)
    plain.confirm = result.confirm
    assert "the search's figure was 1.50x; re-measured" in " ".join(as_markdown(plain).split())
    # a search with reads too short to afford the best's fresh read: its trial's figure, and the report says so
    records[1].metrics = {"samples_per_s": 150.0, "speedup_x": 1.52, "speedup_low": 1.2, "speedup_high": 1.9}
    unread = _result(records, tmp_path)
    unread.confirm = result.confirm
    says = "the search's figure was 1.52x (95%: 1.20-1.90x), its trial's: not read again within the reads' share"
    assert says in " ".join(as_markdown(unread).split()) and as_dict(unread)["search_speedup_read_again"] is False


def test_a_best_that_is_the_baseline_is_diagnosed_once():
    """A README walk: a tie the baseline won printed its diagnosis twice, once as the best's."""
    from autotune.cli.report import _diagnosed

    diag = {"bottleneck": "overhead", "evidence": ["e"], "recommendations": []}
    base = {"trial": 0, "diagnosis": diag}
    assert _diagnosed({"baseline": base, "best": base}) == [("baseline", diag)]
    other = {"trial": 4, "diagnosis": {**diag, "bottleneck": "input"}}
    assert [label for label, _ in _diagnosed({"baseline": base, "best": other})] == ["baseline", "best"]
    assert _diagnosed({"baseline": base, "best": {"trial": 4, "diagnosis": None}}) == [("baseline", diag)]
