"""Notebook parameters: their names and defaults (read from each notebook's ``parameters``
cell, which papermill overrides) and their constraints (:data:`SPEC`, declared once here).

The runner validates every profile and ``--set`` value against :data:`SPEC` before any kernel
starts, ``bnmem params`` prints it, and :func:`bnmem_utils.start` checks the values again inside
the kernel, so an interactive user gets the same one-line message. Allowed names come from the
package's registries (``models.ARCHS``, ``models.NORMS``, ``data.DATASETS``, ...).
"""

from __future__ import annotations

import ast
import io
import json
import math
import os
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path

from bnmem_utils.core.checks import MIN_MODELS

PARAMETERS_TAG = "parameters"


def cell_source(cell: dict) -> str:
    """A notebook cell's source as one string (the JSON holds a string or a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def parameters_cell(path: str | os.PathLike) -> str:
    """Source of the code cell tagged ``parameters``; an error if the notebook has none."""
    nb = json.loads(Path(path).read_text())
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code" and PARAMETERS_TAG in cell.get("metadata", {}).get("tags", []):
            return cell_source(cell)
    raise ValueError(f"{path}: no code cell is tagged {PARAMETERS_TAG!r}; papermill needs one")


def _assigned(node: ast.stmt) -> str | None:
    """The name a one-target assignment (``x = ...``, ``x: T = ...``) assigns, else None."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id
    return None


def notebook_parameters(path: str | os.PathLike) -> dict[str, object]:
    """Map each parameter name to its default, evaluated as a Python literal.

    The parameters cell may hold only literal assignments (numbers, strings, lists, dicts,
    None, booleans) and comments: derived values belong in the next cell, after papermill's
    injected overrides.
    """
    params: dict[str, object] = {}
    for node in ast.parse(parameters_cell(path)).body:
        name = _assigned(node)
        if name is None:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # a docstring-like string
            raise ValueError(f"{path}: the parameters cell may hold only literal assignments, "
                             f"found: {ast.unparse(node)!r}")
        try:
            params[name] = ast.literal_eval(node.value)
        except ValueError as exc:
            raise ValueError(f"{path}: parameter {name!r} is not a literal: "
                             f"{ast.unparse(node.value)!r}") from exc
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
        name = _assigned(node)
        if name:
            # The comment may trail the last line of a value written over several lines.
            for line in range(node.end_lineno or node.lineno, node.lineno - 1, -1):
                if line in comment_on_line:
                    comments[name] = comment_on_line[line]
                    break
    return comments


# --------------------------------------------------------------------------------------------
# Constraints: one declaration per parameter, read by the runner, `bnmem params` and the notebook
# --------------------------------------------------------------------------------------------


class _Registry:
    """The names of a registry of the package (e.g. ``models.ARCHS``), read when first needed,
    so that reading this table does not import torch."""

    def __init__(self, *refs: str):
        self.refs = refs

    def names(self) -> tuple[str, ...]:
        import importlib

        out: list[str] = []
        for ref in self.refs:
            module, attr = ref.rsplit(".", 1)
            out.extend(str(n) for n in getattr(importlib.import_module(f"bnmem_utils.{module}"), attr))
        return tuple(dict.fromkeys(out))

    def __repr__(self) -> str:
        return " + ".join(self.refs)


_NUMBER_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
                 list: "a list"}


