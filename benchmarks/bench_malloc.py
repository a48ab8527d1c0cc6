"""The allocator's half of the process policy: a shadow bank with glibc's defaults against freed
memory held for reuse (``BNMEM_MALLOC``, :mod:`bnmem_utils.core.threads`).

    .venv/bin/python benchmarks/bench_malloc.py                          # about 5 min on 2 cores
    .venv/bin/python benchmarks/bench_malloc.py --models 8 --threads 1 --repeats 3

Each timing builds one LeNet-BN bank of Fashion-MNIST (a 4,000-image pool, as the fmnist
profile's notebook 04; the digits with ``--dataset digits``) with its queries, in a fresh
interpreter under each setting of :data:`SETTINGS` (glibc's defaults; freed memory held with
``mallopt`` once the interpreter runs; held from its start), which alternate, so that load from
other processes hurts all alike. Printed per setting: the median wall time,
the child's system (kernel) time, its peak resident size; then the ratio glibc / hold and
whether the two built the same scores, bit for bit. Printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bnmem_utils.core.threads import GLIBC_ENV, POLICY, glibc_vars

CHILD = """
import json, sys, tempfile, time
from bnmem_utils.jobs import bank
from bnmem_utils.core import threads
from bnmem_utils.training.steps import TrainConfig
args = json.loads(sys.argv[1])
if args["mallopt"]:
    threads.hold_freed_memory()
configs = bank.make_arms(dataset=args["dataset"], norms=["bn"], outlier_rates=[0.01],
                         n_models=args["models"], train=TrainConfig(epochs=args["epochs"]),
                         train_size=args["train_size"], test_size=args["test_size"],
                         population_size=args["population_size"])
start = time.perf_counter()
[b] = bank.train_banks(configs, tempfile.mkdtemp(), device="cpu", threads=args["threads"],
                       progress=False)
print(json.dumps({"seconds": time.perf_counter() - start, "held": threads.describe_allocator().startswith("held"),
                  "checksum": float(b.scores.astype("float64").sum())}))
"""


#: The settings compared: glibc's defaults; freed memory held once the interpreter runs
#: (``threads.hold_freed_memory``: ``mallopt``); held from the interpreter's start (glibc's own
#: variables, as the processes the entry points start get them from ``threads.policy_env``).
SETTINGS = {"glibc": {"BNMEM_MALLOC": "glibc"}, "mallopt": {"BNMEM_MALLOC": "hold"},
            "start": {"BNMEM_MALLOC": "hold", **GLIBC_ENV}}


def run_child(setting: str, spec: dict) -> dict:
    """One bank in a fresh interpreter with the environment of ``SETTINGS[setting]``: its JSON
    line, plus the child's system time and peak resident size (from ``wait4``)."""
    drop = {"BNMEM_MALLOC", *glibc_vars(os.environ)}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(SETTINGS[setting])
    env.setdefault("OMP_WAIT_POLICY", POLICY["OMP_WAIT_POLICY"])   # the wait's half, in all three
    with tempfile.TemporaryDirectory() as tmp, open(f"{tmp}/out", "w+") as fout, \
            open(f"{tmp}/err", "w+") as ferr:
        env["BNMEM_CACHE"] = tmp
        child = json.dumps({**spec, "mallopt": setting == "mallopt"})
        proc = subprocess.Popen([sys.executable, "-c", CHILD, child], env=env,
                                stdout=fout, stderr=ferr)
        _, status, usage = os.wait4(proc.pid, 0)     # the child's own rusage
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read(), ferr.read()
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"BNMEM_MALLOC={setting} failed:\n{err[-3000:]}")
    rec = json.loads(out.strip().splitlines()[-1])
    rec.update(system=usage.ru_stime, peak_gb=usage.ru_maxrss / 2**20)  # ru_maxrss: KiB
    return rec


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="fashion_mnist", help="fashion_mnist or digits")
    ap.add_argument("--models", type=int, default=16, help="bank members")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per model")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    ap.add_argument("--repeats", type=int, default=2, help="timings of each setting")
    ap.add_argument("--train-size", type=int, default=4000, help="the pool")
    args = ap.parse_args(argv)
    spec = {"dataset": args.dataset, "models": args.models, "epochs": args.epochs,
            "threads": args.threads, "train_size": args.train_size,
            "test_size": args.train_size // 2, "population_size": args.train_size // 4}
    print(f"bench_malloc: {spec}; load average {os.getloadavg()}", flush=True)
    recs: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
    for r in range(args.repeats):
        for setting in recs:
            started = time.perf_counter()
            recs[setting].append(run_child(setting, spec))
            rec = recs[setting][-1]
            print(f"  repeat {r + 1} {setting:5s} {rec['seconds']:7.1f} s (system {rec['system']:5.1f}"
                  f" s, peak {rec['peak_gb']:.2f} GB, held {rec['held']}; "
                  f"{time.perf_counter() - started:.0f} s with start-up)", flush=True)
    med = {s: statistics.median(x["seconds"] for x in v) for s, v in recs.items()}
    same = len({x["checksum"] for v in recs.values() for x in v}) == 1
    print("median: " + ", ".join(f"{s} {m:.1f} s" for s, m in med.items()) + "; "
          + ", ".join(f"glibc / {s} = {med['glibc'] / med[s]:.2f}x" for s in med if s != "glibc")
          + f"; same scores: {same}")
    return {"median": med, "same": same, "held": {s: [x["held"] for x in v] for s, v in recs.items()}}


if __name__ == "__main__":
    main()
