"""Zero code for the Trainers (issue 42): an HfArgumentParser + Trainer script and a lightning.Trainer script,
not a line changed, run as trials through autotune's sitecustomize (autotune.instrument), and
the knobs as the HF script's own flags (autotune.export.hf_args)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.export import hf_args
from autotune import instrument
from autotune.trial.result import TrialResult

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tests" / "programs"
HF_TINY = [
    "--hidden_size",
    "32",
    "--num_layers",
    "1",
    "--num_heads",
    "2",
    "--max_words",
    "24",
    "--num_samples",
    "512",
    "--disable_tqdm",
    "true",
    "--logging_steps",
    "1000",
]
LIGHTNING_TINY = ["--width", "8", "--image", "16"]


def test_knobs_become_training_arguments_fields_with_their_pairs():
    assert hf_args.fields({"precision": "bf16-mixed", "num_workers": 2, "batch_size": None}) == {
        "dataloader_num_workers": 2,
        "bf16": True,
        "fp16": False,
    }
    assert hf_args.fields({"num_workers": 0, "prefetch_factor": 4}) == {"dataloader_num_workers": 0}  # HF refuses it
    assert hf_args.fields({"compile": "max-autotune", "fused_optimizer": True}) == {
        "torch_compile": True,
        "torch_compile_mode": "max-autotune",
        "optim": "adamw_torch_fused",
    }
    assert hf_args.fields({"precision": "32-true"}, "cpu") == {"bf16": False, "fp16": False, "use_cpu": True}
    assert hf_args.fields({}) == {}  # nothing set: the script keeps its own values
    assert hf_args.flags({"bf16": True, "dataloader_num_workers": 2}) == [
        "--bf16",
        "true",
        "--dataloader_num_workers",
        "2",
    ]


def test_training_arguments_read_back_as_knob_values_the_scripts_own_settings():
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="o", per_device_train_batch_size=4, dataloader_num_workers=2, use_cpu=True)
    # transformers' own defaults as they resolve: no pinning with use_cpu, the fused AdamW; no prefetch factor set
    # (PyTorch's stands); the language-model knobs' are instrument.own_of's
    assert hf_args.knobs_of(args) == {
        "num_workers": 2,
        "pin_memory": False,
        "persistent_workers": False,
        "batch_size": 4,
        "liger_kernels": False,
        "precision": "32-true",
        "compile": "none",
        "fused_optimizer": True,
    }
    assert hf_args.knobs_of({"bf16": True, "fp16": False, "optim": "adafactor"}) == {"precision": "bf16-mixed"}
    # another optimizer than AdamW: fused_optimizer cannot say it
    knobs = {"precision": "16-mixed", "compile": "max-autotune", "fused_optimizer": False, "num_workers": 1}
    assert hf_args.knobs_of(hf_args.fields(knobs)) == knobs  # one the other way round
    assert hf_args.fields({"fused_optimizer": False}) == {"optim": "adamw_torch"}  # off: AdamW, unfused


def test_the_change_from_the_baseline_switches_paired_fields_together():
    base = hf_args.fields({"precision": "32-true", "num_workers": 0, "batch_size": 8})
    best = hf_args.fields({"precision": "bf16-mixed", "num_workers": 0, "batch_size": 16})
    assert hf_args.changed(best, base) == {"per_device_train_batch_size": 16, "bf16": True, "fp16": False}
    assert hf_args.changed(base, base) == {}


def run(cmd, env, cwd, timeout=600):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def child_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_TRIAL", "AUTOTUNE_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**instrument.with_env(env), **extra}


PARSE = """
import json, sys
from transformers import HfArgumentParser, TrainingArguments
(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
print(json.dumps({k: str(getattr(args, k)) for k in ("dataloader_num_workers", "bf16", "fp16", "per_device_train_batch_size",
                                "output_dir", "report_to", "save_strategy")}))
"""


def test_a_best_config_reaches_an_hf_argument_parser_as_its_flags(tmp_path):
    best = tmp_path / "best_config.yaml"
    best.write_text(
        yaml.safe_dump(
            {
                "knobs": {"num_workers": 2, "precision": "bf16-mixed", "batch_size": 8},
                "device": {"type": "cpu"},
                "safety": [{"knob": "num_workers"}, {"knob": "precision"}],
            }
        )
    )
    env = child_env(AUTOTUNE_CONFIG=str(best))
    # the program's own command line: its flags stay unless a knob sets the same field
    proc = run(
        [sys.executable, "-c", PARSE, "--output_dir", "mine", "--per_device_train_batch_size", "4", "--fp16", "true"],
        env,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["dataloader_num_workers"] == "2" and got["bf16"] == "True" and got["fp16"] == "False"
    assert got["per_device_train_batch_size"] == "4"  # batch_size was the baseline's: not set by this config
    assert got["output_dir"] == "mine" and got["save_strategy"] != "no"  # production: the program's own outputs


def test_without_a_trial_or_a_config_nothing_is_patched_and_the_hidden_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nopen(os.environ['MARK'], 'w').write('ran')\n")
    env = child_env(MARK=str(tmp_path / "mark"))
    env["PYTHONPATH"] += os.pathsep + str(theirs)
    code = (
        "import sys, transformers.trainer as t\n"
        "print(hasattr(t.Trainer.__init__, '__wrapped__'), any(type(f).__name__ == '_Finder' for f in sys.meta_path))"
    )
    proc = run([sys.executable, "-c", code], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]
    assert (tmp_path / "mark").read_text() == "ran"


def run_trial(tmp_path, program, knobs, args):
    """`program` (a file of tests/programs, or TRL_SFT: a module, `-m ...`) as a trial's process."""
    trial = tmp_path / "trial"
    trial.mkdir()
    program = [program] if isinstance(program, str) else list(program)
    request = {
        "workload": {"command": ["python", *program]},
        "knobs": knobs,
        "warmup_steps": 2,
        "measure_steps": 4,
        "min_window_s": 0.2,
        "max_window_s": 3.0,
    }
    (trial / "config.json").write_text(json.dumps(request))
    where = [str(PROGRAMS / program[0])] if program[0].endswith(".py") else program
    proc = run([sys.executable, *where, *args], child_env(AUTOTUNE_TRIAL=str(trial / "config.json")), tmp_path)
    return proc, trial


@pytest.mark.timeout(600)
def test_an_hf_trainer_script_is_a_trial_with_no_line_changed(tmp_path):
    proc, trial = run_trial(
        tmp_path,
        "hf_bert.py",
        {"batch_size": 4, "num_workers": 1},
        ["--output_dir", "mine", "--max_steps", "60", *HF_TINY],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = TrialResult.read(trial / "result.json")
    assert result.status == "ok", result.error
    m = result.metrics
    assert m["samples_per_s"] == pytest.approx(4 * m["steps_per_s"])  # the batch knob, as --per_device_train_batch_size
    assert 0 <= m["data_wait_frac"] < 1  # get_batch_samples timed
    every = m["warmup_steps_run"] + m.get("warmup_extended_steps", 0) + m["window_steps"]
    assert len(result.losses) == every  # every step's loss, reported
    assert {"dataloader_kwargs", "autocast", "step", "data"} <= set(result.used)
    # the window's end ended the process: no final save; the Trainer's outputs went under the trial
    assert not (tmp_path / "mine").exists()
    # its Trainer could flatten padded batches, but its model classifies whole rows: padding_free is not run
    assert "flatten" in result.used and "packing" not in result.used  # no `packing` argument: TRL's
    assert result.cannot["padding_free"].startswith("BertForSequenceClassification is not a causal language model")
    # the Trainer's own Accelerator is the Trainer's: its arguments carry precision and compile (not "cannot")
    assert not {"precision", "compile"} & set(result.cannot)
    # what the script runs with, read by the probe (the baseline of a search with no spec): its model's and its
    # TrainingArguments' own (transformers' defaults: pinned memory, the fused AdamW)
    assert result.own_knobs == {
        "activation_checkpointing": "off",
        "liger_kernels": False,
        "attention": "sdpa",
        "pin_memory": True,
        "persistent_workers": False,
        "precision": "32-true",
        "compile": "none",
        "fused_optimizer": True,
        "grad_accumulation_steps": 1,  # its effective batch's other factor (keep_effective_batch's)
    }


@pytest.mark.timeout(600)
def test_a_padding_collators_language_model_measures_its_padding_and_puts_padding_free_first(tmp_path):
    """lm_trainer.py: texts of 4 to 24 tokens, each batch padded to its longest (issue 62). The trial measures the
    share of the padded batches' token slots that is padding, the attention kernel its model runs; the playbook
    puts padding-free rows first, saying which measurement chose them and what they may gain."""
    from autotune.decide.playbook import advise

    proc, trial = run_trial(tmp_path, "lm_trainer.py", {}, ["--output_dir", "mine", "--max_steps", "100000"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = TrialResult.read(trial / "result.json")
    assert result.status == "ok", result.error
    pad = result.metrics["padding_frac"]
    assert 0.25 < pad < 0.6  # a 4-row batch of 4-24 tokens, padded to its longest
    facts = result.diagnosis["facts"]
    assert facts["padding_frac"] == pytest.approx(pad, abs=1e-4) and facts["attention"] == "sdpa"
    assert result.diagnosis["bottleneck"] in (None, "input")  # its own loop: the wait alone is measured
    moves = advise(result.diagnosis, {**result.own_knobs, **result.knobs})["moves"]
    assert moves[0]["knob"] == "padding_free" and moves[0]["by"] == f"padding {pad:.0%} of the batches' token slots"
    assert moves[0]["gain"] == pytest.approx(1 / (1 - facts["padding_frac"]))


@pytest.mark.timeout(600)
def test_a_lightning_trainer_script_is_a_trial_with_no_line_changed(tmp_path):
    proc, trial = run_trial(
        tmp_path,
        "lightning_clip.py",
        {"batch_size": 12, "num_workers": 1, "precision": "bf16-mixed"},
        ["--max_steps", "60", "--batch_size", "16", *LIGHTNING_TINY],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = TrialResult.read(trial / "result.json")
    assert result.status == "ok", result.error
    m = result.metrics
    assert m["samples_per_s"] == pytest.approx(12 * m["steps_per_s"])  # the DataModule's loader got the knob
    assert 0 <= m["data_wait_frac"] < 1
    assert "bfloat16 Automatic Mixed Precision" in proc.stdout + proc.stderr  # the Trainer's precision
    assert {"dataloader_kwargs", "autocast", "step", "data"} <= set(result.used)
    # the callback handed its LightningModule over: a small CNN, which takes none of a language model's knobs
    lm = {"attention", "padding_free", "liger_kernels", "activation_checkpointing", "float8"}
    assert set(result.cannot) == lm and result.cannot["activation_checkpointing"].startswith("no repeated block")
    assert not (tmp_path / "lightning_logs").exists() and not (tmp_path / "checkpoints").exists()


def best_config(tmp_path, changes, device="cpu"):
    """A best_config.yaml as a search writes it: the knobs, and each changed one in `safety`."""
    path = tmp_path / "run" / "best_config.yaml"
    path.parent.mkdir(exist_ok=True)
    knobs = {"num_workers": 0, "batch_size": 8, "precision": "32-true", "channels_last": False, "num_threads": None}
    knobs.update({name: tuned for name, (_, tuned) in changes.items()})
    path.write_text(
        yaml.safe_dump(
            {
                "knobs": knobs,
                "device": {"type": device},
                "safety": [
                    {"knob": name, "baseline": base, "tuned": tuned, "safety": "safe"}
                    for name, (base, tuned) in changes.items()
                ],
            }
        )
    )
    return path


def test_export_hf_args_prints_the_changed_flags_then_what_no_flag_carries(tmp_path):
    from typer.testing import CliRunner

    from autotune.cli.main import app

    path = best_config(
        tmp_path,
        {
            "num_workers": (0, 2),
            "precision": ("32-true", "bf16-mixed"),
            "channels_last": (False, True),
            "num_threads": (None, 1),
        },
    )
    out = CliRunner().invoke(app, ["export", str(path.parent), "-f", "hf-args"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == "--dataloader_num_workers 2 --bf16 true --fp16 false --use_cpu true"
    assert lines[1] == "# not carried by a TrainingArguments flag:"
    assert lines[2].startswith("#   num_threads=1: OMP_NUM_THREADS=1 before the command")
    assert lines[3].startswith("#   channels_last=True: in the script, `model, _ = cfg.prepare(model)`")
    unchanged = best_config(tmp_path, {})
    assert (
        CliRunner()
        .invoke(app, ["export", str(unchanged.parent), "-f", "hf-args"])
        .output.startswith("# no flag to add")
    )


def autotune_cli(*args, cwd):
    env = child_env()
    return run([sys.executable, "-m", "autotune.cli", *args], env, cwd)


def test_autotune_run_applies_a_best_config_to_an_unchanged_program(tmp_path):
    path = best_config(tmp_path, {"num_workers": (0, 2), "precision": ("32-true", "bf16-mixed")})
    proc = autotune_cli("run", str(path), "--", sys.executable, "-c", PARSE, "--output_dir", "mine", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["dataloader_num_workers"], got["bf16"], got["output_dir"]) == ("2", "True", "mine")


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "best_config.yaml"], "no program to run: give its command after `--`"),
        (["run", "nowhere.yaml", "--", "python"], "`nowhere.yaml` is not a file"),
        (["run", "best_config.yaml", "--", "no-such-program-here"], "`no-such-program-here` is not a command on PATH"),
    ],
)
def test_autotune_run_refuses_bad_input_in_one_line(tmp_path, args, message):
    from typer.testing import CliRunner

    from autotune.cli.main import app

    best_config(tmp_path, {"num_workers": (0, 2)}).rename(tmp_path / "best_config.yaml")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        out = CliRunner().invoke(app, args)
    finally:
        os.chdir(cwd)
    assert out.exit_code == 2 and message in out.output and len(out.output.strip().splitlines()) == 1


def search_program(tmp_path, command):
    """`autotune search` to the end on a program, batch 8 against 16 (the knob as the program's own setting)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "workload": {"command": command},
                "output_dir": str(tmp_path / "run"),
                "search_space": {"preset": None, "knobs": {"batch_size": [8, 16]}},
                "trial": {
                    "warmup_steps": 2,
                    "measure_steps": 4,
                    "min_window_s": 0.2,
                    "max_window_s": 2.0,
                    "profile_steps": 0,
                    "diagnose": False,
                    "prune_margin": 0,  # batch 16 may read slower under load: measured to the end, not pruned
                },
                "search": {"n_trials": 2, "confirm_rounds": 0},
                "safety": {"level": "dynamics", "parity_steps": 4},
            }
        )
    )
    proc = autotune_cli("search", str(spec), "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    import csv

    with open(tmp_path / "run" / "trials.csv") as f:
        trials = list(csv.DictReader(f))
    assert [t["status"] for t in trials] == ["ok", "ok"], trials
    per_step = {int(t["batch_size"]): float(t["samples_per_s"]) / float(t["steps_per_s"]) for t in trials}
    assert per_step == pytest.approx({8: 8, 16: 16})  # each trial's batch reached the program's loader
    assert (tmp_path / "run" / "best_config.yaml").exists()
    return tmp_path / "run"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_hf_trainer_script_is_searched_to_the_end_with_no_line_changed(tmp_path):
    run_dir = search_program(
        tmp_path,
        [
            sys.executable,
            str(PROGRAMS / "hf_bert.py"),
            "--output_dir",
            "mine",
            "--max_steps",
            "200",
            "--per_device_train_batch_size",
            "8",
            *HF_TINY,
        ],
    )
    assert not (tmp_path / "mine").exists()
    out = autotune_cli("export", str(run_dir), "-f", "hf-args", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.splitlines()[0] in (
        "--per_device_train_batch_size 16",
        "# no flag to add: the best config changes no TrainingArguments field from the baseline",
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_lightning_trainer_script_is_searched_to_the_end_with_no_line_changed(tmp_path):
    search_program(
        tmp_path,
        [
            sys.executable,
            str(PROGRAMS / "lightning_clip.py"),
            "--max_steps",
            "200",
            "--batch_size",
            "8",
            *LIGHTNING_TINY,
        ],
    )
    assert not (tmp_path / "lightning_logs").exists()


def test_training_arguments_puts_the_knobs_over_the_scripts_own(tmp_path, monkeypatch):
    import autotune

    monkeypatch.delenv("AUTOTUNE_TRIAL", raising=False)
    monkeypatch.delenv("AUTOTUNE_CONFIG", raising=False)
    assert autotune.config().training_arguments(output_dir="out", bf16=True) == {"output_dir": "out", "bf16": True}
    path = best_config(tmp_path, {"num_workers": (0, 2), "precision": ("32-true", "bf16-mixed")})
    cfg = autotune.config(path)
    assert cfg.training_arguments(output_dir="out", dataloader_num_workers=0, per_device_train_batch_size=4) == {
        "output_dir": "out",
        "dataloader_num_workers": 2,
        "per_device_train_batch_size": 4,
        "bf16": True,
        "fp16": False,
        "use_cpu": True,
    }
    assert "dataloader_kwargs" in cfg.used  # its loader knobs are used: a search would not drop them


@pytest.mark.timeout(600)
def test_a_lightning_cli_script_is_a_trial_with_no_line_changed(tmp_path):
    pytest.importorskip("jsonargparse")  # LightningCLI's own dependency (lightning[pytorch-extra])
    proc, trial = run_trial(
        tmp_path,
        "lightning_cli.py",
        {"batch_size": 12, "precision": "bf16-mixed"},
        [
            "fit",
            "--trainer.max_steps",
            "60",
            "--trainer.gradient_clip_val",
            "1.0",
            "--data.batch_size",
            "16",
            "--model.width",
            "8",
            "--data.image",
            "16",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = TrialResult.read(trial / "result.json")
    assert result.status == "ok", result.error
    assert result.metrics["samples_per_s"] == pytest.approx(12 * result.metrics["steps_per_s"])
    assert "bfloat16 Automatic Mixed Precision" in proc.stdout + proc.stderr


def test_autotune_run_without_a_command_runs_the_searched_program_with_its_environment(tmp_path):
    path = best_config(tmp_path, {"num_workers": (0, 2)})
    data = yaml.safe_load(path.read_text())
    data["workload"] = {
        "command": [
            "python",
            "-c",
            "import os, sys; print(os.environ['SEARCHED'], "
            "'OMP_NUM_THREADS' in os.environ, os.getcwd(), sys.executable)",
        ],
        "dir": str(tmp_path),
        "env": {"SEARCHED": "yes", "OMP_NUM_THREADS": ""},
    }
    path.write_text(yaml.safe_dump(data))
    proc = autotune_cli("run", str(path), cwd=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "False", str(tmp_path), sys.executable]


# --- a Trainer step's samples ------------------------------------------------------------------------------


def needs_trl():
    pytest.importorskip("trl", reason="trl is not installed (pip install 'autotune[test]'): TRL's SFT script")


def test_a_padding_free_batch_counts_its_sequences():
    """TRL's packing flattens a batch's texts into one row (padding-free): counted as rows, it would be one
    sample whatever it holds."""
    needs_trl()
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from autotune.instrument._hf_callback import count_samples

    texts = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}, {"input_ids": [3, 4, 5, 6, 7]}]
    flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(texts)
    assert flat["input_ids"].shape == (1, 10) and int(count_samples(flat)) == 3  # a tensor: read at the window's end
    assert count_samples(DataCollatorForLanguageModeling(pad_token_id=0)(texts)) == 3  # padded: its rows


def test_a_tokenizers_padded_batch_counts_its_rows():
    """A tokenizer's padding collator (run_glue.py's) returns a BatchEncoding: a UserDict, not a dict."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import DataCollatorWithPadding, PreTrainedTokenizerFast

    from autotune.instrument._hf_callback import count_samples

    words = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "a": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]")
    batch = DataCollatorWithPadding(tok)([tok("a a a"), tok("a"), tok("a a")])
    assert type(batch).__name__ == "BatchEncoding" and not isinstance(batch, dict)
    assert count_samples(batch) == 3


# --- TRL's own SFT script (trl/scripts/sft.py of trl 1.13.0), as it ships ------------------------------------

TRL_SFT = ["-m", "trl.scripts.sft"]  # TRL's own SFT script, run from the installed package as it ships


@pytest.fixture(scope="module")
def trl_data(tmp_path_factory):
    """The model TRL's SFT script trains here (a random-init Llama and a BPE tokenizer trained here) and its texts,
    made offline (tests/programs/trl_sft_data.py)."""
    needs_trl()
    where = tmp_path_factory.mktemp("trl")
    proc = run([sys.executable, str(PROGRAMS / "trl_sft_data.py"), str(where), "--rows", "600"], None, where)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where


def trl_args(data: Path, *extra: str) -> list[str]:
    return [
        "--model_name_or_path",
        str(data / "tiny_llama"),
        "--dataset_name",
        str(data / "tiny_text"),
        "--max_length",
        "128",
        "--bf16",
        "false",
        "--logging_steps",
        "1000",
        "--disable_tqdm",
        "true",
        *extra,
    ]


TRL_PARSE = """
import json, sys
from trl.scripts.sft import make_parser  # the script's own parser: TrlParser over its four dataclasses

script_args, training_args, model_args, dataset_args = make_parser().parse_args_and_config(fail_with_unknown_args=False)
fields = ("dataloader_num_workers", "per_device_train_batch_size", "bf16", "use_cpu", "packing", "output_dir",
          "report_to", "push_to_hub", "save_strategy", "eval_strategy")
got = {k: str(getattr(getattr(training_args, k), "value", getattr(training_args, k))) for k in fields}
from autotune import instrument
print(json.dumps({**got, "own": instrument.config().own}))
"""


@pytest.mark.parametrize("mode", ["trial", "production"])
def test_trls_parser_reads_the_knobs_flags_and_a_trials_own(tmp_path, mode):
    """TrlParser subclasses TRL's own copy of HfArgumentParser (trl/scripts/_hf_argparser.py), not transformers':
    the instrumentation patches that copy too."""
    needs_trl()
    knobs = {"batch_size": 8, "num_workers": 1, "precision": "bf16-mixed"}
    if mode == "trial":
        request = {"workload": {"command": ["python", *TRL_SFT]}, "knobs": knobs, "device": "cpu"}
        (tmp_path / "config.json").write_text(json.dumps(request))
        env = child_env(AUTOTUNE_TRIAL=str(tmp_path / "config.json"))
    else:
        changes = {"batch_size": (4, 8), "num_workers": (0, 1), "precision": ("32-true", "bf16-mixed")}
        env = child_env(AUTOTUNE_CONFIG=str(best_config(tmp_path, changes)))
    mine = ["--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", "mine", "--packing", "true"]
    mine += ["--per_device_train_batch_size", "4", "--bf16", "false"]  # fp32 on a CPU: SFTConfig's default is bf16
    proc = run([sys.executable, "-c", TRL_PARSE, *mine], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["dataloader_num_workers"], got["per_device_train_batch_size"]) == ("1", "8")
    assert (got["bf16"], got["use_cpu"]) == ("True", "True")
    assert got["packing"] == "True"  # the script's own flag stays
    if mode == "trial":
        assert (got["report_to"], got["push_to_hub"], got["save_strategy"], got["eval_strategy"]) == (
            "[]",
            "False",
            "no",
            "no",
        )
        assert got["output_dir"] == str(tmp_path / "output")
    else:
        assert got["output_dir"] == "mine" and got["save_strategy"] != "no"


TRL_PARSE_LM = """
import json, sys
from trl.scripts.sft import make_parser

script_args, training_args, model_args, dataset_args = make_parser().parse_args_and_config(fail_with_unknown_args=False)
fields = ("per_device_train_batch_size", "gradient_accumulation_steps", "activation_checkpointing",
          "activation_checkpointing_kwargs", "packing", "padding_free")
print(json.dumps({"attn_implementation": model_args.attn_implementation,
                  **{k: getattr(training_args, k) for k in fields}}))
"""


def test_trls_parser_reads_the_lm_knobs_as_its_own_flags(tmp_path):
    """The attention kernel through TRL's ModelConfig (which the script puts in model_init_kwargs), packing through
    SFTConfig, selective checkpointing as every second layer, the micro-batch with the accumulation that keeps the
    effective batch; padding-free is left to the instrumented Trainer (TRL's own refuses a max_length unpacked)."""
    needs_trl()
    knobs = {"attention": "eager", "packing": True, "activation_checkpointing": "selective", "batch_size": 2}
    knobs["padding_free"] = True
    request = {"workload": {"command": ["python", *TRL_SFT]}, "knobs": knobs, "device": "cpu", "accum_steps": 4}
    (tmp_path / "config.json").write_text(json.dumps(request))
    mine = ["--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", "mine", "--bf16", "false"]
    mine += ["--per_device_train_batch_size", "8", "--activation_checkpointing_kwargs", '{"use_reentrant": false}']
    env = child_env(AUTOTUNE_TRIAL=str(tmp_path / "config.json"))
    proc = run([sys.executable, "-c", TRL_PARSE_LM, *mine], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "attn_implementation": "eager",
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 4,
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"use_reentrant": False, "every_n_layers": 2},
        "packing": True,
        "padding_free": False,
    }