@dataclass(frozen=True)
class Param:
    """The constraint of one notebook parameter.

    ``kind``: int, float, bool, str or list (``item`` then types the elements); ``min``/``max``
    inclusive bounds and ``gt``/``lt`` exclusive ones (of the value, or of each element of a
    list); ``even``; ``choices`` (a tuple, or a registry of the package read when needed);
    ``also``: values allowed besides the range (e.g. 0 = skip); ``nullable``: None allowed;
    ``nonempty``: a list needs an element; ``contains``: elements a list must hold;
    ``download``: the value names data sets (or an OOD source that may be one) that must be on
    disk before the notebook starts unless the parameter of that name (e.g. ``mem_download``) is
    true ("" when the notebook never downloads). Bounds that depend on another parameter of the
    same notebook (checked by :func:`check_relations`): ``split`` = (the parameter naming the
    data set(s), ``"train"`` or ``"test"``): a size at most that split of each data set named
    (:data:`SPLIT_SIZES`); ``at_most``: the parameter whose value bounds this one (or each of
    its elements), e.g. the epochs a list of epochs lies within.
    """

    kind: type
    item: type | None = None
    min: float | None = None
    max: float | None = None
    gt: float | None = None
    lt: float | None = None
    even: bool = False
    choices: tuple | _Registry | None = None
    also: tuple = ()
    nullable: bool = False
    nonempty: bool = False
    contains: tuple = ()
    download: str | None = None
    split: tuple[str, str] | None = None
    at_most: str | None = None

    def allowed(self) -> tuple[str, ...] | None:
        if self.choices is None:
            return None
        return self.choices.names() if isinstance(self.choices, _Registry) else tuple(self.choices)

    def _scalar_words(self, kind: type) -> str:
        text = "an even integer" if self.even else _NUMBER_WORDS.get(kind, kind.__name__)
        # (bracket, operator, bound) of each side: inclusive min/max, exclusive gt/lt
        low = (("[", ">=", self.min) if self.min is not None
               else ("(", ">", self.gt) if self.gt is not None else None)
        high = (("]", "<=", self.max) if self.max is not None
                else (")", "<", self.lt) if self.lt is not None else None)
        if low and high:
            text += f" in {low[0]}{_number(low[2])}, {_number(high[2])}{high[0]}"
        else:
            text += "".join(f" {side[1]} {_number(side[2])}" for side in (low, high) if side)
        if self.also:
            text += " or " + " or ".join(repr(a) for a in self.also)
        return text

    def describe(self) -> str:
        """The constraint in words, e.g. ``an even integer in [4, 1024]`` or ``a non-empty list of:
        bn, none, gn, ln``."""
        choices = self.allowed()
        if self.kind is list:
            head = "a non-empty list" if self.nonempty else "a list"
            if choices is not None:
                text = f"{head} of: {', '.join(choices)}"
            else:
                text = f"{head}, each {self._scalar_words(self.item or object)}"
            if self.contains:
                text += f" (with {', '.join(self.contains)})"
        elif choices is not None:
            text = f"one of: {', '.join(choices)}"
        elif self.kind is bool or self.kind is str:
            text = _NUMBER_WORDS[self.kind]
        else:
            text = self._scalar_words(self.kind)
        if self.at_most:
            text += f", at most {self.at_most}"
        if self.split:
            text += f", at most the {self.split[1]} split of {self.split[0]}"
        if self.nullable:
            text += ", or null (None)"
        return text

    # -- checking -----------------------------------------------------------------------------
    def _check_scalar(self, value, kind: type):
        """``value`` converted to ``kind`` and checked; a ValueError (message: what is wrong)."""
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError("expected true or false")
            return value
        if kind is str:
            if not isinstance(value, str):
                raise ValueError("expected a string")
            choices = self.allowed()
            if choices is not None and value not in choices:
                raise _UnknownName(value, choices)
            return value
        if kind in (int, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"expected {_NUMBER_WORDS[kind]}")
            if kind is int:
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError("expected an integer")
                value = int(value)
            else:
                value = float(value)
                if not math.isfinite(value):
                    raise ValueError("expected a finite number")
            if value in self.also:
                return value
            if ((self.min is not None and value < self.min) or (self.max is not None and value > self.max)
                    or (self.gt is not None and value <= self.gt) or (self.lt is not None and value >= self.lt)
                    or (self.even and value % 2)):
                raise ValueError("out of range")
            return value
        return value

    def check(self, value):
        """``value`` made to the declared type, or ValueError saying what is allowed."""
        if value is None:
            if self.nullable:
                return None
            raise ValueError("null is not allowed")
        if self.kind is list:
            if not isinstance(value, (list, tuple)):
                raise ValueError("expected a list")
            if self.nonempty and not value:
                raise ValueError("the list is empty")
            out = []
            for element in value:
                try:
                    out.append(self._check_scalar(element, self.item or type(element)))
                except _UnknownName as exc:
                    exc.element = True
                    raise
                except ValueError:
                    raise ValueError(f"the element {element!r} is not allowed") from None
            missing = [c for c in self.contains if c not in out]
            if missing:
                raise ValueError(f"the list lacks {', '.join(map(repr, missing))}")
            return out
        return self._check_scalar(value, self.kind)


def _number(x: float) -> str:
    """A bound in words: whole numbers in full (4294967295, not 4.29497e+09), others as %g."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


class _UnknownName(ValueError):
    """A name outside a parameter's choices (reported as ``unknown X 'y'; valid choices: ...``)."""

    def __init__(self, value, choices):
        super().__init__(f"unknown value {value!r}")
        self.value, self.choices, self.element = value, choices, False


