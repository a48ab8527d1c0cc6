"""What a headless run did: each notebook's outcome, the run's summary file and closing table.

:class:`RunSummary` holds every :class:`NotebookResult` of one
:func:`bnmem_utils.run.runner.reproduce` call; :func:`write_summary` writes
``runs/<profile>/summary.json`` (or ``summary.failed.json`` for a run that put nothing in place)
with, for each notebook, the run its results in effect come from (:func:`results_provenance`);
:func:`summary_table` is the table the command line closes with.
"""

from __future__ import annotations

import csv
import json
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bnmem_utils.core import outputs
from bnmem_utils.core.cache import atomic_path, atomic_write_text
from bnmem_utils.core.paths import figures_dir, published_dir, runs_dir
from bnmem_utils.run.params import UsageError
from bnmem_utils.run.preflight import check_writable

if TYPE_CHECKING:
    from bnmem_utils.run.plan import RunPlan

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
    notes: list[str] = field(default_factory=list)  # the comparison with the published run, ...
    previous: dict[str, float] = field(default_factory=dict)  # seconds each notebook last took

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
            "source": self.plan.source,
            "command": self.plan.command(),
            "device": self.plan.device,
            "out_dir": self.plan.out_dir,
            "overrides": self.plan.overrides,
            "data": self.plan.data,
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


def results_run_id(path: Path) -> str:
    payload = outputs.read_json(path)
    return str(payload.get("meta", {}).get("run_id") or "unknown") if payload else ""


def results_problem(path: Path) -> str:
    """Why ``path`` is no sound results file (``""`` when it is one): unreadable, not JSON, or
    not an object of ``meta`` and ``results`` objects (each result an object)."""
    try:
        payload = json.loads(path.read_text())
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except ValueError as exc:
        return f"is not valid JSON ({exc})"
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, dict) or not isinstance(payload.get("meta", {}), dict):
        return "is not a results file (a JSON object of 'meta' and 'results' objects)"
    for key, e in results.items():
        if not (isinstance(e, dict) and isinstance(e.get("fields", {}), dict) and all(
                isinstance(e.get(k), int | float | None) for k in ("lo", "hi", "n"))):
            return (f"holds a damaged result {key!r} (an object whose fields are an object and "
                    "lo, hi and n numbers)")
    return ""


def results_files(profile: str, out_dir=None) -> dict[str, Path]:
    """``{notebook: path}`` of the results files in effect of ``profile`` (not the pending or
    failed runs' ``NN_name.pending.json``, ``NN_name.failed.json``)."""
    folder = runs_dir(profile, out_dir) / "results"
    return {p.stem: p for p in sorted(folder.glob("*.json")) if "." not in p.stem}


def damaged_results(profile: str, out_dir=None) -> dict[str, str]:
    """``{notebook: "results file PATH is not ..."}`` for each damaged results file in effect."""
    return {nb: f"results file {path} {problem}" for nb, path in results_files(profile, out_dir).items()
            if (problem := results_problem(path))}


def results_provenance(profile: str, out_dir=None, *, run_id: str = "",
                       failed: Iterable[str] = ()) -> dict[str, dict]:
    """For each results file of ``profile``: the run id, commit and times of the run that wrote
    it, and where it comes from: ``this run`` (``run_id``), ``kept from an earlier run`` (this
    run failed or interrupted that notebook: ``failed``), ``an earlier run`` (not run now), or
    ``damaged: ...`` (the file cannot be read as results)."""
    failed, damaged = set(failed), damaged_results(profile, out_dir)
    out = {}
    for nb, path in results_files(profile, out_dir).items():
        meta = {} if nb in damaged else outputs.read_json(path).get("meta", {})
        rid = str(meta.get("run_id") or "")
        out[nb] = _provenance(meta, rid, f"damaged: {damaged[nb]}" if nb in damaged
                              else "this run" if run_id and rid == run_id
                              else "kept from an earlier run" if nb in failed
                              else "an earlier run" if run_id else (rid or "interactive"))
    return out


