"""RMIA (Zarifzadeh, Liu and Shokri, ICML 2024) on a shadow-model bank: the membership attack
that compares the target's probability of a sample with a population's, each relative to the
reference (shadow) models'. It reads a :class:`bnmem_utils.privacy.attacks.ShadowSplit` (the
shadows, the target and the population), whose registry of attacks names it ``rmia`` and
``rmia_offline``; plain NumPy/SciPy on its arrays.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit


def _denominator(p_ref: np.ndarray, in_mask: np.ndarray | None, out_mask: np.ndarray | None,
                 offline: bool, a: float) -> np.ndarray:
    """Pr(x) from reference probabilities (S, M): the mean over the IN and OUT reference models
    (online), or over the OUT models with the linear correction ``((1 + a) Pr_out + (1 - a))/2``
    (offline). Masks of None mean every model is OUT (population samples)."""
    out = out_mask if out_mask is not None else np.ones_like(p_ref, dtype=bool)
    if not offline:
        use = out if in_mask is None else (in_mask | out)
        return np.where(use, p_ref, 0.0).sum(axis=0) / use.sum(axis=0)
    n_out = out.sum(axis=0)
    if (n_out == 0).any():
        raise ValueError("offline RMIA needs at least one OUT reference model per sample")
    p_out = np.where(out, p_ref, 0.0).sum(axis=0) / n_out
    return 0.5 * ((1 + a) * p_out + (1 - a))


def rmia(split, *, gamma: float = 1.0, offline: bool = False, a: float = 0.3) -> np.ndarray:
    """RMIA (Zarifzadeh, Liu and Shokri, "Low-Cost High-Power Membership Inference Attacks",
    ICML 2024): the fraction of population samples z that x dominates. ``split``: a
    :class:`~bnmem_utils.privacy.attacks.ShadowSplit` with its population.

    With Pr(x | theta) the target's softmax probability of the (training) label, averaged over
    the Q queries (recovered from the LiRA score as ``sigmoid(s)``):

        LR(x, z) = [Pr(x | theta) / Pr(x)] / [Pr(z | theta) / Pr(z)]
        score(x) = fraction of z in the population with LR(x, z) >= gamma

    Pr(x) is the mean of Pr(x | theta') over the reference (shadow) models. Online (default):
    over the shadows, in and out, in the same numbers for every x
    (``ShadowSplit.balanced_masks``; otherwise the IN/OUT mix would reveal membership).
    ``offline=True``: over the OUT shadows only, corrected linearly to
    ``((1 + a) Pr_out(x) + (1 - a)) / 2`` (the paper's offline approximation of the missing IN
    models); Pr(z) takes the same form (z is out for every model). The population is
    ``split.pop_scores`` / ``split.pop_target``: samples no model trained on (e.g. test data).
    Defaults gamma = 1, a = 0.3 (the paper's and privacy-meter's defaults for small models).
    Ties: the score takes P + 1 values, so TPR at FPR below 1/P is coarse. Returns (M,).
    """
    if split.pop_scores is None:
        raise ValueError("RMIA needs population scores (samples no model trained on): pass "
                         "pop_scores and pop_target, e.g. population= in evaluate_leave_one_out")
    if gamma <= 0:
        raise ValueError(f"gamma must be positive, got {gamma}")
    if not 0 <= a <= 1:
        raise ValueError(f"the offline correction a must lie in [0, 1], got {a}")
    p_x_ref = expit(split.scores).mean(axis=2)  # (S, M)
    p_x = expit(split.target).mean(axis=1)  # (M,)
    p_z_ref = expit(split.pop_scores).mean(axis=2)  # (S, P)
    p_z = expit(split.pop_target).mean(axis=1)  # (P,)
    in_mask, out_mask = split.balanced_masks()  # same IN/OUT mix for every x (see there)
    ratio_x = p_x / _denominator(p_x_ref, in_mask, out_mask, offline, a)  # (M,)
    ratio_z = p_z / _denominator(p_z_ref, None, None, offline, a)  # (P,)
    ratio_z = np.sort(ratio_z)
    # LR(x, z) >= gamma  <=>  ratio_z <= ratio_x / gamma: count with one binary search per x.
    return np.searchsorted(ratio_z, ratio_x / gamma, side="right") / ratio_z.size  # (M,)
