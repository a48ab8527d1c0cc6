"""Means with confidence intervals: every number this project reports carries its spread."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from math import nan

import numpy as np
from scipy import stats as _st


@dataclass(frozen=True)
class Estimate:
    """A mean with a two-sided confidence interval over ``n`` independent values."""

    mean: float
    lo: float
    hi: float
    n: int
    std: float = nan

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.mean:.4g} [{self.lo:.4g}, {self.hi:.4g}] (n={self.n})"

    def fmt(self, digits: int = 3, scale: float = 1.0) -> str:
        """Human-readable ``mean [lo, hi]``, optionally scaled (e.g. 100 for percent)."""
        m, lo, hi = self.mean * scale, self.lo * scale, self.hi * scale
        return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _finite(values) -> np.ndarray:
    """``values`` as a flat float array, NaNs dropped."""
    arr = np.asarray(values, dtype=float).ravel()
    return arr[~np.isnan(arr)]


def mean_ci(values, confidence: float = 0.95) -> Estimate:
    """Student-t interval for the mean of independent values (seeds, targets); NaNs are dropped."""
    arr = _finite(values)
    n = arr.size
    if n < 2:
        return Estimate(float(arr.mean()) if n else nan, nan, nan, n)
    mean, std = float(arr.mean()), float(arr.std(ddof=1))
    half = float(_st.t.ppf(0.5 + confidence / 2, n - 1) * std / np.sqrt(n))
    return Estimate(mean, mean - half, mean + half, n, std)


def diff_ci(a, b, confidence: float = 0.95, paired: bool = False) -> Estimate:
    """Interval for mean(a) - mean(b): paired-t when ``paired`` (same seeds), else Welch."""
    if paired:
        a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
        if a.shape != b.shape:
            raise ValueError(f"paired difference needs equal lengths, got {a.size} and {b.size}")
        return mean_ci(a - b, confidence)
    a, b = _finite(a), _finite(b)
    n = min(a.size, b.size)
    diff = float(a.mean() - b.mean()) if n else nan
    if n < 2:
        return Estimate(diff, nan, nan, n)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = float(np.sqrt(va + vb))
    if se == 0:
        return Estimate(diff, diff, diff, n, 0.0)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(_st.t.ppf(0.5 + confidence / 2, dof) * se)
    return Estimate(diff, diff - half, diff + half, n, se)


def bootstrap_ci(values, statistic=np.mean, confidence: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> Estimate:
    """Percentile bootstrap interval of ``statistic`` (for medians, ratios, non-normal data)."""
    arr = _finite(values)
    if arr.size == 0:
        return Estimate(nan, nan, nan, 0)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    boots = np.apply_along_axis(statistic, 1, arr[idx])
    alpha = (1 - confidence) / 2
    return Estimate(float(statistic(arr)), float(np.quantile(boots, alpha)),
                    float(np.quantile(boots, 1 - alpha)), int(arr.size), float(boots.std(ddof=1)))
