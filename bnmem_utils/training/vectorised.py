"""Vectorised training: K models of one architecture trained at once, as K sequential runs would.

A shadow-model bank trains tens to hundreds of small models per arm. One after another, each
step of a LeNet on 8x8 digits is a little arithmetic wrapped in Python, dispatcher and optimizer
overhead, and tiny convolutions that use a CPU poorly; on a GPU, one small model leaves most of
the device idle. Here the K models' parameters are stacked along a new leading dimension
(``torch.func.stack_module_state``), one forward runs all of them, one backward gives every
model its own gradient, and the optimizer updates the stacked tensors with the arithmetic of
``torch.optim.SGD`` (momentum, weight decay) and ``torch.optim.Adam``. How much faster this
is, and where the time of a vectorised step goes, is measured in ``benchmarks/README.md``.

**Two ways to run K models at once** (:meth:`bnmem_utils.training.stacked.StackedModels.forward` picks one):

* ``"grouped"``, for the plain stacks of layers (LeNet, the MLP): activations are held as
  ``(B, K*C, H, W)``, every model's channels side by side, so that the native kernels already
  treat the models separately: batch norm over K*C channels is K models' batch norms (with their
  running statistics updated in place), group norm with K*G groups is K group norms, a
  convolution with ``groups=K`` is K convolutions, and linear layers are batched matrix
  products. On small images (digits: 8x8 and 4x4 maps under 5x5 kernels) a convolution is
  cheaper as one dense matrix product per model (:func:`bnmem_utils.training.grouped_layers.dense_conv_matrix`) than as a grouped
  convolution (about twice, on a CPU); its kernel gradient still comes from the grouped
  convolution's backward, which is the cheaper one there (``vlayers._GroupedDenseConv``).
  Activations after a convolution are stored channels-last, where the CPU's batch-norm, ReLU
  and max-pool kernels run several times faster over K*C channels (and the GPU's tensor cores
  want them).
* ``"vmap"``, for everything else (ResNets, DenseNet): ``torch.func.vmap`` over
  ``torch.func.functional_call``, with each BN layer swapped for ``stacked._WeightedBatchNorm`` (the
  same function, written so that vmap can batch it and the trainer can update per-model running
  statistics outside vmap, where in-place buffer updates and vmap do not mix).

**What is reproduced, model by model.** :func:`train_models` trains model k on
``x[subsets[k]]`` as ``train.train_model(models[k], x[subsets[k]], y[subsets[k]],
config=config, seed=seeds[k], fill=fill)`` does: the same per-epoch permutation, shift offsets
and flips drawn from a CPU generator seeded with ``seeds[k]`` in the same order, the same batch
size and steps per epoch (a final batch of one sample is dropped), the learning-rate schedule
of that model (models with more samples may take more steps), the shift padding value
(``fill``, or the channel minimum of the model's own subset), the loss, the weight decay and
BN's running-statistics rule, and the same per-epoch measurements (groups, test set, hooks,
the gamma/sigma penalty). Only floating-point summation order differs (a batched matrix
product adds in another order than a convolution), so the models agree with the sequential
ones to rounding at first (about 1e-6 after an epoch) and then drift apart as training
amplifies rounding, exactly as the sequential trainer itself does when its initial weights are
perturbed by 1e-7; the per-model accuracies and attack scores stay statistically the same.
``tests/test_vectorised.py`` states the tolerances.

**Unequal subsets.** The halves of a keep matrix differ in size by a few samples, so at a given
step some models have a shorter final batch, or no batch at all. Every model's batch is padded
to the same length with 0/1 sample weights: the loss is the weighted mean, and at such a step
batch norm takes its statistics over the weighted samples only (:func:`bnmem_utils.training.grouped_layers.weighted_bn`). A model
with no batch at a step is given a dummy batch whose loss is multiplied by zero and whose
update (parameters, optimizer state, running statistics) is discarded bit for bit.

**Which banks are vectorised by default** (:func:`bnmem_utils.jobs.config.bank_trainer`, read by
:func:`bnmem_utils.jobs.bank.default_trainer`):
LeNet and MLP banks on every device; ResNet-20, ResNet-18 and DenseNet banks on a GPU only. On
a CPU the vmap path trains them 0.28-0.94x as fast as one model after another
(``benchmarks/bench_roofline.py``): one such model's convolutions already run near the core's
rate, and K models' grouped convolutions and batched batch norms cost more per FLOP. Blocks
hold :func:`bnmem_utils.jobs.bank_models.default_chunk` models (on a GPU sized from
:func:`bnmem_utils.jobs.bank_models.per_model_bytes` and the device's
total memory).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bnmem_utils.training.penalty import GammaSigmaPenalty
from bnmem_utils.training.stacked import StackedModels, StackedOptimizer, stack_models
from bnmem_utils.training.steps import (
    Batches,
    History,
    Hook,
    TrainConfig,
    as_masks,
    autocast,
    epoch_range,
    lr_at,
    put_metrics,
    run_hooks,
    shift_fill,
    shift_flip,
)

__all__ = ["loss_acc", "train_models"]


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------
def _epoch_batches(plan: _Plan):
    """One epoch's batches of every model, drawn as train_model draws them: (K, S, B) pool
    indices, 0/1 weights, shift offsets (K, S, B, 2) and flips, on the CPU."""
    k_models, n_steps, width = len(plan.batches), plan.n_steps, plan.width
    gidx = torch.zeros(k_models, n_steps, width, dtype=torch.long)
    wts = torch.zeros(k_models, n_steps, width)
    offs = torch.zeros(k_models, n_steps, width, 2, dtype=torch.long)
    flp = torch.zeros(k_models, n_steps, width, dtype=torch.bool)
    col = torch.arange(width).view(1, -1)                                    # (1, B)
    step = torch.arange(n_steps).view(-1, 1)                                 # (S, 1)
    for k, b in enumerate(plan.batches):
        n, bs, st = b.n, b.bs, b.n_steps
        perm, o, f = b.epoch()                                               # (n,), (n, 2), (n,)
        pos = step * bs + col                                                # (S, B)
        valid = (col < bs) & (pos < n) & (step < st)
        # steps past this model's own: a dummy copy of its first batch, weight 1 so that batch
        # norm stays finite (the loss is multiplied by zero, the update discarded)
        dummy = (step >= st) & (col < bs)
        pos = torch.where(step >= st, col % bs, torch.where(valid, pos, 0))
        rows = perm[pos]                                                     # (S, B)
        gidx[k] = plan.idx_list[k][rows]
        wts[k] = (valid | dummy).float()
        if o is not None:
            offs[k] = o[rows]
        if f is not None:
            flp[k] = f[rows]
    return gidx, wts, offs, flp


def loss_acc(stacked: StackedModels, x: torch.Tensor, y: torch.Tensor,
              batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every model's eval-mode mean cross-entropy and accuracy on ``(x, y)``: two (K,) CPU
    tensors."""
    logits = stacked.logits(x, batch_size=batch_size)                        # (K, T, classes)
    yt = y.view(1, -1).expand(logits.shape[0], -1)
    loss = F.cross_entropy(logits.flatten(0, 1), yt.flatten(), reduction="none")
    return (loss.view(logits.shape[0], -1).mean(1).cpu(),
            (logits.argmax(-1) == yt).float().mean(1).cpu())


