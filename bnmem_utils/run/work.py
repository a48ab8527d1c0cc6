"""Each notebook's training work under a profile, and its projected time on one GPU.

:func:`training_work` builds the runs and banks every notebook of a profile trains, with the
functions the notebooks call to build them (each notebook's ``*_from_params``: see
:data:`BUILDERS`) on the profile's values (a key it does not set: the notebook's default), and
counts them as :class:`WorkRow` s: models x epochs x training samples per model (a grid run on
its whole, corrupted training set; a bank member on half its pool), the images of forward passes
besides training (:func:`forward_images`: a bank member's queries and test evaluation, a grid or
gradient-norm run's evaluation every epoch, a gradient-norm run's measured samples), and a
gradient-norm run's per-sample gradients (:func:`gradient_work`). A run or bank that an
earlier notebook already trains (equal :class:`RunConfig`, one cache) is counted there only.
Notebook 05's banks depend on the lambda its selection seeds choose: they are counted for the
choice that banks the most arms, and its measurement runs as if a penalty is chosen (an upper
bound).

:func:`projected_seconds` divides the work by training rates in sample-epochs per second
(:data:`RATES`: those of :data:`RATES_FILE`, measured by ``benchmarks/gpu_smoke.py --json`` on
the last GPU lent, and the others derived from them by FLOPs per trained image), and the forward
images by the network's own speed-up of queries over training times the same rate
(:data:`QUERY_SPEEDUPS`, where the file measured one), else by :data:`FORWARD_SPEEDUP` times it
(the file's measured ratio of a ResNet-18 bank member's query images per second to its training
images per second, else 3: a forward pass is about a third of a training step's FLOPs), and
notebook 03's per-sample gradients (:func:`gradient_work`) at :data:`GRADIENT_COST` trained
images' time each (the file's ``per_sample_cost``, else derived from FLOPs). ``--adopt FILE``
takes a new measurement as that file (given twice, the files of one card's split benchmark
calls, merged: :func:`~bnmem_utils.run.rates.merged_rates`). :func:`projection_block` renders
the comment block each GPU profile carries; ``python -m bnmem_utils.run.work --write gpu paper``
rewrites it in place (and the paragraph of docs/ray.md), and tests/test_work.py checks both;
``--rates cpu``, the CPU profiles at the CPU's rates (:mod:`bnmem_utils.run.cpu_work`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from bnmem_utils.core.paths import project_root
from bnmem_utils.run import plan as runplan
from bnmem_utils.run.params import SPLIT_SIZES
from bnmem_utils.run.rates import (
    BEGIN,
    CIFAR_SHAPE,
    DERIVED,
    END,
    MNIST_SHAPE,
    RATES_FILE,
    RATIOS,
    Rate,
    SHAPES,
    TRAIN_GFLOP,
    load_forward_speedup,
    load_gradient_cost,
    load_query_speedups,
    load_rates,
    merged_rates,
    rate_label,
    rewrite_blocks,
    where_from,
)

#: The ResNet-18 rate the fast path aims at (images per second, one model; 13% of an H200's peak).
RESNET18_TARGET = 40_000.0


class WorkRow(NamedTuple):
    """Part of a notebook's training: ``runs`` models of ``arch`` on ``shape`` images, each
    ``epochs`` epochs over ``samples`` training samples (a bank member: half its pool), trained
    K at once (``vectorised``) or one after another by default on a GPU; ``forward``: the
    images all ``runs`` read in forward passes besides training (:func:`forward_images`; their
    evaluations after an epoch: ``evaluation``), ``peak`` the most one of them reads; ``bank``:
    the models of one bank (1 for other runs), the most a task trains at once; ``gradients``:
    the per-sample gradients all ``runs`` compute (:func:`gradient_work`), ``grad_peak`` those
    of the run that computes the most."""

    label: str
    arch: str
    shape: tuple[int, int, int]
    runs: int
    epochs: int
    samples: float
    vectorised: bool
    forward: float = 0.0
    peak: float = 0.0
    bank: int = 1
    gradients: tuple[float, float] = (0.0, 0.0)
    grad_peak: tuple[float, float] = (0.0, 0.0)
    evaluation: float = 0.0

    @property
    def sample_epochs(self) -> float:
        return self.runs * self.epochs * self.samples


#: The machine the rates of :data:`RATES_FILE` were measured on, and those rates.
MACHINE, MEASURED = load_rates()
#: Forward images per second over the training rate (:func:`load_forward_speedup`): the ratio
#: of every network without one of its own in :data:`QUERY_SPEEDUPS`.
FORWARD = load_forward_speedup()
FORWARD_SPEEDUP = FORWARD.value
#: Each network's own forward speed-up, trained one model after another, where measured
#: (:func:`load_query_speedups`).
QUERY_SPEEDUPS = load_query_speedups()
#: Trained images' time per unit of per-sample gradient work (:func:`load_gradient_cost`).
GRADIENT_COST = load_gradient_cost()


def rate_table(measured: Mapping[tuple, Rate] = MEASURED,
               resnet18: float | None = None) -> dict[tuple, Rate]:
    """``{(arch, shape, vectorised): Rate}`` for every architecture and image shape of
    :data:`TRAIN_GFLOP`: the ``measured`` rates, and the others derived from FLOPs per trained
    image (LeNet from LeNet on MNIST shape under the same trainer, every other network from
    ResNet-18 on CIFAR shape one model after another). ``resnet18``: that rate replaced by this
    many images per second (a target, not measured), the rates derived from it scaled."""
    table = dict(measured)
    r18 = ("resnet18", CIFAR_SHAPE, False)
    if resnet18 is not None:
        table[r18] = Rate(resnet18, f"the {resnet18:,.0f} img/s target, not measured")
    for (arch, shape), gflop in TRAIN_GFLOP.items():
        for vec in (False, True):
            key = (arch, shape, vec)
            if key in table:
                continue
            base = ("lenet", MNIST_SHAPE, vec) if arch == "lenet" else r18
            if base not in table:
                raise ValueError(f"no measured rate for {rate_label(base)} in {RATES_FILE.name}, "
                                 f"so none to derive {rate_label(key)} from")
            scale = TRAIN_GFLOP[base[:2]] / gflop
            table[key] = Rate(table[base].value * scale,
                              f"{DERIVED}: {base[0]} at {base[1][1]}x{base[1][2]} x "
                              f"{TRAIN_GFLOP[base[:2]]:g}/{gflop:g} GFLOP per image")
    return table


#: Training rates at today's code path (the default trainers), on :data:`MACHINE`.
RATES = rate_table()
#: The same with ResNet-18 at :data:`RESNET18_TARGET` (and the rates derived from it scaled).
TARGET_RATES = rate_table(resnet18=RESNET18_TARGET)


# --------------------------------------------------------------------------------------------
# The runs and banks of each notebook
# --------------------------------------------------------------------------------------------
def profile_parameters(profile: str | Mapping) -> dict:
    """Every notebook parameter under ``profile`` (a name, a path, or the values themselves):
    the profile's value, else the notebook's default."""
    values = runplan.load_profile(profile)[1] if isinstance(profile, str) else dict(profile)
    table = runplan.notebook_parameter_table(runplan.discover_notebooks())
    return {k: v for params in table.values() for k, v in params.items()} | values


def _memorization(p: Mapping) -> list[tuple[str, object]]:
    from bnmem_utils.jobs import grid

    return [(f"{c.data.dataset} {c.model.arch} runs", c) for c in grid.configs_from_params(p)]


def _gradient_norms(p: Mapping) -> list[tuple[str, object]]:
    from bnmem_utils.jobs import gradnorms

    return [(f"{c.data.dataset} {c.model.arch} runs", c)
            for c in gradnorms.configs_from_params(p)]


def _lira(p: Mapping) -> list[tuple[str, object]]:
    from bnmem_utils.analyses import leakage

    configs, curve = leakage.configs_from_params(p)
    out = [(f"{c.data.dataset} {c.model.arch} banks", c) for c in configs]
    if curve is not None:
        out.append((f"{curve.data.dataset} {curve.model.arch} shadow-count curve bank", curve))
    return out


def _confound(p: Mapping) -> list[tuple[str, object]]:
    from bnmem_utils.analyses import confound

    labels = {"epochs": "ladder, {:g} epochs", "weight_decay": "top rung, weight decay {:g}",
              "train_size": "top rung, pool of {:,.0f}"}
    seen = {}
    for a in confound.arms_from_params(p):    # a bank on both knobs trains once: its first label
        seen.setdefault(a.config, f"{p['cf_arch']} {labels[a.knob].format(a.level)}")
    return [(label, c) for c, label in seen.items()]


def _mitigation(p: Mapping) -> list[tuple[str, object]]:
    from bnmem_utils.analyses import mitigation as mit

    arch, sweep = p["mit_arch"], mit.sweep_from_params(p)
    out = [(f"{arch} selection runs", c) for c in sweep.selection]
    bn = [k for k, (norm, _) in sweep.arms.items() if norm == "bn"]
    penalised = [k for k in bn if k != mit.BASELINE]
    if penalised:    # plain BN and the chosen setting, the first penalised one, measured again
        out += [(f"{arch} measurement runs", c)
                for c in mit.sweep_from_params(p, penalised[0]).measurement]
    banks = max(([c for arms in mit.sweep_from_params(p, k).banks for c in arms.values()]
                 for k in bn), key=len)    # for the choice that banks the most arms
    for c in banks:
        what = "penalised banks" if c.penalty is not None and c.penalty.lam > 0 else "banks"
        out.append((f"{arch} {what}", c))
    return out


#: What each notebook trains (01 and 06 train no model).
BUILDERS = {"01_theory": None, "02_forced_memorization": _memorization,
            "03_gradient_norms": _gradient_norms, "04_lira": _lira, "04b_confound": _confound,
            "05_mitigation": _mitigation, "06_report": None}


def _row_of(label: str, config) -> WorkRow:
    """The row of one run or bank with nothing counted yet (no model, no forward image, no
    gradient): label, arch, shape, epochs, samples per model, and whether a GPU trains it K
    models at once by default. Runs and banks with the same such row are counted in one."""
    import torch

    from bnmem_utils.jobs.config import bank_trainer

    data, rate = config.data, config.corruption.ood_rate
    n = min(data.train_size or math.inf, SPLIT_SIZES[data.dataset][0])
    samples = n + round(rate * n)             # OOD inserts join the training set
    bank = config.kind == "bank"
    vec = bank and bank_trainer(config, torch.device("cuda")) == "vectorised"
    return WorkRow(label, config.model.arch, SHAPES[data.dataset], 0, config.train.epochs,
                   samples / 2 if bank else samples, vec, forward=0, peak=0,
                   gradients=(0, 0), grad_peak=(0, 0), evaluation=0)


def _measured(config) -> tuple[int, int, bool]:
    """A gradient-norm run's samples measured at each of its epochs, its corrupted training
    set's size, and whether it measures the train definition (BN models only)."""
    data, c, m = config.data, config.corruption, config.measure
    n = min(data.train_size or math.inf, SPLIT_SIZES[data.dataset][0])
    flips, inserts = round(c.flip_rate * n), round(c.ood_rate * n)
    count = min(m.max_clean or math.inf, n - flips) + min(m.max_noisy or math.inf, flips + inserts)
    return int(count), int(n + inserts), "train" in m.definitions and config.model.norm == "bn"


