"""The package's modules form layers (:data:`LAYERS`, the README's table of the package): every
import, those inside functions included, goes to the module's own layer or one below it, there
is no import cycle, and the README lists the same layers with the same modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bnmem_utils

PACKAGE = Path(bnmem_utils.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")

#: The layers, from the bottom up, and their modules: what the README's "package in one page"
#: table says, in the same order.
LAYERS = {
    "base": ("paths", "validation", "threads", "stats", "cache", "device", "results", "outputs"),
    "ingredients": ("datafiles", "data", "models", "attacks", "executors"),
    "training": ("steps", "train", "vlayers", "stacked", "vtrain", "penalty", "bnstats",
                 "persample"),
    "description": ("config",),
    "jobs": ("experiments", "members", "bank", "grads"),
    "analyses": ("theory", "gammaloop", "memorization", "banktables", "gapmatch", "confound",
                 "regularize", "mitigation", "report"),
    "figures": ("plotting", "plots_theory", "plots_memorization", "plots_gradnorm",
                "plots_privacy", "explore"),
    "notebooks, CLI": ("notebook", "params", "runplan", "runner", "runsummary", "publish", "cli"),
}


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations, never run)."""
    return {id(n) for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
            for stmt in node.body for n in ast.walk(stmt)}


def imports_of(module: str) -> set[str]:
    """The package modules ``module`` imports anywhere in its source (top level or not; imports
    under ``if TYPE_CHECKING:`` left out)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    skip = _type_checking_only(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:                      # from .x import y / from . import x, y
                names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            elif node.level == 0 and (node.module or "").startswith("bnmem_utils"):
                parts = node.module.split(".")
                names = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
            else:
                continue
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names
                     if a.name.startswith("bnmem_utils.")]
        else:
            continue
        out |= {n for n in names if n in MODULES and n != module}
    return out


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


def test_no_import_cycle_in_the_package():
    graph = {m: imports_of(m) for m in MODULES}
    assert "bank" in graph["regularize"]                 # the parser sees the imports
    assert not cycles(graph), f"modules that import each other in a circle: {cycles(graph)}"


def test_executors_know_nothing_of_banks_or_grids():
    assert not imports_of("executors") & {"bank", "experiments", "grads", "regularize", "vtrain"}


FIGURES = {"plotting", "plots_theory", "plots_memorization", "plots_gradnorm", "plots_privacy"}


def test_figures_are_drawn_in_the_figure_modules_above_the_analyses():
    drawing = {m for m in MODULES
               if any(isinstance(n, ast.FunctionDef) and n.name.startswith("plot_")
                      for n in ast.parse((PACKAGE / f"{m}.py").read_text()).body)}
    assert drawing == FIGURES, f"figures drawn outside the figure modules: {drawing - FIGURES}"
    above = FIGURES | {"explore", "notebook", "runner", "runplan", "runsummary", "cli", "publish"}
    below = set(MODULES) - above
    assert not {m for m in below if imports_of(m) & FIGURES}
    assert {m for m in FIGURES if imports_of(m) & (FIGURES - {"plotting"})} == set()


def test_the_run_description_sits_between_training_and_the_jobs():
    """The trainers take the parts of a run's description that they read (TrainConfig beside
    the step helpers, PenaltyConfig beside the penalty), so they stand below the description,
    which gathers the parts into a RunConfig with its key; the jobs read RunConfigs."""
    assert imports_of("config") <= {"paths", "cache", "validation", "data", "models", "device",
                                    "attacks", "steps", "penalty", "persample"}
    for module in ("steps", "train", "vlayers", "stacked", "vtrain", "penalty", "persample",
                   "members", "data"):
        assert "config" not in imports_of(module), module
    for module in ("experiments", "bank", "grads"):
        assert "config" in imports_of(module), module


def test_every_cache_file_goes_through_the_one_cache_module():
    """Only bnmem_utils.cache writes or reads a file with torch (records with a digest, one
    error type); every other module caches through it."""
    users = {m for m in MODULES if {"torch.save", "torch.load"} & {
        ast.unparse(n.func) for n in ast.walk(ast.parse((PACKAGE / f"{m}.py").read_text()))
        if isinstance(n, ast.Call)}}
    assert users == {"cache"}, users
    errors = {f"{m}.{n.name}" for m in MODULES
              for n in ast.parse((PACKAGE / f"{m}.py").read_text()).body
              if isinstance(n, ast.ClassDef) and "Cache" in n.name}
    assert errors == {"cache.CacheError"}, errors


ANALYSES = ("attacks", "banktables", "gammaloop", "gapmatch", "memorization", "persample",
            "regularize", "stats", "theory")
HEAVY = ("matplotlib", "seaborn", "IPython", "bnmem_utils.notebook", "bnmem_utils.report",
         *(f"bnmem_utils.{m}" for m in sorted(FIGURES)))


def test_analysis_modules_import_without_the_notebook_layer():
    """``import bnmem_utils.attacks`` (or any analysis module) in a fresh interpreter loads
    neither matplotlib nor the notebook layer: the package's ``__init__`` loads it lazily."""
    import subprocess
    import sys

    code = ("import sys, importlib\n"
            f"for m in {ANALYSES!r}: importlib.import_module('bnmem_utils.' + m)\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == ""
    assert bnmem_utils.start is not None                 # the lazy names still resolve


def test_every_module_is_in_one_layer():
    placed = [m for modules in LAYERS.values() for m in modules]
    assert sorted(placed) == MODULES, set(placed) ^ set(MODULES)


def test_no_module_imports_one_of_a_layer_above_it():
    floor = {m: i for i, modules in enumerate(LAYERS.values()) for m in modules}
    up = {(m, d) for m in MODULES for d in imports_of(m) if floor[d] > floor[m]}
    assert not up, f"imports of a module in a higher layer: {sorted(up)}"


def test_the_readme_lists_the_same_layers():
    text = (PACKAGE.parent / "README.md").read_text()
    table = text[text.index("| layer | modules | what it holds |"):]
    lines = table.splitlines()[2:]
    rows = [line.split("|")[1:3] for line in lines[:next(i for i, line in enumerate(lines)
                                                         if not line.startswith("| "))]]
    listed = {name.strip(): tuple(m.strip(" `") for m in mods.split(",")) for name, mods in rows}
    assert listed == LAYERS

