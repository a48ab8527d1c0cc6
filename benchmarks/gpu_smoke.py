"""One-shot GPU check of the fast paths, within a time budget (--budget, 255 s), no internet.

    benchmarks/gpu_smoke.sh                 # on a machine with a CUDA GPU
    benchmarks/gpu_smoke.sh --tiny          # tiny sizes, any device (the CPU check of the script)
    benchmarks/gpu_smoke.sh --json rates.json --commit abc1234   # also the figures, as JSON

``--json`` writes what was measured: the training rates in the schema of
``bnmem_utils/run/gpu_rates.json`` (``python -m bnmem_utils.run.work --adopt rates.json`` takes
them as the rates the profiles are projected from) and every part's figures.

Prints, each next to its baseline and its target:

1. a LeNet-BN bank: 64 models x 10 epochs, each model on all 60,000 MNIST-shape samples
   (batch 128, SGD, bf16 autocast), trained at once by :func:`bnmem_utils.training.vectorised.train_models`
   (target: under 60 s; a real bank trains each model on half of its pool, half this work);
   baseline: :func:`bnmem_utils.training.loop.train_model` one model after another, timed on a few
   model-epochs and extrapolated to the 640 model-epochs (said so in the output);
2. ResNet-18's bare training step on CIFAR-10-shape data (``gpu_step.py``: one persistent model
   and fused optimizer, a fixed batch on the device, no augmentation, no host sync) in fp32, in
   bf16 with channels-last, and with the step function compiled (compilation timed apart;
   torch.compile compiles the forward and its backward, and runs eagerly what it cannot
   trace, such as the fused optimizer on some torch releases);
   bank members trained as a bank trains them (:func:`bnmem_utils.training.loop.train_model`,
   one compiled forward reused by every member on CUDA, augmentation included) as a fraction of
   the bare step at the same arithmetic (target: at least 0.90), with the first member's
   compilation apart and the compilations of the later ones (0: reused); a trained member's
   queries as the bank makes them, in the bank's precision (its training's: bf16 on CUDA) and in
   float32, and the members' rate with them at the gpu profile's epochs of notebook 04;
   notebook 03's per-sample gradients of a ResNet-18 BN (``gpu_step.per_sample_grads``, float32)
   under both definitions, in seconds and in trained images' time at the rate the projections
   divide ResNet-18's work by (:func:`per_sample_cost`; the queries' speed-up likewise,
   :func:`forward_speedup`); and the
   best rate as a fraction of the card's dense bf16 peak (target: 40,000 img/s on an H100 or
   H200);
3. each wide network's bank (ResNet-20, ResNet-18, DenseNet) on CIFAR-10-shape data, K models
   at once by the vectorised trainer (K from :func:`bnmem_utils.jobs.bank_models.default_chunk`,
   the device's memory) against one model after another, next to the trainer the rule picks
   (:data:`bnmem_utils.jobs.config.GPU_TRAINER`);
4. the projected time of every notebook under the ``gpu`` and ``paper`` profiles:
   its training work (:func:`bnmem_utils.run.work.training_work`: models x epochs x training
   samples, from the profile and the notebooks' defaults) over the training rate (sample-epochs
   per second) measured here for each architecture, image shape and trainer it uses (its banks'
   default trainer on a GPU, :func:`bnmem_utils.jobs.config.bank_trainer`), next to the same at
   the rates of :data:`bnmem_utils.run.work.RATES` (those of ``bnmem_utils/run/gpu_rates.json``,
   measured on the last GPU lent, and the rates derived from them); with ``--no-measure-rates``
   only parts 1 and 3's rates are measured and the others come from that table, labelled.
   The forward passes of queries and evaluation count at each network's own speed-up over its
   training where this part times one model's queries (:func:`query_speedups`; written beside
   the rate in ``--json``), else at ``FORWARD_SPEEDUP`` times the training rate, and 03's
   per-sample gradients at ``GRADIENT_COST`` trained images each.

The parts run in the order ``--parts`` gives (default 1, 3, 4, 2), each until its share of
``--budget`` (:data:`WEIGHTS`);
one that runs out of time is stopped, one that fails is reported in one line, and the run
goes on to its end, writing ``--json`` after every part.

The data are the embedded 8x8 digits upsampled to 28x28 (MNIST shape) and, for CIFAR shape,
Gaussian images with random labels (throughput does not depend on the pixels), all resident on
the device. Compilation and cuDNN autotuning happen in untimed warm-up runs.
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bnmem_utils.core.device import resolve_device, seed_everything
from bnmem_utils.data.datasets import load_dataset
from bnmem_utils.jobs.bank_models import default_chunk
from bnmem_utils.models.nets import build_model
from bnmem_utils.training.loop import TrainConfig, train_model
from bnmem_utils.training.vectorised import train_models

sys.path.insert(0, str(Path(__file__).resolve().parent))   # gpu_step.py, beside this file
from timebox import Clock, run_part  # noqa: E402  (beside this file too)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def mnist_shape(n: int, dev: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` MNIST-shape images (n, 1, 28, 28): the digits upsampled, drawn with repetition."""
    ds = load_dataset("digits")
    up = F.interpolate(ds.x_train, size=(28, 28), mode="bilinear", align_corners=False)
    idx = torch.randint(0, up.shape[0], (n,), generator=torch.Generator().manual_seed(seed))
    return up[idx].contiguous().to(dev), ds.y_train[idx].to(dev)


