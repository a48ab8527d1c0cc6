"""benchmarks/gpu_smoke.py: the rates its projection of the gpu and paper profiles uses, and its
--tiny run on the CPU.

The --tiny run trains for about 40 s on 2 CPU cores, so it is marked slow; the bookkeeping test
is instant.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "benchmarks" / "gpu_smoke.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_projection_rates_come_from_the_parts_or_the_table_labelled(monkeypatch, tmp_path):
    """Part 4 without --measure-rates: parts 1 and 3's rates where they measured, the RATES
    table's for every other key the gpu and paper profiles train, each labelled."""
    from bnmem_utils.run import work

    monkeypatch.chdir(tmp_path)                      # the profiles are found from anywhere
    smoke = _smoke()
    args = argparse.Namespace(
        models=64, epochs=10, samples=60_000, bank_batch=128, bank_steps=40, measure_rates=False)
    b = {"vec_s": 47.7, "seq_s": 47.7 * 23.1}
    rates = smoke.measured_rates(args, torch.device("cpu"), b,
                                 {"resnet20": {"vec": 1e5, "seq": 3e4}})
    keys = {(r.arch, r.shape, r.vectorised) for name in ("gpu", "paper")
            for rows in work.training_work(name).values() for r in rows}
    assert keys <= set(rates)
    lenet = rates[("lenet", work.MNIST_SHAPE, False)]                  # 02's runs, from part 1
    assert lenet.value == pytest.approx(work.MEASURED[("lenet", work.MNIST_SHAPE, False)].value)
    assert lenet.source.startswith("measured here")
    assert rates[("resnet20", work.CIFAR_SHAPE, True)].value == 1e5
    r18 = rates[("resnet18", work.CIFAR_SHAPE, False)]
    assert r18.value == work.RATES[("resnet18", work.CIFAR_SHAPE, False)].value
    assert r18.source.startswith("from RATES")


@pytest.mark.slow
def test_tiny_run_passes_on_the_cpu(capsys, tmp_path):
    """Every part runs and prints; its --json holds a rate for every key the gpu and paper
    profiles train, which bnmem_utils.run.work refuses to project from (a --tiny CPU run) until
    the file says it is a full-size CUDA run."""
    import json

    from bnmem_utils.run import work

    path = tmp_path / "rates.json"
    _smoke().main(["--tiny", "--device", "cpu", "--json", str(path), "--commit", "abc1234"])
    out = capsys.readouterr().out
    for part in ("[1]", "[2]", "[3]", "[4]", "profile gpu:", "profile paper:", "all notebooks:",
                 "total wall time", "bare step, fp32", "bank member", "of the bare fp32 step",
                 "no bf16 peak known", "resnet18", "densenet", "rule: sequential"):
        assert part in out
    with pytest.raises(ValueError, match="measured with --tiny on cpu; only a full-size run on a CUDA GPU"):
        work.load_rates(path)
    doc = json.loads(path.read_text())
    assert doc["machine"]["commit"] == "abc1234" and "--tiny" in doc["machine"]["command"]
    assert doc["parts"]["trainers"]["resnet18"]["seq"] > 0
    doc["machine"] |= {"device": "cuda", "tiny": False}
    path.write_text(json.dumps(doc))
    machine, measured = work.load_rates(path)
    keys = {(r.arch, r.shape, r.vectorised) for name in ("gpu", "paper")
            for rows in work.training_work(name).values() for r in rows}
    assert keys <= set(measured)
    assert all(r.source.startswith("measured (one ") and "commit abc1234" in r.source
               for r in measured.values())
