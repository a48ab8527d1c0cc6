"""RunConfig: built from flat names, read by flat names, every bad value refused by name."""

from __future__ import annotations

import json

import pytest

from bnmem_utils.jobs.config import (
    BankMeasure,
    DataConfig,
    GradNormMeasure,
    GridMeasure,
    ModelConfig,
    PenaltyConfig,
    RunConfig,
)


def test_flat_names_land_in_their_sections_and_read_back_by_their_real_path():
    run = RunConfig.bank(dataset="mnist", data_seed=3, arch="mlp", norm="gn", ood_rate=0.02,
                         epochs=4, lr=0.01, n_models=6, seed=7)
    assert run.data == DataConfig("mnist", seed=3) and run.model == ModelConfig("mlp", "gn")
    assert (run.corruption.ood_rate, run.train.epochs, run.train.lr) == (0.02, 4, 0.01)
    assert isinstance(run.measure, BankMeasure) and run.measure.n_models == 6
    assert (run.model.norm, run.corruption.ood_rate, run.measure.n_models, run.data.seed, run.seed) == ("gn", 0.02, 6, 3, 7)
    assert run.kind == "bank" and run.arm == "mnist/mlp/gn/OOD 2%"
    with pytest.raises(AttributeError):   # a field is read by its real path, not by a flat name
        run.norm  # noqa: B018


def test_each_kind_has_its_measure_and_its_defaults():
    assert isinstance(RunConfig.grid().measure, GridMeasure) and RunConfig.grid().model.arch == "mlp"
    gn = RunConfig.gradnorm()
    assert isinstance(gn.measure, GradNormMeasure)
    assert (gn.corruption.flip_rate, gn.train.epochs, gn.train.lr, gn.train.augment) == (0.1, 30, 0.1, False)
    bank = RunConfig.bank(dataset="cifar10", arch="resnet20")
    assert bank.measure.queries == ("identity", "mirror")            # resolved from the data set
    assert RunConfig.bank().measure.queries[0] == "identity" and len(RunConfig.bank().measure.queries) == 5


def test_replace_routes_flat_names_and_keeps_the_rest():
    run = RunConfig.bank(norm="bn", n_models=4)
    other = run.replace(norm="none", epochs=3, n_models=8)
    assert (other.model.norm, other.train.epochs, other.measure.n_models) == ("none", 3, 8)
    assert other.data == run.data and other.seed == run.seed
    assert run.replace(penalty={"lam": 0.2}).penalty == PenaltyConfig(0.2)
    with pytest.raises(ValueError, match="unknown field 'n_model' of a bank run"):
        run.replace(n_model=8)


def test_plain_dicts_survive_json():
    # a cache record stores as_dict() as JSON and compares it with the config's on reading
    for run in (RunConfig.grid(penalty={"lam": 0.1, "form": "hinge", "tau": 2.0}, norm="bn",
                               track=("gamma_sigma",)),
                RunConfig.bank(ood_rate=0.01, population_size=20),
                RunConfig.gradnorm(measure_epochs=(0, 3), epochs=3, definitions=("eval",))):
        assert json.loads(json.dumps(run.as_dict())) == run.as_dict()


@pytest.mark.parametrize(("kind", "flat", "words"), [
    ("grid", {"nmodels": 3}, ["'nmodels'", "of a grid run", "epochs"]),
    ("bank", {"n_models": 5}, ["even", "5"]),
    ("bank", {"queries": ("mirror",)}, ["'identity'"]),
    ("bank", {"queries": ("identity", "zoom")}, ["'zoom'", "mirror"]),
    ("gradnorm", {"flip_rate": 0.0}, ["nothing is corrupted"]),
    ("gradnorm", {"measure_epochs": (0, 40)}, ["0..30"]),
    ("gradnorm", {"definitions": ("exact",)}, ["'exact'", "eval", "train"]),
    ("grid", {"penalty": {"lam": -1}}, ["lam", "-1"]),
    ("grid", {"penalty": {"lam": 1}, "norm": "ln"}, ["BN models only"]),
    ("grid", {"penalty": {"lam": 1, "form": "cube"}}, ["'cube'", "square", "hinge"]),
    ("grid", {"width": 0}, ["width", "0"]),
    ("grid", {"train_size": 0}, ["train_size"]),
])
def test_bad_values_are_refused_by_name(kind, flat, words):
    with pytest.raises(ValueError) as err:
        RunConfig.make(kind, **flat)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_an_unknown_kind_names_the_valid_ones():
    with pytest.raises(ValueError, match="'sweep'; valid choices: grid, bank, gradnorm"):
        RunConfig.make("sweep")


def test_penalty_labels_and_plain_data():
    assert RunConfig.grid().penalty_label == "none"
    assert PenaltyConfig(0.1).label == "gamma_sigma form=square lam=0.1"
    assert PenaltyConfig(1, "hinge", 1).label == "gamma_sigma form=hinge lam=1 tau=1"
    assert PenaltyConfig.of({"kind": "gamma_sigma", "lam": 0.5}) == PenaltyConfig(0.5)
    assert PenaltyConfig.of({}) is None and PenaltyConfig.of(None) is None
    with pytest.raises(ValueError, match="needs 'lam'"):
        PenaltyConfig.of({"form": "square"})


def test_the_names_a_run_may_list_are_the_registries_names():
    from bnmem_utils.jobs import bank_models as members
    from bnmem_utils.jobs import config
    from bnmem_utils.jobs import grid as experiments
    from bnmem_utils.training import per_sample as persample

    assert set(config.TRACKERS) == set(experiments.TRACKERS)
    assert persample.DEFINITIONS is config.DEFINITIONS and members.QUERIES is config.QUERIES
