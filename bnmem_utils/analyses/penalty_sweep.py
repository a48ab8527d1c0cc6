"""Notebook 05's logic: the gamma/sigma penalty (:mod:`bnmem_utils.training.penalty`) swept against
memorization and clean accuracy.

The sweep as runs (:func:`sweep_arms`, :func:`sweep_configs`: each arm a norm and a
:class:`~bnmem_utils.training.penalty.PenaltyConfig`, the ``penalty`` field of its runs), per-run and
per-setting tables (:func:`runs_table`, :func:`arm_summary`), the key numbers
(:func:`result_records`; the interval-aware choice of lambda is
:func:`bnmem_utils.analyses.mitigation.choose_lambda`), LiRA banks whose members train with the penalty
(:func:`train_arm_banks`), and gamma/sigma distributions of trained models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from bnmem_utils.analyses.memorization import MEM_METRIC
from bnmem_utils.analyses.mitigation import BASELINE, arm_slug
from bnmem_utils.core.device import resolve_device
from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import Estimate, mean_ci
from bnmem_utils.jobs.bank import train_banks
from bnmem_utils.jobs.bank_models import prepare_data
from bnmem_utils.jobs.config import PenaltyConfig, RunConfig
from bnmem_utils.jobs.grid import gamma_sigma_frame, history_frame
from bnmem_utils.models.gamma_sigma import gamma_sigma_stats
from bnmem_utils.models.nets import NORM_LABELS
from bnmem_utils.privacy.attacks import ci_columns, metric_estimate

# --------------------------------------------------------------------------------------------
# gamma/sigma distribution of a trained model

#: One row per BN channel: layer, channel, gamma, running_sigma, ratio (and batch_ratio given a
#: batch ``x``): :func:`bnmem_utils.models.gamma_sigma.gamma_sigma_stats`, the distribution the penalty
#: acts on.
ratio_distribution = gamma_sigma_stats


def ratio_summary(ratios, threshold: float = 1.0) -> dict[str, float]:
    """Median, mean, 90th percentile, max and fraction above ``threshold`` of a set of ratios."""
    r = np.asarray(ratios, dtype=float).ravel()
    r = r[np.isfinite(r)]
    if r.size == 0:
        nan = float("nan")
        return {"n": 0, "median": nan, "mean": nan, "p90": nan, "max": nan, "frac_above": nan}
    return {"n": int(r.size), "median": float(np.median(r)), "mean": float(r.mean()),
            "p90": float(np.quantile(r, 0.9)), "max": float(r.max()),
            "frac_above": float((r > threshold).mean())}


# --------------------------------------------------------------------------------------------
# Notebook 05: the sweep as run configs, its tables, its banks and its figures


def arm_label(norm: str, penalty: PenaltyConfig | Mapping | None = None) -> str:
    """Readable arm name: ``BN lam=0``, ``BN square lam=0.1``, ``BN hinge lam=1 tau=1``, or the
    reference norm's name (``no norm``, ``GroupNorm``, ``LayerNorm``)."""
    penalty = PenaltyConfig.of(penalty)
    if norm != "bn":
        if penalty is not None:
            raise ValueError(f"the gamma/sigma penalty applies to BN models only, got norm {norm!r}")
        return NORM_LABELS.get(norm, norm)
    if penalty is None or penalty.lam == 0.0:
        return BASELINE
    label = f"BN {penalty.form} lam={penalty.lam:g}"
    if penalty.form == "hinge":
        label += f" tau={penalty.tau:g}"
    return label


def sweep_arms(lams: Sequence[float], *, hinge_lams: Sequence[float] = (),
               hinge_taus: Sequence[float] = (), ref_norms: Sequence[str] = ("none", "gn", "ln")
               ) -> dict[str, tuple[str, PenaltyConfig | None]]:
    """``{label: (norm, penalty)}`` of a mitigation sweep, in plotting order.

    The BN baseline (no penalty) first, then the square form at each lam > 0, then the hinge form
    at each (lam > 0, tau), then the reference norms without any penalty.
    """
    arms: dict[str, tuple[str, PenaltyConfig | None]] = {BASELINE: ("bn", None)}
    penalties = [PenaltyConfig(lam, "square") for lam in lams]          # checks lam
    penalties += [PenaltyConfig(lam, "hinge", tau) for tau in hinge_taus for lam in hinge_lams]
    for penalty in penalties:
        if penalty.lam > 0:
            arms[arm_label("bn", penalty)] = ("bn", penalty)
    for norm in ref_norms:
        if norm == "bn":
            raise ValueError("ref_norms lists the alternatives to BN (none, gn, ln); BN is the sweep")
        arms[arm_label(norm)] = (norm, None)
    return arms


