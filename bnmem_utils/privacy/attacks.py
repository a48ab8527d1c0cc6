"""Membership-inference attacks on a shadow-model bank: LiRA, baselines, RMIA, memorization.

RMIA itself is :mod:`bnmem_utils.privacy.rmia`, registered here in :data:`ATTACKS`.

The inputs follow the layout of the reference LiRA code (Carlini et al., "Membership Inference
Attacks From First Principles", IEEE S&P 2022): ``keep`` is a boolean (N, M) matrix (model i
trained on sample j) and ``scores`` a float (N, M, Q) array of LiRA scores
``log p_y - log sum_{y' != y} p_y'`` of every model on every sample under Q query augmentations.
Everything here is NumPy/SciPy/scikit-learn on those arrays, so banks made elsewhere can be
attacked too.

Conventions:

* every attack returns one membership score per sample where HIGHER means "more likely a member";
* attacks see the target model's scores (M, Q) and the shadow models' keep (S, M) and scores
  (S, M, Q), never the target's keep row;
* :func:`evaluate_leave_one_out` makes each model in turn the target and the other N - 1 its
  shadows, and reports AUC, balanced accuracy and TPR at low FPR per target, on all samples and
  on named subsets (clean / outliers). With a balanced keep matrix, a member of the target has
  N/2 - 1 IN shadows and a non-member N/2, so the attacks fit every sample on the same number
  of IN and OUT shadows (:meth:`ShadowSplit.balanced_masks`); otherwise the counts alone would
  leak membership. Intervals over targets use :func:`bnmem_utils.core.stats.mean_ci`; targets share
  shadow models, so they are not fully independent and the interval is somewhat optimistic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd
from scipy.special import log_ndtr, logsumexp

from bnmem_utils.core.checks import check_choice
from bnmem_utils.core.stats import Estimate, mean_ci
from bnmem_utils.privacy.moderated import (
    masked_moments,
    moderated_predictive,
    predictive_logpdf,
    require_shadows,
)
from bnmem_utils.privacy.rmia import rmia

#: Query augmentations of a bank's models: each model's logits on each augmented view of every
#: sample (:func:`bnmem_utils.jobs.bank_models.apply_query`), LiRA's averaged queries.
QUERIES = ("identity", "mirror", "shift_right", "shift_left", "shift_down", "shift_up")

DEFAULT_FPRS = (1e-3, 1e-2)  # the low false-positive rates at which TPR is reported
_MIN_STD = 1e-6  # floor of the LiRA Gaussians' standard deviation


# ---------------------------------------------------------------------------------------------
# Scores from logits
# ---------------------------------------------------------------------------------------------
def _to_numpy(a, dtype=None) -> np.ndarray:
    """A NumPy array from an array-like or a torch tensor (moved to the CPU first)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu()
        if str(a.dtype) == "torch.bfloat16":
            a = a.float()
        a = a.numpy()
    return np.asarray(a, dtype=dtype)


def _with_queries(a, ndim: int) -> np.ndarray:
    """``a`` as float64, with a query axis (Q = 1) added last when it has ``ndim - 1`` axes."""
    a = _to_numpy(a, np.float64)
    return a[..., None] if a.ndim == ndim - 1 else a


def lira_score_from_logits(logits, labels) -> np.ndarray:
    """LiRA score ``log p_y - log sum_{y' != y} p_y'`` in float64, stable for any logit size.

    Both log-probabilities share the softmax normaliser, so the score is exactly
    ``z_y - logsumexp_{y' != y} z_y'``: no softmax is formed and nothing under- or overflows
    (logits of +-1e4 give finite scores). ``logits`` is (..., C), ``labels`` broadcasts to (...).
    """
    z = _to_numpy(logits, np.float64)  # (..., C)
    if z.ndim < 1 or z.shape[-1] < 2:
        raise ValueError(f"logits must have a class axis of size >= 2 last, got shape {z.shape}")
    y = _to_numpy(labels)
    if y.dtype.kind not in "iu":
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    try:
        y = np.broadcast_to(y.astype(np.int64), z.shape[:-1])  # (...)
    except ValueError as exc:
        raise ValueError(f"labels of shape {y.shape} do not match logits of shape {z.shape}") from exc
    num_classes = z.shape[-1]
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{y.min()}, {y.max()}]")
    z_y = np.take_along_axis(z, y[..., None], axis=-1)[..., 0]  # (...)
    others = z.copy()
    np.put_along_axis(others, y[..., None], -np.inf, axis=-1)
    return z_y - logsumexp(others, axis=-1)  # (...)


