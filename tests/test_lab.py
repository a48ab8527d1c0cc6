"""``bnmem lab`` leaves the repository as it was: the notebooks of ``notebooks/`` are saved as
committed (outputs, counts and session metadata dropped, sources and tags kept), and stopping
``bnmem lab`` stops its Jupyter server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from bnmem_utils.core.paths import project_root
from bnmem_utils.run.cli import lab_command
from bnmem_utils.run.lab import SavedAsCommitted

ROOT = project_root()


def _run_cells(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` as a session leaves it: outputs, counts, language_info, the server's kernel name,
    widget state, a cell's scroll state."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.7"}
    # the server's own name for the kernel, which differs from the committed "Python 3"
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    for i, cell in enumerate(nb.cells):
        cell.metadata["scrolled"] = True
        if cell.cell_type == "code":
            cell.execution_count = i
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    return nb


def _save(root: Path, path: str, nb) -> None:
    manager = SavedAsCommitted(root_dir=str(root))
    model = {"type": "notebook", "format": "json", "content": nb}
    asyncio.run(manager.save(model, path))


def test_a_repository_notebook_run_and_saved_is_byte_for_byte_as_committed(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "bnmem_utils").mkdir()
    committed = (ROOT / "notebooks" / "04_lira.ipynb").read_bytes()
    (repo / "notebooks" / "04_lira.ipynb").write_bytes(committed)
    monkeypatch.setenv("BNMEM_ROOT", str(repo))
    nb = _run_cells(nbformat.reads(committed.decode(), as_version=4))
    _save(repo, "notebooks/04_lira.ipynb", nb)
    assert (repo / "notebooks" / "04_lira.ipynb").read_bytes() == committed
    # an edit a reader makes is kept: only what running adds is dropped
    nb.cells[0].source += "\nA reader's note."
    _save(repo, "notebooks/04_lira.ipynb", nb)
    saved = nbformat.read(repo / "notebooks" / "04_lira.ipynb", as_version=4)
    assert saved.cells[0].source.endswith("A reader's note.")
    assert all(c.get("outputs", []) == [] for c in saved.cells)
    # a notebook elsewhere (a reader's own copy) keeps its outputs
    (repo / "mine").mkdir()
    _save(repo, "mine/copy.ipynb", _run_cells(nb))
    kept = nbformat.read(repo / "mine" / "copy.ipynb", as_version=4)
    assert any(c.get("outputs") for c in kept.cells)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serving(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=1).read()
        return True
    except OSError:
        return False


@pytest.mark.slow(minutes=1)
def test_sigterm_to_bnmem_lab_stops_its_server(tmp_path):
    assert "bnmem_utils.run.lab.SavedAsCommitted" in " ".join(lab_command())
    port = _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    lab = subprocess.Popen(
        [sys.executable, "-m", "bnmem_utils.run.cli", "lab", "--no-browser",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.token=t"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not _serving(port):
            assert lab.poll() is None and time.monotonic() < deadline, "JupyterLab did not start"
            time.sleep(0.5)
        lab.send_signal(signal.SIGTERM)
        lab.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _serving(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _serving(port), "the Jupyter server goes on serving after bnmem lab ended"
    finally:
        if lab.poll() is None:
            lab.kill()
