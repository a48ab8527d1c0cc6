"""Grids of training runs (data set x architecture x norm x corruption x seed), cached on disk.

Notebooks 02 (forced memorization) and 05 (mitigation) describe each training run as a
:class:`~bnmem_utils.jobs.config.RunConfig` with a :class:`~bnmem_utils.jobs.config.GridMeasure`
(:meth:`RunConfig.grid <bnmem_utils.jobs.config.RunConfig.grid>`). :func:`run_one` trains it (or reads it back from the
cache) and returns a :class:`RunResult`: the per-epoch history, the end-of-training gamma/sigma
statistics of every BatchNorm channel and what its trackers recorded. :func:`run_grid` runs a
list of configs with a progress bar, loading each data set once, and resumes: runs that finished
before an interruption are read back, not retrained.

Cache: the record ``<cache_dir>/experiments/<key>.pt``, where ``key`` is
:meth:`RunConfig.key <bnmem_utils.jobs.config.RunConfig.key>`, written and checked by
:mod:`bnmem_utils.core.cache`; a file that does not read back, fails its digest or describes
another run is reported and rebuilt, never silently read. The gamma/sigma penalty of notebook
05 is the run's ``penalty`` field.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from bnmem_utils.core import cache, executors
from bnmem_utils.core.cache import CacheError
from bnmem_utils.core.device import cpu_threads, resolve_device, seed_everything
from bnmem_utils.core.paths import cache_dir as default_cache_dir
from bnmem_utils.data.datasets import CLEAN, DataLoader, corrupt, dataset_loader, load_data
from bnmem_utils.jobs.config import (
    VERSIONS,
    CorruptionConfig,
    DataConfig,
    GridMeasure,
    ModelConfig,
    RunConfig,
)
from bnmem_utils.models.gamma_sigma import gamma_sigma_stats
from bnmem_utils.models.nets import build_model, trains_channels_last
from bnmem_utils.training import penalty
from bnmem_utils.training.loop import train_model
from bnmem_utils.training.steps import TrainConfig


# --------------------------------------------------------------------------------------------
# Registries: the names a GridMeasure lists (bnmem_utils.jobs.config) -> behaviour
# --------------------------------------------------------------------------------------------
def _track_gamma_sigma(epoch: int, model: torch.nn.Module, row: dict) -> dict | None:
    """Per-epoch summary of gamma/sigma (running sigma) over all BN channels (claim T2)."""
    gs = gamma_sigma_stats(model)
    if gs.empty:
        return None
    ratio = gs["ratio"].to_numpy(dtype=float)
    return {"gs_median": float(pd.Series(ratio).median()), "gs_mean": float(ratio.mean()),
            "gs_frac_above_1": float((ratio > 1).mean()),
            "gamma_abs_mean": float(gs["gamma"].abs().mean())}


#: Per-epoch trackers (:data:`bnmem_utils.jobs.config.TRACKERS`): name ->
#: ``hook(epoch, model, row) -> dict | None`` (train_model hooks).
TRACKERS: dict[str, Callable] = {"gamma_sigma": _track_gamma_sigma}


def corruption_settings(flip_rates: Sequence[float] = (), ood_rates: Sequence[float] = (),
                        ood_source: str = "gaussian") -> list[CorruptionConfig]:
    """One corruption setting per flip rate and per OOD rate, each applied on its own."""
    return ([CorruptionConfig(flip_rate=float(r)) for r in flip_rates]
            + [CorruptionConfig(ood_rate=float(r), ood_source=ood_source) for r in ood_rates])


def make_grid(*, datasets: Sequence[str], archs: Sequence[str], norms: Sequence[str],
              corruptions: Sequence[CorruptionConfig], seeds: Sequence[int], train: TrainConfig,
              width: int = 1, train_size: int | None = None, test_size: int | None = None,
              track: Sequence[str] = ()) -> list[RunConfig]:
    """The full product of data sets, architectures, corruption settings (none: clean data),
    seeds and norms, each run trained by ``train`` on ``train_size`` / ``test_size`` samples of
    its data set, at ``width``, with the per-epoch trackers ``track``. Norms vary fastest, so an
    interrupted grid leaves complete BN/no-norm pairs behind."""
    return [RunConfig(data=DataConfig(d, train_size, test_size), corruption=c,
                      model=ModelConfig(a, n, width), train=train, seed=int(s),
                      measure=GridMeasure(tuple(track)))
            for d in datasets for a in archs for c in (corruptions or [CorruptionConfig()])
            for s in seeds for n in norms]


def configs_from_params(params: Mapping) -> list[RunConfig]:
    """The runs of notebook 02 (``02_forced_memorization``), in the order it trains them, from
    its parameters ``params`` (the names of its ``parameters`` cell: ``seed`` and the ``mem_*``
    values). The notebook and :mod:`bnmem_utils.run.work` both build its runs here."""
    p = params
    train = TrainConfig(epochs=p["mem_epochs"], batch_size=p["mem_batch_size"],
                        optimizer=p["mem_optimizer"], lr=p["mem_lr"], momentum=p["mem_momentum"],
                        weight_decay=p["mem_weight_decay"], schedule=p["mem_schedule"],
                        augment=p["mem_augment"])
    corruptions = corruption_settings(flip_rates=p["mem_flip_rates"], ood_rates=p["mem_ood_rates"],
                                      ood_source=p["mem_ood_source"])
    return make_grid(
        datasets=p["mem_datasets"], archs=p["mem_archs"], norms=p["mem_norms"],
        corruptions=corruptions, seeds=range(p["seed"], p["seed"] + p["mem_seeds"]), train=train,
        width=p["mem_width"], train_size=p["mem_train_size"], test_size=p["mem_test_size"],
        track=("gamma_sigma",) if p["mem_track_gamma_sigma"] else ())


# --------------------------------------------------------------------------------------------
# The result of one run, and its cache file
# --------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    """One finished run: its config, per-epoch history and end-of-training measurements."""

    config: RunConfig
    key: str
    history: pd.DataFrame               # one row per epoch (bnmem_utils.training.steps.History.as_frame)
    gamma_sigma: pd.DataFrame           # one row per BN channel (empty without BN)
    diverged: bool = False
    message: str = ""
    seconds: float = float("nan")       # training wall time when it was trained
    device: str = "cpu"
    cached: bool = False                # True when read back from the cache in this call


def _frame_to_json(df: pd.DataFrame) -> dict:
    return {"columns": [str(c) for c in df.columns],
            "data": df.astype(object).where(df.notna(), None).values.tolist()}


def _frame_from_json(d: Mapping) -> pd.DataFrame:
    return pd.DataFrame(d["data"], columns=d["columns"]).infer_objects()


def cache_path(cache_dir: str | os.PathLike, key: str) -> Path:
    """``<cache_dir>/experiments/<key>.pt``: the run's record."""
    return Path(cache_dir) / "experiments" / f"{key}.pt"


