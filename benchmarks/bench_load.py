"""Speed under load: each notebook's hot loop, idle and beside busy processes, old and new policy.

    .venv/bin/python benchmarks/bench_load.py                    # about 5-10 min on 2 idle cores
    .venv/bin/python benchmarks/bench_load.py --loops bank --repeats 5
    .venv/bin/python benchmarks/bench_load.py --busy 0 1 --old-policy ACTIVE

The hot loops, each sized to a few seconds on 2 idle cores (an estimate from a busy machine)
and run with its notebook's default thread count under the quick profile:

* ``grid`` (02): a training grid, LeNet and MLP x BN and no norm, 5% flipped labels, one seed
  (``experiments.run_grid``, one thread, ``mem_threads = 1``);
* ``grads`` (03): a gradient-norm run, LeNet-BN, per-sample norms of every noisy and 256 clean
  samples, eval and train definitions, at three epochs (``grads.run``, one thread);
* ``bank`` (04): a 16-LeNet-BN shadow bank on the digits with 1% OOD outliers, Adam, with the
  bank's queries (``bank.train_banks``, torch's default threads: every core, ``lira_threads = 0``);
* ``penalty`` (05): an 8-LeNet-BN bank with the gamma/sigma penalty (lam 0.1), 10% flipped
  labels (``bank.train_banks``, one thread, ``mit_threads = 1``).

Each is timed beside 0, half the cores' and all the cores' worth of busy processes
(a Python loop, normal priority), under the **old** policy (OpenMP's default
wait policy: ``OMP_WAIT_POLICY`` unset when torch starts; ``--old-policy ACTIVE`` for OpenMP's
spinning wait; glibc's allocator defaults, ``BNMEM_MALLOC=glibc``; a bank as one chunk of 16
models on an OpenMP team) and the **new** one (:mod:`bnmem_utils.core.threads`: a bank's chunks of 8
on one thread each, a passive wait, and freed memory held for reuse). Loops that use more than
one thread are also timed under the new policy on one thread. The policy is read once, when torch
starts, so every timing runs in a fresh interpreter; the interpreters of one repeat and load
level run one after another, and the load levels are interleaved within each repeat, so that
load from other processes hurts every variant alike. Medians over ``--repeats``. Each timing is
preceded, in its own interpreter, by the same loop at a tiny size (start-up costs untimed).

Printed, not asserted (a benchmark on a shared machine is a measurement): a table of medians, the
ratios loaded/idle for each policy and new/old on the idle machine, and the targets: beside one
busy process no loop is more than 2x slower than idle, and idle, the new policy is no more than
5% slower than the old. The load average before each block of timings is printed with it: on a
shared machine "idle" means "no busy process of this script's own".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import numpy as np

#: The hot loops, in running order, with their notebook and default torch threads (0: torch's).
LOOPS = {"grid": ("02", 1), "grads": ("03", 1), "bank": ("04", 0), "penalty": ("05", 1)}
#: The wait's variable, which the old policy leaves unset (or sets to ``--old-policy``).
VAR = "OMP_WAIT_POLICY"


def policy_module():
    """bnmem_utils.core.threads, read from its file without importing the package (which loads
    torch): this driver imports no torch."""
    package = Path(importlib.util.find_spec("bnmem_utils").origin).parent
    spec = importlib.util.spec_from_file_location("_bnmem_policy", package / "core" / "threads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The policy of the child interpreter ("old" or "new"), set by :func:`child`.
POLICY = {"name": "new"}


# --------------------------------------------------------------------------------------------
# The loops (run in a child interpreter)
# --------------------------------------------------------------------------------------------


def loop_grid(cache: str, threads: int, tiny: bool) -> None:
    from bnmem_utils.jobs import grid as ex
    from bnmem_utils.jobs.config import TrainConfig

    configs = ex.make_grid(
        datasets=["digits"], archs=["lenet", "mlp"] if not tiny else ["mlp"],
        norms=["bn", "none"] if not tiny else ["bn"],
        corruptions=ex.corruption_settings(flip_rates=[0.05]), seeds=[0],
        train=TrainConfig(epochs=1 if tiny else 8, batch_size=128, optimizer="sgd", lr=0.1,
                          momentum=0.9, weight_decay=5e-4, schedule="cosine", augment=False),
        track=("gamma_sigma",))
    ex.run_grid(configs, "cpu", cache, progress=False, threads=threads)


def loop_grads(cache: str, threads: int, tiny: bool) -> None:
    from bnmem_utils.jobs import gradnorms as G
    from bnmem_utils.jobs.config import CorruptionConfig, DataConfig, GradNormMeasure, TrainConfig

    epochs = 1 if tiny else 6
    configs = G.make_configs(
        norms=["bn", "none"], seeds=[0], data=DataConfig("digits"), arch="lenet",
        corruption=CorruptionConfig(flip_rate=0.1),
        train=TrainConfig(epochs=epochs, batch_size=128, optimizer="sgd", lr=0.1,
                          weight_decay=5e-4, augment=False),
        measure=GradNormMeasure(measure_epochs=(0, epochs) if tiny else (0, 3, 6),
                                definitions=("eval", "train"), max_clean=16 if tiny else 256,
                                max_noisy=16 if tiny else None))
    G.run([s for s in configs if s.model.norm == "bn"], "cpu", cache, progress=False, threads=threads)


def loop_bank(cache: str, threads: int, tiny: bool) -> None:
    from bnmem_utils.jobs import bank
    from bnmem_utils.training.steps import TrainConfig

    recipe = TrainConfig(epochs=1 if tiny else 6, batch_size=64, optimizer="adam", lr=0.005,
                         weight_decay=0.0, augment=True)
    configs = bank.make_arms(norms=["bn"], outlier_rates=[0.01], n_models=4 if tiny else 16,
                             train=recipe)
    bank.train_banks(configs, cache, device="cpu", threads=threads, progress=False, **old_bank())


def old_bank() -> dict:
    """Under the old policy a bank trains as it did before the policy: one vectorised chunk of
    16 models in this thread, on torch's threads (an OpenMP team); under the new one, the
    package's default (chunks of 8 on one thread each, as many at once as torch has threads)."""
    if POLICY["name"] != "old":
        return {}
    from bnmem_utils.core.executors import LocalExecutor
    from bnmem_utils.jobs.bank_models import MemberTrainer

    return {"executor": LocalExecutor(1), "trainer": MemberTrainer(vectorised=True, block=16),
            "members_per_call": 16}


