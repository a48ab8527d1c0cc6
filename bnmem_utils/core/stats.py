"""Means with confidence intervals: every number this project reports carries its spread."""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import nan

import numpy as np
from scipy import stats as _st


@dataclass(frozen=True)
class Estimate:
    """A mean with a two-sided confidence interval over ``n`` independent values; ``method``
    names how the interval was made, ``clipped`` says it was cut to the metric's range."""

    mean: float
    lo: float
    hi: float
    n: int
    std: float = nan
    method: str = ""
    clipped: bool = False

    def __str__(self) -> str:
        return f"{self.mean:.4g} [{self.lo:.4g}, {self.hi:.4g}] (n={self.n})"

    @classmethod
    def of_row(cls, row, col: str, n: int, method: str = "") -> Estimate:
        """The columns ``col``, ``col_lo`` and ``col_hi`` of a table row as an estimate over
        ``n``."""
        return cls(float(row[col]), float(row[f"{col}_lo"]), float(row[f"{col}_hi"]), int(n),
                   method=method)

    def within(self, low: float, high: float) -> Estimate:
        """The interval cut to the metric's range ``[low, high]`` (an accuracy's [0, 1], a
        difference's [-1, 1]), ``clipped`` when it spilled over: a t interval of a bounded
        quantity over few seeds can. NaN ends stay NaN."""
        lo, hi = max(self.lo, low), min(self.hi, high)
        cut = bool(lo > self.lo or hi < self.hi)
        return replace(self, lo=lo, hi=hi, clipped=self.clipped or cut) if cut else self

    def fmt(self, digits: int = 3, scale: float = 1.0) -> str:
        """Human-readable ``mean [lo, hi]``, optionally scaled (e.g. 100 for percent)."""
        m, lo, hi = self.mean * scale, self.lo * scale, self.hi * scale
        return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


#: The names of the interval methods, as each row of the claims table states them.
T, PAIRED_T, WELCH, BOOTSTRAP = "Student t", "paired t", "Welch t", "percentile bootstrap"


def _finite(values) -> np.ndarray:
    """``values`` as a flat float array, NaNs dropped."""
    arr = np.asarray(values, dtype=float).ravel()
    return arr[~np.isnan(arr)]


def mean_ci(values, confidence: float = 0.95) -> Estimate:
    """Student-t interval for the mean of independent values (seeds, targets); NaNs are dropped."""
    arr = _finite(values)
    n = arr.size
    if n < 2:
        return Estimate(float(arr.mean()) if n else nan, nan, nan, n, method=T)
    mean, std = float(arr.mean()), float(arr.std(ddof=1))
    half = float(_st.t.ppf(0.5 + confidence / 2, n - 1) * std / np.sqrt(n))
    return Estimate(mean, mean - half, mean + half, n, std, method=T)


def diff_ci(a, b, confidence: float = 0.95, paired: bool = False) -> Estimate:
    """Interval for mean(a) - mean(b): paired-t when ``paired`` (same seeds), else Welch."""
    if paired:
        a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
        if a.shape != b.shape:
            raise ValueError(f"paired difference needs equal lengths, got {a.size} and {b.size}")
        return replace(mean_ci(a - b, confidence), method=PAIRED_T)
    a, b = _finite(a), _finite(b)
    n = min(a.size, b.size)
    diff = float(a.mean() - b.mean()) if n else nan
    if n < 2:
        return Estimate(diff, nan, nan, n, method=WELCH)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = float(np.sqrt(va + vb))
    if se == 0:
        return Estimate(diff, diff, diff, n, 0.0, method=WELCH)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(_st.t.ppf(0.5 + confidence / 2, dof) * se)
    return Estimate(diff, diff - half, diff + half, n, se, method=WELCH)


