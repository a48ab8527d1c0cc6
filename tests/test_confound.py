"""The confound study (bnmem_utils.analyses.confound): the ladder's banks, both matched-gap estimators on
synthetic curves with a known answer, the power table, the results keys the claims read, and
the runner's selection of notebook 04b."""

from __future__ import annotations

import unittest.mock

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from bnmem_utils.analyses import confound, matched_gap, report
from bnmem_utils.core import stats
from bnmem_utils.jobs import bank
from bnmem_utils.jobs.config import RunConfig
from bnmem_utils.privacy import attacks
from bnmem_utils.run import plan as runplan


def _config(**kw) -> RunConfig:
    """A bank of the study's setting (digits, LeNet), for its results' fields."""
    return RunConfig.bank(dataset="digits", arch="lenet", **kw)


def _frame(offsets: dict[str, float], *, n: int = 24, seed: int = 0, slope: float = 0.8,
           knobs=("epochs",), bend: bool = False,
           loss_scale: dict[str, float] | None = None) -> pd.DataFrame:
    """Per-target rows of synthetic banks: each norm's gap grows along the ladder (norm 'none'
    reaches higher gaps than 'bn', so the ranges overlap only in part) and its AUC is
    0.5 + slope * gap (+ a bend above 6 points) + the norm's offset + noise. The loss gap is
    10 times the accuracy gap (times the norm's ``loss_scale``), the global AUC 0.5 + gap / 2."""
    rng = np.random.default_rng(seed)
    loss_scale = loss_scale or {}
    rows = []
    for norm, offset in offsets.items():
        shift = 0.01 if norm == "none" else 0.0
        for knob in knobs:
            levels = [1, 2, 4, 8, 16] if knob == "epochs" else [0.0, 0.001, 0.01]
            for i, level in enumerate(levels):
                centre = (0.01 + 0.02 * i if knob == "epochs" else 0.09 - 0.025 * i) + shift
                gap = centre + rng.normal(0, 0.006, n)
                auc = (0.5 + slope * gap + (0.5 * np.maximum(gap - 0.06, 0) if bend else 0)
                       + offset + rng.normal(0, 0.008, n))
                rows += [{"dataset": "digits", "arch": "lenet", "norm": norm, "knob": knob,
                          "level": float(level), "replicate": 0,
                          "epochs": level if knob == "epochs" else 16,
                          "weight_decay": 0.0 if knob == "epochs" else level, "model": m,
                          "gap": gap[m], "auc": auc[m], "train_acc": 0.99, "test_acc": 0.9,
                          "loss_gap": 10 * gap[m] * loss_scale.get(norm, 1.0),
                          "global_auc": 0.5 + 0.5 * gap[m]}
                         for m in range(n)]
    return pd.DataFrame(rows)


def test_hinge_fit_recovers_a_piecewise_linear_curve_exactly():
    gap = np.linspace(0, 0.1, 50)
    auc = 0.5 + 0.3 * gap + 2.0 * np.maximum(gap - 0.04, 0) - 1.0 * np.maximum(gap - 0.07, 0)
    fit = matched_gap.fitted_curve([(gap, auc)], [0.04, 0.07], [0.01, 0.05, 0.09])
    expected = 0.5 + 0.3 * np.array([0.01, 0.05, 0.09]) + 2 * np.array([0, 0.01, 0.05]) \
        - np.array([0, 0, 0.02])
    np.testing.assert_allclose(fit, expected, atol=1e-12)
    assert matched_gap.hinge_basis(gap, [0.04, 0.07]).shape == (50, 4)
    np.testing.assert_allclose(matched_gap.default_knots(np.arange(5.0), n_knots=1), [2.0])
    with pytest.raises(ValueError, match="n_knots"):
        matched_gap.default_knots(np.arange(5.0), n_knots=-1)


