"""One fast, seeded training loop for in-memory tensors, with per-epoch memorization metrics.

Why not a DataLoader: every data set here fits on the device, so the loop indexes the training
tensors with a seeded permutation per epoch, augments the whole batch on the device in a few
vectorised ops (random shifts by pad-and-crop with per-sample offsets; horizontal flips for RGB
images), accumulates the loss on the device (no ``.item()`` sync per step) and measures every
group in one eval-mode forward over the training set per epoch. ``benchmarks/bench_train_loop.py``
measures the gain against a plain DataLoader loop.

The GPU path (speed only, the arithmetic is the same up to rounding): the model and each batch
channels-last, the layout of the tensor-core convolutions under bf16; the fused optimizer; and,
by ``TrainConfig.compile`` (:func:`~bnmem_utils.training.steps.compile_mode`: on CUDA by
default, never by default on a CPU), the training forward, and so its backward, through
``torch.compile``. The compiled code takes the parameters as inputs, so every model of one
architecture, batch size and precision reuses one compilation: a bank compiles once, not once
per model. The last batch of an epoch, whose size varies from model to model, runs eagerly, so
that it never triggers a compilation of its own.

Per-epoch rows hold ``epoch``, ``lr``, ``train_loss`` (the mean minibatch loss of the epoch, in
train mode, on augmented inputs), ``<group>_acc``/``<group>_loss`` for every group mask given
(eval mode, against the labels trained on, so that accuracy on a corrupted group is its
memorization), ``test_acc``/``test_loss`` when a test set is given, and whatever the hooks return.
A non-finite loss stops training: :attr:`History.diverged` is set, :attr:`History.message`
names the epoch and step, and a warning is raised.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from bnmem_utils.models.gamma_sigma import frozen_bn_stats
from bnmem_utils.training.steps import (
    Batches,
    History,
    Hook,
    TrainConfig,
    as_masks,
    autocast,
    compile_mode,
    epoch_range,
    lr_at,
    put_metrics,
    run_hooks,
    shift_fill,
    shift_flip,
)


# ----------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------
def _per_sample(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                amp: str = "off") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample loss (float32) and correctness (bool), in the model's current mode, no grad."""
    losses, correct = [], []
    device = x.device
    with torch.no_grad(), autocast(device, amp):
        for i in range(0, x.shape[0], batch_size):
            out = model(x[i:i + batch_size]).float()                             # (b, K)
            yb = y[i:i + batch_size]
            losses.append(F.cross_entropy(out, yb, reduction="none"))
            correct.append(out.argmax(1) == yb)
    if not losses:
        return x.new_zeros(0), torch.zeros(0, dtype=torch.bool, device=device)
    return torch.cat(losses), torch.cat(correct)


def _model_device(model: nn.Module) -> torch.device:
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
             batch_size: int = 1024) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on ``(x, y)`` in eval mode, float32.
    The model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        dev = _model_device(model)
        loss, correct = _per_sample(model, x.to(dev), y.to(dev), batch_size)
    finally:
        model.train(was_training)
    return float(loss.mean()), float(correct.float().mean())


def predict_logits(model: nn.Module, x: torch.Tensor, *, batch_size: int = 1024,
                   train_mode: bool = False) -> torch.Tensor:
    """float32 logits ``(N, K)`` in eval mode (the deployed model), or with ``train_mode=True`` with
    BN using each batch's own statistics (an ablation: the running statistics are left
    untouched). In the caller's precision: a bank queries under the autocast its members
    trained in (bf16 on CUDA; :mod:`bnmem_utils.jobs.bank_models`), float32 otherwise."""
    was_training = model.training
    model.train(train_mode)
    outs = []
    try:
        dev = _model_device(model)
        with frozen_bn_stats(model), torch.no_grad():
            for i in range(0, x.shape[0], batch_size):
                outs.append(model(x[i:i + batch_size].to(dev)).float())          # (b, K)
    finally:
        model.train(was_training)
    return torch.cat(outs) if outs else torch.zeros(0)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD with (non-Nesterov) momentum or Adam, weight decay on every trainable parameter; the
    fused implementation (one kernel for all parameters) when they are on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = {"fused": True} if params and params[0].is_cuda else {}
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay, **fused)
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay, **fused)


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------
def train_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                config: TrainConfig | None = None, seed: int = 0,
                groups: Mapping[str, torch.Tensor] | None = None,
                test: tuple[torch.Tensor, torch.Tensor] | Sequence[torch.Tensor] | None = None,
                hooks: Iterable[Hook] = (), regularizer=None,
                device: str | torch.device | None = None, progress: bool = False,
                channels_last: bool | None = None,
                fill: torch.Tensor | None = None) -> History:
    """Train ``model`` on ``x`` (N, C, H, W) with labels ``y`` (N,) and return its :class:`History`.

    ``seed`` drives the batch order and the augmentation (one CPU generator, so the numbers do not
    depend on the device); the model's initialisation is the caller's (seed before building it).
    ``groups``: ``{name: bool mask (N,)}`` measured each epoch against ``y`` in eval mode.
    ``test``: ``(x_test, y_test)``. ``hooks``: ``hook(epoch, model, row) -> dict | None`` called at the
    end of every epoch with the model in eval mode; returned items are merged into the row.
    ``regularizer``: ``.attach(model)`` once, then ``regularizer(model)`` (a scalar tensor) is added
    to every step's loss; its epoch mean is recorded as ``reg_loss``.
    The last minibatch of an epoch is dropped only when it would hold a single sample (BN cannot
    normalise one sample). ``fill``: the background a training shift brings in, one value per
    channel (:func:`bnmem_utils.training.steps.shift_fill`; default each channel's minimum over ``x``).

    ``channels_last`` stores the model and each batch channels-last (None: on CUDA for images);
    it and ``config.compile`` belong to the GPU path (see the module's docstring).
    """
    config = config or TrainConfig()
    dev = torch.device(device) if device is not None else x.device
    mode = compile_mode(config.compile, dev, regularized=regularizer is not None)
    x, y, forward, channels_last = _place(model, x, y, dev, channels_last, mode)
    masks = as_masks(groups, int(x.shape[0]), dev)
    test_xy = None if test is None else (test[0].to(dev), test[1].to(dev))
    hooks = list(hooks)
    if regularizer is not None:
        regularizer.attach(model)

    batches = Batches(config, x, int(x.shape[0]), shift_fill(x, fill), seed)
    opt = make_optimizer(model, config)
    history = History()
    start = time.perf_counter()
    epochs = epoch_range(config.epochs, progress, "train")
    for epoch in epochs:
        losses, regs, sizes = _train_epoch(model, forward, opt, batches, config, x, y, epoch,
                                           regularizer, channels_last)
        lr_first = lr_at(config, epoch * batches.n_steps, batches.total)       # the row shows it
        row: dict = {"epoch": epoch + 1, "lr": lr_first}
        if not bool((torch.isfinite(losses) & torch.isfinite(regs)).all()):
            history.stop_diverged(row, losses, regs, epoch, batches.n_steps, lr_first)
            break
        row["train_loss"] = float((losses * sizes).sum() / sizes.sum())
        if regularizer is not None:
            row["reg_loss"] = float(regs.mean())
        _measure_epoch(model, row, config, x, y, masks, test_xy)
        run_hooks(hooks, epoch + 1, model, row)
        history.rows.append(row)
        if progress:
            epochs.set_postfix({k: f"{v:.3f}" for k, v in row.items()
                                if k in ("train_loss", "test_acc") and isinstance(v, float)})
    model.eval()
    history.seconds = time.perf_counter() - start
    return history


