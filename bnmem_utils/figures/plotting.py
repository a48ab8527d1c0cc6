"""The one style of every figure, the one ``save_figure`` they all use, notebook 06's figure, and
the one form of the tables the notebooks show (:func:`table_html`).

The figures of the other notebooks are drawn in one module per notebook family, with the style,
colours and panels here: :mod:`bnmem_utils.figures.theory` (01), :mod:`bnmem_utils.figures.memorization`
(02 and 05), :mod:`bnmem_utils.figures.gradnorms` (03) and :mod:`bnmem_utils.figures.privacy` (04 and
04b). Each figure function takes the frames or objects its notebook already holds and returns
the figure (or axes), and its data where the notebook saves them.

``save_figure`` writes PDF (embedded TrueType fonts) + PNG + the CSV of the plotted data and adds
an entry to ``runs/<profile>/figures/manifest.json`` (and its Markdown twin ``manifest.md``) naming the
notebook, profile, parameters and commit that made the figure.

Outputs are byte-identical across reruns of the same data: the PDF and PNG carry fixed metadata
(no creation date), every CSV is written with one float format (:data:`CSV_FLOAT_FORMAT`, so a
float32 column and its float64 copy read back from a cache give the same text), and the manifest
holds no wall-clock time.
"""

from __future__ import annotations

import html
import os
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from bnmem_utils.analyses.report import WORDS as FIELD_WORDS
from bnmem_utils.analyses.report import ClaimsView, claims_text
from bnmem_utils.core.cache import atomic_path, atomic_write_text
from bnmem_utils.core.outputs import breakable, manifest_texts, read_manifest, value_html
from bnmem_utils.models.nets import NORMS

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


#: The words every figure shows for a code name (one not listed is shown as it is): the attacks,
#: the per-epoch metrics, and the data sets and models in the claims table's words.
WORDS = {
    "lira_online": "LiRA online, per-sample variance",
    "lira_online_fixed": "LiRA online, pooled variance",
    "lira_online_global": "LiRA online, the reference's global variance",
    "lira_online_nig": "LiRA online, small-sample (NIG) variance",
    "lira_offline": "LiRA offline", "lira_offline_fixed": "LiRA offline, pooled variance",
    "global_threshold": "global score threshold", "loss_threshold": "loss threshold",
    "rmia": "RMIA", "rmia_offline": "RMIA offline",
    "corrupted_acc": "accuracy on corrupted samples", "corrupted_loss": "loss on corrupted samples",
    "test_acc": "clean test accuracy", "test_loss": "test loss", "train_acc": "training accuracy",
    "train_loss": "training loss", "clean_acc": "accuracy on clean training samples",
    "reg_loss": "penalty term", "gs_median": "median gamma/sigma (BN)",
    "gs_mean": "mean gamma/sigma (BN)", "gs_frac_above_1": "share of gamma/sigma above 1 (BN)",
    "gamma_abs_mean": "mean |gamma| (BN)", "auc": "AUC", "tpr@1%": "TPR at 1% FPR",
    "tpr@0.1%": "TPR at 0.1% FPR", **FIELD_WORDS["dataset"], **FIELD_WORDS["arch"],
}


def words(name) -> str:
    """A code name as figures show it (:data:`WORDS`); a penalty arm's ``lam=``/``tau=`` as
    lambda and tau (``BN square lam=0.1`` -> ``BN square λ=0.1``)."""
    text = WORDS.get(name, str(name))
    return text.replace("lam=", "\u03bb=").replace("tau=", "\u03c4=")


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


#: Inline styles of a shown table's cells (JupyterLab keeps them where it drops a <style>): text
#: wraps at spaces, a number on its own (:data:`_NUMBER`) never breaks.
_CELL = "padding:2px 5px;vertical-align:top;white-space:normal;overflow-wrap:break-word"
_NUMBER = re.compile(r"[-+]?(\d[\d,.]*(e[-+]?\d+)?%?|nan|inf|&lt;NA&gt;|None|True|False)", re.I)


#: The widest table shown, in characters of its cells' widest unbreakable pieces (a notebook
#: beside JupyterLab's file browser at 1024 px holds about 590 px).
TABLE_CHARS = 74


