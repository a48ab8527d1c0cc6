"""Every notebook parameter is declared once, in bnmem_utils/run/parameters.yaml (its notebook,
default, constraint, dry-run value and help): the notebooks' parameters cells are written from it,
and the runner's up-front validation, `bnmem params` and the notebook's own start() read it; bad
values exit 2 with one line before any kernel starts."""

from __future__ import annotations

import re

import pytest
from kernel_env import in_kernel_env

from bnmem_utils.run import cli, rules, runner
from bnmem_utils.run import params as runparams
from bnmem_utils.run import plan as runplan
from bnmem_utils.run.params import (
    SPEC,
    ParameterError,
    check_parameter,
    check_parameters,
    check_relations,
)
from bnmem_utils.run.rules import Param


@pytest.fixture(scope="module")
def table():
    return runplan.notebook_parameter_table(runplan.discover_notebooks())


def test_every_notebook_parameter_has_a_constraint(table):
    missing = sorted(f"{nb}:{key}" for nb, params in table.items() for key in params if key not in SPEC)
    assert not missing, f"declare these in bnmem_utils/run/parameters.yaml: {missing}"


def test_the_parameters_cells_are_the_tables():
    """Each committed parameters cell is what `bnmem params --write-cells` writes from the table:
    the same names, defaults and help, in the table's order (shared parameters first)."""
    notebooks = runplan.discover_notebooks()
    assert runparams.stale_cells(notebooks) == [], "run `bnmem params --write-cells`"
    declared = rules.declarations()
    assert {nb for d in declared.values() for nb in d.notebooks} == set(notebooks)
    for nb, path in notebooks.items():
        defaults = runparams.notebook_parameters(path)
        assert list(defaults)[:4] == list(runplan.COMMON_PARAMETERS)
        assert defaults == {d.name: d.default for d in rules.notebook_declarations(nb)}
        assert runparams.parameter_comments(path) == {d.name: d.help
                                                      for d in rules.notebook_declarations(nb)}
    shared = [d.name for d in declared.values() if len(d.notebooks) > 1]
    assert shared == list(runplan.COMMON_PARAMETERS)         # declared once, for every notebook


def test_write_cells_rewrites_only_the_tagged_cell(tmp_path):
    import json
    import shutil

    path = tmp_path / "04_lira.ipynb"
    shutil.copy(runplan.discover_notebooks()["04_lira"], path)
    original = json.loads(path.read_text())
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    cell["source"] = ["lira_epochs = 3  # edited by hand\n"]
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["x"]}]
    cell["execution_count"] = 7
    path.write_text(json.dumps(nb, indent=1, sort_keys=True) + "\n")
    assert runparams.stale_cells({"04_lira": path}) == ["04_lira"]
    assert runparams.write_cells({"04_lira": path}) == ["04_lira"]
    assert json.loads(path.read_text()) == original               # tag, id, layout, no outputs
    assert runparams.write_cells({"04_lira": path}) == []


def test_every_declaration_reads_and_its_dry_value_fits(table):
    for d in rules.declarations().values():
        d.param.check(d.default)
        if d.dry is not None and d.dry != "extremes":
            d.param.check(d.dry)
    with pytest.raises(TypeError):
        rules._declare("x_bad", {"default": 1, "help": "h", "maxx": 3}, ("01_theory",))


def test_every_default_and_profile_value_meets_its_constraint(table):
    for nb, params in table.items():
        for key, default in params.items():
            check_parameter(key, default, where=f" of {nb}")
    for name in runplan.available_profiles():
        _, values = runplan.load_profile(name)
        check_parameters(values, where=f" (profile {name})")
        for nb, params in table.items():
            check_relations({**params, **{k: v for k, v in values.items() if k in params}},
                            where=f" of {nb} (profile {name})")


def test_registries_give_the_choices():
    from bnmem_utils.data import datasets as data
    from bnmem_utils.models import nets as models
    from bnmem_utils.privacy import attacks

    assert SPEC["mem_archs"].allowed() == tuple(models.ARCHS)
    assert SPEC["lira_norms"].allowed() == tuple(models.NORMS)
    assert SPEC["grad_datasets"].allowed() == tuple(data.DATASETS)
    # the headline attacks: "auto" (the rule of attacks.headline_attack), or any attack
    for name in ("lira_attack", "cf_attack", "mit_attack"):
        assert SPEC[name].allowed() == ("auto", *attacks.ATTACKS), name
        assert SPEC[name].check("auto") == "auto"
    from bnmem_utils.run.rules import declarations

    assert ("per-sample variance (lira_online) from 32 shadows a side"
            in declarations()["lira_attack"].help)
    assert SPEC["lira_curve_models"].check(0) == 0 and SPEC["lira_curve_models"].check(64) == 64


