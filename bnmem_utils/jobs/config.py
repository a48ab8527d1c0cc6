"""One description of a run, nested by what it sets, with one cache key over all of it.

Every trained thing in this project (a run of a grid, a shadow-model bank, a gradient-norm run;
with or without the gamma/sigma penalty) is a :class:`RunConfig`::

    RunConfig(data=DataConfig("digits"), corruption=CorruptionConfig(flip_rate=0.05),
              model=ModelConfig("lenet", "bn"), train=TrainConfig(epochs=20),
              penalty=PenaltyConfig(lam=0.1), seed=0, measure=BankMeasure(n_models=16))

``measure`` says what the run is for, and so which job trains it: :class:`GridMeasure` (a run of
notebooks 02 and 05: per-epoch history, end-of-training gamma/sigma), :class:`BankMeasure` (a
LiRA bank of notebooks 04 and 05: N models on random halves, queried) or
:class:`GradNormMeasure` (notebook 03: per-sample gradient norms at chosen epochs).

:meth:`RunConfig.key` is the one cache key: a hash of the whole resolved description (every
default included), the kind's version, the source of the package code that trains it, the
digest of its data, the device type and the source of any registered data set or architecture. Equal keys mean equal results on the same device type and thread
count; on a CPU another number of threads sums in another order, which training amplifies
into other models of the same statistics (``benchmarks/README.md``).

Built from flat keyword arguments (:meth:`RunConfig.grid`, :meth:`RunConfig.bank`,
:meth:`RunConfig.gradnorm`), each name routed to its section (``data_seed`` is the data
section's ``seed``; ``penalty`` takes a :class:`PenaltyConfig`, a dict or None), and changed the
same way (:meth:`RunConfig.replace`). A field is read by its real path (``config.model.norm``,
``config.measure.n_models``), so a search leads from every use to its field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from bnmem_utils.core import cache
from bnmem_utils.core.checks import check_choice, check_n_models, corruption_label
from bnmem_utils.models.nets import SMALL_ARCHS, trains_channels_last
from bnmem_utils.privacy.attacks import QUERIES
from bnmem_utils.training.penalty import PenaltyConfig
from bnmem_utils.training.per_sample import DEFINITIONS
from bnmem_utils.training.steps import TrainConfig, compile_mode, precision

#: Per-epoch trackers of a grid run (:data:`bnmem_utils.jobs.grid.TRACKERS`).
TRACKERS = ("gamma_sigma",)

#: Hashed into every key of its kind: bump one when a change in training, measuring or the
#: cached format makes that kind's cached results wrong.
VERSIONS = {"grid": 5, "bank": 5, "gradnorm": 5}
#: The module whose job trains each kind; the source of it and of every package module it
#: imports (:func:`bnmem_utils.core.cache.code_path`) is in every key of that kind.
JOB_MODULES = {"grid": "jobs.grid", "bank": "jobs.bank", "gradnorm": "jobs.gradnorms"}


def _check_sizes(section, *names: str) -> None:
    """Each of ``names`` must be None (all) or a positive integer."""
    for name in names:
        v = getattr(section, name)
        if v is not None and (int(v) != v or v < 1):
            raise ValueError(f"{name} must be None (all) or a positive integer, got {v!r}")


@dataclass(frozen=True)
class DataConfig:
    """Which data set, and which subsets of its splits (``seed`` picks them)."""

    dataset: str = "digits"
    train_size: int | None = None     # subsample the training split (None: all of it)
    test_size: int | None = None      # subsample the test split (None: all of it)
    seed: int = 0                     # seed of the subsampling (flat name: data_seed)

    def validate(self) -> None:
        from bnmem_utils.data.datasets import DATASETS

        check_choice("data set", self.dataset, DATASETS)
        _check_sizes(self, "train_size", "test_size")


@dataclass(frozen=True)
class CorruptionConfig:
    """What is corrupted in the training set (:func:`bnmem_utils.data.datasets.corrupt`): label flips,
    OOD inserts with random labels, or both."""

    flip_rate: float = 0.0            # fraction of training samples whose label is flipped
    ood_rate: float = 0.0             # OOD inserts as a fraction of the training set
    ood_source: str = "gaussian"      # where OOD inserts come from

    def validate(self, dataset: str) -> None:
        from bnmem_utils.data.datasets import check_ood_source

        check_ood_source(self.ood_source, dataset)
        for name in ("flip_rate", "ood_rate"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0.0 <= float(v) < 1.0:
                raise ValueError(f"{name} must be a fraction in [0, 1), got {v!r}")

    @property
    def active(self) -> bool:
        """Whether anything is corrupted."""
        return self.flip_rate > 0 or self.ood_rate > 0

    def label(self, with_source: bool = False) -> str:
        """``clean``, ``flip 5%``, ``OOD 1%`` (``OOD 2% (gaussian)`` with the source), or both."""
        return corruption_label(self.flip_rate, self.ood_rate,
                                self.ood_source if with_source else None)

    def slug(self) -> str:
        """The setting in results keys: ``clean``, ``ood1``, ``flip5``, ``ood0.5``."""
        parts = []
        if self.flip_rate > 0:
            parts.append(f"flip{100 * self.flip_rate:g}")
        if self.ood_rate > 0:
            parts.append(f"ood{100 * self.ood_rate:g}")
        return "_".join(parts) or "clean"


@dataclass(frozen=True)
class ModelConfig:
    """The network (:func:`bnmem_utils.models.nets.build_model`)."""

    arch: str = "lenet"
    norm: str = "bn"
    width: int = 1                    # width multiplier

    def validate(self) -> None:
        from bnmem_utils.models.nets import ARCHS, NORMS

        check_choice("architecture", self.arch, ARCHS)
        check_choice("norm", self.norm, NORMS)
        if int(self.width) != self.width or self.width < 1:
            raise ValueError(f"width must be a positive integer, got {self.width!r}")


# --------------------------------------------------------------------------------------------
# What a run measures: one section per kind of job
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GridMeasure:
    """A run of a grid (notebooks 02 and 05): the per-epoch history, the end-of-training
    gamma/sigma of every BN channel, and per-epoch ``track`` hooks
    (:data:`bnmem_utils.jobs.grid.TRACKERS`)."""

    track: tuple[str, ...] = ()

    kind = "grid"

    def __post_init__(self) -> None:
        object.__setattr__(self, "track", tuple(self.track))

    def validate(self, config: RunConfig) -> None:
        for name in self.track:
            check_choice("tracker", name, TRACKERS)



def default_queries(dataset: str) -> tuple[str, ...]:
    """Identity + mirror for the CIFARs (mirror-invariant objects); identity + the four one-pixel
    shifts for the digit-like sets (a mirrored digit is another symbol)."""
    if dataset in ("cifar10", "cifar100"):
        return ("identity", "mirror")
    return ("identity", "shift_right", "shift_left", "shift_down", "shift_up")


@dataclass(frozen=True)
class BankMeasure:
    """A LiRA shadow-model bank (notebooks 04 and 05): ``n_models`` models, each on a random
    half of the pool, queried in eval mode (and BN models in train mode) under ``queries``;
    with ``pairs``, models 2i and 2i + 1 on complementary halves (notebook 04's shadow-count
    curve: any set of whole pairs is balanced)."""

    n_models: int = 16                          # N: even, >= 4
    population_size: int | None = None          # test samples queried as RMIA's population
    queries: tuple[str, ...] = ()               # query augmentations (empty: default_queries)
    query_batch_size: int = 1024                # eval-mode query batch
    train_query_batch_size: int | None = None   # train-mode (ablation) query batch: batch_size
    pairs: bool = False                         # models 2i, 2i + 1 on complementary halves

    kind = "bank"

    def __post_init__(self) -> None:
        object.__setattr__(self, "queries", tuple(self.queries))

    def validate(self, config: RunConfig) -> None:
        check_n_models(self.n_models)
        for q in self.queries:
            check_choice("query", q, QUERIES)
        if self.queries[0] != "identity":
            raise ValueError(f"the first query must be 'identity' (memorization and the loss "
                             f"baseline use it), got {self.queries}")


@dataclass(frozen=True)
class GradNormMeasure:
    """Per-sample gradient norms (notebook 03) at ``measure_epochs`` (0: at initialisation),
    under ``definitions`` (``"train"`` only for BN models), on a seeded subset of the clean and
    of the noisy samples."""

    measure_epochs: tuple[int, ...] = (0, 2, 5, 10, 15, 20, 25, 30)
    definitions: tuple[str, ...] = ("eval", "train")
    max_clean: int | None = 256                 # clean samples measured (None: all)
    max_noisy: int | None = None                # noisy samples measured (None: all)

    kind = "gradnorm"

    def __post_init__(self) -> None:
        object.__setattr__(self, "measure_epochs",
                           tuple(sorted({int(e) for e in self.measure_epochs})))
        object.__setattr__(self, "definitions", tuple(self.definitions))

    def validate(self, config: RunConfig) -> None:
        if not self.definitions:
            raise ValueError("definitions must name at least one of: " + ", ".join(DEFINITIONS))
        for d in self.definitions:
            check_choice("definition", d, DEFINITIONS)
        epochs = config.train.epochs
        bad = [e for e in self.measure_epochs if not 0 <= e <= epochs]
        if bad or not self.measure_epochs:
            raise ValueError(f"measure_epochs must be epochs in 0..{epochs} (0: at init), "
                             f"got {list(self.measure_epochs)}")
        if not config.corruption.active:
            raise ValueError("nothing is corrupted (flip_rate = ood_rate = 0): there are no noisy "
                             "samples to compare with the clean ones")
        _check_sizes(self, "max_clean", "max_noisy")


MEASURES = {m.kind: m for m in (GridMeasure, BankMeasure, GradNormMeasure)}
Measure = GridMeasure | BankMeasure | GradNormMeasure

#: The sections a flat keyword goes to (the rest of RunConfig's fields are its own).
_SECTIONS = {"data": DataConfig, "corruption": CorruptionConfig, "model": ModelConfig,
             "train": TrainConfig}
_ALIASES = {"data_seed": ("data", "seed")}
_FLAT: dict[str, tuple[str, str]] = {
    f.name: (section, f.name) for section, cls in _SECTIONS.items() for f in fields(cls)
    if f.name != "seed"} | _ALIASES


def _route(kind: str, flat: Mapping, own: Collection[str]) -> tuple[dict, dict, dict]:
    """Split keywords of a ``kind`` run into its own fields (``own``), the sections' fields
    (``{section: {field: value}}``) and the measure's; unknown names raise an error that lists
    the valid ones."""
    measure_names = {f.name for f in fields(MEASURES[kind])}
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    measure: dict[str, Any] = {}
    for name, value in flat.items():
        if name in own:
            top[name] = value
        elif name in _FLAT:
            section, attr = _FLAT[name]
            sections.setdefault(section, {})[attr] = value
        elif name in measure_names:
            measure[name] = value
        else:
            valid = sorted({*_FLAT, *measure_names, *own})
            raise ValueError(f"unknown field {name!r} of a {kind} run; valid: {', '.join(valid)}")
    return top, sections, measure


#: Defaults of each kind where they differ from the sections' (a gradient-norm run compares
#: noisy with clean samples, so it corrupts 10% of the labels and does not augment).
KIND_DEFAULTS = {"grid": {"arch": "mlp"}, "bank": {},
                 "gradnorm": {"flip_rate": 0.1, "epochs": 30, "lr": 0.1, "augment": False}}


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunConfig:
    """Everything that determines one trained result; equal configs give equal results on the
    same device type. ``seed`` seeds the corruption (which samples, which wrong labels), the
    initialisation and the batch order (for a bank: its keep matrix and every member's seed),
    so configs that differ only in the norm share their corrupted samples: BN-minus-none
    comparisons are paired."""

    data: DataConfig = field(default_factory=DataConfig)
    corruption: CorruptionConfig = field(default_factory=CorruptionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    penalty: PenaltyConfig | None = None
    seed: int = 0
    measure: Measure = field(default_factory=GridMeasure)

    def __post_init__(self) -> None:
        object.__setattr__(self, "penalty", PenaltyConfig.of(self.penalty))
        if isinstance(self.measure, BankMeasure) and not self.measure.queries:
            object.__setattr__(self, "measure", dataclasses.replace(
                self.measure, queries=default_queries(self.data.dataset)))
        self.validate()

    def validate(self) -> None:
        """Raise a clear error naming any bad value and the valid choices."""
        self.data.validate()
        self.corruption.validate(self.data.dataset)
        self.model.validate()
        if self.penalty is not None and self.model.norm != "bn":
            raise ValueError(f"the gamma/sigma penalty applies to BN models only, got norm "
                             f"{self.model.norm!r}")
        if not isinstance(self.measure, tuple(MEASURES.values())):
            raise TypeError(f"measure must be one of {', '.join(c.__name__ for c in MEASURES.values())}, "
                            f"got {self.measure!r}")
        self.measure.validate(self)

    # -- flat construction -------------------------------------------------------------------
    @classmethod
    def make(cls, kind: str, **flat) -> RunConfig:
        """A run of ``kind`` (grid, bank, gradnorm) from flat keywords: the sections' field
        names (``data_seed`` for the data seed), ``seed``, ``penalty`` and the measure's
        fields. Unknown names raise an error that lists the valid ones."""
        check_choice("kind of run", kind, MEASURES)
        top, parts, measure = _route(kind, {**KIND_DEFAULTS[kind], **flat}, ("seed", "penalty"))
        return cls(**{s: c(**parts.get(s, {})) for s, c in _SECTIONS.items()}, **top,
                   measure=MEASURES[kind](**measure))

    @classmethod
    def grid(cls, **flat) -> RunConfig:
        """A run of a grid (:class:`GridMeasure`) from flat keywords (see :meth:`make`)."""
        return cls.make("grid", **flat)

    @classmethod
    def bank(cls, **flat) -> RunConfig:
        """A shadow-model bank (:class:`BankMeasure`) from flat keywords (see :meth:`make`)."""
        return cls.make("bank", **flat)

    @classmethod
    def gradnorm(cls, **flat) -> RunConfig:
        """A gradient-norm run (:class:`GradNormMeasure`) from flat keywords (see :meth:`make`)."""
        return cls.make("gradnorm", **flat)

    def replace(self, **changes) -> RunConfig:
        """A copy with fields changed, by flat name or by whole section."""
        new, sections, measure = _route(self.kind, changes, {f.name for f in fields(self)})
        for section, kw in sections.items():
            new[section] = dataclasses.replace(new.get(section, getattr(self, section)), **kw)
        if measure:
            new["measure"] = dataclasses.replace(new.get("measure", self.measure), **measure)
        return dataclasses.replace(self, **new)

    # -- derived views ------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.measure.kind

    @property
    def setting(self) -> str:
        """The corruption as a label: ``clean``, ``flip 5%``, ``OOD 1%``; a grid's names the OOD
        source too (``OOD 2% (gaussian)``)."""
        return self.corruption.label(with_source=self.kind == "grid")

    @property
    def arm(self) -> str:
        """A readable name, e.g. ``digits/lenet/bn/OOD 1%``."""
        return f"{self.data.dataset}/{self.model.arch}/{self.model.norm}/{self.setting}"

    @property
    def penalty_label(self) -> str:
        return "none" if self.penalty is None else self.penalty.label

    @property
    def train_query_batch(self) -> int:
        return int(self.measure.train_query_batch_size or self.train.batch_size)

    def as_dict(self) -> dict:
        """The whole resolved description as JSON-ready nested dicts (tuples as lists)."""
        def plain(v):
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, tuple | list):
                return [plain(x) for x in v]
            return v

        return {"kind": self.kind, **plain(asdict(self))}

    def key(self, device="cpu", root=None) -> str:
        """The cache key: a hash of :meth:`as_dict` (every default included), the kind's
        :data:`VERSIONS` entry, the source of the package code that trains it
        (:func:`bnmem_utils.core.cache.source_digest` of its :data:`JOB_MODULES` entry), the digest
        of the data it reads (:func:`bnmem_utils.data.datasets.data_digest`, OOD source included), the
        device type, the precision trained in there (:func:`~bnmem_utils.training.steps.precision`:
        bf16 autocast on CUDA changes the numbers), whether the training forward is compiled
        there (:func:`~bnmem_utils.training.steps.compile_mode`), the memory layout it trains in
        there (:func:`~bnmem_utils.models.nets.trains_channels_last`), the code of registered data
        sets (with their classes and normalization) and architectures
        (:func:`bnmem_utils.data.datasets.registered_code`) and, for a bank, which trainer
        builds it by default on that device (:func:`bank_trainer`: the vectorised trainer's
        models agree with sequential ones to rounding, then drift as any two such runs do), and
        the versions of torch and numpy that compute it (another release may round otherwise).
        ``root``: the data folder the run reads first (as the loaders take it), so that the
        digest is of the data read."""
        import numpy
        import torch

        from bnmem_utils.core.device import resolve_device
        from bnmem_utils.data.datasets import DATASETS, data_digest, registered_code

        # the data set trained on and the one OOD inserts are drawn from, if any
        ood = self.corruption.ood_source if self.corruption.ood_rate > 0 else None
        dev = resolve_device(device)
        payload = {"version": VERSIONS[self.kind], "device": dev.type,
                   "libraries": {"torch": torch.__version__, "numpy": numpy.__version__},
                   "run": self.as_dict(), "source": cache.source_digest(JOB_MODULES[self.kind]),
                   "data": {n: data_digest(n, root) for n in (self.data.dataset, ood) if n in DATASETS},
                   "precision": precision(self.train.amp, dev),
                   "compile": compile_mode(self.train.compile, dev,
                                           regularized=self.penalty is not None),
                   "channels_last": trains_channels_last(self.model.arch, dev)}
        payload.update(registered_code(self.data.dataset, self.model.arch,
                                       self.corruption.ood_source))
        if self.kind == "bank":
            payload["trainer"] = bank_trainer(self, dev)
        return cache.key(payload)


def bank_trainer(config: RunConfig, device="cpu") -> str:
    """Which trainer builds the bank of ``config`` on ``device`` by default
    (:func:`bnmem_utils.jobs.bank.default_trainer`): ``"vectorised"`` (K models at once,
    :mod:`bnmem_utils.training.vectorised`) or ``"sequential"`` (one model after another). The rule, from
    ``benchmarks/bench_roofline.py`` (``benchmarks/README.md``):

    * LeNet and MLP (:data:`SMALL_ARCHS`): vectorised everywhere (on 2 CPU cores 2.4-3.4x
      faster than one model after another on the digits, and faster at 28x28 too);
    * ResNet-20, ResNet-18, DenseNet on a GPU: the trainer :data:`GPU_TRAINER` names, the one
      measured faster there; sequential on a CPU, where one model's convolutions already fill
      the cores and the vmap path measured slower (``benchmarks/bench_cpu_archs.py`` times both
      at 28x28, blocks of 4 against one model per thread);
    * with the gamma/sigma penalty: the same for LeNet and MLP (the penalty runs on the
      vectorised trainer's grouped path), sequential for the wide networks (its vmap path has
      no penalty).
    """
    from bnmem_utils.core.device import resolve_device

    if config.model.arch in SMALL_ARCHS:
        return "vectorised"
    if config.penalty is None and resolve_device(device).type == "cuda":
        return GPU_TRAINER.get(config.model.arch, "sequential")
    return "sequential"


#: The bank trainer of each wide network on a GPU, from measured rates (``benchmarks/gpu_smoke.sh``
#: on one H200, 2026-12-04): a ResNet-20 bank trained 3.3x faster K models at once; ResNet-18
#: 565 sample-epochs/s vectorised (grouped convolutions, Python batch norms) against 8,986 one
#: model after another. DenseNet, not yet measured, goes with ResNet-18: a network that fills
#: the device on its own. A network not named here trains one model after another.
GPU_TRAINER = {"resnet20": "vectorised", "resnet18": "sequential", "densenet": "sequential"}