def _chars(texts) -> int:
    """The widest piece of ``texts`` a cell cannot break (it wraps at spaces and after ``_``),
    plus its padding, in characters."""
    return 2 + max((len(w) for t in texts for w in re.split(r"[\s_]", str(t))), default=0)


def _parts(frame: pd.DataFrame) -> list[pd.DataFrame]:
    """``frame``'s columns in groups that each fit :data:`TABLE_CHARS`, each group led by the
    columns that name a row (the leading ones no value of which starts with a number)."""
    cols = list(frame.columns)
    if frame.columns.nlevels > 1 or not frame.columns.is_unique or not len(frame):
        return [frame]
    width = {c: _chars([c, *frame[c].astype(str)]) for c in cols}
    lead = next((i for i, c in enumerate(cols)
                 if frame[c].astype(str).str.match(r"[-+]?\.?\d").any()), len(cols))
    base = _chars(map(str, frame.index)) + sum(width[c] for c in cols[:lead])
    groups, used = [[]], base
    for c in cols[lead:]:
        if groups[-1] and used + width[c] > TABLE_CHARS:
            groups, used = [*groups, []], base
        groups[-1].append(c)
        used += width[c]
    return [frame[cols[:lead] + g] for g in groups]


def table_html(frame: pd.DataFrame) -> str:
    """``frame`` as pandas shows it in a notebook, made to fit a notebook beside JupyterLab's
    file browser: names wrap after their underscores, text at its spaces, a number never; no
    cell is cut short; a table too wide is shown in parts, each with the columns that name a row."""
    if len(parts := _parts(frame)) > 1:
        return "".join(table_html(p) for p in parts)
    def cell(m: re.Match) -> str:
        tag, attrs, text = m.groups()
        number = _NUMBER.fullmatch(text.strip())
        style = _CELL.replace("normal", "nowrap") if number else _CELL
        return f'<{tag}{attrs} style="{style}">{text if number else breakable(html.unescape(text))}</{tag}>'

    with pd.option_context("display.max_colwidth", None):   # every key and name whole
        shown = re.sub(r"<(td|th)([^>]*)>([^<]*)</\1>", cell, frame._repr_html_() or "")
    return shown.replace('class="dataframe"', 'class="dataframe" style="max-width:100%"', 1)


def wrap_tables() -> None:
    """Show every DataFrame of this IPython session with :func:`table_html` (none outside one)."""
    from IPython import get_ipython

    if (ip := get_ipython()) is not None:
        ip.display_formatter.formatters["text/html"].for_type(pd.DataFrame, table_html)


class ClaimsSummary(ClaimsView):
    """The claims table's summary, one row per key: :func:`claims_text` in a terminal; in a
    browser a table whose keys wrap after their underscores and whose values never break."""

    def _repr_html_(self) -> str:
        rows = [("claim", "key", "ours (95% CI)", "verdict"),
                *((html.escape(r["id"]), breakable(r["key"]), value_html(r["ours"]),
                   html.escape(r["verdict"])) for r in self.rows)]
        trs = "".join("<tr>" + "".join(f'<td style="{_CELL}">{c}</td>' for c in row) + "</tr>"
                      for row in rows)
        counts = claims_text(self.rows).rsplit("\n", 1)[-1]
        return f'<table class="bnmem-summary">{trs}</table><p>{html.escape(counts)}</p>'


def plot_mean_ci(x, runs, ax=None, *, label=None, color=None, confidence: float = 0.95,
                 bounds: tuple[float | None, float | None] = (None, None), **kw):
    """Plot the mean over runs (axis 0 of ``runs``) with a shaded t-interval, clipped to the
    metric's range ``bounds`` (e.g. ``(0, 1)`` for an accuracy); return the axes."""
    from scipy import stats as st

    ax = ax if ax is not None else plt.gca()
    runs = np.atleast_2d(np.asarray(runs, dtype=float))
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


def figure_title(fig) -> str:
    """The figure's title, for captions: its suptitle, else its first axes title ("" if none)."""
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text():
        return sup.get_text()
    titles = [ax.get_title(loc=loc) for ax in fig.axes for loc in ("center", "left")]
    return next((" ".join(t.split()) for t in titles if t), "")