@pytest.mark.parametrize("param, good, bad", [
    (Param(int, min=4, even=True), [4, 16, 8.0], [3, 0, 2, 5, True, "4", None, 4.5]),
    (Param(float, min=0, lt=1), [0, 0.5], [1.0, -0.1, float("nan"), None, "0.1"]),
    (Param(int, min=1, nullable=True), [None, 1], [0, -3]),
    (Param(list, choices=("bn", "none"), nonempty=True), [["bn"], ("bn", "none")],
     [[], ["bn", "foo"], "bn", None]),
    (Param(list, item=float, min=0, lt=1), [[], [0.1, 0]], [[1.5], [-0.1], ["a"]]),
    (Param(int, min=4, even=True, also=(0,)), [0, 4], [2, -2]),
    (Param(list, choices=("bn", "none", "gn"), contains=("bn", "none")), [["bn", "none"]], [["bn", "gn"]]),
    (Param(bool), [True, False], [0, 1, "true", None]),
])
def test_param_check(param, good, bad):
    for value in good:
        param.check(value)
    for value in bad:
        with pytest.raises(ValueError):
            param.check(value)


def test_messages_name_the_value_and_what_is_allowed():
    with pytest.raises(ParameterError, match=r"'lira_n_models'.* must be an even integer in \[4, 1024\]; got 3"):
        check_parameter("lira_n_models", 3)
    with pytest.raises(ParameterError, match=r"unknown mem_norms element 'foo'; valid choices: bn, none, gn, ln"):
        check_parameter("mem_norms", ["bn", "foo"])


@pytest.fixture
def no_kernel(monkeypatch, tmp_path):
    """Any kernel start fails the test: bad values must be caught before."""
    import papermill

    def boom(*a, **k):
        raise AssertionError("a kernel was started")

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(boom))
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "empty-data"))
    return tmp_path


