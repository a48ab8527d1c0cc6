"""The CPU thread and memory policy every torch process the project starts runs with.

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

Importing the package applies nothing. OpenMP and glibc read the policy's variables once, when a
process starts, so the entry points that start processes put :func:`policy_env` in the new
process's environment: the runner in each notebook kernel's, ``bnmem lab`` in the Jupyter
server's (its kernels inherit it), :class:`~bnmem_utils.core.executors.RayExecutor` in its
workers' runtime environment (:func:`worker_env`), and the test suite's ``conftest.py`` in
pytest's own before torch loads (its kernels go through the runner). A process started some
other way (a JupyterLab started by hand) runs without it: :func:`in_force` says so, and the
notebooks print one line saying how to get it (:func:`not_in_force_note`). A value the user
set in the environment is honoured, never overwritten (``OMP_WAIT_POLICY=ACTIVE`` restores
OpenMP's default), and so are explicit thread counts (``OMP_NUM_THREADS``, a notebook's
``*_threads`` parameter).

The memory allocator's half: glibc's ``malloc`` hands large freed blocks straight back to the
operating system, so a training loop that allocates and frees the same activations at every
step takes a fresh page fault for every page it touches again. The policy keeps freed memory
for reuse: a 1 GiB pad on every heap growth, trim only above 4 GiB, ``mmap`` only above 32 MiB,
and one heap for every thread (``MALLOC_ARENA_MAX=1``: the side heaps glibc gives other
threads cannot hold that much, and two chunk workers on them took 1.37x the time). The
processes the entry points start get glibc's own variables (:data:`GLIBC_ENV`) and hold freed
memory from their first allocation; :func:`hold_freed_memory` sets the same in a running
process with ``mallopt``, for a caller that asks (nothing calls it on import). On 2 cores a
Fashion-MNIST bank of 16 LeNets (2 epochs, both threads) took 86.3 s with glibc's defaults,
71.4 s set with ``mallopt`` once running (1.21x) and 63.6 s held from start-up (1.36x),
computing the same scores bit for bit, at a peak resident size of 2.05 GB instead of 1.40 GB
(``benchmarks/bench_malloc.py``). Linux with glibc only. ``BNMEM_MALLOC=glibc`` (or any of
glibc's own ``MALLOC_*`` variables set by the user) leaves glibc's defaults, or the user's
settings, alone.

This module imports nothing heavy, and reads the environment without changing it.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

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


def policy_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``environ`` for a process started with the policy: each
    :data:`POLICY` variable not set there, and with ``BNMEM_MALLOC=hold`` glibc's own
    (:data:`GLIBC_ENV`) unless any of glibc's is set. ``environ`` is only read. A
    ``BNMEM_MALLOC`` other than the choices is a ``ValueError`` that names them."""
    add = {name: value for name, value in POLICY.items() if name not in environ}
    if _malloc_choice(environ) == "hold" and not glibc_vars(environ):
        add.update(GLIBC_ENV)
    return add


def worker_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The policy as a worker's whole set of variables (Ray's ``runtime_env["env_vars"]``): the
    values ``environ`` (default: this process's) gives the policy's and glibc's variables, and
    :func:`policy_env` for those it lacks, so that a worker starts with the policy even where
    its driver did not."""
    env = os.environ if environ is None else environ
    return {**{k: env.get(k, v) for k, v in POLICY.items()}, **glibc_vars(env), **policy_env(env)}


def in_force() -> bool:
    """Whether this process runs with the policy: the wait's variables set (to the policy's
    values or the user's) when this module was first imported (torch reads them when it loads),
    and freed memory held as the policy or the user says (glibc's variables at the process's
    start, or :func:`hold_freed_memory`)."""
    return not not_in_force_note()


def not_in_force_note() -> str:
    """One line for a process that runs without the policy (a Jupyter started some other way),
    naming how to get it; ``""`` where it is in force (:func:`in_force`)."""
    try:
        missing = policy_env({**_env_at_start, **(GLIBC_ENV if _malloc_held else {})})
    except ValueError:                                 # an unknown BNMEM_MALLOC: none of it
        missing = {**POLICY, **GLIBC_ENV}
    names = " ".join(f"{k}={v}" for k, v in missing.items())
    return names and ("bnmem: the thread/allocator policy is not in force in this process: "
                      f"start Jupyter with `bnmem lab`, or with {names} set before it starts")


def hold_freed_memory() -> bool:
    """Tell glibc now (``mallopt``) to keep this process's freed memory for reuse, for a caller
    whose process did not start with :data:`GLIBC_ENV`; whether freed memory is held. True at
    once when the process started with them; nothing is changed when ``BNMEM_MALLOC`` says
    ``glibc``, when other ``MALLOC_*_`` values of glibc's own were set at start-up (the
    user's, honoured), or off glibc. A ``BNMEM_MALLOC`` other than the choices is an error that
    names them."""
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
    """What glibc does with freed memory in this process, in words (``bnmem env``); changes
    nothing."""
    if _glibc_at_start == GLIBC_ENV:
        return "held for reuse from start-up"
    if _malloc_held:
        return "held for reuse"
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


def _start_environ() -> Mapping[str, str]:
    """The environment the process started with, which glibc read (Linux: setting a variable
    later does not change ``/proc/self/environ``); elsewhere this process's now."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            pairs = (item.decode(errors="replace").partition("=") for item in fh.read().split(b"\0"))
            return {name: value for name, _, value in pairs if name}
    except OSError:
        return os.environ


_glibc_at_start = glibc_vars(_start_environ())
_env_at_start = {k: os.environ[k] for k in POLICY if k in os.environ} | _glibc_at_start
_malloc_held = False
