"""Reruns never destroy good results: outputs are replaced only on success, a failed run leaves
its copies beside the good ones, the summary says which result is from which run; bad --out
folders and a second run on the same folder are one-line errors (exit 2).

Papermill is replaced by a stand-in that behaves like a notebook under the runner: it writes
its executed copy and, through bnmem_utils.start, its pending results, then succeeds or fails.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from kernel_env import in_kernel_env
from test_runner import project  # noqa: F401  (the throw-away project fixture)

from bnmem_utils.core.outputs import OutputError
from bnmem_utils.jobs.config import RunConfig
from bnmem_utils.run import cli, preflight, runner
from bnmem_utils.run import summary as runsummary
from bnmem_utils.run.runner import UsageError


def _notebook_like(fail: set[str], value: int = 1, interrupt: set[str] = frozenset()):
    def fake(input_path, output_path, parameters=None, **kwargs):
        from bnmem_utils.run.notebook import NotebookContext

        name = Path(input_path).stem
        ctx = NotebookContext(name, dict(parameters or {}), verbose=False)
        ctx.record("value", value)
        Path(output_path).write_text(json.dumps({"cells": [], "run": value}))
        if name in interrupt:
            raise KeyboardInterrupt
        if name in fail:
            import papermill

            raise papermill.PapermillExecutionError(3, 2, "raise X", "X", "ValueError", "boom", [])

    return fake


def _run(monkeypatch, out, fake):
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(fake))
    return runner.reproduce("smoke", out_dir=out, progress=False, log_output=False)


def test_failed_rerun_keeps_the_previous_results_and_notebook(project, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "out"
    first = _run(monkeypatch, out, _notebook_like(fail=set(), value=1))
    assert first.exit_code == 0
    run_dir = out / "runs" / "smoke"
    good_nb = (run_dir / "02_beta.ipynb").read_text()
    good_res = json.loads((run_dir / "results" / "02_beta.json").read_text())
    assert good_res["results"]["value"]["value"] == 1 and good_res["meta"]["run_id"] == first.run_id

    second = _run(monkeypatch, out, _notebook_like(fail={"02_beta"}, value=2))
    assert [r.status for r in second.results] == ["ok", "failed", "ok"]
    # the good ones stay; the failed run's copies sit beside them
    assert (run_dir / "02_beta.ipynb").read_text() == good_nb
    assert json.loads((run_dir / "results" / "02_beta.json").read_text()) == good_res
    assert json.loads((run_dir / "02_beta.failed.ipynb").read_text())["run"] == 2
    failed = json.loads((run_dir / "results" / "02_beta.failed.json").read_text())
    assert failed["results"]["value"]["value"] == 2 and failed["meta"]["run_id"] == second.run_id
    assert not list((run_dir / "results").glob("*.pending.json"))
    # the others were replaced by this run
    alpha = json.loads((run_dir / "results" / "01_alpha.json").read_text())
    assert alpha["meta"]["run_id"] == second.run_id and alpha["meta"]["finished"]
    # the summary says which result is from which run
    beta = second.results[1]
    assert beta.kept and beta.results_from == first.run_id
    assert beta.output.endswith("02_beta.failed.ipynb")
    table = runsummary.summary_table(second)
    assert f"kept from an earlier run ({first.run_id})" in table and second.run_id in table
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run_id"] == second.run_id
    assert summary["results_in_effect"]["02_beta"]["run_id"] == first.run_id
    assert summary["results_in_effect"]["02_beta"]["from"] == "kept from an earlier run"
    assert summary["results_in_effect"]["01_alpha"]["from"] == "this run"
    text = cli.provenance_text("smoke", str(out))
    assert "02_beta" in text and "kept from an earlier run" in text and first.run_id in text
    # only promoted results are read as results in effect
    from bnmem_utils.core.results import load_results

    assert set(load_results("smoke", out)) == {"01_alpha", "02_beta", "03_gamma"}

    # a run of other notebooks leaves 02's results as they were
    only = runner.reproduce("smoke", only=["01"], out_dir=out, progress=False, log_output=False)
    in_effect = json.loads((run_dir / "summary.json").read_text())["results_in_effect"]
    assert in_effect["01_alpha"]["run_id"] == only.run_id and in_effect["01_alpha"]["from"] == "this run"
    assert in_effect["03_gamma"]["from"] == "an earlier run"

    # a later success supersedes the failure and removes its copies
    third = _run(monkeypatch, out, _notebook_like(fail=set(), value=3))
    assert third.exit_code == 0
    assert not (run_dir / "02_beta.failed.ipynb").exists()
    assert not (run_dir / "results" / "02_beta.failed.json").exists()
    assert json.loads((run_dir / "results" / "02_beta.json").read_text())["results"]["value"]["value"] == 3


def test_interrupted_rerun_keeps_the_previous_results(project, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "out"
    _run(monkeypatch, out, _notebook_like(fail=set(), value=1))
    run_dir = out / "runs" / "smoke"
    before = (run_dir / "results" / "02_beta.json").read_text()
    with pytest.raises(KeyboardInterrupt):
        _run(monkeypatch, out, _notebook_like(fail=set(), value=2, interrupt={"02_beta"}))
    assert (run_dir / "results" / "02_beta.json").read_text() == before
    assert json.loads((run_dir / "02_beta.ipynb").read_text())["run"] == 1
    assert not list((run_dir / "results").glob("*.pending.json"))
    assert not list(run_dir.glob("*.failed.ipynb"))


def test_hand_run_does_not_wipe_results_until_it_records(project, tmp_path, monkeypatch):  # noqa: F811
    """A notebook run by hand (JupyterLab, plain papermill) writes to runs/<profile>/interactive/,
    labelled by time, never over the headless run's results and figures."""
    from bnmem_utils.run.notebook import NotebookContext

    monkeypatch.delenv("BNMEM_RUN_ID", raising=False)
    out = tmp_path / "out"
    headless = out / "runs" / "smoke" / "results" / "01_alpha.json"
    headless.parent.mkdir(parents=True)
    headless.write_text('{"meta": {}, "results": {"old": {"value": 1}}}\n')
    path = out / "runs" / "smoke" / "interactive" / "results" / "01_alpha.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"meta": {}, "results": {"old": {"value": 1}}}\n')
    ctx = NotebookContext("01_alpha", {"profile": "smoke", "out_dir": str(out)}, verbose=False)
    assert ctx.figures_dir == out / "runs" / "smoke" / "interactive" / "figures"
    assert "old" in path.read_text()
    ctx.record("new", 2)
    payload = json.loads(path.read_text())
    assert payload["results"] == {"new": {"value": 2, "fields": {"metric": "new"}}}
    assert re.fullmatch(r"interactive-\d{8}T\d{6}Z", payload["meta"]["run_id"])
    assert "old" in headless.read_text()                     # the headless run's, untouched


