"""One description of a run, one cache key over all of it: every field of every section, the
penalty, the measure, the kind's version and the device type move the key of every kind of run
(a grid run of notebooks 02 and 05, a bank of 04 and 05, a gradient-norm run of 03)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bnmem_utils.analyses import mitigation as mit
from bnmem_utils.core import device
from bnmem_utils.jobs import bank, config
from bnmem_utils.models import nets
from bnmem_utils.jobs import gradnorms as grads
from bnmem_utils.jobs import grid as experiments
from bnmem_utils.jobs.config import (
    BankMeasure,
    CorruptionConfig,
    DataConfig,
    GradNormMeasure,
    GridMeasure,
    ModelConfig,
    PenaltyConfig,
    RunConfig,
    TrainConfig,
)

# One changed value per field of each section (each valid, each different from the default).
CHANGED = {
    DataConfig: {"dataset": "mnist", "train_size": 500, "test_size": 100, "seed": 1},
    CorruptionConfig: {"flip_rate": 0.2, "ood_rate": 0.03, "ood_source": "uniform"},
    ModelConfig: {"arch": "mlp", "norm": "gn", "width": 2},
    TrainConfig: {"epochs": 7, "batch_size": 129, "optimizer": "adam", "lr": 0.06,
                  "momentum": 0.8, "weight_decay": 1e-4, "schedule": "none", "augment": False,
                  "amp": "off", "shift": 3, "flip": True, "eval_batch_size": 512,
                  "compile": "off"},
    GridMeasure: {"track": ("gamma_sigma",)},
    BankMeasure: {"n_models": 6, "population_size": 50, "queries": ("identity", "mirror"),
                  "query_batch_size": 256, "train_query_batch_size": 32, "pairs": True},
    GradNormMeasure: {"measure_epochs": (0, 1), "definitions": ("eval",), "max_clean": 10,
                      "max_noisy": 5},
}
SECTION = {DataConfig: "data", CorruptionConfig: "corruption", ModelConfig: "model",
           TrainConfig: "train"}


def _runs() -> dict[str, RunConfig]:
    """One run of each kind, built through the helpers the notebooks call."""
    grid = experiments.make_grid(datasets=["digits"], archs=["lenet"], norms=["bn"],
                                 corruptions=experiments.corruption_settings(flip_rates=[0.1]),
                                 seeds=[0], train=TrainConfig(epochs=5))[0]
    mitigation = mit.sweep_configs(mit.sweep_arms([0.1]), [0], RunConfig(
        corruption=CorruptionConfig(flip_rate=0.1), train=TrainConfig(epochs=5)))[1]
    arm = bank.make_arms(dataset="digits", archs=["lenet"], norms=["bn"], outlier_rates=[0.01],
                         n_models=4, train=TrainConfig(epochs=5))[0]
    gradnorm = grads.make_configs(norms=["bn", "none"], seeds=[0], data=DataConfig(), arch="lenet",
                                  corruption=CorruptionConfig(flip_rate=0.1),
                                  train=TrainConfig(epochs=5),
                                  measure=GradNormMeasure(measure_epochs=(0, 5)))[0]
    return {"grid run": grid, "mitigation run": mitigation, "bank": arm,
            "mitigation bank": arm.replace(penalty=PenaltyConfig(0.1)), "gradient-norm run": gradnorm}


def test_every_field_has_a_changed_value():
    for cls, changed in CHANGED.items():
        names = {f.name for f in dataclasses.fields(cls)}
        assert names == set(changed), f"add the new field of {cls.__name__} to CHANGED"
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert changed[f.name] != default, (cls, f.name)


@pytest.mark.parametrize("kind", ["grid run", "mitigation run", "bank", "mitigation bank",
                                  "gradient-norm run"])
@pytest.mark.parametrize(("cls", "name"), [(c, n) for c in SECTION for n in CHANGED[c]])
def test_every_section_field_moves_every_key(kind, cls, name):
    run = _runs()[kind]
    if kind.startswith("mitigation") and name == "norm":
        pytest.skip("the penalty applies to BN models only")
    section = getattr(run, SECTION[cls])
    value = CHANGED[cls][name]
    if getattr(section, name) == value and isinstance(value, bool):
        value = not value
    assert getattr(section, name) != value
    changed = dataclasses.replace(section, **{name: value})
    assert run.replace(**{SECTION[cls]: changed}).key() != run.key()


@pytest.mark.parametrize("cls", [GridMeasure, BankMeasure, GradNormMeasure])
def test_every_measure_field_moves_the_key(cls):
    run = {GridMeasure: _runs()["grid run"], BankMeasure: _runs()["bank"],
           GradNormMeasure: _runs()["gradient-norm run"]}[cls]
    for name, value in CHANGED[cls].items():
        assert run.replace(**{name: value}).key() != run.key(), name


def test_the_penalty_the_seed_the_device_and_the_version_move_the_key(monkeypatch):
    for run in _runs().values():
        if run.model.norm == "bn":
            assert run.replace(penalty=PenaltyConfig(0.3)).key() != run.key()
            assert (run.replace(penalty=PenaltyConfig(0.3, "hinge", 2.0)).key()
                    != run.replace(penalty=PenaltyConfig(0.3, "hinge", 1.0)).key())
        assert run.replace(seed=1).key() != run.key()
        with monkeypatch.context() as m:              # as if a GPU were there
            m.setattr(device, "resolve_device", lambda d="auto": torch.device(d))
            assert run.key("cpu") != run.key("cuda")
        before = run.key()
        monkeypatch.setitem(config.VERSIONS, run.kind, config.VERSIONS[run.kind] + 1)
        assert run.key() != before
        monkeypatch.undo()


def test_kinds_never_share_a_key():
    runs = _runs()
    same = RunConfig(data=runs["bank"].data, corruption=runs["bank"].corruption,
                     model=runs["bank"].model, train=runs["bank"].train, seed=0)
    assert same.key() != runs["bank"].key()


def test_a_bank_key_names_its_default_trainer():
    arm = _runs()["bank"]
    assert config.bank_trainer(arm, "cpu") == "vectorised"
    assert config.bank_trainer(arm.replace(arch="resnet20"), "cpu") == "sequential"
    penalised = arm.replace(penalty=PenaltyConfig(0.1))
    assert config.bank_trainer(penalised, "cpu") == "vectorised"
    assert config.bank_trainer(penalised.replace(arch="resnet20"), "cpu") == "sequential"


def test_the_memory_layout_is_in_the_key(monkeypatch):
    """A wide network trains channels-last on a CPU, LeNet and the MLP NCHW, every network
    channels-last images on CUDA (the loop's rule), and the layout is in each key."""
    for arch, wide in (("lenet", False), ("mlp", False), ("resnet20", True), ("densenet", True)):
        assert nets.trains_channels_last(arch, torch.device("cpu")) is (True if wide else None)
        assert nets.trains_channels_last(arch, torch.device("cuda")) is None
    run = _runs()["grid run"].replace(arch="resnet20")
    before = run.key()
    monkeypatch.setattr(config, "trains_channels_last", lambda arch, dev: None)
    assert run.key() != before


# ----------------------------------------------------------------------------------------------
# The code that trains a run is in its key: edits to the package on its path move the key,
# edits to presentation (plots, the report, the notebooks) do not. Checked on modified copies
# of the package, whose keys a fresh interpreter computes.
# ----------------------------------------------------------------------------------------------
_KEYS = """
import importlib, json, sys
from pathlib import Path
tests, copies = sys.argv[1], json.loads(sys.argv[2])
sys.path.append(tests)
out = {}
for name, copy in copies.items():     # each copy imported afresh (torch stays loaded: faster)
    for module in [m for m in sys.modules if m.split(".")[0] in ("bnmem_utils", "test_cache_keys")]:
        del sys.modules[module]
    sys.path.insert(0, copy)
    package = importlib.import_module("bnmem_utils")
    assert Path(package.__file__).resolve().is_relative_to(Path(copy).resolve()), package.__file__
    runs = importlib.import_module("test_cache_keys")._runs()
    out[name] = {kind: run.key() for kind, run in runs.items()}
    sys.path.remove(copy)
print(json.dumps(out))
"""


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} is no longer in {path.name}: update the test's edit"
    path.write_text(text.replace(old, new, 1))


