"""The committed notebooks: structure, profile coverage, and a headless smoke run of each.

Structure tests read the .ipynb files (milliseconds). The smoke runs execute each notebook
through the runner under the ``smoke`` profile into a temporary output folder, so they never
write into the repository's runs/ or figures/; they are marked ``slow`` but run by default
(deselect them with ``-m "not slow"``).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest

from bnmem_utils.core.paths import project_root
from bnmem_utils.run import params, runner
from bnmem_utils.run import plan as runplan

NOTEBOOKS_DIR = project_root() / "notebooks"
NOTEBOOKS = runplan.discover_notebooks(NOTEBOOKS_DIR)
PROFILES = runplan.available_profiles()
PREFIXES = {"01": "theory_", "02": "mem_", "03": "grad_", "04": "lira_", "04b": "cf_", "05": "mit_",
            "06": "report_"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_notebooks_are_found():
    assert NOTEBOOKS, f"no NN_name.ipynb notebooks in {NOTEBOOKS_DIR}"


def test_no_stray_notebooks():
    """Every notebook in notebooks/ follows the NN_name pattern, so the runner sees all of them."""
    stray = [p.name for p in NOTEBOOKS_DIR.glob("*.ipynb") if p.stem not in NOTEBOOKS]
    assert not stray, f"notebooks the runner would skip (name them NN_name.ipynb): {stray}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name):
    nb = _load(NOTEBOOKS[name])
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{name}: cells {dirty} hold outputs or execution counts; run nbstripout"
    assert "papermill" not in nb.get("metadata", {}), f"{name} is an executed copy"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_cell_has_a_unique_id(name):
    """nbformat 4.5 gives every cell an id; a cell without one makes papermill warn on every run
    (and nbformat will refuse it)."""
    ids = [c.get("id") for c in _load(NOTEBOOKS[name])["cells"]]
    missing = [i for i, x in enumerate(ids) if not x]
    assert not missing, f"{name}: cells {missing} have no id; nbformat.validator.normalize adds them"
    assert len(set(ids)) == len(ids), f"{name}: repeated cell ids"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_kernel_metadata(name):
    """papermill (run directly, as the README shows) needs the kernel and language metadata;
    jupytext adds it with ``--set-kernel python3``."""
    spec = _load(NOTEBOOKS[name]).get("metadata", {}).get("kernelspec", {})
    assert spec.get("name") == "python3" and spec.get("language") == "python", (
        f"{name}: metadata.kernelspec is {spec}; convert with jupytext --set-kernel python3")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_one_literal_parameters_cell_with_comments(name):
    nb = _load(NOTEBOOKS[name])
    tagged = [i for i, c in enumerate(nb["cells"])
              if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{name}: {len(tagged)} cells tagged 'parameters', expected exactly 1"
    assert nb["cells"][tagged[0]]["cell_type"] == "code"
    declared = params.notebook_parameters(NOTEBOOKS[name])  # raises on a non-literal value
    for common in runplan.COMMON_PARAMETERS:
        assert common in declared, f"{name} does not declare the common parameter {common!r}"
    assert declared["profile"] == "quick" and declared["device"] == "auto"
    assert declared["out_dir"] == "" and isinstance(declared["seed"], int)
    comments = params.parameter_comments(NOTEBOOKS[name])
    uncommented = [k for k in declared if not comments.get(k)]
    assert not uncommented, f"{name}: parameters without a trailing # comment: {uncommented}"
    prefix = PREFIXES.get(name.split("_", 1)[0])
    if prefix:
        own = [k for k in declared if k not in runplan.COMMON_PARAMETERS]
        wrong = [k for k in own if not k.startswith(prefix)]
        assert not wrong, f"{name}: parameters should carry the prefix {prefix!r}: {wrong}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_starts_the_context_after_the_parameters(name):
    """The first code cell after the parameters opens the context with the notebook's own name."""
    cells = _load(NOTEBOOKS[name])["cells"]
    index = next(i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    code = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells[index + 1:] if c["cell_type"] == "code"]
    calls = [node for src in code[:2] for node in ast.walk(ast.parse(src))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "start"]
    assert calls, f"{name}: none of the two code cells after the parameters calls bm.start(...)"
    first = calls[0].args[0]
    assert isinstance(first, ast.Constant) and first.value == name, (
        f"{name}: bm.start is called with {ast.unparse(first)}, expected {name!r}")


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_key_is_declared(profile):
    """A profile key that no notebook declares is a typo (papermill would only warn)."""
    name, values = runplan.load_profile(profile)
    assert name == profile
    table = runplan.notebook_parameter_table(NOTEBOOKS)
    runplan.validate_values(values, table, source=f"profile {profile}")  # raises with the choices


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory) -> Path:
    """One output folder for all smoke runs, as in ``bnmem reproduce --profile smoke``: the
    notebooks run in order, so 06_report finds the results of 01-05 (and caches are shared)."""
    return tmp_path_factory.mktemp("smoke")


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_runs_headless_under_smoke(name, smoke_out):
    summary = runner.reproduce("smoke", only=[name], out_dir=smoke_out,
                               log_output=False, progress=False)
    (result,) = summary.results
    assert result.ok, f"{name} failed: {result.error}\n{result.cell}\nexecuted copy: {result.output}"
    results_file = smoke_out / "runs" / "smoke" / "results" / f"{name}.json"
    assert results_file.is_file(), f"{name} wrote no results file"
    recorded = _load(results_file)["results"]
    assert recorded, f"{name} recorded no key numbers"
    figures_dir = smoke_out / "runs" / "smoke" / "figures"
    figures = sorted(figures_dir.glob(f"{name.split('_', 1)[0]}_*.png"))
    assert figures, f"{name} saved no figure"
    manifest = _load(figures_dir / "manifest.json")
    for png in figures:
        assert png.with_suffix(".pdf").is_file(), f"{png.stem} has no PDF"
        assert manifest[png.stem]["notebook"] == name, f"{png.stem} is not in the manifest"


