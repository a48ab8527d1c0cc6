"""Per-sample gradient L2 norms under explicit definitions (notebook 03, paper item 2).

In a network with BatchNorm (BN), "the gradient of one sample" has two meanings, and every
figure must say which one it shows (docs/paper.md, "Definitions"):

``"eval"``  **eval mode, running statistics.** BN normalises with its running mean and variance,
    so the samples are independent: the per-sample gradient is ``grad_theta l(f(x_i), y_i)``,
    computed for all samples at once with ``torch.func.vmap(grad(...))`` over
    ``functional_call``.
``"train"`` **train mode, batch statistics.** BN normalises with the statistics of the batch the
    sample sits in, so the samples of a batch are coupled. The per-sample gradient is the
    gradient of sample i's own loss ``l_i`` with the whole batch's statistics (gradient flowing
    through the batch mean and variance too), i.e. row i of the Jacobian of the per-sample loss
    vector ``L(theta) in R^B``. It is computed as one forward on the batch and a ``vmap`` of its
    ``vjp`` over one-hot cotangents, in chunks of rows. Plain ``vmap(grad)`` over a train-mode BN
    model would normalise each sample by itself (a different network) and is never used.

Without BN the two definitions coincide (:func:`which_definitions`; a test checks it). Only
the BN layers switch to train mode under ``"train"``: other modules (dropout) stay in eval mode so
the definition is deterministic. Neither definition changes the model: its modes are restored
and, under ``"train"``, the running statistics are updated only on throw-away copies.

Gradients are computed in the model's dtype (float32), each parameter's per-sample norm is one
fused reduction in that dtype, and the squares are summed over parameters in float64; the returned
norms are float64 CPU tensors. :func:`naive_grad_norms` is the slow reference (one
backward per sample) that the tests and the benchmark compare against.

Cost. ``"eval"`` is one vectorised forward and backward per chunk of samples (on LeNet, 5-19x
the naive loop and 2-6x Opacus on one CPU core; ``benchmarks/bench_grads.py``). ``"train"`` is
inherently one whole-batch backward per measured sample, since every Jacobian row couples the
batch; vectorising the rows pays on a GPU, while on a CPU it runs at about the naive loop's
speed. ``index`` therefore measures a subset of samples whose BN batches still come from the
whole training set.

Notebook 03's runs, which measure these norms while training, are in :mod:`bnmem_utils.jobs.gradnorms`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vjp, vmap

from bnmem_utils.core.checks import check_choice
from bnmem_utils.models.gamma_sigma import bn_layers, frozen_bn_stats

#: Per-sample gradient definitions (:mod:`bnmem_utils.jobs.gradnorms`): eval mode (running BN statistics,
#: samples independent) and train mode (batch statistics, the gradient of l_i with its batch).
DEFINITIONS = ("eval", "train")

DEFINITION_LABELS = {
    "eval": "eval mode (running BN statistics, samples independent)",
    "train": "train mode (batch BN statistics, grad of l_i with its batch)",
}
# Bytes of per-sample gradients held at once when the chunk size is automatic (CPU; on CUDA an
# eighth of the free memory). 32 MiB keeps a chunk in cache: on LeNet (2-core CPU) it picks
# 128 samples at 28x28 and about 390 at 8x8, the fastest chunk sizes measured there.
MEMORY_BUDGET = 2**25
# "train": a chunk of c Jacobian rows backpropagates c copies of the whole batch; keep
# c * batch * input elements per sample under this (CPU; scaled up with the CUDA budget).
# Measured on LeNet (8x8 and 28x28, 2-core CPU): larger chunks only thrash the caches.
ROWS_BUDGET = 2**18

LossFn = Callable[[Tensor, Tensor], Tensor]


def cross_entropy_per_sample(logits: Tensor, y: Tensor) -> Tensor:
    """Per-sample cross-entropy ``(B,)`` from logits ``(B, C)`` and labels ``(B,)``, in float32."""
    return F.cross_entropy(logits.float(), y, reduction="none")


# --- which definitions a model has --------------------------------------------------------------

def which_definitions(model: nn.Module) -> tuple[str, ...]:
    """The distinct definitions worth computing: ``("eval", "train")`` with BN (the layers that
    couple a batch in train mode), else ``("eval",)``: without BN the two coincide."""
    return DEFINITIONS if bn_layers(model) else ("eval",)


def definition_label(definition: str) -> str:
    """Short text naming a definition, for figure titles and legends."""
    check_choice("definition", definition, DEFINITIONS)
    return DEFINITION_LABELS[definition]


# --- the result ---------------------------------------------------------------------------------

@dataclass
class GradNorms:
    """Per-sample gradient L2 norms of ``n`` samples under one definition (float64, on the CPU).

    ``total[i]`` is the norm over all trainable parameters; ``layers[name][i]`` the norm over the
    parameters of module ``name`` (weight and bias together), so
    ``total**2 == sum(layer**2 for layer in layers.values())``.
    """

    total: Tensor  # (n,) float64
    layers: dict[str, Tensor] = field(default_factory=dict)  # module name -> (n,) float64


# --- helpers ------------------------------------------------------------------------------------

def _layer_of(param_name: str) -> str:
    return param_name.rsplit(".", 1)[0] if "." in param_name else param_name


@contextmanager
def _modes(model: nn.Module, definition: str) -> Iterator[None]:
    """Put BN layers in train mode for ``"train"`` (everything else in eval); restore on exit."""
    saved = {m: m.training for m in model.modules()}
    try:
        model.eval()
        if definition == "train":
            for _, m in bn_layers(model):
                m.train()
        yield
    finally:
        for m, flag in saved.items():
            m.training = flag


def _check_eval_ok(model: nn.Module) -> None:
    for name, m in bn_layers(model):
        if not m.track_running_stats or m.running_mean is None:
            raise ValueError(f"BN layer {name!r} keeps no running statistics, so it normalises with "
                             "batch statistics even in eval mode; the 'eval' definition does not "
                             "exist for it: use definition='train'")


def sample_index(index: Tensor | Sequence[int] | None, n: int) -> Tensor:
    """The measured samples as an int64 CPU tensor of distinct positions in 0..n-1."""
    if index is None:
        return torch.arange(n)
    idx = torch.as_tensor(index).cpu()
    if idx.dtype == torch.bool:
        if idx.shape != (n,):
            raise ValueError(f"a boolean index must have shape ({n},), got {tuple(idx.shape)}")
        idx = idx.nonzero().flatten()
    idx = idx.long().flatten()
    if idx.numel() == 0:
        raise ValueError("index selects no sample")
    if int(idx.min()) < 0 or int(idx.max()) >= n or idx.unique().numel() != idx.numel():
        raise ValueError(f"index must hold distinct positions in 0..{n - 1}")
    return idx


def _setup(model: nn.Module, x: Tensor, y: Tensor, definition: str,
           index: Tensor | Sequence[int] | None) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """The checks both implementations share. Returns the trainable parameters (detached), the
    measured positions ``idx`` and ``pos``: each sample's place in the result (-1: not measured)."""
    check_choice("definition", definition, DEFINITIONS)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]}")
    if x.shape[0] == 0:
        raise ValueError("no samples given")
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    if not params:
        raise ValueError("the model has no trainable parameters: there is no gradient to measure")
    idx = sample_index(index, x.shape[0])
    pos = torch.full((x.shape[0],), -1, dtype=torch.long)
    pos[idx] = torch.arange(idx.numel())
    return params, idx, pos