@pytest.mark.parametrize("offset", [0.0, 0.02])
def test_both_estimators_find_the_offset_between_two_curves(offset):
    """BN sits ``offset`` above no norm at every gap, on a curve that bends: both estimators
    read it at low, middle and high matched gaps, and their intervals agree."""
    frame = _frame({"bn": offset, "none": 0.0}, bend=True)
    rows = confound.compare(frame, "bn", "none", n_boot=400)
    assert list(rows.position) == ["low", "mid", "high"]
    assert rows.gap.is_monotonic_increasing
    low, high = max(frame.groupby(["norm", "level"]).gap.mean().groupby("norm").min()), \
        min(frame.groupby(["norm", "level"]).gap.mean().groupby("norm").max())
    assert low < rows.gap.min() and rows.gap.max() < high       # inside the overlap
    for col in ("interp", "reg"):
        assert (rows[f"{col}_lo"] <= offset + 1e-9).all() and (offset <= rows[f"{col}_hi"]).all()
        assert (rows[f"{col}_hi"] - rows[f"{col}_lo"] < 0.02).all()
    assert rows.agree.all()


def test_regression_sees_a_difference_the_bank_means_hide():
    """Curves whose bank means coincide but whose per-model slopes differ: the regression's
    answer is the true one at the middle gap, within its interval."""
    a = [(np.array([0.02, 0.04]), np.array([0.52, 0.54])), (np.array([0.06, 0.08]),
                                                            np.array([0.56, 0.58]))]
    b = [(np.array([0.02, 0.04]), np.array([0.51, 0.53])), (np.array([0.06, 0.08]),
                                                            np.array([0.55, 0.57]))]
    out = matched_gap.regression_difference(a, b, [0.05], n_knots=0, n_boot=200)
    assert out["diff"].iloc[0] == pytest.approx(0.01)
    assert out.lo.iloc[0] <= 0.01 <= out.hi.iloc[0]


def test_matched_gap_reads_at_a_fraction_of_the_overlap():
    rng = np.random.default_rng(1)
    a = [(rng.normal(g, 0.001, 8), rng.normal(0.5 + g, 0.001, 8)) for g in (0.01, 0.05)]
    b = [(rng.normal(g, 0.001, 8), rng.normal(0.49 + g, 0.001, 8)) for g in (0.03, 0.07)]
    mid = matched_gap.matched_gap_difference(a, b, n_boot=200)
    assert mid == matched_gap.matched_gap_difference(a, b, n_boot=200, at=0.5)
    low = matched_gap.matched_gap_difference(a, b, n_boot=200, at=0.0)
    high = matched_gap.matched_gap_difference(a, b, n_boot=200, at=1.0)
    assert low.gap == pytest.approx(max(a[0][0].mean(), b[0][0].mean()))
    assert high.gap == pytest.approx(min(a[1][0].mean(), b[1][0].mean()))
    assert low.gap < mid.gap < high.gap and "of the way up" in low.description
    with pytest.raises(ValueError, match=r"at must be a fraction of the overlap in \[0, 1\]"):
        matched_gap.matched_gap_difference(a, b, at=1.5)


def test_power_table_scales_as_one_over_root_n():
    row = pd.Series({"n": 16, "interp_lo": -0.01, "interp_hi": 0.01, "reg_lo": 0.0,
                     "reg_hi": 0.005})
    table = confound.power_table(pd.DataFrame([row]), sizes=(16, 64), target=0.005)
    assert table.loc["16", "interpolation"] == pytest.approx(0.01)
    assert table.loc["64", "interpolation"] == pytest.approx(0.005)
    assert table.loc["64", "regression"] == pytest.approx(0.00125)
    need = table.iloc[-1]
    assert need.interpolation == 64 and need.regression == 4    # 16 * (0.0025 / 0.005)^2, even


