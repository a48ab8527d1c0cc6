"""The CPU thread and memory policy every torch process of the project starts with.

PyTorch's CPU kernels run on OpenMP threads that, by default, spin while they wait for each
other. On an idle machine that saves a few microseconds per operation; beside any other busy
process it is a cliff: a spinning thread holds a core the other process needs, every small
operation waits for the slowest thread, and the vectorised bank trainer, which runs many small
operations, slowed down up to 20x on 2 cores with one other job running
(``benchmarks/bench_load.py`` measures it). The policy has two parts against it:

* **No team where none is needed.** A bank's chunks train on one torch thread each, as many at
  once as torch has threads (:class:`bnmem_utils.core.executors.LocalExecutor`): independent
  chunks never wait for each other, idle or loaded, and the bank is faster than one chunk on
  two threads (0.7x on the digits, 0.85x on Fashion-MNIST).
* **A passive wait for the teams left** (the training grids and gradient norms run one thread
  by default; a user who asks for more gets them): waiting threads sleep instead of spinning.
  No spin limit in between holds under load (``GOMP_SPINCOUNT`` 3,000: 2x; 30,000: 6x), so
  the policy sleeps at once.

The policy is applied with :func:`apply` when :mod:`bnmem_utils` is imported, which must come
before torch loads (OpenMP reads it once, at start-up): so it reaches the notebook kernels and
test kernels (they inherit the environment of the runner or pytest), and the Ray workers, whose
runtime environment carries :func:`worker_env`. A value the user set in the environment is
honoured, never overwritten (``OMP_WAIT_POLICY=ACTIVE`` restores OpenMP's default), and so are
explicit thread counts (``OMP_NUM_THREADS``, a notebook's ``*_threads`` parameter).

The memory allocator's half: glibc's ``malloc`` hands large freed blocks straight back to the
operating system, so a training loop that allocates and frees the same activations at every
step takes a fresh page fault for every page it touches again. The policy keeps freed memory
for reuse: a 1 GiB pad on every heap growth, trim only above 4 GiB, ``mmap`` only above 32 MiB,
and one heap for every thread (``MALLOC_ARENA_MAX=1``: the side heaps glibc gives other
threads cannot hold that much, and two chunk workers on them took 1.37x the time). :func:`apply`
sets it in this process (``mallopt``, through :func:`hold_freed_memory`) and puts glibc's own
variables (:data:`GLIBC_ENV`) in the environment, so that every process started from here
(notebook kernels, Ray workers, test kernels) holds freed memory from its first allocation. On
2 cores a Fashion-MNIST bank of 16 LeNets (2 epochs, both threads) took 86.3 s with glibc's
defaults, 71.4 s set at import (1.21x) and 63.6 s held from start-up (1.36x), computing the
same scores bit for bit, at a peak resident size of 2.05 GB instead of 1.40 GB
(``benchmarks/bench_malloc.py``). Linux with glibc only. ``BNMEM_MALLOC=glibc`` (or any of
glibc's own ``MALLOC_*`` variables set by the user) leaves glibc's defaults, or the user's
settings, alone.

This module imports nothing heavy, so that it can run before torch.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, MutableMapping

#: Environment variables of the policy and their values, set where the user has not set them.
POLICY = {"OMP_WAIT_POLICY": "PASSIVE", "BNMEM_MALLOC": "hold"}
#: The values ``BNMEM_MALLOC`` takes: keep freed memory for reuse, or glibc's defaults.
MALLOC_CHOICES = ("hold", "glibc")
#: ``mallopt`` parameters (glibc's malloc.h) and the values that hold freed memory.
_MALLOPT = {-2: 1 << 30,       # M_TOP_PAD: grow a heap by 1 GiB more than asked
            -1: 1 << 32,       # M_TRIM_THRESHOLD: give memory back only above 4 GiB free
            -3: 1 << 25,       # M_MMAP_THRESHOLD: mmap (returned on free) only above 32 MiB
            -8: 1}             # M_ARENA_MAX: every thread allocates from the one held heap
#: The same settings as glibc's own environment variables, which it reads before a process's
#: first allocation: what the processes the project starts (kernels, workers) inherit.
GLIBC_ENV = {"MALLOC_TOP_PAD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32),
             "MALLOC_MMAP_THRESHOLD_": str(1 << 25), "MALLOC_ARENA_MAX": "1"}


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each :data:`POLICY` variable in ``environ`` (default: this process's environment)
    unless it is already set, and with ``BNMEM_MALLOC=hold`` glibc's own variables
    (:data:`GLIBC_ENV`) unless any of them is set, so that every process started from here holds
    freed memory from its first allocation; return the policy's values now in force."""
    env = os.environ if environ is None else environ
    for name, value in POLICY.items():
        env.setdefault(name, value)
    if _malloc_choice(env) == "hold" and not glibc_vars(env):
        env.update(GLIBC_ENV)
    if environ is None:
        hold_freed_memory()
    return {name: env[name] for name in POLICY}


