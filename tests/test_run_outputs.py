"""Outputs belong to one run, provenance is never silently lost, and bad values of the
environment are refused before a kernel starts (exit 2, one line naming the value).

On the throw-away project of ``test_runner`` with papermill replaced by ``test_reruns``'s
stand-ins (no kernels): each test takes a second or two.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
from pathlib import Path

import nbformat
import pytest
from kernel_env import in_kernel_env
from test_reruns import _drawing, _notebook_like, _snapshot
from test_runner import COMMON, make_notebook, project  # noqa: F401  (the project fixture)

from bnmem_utils.run import cli, preflight, runner
from bnmem_utils.run import plan as runplan
from bnmem_utils.run.runner import UsageError
from bnmem_utils.run.summary import WALL_TIMES


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def _fake(monkeypatch, fake) -> None:
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(fake))


# --------------------------------------------------------------------------------------------
# Outputs belong to one run
# --------------------------------------------------------------------------------------------


def test_only_a_named_profile_as_shipped_writes_its_own_folders(project, tmp_path):  # noqa: F811
    make_notebook(project / "notebooks" / "04_delta.ipynb",
                  COMMON + 'delta_threads = 1  # threads\ndelta_executor = "local"  # executor\n', [])
    name = lambda *a, **k: runplan.plan_run(*a, **k).profile  # noqa: E731
    shipped = project / "profiles" / "smoke.yaml"
    assert name("smoke") == name(str(shipped)) == "smoke"
    # how a run goes, not what it finds: still the profile's folders
    assert name("smoke", device="cpu", overrides=["delta_threads=2", "delta_executor=local"]) == "smoke"
    assert name("smoke", overrides=["alpha_n=2", "alpha_name=x"]) == "smoke"  # the values it has
    # a --set that can change a number, a dry run, a user's file named like a named profile
    mine = tmp_path / "elsewhere" / "smoke.yaml"
    mine.parent.mkdir()
    mine.write_text(shipped.read_text())
    names = {name("smoke", overrides=["alpha_n=5"]), name("smoke", overrides=["alpha_n=6"]),
             name("smoke", dry_run=True), name(str(mine))}
    assert len(names) == 4 and "smoke" not in names, names
    assert all(n.startswith("smoke-") for n in names) and name("smoke", dry_run=True).startswith("smoke-dry-")
    assert name("smoke", overrides=["alpha_n=5"]) == name("smoke", overrides=["alpha_n=5"])
    # and a user's quick.yaml does not write over figures/quick
    (tmp_path / "quick.yaml").write_text("alpha_n: 4\nalpha_scale: 2\n")
    assert name(str(tmp_path / "quick.yaml")).startswith("quick-")


def test_a_dry_run_leaves_a_real_runs_outputs_alone(project, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "o"
    _fake(monkeypatch, _drawing(1))
    assert runner.reproduce("smoke", out_dir=out, progress=False, log_output=False).exit_code == 0
    before = _snapshot(out)
    _fake(monkeypatch, _drawing(2))
    code, stdout, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--dry-run", "--only", "01",
                           "--out", str(out), "--quiet")
    assert code == 0
    after = _snapshot(out)
    assert {k: v for k, v in after.items() if k in before} == before
    new = sorted({Path(k).parts[1] for k in set(after) - set(before) if Path(k).parts[0] == "runs"})
    assert len(new) == 1 and new[0].startswith("smoke-dry-"), new
    assert f"runs/{new[0]}/figures/01_first.png" in after and f"runs/{new[0]}/results/01_alpha.json" in after
    # the closing lines say where it all went, and how to report it
    assert f"executed notebooks: {out / 'runs' / new[0]}" in stdout
    assert f"figures:            {out / 'runs' / new[0] / 'figures'}" in stdout
    assert f"bnmem report --profile {new[0]} --out {out}" in stdout


def test_out_empty_is_refused(project, capsys):  # noqa: F811
    for value in ("", " "):
        code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--out", value)
        assert code == 2 and len(err.splitlines()) == 1 and "names no folder" in err, err


def test_relative_paths_reach_the_kernel_absolute(project, tmp_path, monkeypatch):  # noqa: F811
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("BNMEM_CACHE", "rel-cache")
    monkeypatch.setenv("BNMEM_DATA", "rel-data")
    seen = {}

    def fake(input_path, output_path, **kw):
        seen.update({k: os.environ.get(k) for k in ("BNMEM_CACHE", "BNMEM_DATA")})
        _notebook_like(set())(input_path, output_path, **kw)

    _fake(monkeypatch, fake)
    summary = runner.reproduce("smoke", only=["01"], out_dir="rel-out", progress=False,
                               log_output=False)
    assert summary.exit_code == 0
    assert seen == {"BNMEM_CACHE": str(here / "rel-cache"), "BNMEM_DATA": str(here / "rel-data")}
    assert summary.plan.out_dir == str(here / "rel-out")
    assert (here / "rel-out" / "runs" / "smoke" / "results" / "01_alpha.json").exists()
    assert (here / "rel-cache").is_dir() and not (project / "rel-cache").exists()


# --------------------------------------------------------------------------------------------
# Provenance never silently lost
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ['{"meta": {"run_id": "x"}, "resu', "[]", '{"results": [1]}'])
def test_a_damaged_results_file_stops_the_run_before_work(project, tmp_path, monkeypatch, capsys,  # noqa: F811
                                                          damage):
    out = tmp_path / "o"
    _fake(monkeypatch, _drawing(1))
    assert runner.reproduce("smoke", out_dir=out, progress=False, log_output=False).exit_code == 0
    damaged = out / "runs" / "smoke" / "results" / "02_beta.json"
    damaged.write_text(damage)
    before = _snapshot(out)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01", "--out", str(out))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(damaged) in err and "--only 02" in err
    assert _snapshot(out) == before
    # bnmem report: one line naming the file and the command that regenerates it
    for argv in (["report", "--profile", "smoke"], ["report", "--compare", "smoke,smoke"]):
        code, _, err = _cli(capsys, *argv, "--out", str(out))
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert str(damaged) in err and f"bnmem reproduce --profile smoke --out {out} --only 02" in err
    # a copy of the output folder: the fix names the copy, not the folder the run wrote
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    code, _, err = _cli(capsys, "report", "--profile", "smoke", "--out", str(copy))
    assert code == 2 and f"bnmem reproduce --profile smoke --out {copy} --only 02" in err, err
    assert f"--out {out} " not in err
    # the run that selects it replaces it; the summary keeps every notebook's provenance
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "02", "--out", str(out),
                        "--quiet")
    assert code == 0 and str(damaged) in err
    effect = json.loads((out / "runs" / "smoke" / "summary.json").read_text())["results_in_effect"]
    assert sorted(effect) == ["01_alpha", "02_beta", "03_gamma"]
    assert all(e["run_id"] for e in effect.values()) and effect["02_beta"]["from"] == "this run"


@pytest.mark.parametrize("damage", ["{", "[]", '{"01_first": 3}', None])
def test_a_damaged_manifest_is_rebuilt_from_every_notebooks_outputs(project, tmp_path,  # noqa: F811
                                                                    monkeypatch, capsys, damage):
    out = tmp_path / "o"
    _fake(monkeypatch, _drawing(1))
    assert runner.reproduce("smoke", out_dir=out, progress=False, log_output=False).exit_code == 0
    manifest = out / "runs" / "smoke" / "figures" / "manifest.json"
    good = json.loads(manifest.read_text())
    if damage is None:
        manifest.unlink()
    else:
        manifest.write_text(damage)
    _fake(monkeypatch, _drawing(2))
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "02", "--out", str(out),
                        "--quiet")
    assert code == 0 and str(manifest) in err and "rebuilt" in err
    rebuilt = json.loads(manifest.read_text())
    assert sorted(rebuilt) == sorted(good)  # 01's and 03's figures too, not only 02's
    assert rebuilt["02_first"] == good["02_first"] | {"commit": rebuilt["02_first"]["commit"]}
    for name in ("01_first", "03_second"):
        entry = rebuilt[name]
        assert entry["rebuilt"] and entry["files"] == good[name]["files"]
        assert entry["notebook"] == good[name]["notebook"]
        assert entry["parameters"] == good[name]["parameters"]


def test_the_html_index_lists_every_notebook_with_its_status(project, tmp_path, monkeypatch, capsys):  # noqa: F811
    def fake(input_path, output_path, parameters=None, **kw):
        _notebook_like({"02_beta"})(input_path, output_path, parameters=parameters, **kw)

    def valid_copy(input_path, output_path, **kw):  # a real notebook, which nbconvert reads
        try:
            fake(input_path, output_path, **kw)
        finally:
            nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]),
                           output_path)

    _fake(monkeypatch, valid_copy)
    out = tmp_path / "o"
    code, _, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--out", str(out), "--html")
    assert code == 1
    index = (out / "runs" / "smoke" / "html" / "index.html").read_text()
    for stem in ("01_alpha", "03_gamma"):
        assert f'<a href="{stem}.html">{stem}</a>: <b>ok</b>' in index, stem
    (item,) = [line for line in index.splitlines() if line.startswith("<li>02_beta")]
    assert item.startswith("<li>02_beta: <b>failed</b> (") and item.endswith(
        '<a href="02_beta.failed.html">executed copy with the traceback</a>; no earlier results</li>')
    assert (out / "runs" / "smoke" / "html" / "02_beta.failed.html").exists()


# --------------------------------------------------------------------------------------------
# Refused before a kernel starts
# --------------------------------------------------------------------------------------------


def _no_kernel(monkeypatch):
    import papermill

    def fail(*a, **k):
        raise AssertionError("a kernel started")

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(fail))


def test_an_executor_without_its_package_is_refused(project, monkeypatch, capsys):  # noqa: F811
    import importlib.util

    make_notebook(project / "notebooks" / "04_delta.ipynb",
                  COMMON + 'delta_executor = "local"  # executor\n', [])
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else find_spec(name, *a))
    _no_kernel(monkeypatch)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--set", "delta_executor=ray")
    assert code == 2 and len(err.splitlines()) == 1
    assert "delta_executor='ray' (for 04_delta) needs Ray, which is not installed" in err


def test_a_cache_that_is_no_writable_folder_is_refused(project, tmp_path, monkeypatch, capsys):  # noqa: F811
    import tempfile

    _no_kernel(monkeypatch)
    afile = tmp_path / "cache-file"
    afile.write_text("x")
    monkeypatch.setenv("BNMEM_CACHE", str(afile))
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--out", str(tmp_path / "o"))
    assert code == 2 and len(err.splitlines()) == 1 and f"{afile} is a file, not a folder" in err
    read_only = tmp_path / "ro-cache"
    monkeypatch.setenv("BNMEM_CACHE", str(read_only))
    probe = tempfile.NamedTemporaryFile

    def denied(*a, dir=None, **k):  # root writes anywhere: a read-only folder, simulated
        if Path(dir) == read_only:
            raise PermissionError(errno.EACCES, "Permission denied")
        return probe(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", denied)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--out", str(tmp_path / "o"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"$BNMEM_CACHE={read_only}: cannot write there (Permission denied)" in err


def test_data_that_cannot_be_downloaded_is_refused(tmp_path, monkeypatch, capsys):
    """The real paper profile's dry run, offline, without its data sets."""
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "no-data"))
    monkeypatch.setattr(preflight, "download_blocked",
                        lambda name: "its download server example.org cannot be reached (offline)")
    _no_kernel(monkeypatch)
    code, _, err = _cli(capsys, "reproduce", "--profile", "paper", "--dry-run", "--only", "02",
                        "--out", str(tmp_path / "o"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "data set 'cifar10' (for 02_forced_memorization) was not found offline" in err
    assert str(tmp_path / "no-data") in err and "example.org cannot be reached" in err


def test_a_run_without_mnist_names_the_one_command_first(tmp_path, monkeypatch, capsys):
    """The archs profile reads MNIST; where it is missing, the line names `bnmem data fetch
    mnist` before the other routes, before any kernel starts."""
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "no-data"))
    _no_kernel(monkeypatch)
    code, _, err = _cli(capsys, "reproduce", "--profile", "archs", "--only", "02",
                        "--out", str(tmp_path / "o"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "data set 'mnist' (for 02_forced_memorization) was not found offline" in err
    assert err.index("get it with `bnmem data fetch mnist`") < err.index("copy torchvision's")


def test_data_with_the_wrong_digest_is_refused_before_a_real_run(tmp_path, monkeypatch, capsys):
    from fake_data import fake_mnist

    root = tmp_path / "data"
    fake_mnist(root, "FashionMNIST")  # not the published Fashion-MNIST, and not accepted
    monkeypatch.setenv("BNMEM_DATA", str(root))
    monkeypatch.delenv("BNMEM_DATA_DIGESTS", raising=False)
    _no_kernel(monkeypatch)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "04", "--out",
                        str(tmp_path / "o"), "--set", "lira_datasets=[fashion_mnist]")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "fashion_mnist" in err and "does not hold the expected data set" in err


# --------------------------------------------------------------------------------------------
# Smaller
# --------------------------------------------------------------------------------------------


def test_notebook_numbers_with_or_without_a_leading_zero(project):  # noqa: F811
    make_notebook(project / "notebooks" / "02b_delta.ipynb", COMMON, [])
    assert list(runplan.select_notebooks(["2b"])) == ["02b_delta"]
    assert list(runplan.select_notebooks("02b,1")) == ["01_alpha", "02b_delta"]
    assert list(runplan.select_notebooks(["2"])) == ["02_beta"]
    with pytest.raises(UsageError, match="unknown notebook '2c'"):
        runplan.select_notebooks(["2c"])


def test_sigterm_ends_a_run_with_its_summary(project, tmp_path, monkeypatch, capsys):  # noqa: F811
    def fake(input_path, output_path, **kw):
        _notebook_like(set())(input_path, output_path, **kw)
        if Path(input_path).stem == "02_beta":
            os.kill(os.getpid(), signal.SIGTERM)

    _fake(monkeypatch, fake)
    before = signal.getsignal(signal.SIGTERM)
    code, out, err = _cli(capsys, "reproduce", "--profile", "smoke", "--out", str(tmp_path / "o"),
                          "--quiet")
    assert code == 143 and err.splitlines()[-1] == "bnmem: terminated"
    assert "01_alpha" in out and "02_beta" in out and "interrupted" in out
    assert signal.getsignal(signal.SIGTERM) == before
    summary = json.loads((tmp_path / "o" / "runs" / "smoke" / "summary.json").read_text())
    assert [(n["notebook"], n["status"]) for n in summary["notebooks"]] == [
        ("01_alpha", "ok"), ("02_beta", "interrupted")]


def test_a_full_disk_names_the_path(project, tmp_path, monkeypatch, capsys):  # noqa: F811
    def full(input_path, output_path, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    _fake(monkeypatch, full)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--out", str(tmp_path / "o"))
    # the first notebook's write failure ends the run: one line naming the path, nothing staged
    assert code == 1 and len(err.splitlines()) == 1 and "No space left on device" in err, err
    assert str(tmp_path / "o" / "runs" / "smoke") in err
    assert not (tmp_path / "o" / "runs" / "smoke" / "results").exists()

    def full_in_kernel(input_path, output_path, **kw):
        import papermill

        raise papermill.PapermillExecutionError(0, 1, "save", "OSError", "[Errno 28] No space left on "
                                                "device: '/o/runs/smoke/figures'", [])

    _fake(monkeypatch, full_in_kernel)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--out", str(tmp_path / "o"))
    assert code == 1 and len(err.splitlines()) == 1 and "No space left on device" in err, err
    from bnmem_utils.core import cache

    def no_space(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runner, "atomic_write_text", no_space)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--out", str(tmp_path / "o"))
    assert code == 1 and len(err.splitlines()) == 1, err
    assert f"cannot write {tmp_path / 'o' / 'runs' / '.bnmem.lock.json'}: No space left" in err
    assert cache.atomic_write_text is not no_space


# --------------------------------------------------------------------------------------------
# The published figures: a run never writes over them; --publish replaces them
# --------------------------------------------------------------------------------------------


def test_a_run_leaves_the_published_figures_alone_and_publish_replaces_them(
        project, monkeypatch, capsys):  # noqa: F811
    published = project / "figures" / "smoke"
    published.mkdir(parents=True)
    (published / "01_first.csv").write_text("x,y\n0,0\n1,99\n")
    (published / "00_gone.csv").write_text("old\n")
    before = _snapshot(project / "figures")
    _fake(monkeypatch, _drawing(1))
    code, stdout, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01", "--quiet")
    assert code == 0 and _snapshot(project / "figures") == before
    run_figures = project / "runs" / "smoke" / "figures"
    assert (run_figures / "01_first.csv").is_file()
    assert f"figures:            {run_figures}" in stdout
    assert "compared with the published run" in stdout and "not there" in stdout
    code, stdout, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01", "--quiet",
                           "--publish")
    assert code == 0 and "published: " in stdout
    assert sorted(p.name for p in published.iterdir()) == sorted(
        [*(p.name for p in run_figures.iterdir()), WALL_TIMES])
    assert list(json.loads((published / WALL_TIMES).read_text())["notebooks"]) == ["01_alpha"]
    assert (published / "01_first.csv").read_text() == (run_figures / "01_first.csv").read_text()
    assert not list(project.glob("figures/.*"))          # no copy left beside it


def _forest(folder: Path, verdict: str) -> None:
    """A claims forest of one row in ``folder``."""
    import csv

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "06_claims_forest.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["id", "setting", "ours", "verdict", "primary"])
        writer.writeheader()
        writer.writerow({"id": "C3a", "setting": "OOD 1%", "ours": "1 [0, 2] pt",
                         "verdict": verdict, "primary": "True"})


def test_a_run_written_elsewhere_is_compared_with_the_repositorys_published_figures(
        project, tmp_path, monkeypatch, capsys):  # noqa: F811
    """--out DIR puts the run's outputs under DIR; the claims are still compared with the
    repository's figures/<profile>/, at the end of the run and by bnmem report."""
    out = tmp_path / "o"
    _forest(project / "figures" / "smoke", "supported")
    _forest(out / "runs" / "smoke" / "figures", "inconclusive")
    _fake(monkeypatch, _drawing(1))
    code, stdout, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01", "--quiet",
                           "--out", str(out))
    assert code == 0 and "nothing to compare" not in stdout, stdout
    assert f"compared with the published run ({project / 'figures' / 'smoke'}): 0 of 1" in stdout
    code, stdout, _ = _cli(capsys, "report", "--profile", "smoke", "--compare-published",
                           "--out", str(out))
    assert code == 0 and "C3a OOD 1%: 1 [0, 2] pt supported -> 1 [0, 2] pt inconclusive" in stdout
    assert not (out / "figures").exists()                   # nothing published under DIR


