"""Where things live: the project root, per-profile run and figure folders, caches, data.

Generated outputs never go next to the sources: executed notebooks, results files and caches go
under ``runs/``, downloaded data under ``data/``, exported figures under ``figures/<profile>/``.
Every location can be moved with ``out_dir`` (the runner's ``--out``) or the ``BNMEM_ROOT``,
``BNMEM_DATA`` and ``BNMEM_CACHE`` environment variables.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


class CacheError(ValueError):
    """A cache file that cannot be trusted (unreadable, truncated, bad checksum, written for
    another configuration): the one error type of every cache of the package (grid runs, bank
    models, gradient norms). The caller retrains what it describes."""


def cache_key(payload: dict, length: int = 20) -> str:
    """The one key rule of every cache: a sha256 of ``payload`` as sorted JSON. Callers put in
    everything that produced a result: the full resolved configuration (defaults included),
    the device type, the code version, the source of registered user code."""
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


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
    """Exported figures of one profile: ``<root>/figures/<profile>``."""
    return output_root(out_dir) / "figures" / profile


def cache_dir(out_dir: str | os.PathLike | None = None) -> Path:
    """Trained-model and bank caches, shared by all profiles (keys are config hashes)."""
    env = os.environ.get("BNMEM_CACHE")
    return Path(env).resolve() if env else output_root(out_dir) / "runs" / "cache"


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Where torchvision data sets are downloaded and converted: ``root``, ``$BNMEM_DATA`` or data/."""
    if root:
        return Path(root).expanduser().resolve()
    env = os.environ.get("BNMEM_DATA")
    return Path(env).expanduser().resolve() if env else project_root() / "data"


def _umask() -> int:
    """The process umask (read by setting it and restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def promote(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename ``src`` over ``dst`` with the usual umask-based mode (mkstemp makes files 0600)."""
    os.chmod(src, 0o666 & ~_umask())
    os.replace(src, dst)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds.

    An interrupted write therefore never leaves a half-written file under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        promote(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
