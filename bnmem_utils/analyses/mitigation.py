"""Notebook 05's analysis of the gamma/sigma penalty (:mod:`bnmem_utils.training.penalty`): swept
against memorization and clean accuracy, its strength chosen on some seeds and measured on
others, and its privacy compared with GroupNorm and LayerNorm at equal clean accuracy.

*The sweep.* Each arm is a norm and a :class:`~bnmem_utils.training.penalty.PenaltyConfig`, the
``penalty`` field of its runs (:func:`sweep_arms`, :func:`sweep_configs`; the notebook's whole
sweep from its parameters: :func:`sweep_from_params`); per-run and per-arm
tables (:func:`runs_table`, :func:`arm_summary`); LiRA banks whose members train with the penalty
(:func:`bank_arms`, :func:`train_arm_banks`, :func:`bank_table`); the key numbers
(:func:`result_records`, :func:`m3_records`).

*Winner's curse.* A lambda picked on the runs that then measure its effect carries an
optimistic interval: of many settings, the one that looked best on those seeds is partly the
one whose noise happened to help. So the seeds are split (:func:`split_seeds`): the rule of
:func:`choose_lambda` picks lambda on the *selection* seeds, and the chosen setting and plain BN
are trained again on disjoint *measurement* seeds, where the claims M1 and M2 read its paired
differences (:func:`measure_chosen`).

*Seeds for a given precision.* :func:`halfwidth_table` gives the 95% half-width of a paired
difference against the number of seeds, from a measured spread: how many seeds an interval of
+-1 point needs.

*Privacy at equal utility (claim M3).* LiRA's AUC moves with accuracy, and the penalty trades
accuracy for memorization; GroupNorm and LayerNorm sit at accuracies of their own. The banks of
BN along lambda (plain BN, the chosen setting, its neighbours and every other banked BN setting,
of either form) trace a curve of AUC against the bank models' clean test accuracy; each
reference is one point. The curve is read at the reference's accuracy by the matched-gap
estimator of :mod:`bnmem_utils.analyses.matched_gap`, with accuracy in place of the gap (the
midpoint of the overlap of the two ranges, which for a one-point reference is its own accuracy;
linear interpolation; nothing extrapolated; a bootstrap over each bank's targets with the rule
applied again in each replicate): :func:`matched_accuracy`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats as _st

from bnmem_utils.analyses.matched_gap import bank_point, replicated_matched_gap
from bnmem_utils.analyses.memorization import MEM_METRIC, check_columns
from bnmem_utils.core.checks import check_choice
from bnmem_utils.core.device import resolve_device
from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import Estimate, mean_ci
from bnmem_utils.jobs.bank import train_banks
from bnmem_utils.jobs.bank_models import prepare_data
from bnmem_utils.jobs.config import PenaltyConfig, RunConfig
from bnmem_utils.jobs.grid import gamma_sigma_frame, history_frame
from bnmem_utils.models.nets import NORM_LABELS
from bnmem_utils.privacy.attacks import ci_columns, metric_estimate, resolve_attack

#: The references claim M3 compares BN with the penalty against.
M3_REFS = ("gn", "ln")

#: The arm every mitigation setting is compared with: BatchNorm trained without the penalty.
BASELINE = "BN lam=0"

#: What an arm of the sweep trains: its norm and its penalty (None: none).
NormPenalty = tuple[str, PenaltyConfig | None]


# --------------------------------------------------------------------------------------------
# The sweep: its arms, its runs, its tables
# --------------------------------------------------------------------------------------------
def arm_label(norm: str, penalty: PenaltyConfig | Mapping | None = None) -> str:
    """Readable arm name: ``BN lam=0``, ``BN square lam=0.1``, ``BN hinge lam=1 tau=1``, or the
    reference norm's name (``no norm``, ``GroupNorm``, ``LayerNorm``)."""
    penalty = PenaltyConfig.of(penalty)
    if norm != "bn":   # a penalty of another norm: RunConfig refuses it
        return NORM_LABELS.get(norm, norm)
    if penalty is None or penalty.lam == 0.0:
        return BASELINE
    label = f"BN {penalty.form} lam={penalty.lam:g}"
    if penalty.form == "hinge":
        label += f" tau={penalty.tau:g}"
    return label


