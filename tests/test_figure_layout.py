"""Every figure function of the package, drawn on small synthetic data, is read by a reader:
no two texts it draws overlap (titles, axis labels, tick labels of different axes, annotations,
legend entries), no annotation sits on a marker, and no text is a code name (``lira_online``,
``gs_median``). The texts are the ones matplotlib's renderer actually draws, at their drawn
extents."""

from __future__ import annotations

import re
from unittest import mock

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from bnmem_utils.figures import gradnorms as plots_gradnorm  # noqa: E402
from bnmem_utils.figures import memorization as plots_memorization  # noqa: E402
from bnmem_utils.figures import plotting  # noqa: E402
from bnmem_utils.figures import privacy as plots_privacy  # noqa: E402
from bnmem_utils.figures import theory as plots_theory  # noqa: E402

#: A code name: lower-case words joined by underscores (``lira_online_fixed``, ``fit_step_twin``).
CODE_NAME = re.compile(r"[a-z]+(_[a-z0-9]+)+")


def drawn_texts(fig) -> list[Text]:
    """The texts the renderer draws when ``fig`` is drawn (visible, non-empty, in view)."""
    drawn, draw = [], Text.draw
    if not hasattr(fig.canvas, "get_renderer"):     # a figure made outside pyplot
        FigureCanvasAgg(fig)

    def record(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)

    with mock.patch.object(Text, "draw", record):
        fig.canvas.draw()
    return list(dict.fromkeys(drawn))


def _tick_axis(fig) -> dict[int, int]:
    """``{id(tick label): id(its axis)}``: tick labels of one axis are spaced by matplotlib."""
    return {id(t): id(axis) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
            for t in axis.get_ticklabels(which="both")}


def _overlap(a: Bbox, b: Bbox, tol: float = 1.0) -> bool:
    inter = Bbox.intersection(a, b)
    return inter is not None and inter.width > tol and inter.height > tol


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes overlap (two tick labels of one axis excepted)."""
    texts = drawn_texts(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    tick = _tick_axis(fig)
    return [(a.get_text(), b.get_text()) for i, a in enumerate(texts) for j, b in enumerate(texts)
            if i < j and not (id(a) in tick and tick.get(id(a)) == tick.get(id(b)))
            and _overlap(boxes[i], boxes[j])]


def _marker_points(ax) -> list[tuple[np.ndarray, float]]:
    """Display positions of the markers drawn in ``ax``, with each one's radius in pixels."""
    px = ax.figure.dpi / 72
    out = []
    for line in ax.get_lines():
        if line.get_visible() and line.get_marker() not in (None, "", "None", " ", "none"):
            xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
            out += [(p, 0.5 * px * line.get_markersize()) for p in xy if np.isfinite(p).all()]
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible():
            xy = coll.get_offset_transform().transform(coll.get_offsets())
            size = float(np.sqrt(np.max(coll.get_sizes(), initial=36.0)))
            out += [(p, 0.5 * px * size) for p in xy if np.isfinite(p).all()]
    return out


def texts_on_markers(fig) -> list[str]:
    """Annotations and free texts of an axes that cover one of its markers."""
    drawn = {id(t) for t in drawn_texts(fig)}
    renderer = fig.canvas.get_renderer()
    hits = []
    for ax in fig.axes:
        points = _marker_points(ax)
        for t in (t for t in ax.texts if id(t) in drawn):
            box = t.get_window_extent(renderer)
            if any(box.x0 - r < x < box.x1 + r and box.y0 - r < y < box.y1 + r
                   for (x, y), r in points):
                hits.append(t.get_text())
    return hits


def code_names(fig) -> list[str]:
    """Drawn texts that hold a code name."""
    return [t.get_text() for t in drawn_texts(fig)
            if any(CODE_NAME.fullmatch(w) for w in re.findall(r"[A-Za-z0-9_]+", t.get_text()))]


def assert_readable(fig) -> None:
    found = {"code names": code_names(fig), "texts over texts": overlapping_texts(fig),
             "texts over markers": texts_on_markers(fig)}
    plt.close(fig)
    assert {k: v for k, v in found.items() if v} == {}


# --------------------------------------------------------------------------------------------
# The check itself can fail
# --------------------------------------------------------------------------------------------


def test_the_check_sees_overlaps_code_names_and_covered_markers():
    fig, (a, b) = plt.subplots(1, 2, figsize=(4, 3))
    a.annotate("one label", (0.5, 0.5))
    a.annotate("another label", (0.5, 0.5))
    a.plot([0.2], [0.2], "o")
    a.annotate("on its point", (0.2, 0.2))
    a.set(xlim=(0, 1), ylim=(0, 1))
    b.set_xlabel("gs_median")
    assert overlapping_texts(fig) == [("one label", "another label")]
    assert texts_on_markers(fig) == ["on its point"]
    assert code_names(fig) == ["gs_median"]
    with pytest.raises(AssertionError):
        assert_readable(fig)