def forward_images(config) -> int:
    """Images one run or bank member of ``config`` reads in forward passes besides training: a
    bank member's eval-mode queries of its pool and the population, its train-mode queries of
    the pool (BN), each under every query augmentation, and its test evaluation; a grid run's
    or gradient-norm run's evaluation of its training set and test split after every epoch,
    and a gradient-norm run's eval-mode losses of its measured samples at each measured epoch
    with (train definition) the forward of each BN batch that holds one, at most the whole set
    (their gradients: :func:`gradient_work`)."""
    pool, t = _pool_and_test(config)
    if config.kind == "bank":
        q, p = len(config.measure.queries), config.measure.population_size
        twice = 2 if config.model.norm == "bn" else 1
        return int(q * (twice * pool + (t if p is None else p)) + t)
    evaluation = evaluation_images(config)
    if config.kind != "gradnorm":
        return evaluation
    m, size, train_def = _measured(config)
    batches, most = math.ceil(size / config.train.batch_size), row_batch(size, config.train.batch_size)
    held = min(size, min(batches, m) * most) if train_def else 0
    return evaluation + len(config.measure.measure_epochs) * (m + held)


def evaluation_images(config) -> int:
    """Of :func:`forward_images`, a grid or gradient-norm run's evaluations after each epoch (at
    its ``eval_batch_size``); 0 for a bank member, whose forward images are its queries."""
    return 0 if config.kind == "bank" else int(config.train.epochs * sum(_pool_and_test(config)))


