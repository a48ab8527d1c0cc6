"""One fast, seeded training loop for in-memory tensors, with per-epoch memorization metrics.

Why not a DataLoader: every data set here fits on the device, so the loop indexes the training
tensors with a seeded permutation per epoch, augments the whole batch on the device in a few
vectorised ops (random shifts by pad-and-crop with per-sample offsets; horizontal flips for RGB
images), accumulates the loss on the device (no ``.item()`` sync per step) and measures every
group in one eval-mode forward over the training set per epoch. ``benchmarks/bench_train_loop.py``
measures the gain against a plain DataLoader loop.

Per-epoch rows hold ``epoch``, ``lr``, ``train_loss`` (the mean minibatch loss of the epoch, in
train mode, on augmented inputs), ``<group>_acc``/``<group>_loss`` for every group mask given
(eval mode, against the labels trained on, so that accuracy on a corrupted group is its
memorization), ``test_acc``/``test_loss`` when a test set is given, and whatever the hooks return.
A non-finite loss stops training: :attr:`History.diverged` is set, :attr:`History.message`
names the epoch and step, and a warning is raised.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

from .bnstats import frozen_bn_stats
from .config import QUERIES, TrainConfig
from .executors import PermanentError
from .validation import check_choice

Hook = Callable[[int, nn.Module, dict], "dict | None"]


@dataclass
class History:
    """What :func:`train_model` measured: one row per finished epoch, and whether it diverged."""

    rows: list[dict] = field(default_factory=list)
    diverged: bool = False
    message: str = ""
    seconds: float = 0.0                # wall time of the whole call (not in the rows: rows are
    #                                     deterministic, times are not)

    def as_frame(self) -> pd.DataFrame:
        """The rows as a DataFrame indexed 0..E-1, one column per measurement."""
        return pd.DataFrame(self.rows)

    def last(self) -> dict:
        """The last epoch's row (empty dict if no epoch finished)."""
        return dict(self.rows[-1]) if self.rows else {}

    def column(self, key: str) -> np.ndarray:
        """One measurement over epochs as a float array (NaN where an epoch lacks it)."""
        return np.array([row.get(key, np.nan) for row in self.rows], dtype=float)

    def at_epoch(self, epoch: int) -> dict:
        """The row of 1-based ``epoch``."""
        for row in self.rows:
            if row["epoch"] == epoch:
                return dict(row)
        raise KeyError(f"epoch {epoch} not in history (epochs 1..{len(self.rows)})")

    def stop_diverged(self, row: dict, losses: torch.Tensor, regs: torch.Tensor, epoch: int,
                      n_steps: int, lr: float, who: str = "") -> str:
        """Training diverged in 0-based ``epoch``: mark it, with a message naming the first step
        whose loss (``losses + regs``, per step) is not finite, close ``row`` with a NaN
        training loss and warn (the warning prefixed by ``who``). Returns the message."""
        bad = int((~(torch.isfinite(losses) & torch.isfinite(regs))).nonzero()[0, 0])
        self.diverged = True
        self.message = (f"training diverged: the loss became {float(losses[bad] + regs[bad])} at "
                        f"epoch {epoch + 1}, step {bad + 1} of {n_steps} (lr {lr:.3g}); "
                        f"training stopped")
        row["train_loss"] = float("nan")
        self.rows.append(row)
        warnings.warn(who + self.message, RuntimeWarning, stacklevel=3)
        return self.message

    def raise_if_diverged(self) -> History:
        """Raise a RuntimeError with the divergence message, else return self."""
        if self.diverged:
            raise RuntimeError(self.message)
        return self

    def to_dict(self) -> dict:
        return {"rows": self.rows, "diverged": self.diverged, "message": self.message,
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: Mapping) -> History:
        return cls(list(d["rows"]), bool(d["diverged"]), str(d["message"]), float(d.get("seconds", 0)))


# ----------------------------------------------------------------------------------------------
# Pieces
# ----------------------------------------------------------------------------------------------
def _autocast(device: torch.device, amp: str):
    """bf16 autocast on CUDA (or anywhere with ``amp="bf16"``); a no-op context otherwise."""
    use = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    if not use:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def default_shift(image_size: int) -> int:
    """Max random shift in pixels: 4 for 32 px (CIFAR), 2 for 16-31 px (MNIST), 1 below (digits)."""
    return 4 if image_size >= 32 else 2 if image_size >= 16 else 1


def _augmentation(config: TrainConfig, x: torch.Tensor) -> tuple[int, bool]:
    """(shift padding in pixels, whether to flip) of training on images ``x`` (N, C, H, W)."""
    pad = (config.shift if config.shift is not None else default_shift(int(x.shape[-1]))) \
        if config.augment else 0
    use_flip = bool(config.augment and (config.flip if config.flip is not None else x.shape[1] == 3))
    return pad, use_flip


def _batch_plan(n: int, batch_size: int) -> tuple[int, int]:
    """(batch size, steps per epoch) for ``n`` samples: a final batch of one sample is dropped
    (BN cannot normalise one sample)."""
    bs = min(batch_size, n)
    return bs, n // bs + (1 if n % bs > 1 else 0)


