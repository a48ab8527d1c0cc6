"""One-shot GPU check of the fast paths: under 5 minutes on one H200, no internet.

    benchmarks/gpu_smoke.sh                 # on a machine with a CUDA GPU
    benchmarks/gpu_smoke.sh --tiny          # tiny sizes, any device (the CPU check of the script)

Prints, each next to its baseline and its target:

1. a LeNet-BN bank: 64 models x 10 epochs, each model on all 60,000 MNIST-shape samples
   (batch 128, SGD, bf16 autocast), trained at once by :func:`bnmem_utils.training.vectorised.train_models`
   (target: under 60 s; a real bank trains each model on half of its pool, half this work);
   baseline: :func:`bnmem_utils.training.loop.train_model` one model after another, timed on a few
   model-epochs and extrapolated to the 640 model-epochs (said so in the output);
2. ResNet-18 training throughput on CIFAR-10-shape data (3x32x32, batch 512) in images per
   second with bf16 autocast, channels-last and ``torch.compile`` (target: at least 30,000),
   next to plain fp32 (no autocast, NCHW, no compile);
3. a ResNet-20 bank on CIFAR-10-shape data: K models trained at once by the vectorised trainer
   (vmap path; K from :func:`bnmem_utils.jobs.bank_models.default_chunk`, the device's memory) against
   one model after another (:func:`bnmem_utils.training.loop.train_model`, one model timed, times K);
4. the projected training time of every notebook under the ``gpu`` and ``paper`` profiles:
   its training work (:func:`bnmem_utils.run.work.training_work`: models x epochs x training
   samples, from the profile and the notebooks' defaults) over the training rate (sample-epochs
   per second) measured here for each architecture, image shape and trainer it uses (its banks'
   default trainer on a GPU, :func:`bnmem_utils.jobs.config.bank_trainer`), next to the same at
   the rates of :data:`bnmem_utils.run.work.RATES` (one H200); with ``--no-measure-rates`` only
   parts 1 and 3's rates are measured and the others come from that table, labelled. Training
   only: queries, per-sample gradients and evaluation are not in it (said so).

The data are the embedded 8x8 digits upsampled to 28x28 (MNIST shape) and, for CIFAR shape,
Gaussian images with random labels (throughput does not depend on the pixels), all resident on
the device. Compilation and cuDNN autotuning happen in untimed warm-up runs.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

from bnmem_utils.core.device import resolve_device, seed_everything
from bnmem_utils.data.datasets import load_dataset
from bnmem_utils.jobs.bank_models import default_chunk
from bnmem_utils.models.nets import build_model
from bnmem_utils.training.loop import TrainConfig, train_model
from bnmem_utils.training.vectorised import train_models


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def mnist_shape(n: int, dev: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` MNIST-shape images (n, 1, 28, 28): the digits upsampled, drawn with repetition."""
    ds = load_dataset("digits")
    up = F.interpolate(ds.x_train, size=(28, 28), mode="bilinear", align_corners=False)
    idx = torch.randint(0, up.shape[0], (n,), generator=torch.Generator().manual_seed(seed))
    return up[idx].contiguous().to(dev), ds.y_train[idx].to(dev)


def cifar_shape(n: int, dev: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 3, 32, 32, generator=g).to(dev),
            torch.randint(0, 10, (n,), generator=g).to(dev))


def lenets(k: int, seed: int = 0) -> list[torch.nn.Module]:
    out = []
    for i in range(k):
        seed_everything(seed + i)
        out.append(build_model("lenet", "bn", in_channels=1, num_classes=10, image_size=28))
    return out