EDITS = {
    "unchanged": [],
    # the defect as reported: a default inside a training function
    "train": [("bnmem_utils/training/steps.py", "else 2 if image_size >= 16 else 1",
               "else 2 if image_size >= 16 else 2")],
    "presentation": [("bnmem_utils/figures/plotting.py", '"""', '"""Edited.\n'),
                     ("bnmem_utils/analyses/report.py", '"""', '"""Edited.\n'),
                     ("notebooks/04_lira.ipynb", '"cells": [', '"cells": [ ')],
    "penalty": [("bnmem_utils/training/penalty.py", '"""', '"""Edited.\n')],
    "grads": [("bnmem_utils/jobs/gradnorms.py", '"""', '"""Edited.\n')],
    # a new module on the path (imported inside a function) is covered without naming it
    "new module": [("bnmem_utils/training/steps.py", "def default_shift(", "def _helper():\n"
                    "    from bnmem_utils.training.helper import VALUE\n    return VALUE\n\n\ndef default_shift("),
                   ("bnmem_utils/training/helper.py", "", "VALUE = 1\n")],
    "new module edited": [("bnmem_utils/training/steps.py", "def default_shift(", "def _helper():\n"
                           "    from bnmem_utils.training.helper import VALUE\n    return VALUE\n\n\n"
                           "def default_shift("),
                          ("bnmem_utils/training/helper.py", "", "VALUE = 2\n")],
}


