"""bnmem_utils: the tested helper package behind the bnmem notebooks.

Companion to "Batch Normalization Amplifies Memorization and Privacy Risks" (arXiv 2605.24420).
Notebooks open a context with :func:`start`, then call the submodules (data, models, train,
theory, grads, bank, attacks, regularize) and save figures and key numbers through the context.
"""

from .device import environment_report, resolve_device, seed_everything
from .notebook import NotebookContext, current, record, save_figure, start
from .stats import Estimate, bootstrap_ci, diff_ci, mean_ci

__version__ = "0.1.0"

__all__ = [
    "Estimate",
    "NotebookContext",
    "bootstrap_ci",
    "current",
    "diff_ci",
    "environment_report",
    "mean_ci",
    "record",
    "resolve_device",
    "save_figure",
    "seed_everything",
    "start",
]