def sweep_configs(arms: Mapping[str, tuple[str, PenaltyConfig | None]], seeds: Sequence[int],
                **common) -> list[RunConfig]:
    """One grid run (:meth:`RunConfig.grid <bnmem_utils.jobs.config.RunConfig.grid>`) per (arm, seed);
    ``common`` holds the shared fields (dataset, arch, flip_rate, epochs, ...). Arms vary
    fastest, so an interrupted sweep leaves complete seeds behind."""
    return [RunConfig.grid(norm=norm, penalty=penalty, seed=int(s), **common)
            for s in seeds for norm, penalty in arms.values()]


def _arm_of(config: RunConfig) -> str:
    return arm_label(config.model.norm, config.penalty)


def runs_table(results: Sequence, *, mem: str = MEM_METRIC) -> pd.DataFrame:
    """One row per finished run: its arm and seed, final memorization ``mem``, clean training
    accuracy, clean test accuracy, the epoch mean of the penalty, and gamma/sigma summaries
    (median over all BN channels of |gamma|/running sigma and of |gamma|/batch sigma, fraction of
    channels with the running ratio above 1)."""
    rows = []
    for r in results:
        config = r.config
        penalty = config.penalty
        last = r.history.iloc[-1] if len(r.history) else pd.Series(dtype=float)
        if mem not in last.index:
            raise ValueError(f"run {r.key} has no {mem!r} column: train it on a corrupted set")
        gs = r.gamma_sigma
        running = ratio_summary(gs["ratio"] if "ratio" in gs else [])
        batch = ratio_summary(gs["batch_ratio"] if "batch_ratio" in gs else [])
        rows.append({
            "arm": _arm_of(config), "norm": config.model.norm, "form": penalty.form if penalty else "",
            "lam": penalty.lam if penalty else 0.0,
            "tau": penalty.tau if penalty and penalty.form == "hinge" else float("nan"),
            "seed": config.seed, "mem": float(last[mem]),
            "clean_acc": float(last.get("clean_acc", float("nan"))),
            "test_acc": float(last.get("test_acc", float("nan"))),
            "reg_loss": float(last.get("reg_loss", float("nan"))),
            "gs_median": running["median"], "gs_batch_median": batch["median"],
            "gs_frac_above_1": running["frac_above"],
            "diverged": bool(r.diverged), "seconds": float(r.seconds)})
    return pd.DataFrame(rows)


def arm_summary(runs: pd.DataFrame, columns: Sequence[str] = ("mem", "test_acc", "clean_acc",
                                                               "gs_median", "gs_frac_above_1")
                ) -> pd.DataFrame:
    """Per arm (in the order they first appear): mean and 95% t-interval over seeds of each
    column, as ``<col>``, ``<col>_lo``, ``<col>_hi``, plus ``n`` and the arm's norm/form/lam/tau."""
    rows = []
    for arm, grp in runs.groupby("arm", sort=False):
        row = {"arm": arm, **{k: grp[k].iloc[0] for k in ("norm", "form", "lam", "tau")},
               "n": len(grp), "diverged": int(grp["diverged"].sum())}
        for c in columns:
            row.update(ci_columns(c, mean_ci(grp[c].to_numpy(dtype=float))))
        rows.append(row)
    return pd.DataFrame(rows)


# -- LiRA banks with the penalty -------------------------------------------------------------


