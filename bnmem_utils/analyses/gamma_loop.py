"""The gamma loop (claim T2): the toy model of :mod:`bnmem_utils.analyses.theory` trained, several seeds at once.

:func:`toy_batches` draws each seed's clean batch of two classes and its outlier; a BN model
(:func:`toy_init`) and its no-BN twin (:func:`to_no_bn`, the same function) are trained by
gradient descent on the clean batch, then with the outlier (:func:`train_toy`).
:func:`gamma_loop` records, per seed, how fast the outlier is fitted, its share of gamma's
gradient and gamma/sigma_B; :func:`gamma_loop_summary` turns them into notebook 01's numbers with
their intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.stats import rankdata
from torch import Tensor

from bnmem_utils.analyses.theory import BN_MODES, DTYPE, MODES
from bnmem_utils.core.checks import check_choice
from bnmem_utils.core.device import cpu_threads
from bnmem_utils.core.stats import Estimate, bootstrap_ci, diff_ci, mean_ci

# --- The gamma loop (claim T2): training the toy model, several seeds at once ---------------------


@dataclass(frozen=True)
class ToyBatch:
    """Training batches of the toy task, one per seed: ``x`` (S, B, d), ``y`` (S, B).

    ``outlier`` is the index of the outlier in every seed's batch (``None`` when there is none).
    """

    x: Tensor
    y: Tensor
    outlier: int | None


def toy_batches(n_clean: int, dim: int, *, seeds, separation: float = 2.0,
                outlier_distance: float = 8.0, with_outlier: bool = True,
                device: str | torch.device = "cpu") -> ToyBatch:
    """The toy task: two Gaussian classes, optionally plus one far, mislabelled outlier.

    Clean sample j: ``x_j = y_j * separation * e_1 + N(0, I_d)``, balanced labels. The outlier
    (index 0 when present) sits at ``outlier_distance`` along a random unit direction ``v`` and
    carries the label that contradicts the class pattern, ``-sign(v_1)``, so only memorization
    fits it. A seed's clean samples are the same with and without the outlier.
    """
    if n_clean < 2 or n_clean % 2:
        raise ValueError(f"n_clean must be even and >= 2, got {n_clean}")
    if dim < 2:
        raise ValueError(f"dim must be >= 2, got {dim}")
    xs, ys = [], []
    for seed in seeds:
        gen = torch.Generator().manual_seed(int(seed))
        y = torch.cat([torch.ones(n_clean // 2), -torch.ones(n_clean // 2)]).to(DTYPE)  # (n,)
        x = torch.randn(n_clean, dim, generator=gen, dtype=DTYPE)  # (n, d)
        x[:, 0] += separation * y
        v = torch.randn(dim, generator=gen, dtype=DTYPE)
        v = v / v.norm()  # (d,) unit
        if with_outlier:
            y_o = torch.tensor(-1.0 if v[0] >= 0 else 1.0, dtype=DTYPE)
            x = torch.cat([outlier_distance * v[None], x])  # (n + 1, d)
            y = torch.cat([y_o.reshape(1), y])
        xs.append(x)
        ys.append(y)
    if not xs:
        raise ValueError("toy_batches needs at least one seed")
    dev = torch.device(device)
    return ToyBatch(torch.stack(xs).to(dev), torch.stack(ys).to(dev), 0 if with_outlier else None)


@dataclass(frozen=True)
class ToyState:
    """Parameters of S independent toy models: ``w`` (S, d); ``a, c, gamma, beta`` (S,)."""

    w: Tensor
    a: Tensor
    c: Tensor
    gamma: Tensor
    beta: Tensor


def _stats_b(w: Tensor, x: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    z = torch.einsum("sbd,sd->sb", x, w)  # (S, B)
    mu = z.mean(1, keepdim=True)  # (S, 1)
    sigma = torch.sqrt(z.var(1, unbiased=False, keepdim=True) + eps)  # (S, 1)
    return z, mu, sigma


def toy_init(batch: ToyBatch, *, init_seed: int = 0, eps: float = 1e-5) -> ToyState:
    """Initial BN model: Gaussian ``w`` rescaled to ``sigma_B = 1`` on ``batch``, ``a = gamma =
    1``, ``c = beta = 0``. With ``gamma/sigma_B = 1`` it computes the same function as its
    no-BN twin from :func:`to_no_bn`, and has the same classifier weight ``a``."""
    s_n, _, d = batch.x.shape
    gen = torch.Generator().manual_seed(init_seed)
    w = torch.randn(s_n, d, generator=gen, dtype=DTYPE).to(batch.x.device)  # (S, d)
    z = torch.einsum("sbd,sd->sb", batch.x, w)
    w = w * torch.sqrt((1.0 - eps) / z.var(1, unbiased=False))[:, None]  # sigma_B = 1
    ones = torch.ones(s_n, dtype=DTYPE, device=w.device)
    return ToyState(w=w, a=ones, c=torch.zeros_like(ones), gamma=ones.clone(),
                    beta=torch.zeros_like(ones))


def to_no_bn(state: ToyState, batch: ToyBatch, *, eps: float = 1e-5) -> ToyState:
    """The no-BN model computing the same function on ``batch`` with the same ``a``.

    ``f = a (gamma (z - mu)/sigma + beta) + c = a (w gamma/sigma) . x + a (beta - gamma mu /
    sigma) + c``: the weight absorbs ``gamma/sigma_B``, the bias the shift. Equal ``a`` is the
    paper's comparison (claim T1 compares models with the same classifier weight).
    """
    _, mu, sigma = _stats_b(state.w, batch.x, eps)
    k = state.gamma / sigma[:, 0]  # (S,)
    c = state.a * (state.beta - k * mu[:, 0]) + state.c
    return ToyState(w=state.w * k[:, None], a=state.a, c=c, gamma=torch.ones_like(k),
                    beta=torch.zeros_like(k))


@dataclass
class ToyTrace:
    """Per-step record of a toy training run (numpy arrays, S seeds, T steps).

    ``gamma``, ``sigma``, ``loss``: (T+1, S), before each step and after the last (``gamma``
    is NaN without BN); ``margins``: (T+1, S, B); ``gamma_grads``: (T, S, B), sample j's
    contribution ``d(l_j / B)/d gamma`` at step t, measured by autograd (they sum to
    ``dL/dgamma``; zeros without BN).
    """

    mode: str
    gamma: np.ndarray
    sigma: np.ndarray
    loss: np.ndarray
    margins: np.ndarray
    gamma_grads: np.ndarray
    outlier: int | None

    @property
    def steps(self) -> int:
        return self.gamma_grads.shape[0]

    def outlier_margin(self) -> np.ndarray:
        """(T+1, S) margin of the outlier."""
        if self.outlier is None:
            raise ValueError("this run has no outlier")
        return self.margins[:, :, self.outlier]

    def shares(self) -> np.ndarray:
        """(T, S, B) each sample's share ``|g_j| / sum_k |g_k|`` of the gamma gradient."""
        g = np.abs(self.gamma_grads)
        return g / np.maximum(g.sum(-1, keepdims=True), np.finfo(float).tiny)


