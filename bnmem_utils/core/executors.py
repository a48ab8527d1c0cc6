"""Executors: where independent training tasks run, in this process or on a Ray cluster.

Shadow-model banks (notebook 04) and training grids (notebooks 02 and 05) are many independent
trainings. An :class:`Executor` runs one function over a list of items and hands the results
back as they finish:

* :class:`LocalExecutor` (``"local"``, the default): this process, a plain loop or (a bank's
  chunks on a CPU) a few one-thread workers at once;
* :class:`RayExecutor` (``"ray"``): one Ray task per item (a bank's chunk of models, or one
  grid run) on a private local Ray or a running cluster, a fraction of a GPU per task letting
  several small models share one.

Results do not depend on the executor: every task trains with the same per-model seed on the
same data as the local loop (bit for bit on the CPU, see ``tests/test_ray.py``). Large inputs
(the data set tensors) go to Ray's object store once per call, not once per task, and each
worker process keeps the latest of them (moved to its device) between tasks.

Fault tolerance: a task whose worker dies (a crash, an out-of-memory kill, a lost node) or that
raises a transient error (``OSError``, a CUDA error) is retried up to ``max_retries`` times.
Errors that would only repeat (a diverged model: :class:`bnmem_utils.training.steps.TrainingError`; bad
input: ``ValueError``, ``TypeError``, ``LookupError``) are not retried but raised at once, with
their own type, as the local executor raises them. Tasks write their cache files themselves
(atomically) and a task re-checks the cache before training, so a retried task, or a rerun after
the driver was interrupted, never retrains a model that was saved.

Ray is an optional extra (``pip install -e ".[ray]"``), imported only when the ray executor is
asked for. :func:`bnmem_utils.jobs.bank.train_bank_chunks` runs banks' chunks on either executor;
:func:`map_uncached` is what :func:`bnmem_utils.jobs.grid.run_grid` and
:func:`bnmem_utils.jobs.gradnorms.run` call when given ``executor="ray"``; docs/ray.md shows how
to run the paper profile on a cluster and on SLURM.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import tempfile
import threading
import traceback
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing, contextmanager, suppress
from typing import Any, Protocol, runtime_checkable

import torch

from bnmem_utils.core import threads
from bnmem_utils.core.cache import CacheError
from bnmem_utils.core.checks import PermanentError, check_choice
from bnmem_utils.core.device import cpu_threads

#: Executor names accepted wherever an ``executor`` parameter is.
EXECUTORS = ("local", "ray")

#: How to get Ray when it is missing.
RAY_INSTALL_HINT = 'pip install -e ".[ray]"  (or: pip install "ray[default]>=2.9")'

#: GPUs per task when the models train on CUDA and ``num_gpus_per_task`` is not given: one task
#: per GPU, so a bank's chunks (and a grid's runs) spread over the cluster's GPUs, each with one
#: CUDA context and one compiled step (a fraction put several processes, contexts and
#: compilations on one GPU, which its own vectorised or sequential trainer already fills).
DEFAULT_GPU_FRACTION = 1.0

#: Seconds an interrupted imap waits for its cancelled Ray tasks to end.
CANCEL_WAIT_S = 20.0


class ExecutorError(RuntimeError):
    """A task that failed for good: its worker kept dying, or a transient error outlived the
    retries. The message names the task and the cause."""


def require_ray():
    """Import and return the ``ray`` module, or raise an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"the 'ray' executor needs Ray, an optional extra of bnmem; install "
                          f"it with {RAY_INSTALL_HINT}, or use executor='local'") from exc
    return ray


#: Exceptions that a retry would only repeat: raised at once, never retried (a damaged cache
#: file, :class:`bnmem_utils.core.cache.CacheError`, is a ValueError).
_PERMANENT_ERRORS = (PermanentError, ValueError, TypeError, LookupError, NotImplementedError)


