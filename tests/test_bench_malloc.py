"""benchmarks/bench_malloc.py on a tiny bank: the three allocator settings run, each is the one asked
for, and they build the same scores."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_malloc.py"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_tiny_bank_under_both_settings(capsys):
    spec = importlib.util.spec_from_file_location("bench_malloc", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--dataset", "digits", "--models", "4", "--epochs", "1", "--repeats", "1",
                      "--threads", "1", "--train-size", "200"])
    assert out["held"] == {"glibc": [False], "mallopt": [True], "start": [True]}
    assert out["same"] is True
    assert "glibc / start =" in capsys.readouterr().out
