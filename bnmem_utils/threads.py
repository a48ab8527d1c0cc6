"""The CPU thread policy every torch process of the project starts with.

PyTorch's CPU kernels run on OpenMP threads that, by default, spin while they wait for each
other. On an idle machine that saves a few microseconds per operation; beside any other busy
process it is a cliff: a spinning thread holds a core the other process needs, every small
operation waits for the slowest thread, and the vectorised bank trainer, which runs many small
operations, slowed down up to 20x on 2 cores with one other job running
(``benchmarks/bench_load.py`` measures it). A passive wait policy makes waiting threads sleep:
beside one busy process the bank then takes 1.4-1.5x its idle time instead of 3.5-4.3x. It is
not free: on an idle machine each small operation wakes a sleeping thread instead of finding it
spinning, and the two-thread bank takes 1.17x [1.08, 1.26] the time of OpenMP's default (loops
on one thread run no OpenMP team and are unaffected). No spin limit in between holds under
load (``GOMP_SPINCOUNT`` 3,000: 2x; 30,000: 6x), so the policy sleeps at once.

The policy is applied with :func:`apply` when :mod:`bnmem_utils` is imported, which must come
before torch loads (OpenMP reads it once, at start-up): so it reaches the notebook kernels and
test kernels (they inherit the environment of the runner or pytest), and the Ray workers, whose
runtime environment carries :func:`worker_env`. A value the user set in the environment is
honoured, never overwritten (``OMP_WAIT_POLICY=ACTIVE`` restores OpenMP's default), and so are
explicit thread counts (``OMP_NUM_THREADS``, a notebook's ``*_threads`` parameter).

This module imports nothing heavy, so that it can run before torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: Environment variables of the policy and their values, set where the user has not set them.
POLICY = {"OMP_WAIT_POLICY": "PASSIVE"}


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each :data:`POLICY` variable in ``environ`` (default: this process's environment)
    unless it is already set; return the values now in force."""
    env = os.environ if environ is None else environ
    for name, value in POLICY.items():
        env.setdefault(name, value)
    return {name: env[name] for name in POLICY}


def worker_env() -> dict[str, str]:
    """The policy's variables as this process runs them, for a worker's environment (Ray's
    ``runtime_env["env_vars"]``), so that a worker process starts with the same policy."""
    return {name: os.environ.get(name, value) for name, value in POLICY.items()}


def in_force() -> bool:
    """Whether the policy reached torch in this process: False when torch was imported before
    :func:`apply` ran and the variable was unset then (the policy cannot apply after start-up)."""
    return not (_torch_first and any(name not in _env_at_import for name in POLICY))


_env_at_import = {name: os.environ[name] for name in POLICY if name in os.environ}
_torch_first = "torch" in sys.modules
