"""The figures of notebooks 04 (LiRA) and 04b (the confound study): ROC curves, AUC against the
train-test gap, memorization per bank, one sample's exposure, and the confound study's
panels, in the style of :mod:`bnmem_utils.figures.plotting`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from bnmem_utils.analyses import matched_gap
from bnmem_utils.figures.plotting import (
    new_figure,
    norm_color,
    panel_grid,
    plot_mean_ci,
    words,
)
from bnmem_utils.models.nets import NORM_LABELS
from bnmem_utils.privacy import attacks
from bnmem_utils.privacy.moderated import predictive_logpdf

# --------------------------------------------------------------------------------------------
# Notebook 04: LiRA (ROC curves, AUC against the gap, one sample's exposure)
# --------------------------------------------------------------------------------------------


def plot_roc_grid(banks, attack: str = "auto"):
    """Notebook 04's ROC figure: one panel per (data set, architecture) row and outlier setting
    column, one log-log ROC curve per norm (all samples, mean over targets, shaded 95% interval,
    FPR 1e-5 to 1), AUC in the legend. ``"auto"`` here and below: the banks' headline attack,
    one for all (:func:`bnmem_utils.privacy.attacks.resolve_attack`)."""
    attack = attacks.resolve_attack(attack, *banks)
    settings = list(dict.fromkeys(b.config.setting for b in banks))
    groups = list(dict.fromkeys((b.config.data.dataset, b.config.model.arch) for b in banks))
    fig, axes = panel_grid(len(groups), len(settings), 4.2, 4, sharex=True, sharey=True)
    for b in banks:
        r, c = groups.index((b.config.data.dataset, b.config.model.arch)), settings.index(b.config.setting)
        ax = axes[r][c]
        loo = b.evaluate()
        auc = attacks.metric_estimate(loo.metrics, attack)
        roc = loo.roc[(loo.roc.attack == attack) & (loo.roc.subset == "all")]
        if roc.empty:
            raise ValueError(f"no ROC rows for attack {attack!r} on subset 'all'")
        wide = roc.pivot(index="target", columns="fpr", values="tpr")   # (targets, grid)
        plot_mean_ci(wide.columns.to_numpy(dtype=float),
                     np.clip(wide.to_numpy(dtype=float), 1e-5, 1), ax,
                     label=f"{NORM_LABELS[b.config.model.norm]} (AUC {auc.mean:.3f})",
                     color=norm_color(b.config.model.norm))
        ax.plot([1e-5, 1], [1e-5, 1], ls=":", color="grey", lw=1)
        ax.set(xscale="log", yscale="log", xlim=(1e-5, 1), ylim=(1e-5, 1),
               xlabel="false-positive rate", ylabel="true-positive rate")
        ax.set_title(f"{words(b.config.data.dataset)}, {words(b.config.model.arch)}, "
                     f"{b.config.setting}")
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{words(attack)}: ROC of each bank (all samples)")
    fig.tight_layout()
    return fig


def plot_auc_vs_gap(banks, attack: str = "auto"):
    """Each bank's attack AUC (all samples) against its models' generalisation gap, with 95%
    intervals, coloured by norm, one marker per setting (both named in the legend). Returns
    ``(fig, data)``."""
    attack, rows = attacks.resolve_attack(attack, *banks), []
    fig, ax = plt.subplots(figsize=(5, 4))
    marker = {s: "osD^vPX*"[i % 8] for i, s in enumerate(dict.fromkeys(b.config.setting for b in banks))}
    for b in banks:
        auc = attacks.metric_estimate(b.evaluate().metrics, attack)
        gap = b.accuracy("gap")
        ax.errorbar(gap.mean, auc.mean, xerr=[[gap.mean - gap.lo], [gap.hi - gap.mean]],
                    yerr=[[auc.mean - auc.lo], [auc.hi - auc.mean]],
                    fmt=marker[b.config.setting], color=norm_color(b.config.model.norm))
        rows.append({"arm": b.config.arm, "norm": b.config.model.norm, "gap": gap.mean,
                     "gap_lo": gap.lo, "gap_hi": gap.hi, "auc": auc.mean, "auc_lo": auc.lo,
                     "auc_hi": auc.hi})
    for norm in dict.fromkeys(b.config.model.norm for b in banks):
        ax.plot([], [], "o", color=norm_color(norm), label=NORM_LABELS[norm])
    for setting, m in marker.items():
        ax.plot([], [], m, color="0.4", label=setting)
    ax.set(xlabel="generalisation gap (train - test accuracy)", ylabel=f"{words(attack)}: AUC")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig, pd.DataFrame(rows)


def plot_bank_memorization(banks):
    """Histograms of the banks' Feldman-Zhang memorization scores, one panel per setting: clean
    samples as outlines, outliers filled, one colour per norm (log density)."""
    settings = list(dict.fromkeys(b.config.setting for b in banks))
    fig, axes = panel_grid(1, max(1, len(settings)), 4.2, 3.6, sharey=True)
    bins = np.linspace(-1, 1, 21)
    for c, setting in enumerate(settings):
        ax = axes[0][c]
        for b in [b for b in banks if b.config.setting == setting]:
            m = b.memorization()
            ax.hist(m[~b.outliers], bins=bins, density=True, histtype="step",
                    color=norm_color(b.config.model.norm), label=f"{NORM_LABELS[b.config.model.norm]}, clean")
            if b.outliers.any():
                ax.hist(m[b.outliers], bins=bins, density=True, histtype="stepfilled", alpha=0.35,
                        color=norm_color(b.config.model.norm),
                        label=f"{NORM_LABELS[b.config.model.norm]}, outliers")
        ax.set(title=setting, xlabel="memorization (acc in - acc out)", yscale="log")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("density")
    fig.tight_layout()
    return fig


def score_text(x: float, digits: int = 2) -> str:
    """An attack number for display: ``digits`` decimals below 1000, three significant digits
    from there (its reason belongs beside it), ``—`` for NaN."""
    if x is None or not np.isfinite(x):
        return "—"
    return f"{x:.{digits}f}" if abs(x) < 1000 else f"{x:.3g}"


def _side_curves(r, grid: np.ndarray, span: float) -> list:
    """``(name, scores, colour, density, label)`` of the IN and OUT sides of one row of
    :func:`bnmem_utils.figures.explore.sample_privacy`: the attack's own fit where it has one
    (a scale under 2% of the axis drawn at that, a floored one said so), else the shadows' median and
    standard deviation, for the eye."""
    fit, out = r.get("fit"), []
    for name, vals, c in (("IN", r["in_scores"], norm_color(r["norm"])),
                          ("OUT", r["out_scores"], "0.45")):
        vals, side = np.asarray(vals, dtype=float), name.lower()
        if fit is not None:
            loc, scale, dof = (fit[f"{p}_{side}"] for p in ("loc", "scale", "dof"))
            floor = fit[f"floor_{side}"]
            label = f"{name}: {vals.size} shadows, fit on {fit['k']}" + (
                " (variance at floor, drawn wider)" if floor else "")
        elif vals.size:
            loc, scale, dof = float(np.median(vals)), float(vals.std()), np.inf
            label = f"{name}: {vals.size} shadows (median, sd)"
        else:
            continue
        scale = max(scale, 0.02 * span + 1e-9)
        out.append((name, vals, c, np.exp(predictive_logpdf(grid, loc, scale, dof)), label))
    return out


def _panel_title(r) -> str:
    """A score panel's title: the norm, the number the readout's LLR column shows (the same
    query and statistic) with its reason at four digits, and the memorization."""
    norm = NORM_LABELS.get(r["norm"], r["norm"])
    if r.get("fit") is None:
        what = f"{r['attack']} score {score_text(r['attack_score'])} (mean of the queries)"
    else:
        what = f"LLR {score_text(r['llr'])} ({r.get('query', 'identity')} query)"
    why = (r.get("reasons") or {}).get("score" if r.get("fit") is None else "LLR")
    return f"{norm}: {what}" + (f"\n{why}" if why else "") + f"\nmemorization {r['memorization']:.2f}"


def plot_sample_privacy(df: pd.DataFrame, image: np.ndarray | None = None, *, fig=None,
                        note: str = ""):
    """The sample's image, then one panel per norm: the shadows' scores on it (IN: trained on
    it, OUT: did not) for one query, as ticks, with the IN and OUT fits of the row's attack
    (an online LiRA's own predictives; for another attack each side's median and standard
    deviation), and the target model's score as a vertical line. Each panel's title gives the
    number of the readout's LLR column: the attack's log-likelihood ratio at this query (for
    an attack without one, its score); a four-digit number has its reason under it. ``note``
    goes above the panels. The score panels share their x axis. Returns the figure."""
    k = len(df)
    fig = fig if fig is not None else new_figure((3.0 + 3.4 * k, 3.4))
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
        curves = _side_curves(r, grid, span)
        top = max([float(cv[3].max()) for cv in curves] + [1e-3])
        for k_, (_, vals, c, dens, label) in enumerate(curves):
            ax.plot(grid, np.minimum(dens, 1.5 * top), color=c, lw=1.8, label=label)
            ax.plot(vals, np.full(vals.size, -(0.07 + 0.08 * k_) * top), "|", color=c, ms=9,
                    mew=1.5)  # each shadow's score
        ax.axvline(r["target_score"], color="k", lw=1.6, ls="--",
                   label=f"target {r['target']} ({'member' if r['member'] else 'non-member'})")
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(mticker.MaxNLocator(nbins=5))  # panels' labels kept apart
        ax.set_ylim(-0.22 * top, top * 1.75)  # room for the legend above the curves
        ax.set_yticks([])
        ax.set_xlabel("score (log-odds of the label)")
        ax.set_title(_panel_title(r), fontsize=9)
        ax.legend(fontsize=7, loc="upper left", frameon=False)
    fig.suptitle((f"{note}\n" if note else "") + f"{words(r0['attack'])}: the target's score against "
                 "its shadows' fits", fontsize=9, color="#a4161a" if note else "black")
    return fig


def rule_shadows(curve: pd.DataFrame) -> float | None:
    """The number of shadow models N at which a shadow-count curve's ``k`` (the fewest shadows a
    side any sample is fitted from) reaches the rule's
    :data:`~bnmem_utils.privacy.attacks.PER_SAMPLE_MIN_SHADOWS`, linear between the curve's
    sizes: 2k = 64 in complementary pairs (k = N/2), more in a balanced bank (some sample
    gets fewer than N/2); None where the curve's k does not span it."""
    pts = curve.drop_duplicates("n_shadows").sort_values("n_shadows")
    k = np.maximum.accumulate(pts.k.to_numpy(dtype=float))
    if not k[0] <= attacks.PER_SAMPLE_MIN_SHADOWS <= k[-1]:
        return None
    return float(np.interp(attacks.PER_SAMPLE_MIN_SHADOWS, k, pts.n_shadows.to_numpy(dtype=float)))


