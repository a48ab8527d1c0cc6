"""bnmem_utils: the tested helper package behind the bnmem notebooks.

Companion to "Batch Normalization Amplifies Memorization and Privacy Risks" (arXiv 2605.24420).
Notebooks open a context with :func:`start`, then call the submodules (data, models, train,
theory, grads, bank, attacks, regularize) and save figures and key numbers through the context.
"""

from . import threads as _threads

_threads.apply()  # before torch loads: OpenMP reads its wait policy once (see threads.py)

from .device import environment_report, resolve_device, seed_everything  # noqa: E402
from .results import Result  # noqa: E402
from .stats import Estimate, bootstrap_ci, diff_ci, mean_ci  # noqa: E402

__version__ = "0.1.0"

#: The notebook layer (matplotlib, seaborn, the report) loads on first use, so that importing an
#: analysis module (``bnmem_utils.attacks``, ``bnmem_utils.gapmatch``, ...) stays light.
_NOTEBOOK_NAMES = ("NotebookContext", "current", "record", "save_figure", "start")


def __getattr__(name: str):
    if name in _NOTEBOOK_NAMES:
        from . import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Estimate",
    "NotebookContext",
    "Result",
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