TRAINER_LM = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

def pad(features):
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, f in enumerate(features):
        ids[row, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[row, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
data = [{"input_ids": list(range(1, 3 + i % 5))} for i in range(16)]
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, use_cpu=True, report_to="none")
trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=pad)
batch = next(iter(trainer.get_train_dataloader()))
print(json.dumps({"collator": type(trainer.data_collator).__name__, "attention": model.config._attn_implementation,
                  "keys": sorted(batch), "rows": list(batch["input_ids"].shape),
                  "positions": batch.get("position_ids", torch.zeros(1, 1)).tolist()[0]}))
"""


def test_a_trainer_whose_collator_pads_gets_padding_free_rows_and_the_attention_kernel(tmp_path):
    """A Trainer script that is not TRL's: its own collator pads; the instrumented Trainer wraps it (each padded
    batch one row, positions restarting per text) and sets the attention kernel on its model."""
    changes = {"padding_free": (False, True), "attention": ("sdpa", "eager")}
    env = child_env(AUTOTUNE_CONFIG=str(best_config(tmp_path, changes)))
    proc = run([sys.executable, "-c", TRAINER_LM], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["collator"], got["attention"]) == ("Flattening", "eager")
    assert got["keys"] == ["input_ids", "labels", "position_ids"] and got["rows"][0] == 1
    starts = [i for i, p in enumerate(got["positions"]) if p == 0]
    assert len(starts) == 4 and got["rows"][1] == len(got["positions"])  # four texts, one row, no padding


def test_a_probe_reads_a_trl_scripts_own_settings_its_flags_and_trls_defaults(tmp_path):
    """A trial that sets no knob (the search's probe run) reads the knob values the script runs with: the search's
    baseline (autotune.execution.program)."""
    needs_trl()
    request = {"workload": {"command": ["python", *TRL_SFT]}, "knobs": {}, "device": "cpu"}
    (tmp_path / "config.json").write_text(json.dumps(request))
    mine = ["--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", "mine", "--packing", "false"]
    mine += ["--per_device_train_batch_size", "4", "--bf16", "false", "--dataloader_num_workers", "1"]
    env = child_env(AUTOTUNE_TRIAL=str(tmp_path / "config.json"))
    proc = run([sys.executable, "-c", TRL_PARSE, *mine], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["own"] == {
        "num_workers": 1,  # its flags
        "batch_size": 4,
        "precision": "32-true",
        "packing": False,
        "padding_free": False,
        "activation_checkpointing": "full",  # TRL's defaults: checkpointing on
        "pin_memory": True,  # transformers': pinned loader memory, the fused AdamW, no compile
        "fused_optimizer": True,
        "compile": "none",
        "persistent_workers": False,
        "liger_kernels": False,
        "grad_accumulation_steps": 1,
    }


# in CI: the TRL parser's patch (test_trls_parser_reads_the_knobs_flags_and_a_trials_own), a packed batch's count
# (test_a_padding_free_batch_counts_its_sequences), a Trainer's callback in a trial (test_an_hf_trainer_script_is_a_
# trial_with_no_line_changed); 28 s of the tier on 2 cores, its model and texts generated first
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trl_sft_script_is_a_trial_with_no_line_changed(tmp_path, trl_data, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))  # datasets' cache: not the user's
    # the LM knobs too: eager attention (TRL's ModelConfig flag), every second layer checkpointed (SFTConfig's
    # kwargs), padding-free rows (TRL's padded batches flattened by the instrumented Trainer)
    lm = {"attention": "eager", "activation_checkpointing": "selective", "padding_free": True}
    proc, trial = run_trial(
        tmp_path,
        TRL_SFT,
        {"batch_size": 4, "num_workers": 1, **lm},
        trl_args(trl_data, "--output_dir", "mine", "--max_steps", "60", "--per_device_train_batch_size", "2"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = TrialResult.read(trial / "result.json")
    assert result.status == "ok", result.error
    m = result.metrics
    assert m["samples_per_s"] == pytest.approx(4 * m["steps_per_s"])  # TrlParser got the batch knob
    assert 0 <= m["data_wait_frac"] < 1  # SFTTrainer (a Trainer) got the callback
    # a language model's unit: its texts' tokens (TRL's padded batches: the attention mask's ones), the FLOPs of
    # the Llama the Trainer handed over (on_train_begin), no MFU on a CPU
    assert result.unit.name == "tokens" and m["tokens_per_s"] == pytest.approx(m["tokens_per_step"] * m["steps_per_s"])
    assert m["tokens_per_step"] / m["seq_len_mean"] == pytest.approx(4) and 1 < m["seq_len_mean"] <= 128
    assert m["flops_per_token"] > 0 and "mfu" not in m
    assert len(result.losses) == m["warmup_steps_run"] + m.get("warmup_extended_steps", 0) + m["window_steps"]
    assert {"dataloader_kwargs", "autocast", "step", "data", "flatten", "packing"} <= set(result.used)
    # its own values of the knobs this trial does not set (a knob it sets is not its own)
    own = result.own_knobs
    assert (own["liger_kernels"], own["packing"], own["precision"]) == (False, False, "32-true") and not result.cannot
    assert not set(own) & {"batch_size", "num_workers", "attention", "activation_checkpointing", "padding_free"}
    assert not (tmp_path / "mine").exists()