@pytest.fixture(scope="module")
def keys_by_edit(tmp_path_factory) -> dict[str, dict[str, str]]:
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    copies = {}
    for name, edits in EDITS.items():
        copy = tmp_path_factory.mktemp("package")
        shutil.copytree(repo / "bnmem_utils", copy / "bnmem_utils",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(repo / "notebooks", copy / "notebooks",
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for file, old, new in edits:
            if not (copy / file).exists():
                (copy / file).write_text("")
            _edit(copy / file, old, new)
        copies[name] = str(copy)
    done = subprocess.run([sys.executable, "-c", _KEYS, str(Path(__file__).parent),
                           json.dumps(copies)], cwd=tmp_path_factory.mktemp("cwd"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow(minutes=1)
def test_code_on_the_path_is_in_every_key(keys_by_edit):
    base = keys_by_edit["unchanged"]
    assert base == {kind: run.key() for kind, run in _runs().items()}     # same code, same keys
    for edit in ("train", "new module"):
        moved = {k for k in base if keys_by_edit[edit][k] != base[k]}
        assert moved == set(base), f"{edit}: {sorted(set(base) - moved)} kept their keys"
    changed = keys_by_edit["new module edited"]
    assert all(changed[k] != keys_by_edit["new module"][k] for k in base)
    # the penalty module holds PenaltyConfig, a part of every run's description
    assert {k for k in base if keys_by_edit["penalty"][k] != base[k]} == set(base)
    assert {k for k in base if keys_by_edit["grads"][k] != base[k]} == {"gradient-norm run"}


@pytest.mark.slow(minutes=1)
def test_presentation_is_not_in_any_key(keys_by_edit):
    assert keys_by_edit["presentation"] == keys_by_edit["unchanged"]


def test_the_code_path_follows_the_imports():
    from bnmem_utils.core import cache

    assert cache.package_imports(
        "from bnmem_utils.core import cache, nothing\nfrom bnmem_utils.training.loop import x\n"
        "import bnmem_utils.models.nets\nfrom bnmem_utils.data.datasets import y\n"
        "from bnmem_utils import start\nimport numpy\n"
        "def f():\n    from bnmem_utils.training.vectorised import z\n"
    ) == {"core.cache", "training.loop", "models.nets", "data.datasets", "training.vectorised"}
    for kind, module in config.JOB_MODULES.items():
        path = cache.code_path(module)
        assert module in path, (kind, path)
        assert not {m.split(".")[0] for m in path} & cache.PRESENTATION, (kind, path)
        assert {"training.loop", "models.nets", "data.datasets", "models.gamma_sigma",
                "jobs.config", "core.cache"} <= set(path), kind
    assert {"training.vectorised", "training.penalty", "jobs.bank_models",
            "privacy.attacks"} <= set(cache.code_path("jobs.bank"))
    assert "jobs.grid" not in cache.code_path("jobs.bank")      # the grid job trains no bank
    assert "training.penalty" in cache.code_path("jobs.grid")


# ----------------------------------------------------------------------------------------------
# The data a run reads is in its key.
# ----------------------------------------------------------------------------------------------
def test_the_data_digest_is_in_the_key(tmp_path, monkeypatch):
    from fake_data import fake_mnist, without_reference

    from bnmem_utils.data import datasets as data

    monkeypatch.delenv("BNMEM_DATA_DIGESTS", raising=False)
    fashion = RunConfig.bank(dataset="fashion_mnist", n_models=4, epochs=1)
    published = fashion.key()
    monkeypatch.setenv("BNMEM_DATA_DIGESTS", "fashion_mnist=0123abcd")
    assert fashion.key() != published                   # a deliberately changed copy
    monkeypatch.delenv("BNMEM_DATA_DIGESTS")
    assert fashion.key() == published

    mnist = RunConfig.grid(dataset="mnist", epochs=1)
    without_reference(monkeypatch)           # the digest of what is read keys the runs
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "a"))
    fake_mnist(tmp_path / "a", seed=1)
    fake_mnist(tmp_path / "b", seed=2)
    key_a = mnist.key()
    assert data.data_digest("mnist") is not None
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "b"))
    assert mnist.key() != key_a                         # other files, other models
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "a"))
    assert mnist.key() == key_a
    # OOD inserts from another data set: its digest too
    digits = RunConfig.grid(dataset="digits", ood_rate=0.01, ood_source="mnist", epochs=1)
    before = digits.key()
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "b"))
    assert digits.key() != before