def test_publish_refuses_a_dry_run_and_keeps_the_published_figures_after_a_failure(
        project, monkeypatch, capsys):  # noqa: F811
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--dry-run", "--publish")
    assert code == 2 and "--publish with --dry-run" in err and "\n" not in err
    published = project / "figures" / "smoke"
    published.mkdir(parents=True)
    (published / "kept.csv").write_text("x\n1\n")
    _fake(monkeypatch, _notebook_like({"01_alpha"}))       # its cell fails
    code, stdout, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01", "--quiet",
                           "--publish")
    assert code == 1 and "not published" in stdout
    assert [p.name for p in published.iterdir()] == ["kept.csv"]


# --------------------------------------------------------------------------------------------
# A report over nothing refuses
# --------------------------------------------------------------------------------------------


def test_a_report_notebook_alone_with_nothing_to_read_is_refused_before_a_kernel(  # noqa: F811
        project, monkeypatch, capsys):  # noqa: F811
    make_notebook(project / "notebooks" / "06_report.ipynb",
                  COMMON + 'report_profile = ""  # read another profile\'s results\n', [])
    _no_kernel(monkeypatch)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "06")
    assert code == 2 and "nothing to report for profile smoke" in err and "\n" not in err
    assert "bnmem reproduce --profile smoke" in err
    assert not (project / "runs" / "smoke" / "figures").exists()
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "06", "--set",
                        "report_profile=quick")
    assert code == 2  # no results of quick either (refused by the value check or this one)