def plot_shadow_curve(curve: pd.DataFrame, metrics=("auc", "tpr@1%")):
    """Notebook 04's shadow-count curve (:func:`bnmem_utils.privacy.shadow_curve.shadow_count_curve`):
    one panel per metric against the number of shadow models N (log2 axis), one line per
    attack, bands its 95% t interval over targets; the rule's threshold (per-sample variances
    from :data:`~bnmem_utils.privacy.attacks.PER_SAMPLE_MIN_SHADOWS` shadows a side k, not N/2
    unless the bank is in pairs) dotted where the curve's k reaches it (:func:`rule_shadows`)."""
    fig, axes = panel_grid(1, len(metrics), 5.0, 3.8)
    paired, at = set(curve.design) == {"pairs"}, rule_shadows(curve)
    side = "k = N/2 a side: pairs" if paired else "k <= N/2 a side: balanced"
    for ax, metric in zip(axes[0], metrics, strict=True):
        for i, (attack, g) in enumerate(curve.groupby("attack", sort=False)):
            g = g.sort_values("n_shadows")
            (line,) = ax.plot(g.n_shadows, g[metric], marker="o", ms=3, label=words(attack),
                              ls="-" if attack.startswith("lira_online") else "--",
                              color=plt.get_cmap("tab10")(i % 10))
            ax.fill_between(g.n_shadows, g[f"{metric}_lo"], g[f"{metric}_hi"], alpha=0.15,
                            color=line.get_color(), lw=0)
        if at is not None:
            ax.axvline(at, ls=":", color="grey", lw=1,
                       label=f"rule: per-sample from k = {attacks.PER_SAMPLE_MIN_SHADOWS} a side "
                             f"(N {'=' if paired else '≈'} {at:.0f} here)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(curve.n_shadows.unique()), minor=False)
        ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(mticker.NullLocator())
        ax.set(xlabel=f"shadow models N\n({side})", ylabel=words(metric), title=words(metric))
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("attacks against the number of shadows (bands: 95% t interval over targets, "
                 "which share shadows)", fontsize=9)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# The confound study (notebook 04b)
# --------------------------------------------------------------------------------------------
def plot_confound_study(points: pd.DataFrame, frame: pd.DataFrame, rows: pd.DataFrame, *,
                        n_knots: int = 3):
    """LiRA AUC against each ruler of the confound study side by side (the accuracy gap, the
    loss gap, the global attack's AUC), one curve per norm: filled circles, the epochs ladder,
    each rung a point with 95% intervals on both axes (on the accuracy gap also the other
    knobs: open squares, dashed, weight decay; open triangles, dotted, pool size), each norm's
    regression fit over its points, and the matched positions of BN with no norm marked
    (dotted); below, across the whole width: BN minus each norm at every matched position of
    every ruler, by both estimators. The legends sit outside the data, and each part says what
    its bars are."""
    fig = plt.figure(figsize=(13, 9.4))
    grid = fig.add_gridspec(2, 3, height_ratios=[1.0, 0.95], hspace=0.55, wspace=0.28)
    top = [fig.add_subplot(grid[0, i]) for i in range(3)]
    for ax, ruler in zip(top, matched_gap.RULERS, strict=False):
        _plot_ladder(ax, points, frame, rows, ruler, n_knots=n_knots)
    handles, labels = top[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 4), fontsize=8,
               bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.text(0.5, 0.925, "each point a bank (a rung of the ladder, seed 0): its mean with the 95% "
             "t interval over its models, on both axes; lines: each norm's regression fit",
             ha="center", fontsize=8)
    bottom = fig.add_subplot(grid[1, :])
    _plot_confound_differences(bottom, rows[(rows.a == "bn") & (rows.knob_a == "epochs")
                                            & (rows.knob_b == "epochs")])
    fig.subplots_adjust(top=0.86, bottom=0.14, left=0.06, right=0.98)
    return fig


def _plot_ladder(ax, points: pd.DataFrame, frame: pd.DataFrame, rows: pd.DataFrame, ruler: str,
                 *, n_knots: int) -> None:
    """One ruler's panel of :func:`plot_confound_study`."""
    spec = matched_gap.RULERS[ruler]
    col, k = spec.column, spec.scale
    epochs = frame[frame.knob == "epochs"]
    knobs = [("epochs", dict(fmt="o", mfc=None))]
    if ruler == "accgap":
        knobs += [("weight_decay", dict(fmt="s", mfc="white", ls="--")),
                  ("train_size", dict(fmt="^", mfc="white", ls=":"))]
    for norm in dict.fromkeys(points.norm):
        for knob, style in knobs:
            p = points[(points.norm == norm) & (points.knob == knob)].sort_values(col)
            if p.empty:
                continue
            label = NORM_LABELS.get(norm, norm) + ("" if knob == "epochs" else
                                                    ", " + knob.replace("_", " "))
            ax.errorbar(k * p[col], 100 * p.auc, xerr=[k * (p[col] - p[f"{col}_lo"]),
                        k * (p[f"{col}_hi"] - p[col])], yerr=[100 * (p.auc - p.auc_lo),
                        100 * (p.auc_hi - p.auc)], color=norm_color(norm), capsize=2, ms=5,
                        lw=1, label=label, **{"ls": "none", **style})
        partner = "none" if norm == "bn" else "bn"
        if {norm, partner} <= set(epochs.norm):
            knots = matched_gap.default_knots(epochs[col][epochs.norm.isin([norm, partner])],
                                           n_knots=n_knots)
            own = points[(points.norm == norm) & (points.knob == "epochs")]
            grid = np.linspace(own[col].min(), own[col].max(), 100)   # over the rungs' means
            fit = matched_gap.fitted_curve(matched_gap.curve(frame, norm, x=col), knots, grid)
            ax.plot(k * grid, 100 * fit, color=norm_color(norm), lw=1.2, alpha=0.8)
    main = rows[(rows.ruler == ruler) & (rows.a == "bn") & (rows.b == "none")
                & (rows.knob_b == "epochs")]
    for i, (_, r) in enumerate(main.dropna(subset=["gap"]).iterrows()):
        ax.axvline(k * r.gap, ls=":", color="grey", lw=1,
                   label=None if i else "matched positions, low to high")
    name, _, detail = spec.words.partition(" (")        # the ruler, its definition below it
    ax.set(xlabel=f"{name} ({spec.unit})" + (f"\n({detail}" if detail else ""),
           ylabel="LiRA AUC, all samples (points)")


def _plot_confound_differences(ax, rows: pd.DataFrame) -> None:
    """BN minus each norm at the low, middle and high matched positions of each ruler:
    interpolation (filled circles) and regression (open diamonds), 95% intervals, the norms
    side by side in each slot, far enough apart that no two bars overlap; the legend below."""
    norms = list(dict.fromkeys(rows.b))
    step = 1.0 / (2 * len(norms) + 1)           # each slot: every norm's two estimators in turn
    slots = {(r, p): 4 * i + j for i, r in enumerate(matched_gap.RULERS)
             for j, p in enumerate(matched_gap.POSITIONS)}
    for b, g in rows.dropna(subset=["gap"]).groupby("b", sort=False):
        x = np.array([slots[(r.ruler, r.position)] for _, r in g.iterrows()], dtype=float)
        for col, marker, dx in (("interp", "o", 0), ("reg", "D", 1)):
            y = 100 * g[col].to_numpy(dtype=float)
            err = [y - 100 * g[f"{col}_lo"].to_numpy(dtype=float),
                   100 * g[f"{col}_hi"].to_numpy(dtype=float) - y]
            offset = (2 * norms.index(b) + dx + 0.5) * step - 0.5
            ax.errorbar(x + offset, y, yerr=err, fmt=marker, ms=4,
                        color=norm_color(b), capsize=2, mfc="white" if col == "reg" else None,
                        label=f"BN - {NORM_LABELS.get(b, b)} "
                              f"({'interpolation' if col == 'interp' else 'regression'})")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(list(slots.values()), [p for _, p in slots], fontsize=8)
    for i, r in enumerate(matched_gap.RULERS):             # each ruler's name under its three slots
        ax.annotate(matched_gap.RULERS[r].words.split(" (")[0], (4 * i + 1, 0), fontsize=8,
                    ha="center",
                    xycoords=("data", "axes fraction"), xytext=(0, -20),
                    textcoords="offset points", va="top")
    counts = set(rows.replicates.dropna().astype(int)) if "replicates" in rows else {1}
    bars = " or ".join(f"a Student t over {r} replicate ladders" if r > 1 else
                       "a percentile bootstrap over one ladder's targets" for r in sorted(counts)
                       if r) or "their method in the CSV"
    ax.set(ylabel="BN minus norm, LiRA AUC (points)",
           title="BN minus each norm at the low, middle and high matched positions of each "
                 f"ruler (bars: 95% intervals, {bars})")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, ncol=min(2 * len(norms), 6), loc="upper center",
              bbox_to_anchor=(0.5, -0.16), frameon=False)


