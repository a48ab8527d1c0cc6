"""Shadow-model banks for membership inference: N models per arm, each trained on a random half.

An *arm* is a data set, an architecture, a norm and a corruption setting: a
:class:`~bnmem_utils.jobs.config.RunConfig` with a :class:`~bnmem_utils.jobs.config.BankMeasure`
(:meth:`RunConfig.bank <bnmem_utils.jobs.config.RunConfig.bank>`), with or without the gamma/sigma
penalty.
Its bank holds N models; the balanced keep matrix (N, M) puts every one of the M pool samples in
exactly N/2 models' training sets (:func:`keep_matrix`). Each model is queried, in eval mode, on
every pool sample under Q deterministic augmentations (identity + mirror for CIFAR; identity +
four one-pixel shifts for digits and MNIST), and its logits are kept. BN models are also queried
in train mode, batch by batch, as the reference LiRA code did (the ablation of notebook 04).

Layout on disk, under ``<cache_dir>/banks/<key>/`` (``key``:
:meth:`RunConfig.key <bnmem_utils.jobs.config.RunConfig.key>`):

* ``config.json``: the config, for provenance;
* ``model_0000.pt`` ...: one file per finished model (its float64 LiRA scores, eval and train
  mode, on the pool and the population; its correctness; its accuracies; and its raw logits
  when they are small, see :data:`MAX_STORED_LOGITS`), written atomically as soon as the model
  is done, so an interrupted bank resumes without retraining;
  a file that is unreadable, truncated, of the wrong shape or of another bank is reported and
  the model retrained;
* ``keep.npy`` (N, M) and ``scores.npy`` (N, M, Q): the layout the reference LiRA code reads,
  written once the bank is complete (plus ``population_scores.npy``, ``seeds.npy``,
  ``kind.npy`` and, for BN, ``train_mode_scores.npy``).

Members are trained by :func:`bnmem_utils.jobs.bank_models.train_members`, one after another or K at once
(a :class:`~bnmem_utils.jobs.bank_models.MemberTrainer`, passed as ``trainer=`` to :func:`train_bank`).
The tables of notebook 04 over finished banks are in :mod:`bnmem_utils.analyses.leakage`.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from bnmem_utils.core import cache, executors
from bnmem_utils.core.cache import CacheError, atomic_path, atomic_write_text, sweep_orphans
from bnmem_utils.core.checks import check_choice as _choices
from bnmem_utils.core.checks import keep_matrix
from bnmem_utils.core.device import cpu_threads, resolve_device
from bnmem_utils.core.paths import cache_dir as default_cache_dir
from bnmem_utils.core.stats import Estimate, mean_ci
from bnmem_utils.data.datasets import CLEAN, dataset_loader
from bnmem_utils.jobs.bank_models import (
    SEQUENTIAL,
    VECTORISED,
    BankData,
    MemberTrainer,
    checked_members_per_call,
    prepare_data,
    task_block,
)
from bnmem_utils.jobs.config import (
    VERSIONS,
    BankMeasure,
    CorruptionConfig,
    DataConfig,
    ModelConfig,
    RunConfig,
    bank_trainer,
)
from bnmem_utils.privacy import attacks
from bnmem_utils.training.steps import TrainConfig


def member_seeds(seed: int, n_models: int) -> np.ndarray:
    """One training seed per model, derived from the bank seed (int64, reproducible)."""
    ss = np.random.SeedSequence([int(seed), 0x6D656D62])  # "memb"
    return ss.generate_state(n_models, dtype=np.uint32).astype(np.int64)


# --------------------------------------------------------------------------------------------
# Per-model cache files
# --------------------------------------------------------------------------------------------
def bank_folder(config: RunConfig, cache_dir: str | os.PathLike | None = None,
                device: str | torch.device = "cpu", data_root=None) -> Path:
    """``<cache_dir>/banks/<key>``: where a bank's files live (``data_root``: the data folder
    its pool is read from first, as :func:`train_banks` takes it)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "banks" / config.key(device, data_root)


def model_path(folder: Path, index: int) -> Path:
    return Path(folder) / f"model_{index:04d}.pt"


#: Logits are kept in a model's cache file only up to this many values (M * Q * C): digits and
#: CIFAR-10 keep them, CIFAR-100 (50,000 x 2 x 100 per model) keeps only the scores.
MAX_STORED_LOGITS = 2**22