def sweep_arms(lams: Sequence[float], *, hinge_lams: Sequence[float] = (),
               hinge_taus: Sequence[float] = (), ref_norms: Sequence[str] = ("none", "gn", "ln")
               ) -> dict[str, NormPenalty]:
    """``{label: (norm, penalty)}`` of a mitigation sweep, in plotting order.

    The BN baseline (no penalty) first, then the square form at each lam > 0, then the hinge form
    at each (lam > 0, tau), then the reference norms without any penalty.
    """
    arms: dict[str, NormPenalty] = {BASELINE: ("bn", None)}
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


def sweep_configs(arms: Mapping[str, NormPenalty], seeds: Sequence[int],
                  run: RunConfig) -> list[RunConfig]:
    """One grid run per (arm, seed): ``run`` (what every run of the sweep shares: data,
    corruption, architecture, training) with the arm's norm and penalty and the seed. Arms vary
    fastest, so an interrupted sweep leaves complete seeds behind."""
    return [replace(run, model=replace(run.model, norm=norm), penalty=penalty, seed=int(s))
            for s in seeds for norm, penalty in arms.values()]


class Sweep(NamedTuple):
    """Notebook 05's training (:func:`sweep_from_params`): its arms and seeds, and the configs it
    trains, in that order."""

    arms: dict[str, NormPenalty]
    seeds: list[int]                     # the selection seeds
    measure_seeds: list[int]             # the measurement seeds, disjoint from them
    selection: list[RunConfig]           # every arm on every selection seed
    measurement: list[RunConfig]         # plain BN and the chosen setting on the measurement seeds
    banks: list[dict[str, RunConfig]]    # per replicate (seed, seed + 1, ...): {arm: its bank}


def sweep_from_params(params: Mapping, chosen: str | None = None) -> Sweep:
    """Notebook 05's (``05_mitigation``) sweep from its parameters ``params`` (the names of its
    ``parameters`` cell: ``seed`` and the ``mit_*`` values). The runs and banks after the
    selection depend on the setting it chooses, ``chosen``: without one, none of them; plain BN
    chosen, no measurement runs; ``mit_bank_models`` 0, no banks. The notebook calls it before
    its selection and again with the setting chosen; :mod:`bnmem_utils.run.work` with the
    setting it assumes: both build the notebook's runs and banks here."""
    p = params
    seeds, measure_seeds = split_seeds(p["seed"], p["mit_seeds"], p["mit_measure_seeds"])
    arms = sweep_arms(p["mit_lams"], hinge_lams=p["mit_hinge_lams"],
                      hinge_taus=p["mit_hinge_taus"], ref_norms=p["mit_ref_norms"])
    if chosen is not None:
        check_choice("setting", chosen, arms)
    # what every run and bank shares; each arm sets its norm and penalty, a bank its epochs
    shared = dict(dataset=p["mit_dataset"], arch=p["mit_arch"], flip_rate=p["mit_flip_rate"],
                  train_size=p["mit_train_size"], test_size=p["mit_test_size"], lr=p["mit_lr"],
                  batch_size=p["mit_batch_size"], weight_decay=p["mit_weight_decay"],
                  augment=p["mit_augment"])
    run = RunConfig.grid(epochs=p["mit_epochs"], **shared)
    measured = {k: arms[k] for k in (BASELINE, chosen)} if chosen not in (None, BASELINE) else {}
    banks = []
    if chosen is not None and p["mit_bank_models"]:
        banked = bank_arms(arms, chosen, p["mit_bank_lams"], extra=grid_neighbours(arms, chosen))
        base = RunConfig.bank(n_models=p["mit_bank_models"], epochs=p["mit_bank_epochs"], **shared)
        banks = [{k: base.replace(seed=p["seed"] + r, norm=norm, penalty=pen)
                  for k, (norm, pen) in banked.items()} for r in range(p["mit_bank_replicates"])]
    return Sweep(arms, seeds, measure_seeds, sweep_configs(arms, seeds, run),
                 sweep_configs(measured, measure_seeds, run), banks)


