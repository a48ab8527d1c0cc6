"""The figures of notebook 03 (per-sample gradient norms): the ECDFs, the noisy-to-clean ratio
over epochs, BN against no norm, and the per-layer ratios, in the style of
:mod:`bnmem_utils.figures.plotting`.
"""

from __future__ import annotations

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from bnmem_utils.analyses.report import WORDS
from bnmem_utils.figures.plotting import norm_color, panel_grid, plot_mean_ci
from bnmem_utils.jobs.config import DEFINITIONS
from bnmem_utils.jobs.gradnorms import NOISY, SETTING, geometric_ci, ratio_estimates
from bnmem_utils.models.nets import NORM_LABELS, ordered_norms

# --------------------------------------------------------------------------------------------
# Notebook 03: per-sample gradient norms
# --------------------------------------------------------------------------------------------


def name_setting(fig, here: dict[str, str]) -> None:
    """Put the data set and network of ``here`` (``{"dataset": ..., "arch": ...}``) above
    ``fig``'s own title: notebook 03 draws each figure once per setting when it has several."""
    words = ", ".join(WORDS[k].get(v, v) for k, v in here.items())
    old = fig.get_suptitle()
    fig.suptitle(f"{words}: {old}" if old else words)
    fig.tight_layout()


def _def_title(d: str, batch_size: int | None) -> str:
    """A definition as panel titles name it (train mode with its batch size)."""
    t = {"eval": "eval mode: running BN stats", "train": "train mode: batch BN stats"}[d]
    return t + (f" (B={batch_size})" if d == "train" and batch_size else "")


def _definition_panels(frame: pd.DataFrame, nrows: int, width: float, height: float, **kw):
    """The definitions in ``frame`` (in :data:`DEFINITIONS` order) and a figure with a column of
    ``nrows`` panels per definition: ``(defs, fig, axes)``."""
    defs = [d for d in DEFINITIONS if d in set(frame["definition"])]
    return defs, *panel_grid(nrows, len(defs), width, height, **kw)


def _ratio_band(ax, e: pd.DataFrame, color, label: str) -> None:
    """A ratio over epochs (markers) with its 95% interval as a band."""
    ax.plot(e["epoch"], e["ratio"], marker="o", ms=3, color=color, label=label)
    ax.fill_between(e["epoch"], e["lo"], e["hi"], color=color, alpha=0.2, linewidth=0)


def _log_ratio_axis(ax, title: str) -> None:
    """A ratio panel's log y axis with the line at 1, its title and legend."""
    ax.axhline(1, color="k", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def _tidy_log_x(ax, max_labels: int = 5) -> None:
    """Readable labels on a log axis: over a narrow range (at initialisation every norm is
    alike) matplotlib labels the minor ticks too and they overlap; keep at most ``max_labels``
    labelled ticks, at 1-2-5 steps, and no minor labels."""
    axis = ax.xaxis
    lo, hi = ax.get_xlim()  # applies any pending autoscaling
    if not (lo > 0 and hi > lo):
        return
    decades = np.log10(hi / lo)
    if decades >= 2:
        axis.set_major_locator(mticker.LogLocator(base=10, numticks=max_labels + 1))
    else:
        ticks = [m * 10.0 ** e for e in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
                 for m in (1.0, 2.0, 5.0) if lo <= m * 10.0 ** e <= hi]
        if len(ticks) < 3:  # under a decade or so: evenly spaced round values
            ticks = [t for t in mticker.MaxNLocator(nbins=max_labels - 1).tick_values(lo, hi)
                     if lo <= t <= hi]
        axis.set_major_locator(mticker.FixedLocator(ticks))
        axis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
    axis.set_minor_formatter(mticker.NullFormatter())


def plot_ecdf(frame: pd.DataFrame, epoch: int, *, batch_size: int | None = None):
    """ECDFs of per-sample gradient norms (log scale), clean against noisy, pooled over seeds:
    one row per definition, one column per norm, at ``epoch``. Returns ``(fig, data)``."""
    sub = frame[frame["epoch"] == epoch]
    if sub.empty:
        raise ValueError(f"epoch {epoch} was not measured; measured: {sorted(frame['epoch'].unique())}")
    defs = [d for d in DEFINITIONS if d in set(sub["definition"])]
    norms = ordered_norms(sub["norm"])
    fig, axes = panel_grid(len(defs), len(norms), 3.2, 2.9, sharex=True, sharey=True)
    for i, d in enumerate(defs):
        for j, norm in enumerate(norms):
            ax = axes[i, j]
            cell = sub[(sub["definition"] == d) & (sub["norm"] == norm)]
            if cell.empty and d == "train" and norm != "bn":
                ax.set_axis_off()  # one definition without BN: shown in the eval row
                ax.text(0.5, 0.5, f"{NORM_LABELS.get(norm, norm)}: no BN layers,\n"
                        "train mode = eval mode (above)", ha="center", va="center",
                        transform=ax.transAxes, fontsize=9, color="0.4")
                if i > 0:  # the panel above then carries the x axis
                    axes[i - 1, j].tick_params(labelbottom=True)
                    axes[i - 1, j].set_xlabel("per-sample gradient L2 norm")
                continue
            for group, color in (("clean", "0.55"), (NOISY, norm_color(norm))):
                v = np.sort(cell.loc[cell["group"] == group, "grad_norm"].to_numpy())
                if v.size:
                    ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", color=color,
                            label=f"{group} (median {np.median(v):.3g})")
            ax.set_xscale("log")
            # A model without BN has one definition: its panels say so, not "running BN stats".
            sub_title = ("no BN layers: train = eval mode" if norm != "bn"
                         else _def_title(d, batch_size))
            ax.set_title(f"{NORM_LABELS.get(norm, norm)}\n{sub_title}", fontsize=9)
            ax.legend(fontsize=7, loc="lower right")
            if i == len(defs) - 1:
                ax.set_xlabel("per-sample gradient L2 norm")
            if j == 0:
                ax.set_ylabel("fraction of samples")
    _tidy_log_x(axes[0, 0])  # the x axis is shared by every panel
    fig.suptitle(f"Per-sample gradient norms at epoch {epoch}, clean vs noisy (pooled over seeds)")
    fig.tight_layout()
    cols = [*SETTING, "norm", "definition", "seed", "epoch", "sample", "kind", "group", "grad_norm"]
    return fig, sub[cols].reset_index(drop=True)


