"""Loader shapes and normalisation, corruption records, seeding, and bad-input errors."""

from __future__ import annotations

import pytest
import torch
from fake_data import accept_fake, fake_cifar, fake_mnist, without_reference, write_idx

from bnmem_utils.data.datasets import (
    CLEAN,
    FLIPPED,
    OOD,
    corrupt,
    load_dataset,
    ood_images,
)


def test_digits_shapes_and_normalisation(digits):
    assert digits.x_train.shape == (1437, 1, 8, 8) and digits.x_test.shape == (360, 1, 8, 8)
    assert digits.y_train.dtype == torch.int64 and digits.x_train.dtype == torch.float32
    assert (digits.in_channels, digits.image_size, digits.num_classes) == (1, 8, 10)
    assert abs(float(digits.x_train.mean())) < 1e-5 and abs(float(digits.x_train.std()) - 1) < 1e-3
    # Stratified split: every class has 35-37 test images.
    counts = torch.bincount(digits.y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    # Pixels round-trip to [0, 1] in sixteenths.
    pixels = digits.denormalize(digits.x_train) * 16
    assert torch.allclose(pixels, pixels.round(), atol=1e-4) and pixels.min() > -1e-4


def test_digits_split_fixed_subsample_seeded(digits):
    again = load_dataset("digits")
    assert torch.equal(again.x_test, digits.x_test)
    a = load_dataset("digits", train_size=100, test_size=50, seed=3)
    b = load_dataset("digits", train_size=100, test_size=50, seed=3)
    c = load_dataset("digits", train_size=100, seed=4)
    assert a.x_train.shape[0] == 100 and a.x_test.shape[0] == 50
    assert torch.equal(a.y_train, b.y_train) and not torch.equal(a.y_train, c.y_train)


def test_label_flips(digits):
    cs = corrupt(digits, flip_rate=0.1, seed=0)
    n = len(digits.y_train)
    flipped = cs.kind == FLIPPED
    assert int(flipped.sum()) == round(0.1 * n) and len(cs) == n
    assert (cs.y[flipped] != cs.orig_y[flipped]).all()           # always a *different* label
    assert torch.equal(cs.y[~flipped], digits.y_train[~flipped])
    assert torch.equal(cs.orig_y, digits.y_train) and torch.equal(cs.x, digits.x_train)
    assert set(cs.groups()) == {"clean", "flipped"}
    # New labels are spread over the other classes, not a fixed permutation.
    shift = (cs.y[flipped] - cs.orig_y[flipped]) % 10
    assert len(shift.unique()) == 9


@pytest.mark.parametrize("source", ["gaussian", "uniform", "shuffled"])
def test_ood_inserts(digits, source):
    cs = corrupt(digits, ood_rate=0.02, ood_source=source, seed=1)
    n = len(digits.y_train)
    m = round(0.02 * n)
    assert m > 0 and len(cs) == n + m and cs.x.shape[1:] == digits.x_train.shape[1:]
    assert (cs.kind[n:] == OOD).all() and (cs.kind[:n] == CLEAN).all()
    assert (cs.orig_y[n:] == -1).all() and cs.y[n:].min() >= 0 and cs.y[n:].max() < 10
    assert torch.isfinite(cs.x).all()
    assert set(cs.groups()) == {"clean", "ood"}


def test_shuffled_keeps_pixel_values(digits):
    x = ood_images(digits, 5, "shuffled", seed=2)
    # Each shuffled image is a permutation of some training image's pixels.
    for img in x:
        sorted_img = img.flatten().sort().values
        assert (digits.x_train.flatten(1).sort(1).values - sorted_img).abs().sum(1).min() < 1e-5


def test_corrupt_combined_and_seeded(digits):
    a = corrupt(digits, flip_rate=0.05, ood_rate=0.01, seed=7)
    b = corrupt(digits, flip_rate=0.05, ood_rate=0.01, seed=7)
    c = corrupt(digits, flip_rate=0.05, ood_rate=0.01, seed=8)
    d = corrupt(digits, flip_rate=0.05, ood_rate=0.02, seed=7)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.kind, b.kind)
    assert not torch.equal(a.kind, c.kind)
    # The flips do not depend on the OOD settings.
    n = len(digits.y_train)
    assert torch.equal(a.kind[:n], d.kind[:n]) and torch.equal(a.y[:n], d.y[:n])
    assert set(a.groups()) == {"clean", "flipped", "ood"}
    assert int((a.kind != CLEAN).sum()) == round(0.05 * n) + round(0.01 * n)


