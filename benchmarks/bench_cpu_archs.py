"""Deep networks on the CPU: the bank trainer against a plain PyTorch loop, both against the
machine's fp32 peak, and the rates a CPU profile is projected from.

    .venv/bin/python benchmarks/bench_cpu_archs.py --batch 32 --json bnmem_utils/run/cpu_rates.json
    .venv/bin/python benchmarks/bench_cpu_archs.py --archs resnet20 --threads 1 --samples 128 --repeats 1

The first, at full size and the `archs` profile's batch, takes about 6 minutes on 2 idle cores
(most of it DenseNet); the second, a toy check, under a minute.

For LeNet, ResNet-20 and DenseNet-BC (BN) at 28x28x1, on each torch thread count of
``--threads``, one epoch over ``--samples`` training images per model (real Fashion-MNIST where
``load_dataset("fashion_mnist")`` finds it, else Gaussian images of that shape), notebook 04's
recipe (``--batch`` 64, Adam lr 0.005 without weight decay, one-pixel shift augmentation):

* **plain**: one model, a textbook PyTorch loop (``torch.optim`` on the model's parameters, the
  batches in order, no augmentation, model and data channels-last), nothing of the package but
  the network itself, on all ``threads`` torch threads;
* **bank, one after another**: the bank's own training call of one member
  (``bank_models._fit_one``, what ``SEQUENTIAL`` runs before it queries), dispatched as
  ``bank.train_banks`` dispatches a bank's tasks on a CPU: ``threads`` members at once, each on
  one thread (``core.executors.LocalExecutor``);
* **bank, K at once**: the vectorised trainer (``vectorised.train_models``) on blocks of K models
  (``bank_models.default_chunk``: 8 LeNets, 4 wide networks), ``threads`` blocks at once, each on
  one thread; the wide networks' blocks on ``--vec-samples`` images per model (their vmap path
  runs at a few images per second: a rate, not an epoch, is what is compared);
* **queries**: eval-mode forward images per second of one member per thread
  (``bank_models.query_logits`` on the pool, the bank's query batch), over its training rate: the
  ``forward_speedup`` a projection prices the bank's queries with;
* **evaluation**: eval-mode images per second of one member per thread evaluated as a grid or
  gradient-norm run evaluates its training set and test split after every epoch
  (``training.loop.evaluate`` at ``TrainConfig.eval_batch_size``, in the layout the network
  trains in on a CPU), over its training rate: the ``eval_speedup`` a projection prices those
  evaluations with.

The script runs itself again under the project's thread and allocator policy
(:mod:`bnmem_utils.core.threads`) where it was started without it, as a notebook kernel runs.
Each rate is in images (sample-epochs) per second, best of ``--repeats`` interleaved runs after a
warm-up of two batches, and a fraction of the fp32 peak: ``cores x clock x FLOP per cycle`` (the
clock from ``lscpu``'s maximum where it gives one, else ``/proc/cpuinfo``'s current ``cpu MHz``;
FLOP per cycle from the vector flags: AVX-512 on Intel 2 FMA units x 16 lanes x 2, AVX2 and
AVX-512 on AMD 2 x 8 x 2), beside a measured 1024^3 float32 matrix product on as many threads.
FLOPs per training image are counted by ``FlopCounterMode`` (``bench_roofline.step_flops``).
``bank / plain`` per image is marked against the 0.9x target, and ``K at once / one after
another`` against the trainer :func:`bnmem_utils.jobs.config.bank_trainer` picks on a CPU.

``--json FILE`` writes the rates of the largest thread count (the whole machine, as a profile
runs) in the format of ``bnmem_utils/run/gpu_rates.json`` with ``device: cpu``, for
``bnmem_utils.run.rates.load_cpu_rates``; ``machine.tiny`` is set when ``--samples`` is below the
full size (the default), and the projection then says so. ``--layout`` also times the bank's
training call with the model and batches channels-last (not what the bank runs: it changes the
rounding of the convolutions, see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench_roofline import load, peak, step_flops
from bnmem_utils.core import executors
from bnmem_utils.core.checks import keep_matrix
from bnmem_utils.core.device import seed_everything
from bnmem_utils.jobs import bank_models as MB
from bnmem_utils.jobs.bank import member_seeds
from bnmem_utils.jobs.config import RunConfig, bank_trainer
from bnmem_utils.models.nets import build_model, trains_channels_last
from bnmem_utils.training.loop import evaluate, train_model
from bnmem_utils.training.vectorised import train_models

SHAPE = (1, 28, 28)
#: Training images per model at full size: LeNet as the fmnist profile's bank members (half of a
#: 4,000-image pool), the wide networks as the archs profile's.
FULL_SAMPLES = {"lenet": 2000, "resnet20": 1000, "densenet": 1000}
TARGET = 0.9


# --------------------------------------------------------------------------------------------
# The machine and its peak
# --------------------------------------------------------------------------------------------
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    out: dict[str, str] = {}
    try:
        for line in open("/proc/cpuinfo"):
            if not line.strip():
                break
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip()
    except OSError:
        pass
    return out


def clock_ghz(info: dict[str, str]) -> tuple[float, str]:
    """The core clock the peak is derived at, and where it was read: ``lscpu``'s maximum where
    it reports one (a turbo clock a loaded machine may not hold), else /proc/cpuinfo's
    ``cpu MHz`` (the current clock, which a virtual machine reports as its nominal one)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        found = re.search(r"CPU max MHz:\s*([\d.]+)", text)
        if found and float(found[1]) > 0:
            return float(found[1]) / 1e3, "lscpu 'CPU max MHz'"
    except (OSError, subprocess.SubprocessError):
        pass
    if info.get("cpu MHz"):
        return float(info["cpu MHz"]) / 1e3, "/proc/cpuinfo 'cpu MHz' (lscpu gives no maximum)"
    return float("nan"), "unknown (no lscpu maximum, no /proc/cpuinfo)"