def shift_fill(x: torch.Tensor, fill: torch.Tensor | None = None) -> torch.Tensor:
    """The (1, C, 1, 1) value a training shift of ``x`` (N, C, H, W) brings in: ``fill`` when
    given (any shape with C elements), else each channel's minimum over ``x``, which is the
    background only when ``x`` holds no outliers darker than it (give the data set's
    :attr:`~bnmem_utils.data.Dataset.background` when it may)."""
    if fill is None:
        return x.amin(dim=(0, 2, 3)).view(1, -1, 1, 1)
    fill = torch.as_tensor(fill, dtype=x.dtype, device=x.device)
    if fill.numel() != x.shape[1]:
        raise ValueError(f"fill has {fill.numel()} values, expected one per channel "
                         f"({x.shape[1]})")
    return fill.reshape(1, -1, 1, 1)


def shift_flip(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor | None, pad: int,
               pad_value: torch.Tensor) -> torch.Tensor:
    """Shift each image by its own offset (pad by ``pad`` with ``pad_value`` per channel, crop back)
    and mirror the ones where ``flips`` is True. Vectorised over the batch.

    x: (B, C, H, W); offsets: (B, 2) int64 in [0, 2*pad] (row, column of the crop's corner);
    flips: (B,) bool or None; pad_value: (1, C, 1, 1).
    """
    b, c, h, w = x.shape
    if pad > 0:
        xp = F.pad(x - pad_value, (pad, pad, pad, pad)) + pad_value              # (B, C, H+2p, W+2p)
        rows = (offsets[:, 0:1] + torch.arange(h, device=x.device)).view(b, 1, h, 1)
        xp = xp.gather(2, rows.expand(b, c, h, w + 2 * pad))                     # (B, C, H, W+2p)
        cols = (offsets[:, 1:2] + torch.arange(w, device=x.device)).view(b, 1, 1, w)
        x = xp.gather(3, cols.expand(b, c, h, w))                                # (B, C, H, W)
    if flips is not None:
        x = torch.where(flips.view(b, 1, 1, 1), x.flip(3), x)
    return x