def test_bad_input(digits, tmp_path, monkeypatch):
    monkeypatch.delenv("BNMEM_DATA", raising=False)
    with pytest.raises(ValueError, match=r"unknown data set 'svhn'.*digits, mnist"):
        load_dataset("svhn")
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=rf"flip_rate must be in \[0, 1\), got {bad}"):
            corrupt(digits, flip_rate=bad)
        with pytest.raises(ValueError, match=r"ood_rate must be in \[0, 1\)"):
            corrupt(digits, ood_rate=bad)
    with pytest.raises(ValueError, match=r"unknown OOD source 'noise'.*gaussian, uniform, shuffled"):
        corrupt(digits, ood_rate=0.01, ood_source="noise")
    with pytest.raises(ValueError, match=r"unknown OOD source 'digits' \(it is the data set"):
        corrupt(digits, ood_rate=0.01, ood_source="digits")
    with pytest.raises(FileNotFoundError, match=r"(?s)cannot be loaded.*digits has no second embedded"):
        corrupt(digits, ood_rate=0.01, ood_source="cifar100", root=tmp_path)
    with pytest.raises(ValueError, match=r"train_size must be an integer in \[1, 1437\]"):
        load_dataset("digits", train_size=5000)


def test_missing_torchvision_set_says_how_to_fetch(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("cifar10", root=tmp_path)
    msg = str(info.value)
    assert str(tmp_path) in msg and "torchvision.datasets.CIFAR10" in msg and "download=True" in msg


# ----------------------------------------------------------------------------------------------
# torchvision paths, offline: tiny files in torchvision's own on-disk formats, read through the
# real torchvision classes and our conversion cache.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_format_round_trip(tmp_path, monkeypatch, name, folder):
    from bnmem_utils.data.datasets import NORMALIZATION, cache_file

    raw = fake_mnist(tmp_path, folder)
    accept_fake(monkeypatch, raw, name=name)      # not the published data set: accepted by name
    ds = load_dataset(name, root=tmp_path)
    assert ds.x_train.shape == (20, 1, 28, 28) and ds.x_test.shape == (10, 1, 28, 28)
    assert (ds.in_channels, ds.image_size, ds.num_classes) == (1, 28, 10)
    assert ds.mean == NORMALIZATION[name][0]
    pixels = (ds.denormalize(ds.x_train) * 255).round().to(torch.uint8)
    assert torch.equal(pixels[:, 0], torch.from_numpy(raw["train"][0]))
    assert torch.equal(ds.y_test, torch.from_numpy(raw["t10k"][1]).long())
    # Converted once: the cache alone serves the next load.
    assert cache_file(name, tmp_path).exists()
    for f in (tmp_path / folder / "raw").iterdir():
        f.unlink()
    again = load_dataset(name, root=tmp_path)
    assert torch.equal(again.x_train, ds.x_train) and torch.equal(again.y_train, ds.y_train)


@pytest.mark.parametrize("damage", ["garbage", "flip_byte"])
def test_corrupted_cache_is_rebuilt(tmp_path, monkeypatch, damage):
    from bnmem_utils.data.datasets import cache_file

    without_reference(monkeypatch)
    fake_mnist(tmp_path)
    good = load_dataset("mnist", root=tmp_path)
    path = cache_file("mnist", tmp_path)
    blob = bytearray(path.read_bytes())
    if damage == "garbage":
        blob = b"not a torch file"
    else:                                     # one byte inside the image data
        blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.warns(UserWarning, match="corrupted or stale"):
        rebuilt = load_dataset("mnist", root=tmp_path)
    assert torch.equal(rebuilt.x_train, good.x_train)
    load_dataset("mnist", root=tmp_path)      # the rebuilt cache reads back without a warning


@pytest.mark.parametrize("hundred", [False, True])
def test_cifar_format_round_trip(tmp_path, monkeypatch, hundred):
    import numpy as np

    raw = fake_cifar(tmp_path, monkeypatch, hundred=hundred)
    name = "cifar100" if hundred else "cifar10"
    ds = load_dataset(name, root=tmp_path, train_size=5, seed=1)
    assert len(raw["train"][1]) == (6 if hundred else 30)       # 1 or 5 training batch files
    assert ds.x_train.shape == (5, 3, 32, 32) and ds.x_test.shape == (6, 3, 32, 32)
    assert ds.num_classes == (100 if hundred else 10) and len(ds.mean) == 3
    full = load_dataset(name, root=tmp_path)
    pixels = (full.denormalize(full.x_train) * 255).round().to(torch.uint8)      # (N, 3, 32, 32)
    expect = torch.from_numpy(raw["train"][0].reshape(-1, 3, 32, 32))
    assert torch.equal(pixels, expect)
    assert full.y_train.tolist() == raw["train"][1]
    assert np.array_equal(full.y_test.numpy(), raw["test"][1])


def test_ood_from_another_data_set(tmp_path, monkeypatch, digits):
    accept_fake(monkeypatch, fake_mnist(tmp_path, "MNIST", seed=1), name="mnist")
    accept_fake(monkeypatch, fake_mnist(tmp_path, "FashionMNIST", n_train=15, seed=2))
    fake_cifar(tmp_path, monkeypatch, hundred=False, seed=3)
    fake_cifar(tmp_path, monkeypatch, hundred=True, seed=4)
    mnist = load_dataset("mnist", root=tmp_path)
    cs = corrupt(mnist, ood_rate=0.4, ood_source="fashion_mnist", root=tmp_path, seed=0)  # 8
    assert cs.x.shape == (28, 1, 28, 28) and (cs.kind[20:] == OOD).all()
    fashion = load_dataset("fashion_mnist", root=tmp_path)
    # Normalised like MNIST: back in pixel space they are Fashion-MNIST training images.
    pix = (mnist.denormalize(cs.x[20:]) * 255).round()
    ref = (fashion.denormalize(fashion.x_train) * 255).round()
    assert all((ref - p).abs().flatten(1).sum(1).min() < 1e-3 for p in pix)
    c10 = load_dataset("cifar10", root=tmp_path)
    cs10 = corrupt(c10, ood_rate=0.14, ood_source="cifar100", root=tmp_path)  # 4
    assert cs10.x.shape == (34, 3, 32, 32) and torch.isfinite(cs10.x).all()
    # Grey into RGB and 28x28 into 8x8 are converted.
    x = ood_images(c10, 3, "mnist", root=tmp_path)
    assert x.shape == (3, 3, 32, 32) and torch.allclose(x[:, 0] * c10.std[0] + c10.mean[0],
                                                        x[:, 1] * c10.std[1] + c10.mean[1], atol=1e-5)
    small = corrupt(digits, ood_rate=0.004, ood_source="mnist", root=tmp_path)
    assert small.x.shape[1:] == (1, 8, 8)
    assert len(small) == len(digits.y_train) + round(0.004 * len(digits.y_train)) > len(digits.y_train)


# ----------------------------------------------------------------------------------------------
# Finding a data set offline: root=, $BNMEM_DATA, data/, then a system package's gzip IDX files.
# ----------------------------------------------------------------------------------------------
def _fake_system_folder(folder, n_train=30, n_test=10, seed=5):
    """Fashion-MNIST's four files as Debian's dataset-fashion-mnist installs them: gzip IDX."""
    import gzip

    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            raw = folder / f"{prefix}-{kind}-ubyte"
            write_idx(raw, array)
            (folder / f"{raw.name}.gz").write_bytes(gzip.compress(raw.read_bytes()))
            raw.unlink()
        arrays[prefix] = (images, labels)
    return arrays


@pytest.fixture
def isolated_roots(tmp_path, monkeypatch):
    """No $BNMEM_DATA, a project data/ folder in tmp, and an empty system folder."""
    from bnmem_utils.data import files as datafiles

    monkeypatch.delenv("BNMEM_DATA", raising=False)
    monkeypatch.delenv("BNMEM_DATA_DIGESTS", raising=False)
    monkeypatch.setattr(datafiles, "project_root", lambda: tmp_path / "project")
    monkeypatch.setattr(datafiles, "SYSTEM_FOLDERS", {"fashion_mnist": (tmp_path / "system",)})
    return tmp_path


def test_search_order_root_env_project_system(isolated_roots, monkeypatch):
    from bnmem_utils.data import datasets as data

    tmp = isolated_roots
    arrays = _fake_system_folder(tmp / "system")
    assert data.find_dataset("fashion_mnist") == f"system:{tmp / 'system'}"
    fake_mnist(tmp / "project" / "data", "FashionMNIST", seed=1)
    assert data.find_dataset("fashion_mnist") == f"torchvision:{tmp / 'project' / 'data'}"
    fake_mnist(tmp / "env", "FashionMNIST", seed=2)
    monkeypatch.setenv("BNMEM_DATA", str(tmp / "env"))
    assert data.find_dataset("fashion_mnist") == f"torchvision:{tmp / 'env'}"
    accept_fake(monkeypatch, fake_mnist(tmp / "given", "FashionMNIST", seed=3))
    assert data.find_dataset("fashion_mnist", root=tmp / "given") == f"torchvision:{tmp / 'given'}"
    # Each route gives its own files' content.
    ds = data.load_dataset("fashion_mnist", root=tmp / "given")
    assert ds.x_train.shape == (20, 1, 28, 28)
    monkeypatch.delenv("BNMEM_DATA")
    for f in (tmp / "project" / "data" / "FashionMNIST" / "raw").iterdir():
        f.unlink()
    accept_fake(monkeypatch, arrays)
    sys_ds = data.load_dataset("fashion_mnist")
    pixels = (sys_ds.denormalize(sys_ds.x_train) * 255).round().to(torch.uint8)
    assert torch.equal(pixels[:, 0], torch.from_numpy(arrays["train"][0]))
    assert sys_ds.x_test.shape == (10, 1, 28, 28)
    # Converted once into the first data folder's cache, which serves the next load.
    assert data.find_dataset("fashion_mnist") == \
        f"cache:{tmp / 'project' / 'data' / 'bnmem' / 'fashion_mnist.pt'}"
    assert torch.equal(data.load_dataset("fashion_mnist").x_train, sys_ds.x_train)
    assert data.find_dataset("digits") == "embedded" and data.find_dataset("mnist") is None


def test_system_files_are_verified(isolated_roots, monkeypatch):
    from bnmem_utils.data import datasets as data

    _fake_system_folder(isolated_roots / "system")
    with pytest.raises(data.DataIntegrityError, match="does not hold the expected data set"):
        data.load_dataset("fashion_mnist")                  # the real digest: fakes are refused
    assert not (isolated_roots / "project" / "data" / "bnmem" / "fashion_mnist.pt").exists()


def test_truncated_idx_file_is_refused(tmp_path):
    import gzip

    from bnmem_utils.data.datasets import read_idx

    write_idx(tmp_path / "x", torch.zeros(4, 3, 3, dtype=torch.uint8).numpy())
    (tmp_path / "x.gz").write_bytes(gzip.compress((tmp_path / "x").read_bytes()[:-5]))
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "x.gz")
    (tmp_path / "y").write_bytes(b"\x00\x00\x0d\x01" + bytes(8))
    with pytest.raises(ValueError, match="not an unsigned-byte IDX"):
        read_idx(tmp_path / "y")
    assert read_idx(tmp_path / "x").shape == (4, 3, 3)


