"""The single-channel model of the paper's theory (claims T1, T2), measured by autograd.

Model (derived in docs/paper.md, "The theory, worked out"). A sample ``x_i`` in R^d feeds one
convolutional channel, ``z_i = w . x_i``, read by a linear classifier::

    none :  f_i = a z_i + c
    BN   :  f_i = a (gamma (z_i - mu_B) / sigma_B + beta) + c,   sigma_B^2 = var_B(z) + eps

with ``mu_B`` and the biased ``var_B`` taken over the batch, as BatchNorm does in training.
Labels ``y_i`` are in {-1, +1}; the margin is ``m_i = y_i f_i``, the loss ``log(1 + exp(-m_i))``
and ``s_i = sigmoid(-m_i)``. The BN layer comes in two variants (``mode``):

* ``"fixed"``: ``mu_B`` and ``sigma_B`` are computed from the batch before the step, then held
  constant (detached), also when the margin after the step is evaluated: the paper's assumption;
* ``"full"``: train-mode BN; the gradient flows through ``mu_B`` and ``sigma_B``, and the margin
  after the step uses the statistics of the updated batch.

One "step" is one SGD step on sample ``i``'s own loss with respect to ``w`` only (``a``, ``c``,
``gamma``, ``beta`` stay put). Margin changes are *measured* through autograd, never by the
formulas being checked; the hand-derived gradients (:func:`hand_margin_gradient`) are an
independent derivation that the tests compare with autograd. With ``u_i = x_i - xbar``,
``zhat_i = (z_i - mu_B)/sigma_B`` and ``C = (1/B) sum_j u_j u_j^T`` the biased batch covariance:

* none:  ``dm_i/dw = y_i a x_i``, so ``dm_i = eta s_i a^2 ||x_i||^2``;
* fixed: ``dm_i/dw = y_i a (gamma/sigma_B) x_i``, so the ratio to ``none`` is
  ``(gamma/sigma_B)^2`` (claim T1). The margin is affine in ``w``, so the first-order formula is
  exact: the only error left is floating-point round-off;
* full:  ``dm_i/dw = y_i a (gamma/sigma_B) (u_i - zhat_i C w / sigma_B)``, so the ratio is
  ``(gamma/sigma_B)^2 ||u_i - zhat_i C w/sigma_B||^2 / ||x_i||^2``. The correction
  ``zhat_i C w / sigma_B = (1/B) sum_j zhat_i zhat_j u_j`` removes the part of ``u_i`` along
  ``w`` (BN's output does not change when ``w`` is rescaled) and grows with the outlier's share
  ``zhat_i^2 / B`` of the batch variance. Dropping it gives the paper's approximation
  ``(gamma/sigma_B)^2 ||u_i||^2 / ||x_i||^2`` (:func:`paper_full_ratio`).

Everything runs in float64, on the CPU by default (the tensors are tiny); the table and training
functions take ``device``.

The gamma loop (claim T2), training the toy model over many steps, is in
:mod:`bnmem_utils.analyses.gamma_loop`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import product

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from bnmem_utils.core.checks import check_choice

MODES = ("none", "fixed", "full")
BN_MODES = ("fixed", "full")
DTYPE = torch.float64


# --- The model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelParams:
    """Parameters of the single-channel model; ``w`` is the channel's weight, shape (d,)."""

    w: Tensor  # (d,) float64
    a: float = 1.0  # classifier weight
    c: float = 0.0  # classifier bias
    gamma: float = 1.0  # BN scale
    beta: float = 0.0  # BN shift
    eps: float = 1e-5  # BN epsilon (added to the batch variance)