# --------------------------------------------------------------------------------------------
# The protocol and the local executor
# --------------------------------------------------------------------------------------------
@runtime_checkable
class Executor(Protocol):
    """Runs ``fn(item, *shared)`` for every item. ``shared`` arguments are the same for all
    items and are shipped once; ``gpu=True`` says the tasks train on CUDA."""

    name: str

    def imap(self, fn: Callable, items: Sequence, *shared, gpu: bool = False
             ) -> Iterator[tuple[int, Any]]:
        """Yield ``(index, fn(items[index], *shared))`` as each task finishes (any order)."""
        ...

    def put(self, obj: Any) -> Any:
        """A handle of ``obj`` that tasks read with :func:`fetch` (shipped once, read many times)."""
        ...

    def close(self) -> None:
        """Release what the executor started (a local Ray); a no-op otherwise."""
        ...


class LocalExecutor:
    """This process: ``fn(item, *shared)`` for each item, errors raised as they come.

    ``workers`` 1 (the default): a plain loop, in order, on the caller's torch threads. More:
    that many items at once on as many threads, torch on one CPU thread each (a lone item
    too, so that what an item computes does not depend on how many came with it), results in
    the order they finish. Independent one-thread tasks never wait for each other, where one task
    on several OpenMP threads waits at every small operation, idle or beside other work
    (``benchmarks/bench_load.py``). When an error comes (or the caller stops reading) the
    items not started are cancelled and those running finish first."""

    name = "local"

    def __init__(self, workers: int = 1):
        if int(workers) != workers or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        self.workers = int(workers)

    def imap(self, fn: Callable, items: Sequence, *shared, gpu: bool = False
             ) -> Iterator[tuple[int, Any]]:
        items = list(items)
        if self.workers == 1 or not items:
            for i, item in enumerate(items):
                yield i, fn(item, *shared)
            return
        with cpu_threads(1), ThreadPoolExecutor(min(self.workers, len(items))) as pool:
            futures = {pool.submit(fn, item, *shared): i for i, item in enumerate(items)}
            try:
                for done in as_completed(futures):
                    yield futures[done], done.result()
            finally:
                for future in futures:
                    future.cancel()

    def put(self, obj: Any) -> Any:
        return obj

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LocalExecutor(workers={self.workers})"


# --------------------------------------------------------------------------------------------
# Worker side: handles of shared objects, their per-process cache, the task wrapper
# --------------------------------------------------------------------------------------------
class _SharedRef:
    """A Ray object reference wrapped so that Ray does not resolve it when a task starts: the
    worker resolves it through :func:`fetch`, which keeps the latest few per process."""

    __slots__ = ("ref",)

    def __init__(self, ref) -> None:
        self.ref = ref


_FETCHED: OrderedDict[str, Any] = OrderedDict()   # worker process: object id -> object
_FETCH_KEEP = 4
_ON_DEVICE: dict[tuple[int, str], tuple[Any, Any]] = {}   # (id(obj), device) -> (obj, copy)


def fetch(handle: Any) -> Any:
    """The object behind ``handle`` (from :meth:`Executor.put`); anything else is returned as it
    is. In a Ray worker the latest few objects are kept, so the tasks of one call that land on
    the same worker read the data set once."""
    if not isinstance(handle, _SharedRef):
        return handle
    key = handle.ref.hex()
    if key not in _FETCHED:
        import ray

        _FETCHED[key] = ray.get(handle.ref)
        while len(_FETCHED) > _FETCH_KEEP:
            _FETCHED.popitem(last=False)
    _FETCHED.move_to_end(key)
    return _FETCHED[key]


def tensors_to(obj: Any, device: str | torch.device) -> Any:
    """A copy of a dataclass (e.g. :class:`bnmem_utils.jobs.bank.BankData`,
    :class:`bnmem_utils.data.datasets.Dataset`) with every tensor field on ``device``; other fields as
    they are. Tensors already there are not copied."""
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"expected a dataclass of tensors, got {type(obj).__name__}")
    changes = {f.name: getattr(obj, f.name).to(device) for f in dataclasses.fields(obj)
               if isinstance(getattr(obj, f.name), torch.Tensor)}
    return dataclasses.replace(obj, **changes)