def lenets(k: int, seed: int = 0) -> list[torch.nn.Module]:
    out = []
    for i in range(k):
        seed_everything(seed + i)
        out.append(build_model("lenet", "bn", in_channels=1, num_classes=10, image_size=28))
    return out


def bank_part(args, dev: torch.device, out: dict) -> None:
    """Part 1 into ``out``, as it goes: the vectorised bank ("vec_s", "finite", "first_loss",
    "last_loss"), then the sequential baseline ("seq_s", extrapolated from "seq_measured"
    model-epochs)."""
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
    first = hist[0].rows[0] if hist[0].rows else {}               # none: diverged at once
    out.update(vec_s=vec_s, finite=all(v == v for v in losses),
               first_loss=first.get("train_loss", float("nan")),
               last_loss=float(sum(losses) / len(losses)))
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
    out.update(seq_s=per_model_epoch * args.models * args.epochs, seq_measured=args.seq_models)


def print_bank_part(args, b: dict) -> None:
    work = f"{args.models} LeNet-BN x {args.epochs} epochs x {args.samples:,} samples"
    print(f"[1] {work} (batch {args.batch}, bf16 on CUDA):")
    if "vec_s" in b:
        print(f"    vectorised   {b['vec_s']:8.1f} s   "
              f"({args.models * args.epochs * args.samples / b['vec_s']:,.0f} samples/s; "
              f"mean loss {b['first_loss']:.3f} -> {b['last_loss']:.3f}; finite: {b['finite']})")
    if "seq_s" in b:
        print(f"    sequential   {b['seq_s']:8.1f} s   (extrapolated from {b['seq_measured']} "
              f"model-epoch(s) of train_model)")
    if "vec_s" in b and "seq_s" in b:
        tiny = " (tiny sizes: not the target run)" if args.tiny else ""
        print(f"    ratio        {b['seq_s'] / b['vec_s']:8.1f} x   target < 60 s: "
              f"{'met' if b['vec_s'] < 60 else 'NOT met'}{tiny}")
    for key, words in (("vec_s", "vectorised"), ("seq_s", "sequential")):
        if key not in b:
            print(f"    {words:12s} not measured")
    sys.stdout.flush()


def step_part(args, dev: torch.device, out: dict, rates: dict) -> None:
    """Part 2 into ``out``, as it goes: ResNet-18's bare training step (``gpu_step.bare_step``)
    in fp32, in bf16 with channels-last, and compiled, without and with CUDA graphs (on CUDA, or
    with ``--compile``), and bank members trained as a bank trains them
    (``gpu_step.bank_member``): with the default ``compile="auto"`` and, where the step
    compiles, with CUDA graphs; all at one batch size. The cheap settings first, each
    compilation after them. Beside them, notebook 03's per-sample gradients
    (``gpu_step.per_sample_grads``), and ``rate``, at which they and the queries are priced:
    ResNet-18 one model after another at ``--bank-batch``, the rate the projections divide by
    (from ``rates`` where an earlier part of this call measured it, else measured here)."""
    import gpu_step

    out["gflop"] = gpu_step.flops_per_image("resnet18") / 1e9
    out["peak"] = gpu_step.peak_flops(dev)
    out["members"] = []
    kw = dict(batch=args.resnet_batch, steps=args.step_steps, warm=args.step_warm)
    out["fp32"] = gpu_step.bare_step("resnet18", dev, bf16=False, compile=False, **kw)
    out["bf16"] = gpu_step.bare_step("resnet18", dev, bf16=True, compile=False, **kw)
    member = dict(batch=args.resnet_batch, steps=args.step_steps, members=args.members)
    out["members"].append(gpu_step.bank_member("resnet18", dev, **member))
    key = ("resnet18", (3, 32, 32), False)
    out["rate"] = ({"img_s": rates[key][0], "how": rates[key][1]} if key in rates else
                   _attempt(lambda: {"img_s": train_rate(*key[:2], dev, k=1, batch=args.bank_batch,
                                                         steps=args.bank_steps),
                                     "how": f"part 2, batch {args.bank_batch}"}))
    out["grads"] = _attempt(lambda: gpu_step.per_sample_grads(
        "resnet18", dev, batch=args.bank_batch, measured=args.grad_samples, n=args.grad_images))
    if args.compile:
        out["bf16 compiled"] = gpu_step.bare_step("resnet18", dev, bf16=True, compile=True, **kw)
        if dev.type == "cuda":
            out["bf16 CUDA graphs"] = gpu_step.bare_step("resnet18", dev, bf16=True,
                                                         compile=True, mode="reduce-overhead",
                                                         **kw)
            out["members"].append(gpu_step.bank_member("resnet18", dev, compile="reduce-overhead",
                                                       queries=False, **member))