def batch_stats(w: Tensor, x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """Batch mean ``mu_B`` and ``sigma_B = sqrt(var_B + eps)`` of ``z = x @ w`` (biased var)."""
    z = x @ w  # (B,)
    return z.mean(), torch.sqrt(z.var(unbiased=False) + eps)


def _logits(p: ChannelParams, w: Tensor, x: Tensor, mode: str,
            stats: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Logits ``f`` (B,) for weight ``w``; ``stats`` are the constants of the fixed mode."""
    z = x @ w  # (B,)
    if mode == "none":
        return p.a * z + p.c
    if stats is None:
        stats = batch_stats(w.detach() if mode == "fixed" else w, x, p.eps)
    mu, sigma = stats
    return p.a * (p.gamma * (z - mu) / sigma + p.beta) + p.c


def logits(p: ChannelParams, x: Tensor, mode: str) -> Tensor:
    """Logits (B,) of the batch ``x`` (B, d) under ``mode`` in {none, fixed, full}."""
    check_choice("mode", mode, MODES)
    return _logits(p, p.w, x, mode)


def with_margin(p: ChannelParams, x: Tensor, y: Tensor, i: int, margin: float,
                mode: str) -> ChannelParams:
    """``p`` with the classifier bias ``c`` chosen so that sample ``i`` has margin ``margin``.

    Used to compare models at equal ``s_i`` (the paper's "at equal s_i"): the ratio of one-step
    margin changes is only ``(gamma/sigma)^2`` when both models start from the same margin.
    """
    f = logits(replace(p, c=0.0), x, mode)[i]
    return replace(p, c=float(margin * y[i] - f))


# --- One SGD step on one sample, measured through autograd ----------------------------------------


@dataclass(frozen=True)
class Step:
    """One SGD step on sample ``i``'s loss with respect to ``w``, as measured."""

    margin_before: float
    margin_after: float
    s: float  # sigmoid(-m_i) before the step
    grad_w: Tensor  # (d,) autograd gradient of m_i with respect to w

    @property
    def delta(self) -> float:
        """The measured margin change ``m_i(after) - m_i(before)``."""
        return self.margin_after - self.margin_before


def sgd_step(p: ChannelParams, x: Tensor, y: Tensor, i: int, eta: float, mode: str) -> Step:
    """Take one SGD step of size ``eta`` on sample ``i``'s logistic loss and measure its margin
    (the batch statistics handled as ``mode`` says, see the module docstring)."""
    check_choice("mode", mode, MODES)
    if not 0 <= i < x.shape[0]:
        raise ValueError(f"sample index {i} out of range for a batch of {x.shape[0]}")
    stats = batch_stats(p.w, x, p.eps) if mode == "fixed" else None
    w = p.w.detach().clone().requires_grad_(True)
    m_i = y[i] * _logits(p, w, x, mode, stats)[i]
    (grad_m,) = torch.autograd.grad(m_i, w, retain_graph=True)
    loss = F.softplus(-m_i)  # log(1 + exp(-m_i))
    (grad_loss,) = torch.autograd.grad(loss, w)
    with torch.no_grad():
        w_new = w - eta * grad_loss
        m_after = y[i] * _logits(p, w_new, x, mode, stats)[i]
    m_i = m_i.detach()
    return Step(float(m_i), float(m_after), float(torch.sigmoid(-m_i)), grad_m.detach())


def hand_margin_gradient(p: ChannelParams, x: Tensor, y: Tensor, i: int, mode: str) -> Tensor:
    """Closed-form ``dm_i/dw`` (d,), derived by hand (see the module docstring); no autograd."""
    check_choice("mode", mode, MODES)
    yi = y[i].to(DTYPE)
    if mode == "none":
        return yi * p.a * x[i]
    mu, sigma = batch_stats(p.w, x, p.eps)
    if mode == "fixed":
        return yi * p.a * p.gamma / sigma * x[i]
    u = x - x.mean(0)  # (B, d) centred batch
    zhat = (x @ p.w - mu) / sigma  # (B,)
    cw_over_sigma = u.T @ zhat / x.shape[0]  # (d,) = C w / sigma
    return yi * p.a * p.gamma / sigma * (u[i] - zhat[i] * cw_over_sigma)


def predicted_delta(p: ChannelParams, x: Tensor, y: Tensor, i: int, eta: float,
                    mode: str) -> float:
    """First-order margin change ``eta s_i ||dm_i/dw||^2`` from the hand-derived gradient."""
    m_i = y[i] * logits(p, x, mode)[i]
    g = hand_margin_gradient(p, x, y, i, mode)
    return float(eta * torch.sigmoid(-m_i) * (g @ g))


def predicted_ratio(p: ChannelParams, x: Tensor, i: int, mode: str) -> float:
    """Exact first-order ratio of the BN margin change to the no-BN one at equal ``s_i``:
    ``||dm_i/dw||^2`` of ``mode`` over that of ``none`` (formulas in the module docstring)."""
    check_choice("mode", mode, BN_MODES)
    y = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)  # the ratio does not depend on y
    g_bn = hand_margin_gradient(p, x, y, i, mode)
    g_none = hand_margin_gradient(p, x, y, i, "none")
    return float((g_bn @ g_bn) / (g_none @ g_none))


def paper_fixed_ratio(gamma: float, sigma: float) -> float:
    """Claim T1: BN multiplies the one-step margin growth by ``(gamma/sigma)^2``."""
    return (gamma / sigma) ** 2


def paper_full_ratio(p: ChannelParams, x: Tensor, i: int) -> float:
    """The paper's full-BN approximation ``(gamma/sigma_B)^2 ||x_i - xbar||^2 / ||x_i||^2``."""
    _, sigma = batch_stats(p.w, x, p.eps)
    u_i = x[i] - x.mean(0)
    return float((p.gamma / sigma) ** 2 * (u_i @ u_i) / (x[i] @ x[i]))


def measured_ratio(p: ChannelParams, x: Tensor, y: Tensor, i: int, eta: float, mode: str,
                   margin: float = 0.0) -> float:
    """Measured one-step margin change with BN (``mode``) over the one without BN.

    Both models share ``w`` and ``a``; each gets the bias ``c`` that puts sample ``i`` at
    ``margin``, so both steps see the same ``s_i``. Both changes come from autograd steps.
    """
    check_choice("mode", mode, BN_MODES)
    bn = sgd_step(with_margin(p, x, y, i, margin, mode), x, y, i, eta, mode)
    none = sgd_step(with_margin(p, x, y, i, margin, "none"), x, y, i, eta, "none")
    return bn.delta / none.delta


# --- Batches with one outlier, and setting sigma_B ------------------------------------------------


def scale_to_sigma(w: Tensor, x: Tensor, sigma: float, eps: float = 1e-5) -> Tensor:
    """Rescale ``w`` so that the batch standard deviation ``sigma_B`` of ``x @ w`` is ``sigma``."""
    if sigma**2 <= eps:
        raise ValueError(f"sigma={sigma} must exceed sqrt(eps)={math.sqrt(eps):.3g}")
    var = (x @ w).var(unbiased=False)
    if var <= 0:
        raise ValueError("x @ w is constant over the batch: sigma_B cannot be set by scaling w")
    return w * torch.sqrt((sigma**2 - eps) / var)


def outlier_batch(batch_size: int, dim: int, *, distance: float, cos: float = 0.0,
                  seed: int = 0, device: str | torch.device = "cpu"
                  ) -> tuple[Tensor, Tensor, Tensor, int]:
    """A batch of ``batch_size - 1`` clean samples plus one outlier, and a channel weight.

    Clean samples are N(0, I_d); the outlier (index 0) sits at ``distance * v`` with ``v`` a
    unit vector at cosine ``cos`` to the weight ``w`` (``cos=0``: the offset is orthogonal to
    ``w``; a random direction in d dimensions has ``|cos|`` about ``1/sqrt(d)``). Labels are
    random signs. Returns ``(x (B, d), y (B,), w (d,), i)``.
    """
    if batch_size < 2 or dim < 2:
        raise ValueError(f"need batch_size >= 2 and dim >= 2, got {batch_size} and {dim}")
    if not -1.0 <= cos <= 1.0:
        raise ValueError(f"cos={cos} must lie in [-1, 1]")
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, generator=gen, dtype=DTYPE)
    w_hat = w / w.norm()
    n = torch.randn(dim, generator=gen, dtype=DTYPE)
    n = n - (n @ w_hat) * w_hat
    v = cos * w_hat + math.sqrt(max(0.0, 1 - cos**2)) * n / n.norm()  # (d,) unit
    x = torch.randn(batch_size, dim, generator=gen, dtype=DTYPE)  # (B, d)
    x[0] = distance * v
    y = torch.randint(0, 2, (batch_size,), generator=gen).to(DTYPE) * 2 - 1  # (B,) in {-1, +1}
    dev = torch.device(device)
    return x.to(dev), y.to(dev), w.to(dev), 0


# --- The notebook's checks (a)-(c) as tables ------------------------------------------------------


def _compared(measured: float, predicted: float, **fields) -> dict:
    """A table row: ``fields``, then measured, predicted and their relative error."""
    return {**fields, "measured": measured, "predicted": predicted,
            "rel_error": abs(measured / predicted - 1)}


def ratio_grid(ratios, sigmas=(0.5, 1.0, 2.0), *, eta: float = 1e-6,
               batch_size: int = 32, dim: int = 16, distance: float = 6.0, cos: float = 0.3,
               margin: float = 0.0, seed: int = 0,
               device: str | torch.device = "cpu") -> pd.DataFrame:
    """Checks (a)/(b): the measured one-step ratio over a grid of ``gamma/sigma_B``.

    For each ``sigma`` in ``sigmas`` (set by rescaling ``w``) and each target ``gamma/sigma``
    in ``ratios`` (``gamma = ratio * sigma``), one autograd step on the outlier of an
    :func:`outlier_batch` is measured in each BN mode and divided by the no-BN step at equal
    margin. ``predicted`` is ``(gamma/sigma_B)^2`` for ``fixed`` and the exact first-order
    ratio for ``full`` (whose geometric factor does not depend on the scale of ``w``).
    Columns: mode, gamma, sigma, gamma_over_sigma, gs2, measured, predicted, rel_error.
    """
    x, y, w0, i = outlier_batch(batch_size, dim, distance=distance, cos=cos, seed=seed,
                                device=device)
    rows = []
    for sigma in sigmas:
        w = scale_to_sigma(w0, x, float(sigma))
        sigma_b = float(batch_stats(w, x)[1])
        for rho in ratios:
            p = ChannelParams(w=w, gamma=float(rho) * float(sigma))
            gs2 = paper_fixed_ratio(p.gamma, sigma_b)
            for mode in BN_MODES:
                predicted = gs2 if mode == "fixed" else predicted_ratio(p, x, i, mode)
                rows.append(_compared(measured_ratio(p, x, y, i, eta, mode, margin), predicted,
                                      mode=mode, gamma=p.gamma, sigma=sigma_b,
                                      gamma_over_sigma=p.gamma / sigma_b, gs2=gs2))
    return pd.DataFrame(rows)


def loglog_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2 or x.shape != y.shape or np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("loglog_slope needs at least two positive (x, y) pairs of equal length")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def eta_sweep(etas, *, gamma: float = 2.0, sigma: float = 0.5, batch_size: int = 32,
              dim: int = 16, distance: float = 6.0, cos: float = 0.3, margin: float = 0.0,
              seed: int = 0, device: str | torch.device = "cpu") -> pd.DataFrame:
    """How the measured step departs from first order as ``eta`` shrinks.

    For each ``eta``: in each mode (none, fixed, full) one autograd step is compared with
    ``eta s_i ||dm_i/dw||^2`` from the hand-derived gradient (``quantity = "delta"``), and the
    measured BN/no-BN ratio with its first-order value (``quantity = "ratio"``). The error is
    round-off in ``none`` and ``fixed`` (affine in ``w``); in ``full`` it is the second-order
    remainder, linear in ``eta``. Columns: eta, mode, quantity, measured, predicted, rel_error.
    """
    x, y, w0, i = outlier_batch(batch_size, dim, distance=distance, cos=cos, seed=seed,
                                device=device)
    p0 = ChannelParams(w=scale_to_sigma(w0, x, sigma), gamma=gamma)
    rows = []
    for eta in map(float, etas):
        for mode in MODES:
            p = with_margin(p0, x, y, i, margin, mode)
            rows.append(_compared(sgd_step(p, x, y, i, eta, mode).delta,
                                  predicted_delta(p, x, y, i, eta, mode),
                                  eta=eta, mode=mode, quantity="delta"))
        for mode in BN_MODES:
            rows.append(_compared(measured_ratio(p0, x, y, i, eta, mode, margin),
                                  predicted_ratio(p0, x, i, mode),
                                  eta=eta, mode=mode, quantity="ratio"))
    return pd.DataFrame(rows)


def full_bn_convergence(batch_sizes, distances, *, cosines=(0.0, 0.3), dim: int = 64,
                        gamma: float = 1.0, eta: float = 1e-6, margin: float = 0.0,
                        seed: int = 0, device: str | torch.device = "cpu") -> pd.DataFrame:
    """Check (c): the full-BN ratio against the paper's formula over batch size and distance.

    For each cosine ``cos`` between the outlier's offset and ``w``, batch size ``B`` and
    distance ``r`` (an :func:`outlier_batch` with ``sigma_B = 1`` set by rescaling ``w``), the
    measured full-BN ratio is listed next to ``gs2 = (gamma/sigma_B)^2``, the paper's
    approximation ``paper`` and the exact first-order value ``exact``. Columns: cos,
    batch_size, distance, zhat (the outlier's), zhat2_share (``zhat^2 / B``, its share of the
    batch variance), gs2, measured, paper, exact, measured_over_gs2, measured_over_paper,
    paper_over_gs2, exact_rel_error.
    """
    rows = []
    for cos, b, r in product(map(float, cosines), map(int, batch_sizes), map(float, distances)):
        x, y, w0, i = outlier_batch(b, dim, distance=r, cos=cos, seed=seed, device=device)
        p = ChannelParams(w=scale_to_sigma(w0, x, 1.0), gamma=gamma)
        mu, sigma = batch_stats(p.w, x, p.eps)
        zhat = float((x[i] @ p.w - mu) / sigma)
        gs2 = paper_fixed_ratio(gamma, float(sigma))
        measured = measured_ratio(p, x, y, i, eta, "full", margin)
        paper = paper_full_ratio(p, x, i)
        exact = predicted_ratio(p, x, i, "full")
        rows.append({"cos": cos, "batch_size": b, "distance": r, "zhat": zhat,
                     "zhat2_share": zhat**2 / b, "gs2": gs2, "measured": measured,
                     "paper": paper, "exact": exact, "measured_over_gs2": measured / gs2,
                     "measured_over_paper": measured / paper, "paper_over_gs2": paper / gs2,
                     "exact_rel_error": abs(measured / exact - 1)})
    return pd.DataFrame(rows)


# --- The interactive explorer (check e); headless runs never depend on it -------------------------


def explore_ratio(gamma: float = 2.0, sigma: float = 1.0, distance: float = 8.0,
                  batch_size: int = 32, eta: float = 1e-4, *, cos: float = 0.3, dim: int = 16,
                  seed: int = 0) -> dict[str, float]:
    """Measured against predicted one-step ratios for one setting (the widget's function).

    Returns measured_fixed, predicted_fixed (``(gamma/sigma)^2``), measured_full,
    exact_full, paper_full and zhat (the outlier's normalised activation).
    """
    x, y, w0, i = outlier_batch(int(batch_size), dim, distance=distance, cos=cos, seed=seed)
    p = ChannelParams(w=scale_to_sigma(w0, x, sigma), gamma=gamma)
    mu, sig = batch_stats(p.w, x, p.eps)
    return {
        "measured_fixed": measured_ratio(p, x, y, i, eta, "fixed"),
        "predicted_fixed": paper_fixed_ratio(gamma, float(sig)),
        "measured_full": measured_ratio(p, x, y, i, eta, "full"),
        "exact_full": predicted_ratio(p, x, i, "full"),
        "paper_full": paper_full_ratio(p, x, i),
        "zhat": float((x[i] @ p.w - mu) / sig),
    }


def format_exploration(res: dict[str, float]) -> str:
    """The explorer's text: measured and predicted ratios side by side."""
    return (f"fixed statistics: measured {res['measured_fixed']:.6g}   predicted "
            f"(gamma/sigma)^2 {res['predicted_fixed']:.6g}\n"
            f"full BN:          measured {res['measured_full']:.6g}   exact first order "
            f"{res['exact_full']:.6g}   paper's approximation {res['paper_full']:.6g}\n"
            f"outlier zhat = {res['zhat']:.3g}")