class UsageError(ValueError):
    """Bad input from the user: unknown profile, notebook or parameter, or a value of the wrong
    type. The message names the bad value and the valid choices; the CLI exits with code 2."""


class ParameterError(UsageError):
    """A parameter value that breaks its declared constraint; the message is one line naming the
    parameter, the value and what is allowed."""


def check_parameter(name: str, value, *, where: str = ""):
    """``value`` checked against ``SPEC[name]`` (converted to the declared type), or
    :class:`ParameterError`. A name without a declared constraint is returned unchanged."""
    param = SPEC.get(name)
    if param is None:
        return value
    try:
        return param.check(value)
    except _UnknownName as exc:
        what = f"{name} element" if exc.element else name
        raise ParameterError(f"parameter {name!r}{where}: unknown {what} {exc.value!r}; valid "
                             f"choices: {', '.join(exc.choices)}") from None
    except ValueError as exc:
        raise ParameterError(f"parameter {name!r}{where} must be {param.describe()}; got {value!r} "
                             f"({exc})") from None


def check_parameters(values: dict, *, where: str = "") -> dict:
    """Every value of ``values`` checked by :func:`check_parameter`; the converted values."""
    return {k: check_parameter(k, v, where=where) for k, v in values.items()}


_DEVICES = ("auto", "cpu", "cuda", "mps")           # bnmem_utils.core.device.DEVICES (no torch import)
ARCHS = _Registry("models.nets.ARCHS")
NORMS = _Registry("models.nets.NORMS")
DATASETS = _Registry("data.datasets.DATASETS")
OOD_SOURCES = _Registry("data.datasets.NOISE_SOURCES", "data.datasets.DATASETS")
ATTACKS = _Registry("privacy.attacks.ATTACKS")
OPTIMIZERS = _Registry("training.steps.OPTIMIZERS")
SCHEDULES = _Registry("training.steps.SCHEDULES")
EXECUTORS = _Registry("core.executors.EXECUTORS")
DEFINITIONS = _Registry("training.per_sample.DEFINITIONS")

#: Upper bounds a real run could use (the paper profile lies well inside each); a larger value
#: is a typo that would exhaust memory or never end, and is refused before any kernel starts.
MAX_SEED = 2**32 - 1     # NumPy seeds modulo 2**32; the notebooks use seed, seed + 1, ... (RELATIONS)
MAX_SEEDS = 1000         # training seeds per setting (the paper: 3)
MAX_EPOCHS = 1000        # training epochs (the paper: 60)
MAX_SIZE = 10**7         # samples (the largest built-in training split has 60,000)
MAX_BATCH = 65536        # samples per step
MAX_MODELS = 1024        # models per LiRA bank (the paper: 64; LiRA's authors: 256)
MAX_WIDTH = 64           # model width multiplier
MAX_THREADS = 1024       # torch CPU threads
MAX_POINTS = 10**4       # grid points of a theory curve (the paper profile: 33)
MAX_STEPS = 10**6        # gradient steps of the toy gamma loop
MAX_DIM = 4096           # input dimension of a toy model

_COUNT = Param(int, min=1)
_SEEDS = Param(int, min=1, max=MAX_SEEDS)
_EPOCHS = Param(int, min=1, max=MAX_EPOCHS)
_BATCH = Param(int, min=1, max=MAX_BATCH)
_WIDTH = Param(int, min=1, max=MAX_WIDTH)
_SIZE = Param(int, min=1, max=MAX_SIZE, nullable=True)
_RATE = Param(float, min=0, lt=1)
_POSITIVE = Param(float, gt=0)
_NONNEG = Param(float, min=0)
_THREADS = Param(int, min=0, max=MAX_THREADS)
_BOOL = Param(bool)
_TEXT = Param(str)
_N_MODELS = Param(int, min=MIN_MODELS, max=MAX_MODELS, even=True)   # validation.check_n_models