def test_the_data_read_is_in_the_key_whatever_the_route(tmp_path, monkeypatch):
    """Files replaced behind a converted cache, and a bank read from a data folder of its own
    (``root``), give other keys: the digest is of the data the run reads."""
    import shutil

    from fake_data import fake_mnist, without_reference

    from bnmem_utils.data import datasets as data

    monkeypatch.delenv("BNMEM_DATA_DIGESTS", raising=False)
    without_reference(monkeypatch)
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "a"))
    fake_mnist(tmp_path / "a", seed=1)
    mnist = RunConfig.grid(dataset="mnist", epochs=1)
    data.load_dataset("mnist")                          # converts them: data/bnmem/mnist.pt
    before = mnist.key()
    shutil.rmtree(tmp_path / "a" / "MNIST")
    fake_mnist(tmp_path / "a", seed=2)                  # the originals replaced, the cache not
    with pytest.warns(UserWarning, match="the cached tensors .* are stale"):
        assert mnist.key() != before                    # the stale cache is said and rebuilt
    fake_mnist(tmp_path / "b", seed=3)
    assert mnist.key(root=tmp_path / "b") != mnist.key()
    arm = RunConfig.bank(dataset="mnist", n_models=4, epochs=1)
    assert bank.bank_folder(arm, tmp_path, data_root=tmp_path / "b") != bank.bank_folder(arm, tmp_path)


def test_a_registered_data_sets_classes_and_normalization_are_in_the_key():
    from bnmem_utils.data import datasets as data

    def toy():
        return {"x_train": torch.rand(8, 1, 4, 4), "y_train": torch.arange(8) % 2,
                "x_test": torch.rand(4, 1, 4, 4), "y_test": torch.arange(4) % 2}

    keys = []
    try:
        for classes, norm in ((2, ((0.5,), (0.25,))), (2, ((0.0,), (1.0,))), (3, ((0.0,), (1.0,)))):
            data.register_dataset("toy_key", toy, num_classes=classes, normalization=norm,
                                  replace=True)
            keys.append(RunConfig.grid(dataset="toy_key", arch="mlp", epochs=1).key())
    finally:
        data._REGISTERED.pop("toy_key", None)
        data.DATASETS = tuple(d for d in data.DATASETS if d != "toy_key")
    assert len(set(keys)) == 3