def test_found_nowhere_names_every_route(isolated_roots):
    from bnmem_utils.data.datasets import load_dataset

    with pytest.raises(FileNotFoundError) as info:
        load_dataset("fashion_mnist")
    msg = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in msg and "download=True" in msg
    assert str(isolated_roots / "system") in msg and str(isolated_roots / "project" / "data") in msg
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("mnist")
    assert "apt-get" not in str(info.value) and "torchvision.datasets.MNIST" in str(info.value)


# ----------------------------------------------------------------------------------------------
# One integrity rule for every route: packed or unpacked, torchvision's layout or the system
# folder, original files or the converted cache; what fails is refused in one line.
# ----------------------------------------------------------------------------------------------
def _refused(call, *needles):
    """The DataIntegrityError of ``call``: one line, naming each of ``needles``."""
    from bnmem_utils.data.datasets import DataIntegrityError

    with pytest.raises(DataIntegrityError) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert str(needle) in msg, (needle, msg)
    return msg


def _pack(raw):
    """gzip the four files of a raw folder in place (torchvision's download leaves them so)."""
    import gzip

    for f in list(raw.iterdir()):
        (raw / f"{f.name}.gz").write_bytes(gzip.compress(f.read_bytes()))
        f.unlink()


def test_packed_files_in_torchvisions_layout_are_found(isolated_roots, monkeypatch):
    from bnmem_utils.data import datasets as data

    env = isolated_roots / "env"
    arrays = fake_mnist(env, "FashionMNIST", seed=7)
    _pack(env / "FashionMNIST" / "raw")
    monkeypatch.setenv("BNMEM_DATA", str(env))
    assert data.find_dataset("fashion_mnist") == f"torchvision:{env}"
    accept_fake(monkeypatch, arrays)
    ds = data.load_dataset("fashion_mnist")
    pixels = (ds.denormalize(ds.x_train) * 255).round().to(torch.uint8)
    assert torch.equal(pixels[:, 0], torch.from_numpy(arrays["train"][0]))