def flop_per_cycle(info: dict[str, str]) -> tuple[int, str]:
    """fp32 FLOP per cycle per core from the vector extensions, and the assumption in words:
    two FMA units per core, each lane a multiply and an add."""
    flags, amd = set(info.get("flags", "").split()), "AMD" in info.get("vendor_id", "")
    if "avx512f" in flags and not amd:
        return 64, "AVX-512: 2 FMA units x 16 fp32 lanes x 2 FLOP (1-FMA-unit parts: half)"
    if "avx2" in flags and "fma" in flags or "avx512f" in flags:
        return 32, "AVX2" + (" (AVX-512 on AMD runs at 256-bit width)" if amd else "") + \
            ": 2 FMA units x 8 fp32 lanes x 2 FLOP"
    return 8, "SSE: 2 units x 4 fp32 lanes, no FMA"


def machine(threads: int) -> dict:
    """The CPU, its logical CPUs, the derived fp32 peak on ``threads`` cores and how."""
    info = _cpuinfo()
    ghz, where = clock_ghz(info)
    per_cycle, how = flop_per_cycle(info)
    name = info.get("model name", "unknown CPU")
    short = re.sub(r"\((R|TM)\)|\s+Processor|\s+CPU|\s+\d+-Core", "", name)
    short = re.sub(r"\s+", " ", short).strip()
    return {"cpu": name, "short": f"{short}, {os.cpu_count()} logical CPUs",
            "logical_cpus": os.cpu_count(), "clock_ghz": ghz, "clock_from": where,
            "flop_per_cycle": per_cycle, "simd": how, "peak_gflops": threads * ghz * per_cycle}