def loop_penalty(cache: str, threads: int, tiny: bool) -> None:
    from bnmem_utils.jobs import bank
    from bnmem_utils.jobs.config import PenaltyConfig, RunConfig

    config = RunConfig.bank(dataset="digits", arch="lenet", norm="bn", n_models=4 if tiny else 8,
                            seed=0, flip_rate=0.1, epochs=1 if tiny else 8, lr=0.05,
                            batch_size=128, weight_decay=5e-4, augment=False)
    config = config.replace(penalty=PenaltyConfig(0.1))
    bank.train_banks([config], cache, device="cpu", threads=threads, progress=False, **old_bank())


def child(loops: list[str], threads: int | None, policy: str, tiny: bool = False) -> None:
    """Time each loop of ``loops`` in this interpreter (cold cache, after a tiny warm-up); print
    one JSON line per loop. ``policy`` "old": the interpreter started without the policy
    (:func:`child_env`); ``threads`` None: each loop's notebook default; ``tiny``: time the warm-up size, without
    a warm-up."""
    at_start = os.environ.get(VAR, "unset")
    POLICY["name"] = policy
    import torch

    from bnmem_utils.core import threads as policy_module

    for name in loops:
        fn, n = globals()[f"loop_{name}"], LOOPS[name][1] if threads is None else threads
        with tempfile.TemporaryDirectory() as warm, tempfile.TemporaryDirectory() as cache:
            if not tiny:
                fn(warm, n, tiny=True)
            print(json.dumps({"start": name, "wall": time.time()}), flush=True)
            t0 = time.perf_counter()
            fn(cache, n, tiny=tiny)
            seconds = time.perf_counter() - t0
        print(json.dumps({"loop": name, "seconds": seconds,
                          "threads": n or torch.get_num_threads(),
                          "wait_policy": at_start,
                          "in_force": policy_module.in_force(),
                          "memory_held": policy_module.hold_freed_memory()}), flush=True)


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


def variants(loops: list[str]) -> list[tuple[str, str, int | None, list[str]]]:
    """(name, policy, threads, loops) of each child interpreter of a block: old and new at each
    loop's default threads, then new on one thread for the loops whose default is more than one
    (threads None: each loop's default)."""
    multi = [name for name in loops if LOOPS[name][1] != 1]
    out = [("old", "old", None, loops), ("new", "new", None, loops)]
    return out + ([("new, 1 thread", "new", 1, multi)] if multi else [])


