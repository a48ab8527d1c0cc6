"""The measured GPU training rates the profiles are projected from, and where each comes from.

:data:`RATES_FILE` (``bnmem_utils/run/gpu_rates.json``) holds what ``benchmarks/gpu_smoke.py
--json`` measured on the last GPU lent: training rates in sample-epochs per second
(:func:`load_rates`), the forward speed-up of queries over training
(:func:`load_forward_speedup`; per network, :func:`load_query_speedups`) and the cost of
per-sample gradients
(:func:`load_gradient_cost`), each refused in one line where it is no measurement. A ratio the
file lacks is derived from FLOPs and says so. ``python -m bnmem_utils.run.work --adopt FILE``
takes a new measurement; :mod:`bnmem_utils.run.work` counts the profiles' work
and projects it at these rates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

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
DERIVED = "derived from FLOPs, not measured"


class Rate(NamedTuple):
    """A training rate in sample-epochs per second, and where it comes from."""

    value: float
    source: str


def rate_label(key: tuple) -> str:
    """``resnet18 3x32x32, one after another`` for the rate key ``(arch, shape, vectorised)``."""
    arch, (c, h, w), vec = key
    return f"{arch} {c}x{h}x{w}, {'K at once' if vec else 'one after another'}"


def where_from(rate: Rate) -> str:
    """``measured``, or the words of a rate derived from FLOPs."""
    return "measured" if rate.source.startswith("measured") else DERIVED


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


def _file_ratio(path: str | Path, entry, name: str, derived: Rate) -> Rate:
    """A measured ratio ``entry`` (``{"value": ..., "how": ...}``) of the rates file at ``path``,
    ``derived`` where it has none; a ``ValueError`` naming the file where it is no positive
    number."""
    if entry is None:
        return derived
    value = entry.get("value") if isinstance(entry, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{path}: {name} = {entry!r} is not a positive number")
    return Rate(float(value), f"measured ({entry.get('how', '')})")


def load_forward_speedup(path: str | Path = RATES_FILE) -> Rate:
    """Forward images per second over the training rate of the same network: the rates file's
    ``forward_speedup`` (``benchmarks/gpu_smoke.py`` part 2: a ResNet-18 bank member's queries
    against ResNet-18's training one model after another), else 3, derived (a training step is a forward and a backward of
    about twice its FLOPs); a ``ValueError`` naming the file where the value is no positive
    number."""
    entry = json.loads(Path(path).read_text()).get("forward_speedup")
    return _file_ratio(path, entry, "forward_speedup",
                       Rate(3.0, f"{DERIVED}: a forward pass is about a third of a training step"))


def load_query_speedups(path: str | Path = RATES_FILE) -> dict[tuple, Rate]:
    """``{(arch, shape, False): Rate}``: each network's forward images per second (one model's
    queries, as a bank makes them) over its training rate one model after another, where the
    rates file's entry carries a ``forward_speedup`` (``benchmarks/gpu_smoke.py`` part 4 times
    the queries of every network and shape it projects); a ``ValueError`` naming the file and
    the entry where it is no positive number, or sits on a vectorised rate (K models' stacked
    queries are not one model's)."""
    out = {}
    for i, e in enumerate(json.loads(Path(path).read_text()).get("rates") or []):
        if "forward_speedup" not in e:
            continue
        key = (e.get("arch"), tuple(e.get("shape") or ()), e.get("vectorised"))
        if key[:2] not in TRAIN_GFLOP or key[2] is not False:
            raise ValueError(f"{path}: rates[{i}] = {e!r} carries a forward_speedup, which only "
                             f"a rate of one model after another of a known network may")
        out[key] = _file_ratio(path, {"value": e["forward_speedup"], "how": e.get("queries", "")},
                               f"rates[{i}].forward_speedup", None)
    return out


#: The cost of per-sample gradients until one is measured, in trained images' time: under
#: ``eval`` per sample (one image's forward and backward), under ``train`` per image of a
#: Jacobian row's batch (a backward of the whole batch per row; the batch's forward is counted
#: as forward images). At the training's arithmetic: 03 computes them in float32, which a GPU
#: runs slower than the bf16 it trains in, and vectorised per-sample gradients use it less well,
#: so read these as lower bounds until ``benchmarks/gpu_smoke.py`` part 2 measures them.
DERIVED_GRADIENT_COST = {
    "eval": Rate(1.0, f"{DERIVED}: one image's forward and backward per sample"),
    "train": Rate(2 / 3, f"{DERIVED}: a backward of the whole batch per Jacobian row")}


def load_gradient_cost(path: str | Path = RATES_FILE) -> dict[str, Rate]:
    """Trained images' time one unit of per-sample gradient work costs
    (:func:`bnmem_utils.run.work.gradient_work`), per definition: the rates file's
    ``per_sample_cost`` (``benchmarks/gpu_smoke.py`` part 2: ResNet-18's per-sample gradients
    against its training one model after another), else :data:`DERIVED_GRADIENT_COST`; a ``ValueError``
    naming the file where an entry is no positive number."""
    doc = json.loads(Path(path).read_text()).get("per_sample_cost") or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: per_sample_cost = {doc!r} is not a table of eval and train")
    return {d: _file_ratio(path, doc.get(d), f"per_sample_cost.{d}", r)
            for d, r in DERIVED_GRADIENT_COST.items()}


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


#: The measured ratios of a rates file that --adopt keeps where a new file lacks them.
RATIOS = ("forward_speedup", "per_sample_cost")


def merged_rates(paths: list) -> dict:
    """The rates document of ``paths``: one file as it is, or the files of one card's split
    calls (``gpu_smoke.sh --parts 2`` and ``--parts 1,3,4``) as one, their rates together and
    each measured ratio from the file that has it; a ``ValueError`` naming the files where one
    is refused, the cards differ, or two measure the same ratio. ``python -m
    bnmem_utils.run.work --adopt`` takes it."""
    docs = []
    for path in paths:
        for check in (load_rates, load_forward_speedup, load_query_speedups, load_gradient_cost):
            check(path)
        docs.append(json.loads(Path(path).read_text()))
    if len(docs) == 1:
        return docs[0]
    names = " + ".join(map(str, paths))
    cards = sorted({str(d["machine"].get("card")) for d in docs})
    if len(cards) > 1:
        raise ValueError(f"{names}: measured on {' and '.join(cards)}; adopt one card's at a time")
    machine = dict(docs[0]["machine"])
    for field in ("date", "commit", "command"):
        machine[field] = " and ".join(dict.fromkeys(str(d["machine"].get(field)) for d in docs))
    doc = {**docs[0], "machine": machine, "rates": [e for d in docs for e in d["rates"]],
           "parts": {str(p): d.get("parts") for p, d in zip(paths, docs, strict=True)}}
    for key in RATIOS:
        found = [d[key] for d in docs if key in d]
        if len(found) > 1:
            raise ValueError(f"{names}: {key} is measured in more than one of them")
        doc.pop(key, None)
        doc.update({key: found[0]} if found else {})
    return doc


#: The measured CPU training rates a CPU profile is projected from: what
#: ``benchmarks/bench_cpu_archs.py --json`` wrote (its CPU, threads, torch, date and commit in the
#: file's ``machine``), read by :func:`load_cpu_rates` and :mod:`bnmem_utils.run.cpu_work`.
CPU_RATES_FILE = Path(__file__).with_name("cpu_rates.json")


def load_cpu_rates(path: str | Path = CPU_RATES_FILE) -> tuple[dict, dict[tuple, Rate]]:
    """The ``machine`` of a CPU rates file (``benchmarks/bench_cpu_archs.py --json``) and its
    measured ``{(arch, shape, vectorised): Rate}``; a ``ValueError`` naming the file and the
    entry where it is not one measured on a CPU. A file measured at toy sizes
    (``machine.tiny``) is read, each rate's source saying so, so that the machinery can be
    checked before a full-size run; a projection from it states it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        machine, entries = data["machine"], data["rates"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a rates file of benchmarks/bench_cpu_archs.py --json "
                         f"({type(exc).__name__}: {exc})") from None
    if machine.get("device") != "cpu":
        raise ValueError(f"{path}: measured on {machine.get('device')}; a CPU projection needs "
                         f"rates measured on a CPU (benchmarks/bench_cpu_archs.py --json)")
    words = ", ".join(str(machine[k]) for k in ("short", "torch", "date") if machine.get(k))
    words += (f", {machine.get('threads', '?')} threads, commit {machine.get('commit', 'unknown')}"
              f", {machine.get('command', '?')}")
    size = "at toy sizes " if machine.get("tiny") else ""
    return machine, _entry_rates(path, entries, f"measured {size}({words}; " + "{how})")


def _entry_rates(path: Path, entries, source: str) -> dict[tuple, Rate]:
    """``{(arch, shape, vectorised): Rate}`` of a rates file's ``entries``, each Rate's source
    ``source`` with ``{how}`` replaced by its entry's ``how``; a ``ValueError`` naming ``path``
    and the entry where one is no rate of a known network, shape and trainer, or measures one
    a second time."""
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
        rates[key] = Rate(float(e["rate"]), source.replace("{how}", str(e.get("how", ""))))
    return rates
