"""Notebook 05's verdict on the gamma/sigma penalty: chosen on some seeds, measured on others,
and its privacy compared with GroupNorm and LayerNorm at equal clean accuracy.

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
reference is one point. The curve is read at the reference's accuracy by the matched-gap machinery of :mod:`bnmem_utils.analyses.matched_gap`,
with accuracy in place of the gap (the midpoint of the overlap of the two ranges, which for a
one-point reference is its own accuracy; linear interpolation; nothing extrapolated; a
bootstrap over each bank's targets with the rule applied again in each replicate):
:func:`matched_accuracy`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as _st

from bnmem_utils.analyses.matched_gap import MatchedGap, bank_point, matched_gap_difference
from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import Estimate, diff_ci, mean_ci
from bnmem_utils.jobs.config import PenaltyConfig, RunConfig

#: The references claim M3 compares BN with the penalty against.
M3_REFS = ("gn", "ln")

#: The arm every mitigation setting is compared with: BatchNorm trained without the penalty.
BASELINE = "BN lam=0"


# --------------------------------------------------------------------------------------------
# choosing lambda from a sweep


def _costs_less(d_acc: Estimate, tolerance: float, rule: str) -> bool:
    """The accuracy difference's lower end (``interval``) or mean (``mean``) above -tolerance."""
    bound = d_acc.lo if rule == "interval" else d_acc.mean
    return bool(np.isfinite(bound) and bound > -tolerance)


def choose_lambda(runs: pd.DataFrame, *, arm: str = "arm", seed: str = "seed",
                  mem: str = "mem", acc: str = "test_acc", baseline: str = BASELINE,
                  tolerance: float = 0.01, rule: str = "interval") -> pd.DataFrame:
    """Compare every arm of a sweep with the baseline arm, paired over seeds, and pick one.

    ``runs`` has one row per (arm, seed) with the final memorization ``mem`` and clean test
    accuracy ``acc`` (fractions). Same seed = same corrupted set, initialisation and batch order,
    so the differences to the baseline are paired (:func:`bnmem_utils.core.stats.diff_ci`).

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
    for col in (arm, seed, mem, acc):
        if col not in runs.columns:
            raise ValueError(f"choose_lambda needs a column {col!r}; got {list(runs.columns)}")
    if rule not in ("interval", "mean"):
        raise ValueError(f"unknown rule {rule!r}; valid choices: interval, mean")
    arms = list(dict.fromkeys(runs[arm]))
    if baseline not in arms:
        raise ValueError(f"baseline arm {baseline!r} not in the sweep; arms: {arms}")
    base = runs[runs[arm] == baseline].set_index(seed)
    rows = []
    for a in [baseline] + [a for a in arms if a != baseline]:
        sub = runs[runs[arm] == a].set_index(seed)
        common = sorted(set(sub.index) & set(base.index))
        d_mem, d_acc = (diff_ci(sub.loc[common, c].to_numpy(), base.loc[common, c].to_numpy(),
                                paired=True) for c in (mem, acc))
        is_base = a == baseline
        rows.append({
            "arm": a, "n": len(sub),
            "mem": mean_ci(sub[mem]), "test_acc": mean_ci(sub[acc]),
            "d_mem": d_mem, "d_acc": d_acc,
            "acceptable": bool(is_base or _costs_less(d_acc, tolerance, rule)),
            "effective": bool((not is_base) and np.isfinite(d_mem.hi) and d_mem.hi < 0),
        })
    table = pd.DataFrame(rows)
    candidates = table[table["acceptable"] & table["effective"]]
    best = min(candidates.index, key=lambda i: table.at[i, "d_mem"].mean, default=0)
    table["chosen"] = table.index == best
    return table


def arm_slug(text: str) -> str:
    """An arm's label as a results-key part: lower case, lam=/tau= folded, one underscore between."""
    out = "".join(c if c.isalnum() else "_" for c in text.lower().replace("lam=", "lam").replace("tau=", "tau"))
    return re.sub("_+", "_", out).strip("_")


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