def compact_record(record: Mapping, data: BankData) -> dict:
    """What a model's cache file keeps: its LiRA scores (float64, computed from the float32
    logits), correctness on the identity query, the scalars, and the raw logits when small.

    ``scores`` (M, Q), ``pop_scores`` (P, Q), ``train_scores`` (M, Q) or None, ``correct`` (M,).
    """
    y = data.y.cpu().numpy()

    def score(logits, labels=y):
        return torch.from_numpy(attacks.lira_score_from_logits(logits, labels[:, None]))

    logits = record["logits"]                                          # (M, Q, C)
    out = {k: v for k, v in record.items() if k not in ("logits", "pop_logits", "train_logits")}
    out["scores"] = score(logits)
    out["pop_scores"] = score(record["pop_logits"], data.pop_y.cpu().numpy())
    out["correct"] = torch.from_numpy(attacks.correct_from_logits(logits[:, 0], y))
    train = record.get("train_logits")
    out["train_scores"] = None if train is None else score(train)
    if logits.numel() <= MAX_STORED_LOGITS:
        out["logits"] = logits.float()
    return out


def save_record(path: Path, record: Mapping, key: str, shape: Mapping) -> None:
    """Write one model's record (:mod:`bnmem_utils.core.cache`): its tensors, its plain numbers
    (index, seed, accuracies, ...), the bank key, and from ``shape`` (:func:`record_shape`) the
    digest of the pool it was trained on and the vectorised block it was trained in."""
    tensors = {k: v for k, v in record.items() if isinstance(v, torch.Tensor)}
    meta = {k: v for k, v in record.items() if v is not None and k not in tensors}
    cache.write(path, {**meta, "kind": "bank", "version": VERSIONS["bank"], "bank_key": key,
                       "pool": shape["pool"], "block": shape["block"]}, tensors)


def read_back(folder: Path, index: int, key: str, shape: Mapping) -> dict | None:
    """Model ``index``'s record read back from its file and checked, without the raw logits (the
    scores suffice from here on; the logits stay on disk); None when there is no file.

    :class:`CacheError` when the file cannot be trusted: unreadable or damaged, of another bank,
    model or pool (a bank given a pool of its own, ``train_banks(data=...)``, and then its
    config's), trained in another vectorised block (another GPU's memory sizes it), of the
    wrong shapes (``shape``: :func:`record_shape`) or non-finite.
    """
    path = model_path(folder, index)
    record = cache.read(path, kind="bank", version=VERSIONS["bank"], bank_key=key, index=index,
                        pool=shape["pool"], block=shape["block"])
    if record is None:
        return None
    rec = {**record[0], **record[1]}
    m, q = shape["n_samples"], shape["n_queries"]
    shapes = {"scores": (m, q), "pop_scores": (shape["n_pop"], q), "correct": (m,)}
    if shape["train_mode"]:
        shapes["train_scores"] = (m, q)
    if rec.get("logits") is not None:
        shapes["logits"] = (m, q, shape["num_classes"])
    for name, shape in shapes.items():
        t = rec.get(name)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise CacheError(f"{path}: {name} has shape {got}, expected {shape}")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CacheError(f"{path}: {name} holds non-finite values")
    for name in ("test_acc", "test_loss", "seed", "seconds"):
        if not isinstance(rec.get(name), (int, float)):
            raise CacheError(f"{path}: missing {name}")
    rec.pop("logits", None)
    return rec