def hold_freed_memory() -> bool:
    """Whether glibc's malloc in this process keeps freed memory for reuse (module docstring).
    True when the process started with :data:`GLIBC_ENV` (inherited from the process that
    started it), or after telling glibc now with ``mallopt``, which happens unless
    ``BNMEM_MALLOC`` says ``glibc`` or other ``MALLOC_*_`` values of glibc's own were set at
    start-up (the user's, honoured). False off glibc. A ``BNMEM_MALLOC`` other than the choices
    is an error that names them."""
    global _malloc_held
    choice = _malloc_choice(os.environ)
    if _glibc_at_start == GLIBC_ENV:                   # glibc read them before it allocated
        return True
    if _malloc_held or choice != "hold" or _glibc_at_start or not sys.platform.startswith("linux"):
        return _malloc_held
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):                  # not glibc (musl has no mallopt)
        return False
    _malloc_held = all(mallopt(param, value) == 1 for param, value in _MALLOPT.items())
    return _malloc_held


def describe_allocator() -> str:
    """What glibc does with freed memory in this process, in words (``bnmem env``)."""
    if hold_freed_memory():
        return "held for reuse" + (" from start-up" if _glibc_at_start else "")
    if _glibc_at_start:
        return "as the environment's MALLOC_*_ variables set it"
    return "returned to the system (glibc's defaults)"


def _malloc_choice(env: Mapping[str, str]) -> str:
    choice = env.get("BNMEM_MALLOC", POLICY["BNMEM_MALLOC"])
    if choice not in MALLOC_CHOICES:
        raise ValueError(f"unknown BNMEM_MALLOC {choice!r}; choose one of "
                         f"{', '.join(MALLOC_CHOICES)}")
    return choice


def glibc_vars(env: Mapping[str, str]) -> dict[str, str]:
    """glibc's own ``MALLOC_*_`` variables (and ``MALLOC_ARENA_MAX``) in ``env``."""
    return {k: v for k, v in env.items()
            if k.startswith("MALLOC_") and (k.endswith("_") or k in GLIBC_ENV)}


def worker_env() -> dict[str, str]:
    """The policy's variables as this process runs them, glibc's ``MALLOC_*_`` ones included,
    for a worker's environment (Ray's ``runtime_env["env_vars"]``), so that a worker process
    starts with the same policy."""
    return {**{name: os.environ.get(name, value) for name, value in POLICY.items()},
            **glibc_vars(os.environ)}


def in_force() -> bool:
    """Whether the wait policy reached torch in this process: False when torch was imported
    before :func:`apply` ran and the variable was unset then (OpenMP reads it at start-up only;
    the allocator's half applies at any time)."""
    return not (_torch_first and "OMP_WAIT_POLICY" not in _env_at_import)


_env_at_import = {name: os.environ[name] for name in POLICY if name in os.environ}
_glibc_at_start = glibc_vars(os.environ)
_torch_first = "torch" in sys.modules
_malloc_held = False
