"""Run the numbered notebooks headless through papermill, with validated parameter profiles.

A *profile* is a flat YAML file (``bnmem_utils/profiles/{smoke,quick,paper}.yaml`` or a user's own
file) mapping parameter names to values; it applies to every notebook that declares the key.
Papermill only warns about a parameter a notebook does not declare, so this module validates
every key and value first and hands each notebook only the keys it declares::

    summary = reproduce("smoke", only=["01"], overrides={"seed": 1}, out_dir="/tmp/bnmem")
    print(summary_table(summary))

Executed notebooks go to ``runs/<profile>/NN_name.ipynb`` (written to a temporary file and
renamed when the notebook ends, so an interrupted run leaves no half-written copy), figures to
``figures/<profile>/`` through the notebooks' own ``save_figure``, and a run summary to
``runs/<profile>/summary.json``. A notebook that fails does not stop the others; its executed
copy, which holds the traceback, is kept and named in the summary.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from .params import notebook_parameters
from .paths import _umask, atomic_write_text, project_root, runs_dir
from .results import format_result, results_path

PROFILE_NAMES = ("smoke", "quick", "fmnist", "paper")
DEFAULT_PROFILE = "quick"
#: Parameters every notebook declares; the runner itself sets the first three.
COMMON_PARAMETERS = ("profile", "device", "out_dir", "seed")
RUNNER_PARAMETERS = ("profile", "device", "out_dir")
NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_([A-Za-z0-9_]+)$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PARTIAL_SUFFIX = ".partial.ipynb"


class UsageError(ValueError):
    """Bad input from the user: unknown profile, notebook or parameter, or a value of the wrong
    type. The message names the bad value and the valid choices; the CLI exits with code 2."""


# --------------------------------------------------------------------------------------------
# Notebooks and profiles
# --------------------------------------------------------------------------------------------


def default_profiles_dir() -> Path:
    """Folder of the named profiles: ``$BNMEM_PROFILES``, else ``bnmem_utils/profiles``."""
    env = os.environ.get("BNMEM_PROFILES")
    return Path(env).resolve() if env else Path(__file__).resolve().parent / "profiles"


def available_profiles(profiles_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """Named profiles, ``{name: path}`` sorted by name (the ``*.yaml`` files of the folder)."""
    folder = Path(profiles_dir) if profiles_dir else default_profiles_dir()
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


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
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"profile file {path} is not valid YAML: {exc}") from exc
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
    return name, values


def discover_notebooks(notebooks_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """The numbered notebooks ``NN_name.ipynb`` of the project, ``{stem: path}`` in order."""
    folder = Path(notebooks_dir) if notebooks_dir else project_root() / "notebooks"
    found = {p.stem: p for p in folder.glob("*.ipynb") if NOTEBOOK_PATTERN.match(p.stem)}
    return dict(sorted(found.items()))


def select_notebooks(only: str | Iterable[str] | None = None,
                     notebooks_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """The notebooks picked by ``only`` (all when empty), in run order.

    Each item of ``only`` (or comma-separated part of a string) may be the number (``01`` or
    ``1``), the full stem (``01_theory``) or the name after the number (``theory``).
    """
    found = discover_notebooks(notebooks_dir)
    if isinstance(only, str):
        only = [only]
    tokens = [t.strip() for item in (only or []) for t in str(item).split(",") if t.strip()]
    if not tokens:
        return found
    chosen: set[str] = set()
    for token in tokens:
        token = token.removesuffix(".ipynb")
        matches = [stem for stem in found
                   if token == stem
                   or (token.isdigit() and int(token) == int(stem[:2]))
                   or token == stem[3:]]
        if not matches:
            valid = ", ".join(found) or f"(no NN_name.ipynb notebooks in {notebooks_dir or 'notebooks/'})"
            raise UsageError(f"unknown notebook {token!r}; valid choices: {valid}")
        chosen.update(matches)
    return {stem: path for stem, path in found.items() if stem in chosen}


def notebook_parameter_table(notebooks: Mapping[str, Path]) -> dict[str, dict[str, object]]:
    """``{notebook: {parameter: default}}`` read from each notebook's ``parameters`` cell."""
    table = {}
    for stem, path in notebooks.items():
        try:
            table[stem] = notebook_parameters(path)
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

    Rules: a None default or a None value accepts anything; bool only for bool; an int for a
    float default (made float); a whole float for an int default (made int); str for str;
    a list for a list or tuple default; a dict for a dict default.
    """
    where = f" of {notebook}" if notebook else ""
    src = f" (from {source})" if source else ""
    if default is None or value is None:
        return value

    def bad() -> UsageError:
        return UsageError(f"parameter {key!r}{where} expects {_type_name(default)} "
                          f"(default {default!r}), got {value!r} ({_type_name(value)}){src}")

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad()
        return value
    if isinstance(default, int):
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad()
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise bad()
        return value
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise bad()
        return list(value)
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise bad()
        return value
    return value


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
    checked with :func:`check_value` against every declaring notebook's default.
    """
    cleaned = {}
    for key, value in values.items():
        declaring = [nb for nb, params in table.items() if key in params]
        if not declaring:
            others = [nb for nb, params in (all_table or {}).items() if key in params]
            if others:
                raise UsageError(f"parameter {key!r} (from {source}) is declared only by "
                                 f"{', '.join(others)}, which is not selected; selected: "
                                 f"{', '.join(table)}")
            raise UsageError(_unknown_key_message(key, source, table))
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
             profiles_dir: str | os.PathLike | None = None,
             notebooks_dir: str | os.PathLike | None = None, dry_run: bool = False) -> RunPlan:
    """Validate a run and work out each notebook's parameters; raise :class:`UsageError` on bad input.

    Profile keys are checked against all notebooks (a profile serves every notebook);
    ``overrides`` (``--set``) against the selected ones. Precedence, lowest first: notebook
    default, profile, dry-run shrink (:func:`dry_run_values`, when ``dry_run``), override,
    ``device``/``out_dir`` arguments. A dry run writes under ``runs/dry-run/`` unless ``out_dir``
    is given, so its meaningless numbers never replace a real run's.
    """
    from .device import resolve_device

    name, values = load_profile(profile, profiles_dir)
    all_notebooks = discover_notebooks(notebooks_dir)
    if not all_notebooks:
        folder = notebooks_dir or project_root() / "notebooks"
        raise UsageError(f"no notebooks named NN_name.ipynb in {folder}")
    selected = select_notebooks(only, notebooks_dir)
    all_table = notebook_parameter_table(all_notebooks)
    table = {nb: all_table[nb] for nb in selected}
    for nb, params in table.items():
        missing = [p for p in RUNNER_PARAMETERS if p not in params]
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
    return RunPlan(name, profile_values, override_values, dev, out, jobs, shrunk)


