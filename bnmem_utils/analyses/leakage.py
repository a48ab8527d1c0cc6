"""Notebook 04's banks (:func:`configs_from_params`) and its tables over the finished
shadow-model banks (:class:`bnmem_utils.jobs.bank.Bank`):
per arm, the attack's metrics beside the accuracies; each norm against a baseline; every
attack side by side; eval- against train-mode queries; memorization per sample and group; the
ROC curves' data.

**Replicate banks.** An arm may be trained as R independent banks, each from its own seed (its
pool's outliers, keep matrix and model initialisations; replicate r of every arm of a setting
shares that seed). The numbers that judge claims (:func:`norm_differences`,
:func:`train_mode_ablation`, :func:`lira_records`) then carry both sources of variance, the
retraining's and the targets', through a Student t over the R replicates' own numbers
(:func:`bnmem_utils.core.stats.replicated`; R - 1 degrees of freedom: three banks are three
data points), and say how the first bank's own interval compares (its calibration). The descriptive tables take the banks they are given
(:func:`first_replicate`: one bank per arm).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import Estimate, mean_ci, replicated
from bnmem_utils.jobs.bank import Bank, curve_config, make_arms
from bnmem_utils.jobs.config import RunConfig
from bnmem_utils.privacy import attacks
from bnmem_utils.privacy.attacks import ci_columns
from bnmem_utils.training.steps import TrainConfig

__all__ = ["ablation_records", "arm_replicates", "arm_table", "attack_comparison",
           "configs_from_params", "first_replicate", "format_table", "lira_records",
           "memorization_frame", "memorization_summary", "norm_differences", "roc_frame",
           "train_mode_ablation"]


def configs_from_params(params: Mapping) -> tuple[list[RunConfig], RunConfig | None]:
    """The banks of notebook 04 (``04_lira``) from its parameters ``params`` (the names of its
    ``parameters`` cell: ``seed`` and the ``lira_*`` values), in the order it trains them: every
    arm (data set, architecture, outlier rate, norm) as ``lira_replicates`` independent banks,
    replicate r from seed ``seed + r``; and the shadow-count curve's bank (None when
    ``lira_curve_models`` is 0). The notebook and :mod:`bnmem_utils.run.work` both build its
    banks here."""
    p = params
    recipe = TrainConfig(epochs=p["lira_epochs"], batch_size=p["lira_batch_size"],
                         optimizer=p["lira_optimizer"], lr=p["lira_lr"],
                         weight_decay=p["lira_weight_decay"], augment=p["lira_augment"])
    configs = [cfg for r in range(p["lira_replicates"]) for ds in p["lira_datasets"]
               for cfg in make_arms(
                   dataset=ds, archs=p["lira_archs"], norms=p["lira_norms"],
                   outlier=p["lira_outlier"], outlier_rates=p["lira_outlier_rates"],
                   ood_source=p["lira_ood_source"], train=recipe, train_size=p["lira_train_size"],
                   test_size=p["lira_test_size"], width=p["lira_width"],
                   n_models=p["lira_n_models"], population_size=p["lira_population_size"],
                   seed=p["seed"] + r)]
    curve = curve_config(configs[0], p["lira_curve_models"]) if p["lira_curve_models"] else None
    return configs, curve


def arm_replicates(banks: Sequence[Bank]) -> dict[tuple[str, str, str, str], list[Bank]]:
    """The banks of each arm ``(dataset, arch, setting, norm)``, its replicates in seed order."""
    out: dict[tuple[str, str, str, str], list[Bank]] = {}
    for bank in sorted(banks, key=lambda b: b.config.seed):
        c = bank.config
        out.setdefault((c.data.dataset, c.model.arch, c.setting, c.model.norm), []).append(bank)
    return out


def first_replicate(banks: Sequence[Bank]) -> list[Bank]:
    """One bank per arm, the replicate of the lowest seed, in the order given."""
    firsts = {id(reps[0]) for reps in arm_replicates(banks).values()}
    return [b for b in banks if id(b) in firsts]


def _replicate_columns(prefix: str, numbers: dict) -> dict:
    """A :func:`~bnmem_utils.core.stats.replicated` result as table columns: ``prefix`` (its
    value), ``_lo``, ``_hi``, ``n`` (replicates, or targets with one bank), ``replicates``,
    ``method``, the first bank's own interval (``first_lo``, ``first_hi``) and ``calibration``."""
    est, first = numbers["estimate"], numbers["first"]
    return {**ci_columns(prefix, est), "n": est.n, "method": est.method,
            "replicates": 1 if numbers["calibration"] is None else est.n,
            "first_lo": first.lo, "first_hi": first.hi, "calibration": numbers["calibration"]}