def plot_ratio_curves(table: pd.DataFrame, *, batch_size: int | None = None):
    """Top row: noisy/clean median ratio over epochs per norm (geometric mean over seeds, 95%
    interval; log scale); bottom row: memorization (accuracy on the noisy samples against their
    training labels). One column per definition. Returns ``(fig, data)``."""
    est = ratio_estimates(table)
    norms = ordered_norms(est["norm"])
    defs, fig, axes = _definition_panels(est, 2, 5.2, 3.2, sharex=True,
                                         gridspec_kw={"height_ratios": [3, 2]})
    for j, d in enumerate(defs):
        ax, ax2 = axes[0, j], axes[1, j]
        for norm in norms:
            c = norm_color(norm)
            e = est[(est["definition"] == d) & (est["norm"] == norm)].sort_values("epoch")
            _ratio_band(ax, e, c, NORM_LABELS.get(norm, norm))
            t = table[(table["definition"] == d) & (table["norm"] == norm)]
            runs = t.pivot(index="seed", columns="epoch", values="noisy_acc")
            plot_mean_ci(runs.columns.to_numpy(), runs.to_numpy(), ax2, color=c, marker="o", ms=3)
        _log_ratio_axis(ax, "median noisy / median clean gradient norm\n"
                        + _def_title(d, batch_size))
        ax2.set_xlabel("epoch (0: initialisation)")
        ax2.xaxis.set_major_locator(mticker.MaxNLocator(integer=True))  # whole epochs only
        ax2.set_ylabel("accuracy on noisy samples\n(memorization)")
        ax2.set_ylim(-0.02, 1.02)
    axes[0, 0].set_ylabel("ratio (geo. mean over seeds,\n95% CI)")
    fig.tight_layout()
    return fig, est


def plot_versus(versus: pd.DataFrame, *, batch_size: int | None = None):
    """BN's median noisy gradient norm over that of each other norm, per epoch (paired by seed,
    geometric mean, 95% interval; log scale). One panel per definition. Returns ``(fig, data)``."""
    defs, fig, axes = _definition_panels(versus, 1, 5.2, 3.6, sharey=True)
    for j, d in enumerate(defs):
        ax = axes[0, j]
        for ref in ordered_norms(versus["reference"]):
            e = versus[(versus["definition"] == d) & (versus["reference"] == ref)]
            _ratio_band(ax, e.sort_values("epoch"), norm_color(ref),
                        f"BN / {NORM_LABELS.get(ref, ref)}")
        _log_ratio_axis(ax, "median noisy norm, BN over the other model\n"
                        f"BN: {_def_title(d, batch_size)}")
        ax.set_xlabel("epoch (0: initialisation)")
        ax.xaxis.set_major_locator(mticker.MaxNLocator(integer=True))
    axes[0, 0].set_ylabel("ratio (geometric mean over seeds, 95% CI)")
    fig.tight_layout()
    return fig, versus


def plot_layers(layers: pd.DataFrame, *, batch_size: int | None = None):
    """Per layer (in depth order), the noisy/clean median ratio of each norm at one epoch
    (geometric mean over seeds, 95% interval). One panel per definition. Returns ``(fig, data)``."""
    defs, fig, axes = _definition_panels(layers, 1, 6.0, 3.8, sharey=True)
    rows, keys = [], [*SETTING, "norm", "definition", "layer", "depth"]
    for k, grp in layers.groupby(keys, sort=False):
        e = geometric_ci(grp["ratio"])
        rows.append({**dict(zip(keys, k, strict=True)), "epoch": int(grp["epoch"].iloc[0]),
                     "ratio": e.mean, "lo": e.lo, "hi": e.hi, "n": e.n})
    est = pd.DataFrame(rows)
    for j, d in enumerate(defs):
        ax = axes[0, j]
        for norm in ordered_norms(est["norm"]):
            e = est[(est["definition"] == d) & (est["norm"] == norm)].sort_values("depth")
            x = e["depth"] / max(1, e["depth"].max())           # 0 = first layer, 1 = last
            ax.errorbar(x, e["ratio"], yerr=[e["ratio"] - e["lo"], e["hi"] - e["ratio"]],
                        marker="o", ms=4, capsize=2, color=norm_color(norm),
                        label=NORM_LABELS.get(norm, norm))
        _log_ratio_axis(ax, f"noisy/clean median norm per layer, epoch {int(est['epoch'].iloc[0])}"
                        f"\n{_def_title(d, batch_size)}")
        ax.set_xlabel("relative depth of the layer (0: first, 1: classifier)")
    axes[0, 0].set_ylabel("ratio (geometric mean over seeds)")
    fig.tight_layout()
    return fig, est