def save_figure(fig, name: str, data=None, *, folder: str | os.PathLike, notebook: str = "",
                profile: str = "", parameters: dict | None = None, commit: str = "",
                description: str = "", data_sets: dict | None = None) -> dict:
    """Write ``<folder>/<name>.pdf|.png|.csv`` and a manifest entry; return that entry.

    ``data`` is the plotted data (DataFrame, dict of columns or records), so every figure can be
    re-plotted or checked without re-running the notebook. ``description``, one sentence saying
    what the figure shows, is the exports' caption. ``fig`` None writes the CSV alone (the table
    behind several figures). Notebooks call this through
    :meth:`bnmem_utils.run.notebook.NotebookContext.save_figure`, which fills in the provenance.
    """
    if not name or any(c in name for c in "/\\ "):
        raise ValueError(f"figure name {name!r} must be non-empty without slashes or spaces")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for ext in ("pdf", "png") if fig is not None else ():
        path = folder / f"{name}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, metadata=FIGURE_METADATA[ext])
        files.append(path.name)
    if data is not None:
        path = folder / f"{name}.csv"
        with atomic_path(path) as tmp:
            pd.DataFrame(data).to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT,
                                      lineterminator="\n")
        files.append(path.name)
    entry = {"figure": name, "title": figure_title(fig) if fig is not None else "",
             "description": " ".join(description.split()), "notebook": notebook,
             "profile": profile, "parameters": parameters or {}, "commit": commit, "files": files,
             **({"data": data_sets} if data_sets else {})}   # {data set: digest} it read
    for file, text in manifest_texts({**read_manifest(folder), name: entry}).items():
        atomic_write_text(folder / file, text)
    return entry


def panel_grid(nrows: int, ncols: int, width: float, height: float, **kw):
    """``plt.subplots`` of ``nrows`` x ``ncols`` panels of ``width`` x ``height`` inches each,
    the axes always a 2-D array."""
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)


def rows_where(frame: pd.DataFrame, cols: Sequence[str], values) -> pd.DataFrame:
    """The rows of ``frame`` whose columns ``cols`` hold ``values``."""
    return frame[np.logical_and.reduce([frame[c] == v for c, v in zip(cols, values, strict=True)])]


def new_figure(figsize=(6.4, 3.0)) -> Figure:
    """A figure outside pyplot, for the explorers' views (never shown by the inline backend on
    its own)."""
    return Figure(figsize=figsize, layout="constrained")


# --------------------------------------------------------------------------------------------
# Notebook 06: the claims table
# --------------------------------------------------------------------------------------------


def _claim_reference(claim) -> float:
    """Where a claim's verdict line sits: zero for an effect, else its bound in the value's own
    sign (a claimed reduction's bound is stated for the reduction: M3's -1 point is +1 on the
    axis of BN's excess)."""
    return 0.0 if claim is None or claim.rule == "effect" else claim.sign * claim.bound


#: Characters a claims-forest row's label holds on one line before it wraps: the labels take
#: about 40% of the figure's width, the intervals the rest.
FOREST_LABEL_CHARS = 62

#: The claims forest's figures, in order: ``{name: (what its claims are about, id prefixes)}``.
CLAIM_GROUPS = {"theory": ("the theory", ("T",)),
                "memorization": ("memorization and gradient norms", ("C1", "C2")),
                "leakage": ("leakage to membership inference", ("C3",)),
                "mitigation": ("the mitigation", ("M",))}


def claim_group(claim_id: str) -> str:
    """The claims-forest figure (a key of :data:`CLAIM_GROUPS`) of the claim ``claim_id``."""
    return next(g for g, (_, prefixes) in CLAIM_GROUPS.items() if claim_id.startswith(prefixes))


def claim_groups(rows: list[dict]) -> dict[str, list[dict]]:
    """The claims rows of each group of :data:`CLAIM_GROUPS` (every group, in order)."""
    return {g: [r for r in rows if claim_group(r["id"]) == g] for g in CLAIM_GROUPS}