def train_models(models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor,
                 subsets: Sequence[torch.Tensor | np.ndarray], *, config: TrainConfig | None = None,
                 seeds: Sequence[int], test: tuple[torch.Tensor, torch.Tensor] | None = None,
                 device: str | torch.device | None = None, path: str = "auto",
                 progress: bool = False, fill: torch.Tensor | None = None,
                 groups: Mapping[str, torch.Tensor] | None = None, hooks: Iterable[Hook] = (),
                 regularizer: GammaSigmaPenalty | None = None,
                 on_epoch: Callable[[int], None] | None = None
                 ) -> tuple[StackedModels, list[History]]:
    """Train ``models[k]`` on ``x[subsets[k]]``, ``y[subsets[k]]`` with seed ``seeds[k]``, all at once.

    Model by model the same as :func:`bnmem_utils.training.loop.train_model` with ``config``, ``seed``,
    ``fill``, ``test``, ``hooks`` and ``regularizer``, up to floating-point summation order (see
    the module docstring). ``x`` (N, C, H, W) and ``y`` (N,) are the shared pool; ``subsets[k]``
    holds indices into it (or a boolean mask over it). ``groups``: ``{name: bool mask (N,) over
    the pool}``, measured on each model's own training samples in the group. Hooks see model k
    as an ordinary module (:meth:`StackedModels.module`), once per model and epoch. The
    ``regularizer`` can only be the gamma/sigma penalty
    (:class:`bnmem_utils.training.penalty.GammaSigmaPenalty`, grouped path only), from each model's own
    batch's sigma_B (another is a ValueError: the sequential trainer then applies). A
    model whose loss becomes non-finite stops there with ``diverged`` set while the others go
    on. ``path``: see :func:`stack_models`. ``on_epoch(e)`` is called after each epoch with the
    number of epochs done (a progress bar's hook).

    The models passed in are left as they were: the trained ones are in the returned
    :class:`StackedModels` (``.module(k)`` is model k), with one :class:`History` per model.
    """
    config = config or TrainConfig()
    dev = torch.device(device) if device is not None else x.device
    x, y = x.to(dev), y.to(dev)
    idx_list = _subset_indices(subsets, len(models), len(seeds), int(x.shape[0]))
    stacked = stack_models(models, dev, path=path)
    reg = _checked_regularizer(regularizer, stacked, models)
    plan = _Plan.make(config, x, idx_list, seeds, fill)
    test_xy = None if test is None else (test[0].to(dev), test[1].to(dev))
    masks = as_masks(groups, int(x.shape[0]), dev)                         # name -> (N,) bool
    hooks = list(hooks)

    opt = StackedOptimizer(stacked, config)
    histories = [History() for _ in models]
    live = np.ones(len(models), dtype=bool)                                # not diverged
    start = time.perf_counter()
    epochs = epoch_range(config.epochs, progress, f"train {len(models)} models")
    for epoch in epochs:
        steps = _train_epoch(stacked, opt, plan, config, x, y, epoch, live, reg)
        epoch_loss = _record_epoch(stacked, plan, config, x, y, epoch, steps, live, histories,
                                   test_xy=test_xy, masks=masks, hooks=hooks,
                                   penalised=regularizer is not None)
        if progress:
            epochs.set_postfix({"loss": f"{float(epoch_loss[live].mean()) if live.any() else float('nan'):.3f}"})
        if on_epoch is not None:
            on_epoch(epoch + 1)
        if not live.any():
            break
    opt.finish()
    seconds = time.perf_counter() - start
    for h in histories:
        h.seconds = seconds
    return stacked, histories


