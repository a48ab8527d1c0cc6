"""Every figure of the notebooks, in one style, and the one ``save_figure`` they all use.

The figure functions come in notebook order (01 theory ... 06 claims); each takes the frames or
objects its notebook already holds and returns the figure (or axes), and its data where the
notebook saves them.

``save_figure`` writes PDF (embedded TrueType fonts) + PNG + the CSV of the plotted data and adds
an entry to ``figures/<profile>/manifest.json`` (and its Markdown twin ``manifest.md``) naming the
notebook, profile, parameters and commit that made the figure.

Outputs are byte-identical across reruns of the same data: the PDF and PNG carry fixed metadata
(no creation date), every CSV is written with one float format (:data:`CSV_FLOAT_FORMAT`, so a
float32 column and its float64 copy read back from a cache give the same text), and the manifest
holds no wall-clock time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from . import attacks, confound
from .cache import atomic_path, atomic_write_text
from .config import PenaltyConfig
from .grads import DEFINITIONS, NOISY, geometric_ci, ratio_estimates
from .memorization import MEM_METRIC, check_columns, curve_stats
from .models import NORM_LABELS, NORMS, ordered_norms
from .outputs import manifest_markdown, manifest_texts, read_manifest  # noqa: F401 (re-exported)
from .stats import mean_ci
from .theory import MODES, GammaLoop, typical_seed_index

#: The one float format of every figure CSV (6 significant digits: float32 and float64 agree).
CSV_FLOAT_FORMAT = "%.6g"
#: Fixed figure metadata: no creation date, so saving the same figure twice gives the same bytes.
FIGURE_METADATA = {
    "pdf": {"CreationDate": None, "ModDate": None, "Producer": "bnmem (matplotlib)"},
    "png": {"Software": "bnmem (matplotlib)"},
}

NORM_ORDER = NORMS
_PALETTE = sns.color_palette("colorblind")
NORM_COLORS = {"bn": _PALETTE[3], "none": _PALETTE[0], "gn": _PALETTE[2], "ln": _PALETTE[4]}


def norm_color(norm: str):
    """The fixed colour of a norm kind (bn, none, gn, ln) in every figure."""
    if norm not in NORM_COLORS:
        raise ValueError(f"unknown norm {norm!r}; valid choices: {', '.join(NORM_ORDER)}")
    return NORM_COLORS[norm]


def set_style() -> None:
    """Seaborn whitegrid, colour-blind palette, embedded fonts in PDF and PS."""
    sns.set_theme(style="whitegrid", palette="colorblind", context="notebook")
    matplotlib.rcParams.update({
        "pdf.fonttype": 42,
        "ps.fonttype": 42,
        "savefig.bbox": "tight",
        "savefig.dpi": 150,
        "figure.dpi": 100,
        "axes.spines.top": False,
        "axes.spines.right": False,
    })


def plot_mean_ci(x, runs, ax=None, *, label=None, color=None, confidence: float = 0.95,
                 bounds: tuple[float | None, float | None] = (None, None), **kw):
    """Plot the mean over runs (axis 0 of ``runs``) with a shaded t-interval, clipped to the
    metric's range ``bounds`` (e.g. ``(0, 1)`` for an accuracy); return the axes."""
    from scipy import stats as st

    ax = ax if ax is not None else plt.gca()
    runs = np.asarray(runs, dtype=float)
    if runs.ndim == 1:
        runs = runs[None]
    n = np.sum(~np.isnan(runs), axis=0)
    mean = np.nanmean(runs, axis=0)
    (line,) = ax.plot(x, mean, label=label, color=color, **kw)
    if runs.shape[0] > 1:
        sd = np.nanstd(runs, axis=0, ddof=1)
        half = st.t.ppf(0.5 + confidence / 2, np.maximum(n - 1, 1)) * sd / np.sqrt(np.maximum(n, 1))
        band = mean - half, mean + half
        if bounds != (None, None):
            band = tuple(np.clip(v, *bounds) for v in band)
        ax.fill_between(x, *band, color=line.get_color(), alpha=0.2, linewidth=0)
    return ax


