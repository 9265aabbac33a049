"""Loss parity of a multi-rank config (autotune.rank_parity): 2 gloo ranks, each on its
shard of the global batch, against the baseline on one rank at the global batch."""

import os

import pytest

from autotune import spec as S
from autotune.knobs import pytorch_defaults
from autotune.execution.launcher import run_in_process
from autotune.trial.request import TrialSettings

pytestmark = pytest.mark.timeout(300)


def late_check(tmp_path, workload, knobs):
    """The late check a 2-rank search asks for (`TrialSettings.parity_check`), run as its trials run."""
    base = {**pytorch_defaults(8), "num_threads": 1}
    spec = S.parse(
        {
            "workload": workload,
            "resources": {"device": "cpu", "ranks_per_trial": 2},
            "search_space": {"preset": None, "knobs": {"precision": ["32-true", "bf16-mixed"]}},
        },
        "late.yaml",
    )
    parity = {"baseline": base, "steps": 8, "tolerance": 0.05, "reference": str(tmp_path / "ref.pt")}
    config = (
        TrialSettings.of(spec.model_dump(mode="json"), "cpu", base, parity).parity_check().config({**base, **knobs})
    )
    assert config["ranks"] == 2 and config["parity_only"]
    # spawned: a fork server preloading tests.workloads is test_launcher's to count
    return run_in_process(config, tmp_path, timeout_s=240, pythonpath=os.getcwd(), launcher="spawn")


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


def test_a_loss_summed_over_the_batch_fails_on_two_ranks(tmp_path):
    # DDP averages the ranks' gradients: with a summed loss, each is half of the global batch's
    result = late_check(tmp_path, {"factory": "tests.workloads:make_summed_loss"}, {})
    assert result.status == "ok", result.error
    parity = result.parity
    assert not parity["passed"] and "per-step grad error" in parity["reason"], parity["reason"]
    assert parity["per_step"]["grad"]["max"] == pytest.approx(0.5, abs=0.01)