# --------------------------------------------------------------------------------------------
# The bank
# --------------------------------------------------------------------------------------------
@dataclass
class Bank:
    """A finished bank: membership, LiRA scores and per-model accuracies (logits stay on disk).

    Shapes: ``keep`` (N, M) bool; ``scores`` (N, M, Q) float64 LiRA scores (eval mode);
    ``train_mode_scores`` (N, M, Q) for BN banks (else None); ``population_scores`` (N, P, Q);
    ``correct`` (N, M) bool (identity query, eval mode, against the training labels);
    ``kind`` (M,) CLEAN/FLIPPED/OOD; ``models``: one row per model (seed, accuracies, seconds).
    """

    config: RunConfig
    key: str
    folder: Path
    keep: np.ndarray
    scores: np.ndarray
    population_scores: np.ndarray
    correct: np.ndarray
    kind: np.ndarray
    labels: np.ndarray
    models: pd.DataFrame
    train_mode_scores: np.ndarray | None = None
    trained: int = 0                        # models trained in this call (the rest were cached)
    _loo: dict = field(default_factory=dict, repr=False)

    @property
    def n_models(self) -> int:
        return int(self.keep.shape[0])

    @property
    def n_samples(self) -> int:
        return int(self.keep.shape[1])

    @property
    def outliers(self) -> np.ndarray:
        """(M,) bool: the corrupted samples (OOD inserts and label flips)."""
        return self.kind != CLEAN

    def groups(self) -> dict[str, np.ndarray]:
        """Subsets reported besides "all": ``clean`` and, when there are any, ``outlier``."""
        out = {"clean": ~self.outliers}
        if self.outliers.any():
            out["outlier"] = self.outliers
        return out

    def evaluate(self, attacks_: Sequence[str] | None = None, *, mode: str = "eval",
                 **kw) -> attacks.LeaveOneOut:
        """Leave-one-out attack results on this bank (cached per call signature in memory).

        ``mode="train"`` attacks the train-mode queries (BN banks only): every model, target and
        shadows alike, queried as the reference implementation did. RMIA needs the population,
        which is queried in eval mode only, so it is left out in train mode.
        """
        _choices("query mode", mode, ("eval", "train"))
        if attacks_ is None:
            attacks_ = tuple(attacks.ATTACKS)
        if mode == "train":
            if self.train_mode_scores is None:
                raise ValueError(f"arm {self.config.arm} has no train-mode queries (BN only)")
            attacks_ = tuple(a for a in attacks_ if not a.startswith("rmia"))
        memo = (tuple(attacks_), mode, tuple(sorted(kw.items())))
        if memo not in self._loo:
            scores = self.scores if mode == "eval" else self.train_mode_scores
            population = None
            if mode == "eval" and any(a.startswith("rmia") for a in attacks_):
                population = self.population_scores
            self._loo[memo] = attacks.evaluate_leave_one_out(
                self.keep, scores, attacks=attacks_, groups=self.groups(), population=population,
                **kw)
        return self._loo[memo]

    def memorization(self) -> np.ndarray:
        """Feldman-Zhang memorization score per pool sample (M,)."""
        return attacks.memorization_scores(self.keep, self.correct)

    def accuracy(self, column: str = "test_acc") -> Estimate:
        """Mean and t-interval over the bank's models of a column of :attr:`models`."""
        return mean_ci(self.models[column].to_numpy())


def _assemble(config: RunConfig, key: str, folder: Path, keep: np.ndarray, seeds: np.ndarray,
              records: Sequence[dict], data: BankData, trained: int) -> Bank:
    kind = data.kind.cpu().numpy()                                        # (M,)

    def stack(name: str) -> np.ndarray:
        return np.stack([r[name].numpy() for r in records])

    # (N, M, Q) float64, (N, P, Q), (N, M) bool, (N, M, Q) or None
    scores, pop_scores, correct = stack("scores"), stack("pop_scores"), stack("correct")
    train_scores = stack("train_scores") if config.model.norm == "bn" else None
    outlier = kind != CLEAN
    rows = []
    for i, r in enumerate(records):
        inn = keep[i]
        row = {"model": i, "seed": int(seeds[i]), "n_train": int(inn.sum()),
               "train_acc": float(correct[i, inn].mean()),
               "pool_out_acc": float(correct[i, ~inn].mean()),
               "test_acc": r["test_acc"], "test_loss": r["test_loss"],
               "train_loss": r.get("train_loss", float("nan")), "seconds": r["seconds"]}
        row["gap"] = row["train_acc"] - row["test_acc"]
        row["train_acc_clean"] = float(correct[i, inn & ~outlier].mean())
        row["train_acc_outlier"] = (float(correct[i, inn & outlier].mean())
                                    if (inn & outlier).any() else float("nan"))
        rows.append(row)
    models = pd.DataFrame(rows)
    # A model far below its bank's median (an unstable run that did not diverge) weakens the
    # bank as target and as shadow: flag it rather than hide it.
    models["poorly_trained"] = models.train_acc < models.train_acc.median() - POOR_TRAINING_MARGIN
    if models.poorly_trained.any():
        bad = models[models.poorly_trained]
        warnings.warn(
            f"bank {config.arm}: {len(bad)} of {len(models)} models trained poorly (train "
            f"accuracy {', '.join(f'{a:.2f}' for a in bad.train_acc)} against a median of "
            f"{models.train_acc.median():.2f}: models {bad.model.tolist()}); they stay in the "
            "bank and in its numbers", stacklevel=3)
    bank = Bank(config=config, key=key, folder=folder, keep=keep, scores=scores,
                population_scores=pop_scores, correct=correct, kind=kind,
                labels=data.y.cpu().numpy(), models=models, train_mode_scores=train_scores,
                trained=trained)
    # keep.npy (N, M) and scores.npy (N, M, Q): the reference LiRA layout
    for name, array in (("keep", keep), ("scores", scores), ("population_scores", pop_scores),
                        ("seeds", seeds), ("kind", kind), ("train_mode_scores", train_scores)):
        if array is not None:
            with atomic_path(folder / f"{name}.npy") as tmp, open(tmp, "wb") as fh:
                np.save(fh, array)
    return bank