def bank_part(args, dev: torch.device) -> dict:
    x, y = mnist_shape(args.samples, dev)
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch, lr=0.05)
    everything = torch.arange(args.samples)
    # warm-up (cuDNN autotuning, allocator): 2 epochs' worth of steps on a slice, untimed
    warm = min(args.samples, 20 * args.batch)
    train_models(lenets(args.models), x[:warm], y[:warm], [torch.arange(warm)] * args.models,
                 config=TrainConfig(epochs=1, batch_size=args.batch), seeds=range(args.models))
    sync(dev)
    t0 = time.perf_counter()
    stacked, hist = train_models(lenets(args.models), x, y, [everything] * args.models,
                                 config=cfg, seeds=range(args.models))
    sync(dev)
    vec_s = time.perf_counter() - t0
    losses = [h.last().get("train_loss", float("nan")) for h in hist]
    finite = all(v == v for v in losses)
    # sequential baseline: a few model-epochs, extrapolated
    one = TrainConfig(epochs=1, batch_size=args.batch, lr=0.05)
    model = lenets(1)[0]
    train_model(model, x[:warm], y[:warm], config=one, seed=0, device=dev)      # warm-up
    sync(dev)
    t0 = time.perf_counter()
    for i in range(args.seq_models):
        train_model(lenets(1, seed=100 + i)[0], x, y, config=one, seed=i, device=dev)
    sync(dev)
    per_model_epoch = (time.perf_counter() - t0) / args.seq_models
    seq_s = per_model_epoch * args.models * args.epochs
    return {"vec_s": vec_s, "seq_s": seq_s, "seq_measured": args.seq_models,
            "finite": finite, "first_loss": hist[0].rows[0]["train_loss"],
            "last_loss": float(sum(losses) / len(losses))}


def resnet_part(args, dev: torch.device) -> dict:
    x, y = cifar_shape(args.resnet_samples, dev)
    warm = min(args.resnet_samples, 8 * args.resnet_batch)
    out = {}
    settings = {"fast": dict(amp="bf16" if dev.type == "cuda" else "off", channels_last=True,
                             compile=args.compile),
                "plain fp32": dict(amp="off", channels_last=False, compile=False)}
    for name, s in settings.items():
        seed_everything(0)
        model = build_model("resnet18", "bn", in_channels=3, num_classes=10)
        cfg = TrainConfig(epochs=1, batch_size=args.resnet_batch, lr=0.1, amp=s["amp"])
        kw = {"channels_last": s["channels_last"], "compile": s["compile"], "device": dev}
        train_model(model, x[:warm], y[:warm], config=cfg, **kw)                 # warm-up
        sync(dev)
        t0 = time.perf_counter()
        h = train_model(model, x, y, config=cfg, **kw)
        sync(dev)
        seconds = time.perf_counter() - t0
        out[name] = {"img_s": args.resnet_samples / seconds, "seconds": seconds,
                     "loss": h.last().get("train_loss", float("nan")), **s}
    return out


def train_rate(arch: str, shape: tuple[int, int, int], dev: torch.device, *, k: int,
               batch: int, steps: int, num_classes: int = 10) -> float:
    """Training sample-epochs per second of ``arch`` on random ``shape`` images, ``steps``
    batches of ``batch``: ``k`` models at once (vectorised) when ``k`` > 1, else one model.
    The default TrainConfig otherwise (bf16 autocast on CUDA). A one-step run of the same
    shapes first, untimed (allocator, cuDNN autotuning)."""
    c, h, _ = shape
    n = batch * steps
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g).to(dev)
    y = torch.randint(0, num_classes, (n,), generator=g).to(dev)

    def models(count: int, seed: int = 0) -> list[torch.nn.Module]:
        out = []
        for i in range(count):
            seed_everything(seed + i)
            out.append(build_model(arch, "bn", in_channels=c, num_classes=num_classes,
                                   image_size=h))
        return out

    def run(samples: int) -> None:
        cfg = TrainConfig(epochs=1, batch_size=batch, lr=0.05, augment=False)
        if k > 1:
            train_models(models(k), x[:samples], y[:samples], [torch.arange(samples)] * k,
                         config=cfg, seeds=range(k), device=dev)
        else:
            train_model(models(1)[0], x[:samples], y[:samples], config=cfg, seed=0, device=dev)

    run(batch)
    sync(dev)
    t0 = time.perf_counter()
    run(n)
    sync(dev)
    return max(k, 1) * n / (time.perf_counter() - t0)


def resnet20_bank_part(args, dev: torch.device) -> dict:
    from bnmem_utils.jobs.config import RunConfig

    k = args.bank_models or default_chunk(RunConfig.bank(arch="resnet20", dataset="cifar10",
                                                     batch_size=args.bank_batch), dev, (3, 32, 32))
    kw = dict(dev=dev, batch=args.bank_batch, steps=args.bank_steps)
    vec = train_rate("resnet20", (3, 32, 32), k=k, **kw)
    seq = train_rate("resnet20", (3, 32, 32), k=1, **kw)
    return {"k": k, "vec": vec, "seq": seq}


