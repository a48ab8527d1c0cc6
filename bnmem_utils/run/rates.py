"""The measured GPU training rates the profiles are projected from, and where each comes from.

:data:`RATES_FILE` (``bnmem_utils/run/gpu_rates.json``) holds what ``benchmarks/gpu_smoke.py
--json`` measured on the last GPU lent: training rates in sample-epochs per second
(:func:`load_rates`), the forward speed-up of queries over training
(:func:`load_forward_speedup`; per network, :func:`load_query_speedups`) and the cost of
per-sample gradients
(:func:`load_gradient_cost`), each refused in one line where it is no measurement. A ratio the
file lacks is derived from FLOPs and says so. ``python -m bnmem_utils.run.work --adopt FILE``
takes a new measurement, a file from outside checked whole first (:func:`read_outside`: its
size, its keys, every number finite and above 0, every string short); :mod:`bnmem_utils.run.work`
counts the profiles' work and projects it at these rates.
"""

from __future__ import annotations

import json
import math
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
#: What :data:`RATES_FILE` says it is (``--adopt`` writes it in place of a benchmark file's own).
ABOUT = ("Training rates (sample-epochs per second) that bnmem_utils.run.work projects the GPU "
         "profiles from, as benchmarks/gpu_smoke.py --json writes them. Keys it does not hold are "
         "derived from FLOPs per trained image. To adopt a new measurement: python -m "
         "bnmem_utils.run.work --adopt FILE, which copies it here and rewrites the gpu and paper "
         "profiles' blocks and docs/ray.md from it.")


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


#: The most bytes a rates file may hold, checked before it is read (a measurement is a few KiB).
MAX_BYTES = 2**20
#: The most characters of a string in a rates file from outside (a card's name, a command, how a
#: rate was measured: they are written into the profiles and docs/ray.md), and of its ``about``.
MAX_TEXT, MAX_ABOUT = 200, 1000
#: The keys of a rates file, of its ``machine``, of one of its rates and of a measured ratio.
KEYS = ("about", "machine", "rates", "parts", "forward_speedup", "per_sample_cost")
MACHINE_KEYS = ("card", "short", "device", "torch", "date", "commit", "command", "tiny",
                "budget_s")
RATE_KEYS = ("arch", "shape", "vectorised", "rate", "how", "forward_speedup", "queries")
RATIO_KEYS = ("value", "how")


def positive(value) -> bool:
    """Whether ``value`` is a finite number above 0: an int or a float, not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value)) and value > 0
    except OverflowError:                # an int too large for a float
        return False


def shown(value, width: int = 60) -> str:
    """``value`` as JSON writes it (``Infinity``, ``true``), cut to ``width`` characters, a
    long string's length said."""
    text = json.dumps(value, default=repr)
    if len(text) <= width:
        return text
    size = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return f"{text[:width - 3]}...{size}"


def _read(path: str | Path) -> dict:
    """The JSON of the rates file at ``path``; a ``ValueError`` naming it where it cannot be
    read, holds more than :data:`MAX_BYTES` (not read then) or is no JSON object."""
    path = Path(path)
    try:
        size = path.stat().st_size
        text = path.read_bytes() if size <= MAX_BYTES else b""
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if size > MAX_BYTES:
        raise ValueError(f"{path}: {size:,} bytes, refused unread; valid: a rates file of at "
                         f"most {MAX_BYTES:,} bytes")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: not a rates file of benchmarks/gpu_smoke.py --json "
                         f"({type(exc).__name__}: {str(exc)[:100]})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: holds {shown(doc)}, not a rates file of "
                         f"benchmarks/gpu_smoke.py --json (a JSON object)")
    return doc


def _refuse(path, key: str, value, valid: str) -> ValueError:
    return ValueError(f"{path}: {key} = {shown(value)} is refused; valid: {valid}")


def _check_table(path, key: str, table, keys: tuple[str, ...]) -> dict:
    """``table`` (the value of ``key``) as a dict of known ``keys`` only."""
    if not isinstance(table, dict):
        raise _refuse(path, key, table, f"an object of {', '.join(keys)}")
    for name in table:
        if name not in keys:
            raise ValueError(f"{path}: {shown(name)} is not a key of "
                             f"{key or 'a rates file'}; valid: {', '.join(keys)}")
    return table


