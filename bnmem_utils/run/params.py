"""Notebook parameters, declared once in ``parameters.yaml`` beside this module (read by
:func:`bnmem_utils.run.rules.declarations`): each one's notebook, default, constraint, dry-run
value and one-line help.

Each notebook's ``parameters`` cell is written from that table (:func:`cell_text`,
``bnmem params --write-cells``) and read back by papermill and :func:`notebook_parameters`. The
runner validates every profile and ``--set`` value against the table before any kernel starts,
``bnmem params`` prints it, and :func:`bnmem_utils.start` checks the values again inside the
kernel, so an interactive user gets the same one-line message. Allowed names come from the
package's registries (``models.ARCHS``, ``models.NORMS``, ``data.DATASETS``, ...).
"""

from __future__ import annotations

import ast
import io
import json
import os
import sys
import tokenize
from pathlib import Path

from bnmem_utils.core.checks import keep_matrix
from bnmem_utils.run import rules
from bnmem_utils.run.rules import UnknownName, declarations, notebook_declarations

PARAMETERS_TAG = "parameters"
#: Old parameter prefixes and their new ones: an old key still works, with a one-line message.
RENAMED_PREFIXES = {"gn_": "grad_"}


def cell_source(cell: dict) -> str:
    """A notebook cell's source as one string (the JSON holds a string or a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tagged(nb: dict, path: str | os.PathLike) -> dict:
    """The code cell of ``nb`` (read from ``path``) tagged ``parameters``; an error if none is."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code" and PARAMETERS_TAG in cell.get("metadata", {}).get("tags", []):
            return cell
    raise ValueError(f"{path}: no code cell is tagged {PARAMETERS_TAG!r}; papermill needs one")


def parameters_cell(path: str | os.PathLike) -> str:
    """Source of the code cell tagged ``parameters``; an error if the notebook has none."""
    return cell_source(_tagged(json.loads(Path(path).read_text()), path))


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


class UsageError(ValueError):
    """Bad input from the user: unknown profile, notebook or parameter, or a value of the wrong
    type. The message names the bad value and the valid choices; the CLI exits with code 2."""


class ParameterError(UsageError):
    """A parameter value that breaks its declared constraint; the message is one line naming the
    parameter, the value and what is allowed."""




def _literal(value) -> str:
    """``value`` as Python source in a parameters cell (strings in double quotes)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_literal, value)) + "]"
    return repr(value)


def cell_text(notebook: str) -> str:
    """The source of ``notebook``'s parameters cell as :data:`TABLE` declares it."""
    return "\n".join(f"{d.name} = {_literal(d.default)}  # {d.help}"
                     for d in notebook_declarations(notebook))


def stale_cells(notebooks: dict[str, Path]) -> list[str]:
    """The notebooks of ``notebooks`` (``{stem: path}``) that the table declares and whose
    parameters cell differs from :func:`cell_text`."""
    return [stem for stem, path in notebooks.items() if notebook_declarations(stem)
            and parameters_cell(path) != cell_text(stem)]


def write_cells(notebooks: dict[str, Path]) -> list[str]:
    """Rewrite each stale parameters cell of ``notebooks`` from the table (its tag, id and the
    notebook's nbformat layout kept, no outputs); return the stems rewritten."""
    stale = stale_cells(notebooks)
    for stem in stale:
        path = Path(notebooks[stem])
        nb = json.loads(path.read_text(encoding="utf-8"))
        cell = _tagged(nb, path)
        cell["source"] = cell_text(stem).splitlines(keepends=True)
        cell["outputs"], cell["execution_count"] = [], None
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n",
                        encoding="utf-8")
    return stale


def rename_deprecated(values: dict, *, source: str) -> dict:
    """``values`` with old parameter names (:data:`RENAMED_PREFIXES`) replaced by the new ones,
    one line on stderr for each; an old and a new name of one parameter together are an error."""
    out = {}
    for key, value in values.items():
        for old, new in RENAMED_PREFIXES.items():
            renamed = new + key[len(old):]
            if key.startswith(old) and renamed in declarations():
                if renamed in values:
                    raise UsageError(f"{source} sets both {key!r} and its new name {renamed!r}; "
                                     f"keep {renamed!r}")
                print(f"bnmem: parameter {key!r} (from {source}) is now {renamed!r}; use the new "
                      "name, the old one will stop working", file=sys.stderr)
                key = renamed
        out[key] = value
    return out


