"""The figures of notebooks 02 (forced memorization) and 05 (the gamma/sigma penalty): curves over
epochs per seed, gamma/sigma per layer, and the penalty's trade-off between accuracy and
memorization, in the style of :mod:`bnmem_utils.figures.plotting`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from bnmem_utils.analyses.memorization import MEM_METRIC, check_columns, curve_stats
from bnmem_utils.core.stats import mean_ci
from bnmem_utils.figures.plotting import norm_color, panel_grid, plot_mean_ci, rows_where, words
from bnmem_utils.jobs.config import PenaltyConfig
from bnmem_utils.models.nets import NORM_LABELS, ordered_norms

# --------------------------------------------------------------------------------------------
# Notebook 02: forced memorization
# --------------------------------------------------------------------------------------------


def _plain_log_y(ax) -> None:
    """Log y axis with plain tick labels (0.5, 1, 2 rather than 5x10^-1); minor ticks are
    labelled too when the axis spans less than a decade, so it is never left unlabelled."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%g"))
    lo, hi = ax.get_ylim()
    narrow = lo > 0 and hi / lo < 10
    minor = mticker.FormatStrFormatter("%g") if narrow else mticker.NullFormatter()
    ax.yaxis.set_minor_formatter(minor)
    ax.tick_params(axis="y", which="minor", labelsize=7)


def _seed_curve(ax, frame: pd.DataFrame, metric: str, scale: float = 1.0, **kw) -> pd.DataFrame:
    """Plot ``metric`` per epoch, mean and 95% band over seeds; return the (seeds, epochs) frame."""
    wide = frame.pivot_table(index="seed", columns="epoch", values=metric)
    plot_mean_ci(wide.columns.to_numpy(), wide.to_numpy() * scale, ax, **kw)
    return wide


def metric_bounds(metric: str) -> tuple[float | None, float | None]:
    """The range a per-epoch metric can take, for clipping its confidence band: ``(0, 1)`` for
    an accuracy (``*_acc``), ``(0, None)`` for a loss or a gamma/sigma, else unbounded."""
    if metric.endswith("_acc"):
        return 0.0, 1.0
    if metric.endswith("_loss") or metric.startswith("gs_") or metric == "gamma_abs_mean":
        return 0.0, None
    return None, None


def plot_curves(hist: pd.DataFrame, metric: str, *, ylabel: str = "", row: str = "setting",
                panel_cols: Sequence[str] = ("dataset", "arch"), logy: bool = False, ylim=None):
    """Grid of per-epoch curves: rows = ``row`` values, columns = ``panel_cols`` combinations,
    one colour per norm, mean and 95% band over seeds. Returns ``(fig, data)`` where ``data``
    is the plotted :func:`curve_stats` frame (for the figure's CSV).
    """
    check_columns(hist, [row, *panel_cols, "norm", "seed", "epoch", metric], "history frame")
    rows = list(dict.fromkeys(hist[row]))
    panels = list(dict.fromkeys(map(tuple, hist[list(panel_cols)].values)))
    norms = ordered_norms(hist["norm"])
    fig, axes = plt.subplots(len(rows), len(panels), squeeze=False, sharex="col", sharey=not logy,
                             figsize=(2.8 * len(panels) + 0.8, 2.8 * len(rows)))
    for i, r in enumerate(rows):
        for j, p in enumerate(panels):
            ax = axes[i, j]
            sel = rows_where(hist, [row, *panel_cols], (r, *p))
            for n in norms:
                s = sel[sel["norm"] == n]
                if len(s):
                    _seed_curve(ax, s, metric, label=NORM_LABELS.get(n, n), color=norm_color(n),
                                bounds=metric_bounds(metric))
            ax.xaxis.set_major_locator(mticker.MaxNLocator(integer=True))  # whole epochs
            if logy:
                _plain_log_y(ax)
            if ylim is not None:
                ax.set_ylim(*ylim)
            if i == 0:
                ax.set_title(" / ".join(map(words, p)), fontsize=10)
            if j == 0:
                ax.set_ylabel(f"{words(r)}\n{ylabel or words(metric)}", fontsize=9)
            if i == len(rows) - 1:
                ax.set_xlabel("epoch")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=len(handles), frameon=False,
                   bbox_to_anchor=(0.5, 1.0 + 0.02 * (4 / max(len(rows), 1))))
    fig.tight_layout()
    return fig, curve_stats(hist, metric, by=[row, *panel_cols, "norm"])