@pytest.mark.parametrize("packed", [False, True])
def test_changed_files_in_torchvisions_layout_are_refused(isolated_roots, monkeypatch, packed):
    """Files that are not the published Fashion-MNIST are refused, packed or not, and nothing
    is converted from them."""
    from bnmem_utils.data import datasets as data

    env = isolated_roots / "env"
    fake_mnist(env, "FashionMNIST", seed=8)
    if packed:
        _pack(env / "FashionMNIST" / "raw")
    monkeypatch.setenv("BNMEM_DATA", str(env))
    _refused(lambda: data.load_dataset("fashion_mnist"), env / "FashionMNIST" / "raw",
             f"expected {data.KNOWN_DIGESTS['fashion_mnist']}", "BNMEM_DATA_DIGESTS=fashion_mnist=")
    assert not (env / "bnmem" / "fashion_mnist.pt").exists()


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
@pytest.mark.parametrize("packed", [False, True])
def test_random_bytes_are_refused_with_their_path(tmp_path, name, folder, packed):
    raw = tmp_path / folder / "raw"
    fake_mnist(tmp_path, folder)
    bad = raw / "train-labels-idx1-ubyte"
    bad.write_bytes(torch.randint(0, 256, (300,), dtype=torch.uint8, generator=torch.Generator()
                                  .manual_seed(0)).numpy().tobytes())
    if packed:                                    # a gzip header, then the same random bytes
        bad.with_suffix(".gz").write_bytes(b"\x1f\x8b" + bad.read_bytes())
        bad.unlink()
        bad = bad.with_suffix(".gz")
    _refused(lambda: load_dataset(name, root=tmp_path), bad, "replace the files in")