def check_parameter(name: str, value, *, where: str = ""):
    """``value`` checked against the declared constraint of ``name`` (converted to the declared
    type), or :class:`ParameterError`. A name the table does not declare is returned unchanged."""
    param = SPEC.get(name)
    if param is None:
        return value
    try:
        return param.check(value)
    except UnknownName as exc:
        what = f"{name} element" if exc.element else name
        raise ParameterError(f"parameter {name!r}{where}: unknown {what} {exc.value!r}; valid "
                             f"choices: {', '.join(exc.choices)}") from None
    except ValueError as exc:
        raise ParameterError(f"parameter {name!r}{where} must be {param.describe()}; got {rules.shown(value)} "
                             f"({exc})") from None


def check_parameters(values: dict, *, where: str = "") -> dict:
    """Every value of ``values`` checked by :func:`check_parameter`; the converted values."""
    return {k: check_parameter(k, v, where=where) for k, v in values.items()}


#: Every notebook parameter's constraint, keyed by name (tests/test_params.py checks that every
#: parameter of every notebook has one, and that every default and profile value satisfies it).
SPEC: dict[str, rules.Param] = {name: d.param for name, d in declarations().items()}

#: The (train, test) split sizes of the built-in data sets, declared so that a size is checked
#: against the data set chosen without loading it (tests/test_params.py checks the digits'
#: against the loader). A data set registered at run time has none: its sizes are checked when
#: it is loaded.
SPLIT_SIZES: dict[str, tuple[int, int]] = {
    "digits": (1437, 360), "mnist": (60000, 10000), "fashion_mnist": (60000, 10000),
    "cifar10": (50000, 10000), "cifar100": (50000, 10000),
}

MAX_SEED = 2**32 - 1     # NumPy seeds modulo 2**32
#: Each notebook's runs use seeds seed, seed + 1, ..., seed + n - 1, n the sum of these counts.
SEED_COUNTS = (("theory_loop_seeds",), ("mem_seeds",), ("grad_seeds",),
               ("mit_seeds", "mit_measure_seeds"), ("lira_replicates",), ("mit_bank_replicates",),
               ("cf_replicates",))
#: Lists whose elements must be among another list parameter's (the confound study's norms).
SUBSETS = {"cf_knob_norms": "cf_norms", "cf_replicated_norms": "cf_norms"}
#: Lists that, when not empty, need another parameter set (not null, not empty), and why.
NEEDS = {"cf_train_sizes": ("cf_train_size", "its levels are compared with the ladder's pool"),
         "mit_hinge_lams": ("mit_hinge_taus", "the hinge form trains at each lambda and tau"),
         "mit_hinge_taus": ("mit_hinge_lams", "the hinge form trains at each lambda and tau")}
#: The LiRA banks: (models per bank, pool sizes, data set(s), outlier rates, outlier kind or the
#: parameter naming it).
BANKS = (
    ("lira_n_models", ("lira_train_size",), "lira_datasets",
     ("lira_outlier_rates",), "lira_outlier"),
    ("cf_n_models", ("cf_train_size", "cf_train_sizes"), "cf_dataset", ("cf_outlier_rate",), "ood"),
    ("mit_bank_models", ("mit_train_size",), "mit_dataset", (), "flip"),
)
#: The corruption rates: (rate(s), the sizes of the training sets they corrupt, data set(s),
#: outlier kind or the parameter naming it, whether a clean sample must be left). A rate flips
#: or inserts round(rate * n) of n training samples (:func:`bnmem_utils.data.datasets.corrupt`;
#: a bank's pool before its inserts): above 0 it must corrupt one, or its setting is the clean
#: one under another name.
CORRUPTIONS = (
    ("mem_flip_rates", ("mem_train_size",), "mem_datasets", "flip", False),
    ("mem_ood_rates", ("mem_train_size",), "mem_datasets", "ood", False),
    ("grad_flip_rate", ("grad_train_size",), "grad_datasets", "flip", True),
    ("lira_outlier_rates", ("lira_train_size",), "lira_datasets", "lira_outlier", False),
    ("cf_outlier_rate", ("cf_train_size", "cf_train_sizes"), "cf_dataset", "ood", False),
    ("mit_flip_rate", ("mit_train_size",), "mit_dataset", "flip", False),
)