def child_env(policy: str, old_policy: str, environ=None) -> dict[str, str]:
    """The environment of a child: ``environ`` without the policy's variables, then the
    variant's values: the new policy's from ``threads.policy_env``, as the entry points give the
    processes they start (freed memory held from the interpreter's start); the old policy runs
    glibc's allocator defaults and OpenMP's wait (``old_policy`` "unset": nothing set)."""
    threads = policy_module()
    environ = os.environ if environ is None else environ
    drop = {*threads.POLICY, *threads.glibc_vars(environ)}
    env = {k: v for k, v in environ.items() if k not in drop}
    if policy == "new":
        return {**env, **threads.policy_env(env)}
    return {**env, "BNMEM_MALLOC": "glibc", **({VAR: old_policy} if old_policy != "unset" else {})}


#: A busy process: spins on one core until its parent (this script) is gone, however it ended.
SPIN = "import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n    sum(range(10**5))"


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` processes that spin on a core each, at normal priority, for the duration."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())]) for _ in range(n)]
    try:
        time.sleep(0.3 if n else 0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def run_child(policy: str, threads: int | None, loops: list[str], old_policy: str,
              tiny: bool = False, timeout: float | None = None) -> list[dict]:
    """One fresh interpreter timing ``loops``; its JSON lines. Stopped after ``timeout`` seconds:
    the loop it was running gets its time so far as a lower bound (``"censored": True``); the
    loops it did not start get nothing."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", policy, "--loops", *loops]
    cmd += ["--threads", str(threads)] if threads is not None else []
    cmd += ["--tiny"] if tiny else []
    try:
        out = subprocess.run(cmd, env=child_env(policy, old_policy), capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        lines = [json.loads(x) for x in (exc.stdout or b"").decode().splitlines()
                 if x.startswith("{")]
        return censor(lines, time.time())
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return [r for r in (json.loads(x) for x in out.stdout.splitlines() if x.startswith("{"))
            if "loop" in r]


def censor(lines: list[dict], now: float) -> list[dict]:
    """The records of a child stopped at ``now``: the finished loops', and for a loop started
    but not finished, its time until ``now`` as a lower bound."""
    done = [r for r in lines if "loop" in r]
    started = [r for r in lines if "start" in r]
    if started and started[-1]["start"] not in {r["loop"] for r in done}:
        done.append({"loop": started[-1]["start"], "seconds": now - started[-1]["wall"],
                     "censored": True})
    return done


def summarise(times: dict[tuple[str, str, int], list[float]], levels: list[int],
              censored: set | frozenset = frozenset()) -> list[dict]:
    """One row per (loop, variant) from ``times[(loop, variant, busy)]`` (seconds of each
    repeat): the median at each load level, and its ratio to the idle median (level 0).
    ``censored``: the (loop, variant, busy) whose times include a lower bound (a stopped run):
    their median is a lower bound too (``row["censored"]``: those levels)."""
    rows = []
    for loop, variant in dict.fromkeys((k[0], k[1]) for k in times):
        med = {n: statistics.median(times[loop, variant, n]) for n in levels
               if times.get((loop, variant, n))}
        row = {"loop": loop, "variant": variant, "median_s": med,
               "raw": {n: times[loop, variant, n] for n in med},
               "censored": [n for n in med if (loop, variant, n) in censored]}
        if 0 in med:
            row["x_idle"] = {n: med[n] / med[0] for n in med if n}
        rows.append(row)
    return rows


def bound(num_censored: bool, den_censored: bool) -> str:
    """What a ratio of two medians is when either is a lower bound: exact (""), a lower bound
    (">="), an upper bound ("<=") or unknown ("?")."""
    return {(False, False): "", (True, False): ">=", (False, True): "<=", (True, True): "?"}[
        (num_censored, den_censored)]


def verdict(x: float, sign: str, limit: float) -> bool | None:
    """Whether ``x`` (exact or a bound, ``sign``) is at most ``limit``; None: cannot tell."""
    if sign == "":
        return x <= limit
    if sign == ">=":
        return False if x > limit else None
    return True if sign == "<=" and x <= limit else None


def ratio(a: dict, na: int, b: dict, nb: int) -> tuple[float, str] | None:
    """Row ``a``'s median at level ``na`` over row ``b``'s at ``nb``, with its :func:`bound`."""
    if na not in a["median_s"] or nb not in b["median_s"]:
        return None
    return (a["median_s"][na] / b["median_s"][nb],
            bound(na in a["censored"], nb in b["censored"]))


def targets(rows: list[dict], one: int = 1) -> list[tuple[str, float, str, bool | None]]:
    """The targets, per loop, under the new policy at the loop's default threads: beside ``one``
    busy process at most 2x the idle time; idle, at most 5% slower than the old policy.
    (text, ratio, its :func:`bound`, met: True / False / None when a stopped run hides it)."""
    by = {(r["loop"], r["variant"]): r for r in rows}
    out = []
    for loop in dict.fromkeys(r["loop"] for r in rows):
        new, old = by.get((loop, "new")), by.get((loop, "old"))
        for text, rx, limit in (
                (f"beside {one} busy process, new policy, x idle <= 2",
                 new and ratio(new, one, new, 0), 2.0),
                ("idle, new / old <= 1.05", new and old and ratio(new, 0, old, 0), 1.05)):
            if rx:
                out.append((f"{loop}: {text}", rx[0], rx[1], verdict(rx[0], rx[1], limit)))
    return out


def table(rows: list[dict], levels: list[int], threads: dict[tuple[str, str], int]) -> str:
    """The markdown table of :func:`summarise`'s rows (">=": a lower bound, a run was stopped)."""
    head = ["loop (notebook)", "policy", "threads", "idle"] + [
        f"{n} busy" for n in levels if n] + ["new / old, idle"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    by = {(r["loop"], r["variant"]): r for r in rows}
    for r in rows:
        cells = [f"{r['loop']} ({LOOPS[r['loop']][0]})", r["variant"],
                 str(threads.get((r["loop"], r["variant"]), "?"))]
        for n in levels:
            sec = r["median_s"].get(n)
            rx = ratio(r, n, r, 0) if n else None
            cells.append(("" if sec is None else ">= " * (n in r["censored"]) + _s(sec))
                         + (f" (**{rx[1]}{rx[0]:.2f}x**)" if rx else ""))
        old = by.get((r["loop"], "old"))
        rx = ratio(r, 0, old, 0) if old and r["variant"] != "old" else None
        cells.append(f"{rx[1]}{rx[0]:.2f}x" if rx else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _s(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f} s"


def load() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def measure(args) -> tuple[dict, set, dict, list[str]]:
    """Every block: for each repeat, each load level, each variant, one child."""
    times: dict[tuple[str, str, int], list[float]] = {}
    censored: set[tuple[str, str, int]] = set()
    threads: dict[tuple[str, str], int] = {}
    seen_policy: dict[str, set] = {}
    for rep in range(args.repeats):
        for n in args.busy:
            print(f"repeat {rep + 1}/{args.repeats}, {n} busy: load average before {load()}",
                  flush=True)
            with busy(n):
                for name, policy, th, loops in variants(args.loops):
                    for rec in run_child(policy, th, loops, args.old_policy, args.tiny,
                                         args.timeout):
                        key = (rec["loop"], name, n)
                        times.setdefault(key, []).append(rec["seconds"])
                        if rec.get("censored"):
                            censored.add(key)
                        else:
                            threads[rec["loop"], name] = rec["threads"]
                            seen_policy.setdefault(name, set()).add(
                                f"{rec['wait_policy']}, in force: {rec['in_force']}, "
                                f"freed memory held: {rec.get('memory_held')}")
                        print(f"  {rec['loop']:8s} {name:14s} {rec['seconds']:6.2f} s"
                              + (" (stopped at --timeout: a lower bound)" * bool(
                                  rec.get("censored"))), flush=True)
    checks = [f"{name}: OMP_WAIT_POLICY {'; '.join(sorted(v))}" for name, v in seen_policy.items()]
    return times, censored, threads, checks


def paired(args) -> list[dict]:
    """The idle comparison with its spread: ``args.paired`` pairs of children, old and new
    alternating which runs first, on an idle machine; per loop the medians and the geometric
    mean of the paired new/old ratios with a 95% t-interval (the machine's drift between pairs
    cancels within a pair)."""
    from scipy import stats

    times: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    for i in range(args.paired):
        for policy in ("old", "new") if i % 2 == 0 else ("new", "old"):
            recs = run_child(policy, None, args.loops, args.old_policy, args.tiny, args.timeout)
            for rec in recs:
                times[policy].setdefault(rec["loop"], []).append(rec["seconds"])
            print(f"pair {i + 1}/{args.paired} {policy}: "
                  + ", ".join(f"{r['loop']} {r['seconds']:.2f} s" for r in recs), flush=True)
    rows = []
    for name in args.loops:
        old, new = np.asarray(times["old"][name]), np.asarray(times["new"][name])
        logs = np.log(new / old)
        half = stats.t.ppf(0.975, logs.size - 1) * logs.std(ddof=1) / np.sqrt(logs.size)
        rows.append({"loop": name, "old_s": float(np.median(old)), "new_s": float(np.median(new)),
                     "ratio": float(np.exp(logs.mean())), "lo": float(np.exp(logs.mean() - half)),
                     "hi": float(np.exp(logs.mean() + half)), "pairs": int(logs.size)})
    print("\n| loop | old, median | new, median | new / old, paired [95% t-interval] |\n"
          "| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['loop']} ({LOOPS[r['loop']][0]}) | {r['old_s']:.2f} s | {r['new_s']:.2f} s "
              f"| {r['ratio']:.2f}x [{r['lo']:.2f}, {r['hi']:.2f}] |")
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loops", nargs="+", default=list(LOOPS), choices=list(LOOPS))
    ncpu = os.cpu_count() or 1
    ap.add_argument("--busy", type=int, nargs="+",
                    default=sorted({0, max(1, ncpu // 2), ncpu}),
                    help="busy processes beside the loop, one level each (0: idle; default: 0, "
                         "half the cores, every core)")
    ap.add_argument("--repeats", type=int, default=3, help="timings of each variant (median)")
    ap.add_argument("--old-policy", default="unset", choices=["unset", "ACTIVE"],
                    help="the old policy: OpenMP's default (unset) or its spinning wait")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds after which a child is stopped; its running loop's time so far "
                         "counts as a lower bound (printed '>=')")
    ap.add_argument("--paired", type=int, default=0, metavar="N",
                    help="instead: N interleaved old/new pairs on the idle machine, and the "
                         "paired new/old ratio of each loop with its 95%% interval")
    ap.add_argument("--json", metavar="PATH", help="also write the rows here")
    ap.add_argument("--tiny", action="store_true",
                    help="every loop at its warm-up size: checks the script runs, measures nothing")
    ap.add_argument("--child", choices=["old", "new"], help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.loops, args.threads, args.child, args.tiny)
        return []
    if args.repeats < 1 or min(args.busy) < 0 or args.timeout <= 0:
        ap.error(f"--repeats must be >= 1, --busy >= 0 and --timeout > 0 (got {args.repeats}, "
                 f"{args.busy}, {args.timeout})")
    args.busy = sorted(set(args.busy))
    if args.paired:
        if args.paired < 2:
            ap.error(f"--paired needs at least 2 pairs (got {args.paired})")
        rows = paired(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return rows
    print(f"bench_load: {cpu_name()}, {ncpu} logical CPUs, {platform.system()}, torch "
          f"{metadata.version('torch')}; load average at start {load()}; busy processes: "
          f"{args.busy}; old policy: OMP_WAIT_POLICY {args.old_policy}; new: PASSIVE"
          + (f"; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
             if "OMP_NUM_THREADS" in os.environ else ""), flush=True)
    t0 = time.perf_counter()
    times, censored, threads, checks = measure(args)
    rows = summarise(times, args.busy, censored)
    print(f"\nload average at end {load()}; {time.perf_counter() - t0:.0f} s in all; "
          f"medians of {args.repeats}; in the children: {' | '.join(checks)}\n")
    print(table(rows, args.busy, threads))
    one = 1 if 1 in args.busy else None
    print()
    for text, x, sign, ok in targets(rows, one) if one else []:
        print(f"{text}: {sign}{x:.2f}x, "
              + {True: "met", False: "NOT met", None: "cannot tell (a run was stopped)"}[ok])
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r, "median_s": {str(k): v for k, v in r["median_s"].items()},
                        "raw": {str(k): v for k, v in r["raw"].items()},
                        "x_idle": {str(k): v for k, v in r.get("x_idle", {}).items()},
                        "censored": r["censored"]}
                       for r in rows], f, indent=1)
    return rows


if __name__ == "__main__":
    main()
