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

from bnmem_utils import cache, data, runner

SYSTEM = data.SYSTEM_FOLDERS["fashion_mnist"][0]
pytestmark = pytest.mark.skipif(
    not all((SYSTEM / f).is_file() for f in data.IDX_FILES.values()),
    reason=f"the real Fashion-MNIST files are not in {SYSTEM}: install them with "
           "`apt-get install dataset-fashion-mnist` (Debian/Ubuntu)")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """An empty data folder: the files must be found in the system folder and converted into it."""
    return tmp_path_factory.mktemp("bnmem-data")


@pytest.fixture(scope="module")
def fmnist(data_root, tmp_path_factory):
    """Loaded with nothing but the system folder to find: no $BNMEM_DATA, no checkout's data/."""
    with pytest.MonkeyPatch.context() as m:
        m.delenv("BNMEM_DATA", raising=False)
        m.setattr(data, "project_root", lambda: tmp_path_factory.mktemp("checkout"))
        return data.load_dataset("fashion_mnist", root=data_root)


def test_found_offline_in_the_system_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("BNMEM_DATA", raising=False)
    monkeypatch.setattr(data, "project_root", lambda: tmp_path)
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
    recorded = json.loads((tmp_path / "runs" / "smoke" / "results" / "04_lira.json").read_text())
    aucs = {k: v for k, v in recorded["results"].items() if k.startswith("lira_auc_bn_fashion_mnist_lenet")}
    assert aucs, "no LiRA AUC recorded for the BN LeNet bank"
    for key, entry in aucs.items():
        assert 0.0 <= entry["value"] <= 1.0, f"{key}: {entry}"
    assert recorded["meta"]["parameters"]["lira_datasets"] == ["fashion_mnist"]
