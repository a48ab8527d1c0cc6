"""The substrate's closing check: digits with 10% flipped labels, LeNet, BN
against no norm, 3 seeds. Prints accuracy on the flipped samples (against their flipped labels:
memorization) at epoch 10 and at the end, clean training and test accuracy, each as a mean with a
95% Student-t interval over seeds, and the paired BN - none difference.

    .venv/bin/python benchmarks/show_substrate.py [--epochs 30] [--augment] [--seeds 3]

Each seed draws its own flipped samples, initialisation and batch order (the same for BN and no
norm, so the difference is paired). About 1-3 s per model on one CPU core.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bnmem_utils.core.stats import diff_ci, mean_ci
from bnmem_utils.data.datasets import corrupt, load_dataset
from bnmem_utils.models.nets import build_model
from bnmem_utils.training.loop import TrainConfig, train_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--flip-rate", type=float, default=0.1)
    ap.add_argument("--arch", default="lenet")
    ap.add_argument("--augment", action="store_true", help="random 1-pixel shifts (off by default)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ds = load_dataset("digits")
    cfg = TrainConfig(epochs=args.epochs, augment=args.augment)
    print(f"digits, {args.flip_rate:.0%} flipped labels, {args.arch}, {args.seeds} seeds; {cfg}")
    metrics = ("flipped_acc@10", "flipped_acc@end", "clean_acc@end", "test_acc@end")
    results: dict[str, dict[str, list[float]]] = {}
    for norm in ("bn", "none"):
        results[norm] = {m: [] for m in metrics}
        secs = []
        for seed in range(args.seeds):
            cs = corrupt(ds, flip_rate=args.flip_rate, seed=seed)
            torch.manual_seed(seed)
            model = build_model(args.arch, norm, in_channels=1, image_size=8)
            t = time.perf_counter()
            hist = train_model(model, cs.x, cs.y, config=cfg, seed=seed, groups=cs.groups(),
                               test=(ds.x_test, ds.y_test)).raise_if_diverged()
            secs.append(time.perf_counter() - t)
            e10, last = hist.at_epoch(min(10, args.epochs)), hist.last()
            for m, v in zip(metrics, (e10["flipped_acc"], last["flipped_acc"], last["clean_acc"],
                                      last["test_acc"]), strict=True):
                results[norm][m].append(v)
        print(f"\n{norm}: {np.mean(secs):.2f} s per model (mean of {len(secs)})")
        for m in metrics:
            vals = results[norm][m]
            print(f"  {m:<16} {mean_ci(vals).fmt(3)}   per seed: {', '.join(f'{v:.3f}' for v in vals)}")
    print("\nBN - none (paired by seed):")
    for m in metrics:
        print(f"  {m:<16} {diff_ci(results['bn'][m], results['none'][m], paired=True).fmt(3)}")


if __name__ == "__main__":
    main()