def _to_frame(data):
    """``data`` as a frame; a dict of columns of unequal lengths in long format (series, index,
    value)."""
    if data is None or isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, dict) and len({np.size(v) for v in data.values()}) > 1:
        rows = [(k, i, v) for k, vals in data.items() for i, v in enumerate(np.ravel(vals))]
        return pd.DataFrame(rows, columns=["series", "index", "value"])
    if isinstance(data, dict):
        return pd.DataFrame({k: np.ravel(v) for k, v in data.items()})
    return pd.DataFrame(data)


def figure_title(fig) -> str:
    """The figure's title, for captions: its suptitle, else its first axes title ("" if none)."""
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text():
        return sup.get_text()
    titles = [ax.get_title(loc=loc) for ax in fig.axes for loc in ("center", "left")]
    return next((" ".join(t.split()) for t in titles if t), "")


def save_figure(fig, name: str, data=None, *, folder: str | os.PathLike, notebook: str = "",
                profile: str = "", parameters: dict | None = None, commit: str = "") -> dict:
    """Write ``<folder>/<name>.pdf|.png|.csv`` and a manifest entry; return that entry.

    ``data`` is the plotted data (DataFrame, dict of columns or records), so every figure can be
    re-plotted or checked without re-running the notebook. Notebooks call this through
    :meth:`bnmem_utils.notebook.NotebookContext.save_figure`, which fills in the provenance.
    """
    if not name or any(c in name for c in "/\\ "):
        raise ValueError(f"figure name {name!r} must be non-empty without slashes or spaces")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for ext in ("pdf", "png"):
        path = folder / f"{name}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, metadata=FIGURE_METADATA[ext])
        files.append(path.name)
    frame = _to_frame(data)
    if frame is not None:
        path = folder / f"{name}.csv"
        with atomic_path(path) as tmp:
            frame.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT, lineterminator="\n")
        files.append(path.name)
    entry = {"figure": name, "title": figure_title(fig), "notebook": notebook,
             "profile": profile, "parameters": parameters or {}, "commit": commit,
             "files": files}
    _update_manifest(folder, entry)
    return entry


def _update_manifest(folder: Path, entry: dict) -> None:
    manifest = read_manifest(folder)
    manifest[entry["figure"]] = entry
    for file, text in manifest_texts(manifest).items():
        atomic_write_text(folder / file, text)


def _panels(nrows: int, ncols: int, width: float, height: float, **kw):
    """``plt.subplots`` of ``nrows`` x ``ncols`` panels of ``width`` x ``height`` inches each,
    the axes always a 2-D array."""
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)


def new_figure(figsize=(6.4, 3.0)) -> Figure:
    """A figure outside pyplot, for the explorers' views (never shown by the inline backend on
    its own)."""
    return Figure(figsize=figsize, layout="constrained")


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
    axes = _panels(1, len(cosines), 5, 4.2, sharey=True, layout="constrained")[1][0]
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


def _where(frame: pd.DataFrame, cols: Sequence[str], values) -> pd.DataFrame:
    """The rows of ``frame`` whose columns ``cols`` hold ``values``."""
    return frame[np.logical_and.reduce([frame[c] == v for c, v in zip(cols, values, strict=True)])]


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
            sel = _where(hist, [row, *panel_cols], (r, *p))
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
                ax.set_title(" / ".join(map(str, p)), fontsize=10)
            if j == 0:
                ax.set_ylabel(f"{r}\n{ylabel or metric}", fontsize=9)
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
    fig, axes = _panels(1, max(len(panels), 1), width, 3.2)
    for j, p in enumerate(panels):
        ax = axes[0, j]
        sel = _where(gs, cols, p)
        layers = list(dict.fromkeys(sel["layer"]))
        ax.boxplot([np.clip(sel.loc[sel["layer"] == lay, "ratio"].to_numpy(dtype=float), 1e-6, None)
                    for lay in layers], showfliers=True, flierprops={"markersize": 2})
        _plain_log_y(ax)
        ax.axhline(1.0, color="k", lw=1, ls="--")
        fracs = _where(per_layer, cols, p).groupby("layer", sort=False)["frac_above"].mean()
        ax.set_xticks(range(1, len(layers) + 1))
        ax.set_xticklabels([f"{lay}\n{100 * fracs.get(lay, np.nan):.0f}%" for lay in layers],
                           rotation=60, fontsize=7, ha="right")
        ax.set_title(" / ".join(map(str, p)), fontsize=10)
        if j == 0:
            ax.set_ylabel(r"$|\gamma| / \sigma_{running}$ per channel")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# Notebook 03: per-sample gradient norms