def test_the_claims_table_of_a_profile_without_results_refuses(tmp_path):
    from bnmem_utils.analyses import report
    from bnmem_utils.core.results import NothingToReport

    with pytest.raises(NothingToReport, match="run `bnmem reproduce --profile mine` first"):
        report.claims_table(report.CLAIMS, "mine", tmp_path)
    assert report.claims_table([], "mine", tmp_path) == []


# --------------------------------------------------------------------------------------------
# The last bad inputs: one line each, before any kernel
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mem_batch_size", "grad_batch_size", "lira_batch_size",
                                  "cf_batch_size", "mit_batch_size"])
def test_a_batch_of_one_sample_is_refused_before_a_kernel(name, monkeypatch, capsys):
    _no_kernel(monkeypatch)
    code, _, err = _cli(capsys, "reproduce", "--set", f"{name}=1")
    assert code == 2 and f"'{name}'" in err and "[2, 65536]" in err and "\n" not in err


@pytest.mark.parametrize("depth", [300, 5000])
def test_deeply_nested_values_are_refused_in_one_short_line(depth, tmp_path, monkeypatch, capsys):
    _no_kernel(monkeypatch)
    nested = "[" * depth + "]" * depth
    code, _, err = _cli(capsys, "reproduce", "--set", f"lira_norms={nested}")
    assert code == 2 and "lira_norms" in err and "\n" not in err and len(err) < 400
    profile = tmp_path / "deep.yaml"
    profile.write_text(f"lira_norms: {nested}\n")
    code, _, err = _cli(capsys, "reproduce", "--profile", str(profile))
    assert code == 2 and "\n" not in err and len(err) < 400


