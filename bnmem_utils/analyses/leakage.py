"""The tables of notebook 04 over finished shadow-model banks (:class:`bnmem_utils.jobs.bank.Bank`):
per arm, the attack's metrics beside the accuracies; each norm against a baseline; every
attack side by side; eval- against train-mode queries; memorization per sample and group; the
ROC curves' data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import diff_ci, mean_ci
from bnmem_utils.jobs.bank import Bank
from bnmem_utils.privacy import attacks
from bnmem_utils.privacy.attacks import ci_columns

__all__ = ["arm_table", "attack_comparison", "format_table", "lira_records", "memorization_frame",
           "memorization_summary", "norm_differences", "roc_frame", "train_mode_ablation"]


def arm_table(banks: Sequence[Bank], attack: str = "lira_online", mode: str = "eval"
              ) -> pd.DataFrame:
    """Per arm and subset: the attack's AUC, balanced accuracy and TPR at 0.1% / 1% FPR (mean
    and 95% interval over targets), beside the arm's train and test accuracy (over models)."""
    rows = []
    for bank in banks:
        loo = bank.evaluate(mode=mode)
        summary = attacks.summarize(loo.metrics[loo.metrics.attack == attack])
        acc = {c: bank.accuracy(c) for c in ("train_acc", "test_acc", "gap")}
        for _, s in summary.iterrows():
            rows.append({"arm": bank.config.arm, "arch": bank.config.model.arch,
                         "norm": bank.config.model.norm, "setting": bank.config.setting,
                         **s.to_dict(),
                         **{c: e.mean for c, e in acc.items()},
                         **{f"{c}_lo": e.lo for c, e in acc.items()},
                         **{f"{c}_hi": e.hi for c, e in acc.items()}})
    return pd.DataFrame(rows)


def norm_differences(banks: Sequence[Bank], attack: str = "lira_online", metric: str = "auc",
                     baseline: str = "none", mode: str = "eval") -> pd.DataFrame:
    """Each norm minus ``baseline`` (same data set, architecture and setting), per subset, with
    a Welch interval over the two banks' targets (targets of different banks are not paired)."""
    by_arm = {(b.config.data.dataset, b.config.model.arch, b.config.setting, b.config.model.norm): b for b in banks}
    rows = []
    for (dataset, arch, setting, norm), bank in by_arm.items():
        base = by_arm.get((dataset, arch, setting, baseline))
        if norm == baseline or base is None:
            continue
        ma, mb = bank.evaluate(mode=mode).metrics, base.evaluate(mode=mode).metrics
        for subset in ma.subset.unique():
            if subset not in set(mb.subset):
                continue
            est = attacks.metric_difference(ma, mb, attack, subset, metric)
            rows.append({"dataset": dataset, "arch": arch, "setting": setting,
                         "norm": norm, "baseline": baseline,
                         "subset": subset, "attack": attack, "metric": metric,
                         "diff": est.mean, "lo": est.lo, "hi": est.hi, "n": est.n})
    return pd.DataFrame(rows)


def lira_records(banks: Sequence[Bank], diffs: pd.DataFrame, attack: str = "lira_online"
                 ) -> list[tuple[Result, object, dict]]:
    """Notebook 04's key numbers of its banks as ``(result, value, extras)`` for
    ``nb.record_all``: each norm minus its baseline (``lira_auc_diff``, rows of
    :func:`norm_differences`), and per bank the AUC on all samples and on the outliers
    (``lira_auc``), the TPR at 1% FPR, the models' test accuracy and train-test gap."""
    by_arm = {(b.config.data.dataset, b.config.model.arch, b.config.setting,
               b.config.model.norm): b for b in banks}
    out = []
    for _, d in diffs.iterrows():
        config = by_arm[d.dataset, d.arch, d.setting, d.norm].config
        out.append((Result.of(config, "lira_auc_diff", versus=d.baseline, subset=d.subset),
                    d["diff"], {"lo": d.lo, "hi": d.hi, "n": int(d.n), "description":
                                f"{attack} AUC, {d.norm} minus {d.baseline}, {d.dataset}/"
                                f"{d.arch}, {d.setting}, {d.subset} samples (Welch 95% over "
                                "targets)"}))
    for b in banks:
        metrics = b.evaluate().metrics
        for subset in ("all", "outlier"):
            if subset in set(metrics.subset):
                out.append((Result.of(b.config, "lira_auc", subset=subset),
                            attacks.metric_estimate(metrics, attack, subset),
                            {"description": f"{attack} AUC on {subset} samples, {b.config.arm} "
                                            f"(95% over {b.n_models} targets)"}))
        for metric, value, what in (
                ("lira_tpr1", attacks.metric_estimate(metrics, attack, "all", "tpr@1%"),
                 f"{attack} TPR at 1% FPR"),
                ("lira_test_acc", b.accuracy("test_acc"), "test accuracy of the bank's models"),
                ("lira_gap", b.accuracy("gap"), "train minus test accuracy of the bank's models")):
            out.append((Result.of(b.config, metric), value,
                        {"description": f"{what}, {b.config.arm}"}))
    return out