def bank_arms(arms: Mapping[str, tuple[str, PenaltyConfig | None]], chosen: str,
              lams: Sequence[float], extra: Sequence[str] = ()
              ) -> dict[str, tuple[str, PenaltyConfig | None]]:
    """The arms of a sweep that get a LiRA bank: plain BN, the square form at each of ``lams``,
    the ``chosen`` setting, the settings named in ``extra`` (e.g. the chosen one's neighbours on
    the grid) and the BN-free references, in that order."""
    out = {BASELINE: arms[BASELINE]}
    out.update({k: (n, p) for k, (n, p) in arms.items()
                if n == "bn" and p is not None and p.form == "square" and p.lam in lams})
    out[chosen] = arms[chosen]
    out.update({k: arms[k] for k in extra})
    out.update({k: v for k, v in arms.items() if v[0] != "bn"})
    return out


def train_arm_banks(arms: Mapping[str, tuple[str, PenaltyConfig | None]], base: RunConfig,
                    cache_dir, *,
                    device="auto", progress: bool = True, root=None, download: bool = False,
                    executor=None, ray_address: str | None = None) -> dict:
    """One LiRA bank per arm: ``base`` (a bank's :class:`~bnmem_utils.jobs.config.RunConfig`) with the
    arm's norm and penalty, all on one pool, their missing models trained as one batch
    (:func:`bnmem_utils.jobs.bank.train_banks`, with its ``executor`` and ``ray_address``). Returns
    ``{label: Bank}``."""
    dev = resolve_device(device)
    data = prepare_data(base, dev, root=root, download=download)   # the pool has no norm
    configs = [base.replace(norm=norm, penalty=penalty) for norm, penalty in arms.values()]
    banks = train_banks(configs, cache_dir, device=dev, data=data, progress=progress,
                        executor=executor, ray_address=ray_address)
    return dict(zip(arms, banks, strict=True))


def bank_table(banks: Mapping, attack: str = "lira_online_fixed") -> pd.DataFrame:
    """Per arm: the attack's AUC over all pool samples and over the corrupted ones (mean and 95%
    interval over targets, each model in turn the target), and the bank models' test accuracy
    and memorization of their own corrupted training samples (mean and interval over models)."""
    rows = []
    for label, b in banks.items():
        metrics = b.evaluate((attack,)).metrics
        row = {"arm": label, "norm": b.config.model.norm, "n_models": b.n_models, "attack": attack}
        for subset, name in (("all", "auc"), ("outlier", "auc_outlier"), ("clean", "auc_clean")):
            if subset in set(metrics["subset"]):
                row.update(ci_columns(name, metric_estimate(metrics, attack, subset, "auc")))
        for col, name in (("test_acc", "bank_test_acc"), ("train_acc_outlier", "bank_mem")):
            row.update(ci_columns(name, mean_ci(b.models[col].to_numpy(dtype=float))))
        rows.append(row)
    return pd.DataFrame(rows)


# -- figures ------------------------------------------------------------------------------------


def _with_arm(frame: pd.DataFrame, results: Sequence) -> pd.DataFrame:
    arm_of = {r.key: _arm_of(r.config) for r in results}
    if frame.empty:
        return frame.assign(arm=pd.Series(dtype=str))
    return frame.assign(arm=frame["run"].map(arm_of))


def history_with_arms(results: Sequence) -> pd.DataFrame:
    """:func:`bnmem_utils.jobs.grid.history_frame` with an ``arm`` column (the sweep setting)."""
    return _with_arm(history_frame(results), results)


def gamma_sigma_with_arms(results: Sequence) -> pd.DataFrame:
    """:func:`bnmem_utils.jobs.grid.gamma_sigma_frame` (one row per BN channel per run, with
    ``ratio`` = |gamma|/running sigma and ``batch_ratio`` = |gamma|/batch sigma) plus ``arm``."""
    return _with_arm(gamma_sigma_frame(results), results)


def _estimate(row, col: str, n: int) -> Estimate:
    """The ``col``, ``col_lo``, ``col_hi`` columns of a table row as an estimate over ``n``."""
    return Estimate(float(row[col]), float(row[f"{col}_lo"]), float(row[f"{col}_hi"]), int(n))