def _attempt(measure) -> dict:
    """``measure()``, or ``{"error": one line}`` where it fails (an out-of-memory error on a
    card the rest of the part still measures)."""
    try:
        return measure()
    except Exception as exc:                     # noqa: BLE001  (reported, the part goes on)
        first = (str(exc).splitlines() or [""])[0][:200]
        return {"error": f"{type(exc).__name__}: {first}"}


#: Part 2's bare-step settings, in words.
SETTINGS = {"fp32": "fp32, NCHW, eager", "bf16": "bf16 autocast, channels-last, eager",
            "bf16 compiled": "bf16 autocast, channels-last, step function compiled",
            "bf16 CUDA graphs": "the same compiled with mode 'reduce-overhead' (CUDA graphs)"}


def print_member(r: dict, m: dict) -> None:
    """One line for bank members against the bare step of the same arithmetic, and one for
    their compilation."""
    same = next((k for k in (m["bare"], "bf16") if k in r), None)
    ratio = (f"= {m['img_s'] / r[same]['img_s']:.2f} of the bare {same} step (target >= 0.90: "
             f"{'met' if m['img_s'] / r[same]['img_s'] >= 0.9 else 'NOT met'})" if same
             else f"(the bare {m['bare']} step not measured: no ratio)")
    print(f"    {m['members']} bank members, compile {m['mode']!r} (train_model as a bank trains "
          f"them, augmentation included): {m['img_s']:,.0f} img/s {ratio}")
    if m["syncs"] is not None:
        print(f"      host syncs in one member's epoch of {m['steps']} steps: {m['syncs']} "
              f"(target: none per step; the epoch's loss and its finiteness are read back at its end)")
    if m.get("queries"):
        print_queries(m, r[same]["img_s"] if same else None, same)
    if m["mode"] != "off":
        print(f"      the bank's first member {m['compile_s']:.1f} s (its compilation, once a "
              f"bank), then {m['graphs']} more compilation(s) "
              f"({'reused' if m['graphs'] == 0 else 'NOT reused'})")
    else:
        print(f"      the bank's first member {m['compile_s']:.1f} s; eager here (compile "
              f"'auto' compiles on CUDA with Triton only)")


def print_queries(m: dict, bare: float | None, name: str | None) -> None:
    """The bank's queries of one member (``gpu_step.member_queries``), in its precision and in
    float32, and the members' rate with them at the epochs of the gpu profile's notebook 04."""
    from bnmem_utils.run import work as W

    q = m["queries"]
    epochs = W.profile_parameters("gpu")["lira_epochs"]
    n = m["img_s"] * m["seconds"] / m["members"]               # images of one member's epoch
    queries_s = q["bank"] * 2 * n / q["pool"]              # its pool of 2 n, at the rate timed
    with_queries = epochs * n / (epochs * m["seconds"] / m["members"] + queries_s)
    ratio = (f" = {with_queries / bare:.2f} of the bare {name} step" if bare else "")
    print(f"      its queries as a bank makes them ({q['images']:,} images forward: a pool of "
          f"{q['pool']:,} in eval and train mode, population, test): {q['bank']:.2f} s in "
          f"{q['precision']} (the bank's), {q['fp32']:.2f} s in fp32 "
          f"({q['fp32'] / q['bank']:.1f}x); a member of {epochs} epochs (the gpu profile's "
          f"04) with its queries: {with_queries:,.0f} img/s{ratio}")


def print_grads(r: dict) -> None:
    """Notebook 03's per-sample gradients (``gpu_step.per_sample_grads``), in seconds and in
    trained images' time at the rate the projections divide by (:func:`per_sample_cost`), next
    to the derived costs they use until one is adopted."""
    from bnmem_utils.run import rates as R

    g, rate = r.get("grads"), r.get("rate") or {}
    if g is None or "error" in g:
        why = f" ({g['error']})" if g else ""
        print(f"    per-sample gradients (notebook 03): not measured{why}")
        return
    cost, derived = per_sample_cost({"resnet18_step": r}), R.DERIVED_GRADIENT_COST
    against = (f"trained images' time at {rate['img_s']:,.0f} img/s ({rate['how']})"
               if cost else f"no training rate to price them ({rate.get('error', 'not measured')})")
    words = {d: (f" = {cost[d]['value']:.3g} {unit} (derived: {derived[d].value:.3g})"
                 if cost else "")
             for d, unit in (("eval", "per sample"), ("train", "per image of its batch"))}
    print(f"    per-sample gradients (notebook 03, float32, ResNet-18 BN), {g['measured']:,} of "
          f"{g['n']:,} images, in {against}: eval mode {g['eval']:.2f} s{words['eval']}; train "
          f"mode {g['train']:.2f} s for as many Jacobian rows in batches of {g['batch']} "
          f"({g['forward']:,} images forward){words['train']}")


def _recompiled(m: dict) -> str:
    """``; N graphs compiled in the timed steps: NOT steady state`` where a compiled bare step
    compiled again after its warm-up (a rate that holds a compilation), else nothing."""
    n = m.get("graphs", 0)
    return f"; {n} graph(s) compiled in the timed steps: NOT steady state, more --step-warm" \
        if n else ""


