"""Vectorised against sequential shadow-bank training: 16 LeNet-BN models on the digits.

    .venv/bin/python benchmarks/bench_bank.py                       # about 5 min on 2 busy cores
    .venv/bin/python benchmarks/bench_bank.py --epochs 40 --threads 1 --repeats 5
    .venv/bin/python benchmarks/bench_bank.py --dataset fashion_mnist --against HEAD~1

``--penalty LAM`` trains every model with the gamma/sigma penalty (notebook 05's banks).
``--dataset fashion_mnist`` builds the arm on real 28x28 Fashion-MNIST (a 4,000-image pool as
the fmnist profile's notebook 04). ``--against REV`` instead times the vectorised trainer of
this checkout against the one of git revision ``REV`` (its ``bnmem_utils/training/vectorised.py`` loaded
next to this one), training only, interleaved, and prints the ratio and the largest difference
in per-model test accuracy.

Measures, side by side in one run, the two ways of building one arm of notebook 04's quick
profile (digits with 5% OOD inserts, LeNet with BN, batch 64, Adam lr 0.005 without weight
decay, each model on its half of the pool):

* ``train``: training only, :func:`bnmem_utils.training.vectorised.train_models` on the 16 models at once
  against :func:`bnmem_utils.training.loop.train_model` on each in turn;
* ``member``: what a bank does per model, training and then querying it (eval-mode queries on
  the pool and the population under 5 augmentations, train-mode queries, test accuracy),
  :func:`bnmem_utils.jobs.bank_models.train_members` K models at once (``vectorised=True``) against
  one after another.

Each side runs ``--repeats`` times, the two interleaved so that load from other processes hurts
both alike, for every torch thread count in ``--threads``; the medians give models per minute
and the ratio. Printed, not asserted: the target is at least 3x on 2 CPU cores.
Models per minute scale with 1/epochs; the default 10 epochs keeps the run short (notebook 04
trains 40).

``--notebook04`` instead builds all six banks of notebook 04's quick profile (BN and no norm,
0 / 1 / 5% outliers, 16 models of 40 epochs each) once with each trainer, into temporary
caches: the end-to-end time of the notebook's training cell (the sequential trainer on one
thread, its best; the vectorised one on each thread count of ``--threads``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
import torch

from bnmem_utils.core.device import seed_everything
from bnmem_utils.jobs import bank as B
from bnmem_utils.jobs import bank_models as MB
from bnmem_utils.jobs.config import PenaltyConfig, RunConfig
from bnmem_utils.models.nets import build_model
from bnmem_utils.training import vectorised as V
from bnmem_utils.training.loop import train_model
from bnmem_utils.training.penalty import from_config


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def run_train(config: RunConfig, data: MB.BankData, keep, seeds, n: int, vectorised: bool):
    """Training only: the first ``n`` members, at once or in turn; returns their test accuracy."""
    tc = config.train
    models, subsets = [], []
    for i in range(n):
        seed_everything(int(seeds[i]))
        models.append(build_model(config.model.arch, config.model.norm, in_channels=1,
                                  num_classes=data.num_classes, image_size=int(data.x.shape[-1])))
        subsets.append(torch.from_numpy(np.flatnonzero(keep[i])))
    if vectorised:
        stacked, _ = V.train_models(models, data.x, data.y, subsets, config=tc,
                                    seeds=[int(s) for s in seeds[:n]], fill=data.fill,
                                    regularizer=from_config(config.penalty))
        logits = stacked.logits(data.x_test)                                 # (K, T, classes)
        return (logits.argmax(-1) == data.y_test).float().mean(1).numpy()
    accs = []
    for i, (m, idx) in enumerate(zip(models, subsets, strict=True)):
        train_model(m, data.x[idx], data.y[idx], config=tc, seed=int(seeds[i]), fill=data.fill,
                    regularizer=from_config(config.penalty))
        with torch.no_grad():
            accs.append(float((m(data.x_test).argmax(-1) == data.y_test).float().mean()))
    return np.array(accs)


def old_vtrain(rev: str):
    """``bnmem_utils/training/vectorised.py`` as of git revision ``rev``, imported beside the current one."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    src = subprocess.run(["git", "show", f"{rev}:bnmem_utils/training/vectorised.py"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    name = "bnmem_utils._vtrain_at_rev"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "bnmem_utils"
    sys.modules[name] = mod
    exec(compile(src, f"{rev}:bnmem_utils/training/vectorised.py", "exec"), mod.__dict__)
    return mod