# --------------------------------------------------------------------------------------------
# Shadow-model banks: one task per chunk of models
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BankJob:
    """What every chunk task of one bank needs besides the pool data (shipped once per bank)."""

    config: RunConfig           # the bank's description
    key: str                    # the bank's cache key (checked in every cache file)
    folder: str                 # <cache_dir>/banks/<key>: where the tasks write model files
    keep: np.ndarray            # (N, M) bool membership
    seeds: np.ndarray           # (N,) per-model training seeds
    device: str                 # device type the models train on ("cpu", "cuda", "mps")
    trainer: MemberTrainer      # one after another, K at once, or a drop-in
    shape: Mapping[str, Any]    # the shapes the model files are checked against
    force: bool = False         # retrain every model, whatever its file holds


def train_bank_chunk(chunk: Sequence[int], job: BankJob, data,
                     progress: Callable[[float], None] | None = None) -> dict[int, dict]:
    """The task of one chunk of bank models: train those whose cache file is missing or cannot
    be trusted, write each file atomically, and return every model's record (as read back from
    its file, without the raw logits). A retried task therefore trains only what its failed
    attempt did not save. ``progress(fraction)``: told how far the chunk's trainer is (local
    workers only; it does not travel to Ray)."""
    dev = resolve_device(job.device)
    data = executors.on_device(data, dev)
    folder = Path(job.folder)
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[int, dict] = {}
    for i in () if job.force else chunk:
        try:
            out[i] = read_back(folder, i, job.key, job.shape)
        except CacheError:
            pass                                       # damaged or foreign: retrain it
    todo = [int(i) for i in chunk if out.get(i) is None]
    if todo:
        new = job.trainer(job.config, job.keep, todo, data, seeds=job.seeds, device=dev,
                          on_progress=progress)
        for i in todo:          # saved, then returned as read back from its file
            save_record(model_path(folder, i), compact_record(new[i], data), job.key,
                        job.shape)
            out[i] = read_back(folder, i, job.key, job.shape)
    return out


def train_bank_chunks(executor: executors.Executor, work: Sequence[tuple[BankJob, Any, list]], *,
                      on_record: Callable[[int, int, dict], None], bar=None) -> None:
    """Train the missing models of several banks as one batch of chunk tasks on ``executor``
    (``work``: each bank's job, pool data and aligned chunks of model indices), so that no
    worker waits while the last chunks of one bank finish. As a chunk finishes,
    ``on_record(bank, index, record)`` is called for each of its models (``bank``: its place
    in ``work``); ``bar`` (model-epochs) moves as the chunks train.

    Locally the chunks train on the executor's workers in this process; on Ray each pool
    object goes to the workers once (on the CPU; each worker moves it to its device), and a
    record whose file the driver cannot see (no shared file system) is written here too. When
    ``on_record`` raises (an interrupt), the chunks not started are cancelled; what finished is
    on disk.
    """
    local = isinstance(executor, executors.LocalExecutor)
    items, shipped = [], {}
    for b, (job, data, chunks) in enumerate(work):
        if not local:
            if id(data) not in shipped:
                shipped[id(data)] = executor.put(executors.tensors_to(data, "cpu"))
            data = shipped[id(data)]
        items += [(b, [int(i) for i in c], job, data) for c in chunks if len(c)]
    moves = _Progress(bar, [len(c) * max(1, int(job.config.train.epochs)) for _, c, job, _ in items])
    items = [(*item, partial(moves.moved, j) if local else None) for j, item in enumerate(items)]
    gpu = any(job.device == "cuda" for job, _, _ in work)
    with closing(executor.imap(_chunk_task, items, gpu=gpu)) as finished:
        for j, records in finished:
            b, _, job = items[j][:3]
            for i in sorted(records):
                path = model_path(Path(job.folder), i)
                if not path.exists():
                    save_record(path, records[i], job.key, job.shape)
                on_record(b, i, records[i])
            moves.moved(j, 1.0)