def arm_table(banks: Sequence[Bank], attack: str = "auto", mode: str = "eval") -> pd.DataFrame:
    """Per arm and subset: the attack's AUC, balanced accuracy and TPR at 0.1% / 1% FPR (mean
    and 95% interval over targets), beside the arm's train and test accuracy (over models).
    ``attack`` here and below: ``"auto"`` is the banks' headline attack, one for all of them
    (:func:`bnmem_utils.privacy.attacks.resolve_attack`: from the shadows a side they leave)."""
    attack, rows = attacks.resolve_attack(attack, *banks), []
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


def norm_differences(banks: Sequence[Bank], attack: str = "auto", metric: str = "auc",
                     baseline: str = "none", mode: str = "eval") -> pd.DataFrame:
    """Each norm minus ``baseline`` (same data set, architecture and setting), per subset. With
    one bank per arm: a Welch interval over the two banks' targets (targets of different banks
    are not paired). With R replicates per arm (replicate r of both arms from one seed): the
    Student t over the replicates' differences (a paired t over replicates, R - 1 d.o.f.), with
    the first replicate's Welch interval and the calibration beside it
    (:func:`_replicate_columns`)."""
    attack, groups, rows = attacks.resolve_attack(attack, *banks), arm_replicates(banks), []
    for (dataset, arch, setting, norm), reps in groups.items():
        base = groups.get((dataset, arch, setting, baseline))
        if norm == baseline or base is None:
            continue
        if [b.config.seed for b in reps] != [b.config.seed for b in base]:
            raise ValueError(f"{reps[0].config.arm} and its {baseline} arm need replicates of the "
                             f"same seeds; got {[b.config.seed for b in reps]} and "
                             f"{[b.config.seed for b in base]}")
        ma = [b.evaluate(mode=mode).metrics for b in reps]
        mb = [b.evaluate(mode=mode).metrics for b in base]
        for subset in ma[0].subset.unique():
            if subset not in set(mb[0].subset):
                continue
            numbers = replicated([attacks.target_values(m, attack, subset, metric) for m in ma],
                                 [attacks.target_values(m, attack, subset, metric) for m in mb])
            cols = _replicate_columns("diff", numbers)
            rows.append({"dataset": dataset, "arch": arch, "setting": setting,
                         "norm": norm, "baseline": baseline,
                         "subset": subset, "attack": attack, "metric": metric,
                         **cols, "lo": cols.pop("diff_lo"), "hi": cols.pop("diff_hi"),
                         "seeds": [b.config.seed for b in reps]})
    return pd.DataFrame(rows)


def _targets_of(reps: Sequence[Bank], attack: str, subset: str, metric: str) -> dict:
    return replicated([attacks.target_values(b.evaluate().metrics, attack, subset, metric)
                       for b in reps])


def lira_records(banks: Sequence[Bank], diffs: pd.DataFrame, attack: str = "auto",
                 secondary: bool = False) -> list[tuple[Result, object, dict]]:
    """Notebook 04's key numbers of its banks as ``(result, value, extras)`` for
    ``nb.record_all``: each norm minus its baseline (``lira_auc_diff``, rows of
    :func:`norm_differences`, with their replicates and calibration), and per arm the AUC on
    all samples and on the outliers (``lira_auc``), the TPR at 1% FPR (both over the targets of
    every replicate, a t over the replicates' means), the models' test accuracy and train-test gap (over the models
    of every replicate). ``secondary``: another attack's numbers beside the headline's, each
    result with its ``attack`` field, the models' accuracies left to the headline's records."""
    attack, groups = attacks.resolve_attack(attack, *banks), arm_replicates(banks)
    tag = {"attack": attack} if secondary else {}
    out = []
    for _, d in diffs.iterrows():
        config = groups[d.dataset, d.arch, d.setting, d.norm][0].config
        over = (f"{d.replicates} replicate banks per arm" if d.replicates > 1
                else "Welch 95% over targets")
        out.append((Result.of(config, "lira_auc_diff", versus=d.baseline, subset=d.subset, **tag),
                    Estimate(d["diff"], d.lo, d.hi, int(d.n), method=d.method),
                    {"replicates": int(d.replicates), "calibration": d.calibration,
                     "description": f"{attack} AUC, {d.norm} minus {d.baseline}, {d.dataset}/"
                                    f"{d.arch}, {d.setting}, {d.subset} samples ({over}; seeds "
                                    f"{', '.join(map(str, d.seeds))})"}))
    for reps in groups.values():
        b, r = reps[0], len(reps)
        metrics = b.evaluate().metrics
        for subset in ("all", "outlier"):
            if subset in set(metrics.subset):
                out.append((Result.of(b.config, "lira_auc", subset=subset, **tag),
                            _targets_of(reps, attack, subset, "auc")["estimate"],
                            {"replicates": r, "description": f"{attack} AUC on {subset} samples, "
                             f"{b.config.arm} (95% over {r} x {b.n_models} targets)"}))
        models = pd.concat([x.models for x in reps])
        for metric, value, what in (
                ("lira_tpr1", _targets_of(reps, attack, "all", "tpr@1%")["estimate"],
                 f"{attack} TPR at 1% FPR"),
                ("lira_test_acc", mean_ci(models.test_acc), "test accuracy of the bank's models"),
                ("lira_gap", mean_ci(models.gap), "train minus test accuracy of the bank's models")
        )[:1 if secondary else 3]:                 # a secondary attack: its TPR only
            out.append((Result.of(b.config, metric, **tag), value,
                        {"replicates": r, "description": f"{what}, {b.config.arm}"}))
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