def print_step_part(args, dev: torch.device, r: dict) -> None:
    if "gflop" not in r:
        print("[2] ResNet-18 training step: nothing measured", flush=True)
        return
    print(f"[2] ResNet-18 training step, CIFAR-10-shape images, batch {args.resnet_batch}, "
          f"{args.step_steps} steps timed after {args.step_warm} untimed; a trained image costs "
          f"{r['gflop']:.2f} GFLOP:")
    graphs = args.compile and dev.type == "cuda"
    wanted = ["fp32", "bf16"] + ["bf16 compiled"] * args.compile + ["bf16 CUDA graphs"] * graphs
    for name, words in SETTINGS.items():
        if name in r:
            extra = (f" (compilation and warm-up {r[name]['compile_s']:.1f} s, apart"
                     f"{_recompiled(r[name])})" if "compiled" in name or "graphs" in name else "")
            print(f"    bare step, {words:60s} {r[name]['img_s']:10,.0f} img/s{extra}")
        elif name in wanted:
            print(f"    bare step, {words:60s} not measured")
    for m in r["members"]:
        print_member(r, m)
    print_grads(r)
    for mode in ["'auto'", "'reduce-overhead'"][len(r["members"]):1 + graphs]:
        print(f"    bank members, compile {mode}: not measured")
    best = max((v["img_s"] for k, v in r.items() if k in SETTINGS), default=None)
    target = 40_000
    if best is None:
        pass
    elif r["peak"]:
        card, peak = r["peak"]
        print(f"    best bare step {best:,.0f} img/s = {best * r['gflop'] * 1e9 / peak:.1%} of the "
              f"{card}'s dense bf16 peak ({peak / 1e12:,.0f} TFLOP/s); target >= {target:,} "
              f"img/s ({target * r['gflop'] * 1e9 / peak:.1%} of peak): "
              f"{'met' if best >= target else 'NOT met'}")
    else:
        print(f"    best bare step {best:,.0f} img/s; no bf16 peak known for this device, so no "
              f"fraction of peak; target >= {target:,} img/s on an H100 or H200")
    sys.stdout.flush()


def train_rate(arch: str, shape: tuple[int, int, int], dev: torch.device, *, k: int,
               batch: int, steps: int, num_classes: int = 10) -> float:
    """Training sample-epochs per second of ``arch`` on random ``shape`` images, ``steps``
    batches of ``batch``: ``k`` models at once (vectorised) when ``k`` > 1, else one model.
    The default TrainConfig otherwise (bf16 autocast on CUDA). A one-step run of the same
    shapes first, untimed (allocator, cuDNN autotuning)."""
    c, h, _ = shape
    n = batch * steps
    from gpu_step import random_images

    x, y = random_images(n, shape, dev, num_classes)

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