def test_labels_out_of_range_and_counts_are_checked(tmp_path):
    import numpy as np

    raw = tmp_path / "MNIST" / "raw"
    fake_mnist(tmp_path)
    write_idx(raw / "t10k-labels-idx1-ubyte", np.full(10, 12, dtype=np.uint8))
    _refused(lambda: load_dataset("mnist", root=tmp_path), raw / "t10k-labels-idx1-ubyte",
             "each in 0..9")
    write_idx(raw / "t10k-labels-idx1-ubyte", np.zeros(9, dtype=np.uint8))
    _refused(lambda: load_dataset("mnist", root=tmp_path), "holds 9 labels (expected 10")


def test_packed_mnist_is_checked_by_its_contents(tmp_path, monkeypatch):
    """Packed MNIST files are checked by what they hold (the published digest of the original
    files' tensors), not by the bytes of one gzip: fakes are refused, a repacked copy is read."""
    raw = tmp_path / "MNIST" / "raw"
    data = fake_mnist(tmp_path)
    _pack(raw)
    monkeypatch.delenv("BNMEM_DATA_DIGESTS", raising=False)
    _refused(lambda: load_dataset("mnist", root=tmp_path), raw, "does not hold the expected")
    accept_fake(monkeypatch, data, name="mnist")
    assert load_dataset("mnist", root=tmp_path).x_train.shape == (20, 1, 28, 28)


