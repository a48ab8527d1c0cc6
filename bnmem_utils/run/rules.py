"""The rules of notebook parameters and their one table, ``parameters.yaml`` beside this module:
each parameter's notebook, default, constraint (:class:`Param`), dry-run value and help
(:func:`declarations`); and the YAML reader of profiles, ``--set`` and the table
(:func:`load_yaml`: YAML 1.2 numbers, no key twice, no key a list or a mapping).
:mod:`bnmem_utils.run.params` checks values against the table and writes the notebooks'
parameters cells from it.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("parameters.yaml")
#: The section of :data:`TABLE` every notebook declares first.
SHARED = "every notebook"




class DuplicateKeyError(ValueError):
    """A mapping that names one key twice (the second would silently win)."""


class KeyTypeError(ValueError):
    """A mapping key that is a list or a mapping (YAML's ``? [a, b]``): a key is a name."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's numbers (``1e-3`` is a float, not a string) and an
    error for a key given twice in one mapping, or a key that is a list or a mapping."""

    def construct_mapping(self, node, deep=False):
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (list, dict)):
                raise KeyTypeError(f"the key {shown(key)} (line {line}) is a "
                                   f"{'list' if isinstance(key, list) else 'mapping'}; a key is a name")
            if key in seen:
                raise DuplicateKeyError(f"key {key!r} is given twice (lines {seen[key]} and {line})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# YAML 1.2's numbers, not 1.1's: 1e-3 is a float, 017 is 17 (not octal 15), 0o17 and 0x1f are
# octal and hex, and 1:30 (1.1's base 60: 90), 0b101 and 1_000 are strings, which a check names.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT, re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
    r"|\.(?:nan|NaN|NAN))$"), list("-+.0123456789"))
_Loader.add_constructor(_INT, lambda loader, node: int(
    text := loader.construct_scalar(node), {"0x": 16, "0o": 8}.get(text[:2], 10)))


def shown(value, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters (``...`` marks the cut): an error line names a
    value without repeating a pasted page of it."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width - 3]}..."


def load_yaml(text: str):
    """``text`` read as YAML 1.2 numbers; :class:`DuplicateKeyError` for a repeated key,
    :class:`KeyTypeError` for a key that is a list or a mapping, and a ``yaml.YAMLError`` for
    nesting deeper than the parser's recursion allows."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to read (a parameter's value is a number, a "
                             "string, or a list of them)") from None


class _Registry:
    """The names of a registry of the package (e.g. ``models.ARCHS``), read when first needed,
    so that reading this table does not import torch."""

    def __init__(self, *refs: str):
        self.refs = refs

    def names(self) -> tuple[str, ...]:
        out: list[str] = []
        for ref in self.refs:
            module, attr = ref.rsplit(".", 1)
            out.extend(str(n) for n in getattr(importlib.import_module(f"bnmem_utils.{module}"), attr))
        return tuple(dict.fromkeys(out))


_NUMBER_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
                 list: "a list"}


@dataclass(frozen=True)
class Param:
    """The constraint of one notebook parameter.

    ``kind``: int, float, bool, str or list (``item`` then types the elements); ``min``/``max``
    inclusive bounds and ``gt``/``lt`` exclusive ones (of the value, or of each element of a
    list); ``even``; ``choices`` (a tuple, or a registry of the package read when needed);
    ``also``: values allowed besides the range (e.g. 0 = skip); ``nullable``: None allowed;
    ``nonempty``: a list needs an element; ``contains``: elements a list must hold (and no
    list holds an element twice: each defines runs or banks);
    ``download``: the value names data sets (or an OOD source that may be one) that must be on
    disk before the notebook starts unless the parameter of that name (e.g. ``mem_download``) is
    true ("" when the notebook never downloads). Bounds that depend on another parameter of the
    same notebook (checked by :func:`bnmem_utils.run.params.check_relations`): ``split`` = (the
    parameter naming the data set(s), ``"train"`` or ``"test"``): a size at most that split of
    each data set named (:data:`bnmem_utils.run.params.SPLIT_SIZES`); ``at_most``: the parameter whose value bounds this one (or each of
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
                text += f" (with {', '.join(map(str, self.contains))})"
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
        if kind in (bool, str):
            if not isinstance(value, kind):
                raise ValueError(f"expected {_NUMBER_WORDS[kind]}")
            choices = self.allowed()
            if choices is not None and value not in choices:
                raise UnknownName(value, choices)
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
                except UnknownName as exc:
                    exc.element = True
                    raise
                except ValueError:
                    raise ValueError(f"the element {shown(element)} is not allowed") from None
            twice = [x for i, x in enumerate(out) if x in out[:i]]
            if twice:
                raise ValueError(f"{twice[0]!r} is given twice: a list names each value once")
            missing = [c for c in self.contains if c not in out]
            if missing:
                raise ValueError(f"the list lacks {', '.join(map(repr, missing))}")
            return out
        return self._check_scalar(value, self.kind)


def _number(x: float) -> str:
    """A bound in words: whole numbers in full (4294967295, not 4.29497e+09), others as %g."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