def test_records_feed_the_claims_c3e_and_c3g():
    frame = _frame({"bn": 0.01, "none": 0.0, "gn": 0.0}, knobs=("epochs", "weight_decay"), n=8)
    rows = pd.concat([confound.compare(frame, "bn", n, n_boot=100, ruler=r)
                      for n in ("none", "gn") for r in confound.RULERS]
                     + [confound.compare(frame, "bn", "bn", knob_b="weight_decay", n_boot=100)])
    recs = confound.records(rows, _config(ood_rate=0.01))
    entries = {r.key: {"fields": r.fields(), "label": r.label} for r, _, _ in recs}
    c3e, c3g, c3h = (next(c for c in report.CLAIMS if c.id == i) for i in ("C3e", "C3g", "C3h"))
    key = "confound_auc_diff_bn_{}_digits_lenet_ood1_{}_{}"
    assert sorted(k for k, e in entries.items() if c3e.matches(e)) == sorted(
        key.format("none", p, r) for p in ("high", "low", "mid") for r in ("accgap", "lossgap"))
    assert [k for k, e in entries.items() if c3e.matches(e) and c3e.is_primary(e)] == [
        key.format("none", "mid", "lossgap")]
    assert [k for k, e in entries.items() if c3g.matches(e)] == [key.format("gn", "mid", "lossgap")]
    assert sorted(k for k, e in entries.items() if c3h.matches(e)) == [
        key.format(n, "mid", "globalauc") for n in ("gn", "none")]
    assert "confound_knob_auc_diff_bn_epochs_bn_weight_decay_digits_lenet_ood1_mid_accgap" \
        in entries
    entry = {r.key: (v, x) for r, v, x in recs}[key.format("none", "mid", "accgap")]
    assert entry[0].lo < entry[0].mean < entry[0].hi and entry[1]["replicates"] == 1
    words = report.setting_words(c3g, entries[key.format("gn", "mid", "lossgap")])
    assert words == ("BN minus GroupNorm, digits 8x8, LeNet, OOD 1%, middle matched gap, "
                     "matched on the loss gap")
    assert report.setting_words(c3e, entries[key.format("none", "low", "accgap")]) \
        == "digits 8x8, LeNet, OOD 1%, low matched gap, matched on the accuracy gap"


def test_each_ruler_matches_the_curves_on_its_own_column():
    """BN's models reach a smaller loss gap at the same accuracy gap (and AUC): matched on the
    accuracy gap the curves agree; matched on the loss gap BN's AUC is higher."""
    frame = _frame({"bn": 0.0, "none": 0.0}, loss_scale={"bn": 0.6}, n=16)
    acc = confound.compare(frame, "bn", "none", n_boot=200, ruler="accgap")
    loss = confound.compare(frame, "bn", "none", n_boot=200, ruler="lossgap")
    mid = {name: r[r.position == "mid"].iloc[0] for name, r in (("acc", acc), ("loss", loss))}
    assert mid["acc"].interp_lo < 0 < mid["acc"].interp_hi
    assert mid["loss"].interp_lo > 0 and mid["loss"].ruler == "lossgap"
    assert "loss gap" in mid["loss"].description and "nats" in mid["loss"].description
    with pytest.raises(ValueError, match="unknown ruler 'gap'.*accgap, lossgap, globalauc"):
        confound.compare(frame, "bn", "none", ruler="gap")


def test_no_overlap_gives_rows_without_numbers():
    frame = _frame({"bn": 0.0, "none": 0.0}, n=6)
    frame.loc[frame.norm == "none", "gap"] += 0.5                  # far above BN's range
    rows = confound.compare(frame, "bn", "none", n_boot=50)
    assert rows.gap.isna().all() and rows.reg.isna().all()
    assert "do not overlap" in rows.description.iloc[0]
    recs = confound.records(rows, _config())
    assert all(v is None for _, v, _ in recs)


def test_study_arms_share_the_top_bank_and_name_bad_values():
    arms = confound.study_arms(norms=["bn", "none", "gn"], epochs=[4, 1, 2], knob_norms=["bn"],
                               weight_decays=[0.01], outlier_rate=0.01, n_models=4)
    ladder = [(a.config.model.norm, a.level) for a in arms if a.knob == "epochs"]
    assert ladder == [(n, e) for n in ("bn", "none", "gn") for e in (1.0, 2.0, 4.0)]
    knob = [a for a in arms if a.knob == "weight_decay"]
    assert [(a.config.model.norm, a.level, a.config.train.epochs) for a in knob] == [
        ("bn", 0.0, 4), ("bn", 0.01, 4)]
    top = next(a for a in arms if a.knob == "epochs" and a.config.model.norm == "bn" and a.level == 4)
    assert knob[0].config == top.config                         # one bank, on both curves
    assert len(confound.unique_configs(arms)) == len(arms) - 1
    with pytest.raises(ValueError, match="norms must include bn and none"):
        confound.study_arms(norms=["bn", "gn"], epochs=[1])
    with pytest.raises(ValueError, match=r"knob_norms \['ln'\] are not among the norms"):
        confound.study_arms(norms=["bn", "none"], epochs=[1], knob_norms=["ln"])
    with pytest.raises(ValueError, match="epochs must be a non-empty list"):
        confound.study_arms(norms=["bn", "none"], epochs=[])