def train_toy(batch: ToyBatch, state: ToyState, *, mode: str = "full", steps: int = 100,
              lr: float = 0.5, eps: float = 1e-5) -> tuple[ToyTrace, ToyState]:
    """Full-batch gradient descent on the toy model from ``state``; return the trace and the
    final state.

    Plain GD (no momentum, no weight decay) on the mean logistic loss; ``w, a, c`` train, and
    ``gamma, beta`` with BN. ``mode``: ``full`` (train-mode BN), ``fixed`` (statistics
    recomputed every step but detached) or ``none`` (``gamma``, ``beta`` ignored).
    """
    check_choice("mode", mode, MODES)
    x, y = batch.x, batch.y  # (S, B, d), (S, B)
    s_n, b_n, _ = x.shape
    if state.w.shape != (s_n, x.shape[2]):
        raise ValueError(f"state.w has shape {tuple(state.w.shape)}, the batch needs "
                         f"{(s_n, x.shape[2])}")
    bn = mode != "none"
    w, a, c, gamma, beta = (t.detach().clone().requires_grad_(True) for t in
                            (state.w, state.a, state.c, state.gamma, state.beta))
    params = [w, a, c] + ([gamma, beta] if bn else [])
    rec: dict[str, list] = {k: [] for k in ("gamma", "sigma", "loss", "margins", "gamma_grads")}
    nan = torch.full((s_n,), float("nan"), dtype=DTYPE, device=x.device)
    with cpu_threads(1):
        for t in range(steps + 1):
            z, mu, sigma = _stats_b(w, x, eps)  # (S, B), (S, 1), (S, 1)
            g_exp = gamma[:, None].expand(s_n, b_n)  # (S, B): gamma seen by each sample
            if bn:
                if mode == "fixed":
                    mu, sigma = mu.detach(), sigma.detach()
                f = a[:, None] * (g_exp * (z - mu) / sigma + beta[:, None]) + c[:, None]
            else:
                f = a[:, None] * z + c[:, None]
            m = y * f  # (S, B)
            per_sample = F.softplus(-m)  # (S, B) logistic loss
            rec["gamma"].append(gamma.detach().clone() if bn else nan)
            rec["sigma"].append(sigma.detach().reshape(s_n).clone())
            rec["loss"].append(per_sample.detach().mean(1))
            rec["margins"].append(m.detach().clone())
            if t == steps:
                break
            loss = per_sample.mean(1).sum()  # seeds are independent: the sum keeps each gradient
            grads = torch.autograd.grad(loss, params + ([g_exp] if bn else []))
            rec["gamma_grads"].append(grads[-1].detach().clone() if bn else torch.zeros_like(m))
            with torch.no_grad():
                for p_, g_ in zip(params, grads[: len(params)], strict=True):
                    p_ -= lr * g_
    empty = torch.zeros(0, s_n, b_n, dtype=DTYPE)
    arr = {k: (torch.stack(v).cpu().numpy() if v else empty.numpy()) for k, v in rec.items()}
    final = ToyState(*(t.detach() for t in (w, a, c, gamma, beta)))
    return ToyTrace(mode=mode, outlier=batch.outlier, **arr), final


