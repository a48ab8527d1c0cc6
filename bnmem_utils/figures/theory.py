"""The figures of notebook 01 (the theory): the ratio grid, the learning-rate sweep, full batch
norm's convergence, the gamma loop and the explorer's panel, in the style of
:mod:`bnmem_utils.figures.plotting`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from bnmem_utils.analyses.gamma_loop import GammaLoop, typical_seed_index
from bnmem_utils.analyses.theory import MODES
from bnmem_utils.figures.plotting import new_figure, norm_color, panel_grid, plot_mean_ci

# --------------------------------------------------------------------------------------------
# Notebook 01: the theory
# --------------------------------------------------------------------------------------------


MODE_STYLE = {"none": ("no BN", "none"), "fixed": ("BN, fixed statistics", "gn"),
              "full": ("BN, full", "bn")}


def _mode_color(mode: str):
    return norm_color(MODE_STYLE[mode][1])


def plot_ratio_grid(grid: pd.DataFrame):
    """Measured ratio against ``(gamma/sigma)^2`` on log-log axes with the identity line."""
    _, ax = plt.subplots(figsize=(5, 4.2), layout="constrained")
    lo, hi = grid.gs2.min() / 1.5, grid.gs2.max() * 1.5
    ax.plot([lo, hi], [lo, hi], color="0.4", lw=1, ls="--", label="identity")
    for mode, marker in (("fixed", "o"), ("full", "x")):
        part = grid[grid["mode"] == mode]
        if len(part):
            ax.scatter(part.gs2, part.measured, marker=marker, color=_mode_color(mode),
                       label=f"measured, {MODE_STYLE[mode][0]}", zorder=3)
    ax.set(xscale="log", yscale="log", xlabel=r"$(\gamma/\sigma_B)^2$",
           ylabel="margin change, BN / no BN", title="One-step margin growth (T1)")
    ax.legend(fontsize="small")
    return ax


def plot_eta_sweep(sweep: pd.DataFrame):
    """Relative error of the measured step against first order, as ``eta`` falls."""
    _, ax = plt.subplots(figsize=(5, 4.2), layout="constrained")
    part = sweep[sweep["quantity"] == "delta"]
    for mode in MODES:
        m = part[part["mode"] == mode]
        ax.plot(m.eta, m.rel_error.clip(lower=1e-17), marker="o", color=_mode_color(mode),
                label=MODE_STYLE[mode][0])
    full = part[part["mode"] == "full"]
    ref = full.rel_error.iloc[-1] * full.eta / full.eta.iloc[-1]
    ax.plot(full.eta, ref, color="0.4", ls=":", label="slope 1")
    ax.set(xscale="log", yscale="log", xlabel=r"learning rate $\eta$",
           ylabel="|measured / first order - 1|", title="First-order accuracy")
    ax.legend(fontsize="small")
    return ax


def plot_full_bn_convergence(conv: pd.DataFrame):
    """Full-BN ratio over ``(gamma/sigma)^2`` against batch size, one panel per cosine.

    Markers: measured; dashed: the paper's approximation; dotted: the exact first-order value.
    """
    cosines = sorted(set(conv["cos"]))
    axes = panel_grid(1, len(cosines), 5, 4.2, sharey=True, layout="constrained")[1][0]
    distances = sorted(set(conv["distance"]))
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, len(distances)))
    for ax, cos in zip(axes, cosines, strict=True):
        part = conv[conv["cos"] == cos]
        for r, col in zip(distances, colors, strict=True):
            m = part[part["distance"] == r].sort_values("batch_size")
            ax.plot(m.batch_size, m.measured_over_gs2, "o", color=col, label=f"r = {r:g}")
            ax.plot(m.batch_size, m.paper_over_gs2, "--", color=col, lw=1)
            ax.plot(m.batch_size, m.exact / m.gs2, ":", color=col, lw=1.5)
        ax.axhline(1.0, color="0.4", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="batch size B",
               title=f"outlier offset at cos = {cos:g} to w")
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    axes[0].set_ylabel(r"full-BN ratio / $(\gamma/\sigma_B)^2$")
    axes[0].legend(fontsize="small", title="distance (markers: measured,\n"
                   "dashed: paper, dotted: exact)", title_fontsize="x-small")
    return axes


def plot_gamma_loop(res: GammaLoop):
    """Four panels: gamma over steps with and without the outlier; the paired differences
    with minus without of gamma and of gamma/sigma_B; every sample's share of dL/dgamma for
    the typical seed (:func:`typical_seed_index`); the outlier's margin with and without BN.
    Curves over seeds are means with 95% t-intervals."""
    axes = np.ravel(plt.subplots(2, 2, figsize=(11, 8), layout="constrained")[1])
    k = typical_seed_index(res)
    w = res.warmup_bn.steps
    t_warm = np.arange(w + 1)
    t_after = w + np.arange(res.with_outlier.steps + 1)
    ax = axes[0]
    plot_mean_ci(t_warm, res.warmup_bn.gamma.T, ax, color="0.4", label="warm-up (clean)")
    plot_mean_ci(t_after, res.with_outlier.gamma.T, ax, color=norm_color("bn"),
                 label="with the outlier")
    plot_mean_ci(t_after, res.without.gamma.T, ax, color=norm_color("none"), label="without")
    ax.axvline(w, color="0.6", lw=1, ls=":")
    ax.set(xlabel="GD step", ylabel=r"$\gamma$", title=r"BN scale $\gamma$")

    ax = axes[1]
    t = np.arange(res.with_outlier.steps + 1)
    d_gamma = (res.with_outlier.gamma - res.without.gamma).T  # (S, T+1)
    d_gs = (res.with_outlier.gamma / res.with_outlier.sigma
            - res.without.gamma / res.without.sigma).T
    plot_mean_ci(t, d_gamma, ax, color=norm_color("bn"), label=r"$\gamma$")
    plot_mean_ci(t, d_gs, ax, color=norm_color("gn"), label=r"$\gamma/\sigma_B$")
    ax.axhline(0, color="0.4", lw=1)
    ax.set(xlabel="GD step after the insertion", ylabel="with minus without the outlier",
           title="what the outlier adds (paired by seed)")

    ax = axes[2]
    shares = res.with_outlier.shares()[:, k]  # (T, B)
    o = res.with_outlier.outlier
    steps = np.arange(shares.shape[0])
    for j in range(shares.shape[1]):
        if j != o:
            ax.plot(steps, shares[:, j], color="0.7", lw=0.7)
    ax.plot(steps, shares[:, o], color=norm_color("bn"), lw=2, label="outlier")
    ax.plot([], [], color="0.7", lw=0.7, label="clean samples")
    fit = int(res.per_seed.fit_step_bn.iloc[k])
    ax.axvspan(0, max(fit, 0.5), color=norm_color("bn"), alpha=0.1, label="being fitted")
    ax.axhline(1 / shares.shape[1], color="0.3", ls=":", lw=1, label="1/B")
    ax.set(xlabel="GD step after the insertion", ylabel=r"share of $dL/d\gamma$",
           title=f"each sample's share (seed {res.per_seed.seed.iloc[k]})",
           xlim=(0, min(shares.shape[0], max(4 * fit, 40))))

    ax = axes[3]
    plot_mean_ci(t, res.with_outlier.outlier_margin().T, ax, color=norm_color("bn"),
                 label="with BN")
    plot_mean_ci(t, res.none_with.outlier_margin().T, ax, color=norm_color("none"),
                 label="without BN (same start)")
    plot_mean_ci(t, res.twin_with.outlier_margin().T, ax, color=norm_color("none"), ls="--",
                 label="without BN (same function at insertion)")
    ax.axhline(0, color="0.4", lw=1)
    ax.set(xlabel="GD step after the insertion", ylabel="margin on the outlier",
           title="memorization of the outlier")
    for ax in axes:
        ax.legend(fontsize="small")
    return axes


_EXPLORER_ROWS = (("fixed statistics: measured", "measured_fixed", "fixed", "o"),
                  ("fixed statistics: (gamma/sigma)^2", "predicted_fixed", "fixed", "D"),
                  ("full BN: measured", "measured_full", "full", "o"),
                  ("full BN: exact first order", "exact_full", "full", "D"),
                  ("full BN: paper's approximation", "paper_full", "full", "s"))


def plot_exploration(res: dict[str, float]):
    """The explorer's chart: each ratio as a point on a log axis (no bars: on a log axis a
    bar's length depends on where the axis starts), its value printed beside it, and the
    no-BN reference (ratio 1) as a line. Measured values are filled circles, predictions open
    markers. Returns the axes."""
    ax = new_figure((6.4, 2.9)).subplots()
    vals = [float(res[key]) for _, key, _, _ in _EXPLORER_ROWS]
    for row, ((_, _, mode, marker), v) in enumerate(zip(_EXPLORER_ROWS, vals, strict=True)):
        colour = _mode_color(mode)
        filled = marker == "o"
        ax.plot([v], [row], marker=marker, ms=8 if filled else 7, ls="none", color=colour,
                mfc=colour if filled else "white", mew=1.8)
        ax.annotate(f"{v:.4g}", (v, row), xytext=(8, 0), textcoords="offset points",
                    va="center", fontsize=9)
    positive = [v for v in vals if v > 0 and np.isfinite(v)] or [1.0]
    lo, hi = min(min(positive), 1.0), max(max(positive), 1.0)
    ax.set_xscale("log")
    ax.set_xlim(lo / 2.5, hi * 4.0)  # room for the printed values
    ax.axvline(1.0, color="0.5", lw=1, ls=":")
    ax.xaxis.set_major_locator(mticker.LogLocator(base=10, numticks=8))
    ax.xaxis.set_minor_locator(mticker.LogLocator(base=10, subs=np.arange(2, 10) * 0.1,
                                                  numticks=80))
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())  # minor labels would overlap
    ax.set_yticks(range(len(_EXPLORER_ROWS)), [r[0] for r in _EXPLORER_ROWS])
    ax.set_ylim(len(_EXPLORER_ROWS) - 0.5, -0.5)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("one-step margin change, BN / no BN (dotted: 1, no amplification)")
    return ax
