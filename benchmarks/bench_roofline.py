"""Roofline of a shadow-model bank: how close its training comes to what the machine can do.

    .venv/bin/python benchmarks/bench_roofline.py                      # about 8 min on 2 cores
    .venv/bin/python benchmarks/bench_roofline.py --archs lenet --threads 1 --sizes 28

For each architecture and image size (8x8: the digits; 28x28: Fashion-MNIST, the real data from
``load_dataset("fashion_mnist")``), on 1 and 2 torch threads:

* **FLOPs per training sample**: one forward and backward of one model on one batch, counted by
  ``torch.utils.flop_counter.FlopCounterMode`` (convolutions, matrix products; the first
  layer's input gradient is not computed, so a step is a little under 3x the forward), over the
  batch size;
* **attainable rate**: the same matrix products and convolutions alone (forward, kernel
  gradient, input gradient), for K models, each timed with the fastest way this torch has for
  its shape: K models at once (a grouped convolution channels-last or NCHW; on small images
  also the vectorised trainer's dense-matrix form; batched matrix products) or one model after
  another (K plain convolutions or matrix products), summed over the layers: what a bank step could
  reach if its norms, pools, activations, optimizer and Python cost nothing. ``peak`` is one
  large float32 matrix product (1024 x 1024 x 1024), the core's arithmetic ceiling;
* **the memory-bound layers**: the model's batch norms (training mode), ReLUs, max-pools and
  adaptive pools alone, forward and backward, each in its fastest form, as above; with them,
  a second attainable rate: every layer of the step at its own best speed, only the optimizer,
  the loss, layout copies and Python left out. ``copy`` is one large memory copy, the bus's
  rate, a reference for how far those layers' native kernels are from it;
* **bank throughput** in sample-epochs per second (one model seeing one training sample once),
  training K models on their own halves of a pool: vectorised
  (:func:`bnmem_utils.training.vectorised.train_models`) and sequential (:func:`bnmem_utils.training.loop.train_model`
  on each model in turn), interleaved, best of ``--repeats``; and each as a fraction of both
  attainable rates (achieved FLOP/s over attainable FLOP/s).

Printed, not asserted. K is 16 for LeNet and 4 for the wide networks (the CPU blocks of
:func:`bnmem_utils.jobs.bank_models.default_chunk`). A LeNet trains one epoch on 2,000 samples at 28x28
(the ``fmnist`` profile's banks: a model's half of a 4,000-image pool) and 640 at 8x8 (about a
digits bank's half), so that a run's fixed costs (building the models, the epoch's batches)
weigh in as in a bank; the wide networks see 64 samples (``--samples``) so that they finish on a
CPU.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from bnmem_utils.core.device import seed_everything
from bnmem_utils.data.datasets import load_dataset
from bnmem_utils.models.nets import build_model
from bnmem_utils.training import grouped_layers as VL
from bnmem_utils.training import vectorised as V
from bnmem_utils.training.loop import TrainConfig, train_model

K_MODELS = {"lenet": 16, "mlp": 16}          # wide networks: 4


def load() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def best_time(fn, repeats: int = 5, min_s: float = 0.05) -> float:
    """Seconds per call of ``fn``: best of ``repeats`` timings of enough calls to last ``min_s``."""
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_s or n >= 256:
            break
        n *= 2
    best = t / n
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def step_flops(arch: str, shape: tuple[int, int, int], batch: int) -> float:
    """FLOPs of one training step of one model on ``batch`` samples, per sample."""
    seed_everything(0)
    model = build_model(arch, "bn", in_channels=shape[0], num_classes=10, image_size=shape[-1])
    x = torch.randn(batch, *shape)
    y = torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / batch


def layer_shapes(arch: str, shape: tuple[int, int, int]) -> list[tuple[nn.Module, tuple]]:
    """Every convolution and linear layer of the model with the shape of its input."""
    seed_everything(0)
    model = build_model(arch, "bn", in_channels=shape[0], num_classes=10, image_size=shape[-1])
    found = []
    hooks = [m.register_forward_hook(lambda m, i, o: found.append((m, tuple(i[0].shape[1:]))))
             for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model.eval()(torch.zeros(2, *shape))
    for h in hooks:
        h.remove()
    return found


def attainable(arch: str, shape: tuple[int, int, int], k: int, batch: int) -> tuple[float, float]:
    """(FLOPs, seconds) of the model's matrix products and convolutions alone, forward and
    backward, for ``k`` models on ``batch`` samples each, every layer with its fastest kernel."""
    total_flops, total_s = 0.0, 0.0
    for i, (m, ishape) in enumerate(layer_shapes(arch, shape)):
        first = i == 0
        candidates = []
        if isinstance(m, nn.Linear):
            o, f = m.weight.shape
            w = torch.randn(k, o, f, requires_grad=True)
            x = torch.randn(k, batch, f, requires_grad=not first)

            def lin(w=w, x=x):
                out = torch.bmm(x, w.transpose(1, 2))
                out.backward(torch.ones_like(out))
            candidates.append(lin)

            def lin1(w=w, x=x):                                # one model at a time
                for j in range(k):
                    out = x[j] @ w[j].t()
                    out.backward(torch.ones_like(out))
            candidates.append(lin1)
            flops = 2 * k * batch * o * f * (2 if first else 3)
        else:
            c, h, wd = ishape
            o = m.out_channels
            weight = torch.randn(k, o, c // m.groups, *m.kernel_size, requires_grad=True)
            ho, wo = VL.conv_out_size(m, h, wd)
            flops = 2 * k * batch * ho * wo * o * (c // m.groups) * m.kernel_size[0] \
                * m.kernel_size[1] * (2 if first else 3)
            for cl in (True, False):                      # one model at a time, K times
                x1 = torch.randn(batch, c, h, wd)
                if cl:
                    x1 = x1.contiguous(memory_format=torch.channels_last)
                x1.requires_grad_(not first)
                w1 = weight[0].detach().clone().requires_grad_()

                def single(x1=x1, w1=w1, m=m):
                    for _ in range(k):
                        out = F.conv2d(x1, w1, None, m.stride, m.padding, m.dilation, m.groups)
                        out.backward(torch.ones_like(out))
                candidates.append(single)
            for cl in (True, False):
                x = torch.randn(batch, k * c, h, wd)
                if cl:
                    x = x.contiguous(memory_format=torch.channels_last)
                x.requires_grad_(not first)

                def conv(x=x, weight=weight, m=m):
                    out = F.conv2d(x, weight.reshape(-1, *weight.shape[2:]), None, m.stride,
                                   m.padding, m.dilation, k * m.groups)
                    out.backward(torch.ones_like(out))
                candidates.append(conv)
            if m.groups == 1 and VL.dense_applies(m, h, wd):
                x = torch.randn(batch, k * c, h, wd).contiguous(memory_format=torch.channels_last)
                x.requires_grad_(not first)

                def dense(x=x, weight=weight, m=m):
                    out = VL._grouped_conv(m, weight, None, x, k, False)
                    out.backward(torch.ones_like(out))
                candidates.append(dense)
        total_flops += flops
        total_s += min(best_time(fn) for fn in candidates)
    return total_flops, total_s


def other_layers(arch: str, shape: tuple[int, int, int]) -> list[tuple[nn.Module, tuple]]:
    """Every batch norm, ReLU, max-pool and adaptive average pool of the model with the shape
    it runs on in a bank step: a ReLU just before a max-pool runs after it, on the pooled map
    (the vectorised trainer's order, equal values), and an adaptive pool to the size the map
    already has is skipped (LeNet's forward skips it)."""
    seed_everything(0)
    model = build_model(arch, "bn", in_channels=shape[0], num_classes=10, image_size=shape[-1])
    kinds = (nn.modules.batchnorm._BatchNorm, nn.ReLU, nn.MaxPool2d, nn.AdaptiveAvgPool2d)
    found = []

    def record(m, i, o):
        if not isinstance(m, nn.AdaptiveAvgPool2d) or tuple(o.shape) != tuple(i[0].shape):
            found.append((m, tuple(i[0].shape[1:]), tuple(o.shape[1:])))
    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, kinds)]
    with torch.no_grad():
        model.eval()(torch.zeros(2, *shape))
    for h in hooks:
        h.remove()
    out = []
    for j, (m, ishape, _) in enumerate(found):
        after = found[j + 1] if j + 1 < len(found) else None
        if isinstance(m, nn.ReLU) and after is not None and isinstance(after[0], nn.MaxPool2d) \
                and after[1] == ishape:
            ishape = after[2]                                  # pooled first, as vtrain does
        out.append((m, ishape))
    return out