# --------------------------------------------------------------------------------------------
# Figures, manifest, summary and executed copies promoted with the results
# --------------------------------------------------------------------------------------------


def _drawing(value: int, *, interrupt_after_figure: set[str] = frozenset(),
             truncated: set[str] = frozenset()):
    """A stand-in notebook that saves two figures (real PDF, PNG, CSV and manifest entries
    through NotebookContext.save_figure), records its value and writes its executed copy;
    ``interrupt_after_figure``: Ctrl-C right after the first figure; ``truncated``: the disk
    fills while its executed copy is written."""
    def fake(input_path, output_path, parameters=None, **kwargs):
        import errno

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from bnmem_utils.run.notebook import NotebookContext

        name = Path(input_path).stem
        ctx = NotebookContext(name, dict(parameters or {}), verbose=False)
        for figure in ("first", "second"):
            fig, ax = plt.subplots(figsize=(2, 2))
            ax.plot([0, 1], [0, value])
            ctx.save_figure(fig, figure, data={"x": [0, 1], "y": [0, value]})
            plt.close(fig)
            if name in interrupt_after_figure:
                raise KeyboardInterrupt
        ctx.record("value", value)
        text = json.dumps({"cells": [], "run": value})
        if name in truncated:
            Path(output_path).write_text(text[:7])
            raise OSError(errno.ENOSPC, "No space left on device", str(output_path))
        Path(output_path).write_text(text)

    return fake