@pytest.mark.slow
def test_every_claim_resolves_to_a_recorded_number(smoke_out):
    """The claims are wired: after a smoke run of every notebook, each claim of
    ``report.CLAIMS`` finds its key among the recorded results, with a number, or with the
    notebook's stated reason for having none (a failed premise, judged "not reproduced")."""
    from bnmem_utils.analyses import report

    results_dir = smoke_out / "runs" / "smoke" / "results"
    todo = [n for n in NOTEBOOKS if not (results_dir / f"{n}.json").is_file()]
    if todo:  # run on its own (the smoke tests above deselected): run what is missing
        summary = runner.reproduce("smoke", only=todo, out_dir=smoke_out, log_output=False,
                                   progress=False)
        assert all(r.ok for r in summary.results), [r.error for r in summary.results if not r.ok]
    rows = report.claims_table(report.CLAIMS, "smoke", out_dir=smoke_out)
    assert {r["id"] for r in rows} == {c.id for c in report.CLAIMS}
    missing = [f"{r['id']} ({r['key']}): {r['reason']}" for r in rows if r["verdict"] == "missing"]
    assert not missing, "claims whose key no notebook recorded:\n" + "\n".join(missing)
    claims = {c.id: c for c in report.CLAIMS}
    for r in rows:
        if r["value"] is None:
            assert r["verdict"] == claims[r["id"]].words("not reproduced") and r["reason"], r
        else:
            assert np.isfinite(r["value"]), r


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_prints_through_the_context(name):
    """A notebook's text goes through ``nb.say``: printed text JupyterLab would break anywhere,
    a number included, at a narrow width."""
    code = [c for c in _load(NOTEBOOKS[name])["cells"] if c["cell_type"] == "code"]
    printing = [line.strip() for c in code for line in "".join(c["source"]).splitlines()
                if re.search(r"(?<![\w.])print\(", line)]
    assert printing == [], f"{name}: use nb.say instead of print: {printing}"
