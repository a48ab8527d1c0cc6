"""Each notebook's training work under a profile, and its projected time on one GPU.

:func:`training_work` builds the runs and banks every notebook of a profile trains, with the
functions the notebooks call to build them (each notebook's ``*_from_params``: see
:data:`BUILDERS`) on the profile's values (a key it does not set: the notebook's default), and
counts them as :class:`WorkRow` s: models x epochs x training samples
per model (a grid run on its whole, corrupted training set; a bank member on half its pool),
and the images each forward pass besides training reads (:func:`forward_images`: a bank
member's queries and test evaluation, a grid or gradient-norm run's evaluation every epoch).
A run or bank that an earlier notebook already trains (equal :class:`RunConfig`, one cache) is
counted there only. Notebook 05's banks depend on the lambda its selection seeds choose: they
are counted for the choice that banks the most arms, and its measurement runs as if a penalty
is chosen (an upper bound).

:func:`projected_seconds` divides the work by training rates in sample-epochs per second
(:data:`RATES`: those of :data:`RATES_FILE`, measured by ``benchmarks/gpu_smoke.py --json`` on
the last GPU lent, and the others derived from them by FLOPs per trained image), and the forward
images by :data:`FORWARD_SPEEDUP` times the same rate (the file's measured ratio of a bank
member's query images per second to its training images per second, else 3: a forward pass is
about a third of a training step's FLOPs). Per-sample gradients (notebook 03) are not in it.
``--adopt FILE`` takes a new measurement as that file.
:func:`projection_block` renders the comment block each GPU profile carries;
``python -m bnmem_utils.run.work --write gpu paper`` rewrites it in place (and the paragraph of
docs/ray.md), and tests/test_work.py checks both.
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

MNIST_SHAPE, CIFAR_SHAPE = (1, 28, 28), (3, 32, 32)
#: Image shape (channels, height, width) of each data set.
SHAPES = {"digits": (1, 8, 8), "mnist": MNIST_SHAPE, "fashion_mnist": MNIST_SHAPE,
          "cifar10": CIFAR_SHAPE, "cifar100": CIFAR_SHAPE}
#: GFLOP of one training step per image (forward and backward; BN models, 10 classes), counted
#: by torch.utils.flop_counter.FlopCounterMode on the CPU (tests/test_work.py recounts them).
TRAIN_GFLOP = {("lenet", MNIST_SHAPE): 0.0036463, ("lenet", CIFAR_SHAPE): 0.0058831,
               ("resnet18", MNIST_SHAPE): 2.7339, ("resnet18", CIFAR_SHAPE): 3.3290,
               ("resnet20", MNIST_SHAPE): 0.18591, ("resnet20", CIFAR_SHAPE): 0.24399,
               ("densenet", MNIST_SHAPE): 0.33006, ("densenet", CIFAR_SHAPE): 0.43287}

#: The measured training rates the projections start from: what ``benchmarks/gpu_smoke.py --json``
#: wrote on the last GPU lent (its card, torch, date and commit in the file's ``machine``).
RATES_FILE = Path(__file__).with_name("gpu_rates.json")
#: The ResNet-18 rate the fast path aims at (images per second, one model; 13% of an H200's peak).
RESNET18_TARGET = 40_000.0
DERIVED = "derived from FLOPs, not measured"


class Rate(NamedTuple):
    """A training rate in sample-epochs per second, and where it comes from."""

    value: float
    source: str


class WorkRow(NamedTuple):
    """Part of a notebook's training: ``runs`` models of ``arch`` on ``shape`` images, each
    ``epochs`` epochs over ``samples`` training samples (a bank member: half its pool), trained
    K at once (``vectorised``) or one after another by default on a GPU; ``forward``: the
    images all ``runs`` read in forward passes besides training (:func:`forward_images`),
    ``peak`` the most one of them reads (a BN bank member more than a no-norm one); ``bank``:
    the models of one bank (1 for other runs), the most a task trains at once."""

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

    @property
    def sample_epochs(self) -> float:
        return self.runs * self.epochs * self.samples


def load_rates(path: str | Path = RATES_FILE) -> tuple[dict, dict[tuple, Rate]]:
    """The ``machine`` of a rates file (``benchmarks/gpu_smoke.py --json``) and its measured
    ``{(arch, shape, vectorised): Rate}``; a ``ValueError`` naming the file and the entry where
    it is not one measured on a GPU at full size (a ``--tiny`` or CPU run projects nothing)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        machine, entries = data["machine"], data["rates"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a rates file of benchmarks/gpu_smoke.py --json "
                         f"({type(exc).__name__}: {exc})") from None
    how = (["with --tiny"] if machine.get("tiny") else []) + \
        ([f"on {machine.get('device')}"] if machine.get("device") != "cuda" else [])
    if how:
        raise ValueError(f"{path}: measured {' '.join(how)}; only a full-size run on a CUDA GPU "
                         f"gives rates to project from")
    words = ", ".join(str(machine[k]) for k in ("short", "torch", "date") if machine.get(k))
    words += f", commit {machine.get('commit', 'unknown')}, {machine.get('command', '?')}"
    rates = {}
    for i, e in enumerate(entries):
        key = (e.get("arch"), tuple(e.get("shape") or ()), e.get("vectorised"))
        if (key[0], key[1]) not in TRAIN_GFLOP or not isinstance(key[2], bool) \
                or not isinstance(e.get("rate"), (int, float)) or not e["rate"] > 0:
            raise ValueError(f"{path}: rates[{i}] = {e!r} is not a rate of a known architecture "
                             f"and image shape ({sorted(TRAIN_GFLOP)}), a trainer "
                             f"(vectorised: true or false) and a positive sample-epochs/s")
        if key in rates:
            raise ValueError(f"{path}: rates[{i}] measures {rate_label(key)} a second time")
        rates[key] = Rate(float(e["rate"]), f"measured ({words}; {e.get('how', '')})")
    return machine, rates


