"""Vectorised training: K models of one architecture trained at once, as K sequential runs would.

A shadow-model bank trains tens to hundreds of small models per arm. One after another, each
step of a LeNet on 8x8 digits is a little arithmetic wrapped in Python, dispatcher and optimizer
overhead, and tiny convolutions that use a CPU poorly; on a GPU, one small model leaves most of
the device idle. Here the K models' parameters are stacked along a new leading dimension
(``torch.func.stack_module_state``), one forward runs all of them, one backward gives every
model its own gradient, and the optimizer updates the stacked tensors with the arithmetic of
``torch.optim.SGD`` (momentum, weight decay) and ``torch.optim.Adam``. How much faster this
is, and where the time of a vectorised step goes, is measured in ``benchmarks/README.md``.

**Two ways to run K models at once** (:meth:`StackedModels.forward` picks one):

* ``"grouped"``, for the plain stacks of layers (LeNet, the MLP): activations are held as
  ``(B, K*C, H, W)``, every model's channels side by side, so that the native kernels already
  treat the models separately: batch norm over K*C channels is K models' batch norms (with their
  running statistics updated in place), group norm with K*G groups is K group norms, a
  convolution with ``groups=K`` is K convolutions, and linear layers are batched matrix
  products. On small images (digits: 8x8 and 4x4 maps under 5x5 kernels) a convolution is
  cheaper as one dense matrix product per model (:func:`dense_conv_matrix`) than as a grouped
  convolution (about twice, on a CPU); its kernel gradient still comes from the grouped
  convolution's backward, which is the cheaper one there (:class:`_GroupedDenseConv`).
  Activations after a convolution are stored channels-last, where the CPU's batch-norm, ReLU
  and max-pool kernels run several times faster over K*C channels (and the GPU's tensor cores
  want them).
* ``"vmap"``, for everything else (ResNets, DenseNet): ``torch.func.vmap`` over
  ``torch.func.functional_call``, with each BN layer swapped for :class:`_WeightedBatchNorm` (the
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
``tests/test_vtrain.py`` states the tolerances.

**Unequal subsets.** The halves of a keep matrix differ in size by a few samples, so at a given
step some models have a shorter final batch, or no batch at all. Every model's batch is padded
to the same length with 0/1 sample weights: the loss is the weighted mean, and at such a step
batch norm takes its statistics over the weighted samples only (:func:`_weighted_bn`). A model
with no batch at a step is given a dummy batch whose loss is multiplied by zero and whose
update (parameters, optimizer state, running statistics) is discarded bit for bit.

**Which banks are vectorised by default** (:func:`bnmem_utils.config.bank_trainer`, read by
:func:`bnmem_utils.bank.default_trainer`):
LeNet and MLP banks on every device; ResNet-20, ResNet-18 and DenseNet banks on a GPU only. On
a CPU the vmap path trains them 0.28-0.94x as fast as one model after another
(``benchmarks/bench_roofline.py``): one such model's convolutions already run near the core's
rate, and K models' grouped convolutions and batched batch norms cost more per FLOP. Blocks
hold :func:`default_chunk` models (on a GPU sized from :func:`per_model_bytes` and the device's
total memory).
"""

from __future__ import annotations

import copy
import math
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

from .config import SMALL_ARCHS
from .penalty import GammaSigmaPenalty, from_spec
from .train import (
    History,
    Hook,
    TrainConfig,
    TrainingError,
    _as_masks,
    _augmentation,
    _autocast,
    _batch_plan,
    _epoch_range,
    _lr_at,
    _put_metrics,
    _run_hooks,
    apply_query,
    safe_batch,
    shift_fill,
    shift_flip,
)
from .validation import check_choice

__all__ = ["StackedModels", "stack_models", "train_models", "train_members_vectorized",
           "vectorizable", "default_chunk", "dense_conv_matrix", "PATHS",
           "SMALL_ARCHS", "per_model_bytes"]

PATHS = ("auto", "grouped", "vmap")



# ----------------------------------------------------------------------------------------------
# Convolutions on small images as dense matrix products
# ----------------------------------------------------------------------------------------------
#: A convolution on an image of at most this many times its kernel's area runs as a dense
#: matrix product (see :func:`dense_conv_matrix`).
DENSE_CONV_MAX_AREA = 4