def measured_rates(args, dev: torch.device, b: dict, r20: dict | None) -> dict:
    """``{(arch, shape, vectorised): Rate}`` for every key the ``gpu`` and ``paper`` profiles
    train: parts 1 and 3's measurements, then (unless ``--no-measure-rates``) each other key
    measured here by :func:`train_rate`, else the RATES table's rate, labelled as such."""
    from bnmem_utils.jobs.config import RunConfig
    from bnmem_utils.run import work as W

    lenet = args.models * args.epochs * args.samples
    here = {("lenet", W.MNIST_SHAPE, True): (lenet / b["vec_s"], "part 1"),
            ("lenet", W.MNIST_SHAPE, False): (lenet / b["seq_s"], "part 1, extrapolated")}
    if r20:
        here |= {("resnet20", W.CIFAR_SHAPE, True): (r20["vec"], "part 3"),
                 ("resnet20", W.CIFAR_SHAPE, False): (r20["seq"], "part 3")}
    keys = sorted({(r.arch, r.shape, r.vectorised) for name in PROJECTED
                   for rows in W.training_work(name).values() for r in rows})
    rates = {}
    for arch, shape, vec in keys:
        key = (arch, shape, vec)
        if key not in here and args.measure_rates:
            k = default_chunk(RunConfig.bank(arch=arch, batch_size=args.bank_batch), dev,
                              shape) if vec else 1
            here[key] = (train_rate(arch, shape, dev, k=k, batch=args.bank_batch,
                                    steps=args.bank_steps),
                         f"batch {args.bank_batch}, {args.bank_steps} steps")
        rates[key] = (W.Rate(here[key][0], f"measured here ({here[key][1]})") if key in here
                      else W.Rate(W.RATES[key].value, "from RATES (one H200, 2026-12-04): "
                                  + W.RATES[key].source.split(" (")[0].split(":")[0]))
    return rates


#: The profiles whose training part 4 projects.
PROJECTED = ("gpu", "paper")


