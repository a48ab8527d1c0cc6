"""What a headless run will do, checked before any notebook starts: profiles, notebooks, values.

A *profile* is a flat YAML file (``bnmem_utils/profiles/{smoke,quick,paper}.yaml`` or a user's own
file) mapping parameter names to values; it applies to every notebook that declares the key.
Papermill only warns about a parameter a notebook does not declare, so every key and value is
validated here (:func:`validate_values`) and each notebook is handed only the keys it declares
(:func:`plan_run`, a :class:`RunPlan` of :class:`NotebookJob`). ``bnmem params`` lists every
parameter with its default and each profile's value (:func:`parameters_overview`). The runner
(:mod:`bnmem_utils.run.runner`) executes a plan.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bnmem_utils.core import paths
from bnmem_utils.core.outputs import aligned, truncate
from bnmem_utils.core.paths import project_root, runs_dir
from bnmem_utils.core.results import results_path
from bnmem_utils.run import params, preflight, rules
from bnmem_utils.run.params import UsageError

DEFAULT_PROFILE = "quick"
#: Parameters every notebook declares; the runner itself sets the first three.
COMMON_PARAMETERS = ("profile", "device", "out_dir", "seed")
RUNNER_PARAMETERS = ("profile", "device", "out_dir")
#: ``NN_name`` or ``NNx_name``: a letter after the number runs a notebook between NN and NN+1
#: (``04b_confound`` after ``04_lira``), selected by ``04b`` or its name, not by ``04``.
NOTEBOOK_PATTERN = re.compile(r"^(\d\d[a-z]?)_([A-Za-z0-9_]+)$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# --------------------------------------------------------------------------------------------
# Notebooks and profiles
# --------------------------------------------------------------------------------------------


def available_profiles() -> dict[str, Path]:
    """Named profiles, ``{name: path}`` sorted by name: the ``*.yaml`` files of
    ``$BNMEM_PROFILES``, else of ``bnmem_utils/profiles``."""
    env = os.environ.get("BNMEM_PROFILES")
    folder = Path(env).resolve() if env else Path(__file__).resolve().parent.parent / "profiles"
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def load_profile(profile: str | os.PathLike = DEFAULT_PROFILE) -> tuple[str, dict]:
    """Read a profile by name or path; return ``(name, values)``.

    The name is the file's stem; it names the output folders ``runs/<name>`` and
    ``figures/<name>`` and is passed to the notebooks as ``profile`` (a ``profile`` key in the
    file must agree). An unknown name raises :class:`UsageError` listing the named profiles.
    """
    named = available_profiles()
    text = str(profile)
    if text in named:
        path = named[text]
    elif not (text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text):
        env = os.environ.get("BNMEM_PROFILES")
        where = f"the profiles of $BNMEM_PROFILES={env}, " if env else ""
        raise UsageError(f"unknown profile {text!r}; valid choices: {', '.join(named) or '(none)'}"
                         f" ({where}or the path of a YAML file of parameter values)")
    elif not Path(text).is_file():
        raise UsageError(f"profile file {text} does not exist (or is not a file); a profile is "
                         f"a name ({', '.join(named) or 'none found'}) or a YAML file's path")
    else:
        path = Path(text)
    try:
        values = rules.load_yaml(path.read_text(encoding="utf-8")) or {}
    except rules.DuplicateKeyError as exc:
        raise UsageError(f"profile file {path}: {exc}; keep one") from None
    except rules.KeyTypeError as exc:
        raise UsageError(f"profile file {path}: {exc}") from None
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
    values = params.rename_deprecated(values, source=f"profile {name}")
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
    ``1``; ``04b`` or ``4b`` for ``04b_confound``), the full stem (``01_theory``) or the name after the
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
        number = re.fullmatch(r"(\d+)([a-z]?)", token)
        matches = [stem for stem in found
                   if token == stem or token in stem.split("_", 1)
                   or (number and NOTEBOOK_PATTERN.match(stem)[1] == f"{int(number[1]):02d}{number[2]}")]
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
    """``["key=value", ...]`` to a dict, each value read as YAML with YAML 1.2's numbers (``3``
    int, ``0.1`` and ``1e-3`` float, ``true`` bool, ``[1, 2]`` list, ``null`` None, anything else
    a string); an old parameter name becomes its new one (with a one-line message); a key
    given twice is an error."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return dict(items)
    out: dict[str, object] = {}
    given: dict[str, str] = {}
    for item in items:
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"--set expects key=value with a parameter name as key, got {rules.shown(item)}")
        if key in given:
            raise UsageError(f"--set {key!r} is given twice ({rules.shown(given[key])} and "
                             f"{rules.shown(item)}; the second would silently win): give it once")
        given[key] = str(item)
        try:
            out[key] = rules.load_yaml(raw) if raw.strip() else ""
        except rules.KeyTypeError as exc:
            raise UsageError(f"--set {rules.shown(item)}: {exc}") from None
        except (yaml.YAMLError, rules.DuplicateKeyError) as exc:
            raise UsageError(f"--set {rules.shown(item)}: the value is not valid YAML "
                             f"({' '.join(str(exc).split())})") from exc
    return params.rename_deprecated(out, source="--set")


