"""The batch runner and the ``bnmem`` CLI, on a throw-away project of tiny notebooks.

``BNMEM_ROOT`` points the package at a temporary folder holding ``notebooks/`` and
``BNMEM_PROFILES`` at its profiles, so nothing here reads or writes the repository's runs/ or
figures/. Only ``test_end_to_end_*`` start Jupyter kernels (one shared run of three notebooks);
everything else is plain Python and takes milliseconds.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import nbformat
import pytest
from kernel_env import in_kernel_env

from bnmem_utils.core import threads
from bnmem_utils.run import cli, runner
from bnmem_utils.run import plan as runplan
from bnmem_utils.run.runner import UsageError

COMMON = '''profile = "quick"  # parameter profile, names the output folders
device = "auto"  # auto, cpu, cuda or mps
out_dir = ""  # output root ("" = project root)
seed = 0  # random seed
'''

ALPHA_PARAMS = COMMON + '''alpha_n = 3  # a count
alpha_scale = 1.5  # a float (units: none)
alpha_name = "x"  # a string
alpha_flag = False  # a boolean
alpha_sizes = [1, 2]  # a list
'''

ALPHA_BODY = [
    'import bnmem_utils as bm\nnb = bm.start("01_alpha", globals())',
    'import matplotlib.pyplot as plt\nfrom bnmem_utils.run import notebook\n'
    'fig, ax = plt.subplots()\n'
    'ax.plot([0, 1], [0, alpha_scale])\n'
    'nb.save_figure(fig, "line", data={"x": [0, 1], "y": [0, alpha_scale]})\n'
    'nb.record("n_squared", alpha_n ** 2, description="alpha_n squared")\n'
    'nb.record("scale", bm.mean_ci([alpha_scale, alpha_scale + 1, alpha_scale + 2]))\n'
    'print("ALPHA-RAN", alpha_n, alpha_name, profile, device, bool(out_dir), '
    'notebook.in_papermill())',
]

FAIL_PARAMS = COMMON + 'beta_k = 2  # a count\n'
FAIL_BODY = [
    'import bnmem_utils as bm\nnb = bm.start("02_beta", globals())',
    'nb.record("before_failure", beta_k)',
    'raise ValueError("boom from the failing notebook")',
    'nb.record("never", 1)',
]

GAMMA_PARAMS = COMMON + 'gamma_epochs = 1  # epochs\n'
GAMMA_BODY = [
    # What the kernel inherited from the runner, before this kernel imports bnmem_utils itself
    'import os\nfor v in ("OMP_WAIT_POLICY", "BNMEM_MALLOC", "MALLOC_TOP_PAD_"):\n'
    '    print("KERNEL-ENV", os.environ.get(v, "unset"))\n'
    'import bnmem_utils as bm\nfrom bnmem_utils.core import threads\n'
    'print("KERNEL-POLICY-IN-FORCE", threads.in_force())\n'
    'nb = bm.start("03_gamma", globals())',
    'nb.record("epochs", gamma_epochs)',
]


def make_notebook(path: Path, params: str, body: list[str]) -> Path:
    """Write a notebook: a title, the tagged parameters cell, then ``body`` code cells."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(f"# {path.stem}"))
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells.append(cell)
    nb.cells.extend(nbformat.v4.new_code_cell(src) for src in body)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A temporary project: three notebooks (one fails) and three profiles."""
    root = tmp_path / "proj"
    make_notebook(root / "notebooks" / "01_alpha.ipynb", ALPHA_PARAMS, ALPHA_BODY)
    make_notebook(root / "notebooks" / "02_beta.ipynb", FAIL_PARAMS, FAIL_BODY)
    make_notebook(root / "notebooks" / "03_gamma.ipynb", GAMMA_PARAMS, GAMMA_BODY)
    (root / "notebooks" / "scratch.ipynb").write_text("{}")  # not numbered: ignored
    profiles = root / "profiles"
    profiles.mkdir()
    (profiles / "smoke.yaml").write_text("profile: smoke\nalpha_n: 2\ngamma_epochs: 1\n")
    (profiles / "quick.yaml").write_text("profile: quick\nalpha_n: 4\nalpha_scale: 2\n")
    (profiles / "paper.yaml").write_text("profile: paper\nalpha_n: 40\n")
    monkeypatch.setenv("BNMEM_ROOT", str(root))
    monkeypatch.setenv("BNMEM_PROFILES", str(profiles))
    monkeypatch.delenv("BNMEM_CACHE", raising=False)
    return root


# --------------------------------------------------------------------------------------------
# Profiles, notebooks and parameters (no kernels)
# --------------------------------------------------------------------------------------------


def test_builtin_profiles_exist_and_are_flat(monkeypatch):
    monkeypatch.delenv("BNMEM_PROFILES", raising=False)  # the shipped bnmem_utils/profiles
    named = runplan.available_profiles()
    assert {"smoke", "quick", "fmnist", "paper"} <= set(named)
    for name in ("smoke", "quick", "fmnist", "paper"):
        got, values = runplan.load_profile(name)
        assert got == name
        assert all(not isinstance(v, dict) or k.endswith("_grid") for k, v in values.items()), values


def test_unknown_profile_lists_valid_ones(project):
    with pytest.raises(UsageError, match=r"unknown profile 'fast'.*paper, quick, smoke"):
        runplan.load_profile("fast")


def test_profile_file_name_must_be_a_folder_name(project, tmp_path):
    path = tmp_path / "my profile.yaml"
    path.write_text("alpha_n: 7\n")
    with pytest.raises(UsageError, match="plain folder name"):
        runplan.load_profile(str(path))


def test_profile_from_a_path(project, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("alpha_n: 7\n")
    name, values = runplan.load_profile(str(path))
    assert name == "mine" and values == {"alpha_n": 7, "profile": "mine"}
    plan = runplan.plan_run(str(path))
    assert plan.profile.startswith("mine-") and plan.jobs[0].parameters["profile"] == plan.profile
    assert plan.jobs[0].parameters["alpha_n"] == 7


@pytest.mark.parametrize("text, match", [
    ("- a\n- b\n", "must map parameter names"),
    ("alpha_n: [1\n", "not valid YAML"),
    ("profile: quick\n", r"sets profile: 'quick'.*set profile: bad"),
])
def test_bad_profile_files(project, tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=match):
        runplan.load_profile(str(path))


def test_discovery_ignores_unnumbered_notebooks(project):
    assert list(runplan.discover_notebooks()) == ["01_alpha", "02_beta", "03_gamma"]


@pytest.mark.parametrize("only, expected", [
    (None, ["01_alpha", "02_beta", "03_gamma"]),
    (["01,03"], ["01_alpha", "03_gamma"]),
    (["3", "alpha"], ["01_alpha", "03_gamma"]),
    ("02_beta", ["02_beta"]),
    (["02_beta.ipynb"], ["02_beta"]),
])
def test_select_notebooks(project, only, expected):
    assert list(runplan.select_notebooks(only)) == expected


@pytest.mark.parametrize("only", ["", [""], [" , "], []])
def test_only_that_names_no_notebook_is_an_error(project, only):
    with pytest.raises(UsageError, match=r"names no notebook; valid choices: 01_alpha, 02_beta"):
        runplan.select_notebooks(only)


def test_profile_file_that_is_not_text(project, tmp_path):
    path = tmp_path / "noise.yaml"
    path.write_bytes(b"alpha_n: \xff\xfe\x00\x81\n")
    with pytest.raises(UsageError, match=r"is not a text file \(byte 9 is not UTF-8\)"):
        runplan.load_profile(str(path))


def test_unknown_notebook_lists_valid_ones(project):
    with pytest.raises(UsageError, match=r"unknown notebook '07'.*01_alpha, 02_beta, 03_gamma"):
        runplan.select_notebooks(["01,07"])


def test_plan_passes_each_notebook_only_its_keys(project):
    plan = runplan.plan_run("quick", overrides=["seed=5"], device="cpu")
    params = {job.notebook: job.parameters for job in plan.jobs}
    name = plan.profile  # a --set that changes results: the run's own folders
    assert name.startswith("quick-")
    assert params["01_alpha"] == {"profile": name, "alpha_n": 4, "alpha_scale": 2.0,
                                  "seed": 5, "device": "cpu", "out_dir": ""}
    assert isinstance(params["01_alpha"]["alpha_scale"], float)  # int in YAML, float default
    assert params["03_gamma"] == {"profile": name, "seed": 5, "device": "cpu", "out_dir": ""}


def test_override_precedence_and_out_dir(project, tmp_path):
    plan = runplan.plan_run("quick", overrides=["alpha_n=9", "alpha_sizes=[3, 4]", "device=cpu"],
                           out_dir=tmp_path / "o")
    alpha = plan.jobs[0].parameters
    assert alpha["alpha_n"] == 9 and alpha["alpha_sizes"] == [3, 4] and alpha["device"] == "cpu"
    assert alpha["out_dir"] == str((tmp_path / "o").resolve())
    assert plan.output_path("01_alpha") == (tmp_path / "o" / "runs" / plan.profile / "01_alpha.ipynb").resolve()


def test_unknown_profile_key_is_an_error(project, tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("alpha_m: 3\n")
    with pytest.raises(UsageError, match=r"unknown parameter 'alpha_m' \(from profile typo\); "
                                         r"did you mean 'alpha_n'\?.*valid parameters: .*beta_k"):
        runplan.plan_run(str(path))


def test_unknown_override_is_an_error(project):
    with pytest.raises(UsageError, match=r"unknown parameter 'nope' \(from --set\).*alpha_n"):
        runplan.plan_run("quick", overrides=["nope=1"])


def test_override_for_an_unselected_notebook_names_it(project):
    with pytest.raises(UsageError, match=r"'beta_k' .*declared only by 02_beta.*not selected"):
        runplan.plan_run("quick", only=["01"], overrides=["beta_k=3"])


def test_profile_keys_of_unselected_notebooks_are_fine(project):
    plan = runplan.plan_run("smoke", only=["02"])  # smoke sets alpha_n and gamma_epochs
    assert [j.notebook for j in plan.jobs] == ["02_beta"]
    assert "alpha_n" not in plan.jobs[0].parameters


@pytest.mark.parametrize("override, match", [
    ("alpha_n=abc", r"'alpha_n' of 01_alpha expects int \(default 3\), got 'abc' \(str\)"),
    ("alpha_n=2.5", "expects int"),
    ("alpha_n=true", "expects int"),
    ("alpha_flag=1", "expects bool"),
    ("alpha_scale=fast", "expects float"),
    ("alpha_name=3", "expects str"),
    ("alpha_sizes=3", "expects list"),
    ("profile=paper", "--profile"),
    ("out_dir=/tmp/x", "--out"),
    ("alpha_n", "key=value"),
    ("device=tpu", "unknown device 'tpu'; valid choices: auto, cpu, cuda, mps"),
])
def test_bad_override_values(project, override, match):
    with pytest.raises(UsageError, match=match):
        runplan.plan_run("quick", overrides=[override])


def test_type_tolerance():
    assert runplan.check_value("k", 3, 1.0) == 3.0 and isinstance(runplan.check_value("k", 3, 1.0), float)
    assert runplan.check_value("k", 4.0, 1) == 4 and isinstance(runplan.check_value("k", 4.0, 1), int)
    with pytest.raises(UsageError, match="expects int"):  # null only where the default is None
        runplan.check_value("k", None, 1)
    assert runplan.check_value("k", None, None) is None
    assert runplan.check_value("k", "anything", None) == "anything"
    assert runplan.check_value("k", (1, 2), [0]) == [1, 2]


def test_parse_overrides_reads_yaml():
    got = runplan.parse_overrides(["a=3", "b=0.5", "c=true", "d=[1, 2]", "e=null", "f=hello", "g="])
    assert got == {"a": 3, "b": 0.5, "c": True, "d": [1, 2], "e": None, "f": "hello", "g": ""}


def test_notebook_without_common_parameters_is_rejected(project):
    make_notebook(project / "notebooks" / "04_bare.ipynb", "x = 1  # x\n", ["print(x)"])
    with pytest.raises(UsageError, match="04_bare does not declare profile, device, out_dir"):
        runplan.plan_run("smoke", only=["04"])


def test_non_literal_parameters_cell_is_rejected(project):
    make_notebook(project / "notebooks" / "04_bad.ipynb", COMMON + "y = 2 * 3  # derived\n", [])
    with pytest.raises(UsageError, match=r"04_bad.ipynb: parameter 'y' is not a literal: '2 \* 3'"):
        runplan.plan_run("smoke")


def test_parameters_overview(project):
    overview = runplan.parameters_overview("01")
    rows = {r["parameter"]: r for r in overview["01_alpha"]}
    assert rows["alpha_n"]["default"] == 3
    assert rows["alpha_n"]["comment"] == "a count"
    assert rows["alpha_n"]["profiles"] == {"paper": 40, "quick": 4, "smoke": 2}
    assert rows["alpha_name"]["profiles"] == {}
    text = runplan.format_parameters(overview, ["paper", "quick", "smoke"])
    assert "alpha_scale" in text and "a float (units: none)" in text


# --------------------------------------------------------------------------------------------
# Execution with papermill stubbed out: failures that are not cell errors, Ctrl-C
# --------------------------------------------------------------------------------------------


def _fake_execute(behaviour):
    """A stand-in for papermill.execute_notebook that writes a partial copy, then misbehaves."""

    def fake(input_path, output_path, **kwargs):
        name = Path(input_path).stem
        Path(output_path).write_text(json.dumps({"cells": [], "partial": name}))
        action = behaviour.get(name)
        if action is not None:
            raise action
        return None

    return fake


def test_interrupt_leaves_no_partial_files(project, tmp_path, monkeypatch):
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook",
                        in_kernel_env(_fake_execute({"02_beta": KeyboardInterrupt()})))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt) as info:
        runner.reproduce("smoke", out_dir=out, progress=False, log_output=False)
    run_dir = out / "runs" / "smoke"
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["01_alpha.ipynb", "summary.json"], names  # nothing of 02, 03 never started
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert [(n["notebook"], n["status"]) for n in summary["notebooks"]] == [
        ("01_alpha", "ok"), ("02_beta", "interrupted")]
    assert info.value.summary.exit_code == 130


def test_other_exceptions_fail_one_notebook_and_keep_going(project, tmp_path, monkeypatch):
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook",
                        in_kernel_env(_fake_execute({"01_alpha": RuntimeError("Kernel died before replying")})))
    summary = runner.reproduce("smoke", out_dir=tmp_path, progress=False, log_output=False)
    assert [r.status for r in summary.results] == ["failed", "ok", "ok"]
    assert summary.results[0].error == "RuntimeError: Kernel died before replying"
    assert Path(summary.results[0].output).is_file()  # the partial executed copy is kept
    assert summary.exit_code == 1
    assert not list((tmp_path / "runs" / "smoke").glob(".*"))


def test_stale_partials_are_cleaned(project, tmp_path, monkeypatch):
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(_fake_execute({})))
    run_dir = tmp_path / "runs" / "smoke"
    run_dir.mkdir(parents=True)
    (run_dir / ".01_alpha.abc.partial.ipynb").write_text("{")
    runner.reproduce("smoke", out_dir=tmp_path, progress=False, log_output=False)
    assert not list(run_dir.glob(".*"))


# --------------------------------------------------------------------------------------------
# The CLI (no kernels)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["reproduce", "--profile", "fast"], "unknown profile 'fast'; valid choices: paper, quick, smoke"),
    (["reproduce", "--only", "09"], "unknown notebook '09'; valid choices: 01_alpha, 02_beta, 03_gamma"),
    (["reproduce", "--set", "alpha_q=1"], "unknown parameter 'alpha_q'"),
    (["reproduce", "--set", "alpha_n=x"], "expects int"),
    (["params", "zeta"], "unknown notebook 'zeta'"),
])
def test_cli_bad_input_exits_2(project, capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_cli_argparse_errors_exit_2(project, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["reproduce", "--device", "tpu"])
    assert info.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["frobnicate"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:      # two of the report's jobs: one is named
        cli.main(["report", "--docs", "--latex"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_cli_params_and_env(project, capsys):
    assert cli.main(["params"]) == 0
    out = capsys.readouterr().out
    for text in ("01_alpha", "02_beta", "03_gamma", "alpha_n", "a count", "beta_k"):
        assert text in out
    assert cli.main(["params", "gamma"]) == 0
    out = capsys.readouterr().out
    assert "gamma_epochs" in out and "alpha_n" not in out
    assert cli.main(["env", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "device" in out and "commit" in out


def test_cli_registry_accepts_new_commands(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))
    cli.command("hello", "say hello", lambda p: p.add_argument("--who", default="you"))(
        lambda args: print(f"hello {args.who}") or 0)
    assert cli.main(["hello", "--who", "lead"]) == 0
    assert capsys.readouterr().out.strip() == "hello lead"


def _fake_kernel(input_path, output_path, *, log_output=False, **kwargs):
    """A stand-in for papermill.execute_notebook that logs as papermill does (cell markers and
    the cells' output, only with ``log_output``) and reports a bar through the state file."""
    import logging

    name = Path(input_path).stem
    Path(os.environ["BNMEM_PROGRESS"]).write_text(json.dumps({"n": 1, "total": 2}))
    if log_output:
        for text in ("Executing Cell 1---------------------------------------", f"OUTPUT OF {name}"):
            logging.getLogger("papermill").info(text)
    Path(output_path).write_text(json.dumps(nbformat.v4.new_notebook()))
    if name == "02_beta":
        raise RuntimeError("Kernel died before replying")


@pytest.mark.parametrize("verbose", [False, True])
def test_cli_console_is_short_unless_verbose(project, tmp_path, monkeypatch, capsys, verbose):
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(_fake_kernel))
    out = tmp_path / "out"
    code = cli.main(["reproduce", "--profile", "smoke", "--out", str(out),
                     *(["--verbose"] if verbose else [])])
    captured = capsys.readouterr()
    console = captured.out + captured.err
    assert code == 1
    assert ("Executing Cell" in console) is verbose
    assert ("OUTPUT OF 01_alpha" in console) is verbose
    # one line per notebook, the failure's error and executed copy, then the closing tables
    assert "[1/3] 01_alpha  ok  0:0" in captured.err and "[3/3] 03_gamma  ok" in captured.err
    failed = out / "runs" / "smoke" / "02_beta.failed.ipynb"
    assert ("[2/3] 02_beta  failed  0:00  RuntimeError: Kernel died before replying\n"
            f"    executed copy: {failed}") in captured.err
    if not verbose:
        assert len(console.splitlines()) <= 22, console
    quiet = cli.main(["reproduce", "--profile", "smoke", "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert quiet == 1 and "[1/3]" not in captured.err and "01_alpha" in captured.out


# --------------------------------------------------------------------------------------------
# End to end: real kernels through papermill (one run shared by the tests below)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """Run the CLI once on the three-notebook project: 01 and 03 pass, 02 fails in cell 5."""
    tmp = tmp_path_factory.mktemp("e2e")
    mp = pytest.MonkeyPatch()
    root = tmp / "proj"
    make_notebook(root / "notebooks" / "01_alpha.ipynb", ALPHA_PARAMS, ALPHA_BODY)
    make_notebook(root / "notebooks" / "02_beta.ipynb", FAIL_PARAMS, FAIL_BODY)
    make_notebook(root / "notebooks" / "03_gamma.ipynb", GAMMA_PARAMS, GAMMA_BODY)
    profiles = root / "profiles"
    profiles.mkdir()
    (profiles / "smoke.yaml").write_text("profile: smoke\nalpha_n: 2\n")
    mp.setenv("BNMEM_ROOT", str(root))
    mp.setenv("BNMEM_PROFILES", str(profiles))
    mp.delenv("BNMEM_HEADLESS", raising=False)
    # A runner whose own process lacks the thread policy (the kernels get it from the runner)
    for name in [*threads.POLICY, *threads.glibc_vars(os.environ)]:
        mp.delenv(name, raising=False)
    mp.setenv("OMP_WAIT_POLICY", "ACTIVE")                           # the user's, honoured
    before = dict(os.environ)
    out = tmp / "out"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(["reproduce", "--profile", "smoke", "--out", str(out), "--device", "cpu",
                         "--set", "alpha_name=cli", "--verbose"])
    environ_kept = dict(os.environ) == before
    mp.undo()
    # --set alpha_name=cli changes results: the run writes folders of its own, smoke-<digest>
    (run_dir,) = [p for p in (out / "runs").iterdir() if p.name.startswith("smoke-")]
    return {"code": code, "out": out, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
            "root": root, "environ_kept": environ_kept, "run_dir": run_dir,
            "figures": run_dir / "figures"}


@pytest.mark.slow
def test_end_to_end_exit_code_and_summary(e2e):
    assert e2e["code"] == 1
    out = e2e["stdout"]
    assert "01_alpha" in out and "02_beta" in out and "03_gamma" in out
    assert "n_squared=4" in out and "scale=2.5 [" in out  # key numbers of this run
    assert "FAILED: 02_beta: ValueError: boom from the failing notebook" in out
    assert "failing cell: cell 5 (In [" in out and 'raise ValueError("boom' in out
    executed = e2e["run_dir"] / "02_beta.failed.ipynb"
    assert f"executed copy with the traceback: {executed}" in out
    summary = json.loads((e2e["run_dir"] / "summary.json").read_text())
    assert [(n["notebook"], n["status"]) for n in summary["notebooks"]] == [
        ("01_alpha", "ok"), ("02_beta", "failed"), ("03_gamma", "ok")]
    assert summary["overrides"] == {"alpha_name": "cli"}


@pytest.mark.slow
def test_end_to_end_outputs(e2e):
    run_dir = e2e["run_dir"]
    assert sorted(p.name for p in run_dir.glob("*.ipynb")) == ["01_alpha.ipynb",
                                                               "02_beta.failed.ipynb",
                                                               "03_gamma.ipynb"]
    assert not list(run_dir.glob(".*")), "no partial files left"
    assert (run_dir / "01_alpha.ipynb").stat().st_mode & 0o044, "executed copies are readable by others"
    # The failing notebook's executed copy holds the traceback and sits beside (not over) the
    # good one, as do the results it recorded before failing; there was no earlier good run.
    failed = nbformat.read(run_dir / "02_beta.failed.ipynb", as_version=4)
    errors = [o for c in failed.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert errors and errors[0]["evalue"] == "boom from the failing notebook"
    beta = json.loads((run_dir / "results" / "02_beta.failed.json").read_text())
    assert beta["results"] == {"before_failure": {"value": 2, "fields": {"metric": "before_failure"}}}
    assert not (run_dir / "results" / "02_beta.json").exists()
    assert not list((run_dir / "results").glob("*.pending.json"))
    # The passing notebook got the profile, the override and the runner's parameters.
    alpha = json.loads((run_dir / "results" / "01_alpha.json").read_text())
    assert alpha["meta"]["parameters"]["alpha_n"] == 2
    assert alpha["meta"]["parameters"]["alpha_name"] == "cli"
    assert alpha["meta"]["parameters"]["device"] == "cpu"
    assert alpha["results"]["scale"]["n"] == 3
    figures = e2e["figures"]
    assert {p.name for p in figures.iterdir()} >= {"01_line.pdf", "01_line.png", "01_line.csv",
                                                   "manifest.json"}
    # Nothing was written into the temporary project itself.
    assert not (e2e["root"] / "runs").exists() and not (e2e["root"] / "figures").exists()


@pytest.mark.slow
def test_end_to_end_streams_notebook_log_and_headless_flag(e2e):
    assert f"ALPHA-RAN 2 cli {e2e['run_dir'].name} cpu True True" in e2e["stderr"]
    executed = nbformat.read(e2e["run_dir"] / "01_alpha.ipynb", as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and 'alpha_name = "cli"' in injected[0].source
    assert os.environ.get("BNMEM_HEADLESS") is None  # restored after the run


@pytest.mark.slow
def test_end_to_end_kernels_start_with_the_thread_policy(e2e):
    # The runner's process lacks the policy and keeps its environment as it was; the kernels it
    # starts find the policy in theirs before they import anything, the user's value honoured.
    for value in ("ACTIVE", "hold", threads.GLIBC_ENV["MALLOC_TOP_PAD_"]):
        assert f"KERNEL-ENV {value}" in e2e["stderr"]
    assert "KERNEL-POLICY-IN-FORCE True" in e2e["stderr"]
    assert e2e["environ_kept"]


# --------------------------------------------------------------------------------------------
# The Jupyter kernel
# --------------------------------------------------------------------------------------------


def test_check_kernel(monkeypatch, tmp_path):
    assert runner.check_kernel("python3") == ""  # this environment's own kernel
    with pytest.raises(UsageError, match=r"unknown Jupyter kernel 'nope'; valid choices: .*python3"):
        runner.check_kernel("nope")
    # A python3 kernel of another environment, found first on JUPYTER_PATH, shadows ours.
    spec = tmp_path / "kernels" / "python3" / "kernel.json"
    spec.parent.mkdir(parents=True)
    spec.write_text(json.dumps({"argv": ["/opt/elsewhere/bin/python", "-m", "ipykernel_launcher",
                                         "-f", "{connection_file}"],
                                "display_name": "other", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    warning = runner.check_kernel("python3")
    assert "runs /opt/elsewhere/bin/python, not this interpreter" in warning
    assert "--kernel bnmem" in warning


def test_cli_unknown_kernel_exits_2(project, capsys):
    assert cli.main(["reproduce", "--kernel", "nope"]) == 2
    assert "unknown Jupyter kernel 'nope'" in capsys.readouterr().err


def test_a_missing_profile_file_and_an_empty_profiles_folder_say_what_is_missing(tmp_path,
                                                                                  monkeypatch):
    """A profile path that is not there reads as a missing file, not an unknown name; an empty
    $BNMEM_PROFILES is named, so that "valid choices: (none)" has its reason beside it."""
    with pytest.raises(UsageError, match=r"profile file .*nope\.yaml does not exist"):
        runplan.load_profile(str(tmp_path / "nope.yaml"))
    monkeypatch.setenv("BNMEM_PROFILES", str(tmp_path))
    with pytest.raises(UsageError, match=r"valid choices: \(none\) \(the profiles of "
                                         r"\$BNMEM_PROFILES="):
        runplan.load_profile("quick")
