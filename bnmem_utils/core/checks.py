"""Small checks and labels shared by the configuration classes (banks, grids, gradient runs), and
the error a retry would only repeat."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class PermanentError(RuntimeError):
    """A task failure that a retry would only repeat (e.g. a model whose training diverged):
    executors (:mod:`bnmem_utils.core.executors`) raise it at once; subclass it for such errors of
    your own."""


def check_choice(name: str, value, valid: Iterable) -> None:
    """Raise ``ValueError("unknown <name> <value>; valid choices: ...")`` unless value is valid."""
    valid = tuple(valid)
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(map(str, valid))}")


def pct(rate: float) -> str:
    """A rate as a percentage label: 0.05 -> '5%', 0.025 -> '2.5%'."""
    p = 100 * rate
    return f"{p:.0f}%" if abs(p - round(p)) < 1e-9 else f"{p:g}%"


def corruption_label(flip_rate: float = 0.0, ood_rate: float = 0.0,
                     ood_source: str | None = None) -> str:
    """A corruption setting as a label: ``clean``, ``flip 5%``, ``OOD 2%``, ``OOD 2% (gaussian)``
    when the source is given, or both joined by `` + ``."""
    parts = []
    if flip_rate > 0:
        parts.append(f"flip {pct(flip_rate)}")
    source = f" ({ood_source})" if ood_source else ""
    if ood_rate > 0:
        parts.append(f"OOD {pct(ood_rate)}{source}")
    return " + ".join(parts) or "clean"


def check_registration(kind: str, name: str, fn, *, built_in: Iterable[str],
                       registered: Iterable[str], replace: bool) -> None:
    """The checks of a new registry entry (an architecture, a data set): ``name`` is an
    identifier, not a built-in one, not registered already unless ``replace``; ``fn`` callable."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a {kind} name must be an identifier, got {name!r}")
    if name in set(built_in):
        raise ValueError(f"{name!r} is a built-in {kind}; choose another name")
    if name in set(registered) and not replace:
        raise ValueError(f"{kind} {name!r} is already registered (pass replace=True)")
    if not callable(fn):
        raise TypeError(f"the {kind} {name!r} needs a callable, got {fn!r}")


#: The fewest models of a LiRA bank (and N must be even): :func:`check_n_models`'s rule, which
#: the notebooks' parameters (:mod:`bnmem_utils.run.params`) state too.
MIN_MODELS = 4


def check_n_models(n_models) -> int:
    """N must be an even integer >= :data:`MIN_MODELS`: a balanced keep matrix puts each sample
    in exactly N/2 models, and leave-one-out then leaves every sample at least one IN and one
    OUT shadow."""
    if isinstance(n_models, bool) or int(n_models) != n_models:
        raise ValueError(f"the number of models must be an integer, got {n_models!r}")
    n = int(n_models)
    if n < MIN_MODELS or n % 2:
        raise ValueError(f"the number of models must be even and at least {MIN_MODELS} (each "
                         f"sample in exactly half of them), got {n}")
    return n


def keep_matrix(n_models: int, n_samples: int, seed: int = 0, pairs: bool = False) -> np.ndarray:
    """Balanced membership: bool (N, M), every sample in exactly N/2 models, chosen at random.

    As the reference code: for each sample a random ranking of the models, the first half keep
    it. Each model then holds M/2 samples on average (binomial-like spread of order sqrt(M)/2).
    ``pairs``: models 2i and 2i + 1 train on complementary halves (a coin per pair and sample),
    so that any set of whole pairs holds every sample exactly once per pair.
    """
    n = check_n_models(n_models)
    if int(n_samples) != n_samples or n_samples < 1:
        raise ValueError(f"the number of samples must be a positive integer, got {n_samples!r}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x6B656570]))  # "keep"
    if pairs:
        coin = rng.random((n // 2, int(n_samples))) < 0.5
        return np.stack([coin, ~coin], axis=1).reshape(n, int(n_samples))
    order = rng.random((n, int(n_samples))).argsort(axis=0)  # (N, M) random ranks per sample
    return order < n // 2
