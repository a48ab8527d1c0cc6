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


#: The package's code lines when this ceiling was last set: a ratchet, lowered as the package
#: shrinks, never raised without a reason. The move into layer subpackages and its clean-up came
#: to 10,055; it was raised to 10,819 for what came after, each with its tests: declared primary
#: rows, Holm's adjustment and replicate intervals (report, stats), the confound study's three
#: rulers, the docs generated from the committed results (run.docs), the offline HTML and the
#: LaTeX export, the policy applied by the entry points, one run per output folder with its
#: up-front checks (run.preflight), and the parameters declared once (run.rules); then to 10,839
#: for the grid, gradient-norm and mitigation builders taking their sections by name
#: (``train=TrainConfig(...)``, most of the lines imports) instead of routing ``**common``, and
#: to 10,879 for the confound study's view past the fit (analysis and figure) and the one
#: mapping from code names to words in the figures; to 10,944 for what a reader sees at 1024 px
#: beside JupyterLab's file browser (every DataFrame shown wrapping, in parts when too wide,
#: values kept whole, the explorers' readouts wrapping only at spaces, notebook 06's summary as
#: a table); to 11,087 for the console's live progress line (run.progress: the kernels'
#: bars through a state file the runner reads); and to 11,104 for the claims forest drawn as
#: one figure per group of claims, its whole table saved alone (a figure saved without one),
#: 11,106 for a verdict's reason naming the side of zero in the value's own sign, 11,119 for the
#: notebooks' printed text shown whole at any width (``nb.say``), and 11,131 for a lopsided
#: percentile-bootstrap interval left inconclusive with its reason (the effect rule its own
#: function; the side-by-side claims table moved beside the docs' table writer, whose Markdown
#: helper it now shares); to 11,249 for replicate banks (notebook 04's claims measured on R
#: independent banks per arm with a two-level interval, the first replicate's interval and its
#: calibration beside it, and the calibration table of notebook 06 and the docs), and to 11,307
#: for the matched-curve rule on replicate banks (``matched_gap.replicated_matched_gap``: M3's
#: two-level interval, the rule applied in each replicate); lowered to 11,304 when the one-bank
#: Welch difference of two attack tables, left to tests only by the replicate path, was removed;
#: to 11,392 for the confound study's replicate ladders (two-level intervals of both matched-gap
#: estimators, replicate-aware past-the-fit changes and power table, the seed and norm checks);
#: lowered to 11,291 when notebook 04's own gap-matched section, whose question notebook 04b
#: answers with ladders, rulers and replicates, was removed; to 10,852 when each layer dropped
#: what only its tests used, merged its near-copies (one random stream for both trainers, one
#: percentile interval, one results-path helper) and checked each value once; to 10,803 when
#: the grid and the gradient-norm jobs shared one cached-run path and one timing table, and
#: the notebook context lost the module-level wrappers the notebooks never called; +270 for
#: the headline LiRA's rule, the global and NIG attacks, the shadow-count curve, the explorer's fit;
#: +185 for a reader's run kept apart from the published figures (``--publish``, the comparison
#: with the published claims), the last inputs checked before a kernel (a report with nothing to
#: read, deep nesting, the data variables, unwritable output folders, a full disk ending the
#: run, a cache write naming its path), JupyterLab saving the repository's notebooks as
#: committed and stopping with ``bnmem lab``, a hand run's outputs in a folder of their own, and
#: the live line that leads with the whole notebook's time to go and fits 80 columns; +92 for
#: the outputs naming their data (and other data writing a folder of its own), the verdicts a
#: change of method moved recorded for the docs, the confound figure's legends off the data and
#: one colour per verdict, notebook 04's attack table saved as a CSV, and the docs reading the
#: headline attack's row where a secondary row shares its words, and the ruler labels on two lines;
#: to 11,355 for a damaged results file's suggested fix naming the folder reported on; to 11,358
#: for a failed cache write carrying its errno (the runner reads errnos, not message words); to
#: 11,385 for bnmem lab keeping a notebook's metadata as on disk (8), the manifest's data column (5)
#: and the published run's wall times that a first run's live line reads (14); to 11,714 for
#: each profile's training work counted and projected on one H200 (run.work, 329).
#: to 11,719 for the confound study's rows under the per-sample attack, recorded as secondary rows;
#: to 11,726 for the claims forest's labels wrapped onto lines of their own height; to 11,746 for
#: the compiled training forward that a bank's models share (TrainConfig.compile, compile_mode).
#: to 11,749 for the precision a model trains in, resolved in the cache key (steps.precision);
#: to 11,768 for each notebook's configs built once, from its parameters (``*_from_params``);
#: to 11,771 for BNMEM_COMPILE=off, which keeps compile "auto" eager on a GPU; to 11,782 for the
#: comparison with the published run naming the claims of the rows only one of the two has;
#: to 11,790 for YAML 1.2's integers in profiles and --set (017 is 17, 1:30 a string); to
#: 11,804 for --record-changes refusing a path, a lone flag and a comparison with a run missing;
#: to 11,807 for `bnmem report --compare` of a profile never run exiting 2, as bad input; to
#: 11,812 for the confound study's pool-size knob refused up front without cf_train_size; to
#: 11,818 for a $BNMEM_COMPILE other than off refused before a kernel (it compiled, silently);
#: to 11,820 for a data set named twice in $BNMEM_DATA_DIGESTS refused (the second won); to
#: 11,828 for the README's claims table telling apart claims on one sentence of the paper; to
#: 11,834 for a missing profile file read as such, and an empty $BNMEM_PROFILES named; to
#: 11,837 for a digest given for the embedded digits refused (nothing would check it); to
#: 11,896 for the GPU training rates read from a committed measurement (gpu_rates.json), checked,
#: adopted from a new benchmark run, and the GPU bank trainer rule checked against them; to
#: 11,912 for cache keys of the data a bank reads from its root, a registered data set's classes,
#: files replaced behind a converted cache and code edited after import; to 11,960 for the code a
#: registered builder calls and reads, and the pool each bank model file was trained on; to
#: 11,962 for a rates file that measures one rate twice refused (the second won); to 11,984 for
#: --publish refusing to delete the published figures of a notebook the run's folder lacks; to
#: 11,986 for the vectorised block each bank model file records (a GPU's block is the card's);
#: to 12,054 for inputs refused before a kernel that failed in one or ran proving nothing
#: (corruption rates rounding to no sample, an empty shadow-count curve, a --set key twice, YAML
#: keys that are not names, the hinge lists apart) and report messages naming the profile file
#: and --out given; to 12,060 for the torch and numpy versions in every cache key and Ray
#: workers given the driver's $BNMEM_COMPILE, which their keys read; to 12,089 for a registered
#: builder's digest the same in every process (no memory address), through the user's modules,
#: arrays included; to 12,113 for a bank's tasks that never split a vectorised block; to 12,201
#: for the record of a fresh clone's .ci/run that the README's quickstart times are generated from;
#: to 12,227 for the sweep of temporary files a killed writer leaves; to 12,231 for a bank's
#: queries in the precision its members trained in; to 12,255 for the forward passes of queries
#: and evaluation in the profiles' projections; to 12,266 for their speed-up read from the
#: committed rates file; to 12,273 for a task's largest member and the speed-up --adopt keeps;
#: to 12,275 for one decorator that puts both query routines in the training's precision; to
#: 12,350 for notebook 03's per-sample gradients in the projections (their count, their cost
#: read from the rates file, kept by --adopt) and the rates file's readers in a module of their
#: own; to 12,354 for the exact size of a Jacobian row's batch and eval left out where it does not run;
#: to 12,376 for each network's own speed-up of queries over its training, read from the rates file;
#: to 12,406 for --adopt taking the files of one card's split benchmark calls as one (and a line
#: fewer for training_work's named counts); to 12,510 for a rates file from outside checked whole
#: before --adopt takes it (its size, its keys, finite numbers above 0, short strings) and an
#: adopt that changes nothing writing nothing; to 12,530 for an attack chosen by name refused
#: before a kernel where its banks leave too few shadows to run it as named (a dry run keeping
#: the banks it needs); to 12,552 for a profile sized for a GPU stopped before any kernel where
#: --device auto finds none (--allow-cpu goes on); to 12,567 for closing lines that name only
#: outputs that are there and commands that run (a folder of a --set rerun by its own command);
#: to 12,588 for --record-changes refusing a file that is no changes file, left as it was; to
#: 12,589 for --compare-published's help naming the repository's figures a run under --out is
#: compared with; to 12,606 for a write that failed in a kernel named by the path and the OS error
#: it names (a full cache disk without the staging folder or torch's words).
MAX_CODE_LINES = 12_606


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


if __name__ == "__main__":
    chain = longest_chain({m: imports_of(m) for m in MODULES})
    print(f"code lines: {package_code_lines():,} (ceiling {MAX_CODE_LINES:,})")
    print(f"longest import chain: {len(chain)} modules (ceiling {MAX_IMPORT_CHAIN}): "
          + " -> ".join(chain))