def plot_past_the_fit(table: pd.DataFrame):
    """What moves once the members are fitted (:func:`bnmem_utils.analyses.confound.past_the_fit`):
    one panel per ruler and one for the LiRA AUC, each norm's change from its first fitted rung
    to the top rung with its 95% interval, and zero marked."""
    columns = {**{r.column: (r.words.split(" (")[0], r.scale, r.unit)
                  for r in matched_gap.RULERS.values()}, "auc": ("LiRA AUC", 100.0, "points")}
    fig, axes = panel_grid(1, len(columns), max(2.6, 0.8 * len(table) + 0.6), 2.6)
    for ax, (col, (name, scale, unit)) in zip(axes[0], columns.items(), strict=True):
        for i, (_, r) in enumerate(table.iterrows()):
            y = scale * r[col]
            ax.errorbar([i], [y], yerr=[[y - scale * r[f"{col}_lo"]], [scale * r[f"{col}_hi"] - y]],
                        fmt="o", color=norm_color(r.norm), capsize=3)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xlim(-0.5, len(table) - 0.5)
        ax.set_xticks(range(len(table)), [f"{NORM_LABELS.get(n, n)}\n{a} to {t}\nepochs"
                                          for n, a, t in zip(table.norm, table.fitted_at,
                                                             table.top, strict=True)], fontsize=7)
        ax.set(title=f"change of the {name}", ylabel=unit)
        ax.title.set_fontsize(8)
    fig.suptitle("past the fit: from each norm's first rung at 99% training accuracy to the "
                 "top rung", fontsize=9)
    fig.tight_layout()
    return fig
