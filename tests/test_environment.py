"""environment.yml (conda-forge) and pyproject.toml name the same packages with the same ranges,
and the install metadata the quickstart relies on is in place."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
#: conda-forge package name -> PyPI distribution name, where they differ.
CONDA_TO_PYPI = {"pytorch": "torch"}
#: Entries of environment.yml that are not dependencies of the package.
CONDA_ONLY = {"python", "pip"}
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")


def normalise(name: str) -> str:
    """PEP 503 name: lower case, runs of '-', '_' and '.' become '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def split_requirement(text: str) -> tuple[str, str]:
    """``"Foo_Bar[x] >= 1, <2"`` -> ``("foo-bar", ">=1,<2")`` (extras and markers dropped)."""
    match = _REQ.match(text)
    assert match, f"cannot parse requirement {text!r}"
    return normalise(match.group(1)), re.sub(r"\s+", "", match.group(3) or "")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pyproject_requirements() -> dict[str, str]:
    """Core dependencies plus the ``test`` extra: ``{name: specifier}``."""
    project = pyproject()
    reqs = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    return dict(split_requirement(r) for r in reqs)


def environment() -> tuple[dict[str, str], list[str]]:
    """environment.yml as ``({pypi name: specifier}, [pip section entries])``."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env.get("channels") == ["conda-forge"], "environment.yml should use conda-forge only"
    conda: dict[str, str] = {}
    pip: list[str] = []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip.extend(dep.get("pip", []))
            continue
        name, spec = split_requirement(str(dep))
        if name in CONDA_ONLY:
            continue
        conda[CONDA_TO_PYPI.get(name, name)] = spec
    return conda, pip


def test_split_requirement():
    assert split_requirement("Foo_Bar[x] >= 1, <2 ; python_version>'3'") == ("foo-bar", ">=1,<2")
    assert split_requirement("ray[default]>=2.9") == ("ray", ">=2.9")
    assert split_requirement("pyyaml") == ("pyyaml", "")


def test_environment_names_the_same_packages_as_pyproject():
    conda, _ = environment()
    wanted = pyproject_requirements()
    missing = sorted(set(wanted) - set(conda))
    extra = sorted(set(conda) - set(wanted))
    assert not missing, f"in pyproject.toml but not in environment.yml: {missing}"
    assert not extra, f"in environment.yml but not in pyproject.toml: {extra}"


def test_environment_uses_the_same_version_ranges():
    conda, _ = environment()
    wanted = pyproject_requirements()
    drift = {name: (wanted[name], conda[name]) for name in wanted
             if name in conda and wanted[name] != conda[name]}
    assert not drift, f"version ranges differ (pyproject, environment.yml): {drift}"


def test_environment_installs_the_package_itself_through_pip():
    _, pip = environment()
    allowed = {"-e .", ".", "-e .[test]", ".[test]"}
    assert pip and set(pip) <= allowed, f"pip section should install only this checkout, got {pip}"


def test_issue_dependency_list_and_extras():
    names = set(dict(split_requirement(r) for r in pyproject()["dependencies"]))
    required = {"torch", "torchvision", "jupyterlab", "papermill", "nbconvert", "numpy",
                "matplotlib", "seaborn", "ipywidgets", "scikit-learn", "scipy", "tqdm", "pyyaml",
                "ipykernel"}
    assert required <= names, f"missing dependencies: {sorted(required - names)}"
    extras = pyproject()["optional-dependencies"]
    assert "pytest" in {split_requirement(r)[0] for r in extras["test"]}
    assert {"ruff", "nbstripout", "pre-commit"} <= {split_requirement(r)[0] for r in extras["dev"]}
    assert pyproject()["scripts"]["bnmem"] == "bnmem_utils.run.cli:main"
    assert pyproject()["requires-python"] == ">=3.11"


def test_installed_versions_satisfy_the_ranges():
    """The environment the tests run in satisfies pyproject's ranges (so they are not stale)."""
    from importlib import metadata

    packaging = pytest.importorskip("packaging.specifiers")
    for name, spec in pyproject_requirements().items():
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # e.g. pytest-xdist is optional at run time
        version = version.split("+")[0]
        assert packaging.SpecifierSet(spec).contains(version, prereleases=True), (
            f"{name} {version} is outside {spec}")


def test_profiles_ship_with_the_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "profiles/*.yaml" in config["tool"]["setuptools"]["package-data"]["bnmem_utils"]
    for name in ("smoke", "quick", "paper"):
        assert (ROOT / "bnmem_utils" / "profiles" / f"{name}.yaml").is_file()


def test_ci_script_runs_the_readme_test_command():
    """.ci/run ends with the README's second quickstart command (what a user types to test)."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```(?:bash|sh)?\n(.*?)```", quickstart, flags=re.S)
    lines = [line.strip() for block in commands for line in block.strip().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    assert len(lines) == 2, f"the quickstart should be exactly two commands, found {lines}"
    assert "bnmem reproduce" in lines[0] and "pip install" in lines[0]
    assert lines[1] in ci, f".ci/run does not run the README's test command {lines[1]!r}"
    assert (ROOT / ".ci" / "run").stat().st_mode & 0o111, ".ci/run is not executable"


def test_ci_checks_that_importing_the_package_changes_nothing():
    """Right after the install, .ci/run imports the package in an environment without the
    thread policy's variables and checks that the import left the environment as it was."""
    from bnmem_utils.core.threads import GLIBC_ENV, POLICY

    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    install = next(i for i, line in enumerate(lines) if "pip install" in line and "-e " in line)
    check = lines[install + 1]
    assert check.startswith("env ") and all(f"-u {name}" in check for name in {*POLICY, *GLIBC_ENV})
    assert ('.venv/bin/python -c "import os; e = dict(os.environ); import bnmem_utils; '
            'assert dict(os.environ) == e"') in check
