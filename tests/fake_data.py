"""Small data files in torchvision's own on-disk formats, written by the tests (offline).

The real torchvision classes read them, so the loaders are tested on the formats they meet on a
connected machine: IDX files for the MNIST family, pickled batches for CIFAR.
"""

from __future__ import annotations

from pathlib import Path


def write_idx(path, array):
    """IDX (big-endian) as in the MNIST distribution: magic 0x0000 08 <ndim>, dims, uint8 data."""
    import numpy as np

    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.tobytes())


def fake_mnist(root, folder="MNIST", n_train=20, n_test=10, seed=0):
    """root/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte with random content."""
    import numpy as np

    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    data = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
        data[prefix] = (images, labels)
    return data


def fake_digest(data) -> str:
    """The digest (:func:`bnmem_utils.core.cache.digest`) of :func:`fake_mnist`'s arrays, as the
    loader reads them: uint8 images (N, 1, 28, 28), int64 labels."""
    import torch

    from bnmem_utils.core import cache

    parts = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = data[prefix]
        parts[f"x_{split}"] = torch.from_numpy(images).unsqueeze(1).contiguous()
        parts[f"y_{split}"] = torch.from_numpy(labels).long()
    return cache.digest(parts)


def accept_fake(monkeypatch, data, name="fashion_mnist") -> str:
    """Accept fake files of a data set with a published digest, as a user with a deliberately
    changed copy would ($BNMEM_DATA_DIGESTS, inherited by the kernels started later; the entries
    of other data sets already there are kept)."""
    import os

    digest = fake_digest(data)
    kept = [item for item in os.environ.get("BNMEM_DATA_DIGESTS", "").split(",")
            if item and not item.startswith(f"{name}=")]
    monkeypatch.setenv("BNMEM_DATA_DIGESTS", ",".join([*kept, f"{name}={digest}"]))
    return digest


def without_reference(monkeypatch, name="mnist") -> None:
    """Drop ``name``'s published digest in this process: the loader's path for a data set with
    no reference (the digest of what was read keys the runs)."""
    from bnmem_utils.data import files

    monkeypatch.setattr(files, "KNOWN_DIGESTS",
                        {k: v for k, v in files.KNOWN_DIGESTS.items() if k != name})


def fake_cifar(root, monkeypatch, hundred=False, per_batch=6, seed=0):
    """CIFAR pickled batches. torchvision checks the md5 of every batch file against the real
    archive's; the test points the class's md5 table at our fake files' md5s (monkeypatch), so the
    real integrity check still runs."""
    import hashlib
    import pickle

    import numpy as np
    import torchvision

    rng = np.random.default_rng(seed)
    cls = torchvision.datasets.CIFAR100 if hundred else torchvision.datasets.CIFAR10
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    label_key = "fine_labels" if hundred else "labels"
    n_classes = 100 if hundred else 10
    md5 = {}
    content = {"train": [], "test": []}
    for name, _ in cls.train_list + cls.test_list:
        data = rng.integers(0, 256, size=(per_batch, 3 * 32 * 32), dtype=np.uint8)
        labels = rng.integers(0, n_classes, size=per_batch).tolist()
        (folder / name).write_bytes(pickle.dumps({"data": data, label_key: labels}))
        md5[name] = hashlib.md5((folder / name).read_bytes()).hexdigest()
        split = "test" if name in dict(cls.test_list) else "train"
        content[split].append((data, labels))
    meta_name = cls.meta["filename"]
    (folder / meta_name).write_bytes(pickle.dumps({cls.meta["key"]: [str(i) for i in range(n_classes)]}))
    monkeypatch.setattr(cls, "train_list", [[n, md5[n]] for n, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[n, md5[n]] for n, _ in cls.test_list])
    monkeypatch.setattr(cls, "meta", dict(cls.meta, md5=hashlib.md5(
        (folder / meta_name).read_bytes()).hexdigest()))
    return {split: (np.concatenate([d for d, _ in parts]), sum((lab for _, lab in parts), []))
            for split, parts in content.items()}


def fake_paper_data(root: Path, monkeypatch, *, n_train: int = 96, n_test: int = 48) -> Path:
    """MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 under ``root`` in torchvision's layouts,
    converted at once into bnmem's cache there (CIFAR's md5 table patched in this process
    only), so that notebook kernels started later read them without torchvision's checks; the
    fake MNIST's and Fashion-MNIST's digests are accepted through $BNMEM_DATA_DIGESTS, which they inherit."""
    from bnmem_utils.data.datasets import load_dataset

    accept_fake(monkeypatch, fake_mnist(root, "MNIST", n_train=n_train, n_test=n_test, seed=1),
                name="mnist")
    accept_fake(monkeypatch, fake_mnist(root, "FashionMNIST", n_train=n_train, n_test=n_test,
                                        seed=2))
    fake_cifar(root, monkeypatch, hundred=False, per_batch=max(n_train // 5, n_test), seed=3)
    fake_cifar(root, monkeypatch, hundred=True, per_batch=max(n_train, n_test), seed=4)
    for name in ("mnist", "fashion_mnist", "cifar10", "cifar100"):
        load_dataset(name, root=root)
    return root


def paper_dry_run(tmp_path_factory, monkeypatch, only: list[str]) -> dict[str, dict]:
    """Run notebooks ``only`` of ``bnmem reproduce --profile paper --dry-run`` on the CPU, on the
    four data sets written by :func:`fake_paper_data`; fail naming each failing notebook's cell;
    return the results files by notebook, and the run's summary under ``"summary"``."""
    import json

    from bnmem_utils.run import plan as runplan
    from bnmem_utils.run import runner

    data_root = fake_paper_data(tmp_path_factory.mktemp("paper-data"), monkeypatch)
    monkeypatch.setenv("BNMEM_DATA", str(data_root))
    out = tmp_path_factory.mktemp("paper-dry-run")
    summary = runner.reproduce("paper", only=only, dry_run=True, out_dir=out, log_output=False,
                               progress=False, device="cpu")
    failed = [f"{r.notebook}: {r.error}\n{r.cell}\n(executed copy: {r.output})"
              for r in summary.results if not r.ok]
    assert not failed, "\n".join(failed)
    assert [r.notebook for r in summary.results] == list(runplan.select_notebooks(only))
    runs = summary.plan.runs_dir  # a dry run's own folder, runs/paper-dry-<digest>
    results = {p.stem: json.loads(p.read_text()) for p in (runs / "results").glob("*.json")}
    return {**results, "summary": json.loads((runs / "summary.json").read_text())}
