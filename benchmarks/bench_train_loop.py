"""Time one training epoch on the digits: bnmem's tensor loop against a plain DataLoader loop.

    .venv/bin/python benchmarks/bench_train_loop.py [--arch lenet --norm bn --repeats 7 --threads 1]

Both loops do the same work per epoch: the same model, batch size 128, shuffled batches, SGD with
momentum and weight decay, no augmentation, the epoch's mean training loss. The second pair of
lines adds what every memorization run also needs each epoch: eval-mode accuracy and loss on
the clean and the flipped training samples (10% flipped) and on the test set; bnmem does that in
one forward over the training set, the plain loop with a DataLoader per group. Prints median
times over the repeats and the ratio (plain / bnmem; above 1 means bnmem is faster). Prints, does
not assert: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from bnmem_utils.core.device import resolve_device
from bnmem_utils.data.datasets import corrupt, load_dataset
from bnmem_utils.models.nets import build_model
from bnmem_utils.training.loop import TrainConfig, train_model


def plain_epoch(model, x, y, *, batch_size, lr, momentum, weight_decay, seed, eval_sets=()):
    """One epoch the textbook way: TensorDataset + DataLoader(shuffle=True), .item() per step."""
    dev = next(model.parameters()).device
    loader = DataLoader(TensorDataset(x.cpu(), y.cpu()), batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    model.train()
    total, count = 0.0, 0
    for xb, yb in loader:
        xb, yb = xb.to(dev), yb.to(dev)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item() * len(yb)
        count += len(yb)
    out = {"train_loss": total / count}
    model.eval()
    with torch.no_grad():
        for name, (xe, ye) in eval_sets:
            correct, loss_sum = 0, 0.0
            for xb, yb in DataLoader(TensorDataset(xe.cpu(), ye.cpu()), batch_size=1024):
                logits = model(xb.to(dev))
                loss_sum += F.cross_entropy(logits, yb.to(dev), reduction="sum").item()
                correct += (logits.argmax(1) == yb.to(dev)).sum().item()
            out[f"{name}_acc"], out[f"{name}_loss"] = correct / len(ye), loss_sum / len(ye)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="lenet")
    ap.add_argument("--norm", default="bn")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = resolve_device(args.device)
    ds = load_dataset("digits", device=dev)
    cs = corrupt(ds, flip_rate=0.1, seed=0)
    groups = cs.groups()
    cfg = TrainConfig(epochs=1, batch_size=128, augment=False, schedule="none")
    hyper = {"batch_size": cfg.batch_size, "lr": cfg.lr, "momentum": cfg.momentum,
             "weight_decay": cfg.weight_decay}
    eval_sets = [(n, (cs.x[m], cs.y[m])) for n, m in groups.items()] + [("test", (ds.x_test, ds.y_test))]

    def fresh():
        torch.manual_seed(0)
        return build_model(args.arch, args.norm, in_channels=1, image_size=8).to(dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    runs = {
        "bnmem loop, train only": lambda m, s: train_model(m, cs.x, cs.y, config=cfg, seed=s),
        "DataLoader, train only": lambda m, s: plain_epoch(m, cs.x, cs.y, seed=s, **hyper),
        "bnmem loop, + eval": lambda m, s: train_model(
            m, cs.x, cs.y, config=cfg, seed=s, groups=groups, test=(ds.x_test, ds.y_test)),
        "DataLoader, + eval": lambda m, s: plain_epoch(
            m, cs.x, cs.y, seed=s, eval_sets=eval_sets, **hyper),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(args.repeats + 1):                  # the first round warms up, not timed
        for name, fn in runs.items():                    # interleaved: load drifts hit all alike
            model = fresh()
            sync()
            t = time.perf_counter()
            fn(model, rep)
            sync()
            if rep:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"digits: {len(cs)} training samples, {args.arch}/{args.norm}, batch 128, device {dev}, "
          f"{args.threads} thread(s), median of {args.repeats} epochs")
    for name, v in times.items():
        print(f"  {name:<24} {med[name] * 1e3:8.1f} ms   (min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f})")
    for what in ("train only", "+ eval"):
        ratio = med[f"DataLoader, {what}"] / med[f"bnmem loop, {what}"]
        print(f"ratio DataLoader / bnmem ({what}): {ratio:.2f}x")


if __name__ == "__main__":
    main()
