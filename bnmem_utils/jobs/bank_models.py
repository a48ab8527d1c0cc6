"""The members of a shadow-model bank: built, trained and queried, one after another or K at once.

:func:`train_members` is the one routine that trains bank members: model i is built with seed
``seeds[i]`` (the same initialisation either way), trained on the pool samples where
``keep[i]``, checked for divergence, queried (eval mode on the pool and the population,
train mode for BN) and returned as one record. It trains them one after another
(:func:`bnmem_utils.training.loop.train_model`) or, ``vectorised``, K at once in fixed blocks of model
indices (:func:`bnmem_utils.training.vectorised.train_models`); the two agree to rounding (see
:mod:`bnmem_utils.training.vectorised`). A :class:`MemberTrainer` is how a bank asks for one or the other
(:data:`SEQUENTIAL`, :data:`VECTORISED`, :func:`bnmem_utils.jobs.bank.default_trainer`), with the
number of models it trains per call.

A member's queries and test evaluation run in the precision it trained in
(:func:`bnmem_utils.training.steps.precision`: bf16 autocast on CUDA, float32 on a CPU unless
asked), their logits upcast to float32 and the LiRA scores computed in float64.
``benchmarks/bench_query_precision.py`` measures what bf16 queries change in every attack's
AUC and low-FPR TPR against float32 queries of the same models.
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.nn import functional as F

from bnmem_utils.core.checks import check_choice
from bnmem_utils.core.device import resolve_device, seed_everything
from bnmem_utils.data.datasets import corrupt, load_data
from bnmem_utils.models.nets import SMALL_ARCHS, build_model, trains_channels_last
from bnmem_utils.privacy.attacks import QUERIES
from bnmem_utils.training.loop import evaluate, predict_logits, train_model
from bnmem_utils.training.penalty import from_config
from bnmem_utils.training.steps import History, TrainingError, autocast
from bnmem_utils.training.vectorised import loss_acc, train_models

if TYPE_CHECKING:
    from bnmem_utils.jobs.config import RunConfig

__all__ = ["BankData", "CPU_CHUNK", "apply_query", "GPU_CHUNK_MAX", "GPU_MEMORY_SHARE", "MemberTrainer", "SEQUENTIAL",
           "VECTORISED", "default_chunk", "per_model_bytes", "prepare_data", "query_logits",
           "query_logits_train_mode", "safe_batch", "train_members"]


# --------------------------------------------------------------------------------------------
# The data members train on
# --------------------------------------------------------------------------------------------
@dataclass
class BankData:
    """The pool the bank is built on (corrupted training split), the test split and the
    population (test samples queried for RMIA), all tensors on the training device."""

    x: torch.Tensor             # (M, C, H, W) pool
    y: torch.Tensor             # (M,) labels trained on (wrong for corrupted samples)
    kind: torch.Tensor          # (M,) CLEAN / FLIPPED / OOD
    x_test: torch.Tensor        # (T, C, H, W)
    y_test: torch.Tensor        # (T,)
    pop_x: torch.Tensor         # (P, C, H, W)
    pop_y: torch.Tensor         # (P,)
    num_classes: int
    fill: torch.Tensor | None = None  # (1, C, 1, 1) what training and query shifts bring in

    @property
    def n_samples(self) -> int:
        return int(self.y.shape[0])

    @functools.cached_property
    def digest(self) -> str:
        """A sha256 of every tensor and value (the bytes, wherever they live): what a bank's
        model files record they were trained and queried on."""
        h = hashlib.sha256()
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                t = v.detach().cpu().contiguous()
                h.update(f"{f.name}:{t.dtype}:{tuple(t.shape)}:".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
            else:
                h.update(f"{f.name}={v!r};".encode())
        return h.hexdigest()[:20]

    def same(self, other: BankData) -> bool:
        """Whether ``other`` holds the same pool, splits and population (by value)."""
        def equal(a, b) -> bool:
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                return a.shape == b.shape and torch.equal(a, b)
            return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a == b

        return all(equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))


def prepare_data(config: RunConfig, device: str | torch.device = "cpu", *, root=None,
                 download: bool = False, dataset=None) -> BankData:
    """Load and corrupt the pool of ``config`` (or corrupt an already loaded ``dataset``)."""
    dev = resolve_device(device)
    if dataset is None:
        dataset = load_data(config, dev, root=root, download=download)
    pool = corrupt(dataset, flip_rate=config.corruption.flip_rate, ood_rate=config.corruption.ood_rate,
                   ood_source=config.corruption.ood_source, root=root,
                   seed=config.seed)
    n_test = int(dataset.y_test.shape[0])
    n_pop = n_test if config.measure.population_size is None else int(config.measure.population_size)
    if n_pop > n_test:  # not clamped: a population larger than the test split is a mistake
        raise ValueError(f"population_size must be at most the {n_test} test samples of "
                         f"{config.data.dataset}, got {n_pop}")
    fill = dataset.background.to(dev)            # what training and query shifts bring in
    return BankData(x=pool.x.to(dev), y=pool.y.to(dev), kind=pool.kind.to(dev),
                    x_test=dataset.x_test.to(dev), y_test=dataset.y_test.to(dev),
                    pop_x=dataset.x_test[:n_pop].to(dev), pop_y=dataset.y_test[:n_pop].to(dev),
                    num_classes=int(dataset.num_classes), fill=fill)


# ----------------------------------------------------------------------------------------------
# Query augmentations (LiRA's) and the queries of one model
# ----------------------------------------------------------------------------------------------
def apply_query(x: torch.Tensor, name: str, fill: torch.Tensor | None = None) -> torch.Tensor:
    """Apply the deterministic query augmentation ``name`` to a (B, C, H, W) batch.

    Shifts move the image content by one pixel and fill the freed row or column with ``fill``
    ((1, C, 1, 1), the data set's background, :attr:`bnmem_utils.data.datasets.Dataset.background`, which
    the training shifts bring in too; zeros when None).
    """
    check_choice("query", name, QUERIES)
    if name == "identity":
        return x
    if name == "mirror":
        return x.flip(-1)
    h, w = x.shape[-2:]
    if fill is not None:
        return apply_query(x - fill, name) + fill
    if name == "shift_right":
        return F.pad(x, (1, 0, 0, 0))[..., :, :w]
    if name == "shift_left":
        return F.pad(x, (0, 1, 0, 0))[..., :, 1:]
    if name == "shift_down":
        return F.pad(x, (0, 0, 1, 0))[..., :h, :]
    return F.pad(x, (0, 0, 0, 1))[..., 1:, :]  # shift_up



def safe_batch(n: int, batch: int) -> int:
    """A batch size near ``batch`` that leaves no final batch of one sample (BN needs two)."""
    b = max(2, min(batch, n))
    while n % b == 1 and b > 2:
        b -= 1
    return b


@torch.no_grad()
def query_logits(model: torch.nn.Module, x: torch.Tensor, queries: Sequence[str], *,
                 batch_size: int = 1024, fill: torch.Tensor | None = None,
                 train_mode: bool = False) -> torch.Tensor:
    """Eval-mode logits of ``model`` on ``x`` (M, C, H, W) under each query: (M, Q, C) float32,
    on the CPU (``train_mode``: BN normalises each batch with its own statistics, in the order
    given; see :func:`query_logits_train_mode`)."""
    out = [predict_logits(model, apply_query(x, q, fill), batch_size=batch_size,
                          train_mode=train_mode).float()
           for q in queries]                                  # Q x (M, classes), on the device
    return torch.stack(out, dim=1).cpu()                      # (M, Q, classes): one copy back


@torch.no_grad()
def query_logits_train_mode(model: torch.nn.Module, x: torch.Tensor, queries: Sequence[str], *,
                            batch_size: int, seed: int = 0,
                            fill: torch.Tensor | None = None) -> torch.Tensor:
    """Train-mode logits (BN normalises with each query batch's own statistics), as the reference
    LiRA code queried its models: (M, Q, C) float32 on the CPU.

    The samples are visited in a fixed random order (``seed``) in batches of ``batch_size``, so
    each batch is a random mix like a training batch (the pool lists OOD inserts last); the
    order is undone afterwards. The running statistics are left as they were
    (:func:`bnmem_utils.training.loop.predict_logits` restores them).
    """
    n = int(x.shape[0])
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))   # (M,)
    logits = query_logits(model, x[perm.to(x.device)], queries, fill=fill, train_mode=True,
                          batch_size=safe_batch(n, batch_size))                     # (M, Q, C)
    return logits[torch.argsort(perm)]                                              # original order


# --------------------------------------------------------------------------------------------
# The one routine: build, train, check, query, record
# --------------------------------------------------------------------------------------------
#: Held while a member is initialised from the global generators (seeded, then drawn from), so
#: that chunks training at once on several threads (:func:`bnmem_utils.jobs.bank.local_workers`)
#: each get the initialisation of their own seeds.
_INIT_LOCK = threading.Lock()


def _build(config: RunConfig, data, seed: int) -> torch.nn.Module:
    """Bank member of ``seed``, initialised as every trainer initialises it."""
    with _INIT_LOCK:
        seed_everything(seed)
        return build_model(config.model.arch, config.model.norm,
                           in_channels=int(data.x.shape[1]), num_classes=data.num_classes,
                           image_size=int(data.x.shape[-1]), width=config.model.width)


def _elapsed(start: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _fit_one(config: RunConfig, model, keep: np.ndarray, i: int, data, seed: int, device: torch.device,
             progress: bool, on_epoch: Callable[[int], None] | None) -> History:
    """Train one member (a fresh gamma/sigma penalty, detached after its training)."""
    idx = torch.from_numpy(np.flatnonzero(keep[i])).to(data.x.device)      # (M_i,)
    hooks = () if on_epoch is None else (lambda epoch, _model, _row: on_epoch(epoch),)
    penalty = from_config(config.penalty)
    try:
        return train_model(model.to(device), data.x[idx], data.y[idx], config=config.train,
                           seed=seed, device=device, progress=progress, regularizer=penalty,
                           fill=data.fill, hooks=hooks,
                           channels_last=trains_channels_last(config.model.arch, device))
    finally:
        if penalty is not None:
            penalty.detach()


def _in_training_precision(query: Callable) -> Callable:
    """``query(config, trained, data, ...)`` under the autocast its members trained in."""
    @functools.wraps(query)
    def run(config: RunConfig, trained, data, *args, **kw):
        with autocast(data.x.device, config.train.amp):
            return query(config, trained, data, *args, **kw)
    return run


@_in_training_precision
def _query_one(config: RunConfig, model, data, seed: int) -> dict:
    """One trained member's queries, as (1, ...) tensors and (1,) lists."""
    model.eval()
    qb = config.measure.query_batch_size
    logits = query_logits(model, data.x, config.measure.queries, batch_size=qb, fill=data.fill)
    pop_logits = query_logits(model, data.pop_x, config.measure.queries, batch_size=qb, fill=data.fill)
    test_loss, test_acc = evaluate(model, data.x_test, data.y_test)
    train_logits = None
    if config.model.norm == "bn":
        train_logits = query_logits_train_mode(
            model, data.x, config.measure.queries, batch_size=config.train_query_batch, seed=seed,
            fill=data.fill)[None]
    return {"logits": logits[None], "pop_logits": pop_logits[None], "train_logits": train_logits,
            "test_acc": [test_acc], "test_loss": [test_loss]}


@_in_training_precision
def _query_stacked(config: RunConfig, stacked, data, seeds: Sequence[int]) -> dict:
    """K trained members' queries at once: (K, ...) tensors."""
    qb = config.measure.query_batch_size
    fill = data.fill                              # the background the query shifts bring in
    logits, pop_logits = (torch.stack([stacked.logits(apply_query(d, q, fill), batch_size=qb).cpu()
                                       for q in config.measure.queries], 2)         # (K, M or P, Q, C)
                          for d in (data.x, data.pop_x))
    test_loss, test_acc = loss_acc(stacked, data.x_test, data.y_test, qb)
    train_logits = None
    if config.model.norm == "bn":
        m = data.n_samples
        bsz = safe_batch(m, config.train_query_batch)
        perms = torch.stack([torch.randperm(m, generator=torch.Generator().manual_seed(s))
                             for s in seeds])                               # (K, M)
        inv = torch.argsort(perms, dim=1)                                   # undoes each order
        per_query = []
        for q in config.measure.queries:
            xq = apply_query(data.x, q, fill)[perms.to(data.x.device)]      # (K, M, C, H, W)
            o = stacked.logits_batch_stats(xq, batch_size=bsz).cpu()        # (K, M, classes)
            per_query.append(torch.gather(o, 1, inv.unsqueeze(-1).expand_as(o)))
        train_logits = torch.stack(per_query, 2)                             # (K, M, Q, C)
    return {"logits": logits, "pop_logits": pop_logits, "train_logits": train_logits,
            "test_acc": test_acc, "test_loss": test_loss}


def _train_group(config: RunConfig, keep: np.ndarray, indices: list[int], data, *, seeds: np.ndarray,
                 device: torch.device, vectorised: bool, progress: bool,
                 on_epoch: Callable[[int], None] | None) -> dict[int, dict]:
    """Build, train, check and query the members ``indices`` (one model, or one vectorised
    block), and return their records. ``seconds``: the training time of a model trained alone;
    a block's wall time, queries included, over its size."""
    member_seeds = [int(seeds[i]) for i in indices]
    models = [_build(config, data, s) for s in member_seeds]
    start = time.perf_counter()
    if vectorised:
        subsets = [torch.from_numpy(np.flatnonzero(keep[i])) for i in indices]
        stacked, histories = train_models(models, data.x, data.y, subsets, config=config.train,
                                          seeds=member_seeds, device=device, progress=progress,
                                          fill=data.fill, regularizer=from_config(config.penalty),
                                          on_epoch=on_epoch)
    else:
        histories = [_fit_one(config, models[0], keep, indices[0], data, member_seeds[0], device,
                              progress, on_epoch)]
        seconds = _elapsed(start, device)
    for i, s, h in zip(indices, member_seeds, histories, strict=True):
        if h.diverged:
            raise TrainingError(f"arm {config.arm}: model {i} (seed {s}) diverged: "
                                f"{h.message or 'non-finite loss'}; lower the learning rate")
    if vectorised:
        queried = _query_stacked(config, stacked, data, member_seeds)
        seconds = _elapsed(start, device) / len(indices)
    else:
        queried = _query_one(config, models[0], data, member_seeds[0])
    out: dict[int, dict] = {}
    for j, (i, s) in enumerate(zip(indices, member_seeds, strict=True)):
        if not torch.isfinite(queried["logits"][j]).all():
            raise TrainingError(f"arm {config.arm}: model {i} (seed {s}) gives non-finite logits")
        train_logits = queried["train_logits"]
        out[i] = {"index": int(i), "seed": s, "logits": queried["logits"][j].contiguous(),
                  "pop_logits": queried["pop_logits"][j].contiguous(),
                  "train_logits": None if train_logits is None else train_logits[j].contiguous(),
                  "test_acc": float(queried["test_acc"][j]),
                  "test_loss": float(queried["test_loss"][j]),
                  "train_loss": float(histories[j].last().get("train_loss", float("nan"))),
                  "epochs": int(len(histories[j].rows)), "seconds": float(seconds)}
    return out


def train_members(config: RunConfig, keep: np.ndarray, model_indices: Sequence[int], data, *,
                  seeds: np.ndarray, device: str | torch.device = "cpu", vectorised: bool = False,
                  block: int | None = None, progress: bool = False,
                  on_progress: Callable[[float], None] | None = None) -> dict[int, dict]:
    """Train the bank's models ``model_indices`` and query them: the one place where bank
    members are trained.

    Model i is built and trained with seed ``seeds[i]`` on the pool samples where ``keep[i]``
    (``data``: a :class:`BankData`); with ``config.penalty`` each model trains
    with its own gamma/sigma penalty. Returns ``{i: record}``; a record holds the eval-mode
    ``logits`` (M, Q, C) on the pool, ``pop_logits`` (P, Q, C) on the population,
    ``train_logits`` (M, Q, C) in train mode for BN models (else None; each model visits the
    pool in its own seeded order, :func:`query_logits_train_mode`), ``test_acc``/``test_loss``
    on the whole test split, the final ``train_loss``, ``epochs`` run and ``seconds``. A
    diverged model, or one whose logits are not finite, raises
    :class:`bnmem_utils.training.steps.TrainingError` naming the arm and the model.

    ``vectorised``: K models at once (:func:`bnmem_utils.training.vectorised.train_models`), in fixed blocks
    of model indices (``block``, default :func:`default_chunk`): block b is models
    ``b*block .. (b+1)*block - 1``, always trained together, so a model's numbers never depend
    on which other models happened to be missing from the cache (a resumed bank is bit for bit
    the uninterrupted one). A block with any requested member is trained whole; only the
    requested records are returned. ``on_progress(fraction)`` is called after every epoch with
    the fraction of this call's training done.
    """
    dev = resolve_device(device)
    wanted = sorted({int(i) for i in model_indices})
    if not wanted:
        return {}
    if vectorised:
        size = vectorised_block(config, dev, block)
        n_models = int(keep.shape[0])
        groups = [list(range(b * size, min((b + 1) * size, n_models)))
                  for b in sorted({i // size for i in wanted})]
    else:
        groups = [[int(i)] for i in model_indices]
    out: dict[int, dict] = {}
    for j, members in enumerate(groups):
        tick = None
        if on_progress is not None:
            def tick(done: int, j: int = j) -> None:
                on_progress((j + done / max(1, int(config.train.epochs))) / len(groups))
        records = _train_group(config, keep, members, data, seeds=seeds, device=dev,
                               vectorised=vectorised, progress=progress, on_epoch=tick)
        out.update({i: records[i] for i in members if i in wanted})
    return out


# --------------------------------------------------------------------------------------------
# How many members per call
# --------------------------------------------------------------------------------------------
#: Models per vectorised block at most: on a CPU (8 LeNets: a bank of 16 is two chunks that
#: train at once on two cores, faster than 16 on an OpenMP team, benchmarks/README.md "Speed
#: under load"; the wide networks are cheaper one after another there, see
#: :func:`bnmem_utils.jobs.config.bank_trainer`) and on a GPU.
CPU_CHUNK = {"small": 8, "wide": 4}
GPU_CHUNK_MAX = 64

#: Share of a GPU's total memory a vectorised block may plan to use (the rest: the pool, the
#: queries, the allocator's slack, cuDNN workspaces).
GPU_MEMORY_SHARE = 0.5

#: (C, H, W) of each data set's images, for :func:`default_chunk` before the data are loaded.
_DATASET_SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "fashion_mnist": (1, 28, 28),
                   "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}


def per_model_bytes(config: RunConfig, image_shape: tuple[int, int, int], num_classes: int = 10) -> int:
    """An estimate of the memory one model of a vectorised block takes while it trains, in bytes:
    float32 parameters four times (weights, gradients, two optimizer moments) and the
    activations of one batch three times (the forward's outputs, kept for the backward, their
    gradients, and the layout copies and recomputed statistics of the vectorised layers),
    counted by running the model once on one sample of ``image_shape`` (C, H, W) on the CPU
    and summing every layer's output size."""
    c, h, w = image_shape
    model = build_model(config.model.arch, config.model.norm,
                        in_channels=c, num_classes=num_classes, image_size=h,
                        width=config.model.width)
    counted = [0]

    def hook(_module, _inputs, output):
        if isinstance(output, torch.Tensor):
            counted[0] += output.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if not list(m.children())]                          # leaf layers only
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, c, h, w))
    finally:
        for hd in handles:
            hd.remove()
    n_params = sum(p.numel() for p in model.parameters())
    batch = int(config.train.batch_size)
    return 4 * (4 * n_params + 3 * counted[0] * batch)


def default_chunk(config: RunConfig, device: str | torch.device = "cpu",
                  image_shape: tuple[int, int, int] | None = None, num_classes: int = 10) -> int:
    """Bank members per vectorised run, a fixed block of model indices (see
    :func:`train_members`).

    On a CPU: 8 LeNets or MLPs (a chunk per core trains at once, on one thread each:
    :func:`bnmem_utils.jobs.bank.local_workers`), 4 wider networks (:data:`CPU_CHUNK`). On a GPU: as many as
    :data:`GPU_MEMORY_SHARE` of the device's *total* memory holds by :func:`per_model_bytes`
    (the data set's ``image_shape`` (C, H, W); 3x32x32 when not given), rounded down to a power
    of two, between 1 and :data:`GPU_CHUNK_MAX`. Total, not free, memory: the block size must
    be the same every time a bank is built or resumed on a kind of device (the bank's models are
    grouped by it)."""
    dev = resolve_device(device)
    small = config.model.arch in SMALL_ARCHS
    if dev.type != "cuda":
        return CPU_CHUNK["small" if small else "wide"]
    total = torch.cuda.get_device_properties(dev).total_memory
    need = per_model_bytes(config, image_shape or (3, 32, 32), num_classes)
    fits = max(1, int(GPU_MEMORY_SHARE * total // max(1, need)))
    return int(min(GPU_CHUNK_MAX, 2 ** int(math.log2(fits))))


def vectorised_block(config: RunConfig, device: str | torch.device = "cpu",
                     block: int | None = None) -> int:
    """The models the vectorised trainer trains together: ``block``, else :func:`default_chunk`
    sized by the images of the bank's data set. Each model file records it (a model's numbers
    depend on its block to rounding, and a GPU's block on the card's memory)."""
    if block:
        return int(block)
    from bnmem_utils.data.datasets import NUM_CLASSES

    dataset = config.data.dataset
    return default_chunk(config, device, _DATASET_SHAPES.get(dataset), NUM_CLASSES.get(dataset, 10))


def checked_members_per_call(members_per_call) -> int:
    """``members_per_call`` as an int, or a ValueError naming it: a whole number, 1 or more."""
    ok = isinstance(members_per_call, int | np.integer) and not isinstance(members_per_call, bool)
    if not ok or members_per_call < 1:
        raise ValueError(f"members_per_call={members_per_call!r}: a whole number of models per "
                         "task, 1 or more")
    return int(members_per_call)


def task_block(config: RunConfig, device: str | torch.device = "cpu", block: int | None = None,
               members_per_call: int | None = None) -> int:
    """The vectorised block of a bank whose tasks hold ``members_per_call`` models each, such
    that no block is split between two tasks (each would train it whole, so twice): ``block``
    when given (``members_per_call`` must then be a multiple of it); else the default block
    (:func:`vectorised_block`) or, with ``members_per_call`` given, its largest divisor not above
    the default. A task of k models is then k/block whole blocks."""
    default = vectorised_block(config, device, block)
    if members_per_call is None:
        return default
    k = checked_members_per_call(members_per_call)
    if block:
        if k % default:
            raise ValueError(f"members_per_call={k} splits the vectorised block of {default} "
                             f"models between tasks (each would train it whole): give a "
                             f"multiple of {default}, or a trainer with block={k}")
        return default
    return max(d for d in range(1, min(k, default) + 1) if k % d == 0)


@dataclass(unsafe_hash=True)
class MemberTrainer:
    """How a bank trains its missing members: one after another (``vectorised=False``) or K at
    once in blocks of ``block`` models (None: :func:`default_chunk`). Calling it is
    :func:`train_members`; :meth:`members_per_call` is how many models
    :func:`bnmem_utils.jobs.bank.train_bank` hands it at a time (aligned chunks of model indices, so
    that a vectorised trainer always trains the same models together, whichever were already
    cached). A drop-in (a test's fake trainer) subclasses it and overrides ``__call__``."""

    vectorised: bool = False
    block: int | None = None

    def members_per_call(self, config: RunConfig, device: str | torch.device = "cpu") -> int:
        """Models per call: 1 one after another; a vectorised block (its data set's images
        sizing it on a GPU) K at once."""
        return vectorised_block(config, device, self.block) if self.vectorised else 1

    def __call__(self, config: RunConfig, keep: np.ndarray, model_indices: Sequence[int], data, *,
                 seeds: np.ndarray, device: str | torch.device = "cpu", progress: bool = False,
                 on_progress: Callable[[float], None] | None = None) -> dict[int, dict]:
        return train_members(config, keep, model_indices, data, seeds=seeds, device=device,
                             vectorised=self.vectorised, block=self.block, progress=progress,
                             on_progress=on_progress)


#: One model after another, and K at once in :func:`default_chunk` blocks.
SEQUENTIAL = MemberTrainer()
VECTORISED = MemberTrainer(vectorised=True)