def load_forward_speedup(path: str | Path = RATES_FILE) -> Rate:
    """Forward images per second over the training rate of the same network: the rates file's
    ``forward_speedup`` (``benchmarks/gpu_smoke.py`` part 2: a ResNet-18 bank member's queries
    against its training), else 3, derived (a training step is a forward and a backward of
    about twice its FLOPs); a ``ValueError`` naming the file where the value is no positive
    number."""
    entry = json.loads(Path(path).read_text()).get("forward_speedup")
    if entry is None:
        return Rate(3.0, "derived from FLOPs, not measured: a forward pass is about a third of a "
                         "training step")
    value = entry.get("value") if isinstance(entry, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{path}: forward_speedup = {entry!r} is not a positive number of "
                         f"forward images per trained image's time")
    return Rate(float(value), f"measured ({entry.get('how', '')})")


#: The machine the rates of :data:`RATES_FILE` were measured on, and those rates.
MACHINE, MEASURED = load_rates()
#: Forward images per second over the training rate (:func:`load_forward_speedup`).
FORWARD = load_forward_speedup()
FORWARD_SPEEDUP = FORWARD.value


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


def _row_of(label: str, config) -> tuple:
    """The row key of one run or bank: label, arch, shape, epochs, samples per model, and
    whether a GPU trains it K models at once by default."""
    import torch

    from bnmem_utils.jobs.config import bank_trainer

    data, rate = config.data, config.corruption.ood_rate
    n = min(data.train_size or math.inf, SPLIT_SIZES[data.dataset][0])
    samples = n + round(rate * n)             # OOD inserts join the training set
    bank = config.kind == "bank"
    vec = bank and bank_trainer(config, torch.device("cuda")) == "vectorised"
    return (label, config.model.arch, SHAPES[data.dataset], config.train.epochs,
            samples / 2 if bank else samples, vec)


def forward_images(config) -> int:
    """Images one run or bank member of ``config`` reads in forward passes besides training: a
    bank member's eval-mode queries of its pool and the population, its train-mode queries of
    the pool (BN), each under every query augmentation, and its test evaluation; a grid run's
    or gradient-norm run's evaluation of its training set and test split after every epoch (a
    gradient-norm run's per-sample gradients are not counted)."""
    data = config.data
    train, test = SPLIT_SIZES[data.dataset]
    n = min(data.train_size or math.inf, train)
    pool = n + round(config.corruption.ood_rate * n)
    t = min(data.test_size or math.inf, test)
    if config.kind == "bank":
        q, p = len(config.measure.queries), config.measure.population_size
        twice = 2 if config.model.norm == "bn" else 1
        return int(q * (twice * pool + (t if p is None else p)) + t)
    return int(config.train.epochs * (pool + t))