# --------------------------------------------------------------------------------------------
# What is timed
# --------------------------------------------------------------------------------------------
def bank_setup(arch: str, samples: int, batch: int, optimizer: str, n_models: int):
    """(config, pool, keep matrix, seeds) of a bank of ``n_models`` ``arch`` members, each on
    about ``samples`` images (half a pool of ``2 * samples``, 1% OOD inserts), notebook 04's
    recipe, on real Fashion-MNIST or, where it is not found, Gaussian images."""
    config = RunConfig.bank(dataset="fashion_mnist", arch=arch, norm="bn", train_size=2 * samples,
                            test_size=256, population_size=256, n_models=n_models, epochs=1,
                            batch_size=batch, optimizer=optimizer, lr=0.005, weight_decay=0.0,
                            augment=True, ood_rate=0.01)
    try:
        data, source = MB.prepare_data(config, "cpu"), "Fashion-MNIST"
    except FileNotFoundError:
        data, source = synthetic_pool(2 * samples), "Gaussian images (Fashion-MNIST not found)"
    keep = keep_matrix(n_models, data.n_samples, config.seed)
    return config, data, keep, member_seeds(config.seed, n_models), source


def synthetic_pool(n: int) -> MB.BankData:
    """A pool of ``n`` Gaussian 28x28 images with random labels, in the bank's layout."""
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(n, *SHAPE, generator=g), torch.randn(256, *SHAPE, generator=g)
    y, yt = torch.randint(0, 10, (n,), generator=g), torch.randint(0, 10, (256,), generator=g)
    return MB.BankData(x=x, y=y, kind=torch.zeros(n, dtype=torch.long), x_test=t, y_test=yt,
                       pop_x=t, pop_y=yt, num_classes=10, fill=x.amin((0, 2, 3), keepdim=True))


def _member(i: int, config, data, keep, seeds, layout: bool = False) -> int:
    """Build and train bank member ``i`` with the bank's own call (``layout``: channels-last,
    which the bank does not do on a CPU); its sample-epochs."""
    model = MB._build(config, data, int(seeds[i]))
    if layout:
        idx = torch.from_numpy(np.flatnonzero(keep[i]))
        train_model(model, data.x[idx], data.y[idx], config=config.train, seed=int(seeds[i]),
                    fill=data.fill, channels_last=True)
    else:
        MB._fit_one(config, model, keep, i, data, int(seeds[i]), torch.device("cpu"), False, None)
    return int(keep[i].sum()) * config.train.epochs


def _block(members: list[int], config, data, keep, seeds) -> int:
    """Build and train bank members ``members`` K at once (the vectorised trainer); their
    sample-epochs."""
    models = [MB._build(config, data, int(seeds[i])) for i in members]
    subsets = [torch.from_numpy(np.flatnonzero(keep[i])) for i in members]
    train_models(models, data.x, data.y, subsets, config=config.train,
                 seeds=[int(seeds[i]) for i in members], fill=data.fill)
    return sum(int(keep[i].sum()) for i in members) * config.train.epochs


def _queries(i: int, config, data, seeds) -> int:
    """Eval-mode queries of one untrained member on the pool, as a bank queries its trained
    members: in the layout training left it in (channels-last for the wide networks on a CPU,
    as :func:`bnmem_utils.training.loop.train_model` stores them); the images."""
    model = MB._build(config, data, int(seeds[i])).eval()
    if trains_channels_last(config.model.arch, torch.device("cpu")):
        model = model.to(memory_format=torch.channels_last)
    MB.query_logits(model, data.x, ("identity",), batch_size=config.measure.query_batch_size,
                    fill=data.fill)
    return data.n_samples


def _evaluation(i: int, config, data, seeds) -> int:
    """One untrained member's evaluation of the pool as a grid or gradient-norm run evaluates
    after an epoch (eval mode, its evaluation batch, the layout it trains in on a CPU); the
    images."""
    model = MB._build(config, data, int(seeds[i]))
    if trains_channels_last(config.model.arch, torch.device("cpu")):
        model = model.to(memory_format=torch.channels_last)
    evaluate(model, data.x, data.y, batch_size=config.train.eval_batch_size)
    return data.n_samples


def on_workers(threads: int, fn, items) -> int:
    """``fn`` on each item, ``threads`` at once, each on one torch thread, as a bank's tasks run
    on a CPU (:func:`bnmem_utils.jobs.bank.local_workers`); the images they report."""
    torch.set_num_threads(threads)
    return sum(n for _, n in executors.LocalExecutor(workers=threads).imap(fn, items))


