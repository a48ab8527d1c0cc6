"""The live progress line: a kernel's bars write their state to the file the runner names, at
most once a second and atomically; the runner reads it back into one line per notebook."""

from __future__ import annotations

import io
import json
import os
import time

import pytest
import tqdm.auto

from bnmem_utils.run import progress
from bnmem_utils.run.progress import LiveLine, StateBar, StateFile, progress_line, read_state

BANKS = {"desc": "6 banks (24 models)", "unit": "model-epoch", "n": 40, "total": 120,
         "initial": 0, "elapsed": 80.0, "time": 1000.0}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_state_file_writes_at_most_once_per_interval_and_the_last_state_wins(tmp_path):
    clock, path = Clock(), tmp_path / "progress.json"
    state = StateFile(path, interval=0.2, clock=clock)
    assert state.write({"n": 1}) is True
    clock.now = 0.1
    assert state.write({"n": 2}) is False and state.write({"n": 3}) is False
    assert read_state(path) == {"n": 1}                  # held back ...
    time.sleep(0.4)
    assert read_state(path) == {"n": 3}                  # ... then written when the interval is up
    clock.now = 0.5
    assert state.write({"n": 4}) is True and read_state(path) == {"n": 4}
    assert state.write({"n": 5}, force=True) is True and read_state(path) == {"n": 5}
    state.clear()
    assert not path.exists() and read_state(path) is None


def test_state_file_is_renamed_into_place_whole(tmp_path, monkeypatch):
    path, seen = tmp_path / "progress.json", []
    replace = os.replace

    def spy(src, dst):
        seen.append((os.fspath(dst), json.loads(open(src).read())))
        replace(src, dst)

    monkeypatch.setattr(progress.os, "replace", spy)
    StateFile(path).write({"n": 7, "total": 9})
    assert seen == [(os.fspath(path), {"n": 7, "total": 9})]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]   # no temporary left


@pytest.fixture
def bars(monkeypatch):
    """tqdm.auto and the bars' state file as they were, after the test."""
    monkeypatch.setattr(tqdm.auto, "tqdm", tqdm.auto.tqdm)
    monkeypatch.setattr(StateBar, "state", None)
    monkeypatch.setattr(StateBar, "_open", [])


def test_without_the_variable_the_bars_stay_tqdms_own(bars, tmp_path, monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    own = tqdm.auto.tqdm
    assert progress.install() is False
    assert tqdm.auto.tqdm is own
    for _ in tqdm.auto.tqdm(range(3), desc="runs", file=io.StringIO()):
        pass
    assert list(tmp_path.iterdir()) == []


def test_under_the_runner_the_outermost_bar_reports_and_draws_nothing(bars, tmp_path, monkeypatch,
                                                                      capsys):
    path = tmp_path / "progress.json"
    monkeypatch.setenv(progress.ENV, str(path))
    assert progress.install() is True
    bar = tqdm.auto.tqdm(total=8, initial=2, desc="2 banks (8 models)", unit="model-epoch")
    assert isinstance(bar, StateBar)
    bar.update(3)
    for _ in tqdm.auto.tqdm(range(4), desc="train", leave=False):    # a bar inside it
        pass
    StateBar.state.flush()
    state = read_state(path)
    assert {k: state[k] for k in ("desc", "unit", "n", "total", "initial")} == {
        "desc": "2 banks (8 models)", "unit": "model-epoch", "n": 5, "total": 8, "initial": 2}
    bar.close()
    assert not path.exists()                                 # no bar open: no count to show
    out = capsys.readouterr()
    assert out.out.startswith("2 banks (8 models):  62%") and "5/8" in out.out   # its last frame
    assert "train" not in out.out and out.err == ""


def test_progress_line_leads_with_the_time_to_go_and_fits_an_80_column_terminal():
    # 40 of 120 in 80 s: 160 s to go when it wrote, 10 s ago
    line = progress_line("[2/7] 04_lira", 3900, BANKS, now=1010.0)
    assert line.startswith("~2:30 to go (this stage)  [2/7] 04_lira  1:05:00 in  ")
    assert "40/120 model-epoch" in line and len(line) <= 79
    # the whole notebook's time to go, where its previous run's time is known (never less than
    # the stage's own)
    whole = progress_line("[2/7] 04_lira", 100, BANKS, now=1010.0, expected=400)
    assert whole.startswith("~5:00 to go  [2/7] 04_lira  1:40 in  6 banks (24 models): 40/120")
    assert progress_line("nb", 100, BANKS, now=1010.0, expected=120).startswith("~2:30 to go  ")
    assert progress_line("[1/7] 01_theory", 42.5, None) == "[1/7] 01_theory  0:42 in"
    assert progress_line("nb", 5, {**BANKS, "n": 0}, now=1000.0).startswith("nb  0:05 in")
    long = {**BANKS, "desc": "a description of the stage that runs on and on " * 3}
    line = progress_line("[5/7] 04b_confound", 3900, long, now=1010.0, expected=7200)
    assert len(line) <= 79 and line.startswith("~") and "40/120 model-epoch" in line


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_live_line_shows_the_state_file(tmp_path, tty):
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({**BANKS, "time": time.time()}))
    stream = _Terminal() if tty else io.StringIO()
    with LiveLine("[4/7] 04_lira", path, stream, every=0.05):
        time.sleep(0.3)
    text = stream.getvalue()
    assert "to go (this stage)  [4/7] 04_lira  0:00 in  6 bank...: 40/120 model-epoch" in text
    if tty:      # redrawn in place, cleared at the end
        assert "\n" not in text and text.startswith("\r") and text.endswith("\r\x1b[K")
    else:        # whole lines, never a carriage return
        assert "\r" not in text and text.endswith("\n")


def test_live_line_prints_once_a_minute_to_a_log_file(tmp_path):
    stream = io.StringIO()
    with LiveLine("nb", tmp_path / "none.json", stream):
        time.sleep(0.2)
    assert stream.getvalue() == ""