def on_device(obj: Any, device: torch.device) -> Any:
    """``tensors_to(obj, device)``, remembered for the latest ``obj`` of this process, so that a
    worker moves a data set to its GPU once, not once per task."""
    key = (id(obj), str(device))
    hit = _ON_DEVICE.get(key)
    if hit is None or hit[0] is not obj:
        _ON_DEVICE.clear()
        hit = (obj, tensors_to(obj, device))
        _ON_DEVICE[key] = hit
    return hit[1]


def _run_task(fn: Callable, item: Any, shared: Sequence, permanent: tuple, threads: int):
    """What one Ray task runs: resolve the shared arguments, run ``fn``. A permanent error is
    returned (so that Ray does not retry it) and re-raised by the driver; any other exception
    propagates and Ray retries the task."""
    if threads:
        torch.set_num_threads(threads)
    args = [fetch(a) for a in shared]
    try:
        return ("ok", fn(item, *args))
    except permanent as exc:
        text = traceback.format_exc()
        try:
            pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - an exception that cannot travel becomes a message
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return ("error", exc, text)


# --------------------------------------------------------------------------------------------
# The Ray executor
# --------------------------------------------------------------------------------------------
#: How many times a Ray whose node timed out during start-up is started (:class:`RayExecutor`).
RAY_START_ATTEMPTS = 3


#: Environment variables that change what a worker computes and that a cache key reads in the
#: driver (``BNMEM_COMPILE``: whether ``compile="auto"`` compiles on a GPU): Ray workers get the
#: driver's values.
KEYED_ENV = ("BNMEM_COMPILE",)