def check_relations(values: dict, *, where: str = "") -> None:
    """:class:`ParameterError` when the parameters of ``values`` (one notebook's full set of
    values) break a bound that depends on another one: ``at_most`` and ``split``
    (:class:`Param`), the seeds' room below 2**32, a toy grid's order, the samples each
    corruption rate corrupts, the banks' members, the shadow-count curve's points, the chosen
    attacks and the report's profile."""
    low, high = values.get("theory_ratio_min"), values.get("theory_ratio_max")
    if low is not None and high is not None and low >= high:
        raise ParameterError(f"parameter 'theory_ratio_min'{where} must be below theory_ratio_max "
                             f"({high!r}); got {low!r}")
    for counts in SEED_COUNTS:
        if values.get("seed") is not None and all(values.get(c) is not None for c in counts):
            if values["seed"] + sum(values[c] for c in counts) - 1 > MAX_SEED:
                raise ParameterError(
                    f"parameter 'seed'{where} must be at most {MAX_SEED + 1} minus "
                    f"{' + '.join(f'{c} ({values[c]})' for c in counts)}, so that every seed the "
                    f"runs use is below 2**32; got {values['seed']!r}")
    for name, whole in SUBSETS.items():
        stray = [v for v in values.get(name) or () if v not in (values.get(whole) or ())]
        if stray and values.get(whole) is not None:
            raise ParameterError(f"parameter {name!r}{where} must name only values of {whole} "
                                 f"({', '.join(values[whole])}); got {values[name]!r}")
    for name, (other, why) in NEEDS.items():
        if values.get(name) and other in values and values[other] in (None, []):
            unset = "null, the whole split" if values[other] is None else "empty"
            raise ParameterError(f"parameter {name!r}{where} needs {other} set ({why}; it is "
                                 f"{unset}); got {values[name]!r}: set {other} or {name}=[]")
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
    _check_bank_members(values, where)
    _check_corrupted_samples(values, where)
    _check_curve(values, where)
    _check_attacks(values, where)
    if values.get("report_profile"):
        _check_report_profile(values["report_profile"], values, where)


def _pool_sizes(values: dict, name: str, dataset_param: str) -> list[int]:
    """The sizes the parameter ``name`` gives (a list's each; None: the train split of each data
    set the parameter ``dataset_param`` names, where known)."""
    value = values.get(name)
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    if value is not None:
        return [int(value)]
    names = values.get(dataset_param)
    names = names if isinstance(names, (list, tuple)) else [names]
    return [SPLIT_SIZES[n][0] for n in names if n in SPLIT_SIZES]


def _check_corrupted_samples(values: dict, where: str) -> None:
    """Each corruption rate of :data:`CORRUPTIONS` above 0 corrupts at least one sample of each
    training set it applies to (and leaves one clean where the notebook compares the two)."""
    for rate_name, sizes, dataset, kind, clean in CORRUPTIONS:
        what = "labels" if values.get(kind, kind) == "flip" else "OOD samples"
        for size_name in sizes:
            for n in _pool_sizes(values, size_name, dataset):
                for rate in _pool_rates(values.get(rate_name)):
                    count = round(rate * n)
                    if (rate and count < 1) or (clean and count >= n):
                        raise ParameterError(_corruption_message(
                            rate_name, rate, size_name, n, what, clean, values, dataset, where))


def _corruption_message(rate_name: str, rate: float, size_name: str, n: int, what: str,
                        clean: bool, values: dict, dataset: str, where: str) -> str:
    """The line refusing ``rate`` of ``n`` samples: the count it rounds to, and the rates (and
    the fewest samples, within the data sets' splits) that corrupt one."""
    verb = "flips" if what == "labels" else "inserts"
    size = size_name if values.get(size_name) is not None else f"{size_name} null: a whole split"
    valid = "0 (clean data) or " if SPEC[rate_name].min == 0 else ""
    valid += f"a rate above {0.5 / n:.3g}" + (f" and below {(n - 0.5) / n:.3g}" if clean else "")
    splits = _pool_sizes({**values, size_name: None}, size_name, dataset)
    limit = min(splits or [SPEC[size_name].max])
    start = max(2, int(min(0.5 / rate, 1e9)))
    fewest = next((m for m in range(start, int(min(limit, start + 1000)) + 1)
                   if 1 <= round(rate * m) < (m if clean else m + 1)), None)
    if fewest is not None and fewest > n:
        valid += f", or {size_name} of at least {fewest}"
    need = ("the notebook needs one flipped and one clean sample" if clean else
            f"a rate above 0 must {verb[:-1]} at least one (else its setting is the clean one)")
    return (f"parameter {rate_name!r}{where}: {rate!r} of the {n} training samples ({size}) "
            f"{verb} round({rate * n:g}) = {round(rate * n)} {what}; {need}; valid: {valid}")


