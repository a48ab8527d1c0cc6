"""bnmem_utils: the tested helper package behind the bnmem notebooks.

Companion to "Batch Normalization Amplifies Memorization and Privacy Risks" (arXiv 2605.24420).
The package is layered: each subpackage is one layer, and a module imports only from its own
layer or the ones below it (:data:`LAYERS`, from the bottom up; ``tests/test_layers.py`` reads
the folders and checks every import). Notebooks open a context with :func:`start`, then call the
layers' modules and save figures and key numbers through the context.

Importing the package changes nothing in the process: the thread, wait and allocator policy
(:mod:`bnmem_utils.core.threads`) is applied by the entry points that start processes (the
runner's kernels, ``bnmem lab``, Ray workers).
"""

from bnmem_utils.core.device import environment_report, resolve_device, seed_everything
from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import Estimate, bootstrap_ci, diff_ci, mean_ci

__version__ = "0.1.0"

#: The layers, from the bottom up: each is a subpackage of the same name.
LAYERS = ("core", "models", "data", "training", "privacy", "jobs", "analyses", "figures", "run")

#: The notebook layer (matplotlib, seaborn, the report) loads on first use, so that importing an
#: analysis module (``bnmem_utils.privacy.attacks``, ``bnmem_utils.analyses.matched_gap``, ...)
#: stays light.
_NOTEBOOK_NAMES = ("NotebookContext", "start")


def __getattr__(name: str):
    if name in _NOTEBOOK_NAMES:
        from bnmem_utils.run import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LAYERS",
    "Estimate",
    "NotebookContext",
    "Result",
    "bootstrap_ci",
    "diff_ci",
    "environment_report",
    "mean_ci",
    "resolve_device",
    "seed_everything",
    "start",
]
