"""Sizes and seams the package holds to, beside what ruff checks (``[tool.ruff.lint]`` in
pyproject.toml holds statements and branches per function):

* every module of the package is at most :data:`MAX_MODULE_LINES` lines;
* every function is at most :data:`MAX_FUNCTION_LINES` lines, counted from its ``def`` line to
  its last line (``end_lineno - lineno + 1``: docstring, comments and blank lines included,
  decorators not), but for the few named in :data:`LONG_FUNCTIONS`, each held to its length
  when the ceiling was set;
* the longest chain of imports inside the package (imports inside functions counted, the
  graph of ``tests/test_layers.py``) is at most :data:`MAX_IMPORT_CHAIN` modules;
* no module imports another module's private names (``from bnmem_utils.training.loop import _foo``), nor reads
  them through the module (``bank._foo``);
* the package's code lines (docstrings, comments and blank lines left out) do not grow past
  :data:`MAX_CODE_LINES`.

``python tests/test_structure.py`` prints the code lines and the longest import chain.

The layers themselves (no cycle, what sits above what, what an analysis module loads) are
``tests/test_layers.py``'s.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize

from test_layers import MODULES, PACKAGE, imports_of, source

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

#: Functions longer than MAX_FUNCTION_LINES, each with its length as its ceiling (none today:
#: add one here only with a reason).
LONG_FUNCTIONS: dict[str, int] = {}

#: The longest import chain, imports inside functions counted: an analysis, a job, the run
#: description, the data sets, their files and the cache (e.g. analyses.leakage -> jobs.bank ->
#: jobs.config -> data.datasets -> data.files -> core.cache) and no deeper.
MAX_IMPORT_CHAIN = 7


#: The package's code lines: a ratchet, lowered as the package shrinks and raised only for a reason.
MAX_CODE_LINES = 13_455  # + the archs fit table and under-fit note, the wide networks' CPU layout and
#                          evaluation speed, notebook 03's several settings, two deep-network profiles,
#                          the archs table's matched gap, the depth figure's commit, the ladder table


def _tree(module: str) -> ast.Module:
    return ast.parse(source(module))


def test_no_module_is_longer_than_the_limit():
    sizes = {m: len(source(m).splitlines()) for m in MODULES}
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def function_lengths() -> dict[str, int]:
    """``{module.function: lines}`` of every function and method (nested ones by their own
    name), from the ``def`` line to the last line."""
    out: dict[str, int] = {}
    for m in MODULES:
        for node in ast.walk(_tree(m)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{m}.{node.name}"
                out[name] = max(out.get(name, 0), node.end_lineno - node.lineno + 1)
    return out


def test_no_function_is_longer_than_the_limit():
    lengths = function_lengths()
    long = {n: k for n, k in lengths.items() if k > MAX_FUNCTION_LINES}
    assert set(long) <= set(LONG_FUNCTIONS), f"split these: {set(long) - set(LONG_FUNCTIONS)}"
    grown = {n: (k, LONG_FUNCTIONS[n]) for n, k in long.items() if k > LONG_FUNCTIONS[n]}
    assert not grown, f"longer than their ceiling (now, ceiling): {grown}"
    stale = {n for n in LONG_FUNCTIONS if lengths.get(n, 0) <= MAX_FUNCTION_LINES}
    assert not stale, f"now within the limit, drop them from LONG_FUNCTIONS: {stale}"


def longest_chain(graph: dict[str, set[str]]) -> tuple[str, ...]:
    """The longest path of modules through ``graph`` (acyclic: tests/test_layers.py checks it)."""
    @functools.cache
    def from_(m: str) -> tuple[str, ...]:
        return max(((m, *from_(d)) for d in sorted(graph[m])), key=len, default=(m,))

    return max((from_(m) for m in sorted(graph)), key=len, default=())


def test_the_chain_finder_finds_the_longest_chain():
    assert longest_chain({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a"}}) == (
        "d", "a", "b", "c")


def test_the_longest_import_chain_is_short():
    chain = longest_chain({m: imports_of(m) for m in MODULES})
    assert len(chain) <= MAX_IMPORT_CHAIN, " -> ".join(chain)


def test_no_module_imports_another_modules_private_names():
    """``from .x import _name`` nowhere (dunders such as ``__version__`` are public)."""
    private = set()
    for m in MODULES:
        for node in ast.walk(_tree(m)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bnmem_utils"):
                private |= {f"{m}: from {node.module} import {a.name}"
                            for a in node.names
                            if a.name.startswith("_") and not a.name.endswith("__")}
    assert not private, sorted(private)


def test_no_module_reads_another_modules_private_names():
    """``module._name`` of another package module nowhere."""
    found = set()
    for m in MODULES:
        tree = _tree(m)
        modules = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and (node.module or "").startswith("bnmem_utils.") for a in node.names
                   if f"{node.module.split('.', 1)[1]}.{a.name}" in MODULES}
        found |= {f"{m}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in modules and node.attr.startswith("_")
                  and not node.attr.endswith("__")}
    assert not found, sorted(found)


def code_lines(source: str) -> int:
    """Lines of ``source`` that hold code: not blank, not only a comment, not a docstring (of
    the module, a class or a function)."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docs.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    lines = {n for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type not in skip for n in range(tok.start[0], tok.end[0] + 1)}
    return len(lines - docs)


def package_code_lines() -> int:
    inits = [p.read_text() for p in PACKAGE.glob("**/__init__.py")]
    return sum(code_lines(text) for text in [*map(source, MODULES), *inits])


def test_code_lines_are_counted_without_docstrings_comments_or_blanks():
    source = '"""Doc\nstring."""\n\n# a comment\nx = 1  # trailing\n\ndef f():\n    """Doc."""\n    return (1,\n            2)\n'
    assert code_lines(source) == 4          # x = 1, def f():, and the two lines of the return


def test_the_package_does_not_grow():
    assert package_code_lines() <= MAX_CODE_LINES


def test_the_ceiling_says_its_reason_not_its_history():
    """The comment over MAX_CODE_LINES is its reason in a line or two; each change of the number
    is told by its commit (git log -L), not kept here."""
    lines = open(__file__).read().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("MAX_CODE_LINES = "))
    above = 0
    while lines[at - above - 1].startswith("#"):
        above += 1
    assert 1 <= above <= 2, f"{above} comment lines over MAX_CODE_LINES"


if __name__ == "__main__":
    chain = longest_chain({m: imports_of(m) for m in MODULES})
    print(f"code lines: {package_code_lines():,} (ceiling {MAX_CODE_LINES:,})")
    print(f"longest import chain: {len(chain)} modules (ceiling {MAX_IMPORT_CHAIN}): "
          + " -> ".join(chain))