def _subset_indices(subsets, k_models: int, n_seeds: int, n_pool: int) -> list[torch.Tensor]:
    """Each model's training indices into the pool (CPU, long), from indices or boolean masks."""
    if k_models == 0:
        raise ValueError("need at least one model to train")
    if len(subsets) != k_models or n_seeds != k_models:
        raise ValueError(f"need one subset and one seed per model: {k_models} models, "
                         f"{len(subsets)} subsets, {n_seeds} seeds")
    idx_list = []
    for k, s in enumerate(subsets):
        s = torch.as_tensor(s).cpu()
        if s.dtype == torch.bool:
            if s.shape != (n_pool,):
                raise ValueError(f"subset {k} is a mask of shape {tuple(s.shape)}, expected ({n_pool},)")
            s = s.nonzero().flatten()
        if s.numel() < 2:
            raise ValueError(f"model {k} needs at least 2 training samples, got {s.numel()}")
        if int(s.min()) < 0 or int(s.max()) >= n_pool:
            raise ValueError(f"subset {k} indexes outside the pool of {n_pool} samples")
        idx_list.append(s.long())
    return idx_list


def _checked_regularizer(regularizer, stacked: StackedModels,
                         models: Sequence[nn.Module]) -> GammaSigmaPenalty | None:
    """The penalty to add to the loss (None when there is none or its lambda is 0), after
    checking that these models can take it vectorised."""
    if regularizer is None:
        return None
    if not isinstance(regularizer, GammaSigmaPenalty):
        raise ValueError(f"{type(regularizer).__name__} is not the gamma/sigma penalty "
                         "(use train.train_model)")
    if not stacked.bn:
        raise ValueError(f"{type(models[0]).__name__} has no BatchNorm layer; the gamma/sigma "
                         "penalty applies to BN models only (norm='bn')")
    if regularizer.lam == 0.0:
        return None
    if stacked.path != "grouped":
        raise ValueError("the gamma/sigma penalty needs the grouped path; "
                         f"{type(models[0]).__name__} runs on the vmap path (use train.train_model)")
    return regularizer