#: What a dry run sets, by parameter-name suffix: one epoch and one seed, a few dozen samples,
#: the smallest bank LiRA accepts. Data sets, architectures, norms and attacks are kept.
DRY_RUN_SIZES: dict[str, object] = {
    "_epochs": 1, "_seeds": 1, "_n_models": 4, "_bank_models": 4, "_train_size": 32,
    "_test_size": 16, "_population_size": 8, "_max_clean": 4, "_max_noisy": 4,
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
    so that corrupted samples exist among a few dozen; epoch lists shrink to the one epoch;
    the penalty sweep keeps lambda 0 and its largest lambda. Everything else (data sets,
    architectures, norms, attacks, optimizers) is the profile's.
    """
    current = {k: v for params in table.values() for k, v in params.items()}
    current.update(values)
    out: dict[str, object] = {k: v for k, v in DRY_RUN_THEORY.items() if k in current}
    for key, value in current.items():
        if key.startswith("theory_"):
            continue
        for suffix, size in DRY_RUN_SIZES.items():
            if key.endswith(suffix):
                keep = isinstance(value, int) and not isinstance(value, bool) and value <= size
                out[key] = value if keep else size
        rates = [float(r) for r in value] if isinstance(value, list) and key.endswith(
            ("_rates", "_lams")) else None
        if rates:
            picked = {max(rates)} | ({0.0} & set(rates))
            out[key] = sorted(picked)
    for key, value in (("mem_fixed_epochs", [1]), ("gn_measure_epochs", [0, 1])):
        if key in current:
            out[key] = value
    return out


# --------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------


@dataclass
class NotebookResult:
    """The outcome of one notebook: status ``ok``, ``failed`` or ``interrupted``."""

    notebook: str
    status: str
    wall_s: float
    output: str                       # executed copy ("" when none was saved)
    error: str = ""                   # exception name and message
    cell: str = ""                    # the failing cell: number, In [n] and its first line
    results: dict = field(default_factory=dict)   # key numbers, formatted, from this run

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

    @property
    def failed(self) -> list[NotebookResult]:
        return [r for r in self.results if not r.ok]

    @property
    def exit_code(self) -> int:
        """0 when every notebook ran, 130 when interrupted, 1 when any failed."""
        if self.interrupted:
            return 130
        return 1 if self.failed else 0

    def as_dict(self) -> dict:
        return {
            "profile": self.plan.profile,
            "device": self.plan.device,
            "out_dir": self.plan.out_dir,
            "overrides": self.plan.overrides,
            "dry_run": self.plan.dry_run,
            "started": self.started,
            "finished": self.finished,
            "interrupted": self.interrupted,
            "notebooks": [asdict(r) for r in self.results],
        }


class _TqdmHandler(logging.Handler):
    """Logging handler that prints through ``tqdm.write`` so the progress bar stays intact."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm.auto import tqdm

        msg = self.format(record).rstrip("\n")
        if msg:
            tqdm.write(msg, file=sys.stderr)


class _NotebookOutputOnly(logging.Filter):
    """Keep the notebook's own output and papermill's 'Executing Cell N' markers; drop the rest.

    Dropped: the paths papermill prints (the output path is the temporary one), the kernel
    name, 'Ending Cell' markers, and papermill's parameter warnings, which the runner's own
    validation supersedes (papermill's parser also trips on comments holding '=').
    """

    DROP = ("Ending Cell", "Input Notebook", "Output Notebook", "Working directory",
            "Executing notebook with kernel", "Passed unknown parameter", "Unable to parse line")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.DROP)