def arm_slug(text: str) -> str:
    """An arm's label as a results-key part: lower case, lam=/tau= folded, one underscore between."""
    out = "".join(c if c.isalnum() else "_" for c in text.lower().replace("lam=", "lam").replace("tau=", "tau"))
    return re.sub("_+", "_", out).strip("_")


def _arm_of(config: RunConfig) -> str:
    return arm_label(config.model.norm, config.penalty)


def _ratio_median_and_above_1(gamma_sigma: pd.DataFrame, column: str) -> tuple[float, float]:
    """The median of a gamma/sigma column over a run's BN channels, and the fraction above 1
    (NaN for a run without BN)."""
    r = gamma_sigma[column].to_numpy(dtype=float) if column in gamma_sigma else np.empty(0)
    r = r[np.isfinite(r)]
    return (float(np.median(r)), float((r > 1).mean())) if r.size else (np.nan, np.nan)


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
        (median, above_1), (batch_median, _) = (_ratio_median_and_above_1(r.gamma_sigma, c)
                                                for c in ("ratio", "batch_ratio"))
        rows.append({
            "arm": _arm_of(config), "norm": config.model.norm, "form": penalty.form if penalty else "",
            "lam": penalty.lam if penalty else 0.0,
            "tau": penalty.tau if penalty and penalty.form == "hinge" else float("nan"),
            "seed": config.seed, "mem": float(last[mem]),
            "clean_acc": float(last.get("clean_acc", float("nan"))),
            "test_acc": float(last.get("test_acc", float("nan"))),
            "reg_loss": float(last.get("reg_loss", float("nan"))),
            "gs_median": median, "gs_batch_median": batch_median, "gs_frac_above_1": above_1,
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


# --------------------------------------------------------------------------------------------
# Choosing lambda on the selection seeds, measuring it on others
# --------------------------------------------------------------------------------------------
def choose_lambda(runs: pd.DataFrame, *, baseline: str = BASELINE, tolerance: float = 0.01,
                  rule: str = "interval") -> pd.DataFrame:
    """Compare every arm of a sweep with the baseline arm, paired over seeds, and pick one.

    ``runs`` has one row per (``arm``, ``seed``) with the final memorization ``mem`` and clean
    test accuracy ``test_acc`` (fractions). Same seed = same corrupted set, initialisation and
    batch order, so the differences to the baseline are paired (:func:`paired_diffs`).

    The rule, interval-aware: an arm is *acceptable* when the lower end of the 95% interval of
    its clean-accuracy difference to the baseline is above ``-tolerance`` (we are confident it
    costs less than ``tolerance``, e.g. one point), and *effective* when the upper end of the
    interval of its memorization difference is below 0 (memorization drops for sure). The chosen
    arm is the acceptable and effective one with the largest mean memorization drop; if there is
    none, the baseline is chosen (the data support no penalty).

    ``rule="mean"`` judges acceptability by the mean accuracy difference instead (above
    ``-tolerance``): the selection stage of notebook 05, whose few seeds cannot bound a cost to
    a point, and whose choice is then measured on fresh seeds by the interval rule
    (:func:`measure_chosen`).

    Returns one row per arm (baseline first): the estimates, the two differences, the flags
    ``acceptable``, ``effective`` and ``chosen``.
    """
    check_columns(runs, ("arm", "seed", "mem", "test_acc"), "choose_lambda's runs")
    check_choice("rule", rule, ("interval", "mean"))
    arms = list(dict.fromkeys(runs["arm"]))
    if baseline not in arms:
        raise ValueError(f"baseline arm {baseline!r} not in the sweep; arms: {arms}")
    rows = []
    for a in [baseline] + [a for a in arms if a != baseline]:
        sub = runs[runs["arm"] == a]
        d_mem, d_acc = (mean_ci(paired_diffs(runs, a, c, baseline)) for c in ("mem", "test_acc"))
        is_base = a == baseline
        bound = d_acc.lo if rule == "interval" else d_acc.mean  # its cost: below tolerance?
        rows.append({
            "arm": a, "n": len(sub),
            "mem": mean_ci(sub["mem"]), "test_acc": mean_ci(sub["test_acc"]),
            "d_mem": d_mem, "d_acc": d_acc,
            "acceptable": bool(is_base or (np.isfinite(bound) and bound > -tolerance)),
            "effective": bool((not is_base) and np.isfinite(d_mem.hi) and d_mem.hi < 0),
        })
    table = pd.DataFrame(rows)
    candidates = table[table["acceptable"] & table["effective"]]
    best = min(candidates.index, key=lambda i: table.at[i, "d_mem"].mean, default=0)
    table["chosen"] = table.index == best
    return table


def split_seeds(first: int, n_select: int, n_measure: int) -> tuple[list[int], list[int]]:
    """Disjoint seed lists: ``n_select`` selection seeds from ``first`` on, then ``n_measure``
    measurement seeds right after them. Each needs at least 1 (an interval needs 2: with one
    seed the differences carry no interval and no claim is decided)."""
    for name, n in (("selection", n_select), ("measurement", n_measure)):
        if int(n) < 1:
            raise ValueError(f"{name} seeds: need at least 1, got {n!r}")
    select = list(range(int(first), int(first) + int(n_select)))
    return select, list(range(select[-1] + 1, select[-1] + 1 + int(n_measure)))


def seeds_frame(select: Sequence[int], measure: Sequence[int]) -> pd.DataFrame:
    """The seeds table: each role, its seeds, and what it decides."""
    if set(select) & set(measure):
        raise ValueError(f"selection and measurement seeds overlap: {sorted(set(select) & set(measure))}")
    return pd.DataFrame([
        {"role": "selection", "n": len(select), "seeds": ", ".join(map(str, select)),
         "decides": "which lambda (every setting of the grid trained)"},
        {"role": "measurement", "n": len(measure), "seeds": ", ".join(map(str, measure)),
         "decides": "M1 and M2 (plain BN and the chosen setting trained again)"}])


def halfwidth(sd: float, n, confidence: float = 0.95):
    """Student-t half-width of the mean of ``n`` values of standard deviation ``sd``."""
    n = np.asarray(n, dtype=float)
    return _st.t.ppf(0.5 + confidence / 2, n - 1) * float(sd) / np.sqrt(n)


def seeds_needed(sd: float, target: float, confidence: float = 0.95, n_max: int = 1000) -> int | None:
    """The fewest seeds (>= 2) whose half-width is at most ``target``; None above ``n_max``."""
    if not (np.isfinite(sd) and sd >= 0 and target > 0):
        raise ValueError(f"seeds_needed needs a finite sd >= 0 and a target > 0; got {sd!r}, {target!r}")
    ns = np.arange(2, n_max + 1)
    ok = np.flatnonzero(halfwidth(sd, ns, confidence) <= target)
    return int(ns[ok[0]]) if ok.size else None


def halfwidth_table(diffs: Mapping[str, Sequence[float]], ns: Sequence[int] = (3, 4, 6, 8, 10, 12, 16, 20, 24, 32),
                    target: float = 0.01, confidence: float = 0.95) -> pd.DataFrame:
    """Half-width of the 95% interval of each paired difference against the number of seeds,
    from its measured spread: one row per seed count, one column per name of ``diffs`` (the
    per-seed differences, fractions), then rows ``sd`` and ``seeds for +-target`` (NaN and None
    for a name with fewer than 2 differences: no spread to read)."""
    rows = {}
    for name, d in diffs.items():
        d = np.asarray(d, dtype=float)
        d = d[np.isfinite(d)]
        if d.size < 2:
            rows[name] = [np.nan] * len(ns) + [np.nan, None]
            continue
        sd = float(d.std(ddof=1))
        rows[name] = [*halfwidth(sd, ns, confidence), sd, seeds_needed(sd, target, confidence)]
    index = [str(int(n)) for n in ns] + ["sd", f"seeds for +-{100 * target:g} pt"]
    return pd.DataFrame(rows, index=pd.Index(index, name="seeds"))


def paired_diffs(runs: pd.DataFrame, arm: str, col: str = "test_acc",
                 baseline: str = BASELINE) -> np.ndarray:
    """Per seed, ``arm`` minus the baseline in ``col`` (the seeds both have, sorted)."""
    a = runs[runs["arm"] == arm].set_index("seed")[col]
    b = runs[runs["arm"] == baseline].set_index("seed")[col]
    common = sorted(set(a.index) & set(b.index))
    return (a.loc[common] - b.loc[common]).to_numpy(dtype=float)


def measure_chosen(runs: pd.DataFrame, chosen: str, *, tolerance: float,
                   baseline: str = BASELINE) -> pd.DataFrame:
    """The chosen setting against plain BN on the measurement seeds: the paired differences of
    :func:`choose_lambda` (interval rule) on those runs alone, two rows (baseline, chosen).
    ``chosen`` the baseline itself: one row."""
    arms = [baseline] if chosen == baseline else [baseline, chosen]
    sub = runs[runs["arm"].isin(arms)]
    missing = [a for a in arms if a not in set(sub["arm"])]
    if missing:
        raise ValueError(f"no measurement runs of {missing}; arms present: {sorted(set(runs['arm']))}")
    return choose_lambda(sub, tolerance=tolerance, baseline=baseline)


def grid_neighbours(arms: Mapping[str, NormPenalty], chosen: str) -> list[str]:
    """The settings next to ``chosen`` on its own ladder of lambda (same form and tau, plain BN
    as lambda 0): the one below and the one above, where they exist. Plain BN chosen: the
    square form's smallest lambda."""
    check_choice("setting", chosen, arms)
    norm, pen = arms[chosen]
    if norm != "bn":
        raise ValueError(f"{chosen!r} is not a BN setting; neighbours on the lambda grid are BN's")
    form, tau = (pen.form, pen.tau) if pen is not None else ("square", None)
    ladder = [(0.0, BASELINE)] + sorted(
        (p.lam, k) for k, (n, p) in arms.items()
        if n == "bn" and p is not None and p.form == form and (form == "square" or p.tau == tau))
    labels = [k for _, k in ladder]
    i = labels.index(chosen)
    return [labels[j] for j in (i - 1, i + 1) if 0 <= j < len(labels)]


# --------------------------------------------------------------------------------------------
# LiRA banks with the penalty, and claim M3: their privacy at a matched accuracy
# --------------------------------------------------------------------------------------------
def bank_arms(arms: Mapping[str, NormPenalty], chosen: str, lams: Sequence[float],
              extra: Sequence[str] = ()) -> dict[str, NormPenalty]:
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


def train_arm_banks(configs: Mapping[str, RunConfig], cache_dir, *, device="auto",
                    progress: bool = True, root=None, download: bool = False, executor=None,
                    ray_address: str | None = None) -> dict:
    """One LiRA bank per arm of ``configs`` (``{label: bank config}``, one replicate of
    :attr:`Sweep.banks`: the arms differ in norm and penalty only), all on one pool, their
    missing models trained as one batch (:func:`bnmem_utils.jobs.bank.train_banks`, with its
    ``executor`` and ``ray_address``). Returns ``{label: Bank}``."""
    pools = {(c.data, c.corruption, c.seed, c.measure.population_size) for c in configs.values()}
    if len(pools) != 1:
        raise ValueError(f"the arms' banks must share one pool (data, corruption, seed); got {len(pools)}")
    dev = resolve_device(device)
    first = next(iter(configs.values()))
    data = prepare_data(first, dev, root=root, download=download)   # the pool has no norm
    banks = train_banks(list(configs.values()), cache_dir, device=dev, data=data, root=root,
                        progress=progress, executor=executor, ray_address=ray_address)
    return dict(zip(configs, banks, strict=True))


def bank_table(banks: Mapping, attack: str = "auto") -> pd.DataFrame:
    """Per arm: the attack's AUC over all pool samples and over the corrupted ones (mean and 95%
    interval over targets, each model in turn the target), and the bank models' test accuracy
    and memorization of their own corrupted training samples (mean and interval over models).
    ``"auto"``: the banks' headline attack, one for all (:func:`resolve_attack`)."""
    attack, rows = resolve_attack(attack, *banks.values()), []
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


def curve_arms(arms: Mapping[str, NormPenalty], banked: Sequence[str]) -> list[str]:
    """The banked BN settings, plain BN and every penalty form and strength: the points of M3's
    BN curve. Both forms belong on it: the question is what BN with the penalty leaks at a given
    accuracy, whichever setting reaches it (the hinge costs little accuracy, so its banks alone
    may not reach the references' accuracies)."""
    return [k for k in banked if arms[k][0] == "bn"]


def matched_accuracy(replicates, curve: Sequence[str], refs: Sequence[str], *,
                     attack: str = "auto", subset: str = "all",
                     seed: int = 0) -> dict[str, dict]:
    """Per reference arm of ``refs``: the BN curve (the banks named by ``curve``) minus the
    reference's bank, the attack's AUC on ``subset`` at a matched clean test accuracy of the
    bank models (:func:`bnmem_utils.analyses.matched_gap.replicated_matched_gap` with accuracy
    on the x-axis). ``replicates``: ``{label: Bank}`` of one replicate, or a list of them (R
    independent banks per arm, each from its own seed); each reference's entry holds the
    ``"estimate"`` (a Student t over the replicates' differences when R >= 2), each replicate's :class:`MatchedGap` (``"replicates"``) and the
    one-bank ``"calibration"``. Targets without an AUC on the subset (NaN) are left out of
    their point. ``"auto"``: the headline attack of those banks, one for all."""
    if not curve:
        raise ValueError("the BN curve needs at least one bank")
    replicates = [replicates] if isinstance(replicates, Mapping) else list(replicates)
    attack = resolve_attack(attack, *(r[k] for r in replicates for k in (*curve, *refs)))

    def points(banks, keys):
        pts = [bank_point(banks[k], attack, subset, x="test_acc") for k in keys]
        return [(gap[np.isfinite(v)], v[np.isfinite(v)]) for gap, v in pts]

    what = f"{attack} AUC on {'all samples' if subset == 'all' else 'the flipped samples'}"
    return {ref: replicated_matched_gap(
                [points(b, curve) for b in replicates], [points(b, [ref]) for b in replicates],
                seed=seed, what=what, names=("BN with the penalty", ref),
                axis="clean test accuracy")
            for ref in refs}


def matched_frame(matches: Mapping[str, dict]) -> pd.DataFrame:
    """One row per reference: matched accuracy and both curves' readings (of the first
    replicate), the difference with its interval (over every replicate), in percent."""
    rows = []
    for ref, found in matches.items():
        m, est = found["replicates"][0], found["estimate"].within(-1.0, 1.0)  # an AUC difference
        pct = {k: (None if v is None or not np.isfinite(v) else 100 * v) for k, v in (
            ("accuracy", m.gap), ("BN curve", m.a), ("reference", m.b), ("difference", est.mean),
            ("lo", est.lo), ("hi", est.hi))}
        rows.append({"reference": ref, **pct, "replicates": len(found["replicates"]),
                     "dropped": m.dropped})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Tables with arms, and the key numbers
# --------------------------------------------------------------------------------------------
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
    (:func:`arm_slug`): memorization and clean test accuracy of every arm (Estimates over
    seeds), the chosen setting and its paired differences to plain BN, and the LiRA AUCs
    (Estimates over targets) of every banked arm.

    ``table`` is the selection (:func:`choose_lambda` on the selection seeds); ``measured``,
    when given, the chosen setting against plain BN on fresh seeds (:func:`measure_chosen`): the
    claims' numbers (``mit_d_mem`` and ``mit_d_acc`` at ``when="chosen"``) and ``mit_mem`` /
    ``mit_acc`` at ``lam0`` and ``chosen`` then read the fresh seeds, and the selection seeds'
    differences are kept at ``when="chosen_select"``."""
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
            rec(f"mit_{col}", Estimate.of_row(r, col, r["n"]),
                f"{arm}: {what}, mean and 95% CI over seeds", norm=k)
    _chosen_records(rec, table, s, measured)
    if btable is not None and len(btable):
        for _, r in btable.iterrows():
            k = arm_slug(r["arm"])
            for col, what in (("auc", "all pool samples"), ("auc_outlier", "the flipped samples")):
                if col in r and pd.notna(r[col]):
                    rec(f"mit_{col}", Estimate.of_row(r, col, r["n_models"]),
                        f"{r['arm']}: {r['attack']} AUC on {what}, 95% CI over targets", norm=k)
    return out


def m3_records(matches: Mapping[str, dict], matches_flipped: Mapping[str, dict] | None,
               n_models: int, config: RunConfig) -> list[tuple[Result, object, dict]]:
    """Results entries ``(result, value, extras)`` in the setting of ``config`` (data set,
    architecture, corruption), each reference the ``versus`` field: ``mit_m3_auc_diff`` (claim
    M3: BN with the penalty minus the reference at a matched accuracy, all samples), the
    matched accuracy (``mit_m3_acc``), and the same difference on the flipped samples
    (``mit_m3_auc_flipped_diff``); entries of :func:`matched_accuracy`. With replicate banks a
    difference is their Student t estimate, with its replicates and calibration."""
    out = []
    for metric, found in (("mit_m3_auc_diff", matches),
                          ("mit_m3_auc_flipped_diff", matches_flipped or {})):
        for ref, entry in found.items():
            vs, reps = arm_slug(ref), entry["replicates"]
            m, est = reps[0], entry["estimate"]
            if len(reps) == 1:
                value, extras = m.diff, {"lo": m.lo, "hi": m.hi, "n": int(n_models),
                                         "description": m.description}
            else:
                value = est if np.isfinite(est.mean) else None
                over = (f"mean over {len(reps)} replicate banks per arm ({est.method})"
                        if value is not None else "no replicate bank has a matched accuracy")
                extras = {"replicates": len(reps), "calibration": entry["calibration"],
                          "description": f"{over}; the first: {m.description}"}
            out.append((Result.of(config, metric, norm="", versus=vs), value, extras))
            if metric == "mit_m3_auc_diff":
                gaps = [r.gap for r in reps if r.gap is not None]
                out.append((Result.of(config, "mit_m3_acc", norm="", versus=vs),
                            float(np.mean(gaps)) if gaps else None,
                            {"description": f"the matched clean test accuracy of BN with the "
                                            f"penalty and {ref} (None: no overlap"
                                            + (", mean over the replicates)" if len(reps) > 1
                                               else ")")}))
    return out
