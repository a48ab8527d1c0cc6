"""A reader's own session: ``bnmem lab`` on a clone of this repository, notebooks 01 and 04 run
with Run All in headless Chromium at their default (quick) profile, saved, and the server
stopped with SIGTERM. Afterwards the clone's ``git status --porcelain`` prints nothing.

A file of its own, apart from ``tests/test_browser.py`` (whose helpers it uses), so that the
suite's two workers can run the two at once. Marked slow: about 2 minutes with this checkout's
model cache warm (after ``bnmem reproduce``), about 5 cold.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_browser import (
    _accept_kernel_dialog,
    _free_port,
    _kernels_idle,
    _no_network,
    _skip_reason,
    _wait_until_serving,
    _watched_page,
    launched_chromium,
)

from bnmem_utils.core.paths import project_root

#: Screenshots of the reader's session (apart from test_browser.py's folder, which that test
#: empties when it starts).
SHOTS = project_root() / "runs" / "browser-screenshots-reader"


@pytest.fixture(scope="module")
def chromium():
    if reason := _skip_reason():
        pytest.skip(reason)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with launched_chromium() as b:
        yield b


READER_RUN_TIMEOUT_S = 600   # 04 at the quick profile trains its banks unless the cache has them


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def _prompts_done(page) -> bool:
    """Every code cell of the visible notebook shows an execution count (``[n]:``)."""
    return page.evaluate(
        "() => { const ps = [...document.querySelectorAll("
        "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')];"
        " return ps.length > 0 && ps.every(p => /\\[\\d+\\]/.test(p.textContent)); }")


def _reader_run_all(page, lab, name: str) -> None:
    """Open ``notebooks/<name>.ipynb`` as committed, Run All from the Run menu, wait until every
    prompt shows a count and the kernel is idle, fail on a traceback; then save (Ctrl+S), as a
    reader would, and let autosave have its turn."""
    page.goto(f"{lab['url']}/lab/workspaces/reader-{name}/tree/notebooks/{name}.ipynb"
              f"?reset&token={lab['token']}")
    page.wait_for_selector(".jp-NotebookPanel:visible .jp-CodeCell", timeout=90_000)
    deadline = time.time() + 90
    while not _kernels_idle(lab, name):
        _accept_kernel_dialog(page)
        assert time.time() < deadline, f"{name}: its kernel did not start"
        time.sleep(0.5)
    page.locator(".jp-NotebookPanel:visible .jp-Notebook").first.focus()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    deadline = time.time() + READER_RUN_TIMEOUT_S
    panel = page.locator(".jp-NotebookPanel:visible").first
    while True:
        time.sleep(3.0)
        _accept_kernel_dialog(page)
        if "Traceback (most recent call last)" in panel.inner_text():
            page.screenshot(path=str(SHOTS / f"reader_{name}_failed.png"))
            pytest.fail(f"{name}: a cell failed in the reader's session (screenshot in {SHOTS})")
        if _prompts_done(page) and _kernels_idle(lab):
            break
        if time.time() > deadline:
            page.screenshot(path=str(SHOTS / f"reader_{name}_failed.png"))
            pytest.fail(f"{name}: Run All did not finish within {READER_RUN_TIMEOUT_S} s")
    page.keyboard.press("Control+s")
    page.wait_for_timeout(2500)
    page.screenshot(path=str(SHOTS / f"reader_{name}.png"))


@pytest.mark.slow(minutes=4)
def test_a_reader_session_in_bnmem_lab_leaves_the_checkout_as_committed(chromium, tmp_path):
    """``bnmem lab`` on a clone of this repository; in Chromium, Run All on 01 and 04 at their
    default (quick) profile, save, and stop ``bnmem lab`` with SIGTERM. Afterwards ``git status
    --porcelain`` of the clone prints nothing, the run's results are under
    ``runs/quick/interactive/`` labelled as an interactive run with its time, the headless run's
    ``runs/quick/results/`` was not written, and the server no longer serves its port. The
    clone's kernels use this checkout's model cache (``BNMEM_CACHE``), which is keyed by
    everything that trains a model, so a warm cache only saves time."""
    from bnmem_utils.core.paths import cache_dir

    if not (project_root() / ".git").exists():
        pytest.skip("not a git checkout: nothing to compare `git status` against")
    clone = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(project_root()), str(clone)], check=True)
    assert _git(clone, "status", "--porcelain") == ""
    settings = tmp_path / "settings" / "@jupyterlab"
    for ext, name, text in (("apputils-extension", "notification", '{"fetchNews": "false"}'),
                            ("notebook-extension", "tracker", '{"windowingMode": "none"}')):
        (settings / ext).mkdir(parents=True)
        (settings / ext / f"{name}.jupyterlab-settings").write_text(text)
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "BNMEM_HEADLESS")}
    env.update(BNMEM_ROOT=str(clone), BNMEM_CACHE=str(cache_dir()),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    log = open(tmp_path / "lab.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(   # what a reader types: bnmem lab (and where to serve)
        [sys.executable, "-m", "bnmem_utils.run.cli", "lab", "--no-browser",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}"],
        cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT)
    lab = {"url": f"http://127.0.0.1:{port}", "token": token, "root": clone}
    try:
        _wait_until_serving(lab["url"], token, server, log, tmp_path / "lab.log")
        page, problems = _watched_page(chromium, lab["url"])
        for name in ("01_theory", "04_lira"):
            _reader_run_all(page, lab, name)
        page.close()
        _no_network(problems)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
        log.close()
    assert _git(clone, "status", "--porcelain") == "", \
        "the reader's session changed tracked files:\n" + _git(clone, "status", "--porcelain")
    results = clone / "runs" / "quick" / "interactive" / "results"
    saved = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    assert {"01_theory", "04_lira"} <= set(saved), sorted(saved)
    for name in ("01_theory", "04_lira"):
        run_id = saved[name]["meta"]["run_id"]   # labelled as interactive, with its time
        assert re.fullmatch(r"interactive-\d{8}T\d{6}Z", run_id), (name, run_id)
    assert not (clone / "runs" / "quick" / "results").exists(), "the headless run's folder was written"
    try:
        urllib.request.urlopen(f"{lab['url']}/api/status?token={token}", timeout=2)
        served = True
    except OSError:
        served = False
    assert not served, "the Jupyter server goes on serving after SIGTERM to bnmem lab"
