"""The dry-run shrink, and the ``paper`` profile proven end to end on a CPU in minutes.

A researcher who starts ``bnmem reproduce --profile paper`` on a GPU must not meet a crash hours
in: every notebook runs here under ``paper --dry-run`` (one epoch, one seed, a few dozen
samples, N = 4), on MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 files the test writes in
torchvision's formats, with every data set, architecture, norm and attack of the profile kept.
Notebooks 01-03 run here and 04-06 in ``test_dry_run_privacy.py``: two files, so that the
suite's two workers run the halves side by side.
"""

from __future__ import annotations

import pytest
from fake_data import paper_dry_run

from bnmem_utils.run import params as runparams
from bnmem_utils.run import plan as runplan


def _table():
    return runplan.notebook_parameter_table(runplan.discover_notebooks())


@pytest.mark.parametrize("profile", ["paper", "gpu", "quick", "fmnist", "smoke", "confound"])
def test_dry_run_shrinks_sizes_and_keeps_what_is_compared(profile):
    name, values = runplan.load_profile(profile)
    table = _table()
    shrunk = runplan.dry_run_values(values, table)
    runplan.validate_values(shrunk, table, source="--dry-run")   # every value fits its notebook
    merged = {k: v for params in table.values() for k, v in params.items()} | values | shrunk
    for key, value in merged.items():
        if key.endswith("_epochs") and isinstance(value, int):
            assert value <= 1, (key, value)
        if key.endswith(("_n_models", "_bank_models")):
            assert value in (0, 4), (key, value)
        if key.endswith("_train_size"):   # the confound pool: one of its 1% outliers
            assert value is not None and value <= (52 if key == "cf_train_size" else 32), (key, value)
        if key.endswith("_test_size"):
            assert value is not None and value <= 16, (key, value)
    for kept in ("mem_datasets", "mem_archs", "mem_norms", "grad_norms", "grad_archs", "lira_datasets",
                 "lira_archs", "lira_norms", "lira_attack", "mit_ref_norms", "mit_arch"):
        assert merged[kept] == ({**{k: v for p in table.values() for k, v in p.items()}, **values}
                                )[kept], kept
    assert shrunk["cf_epochs"] == [1, 2]              # the confound ladder keeps two rungs
    # A rate list keeps its largest rate, and the clean setting where it was listed.
    rates = values.get("lira_outlier_rates", table["04_lira"]["lira_outlier_rates"])
    assert shrunk["lira_outlier_rates"] == sorted({max(rates)} | ({0.0} & set(rates)))
    # Every corruption rate keeps a corrupted sample (and every other bound of a real run
    # holds): the dry run proves each setting's path.
    for nb, params in table.items():
        runparams.check_relations({k: merged[k] for k in params}, where=f" of {nb} ({profile})")
    pools = [merged["cf_train_size"], *merged["cf_train_sizes"]]
    assert all(round(merged["cf_outlier_rate"] * n) >= 1 for n in pools), pools
    # A list the profile leaves empty stays empty (no pool-size knob in the quick profile).
    if not values.get("cf_train_sizes", table["04b_confound"]["cf_train_sizes"]):
        assert shrunk["cf_train_sizes"] == []


def test_dry_run_keeps_an_empty_list_empty():
    table = _table()
    shrunk = runplan.dry_run_values({"cf_train_sizes": []}, table)
    runplan.validate_values(shrunk, table, source="--dry-run")
    assert shrunk["cf_train_sizes"] == []


def test_dry_run_plan_writes_aside_and_set_still_wins(tmp_path, monkeypatch):
    from bnmem_utils.data import datasets as data

    monkeypatch.setattr(data, "dataset_available", lambda name, root=None: True)
    plan = runplan.plan_run("paper", only=["04"], dry_run=True,
                           overrides={"lira_n_models": 6})
    assert plan.out_dir.endswith("runs/dry-run") and plan.dry_run["lira_epochs"] == 1
    (job,) = plan.jobs
    assert job.parameters["lira_n_models"] == 6 and job.parameters["lira_epochs"] == 1
    assert job.parameters["lira_archs"] == ["resnet18", "resnet20"]
    assert runplan.plan_run("paper", only=["04"], dry_run=True, out_dir=tmp_path).out_dir == \
        str(tmp_path)


@pytest.mark.slow(minutes=4)
def test_paper_profile_runs_as_a_dry_run_theory_memorization_gradient_norms(tmp_path_factory,
                                                                           monkeypatch):
    results = paper_dry_run(tmp_path_factory, monkeypatch, ["01", "02", "03"])
    # Every data set, architecture and norm of the profile trained at least one step.
    params = results["02_forced_memorization"]["meta"]["parameters"]
    _, profile = runplan.load_profile("paper")
    assert params["mem_datasets"] == ["mnist", "fashion_mnist", "cifar10", "cifar100"]
    assert params["mem_archs"] == profile["mem_archs"] and "densenet" in params["mem_archs"]
    assert params["mem_norms"] == ["bn", "none", "gn", "ln"]
    assert results["03_gradient_norms"]["meta"]["parameters"]["grad_archs"] == ["resnet18"]
    assert all(results[nb]["results"] for nb in
               ("01_theory", "02_forced_memorization", "03_gradient_norms"))
    assert results["summary"]["dry_run"]["mem_epochs"] == 1
