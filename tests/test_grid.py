"""The grid runner: configs, cache hits, damaged caches, forced retraining, resuming a grid.

Most tests replace the training step with a counting fake, so they check the caching logic in
milliseconds; one test trains a real tiny model end to end on the digits data.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from bnmem_utils.core.device import cpu_threads
from bnmem_utils.jobs import grid as ex
from bnmem_utils.jobs.config import PenaltyConfig, RunConfig, TrainConfig
from bnmem_utils.jobs.grid import RunResult


@pytest.fixture
def fake_training(monkeypatch):
    """Replace the data loader and the training step by fakes that count their calls."""
    calls = {"train": [], "load": []}

    def fake_loader(device, root=None, download=False):
        held = {}

        def load(config):
            if config.data not in held:
                held.clear()
                calls["load"].append(config.data.dataset)
                held[config.data] = f"data:{config.data.dataset}"
            return held[config.data]
        return load

    def fake_train(config, dataset, device, *, progress=False):
        calls["train"].append(config)
        assert dataset == f"data:{config.data.dataset}"
        epochs = np.arange(1, config.train.epochs + 1)
        hist = pd.DataFrame({"epoch": epochs, "train_loss": 1.0 / epochs,
                             "corrupted_acc": 1 - np.exp(-0.5 * epochs), "test_acc": 0.9})
        gs = pd.DataFrame({"layer": ["l1", "l1"], "channel": [0, 1], "gamma": [1.0, 2.0],
                           "running_sigma": [0.5, 4.0], "ratio": [2.0, 0.5]})
        res = RunResult(config=config, key=config.key(device), history=hist, gamma_sigma=gs,
                        seconds=0.01, device=str(device))
        return res

    monkeypatch.setattr(ex, "dataset_loader", fake_loader)
    monkeypatch.setattr(ex, "train_run", fake_train)
    return calls


def config(**kw) -> RunConfig:
    base = {"dataset": "digits", "arch": "mlp", "norm": "bn", "flip_rate": 0.05, "epochs": 3}
    return RunConfig.grid(**{**base, **kw})


# -- configs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, words", [
    ("arch", "vgg", ["'vgg'", "lenet", "mlp"]),
    ("norm", "batch", ["'batch'", "bn", "none", "gn", "ln"]),
    ("dataset", "svhn", ["'svhn'", "digits", "cifar10"]),
    ("track", ("gradients",), ["'gradients'", "gamma_sigma"]),
    ("penalty", {"kind": "l2"}, ["'l2'", "gamma_sigma"]),
    ("optimizer", "lbfgs", ["'lbfgs'", "sgd", "adam"]),
    ("schedule", "linear", ["'linear'", "cosine"]),
    ("ood_source", "digits", ["'digits'", "gaussian", "mnist"]),
])
def test_unknown_names_raise_clear_errors(field, value, words):
    with pytest.raises(ValueError) as err:
        config(**{field: value})
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("kw", [{"flip_rate": 1.5}, {"ood_rate": -0.1}, {"epochs": 0}])
def test_bad_values_raise(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        config(**kw)


def test_spec_is_hashable_and_keys_are_stable():
    reg = {"kind": "gamma_sigma", "lam": 0.01, "form": "hinge", "tau": 1.0}
    a = config(penalty=reg)
    b = config(penalty=dict(reversed(list(reg.items()))))
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    assert a.penalty == PenaltyConfig(0.01, "hinge", 1.0)
    assert a.penalty_label == "gamma_sigma form=hinge lam=0.01 tau=1"
    assert config().penalty_label == "none"
    assert len({config().key(), config(norm="none").key(), config(seed=1).key(), a.key()}) == 4
    assert json.loads(json.dumps(a.as_dict())) == a.as_dict()


def test_setting_labels():
    assert config().setting == "flip 5%"
    assert config(flip_rate=0.0, ood_rate=0.02).setting == "OOD 2% (gaussian)"
    assert config(flip_rate=0.0, ood_rate=0.03, ood_source="mnist").setting == "OOD 3% (mnist)"
    assert config(flip_rate=0.0).setting == "clean"
    assert config(flip_rate=0.005).setting == "flip 0.5%"


def test_make_grid_product_and_order():
    corr = ex.corruption_settings(flip_rates=[0.01, 0.1], ood_rates=[0.02])
    grid = ex.make_grid(datasets=["digits"], archs=["mlp", "lenet"], norms=["bn", "none"],
                        corruptions=corr, seeds=[0, 1], train=TrainConfig(epochs=2))
    assert len(grid) == 1 * 2 * 3 * 2 * 2
    assert len(set(grid)) == len(grid)
    assert [g.model.norm for g in grid[:2]] == ["bn", "none"]  # norms vary fastest: pairs finish together
    assert grid[0].train.epochs == 2 and grid[-1].setting == "OOD 2% (gaussian)"


# -- cache ----------------------------------------------------------------------------------------
def test_cache_hit_does_not_retrain(fake_training, tmp_path):
    s = config()
    first = ex.run_one(s, "cpu", tmp_path)
    second = ex.run_one(s, "cpu", tmp_path)
    assert len(fake_training["train"]) == 1
    assert not first.cached and second.cached
    pd.testing.assert_frame_equal(first.history, second.history, check_dtype=False)
    pd.testing.assert_frame_equal(first.gamma_sigma, second.gamma_sigma, check_dtype=False)


@pytest.mark.parametrize("damage", ["truncate", "edit", "garbage", "other_spec"])
def test_damaged_cache_is_rebuilt(fake_training, tmp_path, damage):
    s = config()
    ex.run_one(s, "cpu", tmp_path)
    path = ex.cache_path(tmp_path, s.key("cpu"))
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "edit":  # a changed number with the old digest
        record = torch.load(path, weights_only=True)
        record["meta"] = record["meta"].replace('"diverged": false', '"diverged": true')
        torch.save(record, path)
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff" * 10)
    else:  # a valid file for another config copied under this key
        other = ex.run_one(config(seed=7), "cpu", tmp_path)
        path.write_bytes(ex.cache_path(tmp_path, other.key).read_bytes())
    n_before = len(fake_training["train"])
    with pytest.warns(UserWarning, match="rebuilding a damaged cache entry"):
        res = ex.run_one(s, "cpu", tmp_path)
    assert not res.cached and len(fake_training["train"]) == n_before + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ex.run_one(s, "cpu", tmp_path).cached  # the rebuilt file is sound


def test_force_retrains(fake_training, tmp_path):
    s = config()
    ex.run_one(s, "cpu", tmp_path)
    res = ex.run_one(s, "cpu", tmp_path, force=True)
    assert not res.cached and len(fake_training["train"]) == 2


def test_grid_resumes_and_loads_each_dataset_once(fake_training, tmp_path):
    grid = ex.make_grid(datasets=["digits", "mnist"], archs=["mlp"], norms=["bn", "none"],
                        corruptions=ex.corruption_settings(flip_rates=[0.05]), seeds=[0, 1],
                        train=TrainConfig(epochs=2))
    # An "interrupted" first pass finished only three runs.
    ex.run_grid(grid[:3], "cpu", tmp_path, progress=False)
    assert len(fake_training["train"]) == 3
    results = ex.run_grid(grid, "cpu", tmp_path, progress=False)
    assert len(fake_training["train"]) == len(grid)                 # only the rest trained
    assert [r.config for r in results] == grid                         # results in config order
    assert sum(r.cached for r in results) == 3
    assert fake_training["load"].count("mnist") == 1                 # once per data set per grid
    # A fully cached grid loads no data at all.
    n_loads = len(fake_training["load"])
    assert all(r.cached for r in ex.run_grid(grid, "cpu", tmp_path, progress=False))
    assert len(fake_training["load"]) == n_loads
    with pytest.raises(ValueError, match="duplicate"):
        ex.run_grid([grid[0], grid[0]], "cpu", tmp_path, progress=False)


def test_long_frames_carry_identity_columns(fake_training, tmp_path):
    grid = ex.make_grid(datasets=["digits"], archs=["mlp"], norms=["bn", "none"],
                        corruptions=ex.corruption_settings(flip_rates=[0.1]), seeds=[0, 1],
                        train=TrainConfig(epochs=4))
    results = ex.run_grid(grid, "cpu", tmp_path, progress=False)
    hist = ex.history_frame(results)
    assert len(hist) == 4 * 4
    assert {"dataset", "arch", "norm", "setting", "seed", "run", "epoch",
            "corrupted_acc", "diverged"} <= set(hist.columns)
    assert set(hist["setting"]) == {"flip 10%"}
    gs = ex.gamma_sigma_frame(results)
    assert len(gs) == 2 * 4 and {"norm", "seed", "layer", "ratio"} <= set(gs.columns)
    assert ex.timing_summary(results)["runs"].tolist() == [2, 2]


# -- one real run ---------------------------------------------------------------------------------
def test_real_tiny_run_end_to_end(tmp_path):
    s = RunConfig.grid(dataset="digits", arch="mlp", norm="bn", flip_rate=0.1, ood_rate=0.034,  # 10
                       epochs=2, batch_size=64, train_size=300, test_size=100, augment=False,
                       track=("gamma_sigma",))
    res = ex.run_one(s, "cpu", tmp_path)
    h = res.history
    assert len(h) == 2 and not res.diverged
    for col in ("corrupted_acc", "flipped_acc", "ood_acc", "clean_acc", "test_acc",
                "corrupted_loss", "gs_median", "gs_frac_above_1"):
        assert col in h.columns and h[col].notna().all(), col
    assert h["corrupted_acc"].between(0, 1).all()
    assert len(res.gamma_sigma) == 256 + 128                         # one row per BN channel
    assert (res.gamma_sigma["ratio"] > 0).all()
    again = ex.run_one(s, "cpu", tmp_path)
    assert again.cached
    pd.testing.assert_frame_equal(h, again.history, check_dtype=False)
    assert len(ex.run_one(s.replace(norm="none"), "cpu", tmp_path).gamma_sigma) == 0


def test_cpu_threads_is_restored():
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with cpu_threads(None):
        assert torch.get_num_threads() == before