class RayExecutor:
    """One Ray task per item, retried when its worker dies.

    Ray is started (or joined) when the first task is submitted, so a rerun whose models are
    all cached never starts it. ``address``: None starts a private local Ray (``local_cpus``
    CPUs, default all; no dashboard; a short temporary folder), shut down by :meth:`close`,
    unless ``RAY_ADDRESS`` is set, in which case that cluster is joined. ``"auto"`` joins the
    cluster started on this machine with ``ray start``; ``"ray://host:10001"`` a remote one
    through Ray Client. When Ray is already initialised in this process it is used as it is and
    left running.

    ``num_cpus_per_task``: CPUs per task (also the task's torch threads). ``num_gpus_per_task``:
    GPUs per task when the models train on CUDA, a fraction to share a GPU (None:
    :data:`DEFAULT_GPU_FRACTION`). ``max_retries``: retries of a task whose worker died or that
    raised a transient error. ``runtime_env``: passed to ``ray.init`` (e.g. a ``working_dir``
    when the cluster's nodes do not have the package installed).
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus_per_task: float = 1,
                 num_gpus_per_task: float | None = None, max_retries: int = 3,
                 local_cpus: int | None = None, runtime_env: Mapping | None = None,
                 log_to_driver: bool = False) -> None:
        ray = require_ray()
        if num_cpus_per_task < 0 or (num_gpus_per_task is not None and num_gpus_per_task < 0):
            raise ValueError(f"resources per task must be non-negative, got num_cpus_per_task="
                             f"{num_cpus_per_task!r}, num_gpus_per_task={num_gpus_per_task!r}")
        if num_gpus_per_task is not None and num_gpus_per_task > 1 and num_gpus_per_task % 1:
            raise ValueError(f"num_gpus_per_task above 1 must be a whole number, got "
                             f"{num_gpus_per_task!r}")
        if int(max_retries) != max_retries or max_retries < 0:
            raise ValueError(f"max_retries must be a non-negative integer, got {max_retries!r}")
        self.address = address
        self.num_cpus_per_task = float(num_cpus_per_task)
        self.num_gpus_per_task = num_gpus_per_task
        self.max_retries = int(max_retries)
        self.local_cpus = local_cpus
        self.runtime_env = dict(runtime_env) if runtime_env else None
        self.log_to_driver = bool(log_to_driver)
        self._ray = ray
        self._remote = None
        self._owns = False
        self._temp_dir: str | None = None
        self._start_lock = threading.Lock()

    def start(self) -> RayExecutor:
        """Start the local Ray or join the cluster now (the first task does it otherwise); safe
        from several threads at once."""
        with self._start_lock:
            return self._start()

    def _start(self) -> RayExecutor:
        ray = self._ray
        if self._remote is not None:
            return self
        if not ray.is_initialized():
            # Workers start with the thread policy (threads.py), this process's own values of
            # it where it has them, and the variables that change what they compute and that
            # the cache keys read here (a worker on another machine has not this environment),
            # which the user's runtime_env may override one by one.
            env = dict(self.runtime_env or {})
            env["env_vars"] = {**threads.worker_env(), **{k: os.environ[k] for k in KEYED_ENV
                                                          if k in os.environ},
                               **env.get("env_vars", {})}
            kw: dict[str, Any] = {"log_to_driver": self.log_to_driver,
                                  "configure_logging": False, "runtime_env": env}
            if self.address is None and not os.environ.get("RAY_ADDRESS"):
                # A private local Ray. A short temporary folder: Ray's socket paths must stay
                # under the 107-character limit of Unix sockets.
                self._temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp" if os.path.isdir(
                    "/tmp") else None)
                # Workers at the driver's priority: they do the run's main work, and at Ray's
                # default niceness (15) any other process on the machine would starve them.
                kw.update(num_cpus=int(self.local_cpus or os.cpu_count() or 1),
                          include_dashboard=False, _temp_dir=self._temp_dir,
                          _system_config={"worker_niceness": 0})
            self._init(kw)
            self._owns = True
        self._remote = ray.remote(_run_task)
        return self

    def _init(self, kw: dict) -> None:
        """``ray.init``, tried again (up to :data:`RAY_START_ATTEMPTS` times) when its node does
        not come up within Ray's fixed 30 s: on a small machine that other work keeps busy, a
        local Ray's processes can start that slowly."""
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            try:
                self._ray.init(address=self.address, **kw)
                return
            except Exception as exc:                 # Ray raises a bare Exception for this
                if "timed out during startup" not in str(exc) or attempt == RAY_START_ATTEMPTS:
                    raise
                self._ray.shutdown()
                warnings.warn(f"Ray's node did not start in time (attempt {attempt} of "
                              f"{RAY_START_ATTEMPTS}); starting it again", stacklevel=4)

    @property
    def started(self) -> bool:
        """Whether this executor has started (or joined) Ray."""
        return self._remote is not None

    # -- resources -----------------------------------------------------------------------------
    def gpus_per_task(self, gpu: bool) -> float:
        """GPUs each task asks for: 0 on the CPU, else ``num_gpus_per_task`` (or the default)."""
        if not gpu:
            return 0.0
        return float(DEFAULT_GPU_FRACTION if self.num_gpus_per_task is None
                     else self.num_gpus_per_task)

    def _check_feasible(self, gpus: float) -> None:
        have = self._ray.cluster_resources()
        if gpus > 0 and have.get("GPU", 0) <= 0:
            raise ExecutorError("the models train on CUDA but the Ray cluster has no GPU; start "
                                "the workers on GPU nodes (ray start --num-gpus=...) or train "
                                "with device='cpu'")
        if self.num_cpus_per_task > have.get("CPU", 0):
            raise ExecutorError(f"num_cpus_per_task={self.num_cpus_per_task:g} but the Ray "
                                f"cluster has {have.get('CPU', 0):g} CPUs")

    # -- running -------------------------------------------------------------------------------
    def put(self, obj: Any) -> _SharedRef:
        if isinstance(obj, _SharedRef):
            return obj
        self.start()
        return _SharedRef(self._ray.put(obj))

    def imap(self, fn: Callable, items: Sequence, *shared, gpu: bool = False
             ) -> Iterator[tuple[int, Any]]:
        ray = self._ray
        items = list(items)
        if not items:
            return
        self.start()
        gpus = self.gpus_per_task(gpu)
        self._check_feasible(gpus)
        shared_refs = [self.put(a) for a in shared]            # shipped once for all tasks
        task = self._remote.options(num_cpus=self.num_cpus_per_task, num_gpus=gpus,
                                    max_retries=self.max_retries, retry_exceptions=True)
        threads = max(1, int(self.num_cpus_per_task))
        refs = [task.remote(fn, item, shared_refs, _PERMANENT_ERRORS, threads)
                for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = index[ref]
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        cause = getattr(exc, "cause", None) or exc
                        raise ExecutorError(
                            f"task {i} of {len(items)} ({_describe(items[i])}) failed after "
                            f"{self.max_retries} retries: {type(cause).__name__}: {cause}"
                        ) from exc
                    if out[0] == "error":
                        err = out[1]
                        err.add_note(f"raised in Ray task {i} ({_describe(items[i])}):\n{out[2]}")
                        raise err
                    yield i, out[1]
        finally:
            # a failure or an interrupt: stop what has not finished. force=True kills the
            # workers of running tasks: a polite cancel raises KeyboardInterrupt wherever the
            # task happens to be, and one that lands inside a lazy import (torch imports
            # torch._dynamo on a first optimizer) leaves a half-initialised module in a worker
            # that Ray then reuses, failing every later task there. Cache files are written
            # atomically, so a killed task leaves none half-written.
            for ref in pending:
                with suppress(Exception):  # best effort
                    ray.cancel(ref, force=True)
            # A kill is asynchronous: wait (briefly) until the cancelled tasks have ended, so
            # that none of them still writes a cache file after the interrupt has propagated.
            if pending:
                with suppress(Exception):  # best effort
                    ray.wait(pending, num_returns=len(pending), timeout=CANCEL_WAIT_S)

    def close(self) -> None:
        """Shut down the local Ray this executor started (a joined cluster keeps running)."""
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns = False
        self._remote = None
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def __repr__(self) -> str:
        return (f"RayExecutor(address={self.address!r}, num_cpus_per_task="
                f"{self.num_cpus_per_task:g}, num_gpus_per_task={self.num_gpus_per_task!r}, "
                f"max_retries={self.max_retries})")


def _describe(item: Any) -> str:
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


# --------------------------------------------------------------------------------------------
# Choosing an executor
# --------------------------------------------------------------------------------------------
def is_local(executor: str | Executor | None) -> bool:
    """True for None, ``"local"`` and a :class:`LocalExecutor`; a clear error for an unknown
    name."""
    if executor is None or isinstance(executor, LocalExecutor):
        return True
    if isinstance(executor, str):
        check_choice("executor", executor, EXECUTORS)
        return executor == "local"
    if not isinstance(executor, Executor):
        raise TypeError(f"executor must be one of {', '.join(EXECUTORS)} or an Executor, got "
                        f"{type(executor).__name__}")
    return False


@contextmanager
def using(executor: str | Executor | None = "local", *, address: str | None = None,
          workers: int = 1, **options) -> Iterator[Executor]:
    """``with using("ray") as ex:``: an executor for the block from its name (``"local"`` or
    ``"ray"``), closed afterwards; an Executor passed in is used as it is and left to the
    caller, who closes it.

    ``address`` and ``options`` (``num_cpus_per_task``, ``num_gpus_per_task``, ``max_retries``,
    ``local_cpus``, ``runtime_env``, ``log_to_driver``) go to :class:`RayExecutor` and are
    ignored by the local executor, so a notebook can pass its parameters either way; ``workers``
    goes to :class:`LocalExecutor` and is ignored by Ray. An empty ``address`` means None (a
    local Ray).
    """
    if not isinstance(executor, str | None):
        is_local(executor)                             # a clear error for a wrong type
        yield executor
        return
    ex = LocalExecutor(workers) if is_local(executor) else RayExecutor(address or None, **options)
    try:
        yield ex
    finally:
        ex.close()


def map_runs(executor: str | Executor | None, configs: Sequence, load: Callable[[Any], Any],
             fn: Callable, *shared, address: str | None = None, gpu: bool = False,
             progress: bool = True, done: int = 0) -> list:
    """``[fn((config, data), *shared) for config in configs]`` as one task per run on
    ``executor``, in the order of ``configs``. Each distinct data description
    (``config.data``) is loaded here once by ``load(config)`` (on the CPU: downloads happen on
    this machine only) and shipped once to the workers; tasks read it with :func:`fetch`.
    ``done``: runs already finished (read from the cache), for the progress bar."""
    from tqdm.auto import tqdm

    configs = list(configs)
    order = sorted(range(len(configs)), key=lambda j: repr(configs[j].data))
    results: list = [None] * len(configs)
    with using(executor, address=address) as ex:
        handles: dict[Any, Any] = {}
        for i in order:
            if configs[i].data not in handles:
                handles[configs[i].data] = ex.put(load(configs[i]))
        items = [(configs[i], handles[configs[i].data]) for i in order]
        with tqdm(total=done + len(configs), initial=done, desc="runs", disable=not progress,
                  smoothing=0.0) as bar, closing(ex.imap(fn, items, *shared, gpu=gpu)) as finished:
            for j, res in finished:
                results[order[j]] = res
                bar.update(1)
    return results


def read_cached(read: Callable, root: Any, config: Any, key: str) -> Any:
    """``read(root, config, key)``: a run's cached result, or None when there is none or it is
    damaged (a :class:`~bnmem_utils.core.cache.CacheError`, reported with a warning: the run is
    rebuilt)."""
    try:
        return read(root, config, key)
    except CacheError as exc:
        warnings.warn(f"rebuilding a damaged cache entry: {exc}", stacklevel=3)
        return None


def map_uncached(executor: str | Executor | None, configs: Sequence, keys: Sequence[str],
                 root: Any, read: Callable, path: Callable, load: Callable[[Any], Any],
                 fn: Callable, *shared, force: bool = False, save: Callable | None = None,
                 address: str | None = None, gpu: bool = False, progress: bool = True) -> list:
    """The results of ``configs`` of a job that caches each run under its key (``keys``) in
    ``root``: each read back by :func:`read_cached` (unless ``force``), the others computed by
    :func:`map_runs` (one task each) when ``executor`` is not local, with ``force`` first
    deleting their files ``path(root, key)`` (a task reads the cache before computing). On the
    local executor those are left None, for the caller to compute. ``save(result, root)``
    writes here the results a task computed whose file is not here (no shared file system)."""
    results = [None if force else read_cached(read, root, c, k)
               for c, k in zip(configs, keys, strict=True)]
    todo = [i for i, r in enumerate(results) if r is None]
    if not todo or is_local(executor):
        return results
    for i in todo if force else ():
        path(root, keys[i]).unlink(missing_ok=True)
    done = map_runs(executor, [configs[i] for i in todo], load, fn, *shared, address=address,
                    gpu=gpu, progress=progress, done=len(configs) - len(todo))
    for i, res in zip(todo, done, strict=True):
        if save is not None and not path(root, res.key).exists():
            save(res, root)
        results[i] = res
    return results


def timing_summary(results: Sequence, by: Sequence[str]) -> Any:
    """Per group of ``by`` (among ``dataset``, ``arch`` and ``norm``): the number of runs, their
    mean seconds (from when each was computed) and how many were read from the cache."""
    import pandas as pd

    df = pd.DataFrame([{"dataset": r.config.data.dataset, "arch": r.config.model.arch,
                        "norm": r.config.model.norm, "seconds": r.seconds, "cached": r.cached}
                       for r in results])
    if df.empty:
        return df
    return (df.groupby(list(by), sort=False)
              .agg(runs=("seconds", "size"), mean_seconds=("seconds", "mean"),
                   read_from_cache=("cached", "sum"))
              .reset_index())


__all__ = ["EXECUTORS", "Executor", "ExecutorError", "LocalExecutor", "PermanentError",
           "RayExecutor", "fetch", "is_local", "map_runs", "map_uncached", "on_device",
           "read_cached", "require_ray", "tensors_to", "timing_summary", "using"]