def _snapshot(out: Path) -> dict[str, bytes]:
    """Every output file under ``out`` (the lock's files aside), by relative path."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".bnmem.lock" not in p.name}


def _good_run(monkeypatch, out):
    first = _run(monkeypatch, out, _drawing(1))
    assert first.exit_code == 0
    before = _snapshot(out)
    assert {"runs/smoke/figures/01_first.pdf", "runs/smoke/figures/01_second.png", "runs/smoke/figures/03_first.csv",
            "runs/smoke/figures/manifest.json", "runs/smoke/summary.json"} <= set(before)
    return before


def test_interrupt_after_a_figure_keeps_every_output_of_the_good_run(project, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "out"
    before = _good_run(monkeypatch, out)
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(_drawing(2, interrupt_after_figure={"01_alpha"})))
    with pytest.raises(KeyboardInterrupt) as info:
        runner.reproduce("smoke", only=["01"], out_dir=out, progress=False, log_output=False)
    assert _snapshot(out) == before  # figures, manifest, results, executed copy, summary.json
    assert "(kept: this run put nothing in place)" in runsummary.summary_table(info.value.summary)
    assert not (out / "runs" / "smoke" / ".staging").exists()


def test_full_disk_in_the_kernel_keeps_the_good_figures(project, tmp_path, monkeypatch):  # noqa: F811
    """The PNG of a figure fails to write after its PDF was written: neither reaches the
    figures folder, and the failed run's copy is valid JSON or absent."""
    import errno

    from matplotlib.figure import Figure

    out = tmp_path / "out"
    before = _good_run(monkeypatch, out)
    savefig = Figure.savefig

    def full_disk_on_png(self, fname, *a, **kw):
        if kw.get("format") == "png":
            raise OSError(errno.ENOSPC, "No space left on device", str(fname))
        return savefig(self, fname, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", full_disk_on_png)
    import papermill

    def notebook_failing_like_papermill(*a, **kw):
        try:
            _drawing(2)(*a, **kw)
        except OSError as exc:
            raise papermill.PapermillExecutionError(2, 1, "save", "OSError", str(exc),
                                                    []) from exc

    # a write failure ends the run at its first notebook (no later one could write either),
    # one line naming the path; every output of the previous good run is kept as it was
    with pytest.raises(OutputError, match="No space left on device"):
        _run(monkeypatch, out, notebook_failing_like_papermill)
    assert _snapshot(out) == before


def test_truncated_executed_copy_is_not_left(project, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "out"
    before = _good_run(monkeypatch, out)
    with pytest.raises(OutputError, match="No space left on device"):   # the run ends at 02
        _run(monkeypatch, out, _drawing(2, truncated={"02_beta"}))
    run_dir = out / "runs" / "smoke"
    assert not (run_dir / "02_beta.failed.ipynb").exists()
    after = _snapshot(out)
    for key in ("runs/smoke/02_beta.ipynb", "runs/smoke/results/02_beta.json",
                "runs/smoke/figures/02_first.pdf", "runs/smoke/figures/02_second.csv"):
        assert after[key] == before[key], key
    assert after["runs/smoke/figures/01_first.csv"] != before["runs/smoke/figures/01_first.csv"]  # promoted
    manifest = json.loads(after["runs/smoke/figures/manifest.json"])
    assert manifest["02_first"] == json.loads(before["runs/smoke/figures/manifest.json"])["02_first"]


def test_full_disk_while_promoting_is_one_line_and_keeps_everything(project, tmp_path, monkeypatch, capsys):  # noqa: F811
    import errno

    out = tmp_path / "out"
    before = _good_run(monkeypatch, out)
    write_text = Path.write_text

    def full_disk_on_manifest(self, *a, **kw):  # in the figures folder, not the staging one
        if self.name.startswith(".manifest.json.") and ".staging" not in str(self):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, *a, **kw)

    monkeypatch.setattr(Path, "write_text", full_disk_on_manifest)
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(_drawing(2)))
    code = cli.main(["reproduce", "--profile", "smoke", "--only", "01", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "cannot write" in err and str(out / "runs" / "smoke" / "figures" / "manifest.json") in err
    assert "No space left on device" in err and "Traceback" not in err
    assert _snapshot(out) == before
    assert not list((out / "runs" / "smoke" / "figures").glob(".*"))


def test_interrupt_during_the_promotion_waits_for_it(project, tmp_path, monkeypatch):  # noqa: F811
    """Ctrl-C that lands between two renames of a promotion is raised after the last one: every
    output of the notebook is then the new run's."""
    import signal

    from bnmem_utils.core import outputs

    out = tmp_path / "out"
    _good_run(monkeypatch, out)
    real, calls = outputs.promote, []

    def promote_then_sigint(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        real(src, dst)

    monkeypatch.setattr(outputs, "promote", promote_then_sigint)
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(_drawing(2)))
    # the precondition: Ctrl-C meets Python's own handler here, whatever an earlier test in this
    # worker left installed (the full suite once left another, and the interrupt went unraised)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            runner.reproduce("smoke", only=["01"], out_dir=out, progress=False, log_output=False)
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(calls) > 2
    summary = info.value.summary
    assert [(r.notebook, r.status) for r in summary.results] == [("01_alpha", "ok")]
    run_dir, figures = out / "runs" / "smoke", out / "runs" / "smoke" / "figures"
    assert json.loads((run_dir / "01_alpha.ipynb").read_text())["run"] == 2
    assert json.loads((run_dir / "results" / "01_alpha.json").read_text())["meta"]["run_id"] == summary.run_id
    manifest = json.loads((figures / "manifest.json").read_text())
    assert "1,2" in (figures / "01_first.csv").read_text()  # the new run's data
    assert manifest["01_first"]["files"] == ["01_first.pdf", "01_first.png", "01_first.csv"]
    assert json.loads((run_dir / "summary.json").read_text())["run_id"] == summary.run_id


def test_a_figure_no_longer_made_leaves_with_the_promotion(project, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "out"
    _good_run(monkeypatch, out)
    figures = out / "runs" / "smoke" / "figures"
    (figures / "01_gone.png").write_bytes(b"old")
    manifest = json.loads((figures / "manifest.json").read_text())
    manifest["01_gone"] = {**manifest["01_first"], "figure": "01_gone", "files": ["01_gone.png"]}
    (figures / "manifest.json").write_text(json.dumps(manifest))
    _run(monkeypatch, out, _drawing(3))
    assert not (figures / "01_gone.png").exists()
    assert "01_gone" not in json.loads((figures / "manifest.json").read_text())


# --------------------------------------------------------------------------------------------
# --out and the per-folder lock
# --------------------------------------------------------------------------------------------


def test_out_pointing_at_a_file_is_one_line_exit_2(project, tmp_path, capsys):  # noqa: F811
    target = tmp_path / "a-file"
    target.write_text("x")
    assert cli.main(["reproduce", "--profile", "smoke", "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err and str(target) in err


def test_out_not_writable_is_one_line_exit_2(project, tmp_path, capsys, monkeypatch):  # noqa: F811
    import tempfile

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", denied)
    assert cli.main(["reproduce", "--profile", "smoke", "--out", str(tmp_path / "ro")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot write there (Permission denied)" in err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_out_read_only_folder(project, tmp_path, capsys):  # noqa: F811
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert cli.main(["reproduce", "--profile", "smoke", "--out", str(ro)]) == 2
    finally:
        ro.chmod(0o755)
    assert "cannot write there" in capsys.readouterr().err


def test_second_run_on_the_same_out_exits_2_naming_the_holder(project, tmp_path, capsys, monkeypatch):  # noqa: F811
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(_notebook_like(fail=set())))
    out = tmp_path / "out"
    root = preflight.check_output_folder(out)
    with runner.output_lock(root, what="bnmem reproduce --profile first"):
        assert cli.main(["reproduce", "--profile", "smoke", "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert f"pid {os.getpid()}" in err and "bnmem reproduce --profile first" in err
        with pytest.raises(UsageError, match="another bnmem run is writing to"):
            runner.reproduce("smoke", out_dir=out, progress=False, log_output=False)
    # released: the next run goes ahead, and leaves no holder file behind
    assert runner.reproduce("smoke", out_dir=out, progress=False, log_output=False).exit_code == 0
    assert not (out / "runs" / ".bnmem.lock.json").exists()


# --------------------------------------------------------------------------------------------
# Model caches under concurrent writers
# --------------------------------------------------------------------------------------------

_WRITER = r'''
import sys, warnings
import torch
torch.set_num_threads(1)
from bnmem_utils.jobs import bank
from bnmem_utils.jobs import grid as experiments
from bnmem_utils.jobs.config import RunConfig
cache = sys.argv[1]
config = RunConfig.grid(dataset="digits", arch="mlp", norm="bn", flip_rate=0.1, epochs=2,
                           train_size=200, test_size=100, augment=False)
with warnings.catch_warnings():
    warnings.simplefilter("error")  # a damaged cache file read back would warn
    r = experiments.run_one(config, "cpu", cache, force=True)
    cfg = RunConfig.bank(dataset="digits", arch="mlp", norm="bn", n_models=4, epochs=1,
                          train_size=120, test_size=60, population_size=40)
    b = bank.train_bank(cfg, cache, device="cpu", progress=False, force=True)
print("OK", r.key, float(r.history["test_acc"].iloc[-1]), b.n_models)
'''


@pytest.mark.slow
def test_two_processes_training_the_same_keys_do_not_corrupt_the_cache(tmp_path):
    import subprocess
    import sys

    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    lines = [o.strip().splitlines()[-1] for o, _ in outs]
    assert lines[0] == lines[1] and lines[0].startswith("OK")
    # what either left behind reads back as sound, without retraining
    from bnmem_utils.jobs import bank
    from bnmem_utils.jobs import grid as experiments

    config = RunConfig.grid(dataset="digits", arch="mlp", norm="bn", flip_rate=0.1, epochs=2,
                               train_size=200, test_size=100, augment=False)
    assert experiments.load_result(cache, config, config.key("cpu")) is not None
    cfg = RunConfig.bank(dataset="digits", arch="mlp", norm="bn", n_models=4, epochs=1,
                          train_size=120, test_size=60, population_size=40)
    assert bank.train_bank(cfg, cache, device="cpu", progress=False).n_models == 4
    assert not list(cache.rglob(".*.tmp"))


# --------------------------------------------------------------------------------------------
# Ctrl-C
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how, code, last", [("SIGINT", 130, "bnmem: interrupted"),
                                             ("SIGTERM", 143, "bnmem: terminated")])
def test_ctrl_c_during_a_cell_is_one_clean_line(tmp_path, how, code, last):
    """SIGINT to the runner's process group while a cell runs: exit 130, 'bnmem: interrupted',
    and no traceback (ipykernel's ZMQError on shutdown used to reach the terminal); SIGTERM to
    the runner alone ends it the same way, with exit code 143."""
    import signal
    import subprocess
    import sys
    import time

    from test_runner import COMMON, make_notebook

    root = tmp_path / "proj"
    make_notebook(root / "notebooks" / "01_sleepy.ipynb", COMMON + "sleepy_s = 60  # seconds\n",
                  ['import bnmem_utils as bm\nnb = bm.start("01_sleepy", globals())',
                   'import time\nprint("SLEEPING", flush=True)\ntime.sleep(sleepy_s)'])
    profiles = root / "profiles"
    profiles.mkdir()
    (profiles / "smoke.yaml").write_text("profile: smoke\nsleepy_s: 60\n")
    env = {**os.environ, "BNMEM_ROOT": str(root), "BNMEM_PROFILES": str(profiles)}
    env.pop("BNMEM_HEADLESS", None)
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bnmem_utils.run.cli", "reproduce", "--profile", "smoke", "--out",
             str(tmp_path / "out"), "--device", "cpu", "--verbose"], stdout=subprocess.PIPE, stderr=err,
            env=env, text=True, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.time() + 120
        while "SLEEPING" not in err_path.read_text() and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        if how == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    stderr = err_path.read_text()
    assert proc.returncode == code, stderr
    assert stderr.rstrip().splitlines()[-1] == last
    assert "Traceback" not in stderr and "ZMQError" not in stderr, stderr
    assert "interrupted" in out


def _closing_lines(text: str) -> dict[str, str]:
    """``{label: value}`` of the closing lines of ``bnmem reproduce`` (``summary:``, ...)."""
    return {m["label"]: m["value"] for m in re.finditer(
        r"^(?P<label>executed notebooks|figures|summary|report): +(?P<value>.*)$", text, re.M)}


def _works(command: str) -> int:
    """The exit status of a ``bnmem`` command as printed."""
    import shlex

    words = shlex.split(command)
    assert words[0] == "bnmem", command
    return cli.main(words[1:])


@pytest.mark.parametrize("how", ["failed", "interrupted"])
def test_a_run_that_put_nothing_in_place_names_only_what_exists(project, tmp_path, monkeypatch,  # noqa: F811
                                                               capsys, how):
    """The first run of a folder (a --set of its own) that put nothing in place: its closing
    lines name no summary, figures folder or report that is not there, and each command they
    name works; `bnmem report` of that folder suggests the command that writes it."""
    import papermill

    out = tmp_path / "out"
    every = {"01_alpha", "02_beta", "03_gamma"}
    fake = _notebook_like(fail=every if how == "failed" else set(),
                          interrupt={"01_alpha"} if how == "interrupted" else set())
    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(fake))
    code = cli.main(["reproduce", "--profile", "smoke", "--set", "alpha_n=3", "--out", str(out),
                     "--quiet"])
    assert code == (1 if how == "failed" else 130)
    lines = _closing_lines(capsys.readouterr().out)
    assert set(lines) == {"executed notebooks", "figures", "summary", "report"}, lines
    for label in ("executed notebooks", "figures", "summary"):
        named = lines[label].split(" (")[0]
        assert named.startswith("none") or Path(named).exists(), (label, lines[label])
    report = re.search(r"`(bnmem [^`]+)`|^(bnmem .*)$", lines["report"])
    command = report[1] or report[2]
    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(_notebook_like(set())))
    assert _works(command) == 0, command
    capsys.readouterr()


def test_report_of_a_folder_without_results_suggests_the_command_that_writes_it(project, tmp_path,  # noqa: F811
                                                                                monkeypatch, capsys):
    """A folder whose runs put nothing in place (runs/<profile>-<digest>/ with only failed
    copies): `bnmem report` of it suggests the `bnmem reproduce` that wrote it, which runs."""
    import papermill

    out = tmp_path / "out"
    monkeypatch.setattr(papermill, "execute_notebook",
                        in_kernel_env(_notebook_like(fail={"01_alpha", "02_beta", "03_gamma"})))
    summary = runner.reproduce("smoke", overrides=["alpha_n=3"], out_dir=out, progress=False,
                               log_output=False)
    folder = summary.plan.profile
    assert folder.startswith("smoke-") and (out / "runs" / folder / "results").is_dir()
    assert cli.main(["report", "--profile", folder, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    command = re.search(r"`(bnmem reproduce [^`]+)`", err)[1]
    assert "--profile smoke " in command and "alpha_n=3" in command, command
    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(_notebook_like(set())))
    assert _works(command) == 0, command


def test_a_full_cache_disk_in_the_kernel_is_one_clean_line(project, tmp_path, monkeypatch,  # noqa: F811
                                                           capsys):
    """A cache record that torch cannot write on a full disk (its ``[enforce fail ...]``
    RuntimeError, turned into an OSError by the cache) ends the run in one line: the record's
    path, "no space left on device" with the space left, what to do; neither the staging folder
    nor torch's words nor the errno."""
    import shutil
    from collections import namedtuple

    import papermill
    import torch

    from bnmem_utils.core import cache

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    record = tmp_path / "cache" / "bank" / "abc.pt"
    with monkeypatch.context() as m:
        m.setattr(torch, "save", full)
        m.setattr(shutil, "disk_usage", lambda p: namedtuple("U", "total used free")(1, 1, 0))
        with pytest.raises(OSError) as info:
            cache.write(record, {"a": 1}, {"x": torch.zeros(2)})

    def notebook(*args, **kwargs):
        raise papermill.PapermillExecutionError(2, 1, "train", "OSError", str(info.value), [])

    monkeypatch.setattr(papermill, "execute_notebook", in_kernel_env(notebook))
    out = tmp_path / "out"
    assert cli.main(["reproduce", "--profile", "smoke", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"bnmem reproduce: error: cannot write {record}: no space left on device (0 MiB "
                   "free there); free space or point $BNMEM_CACHE elsewhere; every output of the "
                   "previous good run is kept"), err


def test_a_write_error_from_the_kernel_names_the_path_it_names():
    from bnmem_utils.core.outputs import kernel_output_error

    error = kernel_output_error("[Errno 28] No space left on device: '/o/runs/x/fig.png'", "/stage")
    assert str(error).startswith("cannot write /o/runs/x/fig.png: No space left on device; ")
    error = kernel_output_error("cannot write /o/m.json: Disk quota exceeded; every output of "
                                "the previous good run is kept", "/stage")
    assert str(error).startswith("cannot write /o/m.json: Disk quota exceeded; every output")
    assert str(kernel_output_error("[Errno 28] No space left on device", "/stage")).startswith(
        "cannot write /stage: No space left on device; ")
