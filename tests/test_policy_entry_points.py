"""Who applies the thread policy (bnmem_utils.core.threads): never an import of the package; the
entry points that start processes (the runner's kernels, ``bnmem lab``'s Jupyter server, Ray
workers: tests/test_threads.py), each without changing its own environment."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bnmem_utils.core import threads
from bnmem_utils.run import cli, runner
from bnmem_utils.run.params import UsageError

ROOT = Path(__file__).resolve().parents[1]
POLICY_VARS = {**threads.POLICY, **threads.GLIBC_ENV}
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and glibc: Linux")

#: Imports every module of every subpackage and reports what changed: the environment, and
#: whether anything looked up glibc's mallopt (threads.hold_freed_memory is the one place).
#: scikit-learn, which sets two variables of Intel's OpenMP when it loads, is imported by the
#: attacks only when they compute a ROC curve, so importing them changes nothing either.
IMPORT_ALL = """
import ctypes, importlib, json, os, pathlib
looked_up = []

class Spy(ctypes.CDLL):
    def __getattr__(self, name):
        looked_up.append(name)
        return super().__getattr__(name)

ctypes.CDLL = Spy
before = dict(os.environ)
import bnmem_utils
package = pathlib.Path(bnmem_utils.__file__).parent           # every folder, __init__ or not
names = sorted(f"bnmem_utils.{p.parent.name}" + ("" if p.stem == "__init__" else f".{p.stem}")
               for p in package.glob("*/*.py"))
for name in names:
    importlib.import_module(name)
from bnmem_utils.core import threads
changed = sorted(k for k in {*before, *os.environ} if before.get(k) != os.environ.get(k))
print(json.dumps({"modules": names, "changed": changed, "mallopt": "mallopt" in looked_up,
                  "held": threads.describe_allocator()}))
"""


def bare_env(**env: str) -> dict[str, str]:
    """This process's environment without the policy's variables or glibc's, plus ``env``."""
    drop = {*threads.POLICY, *threads.glibc_vars(os.environ)}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **env}


@LINUX
def test_importing_every_module_changes_nothing():
    import json

    out = subprocess.run([sys.executable, "-c", IMPORT_ALL], env=bare_env(), cwd=ROOT,
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    layers = {name.split(".")[1] for name in report["modules"]}
    assert layers >= {"core", "models", "data", "training", "privacy", "jobs", "analyses",
                      "figures", "run"}
    assert {"bnmem_utils.run.cli", "bnmem_utils.data.datasets"} <= set(report["modules"])
    assert report["changed"] == []
    assert report["mallopt"] is False
    assert report["held"] == "returned to the system (glibc's defaults)"
    one_liner = "import os; e = dict(os.environ); import bnmem_utils; assert dict(os.environ) == e"
    subprocess.run([sys.executable, "-c", one_liner], env=bare_env(), check=True)


def test_the_kernel_starts_with_the_run_env_and_the_policy(monkeypatch, tmp_path):
    from jupyter_client import AsyncKernelManager

    for name in [*threads.POLICY, *threads.glibc_vars(os.environ)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")                  # the user's, honoured
    launched = {}

    async def start_kernel(self, **kw):                              # jupyter_client's: Popen
        launched.update(kw, stderr_name=kw["stderr"].name)

    monkeypatch.setattr(AsyncKernelManager, "start_kernel", start_kernel)
    before = dict(os.environ)
    km = runner._kernel_manager_class(tmp_path / "stderr", {"BNMEM_RUN_ID": "r1"})()
    asyncio.run(km.start_kernel(extra_arguments=["--x"], cwd=str(tmp_path)))
    env = launched["env"]
    assert env["BNMEM_RUN_ID"] == "r1" and env["PATH"] == os.environ["PATH"]
    assert env["OMP_WAIT_POLICY"] == "ACTIVE"
    assert {k: env[k] for k in POLICY_VARS if k != "OMP_WAIT_POLICY"} == {
        k: v for k, v in POLICY_VARS.items() if k != "OMP_WAIT_POLICY"}
    assert launched["stderr_name"] == str(tmp_path / "stderr")
    assert launched["extra_arguments"] == ["--x"] and launched["cwd"] == str(tmp_path)
    assert dict(os.environ) == before                               # the runner's own: as it was


def test_an_unknown_allocator_choice_is_one_line_before_anything_starts(monkeypatch, capsys):
    monkeypatch.setenv("BNMEM_MALLOC", "jemalloc")
    with pytest.raises(UsageError, match="unknown BNMEM_MALLOC 'jemalloc'; choose one of hold, glibc"):
        runner.check_kernel("python3")
    monkeypatch.setattr(cli, "lab_command", lambda extra: pytest.fail("lab started"))
    assert cli.main(["lab", "--port", "8899"]) == 2
    assert capsys.readouterr().err == ("bnmem lab: error: unknown BNMEM_MALLOC 'jemalloc'; choose "
                                       "one of hold, glibc\n")


@pytest.mark.parametrize("argv, passed", [
    (["--port", "8899", "--no-browser"], ["--port", "8899", "--no-browser"]),
    (["--port=8899"], ["--port=8899"]),
    (["--", "--port", "8899"], ["--port", "8899"]),
    (["--help"], ["--help"]),
    ([], []),
])
def test_lab_passes_jupyters_own_arguments(argv, passed):
    args = cli.build_parser().parse_args(["lab", *argv])
    assert args.args == passed
    cmd = cli.lab_command(args.args)
    assert cmd[len(cmd) - len(passed):] == passed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.partition("=")[::2] for item in raw.split("\0") if item)


@LINUX
@pytest.mark.slow
def test_bnmem_lab_starts_jupyter_with_the_policy(tmp_path):
    pytest.importorskip("jupyterlab")
    port = _free_port()
    env = bare_env(JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
                   JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    log = tmp_path / "lab.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(  # `bnmem lab --port P --no-browser ...`
            [sys.executable, "-m", "bnmem_utils.run.cli", "lab", "--port", str(port),
             "--no-browser", "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0"],
            env=env, cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2)
                break
            except OSError:
                text = log.read_text(errors="replace")
                if proc.poll() == 2 or "unrecognized" in text or (
                        time.time() > deadline and "is running at" in text):
                    pytest.fail(f"bnmem lab refused its arguments or another port:\n{text[-3000:]}")
                if proc.poll() is not None or time.time() > deadline:
                    pytest.skip(f"JupyterLab could not start here:\n{text[-1500:]}")
                time.sleep(0.5)
        servers = _children(proc.pid)
        assert len(servers) == 1, servers
        server_env = _environ(servers[0])
        assert {k: server_env.get(k) for k in POLICY_VARS} == POLICY_VARS
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_notebook_without_the_policy_says_so_in_one_line(tmp_path):
    code = f"import bnmem_utils as bm; bm.start('01_theory', {{'out_dir': {str(tmp_path)!r}}})"
    run = [sys.executable, "-c", code]
    without = subprocess.run(run, env=bare_env(), cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    notes = [line for line in without if "thread/allocator policy is not in force" in line]
    assert len(notes) == 1 and "`bnmem lab`" in notes[0]
    with_it = subprocess.run(run, env=bare_env(**POLICY_VARS), cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    assert "not in force" not in with_it
