"""The bare training step of one network, the yardstick of the bank path (`gpu_smoke.py` part 2).

A bare step is the least a training step can cost on a device: one persistent model and
optimizer, a fixed batch already on the device, no augmentation, no evaluation, no host sync
inside the timed steps, and a constant learning rate. It runs under four settings:

* ``fp32``: float32, NCHW, eager;
* ``bf16``: bf16 autocast, channels-last, eager (the precision the bank path trains in on CUDA);
* ``bf16 compiled``: the same with the whole step (forward, loss, backward and the optimizer)
  compiled by ``torch.compile`` once, then reused;
* bank members: :func:`bnmem_utils.training.loop.train_model` on the same images, as a bank
  trains each model (its defaults: on CUDA bf16, channels-last and one compiled forward that
  every member reuses; augmentation on the device), for the ratio "bank path against the bare
  step" at the same arithmetic; and the bank's queries of a trained member
  (:func:`member_queries`), in the bank's precision and in float32.

Compilation and the first steps (cuDNN autotuning, allocator) are timed apart from the steady
state: ``compile_s`` is the warm-up's time less what the same number of steady steps take.
``flops_per_image`` counts a training step's FLOPs with ``torch.utils.flop_counter``, so that
the achieved rate can be read as a fraction of the card's dense bf16 peak (:data:`PEAK_BF16`).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from bench_roofline import step_flops

from bnmem_utils.core.device import seed_everything
from bnmem_utils.models.nets import build_model
from bnmem_utils.training.loop import TrainConfig, train_model

#: Dense bf16 tensor-core peak in FLOP/s, by a word of the card's name (the vendors' data sheets,
#: without sparsity); a card not listed gets no fraction of peak.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def peak_flops(dev: torch.device) -> tuple[str, float] | None:
    """``(card, dense bf16 FLOP/s)`` of ``dev``, or None (a CPU, or a card not in the table)."""
    if dev.type != "cuda":
        return None
    name = torch.cuda.get_device_name(dev)
    return next(((card, peak) for card, peak in PEAK_BF16.items() if card in name), None)


def _model(arch: str, shape: tuple[int, int, int], dev: torch.device, channels_last: bool,
           num_classes: int = 10) -> torch.nn.Module:
    seed_everything(0)
    c, h, _ = shape
    model = build_model(arch, "bn", in_channels=c, num_classes=num_classes, image_size=h).to(dev)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def flops_per_image(arch: str, shape: tuple[int, int, int] = (3, 32, 32)) -> float:
    """FLOPs of one training step per image (forward, loss and backward), counted on the CPU
    by ``bench_roofline.step_flops`` on a batch of 4."""
    return step_flops(arch, shape, 4)


def random_images(n: int, shape: tuple[int, int, int], dev: torch.device, num_classes: int = 10,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` Gaussian images of ``shape`` with random labels, on ``dev`` (throughput does not
    depend on the pixels)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, *shape, generator=g).to(dev),
            torch.randint(0, num_classes, (n,), generator=g).to(dev))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bare_step(arch: str, dev: torch.device, *, bf16: bool, compile: bool, batch: int, steps: int,
              warm: int = 3, shape: tuple[int, int, int] = (3, 32, 32), mode: str | None = None,
              keep_model: bool = False) -> dict:
    """Images per second of ``steps`` bare training steps of ``arch`` at ``batch`` (after
    ``warm`` untimed ones), and the warm-up's extra time (``compile_s``: compilation, cuDNN
    autotuning, the allocator's first requests); compiled, also ``graphs``: the graphs
    compiled during the timed steps (0: the warm-up compiled all, the rate is steady state);
    ``mode``: the ``torch.compile`` mode ("reduce-overhead": CUDA graphs); with ``keep_model``
    the trained model too (``"model"``, for the tests)."""
    from torch._dynamo.utils import counters

    model = _model(arch, shape, dev, channels_last=bf16)
    fused = {"fused": True} if dev.type == "cuda" else {"foreach": True}
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, **fused)
    x, y = random_images(batch, shape, dev)
    x = x.contiguous(memory_format=torch.channels_last) if bf16 else x

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    run = torch.compile(step, mode=mode) if compile else step
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(warm):
        run()
    _sync(dev)
    warm_s = time.perf_counter() - t0
    graphs = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    _sync(dev)
    seconds = time.perf_counter() - t0
    out = {"img_s": batch * steps / seconds, "seconds": seconds,
           "compile_s": max(0.0, warm_s - warm * seconds / steps)}
    if compile:
        out["graphs"] = counters["stats"]["unique_graphs"] - graphs
    return {**out, "model": model} if keep_model else out


def bank_member(arch: str, dev: torch.device, *, batch: int, steps: int, members: int = 2,
                shape: tuple[int, int, int] = (3, 32, 32), compile: str = "auto",
                queries: bool = True) -> dict:
    """Images per second of bank members trained as a bank trains them
    (:func:`~bnmem_utils.training.loop.train_model` with its defaults: bf16 autocast,
    channels-last and a compiled forward on CUDA, shifts and flips on the device, a cosine
    learning rate set every step), ``members`` models one after another on ``batch * steps``
    images each, after an untimed first member on one batch: ``compile_s`` is that member's
    time (the compilation, once for the bank), ``graphs`` the compilations during the timed
    members (0 when they reuse the first one's), ``bare``: the bare-step setting of the same
    arithmetic (``"bf16 CUDA graphs"``, ``"bf16 compiled"``, ``"bf16"`` or ``"fp32"``).
    ``compile``: the bank's ``TrainConfig.compile``; ``queries``: also time the last member's
    queries (:func:`member_queries`; their path does not depend on ``compile``)."""
    from torch._dynamo.utils import counters

    from bnmem_utils.training.steps import compile_mode

    n = batch * steps
    x, y = random_images(n, shape, dev)
    cfg = TrainConfig(epochs=1, batch_size=batch, lr=0.05, compile=compile)
    _sync(dev)
    t0 = time.perf_counter()
    train_model(_model(arch, shape, dev, False), x[:batch], y[:batch], config=cfg, device=dev)
    _sync(dev)
    compile_s = time.perf_counter() - t0
    graphs = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    for i in range(members):
        model = _model(arch, shape, dev, False)
        train_model(model, x, y, config=cfg, seed=i, device=dev)
    _sync(dev)
    seconds = time.perf_counter() - t0
    queries = member_queries(model, arch, n, shape, dev) if queries else None
    syncs = host_syncs(arch, dev, x, y, cfg) if dev.type == "cuda" else None
    mode = compile_mode(cfg.compile, dev)
    bare = ("fp32" if dev.type != "cuda" else "bf16" if mode == "off" else
            "bf16 CUDA graphs" if mode == "reduce-overhead" else "bf16 compiled")
    return {"img_s": members * n / seconds, "seconds": seconds, "compile_s": compile_s,
            "graphs": counters["stats"]["unique_graphs"] - graphs, "members": members,
            "bare": bare, "mode": mode, "syncs": syncs, "steps": steps, "queries": queries}


def member_queries(model: torch.nn.Module, arch: str, n: int, shape: tuple[int, int, int],
                   dev: torch.device, most: int = 4096, *, fp32: bool = True) -> dict:
    """Seconds a bank spends querying one member trained on ``n`` images, by the bank's own
    routine (:mod:`bnmem_utils.jobs.bank_models`: eval-mode queries of its pool of ``2 n``
    images, a member training on half of it, but at most ``most``, and of a population;
    train-mode queries of the pool, BN; test accuracy; population and test a quarter of the
    pool each; the queries of a data set of ``shape``: CIFAR-10's identity and mirror, or
    MNIST's), once in the precision the bank queries in (that of its training: bf16 autocast
    on CUDA) and, with ``fp32``, once in float32: ``{"bank": s, "fp32": s, "precision": ...,
    "pool": images, "images": forward passes}``. Each after an untimed run of the same."""
    from bnmem_utils.jobs import bank_models as MB
    from bnmem_utils.jobs.config import RunConfig
    from bnmem_utils.training.steps import precision

    pool = min(2 * n, most)
    x, y = random_images(pool, shape, dev)
    x_test, y_test = random_images(max(2, pool // 4), shape, dev)
    data = MB.BankData(x=x, y=y, kind=torch.zeros_like(y), x_test=x_test, y_test=y_test,
                       pop_x=x_test, pop_y=y_test, num_classes=10,
                       fill=torch.zeros(1, shape[0], 1, 1, device=dev))
    config = RunConfig.bank(dataset="cifar10" if shape[0] == 3 else "mnist", arch=arch,
                            norm="bn")
    queries = len(config.measure.queries)
    out = {"precision": precision(config.train.amp, dev), "pool": pool,
           "images": (2 * pool + len(y_test)) * queries + len(y_test)}
    for name, amp in (("bank", config.train.amp), ("fp32", "off"))[:1 + fp32]:
        for timed in (False, True):
            _sync(dev)
            t0 = time.perf_counter()
            MB._query_one(config.replace(amp=amp), model, data, seed=0)
            _sync(dev)
            if timed:
                out[name] = time.perf_counter() - t0
    return out


def query_rate(arch: str, shape: tuple[int, int, int], dev: torch.device, n: int) -> dict:
    """One model's queries as a bank makes them (:func:`member_queries`, in the bank's
    precision, channels-last on CUDA as a trained member is), for a member trained on ``n``
    images: ``{"img_s": forward images per second, "images", "precision"}``. The weights are
    untrained; the time does not depend on them."""
    model = _model(arch, shape, dev, channels_last=dev.type == "cuda")
    q = member_queries(model, arch, n, shape, dev, fp32=False)
    return {"img_s": q["images"] / q["bank"], "images": q["images"], "precision": q["precision"]}


def host_syncs(arch: str, dev: torch.device, x: torch.Tensor, y: torch.Tensor,
               cfg: TrainConfig) -> int:
    """How many times one more member's epoch of ``x`` waits for the device: the warnings of
    ``torch.cuda.set_sync_debug_mode("warn")`` (a value read back, an explicit sync)."""
    import warnings

    model = _model(arch, tuple(x.shape[1:]), dev, False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_model(model, x, y, config=cfg, seed=99, device=dev)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def per_sample_grads(arch: str, dev: torch.device, *, batch: int, measured: int, n: int,
                     shape: tuple[int, int, int] = (3, 32, 32)) -> dict:
    """Seconds notebook 03 spends on the per-sample gradient norms of ``measured`` of ``n``
    images for a BN ``arch`` (:func:`bnmem_utils.training.per_sample.per_sample_grad_norms`,
    float32 as 03 computes them): under the eval definition, and under the train definition
    with BN batches of ``batch`` (``forward``: the images of the batches that hold a measured
    sample, read forward once each). Each after an untimed run on two samples:
    ``{"eval": s, "train": s, "measured": ..., "batch": ..., "n": ..., "forward": images}``."""
    from bnmem_utils.training import per_sample as PS

    model = _model(arch, shape, dev, channels_last=dev.type == "cuda")   # as 03 trains it
    x, y = random_images(n, shape, dev)
    index = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:measured].sort().values
    pos = PS._setup(model, x, y, "train", index)[2]       # each image's row (-1: not measured)
    out = {"measured": index.numel(), "batch": batch, "n": n,
           "forward": sum(len(b) for b, _ in PS._measured_batches(pos, batch, 0))}
    for definition in ("eval", "train"):
        kw = dict(definition=definition, batch_size=batch,
                  shuffle_seed=0 if definition == "train" else None)
        for timed, idx in ((False, index[:2]), (True, index)):
            _sync(dev)
            t0 = time.perf_counter()
            PS.per_sample_grad_norms(model, x, y, index=idx, **kw)
            _sync(dev)
            if timed:
                out[definition] = time.perf_counter() - t0
    return out
