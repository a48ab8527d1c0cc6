"""Fashion-MNIST, the paper's own data set, from the real files of Debian's package.

``apt-get install dataset-fashion-mnist`` puts the four original gzip IDX files in
/usr/share/datasets/fashion-mnist/; ``.ci/run`` installs it when it runs as root with apt.
Without the package (a laptop) every test here skips with the install command, and nothing
else in the suite depends on these files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bnmem_utils.core import cache
from bnmem_utils.data import datasets as data
from bnmem_utils.data import files as datafiles
from bnmem_utils.run import runner

SYSTEM = data.SYSTEM_FOLDERS["fashion_mnist"][0]
pytestmark = pytest.mark.skipif(
    not all((SYSTEM / f).is_file() for f in data.IDX_FILES.values()),
    reason=f"the real Fashion-MNIST files are not in {SYSTEM}: install them with "
           "`apt-get install dataset-fashion-mnist` (Debian/Ubuntu)")


@pytest.fixture(autouse=True)
def _published_digest_only(monkeypatch):
    monkeypatch.delenv("BNMEM_DATA_DIGESTS", raising=False)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """An empty data folder: the files must be found in the system folder and converted into it."""
    return tmp_path_factory.mktemp("bnmem-data")


@pytest.fixture(scope="module")
def fmnist(data_root, tmp_path_factory):
    """Loaded with nothing but the system folder to find: no $BNMEM_DATA, no checkout's data/."""
    with pytest.MonkeyPatch.context() as m:
        m.delenv("BNMEM_DATA", raising=False)
        m.setattr(datafiles, "project_root", lambda: tmp_path_factory.mktemp("checkout"))
        return data.load_dataset("fashion_mnist", root=data_root)


def test_found_offline_in_the_system_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("BNMEM_DATA", raising=False)
    monkeypatch.setattr(datafiles, "project_root", lambda: tmp_path)
    assert data.find_dataset("fashion_mnist") == f"system:{SYSTEM}"


def test_shapes_classes_and_digest(fmnist, data_root):
    assert fmnist.x_train.shape == (60000, 1, 28, 28) and fmnist.x_test.shape == (10000, 1, 28, 28)
    assert fmnist.x_train.dtype == torch.float32 and fmnist.y_train.dtype == torch.int64
    assert torch.bincount(fmnist.y_train, minlength=10).tolist() == [6000] * 10
    assert torch.bincount(fmnist.y_test, minlength=10).tolist() == [1000] * 10
    # The published normalisation constants fit these pixels (mean 0.2860, std 0.3530).
    assert abs(float(fmnist.x_train.mean())) < 1e-3 and abs(float(fmnist.x_train.std()) - 1) < 1e-3
    # Converted once into the data folder's cache, whose tensors carry the published digest.
    _, parts = cache.read(data.cache_file("fashion_mnist", data_root), kind="data")
    assert cache.digest(parts) == data.KNOWN_DIGESTS["fashion_mnist"]
    assert data.find_dataset("fashion_mnist", root=data_root).startswith("cache:")


@pytest.mark.slow
def test_notebook_04_runs_on_real_fashion_mnist(tmp_path, data_root, monkeypatch):
    """Notebook 04 at smoke size on real 28x28 images: banks train, LiRA scores, numbers recorded."""
    monkeypatch.setenv("BNMEM_DATA", str(data_root))
    summary = runner.reproduce(
        "smoke", only=["04"], out_dir=tmp_path, log_output=False, progress=False,
        overrides={"lira_datasets": ["fashion_mnist"], "lira_train_size": 400,
                   "lira_test_size": 300, "lira_population_size": 100})
    (result,) = summary.results
    assert result.ok, f"04 failed on Fashion-MNIST: {result.error}\n{result.cell}"
    recorded = json.loads((summary.plan.runs_dir / "results" / "04_lira.json").read_text())
    aucs = {k: v for k, v in recorded["results"].items() if k.startswith("lira_auc_bn_fashion_mnist_lenet")}
    assert aucs, "no LiRA AUC recorded for the BN LeNet bank"
    for key, entry in aucs.items():
        assert 0.0 <= entry["value"] <= 1.0, f"{key}: {entry}"
    assert recorded["meta"]["parameters"]["lira_datasets"] == ["fashion_mnist"]


