"""Eval-mode forward passes of ResNet-20 and DenseNet-BC on a CPU by layout and batch size.

A bank queries its members, and a grid run evaluates after each epoch, in batches of 1,024
(``MeasureConfig.query_batch_size``, ``TrainConfig.eval_batch_size``). On a CPU the activations
of a deep network at that batch outgrow the caches; this prints, for each network (BN, 28x28x1,
untrained: the speed does not depend on the weights), images per second in NCHW and
channels-last at each ``--batches`` size, on ``--threads`` threads, each timed for ``--seconds``
after one warm-up batch::

    .venv/bin/python benchmarks/bench_forward_batch.py        # --threads 1 --batches 128 1024
"""

from __future__ import annotations

import argparse
import time

import torch

from bnmem_utils.models.nets import build_model


def rate(model: torch.nn.Module, x: torch.Tensor, batch: int, seconds: float) -> float:
    """Images per second of ``model``'s forward passes over ``x`` in batches of ``batch``."""
    with torch.no_grad():
        model(x[:batch])
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            for i in range(0, x.shape[0], batch):
                n += model(x[i:i + batch]).shape[0]
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", nargs="+", default=["densenet", "resnet20"])
    p.add_argument("--batches", nargs="+", type=int, default=[128, 1024])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    x = torch.randn(max(args.batches), 1, 28, 28)
    print(f"threads {args.threads}; images/s of eval-mode forward passes, BN, 28x28x1")
    print("| network | layout | " + " | ".join(f"batch {b}" for b in args.batches) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in args.batches) + " |")
    for arch in args.archs:
        for layout in ("NCHW", "channels-last"):
            model = build_model(arch, "bn", in_channels=1, num_classes=10).eval()
            if layout == "channels-last":
                model = model.to(memory_format=torch.channels_last)
            rates = [rate(model, x, b, args.seconds) for b in args.batches]
            print(f"| {arch} | {layout} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