# --------------------------------------------------------------------------------------------


def _def_title(d: str, batch_size: int | None) -> str:
    """A definition as panel titles name it (train mode with its batch size)."""
    t = {"eval": "eval mode: running BN stats", "train": "train mode: batch BN stats"}[d]
    return t + (f" (B={batch_size})" if d == "train" and batch_size else "")


def _definition_panels(frame: pd.DataFrame, nrows: int, width: float, height: float, **kw):
    """The definitions in ``frame`` (in :data:`DEFINITIONS` order) and a figure with a column of
    ``nrows`` panels per definition: ``(defs, fig, axes)``."""
    defs = [d for d in DEFINITIONS if d in set(frame["definition"])]
    return defs, *_panels(nrows, len(defs), width, height, **kw)


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
    fig, axes = _panels(len(defs), len(norms), 3.2, 2.9, sharex=True, sharey=True)
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
    cols = ["norm", "definition", "seed", "epoch", "sample", "kind", "group", "grad_norm"]
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
    rows = []
    for (norm, d, layer, depth), grp in layers.groupby(["norm", "definition", "layer", "depth"],
                                                       sort=False):
        e = geometric_ci(grp["ratio"])
        rows.append({"norm": norm, "definition": d, "layer": layer, "depth": depth,
                     "epoch": int(grp["epoch"].iloc[0]), "ratio": e.mean, "lo": e.lo, "hi": e.hi,
                     "n": e.n})
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


# --------------------------------------------------------------------------------------------
# Notebook 04: LiRA (ROC curves, AUC against the gap, one sample's exposure, matched gap)
# --------------------------------------------------------------------------------------------


def plot_roc_grid(banks, attack: str = "lira_online"):
    """Notebook 04's ROC figure: one panel per (data set, architecture) row and outlier setting
    column, one log-log ROC curve per norm (all samples, mean over targets, shaded 95% interval,
    FPR 1e-5 to 1), AUC in the legend."""
    settings = list(dict.fromkeys(b.config.setting for b in banks))
    groups = list(dict.fromkeys((b.config.dataset, b.config.arch) for b in banks))
    fig, axes = _panels(len(groups), len(settings), 4.2, 4, sharex=True, sharey=True)
    for b in banks:
        r, c = groups.index((b.config.dataset, b.config.arch)), settings.index(b.config.setting)
        ax = axes[r][c]
        loo = b.evaluate()
        auc = attacks.metric_estimate(loo.metrics, attack)
        roc = loo.roc[(loo.roc.attack == attack) & (loo.roc.subset == "all")]
        if roc.empty:
            raise ValueError(f"no ROC rows for attack {attack!r} on subset 'all'")
        wide = roc.pivot(index="target", columns="fpr", values="tpr")   # (targets, grid)
        plot_mean_ci(wide.columns.to_numpy(dtype=float),
                     np.clip(wide.to_numpy(dtype=float), 1e-5, 1), ax,
                     label=f"{NORM_LABELS[b.config.norm]} (AUC {auc.mean:.3f})",
                     color=norm_color(b.config.norm))
        ax.plot([1e-5, 1], [1e-5, 1], ls=":", color="grey", lw=1)
        ax.set(xscale="log", yscale="log", xlim=(1e-5, 1), ylim=(1e-5, 1),
               xlabel="false-positive rate", ylabel="true-positive rate")
        ax.set_title(f"{b.config.dataset}/{b.config.arch}, {b.config.setting}")
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{attack}: ROC per arm (all samples)")
    fig.tight_layout()
    return fig