def grid_neighbours(arms: Mapping[str, tuple[str, PenaltyConfig | None]], chosen: str) -> list[str]:
    """The settings next to ``chosen`` on its own ladder of lambda (same form and tau, plain BN
    as lambda 0): the one below and the one above, where they exist. Plain BN chosen: the
    square form's smallest lambda."""
    if chosen not in arms:
        raise ValueError(f"unknown setting {chosen!r}; valid choices: {', '.join(arms)}")
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


def curve_arms(arms: Mapping[str, tuple[str, PenaltyConfig | None]], banked: Sequence[str]
               ) -> list[str]:
    """The banked BN settings, plain BN and every penalty form and strength: the points of M3's
    BN curve. Both forms belong on it: the question is what BN with the penalty leaks at a given
    accuracy, whichever setting reaches it (the hinge costs little accuracy, so its banks alone
    may not reach the references' accuracies)."""
    return [k for k in banked if arms[k][0] == "bn"]


def _finite_point(point):
    gap, value = point
    keep = np.isfinite(value)
    return gap[keep], value[keep]


def matched_accuracy(banks: Mapping, curve: Sequence[str], refs: Sequence[str], *,
                     attack: str = "lira_online_fixed", subset: str = "all",
                     seed: int = 0) -> dict[str, MatchedGap]:
    """Per reference arm of ``refs``: the BN curve (the banks named by ``curve``) minus the
    reference's bank, the attack's AUC on ``subset`` at a matched clean test accuracy of the
    bank models (:func:`bnmem_utils.analyses.matched_gap.matched_gap_difference` with accuracy on the
    x-axis). Targets without an AUC on the subset (NaN) are left out of their point."""
    if not curve:
        raise ValueError("the BN curve needs at least one bank")
    points = [_finite_point(bank_point(banks[k], attack, subset, x="test_acc")) for k in curve]
    what = f"{attack} AUC on {'all samples' if subset == 'all' else 'the flipped samples'}"
    return {ref: matched_gap_difference(
                points, [_finite_point(bank_point(banks[ref], attack, subset, x="test_acc"))],
                seed=seed, what=what, names=("BN with the penalty", ref),
                axis="clean test accuracy")
            for ref in refs}


def m3_records(matches: Mapping[str, MatchedGap], matches_flipped: Mapping[str, MatchedGap] | None,
               n_models: int, config: RunConfig) -> list[tuple[Result, object, dict]]:
    """Results entries ``(result, value, extras)`` in the setting of ``config`` (data set,
    architecture, corruption), each reference the ``versus`` field: ``mit_m3_auc_diff`` (claim
    M3: BN with the penalty minus the reference at a matched accuracy, all samples), the
    matched accuracy (``mit_m3_acc``), and the same difference on the flipped samples
    (``mit_m3_auc_flipped_diff``)."""
    out = []
    for metric, found in (("mit_m3_auc_diff", matches),
                          ("mit_m3_auc_flipped_diff", matches_flipped or {})):
        for ref, m in found.items():
            vs = arm_slug(ref)
            out.append((Result.of(config, metric, norm="", versus=vs), m.diff,
                        {"lo": m.lo, "hi": m.hi, "n": int(n_models), "description": m.description}))
            if metric == "mit_m3_auc_diff":
                out.append((Result.of(config, "mit_m3_acc", norm="", versus=vs), m.gap,
                            {"description": f"the matched clean test accuracy of BN with the "
                                            f"penalty and {ref} (None: no overlap)"}))
    return out


def matched_frame(matches: Mapping[str, MatchedGap]) -> pd.DataFrame:
    """One row per reference: matched accuracy, both curves' readings and the difference, with
    intervals, in percent."""
    rows = []
    for ref, m in matches.items():
        pct = {k: (None if v is None else 100 * v) for k, v in (
            ("accuracy", m.gap), ("BN curve", m.a), ("reference", m.b), ("difference", m.diff),
            ("lo", m.lo), ("hi", m.hi))}
        rows.append({"reference": ref, **pct, "dropped": m.dropped})
    return pd.DataFrame(rows)
