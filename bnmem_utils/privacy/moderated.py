"""Small-sample variances for LiRA: each sample's variance shrunk toward the bank's, by empirical
Bayes (Smyth, "Linear models and empirical Bayes methods for assessing differential expression
in microarray experiments", Stat. Appl. Genet. Mol. Biol. 2004: limma's moderated variance).

Per sample (and query) the shadows' scores give a mean and a sample variance s^2 on d = n - 1
degrees of freedom. The prior ``1 / sigma^2 ~ chi2_{d0} / (d0 s0^2)`` is fitted to the bank's
per-sample log variances by the method of moments (limma's ``fitFDist``, digamma and trigamma),
one prior per query. With a flat prior on the mean this is a normal-inverse-gamma posterior:
the variance becomes ``(d0 s0^2 + d s^2) / (d0 + d)`` and a new score follows a Student t with
``d0 + d`` degrees of freedom around the sample's mean, of scale ``s~ sqrt(1 + 1/n)``
(:func:`predictive_logpdf`, which is also the Gaussian of the other online attacks). Plain
NumPy/SciPy on arrays; :mod:`bnmem_utils.privacy.attacks` turns it into an attack.
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma, gammaln, polygamma

#: Prior degrees of freedom are capped here: equal variances everywhere give d0 = infinity (the
#: prior alone, i.e. the pooled variance), a t of 10^6 d.o.f. is a Gaussian to 6 digits.
MAX_PRIOR_DOF = 1e6
_MIN_VAR = 1e-12  # the floor of the variances when their median is 0
_LOG_2PI = float(np.log(2 * np.pi))


def trigamma_inverse(x) -> np.ndarray:
    """The y > 0 with ``trigamma(y) = x``, elementwise (limma's Newton iteration)."""
    x = np.asarray(x, dtype=np.float64)
    mid = np.clip(x, 1e-6, 1e7)                 # outside: the asymptotes below, as limma
    y = 0.5 + 1.0 / mid
    for _ in range(50):
        tri = polygamma(1, y)
        step = tri * (1.0 - tri / mid) / polygamma(2, y)
        y = y + step
        if np.max(-step / y) < 1e-8:
            break
    return np.where(x > 1e7, 1.0 / np.sqrt(x), np.where(x < 1e-6, 1.0 / x, y))


def fit_prior(s2: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prior degrees of freedom ``d0`` and scale ``s0^2`` of sample variances ``s2`` (G, Q) on
    ``d`` (G,) degrees of freedom (each > 0), one prior per column: limma's ``fitFDist``.

    The log variances are centred by ``digamma(d/2) - log(d/2)``; their excess spread over the
    sampling spread ``trigamma(d/2)`` is the prior's ``trigamma(d0/2)``. No excess (all samples
    alike): ``d0`` = :data:`MAX_PRIOR_DOF` and ``s0^2`` the exponential of the centred mean log
    variance. Zero variances are raised to 1e-5 of the median first, as limma does."""
    s2 = np.asarray(s2, dtype=np.float64)
    half = (np.asarray(d, dtype=np.float64) / 2)[:, None]             # (G, 1)
    if s2.shape[0] < 2:
        raise ValueError("the prior of the variances needs at least 2 samples")
    med = np.median(s2, axis=0)
    s2 = np.maximum(s2, np.where(med > 0, 1e-5 * med, _MIN_VAR))
    e = np.log(s2) - digamma(half) + np.log(half)                     # (G, Q)
    emean = e.mean(axis=0)
    excess = e.var(axis=0, ddof=1) - polygamma(1, half).mean()        # (Q,)
    d0 = np.where(excess > 0, 2 * trigamma_inverse(np.where(excess > 0, excess, 1.0)), np.inf)
    d0 = np.minimum(d0, MAX_PRIOR_DOF)
    return d0, np.exp(emean + digamma(d0 / 2) - np.log(d0 / 2))


def masked_moments(scores: np.ndarray, mask: np.ndarray, ddof: int = 1
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count (M,), mean (M, Q) and variance (M, Q) of ``scores`` (S, M, Q) over the rows where
    ``mask`` (S, M), the variance divided by ``count - ddof`` (1: unbiased, as limma; 0: the
    population variance of the reference LiRA code). NaN where ``count <= ddof`` (the mean too
    where no row is selected). Every online LiRA's moments come from here."""
    count = mask.sum(axis=0)
    w = mask[:, :, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(w, scores, 0.0).sum(axis=0) / count[:, None]
        ss = np.where(w, (scores - mean) ** 2, 0.0).sum(axis=0)
        var = np.where(count[:, None] > ddof, ss / (count[:, None] - ddof), np.nan)
    return count, mean, var


def require_shadows(full: np.ndarray, side: str = "") -> None:
    """A ValueError when a sample has no shadow in ``full`` (S, M), every shadow of one side
    before balancing, counting those samples: the attack needs at least one per sample (the
    balanced masks then hold none for any sample, so their counts would name every one)."""
    none = int((full.sum(axis=0) == 0).sum())
    if none:
        raise ValueError(f"no {side + ' ' if side else ''}shadow model for {none} of "
                         f"{full.shape[1]} samples; the attack needs at least one per sample "
                         "(balanced keep, N >= 4)")


def moderated_predictive(scores: np.ndarray, mask: np.ndarray, full: np.ndarray,
                         min_std: float = 1e-6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Student-t predictive of a new score per sample and query, from the shadows of
    ``mask`` (S, M), the same count n for every sample: location (the mean of the n scores),
    scale ``s~ sqrt(1 + 1/n)`` (at least ``min_std``) and degrees of freedom ``d0 + n - 1``,
    each (M, Q).

    The prior is fitted to the ``mask`` samples' variances; with n = 1 (no variance of its own:
    the prior alone) to the ``full`` mask's samples with at least 2 shadows, whose counts may
    differ (one prior shared by every sample cannot leak membership)."""
    require_shadows(full)                   # counted before balancing (see there)
    count, mean, var = masked_moments(scores, mask)
    n = int(count.min())
    if n < 1:                               # a mask that is not the balanced one of full
        require_shadows(mask)
    if n >= 2:
        d0, s0 = fit_prior(var, count - 1)
        post = (d0 * s0 + (n - 1) * var) / (d0 + n - 1)
    else:
        count_f, _, var_f = masked_moments(scores, full)
        ok = count_f >= 2
        if ok.sum() < 2:
            raise ValueError("fewer than 2 samples have 2 shadows on one side: the prior of the "
                             "variances cannot be fitted")
        d0, s0 = fit_prior(var_f[ok], count_f[ok] - 1)
        post = np.broadcast_to(s0, mean.shape)
    scale = np.maximum(np.sqrt(post * (1.0 + 1.0 / n)), min_std)
    return mean, scale, np.broadcast_to(d0 + n - 1, mean.shape)


def predictive_logpdf(x, loc, scale, dof) -> np.ndarray:
    """Log density at ``x`` of a Student t of ``dof`` degrees of freedom (a Gaussian where
    ``dof`` is infinite) with location ``loc`` and scale ``scale``, elementwise."""
    x, loc, scale, dof = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64)
                                               for a in (x, loc, scale, dof)))
    z2 = ((x - loc) / scale) ** 2
    out = -0.5 * (z2 + _LOG_2PI) - np.log(scale)                     # the Gaussian
    t = np.isfinite(dof)
    if t.any():
        nu = dof[t]
        out[t] = (gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * np.pi)
                  - np.log(scale[t]) - (nu + 1) / 2 * np.log1p(z2[t] / nu))
    return out
