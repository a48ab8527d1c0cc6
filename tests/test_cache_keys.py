"""Every cached object's key hashes the complete resolved configuration that produced it.

Each default of :class:`bnmem_utils.train.TrainConfig` is changed in turn (by a subclass with
that one default changed, put where the configs look the class up); the key of every cached
kind built the way the notebooks build it must change with it: a grid run (02, 05), a bank
(04), a gradient-norm run (03) and a mitigation bank (05, penalised members in their own
folder).
"""

from __future__ import annotations

import dataclasses

import pytest

from bnmem_utils import bank, experiments, grads, regularize, train
from bnmem_utils.train import TrainConfig

# One changed value per TrainConfig field (each valid, each different from the default).
CHANGED = {
    "epochs": 21, "batch_size": 129, "optimizer": "adam", "lr": 0.06, "momentum": 0.8,
    "weight_decay": 1e-4, "schedule": "step", "augment": False, "amp": "off", "shift": 3,
    "flip": True, "step_milestones": (0.3, 0.6), "step_gamma": 0.2, "eval_batch_size": 512,
}


def test_every_trainconfig_field_has_a_changed_value():
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert names == set(CHANGED), "add the new TrainConfig field to CHANGED"
    for name, value in CHANGED.items():
        default = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
        old = default.default if default.default is not dataclasses.MISSING else default.default_factory()
        assert value != old


def _with_default(name, value):
    f = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    return dataclasses.make_dataclass("TrainConfig", [(name, f.type, dataclasses.field(default=value))],
                                      bases=(TrainConfig,))


def _keys() -> dict[str, str]:
    """The key of each cached kind, built through the helpers the notebooks call."""
    run = experiments.make_grid(datasets=["digits"], archs=["lenet"], norms=["bn"],
                                corruptions=experiments.corruption_settings(flip_rates=[0.1]),
                                seeds=[0], epochs=5)[0]
    mit_run = regularize.sweep_specs(regularize.sweep_arms([0.1]), [0], dataset="digits",
                                     arch="lenet", flip_rate=0.1, epochs=5)[-1]
    cfg = bank.make_arms(dataset="digits", archs=["lenet"], norms=["bn"], outlier_rates=[0.01],
                         n_models=4, epochs=5)[0]
    gn = grads.make_specs(norms=["bn", "none"], seeds=[0], dataset="digits", arch="lenet", flip_rate=0.1,
                          epochs=5, measure_epochs=(0, 5))[0]
    penalty = {"kind": "gamma_sigma", "lam": 0.1}
    mit_bank = (str(regularize.bank_cache_dir("/cache", penalty)), cfg.replace(n_models=4).key())
    return {"grid run": run.key(), "mitigation run": mit_run.key(), "bank": cfg.key(),
            "gradient-norm run": gn.key(), "mitigation bank": "/".join(mit_bank)}


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_changing_a_trainconfig_default_changes_every_cache_key(monkeypatch, name):
    before = _keys()
    monkeypatch.setattr(train, "TrainConfig", _with_default(name, CHANGED[name]))
    after = _keys()
    # A field a spec sets itself (epochs, lr, ...) never reaches training from the default, so
    # its key may stay; every other field must move every key.
    run = experiments.RunSpec()
    mirrored = run.train_config().as_dict()[name] != _with_default(name, CHANGED[name])().as_dict()[name]
    for kind in before:
        if mirrored:
            continue
        assert after[kind] != before[kind], f"{kind} key ignores TrainConfig.{name}"


@pytest.mark.parametrize("name", ["shift", "flip", "step_milestones", "step_gamma", "eval_batch_size"])
def test_unmirrored_fields_move_every_key(monkeypatch, name):
    before = _keys()
    monkeypatch.setattr(train, "TrainConfig", _with_default(name, CHANGED[name]))
    after = _keys()
    assert all(after[k] != before[k] for k in before), (name, before, after)


def test_cache_versions_bumped():
    assert bank.BANK_VERSION >= 3 and experiments.CACHE_VERSION >= 3 and grads.CACHE_VERSION >= 3


def test_penalty_folder_depends_on_the_penalty_and_its_version(monkeypatch):
    a = regularize.bank_cache_dir("/c", {"kind": "gamma_sigma", "lam": 0.1})
    b = regularize.bank_cache_dir("/c", {"kind": "gamma_sigma", "lam": 0.2})
    assert a != b
    monkeypatch.setattr(regularize, "PENALTY_VERSION", regularize.PENALTY_VERSION + 1)
    assert regularize.bank_cache_dir("/c", {"kind": "gamma_sigma", "lam": 0.1}) != a
