"""gamma/sigma statistics of BatchNorm layers (claim T3, and the mitigation's target).

The theory (docs/paper.md) says BN multiplies the per-step margin growth on an outlier by
``(gamma / sigma_B)**2``. :func:`gamma_sigma_stats` reads, for every channel of every BN layer,
the scale ``gamma``, the running standard deviation ``sqrt(running_var + eps)`` (the sigma a
deployed model divides by), and, given a batch, the batch standard deviation
``sqrt(var_B + eps)`` that training divides by (biased variance over the batch and spatial
positions, exactly as BN computes it). The ratios use ``|gamma|``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

COLUMNS = ("layer", "depth", "channel", "gamma", "beta", "running_sigma", "ratio")
BATCH_COLUMNS = ("batch_sigma", "batch_ratio")


def bn_layers(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """``(name, module)`` of every BatchNorm layer (1d, 2d, 3d, sync), in forward-definition order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, _BatchNorm)]


@contextlib.contextmanager
def frozen_bn_stats(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block BN layers may run in train mode (batch statistics); their running mean,
    variance and batch counter are put back afterwards, so a measurement changes nothing."""
    saved = [(m, {k: v.clone() for k, v in m.named_buffers(recurse=False)})
             for _, m in bn_layers(model)]
    try:
        yield model
    finally:
        with torch.no_grad():
            for m, bufs in saved:
                for k, v in bufs.items():
                    getattr(m, k).copy_(v)


def batch_sigma(module: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """Per-channel sigma_B = sqrt(var_B + eps) of a BN layer's input, as the layer normalises it.

    ``x`` is (N, C, *spatial); the variance is the biased one over every axis but the channel,
    which is what BatchNorm divides by in train mode. Computed in float32 (under bf16 autocast
    too) and differentiable with respect to ``x``, hence to the weights that produced it.
    """
    xf = x.float()                                      # (N, C, *) -> float32
    dims = [0] + list(range(2, xf.dim()))               # all but the channel axis
    var = xf.var(dim=dims, unbiased=False)              # (C,)
    return torch.sqrt(var + module.eps)                 # (C,)


def batch_sigmas(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-channel batch std ``sqrt(var_B + eps)`` at the input of every BN layer for the batch
    ``x`` in a train-mode forward (no gradient, running statistics untouched, mode restored)."""
    out: dict[str, torch.Tensor] = {}
    names = {m: name for name, m in bn_layers(model)}

    def hook(m: _BatchNorm, inputs) -> None:
        out[names[m]] = batch_sigma(m, inputs[0].detach())    # (C,)

    handles = [m.register_forward_pre_hook(hook) for m in names]
    was_training = model.training
    try:
        with frozen_bn_stats(model), torch.no_grad():
            model.train()
            dev = next(model.parameters()).device
            model(x.to(dev))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return out


def gamma_sigma_stats(model: nn.Module, x: torch.Tensor | None = None) -> pd.DataFrame:
    """One row per BN channel: ``layer`` (module name), ``depth`` (0-based order of the BN layer),
    ``channel``, ``gamma``, ``beta``, ``running_sigma``, ``ratio = |gamma| / running_sigma``; with a
    batch ``x`` also ``batch_sigma`` and ``batch_ratio = |gamma| / batch_sigma``. A model without BN
    gives an empty frame with these columns."""
    layers = bn_layers(model)
    batch = batch_sigmas(model, x) if (x is not None and layers) else {}
    frames = []
    for depth, (name, m) in enumerate(layers):
        c = m.num_features
        gamma = m.weight.detach().float().cpu() if m.weight is not None else torch.ones(c)
        beta = m.bias.detach().float().cpu() if m.bias is not None else torch.zeros(c)
        running = (torch.sqrt(m.running_var.detach().float().cpu() + m.eps)
                   if m.running_var is not None else torch.full((c,), float("nan")))
        cols = {"layer": [name] * c, "depth": np.full(c, depth), "channel": np.arange(c),
                "gamma": gamma.numpy(), "beta": beta.numpy(), "running_sigma": running.numpy(),
                "ratio": (gamma.abs() / running).numpy()}
        if x is not None:
            bs = batch[name].cpu()
            cols["batch_sigma"] = bs.numpy()
            cols["batch_ratio"] = (gamma.abs() / bs).numpy()
        frames.append(pd.DataFrame(cols))
    columns = list(COLUMNS) + (list(BATCH_COLUMNS) if x is not None else [])
    if not frames:
        return pd.DataFrame({k: pd.Series(dtype="object" if k == "layer" else float)
                             for k in columns})
    return pd.concat(frames, ignore_index=True)[columns]
