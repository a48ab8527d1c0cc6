"""Memorization summaries on synthetic histories whose answers are known by construction."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from bnmem_utils.analyses import memorization as mem
from bnmem_utils.core.stats import Estimate
from bnmem_utils.figures import explore
from bnmem_utils.figures import memorization as plots_memorization


def _histories(rates: dict[str, float], seeds=(0, 1, 2), epochs: int = 12, noise: float = 0.02,
               settings=("flip 5%",)) -> pd.DataFrame:
    """Per-epoch frame where memorization follows 1 - exp(-rate * epoch) per norm (plus noise)."""
    rng = np.random.default_rng(0)
    rows = []
    for setting in settings:
        for norm, rate in rates.items():
            for seed in seeds:
                for e in range(1, epochs + 1):
                    m = 1 - np.exp(-rate * e) + noise * rng.standard_normal()
                    rows.append({"dataset": "digits", "arch": "mlp", "setting": setting,
                                 "norm": norm, "seed": seed, "epoch": e,
                                 "corrupted_acc": float(np.clip(m, 0, 1)),
                                 "corrupted_loss": float(-np.log(max(m, 1e-3))),
                                 "test_acc": 0.9, "clean_acc": 0.99})
    return pd.DataFrame(rows)


def test_epochs_to_reach_first_crossing_and_never():
    assert mem.epochs_to_reach([1, 2, 3, 4], [0.1, 0.5, 0.4, 0.95], 0.5) == 2
    assert mem.epochs_to_reach([1, 2, 3, 4], [0.1, 0.5, 0.4, 0.95], 0.9) == 4
    assert np.isnan(mem.epochs_to_reach([1, 2, 3], [0.1, 0.2, 0.3], 0.5))
    # NaN (a diverged epoch) never counts as reaching the threshold.
    assert mem.epochs_to_reach([1, 2, 3], [np.nan, 0.2, 0.6], 0.5) == 3
    with pytest.raises(ValueError, match="align"):
        mem.epochs_to_reach([1, 2], [0.1], 0.5)


def test_value_at_epoch():
    assert mem.value_at_epoch([1, 2, 3], [0.1, 0.2, 0.3], 2) == 0.2
    assert mem.value_at_epoch([1, 2, 3], [0.1, 0.2, 0.3], "final") == 0.3
    assert np.isnan(mem.value_at_epoch([1, 2, 3], [0.1, 0.2, 0.3], 7))


def test_run_summary_known_curve():
    hist = _histories({"bn": 0.5}, seeds=(0,), noise=0.0)
    runs = mem.run_summary(hist, at_epochs=(2, 5))
    assert len(runs) == 1
    r = runs.iloc[0]
    # 1 - exp(-0.5 e) >= 0.5  <=>  e >= 2 ln 2 = 1.39 -> epoch 2; >= 0.9 <=> e >= 4.6 -> epoch 5
    assert r["epochs_to_50"] == 2 and r["epochs_to_90"] == 5
    assert r["mem_at_2"] == pytest.approx(1 - np.exp(-1.0))
    assert r["final_mem"] == pytest.approx(1 - np.exp(-6.0))
    assert r["final_test_acc"] == 0.9 and r["epochs"] == 12
    assert r["loss_at_5"] == pytest.approx(-np.log(1 - np.exp(-2.5)))


def test_run_summary_missing_column_is_clear():
    with pytest.raises(ValueError, match="corrupted_acc"):
        mem.run_summary(pd.DataFrame({"dataset": [], "arch": [], "setting": [], "norm": [],
                                      "seed": [], "epoch": []}))


def test_condition_table_interval_and_threshold_counts():
    hist = _histories({"bn": 0.6, "none": 0.1}, epochs=10)
    runs = mem.run_summary(hist, at_epochs=(3,))
    table = mem.condition_table(runs)
    assert list(table["norm"]) == ["bn", "none"]  # NORM_ORDER
    bn, none = table.iloc[0], table.iloc[1]
    assert bn["n_seeds"] == 3
    assert bn["mem_at_3_lo"] <= bn["mem_at_3"] <= bn["mem_at_3_hi"]
    assert bn["mem_at_3"] > none["mem_at_3"]
    # 1 - exp(-0.1 * 10) = 0.63 < 0.9: no-norm seeds never reach 90%.
    assert none["epochs_to_90_n"] == 0 and np.isnan(none["epochs_to_90"])
    shown = mem.format_condition_table(table, metrics=["epochs_to_90", "final_mem"])
    assert shown.loc[1, "epochs_to_90"] == "never (0/3)"
    assert shown.loc[0, "epochs_to_90"].endswith("(3/3)")
    assert shown.loc[0, "norm"] == "BatchNorm"


def test_paired_differences_sign_and_pairing():
    hist = _histories({"bn": 0.6, "none": 0.1, "gn": 0.3}, epochs=10)
    runs = mem.run_summary(hist, at_epochs=(3,))
    d = mem.paired_differences(runs, ["mem_at_3", "epochs_to_90"])
    row = d[d["metric"] == "mem_at_3"].iloc[0]
    expected = (1 - np.exp(-1.8)) - (1 - np.exp(-0.3))
    assert row["diff"] == pytest.approx(expected, abs=0.05)
    assert row["lo"] > 0 and row["n"] == 3
    # epochs_to_90: none never reaches it, so no pair is complete.
    assert d[d["metric"] == "epochs_to_90"].iloc[0]["n"] == 0
    # A seed present for only one norm drops out of the pairing.
    partial = runs[~((runs["norm"] == "none") & (runs["seed"] == 2))]
    d2 = mem.paired_differences(partial, ["mem_at_3"])
    assert d2.iloc[0]["n"] == 2


def test_paired_differences_equal_norms_covers_zero():
    hist = _histories({"bn": 0.3, "none": 0.3}, seeds=range(6), noise=0.05)
    runs = mem.run_summary(hist, at_epochs=(3,))
    row = mem.paired_differences(runs, ["mem_at_3"]).iloc[0]
    assert row["lo"] < 0 < row["hi"]


def test_mem_at_epochs_table_columns():
    hist = _histories({"bn": 0.6, "none": 0.1}, epochs=10, settings=("flip 1%", "flip 10%"))
    runs = mem.run_summary(hist, at_epochs=(3, 5))
    t = mem.mem_at_epochs_table(runs, (3, "final"))
    assert list(t.columns) == ["dataset", "arch", "setting", "epoch", "BatchNorm", "no norm",
                               "BN - none"]
    assert len(t) == 4 and list(t["epoch"][:2]) == ["3", "final"]
    assert t.loc[0, "BN - none"].startswith("+")


def _judged(runs=None, **kw) -> dict[str, str]:
    """The verdicts notebook 02 shows for these runs: its records, judged by the claims table."""
    from bnmem_utils.analyses import report

    recorded = {}
    for what, v, _ in mem.result_records(runs, **kw):
        recorded[what.key] = ({"value": v.mean, "lo": v.lo, "hi": v.hi, "n": v.n}
                              if isinstance(v, Estimate) else {"value": v})
        recorded[what.key].update(fields=what.fields(), label=what.label)
    frame = report.ClaimsView(report.notebook_rows("02_forced_memorization", recorded)).frame
    return dict(zip(frame.index, frame["verdict"], strict=True))


@pytest.mark.parametrize(("levels", "verdict"), [
    ({"bn": 0.6, "none": 0.1}, "reproduced"),           # BN memorizes faster
    ({"bn": 0.1, "none": 0.6}, "not reproduced"),       # BN slower
    ({"bn": 50.0, "none": 50.0}, "inconclusive")])      # both saturated at 100% from epoch 1
def test_speed_claim_is_judged_from_the_recorded_difference(levels, verdict):
    runs = mem.run_summary(_histories(levels, epochs=10, noise=0.0 if levels["bn"] > 1 else 0.02),
                           at_epochs=(3,))
    assert _judged(runs, at_epochs=(3,), headline_epoch=3)["C1a"] == verdict


def test_speed_claim_without_pairs_is_missing():
    runs = mem.run_summary(_histories({"bn": 0.6}), at_epochs=(3,))
    assert _judged(runs, at_epochs=(3,), headline_epoch=3)["C1a"] == "missing"


def _gamma_sigma(fracs: dict[str, float], seeds=(0, 1, 2), channels: int = 20) -> pd.DataFrame:
    rows = []
    for seed in seeds:
        for layer, frac in fracs.items():
            k = int(round(frac * channels))
            ratios = [2.0] * k + [0.5] * (channels - k)
            for c, r in enumerate(ratios):
                rows.append({"dataset": "digits", "arch": "lenet", "setting": "flip 5%",
                             "norm": "bn", "seed": seed, "layer": layer, "channel": c, "ratio": r})
    return pd.DataFrame(rows)


def test_gamma_sigma_fractions_per_layer_and_overall():
    gs = _gamma_sigma({"conv1": 0.75, "conv2": 0.25, "fc": 1.0})
    per_layer, overall = mem.gamma_sigma_fractions(gs)
    assert list(per_layer["layer"]) == ["conv1", "conv2", "fc"]  # network order kept
    assert per_layer["frac_above"].tolist() == pytest.approx([0.75, 0.25, 1.0])
    assert overall["frac_above"].iloc[0] == pytest.approx(2.0 / 3.0)
    assert overall["n"].iloc[0] == 3
    runs = mem.run_summary(_histories({"bn": 0.6, "none": 0.1}), at_epochs=(3,))
    assert _judged(runs, gs_runs=gs)["T3"] == "reproduced"
    assert _judged(runs, gs_runs=_gamma_sigma({"conv1": 0.1}))["T3"] == "not reproduced"


def test_plots_return_figure_and_data():
    import matplotlib.pyplot as plt

    hist = _histories({"bn": 0.6, "none": 0.1}, epochs=5, settings=("flip 1%", "flip 5%"))
    fig, data = plots_memorization.plot_curves(hist, "corrupted_acc", ylabel="memorization")
    assert len(fig.axes) == 2
    assert set(data.columns) >= {"setting", "norm", "epoch", "mean", "lo", "hi", "n"}
    assert len(data) == 2 * 2 * 5
    plt.close(fig)
    gs = _gamma_sigma({"conv1": 0.75, "fc": 0.5})
    per_layer, _ = mem.gamma_sigma_fractions(gs)
    fig = plots_memorization.plot_gamma_sigma(gs, per_layer)
    assert "75%" in " ".join(t.get_text() for t in fig.axes[0].get_xticklabels())
    plt.close(fig)


def test_slug():
    assert mem.slug("OOD 2% (gaussian)") == "ood_2pct_gaussian"
    assert mem.slug("flip 0.5%") == "flip_0p5pct"


def test_result_records_keys_and_values():
    from bnmem_utils.analyses import report

    hist = _histories({"bn": 0.6, "none": 0.1}, epochs=10)
    runs = mem.run_summary(hist, at_epochs=(3, 5))
    gs = _gamma_sigma({"conv1": 0.75, "fc": 0.25})
    gs["arch"] = "mlp"
    per_layer, _ = mem.gamma_sigma_fractions(gs)
    records = mem.result_records(runs, at_epochs=(3, 5), headline_epoch=3,
                                 gs_per_layer=per_layer, gs_runs=gs)
    recs = {r.key: v for r, v, _ in records}
    bn = recs["mem_at3_bn_digits_mlp_flip_5pct"]
    assert bn.mean == pytest.approx(1 - np.exp(-1.8), abs=0.05) and bn.n == 3
    # Claims C1a and C1b read mem_diff: only the headline epoch's gap and the final one.
    claims = {c.id: c for c in report.CLAIMS}
    c1 = sorted(r.key for r, _, _ in records
                if any(claims[i].matches({"fields": r.fields()}) for i in ("C1a", "C1b")))
    assert c1 == ["mem_diff_bn_none_digits_mlp_flip_5pct_at3",
                  "mem_diff_bn_none_digits_mlp_flip_5pct_final"]
    assert recs[c1[0]].lo > 0
    assert "mem_at5_bn_none_digits_mlp_flip_5pct" in recs
    assert "mem_epochs_to_50_bn_none_digits_mlp_flip_5pct" in recs
    assert "mem_at3_bn_none_digits_mlp_flip_5pct" not in recs   # no duplicate of the headline
    assert recs["mem_epochs_to_50_none_digits_mlp_flip_5pct"].n == 3
    # Claim T3 reads mem_t3_frac_above1: one row per condition, layers apart.
    t3 = [r.key for r, _, _ in records if claims["T3"].matches({"fields": r.fields()})]
    assert t3 == ["mem_t3_frac_above1_digits_mlp_flip_5pct"]
    assert recs[t3[0]].mean == pytest.approx(0.5)
    assert recs["mem_t3_layer_frac_above1_digits_mlp_flip_5pct_conv1"].mean == pytest.approx(0.75)
    assert recs["mem_t3_overall_frac_above1"].mean == pytest.approx(0.5)
    assert "mem_t3_overall_frac_above1_batch_sigma" not in recs
    assert all(extras["description"] for _, _, extras in records)
    assert {r.label for r, _, _ in records if r.setting} == {"flip 5%"}
    gs["batch_ratio"] = 2.0
    recs = {r.key: v for r, v, _ in mem.result_records(runs, gs_runs=gs)}
    assert recs["mem_t3_overall_frac_above1_batch_sigma"].mean == pytest.approx(1.0)


def test_display_intervals_are_clipped_to_percent_range():
    hist = _histories({"bn": 0.6, "none": 0.1}, epochs=10, noise=0.2)
    runs = mem.run_summary(hist, at_epochs=(3,))
    table = mem.condition_table(runs)
    assert (table["final_mem_hi"] > 1).any() or (table["mem_at_3_lo"] < 0).any()  # raw spills
    shown = mem.format_condition_table(table, metrics=["final_mem", "mem_at_3"])
    for cell in [*shown["final_mem"], *shown["mem_at_3"]]:
        lo, hi = (float(v) for v in cell.split("[")[1].rstrip("]").split(","))
        assert 0.0 <= lo <= hi <= 100.0


def test_gamma_sigma_fractions_name_each_layer():
    gs = _gamma_sigma({"conv1": 0.0, "conv2": 0.25, "fc1": 1.0, "fc2": 0.9})
    per_layer, overall = mem.gamma_sigma_fractions(gs)
    assert dict(zip(per_layer["layer"], per_layer["frac_above"], strict=True)) == pytest.approx(
        {"conv1": 0.0, "conv2": 0.25, "fc1": 1.0, "fc2": 0.9})
    assert overall["frac_above"].iloc[0] == pytest.approx(2.15 / 4)     # above half: T3 holds


def test_curve_explorer_builds_and_redraws():
    import matplotlib.pyplot as plt

    hist = _histories({"bn": 0.6, "none": 0.1}, epochs=4, settings=("flip 1%", "flip 5%"))
    box = explore.curve_explorer(hist)
    metric, setting, logy = box.children[0].children
    assert metric.value == "corrupted_acc" and setting.options == ("flip 1%", "flip 5%")
    setting.value = "flip 5%"
    metric.value = "corrupted_loss"
    logy.value = True
    plt.close("all")
    fig, data = explore.curve_explorer_default(hist)  # what headless runs show instead
    assert set(data["setting"]) == {"flip 1%"} if "setting" in data else fig.axes
    plt.close("all")


@pytest.mark.parametrize(("fixed", "epochs", "speed"), [
    ([5, 10], 20, 10), ([10, 5], 20, 10), ([3, 8, 6], 12, 8), ([4, 12], 12, 4), ([12], 12, "final")])
def test_the_speed_claim_is_read_at_the_latest_fixed_epoch_in_any_order(fixed, epochs, speed):
    """Notebook 02 judges C1a at the latest of mem_fixed_epochs below mem_epochs, however the
    list is ordered (a sorted list: its last, as before)."""
    import json

    from bnmem_utils.run.params import cell_source
    from bnmem_utils.run.plan import discover_notebooks

    cells = json.loads(discover_notebooks()["02_forced_memorization"].read_text())["cells"]
    lines = [line for c in cells for line in cell_source(c).splitlines()
             if line.startswith(("fixed_epochs = ", "speed_epoch = "))]
    assert len(lines) == 2, lines
    namespace = {"mem_fixed_epochs": fixed, "mem_epochs": epochs}
    exec("\n".join(lines), namespace)  # noqa: S102 (the notebook's own two lines)
    assert namespace["speed_epoch"] == speed
