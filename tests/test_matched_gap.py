"""The matched-gap comparison on synthetic curves with known answers."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from bnmem_utils.analyses import matched_gap
from bnmem_utils.jobs.config import RunConfig


def _curve(gaps, offset, slope=2.0, n=16, noise=0.004, seed=0):
    """Points whose per-target values are ``0.5 + offset + slope * gap`` plus noise."""
    rng = np.random.default_rng(seed)
    points = []
    for g in gaps:
        gap = g + rng.normal(0, noise, n)
        points.append((gap, 0.5 + offset + slope * gap + rng.normal(0, noise, n)))
    return points


def test_interpolate_reads_segments_and_extends_the_ends():
    gaps, values = [[0.0, 1.0, 3.0]], [[0.0, 2.0, 2.0]]
    assert matched_gap.interpolate(gaps, values, 0.5)[0] == pytest.approx(1.0)
    assert matched_gap.interpolate(gaps, values, 2.0)[0] == pytest.approx(2.0)
    assert matched_gap.interpolate(gaps, values, -1.0)[0] == pytest.approx(-2.0)   # first segment
    assert matched_gap.interpolate([[3.0, 0.0, 1.0]], [[2.0, 0.0, 2.0]], 0.5)[0] == pytest.approx(1.0)
    assert matched_gap.interpolate([[1.0]], [[7.0]], 5.0)[0] == 7.0                  # one point


def test_known_offset_at_the_matched_gap():
    a = _curve([0.010, 0.020, 0.040], offset=0.02, seed=1)
    b = _curve([0.015, 0.030, 0.050], offset=0.0, seed=2)
    res = matched_gap.matched_gap_difference(a, b, n_boot=1000, names=("BN", "none"))
    # overlap of the ranges, about [0.015, 0.040]: its midpoint
    assert res.gap == pytest.approx(0.0275, abs=0.003)
    assert res.lo <= 0.02 <= res.hi
    assert res.lo > 0
    assert res.a == pytest.approx(0.5 + 0.02 + 2 * res.gap, abs=0.004)
    assert res.b == pytest.approx(0.5 + 2 * res.gap, abs=0.004)
    assert "BN minus none" in res.description


def test_no_offset_gives_an_interval_around_zero():
    a = _curve([0.010, 0.020, 0.040], offset=0.0, seed=3)
    b = _curve([0.015, 0.030, 0.050], offset=0.0, seed=4)
    res = matched_gap.matched_gap_difference(a, b, n_boot=1000)
    assert res.lo < 0 < res.hi


def test_a_raw_difference_caused_by_the_gap_vanishes_at_the_matched_gap():
    # the same curve, but "a" trained further: a large raw difference, none at equal gap
    a = _curve([0.02, 0.03, 0.05], offset=0.0, seed=5)
    b = _curve([0.01, 0.02, 0.03], offset=0.0, seed=6)
    raw = a[-1][1].mean() - b[-1][1].mean()
    assert raw > 0.03
    res = matched_gap.matched_gap_difference(a, b, n_boot=1000)
    assert res.lo < 0 < res.hi


def test_ranges_that_do_not_overlap_give_no_number():
    a = _curve([0.01, 0.02], offset=0.0, seed=7)
    b = _curve([0.04, 0.06], offset=0.0, seed=8)
    res = matched_gap.matched_gap_difference(a, b, names=("BN", "none"))
    assert res.gap is None and res.diff is None and res.lo is None and res.hi is None
    assert "do not overlap" in res.description and "BN" in res.description


def test_bad_points_are_refused():
    with pytest.raises(ValueError, match="equally long"):
        matched_gap.matched_gap_difference([(np.zeros(3), np.zeros(4))], _curve([0.0], 0.0))
    with pytest.raises(ValueError, match="at least one point"):
        matched_gap.matched_gap_difference([], _curve([0.0], 0.0))


def test_bank_point_pairs_each_target_with_its_own_model():
    metrics = pd.DataFrame({
        "target": [1, 0, 0, 1, 0, 1], "attack": ["lira_online"] * 6,
        "subset": ["all", "all", "outlier", "outlier", "clean", "clean"],
        "auc": [0.7, 0.6, 0.9, 0.95, 0.55, 0.65]})
    models = pd.DataFrame({"model": [0, 1], "gap": [0.01, 0.03]})
    fake = SimpleNamespace(config=SimpleNamespace(arm="x"), models=models,
                           evaluate=lambda mode="eval": SimpleNamespace(metrics=metrics))
    gap, value = matched_gap.bank_point(fake, "lira_online")
    np.testing.assert_allclose(gap, [0.01, 0.03])
    np.testing.assert_allclose(value, [0.6, 0.7])


def test_interpolate_takes_one_gap_per_row():
    out = matched_gap.interpolate([[0.0, 1.0], [0.0, 2.0]], [[0.0, 1.0], [0.0, 1.0]], [0.5, 1.0])
    np.testing.assert_allclose(out, [0.5, 0.5])


def test_replicates_whose_ranges_part_are_left_out_and_counted():
    # ranges that only touch: many replicates lose the overlap
    a = _curve([0.010, 0.030], offset=0.0, noise=0.01, seed=9)
    b = _curve([0.029, 0.050], offset=0.0, noise=0.01, seed=10)
    res = matched_gap.matched_gap_difference(a, b, n_boot=500)
    if res.gap is not None:
        assert 0 < res.dropped < 1
        assert "left out" in res.description


def _fake_bank(norm: str, epochs: int, shift: float, outliers: bool = True,
               undefined: tuple[int, ...] = ()):
    """A bank whose two targets have gaps ``0.01 * epochs`` (+/- 0.002) and AUCs on that line;
    targets in ``undefined`` have no AUC on the outliers (NaN: all members or all non-members)."""

    gaps = np.array([0.01 * epochs - 0.002, 0.01 * epochs + 0.002])
    rows = [{"target": t, "attack": "lira_online", "subset": s,
             "auc": np.nan if (s == "outlier" and t in undefined) else 0.5 + shift + 2 * g + d}
            for t, g in enumerate(gaps) for s, d in (("all", 0.0), ("outlier", 0.1), ("clean", 0.0))]
    config = RunConfig.bank(norm=norm, epochs=epochs, ood_rate=0.01, n_models=4)
    return SimpleNamespace(config=config, n_models=4, outliers=np.array([outliers]),
                           models=pd.DataFrame({"model": [0, 1], "gap": gaps}),
                           evaluate=lambda mode="eval", rows=rows: SimpleNamespace(
                               metrics=pd.DataFrame(rows)))