def _chunk_task(item) -> dict[int, dict]:
    """One task of :func:`train_bank_chunks`: a chunk of one bank's models on its pool data
    (read from the executor's store)."""
    _, chunk, job, data, progress = item
    return train_bank_chunk(chunk, job, executors.fetch(data), progress=progress)


class _Progress:
    """The banks' bar (model-epochs): chunk ``j`` of ``spans[j]`` model-epochs moves it as its
    trainer reports (from any worker thread) and when it finishes."""

    def __init__(self, bar, spans: Sequence[int]):
        self.bar, self.span, self.left, self.lock = bar, list(spans), list(spans), threading.Lock()

    def moved(self, j: int, fraction: float) -> None:
        """Chunk ``j`` is ``fraction`` of its way through."""
        with self.lock:
            step = int(self.span[j] * min(max(fraction, 0.0), 1.0)) - (self.span[j] - self.left[j])
            if step > 0:
                self.left[j] -= step
                if self.bar is not None:
                    self.bar.update(step)


def default_trainer(config: RunConfig, device: str | torch.device = "cpu") -> MemberTrainer:
    """The trainer a bank of ``config`` gets on ``device`` when :func:`train_bank` is given none:
    :data:`bnmem_utils.jobs.bank_models.VECTORISED` (K models at once) where
    :func:`bnmem_utils.jobs.config.bank_trainer` says so, else :data:`bnmem_utils.jobs.bank_models.SEQUENTIAL`
    (one model after another)."""
    return VECTORISED if bank_trainer(config, device) == "vectorised" else SEQUENTIAL


def local_workers(device: torch.device) -> int:
    """How many chunks of a bank train at once in this process: one per torch CPU thread on a
    CPU (each chunk then on one thread: no OpenMP team to wait for, idle or beside other
    work), one on a GPU."""
    return torch.get_num_threads() if device.type == "cpu" else 1


#: A model whose train accuracy is this far below its bank's median is flagged as poorly trained.
POOR_TRAINING_MARGIN = 0.2


def record_shape(config: RunConfig, data: BankData, trainer: MemberTrainer,
                 device: torch.device) -> dict[str, Any]:
    """The shapes every model file of ``config``'s bank on ``data`` is checked against, the
    digest of the pool (every model of the bank trains and is queried on it) and, for
    ``trainer`` vectorised, the block of models it trains together on ``device``."""
    return {"n_samples": data.n_samples, "n_pop": int(data.pop_y.shape[0]),
            "n_queries": len(config.measure.queries), "num_classes": data.num_classes,
            "train_mode": config.model.norm == "bn", "pool": data.digest,
            "block": trainer.members_per_call(config, device) if trainer.vectorised else None}


def pending(config: RunConfig, cache_dir, device: torch.device, data: BankData, *,
            trainer: MemberTrainer | None = None, members_per_call: int | None = None,
            force: bool = False, root=None) -> tuple[BankJob, list[dict | None], list[list[int]]]:
    """``config``'s bank job on ``data``, every model's record read back from the cache (None
    where there is none, where it cannot be trusted (reported) or, with ``force``, everywhere:
    the job then retrains every model and overwrites its file, atomically, so that another
    process reading or writing the same bank meanwhile never meets a missing file), and the
    aligned chunks of the models still to train."""
    key, folder = _open_folder(config, cache_dir, device, root)
    n = config.measure.n_models
    trainer = trainer or default_trainer(config, device)
    if type(trainer) is MemberTrainer and trainer.vectorised:
        # the block this process sizes (whole blocks per task) travels with the job: a Ray
        # worker on another GPU trains in it, as its model files record
        trainer = replace(trainer, block=task_block(config, device, trainer.block,
                                                    members_per_call))
    job = BankJob(config=config, key=key, folder=str(folder),
                  keep=keep_matrix(n, data.n_samples, config.seed, config.measure.pairs),
                  seeds=member_seeds(config.seed, n), device=device.type, trainer=trainer,
                  shape=record_shape(config, data, trainer, device), force=force)
    records: list[dict | None] = [None] * n
    for i in () if force else range(n):
        try:
            records[i] = read_back(folder, i, key, job.shape)
        except CacheError as exc:
            warnings.warn(f"bank {config.arm}: retraining model {i}: {exc}", stacklevel=3)
    todo = [i for i in range(n) if records[i] is None]
    step = members_per_call or job.trainer.members_per_call(config, device)
    return job, records, aligned_chunks(todo, step)