@contextlib.contextmanager
def _notebook_log(enabled: bool) -> Iterator[None]:
    """Route papermill's log (the notebook's own output) to stderr for the duration of a run."""
    logger = logging.getLogger("papermill")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    handler = _TqdmHandler()
    handler.addFilter(_NotebookOutputOnly())
    logger.handlers = [handler] if enabled else [logging.NullHandler()]
    logger.setLevel(logging.INFO if enabled else logging.ERROR)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


@contextlib.contextmanager
def _headless_env() -> Iterator[None]:
    """Set ``BNMEM_HEADLESS=1`` (inherited by the kernel) and restore the environment after."""
    old = os.environ.get("BNMEM_HEADLESS")
    os.environ["BNMEM_HEADLESS"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("BNMEM_HEADLESS", None)
        else:
            os.environ["BNMEM_HEADLESS"] = old


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
    plain = {"python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"}
    if exe in plain:  # jupyter_client substitutes sys.executable for these
        return ""
    try:
        same = Path(exe).resolve() == Path(sys.executable).resolve()
    except OSError:
        same = False
    if same or Path(exe).parent.resolve() == Path(sys.executable).parent.resolve():
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


def _failing_cell(source_path: Path, exc) -> str:
    """'cell 7 (In [5]): first line' for a PapermillExecutionError, numbered as in the source."""
    source = exc.source if isinstance(exc.source, str) else "".join(exc.source or [])
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    number = None
    try:
        cells = json.loads(source_path.read_text())["cells"]
        for i, cell in enumerate(cells):
            src = cell.get("source", "")
            if ("".join(src) if isinstance(src, list) else src) == source:
                number = i + 1
                break
    except (OSError, ValueError, KeyError):
        pass
    where = f"cell {number}" if number else f"executed cell {exc.cell_index + 1}"
    return f"{where} (In [{exc.exec_count}]): {first[:80]}"


def _fresh_results(plan: RunPlan, notebook: str, since: float, keys: int | None = None) -> dict:
    """Formatted key numbers the notebook wrote during this run (an older file is ignored)."""
    path = results_path(plan.profile, notebook, plan.out_dir or None)
    try:
        if path.stat().st_mtime < since - 2.0:  # slack for coarse file-system timestamps
            return {}
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    items = list(payload.get("results", {}).items())
    return {key: format_result(entry) for key, entry in items[:keys]}


def execute_job(plan: RunPlan, job: NotebookJob, *, kernel_name: str = "python3",
                log_output: bool = True, cell_progress: bool = False,
                execution_timeout: float | None = None) -> NotebookResult:
    """Execute one notebook through papermill and save its executed copy atomically.

    Failures (a cell that raises, a dead kernel, a timeout) become a ``failed`` result: the
    executed copy holding the traceback is kept. ``KeyboardInterrupt`` deletes the partial copy
    and propagates.
    """
    import papermill as pm

    out = plan.output_path(job.notebook)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{job.notebook}.", suffix=_PARTIAL_SUFFIX, dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    start = time.time()
    t0 = time.perf_counter()
    status, error, cell = "ok", "", ""
    if log_output:
        logging.getLogger("papermill").info(f"=== {job.notebook}: {job.path} -> {out}")
    try:
        with _headless_env():
            pm.execute_notebook(
                str(job.path), str(tmp), parameters=job.parameters, kernel_name=kernel_name,
                language="python", log_output=log_output, progress_bar=cell_progress, cwd=str(project_root()),
                execution_timeout=execution_timeout, **_kernel_config(),
            )
    except pm.PapermillExecutionError as exc:
        status, error = "failed", f"{exc.ename}: {exc.evalue}"
        cell = _failing_cell(job.path, exc)
    except KeyboardInterrupt:
        tmp.unlink(missing_ok=True)
        raise
    except Exception as exc:  # dead kernel, timeout, unreadable notebook: keep going
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    wall = time.perf_counter() - t0
    saved = ""
    if tmp.exists() and tmp.stat().st_size > 0:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600
        os.replace(tmp, out)
        saved = str(out)
    else:
        tmp.unlink(missing_ok=True)
    return NotebookResult(job.notebook, status, round(wall, 2), saved, error, cell,
                          _fresh_results(plan, job.notebook, start))


def reproduce(profile: str | os.PathLike = DEFAULT_PROFILE, *, only=None, overrides=None,
              device: str | None = None, out_dir: str | os.PathLike | None = None,
              profiles_dir: str | os.PathLike | None = None,
              notebooks_dir: str | os.PathLike | None = None, log_output: bool = True,
              progress: bool = True, kernel_name: str = "python3",
              execution_timeout: float | None = None, dry_run: bool = False) -> RunSummary:
    """Validate, then execute the selected notebooks in order; write ``summary.json``.

    ``dry_run`` shrinks the profile (:func:`dry_run_values`) and writes under ``runs/dry-run/``.

    Every notebook runs even when an earlier one failed. On Ctrl-C the finished notebooks are
    kept, the current one's partial copy is removed, the summary is written and
    ``KeyboardInterrupt`` propagates (the caller prints :func:`summary_table` of
    ``exc.summary``).
    """
    from tqdm.auto import tqdm

    plan = plan_run(profile, only=only, overrides=overrides, device=device, out_dir=out_dir,
                    profiles_dir=profiles_dir, notebooks_dir=notebooks_dir, dry_run=dry_run)
    warning = check_kernel(kernel_name)
    if warning:
        print(warning, file=sys.stderr)
    summary = RunSummary(plan, [], _now())
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
                                                   execution_timeout=execution_timeout))
                current = None
    except KeyboardInterrupt as exc:
        summary.interrupted = True
        if current is not None:
            wall = round(time.perf_counter() - job_start, 2)
            summary.results.append(NotebookResult(current.notebook, "interrupted", wall, "",
                                                  "KeyboardInterrupt"))
        summary.finished = _now()
        write_summary(summary)
        exc.summary = summary  # type: ignore[attr-defined]
        raise
    finally:
        bar.close()
    summary.finished = _now()
    write_summary(summary)
    return summary


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def write_summary(summary: RunSummary) -> Path:
    """Write ``runs/<profile>/summary.json`` atomically; return its path."""
    path = summary.plan.runs_dir / "summary.json"
    atomic_write_text(path, json.dumps(summary.as_dict(), indent=1, default=str) + "\n")
    return path


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def summary_table(summary: RunSummary, *, keys: int = 3, width: int = 70) -> str:
    """The closing table: notebook, status, wall time, a few key numbers; then each failure with
    its failing cell and the path of the executed copy that holds the traceback."""
    rows = [("notebook", "status", "wall", "key numbers")]
    for r in summary.results:
        numbers = "; ".join(f"{k}={v}" for k, v in list(r.results.items())[:keys])
        if not numbers and r.ok:
            numbers = "(no results recorded)"
        rows.append((r.notebook, r.status, f"{r.wall_s:.1f}s", _truncate(numbers, width)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3])
        if i == 0:
            lines.append("-" * (sum(widths) + 6 + len("key numbers")))
    for r in summary.failed:
        lines.append("")
        lines.append(f"{r.status.upper()}: {r.notebook}: {r.error}")
        if r.cell:
            lines.append(f"  failing cell: {r.cell}")
        if r.output:
            lines.append(f"  executed copy with the traceback: {r.output}")
    if summary.interrupted:
        lines.append("")
        lines.append("interrupted: finished notebooks are kept; re-run to complete the others")
    lines.append("")
    lines.append(f"executed notebooks: {summary.plan.runs_dir}")
    lines.append(f"summary:            {summary.plan.runs_dir / 'summary.json'}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Parameter listing (``bnmem params``)
# --------------------------------------------------------------------------------------------


def parameters_overview(only=None, *, profiles_dir=None, notebooks_dir=None) -> dict[str, list[dict]]:
    """For each selected notebook, one row per parameter: name, default, comment and the value
    each named profile gives it (missing when the profile keeps the default)."""
    from .params import parameter_comments

    selected = select_notebooks(only, notebooks_dir)
    profiles = {name: load_profile(name, profiles_dir)[1] for name in available_profiles(profiles_dir)}
    overview = {}
    for nb, path in selected.items():
        defaults = notebook_parameter_table({nb: path})[nb]
        comments = parameter_comments(path)
        rows = []
        for key, default in defaults.items():
            row = {"parameter": key, "default": default, "comment": comments.get(key, "")}
            row["profiles"] = {p: vals[key] for p, vals in profiles.items() if key in vals}
            rows.append(row)
        overview[nb] = rows
    return overview


def format_parameters(overview: Mapping[str, Sequence[Mapping]], profiles: Sequence[str],
                      *, value_width: int = 22) -> str:
    """``bnmem params`` output: per notebook, a table of parameter, default, profile values, comment."""
    blocks = []
    for nb, rows in overview.items():
        header = ("parameter", "default", *profiles, "comment")
        table = [header]
        for row in rows:
            vals = [_truncate(repr(row["profiles"][p]), value_width) if p in row["profiles"] else "."
                    for p in profiles]
            table.append((row["parameter"], _truncate(repr(row["default"]), value_width), *vals,
                          row["comment"]))
        widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
        lines = [nb]
        for r in table:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True))
                         + "  " + r[-1])
        blocks.append("\n".join(lines))
    legend = "('.' = the profile keeps the notebook's default)"
    return "\n\n".join(blocks) + ("\n\n" + legend if blocks else "")


def cleanup_partials(folder: str | os.PathLike) -> list[Path]:
    """Remove partial executed copies a killed run (SIGKILL, power loss) left; return them."""
    removed = []
    for path in Path(folder).glob(f".*{_PARTIAL_SUFFIX}"):
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