def fit_steps(outlier_margin: np.ndarray, threshold: float = 0.0) -> np.ndarray:
    """(S,) first step at which the outlier's margin exceeds ``threshold`` (T+1 if never).

    ``outlier_margin`` is (T+1, S); steps before this one form the "fitting phase".
    """
    above = outlier_margin > threshold  # (T+1, S)
    return np.where(above.any(0), above.argmax(0), outlier_margin.shape[0])


@dataclass
class GammaLoop:
    """The gamma-loop experiment (check d): traces and a per-seed summary table.

    ``warmup_bn``/``warmup_none``: the clean-only warm-up; ``with_outlier``/``without``: the BN
    model continued on the batch with and without the outlier; ``none_with``: the no-BN model
    (same initial function, same warm-up) continued on the batch with the outlier;
    ``twin_with``: the no-BN twin of the warmed-up BN model (the same function at the
    insertion, :func:`to_no_bn`) trained on that batch. ``per_seed`` columns are described in
    :func:`gamma_loop`.
    """

    warmup_bn: ToyTrace
    warmup_none: ToyTrace
    with_outlier: ToyTrace
    without: ToyTrace
    none_with: ToyTrace
    twin_with: ToyTrace
    per_seed: pd.DataFrame
    batch_size: int


def gamma_loop(*, seeds=range(16), n_clean: int = 32, dim: int = 8, distance: float = 8.0,
               separation: float = 2.0, lr: float = 0.05, warmup: int = 300, steps: int = 200,
               mode: str = "full", init_seed: int = 0, eps: float = 1e-5,
               device: str | torch.device = "cpu") -> GammaLoop:
    """Train the toy BN model on a clean batch, then with and without one outlier (claim T2).

    Both BN and no-BN models start as the same function (:func:`toy_init`, :func:`to_no_bn`),
    train ``warmup`` GD steps on the clean batch, then ``steps`` more on the batch with the
    outlier (and, for BN, on the clean batch again as the counterfactual). One row per seed:

    * ``fit_step_bn``, ``fit_step_none``, ``fit_step_twin``: steps after the insertion until the
      outlier's margin first exceeds 0 (``steps + 1`` if never): the memorization speed of the
      BN model, of the no-BN model with the same start and warm-up, and of the BN model's no-BN
      twin (same function at the insertion, so the comparison of claim T1);
    * ``margin_insert_bn``, ``margin_insert_none``: the outlier's margin at the insertion;
    * ``share_fit``: the outlier's mean share ``|g_o| / sum_j |g_j|`` of the per-sample
      contributions ``g_j = d(l_j/B)/d gamma`` over its fitting phase, the steps before
      ``fit_step_bn`` (NaN when the outlier already sits on its label's side at the insertion:
      it is then not being fitted);
    * ``max_clean_share_fit``: the largest single clean sample's share, same steps;
    * ``up_fraction``: fraction of those steps in which the outlier's pull ``-g_o`` raises gamma;
    * ``share_after``, ``up_fraction_after``: the same after it is fitted (NaN if never);
    * ``gamma_start``, ``gamma_end_with``, ``gamma_end_without``: gamma at the insertion and at
      the end with and without the outlier; ``gamma_growth_with``/``_without`` the differences;
    * ``sigma_end_with``/``_without``: ``sigma_B`` at the end;
    * ``gs_start`` (end of warm-up), ``gs_insert`` (with the outlier in the batch),
      ``gs_end_with``, ``gs_end_without``: ``gamma/sigma_B``, the amplification of claim T1.
    """
    check_choice("mode", mode, BN_MODES)
    seeds = list(seeds)
    kw = dict(seeds=seeds, separation=separation, outlier_distance=distance, device=device)
    b_out = toy_batches(n_clean, dim, with_outlier=True, **kw)
    b_clean = toy_batches(n_clean, dim, with_outlier=False, **kw)
    s0 = toy_init(b_clean, init_seed=init_seed, eps=eps)
    gd = partial(train_toy, lr=lr, eps=eps)
    warm_bn, s_bn = gd(b_clean, s0, mode=mode, steps=warmup)
    warm_none, s_none = gd(b_clean, to_no_bn(s0, b_clean, eps=eps), mode="none", steps=warmup)
    with_o, _ = gd(b_out, s_bn, mode=mode, steps=steps)
    without, _ = gd(b_clean, s_bn, mode=mode, steps=steps)
    none_with, _ = gd(b_out, s_none, mode="none", steps=steps)
    twin_with, _ = gd(b_out, to_no_bn(s_bn, b_out, eps=eps), mode="none", steps=steps)

    fit_bn = fit_steps(with_o.outlier_margin())
    df = pd.DataFrame({
        "seed": seeds, "fit_step_bn": fit_bn,
        "fit_step_none": fit_steps(none_with.outlier_margin()),
        "fit_step_twin": fit_steps(twin_with.outlier_margin()),
        "margin_insert_bn": with_o.outlier_margin()[0],
        "margin_insert_none": none_with.outlier_margin()[0],
        **pd.DataFrame(_gamma_phases(with_o, b_out.outlier, fit_bn, steps)),
        "gamma_start": with_o.gamma[0], "gamma_end_with": with_o.gamma[-1],
        "gamma_end_without": without.gamma[-1], "sigma_end_with": with_o.sigma[-1],
        "sigma_end_without": without.sigma[-1], "gs_start": _gs(warm_bn, -1),
        "gs_insert": _gs(with_o, 0), "gs_end_with": _gs(with_o, -1),
        "gs_end_without": _gs(without, -1),
    })
    df["gamma_growth_with"] = df.gamma_end_with - df.gamma_start
    df["gamma_growth_without"] = df.gamma_end_without - df.gamma_start
    return GammaLoop(warm_bn, warm_none, with_o, without, none_with, twin_with, df,
                     b_out.x.shape[1])


