"""Loss parity of a multi-rank config (autotune.safety.rank_parity): 2 gloo ranks, each on its
shard of the global batch, against the baseline on one rank at the global batch."""

import os

import pytest

import yaml

from autotune import knobs as K
from autotune import spec as S
from autotune.plan import SearchPlan
from autotune.decide import checked
from autotune.execution.launcher import Launch, run_in_process
from autotune.export.best_config import ExportSettings, write_best_config
from autotune.records.run_dir import SearchResult, record_of
from autotune.trial.result import TrialResult

pytestmark = pytest.mark.timeout(300)
BASE = {**K.pytorch_defaults(8), "num_threads": 1}


def two_ranks(workload):
    return S.parse(
        {
            "workload": workload,
            "resources": {"device": "cpu", "ranks_per_trial": 2},
            "search_space": {"preset": None, "knobs": {"precision": ["32-true", "bf16-mixed"]}},
        },
        "late.yaml",
    )


def late_check(tmp_path, workload, knobs):
    """The late check a 2-rank search asks for (`TrialSettings.parity_check`), run as its trials run."""
    spec = two_ranks(workload)
    parity = {"baseline": BASE, "steps": 8, "tolerance": 0.05, "reference": str(tmp_path / "ref.pt")}
    settings = SearchPlan.of(spec).trial_settings("cpu", BASE, parity=parity)
    config = settings.parity_check().config({**BASE, **knobs})
    assert config["ranks"] == 2 and config["parity_only"]
    # spawned: a fork server preloading tests.workloads is test_launcher's to count
    return run_in_process(config, tmp_path, timeout_s=240, pythonpath=os.getcwd(), launch=Launch("spawn"))


def test_a_two_rank_bf16_ddp_config_passes_against_one_rank_at_the_global_batch(tmp_path):
    result = late_check(
        tmp_path,
        {"name": "tiny_transformer"},
        {"precision": "bf16-mixed", "ddp_bucket_cap_mb": 1, "ddp_gradient_as_bucket_view": True},
    )
    assert result.status == "ok", result.error
    parity = result.parity
    assert parity["passed"], parity["reason"]
    assert parity["ranks"] == 2 and parity["global_batch"] == 16 and result.metrics["ranks"] == 2
    # the per-step errors are bf16's, inside bands set by the noise of one rank at the global batch
    assert 0 < parity["per_step"]["grad"]["max"] <= parity["per_step"]["grad"]["band"]
    assert (tmp_path / "ref.ranks2.pt").exists()  # the global batch's reference, next to the single-rank one


@pytest.mark.parametrize("sharding", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])  # fsdp's gather: CI's above
def test_a_loss_summed_over_the_batch_fails_on_two_ranks(tmp_path, sharding):
    # DDP and FSDP average the ranks' gradients: with a summed loss, each is half of the global
    # batch's (FSDP's, gathered from its shards)
    result = late_check(tmp_path, {"factory": "tests.workloads:make_summed_loss"}, {"sharding": sharding})
    assert result.status == "ok", result.error
    parity = result.parity
    assert not parity["passed"] and "per-step grad error" in parity["reason"], parity["reason"]
    assert parity["per_step"]["grad"]["max"] == pytest.approx(0.5, abs=0.01)


def test_an_fsdp_winner_is_checked_on_two_ranks_and_exported_as_parity_passed(tmp_path):
    # FSDP2 shards the parameters, gradients and optimizer state: parity gathers them whole
    # (and shards the baseline's state to load them), then judges them as DDP's, and the
    # winner's late check (`checked.pick_checked`, as a search's end runs it) clears it
    fsdp = {**BASE, "precision": "bf16-mixed", "sharding": "fsdp", "fsdp_reshard_after_forward": False}
    windows = [(0, BASE, 100.0), (1, fsdp, 150.0)]  # the windows are not the subject: the late check is
    records = [
        record_of(
            n, k, TrialResult.from_dict({"status": "ok", "metrics": {"samples_per_s": v}}), None, is_baseline=n == 0
        )
        for n, k, v in windows
    ]
    workload = {"name": "tiny_transformer"}
    best = checked.pick_checked(records, lambda knobs, label: late_check(tmp_path, workload, knobs))
    assert best is records[1] and best.info["parity_late"]
    parity = best.parity
    assert parity["passed"], parity["reason"]
    assert parity["ranks"] == 2 and parity["global_batch"] == 16
    # bf16's per-step error, inside its band; one fixed batch overfit as the baseline's
    assert 0 < parity["per_step"]["grad"]["max"] <= parity["per_step"]["grad"]["band"]
    assert parity["overfit"]["judged"] and parity["overfit"]["candidate"] >= 0.9 * parity["overfit"]["baseline"]
    space = K.Space(baseline=BASE, search={}, fixed={}, dropped=[])
    device = K.Device("cpu", 2, "cpu", ranks=2)
    result = SearchResult(tmp_path, space, device, records, records[0], best, 10.0, {}, None)
    spec = two_ranks(workload)
    write_best_config(
        result,
        tmp_path / "best_config.yaml",
        ExportSettings(
            name=spec.name,
            workload=spec.workload,
            flags=spec.search_space.flags(),
            ranks=spec.resources.ranks_per_trial,
        ),
    )
    data = yaml.safe_load((tmp_path / "best_config.yaml").read_text())
    assert data["safety_status"] == "parity passed" and data["knobs"]["sharding"] == "fsdp"
