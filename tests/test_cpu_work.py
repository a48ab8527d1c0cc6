"""bnmem_utils.run.cpu_work and the CPU rates file: a profile's work projected on a CPU.

The CPU rates file (``bnmem_utils/run/cpu_rates.json``, ``benchmarks/bench_cpu_archs.py
--json``) is read by :func:`bnmem_utils.run.rates.load_cpu_rates`, which refuses what is no CPU
measurement and labels a toy-size one; the work is the GPU projection's with the CPU's bank
trainers; a projection is checked against a hand count; and the ``archs`` profile's block is
what ``python -m bnmem_utils.run.work --rates cpu --write`` generates, within its budget.
"""

from __future__ import annotations

import json

import pytest

from bnmem_utils.jobs.config import PenaltyConfig, RunConfig, bank_trainer
from bnmem_utils.models.nets import ARCHS
from bnmem_utils.run import cpu_work as C
from bnmem_utils.run import plan as runplan
from bnmem_utils.run import rates as R
from bnmem_utils.run import work as W

MNIST = R.MNIST_SHAPE


def _cpu_file(tmp_path, tiny: bool = False, **machine) -> tuple:
    doc = {"machine": {"short": "Some CPU, 2 logical CPUs", "device": "cpu", "threads": 2,
                       "torch": "2.x", "date": "2026-12-07", "commit": "abc1234",
                       "command": "benchmarks/bench_cpu_archs.py", "tiny": tiny, **machine},
           "rates": [{"arch": "lenet", "shape": list(MNIST), "vectorised": True, "rate": 20000.0,
                      "how": "blocks"},
                     {"arch": "lenet", "shape": list(MNIST), "vectorised": False, "rate": 8000.0,
                      "how": "one per thread", "forward_speedup": 4.0},
                     {"arch": "resnet20", "shape": list(MNIST), "vectorised": False,
                      "rate": 400.0, "how": "one per thread", "forward_speedup": 3.5},
                     {"arch": "densenet", "shape": list(MNIST), "vectorised": False,
                      "rate": 100.0, "how": "one per thread"}]}
    path = tmp_path / "cpu_rates.json"
    path.write_text(json.dumps(doc))
    return path, doc


def test_a_cpu_rates_file_is_read_and_a_toy_one_says_so(tmp_path):
    path, _ = _cpu_file(tmp_path)
    machine, rates = R.load_cpu_rates(path)
    assert machine["device"] == "cpu" and len(rates) == 4
    r20 = rates[("resnet20", MNIST, False)]
    assert r20.value == 400.0 and r20.source.startswith("measured (Some CPU, 2 logical CPUs")
    assert "2 threads" in r20.source and r20.source.endswith("; one per thread)")
    path, _ = _cpu_file(tmp_path, tiny=True)
    _, rates = R.load_cpu_rates(path)
    assert all(r.source.startswith("measured at toy sizes (") for r in rates.values())


@pytest.mark.parametrize("change, words", [
    (dict(machine={"device": "cuda"}), "measured on cuda; a CPU projection needs rates measured on a CPU"),
    (dict(rate={"arch": "vgg"}), "rates[0] = {'arch': 'vgg'"),
    (dict(rate={"rate": 0}), "is not a rate of a known architecture"),
    (dict(twice=True), "rates[4] measures lenet 1x28x28, K at once a second time"),
])
def test_what_is_no_cpu_measurement_is_refused(tmp_path, change, words):
    path, doc = _cpu_file(tmp_path, **change.get("machine", {}))
    doc["rates"][0] |= change.get("rate", {})
    doc["rates"] += [doc["rates"][0]] if change.get("twice") else []
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as err:
        R.load_cpu_rates(path)
    assert str(path) in str(err.value) and words in str(err.value)
    (tmp_path / "bad.json").write_text("[")
    with pytest.raises(ValueError, match="not a rates file of benchmarks/bench_cpu_archs.py"):
        R.load_cpu_rates(tmp_path / "bad.json")


def test_the_gpu_loader_still_refuses_a_cpu_file(tmp_path):
    path, _ = _cpu_file(tmp_path)
    with pytest.raises(ValueError, match="measured on cpu; only a full-size run on a CUDA GPU"):
        R.load_rates(path)


def test_rates_not_measured_are_derived_by_flops(tmp_path):
    rates = C.cpu_rates(_cpu_file(tmp_path)[0])
    table, g = rates.rates, R.TRAIN_GFLOP
    cifar = R.CIFAR_SHAPE
    assert table[("resnet20", cifar, False)].value == pytest.approx(
        400 * g[("resnet20", MNIST)] / g[("resnet20", cifar)])
    assert table[("resnet18", MNIST, False)].value == pytest.approx(
        400 * g[("resnet20", MNIST)] / g[("resnet18", MNIST)])
    assert table[("resnet18", MNIST, False)].source.startswith(f"{R.DERIVED}: resnet20 at 28x28")
    assert table[("lenet", cifar, True)].value == pytest.approx(
        20000 * g[("lenet", MNIST)] / g[("lenet", cifar)])
    assert ("resnet20", MNIST, True) not in table              # no wide network K at once
    assert rates.speedups[("resnet20", MNIST, False)].value == 3.5
    assert rates.forward.value == 3.0 and ("densenet", MNIST, False) not in rates.speedups


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("penalty", [None, PenaltyConfig(0.1)])
def test_the_cpu_rows_train_as_the_cpu_rule_says(arch, penalty):
    config = RunConfig.bank(dataset="fashion_mnist", arch=arch, penalty=penalty)
    row = C.cpu_row(W._row_of("bank", config))
    assert row.vectorised == (bank_trainer(config, "cpu") == "vectorised")
    grid = RunConfig.grid(dataset="fashion_mnist", arch=arch)
    assert C.cpu_row(W._row_of("runs", grid)).vectorised is False