def plain_loop(arch: str, x: torch.Tensor, y: torch.Tensor, batch: int, optimizer: str) -> int:
    """One model, a textbook loop: channels-last, ``torch.optim``, the batches in order; the
    images it trained on."""
    seed_everything(0)
    model = build_model(arch, "bn", in_channels=SHAPE[0], num_classes=10, image_size=SHAPE[-1])
    model = model.to(memory_format=torch.channels_last).train()
    x = x.contiguous(memory_format=torch.channels_last)
    opt = (torch.optim.Adam(model.parameters(), lr=0.005) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9))
    for i in range(0, x.shape[0] - 1, batch):
        loss = F.cross_entropy(model(x[i:i + batch]), y[i:i + batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return int(x.shape[0])


# --------------------------------------------------------------------------------------------
# One architecture on one thread count
# --------------------------------------------------------------------------------------------
def timed(sides: dict, repeats: int) -> dict[str, float]:
    """Images per second of each side (``{name: fn() -> images}``), best of ``repeats`` runs,
    the sides interleaved so that load from other processes hurts them alike."""
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            images = fn()
            best[name] = max(best.get(name, 0.0), images / (time.perf_counter() - t0))
    return best


def measure(arch: str, threads: int, args) -> dict:
    """Every rate of ``arch`` on ``threads`` threads (see the module's docstring)."""
    samples = args.samples or FULL_SAMPLES.get(arch, 1000)
    k = MB.default_chunk(RunConfig.bank(arch=arch), "cpu")
    config, data, keep, seeds, source = bank_setup(arch, samples, args.batch, args.optimizer,
                                                   max(threads * k, 4))
    rule = bank_trainer(config, "cpu")
    first = torch.from_numpy(np.flatnonzero(keep[0]))
    x, y = data.x[first].contiguous(), data.y[first].contiguous()
    blocks = [list(range(b * k, (b + 1) * k)) for b in range(threads)]
    vkeep = first_samples(keep, args.vec_samples if k < 8 else 0)
    sides = {
        "plain": lambda: (torch.set_num_threads(threads), plain_loop(arch, x, y, args.batch,
                                                                       args.optimizer))[1],
        "sequential": lambda: on_workers(threads, lambda i: _member(i, config, data, keep, seeds),
                                         range(threads)),
        "vectorised": lambda: on_workers(threads, lambda b: _block(b, config, data, vkeep, seeds),
                                         blocks),
        "queries": lambda: on_workers(threads, lambda i: _queries(i, config, data, seeds),
                                      range(threads)),
        "evaluation": lambda: on_workers(threads, lambda i: _evaluation(i, config, data, seeds),
                                         range(threads))}
    if args.layout:
        sides["channels_last"] = lambda: on_workers(
            threads, lambda i: _member(i, config, data, keep, seeds, layout=True), range(threads))
    small = first_samples(keep, 2 * args.batch)                 # warm-up: two batches each
    torch.set_num_threads(1)
    _member(0, config, data, small, seeds)
    _block(blocks[0][:2], config, data, small, seeds)
    if args.layout:
        _member(0, config, data, small, seeds, layout=True)
    plain_loop(arch, x[: 2 * args.batch], y[: 2 * args.batch], args.batch, args.optimizer)
    rates = timed(sides, args.repeats)
    gflop = step_flops(arch, SHAPE, args.batch) / 1e9
    return {"arch": arch, "threads": threads, "k": k, "samples": int(keep[0].sum()),
            "vec_samples": int(vkeep[0].sum()), "data": source, "rule": rule, "gflop": gflop,
            "eval_batch": config.train.eval_batch_size,
            **rates}


def first_samples(keep: np.ndarray, n: int) -> np.ndarray:
    """``keep`` with each member's first ``n`` samples only (``n`` 0: all of them)."""
    if not n:
        return keep
    out = np.zeros_like(keep)
    for i, row in enumerate(keep):
        out[i, np.flatnonzero(row)[:n]] = True
    return out


def report(row: dict, peak_gflops: float) -> str:
    """One architecture on one thread count, in words."""
    r, g = row, row["gflop"]

    def rate(name: str) -> str:
        return f"{r[name]:7,.0f} img/s ({r[name] * g / peak_gflops:5.1%})"

    ruled = r["vectorised"] if r["rule"] == "vectorised" else r["sequential"]
    ratio = ruled / r["plain"]
    faster = "vectorised" if r["vectorised"] > r["sequential"] else "sequential"
    text = (f"  {r['arch']:9s} {g:6.3f} GFLOP/img; plain {rate('plain')}; bank one after another "
            f"{rate('sequential')}, K={r['k']} at once {rate('vectorised')}; bank ({r['rule']}, "
            f"the CPU rule) / plain {ratio:.2f}x "
            f"[{'meets' if ratio >= TARGET else 'BELOW'} the {TARGET}x target]; K at once / one "
            f"after another {r['vectorised'] / r['sequential']:.2f}x (faster: {faster}; "
            f"{'agrees with' if faster == r['rule'] else 'AGAINST'} the rule); queries "
            f"{r['queries']:,.0f} img/s = {r['queries'] / r['sequential']:.1f}x training; "
            f"evaluation {r['evaluation']:,.0f} img/s = "
            f"{r['evaluation'] / r['sequential']:.1f}x training")
    if "channels_last" in r:
        text += (f"; bank one after another channels-last {rate('channels_last')} "
                 f"= {r['channels_last'] / r['sequential']:.2f}x the bank's")
    return text


def table(rows: list[dict], peaks: dict[int, float]) -> list[str]:
    """The rows as a markdown table, rates with their fraction of the derived peak."""
    out = ["| threads | network (K) | GFLOP / image | plain | bank, one after another | bank, K at "
           "once | bank (CPU rule) / plain | K at once / one after another | queries / training "
           "| evaluation / training |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cell = {n: f"{r[n]:,.0f} ({r[n] * r['gflop'] / peaks[r['threads']]:.1%})"
                for n in ("plain", "sequential", "vectorised")}
        ruled = r["vectorised"] if r["rule"] == "vectorised" else r["sequential"]
        out.append(f"| {r['threads']} | {r['arch']} ({r['k']}) | {r['gflop']:.3f} | "
                   f"{cell['plain']} | {cell['sequential']} | {cell['vectorised']} | "
                   f"{ruled / r['plain']:.2f}x ({r['rule']}) | "
                   f"{r['vectorised'] / r['sequential']:.2f}x | "
                   f"{r['queries'] / r['sequential']:.1f}x | "
                   f"{r['evaluation'] / r['sequential']:.1f}x |")
    return out


# --------------------------------------------------------------------------------------------
# The rates file and the run
# --------------------------------------------------------------------------------------------
def rates_document(rows: list[dict], info: dict, args, argv: list[str]) -> dict:
    """The rates of the largest thread count in the format of ``gpu_rates.json`` (``device:
    cpu``): each network one after another (with its queries' ``forward_speedup``) and K at
    once; the plain loop's rates beside them, for reference."""
    top = max(r["threads"] for r in rows)
    tiny = any(r["samples"] < 0.9 * FULL_SAMPLES.get(r["arch"], 1000) for r in rows)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip() or "unknown"
    machine = {"cpu": info["cpu"], "short": info["short"] + (" (toy sizes)" if tiny else ""),
               "device": "cpu", "threads": top, "torch": torch.__version__,
               "date": datetime.date.today().isoformat(), "commit": commit,
               "command": "benchmarks/bench_cpu_archs.py " + " ".join(argv), "tiny": tiny,
               "load": load(), "peak_gflops": round(info["peak_gflops"], 1)}
    entries, plain = [], []
    for r in (r for r in rows if r["threads"] == top):
        how = (f"{top} members at once on 1 thread each, {r['samples']} images each, batch "
               f"{args.batch}, {args.optimizer}, {r['data']}")
        entries.append({"arch": r["arch"], "shape": list(SHAPE), "vectorised": False,
                        "rate": round(r["sequential"], 1), "how": how,
                        "forward_speedup": round(r["queries"] / r["sequential"], 2),
                        "queries": "eval-mode queries of the pool, one member per thread",
                        "eval_speedup": round(r["evaluation"] / r["sequential"], 2),
                        "evaluation": f"evaluation after an epoch, batch "
                                      f"{r['eval_batch']}, one member per thread"})
        entries.append({"arch": r["arch"], "shape": list(SHAPE), "vectorised": True,
                        "rate": round(r["vectorised"], 1),
                        "how": f"{top} blocks of {r['k']} at once on 1 thread each, "
                               f"{r['vec_samples']} images each, " + how.split(", ", 2)[2]})
        plain.append({"arch": r["arch"], "rate": round(r["plain"], 1),
                      "how": f"one model on {top} threads, channels-last, torch.optim"})
    about = ("Training rates (sample-epochs per second) on the CPU that bnmem_utils.run.cpu_work "
             "projects the CPU profiles from, as benchmarks/bench_cpu_archs.py --json writes "
             "them" + (": measured at TOY SIZES (--samples below the full size), a check of "
                       "the machinery, not rates to plan by" if tiny else "") + ".")
    return {"about": about, "machine": machine, "rates": entries, "plain": plain}


def with_policy(argv: list[str]) -> None:
    """Run this script again in a process started with the project's thread and allocator
    policy (:mod:`bnmem_utils.core.threads`: OpenMP's passive wait, freed memory held), as a
    notebook kernel or a Ray worker runs, unless it is in force already; both the bank and the
    plain loop are timed under it."""
    from bnmem_utils.core import threads

    if threads.in_force() or os.environ.get("BNMEM_BENCH_POLICY"):
        return
    env = {**os.environ, **threads.policy_env(os.environ), "BNMEM_BENCH_POLICY": "1"}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archs", nargs="+", default=["lenet", "resnet20", "densenet"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=64, help="batch size (notebook 04: 64)")
    ap.add_argument("--samples", type=int, default=0,
                    help=f"training images per model (default, the full size: {FULL_SAMPLES})")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each side (best)")
    ap.add_argument("--vec-samples", type=int, default=256,
                    help="images per model of the wide networks' K-at-once side (its vmap "
                         "path runs at a few images per second; 0: --samples)")
    ap.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    ap.add_argument("--layout", action="store_true",
                    help="also time the bank's training call channels-last")
    ap.add_argument("--json", metavar="FILE",
                    help="write the rates file (bnmem_utils/run/cpu_rates.json)")
    args = ap.parse_args(argv)
    with_policy(argv)
    from bnmem_utils.core.threads import in_force

    info = machine(max(args.threads))
    print(f"bench_cpu_archs: {info['cpu']}, {info['logical_cpus']} logical CPUs, torch "
          f"{torch.__version__}; thread/allocator policy in force: {in_force()}; load average "
          f"at start {load()}", flush=True)
    print(f"fp32 peak per core: {info['clock_ghz']:.2f} GHz ({info['clock_from']}) x "
          f"{info['flop_per_cycle']} FLOP/cycle ({info['simd']}) = "
          f"{info['clock_ghz'] * info['flop_per_cycle']:.1f} GFLOP/s", flush=True)
    rows, peaks = [], {}
    for threads in args.threads:
        derived = peaks[threads] = machine(threads)["peak_gflops"]
        torch.set_num_threads(threads)
        print(f"threads {threads}: derived peak {derived:.1f} GFLOP/s; measured 1024^3 float32 "
              f"matmul {peak() / 1e9:.1f} GFLOP/s", flush=True)
        for arch in args.archs:
            rows.append(measure(arch, threads, args))
            print(report(rows[-1], derived), flush=True)
    print(f"load average at end {load()}\n")
    print("\n".join(table(rows, peaks)))
    if args.json:
        Path(args.json).write_text(json.dumps(rates_document(rows, info, args, argv), indent=1)
                                   + "\n")
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()