def test_the_pool_size_knob_retrains_the_top_rung_on_smaller_pools_and_shares_its_top_bank():
    arms = confound.study_arms(norms=["bn", "none"], epochs=[1, 3], knob_norms=["bn", "none"],
                               train_sizes=[50, 100], train_size=200, n_models=4)
    knob = [a for a in arms if a.knob == "train_size"]
    assert [(a.config.model.norm, a.level, a.config.data.train_size, a.config.train.epochs) for a in knob] == [
        (n, float(s), s, 3) for n in ("bn", "none") for s in (50, 100, 200)]
    top = {a.config.model.norm: a.config for a in arms if a.knob == "epochs" and a.level == 3}
    assert [a.config for a in knob if a.level == 200] == [top["bn"], top["none"]]
    assert all(a.config.data.train_size == 200 for a in arms if a.knob == "epochs")
    assert len(confound.unique_configs(arms)) == len(arms) - 2
    with pytest.raises(ValueError, match="train_sizes needs the ladder's own pool size"):
        confound.study_arms(norms=["bn", "none"], epochs=[1], knob_norms=["bn"], train_sizes=[50])
    with pytest.raises(ValueError, match=r"train_sizes must be >= 2; got \[1\]"):
        confound.study_arms(norms=["bn", "none"], epochs=[1], knob_norms=["bn"], train_sizes=[1],
                            train_size=100)


def test_replicate_ladders_train_from_their_own_seeds_and_only_for_the_norms_named():
    arms = confound.study_arms(norms=["bn", "none", "gn"], epochs=[1, 2], knob_norms=["bn"],
                               train_sizes=[50], train_size=100, n_models=4, seed=5,
                               replicates=3, replicated_norms=["bn", "none"])
    ladder = [(a.config.model.norm, a.replicate, a.config.seed) for a in arms
              if a.knob == "epochs" and a.level == 2]
    assert ladder == [("bn", r, 5 + r) for r in range(3)] + [("none", r, 5 + r) for r in range(3)] \
        + [("gn", 0, 5)]
    assert {(a.replicate, a.config.seed) for a in arms if a.knob == "train_size"} == {(0, 5)}
    bn = {a.config.seed: a.config for a in arms if a.knob == "epochs" and a.level == 2
          and a.config.model.norm == "bn"}
    assert len(set(bn.values())) == 3                     # three banks, three cache keys
    with pytest.raises(ValueError, match=r"replicated_norms among the norms \(\['ln'\]"):
        confound.study_arms(norms=["bn", "none"], epochs=[1], replicated_norms=["ln"])
    with pytest.raises(ValueError, match="replicates must be >= 1"):
        confound.study_arms(norms=["bn", "none"], epochs=[1], replicates=0)


def _replicated_frame(offsets: dict[str, float], shifts: list[float], *, n: int = 8) -> pd.DataFrame:
    """:func:`_frame` for each replicate ladder, replicate r's AUC moved by ``shifts[r]`` for
    BN only: bank-to-bank variance that one ladder's targets cannot see."""
    frames = []
    for r, shift in enumerate(shifts):
        f = _frame(offsets, n=n, seed=10 + r)
        f.loc[f.norm == "bn", "auc"] += shift
        frames.append(f.assign(replicate=r))
    return pd.concat(frames, ignore_index=True)