def against(args, config, data, keep, seeds) -> list[dict]:
    """The current vectorised trainer against the one of ``args.against``, interleaved."""
    global V
    current, old = V, old_vtrain(args.against)
    n = args.models
    samples = int(keep[:n].sum()) * args.epochs
    rows = []
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            times: dict[str, list[float]] = {"old": [], "new": []}
            accs = {}
            for _side, mod in (("old", old), ("new", current)):         # warm-up
                V = mod
                run_train(config.replace(epochs=1), data, keep, seeds, 2, True)
            for _ in range(args.repeats):
                for side, mod in (("old", old), ("new", current)):
                    V = mod
                    t0 = time.perf_counter()
                    accs[side] = run_train(config, data, keep, seeds, n, True)
                    times[side].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"threads": threads, "old_s": med["old"], "new_s": med["new"],
                   "ratio": med["old"] / med["new"], "raw": times,
                   "old_rate": samples / med["old"], "new_rate": samples / med["new"],
                   "acc_maxdiff": float(np.abs(accs["old"] - accs["new"]).max())}
            rows.append(row)
            print(f"  threads {threads}: {args.against} {med['old']:6.1f} s "
                  f"({row['old_rate']:,.0f} sample-epochs/s), this checkout {med['new']:6.1f} s "
                  f"({row['new_rate']:,.0f} sample-epochs/s) -> {row['ratio']:.2f}x; test "
                  f"accuracy max diff {row['acc_maxdiff']:.4f} (runs: "
                  f"{', '.join(f'{t:.1f}' for t in times['old'])} | "
                  f"{', '.join(f'{t:.1f}' for t in times['new'])})", flush=True)
    finally:
        V = current
    print(f"load average at end {load()}")
    return rows


def run_member(config, data, keep, seeds, n: int, vectorised: bool):
    """Training and querying the first ``n`` members; returns their test accuracy."""
    trainer = MB.VECTORISED if vectorised else MB.SEQUENTIAL
    recs = trainer(config, keep, list(range(n)), data, seeds=seeds, device="cpu")
    return np.array([recs[i]["test_acc"] for i in range(n)])


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=16, help="models in the arm")
    ap.add_argument("--epochs", type=int, default=10, help="epochs per model")
    ap.add_argument("--batch", type=int, default=64, help="batch size (notebook 04: 64)")
    ap.add_argument("--norm", default="bn", help="bn, none, gn or ln")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch CPU threads")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each side (median)")
    ap.add_argument("--parts", nargs="+", default=["train", "member"], choices=["train", "member"])
    ap.add_argument("--optimizer", default="adam", help="adam or sgd (notebook 04: adam)")
    ap.add_argument("--lr", type=float, default=0.005, help="peak learning rate (notebook 04: 0.005)")
    ap.add_argument("--weight-decay", type=float, default=0.0, help="L2 weight decay")
    ap.add_argument("--dataset", default="digits", help="digits or fashion_mnist (real 28x28)")
    ap.add_argument("--train-size", type=int, default=None,
                    help="pool size (default: all digits; 4,000 for fashion_mnist)")
    ap.add_argument("--against", metavar="REV", default=None,
                    help="time the vectorised trainer against the one of git revision REV")
    ap.add_argument("--penalty", type=float, metavar="LAM", default=None,
                    help="train with the gamma/sigma penalty of strength LAM (notebook 05's banks)")
    ap.add_argument("--notebook04", action="store_true",
                    help="build notebook 04's six quick-profile banks with each trainer, once")
    args = ap.parse_args(argv)
    if args.notebook04:
        return notebook04(args)

    size = args.train_size or (4000 if args.dataset != "digits" else None)
    extra = {} if args.dataset == "digits" else {"test_size": 2000, "population_size": 1000}
    config = RunConfig.bank(dataset=args.dataset, train_size=size, n_models=args.models,
                          epochs=args.epochs, batch_size=args.batch, norm=args.norm,
                          ood_rate=0.05, optimizer=args.optimizer, lr=args.lr,
                          weight_decay=args.weight_decay, **extra)
    if args.penalty is not None:
        config = config.replace(penalty=PenaltyConfig(args.penalty))
    data = MB.prepare_data(config, "cpu")
    keep = B.keep_matrix(config.measure.n_models, data.n_samples, config.seed)
    seeds = B.member_seeds(config.seed, config.measure.n_models)
    n = args.models
    print(f"bench_bank: {n} x {config.model.arch}-{config.model.norm} on {args.dataset} "
          f"{tuple(data.x.shape[1:])} ({data.n_samples} pool samples, "
          f"~{int(keep.sum(1).mean())} per model), {args.epochs} epochs, batch {args.batch}, "
          f"{args.optimizer} lr {args.lr}"
          + (f", gamma/sigma penalty lam {args.penalty:g}" if args.penalty is not None else ""))
    print(f"machine: {cpu_name()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}; "
          f"load average at start {load()}")
    if args.against:
        return against(args, config, data, keep, seeds)
    # warm-up: first calls pay one-off initialisation (allocator, kernels)
    torch.set_num_threads(args.threads[0])
    small = config.replace(epochs=1)
    run_train(small, data, keep, seeds, 2, True)
    run_train(small, data, keep, seeds, 1, False)

    parts = {"train": run_train, "member": run_member}
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for part in args.parts:
            times: dict[str, list[float]] = {"sequential": [], "vectorised": []}
            accs = {}
            for _ in range(args.repeats):
                for side in ("sequential", "vectorised"):
                    t0 = time.perf_counter()
                    accs[side] = parts[part](config, data, keep, seeds, n, side == "vectorised")
                    times[side].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"threads": threads, "part": part, **{f"{k}_s": v for k, v in med.items()},
                   "seq_per_min": 60 * n / med["sequential"],
                   "vec_per_min": 60 * n / med["vectorised"],
                   "ratio": med["sequential"] / med["vectorised"],
                   "raw": times, "acc_seq": float(accs["sequential"].mean()),
                   "acc_vec": float(accs["vectorised"].mean()),
                   "acc_maxdiff": float(np.abs(accs["sequential"] - accs["vectorised"]).max())}
            rows.append(row)
            print(f"  threads {threads}, {part:6s}: sequential {med['sequential']:6.1f} s, "
                  f"vectorised {med['vectorised']:6.1f} s -> {row['ratio']:.2f}x  (runs: "
                  f"{', '.join(f'{t:.1f}' for t in times['sequential'])} | "
                  f"{', '.join(f'{t:.1f}' for t in times['vectorised'])})", flush=True)
    print(f"load average at end {load()}")
    head = (f"{'threads':>7} {'part':<7} {'seq s':>7} {'vec s':>7} {'seq models/min':>15} "
            f"{'vec models/min':>15} {'ratio':>6} {'test acc seq/vec (max diff)':>28}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['threads']:>7} {r['part']:<7} {r['sequential_s']:7.1f} {r['vectorised_s']:7.1f} "
              f"{r['seq_per_min']:15.1f} {r['vec_per_min']:15.1f} {r['ratio']:6.2f} "
              f"{r['acc_seq']:>12.3f}/{r['acc_vec']:.3f} ({r['acc_maxdiff']:.3f})")
    for part in args.parts:
        sub = [r for r in rows if r["part"] == part]
        best_seq = min(sub, key=lambda r: r["sequential_s"])
        best_vec = min(sub, key=lambda r: r["vectorised_s"])
        ratio = best_seq["sequential_s"] / best_vec["vectorised_s"]
        print(f"{part}: best sequential ({best_seq['threads']} thread(s)) against best vectorised "
              f"({best_vec['threads']} thread(s)): {ratio:.2f}x; target >= 3x on 2 cores: "
              f"{'met' if ratio >= 3 else 'NOT met'}")
    return rows