@dataclass
class _Plan:
    """What stays fixed across a run's epochs: each model's samples and its batches (its batch
    plan, augmentation and random stream, as :func:`bnmem_utils.training.loop.train_model`'s)."""

    idx_list: list[torch.Tensor]    # each model's training indices
    batches: list[Batches]
    steps_k: np.ndarray             # (K,) steps per epoch
    n_steps: int                    # S: the most steps of any model
    width: int                      # B: the widest batch
    pad_value: torch.Tensor         # (K, 1, C, 1, 1)

    @classmethod
    def make(cls, config: TrainConfig, x: torch.Tensor, idx_list: list[torch.Tensor],
             seeds: Sequence[int], fill: torch.Tensor | None) -> _Plan:
        # each model pads its shifts as train_model does: with ``fill``, or the channel minimum
        # of its own subset
        batches = [Batches(config, x, int(s.numel()),
                           shift_fill(x if fill is not None else x[s.to(x.device)], fill), seed)
                   for s, seed in zip(idx_list, seeds, strict=True)]
        steps_k = np.array([b.n_steps for b in batches])
        pad_value = torch.stack([b.pad_value.flatten() for b in batches])              # (K, C)
        return cls(idx_list, batches, steps_k, int(steps_k.max()), max(b.bs for b in batches),
                   pad_value.reshape(len(batches), 1, -1, 1, 1))


def _train_epoch(stacked: StackedModels, opt: StackedOptimizer, plan: _Plan, config: TrainConfig,
                 x: torch.Tensor, y: torch.Tensor, epoch: int, live: np.ndarray,
                 reg: GammaSigmaPenalty | None) -> dict:
    """One epoch of every live model: its per-step losses, penalties and batch sizes (K, S),
    and each model's learning rate at the epoch's first step."""
    dev, k_models, n_steps = x.device, len(plan.batches), plan.n_steps
    pad, use_flip = plan.batches[0].pad, plan.batches[0].use_flip           # as x's images
    gidx, wts, offs, flp = _epoch_batches(plan)
    # steps where every model has the same number of samples, in the leading columns (all
    # steps when the subsets have equal sizes): cut the padding off and skip the weights
    counts = wts.sum(2).long()                                               # (K, S)
    first = counts[0]                                                        # (S,)
    lead = torch.arange(plan.width) < first[:, None]                         # (S, B)
    full = ((counts == first).all(0) & ((wts != 0) | ~lead).all(2).all(0)).tolist()    # (S,)
    cols = [int(c) if f else plan.width for c, f in zip(first.tolist(), full, strict=True)]
    gidx, wts, offs, flp = gidx.to(dev), wts.to(dev), offs.to(dev), flp.to(dev)
    losses = torch.zeros(k_models, n_steps, device=dev)
    regs = torch.zeros(k_models, n_steps, device=dev)                        # penalty
    sizes = torch.zeros(k_models, n_steps, device=dev)
    # the epoch's schedule, per step and model, sent to the device once
    act_tab = (np.arange(n_steps)[:, None] < plan.steps_k[None, :]) & live[None, :]  # (S, K)
    lr_tab = np.array([[lr_at(config, epoch * b.n_steps + s_, b.total) if s_ < b.n_steps else 0.0
                        for b in plan.batches] for s_ in range(n_steps)])         # (S, K)
    tables = opt.epoch_tables(lr_tab, act_tab)
    act_dev = torch.as_tensor(act_tab).to(dev)                               # (S, K)
    for step in range(n_steps):
        all_active = bool(act_tab[step].all())
        act = act_dev[step]                                                  # (K,)
        c = cols[step]
        idx = gidx[:, step, :c]                                              # (K, B)
        w = wts[:, step, :c]                                                 # (K, B)
        xb = x[idx]                                                          # (K, B, C, H, W)
        if pad or use_flip:
            xb = shift_flip(xb.flatten(0, 1), offs[:, step, :c].flatten(0, 1) if pad else None,
                            flp[:, step, :c].flatten(0, 1) if use_flip else None, pad,
                            plan.pad_value.expand(-1, c, -1, -1, -1).reshape(k_models * c, -1, 1, 1)
                            ).view(xb.shape)
        sigmas = [] if reg is not None else None
        with autocast(dev, config.amp):
            out = stacked.forward(xb, batch_stats=True, weights=None if full[step] else w,
                                  update_stats=True, active=None if all_active else act,
                                  sigmas=sigmas)                              # (K, B, classes)
        ce = F.cross_entropy(out.float().flatten(0, 1), y[idx].flatten(), reduction="none")
        loss = (ce.view(k_models, c) * w).sum(1) / w.sum(1)                  # (K,) batch means
        total = loss
        if reg is not None:
            penalty = reg.per_model([stacked.params.get(f"{n}.weight") for n, _ in sigmas],
                                    [sg for _, sg in sigmas])              # (K,)
            total = loss + penalty
            regs[:, step] = torch.where(act, penalty.detach(), 0.0)
        opt.zero_grad()
        (total if all_active else total * act).sum().backward()
        opt.step(tables, step, None if all_active else act)
        losses[:, step] = torch.where(act, loss.detach(), 0.0)
        sizes[:, step] = torch.where(act, w.sum(1), 0.0)
    return {"losses": losses, "regs": regs, "sizes": sizes, "lr_first": lr_tab[0]}


