"""Wall time of each notebook under a profile, through the runner, into a temporary folder.

    .venv/bin/python benchmarks/bench_notebooks.py                      # quick profile, all six
    .venv/bin/python benchmarks/bench_notebooks.py --only 04 --warm     # one notebook, twice
    .venv/bin/python benchmarks/bench_notebooks.py --profile smoke      # the CI wiring check

Runs :func:`bnmem_utils.run.runner.reproduce` with a fresh output folder and a fresh model cache
(``BNMEM_CACHE`` points into it), so every model is trained: the cold time a first run of the
profile costs. ``--warm`` runs the same notebooks again on the filled cache (what a re-run
costs). Prints a table of status and seconds per notebook, the total, and the machine; exits
non-zero if a notebook failed. The quick profile takes minutes per notebook on 2 CPU cores: run
it on an otherwise idle machine, the timings are only as quiet as the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch


def load() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    from bnmem_utils.run.runner import reproduce

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="quick", help="profile name or YAML file")
    ap.add_argument("--only", default=None, help="notebooks by number or name, e.g. 01,04")
    ap.add_argument("--device", default=None, help="device for every notebook (default: profile's)")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="override a parameter, key=value (repeatable)")
    ap.add_argument("--warm", action="store_true", help="run again on the filled model cache")
    ap.add_argument("--keep", action="store_true", help="keep the output folder (printed)")
    args = ap.parse_args(argv)

    out = Path(tempfile.mkdtemp(prefix="bnmem_bench_"))
    old_cache = os.environ.get("BNMEM_CACHE")
    os.environ["BNMEM_CACHE"] = str(out / "cache")           # cold: nothing cached yet
    print(f"bench_notebooks: profile {args.profile}, only {args.only or 'all'}, output {out}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
          f"torch {torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'}; "
          f"load average at start {load()}", flush=True)
    runs = {}
    try:
        for label in (["cold", "warm"] if args.warm else ["cold"]):
            t0 = time.perf_counter()
            summary = reproduce(args.profile, only=args.only, overrides=args.overrides,
                                device=args.device, out_dir=out, log_output=False,
                                progress=False)
            runs[label] = (summary, time.perf_counter() - t0)
    finally:
        if old_cache is None:
            os.environ.pop("BNMEM_CACHE", None)
        else:
            os.environ["BNMEM_CACHE"] = old_cache
    print(f"load average at end {load()}")
    labels = list(runs)
    head = f"{'notebook':<26} {'status':<8} " + " ".join(f"{lab + ' s':>9}" for lab in labels)
    print(head)
    print("-" * len(head))
    failed = False
    first = runs[labels[0]][0]
    for i, res in enumerate(first.results):
        walls = [runs[lab][0].results[i].wall_s for lab in labels]
        status = "/".join(sorted({runs[lab][0].results[i].status for lab in labels}))
        failed |= status != "ok"
        print(f"{res.notebook:<26} {status:<8} " + " ".join(f"{w:9.1f}" for w in walls))
        if res.status != "ok":
            print(f"    {res.error} in {res.cell}")
    print(f"{'total (incl. start-up)':<26} {'':<8} "
          + " ".join(f"{runs[lab][1]:9.1f}" for lab in labels))
    if args.keep:
        print(f"outputs kept in {out}")
    else:
        shutil.rmtree(out, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