#: Every notebook parameter's constraint, keyed by name (tests/test_params.py checks that every
#: parameter of every notebook has one, and that every default and profile value satisfies it).
SPEC: dict[str, Param] = {
    # common to every notebook
    "profile": Param(str),
    "device": Param(str, choices=_DEVICES),
    "out_dir": _TEXT,
    "seed": Param(int, min=0, max=MAX_SEED),
    # 01_theory
    "theory_ratio_min": _POSITIVE,
    "theory_ratio_max": _POSITIVE,
    "theory_ratio_points": Param(int, min=2, max=MAX_POINTS),
    "theory_sigmas": Param(list, item=float, gt=0, nonempty=True),
    "theory_eta": _POSITIVE,
    "theory_etas": Param(list, item=float, gt=0, nonempty=True),
    "theory_batch_size": Param(int, min=2, max=MAX_BATCH),
    "theory_dim": Param(int, min=1, max=MAX_DIM),
    "theory_outlier_distance": _POSITIVE,
    "theory_conv_batch_sizes": Param(list, item=int, min=2, max=MAX_BATCH, nonempty=True),
    "theory_conv_distances": Param(list, item=float, gt=0, nonempty=True),
    "theory_conv_cosines": Param(list, item=float, min=-1, max=1, nonempty=True),
    "theory_conv_dim": Param(int, min=2, max=MAX_DIM),
    "theory_loop_seeds": Param(int, min=1, max=10**4),
    "theory_loop_n_clean": Param(int, min=2, max=10**4),
    "theory_loop_dim": Param(int, min=1, max=MAX_DIM),
    "theory_loop_distance": _POSITIVE,
    "theory_loop_lr": _POSITIVE,
    "theory_loop_warmup": Param(int, min=0, max=MAX_STEPS),
    "theory_loop_steps": Param(int, min=1, max=MAX_STEPS),
    # 02_forced_memorization
    "mem_datasets": Param(list, choices=DATASETS, nonempty=True, download="mem_download"),
    "mem_archs": Param(list, choices=ARCHS, nonempty=True),
    "mem_norms": Param(list, choices=NORMS, nonempty=True),
    "mem_flip_rates": Param(list, item=float, min=0, lt=1),
    "mem_ood_rates": Param(list, item=float, min=0, lt=1),
    "mem_ood_source": Param(str, choices=OOD_SOURCES, download="mem_download"),
    "mem_seeds": _SEEDS,
    "mem_epochs": _EPOCHS,
    "mem_batch_size": _BATCH,
    "mem_optimizer": Param(str, choices=OPTIMIZERS),
    "mem_lr": _POSITIVE,
    "mem_momentum": _RATE,
    "mem_weight_decay": _NONNEG,
    "mem_schedule": Param(str, choices=SCHEDULES),
    "mem_augment": _BOOL,
    "mem_width": _WIDTH,
    "mem_train_size": Param(int, min=1, max=MAX_SIZE, nullable=True, split=("mem_datasets", "train")),
    "mem_test_size": Param(int, min=1, max=MAX_SIZE, nullable=True, split=("mem_datasets", "test")),
    "mem_fixed_epochs": Param(list, item=int, min=1, max=MAX_EPOCHS, at_most="mem_epochs"),
    "mem_track_gamma_sigma": _BOOL,
    "mem_threads": _THREADS,
    "mem_force_retrain": _BOOL,
    "mem_download": _BOOL,
    "mem_executor": Param(str, choices=EXECUTORS),
    "mem_ray_address": _TEXT,
    # 03_gradient_norms
    "gn_dataset": Param(str, choices=DATASETS, download="gn_download"),
    "gn_arch": Param(str, choices=ARCHS),
    "gn_norms": Param(list, choices=NORMS, nonempty=True, contains=("bn", "none")),
    "gn_seeds": _SEEDS,
    "gn_flip_rate": Param(float, gt=0, lt=1),
    "gn_train_size": Param(int, min=1, max=MAX_SIZE, nullable=True, split=("gn_dataset", "train")),
    "gn_test_size": Param(int, min=1, max=MAX_SIZE, nullable=True, split=("gn_dataset", "test")),
    "gn_epochs": _EPOCHS,
    "gn_batch_size": _BATCH,
    "gn_optimizer": Param(str, choices=OPTIMIZERS),
    "gn_lr": _POSITIVE,
    "gn_weight_decay": _NONNEG,
    "gn_augment": _BOOL,
    "gn_width": _WIDTH,
    "gn_measure_epochs": Param(list, item=int, min=0, max=MAX_EPOCHS, nonempty=True,
                               at_most="gn_epochs"),
    "gn_definitions": Param(list, choices=DEFINITIONS, nonempty=True),
    "gn_max_clean": _SIZE,
    "gn_max_noisy": _SIZE,
    "gn_check_samples": Param(int, min=2, max=1024),
    "gn_threads": _THREADS,
    "gn_download": _BOOL,
    "gn_force": _BOOL,
    "gn_executor": Param(str, choices=EXECUTORS),
    "gn_ray_address": _TEXT,
    # 04_lira (no download parameter: its data sets must be on disk, or fetched by 02/03/05)
    "lira_datasets": Param(list, choices=DATASETS, nonempty=True, download=""),
    "lira_archs": Param(list, choices=ARCHS, nonempty=True),
    "lira_norms": Param(list, choices=NORMS, nonempty=True),
    "lira_outlier_rates": Param(list, item=float, min=0, lt=1, nonempty=True),
    "lira_outlier": Param(str, choices=("ood", "flip")),
    "lira_ood_source": Param(str, choices=OOD_SOURCES, download=""),
    "lira_n_models": _N_MODELS,
    "lira_train_size": Param(int, min=1, max=MAX_SIZE, nullable=True, split=("lira_datasets", "train")),
    "lira_test_size": Param(int, min=1, max=MAX_SIZE, nullable=True, split=("lira_datasets", "test")),
    "lira_population_size": Param(int, min=1, max=MAX_SIZE, nullable=True,
                                  split=("lira_datasets", "test"), at_most="lira_test_size"),
    "lira_epochs": _EPOCHS,
    "lira_gap_epochs": Param(list, item=int, min=1, max=MAX_EPOCHS),
    "lira_gap_outlier_rate": _RATE,
    "lira_batch_size": _BATCH,
    "lira_optimizer": Param(str, choices=OPTIMIZERS),
    "lira_lr": _POSITIVE,
    "lira_weight_decay": _NONNEG,
    "lira_augment": _BOOL,
    "lira_width": _WIDTH,
    "lira_attack": Param(str, choices=ATTACKS),
    "lira_threads": _THREADS,
    "lira_executor": Param(str, choices=EXECUTORS),
    "lira_ray_address": _TEXT,
    # 04b_confound (no download parameter: its data set must be on disk, or fetched by 02/03/05)
    "cf_dataset": Param(str, choices=DATASETS, download=""),
    "cf_arch": Param(str, choices=ARCHS),
    "cf_norms": Param(list, choices=NORMS, nonempty=True, contains=("bn", "none")),
    "cf_epochs": Param(list, item=int, min=1, max=1000, nonempty=True),
    "cf_knob_norms": Param(list, choices=NORMS),
    "cf_weight_decays": Param(list, item=float, min=0, max=1),
    "cf_train_sizes": Param(list, item=int, min=2, max=MAX_SIZE, at_most="cf_train_size"),
    "cf_outlier_rate": _RATE,
    "cf_ood_source": Param(str, choices=OOD_SOURCES, download=""),
    "cf_n_models": replace(_N_MODELS, max=4096),
    "cf_train_size": _SIZE,
    "cf_test_size": _SIZE,
    "cf_population_size": _SIZE,
    "cf_batch_size": Param(int, min=1, max=65536),
    "cf_optimizer": Param(str, choices=OPTIMIZERS),
    "cf_lr": Param(float, gt=0, max=10),
    "cf_weight_decay": Param(float, min=0, max=1),
    "cf_augment": _BOOL,
    "cf_width": Param(int, min=1, max=64),
    "cf_attack": Param(str, choices=ATTACKS),
    "cf_n_knots": Param(int, min=0, max=20),
    "cf_n_boot": Param(int, min=100, max=100000),
    "cf_target_halfwidth": Param(float, gt=0, lt=0.5),
    "cf_threads": Param(int, min=0, max=1024),
    "cf_executor": Param(str, choices=EXECUTORS),
    "cf_ray_address": _TEXT,
    # 05_mitigation
    "mit_dataset": Param(str, choices=DATASETS, download="mit_download"),
    "mit_arch": Param(str, choices=ARCHS),
    "mit_flip_rate": Param(float, gt=0, lt=1),
    "mit_lams": Param(list, item=float, min=0, nonempty=True),
    "mit_hinge_lams": Param(list, item=float, min=0),
    "mit_hinge_taus": Param(list, item=float, min=0),
    "mit_ref_norms": Param(list, choices=NORMS),
    "mit_seeds": _SEEDS,
    "mit_measure_seeds": _SEEDS,
    "mit_epochs": _EPOCHS,
    "mit_lr": _POSITIVE,
    "mit_batch_size": _BATCH,
    "mit_weight_decay": _NONNEG,
    "mit_augment": _BOOL,
    "mit_train_size": Param(int, min=1, max=MAX_SIZE, nullable=True, split=("mit_dataset", "train")),
    "mit_test_size": Param(int, min=1, max=MAX_SIZE, nullable=True, split=("mit_dataset", "test")),
    "mit_tolerance": _RATE,
    "mit_select_tolerance": _RATE,
    "mit_bank_models": replace(_N_MODELS, also=(0,)),
    "mit_bank_lams": Param(list, item=float, min=0),
    "mit_bank_epochs": _EPOCHS,
    "mit_attack": Param(str, choices=ATTACKS),
    "mit_threads": _THREADS,
    "mit_executor": Param(str, choices=EXECUTORS),
    "mit_ray_address": _TEXT,
    "mit_download": _BOOL,
    "mit_force": _BOOL,
    # 06_report
    "report_profile": _TEXT,    # "" or a profile with results (check_relations)
}

