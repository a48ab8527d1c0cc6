"""The dry-run shrink, and the ``paper`` profile proven end to end on a CPU in minutes.

A researcher who starts ``bnmem reproduce --profile paper`` on a GPU must not meet a crash hours
in: every notebook runs here under ``paper --dry-run`` (one epoch, one seed, a few dozen
samples, N = 4), on MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 files the test writes in
torchvision's formats, with every data set, architecture, norm and attack of the profile kept.
"""

from __future__ import annotations

import json

import pytest
from fake_data import fake_paper_data

from bnmem_utils import runner


def _table():
    return runner.notebook_parameter_table(runner.discover_notebooks())


@pytest.mark.parametrize("profile", ["paper", "quick", "fmnist", "smoke"])
def test_dry_run_shrinks_sizes_and_keeps_what_is_compared(profile):
    name, values = runner.load_profile(profile)
    table = _table()
    shrunk = runner.dry_run_values(values, table)
    runner.validate_values(shrunk, table, source="--dry-run")   # every value fits its notebook
    merged = {k: v for params in table.values() for k, v in params.items()} | values | shrunk
    for key, value in merged.items():
        if key.endswith("_epochs") and isinstance(value, int):
            assert value <= 1, (key, value)
        if key.endswith(("_n_models", "_bank_models")):
            assert value in (0, 4), (key, value)
        if key.endswith("_train_size"):
            assert value is not None and value <= 32, (key, value)
        if key.endswith("_test_size"):
            assert value is not None and value <= 16, (key, value)
    for kept in ("mem_datasets", "mem_archs", "mem_norms", "gn_norms", "gn_arch", "lira_datasets",
                 "lira_archs", "lira_norms", "lira_attack", "mit_ref_norms", "mit_arch"):
        assert merged[kept] == ({**{k: v for p in table.values() for k, v in p.items()}, **values}
                                )[kept], kept
    # A rate list keeps its largest rate, and the clean setting where it was listed.
    rates = values.get("lira_outlier_rates", table["04_lira"]["lira_outlier_rates"])
    assert shrunk["lira_outlier_rates"] == sorted({max(rates)} | ({0.0} & set(rates)))
    # The gap-matched curve keeps a second point: 2 epochs beside the banks' 1.
    assert shrunk["lira_gap_epochs"] == [2]


def test_dry_run_keeps_an_empty_gap_curve_empty():
    table = _table()
    shrunk = runner.dry_run_values({"lira_gap_epochs": []}, table)
    runner.validate_values(shrunk, table, source="--dry-run")
    assert shrunk["lira_gap_epochs"] == []


def test_dry_run_plan_writes_aside_and_set_still_wins(tmp_path, monkeypatch):
    from bnmem_utils import data

    monkeypatch.setattr(data, "dataset_available", lambda name, root=None: True)
    plan = runner.plan_run("paper", only=["04"], dry_run=True,
                           overrides={"lira_n_models": 6})
    assert plan.out_dir.endswith("runs/dry-run") and plan.dry_run["lira_epochs"] == 1
    (job,) = plan.jobs
    assert job.parameters["lira_n_models"] == 6 and job.parameters["lira_epochs"] == 1
    assert job.parameters["lira_archs"] == ["resnet18", "resnet20"]
    assert runner.plan_run("paper", only=["04"], dry_run=True, out_dir=tmp_path).out_dir == \
        str(tmp_path)


@pytest.mark.slow(minutes=6)
def test_paper_profile_runs_end_to_end_as_a_dry_run(tmp_path_factory, monkeypatch):
    data_root = fake_paper_data(tmp_path_factory.mktemp("paper-data"), monkeypatch)
    monkeypatch.setenv("BNMEM_DATA", str(data_root))
    out = tmp_path_factory.mktemp("paper-dry-run")
    summary = runner.reproduce("paper", dry_run=True, out_dir=out, log_output=False,
                               progress=False, device="cpu")
    failed = [f"{r.notebook}: {r.error}\n{r.cell}\n(executed copy: {r.output})"
              for r in summary.results if not r.ok]
    assert not failed, "\n".join(failed)
    assert [r.notebook for r in summary.results] == list(runner.discover_notebooks())
    results = {p.stem: json.loads(p.read_text())
               for p in (out / "runs" / "paper" / "results").glob("*.json")}
    # Every data set, architecture and norm of the profile trained at least one step.
    params = results["02_forced_memorization"]["meta"]["parameters"]
    assert params["mem_datasets"] == ["mnist", "fashion_mnist", "cifar10", "cifar100"]
    assert set(params["mem_archs"]) == {"lenet", "resnet18", "densenet"}
    assert results["04_lira"]["meta"]["parameters"]["lira_archs"] == ["resnet18", "resnet20"]
    assert all(r["results"] for r in results.values() if r["meta"]["notebook"] != "06_report")
    summary_file = json.loads((out / "runs" / "paper" / "summary.json").read_text())
    assert summary_file["dry_run"]["mem_epochs"] == 1