@pytest.mark.parametrize("argv, words", [
    (["--set", "lira_n_models=3"], ["lira_n_models", "3", "even integer in [4, 1024]"]),
    (["--set", "lira_n_models=0"], ["lira_n_models", "0", "even integer in [4, 1024]"]),
    (["--set", "mem_epochs=-2"], ["mem_epochs", "-2", "in [1, 1000]"]),
    (["--set", "lira_epochs=0"], ["lira_epochs", "0"]),
    (["--set", "mem_momentum=1.0"], ["mem_momentum", "[0, 1)"]),
    (["--set", "mem_flip_rates=[0.1, 1.5]"], ["mem_flip_rates", "1.5", "[0, 1)"]),
    (["--set", "grad_flip_rate=-0.1"], ["grad_flip_rate", "(0, 1)"]),
    (["--set", "lira_ood_source=nosuchset"], ["lira_ood_source", "nosuchset", "gaussian", "cifar10"]),
    (["--set", "mem_lr=null"], ["mem_lr", "None", "null is not allowed"]),
    (["--set", "seed=null"], ["seed", "None"]),
    (["--set", "mem_archs=null"], ["mem_archs", "None"]),
    (["--set", "lira_norms=[]"], ["lira_norms", "non-empty"]),
    (["--set", "mem_norms=[bn, foo]"], ["mem_norms", "foo", "bn, none, gn, ln"]),
    (["--set", "lira_attack=nope"], ["lira_attack", "nope", "lira_online"]),
    (["--set", "mem_executor=slurm"], ["mem_executor", "slurm", "local, ray"]),
    (["--set", "mem_datasets=[mnist]"], ["'mnist'", "02_forced_memorization", "mem_download"]),
    (["--only", "04", "--set", "lira_datasets=[cifar10]"], ["'cifar10'", "04_lira"]),
    (["--set", "grad_measure_epochs=[0, 50]"], ["grad_measure_epochs", "at most grad_epochs (30)", "50"]),
    (["--set", "theory_ratio_min=9.0"], ["theory_ratio_min", "below theory_ratio_max"]),
    (["--only", "04b", "--set", "cf_train_sizes=[100]"], ["cf_train_sizes", "[100]",
                                                          "cf_train_size", "null"]),
    # sizes, counts, epochs and seeds bounded before a kernel would run out of memory or time
    (["--set", "lira_n_models=1000000000000"], ["lira_n_models", "1000000000000", "[4, 1024]"]),
    (["--set", "mem_seeds=1000000000000"], ["mem_seeds", "1000000000000", "[1, 1000]"]),
    (["--set", "theory_ratio_points=1000000000000"], ["theory_ratio_points", "[2, 10000]"]),
    (["--set", "mem_epochs=1000000000000"], ["mem_epochs", "1000000000000", "[1, 1000]"]),
    (["--set", "grad_max_clean=1000000000000"], ["grad_max_clean", "[1, 10000000]"]),
    (["--only", "04", "--set", "lira_train_size=100000"],
     ["lira_train_size", "100000", "at most 1437", "train split of digits"]),
    (["--only", "02", "--set", "mem_test_size=361"], ["mem_test_size", "at most 360", "test split of digits"]),
    (["--only", "04", "--set", "lira_test_size=50", "--set", "lira_population_size=60"],
     ["lira_population_size", "at most lira_test_size (50)", "60"]),
    (["--set", "seed=10000000000000"], ["seed", "10000000000000", "[0, 4294967295]"]),
    (["--set", "seed=4294967296"], ["seed", "4294967296", "[0, 4294967295]"]),
    (["--only", "02", "--set", "seed=4294967295"], ["'seed'", "at most 4294967296 minus mem_seeds (3)"]),
    (["--only", "02", "--set", "mem_epochs=2", "--set", "mem_fixed_epochs=[100]"],
     ["mem_fixed_epochs", "at most mem_epochs (2)", "[100]"]),
    (["--only", "06", "--set", "report_profile=nosuch"], ["report_profile", "'nosuch'", "'' (this profile)"]),
    (["--only", ""], ["--only", "names no notebook", "01_theory"]),
    (["--timeout", "-5"], ["--timeout", "-5"]),
    (["--timeout", "0"], ["--timeout"]),
])
def test_bad_values_exit_2_with_one_line_before_any_kernel(no_kernel, capsys, argv, words):
    code = cli.main(["reproduce", "--quiet", "--out", str(no_kernel / "out"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)


def test_missing_data_set_is_fine_when_the_run_downloads_it(no_kernel, monkeypatch):
    from bnmem_utils.run import preflight

    monkeypatch.setattr(preflight, "download_blocked", lambda name: "")  # its server answers
    plan = runplan.plan_run("quick", only=["02"], overrides=["mem_datasets=[mnist]", "mem_download=true"])
    assert plan.jobs[0].parameters["mem_datasets"] == ["mnist"]


def test_available_data_set_passes(no_kernel, monkeypatch):
    from bnmem_utils.data import datasets as data

    root = no_kernel / "data"
    (root / "MNIST" / "raw").mkdir(parents=True)
    for stem in ("train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1"):
        (root / "MNIST" / "raw" / f"{stem}-ubyte").write_bytes(b"x")
    monkeypatch.setenv("BNMEM_DATA", str(root))
    assert data.dataset_available("mnist") and data.dataset_available("digits")
    assert not data.dataset_available("cifar10")
    runplan.plan_run("quick", only=["02"], overrides=["mem_datasets=[mnist]"])


def test_empty_profile_file_is_an_error(no_kernel, capsys):
    for text in ("", "# only a comment\n", "profile: empty\n"):
        path = no_kernel / "empty.yaml"
        path.write_text(text)
        assert cli.main(["reproduce", "--profile", str(path), "--out", str(no_kernel / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert "sets no parameter" in err and len(err.splitlines()) == 1


def test_bnmem_params_shows_the_constraints(capsys):
    assert cli.main(["params", "04"]) == 0
    out = capsys.readouterr().out
    assert "[allowed: an even integer in [4, 1024]]" in out
    assert "[allowed: a non-empty list of: bn, none, gn, ln (with bn, none)]" in out


@pytest.mark.parametrize("argv", [["params", ""], ["params", " , "], ["params", "", "--write-cells"]])
def test_bnmem_params_naming_no_notebook_says_so_in_its_own_words(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--only" not in err, err
    assert f"NOTEBOOK {argv[1]!r} names no notebook; valid choices: 01_theory" in err, err
    assert "leave NOTEBOOK out" in err


def test_notebook_start_checks_the_same_constraints(monkeypatch, tmp_path):
    import bnmem_utils as bm

    monkeypatch.delenv("BNMEM_RUN_ID", raising=False)
    namespace = {"lira_n_models": 3, "out_dir": str(tmp_path)}
    with pytest.raises(ParameterError, match=r"'lira_n_models' of 04_lira must be an even integer in \[4, 1024\]; got 3"):
        bm.start("04_lira", namespace, verbose=False)


def test_bad_profile_value_message_names_the_bound(no_kernel, capsys):
    path = no_kernel / "mine.yaml"
    path.write_text("lira_n_models: 5\n")
    assert cli.main(["reproduce", "--profile", str(path), "--out", str(no_kernel / "o")]) == 2
    assert "'lira_n_models' (from profile mine) must be an even integer in [4, 1024]; got 5" \
        in capsys.readouterr().err


def test_profile_file_of_random_bytes_is_one_line_exit_2(no_kernel, capsys):
    import random

    path = no_kernel / "noise.yaml"
    path.write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
    assert cli.main(["reproduce", "--profile", str(path), "--out", str(no_kernel / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a text file" in err and str(path) in err, err


def test_report_profile_with_results_is_accepted(no_kernel):
    results = no_kernel / "out" / "runs" / "quick" / "results"
    results.mkdir(parents=True)
    (results / "02_forced_memorization.json").write_text("{}")
    plan = runplan.plan_run("smoke", only=["06"], out_dir=no_kernel / "out",
                           overrides=["report_profile=quick"])
    assert plan.jobs[0].parameters["report_profile"] == "quick"
    runplan.plan_run("smoke", only=["06"], overrides=["report_profile=smoke"])  # this run's own


@pytest.mark.parametrize("profile", sorted(runplan.available_profiles()))
def test_paper_profile_and_its_dry_run_pass(no_kernel, monkeypatch, profile):
    """The bounds leave room for the paper-scale run, the one-hour GPU run and every other
    committed profile, and for their dry runs (data sets assumed on disk)."""
    monkeypatch.setattr(runplan, "check_environment",  # the data sets each notebook reads, unchecked
                        lambda jobs, table, verify_data: runplan.datasets_of(jobs, table)[0])
    for dry in (False, True):
        plan = runplan.plan_run(profile, dry_run=dry, out_dir=no_kernel / "out")
        assert [j.notebook for j in plan.jobs][:2] == ["01_theory", "02_forced_memorization"]


def test_split_sizes_cover_the_data_sets_and_match_the_digits_loader():
    from bnmem_utils.data import datasets as data
    from bnmem_utils.run.params import SPLIT_SIZES

    assert set(SPLIT_SIZES) == set(data.DATASETS)
    digits = data.load_dataset("digits")
    assert SPLIT_SIZES["digits"] == (len(digits.y_train), len(digits.y_test))


def test_seed_offsets_stay_below_two_to_the_32(no_kernel):
    plan = runplan.plan_run("smoke", only=["02"], overrides=["seed=4294967294", "mem_seeds=2"])
    assert plan.jobs[0].parameters["seed"] == 2**32 - 2
    with pytest.raises(ParameterError, match="at most 4294967296 minus mem_seeds"):
        runplan.plan_run("smoke", only=["02"], overrides=["seed=4294967295", "mem_seeds=2"])


# --------------------------------------------------------------------------------------------
# The checks a hostile user found missing: each refused before any kernel with one line
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    # a list that defines runs or banks names each value once
    (["--only", "02", "--set", "mem_norms=[bn, bn, none]"], ["mem_norms", "'bn' is given twice"]),
    (["--only", "04", "--set", "lira_outlier_rates=[0.0, 0.01, 0.01]"],
     ["lira_outlier_rates", "0.01 is given twice"]),
    (["--only", "04b", "--set", "cf_epochs=[1, 2, 2]"], ["cf_epochs", "2 is given twice"]),
    (["--only", "03", "--set", "grad_measure_epochs=[0, 5, 5]"], ["grad_measure_epochs", "5"]),
    (["--only", "05", "--set", "mit_ref_norms=[gn, gn]"], ["mit_ref_norms", "'gn' is given twice"]),
    # every size within the split of the data set chosen (digits: 1437 train, 360 test)
    (["--only", "04b", "--set", "cf_train_size=100000"],
     ["cf_train_size", "at most 1437", "train split of digits"]),
    (["--only", "04b", "--set", "cf_test_size=361"], ["cf_test_size", "at most 360"]),
    (["--only", "04b", "--set", "cf_population_size=5000"],
     ["cf_population_size", "5000", "at most 360", "test split of digits"]),
    (["--only", "04b", "--set", "cf_test_size=100", "--set", "cf_population_size=200"],
     ["cf_population_size", "at most cf_test_size (100)"]),
    # the fewest training samples the code trains on
    (["--only", "02", "--set", "mem_train_size=1"], ["mem_train_size", "[2, 10000000]", "got 1"]),
    (["--only", "05", "--set", "mit_train_size=1"], ["mit_train_size", "[2, 10000000]"]),
    (["--only", "04", "--set", "lira_train_size=2"],
     ["lira_train_size", "each model needs at least 2"]),
    (["--only", "03", "--set", "grad_train_size=4"],
     ["grad_flip_rate", "0.1 of the 4 training samples (grad_train_size)", "= 0 labels",
      "one flipped and one clean", "above 0.125 and below 0.875", "grad_train_size of at least 6"]),
    # every derived seed below 2**32: 05's measurement seeds follow its selection seeds
    (["--only", "05", "--set", "seed=4294967294"],
     ["'seed'", "mit_seeds (5) + mit_measure_seeds (8)", "4294967294"]),
    (["--only", "05", "--set", "seed=4294967290", "--set", "mit_seeds=2"],
     ["'seed'", "mit_measure_seeds (8)"]),
    # replicate banks and ladders take the seeds after seed
    (["--only", "04", "--set", "seed=4294967295"], ["'seed'", "lira_replicates (3)"]),
    (["--only", "04b", "--set", "seed=4294967294"], ["'seed'", "cf_replicates (3)"]),
    # the confound study's other norm lists name only norms of its ladder
    (["--only", "04b", "--set", "cf_norms=[bn, none]", "--set", "cf_replicated_norms=[bn, gn]"],
     ["cf_replicated_norms", "only values of cf_norms (bn, none)", "['bn', 'gn']"]),
    (["--only", "04b", "--set", "cf_norms=[bn, none]", "--set", "cf_knob_norms=[ln]"],
     ["cf_knob_norms", "only values of cf_norms"]),
])
def test_hostile_values_exit_2_with_one_line_before_any_kernel(no_kernel, capsys, argv, words):
    test_bad_values_exit_2_with_one_line_before_any_kernel(no_kernel, capsys, argv, words)


def test_seeds_up_to_the_last_measurement_seed_pass(no_kernel):
    top = 2**32 - 1 - 5 - 8 + 1
    plan = runplan.plan_run("quick", only=["05"], overrides=[f"seed={top}"])
    assert plan.jobs[0].parameters["seed"] == top


def test_a_key_given_twice_in_a_profile_is_refused_naming_it_and_its_lines(no_kernel, capsys):
    path = no_kernel / "twice.yaml"
    path.write_text("# mine\nmem_epochs: 2\nmem_lr: 0.1\nmem_epochs: 500\n")
    assert cli.main(["reproduce", "--profile", str(path), "--out", str(no_kernel / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "'mem_epochs' is given twice (lines 2 and 4)" in err and str(path) in err, err


@pytest.mark.parametrize("text, words", [
    ("? [a, b]\n: 1\n", ["the key ['a', 'b'] (line 1) is a list", "a key is a name"]),
    ("mem_epochs: 2\n? {a: 1}\n: 3\n", ["the key {'a': 1} (line 2) is a mapping"]),
])
def test_a_profile_key_that_is_a_list_or_a_mapping_is_one_line_exit_2(no_kernel, capsys, text,
                                                                        words):
    path = no_kernel / "keys.yaml"
    path.write_text(text)
    assert cli.main(["reproduce", "--profile", str(path), "--out", str(no_kernel / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err, err
    for word in words:
        assert word in err, (word, err)


def test_numbers_follow_yaml_1_2_in_profiles_and_set(no_kernel):
    assert runplan.parse_overrides(["mem_lr=1e-3", "mem_weight_decay=5E-4", "mem_epochs=1e1"]) \
        == {"mem_lr": 0.001, "mem_weight_decay": 0.0005, "mem_epochs": 10.0}
    plan = runplan.plan_run("smoke", only=["02"], overrides=["mem_lr=1e-3", "mem_epochs=1e1"])
    assert plan.jobs[0].parameters["mem_lr"] == 0.001 and plan.jobs[0].parameters["mem_epochs"] == 10
    path = no_kernel / "exp.yaml"
    path.write_text("mem_lr: 2e-2\nmem_weight_decay: 1.0e-4\nmem_ood_source: 1e-3x\n")
    assert runplan.load_profile(str(path))[1] == {"profile": "exp", "mem_lr": 0.02,
                                                   "mem_weight_decay": 0.0001,
                                                   "mem_ood_source": "1e-3x"}


def test_integers_follow_yaml_1_2_not_1_1s_octal_and_base_60(no_kernel):
    """YAML 1.1 reads 017 as octal 15 and 1:30 as 90: a seed or an epoch count silently other
    than typed. Under YAML 1.2 017 is 17, 0o17 and 0x1f are octal and hex, and 1:30, 0b101
    and 1_000 are strings, which the parameter's check names."""
    assert runplan.parse_overrides(["seed=017", "mem_epochs=+08", "mem_seeds=0o17",
                                    "grad_seeds=0x1f"]) \
        == {"seed": 17, "mem_epochs": 8, "mem_seeds": 15, "grad_seeds": 31}
    assert runplan.parse_overrides(["seed=1:30", "mem_seeds=0b101", "mem_epochs=1_000",
                                    "mem_lr=1_0.5"]) \
        == {"seed": "1:30", "mem_seeds": "0b101", "mem_epochs": "1_000", "mem_lr": "1_0.5"}
    path = no_kernel / "octal.yaml"
    path.write_text("seed: 010\nmem_epochs: 1:30\n")
    assert runplan.load_profile(str(path))[1] == {"profile": "octal", "seed": 10,
                                                   "mem_epochs": "1:30"}
    assert cli.main(["reproduce", "--profile", "smoke", "--only", "01", "--set", "seed=1:30",
                     "--out", str(no_kernel / "o")]) == 2


def test_old_gradient_norm_names_still_work_with_one_line(no_kernel, capsys):
    plan = runplan.plan_run("smoke", only=["03"], overrides=["gn_epochs=3"])
    assert plan.jobs[0].parameters["grad_epochs"] == 3 and "gn_epochs" not in plan.jobs[0].parameters
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'gn_epochs'" in err[0] and "'grad_epochs'" in err[0], err
    path = no_kernel / "old.yaml"
    path.write_text("gn_epochs: 4\ngn_norms: [bn, none]\n")
    assert runplan.load_profile(str(path))[1] == {"profile": "old", "grad_epochs": 4,
                                                   "grad_norms": ["bn", "none"]}
    assert len(capsys.readouterr().err.strip().splitlines()) == 2
    with pytest.raises(runparams.UsageError, match="both 'gn_epochs' and its new name 'grad_epochs'"):
        runplan.parse_overrides(["gn_epochs=3", "grad_epochs=4"])


def test_a_population_larger_than_the_test_split_is_an_error_not_clamped():
    from bnmem_utils.jobs.bank_models import prepare_data
    from bnmem_utils.jobs.config import RunConfig

    config = RunConfig.bank(dataset="digits", n_models=4, train_size=40, population_size=5000)
    with pytest.raises(ValueError, match="population_size must be at most the 360 test samples"):
        prepare_data(config)


# --------------------------------------------------------------------------------------------
# Inputs that failed inside a kernel, or ran and proved nothing: each refused before any kernel
# with one line naming the value and what is allowed
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    # notebook 01's toy models: two input dimensions, two seeds, an even clean batch, full BN on
    # at least 3 samples (on 2 its first order is off by 6% to 3,400%), the orthogonal cosine
    (["--only", "01", "--set", "theory_dim=1"], ["theory_dim", "got 1", "[2, 4096]"]),
    (["--only", "01", "--set", "theory_loop_dim=1"], ["theory_loop_dim", "got 1", "[2, 4096]"]),
    (["--only", "01", "--set", "theory_loop_n_clean=3"],
     ["theory_loop_n_clean", "got 3", "an even integer in [2, 10000]"]),
    (["--only", "01", "--set", "theory_loop_seeds=1"], ["theory_loop_seeds", "got 1", "[2, 10000]"]),
    (["--only", "01", "--set", "theory_conv_cosines=[0.3]"],
     ["theory_conv_cosines", "[0.3]", "(with 0.0)", "lacks 0.0"]),
    (["--only", "01", "--set", "theory_conv_batch_sizes=[2, 64]"],
     ["theory_conv_batch_sizes", "the element 2", "each an integer in [3, 65536]"]),
    (["--only", "01", "--set", "theory_batch_size=2"], ["theory_batch_size", "got 2", "[3, 65536]"]),
    # lists a notebook reads a named element of
    (["--only", "04", "--set", "lira_norms=[bn, gn]"],
     ["lira_norms", "['bn', 'gn']", "(with bn, none)", "lacks 'none'"]),
    (["--only", "03", "--set", "grad_definitions=[train]"],
     ["grad_definitions", "['train']", "(with eval)", "lacks 'eval'"]),
    (["--only", "05", "--set", "mit_ref_norms=[bn]"],
     ["mit_ref_norms", "'bn'", "valid choices: none, gn, ln"]),
    # a YAML key that is a list or a mapping (a TypeError traceback before)
    (["--only", "02", "--set", "mem_norms={[a]: 1}"],
     ["--set 'mem_norms={[a]: 1}'", "the key ['a'] (line 1) is a list", "a key is a name"]),
    (["--only", "02", "--set", "mem_norms=[{? {x: 1} : 2}]"], ["mem_norms", "is a mapping"]),
    # the same --set key twice (the second won, silently)
    (["--only", "02", "--set", "mem_epochs=2", "--set", "mem_epochs=3"],
     ["--set 'mem_epochs' is given twice", "'mem_epochs=2' and 'mem_epochs=3'", "give it once"]),
    (["--only", "03", "--set", "gn_epochs=2", "--set", "gn_epochs=3"], ["'gn_epochs' is given twice"]),
    # the hinge form trains at each (lambda, tau): one list without the other trains no hinge run
    (["--only", "05", "--set", "mit_hinge_taus=[]"],
     ["mit_hinge_lams", "[1.0, 10.0]", "needs mit_hinge_taus set", "it is empty",
      "mit_hinge_lams=[]"]),
    (["--only", "05", "--set", "mit_hinge_lams=[]"],
     ["mit_hinge_taus", "[1.0]", "needs mit_hinge_lams set", "mit_hinge_taus=[]"]),
    # a corruption rate above 0 that rounds to no corrupted sample (round(rate * n), n the
    # training set, a bank's pool before its inserts): the clean setting under another name
    (["--only", "05", "--set", "mit_train_size=40", "--set", "mit_flip_rate=0.01"],
     ["mit_flip_rate", "0.01 of the 40 training samples (mit_train_size)", "round(0.4) = 0 labels",
      "a rate above 0.0125", "mit_train_size of at least 51"]),
    (["--only", "04", "--set", "lira_train_size=100", "--set", "lira_outlier_rates=[0.0,0.004]"],
     ["lira_outlier_rates", "0.004 of the 100", "= 0 OOD samples",
      "0 (clean data) or a rate above 0.005", "lira_train_size of at least 126"]),
    (["--only", "04", "--set", "lira_train_size=60", "--set", "lira_outlier=flip",
      "--set", "lira_outlier_rates=[0.0,0.005]"],
     ["lira_outlier_rates", "0.005 of the 60", "flips round(0.3) = 0 labels", "above 0.00833"]),
    (["--only", "02", "--set", "mem_train_size=40"],
     ["mem_flip_rates", "0.01 of the 40", "= 0 labels", "mem_train_size of at least 51"]),
    (["--only", "02", "--set", "mem_flip_rates=[0.1]", "--set", "mem_ood_rates=[0.0002]"],
     ["mem_ood_rates", "0.0002 of the 1437 training samples (mem_train_size null: a whole split)",
      "= 0 OOD samples", "a rate above 0.000348"]),
    (["--only", "04b", "--set", "cf_train_size=40"],
     ["cf_outlier_rate", "0.01 of the 40", "(cf_train_size)", "= 0 OOD samples",
      "0 (clean data) or a rate above 0.0125", "cf_train_size of at least 51"]),
    (["--only", "04b", "--set", "cf_train_size=300", "--set", "cf_train_sizes=[50]"],
     ["cf_outlier_rate", "0.01 of the 50", "(cf_train_sizes)", "round(0.5) = 0",
      "cf_train_sizes of at least 51"]),
    (["--only", "03", "--set", "grad_train_size=4", "--set", "grad_flip_rate=0.9"],
     ["grad_flip_rate", "round(3.6) = 4 labels", "one flipped and one clean", "below 0.875"]),
    # the shadow-count curve with every count above its bank: no point to draw
    (["--only", "04", "--set", "lira_curve_models=6", "--set", "lira_curve_shadows=[8]"],
     ["lira_curve_shadows", "[8]", "lira_curve_models (6)", "a count of at most 6",
      "lira_curve_models of at least 8", "0 (no curve)"]),
    # an attack chosen by name that its banks cannot run as named (it would fit another variance)
    (["--profile", "smoke", "--only", "04", "--set", "lira_attack=lira_online"],
     ["'lira_attack' of 04_lira", "lira_online fits each sample its own variance",
      "lira_n_models 4 leaves k = 1", "lira_online_fixed", "lira_n_models of at least 6"]),
    (["--profile", "smoke", "--only", "04b", "--set", "cf_attack=lira_offline"],
     ["'cf_attack'", "cf_n_models 4 leaves k = 1", "lira_offline_fixed"]),
    (["--profile", "smoke", "--only", "05", "--set", "mit_attack=lira_online"],
     ["'mit_attack'", "mit_bank_models 4 leaves k = 1", "mit_bank_models of at least 6"]),
    (["--dry-run", "--only", "04", "--set", "lira_attack=lira_online"],
     ["'lira_attack' of 04_lira in this --dry-run", "lira_n_models 4 leaves k = 1"]),
])
def test_inputs_that_failed_late_exit_2_with_one_line_before_any_kernel(no_kernel, capsys, argv,
                                                                         words):
    test_bad_values_exit_2_with_one_line_before_any_kernel(no_kernel, capsys, argv, words)


@pytest.mark.parametrize("n, rate", [(40, 0.01), (50, 0.01), (51, 0.01), (100, 0.005),
                                     (101, 0.005), (150, 0.01), (250, 0.006), (300, 0.1)])
def test_the_check_counts_the_corrupted_samples_as_the_corruption_does(n, rate):
    """The check refuses a rate exactly when corrupt() would flip, or insert, no sample (Python's
    round: 0.5 rounds to 0)."""
    from bnmem_utils.data.datasets import CLEAN, corrupt, load_dataset

    data = load_dataset("digits", train_size=n)
    for kind in ("flip", "ood"):
        corrupted = corrupt(data, **{f"{kind}_rate": rate})
        count = int((corrupted.kind != CLEAN).sum())
        values = {"lira_outlier_rates": [rate], "lira_train_size": n, "lira_outlier": kind,
                  "lira_datasets": ["digits"]}
        if count:
            check_relations(values)
        else:
            with pytest.raises(ParameterError, match="= 0 "):
                check_relations(values)


def test_the_curve_check_refuses_exactly_the_curves_without_a_point():
    from bnmem_utils.privacy.shadow_curve import curve_sizes

    for models in (6, 8, 10, 32):
        for shadows in ([2], [4, 8], [8], [10, 12], [6], [12, 64], [34]):
            values = {"lira_curve_models": models, "lira_curve_shadows": shadows}
            if curve_sizes(shadows, models, paired=True):
                check_relations(values)
            else:
                with pytest.raises(ParameterError, match="no point"):
                    check_relations(values)
    check_relations({"lira_curve_models": 0, "lira_curve_shadows": [64]})   # no curve


@pytest.mark.parametrize("models, shadows", [(6, [6]), (6, [2, 4]), (8, [8]), (64, [64]),
                                             (1024, [1024]), (10, [10, 12])])
def test_a_curve_with_a_point_keeps_one_in_its_dry_run(models, shadows):
    table = runplan.notebook_parameter_table(runplan.discover_notebooks())
    values = {"lira_curve_models": models, "lira_curve_shadows": shadows}
    check_relations(values)
    check_relations(runplan.dry_run_values(values, table))


@pytest.mark.parametrize("attack, pooled", [("lira_online", "lira_online_fixed"),
                                            ("lira_offline", "lira_offline_fixed")])
def test_the_attack_check_refuses_exactly_the_banks_where_the_attack_runs_as_another(attack, pooled):
    """A per-sample-variance attack on a bank attacked leave-one-out scores as its pooled twin
    where the bank leaves 1 shadow a side (N = 4): exactly there the check refuses it."""
    import numpy as np

    from bnmem_utils.core.checks import keep_matrix
    from bnmem_utils.privacy.attacks import evaluate_leave_one_out

    rng = np.random.default_rng(0)
    for n in (4, 6, 8):
        keep = keep_matrix(n, 40, 0)
        scores = rng.normal(size=(n, 40, 2)) + keep[:, :, None]
        named = evaluate_leave_one_out(keep, scores, attacks=[attack, pooled], targets=[0])
        same = np.allclose(named.member_scores[attack][0], named.member_scores[pooled][0])
        values = {"lira_attack": attack, "lira_n_models": n}
        if same:
            with pytest.raises(ParameterError, match=f"{attack} fits each sample its own"):
                check_relations(values)
        else:
            check_relations(values)
        assert same == (n == 4)


def test_a_dry_run_keeps_the_banks_an_attack_chosen_by_name_needs(tmp_path):
    """A profile that names a per-sample-variance attack runs its dry run on banks of 6 (the
    dry run's 4 would leave 1 shadow a side); one on auto keeps the dry run's 4."""
    profile = tmp_path / "named.yaml"
    profile.write_text("lira_attack: lira_online\nlira_n_models: 8\n")
    plan = runplan.plan_run(profile, only=["04"], dry_run=True, out_dir=tmp_path / "out")
    assert plan.jobs[0].parameters["lira_n_models"] == 6
    plan = runplan.plan_run("quick", only=["04"], dry_run=True, out_dir=tmp_path / "out")
    assert plan.jobs[0].parameters["lira_n_models"] == 4


def test_a_profile_sized_for_a_gpu_stops_on_a_cpu_before_any_kernel(no_kernel, monkeypatch,
                                                                      capsys):
    """gpu and paper, where --device auto finds no GPU, stop in one line naming their projected
    time on the GPU and the ways on, before any kernel starts and before the data sets are
    looked for; --allow-cpu, a device asked for by name and a dry run go on, and a profile not
    sized for a GPU is not stopped."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    looked = []
    monkeypatch.setattr(runplan, "check_environment", lambda jobs, table, verify_data:
                        looked.append(1) or runplan.datasets_of(jobs, table)[0])
    for profile in ("gpu", "paper"):
        code = cli.main(["reproduce", "--profile", profile, "--quiet", "--out",
                         str(no_kernel / "out")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert re.search(rf"profile {profile} is sized for a GPU \(projected [\d.]+ (min|h) on "
                         r"one H200\)", err), err
        for words in ("no projection of it exists", "--dry-run", "--allow-cpu", "--device cpu"):
            assert words in err, (words, err)
    assert looked == []
    out = str(no_kernel / "out")
    for kwargs in ({"allow_cpu": True}, {"device": "cpu"}, {"dry_run": True}):
        runplan.plan_run("gpu", out_dir=out, **({"allow_cpu": False} | kwargs))
    runplan.plan_run("quick", out_dir=out, allow_cpu=False)
    runplan.plan_run(runplan.available_profiles()["gpu"], out_dir=out)   # planning alone
    seen = {}

    def reproduce(*args, **kwargs):
        seen.update(kwargs)
        raise runner.UsageError("recorded")

    monkeypatch.setattr(runner, "reproduce", reproduce)
    assert cli.main(["reproduce", "--profile", "gpu", "--allow-cpu", "--quiet"]) == 2
    assert seen["allow_cpu"] is True