def plot_auc_vs_gap(banks, attack: str = "lira_online"):
    """Each bank's attack AUC (all samples) against its models' generalisation gap, with 95%
    intervals, coloured by norm and labelled by setting. Returns ``(fig, data)``."""
    fig, ax = plt.subplots(figsize=(5, 4))
    rows = []
    for b in banks:
        auc = attacks.metric_estimate(b.evaluate().metrics, attack)
        gap = b.accuracy("gap")
        ax.errorbar(gap.mean, auc.mean, xerr=[[gap.mean - gap.lo], [gap.hi - gap.mean]],
                    yerr=[[auc.mean - auc.lo], [auc.hi - auc.mean]], fmt="o",
                    color=norm_color(b.config.norm))
        ax.annotate(b.config.setting, (gap.mean, auc.mean), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")
        rows.append({"arm": b.config.arm, "norm": b.config.norm, "gap": gap.mean,
                     "gap_lo": gap.lo, "gap_hi": gap.hi, "auc": auc.mean, "auc_lo": auc.lo,
                     "auc_hi": auc.hi})
    for norm in dict.fromkeys(b.config.norm for b in banks):
        ax.plot([], [], "o", color=norm_color(norm), label=NORM_LABELS[norm])
    ax.set(xlabel="generalisation gap (train - test accuracy)", ylabel=f"{attack} AUC")
    ax.legend()
    return fig, pd.DataFrame(rows)


def plot_bank_memorization(banks):
    """Histograms of the banks' Feldman-Zhang memorization scores, one panel per setting: clean
    samples as outlines, outliers filled, one colour per norm (log density)."""
    settings = list(dict.fromkeys(b.config.setting for b in banks))
    fig, axes = _panels(1, max(1, len(settings)), 4.2, 3.6, sharey=True)
    bins = np.linspace(-1, 1, 21)
    for c, setting in enumerate(settings):
        ax = axes[0][c]
        for b in [b for b in banks if b.config.setting == setting]:
            m = b.memorization()
            ax.hist(m[~b.outliers], bins=bins, density=True, histtype="step",
                    color=norm_color(b.config.norm), label=f"{NORM_LABELS[b.config.norm]}, clean")
            if b.outliers.any():
                ax.hist(m[b.outliers], bins=bins, density=True, histtype="stepfilled", alpha=0.35,
                        color=norm_color(b.config.norm),
                        label=f"{NORM_LABELS[b.config.norm]}, outliers")
        ax.set(title=setting, xlabel="memorization (acc in - acc out)", yscale="log")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("density")
    fig.tight_layout()
    return fig


def plot_sample_privacy(df: pd.DataFrame, image: np.ndarray | None = None, *, fig=None,
                        attack: str = "lira_online", note: str = ""):
    """The sample's image, then one panel per norm: the shadows' scores on it (IN: trained on
    it, OUT: did not) for one query, as points with the Gaussians fitted to them, and the target
    model's score as a vertical line. Each panel's title gives the log-likelihood ratio of the
    target's score under the two Gaussians drawn (this query alone; the attack's own score,
    averaged over every query, is in the readout). ``note`` goes above the panels. The score
    panels share their x axis. Returns the figure."""
    k = len(df)
    fig = fig if fig is not None else new_figure((3.0 + 3.4 * k, 3.2))
    axes = fig.subplots(1, k + 1, gridspec_kw={"width_ratios": [0.8] + [1.2] * k})
    r0 = df.iloc[0]
    ax = axes[0]
    if image is not None:
        img = np.asarray(image, dtype=float)
        if img.ndim == 3:  # (C, H, W): one channel in grey, three in colour
            img = img[0] if img.shape[0] == 1 else np.moveaxis(img, 0, -1)
        lo, hi = float(img.min()), float(img.max())
        ax.imshow((img - lo) / (hi - lo or 1.0), cmap="gray_r" if img.ndim == 2 else None,
                  vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.set_title(f"#{r0['index']}: label {r0['label']}\n{r0['kind']}", fontsize=10)
    allv = np.concatenate([np.atleast_1d(v) for col in ("in_scores", "out_scores")
                           for v in df[col]] + [df["target_score"].to_numpy()])
    allv = allv[np.isfinite(allv)]
    span = (allv.max() - allv.min()) if allv.size else 1.0
    lo, hi = (allv.min() - 0.15 * span - 1e-6, allv.max() + 0.15 * span + 1e-6) if allv.size else (-1, 1)
    grid = np.linspace(lo, hi, 300)
    for ax, (_, r) in zip(axes[1:], df.iterrows(), strict=True):
        colour = norm_color(r["norm"])
        curves = []
        for name, vals, c in (("IN", r["in_scores"], colour), ("OUT", r["out_scores"], "0.45")):
            vals = np.asarray(vals, dtype=float)
            if vals.size:
                # centre and spread as LiRA fits them (median; a floor when one shadow is all)
                mu, sd = float(np.median(vals)), max(float(vals.std()), 0.05 * span + 1e-3)
                dens = np.exp(-0.5 * ((grid - mu) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
                curves.append((name, vals, c, dens, mu, sd))
        top = max([float(cv[3].max()) for cv in curves] + [1e-3])
        for k_, (name, vals, c, dens, *_) in enumerate(curves):
            ax.plot(grid, dens, color=c, lw=1.8, label=f"{name} shadows ({vals.size})")
            ax.plot(vals, np.full(vals.size, -(0.07 + 0.08 * k_) * top), "|", color=c, ms=9,
                    mew=1.5)  # each shadow's score
        ax.axvline(r["target_score"], color="k", lw=1.6, ls="--",
                   label=f"target {r['target']} ({'member' if r['member'] else 'non-member'})")
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(mticker.MaxNLocator(nbins=5))  # panels' labels kept apart
        ax.set_ylim(-0.22 * top, top * 1.75)  # room for the legend above the curves
        ax.set_yticks([])
        ax.set_xlabel("score log p_y - log sum p_y'")
        ax.set_title(f"{NORM_LABELS.get(r['norm'], r['norm'])}: {_drawn_llr(curves, r)},"
                     f"\nmemorization {r['memorization']:.2f}", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", frameon=False)
    if note:
        fig.suptitle(note, fontsize=9, color="#a4161a")
    return fig


def _drawn_llr(curves: list, r) -> str:
    """``"LLR 1.23 (identity query)"``: log IN density minus log OUT density of the Gaussians
    drawn, at the target's score; ``"no LLR"`` when one of the two is missing."""
    fits = {cv[0]: cv[4:6] for cv in curves}
    if set(fits) != {"IN", "OUT"}:
        return "no LLR"
    at = float(r["target_score"])
    (mu_in, sd_in), (mu_out, sd_out) = fits["IN"], fits["OUT"]
    llr = (np.log(sd_out / sd_in) - 0.5 * ((at - mu_in) / sd_in) ** 2
           + 0.5 * ((at - mu_out) / sd_out) ** 2)
    return f"LLR {llr:.2f} ({r.get('query', 'identity')} query)"


def plot_matched(points: pd.DataFrame, matches: Sequence[dict], attack: str = "lira_online"):
    """Notebook 04's figure of section 7: per (data set, architecture) a row, the attack's AUC
    against the gap (and, when the points have it, the outliers' excess), one curve per norm
    with intervals, the matched gap and each curve's reading there marked. ``points``:
    :func:`curve_frame`; ``matches``: dicts with ``dataset``, ``arch``, ``auc`` and ``excess``
    (:class:`MatchedGap` or None). Returns the figure."""
    groups_gap = list(dict.fromkeys(zip(points.dataset, points.arch, strict=True)))
    panels = [("auc", f"{attack} AUC, all samples")]
    if points.excess.notna().any():
        panels.append(("excess", "AUC on outliers - AUC on clean samples"))
    fig, axes = _panels(max(1, len(groups_gap)), len(panels), 5.2, 4.2)
    for r, (ds, arch) in enumerate(groups_gap):
        m = next((m for m in matches if (m["dataset"], m["arch"]) == (ds, arch)), None)
        for c, (col, label) in enumerate(panels):
            ax = axes[r][c]
            for norm in dict.fromkeys(points.norm):
                p = _where(points, ["dataset", "arch", "norm"], (ds, arch, norm)).sort_values("gap")
                ax.errorbar(100 * p.gap, 100 * p[col],
                            xerr=[100 * (p.gap - p.gap_lo), 100 * (p.gap_hi - p.gap)],
                            yerr=[100 * (p[col] - p[f"{col}_lo"]), 100 * (p[f"{col}_hi"] - p[col])],
                            fmt="o-", capsize=3, color=norm_color(norm), label=NORM_LABELS[norm])
                for _, q in p.iterrows():
                    ax.annotate(f"{q.epochs} ep", (100 * q.gap, 100 * q[col]), fontsize=7,
                                xytext=(4, -10), textcoords="offset points")
            res = m and m[col]
            if res is not None and res.gap is not None:
                g = 100 * res.gap
                ax.axvline(g, ls="--", color="grey", lw=1)
                ax.errorbar([g, g], [100 * res.a, 100 * res.b],
                            yerr=[[100 * (res.a - res.a_lo), 100 * (res.b - res.b_lo)],
                                  [100 * (res.a_hi - res.a), 100 * (res.b_hi - res.b)]],
                            fmt="D", ms=5, color="black", capsize=4, zorder=5)
                ax.set_title(f"{ds}/{arch}: BN - none at gap {g:.2f}\n"
                             f"{100 * res.diff:+.2f} [{100 * res.lo:+.2f}, {100 * res.hi:+.2f}] pts",
                             fontsize=9)
            elif res is not None:
                ax.set_title(f"{ds}/{arch}: no matched gap (ranges do not overlap)", fontsize=9)
            ax.set(xlabel="generalization gap, train - test accuracy (points)",
                   ylabel=f"{label} (points)")
            ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# Notebook 05: the gamma/sigma penalty
# --------------------------------------------------------------------------------------------


def arm_style(label: str, arms: Mapping[str, tuple[str, PenaltyConfig | None]]) -> dict:
    """Colour and marker of an arm: reference norms in their fixed colours (squares), the BN
    arms along a light-to-dark orange-red ramp in sweep order (circles for the square form,
    triangles for the hinge), plain BN lightest."""
    norm, spec = arms[label]
    if norm != "bn":
        return {"color": norm_color(norm), "marker": "s"}
    bn_arms = [k for k, (n, _) in arms.items() if n == "bn"]
    pos = bn_arms.index(label) / max(len(bn_arms) - 1, 1)
    color = matplotlib.colormaps["YlOrRd"](0.35 + 0.6 * pos)
    return {"color": color, "marker": "^" if spec and spec.form == "hinge" else "o"}


def _short(label: str) -> str:
    """A BN arm's label without the words every BN arm shares."""
    return label.replace("BN ", "").replace("square ", "")


def plot_tradeoff(summary: pd.DataFrame, arms: Mapping[str, tuple[str, PenaltyConfig | None]], *,
                  x: str = "mem", y: str = "test_acc", ax=None, xlabel: str = "", ylabel: str = ""):
    """Scatter one point per arm at (``x``, ``y``) in percent with 95% error bars on both axes;
    the BN square-form sweep is joined by a line in order of lambda. ``summary`` has ``<col>``,
    ``<col>_lo``, ``<col>_hi`` per arm (:func:`arm_summary`, :func:`bank_table`). Returns ax."""
    ax = ax if ax is not None else plt.gca()
    s = summary.set_index("arm")
    line = [a for a, (n, spec) in arms.items()
            if n == "bn" and (not spec or spec.form == "square") and a in s.index]
    if len(line) > 1:
        ax.plot(s.loc[line, x] * 100.0, s.loc[line, y] * 100.0, color="grey", lw=1, zorder=1)
    for label in [a for a in arms if a in s.index]:
        r = s.loc[label]
        st = arm_style(label, arms)
        xerr = np.array([[r[x] - r[f"{x}_lo"]], [r[f"{x}_hi"] - r[x]]]) * 100.0
        yerr = np.array([[r[y] - r[f"{y}_lo"]], [r[f"{y}_hi"] - r[y]]]) * 100.0
        ax.errorbar(r[x] * 100.0, r[y] * 100.0, xerr=np.nan_to_num(xerr),
                    yerr=np.nan_to_num(yerr), fmt=st["marker"], color=st["color"], ms=6,
                    capsize=2, label=label, zorder=2)
        if arms[label][0] == "bn":
            ax.annotate(_short(label), (r[x] * 100.0, r[y] * 100.0), textcoords="offset points",
                        xytext=(4, 4), fontsize=7, color=st["color"])
    ax.set(xlabel=xlabel or x, ylabel=ylabel or y)
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
        wide = _seed_curve(ax, sel, metric, 100.0, label=label,
                           color=arm_style(label, arms)["color"], ls="--" if norm != "bn" else "-")
        for epoch in wide.columns:
            e = mean_ci(wide[epoch].to_numpy(dtype=float))
            rows.append({"arm": label, "epoch": int(epoch), "metric": metric,
                         "mean": e.mean, "lo": e.lo, "hi": e.hi, "n": e.n})
    ax.set(xlabel="epoch", ylabel=ylabel or metric)
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
                         btable: pd.DataFrame | None = None, attack: str = "lira_online_fixed"):
    """Notebook 05's trade-off figure: clean accuracy against memorization per arm and, with the
    banks' table, against the attack's AUC on all samples and on the flipped ones. Returns
    ``(fig, data)``."""
    n_panels = 3 if btable is not None else 1
    fig, (axes,) = _panels(1, n_panels, 5, 4.2)
    plot_tradeoff(summary, arms, x="mem", y="test_acc", ax=axes[0],
                  xlabel="memorization of flipped labels (%)", ylabel="clean test accuracy (%)")
    if btable is not None:
        for ax, col, what in ((axes[1], "auc", "all samples"),
                              (axes[2], "auc_outlier", "flipped samples")):
            if col in btable:
                plot_tradeoff(btable, arms, x=col, y="bank_test_acc", ax=ax,
                              xlabel=f"LiRA AUC, {what} ({attack}, %)",
                              ylabel="clean test accuracy of bank models (%)")
                ax.axvline(50, ls=":", color="grey", lw=1)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1.08))
    fig.tight_layout()
    data = pd.concat([summary.assign(source="sweep"),
                      btable.assign(source="bank") if btable is not None else None])
    return fig, data


# --------------------------------------------------------------------------------------------
# Notebook 06: the claims table
# --------------------------------------------------------------------------------------------


def _claim_reference(claim) -> float:
    """Where a claim's verdict line sits: zero for an effect, else its bound."""
    return 0.0 if claim is None or claim.rule == "effect" else claim.bound


def plot_claims(rows: list[dict], claims=None, *, fig=None):
    """Forest plot of every row with an interval, one axis per claim, each on its own scale
    (the claim's display units: points for differences of fractions, else native), so that no
    claim's rows are squeezed by another's range: our value and 95% CI, verdict-coloured, with
    the claim's verdict line (zero for an effect, the bound otherwise). ``claims`` (default
    :data:`bnmem_utils.report.CLAIMS`) gives each id's scale, unit and rule. Returns the figure."""
    if claims is None:
        from .report import CLAIMS as claims
    by_id = {c.id: c for c in claims}
    shown = [r for r in rows if isinstance(r["value"], int | float) and r["lo"] is not None
             and r["hi"] is not None]
    groups: dict[str, list[dict]] = {}
    for r in shown:
        groups.setdefault(r["id"], []).append(r)
    heights = [len(g) + 1.2 for g in groups.values()] or [1]
    fig = fig if fig is not None else plt.figure(figsize=(9, 0.3 * sum(heights) + 0.6))
    if not groups:
        fig.text(0.5, 0.5, "no claim with an interval yet", ha="center", va="center")
        return fig
    axes = fig.subplots(len(groups), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    colours = {"reproduced": "#0a6b2b", "not reproduced": "#a4161a", "inconclusive": "#8a6d00"}
    for ax, (cid, group) in zip(axes, groups.items(), strict=True):
        claim = by_id.get(cid)
        scale = claim.scale if claim else 1.0
        for i, r in enumerate(group):
            v, lo, hi = (scale * float(r[k]) for k in ("value", "lo", "hi"))
            ax.errorbar(v, i, xerr=[[v - lo], [hi - v]], fmt="o", ms=4, capsize=3,
                        color=colours.get(r["verdict"], "#666666"))
        ax.axvline(scale * _claim_reference(claim), color="k", lw=0.8)
        ax.set_yticks(range(len(group)), [r.get("setting") or r["key"] for r in group], fontsize=7)
        ax.set_ylim(len(group) - 0.5, -0.5)
        ax.tick_params(axis="x", labelsize=7)
        unit = f" ({claim.unit})" if claim and claim.unit else ""
        ax.set_title(f"{cid}: {claim.title if claim else ''}{unit}", fontsize=8, loc="left")
    fig.tight_layout(h_pad=0.4)
    return fig


# --------------------------------------------------------------------------------------------
# The confound study (notebook 04b)
# --------------------------------------------------------------------------------------------
def plot_confound_study(points: pd.DataFrame, frame: pd.DataFrame, rows: pd.DataFrame, *,
               n_knots: int = 3):
    """AUC against the gap, one curve per norm (filled circles: the epochs ladder, each rung a
    point with 95% intervals on both axes; open squares, dashed: the weight-decay knob; open
    triangles, dotted: the pool-size knob), each
    norm's regression fit drawn over its points, and BN's matched gaps with no norm marked
    (dotted); right: BN minus each norm at every matched gap by both estimators."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6), width_ratios=[1.4, 1])
    epochs = frame[frame.knob == "epochs"]
    for norm in dict.fromkeys(points.norm):
        for knob, style in (("epochs", dict(fmt="o", mfc=None)),
                            ("weight_decay", dict(fmt="s", mfc="white", ls="--")),
                            ("train_size", dict(fmt="^", mfc="white", ls=":"))):
            p = points[(points.norm == norm) & (points.knob == knob)].sort_values("gap")
            if p.empty:
                continue
            color = norm_color(norm)
            label = NORM_LABELS.get(norm, norm) + ("" if knob == "epochs" else
                                                    ", " + knob.replace("_", " "))
            ax.errorbar(100 * p.gap, 100 * p.auc, xerr=[100 * (p.gap - p.gap_lo),
                        100 * (p.gap_hi - p.gap)], yerr=[100 * (p.auc - p.auc_lo),
                        100 * (p.auc_hi - p.auc)], color=color, capsize=2, ms=5,
                        lw=1, label=label, **{"ls": "none", **style})
        partner = "none" if norm == "bn" else "bn"
        if {norm, partner} <= set(epochs.norm):
            knots = confound.default_knots(epochs.gap[epochs.norm.isin([norm, partner])], n_knots=n_knots)
            own = points[(points.norm == norm) & (points.knob == "epochs")]
            grid = np.linspace(own.gap.min(), own.gap.max(), 100)  # over the rungs' mean gaps
            fit = confound.fitted_curve(confound.curve(frame, norm), knots, grid)
            ax.plot(100 * grid, 100 * fit, color=norm_color(norm), lw=1.2, alpha=0.8)
    main = rows[(rows.a == "bn") & (rows.b == "none") & (rows.knob_b == "epochs")]
    for _, r in main.dropna(subset=["gap"]).iterrows():
        ax.axvline(100 * r.gap, ls=":", color="grey", lw=1)
        ax.annotate(r.position, (100 * r.gap, 1.0), xycoords=("data", "axes fraction"),
                    fontsize=7, ha="center", va="bottom")
    ax.set(xlabel="generalization gap, train - test accuracy (points)",
           ylabel="LiRA AUC, all samples (points)")
    ax.legend(fontsize=7, loc="upper left")
    _plot_confound_differences(bx, rows[(rows.a == "bn") & (rows.knob_a == "epochs")
                               & (rows.knob_b == "epochs")])
    fig.tight_layout()
    return fig


def _plot_confound_differences(ax, rows: pd.DataFrame) -> None:
    """BN minus each norm at its matched gaps: interpolation (circles) and regression
    (diamonds, shifted right a little), 95% intervals."""
    for b, g in rows.dropna(subset=["gap"]).groupby("b", sort=False):
        x = 100 * g.gap.to_numpy(dtype=float)
        for col, marker, dx in (("interp", "o", 0.0), ("reg", "D", 0.08)):
            y = 100 * g[col].to_numpy(dtype=float)
            err = [y - 100 * g[f"{col}_lo"].to_numpy(dtype=float),
                   100 * g[f"{col}_hi"].to_numpy(dtype=float) - y]
            ax.errorbar(x + dx, y, yerr=err, fmt=marker, color=norm_color(b), capsize=3,
                        mfc="white" if col == "reg" else None,
                        label=f"BN - {NORM_LABELS.get(b, b)} ({'interp.' if col == 'interp' else 'regr.'})")
    ax.axhline(0, color="black", lw=0.8)
    ax.set(xlabel="matched gap (points)", ylabel="BN minus norm, LiRA AUC (points)",
           title="at the low, middle and high matched gaps")
    ax.legend(fontsize=7)