def train_bank(config: RunConfig, cache_dir: str | os.PathLike | None = None, **kw) -> Bank:
    """Build (or resume, or read back) the bank of ``config``: :func:`train_banks` of one."""
    return train_banks([config], cache_dir, **kw)[0]


def aligned_chunks(todo: Sequence[int], step: int) -> list[list[int]]:
    """The model indices ``todo`` in chunks aligned to multiples of ``step`` (chunk b: the
    indices among ``b*step .. (b+1)*step - 1``), so that a vectorised trainer always trains the
    same models together, whichever were already cached."""
    step = max(1, int(step))
    return [[i for i in todo if i // step == b] for b in sorted({i // step for i in todo})]


def _open_folder(config: RunConfig, cache_dir, device: torch.device, root=None
                 ) -> tuple[str, Path]:
    """The bank's key and folder, made, with its ``config.json`` (provenance) written and the
    temporary files of writers killed mid-write swept (:func:`~bnmem_utils.core.cache.sweep_orphans`)."""
    key = config.key(device, root)
    folder = bank_folder(config, cache_dir, device, root)
    folder.mkdir(parents=True, exist_ok=True)
    sweep_orphans(folder)
    atomic_write_text(folder / "config.json",
                      json.dumps({"key": key, "device": device.type, "version": VERSIONS["bank"],
                                  "config": config.as_dict()}, indent=1) + "\n")
    return key, folder


def _bar(jobs: Sequence[BankJob], todo: Sequence[int], progress: bool):
    """The banks' bar, in model-epochs, so that it moves while a vectorised block of K models
    trains (the trainer reports the fraction of its call done after each epoch)."""
    from tqdm.auto import tqdm

    epochs = [max(1, int(job.config.train.epochs)) for job in jobs]
    n = [job.config.measure.n_models for job in jobs]
    desc = (f"bank {jobs[0].config.arm} ({n[0]} models x {epochs[0]} epochs)" if len(jobs) == 1
            else f"{len(jobs)} banks ({sum(n)} models)")
    return tqdm(total=sum(k * e for k, e in zip(n, epochs, strict=True)),
                initial=sum((k - t) * e for k, t, e in zip(n, todo, epochs, strict=True)),
                desc=desc, unit="model-epoch", disable=not progress or not sum(todo),
                smoothing=0.0)


def train_banks(configs: Sequence[RunConfig], cache_dir: str | os.PathLike | None = None, *,
                device: str | torch.device = "auto", data: BankData | None = None, root=None,
                download: bool = False, progress: bool = True, threads: int | None = None,
                trainer: MemberTrainer | None = None, members_per_call: int | None = None,
                on_model_done: Callable[[int], None] | None = None, force: bool = False,
                executor=None, ray_address: str | None = None) -> list[Bank]:
    """Build (or resume, or read back) every bank in ``configs``; the banks in the order given.

    Finished models are read from ``<cache_dir>/banks/<key>/``; damaged files are reported and
    retrained. The missing models of *all* banks are trained as one batch of chunk tasks
    (:func:`train_bank_chunks`), ``members_per_call`` at a time by ``trainer`` (default:
    :func:`default_trainer`; default chunk: its
    :meth:`~bnmem_utils.jobs.bank_models.MemberTrainer.members_per_call`; a vectorised block is
    never split between two calls: :func:`~bnmem_utils.jobs.bank_models.task_block`); each model is saved as soon
    as it is done, after which ``on_model_done(i)`` is called with its index in its bank.
    ``force`` retrains everything. The cache key names the default trainer
    (:func:`bnmem_utils.jobs.config.bank_trainer`); a bank built with another ``trainer`` is filed
    under the same key, and each model file records the block it was trained in (none: one
    after another), so a trainer of another block retrains it rather than reading it back.

    ``data``: the pool every bank trains on (:func:`prepare_data`); by default each bank's
    own, each data set loaded once. ``threads``: torch CPU threads while building (restored
    afterwards; None or 0 leaves torch's setting). ``executor``: ``"local"`` (None, the
    default: this process, :func:`local_workers` chunks at once, each on one thread) or
    ``"ray"`` (one Ray task per chunk, on a local Ray or the cluster at ``ray_address``), or an
    :class:`bnmem_utils.core.executors.Executor`. Same results either way, bit for bit on a CPU:
    every chunk trains on one thread, the same models together.
    """
    executors.is_local(executor)               # checks the executor's name before any work
    if members_per_call is not None:
        checked_members_per_call(members_per_call)
    dev = resolve_device(device)
    load = dataset_loader(dev, root=root, download=download)
    with cpu_threads(threads), executors.using(executor, address=ray_address,
                                               workers=local_workers(dev)) as ex:
        work, records = [], []
        for config in configs:
            pool = data if data is not None else prepare_data(config, dev, root=root,
                                                              dataset=load(config))
            # banks that share their pool (only the norm or a training knob differs) hold it
            # once: in memory, and on Ray in the object store
            pool = next((p for _, p, _ in work if p is pool or p.same(pool)), pool)
            job, found, chunks = pending(config, cache_dir, dev, pool, trainer=trainer,
                                         members_per_call=members_per_call, force=force,
                                         root=root)
            work.append((job, pool, chunks))
            records.append(found)
        todo = [sum(map(len, chunks)) for _, _, chunks in work]
        bar = _bar([job for job, _, _ in work], todo, progress)

        def finished(b: int, i: int, rec: dict) -> None:
            records[b][i] = rec
            if on_model_done is not None:
                on_model_done(i)

        if sum(todo):
            train_bank_chunks(ex, work, on_record=finished, bar=bar)
        bar.close()
    return [_assemble(job.config, job.key, Path(job.folder), job.keep, job.seeds, found, pool,
                      trained=n) for (job, pool, _), found, n in zip(work, records, todo, strict=True)]


# --------------------------------------------------------------------------------------------
# Arms and the notebook's tables
# --------------------------------------------------------------------------------------------
def make_arms(*, norms: Sequence[str], outlier_rates: Sequence[float], dataset: str = "digits",
              archs: Sequence[str] = ("lenet",), outlier: str = "ood", ood_source: str = "gaussian",
              train: TrainConfig | None = None, train_size: int | None = None,
              test_size: int | None = None, width: int = 1, n_models: int = 16,
              population_size: int | None = None, seed: int = 0) -> list[RunConfig]:
    """One bank config per (architecture, outlier rate, norm), rate 0 the clean arm, each field
    named here: ``outlier="ood"`` mixes OOD inserts (random labels, from ``ood_source``) into
    the pool at each rate, as the paper's outlier mixtures; ``"flip"`` flips that fraction of
    labels. ``train``: every model's recipe (None: the default one)."""
    _choices("outlier kind", outlier, ("ood", "flip"))
    data = DataConfig(dataset, train_size=train_size, test_size=test_size)
    measure = BankMeasure(n_models=n_models, population_size=population_size)
    return [RunConfig(data=data, model=ModelConfig(a, nm, width), train=train or TrainConfig(), seed=seed,
                      corruption=CorruptionConfig(flip_rate=float(r) if outlier == "flip" else 0.0,
                                                  ood_rate=float(r) if outlier == "ood" else 0.0,
                                                  ood_source=ood_source), measure=measure)
            for a in archs for r in outlier_rates for nm in norms]


def curve_config(config: RunConfig, n_models: int) -> RunConfig:
    """The bank of notebook 04's shadow-count curve: ``config``'s data, model and training, BN on
    clean data, ``n_models`` models in complementary pairs (:class:`BankMeasure` ``pairs``)."""
    return config.replace(norm="bn", flip_rate=0.0, ood_rate=0.0, n_models=n_models, pairs=True)