def _check_bank_members(values: dict, where: str) -> None:
    """Each model of a bank trains on its random half of the pool (the keep matrix of
    :func:`bnmem_utils.core.checks.keep_matrix`, seeded by ``seed``) and needs at least two
    samples: checked for pools under 64 samples (above, fewer than two has odds below 1e-16)."""
    for models, sizes, dataset, rates, outlier in BANKS:
        n_models = values.get(models)
        if not n_models or values.get("seed") is None:
            continue
        kind = values.get(outlier, outlier)
        rate_values = [r for name in rates for r in _pool_rates(values.get(name))]
        for size_name in sizes:
            for n in _pool_sizes(values, size_name, dataset):
                pools = {n + (round(r * n) if kind == "ood" else 0) for r in rate_values or [0]}
                for pool in sorted(p for p in pools if p < 64):
                    _check_keep(size_name, n, pool, int(n_models), int(values["seed"]), where)


def _pool_rates(value) -> list:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def _check_keep(name: str, size: int, pool: int, n_models: int, seed: int, where: str) -> None:
    counts = keep_matrix(n_models, pool, seed).sum(axis=1)
    if counts.min() < 2:
        raise ParameterError(
            f"parameter {name!r}{where}: a pool of {pool} samples ({size} and the outliers) leaves "
            f"model {int(counts.argmin())} of the {n_models}-model bank {int(counts.min())} "
            "training sample(s); each model needs at least 2: use a larger pool")


def _check_curve(values: dict, where: str) -> None:
    """Notebook 04's shadow-count curve drops the shadow counts above its bank
    (:func:`bnmem_utils.privacy.shadow_curve.curve_sizes`): one must be left."""
    models, shadows = values.get("lira_curve_models"), values.get("lira_curve_shadows")
    if models and shadows and min(shadows) > models:
        raise ParameterError(
            f"parameter 'lira_curve_shadows'{where}: every shadow count of {shadows!r} is above "
            f"the curve's bank of lira_curve_models ({models}), so the curve would have no "
            f"point; valid: a count of at most {models}, lira_curve_models of at least "
            f"{min(shadows)}, or lira_curve_models 0 (no curve)")


#: The attacks chosen for the headline numbers and the banks they attack, leave-one-out.
ATTACK_BANKS = (("lira_attack", "lira_n_models"), ("cf_attack", "cf_n_models"),
                ("mit_attack", "mit_bank_models"))
#: The attacks that fit each sample its own variance, from k = N/2 - 1 shadows a side of a bank
#: of N attacked leave-one-out, and the pooled attack each fits instead below 2 a side
#: (bnmem_utils.privacy.attacks: a variance of one score is none).
PER_SAMPLE_VARIANCE = {"lira_online": "lira_online_fixed", "lira_offline": "lira_offline_fixed"}


def _check_attacks(values: dict, where: str) -> None:
    """An attack chosen by name runs as named: one that fits each sample its own variance
    (:data:`PER_SAMPLE_VARIANCE`) needs 2 shadows a side, banks of at least 6 models (a bank
    of 4 leaves 1, and the attack would report the pooled attack's numbers under its name)."""
    for attack, models in ATTACK_BANKS:
        name, n = values.get(attack), values.get(models)
        if name not in PER_SAMPLE_VARIANCE or not n or n // 2 - 1 >= 2:
            continue
        raise ParameterError(
            f"parameter {attack!r}{where}: {name} fits each sample its own variance from "
            f"k = N/2 - 1 shadows a side and needs k >= 2, but {models} {n} leaves k = "
            f"{n // 2 - 1}, where it would fit the pooled variance ({PER_SAMPLE_VARIANCE[name]}'s "
            f"numbers under its name); valid: {models} of at least 6, or {attack} auto, "
            f"{PER_SAMPLE_VARIANCE[name]} or another attack")


def dry_bank_sizes(values: dict, shrunk: dict) -> dict:
    """``shrunk`` (a dry run's values) with each bank whose attack, chosen by name in
    ``values``, fits each sample its own variance kept at 6 models: the dry run's 4 would leave
    it 1 shadow a side, and :func:`_check_attacks` would refuse the run."""
    for attack, models in ATTACK_BANKS:
        if values.get(attack) in PER_SAMPLE_VARIANCE and shrunk.get(models):
            shrunk[models] = max(shrunk[models], 6)
    return shrunk


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