def training_work(profile: str | Mapping) -> dict[str, list[WorkRow]]:
    """``{notebook: [WorkRow, ...]}``: what every notebook trains under ``profile`` when the
    whole profile runs in order (a run or bank an earlier notebook trained read from the cache,
    so not counted again). Bank members count as models (``runs``), each on half its pool."""
    p = profile_parameters(profile)
    trained: set = set()
    work: dict[str, list[WorkRow]] = {}
    for nb, build in BUILDERS.items():
        counts: dict[tuple, list[int]] = {}
        for label, config in (build(p) if build else []):
            if config in trained:
                continue
            trained.add(config)
            runs = config.measure.n_models if config.kind == "bank" else 1
            count = counts.setdefault(_row_of(label, config), [0, 0, 0, 1])
            forward = forward_images(config)
            count[0] += runs
            count[1] += runs * forward
            count[2] = max(count[2], forward)
            count[3] = max(count[3], runs)
        work[nb] = [WorkRow(label, arch, shape, runs, epochs, samples, vec, *sizes)
                    for (label, arch, shape, epochs, samples, vec), (runs, *sizes)
                    in counts.items()]
    return work


def projected_seconds(rows: Iterable[WorkRow], rates: Mapping[tuple, Rate] = RATES, *,
                      forward: bool = True, training: bool = True) -> float:
    """Seconds of ``rows`` at ``rates`` (``{(arch, shape, vectorised): Rate}`` or plain numbers,
    sample-epochs per second): their training and their forward images, the latter at
    :data:`FORWARD_SPEEDUP` times the rate (``forward=False`` or ``training=False``: without)."""
    total = 0.0
    for r in rows:
        key = (r.arch, r.shape, r.vectorised)
        if key not in rates:
            raise ValueError(f"no training rate for {rate_label(key)} (the table covers "
                             f"MNIST- and CIFAR-shape images): {r.label}")
        rate = float(getattr(rates[key], "value", rates[key]))
        total += (training * r.sample_epochs + forward * r.forward / FORWARD_SPEEDUP) / rate
    return total


# --------------------------------------------------------------------------------------------
# The comment block of a profile, the paragraph of docs/ray.md, and --write
# --------------------------------------------------------------------------------------------
BEGIN = ("# --- projected training work (generated by bnmem_utils.run.work; tests/test_work.py "
         "checks it) ---")
END = "# --- end of projected training work ---"
DOC_MARK = re.compile(r"<!-- projected:(?P<profile>[\w.-]+) (?P<gpus>\d+) -->.*?<!-- /projected -->",
                      re.S)
RAY_DOC = "docs/ray.md"


