"""Summaries of forced-memorization runs: speed, completeness, BN-minus-none gaps.

The input is the long per-epoch frame that :func:`bnmem_utils.jobs.grid.history_frame` builds:
one row per (run, epoch) with the run's identity columns (``dataset``, ``arch``, ``norm``,
``setting``, ``seed``) and the metrics :func:`bnmem_utils.training.loop.train_model` records, among them
``corrupted_acc`` (accuracy on the corrupted samples against their *training* labels, in eval
mode: pure memorization, since no pattern links those inputs to those labels),
``corrupted_loss`` and ``test_acc``.

Everything here is plain pandas/numpy, so it is tested on synthetic histories. Every interval
comes from :mod:`bnmem_utils.core.stats` (Student-t over seeds; paired-t for BN minus no norm, because
the same seed means the same corrupted samples and the same batch order in both runs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import Estimate, diff_ci, mean_ci
from bnmem_utils.models.nets import NORM_LABELS, ordered_norms

#: Columns that identify a condition (one cell of the grid, all norms and seeds pooled).
CONDITION_COLS: tuple[str, ...] = ("dataset", "arch", "setting")
#: Columns that identify one training run.
RUN_COLS: tuple[str, ...] = (*CONDITION_COLS, "norm", "seed")
#: The memorization metric: accuracy on the corrupted samples against their training labels.
MEM_METRIC = "corrupted_acc"


# --- one run -------------------------------------------------------------------------------------
def epochs_to_reach(epochs: Sequence[float], values: Sequence[float], threshold: float) -> float:
    """First epoch at which ``values`` reaches ``threshold``; NaN when it never does.

    ``epochs`` and ``values`` are aligned per-epoch arrays (NaN values are skipped, so a
    diverged run that never got there counts as "never", not as a fast run).
    """
    e = np.asarray(epochs, dtype=float)
    v = np.asarray(values, dtype=float)
    if e.shape != v.shape:
        raise ValueError(f"epochs and values must align, got shapes {e.shape} and {v.shape}")
    hit = np.flatnonzero(np.nan_to_num(v, nan=-np.inf) >= threshold)
    return float(e[hit[0]]) if hit.size else float("nan")


def value_at_epoch(epochs: Sequence[float], values: Sequence[float], epoch: int | str) -> float:
    """The value recorded at ``epoch`` (``"final"`` for the last row); NaN if not recorded."""
    e = np.asarray(epochs, dtype=float)
    v = np.asarray(values, dtype=float)
    if epoch == "final":
        return float(v[np.argmax(e)])
    hit = np.flatnonzero(e == float(epoch))
    return float(v[hit[0]]) if hit.size else float("nan")


def check_columns(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """Raise a ValueError naming the ``columns`` that ``frame`` (a ``what``) lacks."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} lacks column(s) {missing}; it has {list(frame.columns)}")


def run_summary(hist: pd.DataFrame, *, thresholds: Sequence[float] = (0.5, 0.9),
                at_epochs: Sequence[int] = ()) -> pd.DataFrame:
    """One row per run: how fast and how completely it memorized, and its clean accuracy.

    Columns: :data:`RUN_COLS`, ``epochs`` (epochs recorded), ``final_mem``, ``mean_mem`` (the
    mean of the memorization curve over epochs: its normalised area, a speed summary that needs
    no threshold), ``epochs_to_<t>`` for each threshold (percent, e.g. ``epochs_to_50``; NaN =
    never), ``mem_at_<e>`` for each fixed epoch, ``final_test_acc``, and when present
    ``final_clean_acc``, ``final_corrupted_loss``, ``loss_at_<e>`` and ``diverged``.
    """
    check_columns(hist, [*RUN_COLS, "epoch", MEM_METRIC], "history frame")
    rows = []
    for key, run in hist.groupby(list(RUN_COLS), sort=False, observed=True):
        run = run.sort_values("epoch")
        ep, mem = run["epoch"].to_numpy(), run[MEM_METRIC].to_numpy(dtype=float)
        row = dict(zip(RUN_COLS, key, strict=True))
        row["epochs"] = int(len(run))
        row["final_mem"] = value_at_epoch(ep, mem, "final")
        row["mean_mem"] = float(np.nanmean(mem)) if np.isfinite(mem).any() else float("nan")
        for t in thresholds:
            row[f"epochs_to_{round(100 * t)}"] = epochs_to_reach(ep, mem, t)
        for e in at_epochs:
            row[f"mem_at_{e}"] = value_at_epoch(ep, mem, e)
        for col in ("test_acc", "clean_acc"):
            if col in run:
                row[f"final_{col}"] = value_at_epoch(ep, run[col], "final")
        if "corrupted_loss" in run:
            row["final_corrupted_loss"] = value_at_epoch(ep, run["corrupted_loss"], "final")
            for e in at_epochs:
                row[f"loss_at_{e}"] = value_at_epoch(ep, run["corrupted_loss"], e)
        if "diverged" in run:
            row["diverged"] = bool(run["diverged"].any())
        rows.append(row)
    return pd.DataFrame(rows)