def test_replicate_ladders_widen_the_matched_gap_intervals_and_carry_their_calibration():
    """BN's offset moves by -2 to +2 AUC points from ladder to ladder: each ladder's own interval
    is narrower than that spread, the intervals of both estimators (a Student t over the three
    ladders' own numbers) are wider than the first ladder's, and the rows, records and power
    table say they rest on three ladders."""
    frame = _replicated_frame({"bn": 0.01, "none": 0.0, "gn": 0.0}, [-0.02, 0.0, 0.02])
    rows = confound.compare(frame, "bn", "none", n_boot=300, ruler="accgap")
    one = confound.compare(frame[frame.replicate == 0], "bn", "none", n_boot=300, ruler="accgap")
    mid, first = (r[r.position == "mid"].iloc[0] for r in (rows, one))
    assert mid.replicates == 3 and first.replicates == 1 and mid.method == stats.REPLICATE_T
    assert "bootstrap over one bank's targets" in first.method
    assert mid.interp_hi - mid.interp_lo > first.interp_hi - first.interp_lo
    assert mid.reg_hi - mid.reg_lo > first.reg_hi - first.reg_lo
    assert mid.calibration["replicates"] == 3
    assert mid.calibration["one_bank_needed_halfwidth"] > mid.calibration["one_bank_halfwidth"]
    assert "3 replicate ladders" in mid.description
    ladders = [confound.compare(frame[frame.replicate == r], "bn", "none", n_boot=50,
                                ruler="accgap").set_index("position").loc["mid"] for r in range(3)]
    interp = stats.replicate_t([x.interp for x in ladders])       # the rule applied per ladder
    assert (mid.interp, mid.interp_lo, mid.interp_hi) == pytest.approx((interp.mean, interp.lo,
                                                                         interp.hi))
    reg = stats.replicate_t([matched_gap.regression_difference(
        *(matched_gap.curve(frame[frame.replicate == r], n) for n in ("bn", "none")), [mid.gap],
        n_boot=10).loc[0, "diff"] for r in range(3)])
    assert (mid.reg, mid.reg_lo, mid.reg_hi) == pytest.approx((reg.mean, reg.lo, reg.hi))
    # GN with one ladder: BN against it compares the ladders of the first seed only
    frame = frame[(frame.norm != "gn") | (frame.replicate == 0)]
    gn = confound.compare(frame, "bn", "gn", n_boot=100, ruler="accgap")
    assert (gn.replicates == 1).all() and gn.calibration.isna().all()
    recs = {r.key: (v, x) for r, v, x in confound.records(rows, _config(ood_rate=0.01))}
    value, extra = recs["confound_auc_diff_bn_none_digits_lenet_ood1_mid_accgap"]
    assert value.method == mid.method and extra["replicates"] == 3 and extra["calibration"]
    reg, _ = recs["confound_reg_auc_diff_bn_none_digits_lenet_ood1_mid_accgap"]
    assert reg.method == stats.REPLICATE_T and reg.n == 3
    power = confound.power_table(rows[rows.position == "mid"], target=0.005)
    assert power.index.name == "R" and list(power.index[:3]) == ["3", "6", "12"]
    t = scipy_stats.t.ppf(0.975, [2, 5]) / np.sqrt([3, 6])          # t(R - 1) / sqrt(R)
    assert power.iloc[1].interpolation == pytest.approx(power.iloc[0].interpolation * t[1] / t[0])
    need = int(power.iloc[-1].interpolation)
    spread = (mid.interp_hi - mid.interp_lo) / 2 / t[0]
    assert [scipy_stats.t.ppf(0.975, r - 1) * spread / np.sqrt(r) <= 0.005
            for r in (need - 1, need)] == [False, True]


def test_one_replicate_of_the_regression_is_the_plain_regression():
    frame = _frame({"bn": 0.01, "none": 0.0}, n=8)
    ca, cb = matched_gap.curve(frame, "bn"), matched_gap.curve(frame, "none")
    plain = matched_gap.regression_difference(ca, cb, [0.05], n_boot=200, seed=3)
    again = matched_gap.replicated_regression_difference([ca], [cb], [0.05], n_boot=200, seed=3)
    pd.testing.assert_frame_equal(plain, again)
    with pytest.raises(ValueError, match="same number"):
        matched_gap.replicated_regression_difference([ca, ca], [cb], [0.05])


def test_curve_names_the_norms_it_has():
    frame = _frame({"bn": 0.0, "none": 0.0}, n=4)
    assert len(matched_gap.curve(frame, "bn")) == 5
    with pytest.raises(ValueError, match="no 'ln' banks on the 'epochs' knob; norms there: bn, none"):
        matched_gap.curve(frame, "ln")