def duration(seconds: float) -> str:
    """``47.2 min`` below two hours, else ``13.6 h``."""
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _span(values: Iterable[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"


def rate_label(key: tuple) -> str:
    """``resnet18 3x32x32, one after another`` for the rate key ``(arch, shape, vectorised)``."""
    arch, (c, h, w), vec = key
    return f"{arch} {c}x{h}x{w}, {'K at once' if vec else 'one after another'}"


def _rate_words(key: tuple, rate: Rate) -> str:
    where = "measured" if rate.source.startswith("measured") else DERIVED
    return f"  {rate_label(key) + ':':36s} {rate.value:>9,.0f}  {where}"


def projection_lines(profile: str) -> list[str]:
    """The lines of :func:`projection_block` without their ``# `` and markers."""
    work = training_work(profile)
    every = [r for rows in work.values() for r in rows]
    lines = _wrap("Training, and the forward passes of queries and evaluation (per-sample "
                  "gradients not counted), the whole profile in order (a bank or run an earlier "
                  "notebook trains is read from the cache), at the training rates of "
                  f"{MACHINE['short']} ({RATES_FILE.name}, {MACHINE['date']}) and forward "
                  f"images at {FORWARD_SPEEDUP:.3g}x those rates ({FORWARD.source}); "
                  "another card of its class should be close for this compute-bound work, but "
                  f"the rates were measured on {MACHINE['short']}. 05's banks are counted for the lambda that "
                  "banks the most arms, its measurement runs as if a penalty is chosen.", 96)
    lines.append(f"  {'notebook':23s} {'models':>7s} {'epochs':>7s} {'samples/model':>14s} "
                 f"{'sample-epochs':>14s} {'forward':>9s} {MACHINE['short']:>10s}")
    for nb, rows in work.items():
        cells = (["-"] * 6 if not rows else
                 [f"{sum(r.runs for r in rows):,}", _span([r.epochs for r in rows], "d"),
                  _span([r.samples for r in rows], ",.0f"),
                  f"{sum(r.sample_epochs for r in rows) / 1e6:,.1f} M",
                  f"{sum(r.forward for r in rows) / 1e6:,.1f} M",
                  duration(projected_seconds(rows))])
        lines.append(f"  {nb:23s} {cells[0]:>7s} {cells[1]:>7s} {cells[2]:>14s} {cells[3]:>14s} "
                     f"{cells[4]:>9s} {cells[5]:>10s}")
    lines.append(f"  {'total':23s} {sum(r.runs for r in every):>7,} {'':7s} {'':14s} "
                 f"{sum(r.sample_epochs for r in every) / 1e6:>12,.1f} M "
                 f"{sum(r.forward for r in every) / 1e6:>7,.1f} M "
                 f"{duration(projected_seconds(every)):>10s}")
    lines += _wrap(f"Of which training {duration(projected_seconds(every, forward=False))}, "
                   f"forward passes {duration(projected_seconds(every, training=False))}. At the "
                   f"{RESNET18_TARGET:,.0f} img/s ResNet-18 target (and the rates derived from "
                   f"it, scaled): {duration(projected_seconds(every, TARGET_RATES))}.", 96)
    lines.append(f"Rates, sample-epochs/s on {MACHINE['short']} (bnmem_utils.run.work.RATES):")
    return lines + [_rate_words(k, RATES[k])
                    for k in sorted({(r.arch, r.shape, r.vectorised) for r in every})]


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
        return projected_seconds([r._replace(runs=k, forward=r.peak * k)])

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
            f"(`python -m bnmem_utils.run.work`: training, queries and evaluation, at the rates "
            f"of `bnmem_utils.run.work.RATES`), so about {duration(seconds)} on {gpus} GPUs with "
            f"one task per GPU, assuming each notebook's work splits evenly by bank member and run. "
            f"The longest single task bounds how far more GPUs can cut it: {what} "
            f"({row.label}, {row.epochs} epochs), {duration(task)}.")


def write(profiles: Iterable[str], root=None) -> list[str]:
    """Rewrite the generated block of each profile file (inserted before its ``profile:`` line
    where it has none) and the projected paragraphs of docs/ray.md; the files that changed."""
    changed = []
    named = runplan.available_profiles()
    for name in profiles:
        path = named[name]
        old = path.read_text()
        block = projection_block(name)
        if BEGIN in old:
            head, rest = old.split(BEGIN, 1)
            new = head + block + rest.split(END, 1)[1]
        else:
            at = re.search(r"^profile:", old, flags=re.M).start()
            new = old[:at] + block + "\n" + old[at:]
        if new != old:
            path.write_text(new)
            changed.append(str(path))
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


def adopt(path: str | Path, profiles: Iterable[str]) -> int:
    """``--adopt``: check the rates file at ``path``, copy it over :data:`RATES_FILE` and rewrite
    the ``profiles``' blocks and docs/ray.md from it (in a fresh interpreter, which reads it);
    exit status 2 with one line where the file is refused."""
    import subprocess

    try:
        machine, rates = load_rates(path)
        rate_table(rates)
        load_forward_speedup(path)
    except ValueError as exc:
        print(f"--adopt: {exc}", file=sys.stderr)
        return 2
    doc = json.loads(Path(path).read_text())
    old = json.loads(RATES_FILE.read_text()) if RATES_FILE.exists() else {}
    kept = "forward_speedup" not in doc and "forward_speedup" in old
    if kept:                       # a run without part 2 keeps the committed measurement
        doc["forward_speedup"] = old["forward_speedup"]
    RATES_FILE.write_text(json.dumps(doc, indent=1) + "\n")
    speedup = load_forward_speedup(RATES_FILE)
    print(f"adopted {path} as {RATES_FILE} ({machine.get('card')}, {machine.get('date')}, "
          f"commit {machine.get('commit')}: {len(rates)} measured rates; forward passes at "
          f"{speedup.value:.3g}x the training rate, {'kept: ' if kept else ''}{speedup.source})")
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
    ap.add_argument("--adopt", metavar="FILE",
                    help=f"take the rates file FILE (benchmarks/gpu_smoke.py --json) as "
                         f"{RATES_FILE.name}, then --write the profiles with it")
    args = ap.parse_args(argv)
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
