"""benchmarks/gpu_smoke.py: the paper-profile work it projects, and its --tiny run on the CPU.

The --tiny run trains for about 40 s on 2 CPU cores, so it is marked slow; the bookkeeping test
is instant.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "benchmarks" / "gpu_smoke.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_paper_work_counts_every_training_run(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)                      # the notebooks are found from anywhere
    work = _smoke().paper_work()
    assert set(work) == {"01_theory", "02_forced_memorization", "03_gradient_norms", "04_lira",
                         "04b_confound", "05_mitigation", "06_report"}
    # 04b: four norms along five rungs (BN and no norm as 3 replicate ladders), BN and no norm at
    # two more weight decays and on two smaller pools, N = 64 each
    ladder = work["04b_confound"]
    assert [r[4] for r in ladder] == [2, 4, 8, 15, 30, 30, 30, 30, 30]
    assert sum(r[3] for r in ladder) == (5 * (4 + 2 * 2) + 2 * 2 + 2 * 2) * 64
    assert [r[5] for r in ladder[-2:]] == [6_250, 12_500] and all(r[6] for r in ladder)
    # 02: 4 data sets x 3 architectures, each 4 norms x (3 flip rates + 1 OOD rate) x 3 seeds
    mem = work["02_forced_memorization"]
    assert len(mem) == 12 and {r[3] for r in mem} == {48} and {r[4] for r in mem} == {60}
    assert sum(r[3] for r in mem) == 576                      # the profile's "576 runs"
    # 04: 24 arms, each 3 replicate banks of 64 models, half of CIFAR's 50,000 each, 30 epochs
    lira = work["04_lira"]
    assert sum(r[3] for r in lira) == 24 * 3 * 64 and {r[5] for r in lira} == {25_000}
    assert all(r[6] for r in lira)                             # bank members


@pytest.mark.slow
def test_tiny_run_passes_on_the_cpu(capsys):
    _smoke().main(["--tiny", "--device", "cpu"])
    out = capsys.readouterr().out
    for part in ("[1]", "[2]", "[3]", "[4]", "all notebooks:", "total wall time"):
        assert part in out
