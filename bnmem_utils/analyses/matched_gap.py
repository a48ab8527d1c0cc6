"""Two norms' attack AUC compared at a matched generalization gap: the estimators.

A membership-inference attack gains from any train-test gap, whatever causes it. When BN models
both leak more and generalise differently, their extra AUC may be the gap's. Here each norm
traces a *curve*: banks trained along a knob that moves the gap without changing the
normalizer (in notebook 04b: the number of training epochs), each bank one point, (mean gap over
its models, mean AUC over its targets). Two curves are compared at one gap both reach, by one
of two estimators.

The interpolation rule (:func:`matched_gap_difference`):

- the *matched gap* is the midpoint of the overlap of the two curves' gap ranges (the smallest
  and largest mean gap of each curve's points). When the ranges do not overlap there is no
  matched gap and no number: nothing is extrapolated;
- each curve is read at the matched gap by linear interpolation between its points sorted by
  gap;
- the interval is a percentile bootstrap over targets, each bank resampled on its own: target i
  of a bank is model i, so its AUC and its gap are resampled together. Every replicate applies
  the whole rule again: each point's mean gap and mean value, the overlap and its midpoint,
  both readings and their difference; so the interval carries the uncertainty of the matched
  gap as well as of both curves, and no replicate reads a curve outside its own range. A
  replicate whose resampled ranges no longer overlap has no difference and is left out (the
  share left out is reported; a large share means the curves barely meet).

The per-model regression (:func:`regression_difference`, with :func:`default_knots` and
:func:`fitted_curve`): each target's AUC against its own model's gap, one piecewise-linear
curve per norm with hinges at shared knots (quantiles of the pooled per-model gaps), read at
the given gaps; its interval: a percentile bootstrap over models within banks (a model's gap
and AUC resampled together), refitting each time. A model's gap is measured with noise (a
finite test split), which flattens the fitted curves (errors in variables); the difference
between two norms is biased less where their curves run alike.

The estimators take per-target arrays, so they are tested on synthetic curves;
:func:`bank_point` turns a :class:`bnmem_utils.jobs.bank.Bank` into one point and :func:`curve`
a per-target frame into a curve. The confound study (:mod:`bnmem_utils.analyses.confound`,
notebook 04b) applies both estimators to its ladders of banks, and notebook 05's M3
(:mod:`bnmem_utils.analyses.mitigation`) the interpolation rule to its curves of banks. On R
replicate banks (:func:`replicated_matched_gap`, :func:`replicated_regression_difference`) an
estimator is applied whole in each replicate, and the interval is a Student t over the R
replicates' numbers (:func:`bnmem_utils.core.stats.replicate_t`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bnmem_utils.privacy.attacks import resolve_attack

if TYPE_CHECKING:
    import pandas as pd

#: Where the curves are compared, as a fraction of the overlap of their gap ranges.
POSITIONS: dict[str, float] = {"low": 1 / 6, "mid": 0.5, "high": 5 / 6}


@dataclass(frozen=True)
class Ruler:
    """What two curves are matched on: a per-target column of :func:`target_frame`, in words,
    and how it is shown (``scale`` times the value, in ``unit``)."""

    column: str
    words: str
    scale: float
    unit: str


#: The rulers, keyed by their results field (``ruler``); ``lossgap`` is the primary one.
RULERS: dict[str, Ruler] = {
    "accgap": Ruler("gap", "accuracy gap (train minus test accuracy)", 100.0, "points"),
    "lossgap": Ruler("loss_gap", "loss gap (non-members' minus members' cross-entropy)", 1.0,
                     "nats"),
    "globalauc": Ruler("global_auc", "global attack's AUC (loss threshold)", 100.0, "points"),
}

#: One point of a curve: ``(gap, value)``, two arrays of the same length, one entry per target
#: (the target's own model's train-minus-test accuracy, and the attack's metric on it).
Point = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class MatchedGap:
    """Curve ``a`` minus curve ``b`` at a matched gap (``None`` fields: the ranges do not
    overlap, and ``description`` says so)."""

    gap: float | None                       # the matched gap (None: no overlap)
    diff: float | None                      # a(gap) - b(gap)
    lo: float | None                        # percentile bootstrap interval of diff
    hi: float | None
    a: float | None                         # curve a at the gap, with its interval
    a_lo: float | None
    a_hi: float | None
    b: float | None                         # curve b at the gap, with its interval
    b_lo: float | None
    b_hi: float | None
    range_a: tuple[float, float]            # gap range of each curve (point means)
    range_b: tuple[float, float]
    dropped: float                          # share of replicates whose ranges did not overlap
    n_boot: int
    description: str


def _check_point(point: Point) -> tuple[np.ndarray, np.ndarray]:
    gap, value = (np.asarray(v, dtype=float).ravel() for v in point)
    if gap.shape != value.shape or gap.size == 0:
        raise ValueError(f"a curve point needs two equally long, non-empty per-target arrays "
                         f"(gap, value); got lengths {gap.size} and {value.size}")
    if not (np.isfinite(gap).all() and np.isfinite(value).all()):
        raise ValueError("a curve point holds a NaN or infinite gap or value")
    return gap, value


def interpolate(gaps, values, at) -> np.ndarray:
    """Piecewise-linear reading of curves at ``at`` (a number, or one per row), vectorised over
    rows.

    ``gaps``, ``values``: two (R, K) arrays, one curve of K points per row (any order; sorted by gap
    here). Between two points: linear; beyond the ends: the end segment extended linearly (the
    matching rule never reads there); a curve of one point is constant. Two points at the same
    gap read as their mean.
    """
    x = np.atleast_2d(np.asarray(gaps, dtype=float))
    y = np.atleast_2d(np.asarray(values, dtype=float))
    if x.shape[1] == 1:
        return y[:, 0].copy()
    order = np.argsort(x, axis=1, kind="stable")
    x, y = np.take_along_axis(x, order, 1), np.take_along_axis(y, order, 1)
    k = x.shape[1]
    at = np.broadcast_to(np.asarray(at, dtype=float), (x.shape[0],))
    seg = np.clip((x <= at[:, None]).sum(axis=1) - 1, 0, k - 2)   # left point of the segment
    rows = np.arange(x.shape[0])
    x0, x1, y0, y1 = x[rows, seg], x[rows, seg + 1], y[rows, seg], y[rows, seg + 1]
    dx = x1 - x0
    safe = np.where(dx > 0, dx, 1.0)
    t = np.where(dx > 0, (at - x0) / safe, 0.5)
    return y0 + t * (y1 - y0)


def _point_means(curve: Sequence[Point]) -> tuple[np.ndarray, np.ndarray]:
    """(K,) mean gap and (K,) mean value of a curve's K points."""
    points = [_check_point(p) for p in curve]
    return np.array([g.mean() for g, _ in points]), np.array([v.mean() for _, v in points])


