"""The confound study (notebook ``04b_confound``): does a normalizer leak more than its
generalization gap explains? Its ladders of banks, their frames, the comparisons and the
power table; the estimators themselves are :mod:`bnmem_utils.analyses.matched_gap`'s.

LiRA's AUC rises with any train-test gap. Each norm here traces a curve of AUC against the gap,
moved by a *knob* that leaves the normalizer, the pool and the keep matrix alone
(:func:`study_arms`):

- ``epochs``: a ladder of training lengths, from underfit to fully fit, one complete LiRA bank
  per rung. Each rung is its own run, its cosine schedule compressed to its length, so a rung
  *is* the model a run of that length deploys. Snapshots of one long run would be cheaper, but
  with a cosine schedule a snapshot at epoch e has not decayed its learning rate and is not an
  e-epoch model (only a constant learning rate makes it one, and that changes the recipe of
  notebook 04 and of the paper); so no snapshots, and the cost is the sum of the rungs'
  epochs, not the top rung's.
- ``weight_decay``: the top rung retrained with L2 weight decay (for the norms of
  ``knob_norms``): a second way to move the gap, to show the answer does not hinge on the first.
  It is a weak knob for BN, whose scale invariance lets L2 shrink the weights without changing
  the function;
- ``train_size``: the top rung retrained on smaller pools (for the norms of ``knob_norms``):
  fewer training samples per model, a larger gap, for every norm alike.

Each curve is drawn against one of three *rulers* (:data:`RULERS`), per model: the accuracy
gap (train minus test accuracy), the loss gap (mean cross-entropy on the model's non-members
minus on its members, on the bank's own pool, eval mode:
:func:`bnmem_utils.privacy.attacks.loss_gap`) and a global attack's AUC (the loss-threshold
attack of Yeom et al., no shadow models, on the same target). The accuracy gap stops moving once
the members are fitted while the attack's AUC does not; the loss gap is what a loss-threshold
attack reads, so it is the primary ruler (declared before the runs); at an equal global-attack
AUC, a higher LiRA AUC is leakage that only LiRA's per-example calibration finds.

Two curves (:func:`~bnmem_utils.analyses.matched_gap.curve` of the per-target frame of
:func:`target_frame`, on one ruler) are compared at
three matched gaps, the points a sixth, a half and five sixths of the way up the overlap of
their gap ranges (:data:`POSITIONS`), by both estimators (:func:`compare`): the interpolation
rule of :func:`bnmem_utils.analyses.matched_gap.matched_gap_difference` (bank means, linear
between rungs, a bootstrap over each bank's targets that re-applies the whole rule) and the
per-model regression of :func:`bnmem_utils.analyses.matched_gap.regression_difference` (the
norm a factor, interacting with the shape), read at the interpolation rule's matched gaps.

:func:`power_table` scales the measured intervals to other bank sizes (a half-width shrinks as
one over the square root of the number of models per bank) or, with replicate ladders, to other
numbers of ladders (as ``t(R - 1) / sqrt(R)``: their intervals are Student t over the ladders).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats as _st

from bnmem_utils.analyses.matched_gap import (
    POSITIONS,
    RULERS,
    MatchedGap,
    curve,
    replicated_matched_gap,
    replicated_regression_difference,
)
from bnmem_utils.core.checks import check_choice
from bnmem_utils.core.results import Result
from bnmem_utils.core.stats import BOOTSTRAP, REPLICATE_T, Estimate, mean_ci, replicated
from bnmem_utils.models.nets import NORM_LABELS
from bnmem_utils.privacy.attacks import ci_columns, loss_gap, resolve_attack

if TYPE_CHECKING:
    from bnmem_utils.jobs.config import RunConfig
    from bnmem_utils.training.steps import TrainConfig

KNOBS = ("epochs", "weight_decay", "train_size")


@dataclass(frozen=True)
class Arm:
    """One bank of the study: its config and where it sits on its knob."""

    knob: str             # one of KNOBS
    level: float          # the knob's value: epochs, or the top rung's weight decay or pool size
    config: RunConfig
    replicate: int = 0    # which replicate ladder (seed ``seed + replicate``); knobs: 0 only


def study_arms(*, norms: Sequence[str], epochs: Sequence[int], knob_norms: Sequence[str] = (),
               weight_decays: Sequence[float] = (), train_sizes: Sequence[int] = (),
               dataset: str = "digits", arch: str = "lenet", outlier_rate: float = 0.0,
               outlier: str = "ood", weight_decay: float = 0.0, train_size: int | None = None,
               train: TrainConfig | None = None, ood_source: str = "gaussian",
               test_size: int | None = None, width: int = 1, n_models: int = 16,
               population_size: int | None = None, seed: int = 0, replicates: int = 1,
               replicated_norms: Sequence[str] = ("bn", "none")) -> list[Arm]:
    """The study's banks: every norm along the ``epochs`` ladder (at ``weight_decay``, on a
    pool of ``train_size``), and the norms of ``knob_norms`` at the top rung with each of
    ``weight_decays`` and on each pool size of ``train_sizes`` too (the ladder's own weight
    decay and pool size included, so that a norm's curves share its top bank). ``train``: the
    models' recipe (None: the default one), its epochs and weight decay set by the ladder and
    the knob; the rest as :func:`bnmem_utils.jobs.bank.make_arms`.

    ``replicates``: how many independent ladders the norms of ``replicated_norms`` train, ladder
    r from seed ``seed + r`` (its own outliers, keep matrix and initialisations, shared by the
    norms' replicate r); the other norms and the other knobs train the ladder of ``seed`` only."""
    from bnmem_utils.jobs.bank import make_arms
    from bnmem_utils.training.steps import TrainConfig

    train = train or TrainConfig()

    norms, rungs = list(norms), sorted({int(e) for e in epochs})
    _check_study(norms, rungs, knob_norms, weight_decays, train_sizes, train_size, replicates,
                 replicated_norms)

    def arms(norm: str, e: int, wd: float, size: int | None = train_size, r: int = 0):
        recipe = dataclasses.replace(train, epochs=e, weight_decay=float(wd))
        return make_arms(norms=[norm], outlier_rates=[outlier_rate], dataset=dataset,
                         archs=[arch], outlier=outlier, ood_source=ood_source, train=recipe,
                         train_size=size, test_size=test_size, width=width, n_models=n_models,
                         population_size=population_size, seed=seed + r)[0]

    top = rungs[-1]
    out = [Arm("epochs", float(e), arms(n, e, weight_decay, r=r), r) for n in norms
           for r in range(int(replicates) if n in replicated_norms else 1) for e in rungs]
    decays = sorted({float(weight_decay), *map(float, weight_decays)}) if weight_decays else []
    out += [Arm("weight_decay", w, arms(n, top, w)) for n in knob_norms for w in decays]
    sizes = sorted({int(train_size), *map(int, train_sizes)}) if train_sizes else []
    out += [Arm("train_size", float(s), arms(n, top, weight_decay, s))
            for n in knob_norms for s in sizes]
    return out


def _check_study(norms: list[str], rungs: list[int], knob_norms, weight_decays, train_sizes,
                 train_size, replicates, replicated_norms) -> None:
    """:func:`study_arms`' arguments, each bad one named with the valid choices."""
    if not rungs or rungs[0] < 1:
        raise ValueError(f"epochs must be a non-empty list of positive integers; got {rungs!r}")
    missing = [n for n in ("bn", "none") if n not in norms]
    if missing:
        raise ValueError(f"norms must include bn and none (the comparison C3e); got {norms!r}")
    stray = [n for n in knob_norms if n not in norms]
    if stray:
        raise ValueError(f"knob_norms {stray!r} are not among the norms; valid choices: "
                         f"{', '.join(norms)}")
    if any(float(w) < 0 for w in weight_decays):
        raise ValueError(f"weight_decays must be >= 0; got {list(weight_decays)!r}")
    if train_sizes and train_size is None:
        raise ValueError("train_sizes needs the ladder's own pool size, train_size (None: the "
                         "whole split, whose size the knob's levels cannot be compared with)")
    if any(int(s) < 2 for s in train_sizes):
        raise ValueError(f"train_sizes must be >= 2; got {list(train_sizes)!r}")
    stray = [n for n in replicated_norms if n not in norms]
    if int(replicates) < 1 or stray:
        raise ValueError(f"replicates must be >= 1 ({replicates!r}) and replicated_norms among "
                         f"the norms ({stray!r} are not); valid choices: {', '.join(norms)}")


def unique_configs(arms: Sequence[Arm]) -> list[RunConfig]:
    """The distinct bank configs of ``arms``, in order (a bank on both knobs trains once)."""
    return list(dict.fromkeys(a.config for a in arms))


def arms_from_params(params: Mapping) -> list[Arm]:
    """The study of notebook 04b (``04b_confound``) from its parameters ``params`` (the names of
    its ``parameters`` cell: ``seed`` and the ``cf_*`` values): :func:`study_arms`' arms, whose
    :func:`unique_configs` are the banks it trains, in that order. The notebook and
    :mod:`bnmem_utils.run.work` both build its banks here."""
    from bnmem_utils.training.steps import TrainConfig

    p = params
    # the models' recipe: the ladder sets its epochs, the knob its weight decay
    recipe = TrainConfig(batch_size=p["cf_batch_size"], optimizer=p["cf_optimizer"],
                         lr=p["cf_lr"], augment=p["cf_augment"])
    return study_arms(
        norms=p["cf_norms"], epochs=p["cf_epochs"], knob_norms=p["cf_knob_norms"],
        weight_decays=p["cf_weight_decays"], train_sizes=p["cf_train_sizes"],
        dataset=p["cf_dataset"], arch=p["cf_arch"], outlier_rate=p["cf_outlier_rate"],
        weight_decay=p["cf_weight_decay"], train=recipe, ood_source=p["cf_ood_source"],
        n_models=p["cf_n_models"], seed=p["seed"], train_size=p["cf_train_size"],
        test_size=p["cf_test_size"], population_size=p["cf_population_size"],
        width=p["cf_width"], replicates=p["cf_replicates"],
        replicated_norms=p["cf_replicated_norms"])


def target_frame(arms: Sequence[Arm], banks: Sequence, attack: str = "auto") -> pd.DataFrame:
    """One row per target of every arm: norm, knob, level, replicate, epochs, weight decay,
    model, its accuracy gap, loss gap and global attack's AUC (the :data:`RULERS`), train and test
    accuracy, and the attack's AUC on all samples (``"auto"``: the banks' headline attack, one
    for all, :func:`~bnmem_utils.privacy.attacks.resolve_attack`). ``banks``: the built banks of
    :func:`unique_configs` (matched to the arms by config)."""
    attack, by_config = resolve_attack(attack, *banks), {b.config: b for b in banks}
    rows = []
    for i, a in enumerate(arms):
        b = by_config.get(a.config)
        if b is None:
            raise ValueError(f"no bank was built for {a.config.arm} ({a.knob} {a.level:g})")
        # LiRA's AUC and the global attack's, each evaluated (and memoised) on its own: the
        # frame of another LiRA reads the global one back
        auc, global_auc = (m[m.subset == "all"].set_index("target").auc.sort_index()
                           for m in (b.evaluate((a_,)).metrics for a_ in (attack, "loss_threshold")))
        acc = b.models.set_index("model").loc[auc.index]
        gaps = dict(enumerate(loss_gap(b.keep, b.scores)))   # each model's, eval mode
        for model, v in auc.items():
            rows.append({"dataset": a.config.data.dataset, "arch": a.config.model.arch,
                         "norm": a.config.model.norm, "knob": a.knob, "level": a.level, "arm": i,
                         "replicate": a.replicate, "seed": a.config.seed,
                         "epochs": a.config.train.epochs, "weight_decay": a.config.train.weight_decay,
                         "train_size": a.config.data.train_size or 0,
                         "model": int(model), "gap": float(acc.gap[model]), "auc": float(v),
                         "loss_gap": float(gaps[int(model)]),
                         "global_auc": float(global_auc[model]),
                         "train_acc": float(acc.train_acc[model]),
                         "test_acc": float(acc.test_acc[model])})
    return pd.DataFrame(rows)


def point_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per bank on its knob (the curves' points; one per replicate): the mean of each
    ruler and of the AUC with 95% t-intervals over its models and targets, mean and lowest
    train accuracy of its models."""
    rows = []
    keys = ["dataset", "arch", "norm", "knob", "level", "replicate", "epochs", "weight_decay",
            "train_size"]
    for key, g in frame.groupby(keys, sort=False):
        rows.append({**dict(zip(keys, key, strict=True)), "n": len(g),
                     **{k: v for col in ("gap", "loss_gap", "global_auc", "auc")
                        for k, v in ci_columns(col, mean_ci(g[col].to_numpy())).items()},
                     "train_acc": g.train_acc.mean(), "train_acc_min": g.train_acc.min(),
                     "test_acc": g.test_acc.mean()})
    return pd.DataFrame(rows)


def fit_progress(points: pd.DataFrame, target: float = 0.99) -> pd.DataFrame:
    """How far each norm's ladder is from fitting its members: per norm, the mean training
    accuracy at the top two rungs of the epochs knob (over every model of every replicate) and,
    from them, the training length at which it would reach ``target``, extrapolating the
    training error as a power of the epochs between those rungs (``error ~ epochs**-alpha``;
    ``alpha`` is the rate of the last doubling or so). ``epochs_to_target`` is the top rung when
    it is already there, NaN when the error did not fall or the ladder has one rung. A norm below
    ``target`` at the top shows by how much the ladder would have to grow for it. Also the top
    rung's lowest model training accuracy (``train_acc_min``) and mean accuracy gap (``gap``)."""
    rows = []
    for norm, g in points[points.knob == "epochs"].groupby("norm", sort=False):
        rungs = g.groupby("level").agg(train_acc=("train_acc", "mean"),
                                       train_acc_min=("train_acc_min", "min"), gap=("gap", "mean"))
        ladder = rungs.reset_index()[["level", "train_acc"]].to_numpy(dtype=float)
        (t1, a1), (t2, a2) = ladder[-2:] if len(ladder) > 1 else ([np.nan, np.nan], ladder[-1])
        e1, e2, goal = 1.0 - a1, 1.0 - a2, 1.0 - target
        alpha = np.log(e1 / e2) / np.log(t2 / t1) if e1 > 0 and e2 > 0 else np.nan
        at = t2 if a2 >= target else t2 * (e2 / goal) ** (1.0 / alpha) if alpha > 0 else np.nan
        rows.append({"norm": norm, "epochs": int(t2), "train_acc": a2, "prev_epochs": t1,
                     "prev_train_acc": a1, "alpha": alpha, "epochs_to_target": at,
                     "fitted": bool(a2 >= target), "reaches": _reach_words(at, int(t2)),
                     "train_acc_min": rungs.train_acc_min.iloc[-1], "gap": rungs.gap.iloc[-1],
                     "replicates": int(g.replicate.nunique())})
    return pd.DataFrame(rows)


#: The range of a change of each bounded column of :func:`past_the_fit` (a difference of two
#: accuracy gaps, of two AUCs); the loss gap's is unbounded.
_CHANGE_RANGES = {"gap": (-2.0, 2.0), "global_auc": (-1.0, 1.0), "auc": (-1.0, 1.0)}


def past_the_fit(frame: pd.DataFrame, points: pd.DataFrame, target: float = 0.99
                 ) -> pd.DataFrame:
    """What still moves once the members are fitted: per norm whose epochs ladder reaches
    ``target`` training accuracy (mean over its models and replicates) below its top rung, the
    change of each ruler and of the LiRA AUC from the first fitted rung (``fitted_at``) to the
    top rung (``top``), top minus fitted: a Welch 95% interval over the two banks' targets with
    one ladder, a Student t over the R replicate ladders' changes
    (:func:`~bnmem_utils.core.stats.replicated`), each cut to its column's range. The accuracy
    gap has little room left there (its training half is pinned near 100%); the losses, and an
    attack that reads them, do not."""
    rows = []
    ladder = frame[frame.knob == "epochs"]
    for norm, g in points[points.knob == "epochs"].groupby("norm", sort=False):
        acc = g.groupby("level").train_acc.mean()
        fitted = acc[acc >= target].index.min()
        if not np.isfinite(fitted) or fitted == acc.index.max():
            continue
        mine = ladder[ladder.norm == norm]
        reps = [r for _, r in mine.groupby("replicate", sort=True)]
        row = {"norm": norm, "fitted_at": int(fitted), "top": int(acc.index.max()),
               "replicates": len(reps)}
        for col in [r.column for r in RULERS.values()] + ["auc"]:
            est = replicated([r[r.level == row["top"]][col].to_numpy() for r in reps],
                             [r[r.level == fitted][col].to_numpy() for r in reps])["estimate"]
            row.update(ci_columns(col, est.within(*_CHANGE_RANGES.get(col, (-np.inf, np.inf)))))
            row["method"] = est.method
        rows.append(row)
    return pd.DataFrame(rows)


def _reach_words(at: float, top: int) -> str:
    """When a ladder's extrapolated training length is reached, in words: "at about N
    epochs" up to ten times the top rung, "beyond N epochs" past it (the power law says little
    that far out), "not at that rate" when the error did not fall."""
    if not np.isfinite(at):
        return "not at that rate"
    return f"at about {at:.0f} epochs" if at <= 10 * top else f"beyond {10 * top} epochs"


# --------------------------------------------------------------------------------------------
# The comparisons
# --------------------------------------------------------------------------------------------
def _replicate_curves(frame: pd.DataFrame, pairs: Sequence[tuple[str, str]], column: str
                      ) -> list[list[list[tuple]]]:
    """Per (norm, knob) of ``pairs``, its :func:`~bnmem_utils.analyses.matched_gap.curve` on
    ``column`` in every replicate that all of them have, in replicate order."""
    have = [set(frame[(frame.norm == n) & (frame.knob == k)].replicate) for n, k in pairs]
    common = sorted(set.intersection(*have)) or [0]
    return [[curve(frame[frame.replicate == r], n, k, column) for r in common] for n, k in pairs]


def compare(frame: pd.DataFrame, a: str, b: str, *, knob_a: str = "epochs",
            knob_b: str | None = None, positions: dict[str, float] | None = None,
            n_knots: int = 3, n_boot: int = 2000, seed: int = 0,
            ruler: str = "accgap") -> pd.DataFrame:
    """Curve ``a`` (norm ``a`` on ``knob_a``) minus curve ``b`` at the matched values of the
    ``ruler`` (a key of :data:`RULERS`) at ``positions`` (default :data:`POSITIONS`), by both
    estimators: one row per position with the ruler, the matched value (``gap``), the
    interpolation rule's ``interp`` (``_lo``, ``_hi``), the regression's ``reg`` (``_lo``,
    ``_hi``), ``agree`` (the two intervals overlap), ``description``, ``n`` (models per bank),
    ``replicates``, the interpolation interval's ``method`` and ``calibration``. No overlap of
    the ranges: one row per position without numbers.

    With R >= 2 replicate ladders of both curves (``frame``'s ``replicate`` column; the
    replicates both have), both estimators are replicate-aware
    (:func:`~bnmem_utils.analyses.matched_gap.replicated_matched_gap`,
    :func:`~bnmem_utils.analyses.matched_gap.replicated_regression_difference`): the value is
    the mean over replicates, the matched gap the mean of theirs, and the intervals Student t
    over the replicates' numbers (each estimator applied whole in each replicate; the results
    file cuts them to an AUC difference's [-1, 1] and says so)."""
    check_choice("ruler", ruler, RULERS)
    spec = RULERS[ruler]
    knob_b = knob_b or knob_a
    positions = POSITIONS if positions is None else positions
    ca, cb = _replicate_curves(frame, [(a, knob_a), (b, knob_b)], spec.column)
    names = tuple(("BN" if n == "bn" else NORM_LABELS.get(n, n)) + ("" if k == "epochs" else
                  f" ({k.replace('_', ' ')})") for n, k in ((a, knob_a), (b, knob_b)))
    rows = []
    for where, frac in positions.items():
        row = {"ruler": ruler, "a": a, "b": b, "knob_a": knob_a, "knob_b": knob_b,
               "position": where, "fraction": frac, "reg": np.nan, "reg_lo": np.nan,
               "reg_hi": np.nan, "agree": None, "n": len(ca[0][0][0]), "replicates": len(ca),
               **_interpolated(ca, cb, frac, where, names, spec, n_boot=n_boot, seed=seed)}
        if row["gap"] is not None:
            r = replicated_regression_difference(ca, cb, [row["gap"]], n_knots=n_knots,
                                                 n_boot=n_boot, seed=seed).iloc[0]
            row.update(reg=r["diff"], reg_lo=r.lo, reg_hi=r.hi,
                       agree=bool(max(row["interp_lo"], r.lo) <= min(row["interp_hi"], r.hi)))
        rows.append(row)
    return pd.DataFrame(rows)


def _interpolated(ca, cb, frac: float, where: str, names: tuple[str, str], spec, *,
                  n_boot: int, seed: int) -> dict:
    """:func:`compare`'s interpolation-rule columns at one position: ``gap`` (the mean of the
    replicates' matched gaps; None unless every replicate has one), ``interp`` (``_lo``,
    ``_hi``), ``method``, ``calibration`` and ``description``."""
    numbers = replicated_matched_gap(ca, cb, n_boot=n_boot, seed=seed, at=frac, names=names,
                                     what="LiRA AUC", axis=spec.words, scale=spec.scale,
                                     unit=spec.unit)
    est, own, reps = numbers["estimate"], numbers["replicates"], len(ca)
    gaps = [m.gap for m in own if m.gap is not None]
    gap = float(np.mean(gaps)) if len(gaps) == reps else None
    shown: MatchedGap = next((x for x in own if x.gap is None), own[0])  # a ladder without a gap
    if reps == 1:
        description = shown.description
    elif gap is None:
        description = (f"no matched {spec.words} in every ladder: in {reps - len(gaps)} of "
                       f"{reps} replicate ladders, {shown.description}")
    else:
        description = (
            f"LiRA AUC, {names[0]} minus {names[1]} at the {where} matched {spec.words}: the mean "
            f"over {reps} replicate ladders (each from its own seed) of each one's "
            f"interpolation rule (matched at {', '.join(f'{spec.scale * g:.2f}' for g in gaps)} "
            f"{spec.unit}); {est.method}")
    found = gap is not None
    return {"gap": gap, "interp": est.mean if found else np.nan,
            "interp_lo": est.lo if found else np.nan, "interp_hi": est.hi if found else np.nan,
            "method": est.method, "calibration": numbers["calibration"],
            "description": description}


def power_table(rows: pd.DataFrame, sizes: Sequence[int] = (16, 32, 64, 128, 256, 512),
                target: float = 0.005) -> pd.DataFrame:
    """The interval half-width of each estimator at other study sizes, scaled from the measured
    one (``rows``: one :func:`compare` row). With one ladder: at other numbers of models per
    bank N (index ``N``), as ``sqrt(N_measured / N)``. With R >= 2 replicate ladders the
    interval is a Student t over them, which more models per bank do not narrow: at other
    numbers of replicate ladders R (index ``R``: 1, 2, 4, ... times the measured R), the
    replicates' spread held, as ``t(R - 1) / sqrt(R)`` against its measured value (95%
    quantiles). The last row, ``N for +-target`` (or ``R for ...``), is the size each estimator
    needs for a half-width of ``target`` (N rounded up to an even number)."""
    row = rows.iloc[0] if isinstance(rows, pd.DataFrame) else rows
    reps = int(row.get("replicates", 1) or 1)
    unit, n0 = ("R", reps) if reps >= 2 else ("N", int(row["n"]))
    hw = {"interpolation": (row.interp_hi - row.interp_lo) / 2,
          "regression": (row.reg_hi - row.reg_lo) / 2}
    if reps >= 2:
        sizes = [reps * 2 ** i for i in range(6)]
        grid = np.arange(2, 100_001)
        factor = _st.t.ppf(0.975, grid - 1) / np.sqrt(grid)       # half-width / spread at R
        spread = {k: v / factor[n0 - 2] for k, v in hw.items()}
        table = [{unit: str(n), **{k: sd * factor[n - 2] for k, sd in spread.items()}}
                 for n in sizes]
        need = {k: float(grid[np.argmax(factor * sd <= target)]) if factor[-1] * sd <= target
                else np.nan for k, sd in spread.items()}
    else:
        table = [{unit: str(n), **{k: v * np.sqrt(n0 / n) for k, v in hw.items()}} for n in sizes]
        need = {k: float(2 * np.ceil(n0 * (v / target) ** 2 / 2)) for k, v in hw.items()}
    table.append({unit: f"{unit} for +-{100 * target:g} pt", **need})
    return pd.DataFrame(table).set_index(unit)


def records(rows: pd.DataFrame, config: RunConfig, attack: str = "", *, secondary: bool = False
            ) -> list[tuple[Result, float | None, dict]]:
    """The results entries of :func:`compare` rows of the study's setting (``config``: any of
    its banks, for the data set, architecture and corruption), per row: the interpolation
    rule's difference, the regression's and the matched gap, with ``norm`` minus ``versus`` and
    the gap's position (``when``). BN minus another norm, both on the epochs ladder, is
    ``confound_auc_diff`` (claims C3e and C3g); a comparison involving another knob is
    ``confound_knob_auc_diff``, its norms named with their knobs. Each carries its replicate
    ladders, its interval's method and, with two or more, the calibration of one ladder's
    interval against theirs; ``attack`` (the LiRA attack the AUCs are of) is named in the
    difference's description. ``secondary``: ``attack`` is not the headline one, and its
    numbers are recorded beside the headline's (the result's ``attack`` field set, the claims'
    secondary rows): the interpolation rule's difference alone, without its calibration."""
    out = []
    for _, r in rows.iterrows():
        on_ladder = r.knob_a == r.knob_b == "epochs" and r.a == "bn"
        fields = ({"norm": r.a, "versus": r.b} if on_ladder else
                  {"norm": f"{r.a}_{r.knob_a}", "versus": f"{r.b}_{r.knob_b}"})
        fields["when"] = r.position
        fields["ruler"] = r.get("ruler", "accgap")
        if secondary:
            fields["attack"] = attack

        def result(metric: str, fields=fields) -> Result:
            return Result.of(config, metric, **fields)

        n, reps = int(r.n), int(r.get("replicates", 1) or 1)
        cal = r.get("calibration")
        extra = {"replicates": reps,
                 "calibration": cal if isinstance(cal, dict) and not secondary else None}

        def estimate(col: str, method: str, r=r, n=reps if reps > 1 else n) -> Estimate | None:
            return None if _num(r[col]) is None else Estimate.of_row(r, col, n, method)

        out.append((result("confound_auc_diff" if on_ladder else "confound_knob_auc_diff"),
                    estimate("interp", r.get("method") or ""),
                    {**extra, "description": f"{attack}: {r.description}" if attack
                     else r.description}))
        if secondary:
            continue
        method = REPLICATE_T if reps > 1 else f"{BOOTSTRAP} over the models of each bank"
        reg = estimate("reg", method)
        over = f"{method}, {reps} replicate ladders" if reps > 1 else method
        out.append((result("confound_reg_auc_diff"), reg,
                    {"replicates": reps, "description": "the same by the per-model "
                     f"piecewise-linear regression at the same gap ({over})"}))
        spec = RULERS[fields["ruler"]]
        out.append((result("confound_gap"), _num(r.gap),
                    {"description": f"the {r.position} matched {spec.words} (None: the ranges "
                                    "do not overlap)" + (f"; the mean over {reps} replicate "
                                                         "ladders" if reps > 1 else "")}))
    return out


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)
