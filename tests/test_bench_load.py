"""benchmarks/bench_load.py: its bookkeeping (instant) and a run of every loop at toy size.

No timing is asserted: the toy run checks that each loop runs in a fresh interpreter under the
policy it names (the old one never reaching OpenMP, the new one in force).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    path = ROOT / "benchmarks" / "bench_load.py"
    spec = importlib.util.spec_from_file_location("bench_load", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_load"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_child_environments():
    b = _bench()
    base = {"PATH": "/bin", "OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "3",
            "MALLOC_TOP_PAD_": "0"}
    assert b.child_env("old", "unset", base) == {"PATH": "/bin", "OMP_NUM_THREADS": "3",
                                                 "BNMEM_MALLOC": "glibc"}
    assert b.child_env("old", "ACTIVE", base)["OMP_WAIT_POLICY"] == "ACTIVE"
    assert b.child_env("new", "unset", base)["OMP_WAIT_POLICY"] == "PASSIVE"
    assert b.child_env("new", "unset", base)["BNMEM_MALLOC"] == "hold"
    assert b.child_env("new", "unset", base)["MALLOC_TOP_PAD_"] == str(1 << 30)
    from bnmem_utils.core.threads import GLIBC_ENV, policy_env
    assert b.child_env("new", "unset", base) == {"PATH": "/bin", "OMP_NUM_THREADS": "3",
                                                 **policy_env({})}
    assert b.policy_module().GLIBC_ENV == GLIBC_ENV
    assert base["OMP_WAIT_POLICY"] == "ACTIVE"                           # not modified


def test_variants_add_one_thread_only_for_loops_on_more_threads():
    b = _bench()
    assert [v[0] for v in b.variants(["grid", "grads"])] == ["old", "new"]
    out = b.variants(["grid", "bank", "penalty"])
    assert [v[0] for v in out] == ["old", "new", "new, 1 thread"]
    assert out[2][1:] == ("new", 1, ["bank"])


def test_summary_ratios_and_targets():
    b = _bench()
    times = {("bank", "old", 0): [2.0, 3.0, 2.5], ("bank", "old", 1): [20.0, 30.0, 25.0],
             ("bank", "new", 0): [2.4, 2.6, 2.0], ("bank", "new", 1): [4.0, 5.0, 6.0],
             ("grid", "old", 0): [1.0], ("grid", "new", 0): [1.0], ("grid", "new", 1): [2.5]}
    rows = b.summarise(times, [0, 1])
    by = {(r["loop"], r["variant"]): r for r in rows}
    assert by["bank", "old"]["median_s"] == {0: 2.5, 1: 25.0}
    assert by["bank", "old"]["x_idle"] == {1: pytest.approx(10.0)}
    assert by["bank", "new"]["x_idle"] == {1: pytest.approx(5.0 / 2.4)}
    verdicts = {text: (x, sign, ok) for text, x, sign, ok in b.targets(rows)}
    assert verdicts["bank: beside 1 busy process, new policy, x idle <= 2"] == (
        pytest.approx(5.0 / 2.4), "", False)
    assert verdicts["bank: idle, new / old <= 1.05"] == (pytest.approx(2.4 / 2.5), "", True)
    assert verdicts["grid: beside 1 busy process, new policy, x idle <= 2"][2] is False
    assert "grid: idle, new / old <= 1.05" in verdicts
    text = b.table(rows, [0, 1], {("bank", "new"): 2})
    assert "| bank (04) | new | 2 | 2.4 s | 5.0 s (**2.08x**) | 0.96x |" in text


def test_a_stopped_run_counts_as_a_lower_bound():
    b = _bench()
    lines = [{"start": "grid", "wall": 100.0}, {"loop": "grid", "seconds": 3.0},
             {"start": "bank", "wall": 104.0}]
    assert b.censor(lines, 164.0) == [{"loop": "grid", "seconds": 3.0},
                                      {"loop": "bank", "seconds": 60.0, "censored": True}]
    assert b.censor(lines[:2], 164.0) == [{"loop": "grid", "seconds": 3.0}]
    times = {("bank", "old", 0): [3.0], ("bank", "old", 1): [60.0, 70.0, 80.0],
             ("bank", "new", 0): [2.0, 30.0, 2.0], ("bank", "new", 1): [3.0]}
    rows = b.summarise(times, [0, 1], {("bank", "old", 1), ("bank", "new", 0)})
    verdicts = {text: (sign, ok) for text, x, sign, ok in b.targets(rows)}
    # new idle is a lower bound, so is its ratio to old idle (0.67): it cannot tell
    assert verdicts["bank: idle, new / old <= 1.05"] == (">=", None)
    assert verdicts["bank: beside 1 busy process, new policy, x idle <= 2"] == ("<=", True)
    text = b.table(rows, [0, 1], {})
    assert "| bank (04) | old | ? | 3.0 s | >= 70.0 s (**>=23.33x**) |  |" in text
    assert b.verdict(3.0, ">=", 2) is False and b.verdict(1.5, ">=", 2) is None
    assert b.verdict(3.0, "<=", 2) is None and b.verdict(1.5, "?", 2) is None


@pytest.mark.slow(minutes=1)
def test_every_loop_runs_under_the_policy_it_names(capsys):
    b = _bench()
    rows = b.main(["--tiny", "--busy", "0", "--repeats", "1"])
    assert {(r["loop"], r["variant"]) for r in rows} == {
        *((loop, v) for loop in b.LOOPS for v in ("old", "new")), ("bank", "new, 1 thread")}
    assert all(r["median_s"][0] > 0 for r in rows)
    out = capsys.readouterr().out
    assert "old: OMP_WAIT_POLICY unset, in force: False" in out
    assert "new: OMP_WAIT_POLICY PASSIVE, in force: True" in out


def test_paired_mode_interleaves_the_policies_and_gives_each_loop_an_interval(capsys):
    b = _bench()
    rows = b.main(["--tiny", "--loops", "grid", "--paired", "2"])
    assert [r["loop"] for r in rows] == ["grid"] and rows[0]["pairs"] == 2
    r = rows[0]
    assert r["old_s"] > 0 and r["new_s"] > 0 and r["lo"] <= r["ratio"] <= r["hi"]
    out = capsys.readouterr().out
    assert out.index("pair 1/2 old") < out.index("pair 1/2 new")    # old first, then new first
    assert out.index("pair 2/2 new") < out.index("pair 2/2 old")
    with pytest.raises(SystemExit):
        b.main(["--paired", "1"])