def _overlap(gaps_a: np.ndarray, gaps_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of two (R, K) arrays of point gaps: the low and high end of the overlap of the
    two curves' gap ranges (no overlap where low > high)."""
    return (np.maximum(gaps_a.min(1), gaps_b.min(1)),
            np.minimum(gaps_a.max(1), gaps_b.max(1)))


def _replicates(curve: Sequence[Point], rng: np.random.Generator, n_boot: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(n_boot, K) resampled mean gaps and mean values, targets resampled within each point
    (:func:`_resampled` of each point; the points were checked by :func:`_point_means`)."""
    draws = [_resampled([point], rng, n_boot) for point in curve]
    return tuple(np.stack([d[i].mean(axis=1) for d in draws], axis=1) for i in (0, 1))


def _readings(curve_a: Sequence[Point], curve_b: Sequence[Point], rng: np.random.Generator,
              n_boot: int, at: float) -> tuple[np.ndarray, np.ndarray]:
    """(n_boot,) readings of both curves at the matched gap of each bootstrap replicate (targets
    resampled within each point, the whole rule applied again); NaN where a replicate's ranges
    do not overlap."""
    ga, va = _replicates(curve_a, rng, n_boot)
    gb, vb = _replicates(curve_b, rng, n_boot)
    low, high = _overlap(ga, gb)
    where = low + at * (high - low)
    at_a, at_b = interpolate(ga, va, where), interpolate(gb, vb, where)
    apart = low > high
    at_a[apart], at_b[apart] = np.nan, np.nan
    return at_a, at_b


def matched_gap_difference(curve_a: Sequence[Point], curve_b: Sequence[Point], *,
                           n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
                           what: str = "AUC", names: tuple[str, str] = ("a", "b"),
                           at: float = 0.5, axis: str = "train-test gap", scale: float = 100.0,
                           unit: str = "points") -> MatchedGap:
    """Curve ``a`` minus curve ``b`` at the matched gap, with a bootstrap interval over targets
    (the rule of the module docstring). ``what``, ``names`` and ``axis`` (what the x-axis
    holds, e.g. ``"clean test accuracy"`` for curves read at a matched accuracy), ``scale`` and
    ``unit`` (how the x-axis is shown: points of a fraction, by default) only word the
    description.

    ``at``: where in the overlap the curves are read, as a fraction of it (0: its low end, 0.5:
    the midpoint, the default; 1: its high end); each bootstrap replicate reads at the same
    fraction of its own overlap."""
    if not curve_a or not curve_b:
        raise ValueError("each curve needs at least one point (bank)")
    if not 0.0 <= float(at) <= 1.0:
        raise ValueError(f"at must be a fraction of the overlap in [0, 1]; got {at!r}")
    (gap_a, val_a), (gap_b, val_b) = _point_means(curve_a), _point_means(curve_b)
    ranges = (float(gap_a.min()), float(gap_a.max())), (float(gap_b.min()), float(gap_b.max()))
    words = dict(what=what, names=names, axis=axis, scale=scale, unit=unit)
    low, high = _overlap(gap_a[None], gap_b[None])
    if low[0] > high[0]:
        return MatchedGap(*[None] * 10, *ranges, 0.0, 0, _gap_words(None, ranges, **words))
    gap = float(low[0] + at * (high[0] - low[0]))
    mean_a = float(interpolate(gap_a[None], val_a[None], gap)[0])
    mean_b = float(interpolate(gap_b[None], val_b[None], gap)[0])
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x67617073]))  # "gaps"
    at_a, at_b = _readings(curve_a, curve_b, rng, n_boot, at)
    kept = np.isfinite(at_a)                         # replicates whose ranges still overlap
    if not kept.any():
        raise ValueError("no bootstrap replicate's gap ranges overlap")  # only with tiny banks
    at_a, at_b = at_a[kept], at_b[kept]
    alpha = (1 - confidence) / 2

    def q(x):
        return float(np.quantile(x, alpha)), float(np.quantile(x, 1 - alpha))

    left_out = float(1 - kept.mean())
    return MatchedGap(
        gap, mean_a - mean_b, *q(at_a - at_b), mean_a, *q(at_a), mean_b, *q(at_b), *ranges,
        left_out, int(n_boot), _gap_words(gap, ranges, at=at, confidence=confidence,
                                          n_boot=n_boot, left_out=left_out, **words))


def _gap_words(gap: float | None, ranges, *, what: str, names: tuple[str, str], axis: str,
               scale: float, unit: str, at: float = 0.5, confidence: float = 0.95,
               n_boot: int = 0, left_out: float = 0.0) -> str:
    """The description of :func:`matched_gap_difference`'s result (``gap`` None: the ranges do
    not overlap)."""
    (na, nb), (ra, rb) = names, ranges

    def span(r):
        return f"[{scale * r[0]:.2f}, {scale * r[1]:.2f}]"

    if gap is None:
        short = "gap" if axis == "train-test gap" else axis
        return (f"no matched {short}: the {short} ranges of {na} {span(ra)} and {nb} {span(rb)} "
                f"{unit} do not overlap, and the curves are not extrapolated")
    return (f"{what}, {na} minus {nb} at a matched {axis} of {scale * gap:.2f} {unit} (the "
            f"{'midpoint' if at == 0.5 else f'point {100 * at:g}% of the way up'} of the "
            f"overlap of {na}'s {span(ra)} and {nb}'s {span(rb)}), each curve read by linear "
            f"interpolation; {100 * confidence:g}% percentile bootstrap over each bank's "
            f"targets ({n_boot} replicates, the rule applied again in each"
            + (f"; {100 * left_out:.0f}% left out: their ranges did not overlap)"
               if left_out > 0 else ")"))


def replicated_matched_gap(curves_a: Sequence[Sequence[Point]], curves_b: Sequence[Sequence[Point]],
                           *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
                           **words) -> dict:
    """Curve ``a`` minus curve ``b`` at the matched gap, measured on R replicate banks per point
    (``curves_a[r]``, ``curves_b[r]``: replicate r's curves, trained from one seed): the rule of
    :func:`matched_gap_difference` applied whole in each replicate (its own matched gap, readings
    and bootstrap interval over its targets), one difference per replicate, and a Student t
    interval over those differences (R - 1 d.o.f.; a replicate whose ranges do not overlap has
    none and is left out, ``n`` counting the rest). Returns ``"estimate"`` (an
    :class:`~bnmem_utils.core.stats.Estimate`: the mean of the replicates' differences; with one
    replicate its own bootstrap interval, its method saying so), ``"replicates"`` (each
    replicate's :class:`MatchedGap`) and ``"calibration"``
    (:func:`~bnmem_utils.core.stats.one_bank_calibration`, None with one replicate or when a
    replicate's ranges do not overlap). ``words`` word each replicate's description."""
    from bnmem_utils.core.stats import BOOTSTRAP, Estimate, one_bank_calibration, replicate_t

    if len(curves_a) != len(curves_b) or not curves_a:
        raise ValueError(f"need the same number (>= 1) of replicates per curve; got "
                         f"{len(curves_a)} and {len(curves_b)}")
    own = [matched_gap_difference(a, b, n_boot=n_boot, confidence=confidence, seed=seed, **words)
           for a, b in zip(curves_a, curves_b, strict=True)]
    if len(own) == 1:
        m = own[0]
        return {"estimate": Estimate(*(float("nan") if v is None else v for v in (m.diff, m.lo, m.hi)),
                                     1, method=f"{BOOTSTRAP} over one bank's targets per point, "
                                               "the rule applied again in each draw"),
                "replicates": own, "calibration": None}
    est = replicate_t([np.nan if m.diff is None else m.diff for m in own], confidence)
    calibration = None
    if all(m.diff is not None for m in own):
        calibration = one_bank_calibration([Estimate(m.diff, m.lo, m.hi, 0) for m in own], est,
                                           confidence)
    return {"estimate": est, "replicates": own, "calibration": calibration}


# --------------------------------------------------------------------------------------------
# The per-model regression
# --------------------------------------------------------------------------------------------
def hinge_basis(gap, knots) -> np.ndarray:
    """``(..., 2 + len(knots))`` design of a piecewise-linear curve in ``gap``: intercept, gap,
    and one hinge ``max(gap - knot, 0)`` per knot."""
    g = np.asarray(gap, dtype=float)[..., None]
    k = np.asarray(knots, dtype=float)
    return np.concatenate([np.ones_like(g), g, np.maximum(g - k, 0.0)], axis=-1)


def default_knots(*gaps, n_knots: int = 3) -> np.ndarray:
    """``n_knots`` interior knots at evenly spaced quantiles of the pooled per-model gaps."""
    pooled = np.concatenate([np.asarray(g, dtype=float).ravel() for g in gaps])
    if n_knots < 0 or pooled.size == 0:
        raise ValueError(f"n_knots must be >= 0 and the gaps non-empty; got {n_knots}")
    return np.quantile(pooled, np.arange(1, n_knots + 1) / (n_knots + 1))


def _fit_read(gap: np.ndarray, auc: np.ndarray, knots: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Least-squares piecewise-linear fits of the rows of ``gap``/``auc`` (R, n) read at ``at``
    (A,): (R, A). A pseudo-inverse, so a resample that leaves a hinge without data still
    fits."""
    x = hinge_basis(gap, knots)                                   # (R, n, p)
    coef = np.einsum("rpn,rn->rp", np.linalg.pinv(x), auc)        # (R, p)
    return coef @ hinge_basis(at, knots).T                        # (R, A)


def _resampled(points: Sequence[tuple], rng: np.random.Generator, n_boot: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """(n_boot, n) gaps and AUCs of a curve's models, resampled within each bank."""
    gaps, aucs = [], []
    for g, v in points:
        g, v = np.asarray(g, dtype=float), np.asarray(v, dtype=float)
        idx = rng.integers(0, g.size, size=(n_boot, g.size))
        gaps.append(g[idx])
        aucs.append(v[idx])
    return np.concatenate(gaps, axis=1), np.concatenate(aucs, axis=1)


def _regression_fit(curve_a: Sequence[tuple], curve_b: Sequence[tuple], at: np.ndarray,
                    n_knots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The knots of two curves' models and each curve's fit read at ``at``."""
    full = [tuple(np.concatenate([np.asarray(p[i], dtype=float) for p in c]) for i in (0, 1))
            for c in (curve_a, curve_b)]
    knots = default_knots(full[0][0], full[1][0], n_knots=n_knots)
    return knots, *(_fit_read(g[None], v[None], knots, at)[0] for g, v in full)


def regression_difference(curve_a: Sequence[tuple], curve_b: Sequence[tuple], at, *,
                          n_knots: int = 3, n_boot: int = 2000, confidence: float = 0.95,
                          seed: int = 0) -> pd.DataFrame:
    """Curve ``a`` minus curve ``b`` at each gap of ``at`` by the per-model regression (the
    module docstring): columns ``gap``, ``diff``, ``lo``, ``hi``, ``a``, ``b``. The curves: lists
    of points (per bank, per-target gap and AUC arrays)."""
    import pandas as pd

    at = np.atleast_1d(np.asarray(at, dtype=float))
    knots, fa, fb = _regression_fit(curve_a, curve_b, at, n_knots)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x72656772]))  # "regr"
    ra = _fit_read(*_resampled(curve_a, rng, n_boot), knots, at)
    rb = _fit_read(*_resampled(curve_b, rng, n_boot), knots, at)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(ra - rb, [alpha, 1 - alpha], axis=0)
    return pd.DataFrame({"gap": at, "diff": fa - fb, "lo": lo, "hi": hi, "a": fa, "b": fb})


def replicated_regression_difference(curves_a: Sequence[Sequence[tuple]],
                                     curves_b: Sequence[Sequence[tuple]], at, *, n_knots: int = 3,
                                     n_boot: int = 2000, confidence: float = 0.95,
                                     seed: int = 0) -> pd.DataFrame:
    """:func:`regression_difference` on R replicate curves per norm (``curves_a[r]``: replicate
    r's banks): the regression fitted whole in each replicate (its own knots), ``diff``, ``a``
    and ``b`` the means over replicates of its readings, and the interval of ``diff`` a Student
    t over the R replicates' differences (R - 1 d.o.f.,
    :func:`~bnmem_utils.core.stats.replicate_t`). With one replicate it is
    :func:`regression_difference` itself, its bootstrap over the models of each bank."""
    import pandas as pd

    from bnmem_utils.core.stats import replicate_t

    if len(curves_a) != len(curves_b) or not curves_a:
        raise ValueError(f"need the same number (>= 1) of replicates per curve; got "
                         f"{len(curves_a)} and {len(curves_b)}")
    if len(curves_a) == 1:
        return regression_difference(curves_a[0], curves_b[0], at, n_knots=n_knots,
                                     n_boot=n_boot, confidence=confidence, seed=seed)
    at = np.atleast_1d(np.asarray(at, dtype=float))
    fits = np.array([_regression_fit(a, b, at, n_knots)[1:]
                     for a, b in zip(curves_a, curves_b, strict=True)])     # (R, 2, A)
    est = [replicate_t(fits[:, 0, i] - fits[:, 1, i], confidence) for i in range(at.size)]
    return pd.DataFrame({"gap": at, "diff": [e.mean for e in est], "lo": [e.lo for e in est],
                         "hi": [e.hi for e in est], "a": fits[:, 0].mean(axis=0),
                         "b": fits[:, 1].mean(axis=0)})


def fitted_curve(points: Sequence[tuple], knots, grid) -> np.ndarray:
    """A curve's piecewise-linear fit read on ``grid`` (for the figure)."""
    g = np.concatenate([np.asarray(p[0], dtype=float) for p in points])
    v = np.concatenate([np.asarray(p[1], dtype=float) for p in points])
    return _fit_read(g[None], v[None], np.asarray(knots, dtype=float),
                     np.asarray(grid, dtype=float))[0]


# --------------------------------------------------------------------------------------------
# Curve points from banks and frames, and notebook 04's comparison of BN with no norm
# --------------------------------------------------------------------------------------------
def bank_point(bank, attack: str = "auto", subset: str = "all", *, x: str = "gap") -> Point:
    """One bank as a curve point: per target, its model's gap (train minus test accuracy) and
    the attack's AUC on ``subset`` (eval-mode queries; ``"auto"``: the bank's headline attack,
    :func:`~bnmem_utils.privacy.attacks.resolve_attack`). ``x`` names the column of the bank's
    model table read in place of the gap (e.g. ``"test_acc"``: curves compared at a matched
    clean test accuracy)."""
    attack, metrics = resolve_attack(attack, bank), bank.evaluate().metrics
    sel = metrics[(metrics.attack == attack) & (metrics.subset == subset)].sort_values("target")
    if sel.empty:
        raise ValueError(f"bank {bank.config.arm} has no {subset!r} subset for {attack!r}")
    value = sel.set_index("target")["auc"]
    if x not in bank.models.columns:
        raise ValueError(f"bank {bank.config.arm} has no model column {x!r}; valid choices: "
                         f"{', '.join(map(str, bank.models.columns))}")
    gap = bank.models.set_index("model")[x].loc[value.index]
    return gap.to_numpy(dtype=float), value.to_numpy(dtype=float)


def curve(frame: pd.DataFrame, norm: str, knob: str = "epochs", x: str = "gap") -> list[tuple]:
    """A norm's curve on a knob of a per-target frame (columns ``norm``, ``knob``, ``level``,
    ``auc`` and the ruler ``x``, by default ``gap``: the confound study's
    :func:`bnmem_utils.analyses.confound.target_frame`) as points: per bank, in the knob's
    order, the (ruler, AUC) arrays of its targets."""
    sel = frame[(frame.norm == norm) & (frame.knob == knob)]
    if sel.empty:
        raise ValueError(f"no {norm!r} banks on the {knob!r} knob; norms there: "
                         f"{', '.join(sorted(set(frame.norm[frame.knob == knob]))) or 'none'}")
    return [(g[x].to_numpy(), g.auc.to_numpy()) for _, g in sel.groupby("level", sort=True)]