def save_result(result: RunResult, cache_dir: str | os.PathLike) -> Path:
    """Write a result as a cache record; return its path."""
    path = cache_path(cache_dir, result.key)
    cache.write(path, {
        "kind": "grid", "version": VERSIONS["grid"], "key": result.key,
        "config": result.config.as_dict(), "device": result.device,
        "diverged": bool(result.diverged), "message": result.message, "seconds": result.seconds,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "history": _frame_to_json(result.history), "gamma_sigma": _frame_to_json(result.gamma_sigma)})
    return path


def load_result(cache_dir: str | os.PathLike, config: RunConfig, key: str) -> RunResult | None:
    """The cached result of ``config`` under ``key``; None when absent;
    :class:`~bnmem_utils.core.cache.CacheError` when the file exists but cannot be trusted."""
    path = cache_path(cache_dir, key)
    record = cache.read(path, kind="grid", version=VERSIONS["grid"], key=key, config=config.as_dict())
    if record is None:
        return None
    meta = record[0]
    try:
        return RunResult(
            config=config, key=key, history=_frame_from_json(meta["history"]),
            gamma_sigma=_frame_from_json(meta["gamma_sigma"]),
            diverged=bool(meta["diverged"]), message=meta["message"],
            seconds=float(meta["seconds"]), device=meta["device"], cached=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheError(f"{path}: malformed ({exc})") from exc


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------
def train_run(config: RunConfig, dataset, device: torch.device, *, progress: bool = False
              ) -> RunResult:
    """Train one run on an already loaded data set; return its result."""
    data = corrupt(dataset, flip_rate=config.corruption.flip_rate, ood_rate=config.corruption.ood_rate,
                   ood_source=config.corruption.ood_source, seed=config.seed)
    groups = data.groups()                                        # name -> (n,) bool mask
    corrupted = data.kind != CLEAN                                # (n,) bool
    if bool(corrupted.any()):
        groups["corrupted"] = corrupted
    seed_everything(config.seed)
    model = build_model(config.model.arch, config.model.norm, in_channels=dataset.in_channels,
                        num_classes=dataset.num_classes, image_size=dataset.image_size,
                        width=config.model.width).to(device)
    regularizer = penalty.from_config(config.penalty)
    hooks = [TRACKERS[name] for name in config.measure.track]
    start = time.perf_counter()
    history = train_model(model, data.x, data.y, config=config.train, seed=config.seed,
                          groups=groups, test=(dataset.x_test, dataset.y_test), hooks=hooks,
                          regularizer=regularizer, device=device, progress=progress,
                          fill=dataset.background,
                          channels_last=trains_channels_last(config.model.arch, device))
    if regularizer is not None:
        regularizer.detach()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    # gamma/sigma at the end: running sigma, plus the sigma of one training batch (the theory's).
    g = torch.Generator().manual_seed(config.seed)
    batch = torch.randperm(len(data.x), generator=g)[: config.train.batch_size].to(data.x.device)
    model.eval()
    gs = gamma_sigma_stats(model, data.x[batch])
    return RunResult(config=config, key=config.key(device), history=history.as_frame(),
                     gamma_sigma=gs, diverged=bool(history.diverged),
                     message=history.message, seconds=seconds, device=str(device))


def run_one(config: RunConfig, device: str | torch.device = "auto",
            cache_dir: str | os.PathLike | None = None, *, force: bool = False,
            data=None, loader: DataLoader | None = None, progress: bool = False) -> RunResult:
    """The result of ``config``: read from the cache when present and sound, else trained and cached.

    ``force`` retrains even when cached. ``data`` is the loaded data set (or ``loader(config)``
    returns it), so a grid loads each data set once; by default it is loaded here. A damaged
    cache file is reported with a warning and rebuilt.
    """
    dev = resolve_device(device)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cached = None if force else executors.read_cached(load_result, root, config, config.key(dev))
    if cached is not None:
        return cached
    if data is None:
        data = (loader or dataset_loader(dev))(config)
    result = train_run(config, data, dev, progress=progress)
    save_result(result, root)
    return result


# --------------------------------------------------------------------------------------------
# Grids of runs (notebooks 02 and 05): one task per run
# --------------------------------------------------------------------------------------------
def run_task(item: tuple, cache_dir: str, device: str):
    """The task of one grid run: :func:`bnmem_utils.jobs.grid.run_one` (which reads the cache
    first, so a retried task does not retrain a run its failed attempt saved)."""
    config, handle = item
    dev = resolve_device(device)
    dataset = executors.on_device(executors.fetch(handle), dev)
    result = run_one(config, dev, cache_dir, data=dataset)
    return dataclasses.replace(result, cached=False)      # trained in this call


def run_grid(configs: Sequence[RunConfig], device: str | torch.device = "auto",
             cache_dir: str | os.PathLike | None = None, *, force: bool = False,
             progress: bool = True, download: bool = False, executor=None,
             ray_address: str | None = None, threads: int | None = None) -> list[RunResult]:
    """Run every config (cached ones are read back), in data-set order, one load per data set.

    Returns the results in the order of ``configs``. Each finished run is cached at once, so an
    interrupted grid resumes where it stopped. ``force`` retrains everything. ``threads`` sets
    torch's CPU thread count while this process trains (restored afterwards; None or 0 keeps
    it): the models here are small, and on a shared 2-core machine one thread beats two fighting.

    ``executor``: ``"local"`` (None, the default: this process) or ``"ray"`` (one Ray task per
    run, on a local Ray or the cluster at ``ray_address``), or an
    :class:`bnmem_utils.core.executors.Executor`; same results either way.
    """
    from tqdm.auto import tqdm

    configs = list(configs)
    dev = resolve_device(device)
    keys = [s.key(dev) for s in configs]
    if len(set(keys)) != len(keys):
        raise ValueError("the grid holds duplicate run configs; each run must be distinct")
    if not executors.is_local(executor):  # one task per run on another executor
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        return executors.map_uncached(
            executor, configs, keys, root, load_result, cache_path,
            lambda s: load_data(s, "cpu", download=download), run_task, str(root), dev.type,
            force=force, address=ray_address, gpu=dev.type == "cuda", progress=progress)
    loader = dataset_loader(dev, download=download)
    order = sorted(range(len(configs)), key=lambda i: repr(configs[i].data))
    results: list[RunResult | None] = [None] * len(configs)
    bar = tqdm(order, desc="runs", disable=not progress, smoothing=0.0)
    trained = 0
    with cpu_threads(threads):
        for i in bar:
            res = run_one(configs[i], dev, cache_dir, force=force, loader=loader)
            trained += not res.cached
            results[i] = res
            bar.set_postfix(trained=trained, cached=sum(r is not None for r in results) - trained)
    return results  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Long frames for the summaries (bnmem_utils.analyses.memorization)
# --------------------------------------------------------------------------------------------
def _config_columns(config: RunConfig) -> dict:
    return {"dataset": config.data.dataset, "arch": config.model.arch, "norm": config.model.norm, "setting": config.setting,
            "seed": config.seed, "flip_rate": config.corruption.flip_rate, "ood_rate": config.corruption.ood_rate,
            "regularizer": config.penalty_label}


def _with_config(frame: pd.DataFrame, result: RunResult, **more) -> pd.DataFrame:
    cols = {**_config_columns(result.config), **more, "run": result.key}
    front = pd.DataFrame({k: [v] * len(frame) for k, v in cols.items()}, index=frame.index)
    return pd.concat([front, frame], axis=1)


def history_frame(results: Iterable[RunResult]) -> pd.DataFrame:
    """All runs' per-epoch rows, each with its run's identity columns and ``diverged`` flag."""
    parts = [_with_config(r.history, r, diverged=r.diverged) for r in results]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def gamma_sigma_frame(results: Iterable[RunResult]) -> pd.DataFrame:
    """All BN runs' end-of-training gamma/sigma rows (one per channel) with identity columns."""
    parts = [_with_config(r.gamma_sigma, r) for r in results if len(r.gamma_sigma)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def timing_summary(results: Sequence[RunResult]) -> pd.DataFrame:
    """Training seconds per (data set, arch, norm): mean and count, from when each was trained."""
    return executors.timing_summary(results, ["dataset", "arch", "norm"])
