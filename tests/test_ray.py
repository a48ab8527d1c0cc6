"""Tests of bnmem_utils.core.executors: the local and Ray executors give the same banks and grids,
a task whose worker dies is retried, and finished models are never retrained.

The Ray tests start one local Ray with 2 CPUs for the whole module (its start-up is most of this
file's time) and are skipped, with the reason, when Ray is not installed (it is an optional
extra: pip install -e ".[ray]").
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from bnmem_utils.core import executors as E
from bnmem_utils.jobs import bank as B
from bnmem_utils.jobs import bank_models as MB
from bnmem_utils.jobs import grid as X
from bnmem_utils.jobs.config import (
    CorruptionConfig,
    DataConfig,
    GradNormMeasure,
    RunConfig,
    TrainConfig,
)

try:
    import ray
except ImportError:  # the optional extra is absent: the Ray tests are skipped
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason='Ray is an optional extra and is not '
                                                   'installed (pip install -e ".[ray]")')

#: A tiny real bank: 4 LeNets, 1 epoch, on a slice of the digits with 5% OOD inserts.
CFG = RunConfig.bank(n_models=4, train_size=120, test_size=60, population_size=30, epochs=1,
                   batch_size=32, ood_rate=0.05, queries=("identity", "shift_right"))


# --- the trainer the fault test runs in the workers ---------------------------------------------
class CountingTrainer(MB.MemberTrainer):
    """One model after another (:data:`bnmem_utils.jobs.bank_models.SEQUENTIAL`), logging every model it trains to ``log`` (one
    line per model, appended by whichever process trains it). With ``die_on``: the first
    attempt to train that model kills its worker process after training, before the model is
    saved (``marker`` records that the death happened)."""

    def __init__(self, log: Path, die_on: int | None = None, marker: Path | None = None):
        super().__init__()
        self.log, self.die_on, self.marker = str(log), die_on, marker and str(marker)

    def __call__(self, config, keep, indices, data, *, seeds, device, progress=False,
                 on_progress=None):
        out = MB.train_members(config, keep, indices, data, seeds=seeds, device=device)
        with open(self.log, "a") as fh:
            fh.write("".join(f"{i}\n" for i in indices))
        if self.die_on in indices and not os.path.exists(self.marker):
            Path(self.marker).write_text(f"pid {os.getpid()}\n")
            os._exit(1)                    # the worker dies: Ray must retry the task
        return out


def trained_models(log: Path) -> list[int]:
    return sorted(int(line) for line in log.read_text().split()) if log.exists() else []


def assert_same_bank(a: B.Bank, b: B.Bank, atol: float = 1e-6) -> None:
    np.testing.assert_array_equal(a.keep, b.keep)
    np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=atol)
    np.testing.assert_allclose(a.population_scores, b.population_scores, rtol=0, atol=atol)
    if a.train_mode_scores is None:                    # a model without BN: none to compare
        assert b.train_mode_scores is None
    else:
        np.testing.assert_allclose(a.train_mode_scores, b.train_mode_scores, rtol=0, atol=atol)
    np.testing.assert_array_equal(a.correct, b.correct)
    np.testing.assert_allclose(a.models.test_acc, b.models.test_acc, rtol=0, atol=atol)


# --- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_ex():
    """One local Ray with 2 CPUs for the module; shut down at the end."""
    if ray is None:
        pytest.skip('Ray is not installed (pip install -e ".[ray]")')
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process; these tests start their own")
    # the workers cannot import this test module: send its classes and functions by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ex = E.RayExecutor(local_cpus=2, max_retries=3)
    yield ex
    ex.close()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def data():
    return MB.prepare_data(CFG, "cpu")


def train_local(folder, data, **kw) -> B.Bank:
    """The bank on the local executor, with one torch thread as each Ray task runs."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return B.train_bank(CFG, folder, device="cpu", data=data, progress=False, **kw)
    finally:
        torch.set_num_threads(old)


@pytest.fixture(scope="module")
def local_bank(tmp_path_factory, data):
    """The reference: the sequential trainer, one model per call, in this process."""
    return train_local(tmp_path_factory.mktemp("local"), data, trainer=MB.SEQUENTIAL,
                       members_per_call=1)


