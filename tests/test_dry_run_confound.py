"""The ``paper`` profile's confound study (notebook 04b) under ``--dry-run`` on a CPU: CIFAR-10
and ResNet-18, all four norms on a two-rung ladder and the weight-decay knob (the rest of the
paper dry run is in ``test_dry_run.py`` and ``test_dry_run_privacy.py``)."""

from __future__ import annotations

import pytest
from fake_data import paper_dry_run


@pytest.mark.slow(minutes=4)
def test_paper_profile_runs_as_a_dry_run_confound_study(tmp_path_factory, monkeypatch):
    results = paper_dry_run(tmp_path_factory, monkeypatch, ["04b"])
    # CIFAR-10 / ResNet-18, all four norms on a two-rung ladder, every claim
    # key recorded (with a number, or none when the tiny banks' gap ranges do not overlap)
    cf = results["04b_confound"]
    assert cf["meta"]["parameters"]["cf_arch"] == "resnet18"
    assert cf["meta"]["parameters"]["cf_epochs"] == [1, 2]
    from bnmem_utils.analyses.matched_gap import RULERS

    for norm in ("none", "gn", "ln"):
        for ruler in RULERS:
            key = f"confound_auc_diff_bn_{norm}_cifar10_resnet18_ood1_mid_{ruler}"
            assert key in cf["results"], key
