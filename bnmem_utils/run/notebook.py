"""The context a notebook opens in its first code cell after the parameters.

    nb = bnmem_utils.start("01_theory", globals())

reads the notebook's parameter names from its ``parameters`` cell, takes their current values
(papermill's overrides included), applies the chosen profile to the parameters still at their
defaults (see :func:`apply_profile`), resolves the device, seeds everything, applies the plotting
style, prints the environment report and opens the results file. ``nb.save_figure`` and
``nb.record`` then write under ``runs/<profile>/figures/`` and ``runs/<profile>/results/`` (under the
runner: aside, promoted by the runner when the notebook succeeds; see :mod:`bnmem_utils.core.outputs`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from bnmem_utils.analyses import report
from bnmem_utils.core import threads
from bnmem_utils.core.device import environment_report, git_commit, resolve_device, seed_everything
from bnmem_utils.core.outputs import aligned, text_html
from bnmem_utils.core.paths import cache_dir, figures_dir, notebooks_dir
from bnmem_utils.core.results import DATA_ENV, Result, ResultsFile, key_numbers, results_path
from bnmem_utils.figures import plotting
from bnmem_utils.run.params import check_parameters, check_relations, notebook_parameters
from bnmem_utils.run.progress import install as install_progress

#: The folder, under ``runs/<profile>/``, of a notebook run outside the runner.
INTERACTIVE = "interactive"


def _now() -> str:
    """The time, to the second, in UTC: what labels an interactive run."""
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


class NotebookContext:
    """Provenance and output locations of one notebook run."""

    def __init__(self, notebook: str, params: dict, *, verbose: bool = True):
        self.notebook = notebook
        self.params = dict(params)
        self.profile: str = str(self.params.get("profile", "quick"))
        self.out_dir: str | None = self.params.get("out_dir") or None
        self.device: torch.device = resolve_device(self.params.get("device", "auto"))
        self.seed: int = int(self.params.get("seed", 0))
        # Under the runner: its run id and the commit it read once at the start of the run.
        self.run_id: str = os.environ.get("BNMEM_RUN_ID", "")
        self.commit = os.environ.get("BNMEM_COMMIT") or git_commit()
        # Outside the runner (JupyterLab, plain papermill) results and figures go to a folder of
        # their own, runs/<profile>/interactive/, so that they never pass for the headless run.
        self.folder: str = self.profile if self.run_id else f"{self.profile}/{INTERACTIVE}"
        self.data: dict = json.loads(os.environ.get(DATA_ENV) or "{}")   # {data set: digest}
        self.figures_dir: Path = figures_dir(self.folder, self.out_dir)
        # Under the runner figures are written aside, to the run's staging folder, and put in
        # figures_dir with the results when the notebook succeeds (bnmem_utils.core.outputs).
        staging = os.environ.get("BNMEM_STAGING", "") if self.run_id else ""
        self.figures_out: Path = Path(staging) / "figures" if staging else self.figures_dir
        self.cache_dir: Path = cache_dir(self.out_dir)
        seed_everything(self.seed)
        plotting.set_style()
        plotting.wrap_tables()   # every DataFrame shown fits the notebook's width
        # The runner promotes the pending file on success (bnmem_utils.core.results explains both).
        self.results = ResultsFile(
            results_path(self.folder, notebook, self.out_dir, "pending" if self.run_id else ""),
            meta={"notebook": notebook, "profile": self.profile, "commit": self.commit,
                  "run_id": self.run_id or f"{INTERACTIVE}-{_now()}",
                  "device": str(self.device), "parameters": self._public_params(),
                  **({"data": self.data} if self.data else {})},
            lazy=not self.run_id,
        )
        if verbose:
            lines = aligned(list(environment_report(self.device).items()))
            if note := threads.not_in_force_note():   # a Jupyter not started by `bnmem lab`
                lines.append(note)
            lines += [f"notebook  {notebook}", f"profile   {self.profile}",
                      f"figures   {self.figures_dir}",
                      *(f"data      {k}: {v}" for k, v in sorted(self.data.items()))]
            if self.throwaway_note:
                lines += ["", f"*** {self.throwaway_note} ***"]
            self.say("\n".join(lines))

    @staticmethod
    def say(*parts, sep: str = " ") -> None:
        """``print`` for a notebook: the text as written in a terminal or a log, and in a
        notebook a block that wraps only at spaces, so a number never splits over two lines
        (JupyterLab breaks printed text anywhere)."""
        from IPython import get_ipython
        from IPython.display import display

        text = sep.join(map(str, parts))
        if getattr(get_ipython(), "kernel", None) is None:
            print(text)
        else:
            display({"text/plain": text, "text/html": text_html(text, cls="bnmem-text")}, raw=True)

    @property
    def throwaway_note(self) -> str:
        """A warning that this run's numbers mean nothing (the smoke profile and dry runs only
        prove the wiring), else ``""``."""
        if self.profile.split("-")[0] == "smoke":  # smoke, or a run of it with --set
            return ("profile smoke: a wiring check with tiny models and banks; its numbers mean "
                    "nothing")
        if "-dry-" in self.profile or (self.out_dir and Path(self.out_dir).name == "dry-run"):
            return "a dry run: one epoch on a few dozen samples; its numbers mean nothing"
        return ""

    @property
    def results_file(self) -> Path:
        """Where this notebook's results end up: ``runs/<profile>/results/<notebook>.json``
        (under the runner they are written to a pending file first and moved there when the
        notebook succeeds)."""
        return results_path(self.folder, self.notebook, self.out_dir)

    def _public_params(self) -> dict:
        return {k: v for k, v in self.params.items() if k != "out_dir"}

    def save_figure(self, fig, name: str, data=None, description: str = "") -> dict:
        """Save ``fig`` as ``<NN>_<name>`` (PDF, PNG, CSV of ``data``; ``fig`` None: the CSV
        alone) with a manifest entry holding ``description``, one sentence saying what it shows
        (the exports' caption)."""
        prefix = self.notebook.split("_", 1)[0]
        return plotting.save_figure(
            fig, f"{prefix}_{name}", data, folder=self.figures_out, notebook=self.notebook,
            profile=self.profile, parameters=self._public_params(), commit=self.commit,
            description=description, data_sets=self.data)

    def record(self, what: Result | str, value, **kw) -> dict:
        """Record one key number: what it measures as a :class:`~bnmem_utils.core.results.Result`
        (a plain string: a metric name), its value (see
        :meth:`bnmem_utils.core.results.ResultsFile.record`)."""
        return self.results.record(what, value, **kw)

    def record_all(self, records) -> int:
        """Record every ``(result, value, extras)`` of a package function that computes a
        notebook's key numbers (e.g. :func:`bnmem_utils.analyses.memorization.result_records`); return
        how many."""
        for what, value, extras in records:
            self.record(what, value, **extras)
        return len(records)

    def key_numbers(self, *patterns: str):
        """The numbers recorded so far whose keys match the glob ``patterns``, with their
        intervals and descriptions (:func:`bnmem_utils.core.results.key_numbers`)."""
        return key_numbers(self.results.values, *patterns)

    def claims(self):
        """This notebook's claims judged from the numbers it recorded so far, by the claims
        table's one judge: a :class:`bnmem_utils.analyses.report.ClaimsView` (the claims table's own
        HTML, cells whole; ``.frame`` is the DataFrame), warning when the numbers mean nothing."""
        rows = report.notebook_rows(self.notebook, self.results.values, self.figures_out)
        return report.ClaimsView(rows, note=self.throwaway_note)


def start(notebook: str, namespace: dict, *, verbose: bool = True) -> NotebookContext:
    """Open the context of ``notebook`` with the values its parameters have in ``namespace``."""
    path = notebooks_dir() / f"{notebook}.ipynb"
    if not path.exists():
        valid = sorted(p.stem for p in notebooks_dir().glob("[0-9][0-9]*_*.ipynb"))
        raise ValueError(f"unknown notebook {notebook!r}; valid choices: {', '.join(valid)}")
    install_progress()  # under the runner: the bars report to its live line, no widgets
    names = notebook_parameters(path)
    params = {name: namespace.get(name, default) for name, default in names.items()}
    if not in_papermill():  # the runner has already merged profile, --set and defaults
        changed = apply_profile(params, names)
        namespace.update(changed)
        if verbose and changed:
            shown = ", ".join(f"{k}={v!r}" for k, v in changed.items() if k != "profile")
            print(f"profile {params['profile']}: {len(changed) - ('profile' in changed)} "
                  f"parameter(s) taken from the profile: {shown or '(none)'}")
    # The constraints the runner checks up front (bnmem_utils.run.params.SPEC), checked here too so a
    # hand-edited value gets the same one-line message.
    params = check_parameters(params, where=f" of {notebook}")
    check_relations(params, where=f" of {notebook}")
    return NotebookContext(notebook, params, verbose=verbose)


def apply_profile(params: dict, defaults: dict) -> dict:
    """Give ``params`` the values of the profile ``params["profile"]`` names; return the changes.

    Used when a notebook runs outside the runner (JupyterLab, or papermill with ``-p profile
    smoke`` alone): setting ``profile = "smoke"`` (or the path of a YAML file) in the parameters
    cell then gives that profile's values, read by the runner's own
    :func:`bnmem_utils.run.plan.load_profile`. A parameter whose value differs from its default
    in the parameters cell (edited there, or injected by papermill) keeps that value: explicit
    values win, as ``--set`` does over a profile. ``params["profile"]`` becomes the profile's
    name (a file's stem), which names the output folders. ``params`` is updated in place.
    """
    from bnmem_utils.run.plan import check_value, load_profile

    if "profile" not in params:
        return {}
    name, values = load_profile(params["profile"])
    changed: dict = {}
    if params["profile"] != name:
        changed["profile"] = name
    for key, value in values.items():
        if key == "profile" or key not in defaults:
            continue  # a key of another notebook
        if _same(params.get(key), defaults[key]):
            value = check_value(key, value, defaults[key], source=f"profile {name}")
            if not _same(value, params.get(key)):
                changed[key] = value
    params.update(changed)
    return changed


def _same(a, b) -> bool:
    """Equal values of the same kind (``1 == 1.0 == True`` is not enough for a parameter)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def in_papermill() -> bool:
    """True when running headless under the bnmem runner (widgets are skipped there)."""
    return os.environ.get("BNMEM_HEADLESS") == "1"
