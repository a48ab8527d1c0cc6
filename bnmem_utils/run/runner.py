"""Run the numbered notebooks headless through papermill, with validated parameter profiles.

A *profile* is a flat YAML file (``bnmem_utils/profiles/{smoke,quick,paper}.yaml`` or a user's own
file) mapping parameter names to values; it applies to every notebook that declares the key.
Papermill only warns about a parameter a notebook does not declare, so every key and value is
validated first (:func:`bnmem_utils.run.plan.plan_run`) and each notebook is handed only the keys
it declares; the run's outcome is a :class:`bnmem_utils.run.summary.RunSummary`::

    summary = reproduce("smoke", only=["01"], overrides={"seed": 1}, out_dir="/tmp/bnmem")
    print(runsummary.summary_table(summary))

Executed notebooks go to ``runs/<name>/NN_name.ipynb``, figures to ``figures/<name>/``
through the notebooks' own ``save_figure``, and a run summary to ``runs/<name>/summary.json``.
A notebook that fails does not stop the others.

Outputs belong to one run. ``<name>`` is the profile's name only for a named profile as
shipped, with no override that can change a number: ``--device``, ``device`` and the
``*_threads``, ``*_executor``, ``*_ray_address``, ``*_download``, ``*_force`` settings (how a run
goes, not what it finds) are allowed. Any other ``--set``, a profile given as a file (even one
named like a named profile) and a dry run write to ``<profile>-<digest>`` (``<profile>-dry-<digest>``;
:func:`bnmem_utils.run.plan.output_name`), so that they never write over a named profile's
folders or each other's. ``$BNMEM_CACHE``, ``$BNMEM_DATA`` (and ``$BNMEM_ROOT``,
``$BNMEM_PROFILES``) and ``--out`` are resolved once, against the folder the command ran in,
and handed to the kernels as absolute paths. Before any kernel starts, a damaged results file
of a notebook this run does not select stops the run (:class:`UsageError`), and a damaged or
missing figures manifest is rebuilt from the figure files and the results files.

Outputs are replaced only on success, all together. Each run has a run id; a notebook under the
runner writes its executed copy and figures (with their manifest entries) to the run's staging
folder and its results to ``results/NN_name.pending.json``; when it succeeded, the runner puts
them all in place in one promotion (:mod:`bnmem_utils.core.outputs`), with the merged figure
manifest and the summary, so that after an interrupt or a full disk every output is from one
run. A failed notebook leaves the previous good ones in place and its own copies beside them, as
``NN_name.failed.ipynb`` (with the traceback; only when it is valid JSON) and
``results/NN_name.failed.json``; an interrupted one leaves nothing of its own. The summary names,
for each notebook, the run its results come from ("kept from an earlier run" when this run
failed it); a run that put nothing in place writes its summary as ``summary.failed.json``, and
``summary.json`` stays the one of the run whose outputs are in place. An output that cannot be
written ends the run with :class:`~bnmem_utils.core.outputs.OutputError` (one line naming the path).

One run at a time per output folder: a second ``reproduce`` on the same ``--out`` (or on the
project root) stops at once with exit code 2, naming the run that holds the folder's lock
(``runs/.bnmem.lock``, released when that run ends, also when it is killed).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from bnmem_utils.core import outputs, threads
from bnmem_utils.core.cache import atomic_write_text, promote
from bnmem_utils.core.paths import figures_dir, project_root, published_dir
from bnmem_utils.core.results import DATA_ENV, format_result
from bnmem_utils.run import params, preflight
from bnmem_utils.run.params import UsageError
from bnmem_utils.run.plan import DEFAULT_PROFILE, NotebookJob, RunPlan, plan_run
from bnmem_utils.run.progress import ENV as PROGRESS_ENV
from bnmem_utils.run.progress import LiveLine, duration, say
from bnmem_utils.run.rules import Param
from bnmem_utils.run.summary import (
    NotebookResult,
    RunSummary,
    check_publishable,
    compare_and_publish,
    damaged_results,
    previous_wall_times,
    results_files,
    results_run_id,
    summary_path,
    summary_text,
    write_summary,
)

_PARTIAL_SUFFIX = ".partial.ipynb"
_KERNEL_STDERR_SUFFIX = ".kernel-stderr"
FAILED_SUFFIX = ".failed.ipynb"
LOCK_NAME = ".bnmem.lock"


class _LogHandler(logging.Handler):
    """Prints, over the live progress line (:func:`~bnmem_utils.run.progress.say`), only the
    notebook's own output and papermill's 'Executing Cell N' markers.

    Dropped: the paths papermill prints (the output path is the temporary one), the kernel
    name, 'Ending Cell' markers, and papermill's parameter warnings, which the runner's own
    validation supersedes (papermill's parser also trips on comments holding '=').
    """

    DROP = ("Ending Cell", "Input Notebook", "Output Notebook", "Working directory",
            "Executing notebook with kernel", "Passed unknown parameter", "Unable to parse line")

    def emit(self, record: logging.LogRecord) -> None:
        msg = self.format(record).rstrip("\n")
        if msg and not str(record.getMessage()).startswith(self.DROP):
            say(msg)


@contextlib.contextmanager
def _notebook_log(enabled: bool) -> Iterator[None]:
    """Route papermill's log (the notebook's own output) to stderr for the duration of a run."""
    logger = logging.getLogger("papermill")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    logger.handlers = [_LogHandler() if enabled else logging.NullHandler()]
    logger.setLevel(logging.INFO if enabled else logging.ERROR)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def check_kernel(kernel_name: str = "python3") -> str:
    """Raise :class:`UsageError` for an unknown kernel, or an environment no kernel can start
    with (an unknown ``BNMEM_MALLOC``); return a warning (else ``""``) when the kernel would not
    run this interpreter, in which case the notebooks may not see bnmem_utils.

    Jupyter looks in the user's folder (``~/.local/share/jupyter``) before this environment's,
    so a ``python3`` kernel registered by another environment can shadow this one.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        threads.policy_env(os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
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


def _kernel_manager_class(stderr_path: Path, env: dict[str, str]):
    """A kernel manager whose kernel process starts with this process's environment plus ``env``
    and the thread policy (:func:`bnmem_utils.core.threads.policy_env`), this process's own left
    as it is, and writes its own stderr (ipykernel's log, C-level warnings; not the cells'
    output, which comes through the kernel's messages) to ``stderr_path``. The runner replays
    that file after the notebook and drops it when the run is interrupted: on Ctrl-C the kernel
    is shut down in the middle of a cell and logs a ZMQError traceback (a reply sent on a closed
    socket) that is only noise. ``start_kernel`` hands ``env`` and ``stderr`` to the kernel's
    ``Popen``."""
    from jupyter_client import AsyncKernelManager

    class _KernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw):
            base = {**kw.pop("env", os.environ), **env}
            with open(stderr_path, "ab") as fh:
                return await super().start_kernel(env={**base, **threads.policy_env(base)},
                                                  stderr=fh, **kw)

    _KernelManager.kernel_env = dict(env)       # what the runner adds, for stand-ins in tests
    return _KernelManager


