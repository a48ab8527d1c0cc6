"""Tests of the gamma/sigma penalty (bnmem_utils.training.penalty: value, gradient, lam=0 exactness)
and of notebook 05's sweep (bnmem_utils.analyses.mitigation)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from bnmem_utils.analyses.mitigation import (
    BASELINE,
    arm_label,
    arm_summary,
    bank_arms,
    bank_table,
    choose_lambda,
    gamma_sigma_with_arms,
    history_with_arms,
    result_records,
    runs_table,
    sweep_arms,
    sweep_configs,
    train_arm_banks,
)
from bnmem_utils.figures import memorization as plots_memorization
from bnmem_utils.jobs.config import (
    CorruptionConfig,
    DataConfig,
    PenaltyConfig,
    RunConfig,
    TrainConfig,
)
from bnmem_utils.models.gamma_sigma import bn_layers, gamma_sigma_stats
from bnmem_utils.training.penalty import GammaSigmaPenalty, batch_sigma, from_config


def small_bn_net(seed: int = 0, gamma: float = 1.0) -> nn.Sequential:
    """conv-BN-relu-conv-BN-relu-pool-linear, with every gamma set to ``gamma``."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3), nn.BatchNorm1d(3),
    )
    for _, m in bn_layers(net):
        nn.init.constant_(m.weight, gamma)
    return net


