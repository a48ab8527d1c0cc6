"""Device choice, seeding and the environment report every notebook prints first."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import subprocess
from importlib import metadata

import numpy as np
import torch

from bnmem_utils.core import threads
from bnmem_utils.core.paths import project_root

DEVICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """Map ``auto|cpu|cuda|mps`` to a torch device; ``auto`` picks cuda, then mps, then cpu."""
    if isinstance(name, torch.device):
        return name
    name = str(name).lower()
    base = name.split(":")[0]
    if base not in DEVICES:
        raise ValueError(f"unknown device {name!r}; valid choices: {', '.join(DEVICES)}")
    if base == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if base == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch sees no CUDA GPU; use 'auto' or 'cpu'")
    if base == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError("device 'mps' was asked for but it is not available; use 'auto' or 'cpu'")
    return torch.device(name)


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); return a CPU generator seeded the same way."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    return torch.Generator().manual_seed(seed)


#: The sources that make every number and figure: a result's commit is the last commit that
#: changed them, so commits that touch only the README, the tests or the committed figures leave
#: the provenance of the figures (and with it their manifest) unchanged, and a rerun of a clean
#: checkout rewrites the tracked figures byte for byte.
CODE_PATHS = ("bnmem_utils", "notebooks")


def _git(*args: str) -> str:
    """The output of ``git *args`` in the project root (raises when git fails)."""
    return subprocess.run(["git", *args], cwd=project_root(), capture_output=True, text=True,
                          check=True).stdout.strip()


def git_commit(short: bool = True) -> str:
    """The last commit that changed :data:`CODE_PATHS` (with ``+dirty`` when they have
    uncommitted changes), or ``unknown`` outside a git checkout."""
    fmt = "%h" if short else "%H"
    try:
        commit = _git("log", "-1", f"--format={fmt}", "HEAD", "--", *CODE_PATHS)
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
        return (commit or "unknown") + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


_REPORT_PACKAGES = ("torch", "torchvision", "numpy", "scipy", "scikit-learn", "matplotlib",
                    "seaborn", "papermill")


def environment_report(device: str | torch.device = "auto") -> dict[str, str]:
    """Package versions, the device in use, thread count, the code commit (the last commit that
    changed the package or the notebooks) and the checked-out HEAD, as a flat dict."""
    dev = resolve_device(device)
    report = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in _REPORT_PACKAGES:
        try:
            report[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            report[pkg] = "not installed"
    report["device"] = str(dev)
    if dev.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(dev)
    report["torch_threads"] = str(torch.get_num_threads())
    report["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "(OpenMP default)") + (
        "" if threads.in_force() else " (policy not in force: start Jupyter with `bnmem lab`)")
    report["freed_memory"] = threads.describe_allocator()
    report["cpu_count"] = str(os.cpu_count())
    report["code_commit"] = git_commit()     # the last commit that changed the code (CODE_PATHS)
    report["head"] = _head()
    return report


def _head() -> str:
    """The checked-out commit (HEAD), short, or ``unknown`` outside a git checkout."""
    try:
        return _git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def print_environment(device: str | torch.device = "auto") -> dict[str, str]:
    """Print :func:`environment_report` as aligned lines and return it."""
    report = environment_report(device)
    width = max(map(len, report))
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    return report


@contextlib.contextmanager
def cpu_threads(threads: int | None):
    """Within the block torch uses ``threads`` CPU threads (None or 0: leave it as it is); the
    previous count is restored afterwards. Small models train faster on one thread of a shared
    2-core machine than on two threads fighting."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(old)