# --- no Ray needed ---------------------------------------------------------------------------------
def test_executor_names_are_checked():
    assert E.is_local(None) and E.is_local("local") and E.is_local(E.LocalExecutor())
    assert not E.is_local("ray")
    with pytest.raises(ValueError, match="unknown executor 'dask'; valid choices: local, ray"), \
            E.using("dask"):
        pass
    with pytest.raises(ValueError, match="unknown executor 'slurm'"):
        B.train_bank(CFG, "/nonexistent", device="cpu", executor="slurm")
    with pytest.raises(TypeError, match="executor must be one of"):
        E.is_local(3)


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` now fails
    with pytest.raises(ImportError, match=r'pip install -e "\.\[ray\]"'), E.using("ray"):
        pass
    with pytest.raises(ImportError, match="optional extra"):
        B.train_banks([CFG], "/nonexistent", device="cpu", executor="ray")


class _SlowRay:
    """A stand-in for the ray module whose node times out during start-up ``slow`` times."""

    def __init__(self, slow: int, error: str = "The current node timed out during startup."):
        self.slow, self.error, self.inits, self.shutdowns = slow, error, 0, 0

    def is_initialized(self):
        return False

    def init(self, **kw):
        self.inits += 1
        if self.inits <= self.slow:
            raise Exception(self.error)

    def shutdown(self):
        self.shutdowns += 1

    def remote(self, fn):
        return fn


def test_a_ray_that_starts_too_slowly_is_started_again(monkeypatch):
    """Ray's node must come up within its fixed 30 s; on a busy machine it may not: the executor
    starts it again (with a warning), up to RAY_START_ATTEMPTS times, and raises any other
    start-up error at once."""
    for slow, raised in ((1, False), (E.RAY_START_ATTEMPTS - 1, False),
                         (E.RAY_START_ATTEMPTS, True)):
        fake = _SlowRay(slow)
        monkeypatch.setattr(E, "require_ray", lambda fake=fake: fake)
        ex = E.RayExecutor(address="auto")
        with pytest.warns(UserWarning, match="did not start in time"):
            if raised:
                with pytest.raises(Exception, match="timed out during startup"):
                    ex.start()
            else:
                assert ex.start().started
        assert fake.inits == min(slow + 1, E.RAY_START_ATTEMPTS) and fake.shutdowns == min(
            slow, E.RAY_START_ATTEMPTS - 1)
    fake = _SlowRay(1, error="no such cluster")
    monkeypatch.setattr(E, "require_ray", lambda: fake)
    with pytest.raises(Exception, match="no such cluster"):
        E.RayExecutor(address="auto").start()
    assert fake.inits == 1 and fake.shutdowns == 0


def test_local_executor_maps_in_order():
    ex = E.LocalExecutor()
    assert list(ex.imap(pow, [2, 3], 3)) == [(0, 8), (1, 27)]
    assert E.fetch(ex.put("x")) == "x"


def test_local_workers_run_items_at_once_on_one_thread_each():
    """Two workers run two items at the same time (each waits for the other at a barrier),
    torch on one thread in each; results come back with their item's index, the thread count
    is restored, and a task's error is raised by the map."""
    barrier = threading.Barrier(2, timeout=30)

    def task(x):
        barrier.wait()
        return x * 10, torch.get_num_threads()

    before = torch.get_num_threads()
    with E.using("local", workers=2) as ex:
        got = dict(ex.imap(task, [1, 2]))
        assert got == {0: (10, 1), 1: (20, 1)} and torch.get_num_threads() == before
        with pytest.raises(ZeroDivisionError):
            list(ex.imap(lambda x: 1 // x, [1, 0, 2]))
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="workers must be a positive integer"):
            E.LocalExecutor(bad)


def test_tensors_to_moves_every_tensor_field(data):
    moved = E.tensors_to(data, "cpu")
    assert moved.x is data.x and moved.num_classes == data.num_classes   # already there: no copy
    with pytest.raises(TypeError, match="dataclass"):
        E.tensors_to({"x": data.x}, "cpu")


def test_chunk_task_rechecks_the_cache(tmp_path, data, local_bank):
    """A (retried) task trains only the models of its chunk that have no sound file."""
    folder = tmp_path / "bank"
    folder.mkdir()
    src = local_bank.folder
    for i in (0, 2):                                       # models 0 and 2 finished before
        B.model_path(folder, i).write_bytes(B.model_path(src, i).read_bytes())
    B.model_path(folder, 1).write_bytes(b"truncated")       # model 1's file is damaged
    log = tmp_path / "trained.log"
    job = B.BankJob(config=CFG, key=local_bank.key, folder=str(folder), keep=local_bank.keep,
                    seeds=B.member_seeds(CFG.seed, CFG.measure.n_models), device="cpu",
                    trainer=CountingTrainer(log),
                    shape=B.record_shape(CFG, data, MB.SEQUENTIAL, torch.device("cpu")))
    out = B.train_bank_chunk([0, 1, 2, 3], job, data)
    assert trained_models(log) == [1, 3]
    assert sorted(out) == [0, 1, 2, 3] and all("logits" not in r for r in out.values())
    for i in range(4):
        np.testing.assert_array_equal(out[i]["scores"].numpy(), local_bank.scores[i])


def _gpu_ids(item):
    import time

    import ray

    time.sleep(1.5)   # long enough for the tasks to overlap
    return [int(i) for i in ray.get_gpu_ids()]


@needs_ray
@pytest.mark.slow(minutes=1)
def test_gpu_tasks_spread_one_per_gpu():
    """On a cluster with 4 (fake) GPUs, tasks that train on CUDA take one GPU each: every task
    sees exactly one GPU id, and the tasks that run at once (half a CPU each: up to four) use
    all four (placement only: no CUDA here)."""
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, num_gpus=4, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    try:
        ex = E.RayExecutor(num_cpus_per_task=0.5)
        assert ex.gpus_per_task(True) == 1.0 and ex.gpus_per_task(False) == 0.0
        seen = dict(ex.imap(_gpu_ids, list(range(8)), gpu=True))     # {task: its GPU ids}
        assert sorted(seen) == list(range(8))
        assert all(len(ids) == 1 for ids in seen.values()), seen
        assert {ids[0] for ids in seen.values()} == {0, 1, 2, 3}, seen
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@needs_ray
def test_ray_starts_only_when_there_is_work(data, local_bank):
    ex = E.RayExecutor(num_gpus_per_task=0.5)
    assert not ex.started and ex.gpus_per_task(True) == 0.5 and ex.gpus_per_task(False) == 0
    cached = B.train_bank(CFG, local_bank.folder.parent.parent, device="cpu", data=data,
                          progress=False, executor=ex, trainer=MB.SEQUENTIAL)
    assert cached.trained == 0 and not ex.started      # everything cached: Ray never started
    ex.close()
    for bad in ({"num_gpus_per_task": -1}, {"num_gpus_per_task": 1.5}, {"max_retries": 0.5}):
        with pytest.raises(ValueError):
            E.RayExecutor(**bad)


# --- on a local Ray with 2 CPUs --------------------------------------------------------------------
@needs_ray
def test_ray_map_keeps_order_and_raises_permanent_errors_at_once(ray_ex, tmp_path):
    assert sorted(ray_ex.imap(pow, [1, 2, 3, 4], 2)) == [(0, 1), (1, 4), (2, 9), (3, 16)]
    assert sorted(ray_ex.imap(np.sum, [np.ones(3), np.ones(5)])) == [(0, 3.0), (1, 5.0)]
    with pytest.raises(ValueError, match="invalid literal"):   # not retried, same type as local
        list(ray_ex.imap(int, ["1", "x"]))
    with pytest.raises(E.ExecutorError, match="has no GPU"):
        list(ray_ex.imap(pow, [1], 2, gpu=True))


@needs_ray
def test_ray_bank_equals_local_bank(ray_ex, tmp_path, data, local_bank):
    # the sequential trainer, two models per task (two tasks, one per CPU)
    remote = B.train_bank(CFG, tmp_path / "seq", device="cpu", data=data, progress=False,
                          executor=ray_ex, trainer=MB.SEQUENTIAL, members_per_call=2)
    assert remote.trained == 4 and remote.key == local_bank.key
    assert_same_bank(remote, local_bank)           # within 1e-6 (bit for bit when measured)
    # a rerun reads everything back and submits nothing
    again = B.train_bank(CFG, tmp_path / "seq", device="cpu", data=data, progress=False,
                         executor=ray_ex, trainer=MB.SEQUENTIAL)
    assert again.trained == 0
    assert_same_bank(again, local_bank)
    # the default trainer (vectorised for LeNet) with the same chunks on both executors
    local_vec = train_local(tmp_path / "vec_local", data, members_per_call=2)
    remote_vec = B.train_bank(CFG, tmp_path / "vec_ray", device="cpu", data=data,
                              progress=False, executor=ray_ex, members_per_call=2)
    assert remote_vec.trained == 4
    assert_same_bank(remote_vec, local_vec)


@needs_ray
def test_ray_bank_interrupted_resumes_without_retraining(ray_ex, tmp_path, data, local_bank):
    """An interrupt in the driver cancels the unfinished tasks; the rerun trains exactly the
    models that have no file, and the bank equals the uninterrupted one."""
    import time

    log = tmp_path / "trained.log"

    def stop(i):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        B.train_bank(CFG, tmp_path, device="cpu", data=data, progress=False, executor=ray_ex,
                     trainer=CountingTrainer(log), on_model_done=stop)
    folder = B.bank_folder(CFG, tmp_path, "cpu")
    missing = [i for i in range(4) if not B.model_path(folder, i).exists()]
    deadline = time.monotonic() + 60                 # the workers give their CPUs back
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    # the interrupt returned only once the cancelled tasks had ended: no file appears later
    assert [i for i in range(4) if not B.model_path(folder, i).exists()] == missing
    assert len(missing) < 4                           # the model that finished is kept
    resumed_log = tmp_path / "resumed.log"
    resumed = B.train_bank(CFG, tmp_path, device="cpu", data=data, progress=False,
                           executor=ray_ex, trainer=CountingTrainer(resumed_log))
    assert resumed.trained == len(missing)
    assert trained_models(resumed_log) == missing
    assert_same_bank(resumed, local_bank)


@needs_ray
def test_ray_retries_a_dead_worker_without_retraining_finished_models(ray_ex, tmp_path, data,
                                                                         local_bank):
    log, marker = tmp_path / "trained.log", tmp_path / "died"
    done = []
    bank = B.train_bank(CFG, tmp_path / "cache", device="cpu", data=data, progress=False,
                        executor=ray_ex, trainer=CountingTrainer(log, die_on=2, marker=marker),
                        on_model_done=done.append)
    assert marker.exists()                                  # the worker did die once
    assert trained_models(log) == [0, 1, 2, 2, 3]           # only the lost model twice
    assert sorted(done) == [0, 1, 2, 3] and bank.trained == 4
    assert_same_bank(bank, local_bank)
    # drop one finished model: a rerun on Ray trains that one only
    B.model_path(bank.folder, 1).unlink()
    again = B.train_bank(CFG, tmp_path / "cache", device="cpu", data=data, progress=False,
                         executor=ray_ex, trainer=CountingTrainer(log))
    assert again.trained == 1 and trained_models(log) == [0, 1, 1, 2, 2, 3]
    assert_same_bank(again, local_bank)


@needs_ray
def test_ray_penalised_bank_equals_local_and_differs_from_plain(ray_ex, tmp_path, data,
                                                               local_bank):
    """Notebook 05's banks (mit_executor="ray"): each member trained with the gamma/sigma
    penalty, in Ray tasks, equals the local run, and the penalty really reached training."""

    config = CFG.replace(penalty={"lam": 3.0, "form": "square"})
    local = B.train_bank(config, tmp_path / "local", device="cpu", data=data, progress=False,
                         members_per_call=2)
    remote = B.train_bank(config, tmp_path / "ray", device="cpu", data=data, progress=False,
                          executor=ray_ex, members_per_call=2)
    assert remote.trained == 4
    assert_same_bank(remote, local)
    assert np.abs(local.scores - local_bank.scores).max() > 1e-3


@needs_ray
def test_ray_grid_equals_local_grid(ray_ex, tmp_path):
    configs = X.make_grid(datasets=["digits"], archs=["mlp"], norms=["bn", "none"],
                          corruptions=X.corruption_settings(flip_rates=[0.05]), seeds=[0],
                          train=TrainConfig(epochs=2, batch_size=64, augment=False),
                          train_size=200, test_size=100, track=("gamma_sigma",))
    local = X.run_grid(configs, "cpu", tmp_path / "local", progress=False)
    remote = X.run_grid(configs, "cpu", tmp_path / "ray", progress=False, executor=ray_ex)
    assert [r.config for r in remote] == configs and not any(r.cached for r in remote)
    for a, b in zip(local, remote, strict=True):
        assert a.key == b.key
        cols = [c for c in a.history.columns if c != "seconds"]
        np.testing.assert_allclose(a.history[cols].to_numpy(float),
                                   b.history[cols].to_numpy(float), rtol=0, atol=1e-6)
        if len(a.gamma_sigma):
            np.testing.assert_allclose(a.gamma_sigma.ratio, b.gamma_sigma.ratio, rtol=0,
                                       atol=1e-6)
    again = X.run_grid(configs, "cpu", tmp_path / "ray", progress=False, executor=ray_ex)
    assert all(r.cached for r in again)


@needs_ray
def test_ray_gradient_norms_equal_local_ones(ray_ex, tmp_path):
    from bnmem_utils.jobs import gradnorms as G

    configs = G.make_configs(norms=["bn", "none"], seeds=[0], arch="lenet",
                             data=DataConfig("digits", train_size=120, test_size=60),
                             corruption=CorruptionConfig(flip_rate=0.1),
                             train=TrainConfig(epochs=2, batch_size=32, lr=0.1, augment=False),
                             measure=GradNormMeasure(measure_epochs=[0, 2], max_clean=10))
    local = G.run(configs, "cpu", tmp_path / "local", progress=False, threads=1)  # as a task
    remote = G.run(configs, "cpu", tmp_path / "ray", progress=False, executor=ray_ex)
    assert [r.config for r in remote] == configs and not any(r.cached for r in remote)
    for a, b in zip(local, remote, strict=True):
        assert a.key == b.key and a.epochs == b.epochs
        for d in a.norms:
            torch.testing.assert_close(a.norms[d], b.norms[d], rtol=0, atol=1e-6)
    again = G.run(configs, "cpu", tmp_path / "ray", progress=False, executor=ray_ex)
    assert all(r.cached for r in again)
    forced = G.run(configs, "cpu", tmp_path / "ray", progress=False, executor=ray_ex, force=True)
    assert not any(r.cached for r in forced)


@needs_ray
def test_ray_arm_banks_run_together_and_equal_local_ones(ray_ex, tmp_path):
    """Notebook 05's banks on Ray: every arm's missing models go out as one batch of chunk
    tasks; the banks equal the ones trained in this process."""
    from bnmem_utils.analyses import mitigation as RG
    from bnmem_utils.jobs.config import PenaltyConfig

    arms = {"plain": ("bn", None), "penalty": ("bn", PenaltyConfig(lam=3.0)),
            "none": ("none", None)}
    configs = {k: CFG.replace(norm=norm, penalty=pen) for k, (norm, pen) in arms.items()}
    local = RG.train_arm_banks(configs, tmp_path / "local", device="cpu", progress=False)
    remote = RG.train_arm_banks(configs, tmp_path / "ray", device="cpu", progress=False,
                                executor=ray_ex)
    assert list(remote) == list(arms) and all(b.trained == 4 for b in remote.values())
    for label in arms:
        assert_same_bank(remote[label], local[label])