def _budget(device: torch.device | None) -> int:
    budget = MEMORY_BUDGET
    if device is not None and device.type == "cuda":
        budget = max(budget, torch.cuda.mem_get_info(device)[0] // 8)
    return budget


def _auto_chunk(n_params: int, n: int, chunk_size: int | None,
                device: torch.device | None = None) -> int:
    """Samples (or Jacobian rows) per vectorised call: ``chunk_size``, or as many per-sample
    gradients as fit in ``MEMORY_BUDGET`` bytes (on CUDA: an eighth of the free memory)."""
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return min(chunk_size, n)
    return max(1, min(n, _budget(device) // max(1, 4 * n_params)))


def _auto_rows(chunk: int, chunk_size: int | None, batch: int, sample_numel: int,
               device: torch.device | None) -> int:
    """Jacobian rows per vectorised call of the "train" definition (see ``ROWS_BUDGET``)."""
    if chunk_size is not None:
        return chunk
    scale = _budget(device) / MEMORY_BUDGET
    return max(1, min(chunk, int(ROWS_BUDGET * scale) // max(1, batch * sample_numel)))


class _Accumulator:
    """Squared norms per layer, filled chunk by chunk."""

    def __init__(self, names: Iterable[str], n: int):
        self.layers = {_layer_of(name): torch.zeros(n, dtype=torch.float64) for name in names}

    def add(self, index: Tensor | slice, grads: dict[str, Tensor]) -> None:
        for name, g in grads.items():  # g: (c, *param_shape)
            # One fused reduction in the gradient's dtype (a float64 copy of every per-sample
            # gradient would cost more than computing it); squares summed in float64.
            nrm = torch.linalg.vector_norm(g.detach().reshape(g.shape[0], -1), dim=1)  # (c,)
            self.layers[_layer_of(name)][index] += nrm.double().square().cpu()

    def result(self) -> GradNorms:
        total = torch.stack(list(self.layers.values())).sum(0).sqrt()  # (n,)
        layers = {k: v.sqrt() for k, v in self.layers.items()}
        return GradNorms(total, layers)


def _measured_batches(pos: Tensor, batch_size: int | None,
                      shuffle_seed: int | None) -> Iterator[tuple[Tensor, Tensor]]:
    """The BN batches (index sets, as even as possible: sizes differ by at most one) that hold a
    measured sample, each with the rows of its measured samples (positions in the batch)."""
    n = pos.numel()
    order = torch.arange(n)
    if shuffle_seed is not None:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(shuffle_seed))
    size = n if batch_size is None else batch_size
    if size < 2:
        raise ValueError(f"the 'train' definition needs batches of at least 2 samples, got {size}")
    for batch in torch.tensor_split(order, math.ceil(n / size)):
        rows = (pos[batch] >= 0).nonzero().flatten()
        if rows.numel():
            yield batch, rows


# --- the fast implementation --------------------------------------------------------------------

def per_sample_grad_norms(model: nn.Module, x: Tensor, y: Tensor, *, definition: str = "eval",
                          index: Tensor | Sequence[int] | None = None,
                          batch_size: int | None = None, shuffle_seed: int | None = None,
                          chunk_size: int | None = None,
                          loss_fn: LossFn = cross_entropy_per_sample) -> GradNorms:
    """Per-sample gradient L2 norms of ``loss_fn`` w.r.t. all trainable parameters, and per layer.

    x: (n, ...) inputs; y: (n,) labels (both moved to the model's device).
    definition: ``"eval"`` (running statistics, ``vmap(grad)``) or ``"train"`` (row i of the
        Jacobian of the batch's per-sample losses; see the module docstring).
    index: the samples to measure (positions or a boolean mask; all when None); the result
        follows its order. Under ``"train"`` every sample of x still fills the BN batches, so
        measuring a few samples costs a few Jacobian rows while their batches stay realistic.
    batch_size: ``"train"`` only: x is cut into batches of about this size (the BN batch; all of x
        when None); ``shuffle_seed`` shuffles samples into batches first. Match the training
        batch size to measure what training sees.
    chunk_size: samples (eval) or Jacobian rows (train) per vectorised call; automatic when None:
        about ``MEMORY_BUDGET`` bytes of per-sample gradients at once, and under "train" at most
        ``ROWS_BUDGET`` input elements times the batch per call.
    loss_fn: ``(logits (B, C), y (B,)) -> (B,)`` per-sample losses; cross-entropy by default.

    Returns float64 CPU norms, ``(m,)`` for the m measured samples.
    """
    params, idx, pos = _setup(model, x, y, definition, index)
    device = next(iter(params.values())).device
    m = idx.numel()
    acc = _Accumulator(params, m)
    chunk = _auto_chunk(sum(p.numel() for p in params.values()), m, chunk_size, device)
    with _modes(model, definition), torch.enable_grad():
        if definition == "eval":
            _check_eval_ok(model)
            xs, ys = x[idx.to(x.device)].to(device), y[idx.to(y.device)].to(device)  # (m, ...), (m,)
            buffers = {k: v.detach() for k, v in model.named_buffers()}

            def loss_one(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
                out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))  # (1, C)
                return loss_fn(out, yi.unsqueeze(0)).sum()

            per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))
            for start in range(0, m, chunk):
                sl = slice(start, min(m, start + chunk))
                acc.add(sl, per_sample(params, xs[sl], ys[sl]))  # {name: (c, *shape)}
            return acc.result()

        x, y = x.to(device), y.to(device)
        for batch, rows in _measured_batches(pos, batch_size, shuffle_seed):
            bd = batch.to(device)
            rows_chunk = _auto_rows(chunk, chunk_size, len(batch), x[0].numel(), device)
            _train_batch_norms(model, params, x[bd], y[bd], rows, pos[batch[rows]], acc,
                               rows_chunk, loss_fn)
        return acc.result()


def _train_batch_norms(model: nn.Module, params: dict[str, Tensor], xb: Tensor, yb: Tensor,
                       rows: Tensor, out_pos: Tensor, acc: _Accumulator, chunk: int,
                       loss_fn: LossFn) -> None:
    """Rows ``rows`` of the Jacobian of the batch's per-sample losses, ``chunk`` rows at a time,
    accumulated at ``out_pos``."""
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def losses(p: dict[str, Tensor]) -> Tensor:
        # Copies made inside the transform take the running-statistics update of this forward.
        copies = {k: v.clone() for k, v in buffers.items()}
        out = functional_call(model, (p, copies), (xb,))  # (B, C), batch statistics
        return loss_fn(out, yb)  # (B,)

    loss_vec, vjp_fn = vjp(losses, params)
    b = loss_vec.shape[0]
    eye = torch.eye(b, dtype=loss_vec.dtype, device=loss_vec.device)  # (B, B) one-hot cotangents
    cot = eye[rows.to(eye.device)]                                     # (r, B)
    vjp_rows = vmap(vjp_fn)
    for start in range(0, cot.shape[0], chunk):
        stop = min(cot.shape[0], start + chunk)
        (g,) = vjp_rows(cot[start:stop])  # {name: (c, *shape)}: d l_i / d theta for the chunk's rows
        acc.add(out_pos[start:stop], g)


# --- the naive reference ------------------------------------------------------------------------

def naive_grad_norms(model: nn.Module, x: Tensor, y: Tensor, *, definition: str = "eval",
                     index: Tensor | Sequence[int] | None = None,
                     batch_size: int | None = None, shuffle_seed: int | None = None,
                     loss_fn: LossFn = cross_entropy_per_sample) -> GradNorms:
    """The slow reference: one backward per sample, same arguments and result as
    :func:`per_sample_grad_norms`.

    ``"eval"``: a forward and a backward on each sample alone, in eval mode. ``"train"``: for each
    batch one train-mode forward, then one backward of each measured ``l_i`` (the graph is kept
    between them). The model's running statistics are restored afterwards.
    """
    trainable, idx, pos = _setup(model, x, y, definition, index)
    names = list(trainable)
    params = [v for v in model.parameters() if v.requires_grad]
    x, y = x.to(params[0].device), y.to(params[0].device)
    acc = _Accumulator(names, idx.numel())

    def add(place: int, gs) -> None:
        acc.add(slice(place, place + 1), {k: g.unsqueeze(0) for k, g in zip(names, gs, strict=True)})

    with frozen_bn_stats(model), _modes(model, definition), torch.enable_grad():
        if definition == "eval":
            _check_eval_ok(model)
            for place, i in enumerate(idx.tolist()):
                loss = loss_fn(model(x[i:i + 1]), y[i:i + 1]).sum()
                add(place, torch.autograd.grad(loss, params))
            return acc.result()
        for batch, rows in _measured_batches(pos, batch_size, shuffle_seed):
            lv = loss_fn(model(x[batch.to(x.device)]), y[batch.to(x.device)])  # (B,)
            places = pos[batch[rows]].tolist()
            for k, (j, place) in enumerate(zip(rows.tolist(), places, strict=True)):
                add(place, torch.autograd.grad(lv[j], params, retain_graph=k < len(places) - 1))
        return acc.result()