def projection_part(args, dev: torch.device, b: dict, r20: dict | None) -> None:
    """Part 4: each notebook of the ``gpu`` and ``paper`` profiles, its training work
    (:func:`bnmem_utils.run.work.training_work`) over the rates of :func:`measured_rates`, next
    to the same at the RATES table (one H200)."""
    from bnmem_utils.run import work as W

    rates = measured_rates(args, dev, b, r20)
    print("[4] projected training time of the gpu and paper profiles (training only: queries, "
          "per-sample gradients and evaluation not included; each profile whole, in order), "
          "from the rates below, next to the same at bnmem_utils.run.work.RATES (one H200):")
    for key, rate in rates.items():
        print(f"    {W.rate_label(key):38s} {rate.value:12,.0f} "
              f"sample-epochs/s, {rate.source}")
    for name in PROJECTED:
        work = W.training_work(name)
        print(f"    profile {name}:")
        for nb, rows in work.items():
            if rows:
                print(f"      {nb:24s} {W.duration(W.projected_seconds(rows, rates)):>10s} here "
                      f"({W.duration(W.projected_seconds(rows))} at RATES)")
        every = [r for rows in work.values() for r in rows]
        print(f"      {'all notebooks:':24s} {W.duration(W.projected_seconds(every, rates)):>10s} "
              f"of training on this device ({W.duration(W.projected_seconds(every))} at RATES)",
              flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny sizes: a functional check on any device")
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--models", type=int, default=64, help="LeNet-BN models trained at once")
    ap.add_argument("--epochs", type=int, default=10, help="epochs of each model")
    ap.add_argument("--samples", type=int, default=60_000, help="MNIST-shape samples per model")
    ap.add_argument("--batch", type=int, default=128, help="LeNet batch size")
    ap.add_argument("--seq-models", type=int, default=2, help="model-epochs timed sequentially")
    ap.add_argument("--resnet-samples", type=int, default=50_000, help="CIFAR-shape images")
    ap.add_argument("--resnet-batch", type=int, default=512, help="ResNet-18 batch size")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the fast ResNet run (default: on CUDA only)")
    ap.add_argument("--skip-resnet", action="store_true", help="only the LeNet bank")
    ap.add_argument("--bank-models", type=int, default=0,
                    help="ResNet-20 models at once (default: from the device's memory)")
    ap.add_argument("--bank-batch", type=int, default=128, help="batch of parts 3 and 4")
    ap.add_argument("--bank-steps", type=int, default=40, help="timed steps of parts 3 and 4")
    ap.add_argument("--skip-projection", action="store_true", help="no part 4")
    ap.add_argument("--measure-rates", action=argparse.BooleanOptionalAction, default=True,
                    help="part 4 measures every rate it needs (--no-measure-rates: only parts "
                         "1 and 3's, the others from bnmem_utils.run.work.RATES, labelled)")
    args = ap.parse_args(argv)
    dev = resolve_device(args.device)
    if args.tiny:
        args.models, args.epochs, args.samples, args.seq_models = 4, 1, 1024, 1
        args.resnet_samples, args.resnet_batch = 256, 64
        args.bank_models, args.bank_batch, args.bank_steps = args.bank_models or 2, 8, 2
    if args.compile is None:
        args.compile = dev.type == "cuda"
    start = time.perf_counter()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    print(f"bnmem GPU smoke: torch {torch.__version__}, device {dev} ({name}), "
          f"{torch.get_num_threads()} CPU threads{', TINY sizes' if args.tiny else ''}", flush=True)

    b = bank_part(args, dev)
    work = f"{args.models} LeNet-BN x {args.epochs} epochs x {args.samples:,} samples"
    print(f"[1] {work} (batch {args.batch}, bf16 on CUDA):")
    print(f"    vectorised   {b['vec_s']:8.1f} s   "
          f"({args.models * args.epochs * args.samples / b['vec_s']:,.0f} samples/s; "
          f"mean loss {b['first_loss']:.3f} -> {b['last_loss']:.3f}; finite: {b['finite']})")
    print(f"    sequential   {b['seq_s']:8.1f} s   (extrapolated from {b['seq_measured']} "
          f"model-epoch(s) of train_model)")
    print(f"    ratio        {b['seq_s'] / b['vec_s']:8.1f} x   target < 60 s: "
          f"{'met' if b['vec_s'] < 60 else 'NOT met'}{' (tiny sizes: not the target run)' if args.tiny else ''}",
          flush=True)
    if not args.skip_resnet:
        r = resnet_part(args, dev)
        fast, plain = r["fast"], r["plain fp32"]
        print(f"[2] ResNet-18, {args.resnet_samples:,} CIFAR-10-shape images, batch "
              f"{args.resnet_batch}, one epoch:")
        print(f"    {'amp ' + fast['amp'] + ', channels-last' + (', compiled' if fast['compile'] else '')}: "
              f"{fast['img_s']:10,.0f} img/s ({fast['seconds']:.1f} s)")
        print(f"    plain fp32 baseline:        {plain['img_s']:10,.0f} img/s ({plain['seconds']:.1f} s)")
        print(f"    ratio {fast['img_s'] / plain['img_s']:.2f} x   target >= 30,000 img/s: "
              f"{'met' if fast['img_s'] >= 30_000 else 'NOT met'}"
              f"{' (tiny sizes: not the target run)' if args.tiny else ''}")
    r20 = resnet20_bank_part(args, dev)
    print(f"[3] ResNet-20 bank, CIFAR-10-shape images, batch {args.bank_batch}, "
          f"{args.bank_steps} steps:")
    print(f"    {r20['k']} models at once: {r20['vec']:10,.0f} sample-epochs/s")
    print(f"    one after another:  {r20['seq']:10,.0f} sample-epochs/s (one model timed)")
    print(f"    ratio {r20['vec'] / r20['seq']:.2f} x; per model and epoch of a 25,000-sample "
          f"half of CIFAR-10: {25_000 / r20['vec']:.1f} s at once, {25_000 / r20['seq']:.1f} s "
          f"one after another", flush=True)
    if not args.skip_projection:
        projection_part(args, dev, b, r20)
    print(f"total wall time {time.perf_counter() - start:.0f} s (target < 300 s on one H200)")


if __name__ == "__main__":
    main()