def _record_epoch(stacked: StackedModels, plan: _Plan, config: TrainConfig, x: torch.Tensor,
                  y: torch.Tensor, epoch: int, steps: dict, live: np.ndarray,
                  histories: list[History], *, test_xy, masks: Mapping[str, torch.Tensor],
                  hooks: list[Hook], penalised: bool) -> torch.Tensor:
    """Append each live model's row for the epoch to its history (or stop it as diverged, which
    clears its ``live`` flag); returns the epoch's mean training loss per model (K,)."""
    losses, regs, sizes, lr_first = steps["losses"], steps["regs"], steps["sizes"], steps["lr_first"]
    k_models, dev = len(plan.batches), x.device
    finite = (torch.isfinite(losses) & torch.isfinite(regs)).all(1).cpu().numpy()
    reg_mean = (regs.sum(1) / torch.as_tensor(plan.steps_k, dtype=regs.dtype,
                                              device=dev)).cpu()            # (K,) own steps
    epoch_loss = ((losses * sizes).sum(1) / sizes.sum(1).clamp_min(1)).cpu()
    # (some model is live here: training stops once none is)
    if test_xy is not None:
        test_loss, test_acc = loss_acc(stacked, *test_xy, config.eval_batch_size)
    if masks:
        # every model on the whole pool at once, then each model's own samples
        with torch.no_grad(), autocast(dev, config.amp):
            logits = stacked.logits(x, batch_size=config.eval_batch_size)       # (K, N, cls)
        pool_loss = F.cross_entropy(logits.flatten(0, 1), y.repeat(k_models),
                                    reduction="none").view(k_models, -1)         # (K, N)
        pool_correct = logits.argmax(-1) == y.view(1, -1)                        # (K, N)
    for k in range(k_models):
        if not live[k]:
            continue
        row: dict = {"epoch": epoch + 1, "lr": float(lr_first[k])}
        if not finite[k]:
            histories[k].stop_diverged(row, losses[k], regs[k], epoch, plan.batches[k].n_steps,
                                       float(lr_first[k]), f"model {k}: ")
            live[k] = False
            continue
        row["train_loss"] = float(epoch_loss[k])
        if penalised:
            row["reg_loss"] = float(reg_mean[k])
        own = plan.idx_list[k].to(dev) if masks else None
        for name, mask in masks.items():
            sel = own[mask[own]]
            put_metrics(row, name, pool_loss[k, sel], pool_correct[k, sel])
        if test_xy is not None:
            row["test_acc"] = float(test_acc[k])
            row["test_loss"] = float(test_loss[k])
        if hooks:
            run_hooks(hooks, epoch + 1, stacked.module(k), row)
        histories[k].rows.append(row)
    return epoch_loss
