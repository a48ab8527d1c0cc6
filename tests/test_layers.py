"""The package's layers are its subpackages: ``bnmem_utils.LAYERS`` names them from the bottom
up, and every import of a module (those inside functions included; only ``if TYPE_CHECKING:``
imports are exempt) goes to its own layer or one below it. There is no import cycle, and the
README's package tree shows the same folders.

Modules are named from the package down (``"core.cache"``); the package imports itself by
absolute names only, so this parser sees every import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import bnmem_utils

PACKAGE = Path(bnmem_utils.__file__).parent
#: The layer folders, read from the tree: every subpackage (a folder with an ``__init__.py``).
FOLDERS = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
#: Every module of the package, as ``layer.module``.
MODULES = sorted(f"{p.parent.name}.{p.stem}" for p in PACKAGE.glob("*/*.py")
                 if p.stem != "__init__")


def source(module: str) -> str:
    return (PACKAGE / (module.replace(".", "/") + ".py")).read_text()


def layer(module: str) -> str:
    return module.split(".")[0]


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations, never run)."""
    return {id(n) for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
            for stmt in node.body for n in ast.walk(stmt)}


def imports_in(text: str) -> set[str]:
    """The package modules that ``text`` imports anywhere (top level or inside a function;
    ``if TYPE_CHECKING:`` left out), as ``layer.module``."""
    tree = ast.parse(text)
    skip = _type_checking_only(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bnmem_utils"):
            base = node.module.split(".")[1:]
            out |= ({".".join(base)} if len(base) == 2
                    else {f"{base[0]}.{a.name}" for a in node.names} if base else set())
        elif isinstance(node, ast.Import):
            out |= {".".join(a.name.split(".")[1:3]) for a in node.names
                    if a.name.startswith("bnmem_utils.")}
    return out & set(MODULES)


def imports_of(module: str) -> set[str]:
    return imports_in(source(module)) - {module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_parser_sees_every_form_of_import():
    text = ("from bnmem_utils.core import cache, stats\n"
            "from bnmem_utils.jobs.bank import train_bank\n"
            "import bnmem_utils.privacy.attacks\n"
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from bnmem_utils.jobs.config import RunConfig\n"
            "def f():\n    from bnmem_utils.analyses import report\n")
    assert imports_in(text) == {"core.cache", "core.stats", "jobs.bank", "privacy.attacks",
                                "analyses.report"}


def test_the_layers_are_the_folders():
    """``bnmem_utils.LAYERS`` orders exactly the subpackages, and no module lies outside one."""
    assert sorted(bnmem_utils.LAYERS) == FOLDERS
    assert [p.name for p in PACKAGE.glob("*.py")] == ["__init__.py"]


def test_the_package_imports_itself_by_absolute_names():
    """No relative import anywhere (so the layer parser and the cache's code path see all)."""
    relative = {m for m in MODULES for node in ast.walk(ast.parse(source(m)))
                if isinstance(node, ast.ImportFrom) and node.level}
    assert not relative


def test_no_import_cycle_in_the_package():
    graph = {m: imports_of(m) for m in MODULES}
    assert "jobs.bank" in graph["analyses.mitigation"]          # the parser sees the imports
    assert not cycles(graph), f"modules that import each other in a circle: {cycles(graph)}"


def test_no_module_imports_one_of_a_layer_above_it():
    floor = {name: i for i, name in enumerate(bnmem_utils.LAYERS)}
    up = {(m, d) for m in MODULES for d in imports_of(m) if floor[layer(d)] > floor[layer(m)]}
    assert not up, f"imports of a module in a higher layer: {sorted(up)}"


def test_executors_know_nothing_of_banks_or_grids():
    assert {layer(m) for m in imports_of("core.executors")} == {"core"}


def test_figures_are_drawn_in_the_figures_layer():
    drawing = {m for m in MODULES
               if any(isinstance(n, ast.FunctionDef) and n.name.startswith("plot_")
                      for n in ast.parse(source(m)).body)}
    assert drawing and {layer(m) for m in drawing} == {"figures"}, drawing
    figure_modules = {m for m in MODULES if layer(m) == "figures"} - {"figures.plotting"}
    assert {m for m in figure_modules if imports_of(m) & figure_modules} <= {"figures.explore"}


def test_the_run_description_sits_below_the_jobs_that_read_it():
    """The trainers take the parts of a run's description that they read (TrainConfig beside
    the step helpers, PenaltyConfig beside the penalty), so they stand below the description
    (``jobs.config``), which gathers the parts into a RunConfig with its key; the jobs read it."""
    for module in MODULES:
        if layer(module) in ("core", "models", "data", "training", "privacy"):
            assert "jobs.config" not in imports_of(module), module
    for module in ("jobs.grid", "jobs.bank", "jobs.gradnorms"):
        assert "jobs.config" in imports_of(module), module


def test_every_cache_file_goes_through_the_one_cache_module():
    """Only bnmem_utils.core.cache writes or reads a file with torch (records with a digest, one
    error type); every other module caches through it."""
    users = {m for m in MODULES if {"torch.save", "torch.load"} & {
        ast.unparse(n.func) for n in ast.walk(ast.parse(source(m))) if isinstance(n, ast.Call)}}
    assert users == {"core.cache"}, users
    errors = {f"{m}.{n.name}" for m in MODULES for n in ast.parse(source(m)).body
              if isinstance(n, ast.ClassDef) and "Cache" in n.name}
    assert errors == {"core.cache.CacheError"}, errors


ANALYSES = ("privacy.attacks", "analyses.leakage", "analyses.gamma_loop", "analyses.matched_gap",
            "analyses.memorization", "training.per_sample", "analyses.mitigation",
            "core.stats", "analyses.theory")
HEAVY = ("matplotlib", "seaborn", "IPython", "bnmem_utils.run.notebook",
         "bnmem_utils.analyses.report",
         *(f"bnmem_utils.{m}" for m in MODULES if layer(m) == "figures"))


def test_analysis_modules_import_without_the_notebook_layer():
    """``import bnmem_utils.privacy.attacks`` (or any analysis module) in a fresh interpreter
    loads neither matplotlib nor the notebook layer, and the lazy names of the package still
    resolve to the notebook layer's functions."""
    code = ("import sys, importlib\n"
            f"for m in {ANALYSES!r}: importlib.import_module('bnmem_utils.' + m)\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
            "import bnmem_utils\n"
            "print(bnmem_utils.start.__module__)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.splitlines() == ["", "bnmem_utils.run.notebook"]


def readme_tree() -> list[str]:
    """The layer folders the package tree of docs/internals.md (linked from the README) lists,
    in its order (top to bottom)."""
    text = (PACKAGE.parent / "docs" / "internals.md").read_text()
    block = text[text.index("```text\nbnmem_utils/"):]
    block = block[:block.index("\n```", 5)]
    return [line.split()[0].rstrip("/") for line in block.splitlines()[2:]
            if line.strip() and line.split()[0].endswith("/")]


def test_the_readme_shows_the_same_tree():
    """docs/internals.md draws the tree top-down (the layers that use others first)."""
    assert readme_tree() == list(reversed(bnmem_utils.LAYERS))