# --------------------------------------------------------------------------------------------
# Notebook 01
# --------------------------------------------------------------------------------------------


def test_theory_figures():
    from bnmem_utils.analyses import gamma_loop as gl
    from bnmem_utils.analyses import theory as th

    assert_readable(plots_theory.plot_ratio_grid(
        th.ratio_grid([0.25, 8.0], sigmas=(1.0,), batch_size=8, dim=4)).figure)
    assert_readable(plots_theory.plot_eta_sweep(
        th.eta_sweep([1e-5, 1e-3], batch_size=8, dim=4)).figure)
    assert_readable(plots_theory.plot_full_bn_convergence(
        th.full_bn_convergence([8, 64], [2.0, 4.0], cosines=(0.0, 0.3), dim=8))[0].figure)
    res = gl.gamma_loop(seeds=range(3), n_clean=8, dim=3, warmup=5, steps=5)
    assert_readable(plots_theory.plot_gamma_loop(res)[0].figure)
    r = th.explore_ratio(gamma=2.0, sigma=1.0, distance=8.0, batch_size=32, eta=1e-4)
    assert_readable(plots_theory.plot_exploration(r).figure)


# --------------------------------------------------------------------------------------------
# Notebooks 02 and 05
# --------------------------------------------------------------------------------------------


def test_memorization_figures():
    from test_memorization import _gamma_sigma, _histories

    from bnmem_utils.analyses import memorization as mem
    from bnmem_utils.figures import explore

    hist = _histories({"bn": 0.6, "none": 0.1, "gn": 0.3}, epochs=20,
                      settings=("flip 1%", "flip 10%", "OOD 2% (gaussian)"))
    for metric in ("corrupted_acc", "test_acc"):
        assert_readable(plots_memorization.plot_curves(hist, metric)[0])
    bn = hist[hist.norm == "bn"].assign(gs_median=lambda f: 1 + 0.1 * f.corrupted_acc)
    assert_readable(plots_memorization.plot_curves(bn, "gs_median", row="arch",
                                                   panel_cols=("dataset", "setting"),
                                                   logy=True)[0])
    gs = _gamma_sigma({"conv1": 0.75, "conv2": 0.6, "fc1": 0.5, "fc2": 0.4})
    assert_readable(plots_memorization.plot_gamma_sigma(gs, mem.gamma_sigma_fractions(gs)[0]))
    assert_readable(explore.curve_explorer_default(hist)[0])


def _arms():
    from bnmem_utils.analyses.mitigation import sweep_arms

    return sweep_arms([0.01, 0.1, 0.3, 1, 3], hinge_lams=(1, 10), hinge_taus=(1,))