_DENSE_INDEX: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _out_size(h: int, w: int, k: Sequence[int], stride: Sequence[int],
              padding: Sequence[int]) -> tuple[int, int]:
    """(Ho, Wo) of a convolution with kernel ``k`` on an ``h`` x ``w`` image."""
    return ((h + 2 * padding[0] - k[0]) // stride[0] + 1,
            (w + 2 * padding[1] - k[1]) // stride[1] + 1)


def _dense_index(o: int, c: int, h: int, w: int, k: tuple[int, int], stride: tuple[int, int],
                 padding: tuple[int, int], channels_last: bool, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each entry of the dense matrix of a convolution comes from, and where each kernel
    weight goes (cached per shape).

    ``gather`` (rows*cols,): for every entry of the (C*h*w, O*Ho*Wo) matrix, the flat index
    (o, c, tap) of the kernel weight it holds, or O*C*kh*kw (a zero appended to the weights)
    where the tap links no input pixel to that output pixel. ``scatter`` (O*C*kh*kw, n): for
    every kernel weight, the flat matrix entries that hold it, padded with rows*cols (a zero
    appended to the matrix's gradient); the gradient of a weight is the sum over its row.
    """
    key = (o, c, h, w, k, stride, padding, channels_last, str(device))
    if key not in _DENSE_INDEX:
        kh, kw = k
        ho, wo = _out_size(h, w, k, stride, padding)
        ki, kj, oi, oj = torch.meshgrid(torch.arange(kh), torch.arange(kw), torch.arange(ho),
                                        torch.arange(wo), indexing="ij")
        i = oi * stride[0] + ki - padding[0]                                # input row
        j = oj * stride[1] + kj - padding[1]                                # input column
        ok = (i >= 0) & (i < h) & (j >= 0) & (j < w)
        pixel = (i * w + j)[ok].view(1, 1, -1)                              # (1, 1, n) per link
        out_pixel = (oi * wo + oj)[ok].view(1, 1, -1)
        tap = (ki * kw + kj)[ok].view(1, 1, -1)
        ci = torch.arange(c).view(1, -1, 1)
        oo = torch.arange(o).view(-1, 1, 1)
        if channels_last:                                   # rows (pixel, c), columns (out, o)
            row, col = pixel * c + ci, out_pixel * o + oo
        else:                                               # rows (c, pixel), columns (o, out)
            row, col = ci * (h * w) + pixel, oo * (ho * wo) + out_pixel
        source = (oo * c + ci) * (kh * kw) + tap                            # (O, C, n)
        row, col, source = (t.flatten() for t in torch.broadcast_tensors(row, col, source))
        n_weights, n_cols = o * c * kh * kw, o * ho * wo
        entry = row * n_cols + col
        gather = torch.full((c * h * w * n_cols,), n_weights, dtype=torch.long)
        gather[entry] = source
        counts = torch.bincount(source, minlength=n_weights)
        order = torch.argsort(source, stable=True)
        rank = torch.arange(source.numel()) - (torch.cumsum(counts, 0) - counts)[source[order]]
        scatter = torch.full((n_weights, max(int(counts.max()), 1)), gather.numel(),
                             dtype=torch.long)
        scatter[source[order], rank] = entry[order]
        _DENSE_INDEX[key] = (gather.to(device), scatter.to(device))
    return _DENSE_INDEX[key]


def _gather_dense(weight: torch.Tensor, gather: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    flat = F.pad(weight.reshape(*weight.shape[:-4], -1), (0, 1))           # (..., OCT + 1)
    return flat.index_select(-1, gather).view(*weight.shape[:-4], rows, cols)


class _DenseFromIndex(torch.autograd.Function):
    """The dense matrix as a gather of the kernel weights (forward) and a gather-and-sum of its
    gradient (backward): two memory passes, where a product with a 0/1 Toeplitz basis costs a
    matrix product and a permuted copy each way (measured: 1.7x faster for LeNet's two
    convolutions on the digits, forward and backward)."""

    @staticmethod
    def forward(ctx, weight, gather, scatter, rows, cols):
        ctx.save_for_backward(scatter)
        ctx.weight_shape = weight.shape
        return _gather_dense(weight, gather, rows, cols)

    @staticmethod
    def backward(ctx, grad):
        (scatter,) = ctx.saved_tensors
        lead = ctx.weight_shape[:-4]
        flat = F.pad(grad.reshape(*lead, -1), (0, 1))                       # (..., rows*cols + 1)
        per_weight = flat.index_select(-1, scatter.flatten()).view(*lead, *scatter.shape)
        return per_weight.sum(-1).view(ctx.weight_shape), None, None, None, None


def _conv_out_size(conv, h: int, w: int) -> tuple[int, int]:
    return _out_size(h, w, conv.kernel_size, conv.stride, conv.padding)


def _dense_applies(conv, h: int, w: int) -> bool:
    """Whether :func:`dense_conv_matrix` handles ``conv`` on an ``h`` x ``w`` input and is the
    cheaper form (an image of at most DENSE_CONV_MAX_AREA kernel areas)."""
    kh, kw = conv.kernel_size
    return (conv.groups == 1 and tuple(conv.dilation) == (1, 1)
            and isinstance(conv.padding, tuple) and conv.padding_mode == "zeros"
            and h * w <= DENSE_CONV_MAX_AREA * kh * kw)


def dense_conv_matrix(weight: torch.Tensor, h: int, w: int, stride: tuple[int, int],
                      padding: tuple[int, int], *, channels_last: bool = False) -> torch.Tensor:
    """The convolution by ``weight`` (..., O, C, kh, kw) on (C, h, w) images as a dense matrix
    (..., C*h*w, O*Ho*Wo): ``x.flatten(1) @ M`` equals ``conv2d(x, weight).flatten(1)`` (up to
    summation order). With ``channels_last`` the rows are ordered (h, w, c) and the columns
    (oh, ow, o), for images stored channels-last. Differentiable in ``weight``; leading
    dimensions (models) are kept."""
    o, c, kh, kw = weight.shape[-4:]
    ho, wo = _out_size(h, w, (kh, kw), stride, padding)
    gather, scatter = _dense_index(o, c, h, w, (kh, kw), tuple(stride), tuple(padding),
                                   channels_last, weight.device)
    if torch._C._are_functorch_transforms_active():        # under vmap: autograd's own rule
        return _gather_dense(weight, gather, c * h * w, o * ho * wo)
    return _DenseFromIndex.apply(weight, gather, scatter, c * h * w, o * ho * wo)


# ----------------------------------------------------------------------------------------------
# Batch norm with sample weights, on the grouped layout
# ----------------------------------------------------------------------------------------------
class _WeightedBNFn(torch.autograd.Function):
    """Batch norm of K models over the samples of weight 1, on x (B, P, K, C) (P positions per
    sample) with w (B, 1, K, 1) in {0, 1}; returns the output, and the (K, C) batch mean (no
    gradient) and biased variance. Its backward is written out (three passes over the
    activations), where autograd through the weighted sums would take about ten:
    ``dx = gamma * rstd * (dy - w * (sum(dy) + xhat * sum(dy * xhat)) / n)`` with sums over the
    weighted samples, the exact gradient (the weight-0 samples get none through the
    statistics). When the variance is used (the gamma/sigma penalty's sigma_B), its gradient
    ``w * dvar * 2 * (x - mean) / n`` is folded into the same passes."""

    @staticmethod
    def forward(ctx, x, w, gamma, beta, eps):
        ctx.set_materialize_grads(False)
        count = w.sum(0).view(-1, 1) * x.shape[1]                            # (K, 1)
        mean = (x * w).sum((0, 1)) / count                                   # (K, C)
        xhat = x - mean
        var = (xhat * w * xhat).sum((0, 1)) / count                          # (K, C), biased
        rstd = torch.rsqrt(var + eps)
        xhat.mul_(rstd)
        out = torch.addcmul(beta, xhat, gamma)
        ctx.save_for_backward(xhat, w, gamma * rstd, count, rstd)
        ctx.mark_non_differentiable(mean)
        return out, mean, var

    @staticmethod
    def backward(ctx, dy, _mean, dvar):
        xhat, w, scale, count, rstd = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(xhat)
        dbeta = dy.sum((0, 1))                                               # (K, C)
        dgamma = (dy * xhat).sum((0, 1))
        if dvar is None:
            t = torch.addcmul(dbeta / count, xhat, dgamma / count)
            dx = (dy - t.mul_(w)).mul_(scale)
        else:            # d var / dx = 2 (x - mean) / n = 2 xhat / (rstd n), on weighted samples
            t = torch.addcmul(dbeta * scale / count, xhat,
                              dgamma * scale / count - 2 * dvar / (rstd * count))
            dx = (dy * scale).sub_(t.mul_(w))
        return (dx, None, dgamma if ctx.needs_input_grad[2] else None,
                dbeta if ctx.needs_input_grad[3] else None, None)


def _weighted_bn(h: torch.Tensor, k: int, weights: torch.Tensor, gamma, beta, eps: float,
                 running: tuple[torch.Tensor, torch.Tensor] | None, factor: torch.Tensor | None,
                 sigma: list | None = None) -> torch.Tensor:
    """Batch norm of K models in the grouped layout ``h`` (B, K*C, ...) with per-model sample
    weights (K, B) in {0, 1}: statistics over the samples of weight 1 only, in float32.

    ``running``: the (K, C) running mean and variance, updated in place (no grad) with
    ``new = (1 - factor) * old + factor * batch`` (``factor`` (K, 1)) and BN's unbiased batch
    variance, when given. ``sigma``: a list that receives the (K, C) sigma_B = sqrt(var_B + eps)
    of this batch, differentiable (the gamma/sigma penalty's)."""
    b = h.shape[0]
    c = h.shape[1] // k
    rest = tuple(h.shape[2:])
    per = math.prod(rest) if rest else 1
    x = h.float().movedim(1, -1).reshape(b, per, k, c)                       # (B, P, K, C)
    wv = weights.t().to(x.dtype).reshape(b, 1, k, 1)
    g = gamma if gamma is not None else x.new_ones(k, c)
    bt = beta if beta is not None else x.new_zeros(k, c)
    out, mean, var = _WeightedBNFn.apply(x, wv, g, bt, eps)
    if sigma is not None:
        sigma.append(torch.sqrt(var + eps))
    if running is not None:
        with torch.no_grad():
            count = weights.sum(1).to(x.dtype).view(k, 1) * per
            rm, rv = running
            rm.mul_(1 - factor).add_(factor * mean)
            rv.mul_(1 - factor).add_(factor * var * count / (count - 1))
    return out.reshape(b, *rest, k * c).movedim(-1, 1)                       # (B, K*C, ...)


# ----------------------------------------------------------------------------------------------
# Path 1: plain stacks of layers, run in the grouped layout
# ----------------------------------------------------------------------------------------------
_GROUPED_TYPES = (nn.Conv2d, nn.Linear, nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm,
                  nn.ReLU, nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.AvgPool2d, nn.Flatten,
                  nn.Identity)


def _layer_plan(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The model as a flat list of (parameter prefix, layer) applied in order, when its forward
    is such a list (LeNet: features, flatten, classifier; MLP: net); None otherwise."""
    from .models import MLP, LeNet

    if type(model) is LeNet:        # features, the adaptive pool (the identity when the map
        #                               already has its size), flatten, classifier
        layers = ([(f"features.{i}", m) for i, m in enumerate(model.features)]
                  + [("pool", model.pool), ("", nn.Flatten())]
                  + [(f"classifier.{i}", m) for i, m in enumerate(model.classifier)])
    elif type(model) is MLP:
        layers = [(f"net.{i}", m) for i, m in enumerate(model.net)]
    else:
        return None
    for _, m in layers:
        if type(m) not in _GROUPED_TYPES:
            return None
        if isinstance(m, nn.Flatten) and (m.start_dim, m.end_dim) != (1, -1):
            return None
        if isinstance(m, nn.LayerNorm) and len(m.normalized_shape) != 1:
            return None
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats:
            return None
    # ReLU then max-pool is max-pool then ReLU, value for value and gradient for gradient (the
    # maximum commutes with a monotone function; a positive maximum sends the gradient to the
    # same element either way, any other gets none): pooling first runs the ReLU and its
    # backward on a quarter of the activations
    for i in range(len(layers) - 1):
        if type(layers[i][1]) is nn.ReLU and type(layers[i + 1][1]) is nn.MaxPool2d:
            layers[i], layers[i + 1] = layers[i + 1], layers[i]
    return layers


class _GroupedDenseConv(torch.autograd.Function):
    """K models' convolutions of a small image, in the grouped layout: the forward is one dense
    matrix product per model (:func:`dense_conv_matrix`); in the backward the kernel gradient
    comes from the native grouped-convolution weight gradient (``torch.nn.grad.conv2d_weight``
    on the channels-last input and output gradient, about 3x cheaper on a CPU than forming the
    dense matrix's gradient and folding it back), and the input gradient from the transposed
    dense product."""

    @staticmethod
    def forward(ctx, h, weight, stride, padding):
        # h (B, K*C, H, W) channels-last, weight (K, O, C, kh, kw) -> (B, K*O, Ho, Wo)
        k, o, c, kh, kw = weight.shape
        b, _, hh, ww = h.shape
        ho, wo = _out_size(hh, ww, (kh, kw), stride, padding)
        with torch.no_grad():
            dense = dense_conv_matrix(weight, hh, ww, stride, padding,
                                      channels_last=True)                  # (K, hw*C, L*O)
        xin = h.permute(0, 2, 3, 1).reshape(b, hh * ww, k, c).permute(2, 0, 1, 3)
        out = torch.bmm(xin.reshape(k, b, hh * ww * c), dense.to(xin.dtype))  # (K, B, L*O)
        out = out.view(k, b, ho, wo, o).permute(1, 2, 3, 0, 4).reshape(b, ho, wo, k * o)
        ctx.save_for_backward(h, dense)
        ctx.shapes = (weight.shape, weight.dtype, stride, padding)
        return out.permute(0, 3, 1, 2)                                       # channels-last

    @staticmethod
    def backward(ctx, grad):
        h, dense = ctx.saved_tensors
        (k, o, c, kh, kw), wdtype, stride, padding = ctx.shapes
        b, _, hh, ww = h.shape
        ho, wo = grad.shape[-2:]
        grad = grad.to(h.dtype).contiguous(memory_format=torch.channels_last)
        grad_h = grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = torch.nn.grad.conv2d_weight(h.contiguous(memory_format=torch.channels_last),
                                                 (k * o, c, kh, kw), grad, stride, padding,
                                                 1, k).view(k, o, c, kh, kw).to(wdtype)
        if ctx.needs_input_grad[0]:
            gk = grad.permute(0, 2, 3, 1).reshape(b, ho * wo, k, o).permute(2, 0, 1, 3)
            gin = torch.bmm(gk.reshape(k, b, ho * wo * o), dense.to(gk.dtype).transpose(1, 2))
            grad_h = gin.view(k, b, hh, ww, c).permute(1, 2, 3, 0, 4).reshape(b, hh, ww, k * c)
            grad_h = grad_h.permute(0, 3, 1, 2)
        return grad_h, grad_w, None, None


def _grouped_conv(m: nn.Conv2d, wt: torch.Tensor, bias: torch.Tensor | None, h: torch.Tensor,
                  k: int, shared: bool) -> torch.Tensor:
    """K models' convolutions: ``h`` (B, K*C, H, W), or (B, C, H, W) when ``shared`` by all;
    ``wt`` (K, O, C, kh, kw). Returns (B, K*O, Ho, Wo) stored channels-last, the layout in which
    the CPU's batch norm, ReLU and max-pool kernels run vectorised over the K*O channels. Small
    images go through dense matrix products (:class:`_GroupedDenseConv`), others through one
    grouped convolution."""
    o, c = wt.shape[1], wt.shape[2]
    b, hh, ww = h.shape[0], h.shape[-2], h.shape[-1]
    ho, wo = _conv_out_size(m, hh, ww)
    if not _dense_applies(m, hh, ww):
        h = h.contiguous(memory_format=torch.channels_last)
        return F.conv2d(h, wt.reshape(k * o, c, *wt.shape[3:]),
                        None if bias is None else bias.reshape(-1), m.stride, m.padding,
                        m.dilation, 1 if shared else k)                      # (B, K*O, Ho, Wo)
    if not shared:
        out = _GroupedDenseConv.apply(h.contiguous(memory_format=torch.channels_last), wt,
                                      tuple(m.stride), tuple(m.padding))
        return out if bias is None else out + bias.reshape(1, k * o, 1, 1)
    # a shared input (eval mode): one matrix product for every model at once
    dense = dense_conv_matrix(wt, hh, ww, m.stride, m.padding,
                              channels_last=True)                           # (K, hw*C, L*O)
    xin = h.permute(0, 2, 3, 1).reshape(b, hh * ww * c)                       # (B, hw*C)
    flat = dense.view(k, hh * ww * c, ho * wo, o).permute(1, 2, 0, 3)         # (hw*C, L, K, O)
    out = (xin @ flat.reshape(hh * ww * c, -1)).view(b, ho, wo, k * o)       # (B, Ho, Wo, K*O)
    if bias is not None:
        out = out + bias.reshape(k * o)
    return out.permute(0, 3, 1, 2)                                           # channels-last


_PARAM_NAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _param_names(m: nn.Module) -> tuple[str, ...]:
    """The names of a layer's own parameters (looked up once per layer, not once per step)."""
    if m not in _PARAM_NAMES:
        _PARAM_NAMES[m] = tuple(n for n, _ in m.named_parameters())
    return _PARAM_NAMES[m]


def _grouped_forward(layers: Sequence[tuple[str, nn.Module]], params: dict, buffers: dict,
                     x: torch.Tensor, k: int, *, batch_stats: bool, update_stats: bool,
                     weights: torch.Tensor | None, sigmas: list | None = None) -> torch.Tensor:
    """Run K models of a layer plan: x (K, B, C, H, W) per model, or (B, C, H, W) shared by all;
    returns logits (K, B, classes). Activations are (B, K*C, H, W) or (B, K*F) throughout.

    BN normalises with batch statistics when ``batch_stats`` (over the samples of weight 1 when
    ``weights`` (K, B) is given), and updates the stacked running statistics in place when
    ``update_stats``; num_batches_tracked is the caller's. ``sigmas``: a list to which each BN
    layer appends ``(name, sigma_B)`` (K, C) of its input, with batch statistics (the
    gamma/sigma penalty's)."""
    shared = x.dim() == 4
    if shared:
        h = x                                                    # (B, C, H, W): same for all
    else:
        kk, b = x.shape[:2]
        c, hh, ww = x.shape[2:]                                      # (B, K*C, H, W), stored
        h = x.permute(1, 3, 4, 0, 2).reshape(b, hh, ww, kk * c).permute(0, 3, 1, 2)  # ch.-last
    for prefix, m in layers:
        p = {n: params[f"{prefix}.{n}"] for n in _param_names(m)}
        if shared and isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm,
                                     nn.LayerNorm)):
            h = h.repeat(1, k, *([1] * (h.dim() - 2)))          # every model's copy of the input
            shared = False
        if isinstance(m, nn.Conv2d):
            h, shared = _grouped_conv(m, p["weight"], p.get("bias"), h, k, shared), False
        elif isinstance(m, nn.Linear):
            wt, bias = p["weight"], p.get("bias")                            # (K, O, F)
            o, f = wt.shape[1], wt.shape[2]
            b = h.shape[0]
            if shared:
                h = F.linear(h.reshape(b, f), wt.reshape(k * o, f),
                             None if bias is None else bias.reshape(-1))     # (B, K*O)
                shared = False
            else:
                hk = h.reshape(b, k, f).transpose(0, 1)                      # (K, B, F)
                out = (torch.baddbmm(bias.unsqueeze(1), hk, wt.transpose(1, 2)) if bias is not None
                       else torch.bmm(hk, wt.transpose(1, 2)))               # (K, B, O)
                h = out.transpose(0, 1).reshape(b, k * o)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            gamma, beta = p.get("weight"), p.get("bias")
            rm, rv = buffers[f"{prefix}.running_mean"], buffers[f"{prefix}.running_var"]
            penalised = sigmas is not None and batch_stats
            g = None if gamma is None else gamma.reshape(-1)
            bt = None if beta is None else beta.reshape(-1)
            if not batch_stats:
                h = F.batch_norm(h, rm.view(-1), rv.view(-1), g, bt, False, 0.0, m.eps)
            elif weights is None and not penalised and (m.momentum is not None or not update_stats):
                h = F.batch_norm(h, rm.view(-1) if update_stats else None,
                                 rv.view(-1) if update_stats else None, g, bt, True,
                                 m.momentum or 0.0, m.eps)
            else:
                w8 = weights if weights is not None else h.new_ones(k, h.shape[0])
                factor = None
                if update_stats:
                    nbt = buffers[f"{prefix}.num_batches_tracked"]
                    factor = (torch.full((k, 1), float(m.momentum), device=h.device)
                              if m.momentum is not None
                              else 1.0 / (nbt.view(k, 1).float() + 1))
                sigma = [] if penalised else None
                h = _weighted_bn(h, k, w8, gamma, beta, m.eps,
                                 (rm, rv) if update_stats else None, factor, sigma)
                if penalised:
                    sigmas.append((prefix, sigma[0]))
        elif isinstance(m, nn.GroupNorm):
            h = F.group_norm(h, k * m.num_groups, p["weight"].reshape(-1) if m.affine else None,
                             p["bias"].reshape(-1) if m.affine else None, m.eps)
        elif isinstance(m, nn.LayerNorm):
            b, f = h.shape[0], m.normalized_shape[0]
            hk = F.layer_norm(h.reshape(b, k, f), (f,), None, None, m.eps)   # (B, K, F)
            if m.elementwise_affine:
                hk = hk * p["weight"] + (p["bias"] if "bias" in p else 0)
            h = hk.reshape(b, k * f)
        elif isinstance(m, nn.ReLU):
            h = F.relu(h, inplace=m.inplace and not shared)
        elif isinstance(m, nn.MaxPool2d):
            h = F.max_pool2d(h, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)
        elif isinstance(m, nn.AvgPool2d):
            h = F.avg_pool2d(h, m.kernel_size, m.stride, m.padding, m.ceil_mode,
                             m.count_include_pad, m.divisor_override)
        elif isinstance(m, nn.AdaptiveAvgPool2d):
            size = m.output_size if isinstance(m.output_size, tuple) else (m.output_size,) * 2
            if tuple(h.shape[-2:]) != size:          # the identity otherwise (LeNet skips it)
                h = F.adaptive_avg_pool2d(h, m.output_size)
        elif isinstance(m, nn.Flatten):
            h = h.flatten(1)
    b = h.shape[0]
    if shared:                                                   # a model with no layer at all
        h = h.flatten(1).repeat(1, k)
    return h.reshape(b, k, -1).transpose(0, 1)                   # (K, B, classes)


# ----------------------------------------------------------------------------------------------
# Path 2: vmap over functional_call, for any architecture
# ----------------------------------------------------------------------------------------------
class _Context(threading.local):
    """What the swapped BN layers read during one vmapped forward (set by StackedModels)."""

    def __init__(self) -> None:
        self.weights: torch.Tensor | None = None   # (B,) 0/1 sample weights of the current model
        self.batch_stats: bool = False             # True: normalise with batch statistics
        self.means: dict[str, torch.Tensor] = {}   # BN name -> (C,) batch mean
        self.vars: dict[str, torch.Tensor] = {}    # BN name -> (C,) unbiased batch variance


_CTX = _Context()


class _WeightedBatchNorm(nn.Module):
    """``nn.BatchNorm1d/2d`` as a plain function of its inputs, so that ``vmap`` can batch it.

    Same parameters and buffers (same names) as the BN it replaces. With batch statistics the
    mean and biased variance are taken over the samples of weight 1 only (all samples when no
    weights are set); the batch mean and unbiased variance are handed back through the context
    for the running-statistics update. Statistics in float32 (under bf16 autocast too); the
    output is formed as BN's CPU kernel forms it, ``x * scale + shift``.
    """

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, name: str):
        super().__init__()
        self.name = name
        self.eps = float(bn.eps)
        self.weight = bn.weight
        self.bias = bn.bias
        self.register_buffer("running_mean", bn.running_mean)
        self.register_buffer("running_var", bn.running_var)
        self.register_buffer("num_batches_tracked", bn.num_batches_tracked)

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # x: (B, C) or (B, C, H, W)
        shape = (1, -1) + (1,) * (x.dim() - 2)                  # broadcast a (C,) vector
        xf = x.float()
        if _CTX.batch_stats:
            dims = [0, *range(2, x.dim())]
            w = _CTX.weights
            if w is None:
                var, mean = torch.var_mean(xf, dims, correction=0)          # (C,), biased
                count = xf.numel() / xf.shape[1]
            else:
                per = xf[0].numel() / xf.shape[1]                           # H*W (1 for 1d)
                wv = w.view((-1,) + (1,) * (x.dim() - 1)).to(xf.dtype)       # (B, 1, ...)
                count = w.sum() * per
                mean = (xf * wv).sum(dims) / count                          # (C,)
                xc = xf - mean.view(shape)
                var = (xc * xc * wv).sum(dims) / count                      # (C,) biased
            if self.name in _CTX.means:
                raise RuntimeError(f"BN layer {self.name!r} is called twice in one forward; "
                                   f"the vectorised trainer cannot update its statistics")
            _CTX.means[self.name] = mean.detach()
            _CTX.vars[self.name] = (var * (count / (count - 1))).detach()
        else:
            mean, var = self.running_mean, self.running_var
        scale = torch.rsqrt(var + self.eps)                                 # (C,) 1 / sigma
        if self.weight is not None:
            scale = scale * self.weight
            shift = self.bias - mean * scale
        else:
            shift = -mean * scale
        return torch.addcmul(shift.view(shape), xf, scale.view(shape))


class _VectorConv2d(nn.Module):
    """``nn.Conv2d`` for the vmapped forward: a dense matrix product on small images (see
    :func:`dense_conv_matrix`), ``F.conv2d`` (a grouped convolution under vmap) elsewhere."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.conv = SimpleNamespace(                 # hyperparameters only: tensors come in
            kernel_size=conv.kernel_size, stride=conv.stride, padding=conv.padding,
            dilation=conv.dilation, groups=conv.groups, padding_mode=conv.padding_mode)
        self.weight = conv.weight
        self.bias = conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # x: (B, C, H, W)
        m = self.conv
        b, _, h, w = x.shape
        if not _dense_applies(m, h, w):
            return F.conv2d(x, self.weight, self.bias, m.stride, m.padding, m.dilation, m.groups)
        ho, wo = _conv_out_size(m, h, w)
        dense = dense_conv_matrix(self.weight, h, w, m.stride, m.padding)   # (C*h*w, O*L)
        out = (x.reshape(b, -1) @ dense.to(x.dtype)).view(b, -1, ho, wo)    # (B, O, Ho, Wo)
        return out if self.bias is None else out + self.bias.view(1, -1, 1, 1)


def _swap_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Replace (in place) every BN of ``model`` by a :class:`_WeightedBatchNorm` and every
    ``nn.Conv2d`` by a :class:`_VectorConv2d`; return the (name, original BN) pairs."""
    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.modules.batchnorm._BatchNorm):
                if not child.track_running_stats or child.running_mean is None:
                    raise ValueError(f"BN layer {full!r} keeps no running statistics; "
                                     f"the vectorised trainer needs them")
                setattr(module, child_name, _WeightedBatchNorm(child, full))
                swapped.append((full, child))
            elif type(child) is nn.Conv2d:
                setattr(module, child_name, _VectorConv2d(child))
    return swapped


# ----------------------------------------------------------------------------------------------
# K models as stacked tensors
# ----------------------------------------------------------------------------------------------
@dataclass
class StackedModels:
    """K models of one architecture as stacked tensors: ``params[name]`` and ``buffers[name]``
    are ``(K, *shape)`` versions of the model's parameter or buffer ``name``.

    ``prototype`` is a copy of the architecture from which :meth:`module` rebuilds model k;
    ``path`` is ``"grouped"`` (``layers`` holds the layer plan) or ``"vmap"`` (``template`` is a
    copy with swapped BN and convolution layers whose own tensors are never used).
    """

    prototype: nn.Module
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    path: str
    layers: list[tuple[str, nn.Module]] | None = None
    template: nn.Module | None = None
    bn: dict[str, float | None] = field(default_factory=dict)   # BN name -> momentum
    checked: set = field(default_factory=set)     # input shapes on which the plan was verified

    @property
    def n_models(self) -> int:
        return int(next(iter(self.params.values())).shape[0])

    def forward(self, x: torch.Tensor, *, batch_stats: bool = False,
                weights: torch.Tensor | None = None, update_stats: bool = False,
                active: torch.Tensor | None = None, sigmas: list | None = None) -> torch.Tensor:
        """All K models: ``x`` (K, B, C, H, W), one batch per model, or (B, C, H, W) shared by
        all -> logits (K, B, classes).

        ``batch_stats``: BN normalises with each model's batch statistics (training, or the
        train-mode query ablation) instead of its running ones, over the samples whose
        ``weights`` (K, B) are 1 when given. ``update_stats``: then also update each model's
        running statistics and ``num_batches_tracked`` as ``nn.BatchNorm`` does in training,
        only for the models where ``active`` (K,) bool is True (all when None). ``sigmas``: a
        list that receives each BN layer's ``(name, sigma_B)`` (K, C) of this batch (grouped
        path only; the gamma/sigma penalty's).
        """
        k = self.n_models
        if weights is not None and x.dim() == 4:
            raise ValueError("per-model sample weights need per-model inputs (K, B, C, H, W)")
        update = bool(update_stats and batch_stats and self.bn)
        masked = update and active is not None
        if self.path == "grouped" and tuple(x.shape[-3:]) not in self.checked:
            self._check_plan(x)
        if self.path == "grouped":
            buffers = self.buffers
            if masked:
                # the batch-norm kernel updates the running statistics in place and autograd
                # keeps them for the backward: update copies, then keep the active models' part
                buffers = {**self.buffers, **{n: t.clone() for n, t in self._bn_buffers().items()}}
            out = _grouped_forward(self.layers, self.params, buffers, x, k,
                                   batch_stats=batch_stats, update_stats=update, weights=weights,
                                   sigmas=sigmas)
            if masked:
                self._keep_active(buffers, active)
        else:
            if sigmas is not None:
                raise ValueError("batch sigmas (the gamma/sigma penalty) need the grouped path; "
                                 f"{type(self.prototype).__name__} runs on the vmap path")
            before = {n: t.clone() for n, t in self._bn_buffers().items()} if masked else None
            out, means, variances = self._vmap_forward(x, batch_stats, weights)
            if update:
                self._update_running(means, variances)
            if masked:
                updated = {n: t.clone() for n, t in self._bn_buffers().items()}
                for n, t in before.items():
                    self.buffers[n].copy_(t)
                self._keep_active(updated, active)
        if update:
            with torch.no_grad():
                for name in self.bn:
                    nbt = self.buffers[f"{name}.num_batches_tracked"]
                    nbt.add_(1 if active is None else active.to(nbt.dtype))
        return out

    @torch.no_grad()
    def _keep_active(self, updated: dict[str, torch.Tensor], active: torch.Tensor) -> None:
        """Copy the updated running statistics of the active models into the stacked buffers."""
        for n in self._bn_buffers():
            t = self.buffers[n]
            t.copy_(torch.where(active.view((-1,) + (1,) * (t.dim() - 1)), updated[n], t))

    @torch.no_grad()
    def _check_plan(self, x: torch.Tensor) -> None:
        """Once per input shape: the layer plan must compute what the model's own forward does
        (model 0, eval mode, two samples, float32). If a change to the model's forward broke
        that, warn and fall back to the vmap path, which runs the forward itself."""
        xs = (x if x.dim() == 4 else x[0])[:2].float()                       # (2, C, H, W)
        with torch.autocast(device_type=xs.device.type, enabled=False):
            self.prototype.eval()
            ref = functional_call(self.prototype, ({n: t[0] for n, t in self.params.items()},
                                                   {n: t[0] for n, t in self.buffers.items()}),
                                  (xs,))
            got = _grouped_forward(self.layers, self.params, self.buffers, xs, self.n_models,
                                   batch_stats=False, update_stats=False, weights=None)[0]
        if got.shape == ref.shape and torch.allclose(got, ref, rtol=1e-3, atol=1e-4):
            self.checked.add(tuple(x.shape[-3:]))
            return
        warnings.warn(f"vtrain: the layer plan of {type(self.prototype).__name__} no longer "
                      f"matches its forward; using the (slower) vmap path", RuntimeWarning,
                      stacklevel=3)
        self.path, self.layers = "vmap", None
        self.template = copy.deepcopy(self.prototype)
        _swap_layers(self.template)

    def _bn_buffers(self) -> dict[str, torch.Tensor]:
        return {f"{name}.{b}": self.buffers[f"{name}.{b}"] for name in self.bn
                for b in ("running_mean", "running_var")}

    def _vmap_forward(self, x, batch_stats, weights):
        template = self.template

        def one(params, buffers, xk, wk):
            _CTX.weights, _CTX.means, _CTX.vars = wk, {}, {}
            out = functional_call(template, (params, buffers), (xk,))       # (B, classes)
            return out, _CTX.means, _CTX.vars

        _CTX.batch_stats = batch_stats
        try:
            if weights is None:
                in_x = None if x.dim() == 4 else 0        # a shared input: one wide convolution
                return vmap(lambda p, b, xk: one(p, b, xk, None),
                            in_dims=(0, 0, in_x))(self.params, self.buffers, x)
            return vmap(one)(self.params, self.buffers, x, weights)
        finally:
            _CTX.weights, _CTX.means, _CTX.vars, _CTX.batch_stats = None, {}, {}, False

    @torch.no_grad()
    def _update_running(self, means: dict, variances: dict) -> None:
        """BN's running-statistics rule on the stacked buffers (vmap path)."""
        for name, mom in self.bn.items():
            if name not in means:
                continue
            rm = self.buffers[f"{name}.running_mean"]
            rv = self.buffers[f"{name}.running_var"]
            if mom is None:                                                  # cumulative average
                nbt = self.buffers[f"{name}.num_batches_tracked"]
                f = 1.0 / (nbt.view(-1, 1).to(rm.dtype) + 1)
            else:
                f = torch.full((rm.shape[0], 1), float(mom), dtype=rm.dtype, device=rm.device)
            rm.mul_(1 - f).add_(f * means[name].to(rm.dtype))
            rv.mul_(1 - f).add_(f * variances[name].to(rv.dtype))

    @torch.no_grad()
    def logits(self, x: torch.Tensor, *, batch_size: int = 1024) -> torch.Tensor:
        """Eval-mode (running statistics) float32 logits of every model on the same ``x``
        (N, C, H, W): (K, N, classes)."""
        outs = [self.forward(x[i:i + batch_size]).float() for i in range(0, x.shape[0], batch_size)]
        return torch.cat(outs, 1)

    @torch.no_grad()
    def logits_batch_stats(self, x: torch.Tensor, *, batch_size: int) -> torch.Tensor:
        """Train-mode float32 logits, BN normalising with each batch's own statistics, on
        per-model inputs ``x`` (K, N, C, H, W) taken in batches of ``batch_size``: (K, N,
        classes). Running statistics are left untouched."""
        outs = [self.forward(x[:, i:i + batch_size], batch_stats=True).float()
                for i in range(0, x.shape[1], batch_size)]
        return torch.cat(outs, 1)

    def state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Model k's parameters and buffers, detached copies, named as in the original model."""
        return {name: t[k].detach().clone() for name, t in {**self.params, **self.buffers}.items()}

    def module(self, k: int) -> nn.Module:
        """Model k as an ordinary ``nn.Module`` (its original layer classes), in eval mode."""
        model = copy.deepcopy(self.prototype)
        model.load_state_dict(self.state_dict(k))
        return model.eval()


def stack_models(models: Sequence[nn.Module], device: str | torch.device | None = None, *,
                 path: str = "auto") -> StackedModels:
    """Stack ``models`` (one architecture, each with its own weights) into a
    :class:`StackedModels` on ``device`` (default: the first model's). ``path``: ``"grouped"``
    (plain stacks of layers: LeNet, MLP), ``"vmap"`` (any model) or ``"auto"`` (grouped where
    it applies)."""
    check_choice("path", path, PATHS)
    if not models:
        raise ValueError("need at least one model to stack")
    first = models[0]
    dev = torch.device(device) if device is not None else next(first.parameters()).device
    names = [n for n, _ in first.named_parameters()]
    for i, m in enumerate(models[1:], 1):
        if type(m) is not type(first) or [n for n, _ in m.named_parameters()] != names:
            raise ValueError(f"model {i} has another architecture than model 0")
    params, buffers = stack_module_state([m.to(dev) for m in models])       # name -> (K, ...)
    buffers = {n: t.detach().clone() for n, t in buffers.items()}
    prototype = copy.deepcopy(first).to(dev)
    bn = {n: m.momentum for n, m in prototype.named_modules()
          if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    layers = _layer_plan(prototype) if path != "vmap" else None
    if path == "grouped" and layers is None:
        raise ValueError(f"{type(first).__name__} is not a plain stack of layers; use path='vmap'")
    if layers is not None:
        return StackedModels(prototype, params, buffers, "grouped", layers=layers, bn=bn)
    template = copy.deepcopy(first).to(dev)
    _swap_layers(template)
    return StackedModels(prototype, params, buffers, "vmap", template=template, bn=bn)


# ----------------------------------------------------------------------------------------------
# The optimizer, on stacked tensors (torch.optim's update rules)
# ----------------------------------------------------------------------------------------------
class _StackedOptimizer:
    """SGD with momentum or Adam, weight decay on every parameter, a learning rate per model, and
    updates only where a model is active. The arithmetic of ``torch.optim.SGD`` (no dampening,
    no Nesterov) and ``torch.optim.Adam`` (betas 0.9/0.999, eps 1e-8, L2 weight decay added to
    the gradient), so a model follows its sequential twin to rounding. It is the same whether or
    not every model is active (inactive ones are masked at the end), so a model's numbers do not
    depend on which models of its chunk are active.

    All parameters live in one (K, P) tensor, ``flat``: on creation every ``stacked.params[name]``
    is replaced by a (K, *shape) leaf view of it, so that an update is a dozen operations on one
    tensor instead of a dozen per parameter (the per-parameter loop of ``torch._foreach_*`` on a
    CPU). The gradients are gathered into one (K, P) tensor per step.
    """

    def __init__(self, stacked: StackedModels, config: TrainConfig):
        self.config = config
        k = stacked.n_models
        names = list(stacked.params)
        with torch.no_grad():
            self.flat = torch.cat([stacked.params[n].detach().reshape(k, -1) for n in names], 1)
        sizes = [stacked.params[n][0].numel() for n in names]
        for n, part in zip(names, self.flat.split(sizes, 1), strict=True):   # (K, size) views
            old = stacked.params[n]
            stacked.params[n] = part.view(old.shape).detach().requires_grad_(old.requires_grad)
        self.params = [stacked.params[n] for n in names]
        self.m = torch.zeros_like(self.flat)             # momentum / Adam's first moment
        if config.optimizer == "adam":
            self.v = torch.zeros_like(self.flat)
        self.steps = np.zeros(k, dtype=np.int64)        # updates taken, per model

    def epoch_tables(self, lr: np.ndarray, active: np.ndarray) -> dict[str, torch.Tensor]:
        """One epoch's per-step, per-model factors, computed on the host in float64 (as
        torch.optim does with Python floats) and sent to the device once, so that a step needs
        no host-to-device copy (which would wait for the device): ``lr`` (S, K) and, for Adam,
        ``step`` (lr over bias correction 1) and ``bc2`` (square root of bias correction 2).
        ``active`` (S, K): which models take each step; their step counts advance here."""
        dev, dtype = self.flat.device, self.flat.dtype
        out = {"lr": torch.as_tensor(lr, dtype=dtype).to(dev)}
        t = self.steps + np.cumsum(active, axis=0)                         # (S, K) after step s
        self.steps = t[-1].copy()
        if self.config.optimizer == "adam":
            t = np.maximum(t, 1).astype(np.float64)
            out["step"] = torch.as_tensor(lr / (1 - 0.9**t), dtype=dtype).to(dev)
            out["bc2"] = torch.as_tensor(np.sqrt(1 - 0.999**t), dtype=dtype).to(dev)
        return out

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, tables: dict[str, torch.Tensor], s: int, mask: torch.Tensor | None) -> None:
        """Step ``s`` of the epoch of ``tables``, for the models where ``mask`` (K,) is True
        (all when None)."""
        c, k = self.config, self.flat.shape[0]
        g = torch.cat([p.grad.reshape(k, -1) if p.grad is not None       # (K, P), zeros where
                       else p.new_zeros(k, p[0].numel()) for p in self.params], 1)  # no gradient
        if c.weight_decay:
            g.add_(self.flat, alpha=c.weight_decay)                          # g + wd p
        col = (-1, 1)                                                        # (K,) -> (K, 1)
        keep = None if mask is None else mask.view(col)
        if c.optimizer == "adam":
            b1, b2, eps = 0.9, 0.999, 1e-8
            m_new = torch.lerp(self.m, g, 1 - b1)                            # b1 m + (1-b1) g
            v_new = self.v * b2
            v_new.addcmul_(g, g, value=1 - b2)                               # b2 v + (1-b2) g^2
            denom = v_new.sqrt().div_(tables["bc2"][s].view(col)).add_(eps)
            update = (m_new / denom).mul_(tables["step"][s].view(col))      # step size
            self.m = m_new if keep is None else torch.where(keep, m_new, self.m)
            self.v = v_new if keep is None else torch.where(keep, v_new, self.v)
        else:
            buf = g
            if c.momentum:
                buf = self.m * c.momentum + g                                # mom buf + g
                self.m = buf if keep is None else torch.where(keep, buf, self.m)
            update = buf * tables["lr"][s].view(col)
        if keep is not None:
            update = torch.where(keep, update, 0.0)
        self.flat.sub_(update)

    def finish(self) -> None:
        """Training is over: the parameters stop requiring gradients."""
        for p in self.params:
            p.grad = None
            p.requires_grad_(False)


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------
def vectorizable(config: TrainConfig | None = None, *, regularizer=None,
                 arch: str | None = None) -> str | None:
    """``None`` when :func:`train_models` can train this configuration, else the reason it
    cannot (the sequential trainer then applies): a regularizer other than the gamma/sigma
    penalty, or the penalty on an architecture of the vmap path (``arch`` not in
    :data:`bnmem_utils.config.SMALL_ARCHS`)."""
    if regularizer is not None:
        if not isinstance(regularizer, GammaSigmaPenalty):
            return f"{type(regularizer).__name__} is not the gamma/sigma penalty (use train.train_model)"
        if arch is not None and arch not in SMALL_ARCHS:
            return f"the gamma/sigma penalty needs the grouped path, which {arch} does not take"
    if config is not None:
        config.validate()
    return None


def _epoch_batches(n_k, bs_k, steps_k, n_steps, width, gens, idx_list, pad, use_flip):
    """One epoch's batches of every model, drawn as train_model draws them: (K, S, B) pool
    indices, 0/1 weights, shift offsets (K, S, B, 2) and flips, on the CPU."""
    k_models = len(n_k)
    gidx = torch.zeros(k_models, n_steps, width, dtype=torch.long)
    wts = torch.zeros(k_models, n_steps, width)
    offs = torch.zeros(k_models, n_steps, width, 2, dtype=torch.long)
    flp = torch.zeros(k_models, n_steps, width, dtype=torch.bool)
    col = torch.arange(width).view(1, -1)                                    # (1, B)
    step = torch.arange(n_steps).view(-1, 1)                                 # (S, 1)
    for k in range(k_models):
        n, bs, st = int(n_k[k]), int(bs_k[k]), int(steps_k[k])
        perm = torch.randperm(n, generator=gens[k])                          # (n,), then
        o = torch.randint(0, 2 * pad + 1, (n, 2), generator=gens[k]) if pad else None
        f = (torch.rand(n, generator=gens[k]) < 0.5) if use_flip else None   # as train_model
        pos = step * bs + col                                                # (S, B)
        valid = (col < bs) & (pos < n) & (step < st)
        # steps past this model's own: a dummy copy of its first batch, weight 1 so that batch
        # norm stays finite (the loss is multiplied by zero, the update discarded)
        dummy = (step >= st) & (col < bs)
        pos = torch.where(step >= st, col % bs, torch.where(valid, pos, 0))
        rows = perm[pos]                                                     # (S, B)
        gidx[k] = idx_list[k][rows]
        wts[k] = (valid | dummy).float()
        if o is not None:
            offs[k] = o[rows]
        if f is not None:
            flp[k] = f[rows]
    return gidx, wts, offs, flp


def _loss_acc(stacked: StackedModels, x: torch.Tensor, y: torch.Tensor,
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

    Model by model the same as :func:`bnmem_utils.train.train_model` with ``config``, ``seed``,
    ``fill``, ``test``, ``hooks`` and ``regularizer``, up to floating-point summation order (see
    the module docstring). ``x`` (N, C, H, W) and ``y`` (N,) are the shared pool; ``subsets[k]``
    holds indices into it (or a boolean mask over it). ``groups``: ``{name: bool mask (N,) over
    the pool}``, measured on each model's own training samples in the group. Hooks see model k
    as an ordinary module (:meth:`StackedModels.module`), once per model and epoch. The
    ``regularizer`` can only be the gamma/sigma penalty
    (:class:`bnmem_utils.penalty.GammaSigmaPenalty`, grouped path only), from each model's own
    batch's sigma_B (:func:`vectorizable` says why a configuration cannot be vectorised). A
    model whose loss becomes non-finite stops there with ``diverged`` set while the others go
    on. ``path``: see :func:`stack_models`. ``on_epoch(e)`` is called after each epoch with the
    number of epochs done (a progress bar's hook).

    The models passed in are left as they were: the trained ones are in the returned
    :class:`StackedModels` (``.module(k)`` is model k), with one :class:`History` per model.
    """
    config = (config or TrainConfig()).validate()
    dev = torch.device(device) if device is not None else x.device
    x, y = x.to(dev), y.to(dev)
    n_pool = int(x.shape[0])
    k_models = len(models)
    if k_models == 0:
        raise ValueError("need at least one model to train")
    if len(subsets) != k_models or len(seeds) != k_models:
        raise ValueError(f"need one subset and one seed per model: {k_models} models, "
                         f"{len(subsets)} subsets, {len(seeds)} seeds")
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
    stacked = stack_models(models, dev, path=path)
    reason = vectorizable(config, regularizer=regularizer)
    if reason:
        raise ValueError(reason)
    use_reg = regularizer is not None and regularizer.lam != 0.0
    if regularizer is not None and not stacked.bn:
        raise ValueError(f"{type(models[0]).__name__} has no BatchNorm layer; the gamma/sigma "
                         "penalty applies to BN models only (norm='bn')")
    if use_reg and stacked.path != "grouped":
        raise ValueError("the gamma/sigma penalty needs the grouped path; "
                         f"{type(models[0]).__name__} runs on the vmap path (use train.train_model)")
    n_k = np.array([int(s.numel()) for s in idx_list])
    bs_k, steps_k = np.array([_batch_plan(int(n), config.batch_size) for n in n_k]).T
    n_steps, width = int(steps_k.max()), int(bs_k.max())             # S steps, B samples each
    total_k = steps_k * config.epochs

    pad, use_flip = _augmentation(config, x)
    # each model pads its shifts as train_model does: with ``fill``, or the channel minimum of
    # its own subset
    if fill is not None:
        pad_value = shift_fill(x, fill).flatten().expand(k_models, -1)               # (K, C)
    else:
        pad_value = torch.stack([shift_fill(x[s.to(dev)]).flatten() for s in idx_list])
    pad_value = pad_value.reshape(k_models, 1, -1, 1, 1)                            # (K, 1, C, 1, 1)
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    test_xy = None if test is None else (test[0].to(dev), test[1].to(dev))
    masks = _as_masks(groups, n_pool, dev)                                  # name -> (N,) bool
    hooks = list(hooks)

    opt = _StackedOptimizer(stacked, config)
    histories = [History() for _ in range(k_models)]
    live = np.ones(k_models, dtype=bool)                                   # not diverged
    start = time.perf_counter()
    epochs = _epoch_range(config.epochs, progress, f"train {k_models} models")

    for epoch in epochs:
        gidx, wts, offs, flp = _epoch_batches(n_k, bs_k, steps_k, n_steps, width, gens, idx_list,
                                              pad, use_flip)
        # steps where every model has the same number of samples, in the leading columns (all
        # steps when the subsets have equal sizes): cut the padding off and skip the weights
        counts = wts.sum(2).long()                                           # (K, S)
        cols, full = [width] * n_steps, [False] * n_steps
        for s_ in range(n_steps):
            c = int(counts[0, s_])
            if bool((counts[:, s_] == c).all()) and bool(wts[:, s_, :c].all()):
                cols[s_], full[s_] = c, True
        gidx, wts, offs, flp = gidx.to(dev), wts.to(dev), offs.to(dev), flp.to(dev)
        step_losses = torch.zeros(k_models, n_steps, device=dev)
        step_regs = torch.zeros(k_models, n_steps, device=dev)                     # penalty
        step_sizes = torch.zeros(k_models, n_steps, device=dev)
        # the epoch's schedule, per step and model, sent to the device once
        act_tab = (np.arange(n_steps)[:, None] < steps_k[None, :]) & live[None, :]   # (S, K)
        lr_tab = np.array([[_lr_at(config, epoch * int(steps_k[k]) + s_, int(total_k[k]), epoch)
                            if s_ < steps_k[k] else 0.0 for k in range(k_models)]
                           for s_ in range(n_steps)])                             # (S, K)
        lr_first = lr_tab[0]
        tables = opt.epoch_tables(lr_tab, act_tab)
        act_dev = torch.as_tensor(act_tab).to(dev)                           # (S, K)
        for step in range(n_steps):
            all_active = bool(act_tab[step].all())
            act = act_dev[step]                                              # (K,)
            c = cols[step]
            idx = gidx[:, step, :c]                                          # (K, B)
            w = wts[:, step, :c]                                             # (K, B)
            xb = x[idx]                                                      # (K, B, C, H, W)
            if pad or use_flip:
                xb = shift_flip(xb.flatten(0, 1), offs[:, step, :c].flatten(0, 1) if pad else None,
                                flp[:, step, :c].flatten(0, 1) if use_flip else None, pad,
                                pad_value.expand(-1, c, -1, -1, -1).reshape(k_models * c, -1, 1, 1)
                                ).view(xb.shape)
            sigmas = [] if use_reg else None
            with _autocast(dev, config.amp):
                out = stacked.forward(xb, batch_stats=True, weights=None if full[step] else w,
                                      update_stats=True, active=None if all_active else act,
                                      sigmas=sigmas)                          # (K, B, classes)
            ce = F.cross_entropy(out.float().flatten(0, 1), y[idx].flatten(), reduction="none")
            loss = (ce.view(k_models, c) * w).sum(1) / w.sum(1)              # (K,) batch means
            total = loss
            if use_reg:
                reg = regularizer.per_model([stacked.params.get(f"{n}.weight") for n, _ in sigmas],
                                            [sg for _, sg in sigmas])      # (K,)
                total = loss + reg
                step_regs[:, step] = torch.where(act, reg.detach(), 0.0)
            opt.zero_grad()
            (total if all_active else total * act).sum().backward()
            opt.step(tables, step, None if all_active else act)
            step_losses[:, step] = torch.where(act, loss.detach(), 0.0)
            step_sizes[:, step] = torch.where(act, w.sum(1), 0.0)

        finite = (torch.isfinite(step_losses) & torch.isfinite(step_regs)).all(1).cpu().numpy()
        reg_mean = (step_regs.sum(1) / torch.as_tensor(steps_k, dtype=step_regs.dtype,
                                                        device=dev)).cpu()  # (K,) own steps
        epoch_loss = ((step_losses * step_sizes).sum(1) / step_sizes.sum(1).clamp_min(1)).cpu()
        # (some model is live here: training stops once none is)
        if test_xy is not None:
            test_loss, test_acc = _loss_acc(stacked, *test_xy, config.eval_batch_size)
        if masks:
            # every model on the whole pool at once, then each model's own samples
            with torch.no_grad(), _autocast(dev, config.amp):
                logits = stacked.logits(x, batch_size=config.eval_batch_size)   # (K, N, cls)
            pool_loss = F.cross_entropy(logits.flatten(0, 1), y.repeat(k_models),
                                        reduction="none").view(k_models, n_pool)  # (K, N)
            pool_correct = logits.argmax(-1) == y.view(1, -1)                    # (K, N)
        for k in range(k_models):
            if not live[k]:
                continue
            row: dict = {"epoch": epoch + 1, "lr": float(lr_first[k])}
            if not finite[k]:
                histories[k].stop_diverged(row, step_losses[k], step_regs[k], epoch,
                                           int(steps_k[k]), float(lr_first[k]), f"model {k}: ")
                live[k] = False
                continue
            row["train_loss"] = float(epoch_loss[k])
            if regularizer is not None:
                row["reg_loss"] = float(reg_mean[k])
            own = idx_list[k].to(dev) if masks else None
            for name, mask in masks.items():
                sel = own[mask[own]]
                _put_metrics(row, name, pool_loss[k, sel], pool_correct[k, sel])
            if test_xy is not None:
                row["test_acc"] = float(test_acc[k])
                row["test_loss"] = float(test_loss[k])
            if hooks:
                _run_hooks(hooks, epoch + 1, stacked.module(k), row)
            histories[k].rows.append(row)
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


# ----------------------------------------------------------------------------------------------
# The bank's trainer
# ----------------------------------------------------------------------------------------------
#: Models per vectorised block at most: on a CPU (measured: more gains little for LeNets, and
#: the wide networks are cheaper one after another there, see
#: :func:`bnmem_utils.config.bank_trainer`) and on a GPU.
CPU_CHUNK = {"small": 16, "wide": 4}
GPU_CHUNK_MAX = 64

#: Share of a GPU's total memory a vectorised block may plan to use (the rest: the pool, the
#: queries, the allocator's slack, cuDNN workspaces).
GPU_MEMORY_SHARE = 0.5


def per_model_bytes(config, image_shape: tuple[int, int, int], num_classes: int = 10) -> int:
    """An estimate of the memory one model of a vectorised block takes while it trains, in bytes:
    float32 parameters four times (weights, gradients, two optimizer moments) and the
    activations of one batch three times (the forward's outputs, kept for the backward, their
    gradients, and the layout copies and recomputed statistics of the vectorised layers),
    counted by running the model once on one sample of ``image_shape`` (C, H, W) on the CPU
    and summing every layer's output size."""
    from .models import build_model

    c, h, w = image_shape
    model = build_model(getattr(config, "arch", "lenet"), getattr(config, "norm", "bn"),
                        in_channels=c, num_classes=num_classes, image_size=h,
                        width=getattr(config, "width", 1))
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
    batch = int(getattr(config, "batch_size", 128))
    return 4 * (4 * n_params + 3 * counted[0] * batch)


def default_chunk(config, device: str | torch.device = "cpu",
                  image_shape: tuple[int, int, int] | None = None, num_classes: int = 10) -> int:
    """Bank members per vectorised run, a fixed block of model indices (see
    :func:`train_members_vectorized`).

    On a CPU: 16 LeNets or MLPs, 4 wider networks (:data:`CPU_CHUNK`). On a GPU: as many as
    :data:`GPU_MEMORY_SHARE` of the device's *total* memory holds by :func:`per_model_bytes`
    (the data set's ``image_shape`` (C, H, W); 3x32x32 when not given), rounded down to a power
    of two, between 1 and :data:`GPU_CHUNK_MAX`. Total, not free, memory: the block size must
    be the same every time a bank is built or resumed on a kind of device (the bank's models are
    grouped by it)."""
    from .device import resolve_device

    dev = resolve_device(device)
    small = getattr(config, "arch", "lenet") in SMALL_ARCHS
    if dev.type != "cuda":
        return CPU_CHUNK["small" if small else "wide"]
    total = torch.cuda.get_device_properties(dev).total_memory
    need = per_model_bytes(config, image_shape or (3, 32, 32), num_classes)
    fits = max(1, int(GPU_MEMORY_SHARE * total // max(1, need)))
    return int(min(GPU_CHUNK_MAX, 2 ** int(math.log2(fits))))


def train_members_vectorized(config, keep: np.ndarray, model_indices: Sequence[int], data, *,
                             seeds: np.ndarray, device: str | torch.device = "cpu",
                             progress: bool = False, block: int | None = None,
                             on_progress: Callable[[float], None] | None = None) -> dict[int, dict]:
    """Drop-in for :func:`bnmem_utils.bank.train_members`: train bank members in vectorised
    runs and query them, vectorised too; returns the same records for ``model_indices``.
    ``on_progress(fraction)`` is called after every epoch of every block with the fraction of
    this call's training done (:func:`bnmem_utils.bank.train_bank` moves its bar with it).

    Members are trained in fixed blocks of model indices (``block``, default
    :func:`default_chunk`): block b is models ``b*block .. (b+1)*block - 1``, always trained
    together, so a model's numbers never depend on which other models happened to be missing
    from the cache (a resumed bank is bit for bit the uninterrupted one). A block with any
    requested member is trained whole; only the requested records are returned.

    A record holds the eval-mode ``logits`` (M, Q, C) on the pool, ``pop_logits`` (P, Q, C),
    ``train_logits`` for BN (train-mode queries, each model visiting the pool in its own seeded
    order as :func:`bnmem_utils.bank.query_logits_train_mode` does), ``test_acc``/``test_loss``,
    the final ``train_loss``, ``epochs``, and ``seconds``: the block's wall time over its size.
    """
    from .device import resolve_device

    dev = resolve_device(device)
    wanted = sorted({int(i) for i in model_indices})
    if not wanted:
        return {}
    n_models = int(keep.shape[0])
    size = int(block or default_chunk(config, dev))
    out: dict[int, dict] = {}
    blocks = sorted({i // size for i in wanted})
    for j, b in enumerate(blocks):
        members = list(range(b * size, min((b + 1) * size, n_models)))
        tick = None
        if on_progress is not None:
            def tick(done: int, j: int = j) -> None:
                on_progress((j + done / max(1, int(config.epochs))) / len(blocks))
        records = _train_block(config, keep, members, data, seeds=seeds, device=dev,
                               progress=progress, on_epoch=tick)
        out.update({i: records[i] for i in members if i in wanted})
    return out


def _train_block(config, keep: np.ndarray, indices: list[int], data, *, seeds: np.ndarray,
                 device: torch.device, progress: bool,
                 on_epoch: Callable[[int], None] | None = None) -> dict[int, dict]:
    """Train and query the bank members ``indices`` in one vectorised run."""
    from .device import seed_everything
    from .models import build_model

    models = []
    for i in indices:
        seed_everything(int(seeds[i]))             # the sequential trainer's initialisation
        models.append(build_model(config.arch, config.norm, in_channels=int(data.x.shape[1]),
                                  num_classes=data.num_classes, image_size=int(data.x.shape[-1]),
                                  width=config.width))
    subsets = [torch.from_numpy(np.flatnonzero(keep[i])) for i in indices]
    start = time.perf_counter()
    stacked, histories = train_models(models, data.x, data.y, subsets, config=config.train,
                                      seeds=[int(seeds[i]) for i in indices], device=device,
                                      progress=progress, fill=data.fill,
                                      regularizer=from_spec(config.penalty), on_epoch=on_epoch)
    for i, h in zip(indices, histories, strict=True):
        if h.diverged:
            raise TrainingError(f"arm {config.arm}: model {i} (seed {int(seeds[i])}) diverged: "
                            f"{h.message or 'non-finite loss'}; lower the learning rate")
    k_models = len(indices)
    qb = config.query_batch_size
    fill = data.fill                              # the background the query shifts bring in
    logits, pop_logits = (torch.stack([stacked.logits(apply_query(d, q, fill), batch_size=qb).cpu()
                                       for q in config.queries], 2)         # (K, M or P, Q, C)
                          for d in (data.x, data.pop_x))
    test_loss, test_acc = _loss_acc(stacked, data.x_test, data.y_test, qb)
    train_logits = None
    if config.norm == "bn":
        m = data.n_samples
        bsz = safe_batch(m, config.train_query_batch)
        perms = torch.stack([torch.randperm(m, generator=torch.Generator().manual_seed(int(seeds[i])))
                             for i in indices])                             # (K, M)
        inv = torch.argsort(perms, dim=1)                                   # undoes each order
        per_query = []
        for q in config.queries:
            xq = apply_query(data.x, q, fill)[perms.to(data.x.device)]      # (K, M, C, H, W)
            o = stacked.logits_batch_stats(xq, batch_size=bsz).cpu()        # (K, M, classes)
            per_query.append(torch.gather(o, 1, inv.unsqueeze(-1).expand_as(o)))
        train_logits = torch.stack(per_query, 2)                             # (K, M, Q, C)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / k_models
    out: dict[int, dict] = {}
    for j, i in enumerate(indices):
        if not torch.isfinite(logits[j]).all():
            raise TrainingError(f"arm {config.arm}: model {i} (seed {int(seeds[i])}) gives "
                            f"non-finite logits")
        last = histories[j].last()
        out[i] = {"index": i, "seed": int(seeds[i]), "logits": logits[j].contiguous(),
                  "pop_logits": pop_logits[j].contiguous(),
                  "train_logits": None if train_logits is None else train_logits[j].contiguous(),
                  "test_acc": float(test_acc[j]), "test_loss": float(test_loss[j]),
                  "train_loss": float(last.get("train_loss", float("nan"))),
                  "epochs": int(len(histories[j].rows)), "seconds": float(seconds)}
    return out


def _members_per_call(config, device) -> int:
    from .data import NUM_CLASSES

    dataset = getattr(config, "dataset", None)
    return default_chunk(config, device, _DATASET_SHAPES.get(dataset), NUM_CLASSES.get(dataset, 10))


#: (C, H, W) of each data set's images, for :func:`default_chunk` before the data are loaded.
_DATASET_SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "fashion_mnist": (1, 28, 28),
                   "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}


#: read by bank.train_bank: call this trainer with aligned blocks of this many models
train_members_vectorized.members_per_call = _members_per_call
