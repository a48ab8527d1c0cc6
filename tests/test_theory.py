"""bnmem_utils.analyses.theory: the single-channel model, its autograd steps and the gamma loop.

Every check compares two independent computations (autograd against a hand-derived gradient,
a measured step against a first-order formula) and most have a companion that shows the same
comparison fails when it should, so a passing test means something. All float64, CPU, small.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from bnmem_utils.analyses import gamma_loop as gl
from bnmem_utils.analyses import theory as th
from bnmem_utils.figures import explore
from bnmem_utils.figures import theory as plots_theory


def _case(batch_size=8, dim=5, distance=4.0, cos=0.4, seed=0, gamma=1.7, sigma=0.8):
    x, y, w, i = th.outlier_batch(batch_size, dim, distance=distance, cos=cos, seed=seed)
    p = th.ChannelParams(w=th.scale_to_sigma(w, x, sigma), a=0.9, c=0.3, gamma=gamma, beta=-0.2)
    return p, x, y, i


# ---- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", th.MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hand_gradient_matches_autograd(mode, seed):
    p, x, y, i = _case(seed=seed)
    for j in (i, 3):  # the outlier and a clean sample
        measured = th.sgd_step(p, x, y, j, 1e-3, mode).grad_w
        hand = th.hand_margin_gradient(p, x, y, j, mode)
        torch.testing.assert_close(measured, hand, rtol=1e-10, atol=1e-12)


def test_full_and_fixed_gradients_differ():
    """The correction through mu_B and sigma_B is real: the two BN gradients are not equal."""
    p, x, y, i = _case()
    g_fixed = th.hand_margin_gradient(p, x, y, i, "fixed")
    g_full = th.hand_margin_gradient(p, x, y, i, "full")
    assert (g_fixed - g_full).norm() > 0.1 * g_fixed.norm()


def test_full_bn_gradient_is_orthogonal_to_w():
    """BN's output does not change when w is rescaled, so dm/dw has no component along w."""
    p, x, y, i = _case(cos=0.7)
    g = th.hand_margin_gradient(p, x, y, i, "full")
    assert abs(float(g @ p.w)) < 1e-4 * float(g.norm() * p.w.norm())
    assert abs(float(th.hand_margin_gradient(p, x, y, i, "fixed") @ p.w)) > 1e-2


def test_with_margin_sets_the_margin():
    p, x, y, i = _case()
    for mode in th.MODES:
        q = th.with_margin(p, x, y, i, -1.25, mode)
        assert float(y[i] * th.logits(q, x, mode)[i]) == pytest.approx(-1.25, abs=1e-12)


def test_batch_stats_and_scale_to_sigma():
    x, _, w, _ = th.outlier_batch(16, 4, distance=3.0, seed=1)
    w2 = th.scale_to_sigma(w, x, 2.5)
    mu, sigma = th.batch_stats(w2, x)
    z = x @ w2
    assert float(sigma) == pytest.approx(2.5, rel=1e-12)
    assert float(mu) == pytest.approx(float(z.mean()), rel=1e-12)
    assert float(sigma) ** 2 == pytest.approx(float(z.var(unbiased=False)) + 1e-5, rel=1e-12)
    with pytest.raises(ValueError, match="sigma"):
        th.scale_to_sigma(w, x, 1e-4)


def test_outlier_batch_geometry_and_determinism():
    x, y, w, i = th.outlier_batch(10, 6, distance=5.0, cos=0.6, seed=3)
    assert x.shape == (10, 6) and y.shape == (10,) and w.shape == (6,) and i == 0
    assert x.dtype == torch.float64
    assert float(x[i].norm()) == pytest.approx(5.0)
    assert float(x[i] @ w / (x[i].norm() * w.norm())) == pytest.approx(0.6)
    assert set(y.tolist()) <= {-1.0, 1.0}
    x2, *_ = th.outlier_batch(10, 6, distance=5.0, cos=0.6, seed=3)
    x3, *_ = th.outlier_batch(10, 6, distance=5.0, cos=0.6, seed=4)
    assert torch.equal(x, x2) and not torch.equal(x, x3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=1, dim=4, distance=1.0), "batch_size"),
    (dict(batch_size=4, dim=4, distance=1.0, cos=1.5), "cos"),
])
def test_outlier_batch_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        th.outlier_batch(**kwargs)


