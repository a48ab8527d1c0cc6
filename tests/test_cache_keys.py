"""One description of a run, one cache key over all of it: every field of every section, the
penalty, the measure, the kind's version and the device type move the key of every kind of run
(a grid run of notebooks 02 and 05, a bank of 04 and 05, a gradient-norm run of 03)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bnmem_utils import bank, config, device, experiments, grads, regularize
from bnmem_utils.config import (
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
    CorruptionConfig: {"flip_rate": 0.2, "ood_rate": 0.03, "ood_count": None,
                       "ood_source": "uniform"},
    ModelConfig: {"arch": "mlp", "norm": "gn", "width": 2},
    TrainConfig: {"epochs": 7, "batch_size": 129, "optimizer": "adam", "lr": 0.06,
                  "momentum": 0.8, "weight_decay": 1e-4, "schedule": "step", "augment": False,
                  "amp": "off", "shift": 3, "flip": True, "step_milestones": (0.3, 0.6),
                  "step_gamma": 0.2, "eval_batch_size": 512},
    GridMeasure: {"track": ("gamma_sigma",), "outputs": ("per_sample",)},
    BankMeasure: {"n_models": 6, "population_size": 50, "queries": ("identity", "mirror"),
                  "query_batch_size": 256, "train_query_batch_size": 32},
    GradNormMeasure: {"measure_epochs": (0, 1), "definitions": ("eval",), "max_clean": 10,
                      "max_noisy": 5},
}
SECTION = {DataConfig: "data", CorruptionConfig: "corruption", ModelConfig: "model",
           TrainConfig: "train"}


def _runs() -> dict[str, RunConfig]:
    """One run of each kind, built through the helpers the notebooks call."""
    grid = experiments.make_grid(datasets=["digits"], archs=["lenet"], norms=["bn"],
                                 corruptions=experiments.corruption_settings(flip_rates=[0.1]),
                                 seeds=[0], epochs=5)[0]
    mitigation = regularize.sweep_specs(regularize.sweep_arms([0.1]), [0], dataset="digits",
                                        arch="lenet", flip_rate=0.1, epochs=5)[1]
    arm = bank.make_arms(dataset="digits", archs=["lenet"], norms=["bn"], outlier_rates=[0.01],
                         n_models=4, epochs=5)[0]
    gradnorm = grads.make_specs(norms=["bn", "none"], seeds=[0], dataset="digits", arch="lenet",
                                flip_rate=0.1, epochs=5, measure_epochs=(0, 5))[0]
    return {"grid run": grid, "mitigation run": mitigation, "bank": arm,
            "mitigation bank": arm.replace(penalty=PenaltyConfig(0.1)), "gradient-norm run": gradnorm}


def test_every_field_has_a_changed_value():
    for cls, changed in CHANGED.items():
        names = {f.name for f in dataclasses.fields(cls)}
        assert names == set(changed), f"add the new field of {cls.__name__} to CHANGED"
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert changed[f.name] != default or f.name == "ood_count", (cls, f.name)


@pytest.mark.parametrize("kind", ["grid run", "mitigation run", "bank", "mitigation bank",
                                  "gradient-norm run"])
@pytest.mark.parametrize(("cls", "name"), [(c, n) for c in SECTION for n in CHANGED[c]
                                           if n != "ood_count"])
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
        if run.norm == "bn":
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