def _pool_and_test(config) -> tuple[int, int]:
    """``config``'s training images (its kept split with the OOD inserts) and test images."""
    data = config.data
    train, test = SPLIT_SIZES[data.dataset]
    n = min(data.train_size or math.inf, train)
    return n + round(config.corruption.ood_rate * n), min(data.test_size or math.inf, test)


def row_batch(size: int, batch: int) -> int:
    """The most images a BN batch holds when ``size`` images are cut into batches of about
    ``batch``, as even as possible (the train definition's batches)."""
    return math.ceil(size / math.ceil(size / batch))


def gradient_work(config) -> tuple[int, int]:
    """A gradient-norm run's per-sample gradient work over its measured epochs: the samples
    whose gradient it computes under the eval definition (one image's forward and backward
    each), and the images of the BN batches it backpropagates under the train definition (a
    backward of the sample's whole batch per Jacobian row: :func:`row_batch` images at most);
    ``(0, 0)`` for any other run. Eval runs unless a BN model measures the train definition
    alone."""
    if config.kind != "gradnorm":
        return 0, 0
    m, size, train_def = _measured(config)
    epochs, eval_def = len(config.measure.measure_epochs), "eval" in config.measure.definitions
    return (epochs * m * (eval_def or not train_def),
            epochs * m * row_batch(size, config.train.batch_size) * train_def)


