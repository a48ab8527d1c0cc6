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
