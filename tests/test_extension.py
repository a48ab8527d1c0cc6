"""Bring your own model (and data set): one function and one registry entry.

A toy architecture is registered and notebook 02's grid (``experiments.make_grid`` ->
``run_grid`` -> ``memorization.run_summary`` -> ``result_records``) runs on it, BN against no
norm, end to end on the digits; a toy data set is registered and a grid runs on that too. The
registrations are undone after each test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bnmem_utils.analyses import memorization as mem
from bnmem_utils.data import datasets as D
from bnmem_utils.jobs import grid as ex
from bnmem_utils.jobs.config import RunConfig, TrainConfig
from bnmem_utils.models import nets as M
from bnmem_utils.run import params


@pytest.fixture
def registries(monkeypatch):
    """Each test's registrations vanish afterwards."""
    monkeypatch.setattr(M, "ARCHS", M.ARCHS)
    monkeypatch.setattr(M, "_REGISTERED", dict(M._REGISTERED))
    monkeypatch.setattr(D, "DATASETS", D.DATASETS)
    monkeypatch.setattr(D, "_REGISTERED", dict(D._REGISTERED))
    monkeypatch.setattr(D, "NUM_CLASSES", dict(D.NUM_CLASSES))


def tiny_cnn(*, norm, in_channels, num_classes, image_size, width):
    """The README's example: one convolution, a switchable norm, pooling, a linear classifier."""
    c = 8 * width
    return nn.Sequential(nn.Conv2d(in_channels, c, 3, padding=1, bias=norm == "none"),
                         M.make_norm(norm, c, 2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(c * (image_size // 2) ** 2, num_classes))


def test_a_registered_architecture_runs_notebook_02s_grid(registries, tmp_path):
    M.register_arch("tiny_cnn", tiny_cnn)
    assert "tiny_cnn" in M.ARCHS
    assert "tiny_cnn" in params.SPEC["mem_archs"].allowed()    # the notebooks' parameters too
    configs = ex.make_grid(datasets=["digits"], archs=["tiny_cnn"], norms=["bn", "none"],
                           corruptions=ex.corruption_settings(flip_rates=[0.1]), seeds=[0],
                           train=TrainConfig(epochs=5), test_size=200)
    results = ex.run_grid(configs, "cpu", tmp_path, progress=False)
    assert [r.config.model.arch for r in results] == ["tiny_cnn", "tiny_cnn"]
    assert not any(r.diverged for r in results)
    assert min(float(r.history.test_acc.iloc[-1]) for r in results) > 0.6   # chance is 0.1
    hist = ex.history_frame(results)
    assert set(hist.norm) == {"bn", "none"} and hist.test_acc.notna().all()
    gs = ex.gamma_sigma_frame(results)
    assert len(gs) == 8                                  # one row per BN channel of the BN run
    runs = mem.run_summary(hist, at_epochs=[1])
    keys = {r.key for r, _, _ in mem.result_records(runs, at_epochs=[1])}
    assert any(k.startswith("mem_diff_bn_none_") for k in keys)
    # a second grid reads every run back from the cache
    assert all(r.cached for r in ex.run_grid(configs, "cpu", tmp_path, progress=False))


def test_editing_a_registered_builder_changes_the_cache_key(registries):
    lenet = RunConfig.grid(dataset="digits", arch="lenet", norm="bn")
    lenet_key = lenet.key("cpu")
    M.register_arch("tiny_cnn", tiny_cnn)
    config = RunConfig.grid(dataset="digits", arch="tiny_cnn", norm="bn", epochs=1)
    before = config.key("cpu")

    def tiny_cnn_wider(*, norm, in_channels, num_classes, image_size, width):
        return tiny_cnn(norm=norm, in_channels=in_channels, num_classes=num_classes,
                        image_size=image_size, width=2 * width)

    M.register_arch("tiny_cnn", tiny_cnn_wider, replace=True)
    assert config.key("cpu") != before                     # no stale run of the old builder
    # built-in architectures and data sets add nothing to their keys
    assert lenet.key("cpu") == lenet_key
    assert D.registered_code("digits", "lenet") == {}
    assert set(D.registered_code("digits", "tiny_cnn")["code"]) == {"tiny_cnn"}


def test_registration_errors_name_the_problem(registries):
    with pytest.raises(ValueError, match="built-in architecture"):
        M.register_arch("lenet", tiny_cnn)
    M.register_arch("tiny_cnn", tiny_cnn)
    with pytest.raises(ValueError, match="already registered"):
        M.register_arch("tiny_cnn", tiny_cnn)
    with pytest.raises(ValueError, match="an identifier"):
        M.register_arch("tiny cnn", tiny_cnn)
    with pytest.raises(ValueError, match="unknown architecture 'nope'.*tiny_cnn"):
        M.build_model("nope")
    with pytest.raises(ValueError, match="built-in data set"):
        D.register_dataset("digits", lambda: {}, num_classes=10)


def blobs():
    """Four classes of 6x6 single-channel images: a bright quadrant per class, plus noise."""
    gen = torch.Generator().manual_seed(0)

    def split(n):
        y = torch.arange(n) % 4
        x = 0.2 * torch.rand(n, 1, 6, 6, generator=gen)
        for c in range(4):
            r, q = divmod(c, 2)
            x[y == c, :, 3 * r:3 * r + 3, 3 * q:3 * q + 3] += 0.8
        return x.clamp(0, 1), y

    x_tr, y_tr = split(240)
    x_te, y_te = split(80)
    return {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te}


def test_a_registered_data_set_loads_and_trains(registries, tmp_path):
    D.register_dataset("blobs", blobs, num_classes=4)
    assert D.find_dataset("blobs") == "registered" and D.dataset_available("blobs")
    ds = D.load_dataset("blobs", train_size=200)
    assert ds.x_train.shape == (200, 1, 6, 6) and ds.num_classes == 4
    np.testing.assert_allclose(ds.x_train.mean().item(), 0.0, atol=0.1)   # normalised
    configs = ex.make_grid(datasets=["blobs"], archs=["lenet"], norms=["bn", "none"],
                           corruptions=[], seeds=[0], train=TrainConfig(epochs=3), train_size=200,
                           test_size=80)
    results = ex.run_grid(configs, "cpu", tmp_path, progress=False)
    assert min(float(r.history.test_acc.iloc[-1]) for r in results) > 0.5   # chance is 0.25


def test_a_bad_loader_is_refused_with_its_name(registries):
    D.register_dataset("broken", lambda: {"x_train": torch.zeros(4, 6, 6)}, num_classes=2)
    with pytest.raises(ValueError, match="'broken' returned no y_train"):
        D.load_dataset("broken")


HIDDEN = 8


class TinyHead(nn.Module):
    """A user's class that a builder calls: its code is part of the builder's key."""

    def __init__(self, features, classes):
        super().__init__()
        self.fc = nn.Linear(features, classes)

    def forward(self, x):
        return self.fc(x.flatten(1))


def head_builder(*, norm, in_channels, num_classes, image_size, width):
    return nn.Sequential(nn.Conv2d(in_channels, HIDDEN * width, 3, padding=1),
                         M.make_norm(norm, HIDDEN * width, 2),
                         TinyHead(HIDDEN * width * image_size ** 2, num_classes))


def test_the_key_covers_what_a_builder_calls_and_reads(registries, monkeypatch):
    """A constant the builder reads, a class of the user's it calls, a value in its closure:
    each changed gives another key, where the builder's own text is the same."""
    M.register_arch("head_net", head_builder)
    config = RunConfig.grid(dataset="digits", arch="head_net", norm="bn", epochs=1)
    keys = {config.key("cpu")}
    monkeypatch.setitem(globals(), "HIDDEN", 16)
    keys.add(config.key("cpu"))

    class TinyHead(nn.Module):          # the same name, another forward
        def __init__(self, features, classes):
            super().__init__()
            self.fc = nn.Linear(features, classes)

        def forward(self, x):
            return self.fc(torch.relu(x.flatten(1)))

    monkeypatch.setitem(globals(), "TinyHead", TinyHead)
    keys.add(config.key("cpu"))

    def make(hidden):
        def builder(*, norm, in_channels, num_classes, image_size, width):
            return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size ** 2, hidden),
                                 nn.ReLU(), nn.Linear(hidden, num_classes))
        return builder

    for hidden in (4, 256):
        M.register_arch("head_net", make(hidden), replace=True)
        keys.add(config.key("cpu"))
    assert len(keys) == 5
    M.register_arch("head_net", make(4), replace=True)     # the same code and values: same key
    assert config.key("cpu") in keys


def test_a_builders_digest_is_the_same_in_every_process_and_follows_what_it_reads(tmp_path,
                                                                                   monkeypatch):
    """No memory address in the digest (a function as a default or in a constant), a helper
    read through a module of the user's, and an array constant, each followed."""
    import importlib
    import subprocess
    import sys
    import textwrap

    (tmp_path / "user_helpers.py").write_text(textwrap.dedent("""
        import numpy as np
        import torch.nn.functional as F
        SCALE = np.array([1.0, 2.0])
        ACTS = {"relu": F.relu}
        def helper():
            return 4
    """))
    (tmp_path / "user_model.py").write_text(textwrap.dedent("""
        import torch.nn.functional as F
        import user_helpers
        def builder(*, norm, in_channels, num_classes, image_size, width, act=F.relu):
            return user_helpers.helper() * user_helpers.SCALE, user_helpers.ACTS
    """))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import user_model; "
            "from bnmem_utils.models.nets import source_digest; "
            "print(source_digest(user_model.builder))")
    digests = {subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                              text=True, check=True).stdout for _ in range(2)}
    assert len(digests) == 1                                   # the same in two processes
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_helpers
    import user_model

    before = M.source_digest(user_model.builder)
    assert before == digests.pop().strip()
    with monkeypatch.context() as patch:
        patch.setattr(user_helpers, "SCALE", user_helpers.SCALE * 2)
        assert M.source_digest(user_model.builder) != before   # an array constant it reads
    assert M.source_digest(user_model.builder) == before
    text = (tmp_path / "user_helpers.py").read_text().replace("return 4", "return 40")
    (tmp_path / "user_helpers.py").write_text(text)
    importlib.reload(user_helpers)
    assert M.source_digest(user_model.builder) != before       # a helper through its module
    sys.modules.pop("user_helpers"), sys.modules.pop("user_model")