def test_damaged_cifar_batch_is_refused(tmp_path, monkeypatch):
    import torchvision

    fake_cifar(tmp_path, monkeypatch)
    folder = tmp_path / torchvision.datasets.CIFAR10.base_folder
    (folder / "data_batch_3").write_bytes(b"random bytes")
    _refused(lambda: load_dataset("cifar10", root=tmp_path), folder / "data_batch_3", "md5")


def test_a_cache_of_other_data_is_rebuilt_from_good_files_or_refused(isolated_roots, monkeypatch):
    """A converted cache holding data other than the expected is never used: rebuilt from the
    original files when they are there (after a repair), refused when they are not."""
    from bnmem_utils.core import cache
    from bnmem_utils.data import datasets as data

    good = _fake_system_folder(isolated_roots / "system")
    bad = {k: v.clone() for k, v in _system_parts(good).items()}
    bad["x_train"][:5] = 255
    path = isolated_roots / "project" / "data" / "bnmem" / "fashion_mnist.pt"
    cache.write(path, {"kind": "data", "version": 3, "name": "fashion_mnist"}, bad)
    accept_fake(monkeypatch, good)
    with pytest.warns(UserWarning, match="does not hold the expected data set"):
        ds = data.load_dataset("fashion_mnist")
    pixels = (ds.denormalize(ds.x_train) * 255).round().to(torch.uint8)
    assert torch.equal(pixels, _system_parts(good)["x_train"])
    _, parts = cache.read(path)
    assert cache.digest(parts) == cache.digest(_system_parts(good))         # rebuilt
    cache.write(path, {"kind": "data", "version": 3, "name": "fashion_mnist"}, bad)
    for f in (isolated_roots / "system").iterdir():
        f.unlink()
    with pytest.warns(UserWarning):
        _refused(lambda: data.load_dataset("fashion_mnist"), path, "no original files",
                 f"delete {path}")


def _system_parts(arrays):
    return {"x_train": torch.from_numpy(arrays["train"][0]).unsqueeze(1),
            "y_train": torch.from_numpy(arrays["train"][1]).long(),
            "x_test": torch.from_numpy(arrays["t10k"][0]).unsqueeze(1),
            "y_test": torch.from_numpy(arrays["t10k"][1]).long()}


def test_a_cache_is_rebuilt_when_its_files_change(tmp_path, monkeypatch):
    """Without a published digest (MNIST's dropped here), a cache converted from files that
    changed since is stale: the changed files are read again."""
    import os

    from bnmem_utils.data.datasets import data_digest

    without_reference(monkeypatch)
    first = fake_mnist(tmp_path, seed=1)
    before = load_dataset("mnist", root=tmp_path)
    old_digest = data_digest("mnist", root=tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    second = fake_mnist(tmp_path / "other", seed=2)
    for f in (tmp_path / "other" / "MNIST" / "raw").iterdir():     # repaired a second later
        os.replace(f, raw / f.name)
        mtime = (raw / f.name).stat().st_mtime_ns + 10**9
        os.utime(raw / f.name, ns=(mtime, mtime))
    with pytest.warns(UserWarning, match="changed since they were converted"):
        after = load_dataset("mnist", root=tmp_path)
    assert not torch.equal(after.x_train, before.x_train)
    pixels = (after.denormalize(after.x_train) * 255).round().to(torch.uint8)
    assert torch.equal(pixels[:, 0], torch.from_numpy(second["train"][0]))
    assert data_digest("mnist", root=tmp_path) != old_digest
    assert first["train"][0].shape == second["train"][0].shape