def format_table(df: pd.DataFrame, columns: Sequence[str], *, digits: int = 3,
                 keep: Sequence[str] = ()) -> pd.DataFrame:
    """``keep`` columns as they are, then each of ``columns`` as ``mean [lo, hi]`` text (from
    its ``_lo``/``_hi`` companions), for display."""
    out = df[list(keep)].copy()
    for c in columns:
        out[c] = [f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
                  for m, lo, hi in zip(df[c], df[f"{c}_lo"], df[f"{c}_hi"], strict=True)]
    return out


def attack_comparison(banks: Sequence[Bank], metric: str = "auc", subset: str = "all",
                      digits: int = 3) -> pd.DataFrame:
    """Arms (rows) by attacks (columns): ``mean [lo, hi]`` of ``metric`` over targets."""
    rows = {}
    for bank in banks:
        s = attacks.summarize(bank.evaluate().metrics)
        s = s[s.subset == subset]
        rows[bank.config.arm] = dict(zip(s.attack, format_table(s, [metric], digits=digits)[metric],
                                         strict=True))
    return pd.DataFrame.from_dict(rows, orient="index")


def train_mode_ablation(banks: Sequence[Bank], attack: str = "lira_online",
                        metric: str = "auc") -> pd.DataFrame:
    """BN banks queried in eval mode against the same models queried in train mode (as the
    reference code did): ``metric`` per subset, and train minus eval with a paired interval
    (same models, same targets)."""
    rows = []
    for bank in banks:
        if bank.train_mode_scores is None:
            continue
        ev, tr = bank.evaluate().metrics, bank.evaluate(mode="train").metrics
        for subset in ev.subset.unique():
            a = ev[(ev.attack == attack) & (ev.subset == subset)].sort_values("target")
            b = tr[(tr.attack == attack) & (tr.subset == subset)].sort_values("target")
            d = diff_ci(b[metric].to_numpy(), a[metric].to_numpy(), paired=True)
            rows.append({"arm": bank.config.arm, "setting": bank.config.setting,
                         "subset": subset, **ci_columns("eval", mean_ci(a[metric])),
                         **ci_columns("train", mean_ci(b[metric])), **ci_columns("diff", d)})
    return pd.DataFrame(rows)


def memorization_frame(banks: Sequence[Bank]) -> pd.DataFrame:
    """One row per (arm, pool sample): Feldman-Zhang memorization and whether it is an outlier."""
    parts = []
    for bank in banks:
        mem = bank.memorization()
        parts.append(pd.DataFrame({"arm": bank.config.arm, "norm": bank.config.model.norm,
                                   "setting": bank.config.setting, "sample": np.arange(mem.size),
                                   "outlier": bank.outliers, "memorization": mem}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def memorization_summary(banks: Sequence[Bank]) -> pd.DataFrame:
    """Per arm and sample group (clean / outlier): mean memorization with a t-interval over
    samples, and the fraction of samples with memorization above 0.5."""
    frame = memorization_frame(banks)
    rows = []
    for (arm, norm, setting, outlier), g in frame.groupby(["arm", "norm", "setting", "outlier"],
                                                          sort=False):
        est = mean_ci(g.memorization.to_numpy())
        rows.append({"arm": arm, "norm": norm, "setting": setting,
                     "group": "outlier" if outlier else "clean", "n": est.n,
                     **ci_columns("memorization", est),
                     "frac_above_0.5": float((g.memorization > 0.5).mean())})
    return pd.DataFrame(rows)


def roc_frame(banks: Sequence[Bank], attack: str = "lira_online", subset: str = "all",
              mode: str = "eval") -> pd.DataFrame:
    """Mean TPR over targets at each FPR of the log grid, one row per (arm, fpr): the data
    behind the log-log ROC figure."""
    parts = []
    for bank in banks:
        roc = bank.evaluate(mode=mode).roc
        roc = roc[(roc.attack == attack) & (roc.subset == subset)]
        mean = roc.groupby("fpr", as_index=False).tpr.mean()
        parts.append(mean.assign(arm=bank.config.arm, norm=bank.config.model.norm,
                                 setting=bank.config.setting, attack=attack, subset=subset))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
