"""Switching the profile inside a notebook: ``profile = "smoke"`` in the parameters cell gives the
smoke profile's values, through the runner's ``load_profile``; explicit values still win."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import nbformat  # noqa: E402
import pytest  # noqa: E402

from bnmem_utils.run import (
    notebook,  # noqa: E402
    params,
)
from bnmem_utils.run.plan import load_profile
from bnmem_utils.run.runner import UsageError  # noqa: E402

CELL = ('profile = "quick"  # p\ndevice = "cpu"  # d\nout_dir = ""  # o\nseed = 0  # s\n'
        'demo_epochs = 40  # e\ndemo_rates = [0.01, 0.05]  # r\ndemo_lr = 0.1  # l\n')


def _project(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "proj"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(CELL)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    (root / "notebooks").mkdir(parents=True)
    nbformat.write(nb, root / "notebooks" / "07_demo.ipynb")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "smoke.yaml").write_text("profile: smoke\ndemo_epochs: 2\ndemo_rates: [0.1]\n"
                                         "demo_lr: 0.5\nother_notebook_key: 3\n")
    (profiles / "quick.yaml").write_text("profile: quick\ndemo_epochs: 40\n")  # = the default
    monkeypatch.setenv("BNMEM_ROOT", str(root))
    monkeypatch.setenv("BNMEM_PROFILES", str(profiles))
    monkeypatch.delenv("BNMEM_HEADLESS", raising=False)
    monkeypatch.delenv("BNMEM_CACHE", raising=False)
    return root


def _namespace(root: Path, **changes) -> dict:
    """What the kernel holds after the parameters cell ran (with a user's edits)."""
    ns = dict(params.notebook_parameters(root / "notebooks" / "07_demo.ipynb"))
    ns["out_dir"] = str(root / "out")
    ns.update(changes)
    return ns


def test_profile_in_the_parameters_cell_gives_its_values(tmp_path, monkeypatch, capsys):
    root = _project(tmp_path, monkeypatch)
    ns = _namespace(root, profile="smoke")
    nb = notebook.start("07_demo", ns)
    # The namespace the next cells read holds the profile's values, not quick's.
    assert (ns["demo_epochs"], ns["demo_rates"], ns["demo_lr"]) == (2, [0.1], 0.5)
    assert nb.params["demo_epochs"] == 2 and nb.profile == "smoke"
    results = (root / "out").resolve() / "runs" / "smoke" / "interactive" / "results"
    assert nb.results_file == results / "07_demo.json"
    assert "other_notebook_key" not in ns  # keys of other notebooks stay out
    out = capsys.readouterr().out
    assert "profile smoke: 3 parameter(s) taken from the profile" in out
    nb.record("demo_number", 1.0)  # a hand run writes its results file from its first number
    saved = json.loads(nb.results_file.read_text())
    assert saved["meta"]["parameters"]["demo_epochs"] == 2


def test_explicit_values_win_over_the_profile(tmp_path, monkeypatch):
    root = _project(tmp_path, monkeypatch)
    ns = _namespace(root, profile="smoke", demo_epochs=5)  # edited in the cell (or injected)
    nb = notebook.start("07_demo", ns, verbose=False)
    assert ns["demo_epochs"] == 5 and nb.params["demo_epochs"] == 5
    assert ns["demo_lr"] == 0.5  # untouched: the profile's
    # An int where the default is a float is an edit too, not "the default".
    ns = _namespace(root, profile="smoke", demo_lr=1)
    notebook.start("07_demo", ns, verbose=False)
    assert ns["demo_lr"] == 1


def test_the_default_profile_changes_nothing(tmp_path, monkeypatch):
    root = _project(tmp_path, monkeypatch)
    ns = _namespace(root)
    before = dict(ns)
    notebook.start("07_demo", ns, verbose=False)
    assert ns == before


def test_a_profile_file_path_names_the_outputs(tmp_path, monkeypatch):
    root = _project(tmp_path, monkeypatch)
    mine = tmp_path / "mine.yaml"
    mine.write_text("demo_epochs: 7\n")
    ns = _namespace(root, profile=str(mine))
    nb = notebook.start("07_demo", ns, verbose=False)
    assert ns["profile"] == "mine" and nb.profile == "mine" and ns["demo_epochs"] == 7
    assert nb.figures_dir.parts[-4:] == ("runs", "mine", "interactive", "figures")


def test_same_mechanism_as_the_runner(tmp_path, monkeypatch):
    root = _project(tmp_path, monkeypatch)
    name, values = load_profile("smoke")
    ns = _namespace(root, profile="smoke")
    notebook.start("07_demo", ns, verbose=False)
    assert {k: ns[k] for k in ("demo_epochs", "demo_rates", "demo_lr")} == \
        {k: values[k] for k in ("demo_epochs", "demo_rates", "demo_lr")}


def test_headless_runs_keep_the_runner_values(tmp_path, monkeypatch):
    """Under the runner every value is already resolved (profile, then --set): a --set back to
    the notebook's default must not be replaced by the profile's value."""
    root = _project(tmp_path, monkeypatch)
    monkeypatch.setenv("BNMEM_HEADLESS", "1")
    ns = _namespace(root, profile="smoke", demo_epochs=40)
    notebook.start("07_demo", ns, verbose=False)
    assert ns["demo_epochs"] == 40


def test_bad_profile_and_bad_value_are_clear_errors(tmp_path, monkeypatch):
    root = _project(tmp_path, monkeypatch)
    with pytest.raises(UsageError, match="unknown profile 'smok'; valid choices: quick, smoke"):
        notebook.start("07_demo", _namespace(root, profile="smok"), verbose=False)
    (tmp_path / "profiles" / "bad.yaml").write_text("demo_epochs: many\n")
    with pytest.raises(UsageError, match="demo_epochs"):
        notebook.start("07_demo", _namespace(root, profile="bad"), verbose=False)


def test_every_notebook_takes_the_smoke_profile(monkeypatch):
    """The real notebooks and profiles: smoke's values reach every notebook that declares them."""
    monkeypatch.delenv("BNMEM_PROFILES", raising=False)
    monkeypatch.delenv("BNMEM_ROOT", raising=False)
    _, smoke = load_profile("smoke")
    for path in sorted(notebook.notebooks_dir().glob("[0-9][0-9]*_*.ipynb")):
        defaults = params.notebook_parameters(path)
        ps = {**defaults, "profile": "smoke"}
        notebook.apply_profile(ps, defaults)
        for key, value in smoke.items():
            if key in defaults:
                assert ps[key] == value, (path.name, key)