def _type_name(value) -> str:
    return "None" if value is None else type(value).__name__


def check_value(key: str, value, default, *, notebook: str = "", source: str = ""):
    """``value`` made compatible with the type of ``default``, or :class:`UsageError`.

    Rules: a None default accepts anything; a None value only a None default; bool only for
    bool; an int for a float default (made float); a whole float for an int default (made int);
    str for str; a list for a list or tuple default; a dict for a dict default. This is the
    fallback for a parameter without a declared constraint (:data:`bnmem_utils.run.params.SPEC`).
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
                         f"(default {default!r}), got {rules.shown(value)} ({_type_name(value)}){src}")
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
    checked against its declared constraint (:data:`bnmem_utils.run.params.SPEC`: type, range,
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
    overrides: dict
    device: str
    out_dir: str                      # "" = the project root
    jobs: list[NotebookJob]
    dry_run: dict = field(default_factory=dict)  # the shrunk values of a dry run ({}: a real run)
    source: str = ""                  # the profile as given: a name, or a file's absolute path
    environment: dict = field(default_factory=dict)  # $BNMEM_* paths made absolute, for kernels
    data: dict = field(default_factory=dict)  # {data set: the digest its data must have}

    @property
    def runs_dir(self) -> Path:
        return runs_dir(self.profile, self.out_dir or None)

    def output_path(self, notebook: str) -> Path:
        """Where the executed copy of ``notebook`` is saved."""
        return self.runs_dir / f"{notebook}.ipynb"

    def results_paths(self, notebook: str) -> tuple[Path, Path, Path]:
        """The results files of ``notebook``: in effect, pending (this run's, until it is put
        in place) and failed (:mod:`bnmem_utils.core.results`)."""
        return tuple(results_path(self.profile, notebook, self.out_dir or None, state)
                     for state in ("", "pending", "failed"))

    def command(self, only: str = "") -> str:
        """The ``bnmem reproduce`` command that writes this run's folders again (``only``: of
        those notebooks)."""
        sets = [f"--set {shlex.quote(f'{k}={json.dumps(v)}')}" for k, v in self.overrides.items()]
        return " ".join(["bnmem reproduce --profile", shlex.quote(self.source or self.profile),
                         *sets, *(["--dry-run"] if self.dry_run else []),
                         *([f"--out {shlex.quote(self.out_dir)}"] if self.out_dir else []),
                         *([f"--only {only}"] if only else [])])


def _given(profile: str | os.PathLike, name: str) -> tuple[str, bool]:
    """The profile as given (a name, or a file's absolute path) and whether it is a named
    profile as shipped (by its name or its file's path)."""
    named = available_profiles().get(name)
    given = str(profile) if str(profile) == name else str(Path(profile).resolve())
    return given, named is not None and given in (name, str(named.resolve()))


def profile_folder(profile: str | os.PathLike) -> str:
    """The output folder name of a run of ``profile`` without ``--set`` or ``--dry-run``."""
    name, values = load_profile(profile)
    table = notebook_parameter_table(discover_notebooks())
    return output_name(name, _given(profile, name)[1],
                       validate_values(values, table, source=f"profile {name}"), {})


#: Overrides that change how a run goes, never its numbers (with ``device``): a named profile
#: run with no other override still writes the profile's own folders.
NEUTRAL_SUFFIXES = ("_threads", "_executor", "_ray_address", "_download", "_force",
                    "_force_retrain")


def output_name(name: str, shipped: bool, values: Mapping, overrides: Mapping,
                shrunk: Mapping | None = None, *, base: Mapping | None = None) -> str:
    """The name of a run's output folders (``runs/<name>/``, ``figures/<name>/``, passed to the
    notebooks as ``profile``): the profile's own for a named profile as shipped with no
    override that can change a number, else ``<profile>-<digest>`` (``<profile>-dry-<digest>``
    for a dry run: ``shrunk`` given), the digest of the profile's values, those overrides and
    the dry run's values: no other run writes over a named profile's outputs. An override
    changes no number when it is neutral (:data:`NEUTRAL_SUFFIXES`, ``device``), keeps the
    value the run has without it (``base``), or is ``report_profile`` naming this profile."""
    changing = {k: v for k, v in overrides.items()
                if k != "device" and not k.endswith(NEUTRAL_SUFFIXES) and (base or {}).get(k) != v
                and not (k == "report_profile" and v == name)}
    if shipped and not changing and shrunk is None:
        return name
    text = json.dumps([values, changing, shrunk], sort_keys=True, default=str)
    dry = "" if shrunk is None else "dry-"
    return f"{name}-{dry}{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def plan_run(profile: str | os.PathLike = DEFAULT_PROFILE, *, only=None, overrides=None,
             device: str | None = None, out_dir: str | os.PathLike | None = None,
             dry_run: bool = False, verify_data: bool = False, allow_cpu: bool = True) -> RunPlan:
    """Validate a run and work out each notebook's parameters; raise :class:`UsageError` on bad input.

    Profile keys are checked against all notebooks (a profile serves every notebook);
    ``overrides`` (``--set``) against the selected ones. Precedence, lowest first: notebook
    default, profile, dry-run shrink (:func:`dry_run_values`, when ``dry_run``), override,
    ``device``/``out_dir`` arguments. The output folders are named by :func:`output_name`; a
    dry run's go under ``runs/dry-run/`` unless ``out_dir`` is given. The environment is
    checked too (:mod:`bnmem_utils.run.preflight`; ``verify_data``: the data sets' digests;
    ``allow_cpu`` False: a profile sized for a GPU that would train on the CPU).
    """
    from bnmem_utils.core.device import resolve_device

    name, values = load_profile(profile)
    given, shipped = _given(profile, name)
    all_notebooks = discover_notebooks()
    if not all_notebooks:
        raise UsageError(f"no notebooks named NN_name.ipynb in {paths.notebooks_dir()}")
    selected = select_notebooks(only)
    all_table = notebook_parameter_table(all_notebooks)
    table = _declaring_runner_parameters({nb: all_table[nb] for nb in selected})
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
        kind = resolve_device(dev).type
    except (ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from exc
    preflight.check_gpu_sized(available_profiles().get(given) or Path(given), name, dev, kind,
                              allow=allow_cpu or dry_run)
    out = str(Path(out_dir).expanduser().resolve()) if out_dir else ""
    base = {k: v for declared in all_table.values() for k, v in declared.items()}
    digests = preflight.digest_overrides()   # data that is not the published data set's
    folder = output_name(name, shipped, profile_values,
                         override_values | ({DIGESTS_KEY: digests} if digests else {}),
                         shrunk if dry_run else None, base=base | profile_values | shrunk)
    merged.update(profile=folder, device=dev, out_dir=out)
    jobs = _notebook_jobs(selected, merged, table)
    for job in jobs:
        params.check_relations({**table[job.notebook], **job.parameters},
                               where=f" of {job.notebook}" + (" in this --dry-run" if dry_run else ""))
    users = check_environment(jobs, table, verify_data=verify_data)
    return RunPlan(folder, override_values, dev, out, jobs, shrunk, source=given,
                   environment=paths.absolute_variables(), data=data_record(users))


def _declaring_runner_parameters(table: dict) -> dict:
    """``table``; :class:`UsageError` for a notebook lacking a parameter the runner sets."""
    for nb, declared in table.items():
        missing = [p for p in RUNNER_PARAMETERS if p not in declared]
        if missing:
            raise UsageError(f"notebook {nb} does not declare {', '.join(missing)} in its "
                             f"parameters cell; every notebook must declare {', '.join(COMMON_PARAMETERS)}")
    return table


#: How a run's digest overrides (``$BNMEM_DATA_DIGESTS``) enter its folder's name and record.
DIGESTS_KEY = "$BNMEM_DATA_DIGESTS"


def data_record(names: Iterable[str]) -> dict:
    """``{data set: digest}`` of the data sets a run reads (``names``): the digest their data is checked
    against (the published one, or ``$BNMEM_DATA_DIGESTS``'s, named with ``overridden``), else
    the embedded digits' own; the summary, each results file and each figure's manifest entry
    record it."""
    from bnmem_utils.data.datasets import data_digest
    from bnmem_utils.data.files import KNOWN_DIGESTS, expected_digest

    overridden = preflight.digest_overrides()
    record = {}
    for name in names:
        digest = expected_digest(name) or (data_digest(name) if name == "digits" else None)
        record[name] = (f"{digest} (overridden; published: {KNOWN_DIGESTS.get(name, 'none')})"
                        if name in overridden else digest or "no published digest")
    return record


def _notebook_jobs(selected: Mapping[str, Path], merged: Mapping[str, object],
                   table: Mapping[str, Mapping[str, object]]) -> list[NotebookJob]:
    """One job per selected notebook with the values it declares; a report notebook's
    ``report_profile`` always named (its default too), for the runner's up-front check."""
    jobs = [NotebookJob(nb, path, {k: v for k, v in merged.items() if k in table[nb]})
            for nb, path in selected.items()]
    for job in jobs:
        if "report_profile" in table[job.notebook]:
            job.parameters.setdefault("report_profile", table[job.notebook]["report_profile"])
    return jobs


def dry_run_values(values: Mapping[str, object],
                   table: Mapping[str, Mapping[str, object]]) -> dict[str, object]:
    """The parameters that shrink a run of ``values`` (a profile over the notebooks' defaults
    in ``table``) to a dry run: minutes on a CPU, every code path of the profile kept.

    Each parameter with a dry-run value in the table (:meth:`bnmem_utils.run.rules.Declaration.
    dry_value`) takes it: one epoch and one seed, a few dozen samples, N = 4 banks (6 where an
    attack chosen by name needs them: :func:`bnmem_utils.run.params.dry_bank_sizes`), a rate
    list's largest rate (and the clean setting, where listed), the confound ladder's two rungs.
    Everything else (data sets, architectures, norms, attacks, optimizers) is the profile's.
    """
    current = {k: v for declared in table.values() for k, v in declared.items()} | dict(values)
    declared = rules.declarations()
    return params.dry_bank_sizes(current, {k: declared[k].dry_value(v) for k, v in current.items()
                                           if k in declared and declared[k].dry is not None})


def datasets_of(jobs: Sequence[NotebookJob], table: Mapping[str, Mapping[str, object]]
                ) -> tuple[dict[str, list[str]], set[str]]:
    """``({data set: [notebook, ...]}, {data set the run downloads})`` of the run's jobs: the
    data sets each job's values (its parameters over its notebook's defaults) name, and those a
    notebook downloads itself (the naming parameter's download parameter is true)."""
    from bnmem_utils.data.datasets import DATASETS

    users: dict[str, list[str]] = {}
    downloaded: set[str] = set()
    for job in jobs:
        values, wanted = {**table[job.notebook], **job.parameters}, set()
        for name, value in values.items():
            param = params.SPEC.get(name)
            if param is None or param.download is None or value is None:
                continue
            names = {str(n) for n in (value if isinstance(value, (list, tuple)) else [value])
                     if n in DATASETS}
            wanted |= names
            if param.download and values.get(param.download):
                downloaded |= names
        for name in sorted(wanted):
            users.setdefault(name, []).append(job.notebook)
    return users, downloaded


def check_environment(jobs: Sequence[NotebookJob], table: Mapping[str, Mapping[str, object]], *,
                      verify_data: bool = False) -> dict[str, list[str]]:
    """What the jobs need of the environment (:mod:`bnmem_utils.run.preflight`): the packages of
    their executors, and the data sets: :class:`UsageError` when a job needs one that is not on
    disk and that no job of the run downloads (its download parameter, e.g. ``mem_download``, is
    false) or whose download server cannot be reached
    (:func:`bnmem_utils.run.preflight.download_blocked`); with ``verify_data``, each data set's
    digest is checked (:func:`bnmem_utils.run.preflight.verify_dataset`). Returns the data sets
    the jobs read, with the notebooks that read each.

    Each job's values are its parameters over its notebook's defaults; the search
    (:func:`bnmem_utils.data.datasets.dataset_available` reads no file) looks where the
    kernel's loader will (``$BNMEM_DATA``, ``data/``, a system package's folder).
    """
    from bnmem_utils.data.datasets import (
        SYSTEM_FOLDERS,
        dataset_available,
        first_command,
        search_roots,
    )

    preflight.check_executors((job.notebook, {**table[job.notebook], **job.parameters})
                              for job in jobs)
    preflight.check_data_variables()
    preflight.check_compile_variable()
    users, downloaded = datasets_of(jobs, table)
    for name, notebooks in users.items():
        if dataset_available(name):
            continue
        blocked = preflight.download_blocked(name) if name in downloaded else ""
        if name in downloaded and not blocked:
            continue
        searched = [str(p) for p in (*search_roots(), *SYSTEM_FOLDERS.get(name, ()))]
        command = first_command(name)
        system = f"get it with `{command}`, or " if command else ""
        raise UsageError(
            f"data set {name!r} (for {', '.join(notebooks)}) was not found offline (searched "
            f"{', '.join(searched)}) and " + (
                f"{blocked}; {system}copy torchvision's folder there (or set $BNMEM_DATA)"
                if blocked else
                f"nothing in this run downloads it; {system}copy torchvision's folder there (or "
                "set $BNMEM_DATA), or let the notebook fetch it (e.g. --set mem_download=true)"))
    for name in users if verify_data else ():
        preflight.verify_dataset(name)
    return users


# --------------------------------------------------------------------------------------------
# Parameter listing (``bnmem params``)
# --------------------------------------------------------------------------------------------


def parameters_overview(only=None) -> dict[str, list[dict]]:
    """For each selected notebook, one row per parameter: name, default, comment, its declared
    constraint (:data:`bnmem_utils.run.params.SPEC`) and the value each named profile gives it
    (missing when the profile keeps the default)."""
    selected = select_notebooks(only)
    profiles = {name: load_profile(name)[1] for name in available_profiles()}
    overview = {}
    for nb, path in selected.items():
        defaults = notebook_parameter_table({nb: path})[nb]
        declared = {d.name: d.help for d in rules.notebook_declarations(nb)}
        comments = declared or params.parameter_comments(path)   # a notebook of the user's own
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
            vals = [truncate(repr(row["profiles"][p]), value_width) if p in row["profiles"] else "."
                    for p in profiles]
            comment = row["comment"]
            if row.get("allowed"):
                comment = f"{comment} [allowed: {row['allowed']}]".strip()
            table.append((row["parameter"], truncate(repr(row["default"]), value_width), *vals,
                          comment))
        blocks.append("\n".join([nb, *("  " + line for line in aligned(table))]))
    legend = "('.' = the profile keeps the notebook's default)"
    return "\n\n".join(blocks) + ("\n\n" + legend if blocks else "")