# --- over seeds ----------------------------------------------------------------------------------
def condition_table(runs: pd.DataFrame, *, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean and 95% t-interval over seeds of each run metric, per condition and norm.

    ``runs`` is :func:`run_summary`'s frame. For each metric ``m`` the table has ``m``,
    ``m_lo``, ``m_hi`` and ``m_n`` (seeds with a finite value). Epochs-to-threshold columns
    average only the seeds that reached the threshold; ``m_n`` of ``n_seeds`` says how many did.
    """
    if metrics is None:
        metrics = [c for c in runs.columns if c.startswith(("epochs_to_", "mem_at_", "loss_at_"))
                   or c in ("final_mem", "mean_mem", "final_test_acc", "final_clean_acc",
                            "final_corrupted_loss")]
    by = [*CONDITION_COLS, "norm"]
    check_columns(runs, [*by, *metrics], "run summary")

    def over_seeds(grp: pd.DataFrame) -> dict:
        row = {"n_seeds": int(len(grp))}
        for m in metrics:
            row.update(_cols(mean_ci(grp[m].to_numpy(dtype=float)), m, f"{m}_"))
        return row

    out = _per_group(runs, by, over_seeds)
    if len(out):
        cond = list(CONDITION_COLS)
        cond_order = {k: i for i, k in enumerate(dict.fromkeys(map(tuple, runs[cond].values)))}
        out["_c"] = [cond_order[tuple(r)] for r in out[cond].values]
        out["_n"] = out["norm"].map({n: i for i, n in enumerate(ordered_norms(out["norm"]))})
        out = out.sort_values(["_c", "_n"], kind="stable").drop(columns=["_c", "_n"])
    return out.reset_index(drop=True)


def paired_differences(runs: pd.DataFrame, metrics: Sequence[str], *, a: str = "bn",
                       b: str = "none") -> pd.DataFrame:
    """``a`` minus ``b`` per condition and metric, paired over seeds, with a 95% interval.

    One row per (condition, metric): ``a_mean``, ``b_mean``, ``diff``, ``lo``, ``hi`` and ``n``
    (pairs with both values finite: a seed where one model never reached a threshold drops out
    of that epochs-to-threshold difference). Conditions lacking either norm are skipped.
    """
    check_columns(runs, [*RUN_COLS, *metrics], "run summary")
    rows = []
    for key, grp in runs.groupby(list(CONDITION_COLS), sort=False, observed=True):
        ga = grp[grp["norm"] == a].set_index("seed")
        gb = grp[grp["norm"] == b].set_index("seed")
        seeds = ga.index.intersection(gb.index)
        if seeds.empty:
            continue
        for m in metrics:
            va, vb = ga.loc[seeds, m].to_numpy(dtype=float), gb.loc[seeds, m].to_numpy(dtype=float)
            ok = np.isfinite(va) & np.isfinite(vb)
            est = diff_ci(va[ok], vb[ok], paired=True)
            row = dict(zip(CONDITION_COLS, key, strict=True))
            row.update(metric=m, a=a, b=b, a_mean=float(np.mean(va[ok])) if ok.any() else np.nan,
                       b_mean=float(np.mean(vb[ok])) if ok.any() else np.nan, **_cols(est, "diff"))
            rows.append(row)
    return pd.DataFrame(rows)


def mem_at_epochs_table(runs: pd.DataFrame, at_epochs: Sequence[int | str]) -> pd.DataFrame:
    """Memorization at fixed epochs as ``mean [lo, hi]`` text (intervals clipped to [0, 100]%),
    one column per norm.

    ``at_epochs`` names columns of ``runs``: an integer ``e`` means ``mem_at_e``; ``"final"``
    means ``final_mem``. Rows are (condition, epoch); the BN-minus-none paired difference is
    added as a last column when both norms are present.
    """
    cols = {e: ("final_mem" if e == "final" else f"mem_at_{e}") for e in at_epochs}
    table = condition_table(runs, metrics=list(cols.values()))
    diffs = {(*r[list(CONDITION_COLS)], r["metric"]): _estimate(r, "diff")
             for _, r in paired_differences(runs, list(cols.values())).iterrows()}
    norms = ordered_norms(table["norm"]) if len(table) else []
    rows = []
    for key, grp in table.groupby(list(CONDITION_COLS), sort=False, observed=True):
        for e, col in cols.items():
            row = dict(zip(CONDITION_COLS, key, strict=True))
            row["epoch"] = str(e)
            for n in norms:
                sel = grp[grp["norm"] == n]
                if len(sel):
                    est = _estimate(sel.iloc[0], col, f"{col}_")
                    row[NORM_LABELS.get(n, n)] = est.within(0.0, 1.0).fmt(1, 100.0)
            if (*key, col) in diffs:
                row["BN - none"] = _fmt_signed(diffs[(*key, col)])
            rows.append(row)
    return pd.DataFrame(rows)


def _per_group(frame: pd.DataFrame, by: Sequence[str], summary) -> pd.DataFrame:
    """One row per group of ``frame`` by the columns ``by`` (in order of first appearance): the
    group's ``by`` values and the dict ``summary(group)``."""
    return pd.DataFrame([{**dict(zip(by, key, strict=True)), **summary(grp)}
                         for key, grp in frame.groupby(list(by), sort=False, observed=True)])


def _cols(est: Estimate, col: str = "mean", prefix: str = "") -> dict:
    """``est`` as the columns ``col``, ``<prefix>lo``, ``<prefix>hi`` and ``<prefix>n``."""
    return {col: est.mean, f"{prefix}lo": est.lo, f"{prefix}hi": est.hi, f"{prefix}n": est.n}


def _estimate(row: pd.Series, col: str, prefix: str = "") -> Estimate:
    """The Estimate that :func:`_cols` wrote into ``row``."""
    return Estimate(row[col], row[f"{prefix}lo"], row[f"{prefix}hi"], int(row[f"{prefix}n"]))


def _fmt_signed(est: Estimate) -> str:
    """``+d [+lo, +hi]`` of a difference of accuracies in percent points, its interval clipped
    to [-1, 1]."""
    c = est.within(-1.0, 1.0)
    return f"{c.mean * 100.0:+.1f} [{c.lo * 100.0:+.1f}, {c.hi * 100.0:+.1f}]"


def format_condition_table(table: pd.DataFrame, *, metrics: Sequence[str] | None = None
                           ) -> pd.DataFrame:
    """Display form of :func:`condition_table`: ``mean [lo, hi]`` strings (accuracies in %).

    Epochs-to-threshold cells read ``mean [lo, hi] (k/n)`` with k the seeds that reached it,
    or ``never (0/n)``. Accuracy intervals are clipped to [0, 100]% for display.
    """
    if metrics is None:
        metrics = [c for c in table.columns if f"{c}_lo" in table.columns]
    out = table[[*CONDITION_COLS, "norm"]].copy()
    out["norm"] = out["norm"].map(lambda n: NORM_LABELS.get(n, n))
    for m in metrics:
        cells = []
        for _, r in table.iterrows():
            est = _estimate(r, m, f"{m}_")
            if m.startswith("epochs_to_"):
                k, n = int(r[f"{m}_n"]), int(r["n_seeds"])
                cells.append(f"never (0/{n})" if k == 0 else
                             (f"{est.mean:.1f} ({k}/{n})" if k == 1 else f"{est.fmt(1)} ({k}/{n})"))
            elif m in ("final_mem", "mean_mem", "final_test_acc", "final_clean_acc") \
                    or m.startswith("mem_at_"):
                cells.append(est.within(0.0, 1.0).fmt(1, 100.0))
            else:
                cells.append(est.fmt(3))
        out[m] = cells
    return out.reset_index(drop=True)


# --- gamma / sigma (claim T3) --------------------------------------------------------------------
def gamma_sigma_fractions(gs: pd.DataFrame, *, threshold: float = 1.0, ratio_col: str = "ratio"
                          ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fraction of BN channels with gamma/sigma above ``threshold``: per layer and overall.

    ``gs`` has one row per (run, BN layer, channel), as
    :func:`bnmem_utils.models.gamma_sigma.gamma_sigma_stats` gives with the run's :data:`RUN_COLS` added. The
    fraction is taken within each run, then averaged over seeds with a t-interval. Returns
    ``(per_layer, overall)``; per_layer also carries the median ratio and keeps the layers in
    network order.
    """
    check_columns(gs, [*RUN_COLS, "layer", ratio_col], "gamma/sigma frame")
    group = [*CONDITION_COLS, "norm"]                  # a run's columns but the seed
    above = gs.assign(_above=gs[ratio_col] > threshold)
    per_run = (above.groupby([*RUN_COLS, "layer"], sort=False, observed=True)
               .agg(frac=("_above", "mean"), median=(ratio_col, "median"),
                    channels=("_above", "size"))
               .reset_index())
    per_layer = _per_group(per_run, [*group, "layer"], lambda g: {
        "channels": int(g["channels"].iloc[0]), **_cols(mean_ci(g["frac"]), "frac_above"),
        "median_ratio": mean_ci(g["median"]).mean})
    overall_run = (above.groupby(list(RUN_COLS), sort=False, observed=True)["_above"].mean()
                   .reset_index())
    overall = _per_group(overall_run, group, lambda g: _cols(mean_ci(g["_above"]), "frac_above"))
    return per_layer, overall


# --- figures -------------------------------------------------------------------------------------
def curve_stats(hist: pd.DataFrame, metric: str, *, by: Sequence[str] = (*CONDITION_COLS, "norm"),
                seed_col: str = "seed") -> pd.DataFrame:
    """Per-epoch mean and 95% t-interval over seeds of ``metric``: the data behind a curve plot."""
    check_columns(hist, [*by, seed_col, "epoch", metric], "history frame")
    return _per_group(hist, [*by, "epoch"], lambda g: {
        "metric": metric, **_cols(mean_ci(g[metric].to_numpy(dtype=float)))})


# --- key numbers for the results file ------------------------------------------------------------
def slug(text) -> str:
    """A results-key fragment: ``"OOD 2% (gaussian)"`` -> ``"ood_2pct_gaussian"``."""
    import re

    s = re.sub(r"[^a-z0-9.]+", "_", str(text).lower().replace("%", "pct"))
    return s.replace(".", "p").strip("_")


def result_records(runs: pd.DataFrame, *, at_epochs: Sequence[int] = (),
                   headline_epoch: int | None = None,
                   gs_per_layer: pd.DataFrame | None = None, gs_runs: pd.DataFrame | None = None
                   ) -> list[tuple[Result, Estimate, dict]]:
    """The key numbers of a memorization grid as ``(result, value, extras)`` for ``nb.record``
    (:meth:`bnmem_utils.run.notebook.NotebookContext.record_all`), each
    :class:`~bnmem_utils.core.results.Result` with the condition's data set, architecture and
    setting (a key fragment through :func:`slug`, and its words):

    * per norm, metric ``mem_at<e>``, ``mem_final``, ``mem_mean``, ``mem_epochs_to_50`` and
      ``mem_test_acc``: each an :class:`Estimate` over seeds;
    * ``mem_diff`` (versus ``none``, ``when`` ``at<headline_epoch>`` and ``final``): the paired
      BN-minus-no-norm difference of memorization at the headline epoch and at the end, the
      numbers of claims C1a and C1b;
    * the other paired differences (other fixed epochs, ``mem_mean``, ``mem_epochs_to_50``,
      ``mem_test_acc``) under their own metric, versus ``none``;
    * ``mem_t3_frac_above1``: fraction of BN channels with gamma/sigma above 1 (claim T3, per
      condition), ``mem_t3_layer_frac_above1`` per layer (``subset``), and
      ``mem_t3_overall_frac_above1`` (``..._batch_sigma``) over every BN run.
    """
    metrics = {**{f"mem_at{e}": f"mem_at_{e}" for e in at_epochs}, "mem_final": "final_mem",
               "mem_mean": "mean_mem", "mem_epochs_to_50": "epochs_to_50",
               "mem_test_acc": "final_test_acc"}
    metrics = {k: v for k, v in metrics.items() if v in runs.columns}
    words = {**{f"mem_at{e}": f"memorization at epoch {e}" for e in at_epochs},
             "mem_final": "final memorization (accuracy on corrupted samples, training labels)",
             "mem_mean": "memorization averaged over epochs (speed, no threshold)",
             "mem_epochs_to_50": "epochs to 50% memorization (seeds that reached it)",
             "mem_test_acc": "final clean test accuracy"}
    headline = {"mem_final": "final"}
    if headline_epoch is not None and f"mem_at{headline_epoch}" in metrics:
        headline[f"mem_at{headline_epoch}"] = f"at{headline_epoch}"
    recs: list[tuple[Result, Estimate, dict]] = []
    for _, r in condition_table(runs, metrics=list(metrics.values())).iterrows():
        for short, col in metrics.items():
            recs.append((_condition(r, short, norm=slug(r["norm"])), _estimate(r, col, f"{col}_"),
                         {"description": f"{words[short]}; {_where(r)}, "
                                         f"{NORM_LABELS.get(r['norm'], r['norm'])}"}))
    diffs = paired_differences(runs, list(metrics.values()))
    inverse = {v: k for k, v in metrics.items()}
    for _, d in diffs.iterrows():
        short = inverse[d["metric"]]
        what = (_condition(d, "mem_diff", norm="bn", versus="none", when=headline[short])
                if short in headline else _condition(d, short, norm="bn", versus="none"))
        recs.append((what, _estimate(d, "diff"),
                     {"description": f"BN minus no norm, paired over seeds: {words[short]}; "
                                     f"{_where(d)}"}))
    return recs + _t3_records(gs_per_layer, gs_runs)


def _condition(r: pd.Series, metric: str, **fields) -> Result:
    """A result of a row's condition (data set, architecture, setting)."""
    return Result(metric, dataset=slug(r["dataset"]), arch=slug(r["arch"]),
                  setting=slug(r["setting"]), label=str(r["setting"]), **fields)


def _where(r: pd.Series) -> str:
    """A row's condition in words."""
    return ", ".join(str(r[c]) for c in CONDITION_COLS)


def _t3_records(gs_per_layer: pd.DataFrame | None, gs_runs: pd.DataFrame | None
                ) -> list[tuple[Result, Estimate, dict]]:
    """Claim T3's records of :func:`result_records`: the fraction of BN channels with
    gamma/sigma above 1 per layer, per condition and over every BN run."""
    recs: list[tuple[Result, Estimate, dict]] = []
    if gs_per_layer is not None and len(gs_per_layer):
        for _, r in gs_per_layer.iterrows():
            recs.append((_condition(r, "mem_t3_layer_frac_above1", subset=slug(r["layer"])),
                         _estimate(r, "frac_above"),
                         {"description": f"fraction of BN channels with gamma/sigma > 1 in "
                                         f"layer {r['layer']}; {_where(r)}"}))
    if gs_runs is None or not len(gs_runs):
        return recs
    _, overall = gamma_sigma_fractions(gs_runs)
    for _, r in overall.iterrows():
        recs.append((_condition(r, "mem_t3_frac_above1"), _estimate(r, "frac_above"),
                     {"description": "fraction of all BN channels with gamma/running sigma > 1; "
                                     f"{_where(r)}"}))
    recs.append((Result("mem_t3_overall_frac_above1"), overall_fraction(gs_runs),
                 {"description": "fraction of BN channels with gamma/running sigma > 1, "
                                 "mean over every BN run of the grid"}))
    if "batch_ratio" in gs_runs:
        recs.append((Result("mem_t3_overall_frac_above1_batch_sigma"),
                     overall_fraction(gs_runs, ratio_col="batch_ratio"),
                     {"description": "fraction of BN channels with gamma/sigma_B > 1 "
                                     "(sigma of one training batch), mean over every BN run"}))
    return recs


def overall_fraction(gs: pd.DataFrame, *, threshold: float = 1.0, ratio_col: str = "ratio"
                     ) -> Estimate:
    """Fraction of BN channels above ``threshold`` within each run, averaged over all runs
    (``gs`` checked by the caller, :func:`_t3_records`, through :func:`gamma_sigma_fractions`)."""
    per_run = (gs.assign(_above=gs[ratio_col] > threshold)
               .groupby(list(RUN_COLS), sort=False, observed=True)["_above"].mean())
    return mean_ci(per_run.to_numpy(dtype=float))