def _replay_kernel_stderr(path: Path) -> None:
    """Print what the kernel process wrote to its stderr (the staging folder it lies in goes
    with the rest of the notebook's staged files)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    if text.strip():
        logging.getLogger("papermill").warning(text.rstrip("\n"))


def _failing_cell(source_path: Path, exc) -> str:
    """'cell 7 (In [5]): first line' for a PapermillExecutionError, numbered as in the source."""
    source = exc.source if isinstance(exc.source, str) else "".join(exc.source or [])
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    cells = outputs.read_json(source_path).get("cells", [])
    number = next((i + 1 for i, cell in enumerate(cells) if params.cell_source(cell) == source), None)
    where = f"cell {number}" if number else f"executed cell {exc.cell_index + 1}"
    return f"{where} (In [{exc.exec_count}]): {first[:80]}"


def _fresh_results(path: Path, run_id: str) -> dict:
    """Formatted key numbers of the results file ``path`` if this run (``run_id``) wrote it."""
    payload = outputs.read_json(path)
    if payload.get("meta", {}).get("run_id") != run_id:
        return {}
    return {key: format_result(entry) for key, entry in payload.get("results", {}).items()}


def new_run_id() -> str:
    """A unique run id: the start time (UTC, to the second) and a random suffix."""
    import secrets

    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + f"-{secrets.token_hex(3)}"


def execute_job(summary: RunSummary, job: NotebookJob, *, kernel_name: str, log_output: bool,
                live: str, execution_timeout: float | None) -> NotebookResult:
    """Execute one notebook of the run ``summary`` (its outcomes so far) through papermill;
    replace its outputs only if it succeeded.

    The notebook sees the run's id as ``$BNMEM_RUN_ID``, its staging folder as ``$BNMEM_STAGING``
    and its bars' state file there as ``$BNMEM_PROGRESS``, shown as a live line labelled
    ``live`` while it runs (none when ``""``; :mod:`bnmem_utils.run.progress`). On success its
    executed copy, results, figures and manifest entries and ``summary.json`` are promoted
    together
    (:class:`bnmem_utils.core.outputs.Promotion`; :class:`~bnmem_utils.core.outputs.OutputError` when one
    cannot be written, nothing then replaced); a failure keeps its copies as the module docstring
    says. ``KeyboardInterrupt`` deletes this run's staged files and propagates; one that arrives
    during the promotion is raised after it, carrying the result as ``exc.result``.
    """
    plan, run_id, commit = summary.plan, summary.run_id, summary.commit
    out = plan.output_path(job.notebook)
    pending_res = plan.results_paths(job.notebook)[1]
    pending_res.unlink(missing_ok=True)
    stage = outputs.staging_folder(plan.runs_dir, run_id, job.notebook)
    tmp, kernel_stderr = stage / out.name, stage / "kernel-stderr"
    t0 = time.perf_counter()
    if log_output:
        logging.getLogger("papermill").info(f"=== {job.notebook}: {job.path} -> {out}")
    # BNMEM_HEADLESS=1, the run's id, commit, staging folder and state file, inherited by the kernel
    env = {"BNMEM_HEADLESS": "1", "BNMEM_RUN_ID": run_id, "BNMEM_STAGING": str(stage),
           DATA_ENV: json.dumps(plan.data, sort_keys=True),
           PROGRESS_ENV: str(stage / "progress.json"),
           **({"BNMEM_COMMIT": commit} if commit else {}), **plan.environment}
    try:
        with (LiveLine(live, stage / "progress.json", expected=summary.previous.get(job.notebook))
              if live else contextlib.nullcontext()):
            status, error, cell = _papermill(job, tmp, kernel_stderr, env, kernel_name=kernel_name,
                                             log_output=log_output,
                                             execution_timeout=execution_timeout)
    except (KeyboardInterrupt, outputs.OutputError):   # a full disk ends the run like Ctrl-C
        pending_res.unlink(missing_ok=True)
        outputs.discard_staging(plan.runs_dir, run_id)
        raise
    wall = round(time.perf_counter() - t0, 2)
    if log_output:
        _replay_kernel_stderr(kernel_stderr)
    if status != "ok":
        return _keep_failure(plan, job, NotebookResult(job.notebook, status, wall, "", error, cell),
                             tmp, run_id)
    result = NotebookResult(job.notebook, status, wall, "", results=_fresh_results(pending_res, run_id),
                            results_from=run_id)
    try:
        with outputs.held_interrupt():
            _promote_success(job, result, stage, summary)
    except KeyboardInterrupt as exc:
        exc.result = result  # type: ignore[attr-defined]
        raise
    finally:
        pending_res.unlink(missing_ok=True)
        outputs.discard_staging(plan.runs_dir, run_id)
    return result


#: Write failures that no later notebook would escape: the run ends on them, as docs/internals.md
#: says, instead of failing every notebook after it one by one.
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_FULL = re.compile(r"No space left on device|Disk quota exceeded|Read-only file system|"
                   rf"\[Errno ({'|'.join(map(str, _FULL_ERRNOS))})\]")


def _papermill(job: NotebookJob, output: Path, kernel_stderr: Path, env: dict, *, kernel_name: str,
               log_output: bool, execution_timeout: float | None) -> tuple[str, str, str]:
    """Execute ``job`` into ``output``, its kernel's environment with ``env`` added;
    ``(status, error, failing cell)``."""
    import papermill as pm

    try:
        pm.execute_notebook(
            str(job.path), str(output), parameters=job.parameters, kernel_name=kernel_name,
            language="python", log_output=log_output, progress_bar=False, cwd=str(project_root()),
            execution_timeout=execution_timeout,
            kernel_manager_class=_kernel_manager_class(kernel_stderr, env), **_kernel_config(),
        )
    except pm.PapermillExecutionError as exc:
        if exc.ename in ("OSError", "OutputError") and _FULL.search(exc.evalue):
            raise outputs.kernel_output_error(exc.evalue, output.parent) from None
        return "failed", f"{exc.ename}: {exc.evalue}", _failing_cell(job.path, exc)
    except Exception as exc:  # dead kernel, timeout, unreadable notebook: keep going
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:   # a full disk ends the run
            raise outputs.OutputError(exc.filename or output, exc) from None
        where = f" (writing {output})" if isinstance(exc, OSError) and not exc.filename else ""
        return "failed", f"{type(exc).__name__}: {exc}{where}", ""
    return "ok", "", ""


def _promote_success(job: NotebookJob, result: NotebookResult, stage: Path,
                     summary: RunSummary) -> None:
    """Put a successful notebook's outputs in place together (and ``result.output``): its
    executed copy, stamped results, figures and manifest, and the summary that lists it; the
    copies of an earlier failure go."""
    plan = summary.plan
    out = plan.output_path(job.notebook)
    final_res, pending_res, failed_res = plan.results_paths(job.notebook)
    promotion = outputs.Promotion()
    payload = outputs.read_json(pending_res)
    if payload:
        payload.setdefault("meta", {})["finished"] = _now()
        promotion.write(final_res, json.dumps(payload, indent=1, default=str) + "\n")
    else:  # the notebook recorded nothing: its earlier results (if any) stay in effect
        result.results_from = results_run_id(final_res)
    tmp = stage / out.name
    if tmp.exists() and tmp.stat().st_size > 0:
        promotion.move(tmp, out)
        result.output = str(out)
    outputs.promote_figures(promotion, stage / "figures", figures_dir(plan.profile, plan.out_dir or None),
                            job.notebook)
    promotion.remove(out.with_name(job.notebook + FAILED_SUFFIX), failed_res)
    so_far = replace(summary, results=[*summary.results, result])
    promotion.write(summary_path(summary), summary_text(so_far, promoted={job.notebook: payload}))
    promotion.commit()


def _keep_failure(plan: RunPlan, job: NotebookJob, result: NotebookResult, tmp: Path,
                  run_id: str) -> NotebookResult:
    """A failed notebook's own copies, beside the good ones: its executed copy (when it is valid
    JSON: a copy truncated by a full disk is dropped) and the results it recorded; an older
    failure's copies go either way. Its staged figures are dropped."""
    final_res, pending_res, failed_res = plan.results_paths(job.notebook)
    failed_out = plan.output_path(job.notebook).with_name(job.notebook + FAILED_SUFFIX)
    failed_out.unlink(missing_ok=True)
    failed_res.unlink(missing_ok=True)
    try:
        if outputs.read_json(tmp):  # ({} when missing, empty or not JSON)
            promote(tmp, failed_out)
            result.output = str(failed_out)
        if outputs.read_json(pending_res):
            promote(pending_res, failed_res)
    except OSError:
        pass  # the failure's own copies are a courtesy: the good outputs stay either way
    finally:
        pending_res.unlink(missing_ok=True)
        outputs.discard_staging(plan.runs_dir, run_id)
    result.results = _fresh_results(failed_res, run_id)
    result.results_from = results_run_id(final_res)
    result.kept = final_res.exists()
    return result