def attainable_other(arch: str, shape: tuple[int, int, int], k: int, batch: int) -> float:
    """Seconds of the model's batch norms (training mode, running statistics updated), ReLUs,
    max-pools and adaptive pools alone, forward and backward, for ``k`` models on ``batch``
    samples each: every layer with its fastest form (the K models' channels side by side,
    channels-last or NCHW, or one model after another), the memory-bound part of a step."""
    total = 0.0
    for m, (c, *hw) in other_layers(arch, shape):
        candidates = []
        for together, cl in ((True, True), (True, False), (False, True), (False, False)):
            ch = k * c if together else c
            x = torch.randn(batch, ch, *hw)
            if cl and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            elif cl:
                continue                                     # a (B, F) map has one layout
            x.requires_grad_()
            rm, rv = torch.zeros(ch), torch.ones(ch)
            g, b = torch.ones(ch, requires_grad=True), torch.zeros(ch, requires_grad=True)
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                def op(x, rm=rm, rv=rv, g=g, b=b, m=m):
                    return F.batch_norm(x, rm, rv, g, b, True, m.momentum or 0.1, m.eps)
            elif isinstance(m, nn.ReLU):
                def op(x):
                    return F.relu(x)
            elif isinstance(m, nn.MaxPool2d):
                def op(x, m=m):
                    return F.max_pool2d(x, m.kernel_size, m.stride, m.padding, m.dilation,
                                        m.ceil_mode)
            else:
                def op(x, m=m):
                    return F.adaptive_avg_pool2d(x, m.output_size)
            grad = torch.ones_like(op(x.detach()))

            wrt = [x, g, b] if isinstance(m, nn.modules.batchnorm._BatchNorm) else [x]

            def run(x=x, op=op, grad=grad, wrt=wrt, reps=1 if together else k):
                for _ in range(reps):    # gradients returned, not added into .grad (a pass)
                    torch.autograd.grad(op(x), wrt, grad)
            candidates.append(run)
        total += min(best_time(fn) for fn in candidates)
    return total


