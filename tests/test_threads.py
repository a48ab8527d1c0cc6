"""The thread policy (bnmem_utils.core.threads): a pure function of the environment that the entry
points put in the processes they start, never over the user's value; importing applies nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bnmem_utils.core import threads

#: Every variable of the policy (the wait's and the allocator's).
POLICY_VARS = {**threads.POLICY, **threads.GLIBC_ENV}


def bare_env(**env: str) -> dict[str, str]:
    """This process's environment without the policy's variables (conftest applied them to
    pytest's own) and without any of glibc's allocator variables, plus ``env``."""
    drop = {*threads.POLICY, *threads.glibc_vars(os.environ)}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **env}


def _fresh(code: str, **env: str) -> str:
    """Run ``code`` in a new interpreter started without the policy (plus ``env``)."""
    out = subprocess.run([sys.executable, "-c", code], env=bare_env(**env), check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def test_policy_env_adds_what_is_missing_and_changes_nothing():
    env = {"PATH": "/bin"}
    assert threads.policy_env(env) == POLICY_VARS
    assert env == {"PATH": "/bin"}                                   # only read
    assert threads.policy_env(POLICY_VARS) == {}
    assert threads.policy_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {
        "BNMEM_MALLOC": "hold", **threads.GLIBC_ENV}                  # the user's value wins
    # The user's own malloc variables (also glibc's one without the underscore) win.
    assert threads.policy_env({"MALLOC_ARENA_TEST_": "1"}) == threads.POLICY
    assert threads.policy_env({"MALLOC_ARENA_MAX": "4"}) == threads.POLICY
    assert threads.policy_env({"BNMEM_MALLOC": "glibc"}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    with pytest.raises(ValueError, match="unknown BNMEM_MALLOC 'jemalloc'; choose one of hold, glibc"):
        threads.policy_env({"BNMEM_MALLOC": "jemalloc"})


def test_worker_env_is_the_whole_policy_with_the_drivers_own_values():
    assert threads.worker_env({}) == POLICY_VARS                     # a driver without it
    assert threads.worker_env(POLICY_VARS) == POLICY_VARS            # a driver with it
    user = {"OMP_WAIT_POLICY": "ACTIVE", "MALLOC_ARENA_MAX": "4", "PATH": "/bin"}
    assert threads.worker_env(user) == {"OMP_WAIT_POLICY": "ACTIVE", "BNMEM_MALLOC": "hold",
                                        "MALLOC_ARENA_MAX": "4"}


def test_in_force_only_when_the_process_started_with_it():
    code = ("from bnmem_utils.core import threads; from bnmem_utils.core.device import "
            "environment_report; print(threads.in_force()); "
            "print(environment_report('cpu')['omp_wait_policy']); print(threads.not_in_force_note())")
    without = _fresh(code).splitlines()
    assert without[:2] == ["False", "(OpenMP default) (policy not in force: start Jupyter with "
                                    "`bnmem lab`)"]
    note = without[2]
    assert "thread/allocator policy is not in force" in note and "`bnmem lab`" in note
    assert all(f"{k}={v}" in note for k, v in POLICY_VARS.items())  # what to set instead
    assert _fresh(code, **POLICY_VARS).splitlines() == ["True", "PASSIVE"]
    # The user's own choices count as the policy in force; a note names only what is missing.
    assert _fresh(code, OMP_WAIT_POLICY="ACTIVE", BNMEM_MALLOC="glibc").splitlines() == [
        "True", "ACTIVE"]
    partial = _fresh(code, OMP_WAIT_POLICY="PASSIVE", BNMEM_MALLOC="glibc").splitlines()
    assert partial[0] == "True"
    partial = _fresh(code, OMP_WAIT_POLICY="PASSIVE").splitlines()[2]
    assert "OMP_WAIT_POLICY" not in partial and "MALLOC_TOP_PAD_=1073741824" in partial


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_the_allocator_is_held_from_start_up_or_when_asked():
    report = "from bnmem_utils.core import threads; print(threads.describe_allocator())"
    assert _fresh(report) == "returned to the system (glibc's defaults)"   # import: nothing
    assert _fresh(report, **threads.GLIBC_ENV) == "held for reuse from start-up"
    assert _fresh(report, MALLOC_TOP_PAD_="0") == "as the environment's MALLOC_*_ variables set it"
    # glibc reads its variables when the process starts: setting them later is not "held".
    late = ("import os; from bnmem_utils.core import threads; os.environ.update(threads.GLIBC_ENV); "
            "import importlib; importlib.reload(threads); print(threads.describe_allocator())")
    assert _fresh(late) == "returned to the system (glibc's defaults)"
    # An entry point asks for it in its own process: mallopt, unless the user said otherwise.
    ask = ("from bnmem_utils.core import threads; print(threads.hold_freed_memory(), "
           "threads.describe_allocator())")
    assert _fresh(ask) == "True held for reuse"
    assert _fresh(ask, BNMEM_MALLOC="glibc") == "False returned to the system (glibc's defaults)"
    assert _fresh(ask, MALLOC_TOP_PAD_="0") == ("False as the environment's MALLOC_*_ variables "
                                                 "set it")
    # A process started with policy_env holds freed memory from its first allocation.
    child = ("import os, subprocess, sys; from bnmem_utils.core import threads; "
             "env = {**os.environ, **threads.policy_env(os.environ)}; "
             f"print(subprocess.run([sys.executable, '-c', {report!r}], env=env, "
             "capture_output=True, text=True, check=True).stdout.strip())")
    assert _fresh(child) == "held for reuse from start-up"
    assert _fresh(child, BNMEM_MALLOC="glibc") == "returned to the system (glibc's defaults)"
    # An unknown BNMEM_MALLOC does not break the import; the entry points name it.
    assert _fresh("import bnmem_utils; print('imported')", BNMEM_MALLOC="jemalloc") == "imported"


def test_ray_workers_get_the_policy_though_the_driver_has_none(monkeypatch):
    pytest.importorskip("ray")
    from bnmem_utils.core.executors import RayExecutor

    for name in [*threads.POLICY, *threads.glibc_vars(os.environ)]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("BNMEM_COMPILE", raising=False)
    captured = {}

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kw):
            captured.update(kw)

        def remote(self, fn):
            return fn

    ex = RayExecutor(runtime_env={"env_vars": {"OMP_WAIT_POLICY": "ACTIVE", "X": "1"}})
    ex._ray = FakeRay()
    ex.start()
    assert captured["runtime_env"]["env_vars"] == {**POLICY_VARS, "OMP_WAIT_POLICY": "ACTIVE",
                                                   "X": "1"}      # the user's runtime_env wins
    ex2 = RayExecutor()
    ex2._ray = FakeRay()
    ex2.start()
    assert captured["runtime_env"]["env_vars"] == POLICY_VARS
    assert not set(POLICY_VARS) & set(os.environ)                    # the driver's is unchanged
    monkeypatch.setenv("BNMEM_COMPILE", "off")                     # in the key, read by workers
    ex3 = RayExecutor()
    ex3._ray = FakeRay()
    ex3.start()
    assert captured["runtime_env"]["env_vars"] == {**POLICY_VARS, "BNMEM_COMPILE": "off"}
