"""Per-sample gradient-norm throughput: bnmem_utils.jobs.gradnorms against a naive loop and Opacus.

    .venv/bin/python benchmarks/bench_grads.py                  # LeNet at 8x8 and 28x28, ~2 min
    .venv/bin/python benchmarks/bench_grads.py --sizes 28 --n 512 --repeats 7 --sweep --threads 0

One run prints, for each input size: the seconds per call on ``--n`` samples (best of ``--repeats``
timed calls after one warm-up, methods interleaved so that a noisy shared machine hurts them
alike), the throughput in samples/s, and the ratios (by wall time, and by CPU time in brackets)

* ``grads / naive``: speed-up over one backward per sample (target: at least 10x);
* ``grads / opacus``: against Opacus' GradSampleModule (hooks), on the models Opacus accepts,
  the no-norm and GroupNorm LeNets of the zoo (target: at least 1x).

Every method computes the same thing, the L2 norm of each sample's gradient over all parameters,
and the script checks that their answers agree. The BN LeNet is timed too, under both
definitions of bnmem_utils.jobs.gradnorms (eval: running statistics; train: row i of the batch Jacobian),
each against its own naive loop; Opacus cannot run BN at all. The targets are for 2 CPU cores.
The ``bound`` column divides the naive loop's time by that of one plain batched forward and
backward (no per-sample work at all): no per-sample method can beat the naive loop by more.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bnmem_utils.core.device import resolve_device
from bnmem_utils.models.nets import build_model
from bnmem_utils.training import per_sample as PS


def opacus_norms(model: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A function ``(x, y) -> (n,)`` per-sample gradient norms with Opacus' GradSampleModule.

    Opacus' backward hooks cannot follow the zoo's in-place ReLUs, so a copy with out-of-place
    ReLUs is wrapped (same weights, same function)."""
    import copy

    from opacus import GradSampleModule

    clone = copy.deepcopy(model)
    for m in clone.modules():
        if isinstance(m, torch.nn.ReLU):
            m.inplace = False
    gsm = GradSampleModule(clone, loss_reduction="sum")
    params = [p for p in gsm.parameters() if p.requires_grad]

    def norms(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for p in params:
            p.grad, p.grad_sample = None, None
        F.cross_entropy(gsm(x), y, reduction="sum").backward()
        sq = sum(p.grad_sample.reshape(len(x), -1).double().square().sum(1) for p in params)
        return sq.sqrt().cpu()                             # (n,)

    return norms


def timed(fns: dict[str, Callable[[], torch.Tensor]], repeats: int, device: torch.device
          ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Best (minimum) wall seconds of each function over ``repeats`` calls after one warm-up, calls
    interleaved; also ``<name>_cpu``, the minimum process CPU seconds (all threads), which a
    machine shared with other jobs disturbs less than wall time."""
    out = {name: fn() for name, fn in fns.items()}          # warm-up, and the answers
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    best = {name: min(ts) for name, ts in wall.items()}
    best.update({f"{name}_cpu": min(ts) for name, ts in cpu.items()})
    return best, out


def batch_backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One plain forward and backward of the whole batch, no per-sample anything: a lower bound
    on the time of any per-sample method, so ``naive / floor`` bounds the reachable speed-up."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return torch.zeros(len(x))


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()).abs() / b.double().abs().clamp_min(1e-30)).max())


def bench_size(size: int, n: int, batch: int, repeats: int, naive_repeats: int, chunk: int | None,
               device: torch.device) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, size, size, generator=g).to(device)  # (n, 1, size, size)
    y = torch.randint(0, 10, (n,), generator=g).to(device)     # (n,)
    rows = []
    for norm in ("none", "gn"):
        torch.manual_seed(0)
        model = build_model("lenet", norm, image_size=size).to(device)
        op = opacus_norms(model)
        fns = {"grads": lambda m=model: PS.per_sample_grad_norms(m, x, y, chunk_size=chunk).total,
               "opacus": lambda op=op: op(x, y), "floor": lambda m=model: batch_backward(m, x, y)}
        t, out = timed(fns, repeats, device)
        tn, outn = timed({"naive": lambda m=model: PS.naive_grad_norms(m, x, y).total},
                         naive_repeats, device)
        rows.append({"size": size, "model": f"lenet-{norm}", "definition": "eval", **t, **tn,
                     "err_grads": max_rel(out["grads"], outn["naive"]),
                     "err_opacus": max_rel(out["opacus"], outn["naive"])})
    torch.manual_seed(0)
    model = build_model("lenet", "bn", image_size=size).to(device)
    model.train()
    with torch.no_grad():
        model(x)                                              # non-trivial running statistics
    for definition in PS.DEFINITIONS:
        kw = {"definition": definition, "batch_size": batch, "shuffle_seed": 0}
        t, out = timed({"grads": lambda kw=kw: PS.per_sample_grad_norms(model, x, y, chunk_size=chunk,
                                                                     **kw).total}, repeats, device)
        tn, outn = timed({"naive": lambda kw=kw: PS.naive_grad_norms(model, x, y, **kw).total},
                         naive_repeats, device)
        rows.append({"size": size, "model": "lenet-bn", "definition": definition, **t, **tn,
                     "opacus": float("nan"), "opacus_cpu": float("nan"), "floor": float("nan"),
                     "err_grads": max_rel(out["grads"], outn["naive"]),
                     "err_opacus": float("nan")})
    return rows


def sweep(size: int, n: int, device: torch.device, repeats: int) -> None:
    """Seconds per batch of the eval definition against the chunk size (no-norm LeNet)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, size, size, generator=g).to(device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    model = build_model("lenet", "none", image_size=size).to(device)
    chunks = [c for c in (8, 16, 32, 64, 128, 256, 512, 1024) if c <= n]
    fns = {str(c): (lambda c=c: PS.per_sample_grad_norms(model, x, y, chunk_size=c).total) for c in chunks}
    fns["auto"] = lambda: PS.per_sample_grad_norms(model, x, y).total
    t, _ = timed(fns, repeats, device)
    print(f"chunk sweep, {size}x{size}, n={n}: " + ", ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in t.items()))


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 28], help="input sizes (pixels)")
    ap.add_argument("--n", type=int, default=1024, help="samples per timed call")
    ap.add_argument("--batch", type=int, default=128, help="BN batch of the train definition")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per method (best of)")
    ap.add_argument("--naive-repeats", type=int, default=3, help="timed calls of the naive loops")
    ap.add_argument("--chunk", type=int, default=None, help="chunk size of grads (default: auto)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (0: torch's default). One is fastest for these small "
                         "models, and steady when other jobs share the cores")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--sweep", action="store_true", help="also sweep the chunk size")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook.*")
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} CPU threads, "
          f"n={args.n} samples per call, best of {args.repeats} (naive: {args.naive_repeats})")
    rows = []
    for size in args.sizes:
        rows += bench_size(size, args.n, args.batch, args.repeats, args.naive_repeats, args.chunk,
                           device)
        if args.sweep:
            sweep(size, args.n, device, args.repeats)
    header = (f"{'size':>4} {'model':<10} {'def':<5} {'grads s':>8} {'naive s':>8} {'opacus s':>8} "
              f"{'grads/s':>9} {'x naive (cpu)':>14} {'x opacus (cpu)':>15} {'bound':>6} "
              f"{'err grads':>9} {'err opacus':>10}")
    print(header)
    print("-" * len(header))
    for r in rows:
        r.update(throughput=args.n / r["grads"], x_naive=r["naive"] / r["grads"],
                 x_opacus=r["opacus"] / r["grads"], x_naive_cpu=r["naive_cpu"] / r["grads_cpu"],
                 x_opacus_cpu=r["opacus_cpu"] / r["grads_cpu"], bound=r["naive"] / r["floor"])
        vs_naive = f"{r['x_naive']:.1f} ({r['x_naive_cpu']:.1f})"
        vs_opacus = f"{r['x_opacus']:.2f} ({r['x_opacus_cpu']:.2f})"
        print(f"{r['size']:>4} {r['model']:<10} {r['definition']:<5} {r['grads']:8.4f} "
              f"{r['naive']:8.3f} {r['opacus']:8.4f} {r['throughput']:9.0f} {vs_naive:>14} "
              f"{vs_opacus:>15} {r['bound']:6.1f} {r['err_grads']:9.1e} {r['err_opacus']:10.1e}")
    print("bound: naive / (one plain batched forward+backward), the most any per-sample method "
          "could gain over the naive loop here.")
    for size in args.sizes:
        ok = [r for r in rows if r["size"] == size and r["opacus"] == r["opacus"]]
        if not ok:
            continue
        lo_naive = min(r["x_naive"] for r in ok)
        lo_opacus = min(r["x_opacus"] for r in ok)
        print(f"{size}x{size}, Opacus-compatible models: >= 10x naive "
              f"{'met' if lo_naive >= 10 else 'NOT met'} (min {lo_naive:.1f}x); >= Opacus "
              f"{'met' if lo_opacus >= 1 else 'NOT met'} (min {lo_opacus:.2f}x)")
    return rows


if __name__ == "__main__":
    main()
