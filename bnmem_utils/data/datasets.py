"""Data sets as normalised tensors on the device, and their corruption (label flips, OOD inserts).

Two halves:

* :func:`load_dataset` returns a :class:`Dataset` of float32 ``(N, C, H, W)`` images, normalised
  per channel, and int64 labels, already on the chosen device, so that the training loop never
  touches a DataLoader. ``digits`` is scikit-learn's bundled set of 1,797 8x8 handwritten digits
  (no download): a fixed stratified 80/20 split (1,437 train / 360 test, split seed 0), pixels
  scaled from 0..16 to [0, 1] and normalised with the training split's mean and std; the CNNs
  see the native 8x8 resolution (the models pad so that 8x8 works; upsampling would cost
  compute without adding information). ``mnist``, ``fashion_mnist``, ``cifar10`` and ``cifar100``
  are found offline (:func:`find_dataset`): ``root=``, ``$BNMEM_DATA``, the project's ``data/``
  (a converted cache or torchvision's own folder, packed or unpacked), then a system package's
  files (Debian's ``dataset-fashion-mnist``: ``/usr/share/datasets/fashion-mnist/``), read and
  checked by :mod:`bnmem_utils.data.files`: whatever is read is verified before first use
  (against Fashion-MNIST's published digest, torchvision's md5 lists), and a data set that
  fails is refused with a :class:`DataIntegrityError` naming the path and the repair. Found
  files are converted once to a uint8 tensor file under the first data folder's ``bnmem/``
  (verified again when read back) and normalised with the usual per-channel constants;
  torchvision downloads only with ``download=True``.
* :func:`corrupt` makes the training set the memorization experiments need: label flips (each
  chosen sample gets a uniformly random *different* label) and out-of-distribution inserts
  (added samples with uniformly random labels), with a per-sample record of what happened
  (:class:`CorruptedSet`: ``kind`` in {CLEAN, FLIPPED, OOD} and the original label).

:func:`load_data` loads the data set a run's description names (its sizes and data seed), and
:func:`dataset_loader` keeps the latest one loaded, for the jobs that train many runs.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.nn import functional as F

from bnmem_utils.core import cache
from bnmem_utils.core.checks import check_choice, check_registration
from bnmem_utils.data import files as datafiles
from bnmem_utils.data.files import (  # noqa: F401 - re-exported: the data API in one place
    IDX_FILES,
    INSTALL_HINTS,
    KNOWN_DIGESTS,
    SYSTEM_FOLDERS,
    DataIntegrityError,
    cache_file,
    first_command,
    read_idx,
    search_roots,
)
from bnmem_utils.models import nets as models

if TYPE_CHECKING:
    from bnmem_utils.jobs.config import RunConfig

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100")
CLEAN, FLIPPED, OOD = 0, 1, 2
KIND_NAMES = {CLEAN: "clean", FLIPPED: "flipped", OOD: "ood"}
NOISE_SOURCES = ("gaussian", "uniform", "shuffled")
"""OOD sources that need no other data set; any other name in :data:`DATASETS` also works."""

# Per-channel mean and std of the training pixels in [0, 1] (the usual published constants).
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
NUM_CLASSES = {"digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100}
DIGITS_SPLIT_SEED = 0
DIGITS_TEST_FRACTION = 0.2


#: Data sets added with :func:`register_dataset`: name -> (loader, normalization or None).
_REGISTERED: dict[str, tuple[Callable[[], Mapping[str, torch.Tensor]],
                             tuple[tuple[float, ...], tuple[float, ...]] | None]] = {}
_BUILT_IN = frozenset(DATASETS)


def register_dataset(name: str, loader: Callable[[], Mapping[str, torch.Tensor]], *,
                     num_classes: int,
                     normalization: tuple[Sequence[float], Sequence[float]] | None = None,
                     replace: bool = False) -> None:
    """Add a data set under ``name``, for every experiment and for the notebooks' parameters.

    ``loader()`` returns ``x_train``, ``y_train``, ``x_test``, ``y_test``: images
    ``(N, C, H, W)`` with pixels in [0, 1] (float) or 0-255 (uint8), and int64 labels in
    ``[0, num_classes)``. ``normalization``: per-channel (mean, std) of the pixels in [0, 1];
    by default measured on the training images. Cached results of a registered data set are
    keyed by the loader's code (:func:`registered_code`: its source and that of the user's
    functions it calls, the constants it reads), ``num_classes`` and ``normalization``, not by
    the files it may read: give changed data a new name. ``replace`` re-registers a name added
    before (a built-in name cannot be replaced).
    """
    global DATASETS
    check_registration("data set", name, loader, built_in=_BUILT_IN, registered=_REGISTERED,
                       replace=replace)
    if int(num_classes) != num_classes or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    norm = None if normalization is None else (tuple(map(float, normalization[0])),
                                               tuple(map(float, normalization[1])))
    _REGISTERED[name] = (loader, norm)
    NUM_CLASSES[name] = int(num_classes)
    DATASETS = tuple(dict.fromkeys((*DATASETS, name)))


def registered_code(*names: str) -> dict:
    """``{"code": {name: digest}}`` for the registered data sets (their loader's code,
    :func:`bnmem_utils.models.nets.source_digest`; number of classes; normalization) and
    architectures among ``names`` (empty for built-ins): the part of a cache key that covers
    user code."""
    code = {}
    for n in dict.fromkeys(names):
        # a data set: its loader's source, and the registration's own values (the classes,
        # the normalization), which change the results as much as the loader does
        digest = ([models.source_digest(_REGISTERED[n][0]), NUM_CLASSES[n], _REGISTERED[n][1]]
                  if n in _REGISTERED else models.code_fingerprint(n))
        if digest is not None:
            code[n] = digest
    return {"code": code} if code else {}


def _registered_raw(name: str) -> tuple[torch.Tensor, ...]:
    """A registered data set's splits as float pixels in [0, 1], checked."""
    loader, _ = _REGISTERED[name]
    parts = loader()
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in parts]
    if missing:
        raise ValueError(f"the loader of data set {name!r} returned no {', '.join(missing)}")
    out = []
    for split in ("train", "test"):
        x, y = torch.as_tensor(parts[f"x_{split}"]), torch.as_tensor(parts[f"y_{split}"])
        if x.dim() != 4 or y.dim() != 1 or len(x) != len(y):
            raise ValueError(f"data set {name!r}: x_{split} must be (N, C, H, W) and y_{split} "
                             f"(N,), got {tuple(x.shape)} and {tuple(y.shape)}")
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        y = y.long()
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= NUM_CLASSES[name]):
            raise ValueError(f"data set {name!r}: labels of {split} outside "
                             f"[0, {NUM_CLASSES[name]})")
        out += [x, y]
    return tuple(out)


