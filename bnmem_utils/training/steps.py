"""The pieces both trainers share: the sequential loop (:mod:`bnmem_utils.training.loop`) and K models at
once (:mod:`bnmem_utils.training.vectorised`) draw batches, augment, schedule the learning rate, measure and
report divergence with these, so that model k of a vectorised run is the sequential run of
model k up to summation order.

What is here: a run's :class:`History` and the :class:`TrainingError` a retry would repeat; the
batch plan, the augmentation (shift padding and flips, :func:`shift_flip`), the learning-rate
schedule (:func:`lr_at`), bf16 autocast, and the per-epoch measurements (group masks,
hooks).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

from bnmem_utils.core.checks import PermanentError, check_choice

OPTIMIZERS = ("sgd", "adam")
SCHEDULES = ("cosine", "none")
AMP_MODES = ("auto", "bf16", "off")
#: ``TrainConfig.compile``: "auto" (compiled on CUDA where the compiler can run, else eager),
#: "off", or a ``torch.compile`` mode ("reduce-overhead" adds CUDA graphs on a GPU).
COMPILE_MODES = ("auto", "off", "default", "reduce-overhead", "max-autotune")

Hook = Callable[[int, nn.Module, dict], "dict | None"]


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of :func:`bnmem_utils.training.loop.train_model` (units in the comments)."""

    epochs: int = 20                    # passes over the training set
    batch_size: int = 128               # samples per step
    optimizer: str = "sgd"              # "sgd" (with momentum) or "adam"
    lr: float = 0.05                    # peak learning rate
    momentum: float = 0.9               # SGD momentum (ignored by Adam)
    weight_decay: float = 5e-4          # L2 weight decay on every parameter (norm scales included)
    schedule: str = "cosine"            # "cosine" (per step, to 0) or "none"
    augment: bool = True                # random shifts (and flips for RGB); see shift/flip
    amp: str = "auto"                   # "auto": bf16 autocast on CUDA only; "bf16": always; "off"
    shift: int | None = None            # max shift in pixels (None: 4 from 32 px, 2 from 16 px, else 1)
    flip: bool | None = None            # horizontal flips (None: only for 3-channel images)
    eval_batch_size: int = 1024         # samples per forward in the per-epoch measurements
    compile: str = "auto"               # the training forward through torch.compile: "auto" (on
    #                                     CUDA only; see compile_mode), "off", or a compile mode

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError naming any invalid value and the valid choices."""
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("amp mode", self.amp, AMP_MODES)
        check_choice("compile mode", self.compile, COMPILE_MODES)
        for name in ("epochs", "batch_size", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if self.weight_decay < 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"need weight_decay >= 0 and momentum in [0, 1), got "
                             f"{self.weight_decay!r} and {self.momentum!r}")
        if self.shift is not None and (not isinstance(self.shift, int) or self.shift < 0):
            raise ValueError(f"shift must be a non-negative integer or None, got {self.shift!r}")


# ----------------------------------------------------------------------------------------------
# A run's record and the error a retry would repeat
# ----------------------------------------------------------------------------------------------
@dataclass
class History:
    """What one training run measured (:func:`bnmem_utils.training.loop.train_model`, or one model of
    :func:`bnmem_utils.training.vectorised.train_models`): one row per finished epoch, and whether it
    diverged."""

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

    def at_epoch(self, epoch: int) -> dict:
        """The row of 1-based ``epoch``."""
        for row in self.rows:
            if row["epoch"] == epoch:
                return dict(row)
        raise KeyError(f"epoch {epoch} not in history (epochs 1..{len(self.rows)})")

    def stop_diverged(self, row: dict, losses: torch.Tensor, regs: torch.Tensor, epoch: int,
                      n_steps: int, lr: float, who: str = "") -> None:
        """Training diverged in 0-based ``epoch``: mark it, with a message naming the first step
        whose loss (``losses + regs``, per step) is not finite, close ``row`` with a NaN
        training loss and warn (the warning prefixed by ``who``)."""
        bad = int((~(torch.isfinite(losses) & torch.isfinite(regs))).nonzero()[0, 0])
        self.diverged = True
        self.message = (f"training diverged: the loss became {float(losses[bad] + regs[bad])} at "
                        f"epoch {epoch + 1}, step {bad + 1} of {n_steps} (lr {lr:.3g}); "
                        f"training stopped")
        row["train_loss"] = float("nan")
        self.rows.append(row)
        warnings.warn(who + self.message, RuntimeWarning, stacklevel=3)

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


class TrainingError(PermanentError):
    """A model that cannot be trained as configured (its training diverged, its outputs are not
    finite): a retry would repeat it, so executors raise it at once."""


# ----------------------------------------------------------------------------------------------
# Batches, augmentation, schedule
# ----------------------------------------------------------------------------------------------
def precision(amp: str, device: torch.device) -> str:
    """What ``TrainConfig.amp`` trains in on ``device``: "bf16" (autocast) on CUDA or with
    ``amp="bf16"``, else "fp32". The cache key holds it."""
    return "bf16" if amp == "bf16" or (amp == "auto" and device.type == "cuda") else "fp32"


def autocast(device: torch.device, amp: str):
    """bf16 autocast where :func:`precision` says so; a no-op context otherwise."""
    if precision(amp, device) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def compile_mode(compile: str, device: torch.device, regularized: bool = False) -> str:
    """What ``TrainConfig.compile`` does on ``device``: "off" (eager) or the ``torch.compile``
    mode. "auto" compiles ("default" mode) on CUDA where Triton, the GPU compiler's backend, is
    installed, and is eager elsewhere: on a CPU the committed results were trained eagerly, and
    compiling them would change their last bits; ``BNMEM_COMPILE=off`` in the environment makes
    "auto" eager on CUDA too (where the compiler fails on a machine). A ``regularized`` run (the
    gamma/sigma penalty, whose forward hooks keep each model's batch statistics) always trains
    eagerly. The cache key holds this resolved value
    (:meth:`bnmem_utils.jobs.config.RunConfig.key`), so a model is never read back as trained
    in another mode."""
    if compile == "off" or regularized:
        return "off"
    if compile == "auto" and os.environ.get("BNMEM_COMPILE", "").strip().lower() == "off":
        return "off"
    if compile != "auto":
        return compile
    if device.type != "cuda":
        return "off"
    from torch.utils._triton import has_triton

    return "default" if has_triton() else "off"


def default_shift(image_size: int) -> int:
    """Max random shift in pixels: 4 for 32 px (CIFAR), 2 for 16-31 px (MNIST), 1 below (digits)."""
    return 4 if image_size >= 32 else 2 if image_size >= 16 else 1


def augmentation(config: TrainConfig, x: torch.Tensor) -> tuple[int, bool]:
    """(shift padding in pixels, whether to flip) of training on images ``x`` (N, C, H, W)."""
    pad = (config.shift if config.shift is not None else default_shift(int(x.shape[-1]))) \
        if config.augment else 0
    use_flip = bool(config.augment and (config.flip if config.flip is not None else x.shape[1] == 3))
    return pad, use_flip


def batch_plan(n: int, batch_size: int) -> tuple[int, int]:
    """(batch size, steps per epoch) for ``n`` samples: a final batch of one sample is dropped
    (BN cannot normalise one sample)."""
    bs = min(batch_size, n)
    return bs, n // bs + (1 if n % bs > 1 else 0)


class Batches:
    """One run's batch plan and random stream: the batch size and steps of an epoch of ``n``
    samples, the augmentation of images like ``x``, the shift padding value (1, C, 1, 1), and
    one CPU generator seeded with ``seed`` for the order, shifts and flips. Both trainers draw
    from it, so that model k of a vectorised run takes the batches of its sequential run."""

    def __init__(self, config: TrainConfig, x: torch.Tensor, n: int, pad_value: torch.Tensor,
                 seed: int):
        self.n = n
        self.pad, self.use_flip = augmentation(config, x)
        self.pad_value = pad_value
        self.bs, self.n_steps = batch_plan(n, config.batch_size)
        self.total = self.n_steps * config.epochs
        self.gen = torch.Generator().manual_seed(int(seed))

    def epoch(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The epoch's random draws on the CPU, in the generator's fixed order: a permutation
        (n,), then the shift offsets (n, 2) and the flips (n,) when they are used (else None)."""
        perm = torch.randperm(self.n, generator=self.gen)
        offsets = flips = None
        if self.pad:
            offsets = torch.randint(0, 2 * self.pad + 1, (self.n, 2), generator=self.gen)
        if self.use_flip:
            flips = torch.rand(self.n, generator=self.gen) < 0.5
        return perm, offsets, flips


def shift_fill(x: torch.Tensor, fill: torch.Tensor | None = None) -> torch.Tensor:
    """The (1, C, 1, 1) value a training shift of ``x`` (N, C, H, W) brings in: ``fill`` when
    given (any shape with C elements), else each channel's minimum over ``x``, which is the
    background only when ``x`` holds no outliers darker than it (give the data set's
    :attr:`~bnmem_utils.data.datasets.Dataset.background` when it may)."""
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


def lr_at(config: TrainConfig, step: int, total: int) -> float:
    """Learning rate of global ``step`` (0-based) of ``total``."""
    if config.schedule == "cosine":
        return config.lr * 0.5 * (1.0 + math.cos(math.pi * step / total))
    return config.lr


# ----------------------------------------------------------------------------------------------
# Per-epoch measurements
# ----------------------------------------------------------------------------------------------
def epoch_range(epochs: int, progress: bool, desc: str) -> Iterable[int]:
    """``range(epochs)``, shown as a tqdm bar when ``progress``."""
    if not progress:
        return range(epochs)
    from tqdm.auto import tqdm
    return tqdm(range(epochs), desc=desc, leave=False)


def put_metrics(row: dict, name: str, loss: torch.Tensor, correct: torch.Tensor) -> None:
    """``row[name_acc]``, ``row[name_loss]``: the mean of per-sample ``correct`` and ``loss``."""
    row[f"{name}_acc"] = float(correct.float().mean())
    row[f"{name}_loss"] = float(loss.mean())


def run_hooks(hooks: Sequence[Hook], epoch: int, model: nn.Module, row: dict) -> None:
    """Call every hook on the finished epoch and merge what it returns into ``row``."""
    for hook in hooks:
        extra = hook(epoch, model, row)
        if extra:
            row.update(extra)


def as_masks(groups: Mapping[str, torch.Tensor] | None, n: int,
              device: torch.device) -> dict[str, torch.Tensor]:
    """``groups`` ``{name: bool mask (n,)}`` checked, on ``device``."""
    masks = {}
    for name, g in (groups or {}).items():
        g = torch.as_tensor(g, device=device)
        if g.dtype != torch.bool or g.shape != (n,):
            raise ValueError(f"group {name!r} must be a boolean mask of shape ({n},), got "
                             f"{g.dtype} of shape {tuple(g.shape)}")
        masks[name] = g
    return masks