def plot_gamma_sigma(gs: pd.DataFrame, per_layer: pd.DataFrame):
    """Per-layer distribution of gamma/sigma (log scale, pooled over seeds and settings), one
    panel per (data set, architecture), the line gamma/sigma = 1, and the fraction above 1 per
    layer (mean over all runs of the panel). Returns the figure.
    """
    cols = ["dataset", "arch"]
    check_columns(gs, [*cols, "layer", "ratio"], "gamma/sigma frame")
    panels = list(dict.fromkeys(map(tuple, gs[cols].values)))
    width = max(3.2, 0.5 * gs["layer"].nunique() + 1.5)
    fig, axes = panel_grid(1, max(len(panels), 1), width, 3.2)
    for j, p in enumerate(panels):
        ax = axes[0, j]
        sel = rows_where(gs, cols, p)
        layers = list(dict.fromkeys(sel["layer"]))
        ax.boxplot([np.clip(sel.loc[sel["layer"] == lay, "ratio"].to_numpy(dtype=float), 1e-6, None)
                    for lay in layers], showfliers=True, flierprops={"markersize": 2})
        _plain_log_y(ax)
        ax.axhline(1.0, color="k", lw=1, ls="--")
        fracs = rows_where(per_layer, cols, p).groupby("layer", sort=False)["frac_above"].mean()
        ax.set_xticks(range(1, len(layers) + 1))
        ax.set_xticklabels([f"{lay}\n{100 * fracs.get(lay, np.nan):.0f}%" for lay in layers],
                           rotation=60, fontsize=7, ha="right")
        ax.set_title(" / ".join(map(words, p)), fontsize=10)
        if j == 0:
            ax.set_ylabel(r"$|\gamma| / \sigma_{running}$ per channel")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# Notebook 05: the gamma/sigma penalty
# --------------------------------------------------------------------------------------------


def arm_style(label: str, arms: Mapping[str, tuple[str, PenaltyConfig | None]]) -> dict:
    """Colour and marker of an arm: reference norms in their fixed colours (squares), the BN
    arms along a light-to-dark orange-red ramp in sweep order (circles for the square form,
    triangles for the hinge), plain BN lightest."""
    norm, penalty = arms[label]
    if norm != "bn":
        return {"color": norm_color(norm), "marker": "s"}
    bn_arms = [k for k, (n, _) in arms.items() if n == "bn"]
    pos = bn_arms.index(label) / max(len(bn_arms) - 1, 1)
    color = matplotlib.colormaps["YlOrRd"](0.35 + 0.6 * pos)
    return {"color": color, "marker": "^" if penalty and penalty.form == "hinge" else "o"}


def _short(label: str) -> str:
    """A BN arm's label without the words every BN arm shares."""
    return words(label).replace("BN ", "").replace("square ", "")


def plot_tradeoff(summary: pd.DataFrame, arms: Mapping[str, tuple[str, PenaltyConfig | None]], *,
                  x: str = "mem", y: str = "test_acc", ax=None, xlabel: str = "", ylabel: str = ""):
    """Scatter one point per arm at (``x``, ``y``) in percent with 95% error bars on both axes;
    the BN square-form sweep is joined by a line in order of lambda; the legend names each arm
    (colour and marker, :func:`arm_style`). ``summary`` has ``<col>``,
    ``<col>_lo``, ``<col>_hi`` per arm (:func:`arm_summary`, :func:`bank_table`). Returns ax."""
    ax = ax if ax is not None else plt.gca()
    s = summary.set_index("arm")
    line = [a for a, (n, penalty) in arms.items()
            if n == "bn" and (not penalty or penalty.form == "square") and a in s.index]
    if len(line) > 1:
        ax.plot(s.loc[line, x] * 100.0, s.loc[line, y] * 100.0, color="grey", lw=1, zorder=1)
    for label in [a for a in arms if a in s.index]:
        r = s.loc[label]
        st = arm_style(label, arms)
        xerr = np.array([[r[x] - r[f"{x}_lo"]], [r[f"{x}_hi"] - r[x]]]) * 100.0
        yerr = np.array([[r[y] - r[f"{y}_lo"]], [r[f"{y}_hi"] - r[y]]]) * 100.0
        ax.errorbar(r[x] * 100.0, r[y] * 100.0, xerr=np.nan_to_num(xerr),
                    yerr=np.nan_to_num(yerr), fmt=st["marker"], color=st["color"], ms=6,
                    capsize=2, label=words(label), zorder=2)
    ax.set(xlabel=xlabel or words(x), ylabel=ylabel or words(y))
    return ax