def bandwidth() -> float:
    """Bytes per second of one large copy (read and write of 77 MB each): the memory bus's rate
    for the memory-bound layers, a reference for how close their native kernels come."""
    x = torch.randn(64 * 96 * 28 * 28 * 4)
    y = torch.empty_like(x)
    return 2 * 4 * x.numel() / best_time(lambda: y.copy_(x))


def peak() -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return 2 * 1024**3 / best_time(lambda: a @ b)


def pool_for(size: int, n_pool: int):
    ds = load_dataset("digits" if size == 8 else "fashion_mnist")
    return ds.x_train[:n_pool].contiguous(), ds.y_train[:n_pool].contiguous()


def bank_rates(arch: str, x, y, k: int, n: int, batch: int, repeats: int) -> dict[str, float]:
    """Sample-epochs per second, vectorised and sequential, best of ``repeats`` interleaved."""
    config = TrainConfig(epochs=1, batch_size=batch, optimizer="adam", lr=0.005)
    g = torch.Generator().manual_seed(0)
    subsets = [torch.randperm(x.shape[0], generator=g)[:n] for _ in range(k)]
    seeds = list(range(k))

    def models():
        out = []
        for s in seeds:
            seed_everything(s)
            out.append(build_model(arch, "bn", in_channels=x.shape[1], num_classes=10,
                                   image_size=x.shape[-1]))
        return out

    def vec():
        V.train_models(models(), x, y, subsets, config=config, seeds=seeds)

    def seq():
        for m, s, idx in zip(models(), seeds, subsets, strict=True):
            train_model(m, x[idx], y[idx], config=config, seed=s)

    small = [s[: 2 * batch] for s in subsets[:2]]                           # warm-up
    V.train_models(models()[:2], x, y, small, config=config, seeds=seeds[:2])
    train_model(models()[0], x[small[0]], y[small[0]], config=config, seed=0)
    times = {"vectorised": [], "sequential": []}
    for _ in range(repeats):
        for name, fn in (("sequential", seq), ("vectorised", vec)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: k * n / min(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archs", nargs="+", default=["lenet", "resnet20", "densenet", "resnet18"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 28], help="8 (digits), 28 (fmnist)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=0,
                    help="training samples per model (default: LeNet 2000 at 28x28, the "
                         "fmnist profile's banks, and 640 at 8x8; 64 for the wide networks)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"bench_roofline: torch {torch.__version__}, {os.cpu_count()} logical CPUs, "
          f"batch {args.batch}; load average at start {load()}", flush=True)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        top = peak()
        print(f"threads {threads}: peak (1024^3 float32 matmul) {top / 1e9:.1f} GFLOP/s; copy "
              f"{bandwidth() / 1e9:.1f} GB/s (read + write)", flush=True)
        for size in args.sizes:
            for arch in args.archs:
                k = K_MODELS.get(arch, 4)
                n = args.samples or ((2000 if size > 8 else 640) if arch in K_MODELS else 64)
                shape = (1, size, size)
                per_sample = step_flops(arch, shape, args.batch)
                fl, sec = attainable(arch, shape, k, args.batch)
                rate = fl / sec
                other = attainable_other(arch, shape, k, args.batch)
                all_sps = rate / per_sample * sec / (sec + other)   # every layer at its best
                x, y = pool_for(size, max(2 * n, 1000))
                r = bank_rates(arch, x, y, k, n, args.batch, args.repeats)
                row = {"threads": threads, "size": size, "arch": arch, "k": k,
                       "mflop_per_sample": per_sample / 1e6, "peak_gflops": top / 1e9,
                       "attainable_gflops": rate / 1e9, "attainable_sps": rate / per_sample,
                       **{f"{name}_sps": v for name, v in r.items()},
                       **{f"{name}_frac": v * per_sample / rate for name, v in r.items()},
                       "other_share": other / (sec + other), "all_sps": all_sps,
                       **{f"{name}_frac_all": v / all_sps for name, v in r.items()}}
                rows.append(row)
                print(f"  {size}x{size} {arch:9s} K={k:2d}: {per_sample / 1e6:8.2f} MFLOP/sample-"
                      f"step; attainable {rate / 1e9:6.1f} GFLOP/s = {rate / per_sample:9,.0f} "
                      f"sample-epochs/s; vectorised {r['vectorised']:8,.0f} "
                      f"({row['vectorised_frac']:5.1%}), sequential {r['sequential']:8,.0f} "
                      f"({row['sequential_frac']:5.1%}); vec/seq "
                      f"{r['vectorised'] / r['sequential']:.2f}x; with norms, pools and ReLUs "
                      f"({row['other_share']:.0%} of it) attainable {all_sps:9,.0f}: vectorised "
                      f"{row['vectorised_frac_all']:5.1%}, sequential "
                      f"{row['sequential_frac_all']:5.1%}", flush=True)
    print(f"load average at end {load()}")
    print()
    print("| threads | image | arch (K) | MFLOP / sample-step | peak GFLOP/s | attainable GFLOP/s "
          "| attainable sample-epochs/s | vectorised | sequential | vec / seq "
          "| norms, pools, ReLUs: share of attainable time | attainable with them "
          "| vectorised of it | sequential of it |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['threads']} | {r['size']}x{r['size']} | {r['arch']} ({r['k']}) | "
              f"{r['mflop_per_sample']:.2f} | {r['peak_gflops']:.0f} | {r['attainable_gflops']:.0f} | "
              f"{r['attainable_sps']:,.0f} | {r['vectorised_sps']:,.0f} ({r['vectorised_frac']:.0%}) | "
              f"{r['sequential_sps']:,.0f} ({r['sequential_frac']:.0%}) | "
              f"{r['vectorised_sps'] / r['sequential_sps']:.2f}x | {r['other_share']:.0%} | "
              f"{r['all_sps']:,.0f} | {r['vectorised_frac_all']:.0%} | "
              f"{r['sequential_frac_all']:.0%} |")
    return rows


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