def test_no_key_after_the_code_on_the_path_was_edited(tmp_path):
    """A module edited after the process read it (a kernel left running): the process may run
    either text, so it gives no key rather than one that may name the wrong code."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "bnmem_utils", tmp_path / "bnmem_utils",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = (
        "from pathlib import Path\nfrom bnmem_utils.jobs.config import RunConfig\n"
        "from bnmem_utils.core.cache import SourceChanged\n"
        "run = RunConfig.grid(epochs=1); run.key()\n"
        "p = Path('bnmem_utils/training/steps.py'); p.write_text(p.read_text() + '# edited\\n')\n"
        "try:\n    run.key()\nexcept SourceChanged:\n    print('refused')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.strip() == "refused", done.stderr[-2000:]


def test_a_bank_trained_on_a_pool_of_its_own_is_not_read_back_as_its_configs(tmp_path):
    """train_banks(data=...) files the bank under its config's key; each model file records
    the pool it was trained on, so the config's own bank is retrained, not read back."""
    import numpy as np

    from bnmem_utils.jobs.bank import train_banks
    from bnmem_utils.jobs.bank_models import prepare_data

    config = RunConfig.bank(dataset="digits", arch="mlp", norm="none", n_models=4, epochs=1,
                            train_size=128, test_size=32, flip_rate=0.05)
    other = prepare_data(config.replace(flip_rate=0.3), "cpu")      # same size, other labels
    assert other.digest != prepare_data(config, "cpu").digest
    assert train_banks([config], tmp_path, device="cpu", data=other, progress=False)[0].trained == 4
    with pytest.warns(UserWarning, match="written for another pool"):
        own = train_banks([config], tmp_path, device="cpu", progress=False)[0]
    fresh = train_banks([config], tmp_path / "fresh", device="cpu", progress=False)[0]
    assert own.trained == 4 and np.array_equal(own.scores, fresh.scores)
    again = train_banks([config], tmp_path, device="cpu", progress=False)[0]
    assert again.trained == 0                                         # its own pool: read back


def test_a_model_trained_in_another_block_is_retrained_not_read_back(tmp_path):
    """A vectorised model's numbers depend on the block it trained in (to rounding), and a
    GPU's block on the card's memory: each model file records its block, and a bank asked for
    with another block (or one after another) retrains it."""
    from bnmem_utils.jobs.bank import train_banks
    from bnmem_utils.jobs.bank_models import SEQUENTIAL, MemberTrainer

    config = RunConfig.bank(dataset="digits", arch="mlp", norm="bn", n_models=4, epochs=1,
                            train_size=128, test_size=32)
    blocks = MemberTrainer(vectorised=True, block=2)
    assert train_banks([config], tmp_path, device="cpu", trainer=blocks,
                       progress=False)[0].trained == 4
    assert train_banks([config], tmp_path, device="cpu", trainer=blocks,
                       progress=False)[0].trained == 0
    with pytest.warns(UserWarning, match="written for another block"):
        assert train_banks([config], tmp_path, device="cpu", progress=False)[0].trained == 4
    with pytest.warns(UserWarning, match="written for another block"):
        assert train_banks([config], tmp_path, device="cpu", trainer=SEQUENTIAL,
                           progress=False)[0].trained == 4


def test_the_library_versions_are_in_the_key(monkeypatch):
    """Another torch or numpy release may round otherwise: its results get a key of their own."""
    import numpy

    run = RunConfig.grid(dataset="digits", epochs=1)
    before = run.key()
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert run.key() != before
    monkeypatch.undo()
    monkeypatch.setattr(numpy, "__version__", "0.0.1")
    assert run.key() != before