def plot_ratio_distribution(gs: pd.DataFrame, arms: Mapping[str, tuple[str, PenaltyConfig | None]], *,
                            column: str = "ratio", ax=None):
    """Box plot of per-channel gamma/sigma (all BN layers and seeds pooled) per BN arm, log scale,
    with the line ratio = 1 where the theory's amplification (gamma/sigma)^2 exceeds 1."""
    ax = ax if ax is not None else plt.gca()
    labels = [a for a, (n, _) in arms.items() if n == "bn" and a in set(gs["arm"])]
    data = [gs.loc[gs["arm"] == a, column].to_numpy(dtype=float) for a in labels]
    parts = ax.boxplot(data, showfliers=False, patch_artist=True, widths=0.6)
    for patch, label in zip(parts["boxes"], labels, strict=True):
        patch.set_facecolor(arm_style(label, arms)["color"])
        patch.set_alpha(0.6)
    ax.axhline(1.0, ls="--", color="grey", lw=1)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(mticker.FormatStrFormatter("%g"))
    ax.set_xticks(range(1, len(labels) + 1), [_short(a) for a in labels], rotation=30,
                  ha="right", fontsize=8)
    ax.set_ylabel("|gamma| / sigma per channel")
    return ax


def plot_arm_curves(hist: pd.DataFrame, arms: Mapping[str, tuple[str, PenaltyConfig | None]],
                    metric: str = MEM_METRIC, *, ax=None, ylabel: str = "") -> tuple:
    """Per-epoch ``metric`` per arm in percent, mean and 95% band over seeds (reference norms
    dashed). Returns ``(ax, data)`` with the plotted means and intervals per (arm, epoch)."""
    ax = ax if ax is not None else plt.gca()
    rows = []
    for label, (norm, _) in arms.items():
        sel = hist[hist["arm"] == label]
        if sel.empty:
            continue
        wide = _seed_curve(ax, sel, metric, 100.0, label=words(label),
                           color=arm_style(label, arms)["color"], ls="--" if norm != "bn" else "-")
        for epoch in wide.columns:
            e = mean_ci(wide[epoch].to_numpy(dtype=float))
            rows.append({"arm": label, "epoch": int(epoch), "metric": metric,
                         "mean": e.mean, "lo": e.lo, "hi": e.hi, "n": e.n})
    ax.set(xlabel="epoch", ylabel=ylabel or words(metric))
    return ax, pd.DataFrame(rows)


def plot_arm_memorization(hist: pd.DataFrame, arms: Mapping[str, tuple[str, PenaltyConfig | None]]):
    """Notebook 05's curves: memorization of the flipped labels and clean test accuracy over
    training, one curve per arm. Returns ``(fig, data)``."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    _, mem_curves = plot_arm_curves(hist, arms, MEM_METRIC, ax=axes[0],
                                    ylabel="memorization of flipped labels (%)")
    _, acc_curves = plot_arm_curves(hist, arms, "test_acc", ax=axes[1],
                                    ylabel="clean test accuracy (%)")
    axes[1].legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    return fig, pd.concat([mem_curves, acc_curves])


def plot_tradeoff_panels(summary: pd.DataFrame, arms: Mapping[str, tuple[str, PenaltyConfig | None]],
                         btable: pd.DataFrame | None = None, attack: str = "auto"):
    """Notebook 05's trade-off figure: clean accuracy against memorization per arm and, with the
    banks' table, against the attack's AUC on all samples and on the flipped ones (``"auto"``:
    the attack the table names, :func:`bnmem_utils.analyses.mitigation.bank_table`'s headline
    attack by default). Returns ``(fig, data)``."""
    if attack == "auto" and btable is not None and "attack" in btable and len(btable):
        attack = str(btable.attack.iloc[0])                    # one attack per bank table
    n_panels = 3 if btable is not None else 1
    fig, (axes,) = panel_grid(1, n_panels, 5, 4.2)
    plot_tradeoff(summary, arms, x="mem", y="test_acc", ax=axes[0],
                  xlabel="memorization of flipped labels (%)", ylabel="clean test accuracy (%)")
    if btable is not None:
        for ax, col, what in ((axes[1], "auc", "all samples"),
                              (axes[2], "auc_outlier", "flipped samples")):
            if col in btable:
                plot_tradeoff(btable, arms, x=col, y="bank_test_acc", ax=ax,
                              xlabel=f"AUC, {what} (%)\n{words(attack)}",
                              ylabel="clean test accuracy of bank models (%)")
                ax.axvline(50, ls=":", color="grey", lw=1)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1.08))
    fig.tight_layout()
    data = pd.concat([summary.assign(source="sweep"),
                      btable.assign(source="bank") if btable is not None else None])
    return fig, data