def attack_table(banks: Sequence[Bank]) -> pd.DataFrame:
    """Every attack on every bank (each replicate its own rows): AUC, balanced accuracy and TPR
    at low FPR with their 95% intervals over the bank's targets, per subset; the CSV behind
    the notebook's attack tables."""
    frames = [attacks.summarize(b.evaluate().metrics).assign(
        arm=b.config.arm, replicate=i) for reps in arm_replicates(banks).values()
        for i, b in enumerate(reps)]
    table = pd.concat(frames, ignore_index=True)
    return table[["arm", "replicate", *[c for c in table.columns if c not in ("arm", "replicate")]]]


def train_mode_ablation(banks: Sequence[Bank], attack: str = "auto", metric: str = "auc"
                        ) -> pd.DataFrame:
    """BN banks queried in eval mode against the same models queried in train mode (as the
    reference code did): ``metric`` per subset, and train minus eval, paired over targets (same
    models, same targets), a t over the replicates' mean differences when an arm has several."""
    attack, rows = attacks.resolve_attack(attack, *banks), []
    for reps in arm_replicates(banks).values():
        if reps[0].train_mode_scores is None:
            continue
        ev = [b.evaluate().metrics for b in reps]
        tr = [b.evaluate(mode="train").metrics for b in reps]
        for subset in ev[0].subset.unique():
            def values(frames, s=subset):
                return [f[(f.attack == attack) & (f.subset == s)].sort_values("target")[metric]
                        .to_numpy() for f in frames]
            a, b = values(ev), values(tr)
            numbers = replicated(b, a, paired=True)
            rows.append({"arm": reps[0].config.arm, "setting": reps[0].config.setting,
                         "subset": subset, **ci_columns("eval", replicated(a)["estimate"]),
                         **ci_columns("train", replicated(b)["estimate"]),
                         **_replicate_columns("diff", numbers)})
    return pd.DataFrame(rows)


def ablation_records(banks: Sequence[Bank], ablation: pd.DataFrame, attack: str = "auto",
                     secondary: bool = False) -> list[tuple[Result, object, dict]]:
    """The control of section 6 as key numbers (``lira_eval_minus_trainmode_auc``): eval-mode
    minus train-mode AUC on all samples per BN arm, positive when the reference code's
    train-mode queries understate the leakage (rows of :func:`train_mode_ablation`);
    ``secondary``: another attack's, beside the headline's (:func:`lira_records`)."""
    attack, out = attacks.resolve_attack(attack, *banks), []
    configs = {b.config.arm: b.config for b in banks}
    for _, r in ablation[ablation.subset == "all"].iterrows():
        result = Result.of(configs[r.arm], "lira_eval_minus_trainmode_auc",
                           **({"attack": attack} if secondary else {}))
        over = (f"{r.replicates} replicate banks" if r.replicates > 1
                else "paired 95% over targets")
        out.append((result, Estimate(-r["diff"], -r.diff_hi, -r.diff_lo, int(r.n), method=r.method),
                    {"replicates": int(r.replicates), "calibration": r.calibration,
                     "description": f"{attack} AUC with eval-mode minus train-mode queries, "
                                    f"{r.arm}, all samples ({over})"}))
    return out


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


def roc_frame(banks: Sequence[Bank], attack: str = "auto", subset: str = "all",
              mode: str = "eval") -> pd.DataFrame:
    """Mean TPR over targets at each FPR of the log grid, one row per (arm, fpr): the data
    behind the log-log ROC figure."""
    attack, parts = attacks.resolve_attack(attack, *banks), []
    for bank in banks:
        roc = bank.evaluate(mode=mode).roc
        roc = roc[(roc.attack == attack) & (roc.subset == subset)]
        mean = roc.groupby("fpr", as_index=False).tpr.mean()
        parts.append(mean.assign(arm=bank.config.arm, norm=bank.config.model.norm,
                                 setting=bank.config.setting, attack=attack, subset=subset))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
