"""Where things live: the project root, per-profile run and figure folders, caches, data.

Generated outputs never go next to the sources: executed notebooks, results files, figures and
caches go under ``runs/``, downloaded data under ``data/``. The committed ``figures/<profile>/``
holds the published run of each profile, which only ``bnmem reproduce --publish`` replaces.
Every location can be moved with ``out_dir`` (the runner's ``--out``) or the ``BNMEM_ROOT``,
``BNMEM_DATA`` and ``BNMEM_CACHE`` environment variables.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # bnmem_utils/ (this file is in core/)


def project_root() -> Path:
    """The repository root: ``$BNMEM_ROOT``, else the folder above the package holding notebooks/."""
    env = os.environ.get("BNMEM_ROOT")
    if env:
        return Path(env).resolve()
    candidate = _PACKAGE_DIR.parent
    if (candidate / "notebooks").is_dir():
        return candidate
    # A non-editable install: fall back on the working directory, walking up to a checkout.
    cwd = Path.cwd().resolve()
    for folder in (cwd, *cwd.parents):
        if (folder / "notebooks").is_dir() and (folder / "bnmem_utils").is_dir():
            return folder
    return cwd


def notebooks_dir() -> Path:
    """The folder holding the numbered notebooks."""
    return project_root() / "notebooks"


def output_root(out_dir: str | os.PathLike | None = None) -> Path:
    """Root under which runs/ and figures/ are written: ``out_dir`` if given, else the project root."""
    return Path(out_dir).resolve() if out_dir else project_root()


def runs_dir(profile: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Executed notebooks and results files of one profile: ``<root>/runs/<profile>``."""
    return output_root(out_dir) / "runs" / profile


def figures_dir(profile: str, out_dir: str | os.PathLike | None = None) -> Path:
    """A run's figures (PDF, PNG, the CSV behind each, the manifest): ``<root>/runs/<profile>/figures``.
    A reader's run writes here, never over the published folder (:func:`published_dir`)."""
    return runs_dir(profile, out_dir) / "figures"


def published_dir(profile: str, out_dir: str | os.PathLike | None = None) -> Path:
    """The published figures of one profile, the ones the README and docs quote:
    ``<root>/figures/<profile>``, replaced only by ``bnmem reproduce --publish``."""
    return output_root(out_dir) / "figures" / profile


def cache_dir(out_dir: str | os.PathLike | None = None) -> Path:
    """Trained-model and bank caches, shared by all profiles (keys are config hashes)."""
    env = os.environ.get("BNMEM_CACHE")
    return Path(env).expanduser().resolve() if env else output_root(out_dir) / "runs" / "cache"


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Where torchvision data sets are downloaded and converted: ``root``, ``$BNMEM_DATA`` or data/."""
    if root:
        return Path(root).expanduser().resolve()
    env = os.environ.get("BNMEM_DATA")
    return Path(env).expanduser().resolve() if env else project_root() / "data"


#: Environment variables that name folders, made absolute for the notebooks' kernels.
PATH_VARIABLES = ("BNMEM_ROOT", "BNMEM_PROFILES", "BNMEM_DATA", "BNMEM_CACHE")


def absolute_variables() -> dict[str, str]:
    """The :data:`PATH_VARIABLES` that are set, a relative one resolved against the working
    directory: a kernel runs in the project root, where it would mean another folder."""
    return {name: str(Path(os.environ[name]).expanduser().resolve())
            for name in PATH_VARIABLES if os.environ.get(name)}
