"""Run the numbered notebooks headless through papermill, with validated parameter profiles.

A *profile* is a flat YAML file (``bnmem_utils/profiles/{smoke,quick,paper}.yaml`` or a user's own
file) mapping parameter names to values; it applies to every notebook that declares the key.
Papermill only warns about a parameter a notebook does not declare, so this module validates
every key and value first and hands each notebook only the keys it declares::

    summary = reproduce("smoke", only=["01"], overrides={"seed": 1}, out_dir="/tmp/bnmem")
    print(summary_table(summary))

Executed notebooks go to ``runs/<profile>/NN_name.ipynb``, figures to ``figures/<profile>/``
through the notebooks' own ``save_figure``, and a run summary to ``runs/<profile>/summary.json``.
A notebook that fails does not stop the others.

Outputs are replaced only on success, all together. Each run has a run id; a notebook under the
runner writes its executed copy and figures (with their manifest entries) to the run's staging
folder and its results to ``results/NN_name.pending.json``; when it succeeded, the runner puts
them all in place in one promotion (:mod:`bnmem_utils.outputs`), with the merged figure
manifest and the summary, so that after an interrupt or a full disk every output is from one
run. A failed notebook leaves the previous good ones in place and its own copies beside them, as
``NN_name.failed.ipynb`` (with the traceback; only when it is valid JSON) and
``results/NN_name.failed.json``; an interrupted one leaves nothing of its own. The summary names,
for each notebook, the run its results come from ("kept from an earlier run" when this run
failed it); a run that put nothing in place writes its summary as ``summary.failed.json``, and
``summary.json`` stays the one of the run whose outputs are in place. An output that cannot be
written ends the run with :class:`~bnmem_utils.outputs.OutputError` (one line naming the path).

One run at a time per output folder: a second ``reproduce`` on the same ``--out`` (or on the
project root) stops at once with exit code 2, naming the run that holds the folder's lock
(``runs/.bnmem.lock``, released when that run ends, also when it is killed).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import difflib
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from unittest import mock

import yaml

from . import outputs, params, paths
from .cache import atomic_write_text, promote
from .params import UsageError
from .paths import figures_dir, output_root, project_root, runs_dir
from .results import format_result, load_results, results_path

PROFILE_NAMES = ("smoke", "quick", "fmnist", "paper")
DEFAULT_PROFILE = "quick"
#: Parameters every notebook declares; the runner itself sets the first three.
COMMON_PARAMETERS = ("profile", "device", "out_dir", "seed")
RUNNER_PARAMETERS = ("profile", "device", "out_dir")
#: ``NN_name`` or ``NNx_name``: a letter after the number runs a notebook between NN and NN+1
#: (``04b_confound`` after ``04_lira``), selected by ``04b`` or its name, not by ``04``.
NOTEBOOK_PATTERN = re.compile(r"^(\d\d[a-z]?)_([A-Za-z0-9_]+)$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PARTIAL_SUFFIX = ".partial.ipynb"
_KERNEL_STDERR_SUFFIX = ".kernel-stderr"
FAILED_SUFFIX = ".failed.ipynb"
LOCK_NAME = ".bnmem.lock"


# --------------------------------------------------------------------------------------------
# Notebooks and profiles
# --------------------------------------------------------------------------------------------


def available_profiles(profiles_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """Named profiles, ``{name: path}`` sorted by name: the ``*.yaml`` files of
    ``profiles_dir``, else of ``$BNMEM_PROFILES``, else of ``bnmem_utils/profiles``."""
    if not profiles_dir:
        env = os.environ.get("BNMEM_PROFILES")
        profiles_dir = Path(env).resolve() if env else Path(__file__).resolve().parent / "profiles"
    return {p.stem: p for p in sorted(Path(profiles_dir).glob("*.yaml"))}


def load_profile(profile: str | os.PathLike = DEFAULT_PROFILE,
                 profiles_dir: str | os.PathLike | None = None) -> tuple[str, dict]:
    """Read a profile by name or path; return ``(name, values)``.

    The name is the file's stem; it names the output folders ``runs/<name>`` and
    ``figures/<name>`` and is passed to the notebooks as ``profile`` (a ``profile`` key in the
    file must agree). An unknown name raises :class:`UsageError` listing the named profiles.
    """
    named = available_profiles(profiles_dir)
    text = str(profile)
    if text in named:
        path = named[text]
    elif (text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text) and Path(text).is_file():
        path = Path(text)
    else:
        raise UsageError(f"unknown profile {text!r}; valid choices: {', '.join(named) or '(none)'}"
                         " (or the path of a YAML file of parameter values)")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise UsageError(f"profile file {path} is not a text file (byte {exc.start} is not "
                         "UTF-8); a profile is a YAML file of parameter values") from None
    except OSError as exc:
        raise UsageError(f"profile file {path} cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"profile file {path} is not valid YAML: "
                         f"{' '.join(str(exc).split())}") from exc
    if not isinstance(values, dict):
        raise UsageError(f"profile file {path} must map parameter names to values, "
                         f"found a {type(values).__name__}")
    for key in values:
        if not isinstance(key, str) or not key.isidentifier():
            raise UsageError(f"profile file {path}: {key!r} is not a valid parameter name")
    name = path.stem
    if not _SAFE_NAME.match(name):
        raise UsageError(f"profile file {path}: its name {name!r} must be a plain folder name "
                         "(letters, digits, '_', '-', '.')")
    if values.setdefault("profile", name) != name:
        raise UsageError(f"profile file {path} sets profile: {values['profile']!r}, but its results "
                         f"would then mix with that profile's under runs/{values['profile']}; "
                         f"set profile: {name} (the file's name) or remove the key")
    if not set(values) - {"profile"}:
        raise UsageError(f"profile file {path} sets no parameter; an empty profile would silently "
                         "run the notebooks' defaults (use --profile quick for those)")
    return name, values


def discover_notebooks(notebooks_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """The numbered notebooks ``NN_name.ipynb`` of the project, ``{stem: path}`` in order."""
    folder = Path(notebooks_dir) if notebooks_dir else paths.notebooks_dir()
    found = {p.stem: p for p in folder.glob("*.ipynb") if NOTEBOOK_PATTERN.match(p.stem)}
    return dict(sorted(found.items()))


def select_notebooks(only: str | Iterable[str] | None = None) -> dict[str, Path]:
    """The notebooks picked by ``only`` (all when None), in run order.

    Each item of ``only`` (or comma-separated part of a string) may be the number (``01`` or
    ``1``; ``04b`` for ``04b_confound``), the full stem (``01_theory``) or the name after the
    number (``theory``). An ``only`` that names no notebook at all (``--only ''``) is an error,
    not a way to select all.
    """
    found = discover_notebooks()
    if only is None:
        return found
    items = [only] if isinstance(only, str) else list(only)
    tokens = [t.strip() for item in items for t in str(item).split(",") if t.strip()]
    if not tokens:
        raise UsageError(f"--only {','.join(map(str, items))!r} names no notebook; valid choices: "
                         f"{', '.join(found) or '(none)'} (leave --only out to run them all)")
    chosen: set[str] = set()
    for token in tokens:
        token = token.removesuffix(".ipynb")
        matches = [stem for stem in found
                   if token == stem or token in stem.split("_", 1)
                   or (token.isdigit() and stem[:2].isdigit() and stem[2] == "_"
                       and int(token) == int(stem[:2]))]
        if not matches:
            valid = ", ".join(found) or "(no NN_name.ipynb notebooks in notebooks/)"
            raise UsageError(f"unknown notebook {token!r}; valid choices: {valid}")
        chosen.update(matches)
    return {stem: path for stem, path in found.items() if stem in chosen}


def notebook_parameter_table(notebooks: Mapping[str, Path]) -> dict[str, dict[str, object]]:
    """``{notebook: {parameter: default}}`` read from each notebook's ``parameters`` cell."""
    table = {}
    for stem, path in notebooks.items():
        try:
            table[stem] = params.notebook_parameters(path)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path} is not a valid notebook (JSON): {exc}") from exc
        except SyntaxError as exc:
            raise UsageError(f"{path}: the parameters cell is not valid Python: {exc}") from exc
        except ValueError as exc:  # no parameters cell, or a non-literal value; names the path
            raise UsageError(str(exc)) from exc
    return table


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def parse_overrides(items: Iterable[str] | Mapping[str, object] | None) -> dict[str, object]:
    """``["key=value", ...]`` to a dict, each value read as YAML (``3`` int, ``0.1`` float,
    ``true`` bool, ``[1, 2]`` list, ``null`` None, anything else a string)."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return dict(items)
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"--set expects key=value with a parameter name as key, got {item!r}")
        try:
            out[key] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise UsageError(f"--set {item!r}: the value is not valid YAML ({exc})") from exc
    return out


def _type_name(value) -> str:
    return "None" if value is None else type(value).__name__


def check_value(key: str, value, default, *, notebook: str = "", source: str = ""):
    """``value`` made compatible with the type of ``default``, or :class:`UsageError`.

    Rules: a None default accepts anything; a None value only a None default; bool only for
    bool; an int for a float default (made float); a whole float for an int default (made int);
    str for str; a list for a list or tuple default; a dict for a dict default. This is the
    fallback for a parameter without a declared constraint (:data:`bnmem_utils.params.SPEC`).
    """
    if default is None:
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    convert = None
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok, convert = number and (isinstance(value, int) or value.is_integer()), int
    elif isinstance(default, float):
        ok, convert = number, float
    elif isinstance(default, (list, tuple)):
        ok, convert = isinstance(value, (list, tuple)), list
    elif isinstance(default, (str, dict)):
        ok = isinstance(value, type(default))
    else:
        ok = True
    if not ok:
        where = f" of {notebook}" if notebook else ""
        src = f" (from {source})" if source else ""
        raise UsageError(f"parameter {key!r}{where} expects {_type_name(default)} "
                         f"(default {default!r}), got {value!r} ({_type_name(value)}){src}")
    return convert(value) if convert else value


def _unknown_key_message(key: str, source: str, declared: Mapping[str, Iterable[str]]) -> str:
    valid = sorted({k for keys in declared.values() for k in keys})
    hint = difflib.get_close_matches(key, valid, n=1)
    text = f"unknown parameter {key!r} (from {source})"
    if hint:
        text += f"; did you mean {hint[0]!r}?"
    return text + f"; valid parameters: {', '.join(valid) or '(none)'}"


def validate_values(values: Mapping[str, object], table: Mapping[str, Mapping[str, object]], *,
                    source: str, all_table: Mapping[str, Mapping[str, object]] | None = None) -> dict:
    """Check every key of ``values`` against the notebooks of ``table``; return cleaned values.

    A key no notebook of ``table`` declares is an error that lists the valid keys (and, when
    ``all_table`` is given, names the unselected notebook that would take it). Each value is
    checked against its declared constraint (:data:`bnmem_utils.params.SPEC`: type, range,
    allowed values, null, empty lists), or, for a parameter without one, with
    :func:`check_value` against every declaring notebook's default.
    """
    cleaned = {}
    for key, value in values.items():
        declaring = [nb for nb, declared in table.items() if key in declared]
        if not declaring:
            others = [nb for nb, declared in (all_table or {}).items() if key in declared]
            if others:
                raise UsageError(f"parameter {key!r} (from {source}) is declared only by "
                                 f"{', '.join(others)}, which is not selected; selected: "
                                 f"{', '.join(table)}")
            raise UsageError(_unknown_key_message(key, source, table))
        if key in params.SPEC:
            value = params.check_parameter(key, value, where=f" (from {source})")
        else:
            for nb in declaring:
                value = check_value(key, value, table[nb][key], notebook=nb, source=source)
        cleaned[key] = value
    return cleaned


# --------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------


@dataclass
class NotebookJob:
    """One notebook to execute: its name, source path and the parameters it will receive."""

    notebook: str
    path: Path
    parameters: dict


@dataclass
class RunPlan:
    """Everything :func:`reproduce` will do, validated before any notebook starts."""

    profile: str
    profile_values: dict
    overrides: dict
    device: str
    out_dir: str                      # "" = the project root
    jobs: list[NotebookJob]
    dry_run: dict = field(default_factory=dict)  # the shrunk values of a dry run ({}: a real run)

    @property
    def runs_dir(self) -> Path:
        return runs_dir(self.profile, self.out_dir or None)

    def output_path(self, notebook: str) -> Path:
        """Where the executed copy of ``notebook`` is saved."""
        return self.runs_dir / f"{notebook}.ipynb"


def plan_run(profile: str | os.PathLike = DEFAULT_PROFILE, *, only=None, overrides=None,
             device: str | None = None, out_dir: str | os.PathLike | None = None,
             dry_run: bool = False) -> RunPlan:
    """Validate a run and work out each notebook's parameters; raise :class:`UsageError` on bad input.

    Profile keys are checked against all notebooks (a profile serves every notebook);
    ``overrides`` (``--set``) against the selected ones. Precedence, lowest first: notebook
    default, profile, dry-run shrink (:func:`dry_run_values`, when ``dry_run``), override,
    ``device``/``out_dir`` arguments. A dry run writes under ``runs/dry-run/`` unless ``out_dir``
    is given, so its meaningless numbers never replace a real run's.
    """
    from .device import resolve_device

    name, values = load_profile(profile)
    all_notebooks = discover_notebooks()
    if not all_notebooks:
        raise UsageError(f"no notebooks named NN_name.ipynb in {paths.notebooks_dir()}")
    selected = select_notebooks(only)
    all_table = notebook_parameter_table(all_notebooks)
    table = {nb: all_table[nb] for nb in selected}
    for nb, declared in table.items():
        missing = [p for p in RUNNER_PARAMETERS if p not in declared]
        if missing:
            raise UsageError(f"notebook {nb} does not declare {', '.join(missing)} in its "
                             f"parameters cell; every notebook must declare {', '.join(COMMON_PARAMETERS)}")
    profile_values = validate_values(values, all_table, source=f"profile {name}")
    override_values = parse_overrides(overrides)
    if "profile" in override_values:
        raise UsageError("set the profile with --profile, not --set profile=...")
    if "out_dir" in override_values or values.get("out_dir"):
        raise UsageError("set the output folder with --out DIR, not as the parameter out_dir")
    override_values = validate_values(override_values, table, source="--set", all_table=all_table)
    shrunk = {}
    if dry_run:
        shrunk = validate_values(dry_run_values(profile_values, all_table), all_table,
                                 source="--dry-run")
        if not out_dir:
            out_dir = project_root() / "runs" / "dry-run"

    merged = {**profile_values, **shrunk, **override_values}
    dev = str(device or merged.get("device") or "auto")
    try:
        resolve_device(dev)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from exc
    out = str(Path(out_dir).expanduser().resolve()) if out_dir else ""
    merged.update(profile=name, device=dev, out_dir=out)
    jobs = [NotebookJob(nb, path, {k: v for k, v in merged.items() if k in table[nb]})
            for nb, path in selected.items()]
    for job in jobs:
        params.check_relations({**table[job.notebook], **job.parameters}, where=f" of {job.notebook}")
    check_datasets(jobs, table)
    return RunPlan(name, profile_values, override_values, dev, out, jobs, shrunk)


#: What a dry run sets, by parameter-name suffix: one epoch and one seed, a few dozen samples,
#: the smallest bank LiRA accepts. Data sets, architectures, norms and attacks are kept.
DRY_RUN_SIZES: dict[str, object] = {
    "_epochs": 1, "_seeds": 1, "_n_models": 4, "_bank_models": 4, "_train_size": 32,
    "_test_size": 16, "_population_size": 8, "_max_clean": 4, "_max_noisy": 4,
    "_check_samples": 8,
}
#: Exact values of a dry run for the theory notebook's grids (closed-form toy models; the gamma
#: loop keeps its seeds and steps: the notebook checks its own numbers, and they are cheap).
DRY_RUN_THEORY: dict[str, object] = {
    "theory_ratio_points": 6, "theory_sigmas": [1.0], "theory_etas": [1e-6, 1e-4, 1e-2],
    "theory_conv_batch_sizes": [4, 64, 256], "theory_conv_distances": [2.0, 16.0],
}


def dry_run_values(values: Mapping[str, object],
                   table: Mapping[str, Mapping[str, object]]) -> dict[str, object]:
    """The parameters that shrink a run of ``values`` (a profile over the notebooks' defaults
    in ``table``) to a dry run: minutes on a CPU, every code path of the profile kept.

    Sizes follow :data:`DRY_RUN_SIZES` (a size the profile already has smaller, or 0 to skip a
    part, is kept); rate lists keep their largest rate (and the clean setting, where listed),
    so that corrupted samples exist among a few dozen; epoch lists shrink to the one epoch (the
    gap-matched LiRA curve to 2 epochs, a second point beside the banks' one, on the largest
    kept rate when the profile's gap arm is one of its banks, so that its bank at the banks'
    epochs is read back from the cache as in the full run; the confound study's ladder to 1 and 2
    epochs, its pool-size knob to one pool of half the dry run's); the penalty sweep keeps lambda 0
    and its largest lambda. Everything else (data sets, architectures, norms, attacks,
    optimizers) is the profile's.
    """
    current = {k: v for declared in table.values() for k, v in declared.items()}
    current.update(values)
    out: dict[str, object] = {k: v for k, v in DRY_RUN_THEORY.items() if k in current}
    for key, value in current.items():
        if key.startswith("theory_"):
            continue
        for suffix, size in DRY_RUN_SIZES.items():
            if key.endswith(suffix):
                keep = isinstance(value, int) and not isinstance(value, bool) and value <= size
                out[key] = value if keep else size
        if isinstance(value, list) and value and key.endswith(("_rates", "_lams")):
            rates = [float(r) for r in value]
            out[key] = sorted({max(rates)} | ({0.0} & set(rates)))
    for key, value in (("mem_fixed_epochs", [1]), ("gn_measure_epochs", [0, 1])):
        if key in current:
            out[key] = value
    if "lira_gap_epochs" in current:  # the gap-matched curve keeps a second point (2 epochs
        out["lira_gap_epochs"] = [2] if current["lira_gap_epochs"] else []  # beside the 1)
    if "cf_epochs" in current:  # the confound study's ladder keeps two rungs
        out["cf_epochs"] = [1, 2]
    if current.get("cf_train_sizes"):  # and its pool-size knob one smaller pool
        out["cf_train_sizes"] = [DRY_RUN_SIZES["_train_size"] // 2]
    rates = [float(r) for r in current.get("lira_outlier_rates") or []]
    if current.get("lira_gap_outlier_rate") in rates:
        out["lira_gap_outlier_rate"] = max(out["lira_outlier_rates"])
    return out


def check_datasets(jobs: Sequence[NotebookJob], table: Mapping[str, Mapping[str, object]]) -> None:
    """:class:`UsageError` when a job needs a data set that is not on disk and that no job of
    the run downloads (its download parameter, e.g. ``mem_download``, is false).

    Each job's values are its parameters over its notebook's defaults; the check is cheap
    (:func:`bnmem_utils.data.dataset_available` reads no file) and searches where the kernel's
    loader will (``$BNMEM_DATA``, ``data/``, a system package's folder).
    """
    from .data import INSTALL_HINTS, SYSTEM_FOLDERS, dataset_available, search_roots

    offline: dict[str, list[str]] = {}
    downloaded: set[str] = set()
    for job in jobs:
        needs = params.dataset_needs({**table[job.notebook], **job.parameters})
        downloaded |= needs["download"]
        for name in needs["offline"]:
            offline.setdefault(name, []).append(job.notebook)
    for name, notebooks in offline.items():
        if name not in downloaded and not dataset_available(name):
            searched = [str(p) for p in (*search_roots(), *SYSTEM_FOLDERS.get(name, ()))]
            system = (f"install it (`{INSTALL_HINTS[name].split('   ')[0]}`), or "
                      if name in INSTALL_HINTS else "")
            raise UsageError(
                f"data set {name!r} (for {', '.join(notebooks)}) was not found offline (searched "
                f"{', '.join(searched)}) and nothing in this run downloads it; {system}copy "
                "torchvision's folder there (or set $BNMEM_DATA), or let the notebook fetch it "
                "(e.g. --set mem_download=true)")


# --------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------


@dataclass
class NotebookResult:
    """The outcome of one notebook: status ``ok``, ``failed`` or ``interrupted``."""

    notebook: str
    status: str
    wall_s: float
    output: str                       # executed copy ("" when none was saved); a failed
    #                                   notebook's is NN_name.failed.ipynb
    error: str = ""                   # exception name and message
    cell: str = ""                    # the failing cell: number, In [n] and its first line
    results: dict = field(default_factory=dict)   # key numbers, formatted, from this run
    results_from: str = ""            # run id of the results now in results/NN_name.json ("" none)
    kept: bool = False                # True: this run failed, the results are an earlier run's

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class RunSummary:
    """All notebooks' outcomes of one :func:`reproduce` call."""

    plan: RunPlan
    results: list[NotebookResult]
    started: str
    finished: str = ""
    interrupted: bool = False
    run_id: str = ""
    commit: str = ""
    summary_file: str = ""            # where write_summary put it (summary.json or .failed.json)

    @property
    def failed(self) -> list[NotebookResult]:
        return [r for r in self.results if not r.ok]

    @property
    def exit_code(self) -> int:
        """0 when every notebook ran, 130 when interrupted, 1 when any failed."""
        return 130 if self.interrupted else 1 if self.failed else 0

    def as_dict(self) -> dict:
        return {
            "profile": self.plan.profile,
            "device": self.plan.device,
            "out_dir": self.plan.out_dir,
            "overrides": self.plan.overrides,
            "run_id": self.run_id,
            "commit": self.commit,
            "dry_run": self.plan.dry_run,
            "started": self.started,
            "finished": self.finished,
            "interrupted": self.interrupted,
            "notebooks": [asdict(r) for r in self.results],
            "results_in_effect": results_provenance(
                self.plan.profile, self.plan.out_dir or None, run_id=self.run_id,
                failed={r.notebook for r in self.failed}),
        }


class _TqdmHandler(logging.Handler):
    """Prints through ``tqdm.write``, so the progress bar stays intact, only the notebook's own
    output and papermill's 'Executing Cell N' markers.

    Dropped: the paths papermill prints (the output path is the temporary one), the kernel
    name, 'Ending Cell' markers, and papermill's parameter warnings, which the runner's own
    validation supersedes (papermill's parser also trips on comments holding '=').
    """

    DROP = ("Ending Cell", "Input Notebook", "Output Notebook", "Working directory",
            "Executing notebook with kernel", "Passed unknown parameter", "Unable to parse line")

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm.auto import tqdm

        msg = self.format(record).rstrip("\n")
        if msg and not str(record.getMessage()).startswith(self.DROP):
            tqdm.write(msg, file=sys.stderr)


@contextlib.contextmanager
def _notebook_log(enabled: bool) -> Iterator[None]:
    """Route papermill's log (the notebook's own output) to stderr for the duration of a run."""
    logger = logging.getLogger("papermill")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    logger.handlers = [_TqdmHandler() if enabled else logging.NullHandler()]
    logger.setLevel(logging.INFO if enabled else logging.ERROR)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def check_kernel(kernel_name: str = "python3") -> str:
    """Raise :class:`UsageError` for an unknown kernel; return a warning (else ``""``) when the
    kernel would not run this interpreter, in which case the notebooks may not see bnmem_utils.

    Jupyter looks in the user's folder (``~/.local/share/jupyter``) before this environment's,
    so a ``python3`` kernel registered by another environment can shadow this one.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        spec = manager.get_kernel_spec(kernel_name)
    except NoSuchKernel as exc:
        valid = ", ".join(sorted(manager.find_kernel_specs())) or "(none)"
        raise UsageError(f"unknown Jupyter kernel {kernel_name!r}; valid choices: {valid}") from exc
    exe = spec.argv[0] if spec.argv else ""
    here = Path(sys.executable)
    # jupyter_client substitutes sys.executable for the plain names
    if (exe in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")
            or Path(exe).resolve() == here.resolve()
            or Path(exe).parent.resolve() == here.parent.resolve()):
        return ""
    return (f"warning: Jupyter kernel {kernel_name!r} runs {exe}, not this interpreter "
            f"({sys.executable}); if notebooks fail to import bnmem_utils, run "
            f"`{sys.executable} -m ipykernel install --user --name bnmem` and pass --kernel bnmem")


def _kernel_config() -> dict:
    """Engine options: encrypt the local kernel connection (CurveZMQ) where pyzmq supports it,
    which also silences ipykernel's 'running over TCP without encryption' warning."""
    try:
        import zmq
        from traitlets.config import Config

        if zmq.has("curve"):
            return {"config": Config({"KernelManager": {"transport_encryption": "auto"}})}
    except ImportError:
        pass
    return {}


def _kernel_manager_class(stderr_path: Path):
    """A kernel manager whose kernel process writes its own stderr (ipykernel's log, C-level
    warnings; not the cells' output, which comes through the kernel's messages) to
    ``stderr_path``. The runner replays that file after the notebook and drops it when the run is
    interrupted: on Ctrl-C the kernel is shut down in the middle of a cell and logs a ZMQError
    traceback (a reply sent on a closed socket) that is only noise."""
    from jupyter_client import AsyncKernelManager

    class _KernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            with open(stderr_path, "ab") as fh:
                kw["stderr"] = fh
                return await super()._async_launch_kernel(kernel_cmd, **kw)

    return _KernelManager


def _replay_kernel_stderr(path: Path, enabled: bool) -> None:
    """Print what the kernel process wrote to its stderr (when ``enabled``), then remove it."""
    try:
        text = path.read_text(errors="replace") if enabled else ""
    except OSError:
        text = ""
    path.unlink(missing_ok=True)
    if text.strip():
        logging.getLogger("papermill").warning(text.rstrip("\n"))


def _failing_cell(source_path: Path, exc) -> str:
    """'cell 7 (In [5]): first line' for a PapermillExecutionError, numbered as in the source."""
    source = exc.source if isinstance(exc.source, str) else "".join(exc.source or [])
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    cells = read_json(source_path).get("cells", [])
    number = next((i + 1 for i, cell in enumerate(cells) if params.cell_source(cell) == source), None)
    where = f"cell {number}" if number else f"executed cell {exc.cell_index + 1}"
    return f"{where} (In [{exc.exec_count}]): {first[:80]}"


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _fresh_results(path: Path, run_id: str) -> dict:
    """Formatted key numbers of the results file ``path`` if this run (``run_id``) wrote it."""
    payload = read_json(path)
    if payload.get("meta", {}).get("run_id") != run_id:
        return {}
    return {key: format_result(entry) for key, entry in payload.get("results", {}).items()}


def _results_run_id(path: Path) -> str:
    payload = read_json(path)
    return str(payload.get("meta", {}).get("run_id") or "unknown") if payload else ""


def new_run_id() -> str:
    """A unique run id: the start time (UTC, to the second) and a random suffix."""
    import secrets

    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + f"-{secrets.token_hex(3)}"


def results_provenance(profile: str, out_dir=None, *, run_id: str = "",
                       failed: Iterable[str] = ()) -> dict[str, dict]:
    """For each results file of ``profile``: the run id, commit and times of the run that wrote
    it, and where it comes from: ``this run`` (``run_id``), ``kept from an earlier run`` (this
    run failed or interrupted that notebook: ``failed``) or ``an earlier run`` (not run now)."""
    failed = set(failed)
    try:
        loaded = load_results(profile, out_dir)
    except ValueError:
        return {}
    out = {}
    for nb, payload in loaded.items():
        meta = payload.get("meta", {})
        rid = str(meta.get("run_id") or "")
        out[nb] = {"run_id": rid, "commit": meta.get("commit", ""),
                   "started": meta.get("started", ""), "finished": meta.get("finished", ""),
                   "from": ("this run" if run_id and rid == run_id
                            else "kept from an earlier run" if nb in failed
                            else "an earlier run" if run_id else (rid or "interactive"))}
    return out


def execute_job(plan: RunPlan, job: NotebookJob, *, kernel_name: str = "python3",
                log_output: bool = True,
                execution_timeout: float | None = None, run_id: str = "",
                commit: str = "", summary: RunSummary | None = None) -> NotebookResult:
    """Execute one notebook through papermill; replace its outputs only if it succeeded.

    The notebook sees ``run_id`` as ``$BNMEM_RUN_ID`` and its staging folder as
    ``$BNMEM_STAGING``. On success its executed copy, results, figures and manifest entries (and
    ``summary.json``, when ``summary`` is the run's summary so far) are promoted together
    (:class:`bnmem_utils.outputs.Promotion`; :class:`~bnmem_utils.outputs.OutputError` when one
    cannot be written, nothing then replaced); a failure keeps its copies as the module docstring
    says. ``KeyboardInterrupt`` deletes this run's staged files and propagates; one that arrives
    during the promotion is raised after it, carrying the result as ``exc.result``.
    """
    from .results import pending_results_path

    run_id = run_id or new_run_id()
    out = plan.output_path(job.notebook)
    pending_res = pending_results_path(plan.profile, job.notebook, plan.out_dir or None)
    pending_res.unlink(missing_ok=True)
    stage = outputs.staging_folder(plan.runs_dir, run_id, job.notebook)
    tmp, kernel_stderr = stage / out.name, stage / "kernel-stderr"
    t0 = time.perf_counter()
    if log_output:
        logging.getLogger("papermill").info(f"=== {job.notebook}: {job.path} -> {out}")
    # BNMEM_HEADLESS=1, the run's id, commit and staging folder, inherited by the kernel
    env = {"BNMEM_HEADLESS": "1", "BNMEM_RUN_ID": run_id, "BNMEM_STAGING": str(stage),
           **({"BNMEM_COMMIT": commit} if commit else {})}
    try:
        status, error, cell = _papermill(job, tmp, kernel_stderr, env, kernel_name=kernel_name,
                                         log_output=log_output, execution_timeout=execution_timeout)
    except KeyboardInterrupt:
        pending_res.unlink(missing_ok=True)
        _replay_kernel_stderr(kernel_stderr, enabled=False)
        outputs.discard_staging(plan.runs_dir, run_id)
        raise
    wall = round(time.perf_counter() - t0, 2)
    _replay_kernel_stderr(kernel_stderr, enabled=log_output)
    if status != "ok":
        return _keep_failure(plan, job, NotebookResult(job.notebook, status, wall, "", error, cell),
                             tmp, run_id)
    result = NotebookResult(job.notebook, status, wall, "", results=_fresh_results(pending_res, run_id),
                            results_from=run_id)
    try:
        with outputs.held_interrupt():
            _promote_success(plan, job, result, stage, summary)
    except KeyboardInterrupt as exc:
        exc.result = result  # type: ignore[attr-defined]
        raise
    finally:
        pending_res.unlink(missing_ok=True)
        outputs.discard_staging(plan.runs_dir, run_id)
    return result


def _papermill(job: NotebookJob, output: Path, kernel_stderr: Path, env: dict, *, kernel_name: str,
               log_output: bool, execution_timeout: float | None) -> tuple[str, str, str]:
    """Execute ``job`` into ``output`` with ``env`` set; ``(status, error, failing cell)``."""
    import papermill as pm

    try:
        with mock.patch.dict(os.environ, env):
            pm.execute_notebook(
                str(job.path), str(output), parameters=job.parameters, kernel_name=kernel_name,
                language="python", log_output=log_output, progress_bar=False, cwd=str(project_root()),
                execution_timeout=execution_timeout,
                kernel_manager_class=_kernel_manager_class(kernel_stderr), **_kernel_config(),
            )
    except pm.PapermillExecutionError as exc:
        return "failed", f"{exc.ename}: {exc.evalue}", _failing_cell(job.path, exc)
    except Exception as exc:  # dead kernel, timeout, unreadable notebook, full disk: keep going
        return "failed", f"{type(exc).__name__}: {exc}", ""
    return "ok", "", ""


def _promote_success(plan: RunPlan, job: NotebookJob, result: NotebookResult, stage: Path,
                     summary: RunSummary | None) -> None:
    """Put a successful notebook's outputs in place together (and ``result.output``): its
    executed copy, stamped results, figures and manifest, and the summary that lists it; the
    copies of an earlier failure go."""
    from .results import failed_results_path, pending_results_path

    where = (plan.profile, job.notebook, plan.out_dir or None)
    out, pending_res, final_res = (plan.output_path(job.notebook), pending_results_path(*where),
                                   results_path(*where))
    promotion = outputs.Promotion()
    payload = read_json(pending_res)
    if payload:
        payload.setdefault("meta", {})["finished"] = _now()
        promotion.write(final_res, json.dumps(payload, indent=1, default=str) + "\n")
    else:  # the notebook recorded nothing: its earlier results (if any) stay in effect
        result.results_from = _results_run_id(final_res)
    tmp = stage / out.name
    if tmp.exists() and tmp.stat().st_size > 0:
        promotion.move(tmp, out)
        result.output = str(out)
    outputs.promote_figures(promotion, stage / "figures", figures_dir(plan.profile, plan.out_dir or None),
                            job.notebook)
    promotion.remove(out.with_name(job.notebook + FAILED_SUFFIX), failed_results_path(*where))
    if summary is not None:
        so_far = replace(summary, results=[*summary.results, result])
        promotion.write(summary_path(summary), summary_text(so_far, promoted={job.notebook: payload}))
    promotion.commit()


def _keep_failure(plan: RunPlan, job: NotebookJob, result: NotebookResult, tmp: Path,
                  run_id: str) -> NotebookResult:
    """A failed notebook's own copies, beside the good ones: its executed copy (when it is valid
    JSON: a copy truncated by a full disk is dropped) and the results it recorded; an older
    failure's copies go either way. Its staged figures are dropped."""
    from .results import failed_results_path, pending_results_path

    where = (plan.profile, job.notebook, plan.out_dir or None)
    final_res, pending_res, failed_res = (results_path(*where), pending_results_path(*where),
                                          failed_results_path(*where))
    failed_out = plan.output_path(job.notebook).with_name(job.notebook + FAILED_SUFFIX)
    failed_out.unlink(missing_ok=True)
    failed_res.unlink(missing_ok=True)
    try:
        if tmp.exists() and tmp.stat().st_size > 0 and read_json(tmp):
            promote(tmp, failed_out)
            result.output = str(failed_out)
        if read_json(pending_res):
            promote(pending_res, failed_res)
    except OSError:
        pass  # the failure's own copies are a courtesy: the good outputs stay either way
    finally:
        pending_res.unlink(missing_ok=True)
        outputs.discard_staging(plan.runs_dir, run_id)
    result.results = _fresh_results(failed_res, run_id)
    result.results_from = _results_run_id(final_res)
    result.kept = final_res.exists()
    return result


def check_timeout(timeout: float | None) -> float | None:
    """A cell timeout must be a positive number of seconds (None: no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 < timeout < float("inf"):
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def check_output_folder(out_dir: str | os.PathLike | None) -> Path:
    """The output root (``--out`` or the project root), created if needed and checked writable
    by writing a probe file; :class:`UsageError` (one line) when it is a file or cannot be
    written, instead of a traceback later."""
    root = output_root(out_dir)
    label = f"--out {out_dir}" if out_dir else f"output folder {root}"
    for folder in (root, root / "runs"):
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{label}: {folder} is a file, not a folder")
    try:
        (root / "runs").mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root / "runs", prefix=".bnmem-probe."):
            pass
    except OSError as exc:
        raise UsageError(f"{label}: cannot write there ({exc.strerror or exc})") from None
    return root


@contextlib.contextmanager
def output_lock(root: Path, *, what: str = "") -> Iterator[None]:
    """Hold the lock of an output folder (``<root>/runs/.bnmem.lock``) for one run.

    A second run on the same folder does not wait: it raises :class:`UsageError` naming the
    holder (process id, host, start time and command, from ``.bnmem.lock.json``). The lock is
    an OS file lock, so a killed run releases it; its holder file is then stale and ignored.
    """
    import socket

    from filelock import FileLock, Timeout

    path = root / "runs" / LOCK_NAME
    info = path.with_name(LOCK_NAME + ".json")
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = read_json(info)
        who = (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
               f": {holder.get('command')}" if holder else "another process")
        raise UsageError(f"another bnmem run is writing to {root} ({who}); wait for it to end or "
                         "pass another --out") from None
    try:
        atomic_write_text(info, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                            "started": _now(), "command": what or " ".join(sys.argv)})
                          + "\n")
        yield
    finally:
        info.unlink(missing_ok=True)
        lock.release()


def reproduce(profile: str | os.PathLike = DEFAULT_PROFILE, *, only=None, overrides=None,
              device: str | None = None, out_dir: str | os.PathLike | None = None,
              log_output: bool = True, progress: bool = True, kernel_name: str = "python3",
              execution_timeout: float | None = None, dry_run: bool = False) -> RunSummary:
    """Validate, then execute the selected notebooks in order; write ``summary.json``.

    ``dry_run`` shrinks the profile (:func:`dry_run_values`) and writes under ``runs/dry-run/``.

    Every notebook runs even when an earlier one failed. On Ctrl-C the finished notebooks are
    kept, the current one's partial copy is removed, the summary is written and
    ``KeyboardInterrupt`` propagates (the caller prints :func:`summary_table` of
    ``exc.summary``).
    """
    from .device import git_commit

    execution_timeout = check_timeout(execution_timeout)
    plan = plan_run(profile, only=only, overrides=overrides, device=device, out_dir=out_dir,
                    dry_run=dry_run)
    warning = check_kernel(kernel_name)
    if warning:
        print(warning, file=sys.stderr)
    root = check_output_folder(plan.out_dir or None)
    with output_lock(root, what=f"bnmem reproduce --profile {plan.profile}"):
        return _reproduce_locked(plan, git_commit(), log_output=log_output, progress=progress,
                                 kernel_name=kernel_name, execution_timeout=execution_timeout)


def _reproduce_locked(plan: RunPlan, commit: str, *, log_output: bool, progress: bool,
                      kernel_name: str, execution_timeout: float | None) -> RunSummary:
    from tqdm.auto import tqdm

    summary = RunSummary(plan, [], _now(), run_id=new_run_id(), commit=commit)
    cleanup_partials(plan.runs_dir)
    # disable=None: a bar on a terminal, none in a log file (the "=== notebook" lines remain)
    bar = tqdm(plan.jobs, desc=f"bnmem {plan.profile}", unit="notebook",
               disable=None if progress else True, file=sys.stderr)
    current, job_start = None, time.perf_counter()
    try:
        with _notebook_log(log_output):
            for job in bar:
                current, job_start = job, time.perf_counter()
                bar.set_postfix_str(job.notebook)
                summary.results.append(execute_job(plan, job, kernel_name=kernel_name,
                                                   log_output=log_output,
                                                   execution_timeout=execution_timeout,
                                                   run_id=summary.run_id, commit=commit,
                                                   summary=summary))
                current = None
    except KeyboardInterrupt as exc:
        summary.interrupted = True
        if getattr(exc, "result", None) is not None:  # it came while its outputs were promoted
            summary.results.append(exc.result)  # type: ignore[attr-defined]
        elif current is not None:
            wall = round(time.perf_counter() - job_start, 2)
            final = results_path(plan.profile, current.notebook, plan.out_dir or None)
            summary.results.append(NotebookResult(
                current.notebook, "interrupted", wall, "", "KeyboardInterrupt",
                results_from=_results_run_id(final), kept=final.exists()))
        exc.summary = summary  # type: ignore[attr-defined]
        _finish(summary, bar, write=any(r.ok for r in summary.results), strict=False)
        raise
    except outputs.OutputError:
        _finish(summary, bar, write=False, strict=False)  # the promotions wrote summary.json
        raise
    _finish(summary, bar, write=True, strict=True)
    return summary


def _finish(summary: RunSummary, bar, *, write: bool, strict: bool) -> None:
    """Close the progress bar and, when ``write``, write the run's summary
    (:func:`write_summary`). An interrupted run that put nothing in place writes none (it leaves
    nothing of its own), nor does a run ended by an output error (each promotion wrote
    ``summary.json`` with its outputs). A summary that cannot be written is an
    :class:`~bnmem_utils.outputs.OutputError` when ``strict``, else a warning."""
    bar.close()
    summary.finished = _now()
    if not write:
        return
    try:
        write_summary(summary)
    except outputs.OutputError as exc:
        if strict:
            raise
        print(f"bnmem: {exc}", file=sys.stderr)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def summary_path(summary: RunSummary) -> Path:
    """``runs/<profile>/summary.json``: the last run that put results in place."""
    return summary.plan.runs_dir / "summary.json"


def summary_text(summary: RunSummary, *, promoted: Mapping[str, dict] | None = None) -> str:
    """``summary.json``'s contents; ``promoted`` (``{notebook: results payload}``) are results
    being put in place with it, listed as this run's results in effect."""
    payload = summary.as_dict()
    effect = payload["results_in_effect"]
    for nb, results in (promoted or {}).items():
        if results:
            meta = results.get("meta", {})
            effect[nb] = {"run_id": summary.run_id, "commit": meta.get("commit", ""),
                          "started": meta.get("started", ""), "finished": meta.get("finished", ""),
                          "from": "this run"}
    payload["results_in_effect"] = dict(sorted(effect.items()))
    return json.dumps(payload, indent=1, default=str) + "\n"


def write_summary(summary: RunSummary) -> Path:
    """Write the run's summary atomically; return its path.

    A run that put at least one notebook's outputs in place writes ``summary.json`` (and drops
    the ``summary.failed.json`` of an earlier run); a run that put none (every notebook failed
    or was interrupted) leaves ``summary.json``, which still describes every output in place,
    and writes its own as ``summary.failed.json``. :class:`~bnmem_utils.outputs.OutputError`
    when the file cannot be written.
    """
    path = summary_path(summary)
    failed = path.with_name("summary.failed.json")
    if not any(r.ok for r in summary.results):
        path = failed
    try:
        atomic_write_text(path, summary_text(summary))
        if path != failed:
            failed.unlink(missing_ok=True)
    except OSError as exc:
        raise outputs.OutputError(path, exc) from None
    summary.summary_file = str(path)
    return path


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """One line per row, every column but the last padded to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
            for row in rows]


def summary_table(summary: RunSummary, *, keys: int = 3, width: int = 70) -> str:
    """The closing table: notebook, status, wall time, a few key numbers; then each failure with
    its failing cell and the path of the executed copy that holds the traceback."""
    rows = [("notebook", "status", "wall", "key numbers")]
    for r in summary.results:
        numbers = "; ".join(f"{k}={v}" for k, v in list(r.results.items())[:keys])
        if not numbers and r.ok:
            numbers = "(no results recorded)"
        rows.append((r.notebook, r.status, f"{r.wall_s:.1f}s", _truncate(numbers, width)))
    lines = _aligned(rows)
    lines.insert(1, "-" * len(lines[0]))
    for r in summary.failed:
        lines += ["", f"{r.status.upper()}: {r.notebook}: {r.error}"]
        if r.cell:
            lines.append(f"  failing cell: {r.cell}")
        if r.output:
            lines.append(f"  executed copy with the traceback: {r.output}")
        lines.append(f"  results and executed notebook kept from an earlier run ({r.results_from})"
                     if r.kept else "  no earlier results to keep")
    if summary.interrupted:
        lines += ["", "interrupted: finished notebooks are kept; re-run to complete the others"]
    lines.append("")
    if summary.run_id:
        lines.append(f"run:                {summary.run_id} (commit {summary.commit or 'unknown'})")
    lines.append(f"executed notebooks: {summary.plan.runs_dir}")
    lines.append(f"summary:            {summary.summary_file}" if summary.summary_file else
                 f"summary:            {summary_path(summary)} (kept: this run put nothing in place)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Parameter listing (``bnmem params``)
# --------------------------------------------------------------------------------------------


def parameters_overview(only=None) -> dict[str, list[dict]]:
    """For each selected notebook, one row per parameter: name, default, comment, its declared
    constraint (:data:`bnmem_utils.params.SPEC`) and the value each named profile gives it
    (missing when the profile keeps the default)."""
    selected = select_notebooks(only)
    profiles = {name: load_profile(name)[1] for name in available_profiles()}
    overview = {}
    for nb, path in selected.items():
        defaults = notebook_parameter_table({nb: path})[nb]
        comments = params.parameter_comments(path)
        overview[nb] = [
            {"parameter": key, "default": default, "comment": comments.get(key, ""),
             "allowed": params.SPEC[key].describe() if key in params.SPEC
             else f"{type(default).__name__} (as the default)",
             "profiles": {p: vals[key] for p, vals in profiles.items() if key in vals}}
            for key, default in defaults.items()]
    return overview


def format_parameters(overview: Mapping[str, Sequence[Mapping]], profiles: Sequence[str],
                      *, value_width: int = 22) -> str:
    """``bnmem params`` output: per notebook, a table of parameter, default, profile values,
    comment and what values are allowed."""
    blocks = []
    for nb, rows in overview.items():
        table = [("parameter", "default", *profiles, "comment")]
        for row in rows:
            vals = [_truncate(repr(row["profiles"][p]), value_width) if p in row["profiles"] else "."
                    for p in profiles]
            comment = row["comment"]
            if row.get("allowed"):
                comment = f"{comment} [allowed: {row['allowed']}]".strip()
            table.append((row["parameter"], _truncate(repr(row["default"]), value_width), *vals,
                          comment))
        blocks.append("\n".join([nb, *("  " + line for line in _aligned(table))]))
    legend = "('.' = the profile keeps the notebook's default)"
    return "\n\n".join(blocks) + ("\n\n" + legend if blocks else "")


def cleanup_partials(folder: str | os.PathLike) -> None:
    """Remove what a killed run (SIGKILL, power loss) left: its staging folder and the partial
    executed copies of older versions."""
    outputs.discard_staging(Path(folder))
    for pattern in (f".*{_PARTIAL_SUFFIX}", f".*{_KERNEL_STDERR_SUFFIX}"):
        for path in Path(folder).glob(pattern):
            path.unlink(missing_ok=True)