def test_bad_mode_names_the_choices():
    p, x, y, i = _case()
    with pytest.raises(ValueError, match="unknown mode 'bn'.*none, fixed, full"):
        th.sgd_step(p, x, y, i, 0.1, "bn")
    with pytest.raises(ValueError, match="valid choices: fixed, full"):
        th.measured_ratio(p, x, y, i, 0.1, "none")
    with pytest.raises(ValueError, match="out of range"):
        th.sgd_step(p, x, y, 99, 0.1, "fixed")


# ---- one-step margin growth (claim T1) --------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "fixed"])
def test_affine_modes_are_exact_at_any_eta(mode):
    """Without BN and with frozen statistics the margin is affine in w: first order is exact."""
    p, x, y, i = _case()
    for eta in (1e-4, 0.5):
        measured = th.sgd_step(p, x, y, i, eta, mode).delta
        assert measured == pytest.approx(th.predicted_delta(p, x, y, i, eta, mode), rel=1e-9)


def test_full_bn_error_is_first_order_in_eta():
    p, x, y, i = _case()
    errs = [abs(th.sgd_step(p, x, y, i, eta, "full").delta
                / th.predicted_delta(p, x, y, i, eta, "full") - 1) for eta in (1e-3, 1e-4)]
    assert errs[0] > 1e-6  # there is a second-order remainder ...
    assert errs[0] / errs[1] == pytest.approx(10, rel=0.05)  # ... and it is linear in eta


@pytest.mark.parametrize("gamma, sigma", [(0.5, 2.0), (1.0, 1.0), (3.0, 0.4)])
def test_fixed_ratio_is_gamma_over_sigma_squared(gamma, sigma):
    p, x, y, i = _case(gamma=gamma, sigma=sigma)
    measured = th.measured_ratio(p, x, y, i, 1e-3, "fixed", margin=0.3)
    assert measured == pytest.approx((gamma / sigma) ** 2, rel=1e-8)
    assert th.predicted_ratio(p, x, i, "fixed") == pytest.approx((gamma / sigma) ** 2, rel=1e-5)


def test_ratio_needs_equal_margins():
    """At unequal s_i the ratio is not (gamma/sigma)^2: the matching in measured_ratio matters."""
    p, x, y, i = _case(gamma=2.0, sigma=1.0)
    bn = th.sgd_step(replace(p, c=3.0), x, y, i, 1e-4, "fixed").delta
    none = th.sgd_step(replace(p, c=-3.0), x, y, i, 1e-4, "none").delta
    assert abs(bn / none / 4.0 - 1) > 0.1


def test_full_ratio_matches_exact_formula_not_fixed_one():
    p, x, y, i = _case(batch_size=6, cos=0.6, distance=6.0)
    measured = th.measured_ratio(p, x, y, i, 1e-7, "full")
    assert measured == pytest.approx(th.predicted_ratio(p, x, i, "full"), rel=1e-4)
    assert abs(measured / th.paper_fixed_ratio(p.gamma, 0.8) - 1) > 0.05


def test_paper_full_ratio_is_exact_when_offset_is_orthogonal_to_w():
    """With x_i - xbar orthogonal to w (zhat_i = 0) the correction vanishes."""
    x, y, w, _ = th.outlier_batch(12, 6, distance=5.0, cos=0.0, seed=2)
    x[1:] -= x[1:].mean(0)  # clean samples centred: xbar = x_0 / B, so x_0 - xbar is along x_0
    p = th.ChannelParams(w=th.scale_to_sigma(w, x, 1.3), gamma=0.7)
    assert th.predicted_ratio(p, x, 0, "full") == pytest.approx(th.paper_full_ratio(p, x, 0),
                                                                rel=1e-9)
    assert th.paper_full_ratio(p, x, 0) == pytest.approx((0.7 / 1.3) ** 2 * (11 / 12) ** 2,
                                                         rel=1e-9)