def _forest_labels(groups: dict[str, list[dict]]) -> tuple[dict[str, list[str]], list[float]]:
    """Each claim's row labels (its setting, "primary: " first on its primary row), wrapped at
    :data:`FOREST_LABEL_CHARS`, and each claim's axis height in inches: 0.2 a row, 0.14 more
    for each further line its longest label takes."""
    labels = {cid: [textwrap.fill(("primary: " if r.get("primary") else "")
                                  + (r.get("setting") or "as recorded"), FOREST_LABEL_CHARS)
                    for r in g] for cid, g in groups.items()}
    heights = [len(g) * (0.06 + 0.14 * max(t.count("\n") + 1 for t in labels[cid]))
               for cid, g in groups.items()]
    return labels, heights


def plot_claims(rows: list[dict], claims=None, *, fig=None, title: str = ""):
    """Forest plot of every row with an interval, one axis per claim, each on its own scale
    (the claim's display units: points for differences of fractions, else native), so that no
    claim's rows are squeezed by another's range: our value and 95% CI, verdict-coloured, with
    the claim's verdict line (zero for an effect, the bound otherwise). ``claims`` (default
    :data:`bnmem_utils.analyses.report.CLAIMS`) gives each id's scale, unit and rule. Notebook 06
    draws one per group of :data:`CLAIM_GROUPS`; without a row with an interval it is a small
    figure saying so. Returns the figure."""
    from bnmem_utils.analyses.report import CLAIMS, VERDICT_COLOURS

    claims = CLAIMS if claims is None else claims
    by_id = {c.id: c for c in claims}
    shown = [r for r in rows if isinstance(r["value"], int | float) and r["lo"] is not None
             and r["hi"] is not None]
    groups: dict[str, list[dict]] = {}
    for r in shown:
        groups.setdefault(r["id"], []).append(r)
    labels, heights = _forest_labels(groups)   # inches: 0.45 more an axis (title and ticks),
    fig = fig if fig is not None else plt.figure(  # 0.65 the figure's title and legend
        figsize=(9, max(1.0, sum(heights) + 0.45 * len(heights) + 0.65)))
    if not groups:
        fig.suptitle(title, fontsize=10)
        fig.text(0.5, 0.4, "no claim here measured with an interval yet", ha="center", va="center")
        return fig
    axes = fig.subplots(len(groups), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    titles = []
    for ax, (cid, group) in zip(axes, groups.items(), strict=True):
        claim = by_id.get(cid)
        scale = claim.scale if claim else 1.0
        for i, r in enumerate(group):
            v, lo, hi = (scale * float(r[k]) for k in ("value", "lo", "hi"))
            colour = VERDICT_COLOURS[r["verdict"]]
            ax.errorbar(v, i, xerr=[[v - lo], [hi - v]], fmt="o", ms=4, capsize=3, color=colour,
                        mfc=colour if r.get("primary") else "white")
        ax.axvline(scale * _claim_reference(claim), color="k", lw=0.8)
        ax.set_yticks(range(len(group)), labels[cid], fontsize=7)
        ax.set_ylim(len(group) - 0.5, -0.5)
        ax.tick_params(axis="x", labelsize=7)
        unit = f" ({claim.unit})" if claim and claim.unit else ""
        titles.append(ax.set_title(f"{cid}: {claim.title if claim else ''}{unit}", fontsize=8,
                                   loc="left"))
    seen = dict.fromkeys(r["verdict"] for r in shown)
    handles = [Line2D([], [], marker="o", ls="", color=VERDICT_COLOURS[v], label=v) for v in seen]
    handles += [Line2D([], [], marker="o", ls="", color="k", mfc="white",
                       label="secondary row (open)"),
                Line2D([], [], color="k", lw=1, label="bars: 95% intervals (method: the CSV)")]
    height = fig.get_figheight()
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.05 / height, va="top")
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, 1 - (0.3 if title else 0) / height))  # under the title
    # the rect keeps 0.35 in for the legend; tight_layout makes room for the suptitle itself
    fig.tight_layout(pad=0.3, h_pad=0.4, rect=(0, 0, 1, 1 - 0.35 / height))
    for ax, text in zip(axes, titles, strict=True):  # from the figure's left edge: a long claim
        box = ax.get_position()                        # title stays whole
        text.set_x((0.01 - box.x0) / box.width)
    return fig