@dataclass
class Dataset:
    """A data set as tensors: images normalised per channel, on one device.

    ``x_*`` are float32 ``(N, C, H, W)``; ``y_*`` int64 ``(N,)``. ``mean``/``std`` are the
    per-channel constants that map pixels in [0, 1] to ``x`` (``x = (pixel - mean) / std``).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)

    @property
    def in_channels(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.x_train.shape[-1])

    @property
    def device(self) -> torch.device:
        return self.x_train.device

    @property
    def background(self) -> torch.Tensor:
        """(1, C, 1, 1): a black pixel (0 in [0, 1]) in the normalised space, the background of
        digits and MNIST and the border of CIFAR; what a training or query shift brings in. A
        fixed value: the minimum of a training set with OOD inserts would be the inserts'."""
        mean, std = self._stats(self.x_train)
        return -mean / std

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, len(self.mean), 1, 1)
        mean = torch.tensor(self.mean, dtype=like.dtype, device=like.device).view(shape)
        std = torch.tensor(self.std, dtype=like.dtype, device=like.device).view(shape)
        return mean, std

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """Map pixels in [0, 1], ``(N, C, H, W)``, to this data set's normalised space."""
        mean, std = self._stats(pixels)
        return (pixels - mean) / std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Map normalised images back to pixels in [0, 1]."""
        mean, std = self._stats(x)
        return x * std + mean

    def to(self, device: str | torch.device) -> Dataset:
        """The same data set on another device."""
        return Dataset(self.name, self.x_train.to(device), self.y_train.to(device),
                       self.x_test.to(device), self.y_test.to(device), self.num_classes,
                       self.mean, self.std)

    def __repr__(self) -> str:
        return (f"Dataset({self.name!r}, train={tuple(self.x_train.shape)}, "
                f"test={tuple(self.x_test.shape)}, classes={self.num_classes}, device={self.device})")


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------
def _digits_raw() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as uint8-valued float pixels in [0, 1]: the fixed stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = bunch.images.astype(np.float32) / 16.0          # (1797, 8, 8), 0..16 -> [0, 1]
    labels = bunch.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(labels)), test_size=DIGITS_TEST_FRACTION, random_state=DIGITS_SPLIT_SEED,
        stratify=labels)
    x = torch.from_numpy(images).unsqueeze(1)                 # (1797, 1, 8, 8)
    y = torch.from_numpy(labels)
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]


def find_dataset(name: str, root: str | os.PathLike | None = None) -> str | None:
    """Where :func:`load_dataset` would read ``name`` from without a download, or None.

    Cheap (file names only): ``"embedded"`` for digits, ``"registered"`` for a registered set,
    else ``"cache:<path>"``, ``"torchvision:<folder>"`` or ``"system:<folder>"``, following the
    search order (:mod:`bnmem_utils.data.files`).
    """
    check_choice("data set", name, DATASETS)
    if name == "digits":
        return "embedded"
    if name in _REGISTERED:
        return "registered"
    return next((f"{how}:{where}" for how, where in datafiles.sources(
        name, datafiles.search_roots(root))), None)


@functools.cache
def _digits_digest() -> str:
    return cache.digest(dict(zip(("x_train", "y_train", "x_test", "y_test"), _digits_raw(),
                                 strict=True)))


def data_digest(name: str, root: str | os.PathLike | None = None) -> str | None:
    """The digest of the data a run of ``name`` reads, for its cache key: digits' tensors
    (computed once per process), the verified digest of a torchvision set
    (:func:`bnmem_utils.data.files.data_digest`), None for a registered set (its loader's code
    is in the key instead, :func:`registered_code`) or a set found nowhere."""
    if name == "digits":
        return _digits_digest()
    if name in _REGISTERED:
        return None
    return datafiles.data_digest(name, root)

def _subsample(x: torch.Tensor, y: torch.Tensor, size: int | None, gen: torch.Generator,
               what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if size is None:
        return x, y
    if not (isinstance(size, int | np.integer) and 0 < size <= len(y)):
        raise ValueError(f"{what} must be an integer in [1, {len(y)}], got {size!r}")
    idx = torch.randperm(len(y), generator=gen)[:size]
    return x[idx], y[idx]


def load_dataset(name: str, *, root: str | os.PathLike | None = None,
                 device: str | torch.device = "cpu", download: bool = False,
                 train_size: int | None = None, test_size: int | None = None,
                 seed: int = 0) -> Dataset:
    """Load ``name`` (one of :data:`DATASETS`) as normalised tensors on ``device``.

    ``train_size``/``test_size`` keep a random subset (chosen with ``seed``) of each split; the
    split itself is fixed (for digits: stratified 80/20 with seed 0), so every experiment sees
    the same test set. The other sets are found offline as :func:`find_dataset` says; found
    nowhere and with ``download=False``, a FileNotFoundError names the folders searched and
    every way to get the files.
    """
    check_choice("data set", name, DATASETS)
    if name == "digits":
        x_tr, y_tr, x_te, y_te = _digits_raw()                # pixels in [0, 1]
        mean = (float(x_tr.mean()),)
        std = (float(x_tr.std()),)
    elif name in _REGISTERED:
        x_tr, y_tr, x_te, y_te = _registered_raw(name)
        mean, std = _REGISTERED[name][1] or (
            tuple(float(v) for v in x_tr.mean(dim=(0, 2, 3))),
            tuple(float(v) for v in x_tr.std(dim=(0, 2, 3))))
    else:
        parts, _ = datafiles.load_files(name, root, download)
        x_tr, y_tr = parts["x_train"].float() / 255.0, parts["y_train"]
        x_te, y_te = parts["x_test"].float() / 255.0, parts["y_test"]
        mean, std = NORMALIZATION[name]
    gen = torch.Generator().manual_seed(int(seed))
    x_tr, y_tr = _subsample(x_tr, y_tr, train_size, gen, "train_size")
    x_te, y_te = _subsample(x_te, y_te, test_size, gen, "test_size")
    ds = Dataset(name, x_tr, y_tr, x_te, y_te, NUM_CLASSES[name], tuple(mean), tuple(std))
    ds.x_train, ds.x_test = ds.normalize(x_tr), ds.normalize(x_te)
    return ds.to(device)


# ----------------------------------------------------------------------------------------------
# Corruption
# ----------------------------------------------------------------------------------------------
@dataclass
class CorruptedSet:
    """A training set after corruption, with a per-sample record.

    ``x``/``y``: the images and the labels trained on (flipped or random for corrupted samples);
    ``kind``: ``(n,)`` int64 in {CLEAN, FLIPPED, OOD}; ``orig_y``: the original label (-1 for OOD
    inserts). Flipped samples keep their position; OOD inserts are appended after the originals.
    """

    x: torch.Tensor
    y: torch.Tensor
    kind: torch.Tensor
    orig_y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def groups(self) -> dict[str, torch.Tensor]:
        """Boolean masks ``{"clean", "flipped", "ood"}`` over the samples; empty groups are left out."""
        masks = {name: self.kind == code for code, name in KIND_NAMES.items()}
        return {name: mask for name, mask in masks.items() if bool(mask.any())}


def _stream_seed(seed: int, stream: int) -> int:
    """An independent 63-bit seed for random stream ``stream`` of ``seed`` (NumPy SeedSequence)."""
    return int(np.random.SeedSequence([int(seed), stream]).generate_state(1, np.uint64)[0] >> 1)


def _generator(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(_stream_seed(seed, stream))


def _check_rate(value: float, what: str) -> float:
    if not isinstance(value, int | float | np.floating) or not (0.0 <= float(value) < 1.0):
        raise ValueError(f"{what} must be in [0, 1), got {value!r}")
    return float(value)


def check_ood_source(source: str, target: str) -> None:
    """Raise a clear error unless ``source`` is a valid OOD source for the data set ``target``:
    a noise source or another data set."""
    valid = NOISE_SOURCES + tuple(d for d in DATASETS if d != target)
    if source not in valid:
        hint = " (it is the data set being corrupted)" if source == target else ""
        raise ValueError(f"unknown OOD source {source!r}{hint} for {target!r}; valid choices: "
                         f"{', '.join(valid)}")


def _to_target_pixels(pixels: torch.Tensor, channels: int, size: int) -> torch.Tensor:
    """Match another data set's pixels ``(K, C', H', W')`` in [0, 1] to ``channels`` x ``size``."""
    if pixels.shape[1] != channels:
        if channels == 1:       # RGB -> luminance (ITU-R 601 weights)
            w = torch.tensor([0.299, 0.587, 0.114], dtype=pixels.dtype, device=pixels.device)
            pixels = (pixels * w.view(1, 3, 1, 1)).sum(1, keepdim=True)
        else:                   # grey -> repeated channels
            pixels = pixels.mean(1, keepdim=True).expand(-1, channels, -1, -1)
    if pixels.shape[-2:] != (size, size):
        pixels = F.interpolate(pixels, size=(size, size), mode="bilinear", align_corners=False,
                               antialias=True)
    return pixels.clamp(0.0, 1.0).contiguous()


def _pick(n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` indices into ``n`` images: distinct when ``count <= n``, else with repeats."""
    if count <= n:
        return torch.randperm(n, generator=gen)[:count]
    return torch.randint(0, n, (count,), generator=gen)


