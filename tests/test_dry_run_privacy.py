"""The ``paper`` profile's notebooks 04, 05 and 06 under ``--dry-run`` on a CPU: every LiRA data
set, architecture, norm and outlier rate, the mitigation sweep and the report (notebooks 01-03 are in ``test_dry_run.py``, the confound study 04b in
``test_dry_run_confound.py``: three files, so the suite's two workers share them evenly)."""

from __future__ import annotations

import pytest
from fake_data import paper_dry_run

from bnmem_utils.run.plan import load_profile


@pytest.mark.slow(minutes=4)
def test_paper_profile_runs_as_a_dry_run_lira_mitigation_report(tmp_path_factory, monkeypatch):
    results = paper_dry_run(tmp_path_factory, monkeypatch, ["04", "05", "06"])
    params = results["04_lira"]["meta"]["parameters"]
    _, profile = load_profile("paper")
    assert params["lira_datasets"] == profile["lira_datasets"] and "cifar10" in params["lira_datasets"]
    assert params["lira_archs"] == ["resnet18", "resnet20"] and params["lira_norms"] == ["bn", "none"]
    # every data set records its own numbers (the keys name it): none hides another's
    recorded = results["04_lira"]["results"]
    for ds in params["lira_datasets"]:
        for arch in params["lira_archs"]:
            for key in (f"lira_auc_diff_bn_none_{ds}_{arch}_ood5_all",
                        f"lira_auc_diff_bn_none_{ds}_{arch}_ood5_outlier"):
                assert key in recorded, key
    assert results["05_mitigation"]["meta"]["parameters"]["mit_arch"] == "resnet18"
    assert results["04_lira"]["results"] and results["05_mitigation"]["results"]
    assert results["06_report"]["results"]          # the report judged what 04 and 05 recorded
    assert results["summary"]["dry_run"]["lira_epochs"] == 1