def test_data_variables_that_name_nothing_usable_are_refused(tmp_path, monkeypatch, capsys):
    _no_kernel(monkeypatch)
    a_file = tmp_path / "data.txt"
    a_file.write_text("x")
    monkeypatch.setenv("BNMEM_DATA", str(a_file))
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01")
    assert code == 2 and "$BNMEM_DATA" in err and str(a_file) in err and "is a file" in err
    monkeypatch.delenv("BNMEM_DATA")
    monkeypatch.setenv("BNMEM_DATA_DIGESTS", "nosuchset=abc")
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01")
    assert code == 2 and "'nosuchset'" in err and "fashion_mnist" in err and "\n" not in err
    monkeypatch.setenv("BNMEM_DATA_DIGESTS", "mnist=abc,mnist=def")
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01")
    assert code == 2 and "'mnist'" in err and "twice" in err and "\n" not in err, err
    monkeypatch.setenv("BNMEM_DATA_DIGESTS", "digits=abc")     # embedded: nothing to check
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01")
    assert code == 2 and "digits" in err and "embedded" in err and "\n" not in err, err


@pytest.mark.parametrize("value", ["false", "0", "of", "no"])
def test_a_compile_variable_other_than_off_is_refused(value, monkeypatch, capsys):
    """BNMEM_COMPILE has one value, off: any other (false, 0) would silently compile on a GPU."""
    _no_kernel(monkeypatch)
    monkeypatch.setenv("BNMEM_COMPILE", value)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01")
    assert code == 2 and "\n" not in err and f"$BNMEM_COMPILE={value}" in err and "off" in err, err