def _per_sample(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                amp: str = "off") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample loss (float32) and correctness (bool), in the model's current mode, no grad."""
    losses, correct = [], []
    device = x.device
    with torch.no_grad(), _autocast(device, amp):
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
    untouched). No autocast: the logits feed attacks that need their precision."""
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


def _epoch_range(epochs: int, progress: bool, desc: str) -> Iterable[int]:
    """``range(epochs)``, shown as a tqdm bar when ``progress``."""
    if not progress:
        return range(epochs)
    from tqdm.auto import tqdm
    return tqdm(range(epochs), desc=desc, leave=False)


def _put_metrics(row: dict, name: str, loss: torch.Tensor, correct: torch.Tensor) -> None:
    """``row[name_acc]``, ``row[name_loss]``: the mean of per-sample ``correct`` and ``loss``."""
    row[f"{name}_acc"] = float(correct.float().mean())
    row[f"{name}_loss"] = float(loss.mean())


def _run_hooks(hooks: Sequence[Hook], epoch: int, model: nn.Module, row: dict) -> None:
    """Call every hook on the finished epoch and merge what it returns into ``row``."""
    for hook in hooks:
        extra = hook(epoch, model, row)
        if extra:
            row.update(extra)


def _as_masks(groups: Mapping[str, torch.Tensor] | None, n: int,
              device: torch.device) -> dict[str, torch.Tensor]:
    masks = {}
    for name, g in (groups or {}).items():
        g = torch.as_tensor(g, device=device)
        if g.dtype != torch.bool:
            mask = torch.zeros(n, dtype=torch.bool, device=device)
            mask[g.long()] = True
            g = mask
        if g.shape != (n,):
            raise ValueError(f"group {name!r} must be a boolean mask of shape ({n},), got {tuple(g.shape)}")
        masks[name] = g
    return masks


def _lr_at(config: TrainConfig, step: int, total: int, epoch: int) -> float:
    """Learning rate of global ``step`` (0-based) in 0-based ``epoch``."""
    if config.schedule == "cosine":
        return config.lr * 0.5 * (1.0 + math.cos(math.pi * step / total))
    if config.schedule == "step":
        passed = sum(epoch >= round(m * config.epochs) for m in config.step_milestones)
        return config.lr * config.step_gamma**passed
    return config.lr


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD with (non-Nesterov) momentum or Adam, weight decay on every trainable parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------
def train_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                config: TrainConfig | None = None, seed: int = 0,
                groups: Mapping[str, torch.Tensor] | None = None,
                test: tuple[torch.Tensor, torch.Tensor] | Sequence[torch.Tensor] | None = None,
                hooks: Iterable[Hook] = (), regularizer=None,
                device: str | torch.device | None = None, progress: bool = False,
                channels_last: bool | None = None, compile: bool = False,
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
    channel (:func:`shift_fill`; default each channel's minimum over ``x``).

    GPU path (speed only, the arithmetic is the same up to rounding): ``channels_last``
    stores the model and each batch channels-last, the layout of the tensor-core convolutions
    under bf16 (None: on CUDA for images); ``compile=True`` runs the training forward through
    ``torch.compile`` (a first-call compilation; worth it for long runs on a GPU).
    """
    config = (config or TrainConfig()).validate()
    dev = torch.device(device) if device is not None else x.device
    model.to(dev)
    x, y = x.to(dev), y.to(dev)
    # The GPU path: channels-last memory and, when asked, a compiled forward.
    if channels_last is None:
        channels_last = dev.type == "cuda" and x.dim() == 4
    if channels_last:
        model.to(memory_format=torch.channels_last)
    forward = torch.compile(model) if compile else model
    n = int(x.shape[0])
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},), got {tuple(y.shape)}")
    if n < 2:
        raise ValueError(f"need at least 2 training samples, got {n}")
    masks = _as_masks(groups, n, dev)
    test_xy = None if test is None else (test[0].to(dev), test[1].to(dev))
    hooks = list(hooks)
    if regularizer is not None:
        regularizer.attach(model)

    pad, use_flip = _augmentation(config, x)
    pad_value = shift_fill(x, fill)                                              # (1, C, 1, 1)
    bs, n_steps = _batch_plan(n, config.batch_size)
    total_steps = n_steps * config.epochs
    gen = torch.Generator().manual_seed(int(seed))
    opt = make_optimizer(model, config)
    history = History()
    start = time.perf_counter()
    epochs = _epoch_range(config.epochs, progress, "train")

    for epoch in epochs:
        model.train()
        perm = torch.randperm(n, generator=gen).to(dev)                             # (N,)
        if pad:
            offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen).to(dev)  # (N, 2)
        if use_flip:
            flips = (torch.rand(n, generator=gen) < 0.5).to(dev)                     # (N,)
        step_losses = torch.zeros(n_steps, device=dev)                               # batch mean CE
        step_regs = torch.zeros(n_steps, device=dev)                                 # regularizer
        step_sizes = torch.zeros(n_steps, device=dev)
        lr_first = _lr_at(config, epoch * n_steps, total_steps, epoch)   # the epoch's row shows it
        for step in range(n_steps):
            lr = _lr_at(config, epoch * n_steps + step, total_steps, epoch)
            for group in opt.param_groups:
                group["lr"] = lr
            idx = perm[step * bs:(step + 1) * bs]                                    # (b,)
            xb, yb = x[idx], y[idx]                                                  # (b, C, H, W), (b,)
            if pad or use_flip:
                xb = shift_flip(xb, offsets[idx] if pad else None, flips[idx] if use_flip else None,
                                pad, pad_value)
            if channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            with _autocast(dev, config.amp):
                out = forward(xb)                                                    # (b, K)
            loss = F.cross_entropy(out.float(), yb)
            total = loss
            if regularizer is not None:
                reg = regularizer(model)
                total = loss + reg
                step_regs[step] = reg.detach().float()
            opt.zero_grad(set_to_none=True)
            total.backward()
            opt.step()
            step_losses[step] = loss.detach()
            step_sizes[step] = idx.shape[0]

        row: dict = {"epoch": epoch + 1, "lr": lr_first}
        finite = torch.isfinite(step_losses) & torch.isfinite(step_regs)
        if not bool(finite.all()):
            history.stop_diverged(row, step_losses, step_regs, epoch, n_steps, lr_first)
            break
        row["train_loss"] = float((step_losses * step_sizes).sum() / step_sizes.sum())
        if regularizer is not None:
            row["reg_loss"] = float(step_regs.mean())

        model.eval()
        if masks:
            loss_i, correct_i = _per_sample(model, x, y, config.eval_batch_size, config.amp)
            for name, mask in masks.items():
                _put_metrics(row, name, loss_i[mask], correct_i[mask])
        if test_xy is not None:
            _put_metrics(row, "test", *_per_sample(model, *test_xy, config.eval_batch_size,
                                                   config.amp))
        _run_hooks(hooks, epoch + 1, model, row)
        history.rows.append(row)
        if progress:
            epochs.set_postfix({k: f"{v:.3f}" for k, v in row.items()
                                if k in ("train_loss", "test_acc") and isinstance(v, float)})
    model.eval()
    history.seconds = time.perf_counter() - start
    return history


# --------------------------------------------------------------------------------------------
# Queries of trained models (LiRA's augmentations) and errors that a retry would repeat
# --------------------------------------------------------------------------------------------
class TrainingError(PermanentError):
    """A model that cannot be trained as configured (its training diverged, its outputs are not
    finite): a retry would repeat it, so executors raise it at once."""


def apply_query(x: torch.Tensor, name: str, fill: torch.Tensor | None = None) -> torch.Tensor:
    """Apply the deterministic query augmentation ``name`` to a (B, C, H, W) batch.

    Shifts move the image content by one pixel and fill the freed row or column with ``fill``
    ((1, C, 1, 1), the data set's background, :attr:`bnmem_utils.data.Dataset.background`, which
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