def _place(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dev: torch.device,
           channels_last: bool | None, compile: str):
    """The model and the data on ``dev``, checked, in the GPU path's layout (channels-last
    memory and, unless ``compile`` is "off", a compiled forward for static shapes, the
    full batches): ``(x, y, forward, channels_last)``."""
    model.to(dev)
    x, y = x.to(dev), y.to(dev)
    if channels_last is None:
        channels_last = dev.type == "cuda" and x.dim() == 4
    if channels_last:
        model.to(memory_format=torch.channels_last)
    n = int(x.shape[0])
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},), got {tuple(y.shape)}")
    if n < 2:
        raise ValueError(f"need at least 2 training samples, got {n}")
    if compile == "off":
        return x, y, model, channels_last
    return x, y, torch.compile(model, mode=None if compile == "default" else compile,
                               dynamic=False), channels_last


def _batch(batches: Batches, x, y, idx, offsets, flips, channels_last: bool):
    """Batch ``idx`` of ``x`` and ``y``, augmented and in the run's memory layout."""
    xb, yb = x[idx], y[idx]                                              # (b, C, H, W), (b,)
    if batches.pad or batches.use_flip:
        xb = shift_flip(xb, offsets[idx] if batches.pad else None,
                        flips[idx] if batches.use_flip else None, batches.pad, batches.pad_value)
    if channels_last:
        xb = xb.contiguous(memory_format=torch.channels_last)
    return xb, yb


def _train_epoch(model: nn.Module, forward, opt: torch.optim.Optimizer, batches: Batches,
                 config: TrainConfig, x: torch.Tensor, y: torch.Tensor, epoch: int, regularizer,
                 channels_last: bool):
    """One epoch of SGD steps: each step's mean loss, regularizer and batch size (S,)."""
    dev = x.device
    model.train()
    perm, offsets, flips = (None if t is None else t.to(dev) for t in batches.epoch())
    n_steps, bs = batches.n_steps, batches.bs
    losses = torch.zeros(n_steps, device=dev)                                    # batch mean CE
    regs = torch.zeros(n_steps, device=dev)                                      # regularizer
    sizes = torch.zeros(n_steps, device=dev)
    for step in range(n_steps):
        lr = lr_at(config, epoch * n_steps + step, batches.total)
        for group in opt.param_groups:
            group["lr"] = lr
        idx = perm[step * bs:(step + 1) * bs]                                        # (b,)
        xb, yb = _batch(batches, x, y, idx, offsets, flips, channels_last)
        with autocast(dev, config.amp):
            out = (forward if idx.shape[0] == bs else model)(xb)                     # (b, K)
        loss = F.cross_entropy(out.float(), yb)
        total = loss
        if regularizer is not None:
            reg = regularizer(model)
            total = loss + reg
            regs[step] = reg.detach().float()
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        losses[step] = loss.detach()
        sizes[step] = idx.shape[0]
    return losses, regs, sizes


def _measure_epoch(model: nn.Module, row: dict, config: TrainConfig, x: torch.Tensor,
                   y: torch.Tensor, masks: Mapping[str, torch.Tensor], test_xy) -> None:
    """The end-of-epoch measurements, in eval mode, into ``row``: each group's loss and
    accuracy on the training set, and the test set's."""
    model.eval()
    if masks:
        loss_i, correct_i = _per_sample(model, x, y, config.eval_batch_size, config.amp)
        for name, mask in masks.items():
            put_metrics(row, name, loss_i[mask], correct_i[mask])
    if test_xy is not None:
        put_metrics(row, "test", *_per_sample(model, *test_xy, config.eval_batch_size,
                                              config.amp))