def _provenance(meta: dict, run_id: str, source: str) -> dict:
    """One entry of ``results_in_effect``: the run (``run_id``) and the ``meta`` of its results
    file, and where they come from."""
    return {"run_id": run_id, "commit": meta.get("commit", ""), "started": meta.get("started", ""),
            "finished": meta.get("finished", ""), "from": source}


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
            effect[nb] = _provenance(results.get("meta", {}), summary.run_id, "this run")
    payload["results_in_effect"] = dict(sorted(effect.items()))
    return json.dumps(payload, indent=1, default=str) + "\n"


def write_summary(summary: RunSummary) -> Path:
    """Write the run's summary atomically; return its path.

    A run that put at least one notebook's outputs in place writes ``summary.json`` (and drops
    the ``summary.failed.json`` of an earlier run); a run that put none (every notebook failed
    or was interrupted) leaves ``summary.json``, which still describes every output in place,
    and writes its own as ``summary.failed.json``. :class:`~bnmem_utils.core.outputs.OutputError`
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


def summary_table(summary: RunSummary, *, keys: int = 3, width: int = 70) -> str:
    """The closing table: notebook, status, wall time, a few key numbers; then each failure with
    its failing cell and the path of the executed copy that holds the traceback."""
    rows = [("notebook", "status", "wall", "key numbers")]
    for r in summary.results:
        numbers = "; ".join(f"{k}={v}" for k, v in list(r.results.items())[:keys])
        if not numbers and r.ok:
            numbers = "(no results recorded)"
        rows.append((r.notebook, r.status, f"{r.wall_s:.1f}s", outputs.truncate(numbers, width)))
    lines = outputs.aligned(rows)
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
    return "\n".join(lines + [f"{label + ':':19s} {text}" for label, text in _where(summary)])


def _where(summary: RunSummary) -> list[tuple[str, str]]:
    """The closing lines' ``(label, text)``: the executed notebooks, figures and summary where
    they are (``none`` where this run put none in place and no earlier run left one), and the
    report command where it has results to read, else the command that runs the folder again."""
    plan = summary.plan
    out_dir, none = plan.out_dir or None, "none (this run put none in place)"
    figures = figures_dir(plan.profile, out_dir)
    if summary.summary_file:
        written = summary.summary_file
    elif summary_path(summary).is_file():
        written = f"{summary_path(summary)} (kept: this run put nothing in place)"
    else:
        written = "none written (this run put nothing in place)"
    out = f" --out {shlex.quote(plan.out_dir)}" if plan.out_dir else ""
    report = (f"bnmem report --profile {plan.profile}{out}" if results_files(plan.profile, out_dir)
              else f"none: no results in place; run it again with `{plan.command()}`")
    return [("executed notebooks", str(plan.runs_dir) if any(plan.runs_dir.glob("*.ipynb"))
             else none),
            ("figures", str(figures) if figures.is_dir() else none),
            ("summary", written), ("report", report)]


#: The claims table of a run's figures folder (notebook 06 writes it).
FOREST = "06_claims_forest.csv"


def read_forest(folder: Path) -> tuple[dict, ...]:
    """The rows of the claims forest in a figures folder (empty when it is not there)."""
    path = folder / FOREST
    if not path.is_file():
        return ()
    with open(path, newline="") as f:
        return tuple(csv.DictReader(f))


def verdict_changes(new: Iterable[dict], old: Iterable[dict]) -> tuple[list[tuple], int]:
    """The claims rows of two runs paired by claim and setting: ``([(new row, old row), ...],
    how many rows only one run has)``."""
    new, keyed = list(new), {(r["id"], r["setting"]): r for r in old}
    pairs = [(r, keyed[r["id"], r["setting"]]) for r in new if (r["id"], r["setting"]) in keyed]
    return pairs, len(new) + len(keyed) - 2 * len(pairs)


#: The columns of a changes file (``figures/changes/<name>.csv``, :func:`record_changes`).
CHANGE_COLUMNS = ("profile", "id", "setting", "primary", "before", "before_verdict", "after",
                  "after_verdict")


def changes_problem(path: Path) -> str:
    """Why the existing file at ``path`` is no changes file that :func:`record_changes` can add
    to (``""`` when it is one, or is not there): unreadable, not text, or not a CSV of
    :data:`CHANGE_COLUMNS`."""
    if not path.exists():
        return ""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
            sum(1 for _ in csv.reader(f))
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    except (UnicodeDecodeError, csv.Error) as exc:
        return f"it is not a CSV text file ({type(exc).__name__})"
    if sorted(header) != sorted(CHANGE_COLUMNS):
        columns = " ".join(", ".join(header).split()) or "none"     # one line, whatever it holds
        return f"its columns are {outputs.truncate(columns, 80)}"
    return ""


def record_changes(run: Path, published: Path, profile: str, path: Path) -> int:
    """Write the rows whose verdict moved between the published claims and a run's to the CSV
    ``path`` (its rows of other profiles kept; this profile's replaced): what the docs' table
    of a change of method reads. Returns how many moved."""
    pairs, _ = verdict_changes(read_forest(run), read_forest(published))
    moved = [{"profile": profile, "id": r["id"], "setting": r["setting"],
              "primary": r.get("primary", ""), "before": old["ours"],
              "before_verdict": old["verdict"], "after": r["ours"], "after_verdict": r["verdict"]}
             for r, old in pairs if r["verdict"] != old["verdict"]]
    kept = []
    if path.is_file():
        with open(path, newline="") as f:
            kept = [r for r in csv.DictReader(f) if r["profile"] != profile]
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, CHANGE_COLUMNS)
        writer.writeheader()
        writer.writerows(kept + moved)
    return len(moved)


def _only_in(rows: Iterable[dict], other: Iterable[dict], words: str) -> str:
    """The rows of ``rows`` that ``other`` lacks, counted by claim (``"C3e 6, C3h 3 only in
    <words>"``; empty when there are none), secondary rows said apart."""
    have = {(r["id"], r["setting"]) for r in other}
    extra = [r for r in rows if (r["id"], r["setting"]) not in have]
    if not extra:
        return ""
    counts = Counter(r["id"] + (" (secondary)" if r.get("primary") != "True" else "")
                     for r in extra)
    return ", ".join(f"{k} {n}" for k, n in counts.items()) + f" only in {words}"


def compare_published(run: Path, published: Path) -> str:
    """How a run's claims (its figures folder ``run``) compare with the published ones: how
    many verdicts match, each row that moved with both numbers, and whether a primary row
    moved (``bnmem report --compare-published``, and the end of every run)."""
    mine, theirs = read_forest(run), read_forest(published)
    if not mine or not theirs:
        missing = run if not mine else published
        return f"compared with the published run: nothing to compare ({missing / FOREST} is not there)"
    common, unmatched = verdict_changes(mine, theirs)
    moved = [(r, old) for r, old in common if r["verdict"] != old["verdict"]]
    renumbered = sum(r["ours"] != old["ours"] for r, old in common)
    lines = [f"compared with the published run ({published}): {len(common) - len(moved)} of "
             f"{len(common)} verdicts match; {renumbered} rows print other numbers"]
    if renumbered:
        lines.append("  (numbers move with the code, and on another kind of CPU or torch build, "
                     "whose last bits carry on like a reseed: verdicts are what to compare)")
    for r, old in moved:
        flag = "PRIMARY " if r.get("primary") == "True" else ""
        lines.append(f"  {flag}{r['id']} {r['setting']}: {old['ours']} {old['verdict']} -> "
                     f"{r['ours']} {r['verdict']}")
    if unmatched:
        sides = [_only_in(mine, theirs, "this run's"), _only_in(theirs, mine, "the published")]
        lines.append(f"  {unmatched} rows are in only one of the two runs: "
                     + "; ".join(side for side in sides if side))
    primary = sum(r.get("primary") == "True" for r, _ in moved)
    lines.append(f"  a PRIMARY verdict moved: {primary} row(s), flagged above" if primary
                 else "  no primary verdict moved")
    return "\n".join(lines)


#: In a published folder: how long each notebook took on a recorded run of the profile, with
#: that run's commit and start (``{"notebooks": {notebook: {"wall_s", "commit", "started"}}}``),
#: written by ``--publish``; what a first run's live line estimates its time to go from.
WALL_TIMES = "wall_times.json"


def previous_wall_times(plan: RunPlan) -> dict[str, float]:
    """``{notebook: seconds}`` of the last run of the plan's folders that ran it to the end
    (``summary.json``), else of the published run (:data:`WALL_TIMES`, on whatever machine
    published it): what the live line's time to go is read from."""
    notebooks = outputs.read_json(runs_dir(plan.profile, plan.out_dir or None) / "summary.json"
                                  ).get("notebooks") or []
    own = {n["notebook"]: float(n["wall_s"]) for n in notebooks
           if isinstance(n, dict) and n.get("status") == "ok" and n.get("wall_s")}
    published = outputs.read_json(published_dir(plan.profile, plan.out_dir or None) / WALL_TIMES
                                  ).get("notebooks") or {}
    seconds = {name: entry.get("wall_s") for name, entry in published.items()
               if isinstance(entry, dict)}
    return {**{name: float(s) for name, s in seconds.items()
               if isinstance(s, int | float) and s > 0}, **own}


def wall_times_text(summary: RunSummary, published: Path) -> str:
    """:data:`WALL_TIMES` for ``published`` once ``summary``'s run is published: its notebooks'
    times, and the earlier entries of notebooks it did not run (``--only``)."""
    entries = outputs.read_json(published / WALL_TIMES).get("notebooks") or {}
    entries = {k: v for k, v in entries.items() if isinstance(v, dict)}
    entries.update({r.notebook: {"wall_s": round(r.wall_s, 1), "commit": summary.commit,
                                 "started": summary.started} for r in summary.results if r.ok})
    return json.dumps({"notebooks": dict(sorted(entries.items()))}, indent=1) + "\n"


def figure_notebooks(folder: Path) -> set[str]:
    """The notebooks whose figures the manifest of ``folder`` lists."""
    return {str(e["notebook"]) for e in outputs.read_manifest(folder).values() if e.get("notebook")}


def dropped_by_publishing(run_figures: Path, published: Path,
                          also: Iterable[str] = ()) -> list[str]:
    """The notebooks whose figures are published in ``published`` but that ``run_figures`` (with
    the notebooks ``also``, about to run) has none of: publishing it would delete them."""
    return sorted(figure_notebooks(published) - figure_notebooks(run_figures) - set(also))


def check_publishable(plan: RunPlan, published: Path) -> None:
    """Before any work, for ``--publish``: the published folder's parent must be writable, and
    once the selected notebooks have run, the run's figures folder must hold figures of every
    notebook with published figures (the published folder is replaced whole, so ``--only`` on a
    folder without them would delete them); else :class:`UsageError` naming them and the
    command that makes them."""
    check_writable(published.parent, f"--publish into {published}")
    run = figures_dir(plan.profile, plan.out_dir or None)
    dropped = dropped_by_publishing(run, published, [job.notebook for job in plan.jobs])
    if dropped:
        only = ",".join(nb.split("_")[0] for nb in dropped)
        raise UsageError(f"--publish would delete the published figures of {', '.join(dropped)} "
                         f"from {published}: {run} has none of them; add them to --only or run "
                         f"them first ({plan.command(only)})")


def compare_and_publish(summary: RunSummary, published: Path, publish: bool) -> None:
    """Note in ``summary.notes`` how the run's claims compare with the repository's published
    ones (its ``figures/<profile>/``, what the docs quote, wherever the run's outputs went);
    with ``publish`` and every notebook ok, replace the figures of ``published`` with the run's,
    unless that would drop a notebook's published figures that the run's folder lacks
    (:func:`dropped_by_publishing`: a run's folder holding only part of the profile)."""
    plan = summary.plan
    run_figures = figures_dir(plan.profile, plan.out_dir or None)
    if not plan.dry_run:
        summary.notes.append(compare_published(run_figures, published_dir(plan.profile)))
    if not publish:
        return
    dropped = dropped_by_publishing(run_figures, published)
    if summary.exit_code != 0:
        summary.notes.append(f"not published: a notebook did not succeed; {published} is as "
                             "it was")
    elif dropped:
        summary.notes.append(f"not published: {run_figures} has no figures of "
                             f"{', '.join(dropped)}, whose published figures it would delete; "
                             f"{published} is as it was")
    else:
        count = outputs.publish_folder(run_figures, published,
                                       {WALL_TIMES: wall_times_text(summary, published)})
        summary.notes.append(f"published: {count} files of {run_figures} to {published}")