def _gs(trace: ToyTrace, t: int) -> np.ndarray:
    """(S,) gamma/sigma_B of every seed at step ``t``."""
    return trace.gamma[t] / trace.sigma[t]


def _gamma_phases(with_o: ToyTrace, o: int, fit_bn: np.ndarray, steps: int) -> list[dict]:
    """Per seed, the outlier's part in the gamma gradient while it is being fitted (the steps
    before ``fit_bn``) and after (columns of :func:`gamma_loop`)."""
    shares = with_o.shares()                                 # (T, S, B)
    phases = []
    for k in range(shares.shape[1]):
        end_fit = int(min(fit_bn[k], steps))  # fitting phase: steps [0, end_fit)
        sh, after = shares[:end_fit, k], slice(end_fit, steps)  # (t, B)
        pull = -with_o.gamma_grads[:, k, o]  # (T,) the outlier's push on gamma (GD step sign)
        fitting, fitted = end_fit > 0, end_fit < steps
        phases.append({
            "share_fit": float(sh[:, o].mean()) if fitting else np.nan,
            "max_clean_share_fit": (float(np.delete(sh, o, axis=1).max(1).mean()) if fitting
                                    else np.nan),
            "up_fraction": float((pull[:end_fit] > 0).mean()) if fitting else np.nan,
            "share_after": float(shares[after, k, o].mean()) if fitted else np.nan,
            "up_fraction_after": float((pull[after] > 0).mean()) if fitted else np.nan})
    return phases