#: The (train, test) split sizes of the built-in data sets, declared so that a size is checked
#: against the data set chosen without loading it (tests/test_params.py checks the digits'
#: against the loader). A data set registered at run time has none: its sizes are checked when
#: it is loaded.
SPLIT_SIZES: dict[str, tuple[int, int]] = {
    "digits": (1437, 360), "mnist": (60000, 10000), "fashion_mnist": (60000, 10000),
    "cifar10": (50000, 10000), "cifar100": (50000, 10000),
}

#: Constraints between two parameters of one notebook: (first, second, test, what must hold).
#: Each seed parameter's runs use seeds seed, seed + 1, ..., seed + n - 1, all below 2**32.
RELATIONS: tuple[tuple[str, str, object, str], ...] = (
    ("theory_ratio_min", "theory_ratio_max", lambda a, b: a < b, "below"),
    *(("seed", n, lambda s, k: s + k - 1 <= MAX_SEED, f"at most {MAX_SEED + 1} minus")
      for n in ("theory_loop_seeds", "mem_seeds", "gn_seeds", "mit_seeds")),
)


def check_relations(values: dict, *, where: str = "") -> None:
    """:class:`ParameterError` when two parameters of ``values`` (one notebook's full set of
    values) break a constraint of :data:`RELATIONS`, or a value its ``at_most`` or ``split``
    bound (:class:`Param`)."""
    for a, b, test, words in RELATIONS:
        if values.get(a) is not None and values.get(b) is not None \
                and not test(values[a], values[b]):  # type: ignore[operator]
            raise ParameterError(f"parameter {a!r}{where} must be {words} {b} ({values[b]!r}); "
                                 f"got {values[a]!r}")
    for name, value in values.items():
        param = SPEC.get(name)
        if param is None or value is None:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        bound = values.get(param.at_most) if param.at_most else None
        if bound is not None and any(x > bound for x in items):
            raise ParameterError(f"parameter {name!r}{where} must be at most {param.at_most} "
                                 f"({bound!r}){' each' if param.kind is list else ''}; got {value!r}")
        if param.split:
            _check_split(name, value, param.split, values.get(param.split[0]), where)
    if values.get("report_profile"):
        _check_report_profile(values["report_profile"], values, where)


