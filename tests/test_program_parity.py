"""Loss parity of a user's own program (autotune.safety.program_parity): the verdict's rules, the program's
parity runs (real processes, through the launcher) on a healthy bf16 candidate, a planted cancellation that
bf16 rounds away, a chaotic program, one that never hands over its model and one that reports no loss; a
language model's numerics knobs on a Trainer's tiny Llama (padding-free rows against padded ones, eager attention
against sdpa) and the planted faults of a padding-free row whose documents attend across each other; and a
search whose bf16 winner is checked late and exported as checked."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from autotune import knobs as K
from autotune.execution.launcher import run_in_process
from autotune.safety import program_parity as PP
from tests.test_program import search

pytestmark = pytest.mark.timeout(600)

PROGRAMS = Path(__file__).parent / "programs"
STEPS, TOL = 10, 0.05
REF = [2.0, 1.8, 1.6, 1.5, 1.4, 1.3, 1.25, 1.2, 1.15, 1.1]


def near(losses, rel):
    return [x * (1 + rel * (-1) ** i) for i, x in enumerate(losses)]


@pytest.mark.parametrize(
    "noise, candidate, verdict, passed",
    [
        ([near(REF, 0.01)] * 3, near(REF, 0.02), "passed", True),  # inside the tolerance
        ([near(REF, 0.01)] * 3, near(REF, 0.2), "failed", False),  # past it, the noise quiet
        ([near(REF, 0.01)] * 3, REF[:5] + [math.nan] * 5, "failed", False),  # NaN
        ([near(REF, 0.4)] * 3, near(REF, 0.3), "not judged", False),  # chaotic: never "passed"
        ([near(REF, 0.4)] * 3, near(REF, 0.01), "not judged", False),
        (None, near(REF, 0.01), "not judged", False),  # no noise could be made (no model handed over)
        ([near(REF, 0.01)] * 3, REF[:4], "not measured", False),  # fewer losses than the steps
    ],
)
def test_the_verdict_on_a_programs_loss_trajectories(noise, candidate, verdict, passed):
    out = PP.verdict(REF, noise, candidate, STEPS, TOL, 2.0**-8, rtol=0.1)  # the first step: inside 0.1 each
    assert (out["verdict"], out["passed"]) == (verdict, passed)
    if verdict != "not measured":
        assert out["multi_step"]["loss_dev"]["judged"] == (noise is not None and verdict != "not judged")
    assert verdict == "passed" or out["reason"]


def first_off(losses, rel):
    return [losses[0] * (1 + rel)] + losses[1:]


@pytest.mark.parametrize(
    "noise, candidate, random, verdict, failed",
    [
        # a padding-free row whose documents see each other: its first loss 2e-4 off (the tiny Llama of TRL's
        # script), inside any tolerance over many steps, 150 x fp32's rtol from the same weights on the same batch
        ([first_off(REF, 1e-7)] * 3, first_off(REF, 2e-4), False, "failed", ["first-step loss"]),
        ([first_off(REF, 1e-7)] * 3, first_off(REF, 1e-7), False, "passed", []),
        ([first_off(REF, 1e-5)] * 3, first_off(REF, 2e-5), False, "passed", []),  # the band: 8 x the noise
        ([first_off(REF, 1e-7)] * 3, first_off(REF, 2e-4), True, "passed", []),  # dropout: another draw, unjudged
        ([REF[:1] + near(REF, 0.4)[1:]] * 3, first_off(REF, 2e-4), False, "failed", ["first-step loss"]),  # chaotic
        ([first_off(REF, 1e-7)] * 3, near(REF, 0.2), False, "failed", ["first-step loss", "multi-step loss"]),
    ],
)
def test_a_programs_first_loss_is_judged_as_a_step_from_identical_state(noise, candidate, random, verdict, failed):
    out = PP.verdict(REF, noise, candidate, STEPS, TOL, 2.0**-16, rtol=1.3e-6, random=random)
    assert (out["verdict"], out.get("failed")) == (verdict, failed)
    first = out["first_step"]
    assert first["judged"] == (not random) and first["band"] == max(1.3e-6, 8 * first["noise"])
    assert ("first loss" in (out["reason"] or "")) == ("first-step loss" in failed)


def test_a_model_that_draws_random_numbers_in_training_is_told():
    from tests.test_lm_knobs import tiny_llama

    assert not PP.draws_random(tiny_llama())
    assert PP.draws_random(tiny_llama(attention_dropout=0.1))  # transformers' functional attention dropout
    assert PP.draws_random(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))
    assert not PP.draws_random(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))


def check(tmp_path, command: list[str], candidate: dict, where: Path = PROGRAMS, baseline: dict | None = None):
    """program_parity.check on `command` (in tests/programs), each run a real process through the launcher."""
    base = {**K.pytorch_defaults(None), **(baseline or {})}
    runs = []

    def run(knobs, label, noise=None):
        parity = {"baseline": base, "steps": STEPS, "tolerance": TOL, **({"noise": noise} if noise else {})}
        config = {
            "workload": {"command": command, "dir": str(where)},
            "knobs": {k: v for k, v in knobs.items() if v != base.get(k)},
            "parity_only": True,
            "parity": parity,
            "seed": 0,
            "device": "cpu",
        }
        runs.append(label)
        return run_in_process(config, tmp_path / label, 120)

    cand = {**base, **candidate}
    verdict, failed = PP.check(
        run, cand, base, {"steps": STEPS, "tolerance": TOL}, device_type="cpu", path=tmp_path / "ref.json", label="p"
    )
    assert failed is None, (failed.status, failed.error)
    return verdict, runs


def test_a_programs_bf16_passes_and_a_cancellation_bf16_rounds_away_fails(tmp_path):
    verdict, runs = check(tmp_path / "healthy", ["python", "parity_mlp.py"], {"precision": "bf16-mixed"})
    assert verdict["verdict"] == "passed", verdict["reason"]
    assert runs == ["p-baseline", "p-noise0", "p-noise1", "p-noise2", "p"]  # the noise runs: its weights perturbed
    assert 0 < verdict["noise_floor"] <= TOL and verdict["max_rel_dev"] <= verdict["multi_step"]["loss_dev"]["band"]
    # the same numerics again: the verdict kept in the run dir, no run
    again, runs = check(
        tmp_path / "healthy", ["python", "parity_mlp.py"], {"precision": "bf16-mixed", "num_workers": 2}
    )
    assert (again["verdict"], again["reference"], runs) == ("passed", "cached", [])

    planted, _ = check(tmp_path / "cancel", ["python", "parity_mlp.py", "--cancel"], {"precision": "bf16-mixed"})
    assert planted["verdict"] == "failed" and "multi-step loss" in planted["failed"]
    assert planted["max_rel_dev"] > 10 * planted["multi_step"]["loss_dev"]["band"]


def test_chaos_a_model_never_handed_over_and_no_loss_are_never_passed(tmp_path):
    chaotic, _ = check(tmp_path / "chaotic", ["python", "parity_mlp.py", "--lr", "3"], {"precision": "bf16-mixed"})
    assert chaotic["verdict"] == "not judged" and "chaotic" in chaotic["reason"]
    unseen, _ = check(tmp_path / "unseen", ["python", "parity_mlp.py", "--functional"], {"precision": "bf16-mixed"})
    assert unseen["verdict"] == "not judged" and "autotune found no model" in unseen["reason"]
    silent, runs = check(tmp_path / "silent", ["python", "parity_mlp.py", "--no_loss"], {"precision": "bf16-mixed"})
    assert silent["verdict"] == "not measured" and runs == ["p-baseline"]  # nothing more to run


# transformers' Trainer on the tiny Llama, its own collator padding each batch (tests/programs/lm_trainer.py)
LM_TRAINER = "python lm_trainer.py --output_dir out --max_steps 100000 --per_device_train_batch_size 4 "
LM_TRAINER += "--report_to none --logging_steps 1000 --disable_tqdm true"
SDPA = {"attention": "sdpa", "padding_free": False}  # the model's own kernel, padded batches


@pytest.mark.slow  # CI tier: this module's bf16 and cancellation checks (the same program parity), test_instrument's
# padding-free rows of a padding collator
def test_padding_free_rows_and_eager_attention_pass_and_documents_that_attend_across_each_other_fail(tmp_path):
    """Padding-free against padded: the same tokens, so the same per-token loss, from the first step (fp32's rtol)
    over every step; eager attention against sdpa the same. The planted fault (lm_trainer.py's `--fault
    positions`: the position ids dropped) lets a row's documents attend across each other: the first loss moves
    6.2e-4 (3.0e-3 over 10 steps, inside the 5% tolerance), far past the first step's band (1.8e-6)."""
    healthy = tmp_path / "healthy"
    flat, runs = check(healthy, LM_TRAINER.split(), {"padding_free": True}, baseline=SDPA)
    assert flat["verdict"] == "passed", flat["reason"]
    assert runs == ["p-baseline", "p-noise0", "p-noise1", "p-noise2", "p"]
    first = flat["first_step"]
    assert first["judged"] and first["rtol"] == 1.3e-6 and first["value"] <= first["band"]
    eager, runs = check(healthy, LM_TRAINER.split(), {"attention": "eager"}, baseline=SDPA)
    assert (eager["verdict"], runs) == ("passed", ["p"]), eager["reason"]  # the baseline's runs kept
    # the fault acts on padding-free rows alone, so the baseline's runs are the healthy script's (measured: the
    # faulty script's own baseline and noise runs, as the slow test below makes them, gave the same losses to the
    # bit); its verdicts are not the faulty script's
    planted_dir = tmp_path / "positions"
    planted_dir.mkdir()
    reference = {**json.loads((healthy / "ref.json").read_text()), "verdicts": {}}
    (planted_dir / "ref.json").write_text(json.dumps(reference))
    command = [*LM_TRAINER.split(), "--fault", "positions"]
    planted, runs = check(planted_dir, command, {"padding_free": True}, baseline=SDPA)
    assert (planted["verdict"], planted["failed"], runs) == ("failed", ["first-step loss"], ["p"]), planted
    assert planted["first_step"]["value"] > 100 * planted["first_step"]["band"]
    assert planted["max_rel_dev"] < TOL  # what the multi-step check alone passed (RULE 5)


@pytest.mark.slow  # ~2 x 5 runs of the Trainer script (~80 s on 2 idle cores): in CI, the fault above
@pytest.mark.parametrize("fault", ["positions", "cache"])
def test_a_padding_free_row_whose_documents_attend_across_each_other_fails_from_its_own_baseline(tmp_path, fault):
    """Each planted fault with its own baseline's runs: the KV cache turned on after the Trainer turned it off
    (transformers builds no packed mask beside a cache) fails as the dropped position ids do."""
    planted, runs = check(tmp_path, [*LM_TRAINER.split(), "--fault", fault], {"padding_free": True}, baseline=SDPA)
    assert (planted["verdict"], planted["failed"]) == ("failed", ["first-step loss"]), planted
    assert planted["first_step"]["value"] > 100 * planted["first_step"]["band"] and planted["max_rel_dev"] < TOL
    assert runs == ["p-baseline", "p-noise0", "p-noise1", "p-noise2", "p"]


@pytest.mark.slow  # in CI: a program's bf16 parity both ways without a search (above), and the late check of a
# search's incumbent whose trial skipped parity (test_checked), which this runs on a program
@pytest.mark.parametrize("cancel", [False, True])
def test_a_searchs_bf16_winner_is_checked_late_and_exported_only_when_it_passes(tmp_path, cancel):
    command = ["python", "parity_mlp.py", "--fp32_ms", "20"] + (["--cancel"] if cancel else [])
    proc = search(
        tmp_path,
        command,
        {"precision": ["32-true", "bf16-mixed"]},
        n_trials=2,
        spec_extra={"safety": {"level": "numerics", "parity_steps": STEPS}},
    )
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    best = yaml.safe_load((run / "best_config.yaml").read_text())
    trial = json.loads((run / "trials" / "0001" / "result.json").read_text())
    assert trial["knobs"]["precision"] == "bf16-mixed" and trial["parity_late"]
    if cancel:
        assert trial["parity"]["verdict"] == "failed"
        assert best["knobs"]["precision"] == "32-true" and best["safety_status"] == "baseline"
        assert best["rejected_faster_but_unsafe"][0]["trial"] == 1
    else:
        assert trial["parity"]["verdict"] == "passed"
        assert best["knobs"]["precision"] == "bf16-mixed" and best["safety_status"] == "parity passed"
        flag = next(f for f in best["safety"] if f["knob"] == "precision")
        assert flag["parity"]["verdict"] == "passed" and flag["parity"]["multi_step"]["loss_dev"]["judged"]


@pytest.mark.slow  # ~80 s: in CI, the loop program's parity runs above (a Trainer reports through the same loop)
@pytest.mark.parametrize(
    "command",
    [
        "python hf_bert.py --output_dir out --max_steps 100000 --per_device_train_batch_size 4 --report_to none",
        "python lightning_clip.py --max_steps 100000 --batch_size 4 --num_workers 0",
    ],
)
def test_a_trainer_script_hands_over_its_model_and_gets_a_verdict(tmp_path, command):
    for f in PROGRAMS.iterdir():  # the script's outputs go under its directory
        if f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    verdict, runs = check(tmp_path, command.split(), {"precision": "bf16-mixed"}, where=tmp_path)
    assert verdict["verdict"] == "passed", verdict["reason"]
    assert verdict["noise_floor"] > 0  # its noise runs perturbed the model its callback handed over
