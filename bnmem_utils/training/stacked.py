"""K models of one architecture as stacked tensors, their forward and their optimizer.

:class:`StackedModels` holds every parameter and buffer of K models with a new leading
dimension (``torch.func.stack_module_state``) and runs all of them in one forward, on one of two
paths (:func:`stack_models` picks one): ``"grouped"`` for the plain stacks of layers (LeNet, the
MLP; the layers of :mod:`bnmem_utils.training.grouped_layers`), ``"vmap"`` for everything else (ResNets,
DenseNet: ``torch.func.vmap`` over ``torch.func.functional_call``, with each BN layer swapped for
:class:`_WeightedBatchNorm`). :class:`StackedOptimizer` updates the stacked tensors with the
arithmetic of ``torch.optim.SGD`` and ``torch.optim.Adam``. :mod:`bnmem_utils.training.vectorised` trains
with them.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

from bnmem_utils.core.checks import check_choice
from bnmem_utils.training.grouped_layers import (
    conv_out_size,
    dense_applies,
    dense_conv_matrix,
    grouped_forward,
    layer_plan,
)

if TYPE_CHECKING:
    from bnmem_utils.training.steps import TrainConfig

__all__ = ["PATHS", "StackedModels", "StackedOptimizer", "stack_models"]

PATHS = ("auto", "grouped", "vmap")


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
        if not dense_applies(m, h, w):
            return F.conv2d(x, self.weight, self.bias, m.stride, m.padding, m.dilation, m.groups)
        ho, wo = conv_out_size(m, h, w)
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
        if self.path == "grouped":
            buffers = self.buffers
            if masked:
                # the batch-norm kernel updates the running statistics in place and autograd
                # keeps them for the backward: update copies, then keep the active models' part
                buffers = {**self.buffers, **{n: t.clone() for n, t in self._bn_buffers().items()}}
            out = grouped_forward(self.layers, self.params, buffers, x, k,
                                   batch_stats=batch_stats, update_stats=update, weights=weights,
                                   sigmas=sigmas)
            if masked:
                self._keep_active(buffers, active)
        else:
            if sigmas is not None:
                raise ValueError("batch sigmas (the gamma/sigma penalty) need the grouped path; "
                                 f"{type(self.prototype).__name__} runs on the vmap path")
            out, means, variances = self._vmap_forward(x, batch_stats, weights)
            if update:
                self._update_running(means, variances, active)
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
    def _update_running(self, means: dict, variances: dict, active: torch.Tensor | None) -> None:
        """BN's running-statistics rule on the stacked buffers (vmap path), for the models where
        ``active`` (K,) is True (all when None)."""
        for name, mom in self.bn.items():
            if name not in means:
                continue
            rm = self.buffers[f"{name}.running_mean"]
            if mom is None:                                                  # cumulative average
                nbt = self.buffers[f"{name}.num_batches_tracked"]
                f = 1.0 / (nbt.view(-1, 1).to(rm.dtype) + 1)
            else:
                f = torch.full((rm.shape[0], 1), float(mom), dtype=rm.dtype, device=rm.device)
            for kind, batch in (("running_mean", means), ("running_var", variances)):
                t = self.buffers[f"{name}.{kind}"]
                new = t * (1 - f) + f * batch[name].to(t.dtype)
                t.copy_(new if active is None else torch.where(active.view(-1, 1), new, t))

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
    layers = layer_plan(prototype) if path != "vmap" else None
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
class StackedOptimizer:
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