def _arm_table(arms, cols, seed=0) -> pd.DataFrame:
    """Per arm, each column's value and interval, with arms close together (labels crowd)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, arm in enumerate(arms):
        row = {"arm": arm}
        for col in cols:
            v = 0.6 + 0.02 * i + 0.005 * rng.standard_normal()
            row.update({col: v, f"{col}_lo": v - 0.03, f"{col}_hi": v + 0.03})
        rows.append(row)
    return pd.DataFrame(rows)


def test_mitigation_figures():
    arms = _arms()
    hist = pd.DataFrame([{"arm": a, "seed": s, "epoch": e, "corrupted_acc": 0.1 * e / (i + 1),
                          "test_acc": 0.9 - 0.01 * i}
                         for i, a in enumerate(arms) for s in (0, 1) for e in range(1, 6)])
    assert_readable(plots_memorization.plot_arm_memorization(hist, arms)[0])
    gs = pd.DataFrame([{"arm": a, "ratio": r} for a in arms for r in (0.5, 1.0, 2.0)])
    fig, ax = plt.subplots(figsize=(5, 4))
    plots_memorization.plot_ratio_distribution(gs, arms, ax=ax)
    fig.tight_layout()
    assert_readable(fig)
    summary = _arm_table(arms, ("mem", "test_acc"))
    btable = _arm_table(arms, ("auc", "auc_outlier", "bank_test_acc"), seed=1)
    assert_readable(plots_memorization.plot_tradeoff_panels(summary, arms, btable)[0])


# --------------------------------------------------------------------------------------------
# Notebook 03
# --------------------------------------------------------------------------------------------


def test_gradient_norm_figures():
    from test_grads import _fake_results

    from bnmem_utils.jobs import gradnorms as G

    results = _fake_results(bn_noisy=8.0, none_noisy=2.0)
    frame = G.norms_frame(results)
    table = G.median_table(frame)
    for fig, _ in (plots_gradnorm.plot_ecdf(frame, 5, batch_size=128),
                   plots_gradnorm.plot_ratio_curves(table, batch_size=128),
                   plots_gradnorm.plot_versus(G.noisy_vs_all(table), batch_size=128),
                   plots_gradnorm.plot_layers(G.layer_ratio_frame(results, epoch=5),
                                              batch_size=128)):
        assert_readable(fig)


# --------------------------------------------------------------------------------------------
# Notebooks 04, 04b and 06
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def banks(tmp_path_factory):
    from test_bank import CFG, FakeTrainer, fake_data

    from bnmem_utils.jobs import bank as B

    folder = tmp_path_factory.mktemp("banks")
    return [B.train_bank(CFG.replace(norm=n, ood_rate=r), folder, device="cpu",
                         data=fake_data(), progress=False, trainer=FakeTrainer())
            for r in (0.0, 0.05) for n in ("bn", "none")]


@pytest.mark.parametrize("attack", ["lira_online", "lira_online_fixed"])
def test_lira_figures(banks, attack):
    assert_readable(plots_privacy.plot_roc_grid(banks, attack))
    assert_readable(plots_privacy.plot_auc_vs_gap(banks, attack)[0])
    assert_readable(plots_privacy.plot_bank_memorization(banks))


def _curve(sizes, ks, design: str) -> pd.DataFrame:
    """A shadow-count curve's rows (two attacks) with the given shadows a side k per size."""
    cols = {f"{m}{s}": v for m in ("auc", "tpr@1%") for s, v in (("", 0.6), ("_lo", 0.55),
                                                                  ("_hi", 0.65))}
    return pd.DataFrame([{"n_shadows": n, "k": k, "attack": a, **cols, "n": 4, "design": design}
                         for n, k in zip(sizes, ks, strict=True)
                         for a in ("lira_online", "lira_online_fixed")])


def test_shadow_curve_figure_marks_the_rule_where_the_curves_k_reaches_it():
    """The rule's dotted line counts shadows a side k: at N = 64 in pairs (k = N/2), further
    right on a balanced bank, whose fewest shadows a side fall short of N/2 (here k = 28 at
    N = 64); no line where the curve's k does not reach 32."""
    for curve, at, said in ((_curve([16, 32, 64, 126], [8, 16, 32, 63], "pairs"), 64, "N = 64"),
                            (_curve([16, 32, 64, 127], [6, 13, 28, 58], "balanced"),
                             64 + 4 / 30 * 63, "N ≈ 72")):
        fig = plots_privacy.plot_shadow_curve(curve)
        (rule,) = [ln for ln in fig.axes[0].lines if ln.get_linestyle() == ":"]
        assert rule.get_xdata()[0] == pytest.approx(at)
        assert rule.get_label() == f"rule: per-sample from k = 32 a side ({said} here)"
        assert_readable(fig)
    fig = plots_privacy.plot_shadow_curve(_curve([4, 8, 14], [2, 4, 7], "pairs"))
    assert not [ln for ln in fig.axes[0].lines if ln.get_linestyle() == ":"]
    assert_readable(fig)


def test_sample_privacy_figure(banks):
    from test_bank import fake_data

    from bnmem_utils.figures import explore

    df = explore.sample_privacy(banks[2:], 3)
    assert_readable(plots_privacy.plot_sample_privacy(df, fake_data().x[3].numpy(),
                                                      note="a note above the panels"))


def test_confound_figure():
    from test_confound import _frame

    from bnmem_utils.analyses import confound

    frame = _frame({"bn": 0.01, "none": 0.0, "gn": 0.0, "ln": 0.0},
                   knobs=("epochs", "weight_decay"), n=8).assign(train_size=1000)
    rows = pd.concat([confound.compare(frame, "bn", n, n_boot=50, ruler=r)
                      for n in ("none", "gn", "ln") for r in confound.RULERS])
    fig = plots_privacy.plot_confound_study(confound.point_frame(frame), frame, rows)
    assert_readable(fig)
    past = pd.DataFrame([{"norm": n, "fitted_at": 20 * (1 + i % 2), "top": 80,   # real widths
                          **{f"{c}{s}": 0.01 * (i + 1) + d for c in ("gap", "loss_gap",
                                                                     "global_auc", "auc")
                             for s, d in (("", 0.0), ("_lo", -0.01), ("_hi", 0.01))}}
                         for i, n in enumerate(("bn", "none", "gn", "ln"))])
    assert_readable(plots_privacy.plot_past_the_fit(past))


