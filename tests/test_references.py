"""Every reference a notebook makes resolves inside the repository: linked and named files exist,
and every ``bnmem`` command (with its options) that a notebook tells the reader to run exists."""

from __future__ import annotations

import json
import re

import pytest

from bnmem_utils.core.paths import project_root
from bnmem_utils.run import cli
from bnmem_utils.run import plan as runplan

ROOT = project_root()
NOTEBOOKS = runplan.discover_notebooks(ROOT / "notebooks")
_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")
_PATH = re.compile(r"`((?:bnmem_utils|tests|docs|benchmarks|notebooks)/[\w./-]+)`")
_COMMAND = re.compile(r"\bbnmem ([a-z][a-z-]*)([^`\n]*)")
_OUTSIDE = re.compile(r"\b(?:PAPER|DESIGN|STYLE)\.md\b|\.\./shared/|\bissue \d+")


def _text(name: str) -> str:
    cells = json.loads(NOTEBOOKS[name].read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells)


def _anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of a Markdown file's headings."""
    out = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_links_and_paths_resolve(name):
    text = _text(name)
    for target, anchor in _LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path = (ROOT / "notebooks" / target).resolve()
        assert path.exists(), f"{name}: link to {target} does not resolve ({path})"
        assert ROOT in path.parents, f"{name}: link {target} leaves the repository"
        if anchor and path.suffix == ".md":
            assert anchor[1:] in _anchors(path.read_text()), f"{name}: no heading {anchor} in {target}"
            # JupyterLab's heading ids keep the title's case (The-claims): it lands on the section
            # by an explicit anchor, which GitHub honours too
            assert f'<a id="{anchor[1:]}"></a>' in path.read_text(), \
                f"{name}: {target} has no <a id=\"{anchor[1:]}\"></a> before its heading"
    for path in _PATH.findall(text):
        assert (ROOT / path).exists(), f"{name}: names {path}, which is not in the repository"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_references_outside_the_repository(name):
    found = _OUTSIDE.findall(_text(name))
    assert not found, f"{name} refers to things outside the repository: {found}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_named_commands_exist(name):
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    for command, rest in _COMMAND.findall(_text(name)):
        if command in {"utils"}:  # bnmem_utils, matched from "bnmem_utils" only with a space
            continue
        assert command in subparsers, f"{name}: `bnmem {command}` is not a command " \
                                      f"(commands: {', '.join(subparsers)})"
        options = {s for a in subparsers[command]._actions for s in a.option_strings}
        for opt in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
            assert opt in options, f"{name}: `bnmem {command}` has no option {opt}"


def test_the_paper_summary_is_in_the_repository():
    text = (ROOT / "docs" / "paper.md").read_text()
    for heading in ("the-claims", "the-theory-worked-out", "definitions",
                    "measured-gammasigma-per-layer"):
        assert heading in _anchors(text)
    for term in ("(gamma/sigma_B)^2", "LiRA score", "Keep matrix", "eval mode", "train mode"):
        assert term in text


# --------------------------------------------------------------------------------------------
# README.md and docs/*.md
# --------------------------------------------------------------------------------------------

DOCS = {p.relative_to(ROOT).as_posix(): p for p in [ROOT / "README.md",
                                                     *sorted((ROOT / "docs").glob("*.md"))]}
_MD_LINK = re.compile(r"\]\(([^)\s]*)\)")
_DOC_PATH = re.compile(r"`((?:bnmem_utils|tests|docs|benchmarks|notebooks|figures)/[\w./-]*"
                       r"[\w/])`")
_FIGURE = re.compile(r"`(\d\d[a-z]?_[a-z0-9_]+)(?:\.(?:csv|png|pdf))?`")
_SCRIPT = re.compile(r"(?:benchmarks/)?\b(bench_\w+|gpu_smoke)\.py((?: +[^\s`|]+)*)")


def _doc_commands(text: str) -> list[tuple[str, str]]:
    """``(command, rest of the line)`` for each ``bnmem <cmd>`` in a code span or code block."""
    spans = re.findall(r"```.*?```|`[^`\n]+`", text, flags=re.S)
    return [m for s in spans for m in _COMMAND.findall(s)]


@pytest.mark.parametrize("name", DOCS)
def test_doc_links_and_anchors_resolve(name):
    doc = DOCS[name]
    text = doc.read_text()
    for target in _MD_LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.exists(), f"{name}: link to {target} does not resolve ({path})"
        assert ROOT in path.parents or path == ROOT, f"{name}: link {target} leaves the repository"
        if anchor:
            assert anchor in _anchors(path.read_text()), f"{name}: no heading #{anchor} in {path.name}"


@pytest.mark.parametrize("name", DOCS)
def test_doc_paths_and_figures_exist(name):
    text = DOCS[name].read_text()
    for path in _DOC_PATH.findall(text):
        assert (ROOT / path).exists(), f"{name}: names {path}, which is not in the repository"
    stems = {p.stem for p in ROOT.glob("figures/*/*.png")} | set(NOTEBOOKS) | {  # a table alone
        p.stem for p in ROOT.glob("figures/*/*.csv")}
    for stem in _FIGURE.findall(text):
        assert stem in stems, f"{name}: names {stem}, neither a notebook nor a committed figure"


@pytest.mark.parametrize("name", DOCS)
def test_doc_commands_and_their_flags_exist(name):
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    for command, rest in _doc_commands(DOCS[name].read_text()):
        assert command in subparsers, f"{name}: `bnmem {command}` is not a command"
        if getattr(subparsers[command], "passes_through", False):  # bnmem lab: to JupyterLab
            continue
        actions = subparsers[command]._actions
        options = {s for a in actions for s in a.option_strings}
        for opt in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
            assert opt in options, f"{name}: `bnmem {command}` has no option {opt}"


def _script_options(script: str) -> dict[str, bool]:
    """``{--flag: whether it takes a value}`` of a benchmark script's argparse options."""
    source = (ROOT / "benchmarks" / f"{script}.py").read_text()
    calls = source.split("add_argument(")[1:]
    return {flag: "store_true" not in call.split("add_argument")[0]
            for call in calls for flag in re.findall(r'"(--[\w-]+)"', call.split(")")[0])}


@pytest.mark.parametrize("name", DOCS)
def test_doc_benchmark_flags_exist_with_their_values(name):
    for script, rest in _SCRIPT.findall(DOCS[name].read_text()):
        assert (ROOT / "benchmarks" / f"{script}.py").exists(), f"{name}: no {script}.py"
        options, tokens = _script_options(script), rest.split()
        for i, token in enumerate(tokens):
            if not token.startswith("--"):
                continue
            assert token in options, f"{name}: {script}.py has no option {token}"
            given = i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
            assert given or not options[token], f"{name}: {script}.py {token} needs a value"


def test_every_profile_is_listed_by_reproduce_help_and_the_paper_summary():
    from bnmem_utils.run.docs import profile_summaries

    names = set(runplan.available_profiles())
    summaries = profile_summaries()
    assert set(summaries) == names and all(summaries.values())
    reproduce = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    help_text = reproduce["reproduce"].format_help()
    assert all(f"  {n} " in help_text for n in names)
    text = (ROOT / "docs" / "paper.md").read_text()
    section = text[text.index("## The profiles"):]
    listed = set(re.findall(r"^\| `([\w-]+)` \|", section, flags=re.M))
    assert listed == names, f"docs/paper.md's profiles {sorted(listed)} against {sorted(names)}"