def test_runner_selects_04b_by_its_number_and_name_not_by_04(monkeypatch):
    found = {s: s for s in ("04_lira", "04b_confound", "05_mitigation")}
    monkeypatch.setattr(runplan, "discover_notebooks", lambda *a: found)
    assert list(runplan.select_notebooks("04")) == ["04_lira"]
    assert list(runplan.select_notebooks("4")) == ["04_lira"]
    assert list(runplan.select_notebooks("04b")) == ["04b_confound"]
    assert list(runplan.select_notebooks("confound")) == ["04b_confound"]
    assert list(runplan.select_notebooks(["04", "04b"])) == ["04_lira", "04b_confound"]
    assert runplan.NOTEBOOK_PATTERN.match("04b_confound") and not runplan.NOTEBOOK_PATTERN.match(
        "04bb_x")


class _Batching:
    """A remote-looking executor that runs tasks in this process and records each batch."""

    name = "batching"

    def __init__(self):
        self.batches: list[list] = []
        self.puts = 0

    def imap(self, fn, items, *shared, gpu=False):
        self.batches.append(list(items))
        for i, item in enumerate(items):
            yield i, fn(item, *shared)

    def map(self, fn, items, *shared, gpu=False):
        return [v for _, v in self.imap(fn, items, *shared, gpu=gpu)]

    def put(self, obj):
        self.puts += 1
        return obj

    def close(self):
        pass


def test_the_study_banks_go_out_as_one_batch_and_match_the_local_build(tmp_path):
    """On a remote executor every missing model of every bank of the study goes out in one batch
    (the pool shipped once for banks that share it); the banks equal the local build's."""
    arms = confound.study_arms(norms=["bn", "none"], epochs=[1, 2], n_models=4, train_size=120,
                               test_size=60, population_size=30)
    configs = confound.unique_configs(arms)
    ex = _Batching()
    remote = bank.train_banks(configs, tmp_path / "remote", device="cpu", executor=ex,
                              progress=False)
    assert len(ex.batches) == 1 and ex.puts == 1
    assert sorted((job.config.arm, job.config.train.epochs, tuple(c)) for _, c, job, _, _ in ex.batches[0]) \
        == sorted((c.arm, c.train.epochs, (0, 1, 2, 3)) for c in configs)
    assert all(b.trained == 4 for b in remote)     # trained by the batch, read back from the cache
    local = bank.train_banks(configs, tmp_path / "local", device="cpu", progress=False)
    for r, lo in zip(remote, local, strict=True):
        np.testing.assert_allclose(r.scores, lo.scores, rtol=0, atol=1e-6)
    # the per-target frame: each target's AUC and its own model's gap, as notebook 04 reads them
    frame = confound.target_frame(arms, remote)
    assert len(frame) == 4 * len(arms) and set(frame.knob) == {"epochs"}
    for i, b in enumerate(remote):
        gap, auc = matched_gap.bank_point(b)
        np.testing.assert_allclose(frame[frame.arm == i].gap, gap)
        np.testing.assert_allclose(frame[frame.arm == i].auc, auc)
    points = confound.point_frame(frame)
    assert len(points) == len(arms) and (points.n == 4).all()
    # another LiRA's frame (the notebook's per-sample variance beside its headline, here the
    # pooled variance of "auto" with 3 shadows a side) evaluates only that attack: the global
    # one is read back, and reads the same
    evaluated = []
    real = attacks.evaluate_leave_one_out

    def counting(*args, **kw):
        evaluated.extend(kw["attacks"])
        return real(*args, **kw)

    with unittest.mock.patch.object(attacks, "evaluate_leave_one_out", counting):
        other = confound.target_frame(arms, remote, attack="lira_online")
    assert evaluated == ["lira_online"] * len(remote)
    np.testing.assert_array_equal(other.global_auc, frame.global_auc)
    again = _Batching()
    cached = bank.train_banks(configs, tmp_path / "remote", device="cpu", executor=again,
                              progress=False)
    assert again.batches == [] and again.puts == 0             # nothing left to train
    assert all(b.trained == 0 for b in cached)