def correct_from_logits(logits, labels) -> np.ndarray:
    """Boolean (...) array: does the arg-max of ``logits`` (..., C) equal ``labels``?"""
    z = _to_numpy(logits)
    y = _to_numpy(labels)
    return np.argmax(z, axis=-1) == np.broadcast_to(y, z.shape[:-1])


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------
def check_bank(keep, scores) -> tuple[np.ndarray, np.ndarray]:
    """Validate a bank: ``keep`` (N, M) of 0/1 and ``scores`` (N, M) or (N, M, Q), finite.

    Returns ``keep`` as bool and ``scores`` as float64 (N, M, Q). Shapes that disagree, a keep
    matrix with values other than 0/1, or non-finite scores raise a ValueError naming the problem.
    """
    keep = _to_numpy(keep)
    scores = _with_queries(scores, 3)
    if keep.ndim != 2:
        raise ValueError(f"keep must be 2-D (N models, M samples), got shape {keep.shape}")
    if keep.dtype != bool:
        if not np.isin(keep, (0, 1)).all():
            raise ValueError("keep must hold booleans or 0/1 values")
        keep = keep.astype(bool)
    if scores.ndim != 3:
        raise ValueError(f"scores must be (N, M) or (N, M, Q), got shape {scores.shape}")
    if scores.shape[:2] != keep.shape:
        raise ValueError(
            f"keep and scores disagree: keep is {keep.shape} (N, M) but scores is "
            f"{scores.shape} (N, M, Q)")
    return keep, _finite("scores", scores)


def _finite(name: str, a: np.ndarray) -> np.ndarray:
    """``a``, refused when it holds NaN or inf (the attacks would return NaN scores)."""
    bad = ~np.isfinite(a)
    if bad.any():
        raise ValueError(f"{name} hold {int(bad.sum())} non-finite values (NaN or inf)")
    return a


@dataclass
class ShadowSplit:
    """What an attack sees: the shadows' keep and scores, the target's scores, the population.

    Shapes: ``keep`` (S, M) bool, ``scores`` (S, M, Q), ``target`` (M, Q); RMIA also needs the
    population (never-trained-on) samples: ``pop_scores`` (S, P, Q) and ``pop_target`` (P, Q).
    """

    keep: np.ndarray
    scores: np.ndarray
    target: np.ndarray
    pop_scores: np.ndarray | None = None
    pop_target: np.ndarray | None = None

    def __post_init__(self):
        self.keep, self.scores = check_bank(self.keep, self.scores)
        self.target = _finite("target scores", _with_queries(self.target, 2))
        if self.target.shape != self.scores.shape[1:]:
            raise ValueError(f"target scores {self.target.shape} do not match the shadows' "
                             f"(M, Q) = {self.scores.shape[1:]}")
        if (self.pop_scores is None) != (self.pop_target is None):
            raise ValueError("pop_scores and pop_target must be given together")
        if self.pop_scores is not None:
            ps, pt = _with_queries(self.pop_scores, 3), _with_queries(self.pop_target, 2)
            if ps.ndim != 3 or ps.shape[0] != self.scores.shape[0] or ps.shape[1:] != pt.shape:
                raise ValueError(f"population scores {ps.shape} (S, P, Q) and target population "
                                 f"scores {pt.shape} (P, Q) do not match {self.scores.shape[0]} "
                                 "shadows")
            self.pop_scores = _finite("population scores", ps)
            self.pop_target = _finite("target population scores", pt)

    def balanced_masks(self) -> tuple[np.ndarray, np.ndarray]:
        """IN and OUT shadow masks (S, M) with the same number of IN (and of OUT) shadows for
        every sample: the first k_in IN and k_out OUT shadows in model order, k = the smallest
        count over samples (as the reference code truncates).

        Why (module docstring): estimates from unequal counts differ in distribution (a median
        of 7 values is not a median of 8, a variance of one value is 0), so the attack score
        would reveal membership through the counts alone: with N = 4 and no signal at all,
        unbalanced online LiRA reaches an AUC of 0.68.
        """
        out = []
        for mask in (self.keep, ~self.keep):
            k = int(mask.sum(axis=0).min()) if mask.size else 0
            out.append(mask & (np.cumsum(mask, axis=0) <= k))  # first k per sample (column)
        return out[0], out[1]