def test_an_empty_or_repeated_compare_is_refused(capsys):
    for value in ("", "quick,quick"):          # nothing to compare, or one column twice
        code, _, err = _cli(capsys, "report", "--compare", value)
        assert code == 2 and "must name profiles, each once" in err and repr(value) in err


def test_comparing_a_profile_with_no_results_is_bad_input(tmp_path, capsys):
    """A profile never run is the user's to run first (exit 2, as `bnmem report` alone), not an
    output that could not be written (exit 1)."""
    code, _, err = _cli(capsys, "report", "--compare", "smoke,quick", "--out", str(tmp_path))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "nothing to report for profile smoke" in err and "bnmem reproduce" in err


def test_a_figures_folder_that_cannot_be_written_is_refused_before_a_kernel(  # noqa: F811
        project, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Found before notebook 01, not after it (a file where the folder goes: as root, the one
    unwritable folder that a test can make)."""
    figures = tmp_path / "o" / "runs" / "smoke" / "figures"
    figures.parent.mkdir(parents=True)
    figures.write_text("not a folder")
    _no_kernel(monkeypatch)
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--out", str(tmp_path / "o"))
    assert code == 2 and str(figures) in err and "\n" not in err


# --------------------------------------------------------------------------------------------
# Outputs name the data behind them
# --------------------------------------------------------------------------------------------


def test_a_run_records_its_data_and_other_data_gets_a_folder_of_its_own(tmp_path, monkeypatch):
    from fake_data import fake_mnist

    plan = runplan.plan_run("quick", only=["04"])
    assert plan.profile == "quick" and set(plan.data) == {"digits"}
    assert re.fullmatch(r"[0-9a-f]{16,}", plan.data["digits"])     # the embedded digits' own
    fake_mnist(tmp_path, "FashionMNIST")              # a Fashion-MNIST that is not the published
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path))
    monkeypatch.setenv("BNMEM_DATA_DIGESTS", "fashion_mnist=0123abcd")
    other = runplan.plan_run("quick", only=["04"], overrides={"lira_datasets": ["fashion_mnist"]})
    assert other.profile.startswith("quick-") and other.profile != plan.profile
    assert other.data["fashion_mnist"].startswith("0123abcd (overridden")


def test_the_results_and_the_manifest_name_the_data(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from bnmem_utils.core.results import DATA_ENV
    from bnmem_utils.run.notebook import NotebookContext

    monkeypatch.setenv("BNMEM_RUN_ID", "r1")
    monkeypatch.setenv("BNMEM_STAGING", str(tmp_path / "stage"))
    monkeypatch.setenv(DATA_ENV, json.dumps({"fashion_mnist": "89d4"}))
    ctx = NotebookContext("01_alpha", {"profile": "smoke", "out_dir": str(tmp_path)}, verbose=False)
    ctx.record("value", 1)
    pending = tmp_path / "runs" / "smoke" / "results" / "01_alpha.pending.json"
    assert json.loads(pending.read_text())["meta"]["data"] == {"fashion_mnist": "89d4"}
    fig, _ = plt.subplots()
    entry = ctx.save_figure(fig, "first", {"x": [1]})
    plt.close(fig)
    assert entry["data"] == {"fashion_mnist": "89d4"}


def test_a_first_run_reads_its_time_to_go_from_the_published_run(tmp_path):
    """No run of its own yet (a fresh clone): the live line's estimates are the published run's
    times; a run of its own then takes over, notebook by notebook."""
    from types import SimpleNamespace

    from bnmem_utils.run.summary import RunSummary, previous_wall_times, wall_times_text

    plan = SimpleNamespace(profile="smoke", out_dir=str(tmp_path))
    published = tmp_path / "figures" / "smoke"
    published.mkdir(parents=True)
    assert previous_wall_times(plan) == {}
    done = [SimpleNamespace(notebook="01_theory", wall_s=12.34, ok=True),
            SimpleNamespace(notebook="02_forced_memorization", wall_s=5.0, ok=False)]
    first = RunSummary(plan, done, "2026-12-06T01:00:00+00:00", commit="abc1234")
    (published / WALL_TIMES).write_text(wall_times_text(first, published))
    later = RunSummary(plan, [SimpleNamespace(notebook="04_lira", wall_s=99.0, ok=True)],
                       "2026-12-06T02:00:00+00:00", commit="def5678")
    (published / WALL_TIMES).write_text(wall_times_text(later, published))   # --only 04
    entries = json.loads((published / WALL_TIMES).read_text())["notebooks"]
    assert entries == {"01_theory": {"wall_s": 12.3, "commit": "abc1234",
                                     "started": "2026-12-06T01:00:00+00:00"},
                       "04_lira": {"wall_s": 99.0, "commit": "def5678",
                                   "started": "2026-12-06T02:00:00+00:00"}}
    assert previous_wall_times(plan) == {"01_theory": 12.3, "04_lira": 99.0}
    own = tmp_path / "runs" / "smoke"
    own.mkdir(parents=True)
    (own / "summary.json").write_text(json.dumps({"notebooks": [
        {"notebook": "04_lira", "status": "ok", "wall_s": 50.0}]}))
    assert previous_wall_times(plan) == {"01_theory": 12.3, "04_lira": 50.0}


def _own_figures(without: set[str] = frozenset()):
    """A stand-in notebook that saves one figure, ``plot`` (``01_plot`` once numbered), except
    the notebooks in ``without``, which save none, and records a value."""
    def fake(input_path, output_path, parameters=None, **kwargs):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from bnmem_utils.run.notebook import NotebookContext

        name = Path(input_path).stem
        ctx = NotebookContext(name, dict(parameters or {}), verbose=False)
        if name not in without:
            fig, ax = plt.subplots(figsize=(2, 2))
            ax.plot([0, 1], [0, 1])
            ctx.save_figure(fig, "plot", data={"x": [0, 1]})
            plt.close(fig)
        ctx.record("value", 1)
        Path(output_path).write_text(json.dumps({"cells": []}))

    return fake


def test_publish_never_deletes_the_published_figures_of_a_notebook_the_run_lacks(
        project, monkeypatch, capsys):  # noqa: F811
    published = project / "figures" / "smoke"
    _fake(monkeypatch, _own_figures())
    code, stdout, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01,03",
                           "--quiet", "--publish")
    assert code == 0 and "published: " in stdout
    assert {p.name for p in published.glob("0*_plot.csv")} == {"01_plot.csv", "03_plot.csv"}
    before = _snapshot(project / "figures")
    # a fresh clone (runs/ is not committed), or a folder where 01 never succeeded
    shutil.rmtree(project / "runs" / "smoke")
    code, _, err = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "03", "--quiet",
                        "--publish")
    assert code == 2 and "\n" not in err, err
    assert "published figures of 01_alpha" in err and "--only 01" in err
    assert _snapshot(project / "figures") == before
    assert not (project / "runs" / "smoke" / "results" / "03_gamma.json").exists()  # ran nothing
    # selected, but it made no figure: refused after the run, the published ones kept
    _fake(monkeypatch, _own_figures(without={"01_alpha"}))
    code, stdout, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01,03",
                           "--quiet", "--publish")
    assert "not published: " in stdout and "01_alpha" in stdout
    assert _snapshot(project / "figures") == before
    # with 01's figures in the run's folder again, it publishes
    _fake(monkeypatch, _own_figures())
    code, stdout, _ = _cli(capsys, "reproduce", "--profile", "smoke", "--only", "01", "--quiet",
                           "--publish")
    assert code == 0 and "published: " in stdout
    assert {p.name for p in published.glob("0*_plot.csv")} == {"01_plot.csv", "03_plot.csv"}