def _chosen_records(rec, table: pd.DataFrame, summary: pd.DataFrame,
                    measured: pd.DataFrame | None) -> None:
    """The chosen setting's records of :func:`result_records`, through ``rec(metric, value,
    description, **fields)``."""
    chosen = table[table["chosen"]].iloc[0]
    rec("mit_chosen", chosen["arm"], "setting the data support (choose_lambda rule)")
    rec("mit_chosen_lambda", float(summary.loc[chosen["arm"], "lam"]), "its lambda (0 = none)")
    if measured is not None and chosen["arm"] != table.iloc[0]["arm"]:
        for col, what in (("d_mem", "memorization"), ("d_acc", "clean test accuracy")):
            rec(f"mit_{col}", chosen[col], f"chosen minus plain BN, {what} (paired CI over the "
                "selection seeds, which chose it: optimistic)", when="chosen_select")
    final = table if measured is None else measured
    seeds = "" if measured is None else " (fresh measurement seeds)"
    base, chosen = final.iloc[0], final[final["arm"] == chosen["arm"]].iloc[0]
    for name, row in (("lam0", base), ("chosen", chosen)):
        rec("mit_mem", row["mem"], f"memorization at {row['arm']}, 95% CI over seeds{seeds}",
            when=name)
        rec("mit_acc", row["test_acc"], f"clean test accuracy at {row['arm']}{seeds}", when=name)
    # No penalty met the rule: there is no chosen setting whose effect the claims could read,
    # and plain BN minus itself (0 [0, 0]) would pass the accuracy claim vacuously.
    kept = chosen["arm"] == base["arm"]
    why = ("no penalty setting lowered memorization while keeping clean accuracy within the "
           "tolerance (choose_lambda kept plain BN)")
    for col, what in (("d_mem", "memorization"), ("d_acc", "clean test accuracy")):
        rec(f"mit_{col}", None if kept else chosen[col],
            why if kept else f"chosen minus plain BN, {what} (paired CI){seeds}", when="chosen")


def result_records(summary: pd.DataFrame, table: pd.DataFrame, config: RunConfig,
                   btable: pd.DataFrame | None = None, measured: pd.DataFrame | None = None
                   ) -> list[tuple[Result, object, dict]]:
    """``(result, value, extras)`` for notebook 05's results file, each in the setting of
    ``config`` (data set, architecture, corruption), an arm its ``norm`` field
    (:func:`~bnmem_utils.analyses.mitigation.arm_slug`): memorization and clean test accuracy of every
    arm (Estimates over seeds), the chosen setting and its paired differences to plain BN, and
    the LiRA AUCs (Estimates over targets) of every banked arm.

    ``table`` is the selection (:func:`~bnmem_utils.analyses.mitigation.choose_lambda` on the selection
    seeds); ``measured``, when given, the chosen setting against plain BN on fresh seeds
    (:func:`bnmem_utils.analyses.mitigation.measure_chosen`): the claims' numbers (``mit_d_mem`` and
    ``mit_d_acc`` at ``when="chosen"``) and ``mit_mem`` / ``mit_acc`` at ``lam0`` and
    ``chosen`` then read the fresh seeds, and the selection seeds' differences are kept at
    ``when="chosen_select"``."""
    out: list[tuple[Result, object, dict]] = []

    def rec(metric: str, value, description: str, **fields) -> None:
        out.append((Result.of(config, metric, **{"norm": "", **fields}), value,
                    {"description": description}))

    s = summary.set_index("arm")
    for arm, r in s.iterrows():
        k = arm_slug(arm)
        for col, what in (("mem", "memorization of the flipped labels (final accuracy on them)"),
                          ("test_acc", "clean test accuracy"),
                          ("gs_median", "median |gamma|/running sigma over BN channels"),
                          ("gs_frac_above_1", "fraction of BN channels with |gamma|/running sigma > 1")):
            if col.startswith("gs_") and r["norm"] != "bn":
                continue
            rec(f"mit_{col}", _estimate(r, col, r["n"]),
                f"{arm}: {what}, mean and 95% CI over seeds", norm=k)
    _chosen_records(rec, table, s, measured)
    if btable is not None and len(btable):
        for _, r in btable.iterrows():
            k = arm_slug(r["arm"])
            for col, what in (("auc", "all pool samples"), ("auc_outlier", "the flipped samples")):
                if col in r and pd.notna(r[col]):
                    rec(f"mit_{col}", _estimate(r, col, r["n_models"]),
                        f"{r['arm']}: {r['attack']} AUC on {what}, 95% CI over targets", norm=k)
    return out
