"""The README's two commands on a fresh clone, recorded: what the quickstart's times come from.

``.ci/run`` runs the README's quickstart as a reader would, from a clean checkout. With
``BNMEM_CI_RECORD=PATH`` it also writes what that run measured, through :func:`main`: each
stage's wall time and exit status, whether the cache was empty and the tree clean after each
command, every notebook's time (``runs/quick/summary.json``), how the run's verdicts compare
with the published ones (:func:`bnmem_utils.run.summary.compare_published`), pytest's own
summary line, the machine and the commit. The developers commit a fresh clone's record as
``docs/fresh_clone.json`` (:data:`bnmem_utils.run.docs.FRESH_CLONE`); the README's sentence
about the quickstart's times is generated from it (``<!-- generated:fresh-clone -->``,
:func:`bnmem_utils.run.docs.fresh_clone_sentence`), so it names the commit it was measured on
and cannot drift from it.

    BNMEM_CI_RECORD=/tmp/fresh_clone.json .ci/run      # then copy it to docs/fresh_clone.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

from bnmem_utils.core.paths import figures_dir, project_root, published_dir, runs_dir
from bnmem_utils.run.docs import FRESH_CLONE, fresh_clone_sentence
from bnmem_utils.run.summary import compare_published

PROFILE = "quick"
_PYTEST = re.compile(r"=+ (?P<counts>\d+ (?:passed|failed)[^=]*?) in [\d.]+s(?: \([^)]*\))? =+")


def _cpu() -> str:
    """``N logical CPUs, MODEL`` of this machine (the model from /proc/cpuinfo where there is
    one)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} logical CPUs, {model}"


def pytest_counts(log: str) -> str:
    """pytest's closing counts (``1247 passed, 3 skipped, 1 xpassed``) from its output, or ""."""
    hits = _PYTEST.findall(log.replace("\r", "\n"))
    return hits[-1].strip() if hits else ""


def record(*, stages: dict[str, dict], cmd2_log: str, cache_files_before: int, load: str,
           commit: str, root: Path | None = None) -> dict:
    """The record of a fresh clone's run, from ``root`` (the clone) after both commands.

    ``stages``: ``{"install"|"command 1"|"command 2": {"seconds", "rc", "clean"}}`` as
    ``.ci/run`` timed them; ``cmd2_log``: command 2's output; ``cache_files_before``: files in
    the cache before command 1 (0: every model trained); ``load``: /proc/loadavg at the start."""
    root = root or project_root()
    summary_file = runs_dir(PROFILE, root) / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    notebooks = {n["notebook"]: round(float(n["wall_s"]), 1)
                 for n in summary.get("notebooks", []) if n.get("status") == "ok"}
    comparison = compare_published(figures_dir(PROFILE, root), published_dir(PROFILE, root))
    return {"commit": commit, "recorded": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": _cpu(), "load_at_start": load, "python": platform.python_version(),
            "torch": torch.__version__, "stages": stages, "cache_files_before": cache_files_before,
            "notebooks": notebooks, "comparison": comparison.splitlines()[0].split(": ", 1)[-1],
            "pytest": pytest_counts(cmd2_log)}


def main(argv: list[str] | None = None) -> int:
    """``.ci/run``'s recorder: ``--out PATH`` and the stages as ``NAME=SECONDS:RC:CLEAN``."""
    p = argparse.ArgumentParser(prog="python -m bnmem_utils.run.fresh_clone",
                                description="Write the record of a fresh clone's .ci/run.")
    p.add_argument("--out", required=True, help="where to write the record (JSON)")
    p.add_argument("--stage", action="append", default=[], metavar="NAME=SECONDS:RC:CLEAN")
    p.add_argument("--cmd2-log", required=True, help="command 2's output")
    p.add_argument("--cache-files-before", type=int, required=True)
    p.add_argument("--load", default="", help="/proc/loadavg at the start")
    p.add_argument("--commit", required=True)
    args = p.parse_args(argv)
    stages = {}
    for item in args.stage:
        name, _, values = item.partition("=")
        seconds, rc, clean = values.split(":")
        stages[name] = {"seconds": float(seconds), "rc": int(rc), "clean": clean == "clean"}
    rec = record(stages=stages, cmd2_log=Path(args.cmd2_log).read_text(errors="replace"),
                 cache_files_before=args.cache_files_before, load=args.load, commit=args.commit)
    Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")
    print(f"[ci] recorded the run in {args.out} (commit it as {FRESH_CLONE}): "
          f"{fresh_clone_sentence(rec)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