def test_loglog_slope():
    x = np.geomspace(0.1, 10, 7)
    assert th.loglog_slope(x, 3 * x**2) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        th.loglog_slope([1.0, -1.0], [1.0, 1.0])


def test_grid_tables():
    grid = th.ratio_grid([0.25, 1.0, 8.0], sigmas=(0.5, 2.0), batch_size=8, dim=4)
    assert len(grid) == 12 and set(grid["mode"]) == {"fixed", "full"}
    fixed = grid[grid["mode"] == "fixed"]
    assert fixed.rel_error.max() < 1e-8
    assert th.loglog_slope(fixed.gamma_over_sigma, fixed.measured) == pytest.approx(2, abs=1e-6)
    assert grid[grid["mode"] == "full"].rel_error.max() < 1e-3

    sweep = th.eta_sweep([1e-5, 1e-4, 1e-3], batch_size=8, dim=4)
    full = sweep[(sweep["mode"] == "full") & (sweep["quantity"] == "delta")]
    assert th.loglog_slope(full.eta, full.rel_error) == pytest.approx(1.0, abs=0.05)
    fixed = sweep[(sweep["mode"] == "fixed")]
    assert fixed.rel_error.max() < 1e-8

    conv = th.full_bn_convergence([4, 256], [2.0, 8.0], cosines=(0.0, 0.5), dim=16)
    assert len(conv) == 8
    assert conv.exact_rel_error.max() < 1e-3
    orth_big = conv[(conv["cos"] == 0.0) & (conv.batch_size == 256)]
    assert (orth_big.measured_over_paper - 1).abs().max() < 0.01
    aligned_big = conv[(conv["cos"] == 0.5) & (conv.batch_size == 256)]
    assert (aligned_big.measured_over_paper < 0.85).all()  # about 1 - cos^2 = 0.75


# ---- the gamma loop (claim T2) ----------------------------------------------------------------


def _toy(with_outlier=True, seeds=(0, 1, 2)):
    return gl.toy_batches(8, 3, seeds=seeds, outlier_distance=6.0, with_outlier=with_outlier)


def test_toy_batches_shapes_and_outlier():
    b = _toy()
    assert b.x.shape == (3, 9, 3) and b.y.shape == (3, 9) and b.outlier == 0
    assert np.allclose(b.x[:, 0].norm(dim=1).numpy(), 6.0)
    # the outlier's label contradicts the class pattern along e_1
    assert torch.all(torch.sign(b.x[:, 0, 0]) == -b.y[:, 0])
    clean = _toy(with_outlier=False)
    assert clean.outlier is None and torch.equal(clean.x, b.x[:, 1:])
    with pytest.raises(ValueError, match="even"):
        gl.toy_batches(7, 3, seeds=[0])