def ood_images(ds: Dataset, count: int, source: str, *, root: str | os.PathLike | None = None,
               seed: int = 0) -> torch.Tensor:
    """``count`` OOD images shaped and normalised like ``ds``'s training images, on its device.

    Sources: ``gaussian``: N(0, 1) per pixel in the normalised space (noise with the data set's
    per-channel pixel mean and std); ``uniform``: pixels uniform in [0, 1], then normalised;
    ``shuffled``: training images whose pixel positions are permuted at random (one permutation per
    image, shared by its channels: the intensity histogram stays, the shape goes); any other name in
    :data:`DATASETS`: that data set's training images (grey<->RGB converted, resized bilinearly to
    the target size), normalised like ``ds``.
    """
    check_ood_source(source, ds.name)
    c, s = ds.in_channels, ds.image_size
    gen = torch.Generator().manual_seed(int(seed))
    if count == 0:
        return ds.x_train.new_empty((0, c, s, s))
    if source == "gaussian":
        return torch.randn((count, c, s, s), generator=gen).to(ds.device)
    if source == "uniform":
        return ds.normalize(torch.rand((count, c, s, s), generator=gen)).to(ds.device)
    if source == "shuffled":
        pick = _pick(ds.x_train.shape[0], count, gen)
        perm = torch.argsort(torch.rand((count, s * s), generator=gen), dim=1)  # (K, H*W)
        flat = ds.x_train[pick.to(ds.device)].flatten(2)                      # (K, C, H*W)
        idx = perm.to(ds.device).unsqueeze(1).expand(-1, c, -1)
        return flat.gather(2, idx).view(count, c, s, s)
    try:
        other = load_dataset(source, root=root, device="cpu")
    except FileNotFoundError as err:
        extra = (" digits has no second embedded data set, so an OOD data set for it must be "
                 "fetched first; or use one of: " + ", ".join(NOISE_SOURCES)) if ds.name == "digits" else \
            " Or use one of the noise sources: " + ", ".join(NOISE_SOURCES)
        raise FileNotFoundError(f"OOD source {source!r} cannot be loaded: {err}{extra}") from err
    pick = _pick(other.x_train.shape[0], count, gen)
    pixels = _to_target_pixels(other.denormalize(other.x_train[pick]), c, s)
    return ds.normalize(pixels.to(ds.device))