# ----------------------------------------------------------------------------------------------
# The real files through every route: torchvision's layout under $BNMEM_DATA, packed or
# unpacked, and the converted cache; changed or damaged copies are refused in one line.
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def env_root(tmp_path, monkeypatch) -> Path:
    """$BNMEM_DATA in tmp, no checkout data/, no system folder: only what the test puts there."""
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "env"))
    monkeypatch.setattr(datafiles, "project_root", lambda: tmp_path / "checkout")
    monkeypatch.setattr(datafiles, "SYSTEM_FOLDERS", {})
    return tmp_path / "env"


def _torchvision_layout(root: Path, packed: bool) -> Path:
    """The four original files in ``root/FashionMNIST/raw/``, as shipped (.gz) or unpacked."""
    import gzip
    import shutil

    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in data.IDX_FILES.values():
        if packed:
            shutil.copy(SYSTEM / name, raw / name)
        else:
            (raw / name.removesuffix(".gz")).write_bytes(gzip.decompress((SYSTEM / name).read_bytes()))
    return raw


def _one_line_refusal(*needles) -> str:
    with pytest.raises(data.DataIntegrityError) as info:
        data.load_dataset("fashion_mnist")
    msg = str(info.value)
    assert "\n" not in msg and all(str(n) in msg for n in needles), msg
    return msg


@pytest.mark.parametrize("packed", [True, False])
def test_torchvision_layout_under_bnmem_data(env_root, packed):
    raw = _torchvision_layout(env_root, packed)
    assert data.find_dataset("fashion_mnist") == f"torchvision:{env_root}"
    ds = data.load_dataset("fashion_mnist")
    assert ds.x_train.shape == (60000, 1, 28, 28)
    _, parts = cache.read(env_root / "bnmem" / "fashion_mnist.pt", kind="data")
    assert cache.digest(parts) == data.KNOWN_DIGESTS["fashion_mnist"]
    assert data.data_digest("fashion_mnist") == data.KNOWN_DIGESTS["fashion_mnist"]
    assert raw.is_dir()


def _brighten(raw: Path, n: int = 200) -> None:
    """Set the first ``n`` training images of the unpacked image file to 255."""
    path = raw / "train-images-idx3-ubyte"
    blob = bytearray(path.read_bytes())
    blob[16: 16 + n * 784] = bytes([255]) * (n * 784)
    path.write_bytes(bytes(blob))


def test_changed_unpacked_images_are_refused(env_root):
    raw = _torchvision_layout(env_root, packed=False)
    _brighten(raw)
    _one_line_refusal(raw, "expected " + data.KNOWN_DIGESTS["fashion_mnist"])
    assert not (env_root / "bnmem" / "fashion_mnist.pt").exists()


def test_random_label_bytes_are_refused(env_root):
    raw = _torchvision_layout(env_root, packed=False)
    (raw / "train-labels-idx1-ubyte").write_bytes(bytes(range(256)) * 40)
    _one_line_refusal(raw / "train-labels-idx1-ubyte", "not an unsigned-byte IDX file")


def test_a_cache_of_changed_data_is_rebuilt_after_the_repair_or_refused(env_root):
    """The cache of a changed copy (as an older version wrote it) is never used: rebuilt from
    the repaired files, refused without them."""
    raw = _torchvision_layout(env_root, packed=False)
    good = {k: torch.from_numpy(data.read_idx(raw / f.removesuffix(".gz")).copy())
            for k, f in data.IDX_FILES.items()}
    parts = {k: v.unsqueeze(1) if k.startswith("x") else v.long() for k, v in good.items()}
    bad = dict(parts, x_train=parts["x_train"].clone())
    bad["x_train"][:200] = 255
    path = env_root / "bnmem" / "fashion_mnist.pt"
    cache.write(path, {"kind": "data", "version": datafiles.CACHE_VERSION, "name": "fashion_mnist"},
                bad)
    with pytest.warns(UserWarning, match="does not hold the expected data set"):
        ds = data.load_dataset("fashion_mnist")
    assert torch.equal((ds.denormalize(ds.x_train[:200]) * 255).round().to(torch.uint8),
                       parts["x_train"][:200])
    assert cache.digest(cache.read(path)[1]) == data.KNOWN_DIGESTS["fashion_mnist"]
    cache.write(path, {"kind": "data", "version": datafiles.CACHE_VERSION, "name": "fashion_mnist"},
                bad)
    for f in raw.iterdir():
        f.unlink()
    with pytest.warns(UserWarning):
        _one_line_refusal(path, cache.digest(bad), "no original files")
