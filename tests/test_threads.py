"""The thread policy (bnmem_utils.core.threads): set before torch loads, never over the user's value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bnmem_utils.core import threads


def _fresh(code: str, **env: str) -> str:
    """Run ``code`` in a new interpreter whose environment lacks the policy's variables (and
    glibc's allocator variables, which this process now holds)."""
    glibc = threads.glibc_vars(os.environ)
    base = {k: v for k, v in os.environ.items() if k not in threads.POLICY and k not in glibc}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def test_importing_the_package_sets_the_policy_before_torch():
    code = ("import bnmem_utils, os, sys; from bnmem_utils import threads; "
            "print(os.environ['OMP_WAIT_POLICY'], threads.in_force())")
    assert _fresh(code) == "PASSIVE True"


def test_a_value_the_user_set_is_honoured():
    code = "import bnmem_utils, os; print(os.environ['OMP_WAIT_POLICY'])"
    assert _fresh(code, OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.apply(env) == {"OMP_WAIT_POLICY": "ACTIVE", "BNMEM_MALLOC": "hold"}
    assert threads.apply({}) == threads.POLICY
    assert env["MALLOC_TOP_PAD_"] == threads.GLIBC_ENV["MALLOC_TOP_PAD_"]     # for its children
    own = {"MALLOC_ARENA_TEST_": "1", "BNMEM_MALLOC": "hold"}
    threads.apply(own)
    assert "MALLOC_TOP_PAD_" not in own                    # the user's own malloc variables win
    arenas = {"MALLOC_ARENA_MAX": "4"}                     # glibc's one without the underscore
    threads.apply(arenas)
    assert arenas["MALLOC_ARENA_MAX"] == "4" and "MALLOC_TOP_PAD_" not in arenas
    off = {"BNMEM_MALLOC": "glibc"}
    threads.apply(off)
    assert off == {"BNMEM_MALLOC": "glibc", "OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_the_allocator_holds_freed_memory_unless_told_otherwise():
    code = "import bnmem_utils; from bnmem_utils import threads; print(threads.hold_freed_memory())"
    assert _fresh(code) == "True"
    report = ("from bnmem_utils.core.device import environment_report; "
              "print(environment_report('cpu')['freed_memory'])")
    assert _fresh(report) == "held for reuse"
    assert _fresh(report, BNMEM_MALLOC="glibc") == "returned to the system (glibc's defaults)"
    assert _fresh(code, BNMEM_MALLOC="glibc") == "False"
    assert _fresh(code, MALLOC_TOP_PAD_="0") == "False"        # glibc's own setting wins
    assert _fresh(report, MALLOC_TOP_PAD_="0") == "as the environment's MALLOC_*_ variables set it"
    # Processes started from a package process inherit glibc's variables: held from start-up.
    child = ("import bnmem_utils, subprocess, sys; print(subprocess.run([sys.executable, '-c', "
             f"{report!r}], capture_output=True, text=True, check=True).stdout.strip())")
    assert _fresh(child) == "held for reuse from start-up"
    assert _fresh(child, BNMEM_MALLOC="glibc") == "returned to the system (glibc's defaults)"
    assert _fresh(report, **threads.GLIBC_ENV) == "held for reuse from start-up"
    bad = subprocess.run([sys.executable, "-c", "import bnmem_utils"], capture_output=True,
                         text=True, env={**os.environ, "BNMEM_MALLOC": "jemalloc"})
    assert bad.returncode and "unknown BNMEM_MALLOC 'jemalloc'; choose one of hold, glibc" in bad.stderr


def test_torch_imported_first_is_reported_as_not_in_force():
    code = "import torch, bnmem_utils; from bnmem_utils import threads; print(threads.in_force())"
    assert _fresh(code) == "False"
    code = ("import torch, bnmem_utils; from bnmem_utils.core.device import environment_report; "
            "print(environment_report('cpu')['omp_wait_policy'])")
    assert "not in force" in _fresh(code)


def test_ray_workers_get_the_policy(monkeypatch):
    pytest.importorskip("ray")
    from bnmem_utils.core.executors import RayExecutor

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
    glibc = threads.glibc_vars(os.environ)
    assert glibc == threads.GLIBC_ENV          # this process holds freed memory, and passes it on
    assert captured["runtime_env"]["env_vars"] == {"OMP_WAIT_POLICY": "ACTIVE", "X": "1",
                                                   "BNMEM_MALLOC": os.environ["BNMEM_MALLOC"],
                                                   **glibc}
    ex2 = RayExecutor()
    ex2._ray = FakeRay()
    ex2.start()
    assert captured["runtime_env"]["env_vars"]["OMP_WAIT_POLICY"] == os.environ["OMP_WAIT_POLICY"]