def bootstrap_ci(values, statistic=np.mean, confidence: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> Estimate:
    """Percentile bootstrap interval of ``statistic`` (for medians, ratios, non-normal data)."""
    arr = _finite(values)
    if arr.size == 0:
        return Estimate(nan, nan, nan, 0, method=BOOTSTRAP)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    boots = np.apply_along_axis(statistic, 1, arr[idx])
    lo, hi = np.quantile(boots, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Estimate(float(statistic(arr)), float(lo), float(hi), int(arr.size),
                    float(boots.std(ddof=1)), method=BOOTSTRAP)


def p_from_interval(value: float, lo: float, hi: float, null: float = 0.0, *, n: int = 0,
                    confidence: float = 0.95) -> float:
    """The two-sided p-value of ``value`` against ``null`` read back from its interval: the
    half of the interval facing the null, as a Student t interval with ``n - 1`` degrees of
    freedom (a normal one when ``n < 2``: bootstrap and Welch intervals). At the interval's edge
    it gives ``1 - confidence`` exactly; elsewhere it is the t test the interval inverts."""
    half = (value - lo) if value >= null else (hi - value)
    if not all(map(np.isfinite, (value, lo, hi))) or half <= 0:
        return nan
    dist = _st.t(n - 1) if n >= 2 else _st.norm
    stat = abs(value - null) / half * dist.ppf(0.5 + confidence / 2)
    return float(2 * dist.sf(stat))


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values (valid under any dependence between
    the tests); NaNs stay NaN and are not counted in the family."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m = order.size
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out


#: The interval of a number measured on R >= 2 replicate banks (:func:`replicate_t`).
REPLICATE_T = "Student t over replicate banks (R - 1 d.o.f.)"


def replicate_t(values, confidence: float = 0.95) -> Estimate:
    """Student t interval, R - 1 degrees of freedom, of the mean of R replicate-level numbers,
    each computed whole on one bank retrained from its own seed; ``n`` is R (NaNs dropped).

    Few replicates are few data points: when retraining moves the number more than its targets
    do, a normal or bootstrap interval over three of them under-covers, a t interval does not.
    For a difference of two arms pass the per-replicate differences ``a_r - b_r`` (replicate r of
    both arms shares a seed: a paired t over the replicates)."""
    return replace(mean_ci(values, confidence), method=REPLICATE_T)


def one_bank_calibration(own, est: Estimate, confidence: float = 0.95) -> dict[str, float]:
    """How well one bank's interval describes retraining: ``own`` holds each replicate's own
    interval (over its targets only), ``est`` the :func:`replicate_t` interval of their numbers.

    Returns the mean one-bank half-width; the replicate half-width (of the mean of R banks); the
    half-width one bank would need to carry retraining too, the normal quantile times the
    standard deviation of the R replicates' numbers (what one bank's number scatters by when the
    bank is retrained: the t quantile of ``est`` also pays for estimating that spread from R
    banks, which is not one bank's scatter, so at R = 3 it would read 2.2 times too wide even
    for calibrated intervals); and the fraction of replicates whose own interval covers the mean
    of the other replicates' numbers (near ``confidence`` when one-bank intervals are
    calibrated). It needs at least two replicates."""
    own = list(own)
    if len(own) < 2:
        raise ValueError(f"calibration needs at least 2 replicates; got {len(own)}")
    means = np.array([e.mean for e in own])
    others = (means.sum() - means) / (means.size - 1)
    spread = float(means.std(ddof=1)) * float(_st.norm.ppf(0.5 + confidence / 2))
    return {"replicates": len(own),
            "one_bank_halfwidth": float(np.mean([(e.hi - e.lo) / 2 for e in own])),
            "replicate_halfwidth": (est.hi - est.lo) / 2, "one_bank_needed_halfwidth": spread,
            "covers_others": float(np.mean([e.lo <= m <= e.hi for e, m in zip(own, others,
                                                                              strict=True)]))}


def replicated(a, b=None, *, paired: bool = False, confidence: float = 0.95) -> dict:
    """One number measured on R replicate banks: ``a`` (and ``b``) lists of per-target values,
    one array per replicate (replicate r of both arms shares a seed); ``b`` None: the mean of
    ``a`` alone. Returns ``"estimate"``, with R >= 2 the :func:`replicate_t` interval over the
    replicates' own numbers (a paired t over replicates for a difference), else the one bank's
    own over its targets (Welch for a difference of two banks, paired t when ``paired``, Student
    t for ``b`` None, the method saying "over one bank's targets"); ``"first"``, the first
    replicate's own interval; ``"calibration"`` (:func:`one_bank_calibration`) when R >= 2."""
    if not len(a) or (b is not None and len(b) != len(a)):
        raise ValueError(f"need the same number (>= 1) of replicates per arm; got {len(a)} and "
                         f"{len(a if b is None else b)}")
    if paired:
        a, b = [np.asarray(x, float) - np.asarray(y, float) for x, y in zip(a, b, strict=True)], None
    own = [(mean_ci(x, confidence) if b is None else diff_ci(x, y, confidence))
           for x, y in zip(a, b if b is not None else a, strict=True)]
    own = [replace(e, method=f"{PAIRED_T if paired else e.method} over one bank's targets")
           for e in own]
    if len(a) < 2:
        return {"estimate": own[0], "first": own[0], "calibration": None}
    est = replicate_t([e.mean for e in own], confidence)
    return {"estimate": est, "first": own[0],
            "calibration": one_bank_calibration(own, est, confidence)}