class UnknownName(ValueError):
    """A name outside a parameter's choices (reported as ``unknown X 'y'; valid choices: ...``)."""

    def __init__(self, value, choices):
        super().__init__(f"unknown value {value!r}")
        self.value, self.choices, self.element = value, choices, False


_REGISTRIES = {name.split(".")[-1]: _Registry(name) for name in (
    "models.nets.ARCHS", "models.nets.NORMS", "data.datasets.DATASETS", "privacy.attacks.ATTACKS",
    "privacy.attacks.HEADLINE_CHOICES",
    "training.steps.OPTIMIZERS", "training.steps.SCHEDULES", "core.executors.EXECUTORS",
    "training.per_sample.DEFINITIONS")}
_REGISTRIES["OOD_SOURCES"] = _Registry("data.datasets.NOISE_SOURCES", "data.datasets.DATASETS")



# --------------------------------------------------------------------------------------------
# The table: one declaration per parameter
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Declaration:
    """One notebook parameter as :data:`TABLE` declares it: the notebooks that take it, its
    default, one-line help, constraint and dry-run value (None: a dry run keeps the value)."""

    name: str
    notebooks: tuple[str, ...]
    default: object
    help: str
    param: Param
    dry: object = None

    def dry_value(self, current):
        """The value of a dry run, given the run's ``current`` value (see :data:`TABLE`'s
        ``dry``): a number caps it, a list replaces a non-empty list, ``extremes`` keeps a rate
        list's largest rate and its 0."""
        if isinstance(current, (list, tuple)):
            if not current:
                return []
            if self.dry == "extremes":
                rates = {float(r) for r in current}
                return sorted({max(rates)} | ({0.0} & rates))
            return list(self.dry)  # type: ignore[call-overload]
        return self.dry if current is None or current > self.dry else current  # type: ignore[operator]


_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "list": list}


def _declare(name: str, entry: dict, notebooks: tuple[str, ...]) -> Declaration:
    """A :class:`Declaration` from its entry of :data:`TABLE`; the type and a list's item type
    follow the default unless the entry names them."""
    entry = dict(entry)
    default, help_, dry = entry.pop("default"), entry.pop("help"), entry.pop("dry", None)
    kind = _TYPES[entry.pop("type")] if "type" in entry else type(default)
    item = _TYPES[entry.pop("item")] if "item" in entry else None
    if kind is list and item is None:
        item = str if "choices" in entry else type(default[0]) if default else None
    choices = entry.pop("choices", None)
    if isinstance(choices, str):
        choices = _REGISTRIES[choices]
    elif choices is not None:
        choices = tuple(choices)
    for key in ("also", "contains", "split"):
        if key in entry:
            entry[key] = tuple(entry[key])
    nullable = entry.pop("nullable", False) or default is None
    param = Param(kind, item=item, choices=choices, nullable=nullable, **entry)
    return Declaration(name, notebooks, default, help_, param, dry)


@functools.cache
def declarations() -> dict[str, Declaration]:
    """Every parameter of :data:`TABLE` by name, in the table's order (shared ones first)."""
    table = load_yaml(TABLE.read_text(encoding="utf-8"))
    notebooks = tuple(k for k in table if k not in ("kinds", SHARED))
    out: dict[str, Declaration] = {}
    for section in (SHARED, *notebooks):
        owners = notebooks if section == SHARED else (section,)
        for name, entry in table[section].items():
            out[name] = _declare(name, entry, owners)
    return out


def notebook_declarations(notebook: str) -> list[Declaration]:
    """The parameters ``notebook`` declares, in its cell's order ([] for a notebook the table
    does not know)."""
    return [d for d in declarations().values() if notebook in d.notebooks]