def test_fit_progress_projects_the_epochs_a_norm_needs_to_fit():
    """Training error 16% at 10 epochs and 4% at 20 falls as epochs**-2, so 1% comes at 40; a
    norm already at 99% needs its top rung; a norm whose error rose gets no projection."""
    rows = [("bn", 10, 0.95), ("bn", 20, 0.995), ("gn", 5, 0.5), ("gn", 10, 0.84),
            ("gn", 20, 0.96), ("ln", 10, 0.9), ("ln", 20, 0.85), ("ln", 40, 0.99, "train_size")]
    points = pd.DataFrame([{"norm": r[0], "level": r[1], "train_acc": r[2], "train_acc_min": r[2],
                            "gap": 0.1, "knob": r[3] if len(r) > 3 else "epochs", "replicate": 0}
                           for r in rows])
    out = confound.fit_progress(points).set_index("norm")
    assert out.loc["bn", "fitted"] and out.loc["bn", "epochs_to_target"] == 20
    assert not out.loc["gn", "fitted"] and out.loc["gn", "alpha"] == pytest.approx(2.0)
    assert out.loc["gn", "epochs_to_target"] == pytest.approx(40.0)
    assert out.loc["gn", "reaches"] == "at about 40 epochs"
    assert confound._reach_words(8.1e32, 72) == "beyond 720 epochs"       # no 33-digit number
    assert (out.loc["gn", "prev_epochs"], out.loc["gn", "epochs"]) == (10, 20)
    assert np.isnan(out.loc["ln", "epochs_to_target"])          # the knob row is not a rung
    one = confound.fit_progress(points[points.level == 20]).set_index("norm")   # one rung each
    assert one.loc["bn", "epochs_to_target"] == 20 and np.isnan(one.loc["gn", "epochs_to_target"])
    # replicate ladders: a rung's accuracy is the mean over them, its lowest model the lowest
    bn = points[points.norm == "bn"]
    twice = pd.concat([bn.assign(replicate=0), bn.assign(replicate=1, train_acc=bn.train_acc - 0.01,
                                                         train_acc_min=bn.train_acc - 0.2)])
    both = confound.fit_progress(twice).set_index("norm").loc["bn"]
    assert both.replicates == 2 and both.train_acc == pytest.approx(0.99)
    assert both.train_acc_min == pytest.approx(0.795) and both.fitted


def test_past_the_fit_measures_what_moves_after_the_members_are_fitted():
    """BN fitted from 8 epochs on: from 8 to 16 its accuracy gap stays while its loss gap and
    AUC grow, and the changes come with intervals that resolve them; a norm fitted only at the
    top rung (no rung past its fit) has no row."""
    rng = np.random.default_rng(3)
    rows = []
    for norm, fitted_from in (("bn", 8), ("none", 16)):
        for level in (2, 4, 8, 16):
            past = level > fitted_from
            rows += [{"norm": norm, "knob": "epochs", "level": float(level), "replicate": 0,
                      "model": m,
                      "gap": 0.1 + rng.normal(0, 0.004), "loss_gap": (0.8 if past else 0.5)
                      + rng.normal(0, 0.03), "global_auc": 0.6, "auc": (0.70 if past else 0.65)
                      + rng.normal(0, 0.005), "train_acc": 0.995 if level >= fitted_from else 0.9}
                     for m in range(16)]
    frame = pd.DataFrame(rows)
    points = frame.groupby(["norm", "knob", "level"], as_index=False).agg(
        train_acc=("train_acc", "mean"))
    out = confound.past_the_fit(frame, points).set_index("norm")
    assert list(out.index) == ["bn"]
    bn = out.loc["bn"]
    assert (bn.fitted_at, bn.top) == (8, 16)
    assert bn.gap_lo < 0 < bn.gap_hi                            # the accuracy gap stays
    assert bn.loss_gap_lo > 0.2 and bn.auc == pytest.approx(0.05, abs=0.01) and bn.auc_lo > 0
    from bnmem_utils.figures.privacy import plot_past_the_fit

    fig = plot_past_the_fit(out.reset_index())
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["change of the accuracy gap", "change of the loss gap",
                      "change of the global attack's AUC", "change of the LiRA AUC"], titles
    assert fig.axes[-1].get_xticklabels()[0].get_text() == "BatchNorm\n8 to 16\nepochs"
