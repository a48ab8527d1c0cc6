"""The record of a fresh clone's ``.ci/run`` and the README sentence generated from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bnmem_utils.run import docs, fresh_clone

ROOT = Path(__file__).resolve().parents[1]
STAGES = {"install": {"seconds": 142.0, "rc": 0, "clean": True},
          "command 1": {"seconds": 571.0, "rc": 0, "clean": True},
          "command 2": {"seconds": 785.0, "rc": 0, "clean": True}}


@pytest.mark.parametrize("log, counts", [
    ("...\n====== 1247 passed, 3 skipped, 1 xpassed in 785.12s (0:13:05) ======\n",
     "1247 passed, 3 skipped, 1 xpassed"),
    ("= 1 failed, 20 passed, 2 warnings in 3.50s =\r\n", "1 failed, 20 passed, 2 warnings"),
    ("=== 5 passed in 0.1s ===\nlater: === 6 passed in 0.2s ===", "6 passed"),
    ("no summary: killed", ""),
])
def test_pytest_counts_come_from_its_closing_line(log, counts):
    assert fresh_clone.pytest_counts(log) == counts


@pytest.fixture
def clone(tmp_path):
    """A clone after command 1: the published quick figures, the run's own copy of them, and
    its summary.json."""
    shutil.copytree(ROOT / "figures" / "quick", tmp_path / "figures" / "quick")
    run = tmp_path / "runs" / "quick"
    shutil.copytree(ROOT / "figures" / "quick", run / "figures")
    (run / "summary.json").write_text(json.dumps({"notebooks": [
        {"notebook": "01_theory", "status": "ok", "wall_s": 15.04},
        {"notebook": "02_forced_memorization", "status": "failed", "wall_s": 3.0}]}))
    return tmp_path


def test_a_record_holds_the_stages_notebooks_comparison_and_tests(clone):
    rec = fresh_clone.record(stages=STAGES, cmd2_log="== 12 passed, 1 skipped in 9.9s ==",
                             cache_files_before=0, load="0.05 0.20 0.30 1/200 7",
                             commit="abc1234", root=clone)
    assert rec["commit"] == "abc1234" and rec["stages"] == STAGES
    assert rec["notebooks"] == {"01_theory": 15.0}                  # the notebooks that ran
    n = len([line for line in (clone / "figures/quick/06_claims_forest.csv").open()][1:])
    assert n > 10 and rec["comparison"] == f"{n} of {n} verdicts match; 0 rows print other numbers"
    assert rec["pytest"] == "12 passed, 1 skipped" and "logical CPUs" in rec["machine"]
    text = docs.fresh_clone_sentence(rec)
    assert text.startswith("On a fresh clone at commit abc1234 (")
    for part in ("load 0.05 at the start", "**142 s**", "**9.5 min** (571 s, every model "
                 "trained: an empty cache; compared with the published run, "
                 f"{n} of {n} verdicts match", "**13.1 min** (785 s, 12 passed, 1 skipped)",
                 "`git status` clean after each"):
        assert part in text, part


def test_a_failed_or_unclean_run_is_no_timing(clone):
    rec = fresh_clone.record(stages=STAGES, cmd2_log="", cache_files_before=3, load="1.0",
                             commit="abc1234", root=clone)
    assert "3 cache files already there" in docs.fresh_clone_sentence(rec)
    for stage, change in (("command 2", {"rc": 1}), ("command 1", {"clean": False})):
        bad = {**rec, "stages": {**STAGES, stage: {**STAGES[stage], **change}}}
        with pytest.raises(ValueError, match=f"did not pass cleanly \\({stage}\\)"):
            docs.fresh_clone_sentence(bad)
    with pytest.raises(ValueError, match="a stage is missing"):
        docs.fresh_clone_sentence({**rec, "stages": {"install": STAGES["install"]}})


def test_the_recorder_command_writes_the_record(clone, tmp_path, monkeypatch):
    monkeypatch.setattr(fresh_clone, "project_root", lambda: clone)
    log = tmp_path / "command2.log"
    log.write_text("==== 7 passed in 1.00s ====\n")
    out = tmp_path / "record.json"
    assert fresh_clone.main(["--out", str(out), "--stage", "install=10:0:clean",
                             "--stage", "command 1=20:0:clean", "--stage", "command 2=30:0:clean",
                             "--cmd2-log", str(log), "--cache-files-before", "0",
                             "--load", "0.5 0.4 0.3 1/1 1", "--commit", "f00d"]) == 0
    rec = json.loads(out.read_text())
    assert rec["stages"]["command 1"] == {"seconds": 20.0, "rc": 0, "clean": True}
    assert rec["pytest"] == "7 passed" and rec["commit"] == "f00d"

