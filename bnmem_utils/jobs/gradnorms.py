"""Notebook 03: train on a corrupted set, measure every sample's gradient norm at chosen epochs.

:func:`run` trains each gradient-norm :class:`~bnmem_utils.jobs.config.RunConfig`
(:meth:`RunConfig.gradnorm <bnmem_utils.jobs.config.RunConfig.gradnorm>`) on a corrupted set with a
:class:`GradNormTracker` hook that measures the chosen samples at the chosen epochs with
:func:`bnmem_utils.training.per_sample.per_sample_grad_norms` (under both definitions, see
:mod:`bnmem_utils.training.per_sample`; cached on disk); :func:`norms_frame`, :func:`median_table`,
:func:`ratio_estimates`, :func:`noisy_vs_all` and :func:`result_records` turn the runs into numbers
with 95% intervals over seeds.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bnmem_utils.core import cache, executors
from bnmem_utils.core.device import cpu_threads
from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import Estimate, mean_ci
from bnmem_utils.jobs.config import (
    VERSIONS,
    CorruptionConfig,
    DataConfig,
    GradNormMeasure,
    ModelConfig,
    RunConfig,
)
from bnmem_utils.models.nets import ordered_norms, trains_channels_last
from bnmem_utils.training.per_sample import (
    definition_label,
    naive_grad_norms,
    per_sample_grad_norms,
    which_definitions,
)
from bnmem_utils.training.steps import TrainConfig

# ================================================================================================
# Notebook 03: train on a corrupted set, measure every sample's gradient norm at chosen epochs
# ================================================================================================

@dataclass
class GradNormResult:
    """Per-sample gradient norms of one run at its measured epochs (all float64, on the CPU).

    ``norms[definition]``: (E, m) total norms of the m measured samples at the E measured epochs;
    ``layer_norms[definition]``: (E, m, L) per layer (``layer_names``); ``loss``/``correct``:
    (E, m) eval-mode loss and correctness against the training labels (memorization);
    ``index``: (m,) positions in the corrupted training set; ``kind``: (m,) CLEAN/FLIPPED/OOD.
    """

    config: RunConfig
    key: str
    epochs: list[int]
    index: Tensor
    kind: Tensor
    norms: dict[str, Tensor]
    layer_norms: dict[str, Tensor]
    layer_names: list[str]
    loss: Tensor
    correct: Tensor
    history: pd.DataFrame
    seconds: float = float("nan")  # wall time of training plus measuring, when it was computed
    device: str = "cpu"
    cached: bool = False


class GradNormTracker:
    """A :func:`bnmem_utils.training.loop.train_model` hook that measures, at the epochs of
    ``config.measure``, the gradient norms of the samples ``index`` of the corrupted training
    set ``data`` (every definition the model has among the measured ones) and their eval-mode
    loss and correctness.

    Call it once with ``epoch=0`` before training to measure at initialisation. The train
    definition cuts the whole training set into random batches of the training batch size
    (reshuffled at each epoch with a seed drawn from the run's seed and the epoch), as the
    training loop does, and computes the Jacobian rows of the measured samples only.
    """

    def __init__(self, config: RunConfig, data, index: Tensor):
        self.config, self.index = config, index                  # index: (m,)
        self.x, self.y = data.x, data.y                           # (n, C, H, W), (n,)
        self.measured: list[int] = []
        self.norms: dict[str, list[Tensor]] = {}                  # definition -> [(m,)]
        self.layer_norms: dict[str, list[Tensor]] = {}            # definition -> [(m, L)]
        self.layer_names: list[str] = []
        self.loss: list[Tensor] = []                              # [(m,)]
        self.correct: list[Tensor] = []                           # [(m,)]

    def __call__(self, epoch: int, model: nn.Module, row: dict | None = None) -> dict | None:
        config = self.config
        if epoch not in config.measure.measure_epochs:
            return None
        from bnmem_utils.training.loop import predict_logits

        sel = self.index.to(self.x.device)
        logits = predict_logits(model, self.x[sel])               # (m, K) eval mode, float32
        y = self.y[sel].to(logits.device)
        self.loss.append(F.cross_entropy(logits, y, reduction="none").double().cpu())
        self.correct.append((logits.argmax(1) == y).cpu())
        defs = [d for d in which_definitions(model) if d in config.measure.definitions] or ["eval"]
        for d in defs:  # a model without BN has "eval" only: "train" coincides with it
            res = per_sample_grad_norms(model, self.x, self.y, definition=d, index=self.index,
                                        batch_size=config.train.batch_size,
                                        shuffle_seed=_mix(config.seed, epoch) if d == "train" else None)
            self.layer_names = list(res.layers)
            self.norms.setdefault(d, []).append(res.total)
            self.layer_norms.setdefault(d, []).append(torch.stack(list(res.layers.values()), 1))
        self.measured.append(epoch)
        return {f"gradnorm_median_{d}": float(self.norms[d][-1].median()) for d in defs}


def measured_samples(kind: Tensor, *, max_clean: int | None, max_noisy: int | None,
                     seed: int) -> Tensor:
    """Sorted positions of the samples to measure: up to ``max_clean`` clean and ``max_noisy``
    noisy (flipped or OOD) samples, each a seeded uniform subset (None: all of them)."""
    kind = kind.cpu()
    g = torch.Generator().manual_seed(_mix(seed, 10**6))
    parts = []
    for mask, cap in ((kind == 0, max_clean), (kind != 0, max_noisy)):
        pos = mask.nonzero().flatten()
        if cap is not None and cap < pos.numel():
            pos = pos[torch.randperm(pos.numel(), generator=g)[:cap]]
        parts.append(pos)
    return torch.cat(parts).sort().values


def _mix(seed: int, stream: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(stream), 3]).generate_state(1)[0])


def train_and_measure(config: RunConfig, dataset, dev: torch.device) -> GradNormResult:
    """Train ``config`` on ``dataset`` (a loaded :class:`bnmem_utils.data.datasets.Dataset`) on
    ``dev`` and measure the per-sample gradient norms of the samples :func:`measured_samples`
    picks at its epochs (:class:`GradNormTracker`). No caching (see :func:`run`)."""
    import time

    from bnmem_utils.core.device import seed_everything
    from bnmem_utils.data.datasets import corrupt
    from bnmem_utils.models.nets import build_model
    from bnmem_utils.training.loop import train_model

    dataset = dataset.to(dev)
    data = corrupt(dataset, flip_rate=config.corruption.flip_rate, ood_rate=config.corruption.ood_rate,
                   ood_source=config.corruption.ood_source, seed=config.seed)
    index = measured_samples(data.kind, max_clean=config.measure.max_clean, max_noisy=config.measure.max_noisy,
                             seed=config.seed)
    start = time.perf_counter()
    seed_everything(config.seed)
    model = build_model(config.model.arch, config.model.norm, in_channels=dataset.in_channels,
                        num_classes=dataset.num_classes, image_size=dataset.image_size,
                        width=config.model.width).to(dev)
    tracker = GradNormTracker(config, data, index)
    tracker(0, model)
    history = train_model(model, data.x, data.y, config=config.train, seed=config.seed,
                          groups=data.groups(), test=(dataset.x_test, dataset.y_test),
                          hooks=[tracker], device=dev, fill=dataset.background,
                          channels_last=trains_channels_last(config.model.arch, dev))
    if history.diverged:
        warnings.warn(f"{config.model.norm} seed {config.seed}: {history.message}", RuntimeWarning, stacklevel=2)
    return GradNormResult(
        config=config, key=config.key(dev), epochs=tracker.measured, index=index,
        kind=data.kind[index.to(data.kind.device)].cpu(),
        norms={d: torch.stack(v) for d, v in tracker.norms.items()},
        layer_norms={d: torch.stack(v) for d, v in tracker.layer_norms.items()},
        layer_names=tracker.layer_names, loss=torch.stack(tracker.loss),
        correct=torch.stack(tracker.correct), history=history.as_frame(),
        seconds=time.perf_counter() - start, device=str(dev))


# --- cache --------------------------------------------------------------------------------------

def cache_path(cache_dir: str | os.PathLike, key: str) -> Path:
    """``<cache_dir>/gradnorms/<key>.pt``."""
    return Path(cache_dir) / "gradnorms" / f"{key}.pt"


def save_result(result: GradNormResult, cache_dir: str | os.PathLike) -> None:
    """Write ``result`` as a cache record (:mod:`bnmem_utils.core.cache`) at :func:`cache_path`."""
    cache.write(cache_path(cache_dir, result.key), {
        "kind": "gradnorm", "version": VERSIONS["gradnorm"], "key": result.key,
        "config": result.config.as_dict(), "layer_names": result.layer_names, "device": result.device,
        "seconds": result.seconds, "history": result.history.to_dict(orient="split")},
        {"index": result.index, "kind": result.kind, "loss": result.loss,
         "correct": result.correct, "epochs": torch.tensor(result.epochs, dtype=torch.int64),
         **{f"norms/{d}": t for d, t in result.norms.items()},
         **{f"layer_norms/{d}": t for d, t in result.layer_norms.items()}})


def load_result(cache_dir: str | os.PathLike, config: RunConfig, key: str) -> GradNormResult | None:
    """The cached result of ``config``: None when absent, :class:`CacheError` when untrustworthy."""
    record = cache.read(cache_path(cache_dir, key), kind="gradnorm", version=VERSIONS["gradnorm"],
                        key=key, config=config.as_dict())
    if record is None:
        return None
    meta, tensors = record
    h = meta["history"]
    return GradNormResult(
        config=config, key=key, epochs=tensors["epochs"].tolist(), index=tensors["index"],
        kind=tensors["kind"], loss=tensors["loss"], correct=tensors["correct"],
        norms={k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith("norms/")},
        layer_norms={k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith("layer_norms/")},
        layer_names=list(meta["layer_names"]),
        history=pd.DataFrame(h["data"], columns=h["columns"]),
        seconds=float(meta["seconds"]), device=meta["device"], cached=True)


def run(configs: Sequence[RunConfig], device: str | torch.device = "auto",
        cache_dir: str | os.PathLike | None = None, *,
        force: bool = False, progress: bool = True, download: bool = False,
        threads: int | None = None, executor=None,
        ray_address: str | None = None) -> list[GradNormResult]:
    """Results of every config, read from the cache when present and sound, else computed and cached
    at once (an interrupted list resumes where it stopped). A damaged cache file is reported with
    a warning and rebuilt. Data sets are loaded once per (name, train_size, test_size). ``threads``: torch
    CPU threads while computing (restored afterwards; None or 0 leaves torch's setting): small
    models run fastest on one, and a BN model's many tiny parallel kernels slow down badly when
    the machine's cores are shared with other jobs.

    ``executor``: ``"local"`` (None, the default: this process) or ``"ray"`` (one Ray task per
    run, one thread each, on a local Ray or the cluster at ``ray_address``), or an
    :class:`bnmem_utils.core.executors.Executor`; same results either way."""
    from tqdm.auto import tqdm

    from bnmem_utils.core.device import resolve_device
    from bnmem_utils.core.paths import cache_dir as default_cache_dir
    from bnmem_utils.data.datasets import dataset_loader, load_data

    configs = list(configs)
    dev = resolve_device(device)
    root = cache_dir if cache_dir is not None else default_cache_dir()
    out = executors.map_uncached(  # on another executor: one task per run not cached
        executor, configs, [c.key(dev) for c in configs], root, load_result, cache_path,
        functools.partial(load_data, device="cpu", download=download), measure_task, str(root),
        dev.type, force=force, save=save_result, address=ray_address, gpu=dev.type == "cuda",
        progress=progress)
    todo = [i for i, r in enumerate(out) if r is None]
    load = dataset_loader(dev, download=download)
    with cpu_threads(threads):
        bar = tqdm(todo, desc="runs", disable=not progress)
        for i in bar:
            config = configs[i]
            bar.set_postfix(norm=config.model.norm, seed=config.seed)
            out[i] = train_and_measure(config, load(config), dev)
            save_result(out[i], root)
    return out  # type: ignore[return-value]


def measure_task(item: tuple, cache_dir: str, device: str) -> GradNormResult:
    """The task of one run on an executor: train and measure it, and cache the result (reading
    the cache first, so that a retried task does not redo a run its failed attempt saved)."""
    from bnmem_utils.core.device import resolve_device

    config, handle = item
    dev = resolve_device(device)
    result = executors.read_cached(load_result, cache_dir, config, config.key(dev))
    if result is None:
        result = train_and_measure(config, executors.on_device(executors.fetch(handle), dev), dev)
        save_result(result, cache_dir)
    return result


# --- summaries ----------------------------------------------------------------------------------

NOISY = "noisy"  # flipped and OOD samples together: the ones whose label no pattern explains


def _filled(r: GradNormResult, by_definition: dict[str, Tensor]) -> dict[str, Tensor]:
    """``by_definition`` (norms or layer norms of run ``r``) with, for a model without BN, the
    eval-mode entry under ``"train"`` too: the two definitions coincide for it (which
    tests/test_grads.py checks), so every definition panel shows every norm."""
    out = dict(by_definition)
    if "train" in r.config.measure.definitions and "train" not in out and "eval" in out:
        out["train"] = out["eval"]
    return out


#: The columns that tell one setting of notebook 03 from another: its runs' data set and
#: architecture (every frame below carries them, and summarizes each setting apart).
SETTING = ("dataset", "arch")


def _setting(config: RunConfig) -> dict[str, str]:
    return {"dataset": config.data.dataset, "arch": config.model.arch}


def norms_frame(results: Sequence[GradNormResult]) -> pd.DataFrame:
    """Long frame, one row per (run, definition, epoch, sample): the run's :data:`SETTING`
    (``dataset``, ``arch``), ``norm``, ``seed``, ``definition``, ``epoch``, ``sample``, ``kind``
    (clean/flipped/ood), ``group`` (clean/noisy), ``grad_norm``, ``loss``, ``correct``; a model
    without BN appears under both definitions."""
    from bnmem_utils.data.datasets import KIND_NAMES

    parts = []
    for r in results:
        kind = np.array([KIND_NAMES[int(k)] for k in r.kind])
        e, m = r.loss.shape
        for d, t in _filled(r, r.norms).items():
            parts.append(pd.DataFrame({
                **_setting(r.config), "norm": r.config.model.norm, "seed": r.config.seed,
                "definition": d,
                "epoch": np.repeat(r.epochs, m), "sample": np.tile(r.index.numpy(), e),
                "kind": np.tile(kind, e), "group": np.tile(np.where(kind == "clean", "clean", NOISY), e),
                "grad_norm": t.numpy().ravel(), "loss": r.loss.numpy().ravel(),
                "correct": r.correct.numpy().ravel()}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def layer_ratio_frame(results: Sequence[GradNormResult], epoch: int | None = None) -> pd.DataFrame:
    """Per layer: median noisy norm over median clean norm, per run and definition, at ``epoch``
    (the last measured one when None). Columns: dataset, arch, norm, seed, definition, layer,
    depth, ratio; a model without BN appears under both definitions."""
    rows = []
    for r in results:
        ep = r.epochs[-1] if epoch is None else epoch
        if ep not in r.epochs:
            raise ValueError(f"epoch {ep} was not measured; measured epochs: {r.epochs}")
        i = r.epochs.index(ep)
        noisy = r.kind != 0
        for d, t in _filled(r, r.layer_norms).items():
            for j, name in enumerate(r.layer_names):
                col = t[i, :, j]                                            # (m,)
                rows.append({**_setting(r.config), "norm": r.config.model.norm,
                             "seed": r.config.seed, "definition": d,
                             "epoch": ep, "layer": name, "depth": j,
                             "ratio": float(col[noisy].median() / col[~noisy].median())})
    return pd.DataFrame(rows)


def median_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, norm, definition, seed, epoch): median gradient norm of clean and of noisy
    samples, their ratio ``noisy/clean``, and the memorization (accuracy on noisy samples
    against their training labels)."""
    run = [*SETTING, "norm", "definition", "seed", "epoch"]
    g = frame.groupby([*run, "group"], sort=False)["grad_norm"].median()
    t = g.unstack("group").reset_index()
    if NOISY not in t or "clean" not in t:
        raise ValueError("the frame needs both clean and noisy samples")
    t["ratio"] = t[NOISY] / t["clean"]
    mem = frame[frame["group"] == NOISY].groupby(run, sort=False)["correct"].mean()
    return t.merge(mem.rename("noisy_acc").reset_index(), on=run)


def geometric_ci(values) -> Estimate:
    """Geometric mean of positive ratios over seeds, with the Student-t 95% interval of the mean
    log, mapped back (``std`` is that of the natural log). Ratios are compared on the log scale:
    2x and 0.5x are symmetric around 1."""
    v = np.log(np.asarray(values, dtype=float))
    e = mean_ci(v)
    return Estimate(float(np.exp(e.mean)), float(np.exp(e.lo)), float(np.exp(e.hi)), e.n, e.std)


def _ratio_cols(values) -> dict:
    """``ratio``, ``lo``, ``hi``, ``n`` of :func:`geometric_ci` of ``values``."""
    est = geometric_ci(values)
    return {"ratio": est.mean, "lo": est.lo, "hi": est.hi, "n": est.n}


def ratio_estimates(table: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, norm, definition, epoch): the noisy/clean median ratio over seeds
    (geometric mean with 95% interval), and the mean noisy-sample accuracy."""
    keys = [*SETTING, "norm", "definition", "epoch"]
    return pd.DataFrame([
        {**dict(zip(keys, k, strict=True)), **_ratio_cols(grp["ratio"]),
         "noisy_acc": float(grp["noisy_acc"].mean())}
        for k, grp in table.groupby(keys, sort=False)])


def noisy_vs_all(table: pd.DataFrame, *, norm: str = "bn") -> pd.DataFrame:
    """Per (setting, reference, definition, epoch), for every other norm in ``table`` as the
    reference: median noisy norm of ``norm`` over that of the reference, paired by seed (same
    corrupted samples), geometric mean over seeds with 95% interval. A reference model has one
    definition only when it has no BN; it is then matched to both of ``norm``'s."""
    a = table[table["norm"] == norm]
    refs = [r for r in ordered_norms(table["norm"]) if r != norm]
    if a.empty or not refs:
        raise ValueError(f"need runs of {norm!r} and of another norm; have "
                         f"{sorted(table['norm'].unique())}")
    rows, keys = [], [*SETTING, "definition", "epoch"]
    for ref in refs:
        m = a.merge(table[table["norm"] == ref], on=[*SETTING, "definition", "seed", "epoch"],
                    suffixes=("", "_ref"))
        rows += [{**dict(zip(keys, k, strict=True)), "norm": norm, "reference": ref,
                  **_ratio_cols(grp[NOISY] / grp[f"{NOISY}_ref"])}
                 for k, grp in m.groupby(keys, sort=False)]
    return pd.DataFrame(rows)


def estimate_at(frame: pd.DataFrame, epoch: int | str = "final", **match) -> tuple[int, Estimate]:
    """The Estimate in a :func:`ratio_estimates`/:func:`noisy_vs_all` frame at ``epoch`` (an
    epoch, ``"final"`` for the last, ``"peak"`` for the one with the largest ratio), for the
    rows matching ``match`` (e.g. norm="bn", definition="eval")."""
    sub = where(frame, match)
    if sub.empty:
        raise ValueError(f"no rows match {match}")
    if epoch == "final":
        row = sub.loc[sub["epoch"].idxmax()]
    elif epoch == "peak":
        row = sub.loc[sub["ratio"].idxmax()]
    else:
        hit = sub[sub["epoch"] == epoch]
        if hit.empty:
            raise ValueError(f"epoch {epoch} not measured; measured: {sorted(sub['epoch'].unique())}")
        row = hit.iloc[0]
    return int(row["epoch"]), Estimate(float(row["ratio"]), float(row["lo"]), float(row["hi"]), int(row["n"]))


# --- figures and records ------------------------------------------------------------------------

def result_records(ratios: pd.DataFrame, versus: pd.DataFrame, configs: Sequence[RunConfig]
                   ) -> list[tuple[Result, object, dict]]:
    """Notebook 03's key numbers as ``(result, value, extras)`` for ``nb.record_all``, for each
    setting of the runs ``configs`` (:data:`SETTING`: data set and architecture) apart, each
    :class:`~bnmem_utils.core.results.Result` with the data set, architecture and corruption of
    that setting's runs.

    For each norm (and, for BN, each definition, the ``mode`` field): the noisy/clean median
    ratio (``gn_ratio``) at the final epoch and at its peak (and the peak's epoch), and the
    final memorization; for each other norm (``versus``) and definition: BN-noisy over that
    norm's noisy median norm (``gn_over``), final and at the BN ratio's peak epoch."""
    out = []
    for config in settings(configs).values():
        here = _setting(config)
        out += _setting_records(where(ratios, here), where(versus, here), config)
    return out


def settings(configs: Sequence[RunConfig]) -> dict[tuple[str, str], RunConfig]:
    """``{(dataset, arch): its first run}`` of ``configs``, in their order: notebook 03's
    settings."""
    out: dict[tuple[str, str], RunConfig] = {}
    for c in configs:
        out.setdefault((c.data.dataset, c.model.arch), c)
    return out


def per_setting(configs: Sequence[RunConfig]) -> list[tuple[dict[str, str], str]]:
    """For each setting of ``configs`` (:func:`settings`): its columns' values (``{"dataset":
    ..., "arch": ...}``, for :func:`where`) and the suffix of its figures' names
    (``_fashion_mnist_resnet20``; empty when the runs have one setting, so that a profile of
    one keeps the plain names)."""
    found = settings(configs)
    return [({"dataset": d, "arch": a}, "" if len(found) == 1 else f"_{d}_{a}") for d, a in found]


def where(frame: pd.DataFrame, match: Mapping[str, str]) -> pd.DataFrame:
    """The rows of ``frame`` whose columns hold ``match``'s values."""
    keep = np.ones(len(frame), dtype=bool)
    for k, v in match.items():
        keep &= (frame[k] == v).to_numpy()
    return frame[keep]


def _setting_records(ratios: pd.DataFrame, versus: pd.DataFrame, config: RunConfig
                     ) -> list[tuple[Result, object, dict]]:
    """:func:`result_records` of one setting, its runs' ``config``."""
    out = []

    def rec(metric: str, value, description: str, **fields) -> None:
        out.append((Result.of(config, metric, **fields), value, {"description": description}))

    for (norm, d), _ in ratios.groupby(["norm", "definition"], sort=False):
        if d == "train" and norm != "bn":
            continue  # no BN in the zoo's other models: the train definition equals eval
        for when in ("final", "peak"):
            ep, est = estimate_at(ratios, when, norm=norm, definition=d)
            rec("gn_ratio", est,
                f"median noisy / median clean per-sample gradient norm, {norm}, "
                f"{definition_label(d)}, {when} epoch ({ep}); geometric mean over seeds, 95% CI",
                norm=norm, mode=d, when=when)
            if when == "peak":
                rec("gn_peak_epoch", ep, f"epoch of the peak ratio ({norm}, {d})",
                    norm=norm, mode=d)
        if d == "eval":
            last = ratios[(ratios["norm"] == norm) & (ratios["definition"] == d)]
            rec("gn_noisy_acc", float(last.loc[last["epoch"].idxmax(), "noisy_acc"]),
                f"accuracy on the noisy samples against their training labels at the final "
                f"epoch ({norm}), mean over seeds", norm=norm, when="final")
    for (ref, d), _ in versus.groupby(["reference", "definition"], sort=False):
        _, fin = estimate_at(versus, "final", reference=ref, definition=d)
        over = dict(norm="bn", versus=ref, subset="noisy", mode=d)
        rec("gn_over", fin, f"median noisy gradient norm, BN ({definition_label(d)}) over "
            f"{ref}, final epoch; paired by seed, geometric mean, 95% CI", **over, when="final")
        peak_ep, _ = estimate_at(ratios, "peak", norm="bn", definition=d)
        _, at_peak = estimate_at(versus, peak_ep, reference=ref, definition=d)
        rec("gn_over", at_peak, f"the same at the epoch of BN's peak noisy/clean ratio "
            f"({peak_ep})", **over, when="at_bn_peak")
    return out


# --- notebook helpers ---------------------------------------------------------------------------

def make_configs(*, norms: Sequence[str], seeds: Sequence[int], data: DataConfig,
                 corruption: CorruptionConfig, arch: str, train: TrainConfig,
                 measure: GradNormMeasure, width: int = 1) -> list[RunConfig]:
    """One gradient-norm :class:`~bnmem_utils.jobs.config.RunConfig` per (seed, norm) of ``arch``
    at ``width``, trained by ``train`` on ``data`` corrupted by ``corruption`` and measured by
    ``measure``; norms vary fastest (an interrupted list leaves complete pairs behind)."""
    norms = list(norms)
    if "bn" not in norms or "none" not in norms:
        raise ValueError(f"norms must include 'bn' and 'none' (the paper's comparison), got {norms}")
    return [RunConfig(data=data, corruption=corruption, model=ModelConfig(arch, n, width),
                      train=train, seed=int(s), measure=measure) for s in seeds for n in norms]


def configs_from_params(params: Mapping) -> list[RunConfig]:
    """The runs of notebook 03 (``03_gradient_norms``), in the order it trains them (each data
    set's architectures in turn), from its parameters ``params`` (the names of its
    ``parameters`` cell: ``seed`` and the ``grad_*`` values). The notebook and
    :mod:`bnmem_utils.run.work` both build its runs here."""
    p = params
    return [c for dataset in p["grad_datasets"] for arch in p["grad_archs"] for c in make_configs(
        norms=p["grad_norms"], seeds=range(p["seed"], p["seed"] + p["grad_seeds"]),
        arch=arch, width=p["grad_width"],
        data=DataConfig(dataset, train_size=p["grad_train_size"], test_size=p["grad_test_size"]),
        corruption=CorruptionConfig(flip_rate=p["grad_flip_rate"]),
        train=TrainConfig(epochs=p["grad_epochs"], batch_size=p["grad_batch_size"],
                          optimizer=p["grad_optimizer"], lr=p["grad_lr"],
                          weight_decay=p["grad_weight_decay"], augment=p["grad_augment"]),
        measure=GradNormMeasure(measure_epochs=p["grad_measure_epochs"],
                                definitions=p["grad_definitions"], max_clean=p["grad_max_clean"],
                                max_noisy=p["grad_max_noisy"]))]


def check_against_naive(arch: str, dataset: str, *, n: int = 24, batch_size: int = 8,
                        device: str | torch.device = "cpu", seed: int = 0, download: bool = False,
                        threads: int | None = None) -> pd.DataFrame:
    """Both definitions against the naive loop on ``n`` training samples of ``dataset``, for
    every norm: one row per (norm, definition) with the largest relative error of the total
    norm and of any layer's norm. Notebook 03 prints it as its "match" check before measuring."""
    from bnmem_utils.core.device import resolve_device
    from bnmem_utils.data.datasets import load_dataset
    from bnmem_utils.models.nets import NORMS, build_model

    dev = resolve_device(device)
    ds = load_dataset(dataset, device=dev, train_size=n, test_size=min(n, 10), seed=seed,
                      download=download)
    x, y, k = ds.x_train, ds.y_train, ds.num_classes
    rows = []
    for norm in NORMS:
        torch.manual_seed(seed)
        model = build_model(arch, norm, in_channels=x.shape[1], num_classes=k,
                            image_size=x.shape[-1]).to(dev)
        for d in which_definitions(model):
            kw = {"batch_size": batch_size, "shuffle_seed": seed} if d == "train" else {}
            with cpu_threads(threads):
                fast = per_sample_grad_norms(model, x, y, definition=d, **kw)
                ref = naive_grad_norms(model, x, y, definition=d, **kw)
            err = float(((fast.total - ref.total).abs() / ref.total).max())
            lay = max(float(((fast.layers[name] - ref.layers[name]).abs()
                             / ref.layers[name].clamp_min(1e-12)).max()) for name in ref.layers)
            rows.append({"norm": norm, "definition": d, "samples": n, "max_rel_err_total": err,
                         "max_rel_err_layer": lay, "match (1e-5)": err < 1e-5})
    return pd.DataFrame(rows)


def timing_summary(results: Sequence[GradNormResult]) -> pd.DataFrame:
    """Seconds per run (training plus measuring, from when it was computed), per norm."""
    return executors.timing_summary(results, ["norm"])