# ---------------------------------------------------------------------------------------------
# LiRA
# ---------------------------------------------------------------------------------------------
def _fit_gaussians(scores: np.ndarray, balanced: np.ndarray, full: np.ndarray,
                   pooled: bool, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample Gaussians over the ``balanced`` shadow mask: centre (M, Q), the median, and
    variance (M, Q), ddof=0 as the reference code, the standard deviation floored at ``_MIN_STD``.

    The variance is per sample, or, with ``pooled`` or when the balanced count is below 2
    (N = 4 leaves one IN and one OUT shadow per sample), the pooled within-sample variance per
    query: the mean of the per-sample variances over the ``full`` mask's samples with >= 2
    shadows. One number shared by all samples cannot leak membership, so the full mask is safe
    there. It measures the spread of one sample's score across models, not the spread between
    samples (the reference code's ``np.std(dat_in)`` mixes the two).
    """
    require_shadows(full, kind)          # so every sample has k >= 1 balanced shadows: no NaN
    count, _, var = masked_moments(scores, balanced, ddof=0)
    mu = np.nanmedian(np.where(balanced[:, :, None], scores, np.nan), axis=0)
    if pooled or count.min() < 2:
        count_full, _, var_full = masked_moments(scores, full, ddof=0)
        ok = count_full >= 2  # (M,)
        if not ok.any():
            raise ValueError(f"no sample has 2 {kind} shadow models: the variance of the "
                             "shadow scores cannot be estimated (use N >= 4)")
        var = np.broadcast_to(var_full[ok].mean(axis=0), var.shape).copy()  # (Q,) to (M, Q)
    return mu, np.maximum(var, _MIN_STD**2)


@dataclass
class OnlineFit:
    """What an online LiRA fits per sample and query (each (M, Q)): the IN and OUT predictive's
    location, scale and degrees of freedom (infinite: a Gaussian), and the shadows a side (k);
    ``floor_in`` / ``floor_out`` mark scales held at the floor ``_MIN_STD``."""

    loc_in: np.ndarray
    scale_in: np.ndarray
    dof_in: np.ndarray
    loc_out: np.ndarray
    scale_out: np.ndarray
    dof_out: np.ndarray
    k: int

    def log_ratio(self, x) -> np.ndarray:
        """Per query (M, Q): log p_IN(x) - log p_OUT(x) of the target's scores ``x``."""
        return (predictive_logpdf(x, self.loc_in, self.scale_in, self.dof_in)
                - predictive_logpdf(x, self.loc_out, self.scale_out, self.dof_out))

    @property
    def floor_in(self) -> np.ndarray:
        return self.scale_in <= _MIN_STD * (1 + 1e-9)

    @property
    def floor_out(self) -> np.ndarray:
        return self.scale_out <= _MIN_STD * (1 + 1e-9)


#: The online LiRA attacks by how each fits the variance of a sample's scores: its own
#: (``sample``), the pooled within-sample variance (``pooled``), the reference code's one
#: standard deviation over every IN score (``global``), or shrunk toward the pooled one by
#: empirical Bayes (``nig``, :mod:`bnmem_utils.privacy.moderated`).
ONLINE = {"lira_online": "sample", "lira_online_fixed": "pooled",
          "lira_online_global": "global", "lira_online_nig": "nig"}


def online_fit(split: ShadowSplit, variance: str = "sample") -> OnlineFit:
    """The IN and OUT fits of an online LiRA (:data:`ONLINE`), over the balanced shadows
    (:meth:`ShadowSplit.balanced_masks`), k of them a side for every sample.

    ``sample`` / ``pooled``: Gaussians, centre the median, variance as :func:`_fit_gaussians`.
    ``global``: the reference code's ``fix_variance`` (tensorflow/privacy mi_lira_2021,
    plot.py): one standard deviation over every balanced IN score (all shadows, samples and
    queries: ``np.std(dat_in)``), for IN and OUT alike; it mixes the spread between samples'
    means into it. ``nig``: Student t predictives around the mean, the variance shrunk toward
    the bank's (:func:`bnmem_utils.privacy.moderated.moderated_predictive`)."""
    check_choice("variance", variance, ("sample", "pooled", "global", "nig"))
    for full, side in ((split.keep, "IN"), (~split.keep, "OUT")):
        require_shadows(full, side)
    in_mask, out_mask = split.balanced_masks()
    k = int(in_mask.sum(axis=0).min()) if in_mask.size else 0
    if variance == "nig":
        sides = [moderated_predictive(split.scores, m, f, _MIN_STD)
                 for m, f in ((in_mask, split.keep), (out_mask, ~split.keep))]
        return OnlineFit(*sides[0], *sides[1], k=k)
    sides = []
    for mask, full, kind in ((in_mask, split.keep, "IN"), (out_mask, ~split.keep, "OUT")):
        mu, var = _fit_gaussians(split.scores, mask, full, variance == "pooled", kind)
        if variance == "global":
            var = np.full_like(var, max(float(split.scores[in_mask].var()), _MIN_STD**2))
        sides.append((mu, np.sqrt(var), np.full_like(mu, np.inf)))
    return OnlineFit(*sides[0], *sides[1], k=k)


def _online(split: ShadowSplit, variance: str) -> np.ndarray:
    return online_fit(split, variance).log_ratio(split.target).mean(axis=1)  # (M,)


def lira_online(split: ShadowSplit, *, pooled_variance: bool = False) -> np.ndarray:
    """LiRA online: log N(s; mu_in, s_in) - log N(s; mu_out, s_out), averaged over queries.

    Per sample and per query, the in (out) Gaussian is fitted to the shadows that did (did not)
    train on the sample, the same number for every sample (:meth:`ShadowSplit.balanced_masks`):
    centre = median over those shadows (as the reference code), variance over the same shadows,
    or with ``pooled_variance`` the pooled within-sample variance, one per query for in and one
    for out (better with few shadows, Carlini et al. Sec. VI; not the reference code's
    ``fix_variance``, which is :data:`ONLINE`'s ``global``). The likelihood ratio per query is
    averaged over the Q queries. Returns (M,). The other online fits: :func:`online_fit`.
    """
    return _online(split, "pooled" if pooled_variance else "sample")


def lira_offline(split: ShadowSplit, *, pooled_variance: bool = False) -> np.ndarray:
    """LiRA offline, one-sided: how far above the OUT Gaussian the target's score lies.

    Carlini et al. (Sec. IV-C) test only against the out distribution: a member's score sits in
    the upper tail of N(mu_out, s_out). Per query we take ``-log Pr[Z > s]`` (``-log`` of the
    survival function, computed with ``log_ndtr`` so that far tails stay finite and distinct,
    where ``1 - Pr[Z > s]`` would saturate at 1) and average it over the Q queries. Centre and
    variance (``pooled_variance``) as in :func:`lira_online`. Returns (M,).
    """
    mu_out, var_out = _fit_gaussians(split.scores, split.balanced_masks()[1], ~split.keep,
                                     pooled_variance, "OUT")
    z = (split.target - mu_out) / np.sqrt(var_out)  # (M, Q)
    return (-log_ndtr(-z)).mean(axis=1)  # (M,)


def global_threshold(split: ShadowSplit) -> np.ndarray:
    """Baseline: the target's own LiRA score averaged over queries (one global threshold)."""
    return split.target.mean(axis=1)


def loss_threshold(split: ShadowSplit) -> np.ndarray:
    """Baseline (Yeom et al. 2018): minus the target's cross-entropy on the un-augmented query.

    The loss follows from the score s = log(p/(1-p)): ``-log p = log(1 + exp(-s))``.
    """
    return -np.logaddexp(0.0, -split.target[:, 0])


def loss_gap(keep, scores) -> np.ndarray:
    """Per model (N,): its mean cross-entropy on the pool samples it did not train on minus on
    those it did (eval mode, the un-augmented query), from the bank's LiRA scores (N, M, Q) as
    :func:`loss_threshold` reads them. The generalization gap that a loss-threshold attack
    sees, unlike the accuracy gap, which stops moving once the members are fitted."""
    keep, scores = check_bank(keep, scores)
    loss = np.logaddexp(0.0, -scores[:, :, 0])                        # (N, M) cross-entropy
    members, others = keep.sum(axis=1), (~keep).sum(axis=1)          # (N,) each >= 1
    return (loss * ~keep).sum(axis=1) / others - (loss * keep).sum(axis=1) / members


# name -> function(split) -> (M,) membership score, higher = member; ``*_fixed``: the pooled
# within-sample variance (the names stay: they key committed results and caches)
ATTACKS: dict[str, Callable[[ShadowSplit], np.ndarray]] = {
    **{name: partial(_online, variance=v) for name, v in ONLINE.items()},
    "lira_offline": lira_offline,
    "lira_offline_fixed": partial(lira_offline, pooled_variance=True),
    "global_threshold": global_threshold,
    "loss_threshold": loss_threshold,
    "rmia": rmia,
    "rmia_offline": lambda s: rmia(s, offline=True),
}

#: Shadows a side (k) from which the headline LiRA fits each sample its own variance.
PER_SAMPLE_MIN_SHADOWS = 32
#: What ``lira_attack``, ``cf_attack`` and ``mit_attack`` accept: an attack, or ``auto``.
HEADLINE_CHOICES = ("auto", *ATTACKS)


def shadows_a_side(bank) -> int:
    """The fewest IN or OUT shadows (k) any sample is fitted from when ``bank`` is attacked
    leave-one-out (every target, the other N - 1 its shadows, :meth:`ShadowSplit.balanced_masks`).
    ``bank``: a keep matrix (N, M), an object holding one as ``keep`` (a Bank), or a size N read
    as a balanced bank (k = N/2 - 1). An unbalanced keep (:func:`check_bank` allows one) can
    leave far fewer: a random keep of 64 models gave 22 IN and 21 OUT."""
    if isinstance(bank, (int, np.integer)):
        return int(bank) // 2 - 1
    keep = _to_numpy(getattr(bank, "keep", bank)).astype(bool)
    if keep.ndim != 2:
        raise ValueError(f"keep must be 2-D (N models, M samples), got shape {keep.shape}")
    n_in = keep.sum(axis=0)                                         # (M,)
    return int(min((n_in - keep).min(), (keep.shape[0] - n_in - ~keep).min()))


def headline_attack(*banks) -> str:
    """The headline LiRA of ``banks`` (one for all): per-sample variance (``lira_online``) where
    every sample is fitted from k >= :data:`PER_SAMPLE_MIN_SHADOWS` shadows a side
    (:func:`shadows_a_side`: balanced banks of at least 66 models), the pooled within-sample
    variance (``lira_online_fixed``) below. Carlini et al. 2022: per-example variances help only
    with many shadow models (their code's ``fix_variance`` below that); the pooled form is this
    module's, not ``np.std(dat_in)`` (``lira_online_global``), which adds the spread between
    samples' means."""
    if not banks:
        raise ValueError("the headline attack is decided from a bank: give one")
    k = min(shadows_a_side(b) for b in banks)
    return "lira_online" if k >= PER_SAMPLE_MIN_SHADOWS else "lira_online_fixed"


def resolve_attack(name: str, *banks) -> str:
    """``name``, or for ``"auto"`` :func:`headline_attack` of ``banks`` (one attack for all)."""
    check_choice("attack", name, HEADLINE_CHOICES)
    return headline_attack(*banks) if name == "auto" else name


# ---------------------------------------------------------------------------------------------
# Memorization
# ---------------------------------------------------------------------------------------------
def memorization_scores(keep, correct) -> np.ndarray:
    """Feldman-Zhang memorization per sample: Pr[correct | in] - Pr[correct | out] over models.

    ``keep`` (N, M) and ``correct`` (N, M) boolean (model i classifies sample j as its training
    label; use the un-augmented query). Returns float64 (M,) in [-1, 1]. Every sample needs at
    least one in and one out model (a balanced keep matrix guarantees it).
    """
    keep = _to_numpy(keep).astype(bool)
    correct = _to_numpy(correct)
    if correct.ndim == 3:
        raise ValueError("correct must be (N, M); take the un-augmented query, correct[:, :, 0]")
    if correct.shape != keep.shape:
        raise ValueError(f"keep {keep.shape} and correct {correct.shape} shapes disagree")
    correct = correct.astype(np.float64)
    n_in, n_out = keep.sum(axis=0), (~keep).sum(axis=0)  # (M,)
    if (n_in == 0).any() or (n_out == 0).any():
        raise ValueError("every sample needs at least one IN and one OUT model")
    acc_in = (correct * keep).sum(axis=0) / n_in
    acc_out = (correct * ~keep).sum(axis=0) / n_out
    return acc_in - acc_out


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------
def tpr_key(fpr: float) -> str:
    """Column name of the TPR at a given FPR, e.g. ``tpr@0.1%``."""
    return f"tpr@{100 * fpr:g}%"


def roc_metrics(is_member, score, fprs: Sequence[float] = DEFAULT_FPRS, grid=()
                ) -> tuple[dict[str, float], np.ndarray]:
    """AUC, balanced accuracy and TPR at each FPR in ``fprs`` of one attack on one target, and
    the TPR at each FPR of ``grid`` (for averaging ROC curves over targets on a common,
    log-spaced, FPR axis).

    Balanced accuracy = max over thresholds of (TPR + 1 - FPR) / 2 (the reference's ``acc``).
    TPR at FPR f = the largest TPR among ROC points with FPR <= f (no interpolation beyond the
    empirical curve; with K non-members the finest FPR step is 1/K). All NaN when the labels
    hold only one class.
    """
    y = _to_numpy(is_member).astype(bool).ravel()
    s = _to_numpy(score, np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"is_member {y.shape} and score {s.shape} have different sizes")
    out = {"auc": np.nan, "bal_acc": np.nan, **{tpr_key(f): np.nan for f in fprs}}
    grid = np.asarray(grid, dtype=np.float64)
    if y.all() or not y.any():
        return out, np.full(grid.shape, np.nan)
    # here: importing sklearn sets KMP_* variables
    from sklearn.metrics import roc_auc_score, roc_curve

    fpr, tpr = roc_curve(y, s, drop_intermediate=False)[:2]
    out["auc"] = float(roc_auc_score(y, s))
    out["bal_acc"] = float(np.max((tpr + 1 - fpr) / 2))
    for f in fprs:
        out[tpr_key(f)] = float(tpr[fpr <= f].max())
    # fpr is non-decreasing and so is tpr: the last point with fpr <= g has the largest tpr.
    return out, tpr[np.clip(np.searchsorted(fpr, grid, side="right") - 1, 0, None)]


@dataclass
class LeaveOneOut:
    """Per-target results of :func:`evaluate_leave_one_out`.

    ``metrics``: one row per (target, attack, subset) with n_in, n_out, auc, bal_acc and the
    ``tpr@..%`` columns. ``roc``: one row per (target, attack, subset, fpr) with the tpr there.
    ``member_scores``: {attack: (N, M) array of each target's scores}, for further analysis.
    """

    metrics: pd.DataFrame
    roc: pd.DataFrame
    member_scores: dict[str, np.ndarray] = field(default_factory=dict)


def evaluate_leave_one_out(
        keep, scores, *,
        attacks: Iterable[str] = (*ONLINE, "lira_offline", "lira_offline_fixed",
                                  "global_threshold", "loss_threshold"),
        groups: Mapping[str, np.ndarray] | None = None, population=None,
        targets: Iterable[int] | None = None, fprs: Sequence[float] = DEFAULT_FPRS,
        roc_grid=None) -> LeaveOneOut:
    """Make each model the target in turn, the other N - 1 its shadows, and score every attack.

    ``keep`` (N, M), ``scores`` (N, M, Q): the bank. ``groups``: {name: bool mask (M,)} of
    subsets to report besides "all" (e.g. clean / outlier). ``population``: (N, P, Q) scores of
    samples no model trained on (needed by the RMIA attacks). ``targets``: which models to use as
    targets (all by default). ``roc_grid``: FPR values at which to record the ROC (default
    log-spaced 1e-5..1).
    """
    keep, scores = check_bank(keep, scores)
    n_models, n_samples, _ = scores.shape
    if n_models < 3:
        raise ValueError(f"leave-one-out needs at least 3 models, got {n_models}")
    attacks = list(attacks)
    for name in attacks:
        check_choice("attack", name, ATTACKS)
    subsets = {"all": np.ones(n_samples, dtype=bool)}
    for name, mask in (groups or {}).items():
        mask = _to_numpy(mask).astype(bool)
        if mask.shape != (n_samples,):
            raise ValueError(f"group {name!r} mask has shape {mask.shape}, expected ({n_samples},)")
        if name == "all":
            raise ValueError("group name 'all' is reserved")
        subsets[name] = mask
    pop = None
    if population is not None:
        pop = _with_queries(population, 3)
        if pop.ndim != 3 or pop.shape[0] != n_models:
            raise ValueError(f"population scores must be (N={n_models}, P, Q), got {pop.shape}")
    grid = np.logspace(-5, 0, 61) if roc_grid is None else np.asarray(roc_grid, dtype=float)
    targets = range(n_models) if targets is None else list(targets)

    rows, roc_rows = [], []
    member_scores = {name: np.full((n_models, n_samples), np.nan) for name in attacks}
    for t in targets:
        shadows = np.arange(n_models) != t
        split = ShadowSplit(
            keep[shadows], scores[shadows], scores[t],
            None if pop is None else pop[shadows], None if pop is None else pop[t])
        for name in attacks:
            s = ATTACKS[name](split)  # (M,)
            member_scores[name][t] = s
            for subset, mask in subsets.items():
                y = keep[t, mask]
                metrics, tpr = roc_metrics(y, s[mask], fprs, grid)
                rows.append({"target": t, "attack": name, "subset": subset,
                             "n_in": int(y.sum()), "n_out": int((~y).sum()), **metrics})
                roc_rows.extend({"target": t, "attack": name, "subset": subset, "fpr": f,
                                 "tpr": r} for f, r in zip(grid, tpr, strict=True))
    return LeaveOneOut(pd.DataFrame(rows), pd.DataFrame(roc_rows), member_scores)


def ci_columns(name: str, est: Estimate) -> dict[str, float]:
    """An estimate as table columns: ``{name: mean, name_lo: lo, name_hi: hi}``."""
    return {name: est.mean, f"{name}_lo": est.lo, f"{name}_hi": est.hi}


def summarize(metrics: pd.DataFrame, by: Sequence[str] = ("attack", "subset")) -> pd.DataFrame:
    """Mean and 95% t-interval over targets of every metric, per group of ``by``.

    Columns ``<metric>``, ``<metric>_lo``, ``<metric>_hi`` and ``n`` (targets with a value).
    """
    rows = []
    cols = [c for c in metrics.columns if c in ("auc", "bal_acc") or c.startswith("tpr@")]
    for key, group in metrics.groupby(list(by), sort=False):
        row = dict(zip(by, key, strict=True))
        for c in cols:
            row.update(ci_columns(c, mean_ci(group[c].to_numpy())))
        row["n"] = int(group[cols[0]].notna().sum()) if cols else 0
        rows.append(row)
    return pd.DataFrame(rows)


def metric_estimate(metrics: pd.DataFrame, attack: str, subset: str = "all",
                    metric: str = "auc") -> Estimate:
    """Mean and 95% t-interval over targets of one metric of one attack on one subset."""
    return mean_ci(target_values(metrics, attack, subset, metric))


def target_values(metrics: pd.DataFrame, attack: str, subset: str, metric: str) -> np.ndarray:
    """One metric's per-target values of one attack on one subset (an error when none)."""
    sel = metrics[(metrics["attack"] == attack) & (metrics["subset"] == subset)][metric]
    if sel.empty:
        raise ValueError(f"no rows for attack {attack!r} on subset {subset!r}")
    return sel.to_numpy()

