"""Read a notebook's ``parameters`` cell: the names and default values papermill can override."""

from __future__ import annotations

import ast
import io
import json
import os
import tokenize
from pathlib import Path

PARAMETERS_TAG = "parameters"


def parameters_cell(path: str | os.PathLike) -> str:
    """Source of the code cell tagged ``parameters``; an error if the notebook has none."""
    nb = json.loads(Path(path).read_text())
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code" and PARAMETERS_TAG in cell.get("metadata", {}).get("tags", []):
            src = cell.get("source", "")
            return "".join(src) if isinstance(src, list) else src
    raise ValueError(f"{path}: no code cell is tagged {PARAMETERS_TAG!r}; papermill needs one")


def notebook_parameters(path: str | os.PathLike) -> dict[str, object]:
    """Map each parameter name to its default, evaluated as a Python literal.

    The parameters cell may hold only literal assignments (numbers, strings, lists, dicts,
    None, booleans) and comments: derived values belong in the next cell, after papermill's
    injected overrides.
    """
    source = parameters_cell(path)
    tree = ast.parse(source)
    params: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring-like string
        else:
            raise ValueError(f"{path}: the parameters cell may hold only literal assignments, "
                             f"found: {ast.unparse(node)!r}")
        try:
            params[name] = ast.literal_eval(value)
        except ValueError as exc:
            raise ValueError(f"{path}: parameter {name!r} is not a literal: {ast.unparse(value)!r}") from exc
    return params


def parameter_comments(path: str | os.PathLike) -> dict[str, str]:
    """The trailing ``# comment`` of each parameter line, used by ``bnmem params`` as its help.

    Comments are found with the tokenizer, so a ``#`` or ``=`` inside a string value or inside
    the comment itself is read correctly.
    """
    source = parameters_cell(path)
    comment_on_line: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comment_on_line[tok.start[0]] = tok.string.lstrip("#").strip()
        tree = ast.parse(source)
    except (tokenize.TokenError, SyntaxError):
        return {}
    comments: dict[str, str] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name):
            # The comment may trail the last line of a value written over several lines.
            for line in range(node.end_lineno or node.lineno, node.lineno - 1, -1):
                if line in comment_on_line:
                    comments[target.id] = comment_on_line[line]
                    break
    return comments