def training_work(profile: str | Mapping) -> dict[str, list[WorkRow]]:
    """``{notebook: [WorkRow, ...]}``: what every notebook trains under ``profile`` when the
    whole profile runs in order (a run or bank an earlier notebook trained read from the cache,
    so not counted again). Bank members count as models (``runs``), each on half its pool."""
    p = profile_parameters(profile)
    trained: set = set()
    work: dict[str, list[WorkRow]] = {}
    for nb, build in BUILDERS.items():
        rows: dict[WorkRow, WorkRow] = {}        # a row with nothing counted -> its sums
        for label, config in (build(p) if build else []):
            if config in trained:
                continue
            trained.add(config)
            runs = config.measure.n_models if config.kind == "bank" else 1
            forward, grads = forward_images(config), gradient_work(config)
            empty = _row_of(label, config)
            row = rows.get(empty, empty)
            rows[empty] = row._replace(
                runs=row.runs + runs, forward=row.forward + runs * forward,
                evaluation=row.evaluation + runs * evaluation_images(config),
                peak=max(row.peak, forward), bank=max(row.bank, runs),
                gradients=tuple(a + runs * b for a, b in zip(row.gradients, grads, strict=True)),
                grad_peak=max(row.grad_peak, grads, key=lambda g: (g[1], g[0])))
        work[nb] = list(rows.values())
    return work


def gradient_images(row: WorkRow, cost: Mapping[str, Rate] | None = None) -> float:
    """``row``'s per-sample gradient work in trained images' time (:data:`GRADIENT_COST`)."""
    cost = GRADIENT_COST if cost is None else cost
    return row.gradients[0] * cost["eval"].value + row.gradients[1] * cost["train"].value


def projected_seconds(rows: Iterable[WorkRow], rates: Mapping[tuple, Rate] = RATES, *,
                      forward: bool = True, training: bool = True, gradients: bool = True,
                      speedups: Mapping[tuple, Rate] | None = None) -> float:
    """Seconds of ``rows`` at ``rates`` (``{(arch, shape, vectorised): Rate}`` or plain numbers,
    sample-epochs per second): their training, their forward images at the network's speed-up
    of ``speedups`` (default :data:`QUERY_SPEEDUPS`) times the rate, else at
    :data:`FORWARD_SPEEDUP` times it, and their per-sample gradients
    (:func:`gradient_images`) at the rate (``forward``, ``training`` or ``gradients`` False:
    without that part)."""
    speedups = QUERY_SPEEDUPS if speedups is None else speedups
    total = 0.0
    for r in rows:
        key = (r.arch, r.shape, r.vectorised)
        if key not in rates:
            raise ValueError(f"no training rate for {rate_label(key)} (the table covers "
                             f"MNIST- and CIFAR-shape images): {r.label}")
        rate = float(getattr(rates[key], "value", rates[key]))
        speedup = speedups[key].value if key in speedups else FORWARD_SPEEDUP
        total += (training * r.sample_epochs + forward * r.forward / speedup
                  + gradients * gradient_images(r)) / rate
    return total