def check_timeout(timeout: float | None) -> float | None:
    """A cell timeout must be a positive (finite) number of seconds (None: no limit)."""
    try:
        return Param(float, gt=0, nullable=True).check(timeout)
    except ValueError:
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout!r}") from None


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
        holder = outputs.read_json(info)
        who = (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
               f": {holder.get('command')}" if holder else "another process")
        raise UsageError(f"another bnmem run is writing to {root} ({who}); wait for it to end or "
                         "pass another --out") from None
    try:
        try:
            atomic_write_text(info, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                "started": _now(),
                                                "command": what or " ".join(sys.argv)}) + "\n")
        except OSError as exc:  # a full disk: one line naming the file
            raise outputs.OutputError(info, exc) from None
        yield
    finally:
        info.unlink(missing_ok=True)
        lock.release()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be, so that a terminated run ends as an interrupted
    one: finished notebooks kept, the summary written and printed."""


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` for the block (in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def reproduce(profile: str | os.PathLike = DEFAULT_PROFILE, *, only=None, overrides=None,
              device: str | None = None, out_dir: str | os.PathLike | None = None,
              log_output: bool = True, progress: bool = True, kernel_name: str = "python3",
              execution_timeout: float | None = None, dry_run: bool = False,
              publish: bool = False, allow_cpu: bool = False) -> RunSummary:
    """Validate, then execute the selected notebooks in order; write ``summary.json``.

    The figures go to the run's own ``runs/<profile>/figures/``; ``publish`` then replaces the
    published ``figures/<profile>/`` with them when every notebook succeeded and they hold figures
    of every notebook published there (never for a dry run). Either way, where both exist, the
    run's claims are compared with the published ones first (``summary.compare_published``).

    ``dry_run`` shrinks the profile (:func:`dry_run_values`) and writes under ``runs/dry-run/``;
    a real run checks its data sets' digests first, and a profile sized for a GPU goes on where
    ``--device auto`` finds none only with ``allow_cpu``. ``progress``: a live line while each
    notebook runs and one line when it ends, on stderr; ``log_output``: the notebooks' own
    output too, cell by cell.

    Every notebook runs even when an earlier one failed. On Ctrl-C (or SIGTERM, raised as
    :class:`Terminated`) the finished notebooks are kept, the current one's partial copy is
    removed, the summary is written and ``KeyboardInterrupt`` propagates (the caller prints
    :func:`summary_table` of ``exc.summary``).
    """
    from bnmem_utils.core.device import git_commit

    execution_timeout = check_timeout(execution_timeout)
    if publish and dry_run:
        raise UsageError("--publish with --dry-run: a dry run's numbers mean nothing, so it "
                         "never replaces the published figures; drop one of the two")
    plan = plan_run(profile, only=only, overrides=overrides, device=device, out_dir=out_dir,
                    dry_run=dry_run, verify_data=not dry_run, allow_cpu=allow_cpu)
    if warning := check_kernel(kernel_name):
        print(warning, file=sys.stderr)
    root = preflight.check_output_folder(plan.out_dir or None)
    preflight.check_cache_folder(plan.out_dir or None)
    for folder in (plan.runs_dir / "results", figures_dir(plan.profile, plan.out_dir or None)):
        preflight.check_writable(folder, f"output folder {folder}", create=False)  # before 01
    published = published_dir(plan.profile, plan.out_dir or None)
    with output_lock(root, what=f"bnmem reproduce --profile {plan.profile}"), _sigterm_interrupts():
        check_outputs(plan)
        if publish:
            check_publishable(plan, published)
        summary = _reproduce_locked(plan, git_commit(), log_output=log_output, progress=progress,
                                    kernel_name=kernel_name, execution_timeout=execution_timeout)
        compare_and_publish(summary, published, publish)
    return summary


def check_outputs(plan: RunPlan) -> None:
    """Before any work: a damaged results file of a notebook this run does not select is a
    :class:`UsageError` (one selected is only named: this run replaces it); a damaged or missing
    figures manifest is rebuilt (:func:`bnmem_utils.core.outputs.rebuild_manifest`), named in
    one line."""
    out, selected = plan.out_dir or None, {job.notebook for job in plan.jobs}
    damaged = damaged_results(plan.profile, out)
    for nb, problem in damaged.items():
        if nb not in selected:
            raise UsageError(f"{problem}; re-run its notebook ({plan.command(nb.split('_')[0])}) "
                             "or move the file away")
        print(f"bnmem: {problem}; this run replaces it", file=sys.stderr)
    _check_something_to_report(plan, selected)
    folder = figures_dir(plan.profile, out)
    problem = outputs.manifest_problem(folder)
    if problem:
        outputs.rebuild_manifest(folder, {nb: outputs.read_json(path) for nb, path in
                                          results_files(plan.profile, out).items() if nb not in damaged})
        print(f"bnmem: {problem}; rebuilt it from the figures there and the results files",
              file=sys.stderr)


def _check_something_to_report(plan: RunPlan, selected: set[str]) -> None:
    """A report notebook (one that declares ``report_profile``) run alone needs another
    notebook's results to read: with none, :class:`UsageError` naming what to run first, before
    a kernel starts (an empty claims table never replaces a full one)."""
    for job in plan.jobs:
        if "report_profile" not in job.parameters or selected - {job.notebook}:
            continue
        source = job.parameters["report_profile"] or plan.profile
        if not set(results_files(source, plan.out_dir or None)) - {job.notebook}:
            raise UsageError(f"--only {job.notebook.split('_')[0]}: nothing to report for profile "
                             f"{source}, which has no results of another notebook; run `bnmem "
                             f"reproduce --profile {source}` first")


def _reproduce_locked(plan: RunPlan, commit: str, *, log_output: bool, progress: bool,
                      kernel_name: str, execution_timeout: float | None) -> RunSummary:
    summary = RunSummary(plan, [], _now(), run_id=new_run_id(), commit=commit,
                         previous=previous_wall_times(plan))
    cleanup_partials(plan.runs_dir)
    current, job_start = None, time.perf_counter()
    try:
        with _notebook_log(log_output):
            for i, job in enumerate(plan.jobs, 1):
                current, job_start = job, time.perf_counter()
                label = f"[{i}/{len(plan.jobs)}] {job.notebook}"
                result = execute_job(summary, job, kernel_name=kernel_name, log_output=log_output,
                                     live=label if progress else "",
                                     execution_timeout=execution_timeout)
                summary.results.append(result)
                current = None
                if progress:
                    _say_done(label, result)
    except KeyboardInterrupt as exc:
        summary.interrupted = True
        if getattr(exc, "result", None) is not None:  # it came while its outputs were promoted
            summary.results.append(exc.result)  # type: ignore[attr-defined]
        elif current is not None:
            wall = round(time.perf_counter() - job_start, 2)
            final = plan.results_paths(current.notebook)[0]
            summary.results.append(NotebookResult(
                current.notebook, "interrupted", wall, "", type(exc).__name__,
                results_from=results_run_id(final), kept=final.exists()))
        exc.summary = summary  # type: ignore[attr-defined]
        _finish(summary, write=any(r.ok for r in summary.results), strict=False)
        raise
    except outputs.OutputError:
        _finish(summary, write=False, strict=False)  # the promotions wrote summary.json
        raise
    _finish(summary, write=True, strict=True)
    return summary


def _say_done(label: str, result: NotebookResult) -> None:
    """The line a notebook leaves when it ends: its status and wall time; a failure's error and
    the executed copy that holds its traceback."""
    line = f"{label}  {result.status}  {duration(result.wall_s)}"
    if not result.ok:
        line += f"  {result.error}" + (f"\n    executed copy: {result.output}" if result.output
                                       else "")
    say(line)


def _finish(summary: RunSummary, *, write: bool, strict: bool) -> None:
    """When ``write``, write the run's summary
    (:func:`write_summary`). An interrupted run that put nothing in place writes none (it leaves
    nothing of its own), nor does a run ended by an output error (each promotion wrote
    ``summary.json`` with its outputs). A summary that cannot be written is an
    :class:`~bnmem_utils.core.outputs.OutputError` when ``strict``, else a warning."""
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


def cleanup_partials(folder: str | os.PathLike) -> None:
    """Remove what a killed run (SIGKILL, power loss) left: its staging folder and the partial
    executed copies of older versions."""
    outputs.discard_staging(Path(folder))
    for pattern in (f".*{_PARTIAL_SUFFIX}", f".*{_KERNEL_STDERR_SUFFIX}"):
        for path in Path(folder).glob(pattern):
            path.unlink(missing_ok=True)