def gamma_loop_summary(res: GammaLoop) -> dict[str, Estimate]:
    """Means over seeds with t-intervals (paired differences where runs share a seed); the
    bounded fractions get percentile-bootstrap intervals. Seeds with a NaN entry are left out.

    Keys: outlier_share, max_clean_share, share_excess (outlier minus largest clean, paired),
    up_fraction_fit, share_after, up_fraction_after, gamma_growth_with, gamma_growth_without,
    gamma_growth_diff, gs_end_with, gs_end_without, gs_end_diff, fit_step_bn, fit_step_none,
    fit_step_diff (BN minus no BN; never-fitted runs count as ``steps + 1``), bn_faster (the
    fraction of seeds in which BN fits the outlier in fewer steps), margin_insert_diff (BN minus
    no BN at the insertion), fit_step_twin, fit_step_diff_twin, bn_faster_twin (the same
    against the no-BN twin that computes the same function at the insertion).
    """
    d = res.per_seed
    return {
        "outlier_share": mean_ci(d.share_fit),
        "max_clean_share": mean_ci(d.max_clean_share_fit),
        "share_excess": diff_ci(d.share_fit, d.max_clean_share_fit, paired=True),
        "up_fraction_fit": bootstrap_ci(d.up_fraction),
        "share_after": mean_ci(d.share_after),
        "up_fraction_after": bootstrap_ci(d.up_fraction_after),
        "gamma_growth_with": mean_ci(d.gamma_growth_with),
        "gamma_growth_without": mean_ci(d.gamma_growth_without),
        "gamma_growth_diff": diff_ci(d.gamma_growth_with, d.gamma_growth_without, paired=True),
        "gs_end_with": mean_ci(d.gs_end_with),
        "gs_end_without": mean_ci(d.gs_end_without),
        "gs_end_diff": diff_ci(d.gs_end_with, d.gs_end_without, paired=True),
        "fit_step_bn": mean_ci(d.fit_step_bn),
        "fit_step_none": mean_ci(d.fit_step_none),
        "fit_step_diff": diff_ci(d.fit_step_bn, d.fit_step_none, paired=True),
        "bn_faster": bootstrap_ci((d.fit_step_bn < d.fit_step_none).astype(float)),
        "margin_insert_diff": diff_ci(d.margin_insert_bn, d.margin_insert_none, paired=True),
        "fit_step_twin": mean_ci(d.fit_step_twin),
        "fit_step_diff_twin": diff_ci(d.fit_step_bn, d.fit_step_twin, paired=True),
        "bn_faster_twin": bootstrap_ci((d.fit_step_bn < d.fit_step_twin).astype(float)),
        "speedup_gs_spearman": _spearman_ci(d.gs_insert, d.fit_step_twin, d.fit_step_bn),
    }