def test_a_projection_matches_a_hand_count(tmp_path):
    rates = C.cpu_rates(_cpu_file(tmp_path)[0])
    rows = [W.WorkRow("a", "resnet20", MNIST, 4, 10, 500.0, False, forward=7000.0),
            W.WorkRow("b", "densenet", MNIST, 2, 5, 300.0, False, forward=900.0,
                      gradients=(100.0, 300.0)),
            W.WorkRow("c", "lenet", MNIST, 8, 3, 1000.0, True)]
    by_hand = ((20000 + 7000 / 3.5) / 400 + (3000 + 900 / 3.0 + 100 + 300 * 2 / 3) / 100
               + 24000 / 20000)
    assert C.projected_seconds(rows, rates) == pytest.approx(by_hand)
    assert C.projected_seconds(rows, rates, forward=False, gradients=False) == pytest.approx(
        20000 / 400 + 3000 / 100 + 24000 / 20000)
    with pytest.raises(ValueError, match="no CPU training rate for resnet20 1x28x28, K at once"):
        C.projected_seconds([rows[0]._replace(vectorised=True)], rates)


def test_an_evaluation_speedup_prices_the_evaluations_alone(tmp_path):
    path, doc = _cpu_file(tmp_path)
    doc["rates"][2] |= {"eval_speedup": 10.0, "evaluation": "after an epoch, batch 1024"}
    path.write_text(json.dumps(doc))
    rates = C.cpu_rates(path)
    assert rates.evaluations[("resnet20", MNIST, False)].value == 10.0
    row = W.WorkRow("a", "resnet20", MNIST, 4, 10, 500.0, False, forward=7000.0, evaluation=5000.0)
    assert C.projected_seconds([row], rates) == pytest.approx((20000 + 2000 / 3.5 + 5000 / 10) / 400)
    dense = row._replace(arch="densenet")           # no evaluation speed-up: as its queries, 3x
    assert C.projected_seconds([dense], rates) == pytest.approx((20000 + 7000 / 3.0) / 100)
    assert "evaluations after an epoch at their own measured speed-up (resnet20 10x)" in " ".join(
        C.projection_lines(W.training_work, "archs", C.CPU_PROFILES["archs"], rates))
    (tmp_path / "toy").mkdir()
    toy, doc = _cpu_file(tmp_path / "toy", tiny=True)
    doc["rates"][2]["eval_speedup"] = 10.0
    toy.write_text(json.dumps(doc))
    assert C.cpu_rates(toy).planned().evaluations == {}       # a plan rests on no toy speed-up
    doc["rates"][0]["eval_speedup"] = 5.0             # on a K-at-once rate: refused
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"rates\[0\] = .* carries a eval_speedup"):
        R.load_query_speedups(path, "eval_speedup")


def test_only_the_selected_notebooks_are_counted():
    every = C.training_work(W.training_work, "archs")
    some = C.training_work(W.training_work, "archs", "02,04")
    assert list(some) == ["02_forced_memorization", "04_lira"]
    assert all(some[nb] == every[nb] for nb in some)
    assert not any(r.vectorised for rows in some.values() for r in rows)


def test_the_cpu_profiles_are_the_deeper_networks_profiles_of_the_docs():
    from bnmem_utils.run import docs

    assert list(docs.DEEP_PROFILES) == list(C.CPU_PROFILES)


@pytest.mark.parametrize("profile", sorted(C.CPU_PROFILES))
def test_each_cpu_profile_holds_its_generated_block(profile):
    text = runplan.available_profiles()[profile].read_text()
    assert text.count(C.BEGIN) == 1 and text.count(C.END) == 1
    block = text[text.index(C.BEGIN):text.index(C.END) + len(C.END)]
    assert block == C.projection_block(W.training_work, profile), (
        f"profiles/{profile}.yaml's block is stale: run `python -m bnmem_utils.run.work --rates "
        "cpu --write` and commit it")


@pytest.mark.parametrize("profile, archs", [("archs", {"resnet20", "densenet"}),
                                            ("densenet", {"densenet"}),
                                            ("densenet_fmnist", {"densenet"}),
                                            ("confound_resnet20", {"resnet20"}),
                                            ("confound_resnet20_mnist", {"resnet20"})])
def test_each_cpu_profile_fits_its_budget_at_the_planned_rates(profile, archs):
    rates = C.cpu_rates().planned()
    rows = [r for rows in C.training_work(W.training_work, profile,
                                          C.CPU_PROFILES[profile]).values() for r in rows]
    assert {r.arch for r in rows} == archs
    assert C.projected_seconds(rows, rates) <= 2 * 3600       # a CPU profile's budget: two hours


def test_the_committed_cpu_rates_file_is_a_cpu_measurement():
    machine, measured = R.load_cpu_rates()
    assert machine["device"] == "cpu"
    assert {k for k in measured} >= {(a, MNIST, False) for a in ("lenet", "resnet20", "densenet")}
    if machine["tiny"]:
        assert "toy sizes" in machine["short"] and "TOY SIZES" in json.loads(
            R.CPU_RATES_FILE.read_text())["about"]


def test_work_projects_a_profile_at_the_cpu_rates(capsys):
    assert W.main(["--rates", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("profile archs:\n" + C.BEGIN)
    assert W.main(["quick", "--rates", "cpu"]) == 2          # the digits: no rate
    assert "--rates cpu: no CPU training rate for lenet" in capsys.readouterr().err