def _check_field(path, key: str, value) -> None:
    """One value of a rates file from outside, by its name: a number finite and above 0 (a
    rate, a ratio), a flag, a shape, a budget, else a string of at most :data:`MAX_TEXT`."""
    name = key.rsplit(".", 1)[-1]
    if name in ("rate", "value", "forward_speedup"):
        if not positive(value):
            raise _refuse(path, key, value, "a finite number above 0 (true and false are none)")
    elif name in ("vectorised", "tiny"):
        if not isinstance(value, bool):
            raise _refuse(path, key, value, "true or false")
    elif name == "shape":
        if not (isinstance(value, list) and len(value) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise _refuse(path, key, value, "[channels, height, width], three integers")
    elif name == "budget_s":
        if not (value == 0 or positive(value)):
            raise _refuse(path, key, value, "a finite number of seconds, 0 or above")
    else:
        limit = MAX_ABOUT if key == "about" else MAX_TEXT
        if not isinstance(value, str) or len(value) > limit:
            raise _refuse(path, key, value, f"a string of at most {limit} characters")


def read_outside(path: str | Path) -> dict:
    """The rates file at ``path`` from outside the repository (``benchmarks/gpu_smoke.py
    --json``), checked whole before anything is taken from it: at most :data:`MAX_BYTES`, no key
    but those named here (:data:`KEYS` and the tables beside it), every rate and ratio a finite
    number above 0, every flag true or false and every string short (:func:`_check_field`;
    ``parts``, the benchmark's own figures, is read by nothing); a ``ValueError`` of one line
    naming the file, the key, the value and what is valid where it is not."""
    doc = _check_table(path, "", _read(path), KEYS)
    for key in ("machine", "rates"):
        if key not in doc:
            raise ValueError(f"{path}: no {key}; a rates file of benchmarks/gpu_smoke.py --json "
                             f"holds {', '.join(KEYS)}")
    if "about" in doc:
        _check_field(path, "about", doc["about"])
    for name, value in _check_table(path, "machine", doc["machine"], MACHINE_KEYS).items():
        _check_field(path, f"machine.{name}", value)
    if not isinstance(doc["rates"], list):
        raise _refuse(path, "rates", doc["rates"], "a list of rates")
    for i, entry in enumerate(doc["rates"]):
        for name, value in _check_table(path, f"rates[{i}]", entry, RATE_KEYS).items():
            _check_field(path, f"rates[{i}].{name}", value)
    ratios = {"forward_speedup": doc.get("forward_speedup")}
    if "per_sample_cost" in doc:
        cost = _check_table(path, "per_sample_cost", doc["per_sample_cost"], ("eval", "train"))
        ratios |= {f"per_sample_cost.{d}": v for d, v in cost.items()}
    for key, ratio in ratios.items():
        for name, value in ({} if ratio is None else
                            _check_table(path, key, ratio, RATIO_KEYS)).items():
            _check_field(path, f"{key}.{name}", value)
    return doc


def load_rates(path: str | Path = RATES_FILE) -> tuple[dict, dict[tuple, Rate]]:
    """The ``machine`` of a rates file (``benchmarks/gpu_smoke.py --json``) and its measured
    ``{(arch, shape, vectorised): Rate}``; a ``ValueError`` naming the file and the entry where
    it is not one measured on a GPU at full size (a ``--tiny`` or CPU run projects nothing)."""
    path = Path(path)
    data = _read(path)
    try:
        machine, entries = data["machine"], data["rates"]
        machine.get("device")
    except (KeyError, TypeError, AttributeError) as exc:
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
                or not positive(e.get("rate")):
            raise ValueError(f"{path}: rates[{i}] = {e!r} is not a rate of a known "
                             f"architecture and image shape ({sorted(TRAIN_GFLOP)}), a trainer "
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
    if not positive(value):
        raise ValueError(f"{path}: {name} = {shown(entry)} is not a positive number")
    return Rate(float(value), f"measured ({entry.get('how', '')})")


def load_forward_speedup(path: str | Path = RATES_FILE) -> Rate:
    """Forward images per second over the training rate of the same network: the rates file's
    ``forward_speedup`` (``benchmarks/gpu_smoke.py`` part 2: a ResNet-18 bank member's queries
    against ResNet-18's training one model after another), else 3, derived (a training step is a forward and a backward of
    about twice its FLOPs); a ``ValueError`` naming the file where the value is no positive
    number."""
    entry = _read(path).get("forward_speedup")
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
    for i, e in enumerate(_read(path).get("rates") or []):
        if "forward_speedup" not in e:
            continue
        key = (e.get("arch"), tuple(e.get("shape") or ()), e.get("vectorised"))
        if key[:2] not in TRAIN_GFLOP or key[2] is not False:
            raise ValueError(f"{path}: rates[{i}] = {shown(e)} carries a forward_speedup, which only "
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
    doc = _read(path).get("per_sample_cost") or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: per_sample_cost = {shown(doc)} is not a table of eval and train")
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
    """The rates document of ``paths`` as :data:`RATES_FILE` holds it: one file's ``machine``,
    ``rates`` and measured ratios under :data:`ABOUT` (each file checked first:
    :func:`read_outside`; ``parts``, the benchmark's figures, left out), or the files of one
    card's split calls (``gpu_smoke.sh --parts 2`` and ``--parts 1,3,4``) as one, their rates
    together and each measured ratio from the file that has it; a ``ValueError`` naming the
    files where one is refused, the cards differ, or two measure the same ratio. ``python -m
    bnmem_utils.run.work --adopt`` takes it."""
    docs = []
    for path in paths:
        doc = read_outside(path)
        for check in (load_rates, load_forward_speedup, load_query_speedups, load_gradient_cost):
            check(path)
        docs.append({"about": ABOUT, **{k: doc[k] for k in ("machine", "rates", *RATIOS)
                                        if k in doc}})
    if len(docs) == 1:
        return docs[0]
    names = " + ".join(map(str, paths))
    cards = sorted({str(d["machine"].get("card")) for d in docs})
    if len(cards) > 1:
        raise ValueError(f"{names}: measured on {' and '.join(cards)}; adopt one card's at a time")
    machine = dict(docs[0]["machine"])
    for field in ("date", "commit", "command"):
        machine[field] = " and ".join(dict.fromkeys(str(d["machine"].get(field)) for d in docs))
    doc = {**docs[0], "machine": machine, "rates": [e for d in docs for e in d["rates"]]}
    for key in RATIOS:
        found = [d[key] for d in docs if key in d]
        if len(found) > 1:
            raise ValueError(f"{names}: {key} is measured in more than one of them")
        doc.pop(key, None)
        doc.update({key: found[0]} if found else {})
    return doc