def _spearman(a, b) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (0 when either is constant)."""
    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _spearman_ci(gs, fit_twin, fit_bn) -> Estimate:
    """Spearman correlation of ``gamma/sigma_B`` at the insertion with the log speed-up
    ``log(fit_twin / fit_bn)`` over seeds where both fit after >= 1 step, with a bootstrap
    interval over seeds."""
    gs, fit_twin, fit_bn = (np.asarray(v, dtype=float) for v in (gs, fit_twin, fit_bn))
    ok = (fit_twin > 0) & (fit_bn > 0)
    x, y = gs[ok], np.log(fit_twin[ok] / fit_bn[ok])
    if x.size < 4:
        return Estimate(math.nan, math.nan, math.nan, int(x.size))
    est = bootstrap_ci(np.arange(x.size), n_boot=1000,
                       statistic=lambda k: _spearman(x[k.astype(int)], y[k.astype(int)]))
    return Estimate(_spearman(x, y), est.lo, est.hi, est.n, est.std)


# --- Figures --------------------------------------------------------------------------------------

def typical_seed_index(res: GammaLoop) -> int:
    """Index of the seed whose fitting time is the median of those fitted after >= 1 step."""
    fit = res.per_seed.fit_step_bn.to_numpy()
    ok = np.flatnonzero((fit >= 1) & (fit <= res.with_outlier.steps))
    if ok.size == 0:
        return 0
    return int(ok[np.argsort(fit[ok])[ok.size // 2]])


def gamma_loop_frame(res: GammaLoop) -> pd.DataFrame:
    """Long-format data behind :func:`plot_gamma_loop`: run, seed, step, gamma, sigma,
    outlier_margin, outlier_share."""
    frames = []
    for name, tr, offset in (("warmup", res.warmup_bn, 0),
                             ("with_outlier", res.with_outlier, res.warmup_bn.steps),
                             ("without", res.without, res.warmup_bn.steps),
                             ("none_with_outlier", res.none_with, res.warmup_bn.steps),
                             ("twin_with_outlier", res.twin_with, res.warmup_bn.steps)):
        t_n, s_n = tr.gamma.shape
        steps, seeds = np.meshgrid(np.arange(t_n) + offset, res.per_seed.seed.to_numpy(),
                                   indexing="ij")
        frame = {"run": name, "seed": seeds.ravel(), "step": steps.ravel(),
                 "gamma": tr.gamma.ravel(), "sigma": tr.sigma.ravel()}
        if tr.outlier is not None:
            frame["outlier_margin"] = tr.outlier_margin().ravel()
            if tr.mode != "none":
                share = np.vstack([tr.shares()[:, :, tr.outlier], np.full((1, s_n), np.nan)])
                frame["outlier_share"] = share.ravel()
        frames.append(pd.DataFrame(frame))
    return pd.concat(frames, ignore_index=True)