def notebook04(args) -> list[dict]:
    """Notebook 04's training cell (quick profile), with each trainer, into temporary caches: the
    sequential trainer on one thread (its best), the vectorised one on each of ``--threads``."""
    import tempfile

    from bnmem_utils.training.steps import TrainConfig

    recipe = TrainConfig(epochs=40, batch_size=64, optimizer="adam", lr=0.005, weight_decay=0.0,
                         augment=True)
    configs = B.make_arms(norms=["bn", "none"], outlier_rates=[0.0, 0.01, 0.05], n_models=16,
                          train=recipe)
    print(f"notebook 04, quick profile: {len(configs)} banks x 16 LeNets x 40 epochs; "
          f"machine: {cpu_name()}, {os.cpu_count()} logical CPUs; load average {load()}")
    runs = [("sequential", MB.SEQUENTIAL, 1)] + [("vectorised", None, t) for t in args.threads]
    rows = []
    for name, trainer, threads in runs:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            banks = B.train_banks(configs, tmp, device="cpu", threads=threads, progress=False,
                                  trainer=trainer)
            seconds = time.perf_counter() - t0
        acc = float(np.mean([b.models.test_acc.mean() for b in banks]))
        rows.append({"trainer": name, "threads": threads, "seconds": seconds, "test_acc": acc})
        print(f"  {name:10s} {threads} thread(s): {seconds:7.1f} s for {16 * len(configs)} models "
              f"({60 * 16 * len(configs) / seconds:.0f} models/min), mean test accuracy "
              f"{acc:.3f}; ratio {rows[0]['seconds'] / seconds:.2f}x", flush=True)
    print(f"load average at end {load()}")
    return rows


if __name__ == "__main__":
    main()