# --------------------------------------------------------------------------------------------
# The comment block of a profile, the paragraph of docs/ray.md, and --write
# --------------------------------------------------------------------------------------------
DOC_MARK = re.compile(r"<!-- projected:(?P<profile>[\w.-]+) (?P<gpus>\d+) -->.*?<!-- /projected -->",
                      re.S)
RAY_DOC = "docs/ray.md"


def duration(seconds: float) -> str:
    """``47.2 min`` below two hours, else ``13.6 h``."""
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _span(values: Iterable[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"


def _rate_words(key: tuple, rate: Rate) -> str:
    queries = (f", queries {QUERY_SPEEDUPS[key].value:.3g}x" if key in QUERY_SPEEDUPS else "")
    return f"  {rate_label(key) + ':':36s} {rate.value:>9,.0f}  {where_from(rate)}{queries}"


def projection_lines(profile: str) -> list[str]:
    """The lines of :func:`projection_block` without their ``# `` and markers."""
    work = training_work(profile)
    every = [r for rows in work.values() for r in rows]
    cost = GRADIENT_COST
    where = " and ".join(sorted({where_from(r) for r in cost.values()}))
    own = ("each network's measured speed-up of queries over its training where the rates "
           "below give one, else at " if QUERY_SPEEDUPS else "")
    lines = _wrap("Training, the forward passes of queries and evaluation, and 03's per-sample "
                  "gradients, the whole profile in order (a bank or run an earlier notebook "
                  "trains is read from the cache), at the training rates of "
                  f"{MACHINE['short']} ({RATES_FILE.name}, {MACHINE['date']}), forward images at "
                  f"{own}{FORWARD_SPEEDUP:.3g}x those rates ({FORWARD.source}) and per-sample "
                  f"gradients (grads, in trained images' time) at {cost['eval'].value:.3g} per "
                  f"sample in eval mode and {cost['train'].value:.3g} per image of a Jacobian "
                  f"row's batch in train mode ({where}); another card "
                  "of its class should be close for this compute-bound work, but the rates were "
                  f"measured on {MACHINE['short']}. 05's banks are counted for the lambda that "
                  "banks the most arms, its measurement runs as if a penalty is chosen.", 96)
    lines.append(f"  {'notebook':23s} {'models':>7s} {'epochs':>7s} {'samples/model':>14s} "
                 f"{'sample-epochs':>14s} {'forward':>9s} {'grads':>8s} {MACHINE['short']:>10s}")
    for nb, rows in work.items():
        cells = (["-"] * 7 if not rows else
                 [f"{sum(r.runs for r in rows):,}", _span([r.epochs for r in rows], "d"),
                  _span([r.samples for r in rows], ",.0f"),
                  f"{sum(r.sample_epochs for r in rows) / 1e6:,.1f} M",
                  f"{sum(r.forward for r in rows) / 1e6:,.1f} M",
                  f"{sum(gradient_images(r) for r in rows) / 1e6:,.1f} M",
                  duration(projected_seconds(rows))])
        lines.append(f"  {nb:23s} {cells[0]:>7s} {cells[1]:>7s} {cells[2]:>14s} {cells[3]:>14s} "
                     f"{cells[4]:>9s} {cells[5]:>8s} {cells[6]:>10s}")
    lines.append(f"  {'total':23s} {sum(r.runs for r in every):>7,} {'':7s} {'':14s} "
                 f"{sum(r.sample_epochs for r in every) / 1e6:>12,.1f} M "
                 f"{sum(r.forward for r in every) / 1e6:>7,.1f} M "
                 f"{sum(gradient_images(r) for r in every) / 1e6:>6,.1f} M "
                 f"{duration(projected_seconds(every)):>10s}")
    alone = {part: duration(projected_seconds(every, **{p: p == part for p in PARTS}))
             for part in PARTS}
    lines += _wrap(f"Of which training {alone['training']}, forward passes {alone['forward']}, "
                   f"per-sample gradients {alone['gradients']}. At the "
                   f"{RESNET18_TARGET:,.0f} img/s ResNet-18 target (and the rates derived from "
                   f"it, scaled): {duration(projected_seconds(every, TARGET_RATES))}.", 96)
    lines.append(f"Rates, sample-epochs/s on {MACHINE['short']} (bnmem_utils.run.work.RATES):")
    return lines + [_rate_words(k, RATES[k])
                    for k in sorted({(r.arch, r.shape, r.vectorised) for r in every})]


#: The parts of a projection (:func:`projected_seconds`' keywords).
PARTS = ("training", "forward", "gradients")


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, break_on_hyphens=False)


def projection_block(profile: str) -> str:
    """The generated comment block of ``profile``'s file (markers included, no final newline)."""
    return "\n".join([BEGIN, *(f"# {line}".rstrip() for line in projection_lines(profile)), END])


def parallel_seconds(profile: str, gpus: int) -> tuple[float, WorkRow, float]:
    """Projected time of ``profile`` on ``gpus`` GPUs with one task per GPU, each notebook's
    work split evenly over them but never below its longest single task (a grid run, one bank
    member trained one after another, or a vectorised block of up to 64 members of one bank);
    and that longest task over the whole profile with its seconds."""
    from bnmem_utils.jobs.bank_models import GPU_CHUNK_MAX

    def task(r: WorkRow) -> float:
        k = min(GPU_CHUNK_MAX, r.bank) if r.vectorised else 1
        grads = tuple(k * g for g in r.grad_peak)
        return projected_seconds([r._replace(runs=k, forward=r.peak * k, gradients=grads)])

    total, longest = 0.0, (0.0, None)
    for rows in training_work(profile).values():
        if rows:
            slowest = max(rows, key=task)
            total += max(projected_seconds(rows) / gpus, task(slowest))
            longest = max(longest, (task(slowest), slowest), key=lambda t: t[0])
    return total, longest[1], longest[0]


def parallel_text(profile: str, gpus: int) -> str:
    """The sentences of docs/ray.md: ``profile``'s projected training time on ``gpus`` GPUs."""
    from bnmem_utils.jobs.bank_models import GPU_CHUNK_MAX

    seconds, row, task = parallel_seconds(profile, gpus)
    one = projected_seconds([r for rows in training_work(profile).values() for r in rows])
    what = (f"{min(GPU_CHUNK_MAX, row.bank)} models trained at once" if row.vectorised
            else "one model")
    return (f"The `{profile}` profile projects {duration(one)} on {MACHINE['short']} "
            f"(`python -m bnmem_utils.run.work`: training, queries, evaluation and per-sample "
            f"gradients, at the rates "
            f"of `bnmem_utils.run.work.RATES`), so about {duration(seconds)} on {gpus} GPUs with "
            f"one task per GPU, assuming each notebook's work splits evenly by bank member and run. "
            f"The longest single task bounds how far more GPUs can cut it: {what} "
            f"({row.label}, {row.epochs} epochs), {duration(task)}.")


def write(profiles: Iterable[str], root=None) -> list[str]:
    """Rewrite the generated block of each profile file (inserted before its ``profile:`` line
    where it has none) and the projected paragraphs of docs/ray.md; the files that changed."""
    named = runplan.available_profiles()
    by_path = {str(named[n]): n for n in profiles}
    changed = rewrite_blocks([named[n] for n in profiles],
                             lambda path: projection_block(by_path[str(path)]))
    doc = (root or project_root()) / RAY_DOC
    old = doc.read_text()
    new = DOC_MARK.sub(lambda m: f"<!-- projected:{m['profile']} {m['gpus']} -->"
                       f"{parallel_text(m['profile'], int(m['gpus']))}<!-- /projected -->", old)
    if new != old:
        doc.write_text(new)
        changed.append(str(doc))
    return changed


def trainer_disagreements(rates: Mapping[tuple, Rate]) -> list[str]:
    """Each wide network whose GPU bank trainer (:data:`bnmem_utils.jobs.config.GPU_TRAINER`) is
    not the faster of its two measured CIFAR-shape rates in ``rates``, in words."""
    from bnmem_utils.jobs.config import GPU_TRAINER

    out = []
    for arch, rule in GPU_TRAINER.items():
        vec, seq = (rates.get((arch, CIFAR_SHAPE, v)) for v in (True, False))
        if vec and seq and vec.source.startswith("measured") and seq.source.startswith("measured"):
            faster = "vectorised" if vec.value > seq.value else "sequential"
            if faster != rule:
                out.append(f"{arch}: GPU_TRAINER says {rule}, but {faster} measured faster "
                           f"({vec.value:,.0f} sample-epochs/s K at once, {seq.value:,.0f} one "
                           f"after another)")
    return out


def adopt(paths: str | Path | Iterable, profiles: Iterable[str]) -> int:
    """``--adopt``: check the rates file at ``paths`` (or the files of one card's split calls,
    merged: :func:`~bnmem_utils.run.rates.merged_rates`), write it over :data:`RATES_FILE` (keeping a committed ratio that
    none of them measures: :data:`RATIOS`) and rewrite the ``profiles``' blocks and docs/ray.md
    from it (in a fresh interpreter, which reads it); exit status 2 with one line where it is
    refused (a file from outside: :func:`~bnmem_utils.run.rates.read_outside`), and where it
    holds what :data:`RATES_FILE` holds, exit status 0: either way nothing is written."""
    import subprocess
    import tempfile

    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    old = json.loads(RATES_FILE.read_text()) if RATES_FILE.exists() else {}
    try:
        doc = merged_rates(paths)
        kept = [k for k in RATIOS if k not in doc and k in old]
        doc |= {k: old[k] for k in kept}     # a run without part 2 keeps those measurements
        with tempfile.TemporaryDirectory() as tmp:
            trial = Path(tmp) / RATES_FILE.name
            trial.write_text(json.dumps(doc, indent=1) + "\n")
            try:
                machine, rates = load_rates(trial)
                rate_table(rates)
            except ValueError as exc:        # a rate in two of the files: name them
                raise ValueError(str(exc).replace(str(trial), " + ".join(map(str, paths)))) from None
            speedup, cost = load_forward_speedup(trial), load_gradient_cost(trial)
            own = load_query_speedups(trial)
    except ValueError as exc:
        print(f"--adopt: {exc}", file=sys.stderr)
        return 2
    if doc == old:
        print(f"--adopt: {RATES_FILE} already holds what {' + '.join(map(str, paths))} "
              f"measured; nothing written")
        return 0
    RATES_FILE.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"adopted {' + '.join(map(str, paths))} as {RATES_FILE} ({machine.get('card')}, "
          f"{machine.get('date')}, commit {machine.get('commit')}: {len(rates)} measured rates, "
          f"{len(own)} with their network's queries' speed-up; forward passes elsewhere at "
          f"{speedup.value:.3g}x the training rate, "
          f"{'kept: ' if 'forward_speedup' in kept else ''}{speedup.source}; per-sample "
          f"gradients at {cost['eval'].value:.3g} and {cost['train'].value:.3g} (eval, train), "
          f"{'kept: ' if 'per_sample_cost' in kept else ''}{cost['train'].source})")
    for line in trainer_disagreements(rates):
        print(f"warning: {line}; change GPU_TRAINER in bnmem_utils/jobs/config.py", file=sys.stderr)
    return subprocess.call([sys.executable, "-m", "bnmem_utils.run.work", "--write", *profiles])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bnmem_utils.run.work",
                                 description="Each notebook's training work under a profile and "
                                             "its projected training time on one GPU.")
    ap.add_argument("profiles", nargs="*", default=["gpu", "paper"], help="profiles (gpu paper)")
    ap.add_argument("--write", action="store_true",
                    help="rewrite each profile file's generated block and docs/ray.md's paragraph")
    ap.add_argument("--adopt", metavar="FILE", action="append",
                    help=f"take the rates file FILE (benchmarks/gpu_smoke.py --json) as "
                         f"{RATES_FILE.name}, then --write the profiles with it; given twice, "
                         f"the files of one card's split calls, merged")
    ap.add_argument("--rates", choices=("gpu", "cpu"), default="gpu",
                    help="project at the GPU's rates (gpu_rates.json) or the CPU's "
                         "(cpu_rates.json: bnmem_utils.run.cpu_work; profiles by default the CPU "
                         "profiles, with --write their blocks)")
    ap.add_argument("--only", metavar="NB",
                    help="with --rates cpu: these notebooks (as bnmem reproduce --only; default "
                         "each CPU profile's own)")
    args = ap.parse_args(argv)
    if args.rates == "cpu":
        from bnmem_utils.run import cpu_work

        default = args.profiles == ap.get_default("profiles")
        return cpu_work.main(training_work, list(cpu_work.CPU_PROFILES) if default
                             else args.profiles, only=args.only, write_files=args.write)
    if args.adopt:
        return adopt(args.adopt, args.profiles)
    if args.write:
        for path in write(args.profiles):
            print(f"rewrote {path}")
        return 0
    for name in args.profiles:
        try:
            print(f"profile {name}:\n{projection_block(name)}\n")
        except ValueError as exc:    # a profile on data the rates do not cover (the digits)
            print(f"profile {name}: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
