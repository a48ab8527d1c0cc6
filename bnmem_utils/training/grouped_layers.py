"""The layers of K models at once, on the grouped layout of :mod:`bnmem_utils.training.stacked`.

Activations of K models are held as ``(B, K*C, H, W)``, every model's channels side by side, so
that the native kernels already treat the models separately (see :mod:`bnmem_utils.training.vectorised`).
Here: convolutions on small images as one dense matrix product per model
(:func:`dense_conv_matrix`, cheaper than a grouped convolution on 8x8 and 4x4 maps under 5x5
kernels), batch norm over the samples of weight 1 with its backward written out
(:func:`weighted_bn`), and the forward of a plain stack of layers (LeNet, the MLP) in that
layout (:func:`layer_plan`, :func:`grouped_forward`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["DENSE_CONV_MAX_AREA", "conv_out_size", "dense_applies", "dense_conv_matrix",
           "grouped_forward", "layer_plan", "weighted_bn"]

# ----------------------------------------------------------------------------------------------
# Convolutions on small images as dense matrix products
# ----------------------------------------------------------------------------------------------
#: A convolution on an image of at most this many times its kernel's area runs as a dense
#: matrix product (see :func:`dense_conv_matrix`).
DENSE_CONV_MAX_AREA = 4

_DENSE_INDEX: dict[tuple, torch.Tensor] = {}


def _out_size(h: int, w: int, k: Sequence[int], stride: Sequence[int],
              padding: Sequence[int]) -> tuple[int, int]:
    """(Ho, Wo) of a convolution with kernel ``k`` on an ``h`` x ``w`` image."""
    return ((h + 2 * padding[0] - k[0]) // stride[0] + 1,
            (w + 2 * padding[1] - k[1]) // stride[1] + 1)


def _dense_index(o: int, c: int, h: int, w: int, k: tuple[int, int], stride: tuple[int, int],
                 padding: tuple[int, int], channels_last: bool, device: torch.device
                 ) -> torch.Tensor:
    """Where each entry of the dense matrix of a convolution comes from (cached per shape): for
    every entry of the (C*h*w, O*Ho*Wo) matrix, the flat index (o, c, tap) of the kernel weight
    it holds, or O*C*kh*kw (a zero appended to the weights) where the tap links no input pixel
    to that output pixel."""
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
        gather = torch.full((c * h * w * n_cols,), n_weights, dtype=torch.long)
        gather[row * n_cols + col] = source
        _DENSE_INDEX[key] = gather.to(device)
    return _DENSE_INDEX[key]


def conv_out_size(conv, h: int, w: int) -> tuple[int, int]:
    return _out_size(h, w, conv.kernel_size, conv.stride, conv.padding)


def dense_applies(conv, h: int, w: int) -> bool:
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
    gather = _dense_index(o, c, h, w, (kh, kw), tuple(stride), tuple(padding), channels_last,
                          weight.device)
    flat = F.pad(weight.reshape(*weight.shape[:-4], -1), (0, 1))           # (..., OCT + 1)
    return flat.index_select(-1, gather).view(*weight.shape[:-4], c * h * w, o * ho * wo)


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


def weighted_bn(h: torch.Tensor, k: int, weights: torch.Tensor, gamma, beta, eps: float,
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
                  nn.ReLU, nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Identity)


def layer_plan(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The model as a flat list of (parameter prefix, layer) applied in order, when its forward
    is such a list: its class's own ``flat_layers`` method says so (LeNet and the MLP of
    :mod:`bnmem_utils.models.nets`; a subclass, which may change the forward, does not inherit it);
    None otherwise."""
    flat_layers = type(model).__dict__.get("flat_layers")
    if flat_layers is None:
        return None
    layers = flat_layers(model)
    if any(type(m) not in _GROUPED_TYPES for _, m in layers):
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
    ho, wo = conv_out_size(m, hh, ww)
    if not dense_applies(m, hh, ww):
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


def _grouped_linear(wt: torch.Tensor, bias: torch.Tensor | None, h: torch.Tensor, k: int,
                    shared: bool) -> torch.Tensor:
    """K models' linear layers, ``wt`` (K, O, F), on ``h`` (B, K*F), or (B, F) when ``shared``:
    (B, K*O)."""
    o, f = wt.shape[1], wt.shape[2]
    b = h.shape[0]
    if shared:
        return F.linear(h.reshape(b, f), wt.reshape(k * o, f),
                        None if bias is None else bias.reshape(-1))           # (B, K*O)
    hk = h.reshape(b, k, f).transpose(0, 1)                                    # (K, B, F)
    out = (torch.baddbmm(bias.unsqueeze(1), hk, wt.transpose(1, 2)) if bias is not None
           else torch.bmm(hk, wt.transpose(1, 2)))                             # (K, B, O)
    return out.transpose(0, 1).reshape(b, k * o)


def _grouped_bn(m: nn.Module, prefix: str, p: dict, buffers: dict, h: torch.Tensor, k: int, *,
                batch_stats: bool, update_stats: bool, weights: torch.Tensor | None,
                sigmas: list | None) -> torch.Tensor:
    """K models' batch norm layers on ``h`` (B, K*C, ...): see :func:`grouped_forward`."""
    gamma, beta = p.get("weight"), p.get("bias")
    rm, rv = buffers[f"{prefix}.running_mean"], buffers[f"{prefix}.running_var"]
    penalised = sigmas is not None and batch_stats
    g = None if gamma is None else gamma.reshape(-1)
    bt = None if beta is None else beta.reshape(-1)
    if not batch_stats:
        return F.batch_norm(h, rm.view(-1), rv.view(-1), g, bt, False, 0.0, m.eps)
    if weights is None and not penalised and (m.momentum is not None or not update_stats):
        return F.batch_norm(h, rm.view(-1) if update_stats else None,
                            rv.view(-1) if update_stats else None, g, bt, True,
                            m.momentum or 0.0, m.eps)
    w8 = weights if weights is not None else h.new_ones(k, h.shape[0])
    factor = None
    if update_stats:
        nbt = buffers[f"{prefix}.num_batches_tracked"]
        factor = (torch.full((k, 1), float(m.momentum), device=h.device)
                  if m.momentum is not None
                  else 1.0 / (nbt.view(k, 1).float() + 1))
    sigma = [] if penalised else None
    h = weighted_bn(h, k, w8, gamma, beta, m.eps, (rm, rv) if update_stats else None, factor,
                    sigma)
    if penalised:
        sigmas.append((prefix, sigma[0]))
    return h


def grouped_forward(layers: Sequence[tuple[str, nn.Module]], params: dict, buffers: dict,  # noqa: C901, PLR0912 (one branch per layer type)
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
            h, shared = _grouped_linear(p["weight"], p.get("bias"), h, k, shared), False
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            h = _grouped_bn(m, prefix, p, buffers, h, k, batch_stats=batch_stats,
                            update_stats=update_stats, weights=weights, sigmas=sigmas)
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
        elif isinstance(m, nn.AdaptiveAvgPool2d):
            size = m.output_size if isinstance(m.output_size, tuple) else (m.output_size,) * 2
            if tuple(h.shape[-2:]) != size:          # the identity otherwise (LeNet skips it)
                h = F.adaptive_avg_pool2d(h, m.output_size)
        elif isinstance(m, nn.Flatten):
            h = h.flatten(1)
    return h.reshape(h.shape[0], k, -1).transpose(0, 1)          # (K, B, classes)
