"""Attack quality against the number of shadow models, from one bank: which LiRA to trust at
which N (notebook 04's shadow-count curve, the evidence behind
:func:`bnmem_utils.privacy.attacks.headline_attack`).

For each size N and each of several targets, the target's shadows are N other models of the
bank, drawn at random (seeded per size and target). In a bank of complementary pairs
(:func:`bnmem_utils.core.checks.keep_matrix` with ``pairs=True``) the draw takes N/2 whole pairs,
never the target's own, so every sample has exactly N/2 IN and N/2 OUT shadows; in any other
bank it takes N models and the attacks balance them (:meth:`ShadowSplit.balanced_masks`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from bnmem_utils.privacy.attacks import (
    ATTACKS,
    DEFAULT_FPRS,
    ShadowSplit,
    check_bank,
    roc_metrics,
    summarize,
)

#: How the curve's intervals are made (said in its table and figure).
CURVE_METHOD = ("95% t interval over targets (each its own random shadows; targets share "
                "shadow models, so somewhat optimistic)")


def is_paired(keep: np.ndarray) -> bool:
    """Whether models 2i and 2i + 1 of ``keep`` (N, M) hold complementary halves."""
    return keep.shape[0] % 2 == 0 and bool((keep[0::2] == ~keep[1::2]).all())


def curve_sizes(sizes: Sequence[int], n_models: int, paired: bool) -> list[int]:
    """The shadow counts the bank allows, ascending: sizes above the bank dropped, the bank's
    own size read as every model a target can use (N - 1; N - 2 with pairs, the partner left
    out) and the others kept (even, at least 2)."""
    most = n_models - 2 if paired else n_models - 1
    out = {most if s >= n_models else int(s) for s in sizes if 2 <= s <= n_models}
    return sorted(s for s in out if s <= most)


def _shadows(rng, target: int, size: int, n_models: int, paired: bool) -> np.ndarray:
    """Indices of ``size`` shadow models for ``target``: whole pairs other than its own, or
    any other models."""
    if paired:
        pairs = np.setdiff1d(np.arange(n_models // 2), [target // 2])
        chosen = rng.choice(pairs, size // 2, replace=False)
        return np.sort(np.concatenate([2 * chosen, 2 * chosen + 1]))
    others = np.setdiff1d(np.arange(n_models), [target])
    return np.sort(rng.choice(others, size, replace=False))


def shadow_count_curve(keep, scores, sizes: Sequence[int], attacks: Sequence[str] = tuple(ATTACKS),
                       targets: int = 16, seed: int = 0, population=None,
                       fprs: Sequence[float] = DEFAULT_FPRS) -> pd.DataFrame:
    """AUC and TPR at each FPR of every attack against the number of shadow models N.

    ``keep`` (N_bank, M), ``scores`` (N_bank, M, Q): the bank; ``population`` (N_bank, P, Q):
    its population scores (RMIA; attacks that need them are left out without). ``targets``
    models of the bank, drawn once from ``seed``, are attacked at every size, each with its own
    shadows drawn from ``(seed, size, target)``. One row per (size, attack): ``n_shadows``,
    ``k`` (the fewest IN or OUT shadows a sample is fitted from), ``attack``, each metric's mean with ``_lo``/``_hi``
    (:data:`CURVE_METHOD`), ``n`` (targets), ``design`` (``pairs`` or ``balanced``)."""
    keep, scores = check_bank(keep, scores)
    n_models, paired = keep.shape[0], is_paired(keep)
    attacks = [a for a in attacks if population is not None or not a.startswith("rmia")]
    chosen = np.random.default_rng(seed).choice(n_models, min(targets, n_models), replace=False)
    rows = []
    for size in curve_sizes(sizes, n_models, paired):
        for t in sorted(int(t) for t in chosen):
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), size, t]))
            idx = _shadows(rng, t, size, n_models, paired)
            split = ShadowSplit(keep[idx], scores[idx], scores[t],
                                *(() if population is None else (population[idx], population[t])))
            k = min(int(m.sum(axis=0).min()) for m in split.balanced_masks())   # IN or OUT
            for name in attacks:
                metrics, _ = roc_metrics(keep[t], ATTACKS[name](split), fprs)
                rows.append({"n_shadows": size, "k": k, "attack": name, "target": t, **metrics})
    return summarize_curve(pd.DataFrame(rows), "pairs" if paired else "balanced")


def summarize_curve(per_target: pd.DataFrame, design: str) -> pd.DataFrame:
    """One row per (N, attack) of :func:`shadow_count_curve`'s per-target rows: the intervals of
    :func:`~bnmem_utils.privacy.attacks.summarize` (``n``: the targets with a value), the fewest
    shadows a side ``k`` over the targets, the ``design`` and the interval's method."""
    keys = ["n_shadows", "attack"]
    out = summarize(per_target, keys)
    out.insert(1, "k", per_target.groupby(keys, sort=False).k.min().to_numpy())
    return out.assign(design=design, method=CURVE_METHOD)