#: The rows with an interval of each claim in the quick profile (digits 8x8), whose one claims
#: figure, before it was drawn per group, was 22.44 inches tall (3301 px).
QUICK_ROWS = {"C1a": 8, "C1b": 8, "T3": 8, "C3e": 3, "C3f": 3, "C2a": 2, "C2b": 2, "C2c": 2,
              "C3a": 2, "C3g": 2, "M3": 2, "C3b": 1, "C3c": 1, "C3d": 1, "T1d": 1, "T2a": 1,
              "T2b": 1, "M1": 1, "M2": 1}
QUICK_HEIGHT_BEFORE = 22.44


def _claim_rows(counts: dict[str, int]) -> list[dict]:
    return [{"id": cid, "key": "gamma_loop_fit_step_twin", "value": 0.1 * k,
             "lo": 0.1 * k - 0.05, "hi": 0.1 * k + 0.05, "primary": k == 0,
             "verdict": ("reproduced", "inconclusive", "not reproduced")[k % 3],
             "setting": "digits 8x8, LeNet, flip 10%, eval-mode gradients" if k else ""}
            for cid, n in counts.items() for k in range(n)]


def test_every_claim_is_in_exactly_one_forest_group():
    from bnmem_utils.analyses.report import CLAIMS

    for claim in CLAIMS:
        owners = [g for g, (_, prefixes) in plotting.CLAIM_GROUPS.items()
                  if claim.id.startswith(prefixes)]
        assert owners == [plotting.claim_group(claim.id)], f"{claim.id} is in {owners}"
    groups = plotting.claim_groups([{"id": c.id} for c in CLAIMS])
    assert list(groups) == ["theory", "memorization", "leakage", "mitigation"]
    assert sorted(r["id"] for g in groups.values() for r in g) == sorted(c.id for c in CLAIMS)
    assert [r["id"] for r in groups["memorization"]] == ["C1a", "C1b", "C2a", "C2b", "C2c"]
    assert [r["id"] for r in groups["mitigation"]] == ["M1", "M2", "M3"]


def test_claims_figures():
    from bnmem_utils.analyses.report import CLAIMS

    groups = plotting.claim_groups(_claim_rows({c.id: 3 for c in CLAIMS}))
    for group, (about, _) in plotting.CLAIM_GROUPS.items():
        fig = plotting.plot_claims(groups[group], title=f"claims of the paper on {about}")
        assert plotting.figure_title(fig) == f"claims of the paper on {about}"
        assert_readable(fig)


def test_a_claims_group_with_nothing_measured_draws_a_small_figure():
    rows = [{"id": "M1", "value": None, "lo": None, "hi": None, "verdict": "missing"}]
    fig = plotting.plot_claims(rows, title="claims of the paper on the mitigation")
    assert fig.get_figheight() <= 1.0 and not fig.axes
    assert "no claim here measured with an interval yet" in [t.get_text() for t in drawn_texts(fig)]
    assert_readable(fig)


def test_each_claims_group_of_a_profile_is_a_third_of_the_one_figure():
    groups = plotting.claim_groups(_claim_rows(QUICK_ROWS))
    heights = {g: plotting.plot_claims(rows).get_figheight() for g, rows in groups.items()}
    plt.close("all")
    assert max(heights.values()) <= QUICK_HEIGHT_BEFORE / 3, heights


def test_a_claims_verdict_line_sits_at_its_bound_in_the_values_sign():
    """M3 (a claimed reduction, sign -1, bound -1 point) draws its line at +1 point on the axis
    of BN's excess over GroupNorm, where the verdict reads it; M2 (sign +1) at -1 point."""
    from bnmem_utils.analyses.report import CLAIMS

    rows = [{"id": cid, "value": v, "lo": v - 0.005, "hi": v + 0.005, "primary": True,
             "verdict": "inconclusive", "setting": "Fashion-MNIST"}
            for cid, v in (("M2", -0.004), ("M3", 0.016))]
    fig = plotting.plot_claims(rows, CLAIMS)
    lines = {ax.get_title(loc="left")[:2]: [ln.get_xdata()[0] for ln in ax.get_lines()
                                            if list(ln.get_xdata()) == [ln.get_xdata()[0]] * 2]
             for ax in fig.axes}
    plt.close(fig)
    assert lines["M2"] == [pytest.approx(-1.0)] and lines["M3"] == [pytest.approx(1.0)], lines