def _check_report_profile(name: str, values: dict, where: str) -> None:
    """``report_profile`` must name this run's profile or one with results in the output folder
    (``out_dir``): any other name would report no verdict at all."""
    from bnmem_utils.core.paths import output_root

    runs = output_root(values.get("out_dir") or None) / "runs"
    found = sorted(p.parent.name for p in runs.glob("*/results")
                   if any("." not in q.stem for q in p.glob("[0-9][0-9]_*.json")))
    if name != values.get("profile") and name not in found:
        raise ParameterError(
            f"parameter 'report_profile'{where}: no results of profile {name!r} in {runs}; valid "
            f"choices: '' (this profile){''.join(', ' + f for f in found)}")


def _check_split(name: str, size: int, split: tuple[str, str], datasets, where: str) -> None:
    """A size larger than the ``split`` of a data set the parameter ``split[0]`` names."""
    column = 0 if split[1] == "train" else 1
    names = datasets if isinstance(datasets, (list, tuple)) else [datasets]
    for dataset in names:
        limit = SPLIT_SIZES.get(str(dataset), (None, None))[column]
        if limit is not None and size > limit:
            raise ParameterError(f"parameter {name!r}{where} must be at most {limit}, the size of "
                                 f"the {split[1]} split of {dataset} ({split[0]}); got {size!r}")