def test_no_bn_twin_computes_the_same_function():
    b = _toy()
    _, state = gl.train_toy(b, gl.toy_init(b), mode="full", steps=5, lr=0.1)
    twin = gl.to_no_bn(state, b)
    tr_bn, _ = gl.train_toy(b, state, mode="full", steps=0)
    tr_none, _ = gl.train_toy(b, twin, mode="none", steps=0)
    np.testing.assert_allclose(tr_bn.margins, tr_none.margins, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", ["full", "fixed"])
def test_per_sample_gamma_contributions(mode):
    """Autograd's per-sample dL/dgamma parts sum to dL/dgamma and match -(1/B) s y a zhat."""
    b = _toy()
    state = gl.toy_init(b)
    trace, after = gl.train_toy(b, state, mode=mode, steps=1, lr=0.1)
    g = trace.gamma_grads[0]  # (S, B)
    x, y = b.x, b.y
    z = torch.einsum("sbd,sd->sb", x, state.w)
    zhat = (z - z.mean(1, keepdim=True)) / torch.sqrt(z.var(1, unbiased=False, keepdim=True)
                                                        + 1e-5)
    m = y * (state.a[:, None] * (state.gamma[:, None] * zhat + state.beta[:, None])
             + state.c[:, None])
    hand = -(torch.sigmoid(-m) * y * state.a[:, None] * zhat) / b.x.shape[1]
    np.testing.assert_allclose(g, hand.numpy(), rtol=1e-10, atol=1e-14)
    # one GD step moves gamma by -lr * sum of the parts
    np.testing.assert_allclose(after.gamma.numpy(), state.gamma.numpy() - 0.1 * g.sum(1),
                               rtol=1e-12)
    shares = trace.shares()
    np.testing.assert_allclose(shares.sum(-1), 1.0)


def test_train_toy_lowers_loss_and_is_deterministic():
    b = _toy()
    s0 = gl.toy_init(b, init_seed=5)
    t1, _ = gl.train_toy(b, s0, mode="full", steps=30, lr=0.1)
    t2, _ = gl.train_toy(b, s0, mode="full", steps=30, lr=0.1)
    assert np.array_equal(t1.margins, t2.margins)
    assert (t1.loss[-1] < t1.loss[0]).all()
    assert np.allclose(t1.sigma[0], 1.0)  # toy_init sets sigma_B = 1
    t_none, _ = gl.train_toy(b, gl.to_no_bn(s0, b), mode="none", steps=3)
    assert np.isnan(t_none.gamma).all() and not t_none.gamma_grads.any()
    with pytest.raises(ValueError, match="shape"):
        gl.train_toy(_toy(seeds=(0, 1)), s0)


def test_spearman_ci():
    gs = np.array([0.5, 0.8, 1.0, 1.5, 2.0, 3.0])
    fit_bn = np.array([20, 12, 10, 6, 4, 2])
    est = gl._spearman_ci(gs, np.full(6, 10), fit_bn)  # speed-up grows with gamma/sigma
    assert est.mean == pytest.approx(1.0) and est.n == 6
    est = gl._spearman_ci(gs, np.full(6, 10), fit_bn[::-1])
    assert est.mean == pytest.approx(-1.0)
    assert math.isnan(gl._spearman_ci(gs[:3], np.full(3, 10), fit_bn[:3]).mean)


def test_fit_steps():
    m = np.array([[-2.0, -1.0, 0.5], [-1.0, 0.5, 0.6], [0.2, 1.0, 0.7]])  # (T+1, S)
    assert gl.fit_steps(m).tolist() == [2, 1, 0]
    assert gl.fit_steps(-np.ones((4, 2))).tolist() == [4, 4]


def test_gamma_loop_small_run():
    res = gl.gamma_loop(seeds=range(4), n_clean=8, dim=3, warmup=20, steps=15, lr=0.1)
    d = res.per_seed
    assert len(d) == 4 and res.batch_size == 9
    fitting = d.fit_step_bn > 0  # NaN where the outlier is already fitted at the insertion
    assert d.share_fit[fitting].between(0, 1).all() and d.share_fit[~fitting].isna().all()
    assert d.max_clean_share_fit[fitting].between(0, 1).all()
    assert np.allclose(d.gamma_start, res.warmup_bn.gamma[-1])
    assert {"fit_step_twin", "margin_insert_bn", "gs_insert"} <= set(d.columns)
    # the twin computes the BN model's function at the insertion
    np.testing.assert_allclose(res.twin_with.margins[0], res.with_outlier.margins[0], rtol=1e-9,
                               atol=1e-9)
    s = gl.gamma_loop_summary(res)
    assert s["outlier_share"].n == fitting.sum()  # seeds fitted at the insertion are left out
    assert math.isfinite(s["outlier_share"].mean)
    frame = gl.gamma_loop_frame(res)
    assert {"run", "seed", "step", "gamma", "outlier_share"} <= set(frame.columns)
    assert len(frame) == 4 * (21 + 4 * 16)


# ---- explorer, figures ----------------------------------------------------------------


def test_explore_ratio_agrees_with_theory():
    r = th.explore_ratio(gamma=3.0, sigma=0.5, distance=10.0, batch_size=64, eta=1e-6, dim=8)
    assert r["measured_fixed"] == pytest.approx(36.0, rel=1e-4)
    assert r["predicted_fixed"] == pytest.approx(36.0, rel=1e-4)
    assert r["measured_full"] == pytest.approx(r["exact_full"], rel=1e-3)
    assert "measured" in th.format_exploration(r)


def test_ratio_explorer_builds_a_widget():
    pytest.importorskip("ipywidgets")
    ex = explore.ratio_explorer()
    assert set(ex.sliders) == {"gamma", "sigma", "distance", "batch_size", "eta", "cos"}
    # Drawn exactly once on build, with the initial values hit exactly (no snapping: 2.0, not
    # 1.9953), so the readout matches the chart: (2/1)^2 = 4.
    assert ex.draws == 1 and ex.values() == explore.EXPLORER_DEFAULTS
    assert "(gamma/sigma_B)^2 = 4" in ex.readout.value and "measured 4" in ex.readout.value
    assert ex.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    first = ex.image.value
    ex.sliders["gamma"].value = 4.0  # one release, one redraw
    assert ex.draws == 2 and "(gamma/sigma_B)^2 = 16" in ex.readout.value
    assert ex.image.value != first
    for s in ex.sliders.values():
        assert s.continuous_update is False


def test_explorer_chart_uses_points_and_no_minor_labels():
    import matplotlib.ticker as mticker

    r = th.explore_ratio(gamma=2.0, sigma=1.0, distance=8.0, batch_size=32, eta=1e-4)
    ax = plots_theory.plot_exploration(r)
    assert not ax.patches  # no bars: their length on a log axis would mislead
    assert len(ax.lines) == 6  # five points and the reference line at 1
    assert isinstance(ax.xaxis.get_minor_formatter(), mticker.NullFormatter)
    lo, hi = ax.get_xlim()
    assert lo < 1 < hi


def test_show_ratio_exploration_displays_an_image(capsys, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    explore.show_ratio_exploration()
    assert "measured 4" in capsys.readouterr().out
    assert shown and shown[0].data[:4] == b"\x89PNG"


def test_figures_draw_what_they_are_given():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = th.ratio_grid([0.25, 8.0], sigmas=(1.0,), batch_size=8, dim=4)
    ax = plots_theory.plot_ratio_grid(grid)
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    for points, mode in zip(ax.collections, ("fixed", "full"), strict=True):  # one per mode
        part = grid[grid["mode"] == mode]
        np.testing.assert_allclose(points.get_offsets(), part[["gs2", "measured"]].to_numpy())
    assert [t.get_text() for t in ax.get_legend().get_texts()][0] == "identity"

    sweep = th.eta_sweep([1e-5, 1e-3], batch_size=8, dim=4)
    ax = plots_theory.plot_eta_sweep(sweep)
    lines = {line.get_label(): line for line in ax.get_lines()}  # one per mode, and slope 1
    assert set(lines) == {plots_theory.MODE_STYLE[m][0] for m in th.MODES} | {"slope 1"}
    delta = sweep[(sweep["quantity"] == "delta") & (sweep["mode"] == "full")]
    np.testing.assert_allclose(lines[plots_theory.MODE_STYLE["full"][0]].get_ydata(),
                               delta["rel_error"])

    conv = th.full_bn_convergence([8, 64], [2.0, 4.0], cosines=(0.0, 0.3), dim=8)
    axes = plots_theory.plot_full_bn_convergence(conv)
    assert [a.get_title() for a in axes] == ["outlier offset at cos = 0 to w",
                                             "outlier offset at cos = 0.3 to w"]
    measured = [line for line in axes[1].get_lines() if line.get_label() == "r = 4"][0]
    part = conv[(conv["cos"] == 0.3) & (conv["distance"] == 4.0)].sort_values("batch_size")
    np.testing.assert_allclose(measured.get_ydata(), part["measured_over_gs2"])

    res = gl.gamma_loop(seeds=range(3), n_clean=8, dim=3, warmup=5, steps=5)
    axes = plots_theory.plot_gamma_loop(res)
    assert len(axes) == 4 and axes[3].get_title() == "memorization of the outlier"
    outlier = [line for line in axes[2].get_lines() if line.get_label() == "outlier"][0]
    k = plots_theory.typical_seed_index(res)
    np.testing.assert_allclose(outlier.get_ydata(),
                               res.with_outlier.shares()[:, k][:, res.with_outlier.outlier])
    plt.close("all")