def corrupt(ds: Dataset, *, flip_rate: float = 0.0, ood_rate: float = 0.0,
            ood_source: str = "gaussian",
            root: str | os.PathLike | None = None, seed: int = 0) -> CorruptedSet:
    """Corrupt ``ds``'s training set: flip labels and/or insert OOD samples, seeded.

    * ``flip_rate``: ``round(flip_rate * n)`` samples (chosen at random) each get a uniformly
      random label different from their own.
    * ``ood_rate``: ``round(ood_rate * n)`` OOD images from ``ood_source`` (see
      :func:`ood_images`) are appended, each with a uniformly random label.

    Flips and inserts use independent random streams derived from ``seed``: changing the OOD
    settings leaves the flipped samples the same. Everything stays on ``ds``'s device.
    """
    flip_rate = _check_rate(flip_rate, "flip_rate")
    ood_rate = _check_rate(ood_rate, "ood_rate")
    check_ood_source(ood_source, ds.name)
    n, k = int(ds.y_train.shape[0]), ds.num_classes
    n_ood = round(ood_rate * n)

    g_flip, g_ood = _generator(seed, 1), _generator(seed, 2)
    y = ds.y_train.cpu().clone()
    kind = torch.full((n,), CLEAN, dtype=torch.int64)
    n_flip = round(flip_rate * n)
    if n_flip:
        idx = torch.randperm(n, generator=g_flip)[:n_flip]
        shift = torch.randint(1, k, (n_flip,), generator=g_flip)  # 1..k-1: never the same label
        y[idx] = (y[idx] + shift) % k
        kind[idx] = FLIPPED
    orig_y = ds.y_train.cpu().clone()
    x = ds.x_train
    if n_ood:
        x_ood = ood_images(ds, n_ood, ood_source, root=root, seed=_stream_seed(seed, 3))
        y_ood = torch.randint(0, k, (n_ood,), generator=g_ood)
        x = torch.cat([x, x_ood], 0)
        y = torch.cat([y, y_ood])
        kind = torch.cat([kind, torch.full((n_ood,), OOD, dtype=torch.int64)])
        orig_y = torch.cat([orig_y, torch.full((n_ood,), -1, dtype=torch.int64)])
    dev = ds.device
    return CorruptedSet(x, y.to(dev), kind.to(dev), orig_y.to(dev))


#: A function from a run's description to its data set (:func:`dataset_loader`).
DataLoader = Callable[["RunConfig"], Dataset]


def load_data(config: RunConfig, device: str | torch.device, *, root=None, download: bool = False):
    """The data set ``config`` trains on (its name, sizes and data seed), on ``device``."""
    return load_dataset(config.data.dataset, root=root, device=device, download=download,
                        train_size=config.data.train_size, test_size=config.data.test_size, seed=config.data.seed)


def dataset_loader(device: torch.device, root=None, download: bool = False) -> DataLoader:
    """A loader that keeps the data set of the latest data key only (one load per data set)."""
    held: dict = {}

    def load(config: RunConfig):
        if config.data not in held:
            held.clear()  # free the previous data set (GPU memory) before loading the next
            held[config.data] = load_data(config, device, root=root, download=download)
        return held[config.data]

    return load


def dataset_available(name: str, root: str | os.PathLike | None = None) -> bool:
    """True when ``name`` can be loaded without a download (:func:`find_dataset` finds it): a
    cheap check for the runner, before any kernel starts; the loader stays the judge."""
    return find_dataset(name, root) is not None