def trainers_part(args, dev: torch.device, out: dict) -> None:
    """Part 3 into ``out``, as it goes: each wide network's bank on CIFAR-shape images, K models
    at once (vectorised; K from the device's memory, or ``--bank-models``) and one after
    another: ``{arch: {"k", "vec_steps", "vec", "seq"}}`` (on CUDA also each one's peak memory,
    "vec_peak_gb" and "seq_peak_gb"; an out-of-memory error is "vec_error" or "seq_error", and
    the next network goes on). Every network under the trainer the rule picks first (the rates
    the projections use), then each under the other (whether the rule is the faster). The vectorised ResNet-18 and DenseNet, slow there by an order of
    magnitude, are timed on a quarter of the steps."""
    from bnmem_utils.jobs.config import RunConfig, bank_trainer

    for arch in WIDE:
        k = args.bank_models or default_chunk(RunConfig.bank(arch=arch, dataset="cifar10",
                                                         batch_size=args.bank_batch), dev, (3, 32, 32))
        vec_steps = args.bank_steps if arch == "resnet20" else max(1, args.bank_steps // 4)
        out[arch] = {"k": k, "vec_steps": vec_steps}
    rule = {arch: bank_trainer(RunConfig.bank(arch=arch, dataset="cifar10"), dev) == "vectorised"
            for arch in WIDE}
    for arch, vec in [(a, rule[a]) for a in WIDE] + [(a, not rule[a]) for a in WIDE]:
        r, name = out[arch], "vec" if vec else "seq"
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        try:
            r[name] = train_rate(arch, (3, 32, 32), dev, k=r["k"] if vec else 1,
                                 batch=args.bank_batch,
                                 steps=r["vec_steps"] if vec else args.bank_steps)
        except torch.cuda.OutOfMemoryError as exc:  # K models too many: the next one may fit
            r[f"{name}_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            print(f"[3] {arch} {name}: {r[f'{name}_error']}", flush=True)
        if name not in r:                      # freed once the error's frames are gone
            torch.cuda.empty_cache()
            continue
        if dev.type == "cuda":                 # against the card's memory, for K's estimate
            r[f"{name}_peak_gb"] = torch.cuda.max_memory_allocated(dev) / 1e9


#: The wide networks whose two bank trainers part 3 times side by side.
WIDE = ("resnet20", "resnet18", "densenet")


def print_trainers_part(args, dev: torch.device, t: dict) -> None:
    from bnmem_utils.jobs.config import RunConfig, bank_trainer

    print(f"[3] each wide network's bank on CIFAR-10-shape images, batch {args.bank_batch}, "
          f"sample-epochs/s under each trainer (the rule: bnmem_utils.jobs.config.GPU_TRAINER):")
    for arch in WIDE:
        r = t.get(arch, {})
        rule = bank_trainer(RunConfig.bank(arch=arch, dataset="cifar10"), dev)
        peak = f", {r['vec_peak_gb']:.0f} GB" if "vec_peak_gb" in r else ""
        vec = f"{r['vec']:10,.0f} ({r['vec_steps']} steps{peak})" if "vec" in r else "  not measured"
        seq = f"{r['seq']:10,.0f}" if "seq" in r else "not measured"
        if "vec" in r and "seq" in r:
            faster = "vectorised" if r["vec"] > r["seq"] else "sequential"
            verdict = (f"ratio {r['vec'] / r['seq']:5.2f} x   rule: {rule}"
                       f"{'' if rule == faster else ' (NOT the faster here)'}")
        else:
            verdict = f"rule: {rule} (not compared)"
        print(f"    {arch:9s} {r.get('k', 0):3d} at once {vec}   one after another {seq}   "
              f"{verdict}", flush=True)


def part_rates(args, b: dict, trainers: dict) -> dict[tuple, tuple[float, str]]:
    """``{(arch, shape, vectorised): (rate, how)}`` of what parts 1 and 3 measured."""
    from bnmem_utils.run import work as W

    lenet = args.models * args.epochs * args.samples
    here = {}
    if "vec_s" in b:
        here[("lenet", W.MNIST_SHAPE, True)] = (lenet / b["vec_s"], "part 1")
    if "seq_s" in b:
        here[("lenet", W.MNIST_SHAPE, False)] = (lenet / b["seq_s"], "part 1, extrapolated")
    for arch, r in trainers.items():
        for vec, name in ((True, "vec"), (False, "seq")):
            if isinstance(r, dict) and name in r:
                here[(arch, W.CIFAR_SHAPE, vec)] = (r[name], "part 3")
    return here


def rates_part(args, dev: torch.device, here: dict, out: dict, queried: dict) -> None:
    """Part 4's measurements, as it goes: each key the ``gpu`` and ``paper`` profiles train
    that parts 1 and 3 did not measure, by :func:`train_rate`, into ``here`` (and ``out``, by
    label); then the queries of one model of each network and shape they train one after
    another (``gpu_step.query_rate``), into ``queried`` as ``{(arch, shape): (img/s, how)}``
    (and ``out["queries"]``; a network whose queries fail, in one line there). None of either
    with ``--no-measure-rates``."""
    import gpu_step

    from bnmem_utils.jobs.config import RunConfig
    from bnmem_utils.run import work as W

    keys = sorted(projected_keys()) if args.measure_rates else []
    for arch, shape, vec in keys:
        key = (arch, shape, vec)
        if key not in here:
            k = default_chunk(RunConfig.bank(arch=arch, batch_size=args.bank_batch), dev,
                              shape) if vec else 1
            here[key] = (train_rate(arch, shape, dev, k=k, batch=args.bank_batch,
                                    steps=args.bank_steps),
                         f"batch {args.bank_batch}, {args.bank_steps} steps")
            out[W.rate_label(key)] = here[key][0]
    n = args.bank_batch * args.bank_steps
    for arch, shape in sorted({k[:2] for k in keys if not k[2]}):
        q = _attempt(lambda a=arch, s=shape: gpu_step.query_rate(a, s, dev, n))
        out.setdefault("queries", {})[W.rate_label((arch, shape, False))] = q
        if "error" in q:                         # this network's ratio stays the file-wide one
            print(f"[4] queries of {arch} {shape}: {q['error']}", flush=True)
            continue
        queried[(arch, shape)] = (q["img_s"], f"part 4: one model's queries as a bank makes "
                                              f"them, {q['images']:,} images in {q['precision']}")


def query_speedups(rates: dict, queried: dict) -> dict:
    """``{(arch, shape, False): Rate}``: each network's query images per second
    (:func:`rates_part`'s ``queried``) over its training rate one model after another, where
    this call measured both (a ratio against another machine's rate would be none)."""
    from bnmem_utils.run import work as W

    return {key: W.Rate(queried[key[:2]][0] / r.value, f"measured here ({queried[key[:2]][1]})")
            for key, r in rates.items()
            if not key[2] and key[:2] in queried and r.source.startswith("measured here")}


def rates_and_speedups(here: dict, queried: dict) -> tuple[dict, dict]:
    """:func:`labelled_rates` of ``here`` and, over them, :func:`query_speedups`."""
    rates = labelled_rates(here)
    return rates, query_speedups(rates, queried)


def labelled_rates(here: dict) -> dict:
    """``{(arch, shape, vectorised): Rate}`` for every key the ``gpu`` and ``paper`` profiles
    train: the rate measured here where there is one, else the RATES table's, labelled as such;
    and after them every other rate measured here (both trainers of each network)."""
    from bnmem_utils.run import work as W

    rates = {}
    for key in sorted(projected_keys()):
        rates[key] = (W.Rate(here[key][0], f"measured here ({here[key][1]})") if key in here
                      else W.Rate(W.RATES[key].value, f"from RATES ({W.MACHINE['short']}, "
                                  f"{W.MACHINE['date']}): "
                                  + W.RATES[key].source.split(" (")[0].split(":")[0]))
    return rates | {k: W.Rate(v, f"measured here ({how})") for k, (v, how) in here.items()
                    if k not in rates}


#: The profiles whose training part 4 projects.
PROJECTED = ("gpu", "paper")


@functools.cache
def projected_work() -> dict[str, dict]:
    """:func:`bnmem_utils.run.work.training_work` of each :data:`PROJECTED` profile, built once."""
    from bnmem_utils.run import work as W

    return {name: W.training_work(name) for name in PROJECTED}


def projected_keys() -> set[tuple]:
    """Every rate key ``(arch, shape, vectorised)`` the :data:`PROJECTED` profiles train."""
    return {(r.arch, r.shape, r.vectorised) for work in projected_work().values()
            for rows in work.values() for r in rows}


def projection_part(rates: dict, speedups: dict) -> None:
    """Part 4's output: each notebook of the ``gpu`` and ``paper`` profiles, its training work
    (:func:`bnmem_utils.run.work.training_work`) over ``rates`` (:func:`labelled_rates`), its
    forward passes at ``speedups`` (:func:`query_speedups`) where measured, next to the same at
    the RATES table (from the committed ``gpu_rates.json``)."""
    from bnmem_utils.run import work as W

    used = projected_keys()
    cost = W.GRADIENT_COST
    print("[4] projected time of the gpu and paper profiles (training, the forward passes "
          f"of queries and evaluation at each network's measured speed-up over its training "
          f"where listed, else at {W.FORWARD_SPEEDUP:.3g}x the training rate, and 03's "
          f"per-sample gradients at {cost['eval'].value:.3g} trained images per sample in eval "
          f"mode and {cost['train'].value:.3g} per image of a row's batch in train mode; each "
          "profile whole, in order), "
          f"from the rates below, next to the same at bnmem_utils.run.work.RATES "
          f"({W.MACHINE['short']}):")
    for key, rate in ((k, r) for k, r in rates.items() if k in used):
        ratio = f", queries {speedups[key].value:.3g}x" if key in speedups else ""
        print(f"    {W.rate_label(key):38s} {rate.value:12,.0f} "
              f"sample-epochs/s{ratio}, {rate.source}")
    for name in PROJECTED:
        work = projected_work()[name]
        print(f"    profile {name}:")
        for nb, rows in work.items():
            if rows:
                print(f"      {nb:24s} "
                      f"{W.duration(W.projected_seconds(rows, rates, speedups=speedups)):>10s} here "
                      f"({W.duration(W.projected_seconds(rows))} at RATES)")
        every = [r for rows in work.values() for r in rows]
        here = W.projected_seconds(every, rates, speedups=speedups)
        print(f"      {'all notebooks:':24s} {W.duration(here):>10s} "
              f"on this device ({W.duration(W.projected_seconds(every))} at RATES)",
              flush=True)


def machine(args, dev: torch.device, name: str) -> dict:
    """Where and how this run measured: the card (``short``: "one H100"), torch, the date (UTC),
    the commit (``--commit``, else the checkout's, else "unknown") and the command."""
    import datetime
    import re
    import subprocess

    commit = args.commit
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    card = re.search(r"\b[A-Z]\d{2,3}\b", name) if dev.type == "cuda" else None
    return {"card": name, "short": f"one {card.group() if card else name}", "device": dev.type,
            "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
            "commit": commit, "command": "benchmarks/gpu_smoke.sh " + " ".join(args.argv),
            "tiny": bool(args.tiny), "budget_s": args.budget}


def _priced(record: dict) -> tuple[dict, float] | None:
    """Part 2's figures and the rate its costs are priced in (img/s of ResNet-18 trained one
    model after another at --bank-batch: the rate the projections divide by), or None."""
    r = record.get("resnet18_step") or {}
    rate = (r.get("rate") or {}).get("img_s")
    return (r, rate) if rate else None


def forward_speedup(record: dict) -> dict | None:
    """Part 2's ResNet-18 bank member's queries: their images per second (in the bank's
    precision) over the rate the projections divide ResNet-18's work by (part 2's ``rate``),
    the ratio bnmem_utils.run.work counts forward passes at; None where part 2 did not time
    both."""
    if (priced := _priced(record)) is None:
        return None
    r, rate = priced
    m = next((m for m in r.get("members") or [] if m.get("queries")), None)
    if m is None:
        return None
    q = m["queries"]
    return {"value": q["images"] / q["bank"] / rate,
            "how": f"ResNet-18, CIFAR-10 shape: a bank member's queries, {q['images']:,} images "
                   f"forward in {q['precision']}, against its training one model after another "
                   f"({r['rate']['how']})"}


def per_sample_cost(record: dict) -> dict | None:
    """Part 2's per-sample gradients in trained images' time at the rate the projections
    divide ResNet-18's work by (part 2's ``rate``), the unit bnmem_utils.run.work counts them
    in: under eval, per sample; under train, per image of a Jacobian row's batch
    (``work.row_batch``), less the batches' forward, which the projection counts as forward
    images (timed at the member's query rate, else at the forward speed-up in use). None where
    part 2 did not time them."""
    from bnmem_utils.run import work as W

    if (priced := _priced(record)) is None:
        return None
    r, rate = priced
    g = r.get("grads") or {}
    if "eval" not in g:
        return None
    speedup = (forward_speedup(record) or {}).get("value", W.FORWARD_SPEEDUP)
    forward_s = g["forward"] / (speedup * rate)
    rows = g["measured"] * W.row_batch(g["n"], g["batch"])
    how = (f"ResNet-18 BN, CIFAR-10 shape, float32: {g['measured']:,} of {g['n']:,} images, BN "
           f"batches of {g['batch']}, against its training one model after another "
           f"({r['rate']['how']})")
    return {"eval": {"value": g["eval"] * rate / g["measured"], "how": how},
            "train": {"value": (g["train"] - forward_s) * rate / rows, "how": how}}


def write_json(path: str, about: dict, rates: dict | None, record: dict,
               quiet: bool = False, speedups: dict | None = None) -> None:
    """``--json``: the rates this run measured (the schema of ``bnmem_utils/run/gpu_rates.json``,
    which ``python -m bnmem_utils.run.work --adopt`` takes), each with its queries' speed-up
    where part 4 measured one (``speedups``: :func:`query_speedups`), and every part's
    figures."""
    import json

    def how(rate) -> str:
        return rate.source.removeprefix("measured here (").removesuffix(")")

    speedups = speedups or {}
    measured = [{"arch": k[0], "shape": list(k[1]), "vectorised": k[2], "rate": r.value,
                 "how": how(r)} | ({"forward_speedup": speedups[k].value,
                                    "queries": how(speedups[k])} if k in speedups else {})
                for k, r in (rates or {}).items() if r.source.startswith("measured here")]
    doc = {"about": "benchmarks/gpu_smoke.py --json: the training rates it measured (sample-"
                    "epochs per second; bnmem_utils.run.work --adopt takes them), each "
                    "network's speed-up of queries over its training where part 4 measured it, "
                    "a ResNet-18 bank member's where part 2 did, and each part's figures.",
           "machine": about, "rates": measured, "parts": record}
    if speedup := forward_speedup(record):
        doc["forward_speedup"] = speedup
    if cost := per_sample_cost(record):
        doc["per_sample_cost"] = cost
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if not quiet:
        print(f"wrote {path} ({len(measured)} measured rates)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny sizes: a functional check on any device")
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--models", type=int, default=64, help="LeNet-BN models trained at once")
    ap.add_argument("--epochs", type=int, default=10, help="epochs of each model")
    ap.add_argument("--samples", type=int, default=60_000, help="MNIST-shape samples per model")
    ap.add_argument("--batch", type=int, default=128, help="LeNet batch size")
    ap.add_argument("--seq-models", type=int, default=2, help="model-epochs timed sequentially")
    ap.add_argument("--resnet-batch", type=int, default=512, help="ResNet-18 batch size of part 2")
    ap.add_argument("--step-steps", type=int, default=30, help="timed steps of part 2")
    ap.add_argument("--step-warm", type=int, default=5,
                    help="untimed steps before them (compilation, autotuning)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="part 2 also compiles the bare step (default: on CUDA only)")
    ap.add_argument("--members", type=int, default=2,
                    help="bank members timed in part 2, after an untimed first one")
    ap.add_argument("--parts", default="1,3,4,2",
                    help="the parts to run, in order (default 1,3,4,2: the rates first); e.g. "
                         "--parts 2 in one call and --parts 1,3,4 in another")
    ap.add_argument("--skip-resnet", action="store_true", help="no part 2")
    ap.add_argument("--bank-models", type=int, default=0,
                    help="models at once in part 3 (default: from the device's memory)")
    ap.add_argument("--bank-batch", type=int, default=128,
                    help="batch of parts 3 and 4, and the BN batch of part 2's per-sample gradients")
    ap.add_argument("--grad-samples", type=int, default=256,
                    help="samples whose per-sample gradients part 2 times (notebook 03's cost)")
    ap.add_argument("--grad-images", type=int, default=4000,
                    help="images they are measured among: the train definition's BN batches")
    ap.add_argument("--bank-steps", type=int, default=40, help="timed steps of parts 3 and 4")
    ap.add_argument("--skip-projection", action="store_true", help="no part 4")
    ap.add_argument("--measure-rates", action=argparse.BooleanOptionalAction, default=True,
                    help="part 4 measures every rate it needs (--no-measure-rates: only parts "
                         "1 and 3's, the others from bnmem_utils.run.work.RATES, labelled)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds the parts may take in all (default: 255 at full size, no limit "
                         "with --tiny; 0: no limit): a part past its share is stopped or "
                         "skipped, and the output and --json say which")
    ap.add_argument("--json", metavar="PATH",
                    help="also write the measured rates and every part's figures to PATH as JSON "
                         "(what python -m bnmem_utils.run.work --adopt takes), after every part")
    ap.add_argument("--commit", default="",
                    help="the commit measured, for --json (default: the checkout's, if it is one)")
    given_argv = list(sys.argv[1:] if argv is None else argv)
    if ap.parse_known_args(given_argv)[0].tiny:     # tiny sizes, where no option sets its own
        ap.set_defaults(**TINY)
    args = ap.parse_args(given_argv)
    args.argv = given_argv
    given, parts = args.parts, [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in WEIGHTS]
    if bad or not parts or len(set(parts)) != len(parts):
        ap.error(f"--parts {args.parts!r}: each of {', '.join(sorted(WEIGHTS))} at most once, "
                 "comma-separated")
    args.parts = [p for p in parts if not (p == "2" and args.skip_resnet)
                  and not (p == "4" and args.skip_projection)]
    if not args.parts:
        ap.error(f"--parts {given!r} with the --skip options leaves no part to run")
    if args.budget is None:
        args.budget = 0.0 if args.tiny else 255.0
    return args


#: The sizes of ``--tiny`` (each an option's default there; an option given still sets its own).
TINY = dict(models=4, epochs=1, samples=1024, seq_models=1, resnet_batch=16, step_steps=2,
            step_warm=2, bank_models=2, bank_batch=8, bank_steps=2, grad_samples=8,
            grad_images=32)


#: Each part's weight in ``--budget``: a part may run until the sum of its own and the earlier
#: parts' weights, over that of every part run (what a part leaves unused goes to the next).
#: The default order (``--parts``) puts the training rates the projections and ``--adopt``
#: use first (parts 1, 3 and 4), then part 2, whose compilations (about a minute each, cold)
#: are the costliest.
WEIGHTS = {"1": 0.40, "3": 0.40, "4": 0.05, "2": 0.15}


def schedule(parts: list[str]) -> dict[str, float]:
    """``{part: the share of --budget it may run until}``, cumulative, in the order given."""
    total, done, out = sum(WEIGHTS[p] for p in parts), 0.0, {}
    for p in parts:
        done += WEIGHTS[p]
        out[p] = done / total
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    dev = resolve_device(args.device)
    if args.compile is None:
        args.compile = dev.type == "cuda"
    start = time.perf_counter()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    budget = f", a budget of {args.budget:.0f} s" if args.budget > 0 else ""
    print(f"bnmem GPU smoke: torch {torch.__version__}, device {dev} ({name}), "
          f"{torch.get_num_threads()} CPU threads{', TINY sizes' if args.tiny else ''}{budget}; "
          f"parts in the order {' '.join(args.parts)}", flush=True)
    record: dict = {}
    share = schedule(args.parts)
    measured: dict = {}              # {(arch, shape, vectorised): (rate, how)}, as measured
    queried: dict = {}               # {(arch, shape): (query images/s, how)}, part 4's
    parts = {"1": ("lenet_bank", lambda out: bank_part(args, dev, out),
                   lambda out: print_bank_part(args, out)),
             "3": ("trainers", lambda out: trainers_part(args, dev, out),
                   lambda out: print_trainers_part(args, dev, out)),
             "4": ("rates_measured", lambda out: rates_part(args, dev, measured, out, queried),
                   lambda _out: projection_part(*rates_and_speedups(measured, queried))),
             "2": ("resnet18_step", lambda out: step_part(args, dev, out, measured),
                   lambda out: print_step_part(args, dev, out))}
    for label in args.parts:
        key, measure, show = parts[label]
        until = args.budget * share[label]
        clock = Clock(start + until, f"its time (until {until:.0f} s of the --budget of "
                                     f"{args.budget:.0f} s)") if args.budget > 0 else Clock()
        out = run_part(f"[{label}]", measure, clock, record.setdefault(key, {}), dev)
        try:
            show(out)
        except Exception as exc:                 # a figure the part lacks: one line, go on
            print(f"[{label}] could not print: {type(exc).__name__}: {exc}", flush=True)
        measured.update(part_rates(args, record.get("lenet_bank", {}), record.get("trainers", {})))
        last = label == args.parts[-1]
        record["wall_s"] = time.perf_counter() - start
        if last:
            short = [f"{k}: {v.get('skipped') or v.get('stopped') or v.get('error')}"
                     for k, v in record.items() if isinstance(v, dict)
                     and {"skipped", "stopped", "error"} & set(v)]
            print(f"total wall time {record['wall_s']:.0f} s (target < 300 s on one H200)"
                  + ("; NOT complete: " + "; ".join(short) if short else ""), flush=True)
        if args.json:                # after every part: a run cut short keeps what it measured
            rates, speedups = rates_and_speedups(measured, queried)
            write_json(args.json, machine(args, dev, name), rates, record, quiet=not last,
                       speedups=speedups)

if __name__ == "__main__":
    main()
