"""Shared fixtures: small, fast, deterministic; CPU only (nothing here needs a GPU)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# The notebook kernels and Ray workers that tests start inherit this: one torch thread each, so
# that two xdist workers, each running a kernel, never ask a 2-core machine for four threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _apply_the_policy() -> None:
    """pytest is an entry point: it puts the thread policy (bnmem_utils.core.threads, which
    importing the package does not apply) in its own environment before torch loads, so that
    in-process training keeps the passive wait and the processes tests start inherit it. The
    module is read from its file: importing the package would load torch first."""
    package = Path(importlib.util.find_spec("bnmem_utils").origin).parent   # not imported
    spec = importlib.util.spec_from_file_location("_bnmem_policy", package / "core" / "threads.py")
    policy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(policy)
    os.environ.update(policy.policy_env(os.environ))


_apply_the_policy()
from bnmem_utils.core import threads  # noqa: E402,I001  # isort: split

threads.hold_freed_memory()    # glibc read its variables at start-up: this process holds it now

import pytest  # noqa: E402
import torch  # noqa: E402
from xdist_files import pytest_xdist_make_scheduler  # noqa: E402,F401  # a dead worker ends no run


def pytest_collection_modifyitems(config, items):
    """Longest first. The suite runs on two pytest-xdist workers that take one file at a time
    (``--dist loadfile``, in this order): the file with the longest test (``slow(minutes=N)``),
    then the other files with slow tests, then the rest, so that its wall time is about that of
    its longest file rather than of the longest file started last."""
    def minutes(item) -> float:
        mark = item.get_closest_marker("slow")
        return 0.0 if mark is None else float(mark.kwargs.get("minutes", 0.5))

    weight: dict = {}
    for item in items:
        weight[item.path] = max(weight.get(item.path, 0.0), minutes(item))
    items.sort(key=lambda item: -weight[item.path])                  # stable within a file


@pytest.fixture(autouse=True)
def _few_threads():
    """Tests run beside other jobs on a small machine: keep torch to one thread per test."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def digits():
    """The embedded digits data set on the CPU (1,437 train / 360 test 8x8 images)."""
    from bnmem_utils.data.datasets import load_dataset

    return load_dataset("digits")