def batch(seed: int = 1, n: int = 16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_batch_sigma_is_what_bn_divides_by():
    bn = nn.BatchNorm2d(5).train()
    nn.init.uniform_(bn.weight, 0.5, 2.0)
    x = torch.randn(7, 5, 4, 4) * 3 + 1
    sigma = batch_sigma(bn, x)                                   # (5,)
    mu = x.mean(dim=(0, 2, 3))
    manual = bn.weight[None, :, None, None] * (x - mu[None, :, None, None]) / sigma[None, :, None, None] \
        + bn.bias[None, :, None, None]
    torch.testing.assert_close(bn(x), manual, rtol=1e-5, atol=1e-5)


def test_penalty_value_matches_manual_square_and_hinge():
    net = small_bn_net(gamma=1.5).train()
    x, _ = batch()
    captured = []
    hooks = [m.register_forward_hook(lambda m, i, o: captured.append((m, i[0]))) for _, m in bn_layers(net)]
    for form, tau in (("square", 1.0), ("hinge", 1.0), ("hinge", 3.0)):
        captured.clear()
        reg = GammaSigmaPenalty(0.3, form=form, tau=tau).attach(net)
        net(x)
        value = reg(net)
        r = torch.cat([m.weight.abs() / torch.sqrt(inp.var(dim=[d for d in range(inp.dim()) if d != 1],
                                                            unbiased=False) + m.eps)
                       for m, inp in captured])
        terms = r**2 if form == "square" else torch.relu(r - tau) ** 2
        torch.testing.assert_close(value, 0.3 * terms.mean())
        assert value.item() > 0
        reg.detach()
    for h in hooks:
        h.remove()


def test_sum_reduction_scales_with_channel_count():
    net = small_bn_net().train()
    x, _ = batch()
    mean_reg = GammaSigmaPenalty(1.0, reduction="mean").attach(net)
    net(x)
    m = mean_reg(net)
    mean_reg.detach()
    sum_reg = GammaSigmaPenalty(1.0, reduction="sum").attach(net)
    net(x)
    s = sum_reg(net)
    torch.testing.assert_close(s, m * (4 + 6 + 3))


@pytest.mark.parametrize("form", ["square", "hinge"])
def test_gradient_steps_on_penalty_lower_the_ratio(form):
    net = small_bn_net(gamma=2.5).train()
    x, _ = batch(n=32)
    reg = GammaSigmaPenalty(1.0, form=form, tau=1.0).attach(net)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def ratios():
        net(x)
        r = torch.cat(reg.ratios()).detach()                     # (13,)
        reg(net)                                                 # consume the capture
        return r

    before = ratios()
    assert (before > 1).all()
    values = []
    for _ in range(10):
        opt.zero_grad()
        net(x)
        value = reg(net)
        value.backward()
        opt.step()
        values.append(value.item())
    after = ratios()
    assert all(b < a for a, b in zip(values, values[1:], strict=False))   # the penalty falls every step
    assert after.mean() < 0.9 * before.mean()
    assert after.max() < before.max()


def test_hinge_with_fixed_sigma_brings_gamma_down_to_tau():
    # one conv + BN: with sigma treated as a constant only gamma moves, and the hinge stops at tau
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 5, 3), nn.BatchNorm2d(5)).train()
    nn.init.constant_(net[1].weight, 3.0)
    x, _ = batch()
    reg = GammaSigmaPenalty(1.0, form="hinge", tau=1.5, through_sigma=False).attach(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        net(x)
        reg(net).backward()
        opt.step()
    assert net[0].weight.grad is None                            # nothing flowed through sigma
    net(x)
    r = reg.ratios()[0].detach()
    torch.testing.assert_close(r, torch.full_like(r, 1.5), atol=1e-3, rtol=0)


def test_hinge_ignores_channels_below_tau():
    net = small_bn_net(gamma=0.2).train()
    x, _ = batch()
    reg = GammaSigmaPenalty(1.0, form="hinge", tau=100.0).attach(net)
    net(x)
    value = reg(net)
    assert value.item() == 0.0
    value.backward()
    assert all(p.grad is None or torch.all(p.grad == 0) for p in net.parameters())


def test_gradient_flows_through_sigma_unless_detached():
    x, _ = batch()
    grads = {}
    for through in (True, False):
        net = small_bn_net(gamma=2.0).train()
        reg = GammaSigmaPenalty(1.0, through_sigma=through).attach(net)
        net(x)
        reg(net).backward()
        grads[through] = (net[0].weight.grad, net[1].weight.grad)
    conv_through, gamma_through = grads[True]
    conv_const, gamma_const = grads[False]
    assert conv_through is not None and conv_through.abs().sum() > 0
    assert conv_const is None or conv_const.abs().sum() == 0
    assert gamma_through.abs().sum() > 0 and gamma_const.abs().sum() > 0
    # growing the filter raises sigma, so the gradient w.r.t. the filter points along the filter
    # (descending it grows ||w||): <grad, w> < 0
    net = small_bn_net(gamma=2.0).train()
    assert torch.sum(conv_through * net[0].weight) < 0


def _train(net, reg, steps=8, seed=0):
    torch.manual_seed(seed)
    x, y = batch(n=64)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    if reg is not None:
        reg.attach(net)
    losses = []
    for _ in range(steps):
        idx = torch.randperm(64)[:16]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
        if reg is not None:
            loss = loss + reg(net)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        net.eval()
        with torch.no_grad():
            net(x)                                               # an eval pass in between
        net.train()
    return losses, {k: v.clone() for k, v in net.state_dict().items()}


def test_lam_zero_reproduces_plain_training_exactly_manual_loop():
    l0, s0 = _train(small_bn_net(), None)
    l1, s1 = _train(small_bn_net(), GammaSigmaPenalty(0.0, form="hinge"))
    l2, _ = _train(small_bn_net(), GammaSigmaPenalty(0.1))
    assert l0 == l1
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k
    assert l2 != l0                                              # and a non-zero lam does change it


def test_lam_zero_reproduces_train_model_exactly():
    from bnmem_utils.training import loop as train

    x, y = batch(n=96)
    groups = {"all": torch.ones(96, dtype=torch.bool)}
    cfg = train.TrainConfig(epochs=2, batch_size=32, augment=False)
    runs = []
    for reg in (None, GammaSigmaPenalty(0.0), GammaSigmaPenalty(0.5)):
        net = small_bn_net()
        hist = train.train_model(net, x, y, config=cfg, seed=3, groups=groups, regularizer=reg,
                                 device="cpu")
        runs.append((hist.as_frame(), net.state_dict()))
    (f0, s0), (f1, s1), (f2, s2) = runs
    # a regularized run also records the epoch mean of the penalty, reg_loss: 0 at lam = 0
    assert (f1.pop("reg_loss") == 0).all() and (f2.pop("reg_loss") > 0).all()
    pd.testing.assert_frame_equal(f0, f1)
    assert not f0.equals(f2)
    assert all(torch.equal(s0[k], s1[k]) for k in s0)
    assert not all(torch.equal(s0[k], s2[k]) for k in s0)


def test_eval_forward_does_not_capture_and_missing_capture_is_an_error():
    net = small_bn_net().train()
    x, _ = batch()
    reg = GammaSigmaPenalty(0.1).attach(net)
    net.eval()
    net(x)
    with pytest.raises(RuntimeError, match="train-mode forward"):
        reg(net)
    net.train()
    net(x)
    reg(net)
    with pytest.raises(RuntimeError, match="train-mode forward"):
        reg(net)                                                 # consumed: needs a new forward


def test_attach_detach_and_misuse():
    net, other = small_bn_net(), small_bn_net(1)
    reg = GammaSigmaPenalty(0.1)
    with pytest.raises(RuntimeError, match="not attached"):
        reg(net)
    reg.attach(net)
    assert reg.attach(net) is reg                                # idempotent on the same model
    with pytest.raises(RuntimeError, match="another model"):
        reg.attach(other)
    with pytest.raises(RuntimeError, match="different model"):
        reg(other)
    n_hooks = sum(len(m._forward_hooks) for m in net.modules())
    assert n_hooks == 3
    reg.detach()
    reg.detach()
    assert sum(len(m._forward_hooks) for m in net.modules()) == 0
    reg.attach(other)
    with pytest.raises(ValueError, match="no BatchNorm"):
        GammaSigmaPenalty(0.1).attach(nn.Sequential(nn.Linear(3, 3)))


@pytest.mark.parametrize("kwargs, match", [
    ({"lam": -1.0}, "lam must be"),
    ({"lam": float("nan")}, "lam must be"),
    ({"lam": 0.1, "form": "cube"}, "unknown gamma/sigma penalty form 'cube'; valid choices: square, hinge"),
    ({"lam": 0.1, "tau": -0.5}, "tau must be"),
    ({"lam": 0.1, "reduction": "max"}, "unknown reduction 'max'"),
])
def test_bad_parameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GammaSigmaPenalty(**kwargs)


def test_from_spec_round_trip_and_errors():
    assert from_config(None) is None and from_config({}) is None
    reg = from_config({"kind": "gamma_sigma", "lam": 0.01, "form": "hinge", "tau": 2.0})
    assert (reg.lam, reg.form, reg.tau) == (0.01, "hinge", 2.0)
    reg = from_config(PenaltyConfig(0.01, "hinge", 2.0, reduction="sum", through_sigma=False))
    assert (reg.lam, reg.form, reg.tau, reg.reduction, reg.through_sigma) == (0.01, "hinge", 2.0,
                                                                              "sum", False)
    with pytest.raises(ValueError, match="unknown penalty kind 'l2'"):
        from_config({"kind": "l2", "lam": 1})
    with pytest.raises(ValueError, match="unknown penalty option"):
        from_config({"kind": "gamma_sigma", "lam": 1, "beta": 2})
    with pytest.raises(ValueError, match="needs 'lam'"):
        from_config({"kind": "gamma_sigma"})


def test_sweep_arms_and_labels():
    arms = sweep_arms([0, 0.01, 0.1], hinge_lams=[0.1, 1.0], hinge_taus=[1.0])
    assert list(arms) == [BASELINE, "BN square lam=0.01", "BN square lam=0.1",
                          "BN hinge lam=0.1 tau=1", "BN hinge lam=1 tau=1",
                          "no norm", "GroupNorm", "LayerNorm"]
    assert arms[BASELINE] == ("bn", None) and arms["GroupNorm"] == ("gn", None)
    assert all(from_config(spec) is not None for norm, spec in arms.values() if spec)
    assert arm_label("bn", {"kind": "gamma_sigma", "lam": 0.0}) == BASELINE
    with pytest.raises(ValueError, match="lam must be"):
        sweep_arms([-1.0])
    with pytest.raises(ValueError, match="alternatives to BN"):
        sweep_arms([0.1], ref_norms=["bn"])


def test_gamma_sigma_of_a_fresh_bn_net_is_gamma():
    net = small_bn_net(gamma=2.0).eval()
    df = gamma_sigma_stats(net)
    assert len(df) == 4 + 6 + 3
    assert {"layer", "channel", "gamma", "running_sigma", "ratio"} <= set(df.columns)
    # fresh BN: running_var = 1, so ratio = gamma / sqrt(1 + eps)
    np.testing.assert_allclose(df["ratio"], 2.0 / np.sqrt(1 + 1e-5), rtol=1e-5)


def _sweep(mem_shift, acc_shift, seeds=6, noise=0.004):
    rng = np.random.default_rng(0)
    rows = []
    for s in range(seeds):
        base_mem, base_acc = 0.8 + rng.normal(0, 0.05), 0.95 + rng.normal(0, 0.01)
        rows.append({"arm": BASELINE, "seed": s, "mem": base_mem, "test_acc": base_acc})
        for arm, (dm, da) in {"small": (mem_shift[0], acc_shift[0]),
                              "large": (mem_shift[1], acc_shift[1])}.items():
            rows.append({"arm": arm, "seed": s, "mem": base_mem + dm + rng.normal(0, noise),
                         "test_acc": base_acc + da + rng.normal(0, noise)})
    return pd.DataFrame(rows)


def test_choose_lambda_picks_largest_drop_within_tolerance():
    # large cuts memorization more but costs 5 points of accuracy: small is chosen
    table = choose_lambda(_sweep((-0.2, -0.5), (0.0, -0.05)))
    assert list(table["arm"]) == [BASELINE, "small", "large"]
    assert table.set_index("arm").loc["small", "chosen"]
    assert not table.set_index("arm").loc["large", "acceptable"]
    # both free: the larger drop wins
    table = choose_lambda(_sweep((-0.2, -0.5), (0.0, 0.0)))
    assert table.set_index("arm").loc["large", "chosen"]


def test_choose_lambda_falls_back_to_baseline():
    table = choose_lambda(_sweep((0.05, 0.1), (0.0, 0.0)))        # memorization does not drop
    assert table.iloc[0]["chosen"] and table["chosen"].sum() == 1
    table = choose_lambda(_sweep((-0.3, -0.5), (-0.05, -0.1)))
    assert table.iloc[0]["chosen"]                                 # the drops cost accuracy
    assert not table["acceptable"].iloc[1:].any()
    with pytest.raises(ValueError, match="baseline arm"):
        choose_lambda(_sweep((0, 0), (0, 0)), baseline="none")


# ---------------------------------------------------------------------------------------------
# Notebook 05's pipeline on a tiny real sweep (digits, 120 samples, 2 epochs: a few seconds)


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    from bnmem_utils.jobs import grid as ex

    torch.set_num_threads(1)
    arms = sweep_arms([0.0, 1.0], ref_norms=["none"])
    configs = sweep_configs(arms, [0, 1], RunConfig(
        data=DataConfig("digits", train_size=120, test_size=60),
        corruption=CorruptionConfig(flip_rate=0.1), train=TrainConfig(epochs=2, augment=False)))
    cache = tmp_path_factory.mktemp("cache")
    results = ex.run_grid(configs, "cpu", cache, progress=False)
    return arms, configs, results, cache


def test_sweep_specs_carry_the_penalty(tiny_sweep):
    arms, configs, results, _ = tiny_sweep
    assert len(configs) == 3 * 2 and [s.seed for s in configs] == [0, 0, 0, 1, 1, 1]
    assert configs[1].penalty == PenaltyConfig(1.0, "square")
    # the penalty reached training: the regularized run records reg_loss > 0, the others none
    assert (results[1].history["reg_loss"] > 0).all()
    assert "reg_loss" not in results[0].history and "reg_loss" not in results[2].history


def test_runs_table_and_summary(tiny_sweep):
    arms, _, results, _ = tiny_sweep
    runs = runs_table(results)
    assert list(runs["arm"]) == [BASELINE, "BN square lam=1", "no norm"] * 2
    assert runs["mem"].between(0, 1).all() and runs["test_acc"].between(0, 1).all()
    gs = results[1].gamma_sigma                           # one row per BN channel of the run
    assert runs.loc[1, ["gs_median", "gs_batch_median", "gs_frac_above_1"]].tolist() == \
        pytest.approx([gs["ratio"].median(), gs["batch_ratio"].median(), (gs["ratio"] > 1).mean()])
    assert runs.loc[runs["norm"] == "bn", "gs_median"].notna().all()
    assert runs.loc[runs["norm"] == "none", "gs_median"].isna().all()
    summary = arm_summary(runs)
    assert list(summary["arm"]) == list(arms) and (summary["n"] == 2).all()
    row = summary.set_index("arm").loc[BASELINE]
    assert row["mem_lo"] <= row["mem"] <= row["mem_hi"]
    hist = history_with_arms(results)
    assert set(hist["arm"]) == set(arms) and hist["epoch"].max() == 2
    gs = gamma_sigma_with_arms(results)
    assert set(gs["arm"]) == {BASELINE, "BN square lam=1"}
    table = choose_lambda(runs[runs["norm"] == "bn"])
    config = RunConfig.grid(dataset="digits", arch="lenet", flip_rate=0.1)
    records = {r.key: v for r, v, _ in result_records(summary, table, config)}
    where = "digits_lenet_flip10"
    assert {f"mit_mem_{where}_lam0", f"mit_acc_{where}_lam0", f"mit_mem_{where}_chosen",
            f"mit_chosen_{where}", f"mit_mem_bn_square_lam1_{where}",
            f"mit_test_acc_no_norm_{where}"} <= set(records)
    plain = records[f"mit_mem_{where}_lam0"]            # plain BN over the seeds, as summarised
    assert (plain.mean, plain.lo, plain.hi, plain.n) == pytest.approx(
        (row["mem"], row["mem_lo"], row["mem_hi"], 2))
    assert 0 <= records[f"mit_gs_frac_above_1_bn_square_lam1_{where}"].mean <= 1
    # No penalty qualifies: plain BN minus itself must not pass the accuracy claim vacuously.
    kept = table.assign(chosen=table["arm"] == BASELINE)
    records = {r.key: v for r, v, _ in result_records(summary, kept, config)}
    assert records[f"mit_chosen_{where}"] == BASELINE
    assert records[f"mit_d_mem_{where}_chosen"] is None
    assert records[f"mit_d_acc_{where}_chosen"] is None


def test_figures_draw(tiny_sweep):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, _, results, _ = tiny_sweep
    summary = arm_summary(runs_table(results))
    fig, axes = plt.subplots(1, 3)
    plots_memorization.plot_tradeoff(summary, arms, ax=axes[0])
    _, data = plots_memorization.plot_arm_curves(history_with_arms(results), arms, ax=axes[1])
    assert set(data["arm"]) == set(arms) and len(data) == 3 * 2
    plots_memorization.plot_ratio_distribution(gamma_sigma_with_arms(results), arms, ax=axes[2])
    assert len(axes[0].lines) >= 1
    plt.close(fig)


def test_tradeoff_names_each_arm_in_its_legend_and_writes_nothing_on_the_points():
    """Arms at one point (the hinge sweep often sits at one accuracy): no label is written on
    the points; the legend names each arm, lambda and tau as letters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = {f"BN hinge lam={lam} tau=1": ("bn", PenaltyConfig(lam, form="hinge"))
            for lam in (0.03, 0.1, 0.3, 1)}
    summary = pd.DataFrame([{"arm": a, "mem": 0.1 + 0.002 * i, "test_acc": 0.8, "mem_lo": 0.09,
                             "mem_hi": 0.11, "test_acc_lo": 0.79, "test_acc_hi": 0.81}
                            for i, a in enumerate(arms)])
    fig, ax = plt.subplots(figsize=(4, 3))
    plots_memorization.plot_tradeoff(summary, arms, ax=ax)
    assert len(ax.texts) == 0
    assert ax.get_legend_handles_labels()[1][0] == "BN hinge \u03bb=0.03 \u03c4=1"
    plt.close(fig)


def test_bank_with_penalty(tiny_sweep, tmp_path):
    arms, _, _, _ = tiny_sweep
    penalty = arms["BN square lam=1"][1]
    base = RunConfig.bank(dataset="digits", arch="lenet", norm="bn", n_models=4, flip_rate=0.1,
                          train_size=80, test_size=40, epochs=1, augment=False,
                          queries=("identity",))
    assert base.replace(penalty=penalty).key() not in (
        base.key(), base.replace(penalty=PenaltyConfig(0.5)).key())
    banks = train_arm_banks({BASELINE: base, "BN square lam=1": base.replace(penalty=penalty)},
                            tmp_path, device="cpu", progress=False)
    a, b = banks[BASELINE], banks["BN square lam=1"]
    assert b.config.penalty == penalty and a.config.penalty is None
    assert a.folder != b.folder and np.array_equal(a.keep, b.keep)
    assert not np.allclose(a.scores, b.scores)                  # the penalty changed the models
    table = bank_table(banks)
    assert list(table["arm"]) == [BASELINE, "BN square lam=1"]
    assert table["auc"].between(0, 1).all() and "auc_outlier" in table
    # read back from the cache: nothing retrained
    again = train_arm_banks({"BN square lam=1": base.replace(penalty=penalty)}, tmp_path,
                            device="cpu", progress=False)
    assert again["BN square lam=1"].trained == 0
    np.testing.assert_array_equal(again["BN square lam=1"].scores, b.scores)


def test_bank_arms_are_baseline_listed_lams_chosen_and_references():
    arms = sweep_arms([0.1, 1.0, 3.0], hinge_lams=[1.0], hinge_taus=[1.0])
    chosen = "BN hinge lam=1 tau=1"
    assert list(bank_arms(arms, chosen, [1.0])) == [BASELINE, "BN square lam=1", chosen,
                                                    "no norm", "GroupNorm", "LayerNorm"]
