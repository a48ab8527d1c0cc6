"""Per-sample gradient norms: both definitions against the naive loop (one backward per sample),
for every norm kind, on hand-built small models and on every model of the zoo."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bnmem_utils.core.results import ResultsFile
from bnmem_utils.figures import gradnorms as plots_gradnorm
from bnmem_utils.jobs import gradnorms as G
from bnmem_utils.jobs.config import (
    CorruptionConfig,
    DataConfig,
    GradNormMeasure,
    RunConfig,
    TrainConfig,
)
from bnmem_utils.training import per_sample as PS

RTOL = 1e-5


def _norm_layer(kind: str, channels: int, dim: int = 2) -> nn.Module:
    if kind == "bn":
        return nn.BatchNorm2d(channels) if dim == 2 else nn.BatchNorm1d(channels)
    if kind == "gn":
        return nn.GroupNorm(2, channels)
    if kind == "ln":
        return nn.GroupNorm(1, channels) if dim == 2 else nn.LayerNorm(channels)
    return nn.Identity()


def small_cnn(kind: str) -> nn.Module:
    """conv-norm-relu-pool, linear-norm-relu, linear: both BN2d and BN1d when kind is 'bn'."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), _norm_layer(kind, 4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 8), _norm_layer(kind, 8, dim=1), nn.ReLU(),
        nn.Linear(8, 3))
    if kind == "bn":  # non-trivial running statistics and affine parameters
        model.train()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(32, 1, 8, 8) * 1.5 + 0.3)
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
    return model


def _data(n: int = 10, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def assert_close(a: PS.GradNorms, b: PS.GradNorms, rtol: float = RTOL) -> None:
    assert a.layers.keys() == b.layers.keys()
    assert torch.allclose(a.total, b.total, rtol=rtol, atol=0), (a.total, b.total)
    for name in a.layers:
        # A layer whose gradient is exactly zero (a conv bias before BN) compares absolutely.
        assert torch.allclose(a.layers[name], b.layers[name], rtol=rtol, atol=1e-10), name


@pytest.mark.parametrize("kind", ["bn", "gn", "ln", "none"])
@pytest.mark.parametrize("definition", PS.DEFINITIONS)
def test_fast_matches_naive_loop(kind, definition):
    model = small_cnn(kind)
    x, y = _data(11)
    kw = {"batch_size": 4, "shuffle_seed": 3} if definition == "train" else {}
    fast = PS.per_sample_grad_norms(model, x, y, definition=definition, chunk_size=3, **kw)
    naive = PS.naive_grad_norms(model, x, y, definition=definition, **kw)
    assert fast.total.dtype == torch.float64 and fast.total.shape == (11,)
    assert (fast.total > 0).all()
    assert_close(fast, naive)


@pytest.mark.parametrize("kind", ["gn", "ln", "none"])
def test_definitions_coincide_without_bn(kind):
    model = small_cnn(kind)
    x, y = _data(9)
    assert PS.which_definitions(model) == ("eval",)
    ev = PS.per_sample_grad_norms(model, x, y, definition="eval")
    tr = PS.per_sample_grad_norms(model, x, y, definition="train", batch_size=4, shuffle_seed=0)
    assert torch.allclose(ev.total, tr.total, rtol=RTOL, atol=0)
    for name in ev.layers:
        assert torch.allclose(ev.layers[name], tr.layers[name], rtol=RTOL, atol=1e-10)


def test_definitions_differ_with_bn():
    model = small_cnn("bn")
    x, y = _data(8)
    assert PS.which_definitions(model) == ("eval", "train")
    ev = PS.per_sample_grad_norms(model, x, y, definition="eval")
    tr = PS.per_sample_grad_norms(model, x, y, definition="train", batch_size=4)
    assert ((ev.total - tr.total).abs() / ev.total).max() > 1e-2


def test_train_definition_depends_on_the_batch():
    """The coupling is real: the same sample gets another gradient in another batch."""
    model = small_cnn("bn")
    x, y = _data(8)
    a = PS.per_sample_grad_norms(model, x, y, definition="train", batch_size=4, shuffle_seed=0)
    b = PS.per_sample_grad_norms(model, x, y, definition="train", batch_size=4, shuffle_seed=1)
    whole = PS.per_sample_grad_norms(model, x, y, definition="train")
    assert not torch.allclose(a.total, b.total, rtol=1e-3)
    assert not torch.allclose(a.total, whole.total, rtol=1e-3)


def test_plain_vmap_grad_in_train_mode_is_another_network():
    """What the module never does: vmap(grad) over a train-mode BN model normalises each sample
    by itself, which gives other numbers than row i of the batch Jacobian."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    # BN without running statistics normalises with batch statistics in any mode.
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4, track_running_stats=False),
                        nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3))
    x, y = _data(6)
    params = {k: v.detach() for k, v in net.named_parameters()}

    def loss_one(p, xi, yi):
        out = functional_call(net, p, (xi.unsqueeze(0),))  # a "batch" of one: its own statistics
        return PS.cross_entropy_per_sample(out, yi.unsqueeze(0)).sum()

    wrong = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    wrong_total = torch.stack([g.flatten(1).double().square().sum(1) for g in wrong.values()]).sum(0).sqrt()
    right = PS.per_sample_grad_norms(net, x, y, definition="train")
    assert_close(right, PS.naive_grad_norms(net, x, y, definition="train"))
    assert not torch.allclose(wrong_total, right.total, rtol=1e-2)


@pytest.mark.parametrize("definition", PS.DEFINITIONS)
@pytest.mark.parametrize("start_mode", [True, False])
def test_model_left_unchanged(definition, start_mode):
    model = small_cnn("bn")
    model.train(start_mode)
    model[7].train(not start_mode)  # a mixed state is restored as it was
    flags = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = _data(8)
    PS.per_sample_grad_norms(model, x, y, definition=definition, batch_size=4)
    PS.naive_grad_norms(model, x, y, definition=definition, batch_size=4)
    assert [m.training for m in model.modules()] == flags
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k  # running statistics and num_batches_tracked too
    assert all(p.grad is None for p in model.parameters())


def test_chunk_size_and_order_do_not_matter():
    model = small_cnn("bn")
    x, y = _data(10)
    ref = PS.per_sample_grad_norms(model, x, y, chunk_size=1)
    for cs in (4, 10, None):
        assert torch.allclose(PS.per_sample_grad_norms(model, x, y, chunk_size=cs).total, ref.total,
                              rtol=RTOL)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    permuted = PS.per_sample_grad_norms(model, x[perm], y[perm])
    assert torch.allclose(permuted.total, ref.total[perm], rtol=RTOL)
    tr = PS.per_sample_grad_norms(model, x, y, definition="train", batch_size=5, chunk_size=2)
    tr_all = PS.per_sample_grad_norms(model, x, y, definition="train", batch_size=5)
    assert torch.allclose(tr.total, tr_all.total, rtol=RTOL)


def test_layers_add_up_to_total():
    model = small_cnn("gn")
    x, y = _data(5)
    res = PS.per_sample_grad_norms(model, x, y)
    assert list(res.layers) == ["0", "1", "5", "6", "8"]  # modules owning parameters, in order
    summed = torch.stack([v**2 for v in res.layers.values()]).sum(0).sqrt()
    assert torch.allclose(summed, res.total, rtol=1e-12)
    assert "running" in PS.definition_label("eval")


def test_frozen_parameters_are_left_out():
    model = small_cnn("none")
    model[0].weight.requires_grad_(False)
    x, y = _data(4)
    res = PS.per_sample_grad_norms(model, x, y)
    assert_close(res, PS.naive_grad_norms(model, x, y))
    full = PS.per_sample_grad_norms(small_cnn("none"), x, y)
    assert (res.layers["0"] < full.layers["0"]).all()  # only the bias of layer 0 is left


def test_bad_input():
    model = small_cnn("bn")
    x, y = _data(4)
    with pytest.raises(ValueError, match="unknown definition 'batch'.*eval, train"):
        PS.per_sample_grad_norms(model, x, y, definition="batch")
    with pytest.raises(ValueError, match="4 samples but y has 3"):
        PS.per_sample_grad_norms(model, x, y[:3])
    with pytest.raises(ValueError, match="at least 2"):
        PS.per_sample_grad_norms(model, x, y, definition="train", batch_size=1)
    with pytest.raises(ValueError, match="chunk_size"):
        PS.per_sample_grad_norms(model, x, y, chunk_size=0)
    no_stats = nn.Sequential(nn.Flatten(), nn.Linear(64, 4), nn.BatchNorm1d(4, track_running_stats=False))
    with pytest.raises(ValueError, match="no running statistics"):
        PS.per_sample_grad_norms(no_stats, x, y)
    res = PS.per_sample_grad_norms(no_stats, x, y, definition="train")  # that one exists
    assert_close(res, PS.naive_grad_norms(no_stats, x, y, definition="train"))


# --- the model zoo ------------------------------------------------------------------------------

def _zoo_cases():
    from bnmem_utils.models.nets import ARCHS, NORMS

    return [(a, n) for a in ARCHS for n in NORMS]


@pytest.mark.parametrize("arch,norm", _zoo_cases())
def test_zoo_fast_matches_naive(arch, norm):
    """Every architecture x norm, both definitions, in float64 so that the comparison tests the
    algorithm rather than float32 rounding in deep nets (float32 agrees to ~1e-7 on LeNet and
    to ~5e-5 on ResNet-18 with GroupNorm)."""
    from bnmem_utils.models.nets import build_model

    torch.manual_seed(0)
    model = build_model(arch, norm, in_channels=1, num_classes=5, image_size=8).double()
    x = torch.randn(6, 1, 8, 8, dtype=torch.float64)
    y = torch.arange(6) % 5
    assert PS.which_definitions(model) == (PS.DEFINITIONS if norm == "bn" else ("eval",))
    for definition in PS.DEFINITIONS if norm == "bn" else ("eval",):
        fast = PS.per_sample_grad_norms(model, x, y, definition=definition, batch_size=3)
        naive = PS.naive_grad_norms(model, x, y, definition=definition, batch_size=3)
        assert_close(fast, naive, rtol=1e-9)
    if norm == "bn":
        assert fast.layers.keys() == {n.rsplit(".", 1)[0] for n, _ in model.named_parameters()}


@pytest.mark.parametrize("arch", ["resnet20", "densenet"])
def test_a_channels_last_model_has_the_same_norms(arch):
    """The wide networks train channels-last on a CPU (``nets.trains_channels_last``); their
    per-sample gradient norms are measured on the model in that layout, and match NCHW's."""
    from bnmem_utils.models.nets import build_model

    torch.manual_seed(0)
    model = build_model(arch, "bn", in_channels=1, num_classes=5, image_size=8).double()
    x = torch.randn(6, 1, 8, 8, dtype=torch.float64)
    y = torch.arange(6) % 5
    plain = {d: PS.per_sample_grad_norms(model, x, y, definition=d, batch_size=3)
             for d in PS.DEFINITIONS}
    model.to(memory_format=torch.channels_last)
    for definition, expected in plain.items():
        assert_close(PS.per_sample_grad_norms(model, x, y, definition=definition, batch_size=3),
                     expected, rtol=1e-9)


@pytest.mark.parametrize("definition", PS.DEFINITIONS)
def test_index_measures_a_subset_with_full_batches(definition):
    """Measuring some samples gives exactly their rows of the full result: under "train" the
    other samples still fill the BN batches."""
    model = small_cnn("bn")
    x, y = _data(12)
    kw = {"batch_size": 5, "shuffle_seed": 2} if definition == "train" else {}
    full = PS.per_sample_grad_norms(model, x, y, definition=definition, **kw)
    index = torch.tensor([7, 0, 11, 3])
    part = PS.per_sample_grad_norms(model, x, y, definition=definition, index=index, chunk_size=2, **kw)
    assert torch.allclose(part.total, full.total[index], rtol=1e-6)
    for name in part.layers:
        assert torch.allclose(part.layers[name], full.layers[name][index], rtol=1e-6, atol=1e-10)
    assert_close(part, PS.naive_grad_norms(model, x, y, definition=definition, index=index, **kw))
    mask = torch.zeros(12, dtype=torch.bool)
    mask[index] = True
    by_mask = PS.per_sample_grad_norms(model, x, y, definition=definition, index=mask, **kw)
    assert torch.allclose(by_mask.total, full.total[index.sort().values], rtol=1e-6)


def test_bad_index():
    model = small_cnn("none")
    x, y = _data(4)
    for bad in ([4], [1, 1], [-1], []):
        with pytest.raises(ValueError, match="index"):
            PS.per_sample_grad_norms(model, x, y, index=torch.tensor(bad, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        PS.per_sample_grad_norms(model, x, y, index=torch.ones(3, dtype=torch.bool))


# --- the notebook-03 experiment: configs, cache, summaries, verdict -------------------------------

def _tiny_config(**kw) -> G.GradNormSpec:
    base = dict(arch="mlp", norm="bn", train_size=120, flip_rate=0.1, epochs=2, batch_size=32,
                measure_epochs=(0, 2), max_clean=10)
    base.update(kw)
    return RunConfig.gradnorm(**base)


def test_spec_validation():
    with pytest.raises(ValueError, match="unknown norm 'batch'.*bn, none, gn, ln"):
        _tiny_config(norm="batch")
    with pytest.raises(ValueError, match="measure_epochs"):
        _tiny_config(measure_epochs=(0, 3))
    with pytest.raises(ValueError, match="nothing is corrupted"):
        _tiny_config(flip_rate=0.0)
    with pytest.raises(ValueError, match="unknown definition"):
        _tiny_config(definitions=("eval", "batch"))
    with pytest.raises(ValueError, match="max_clean"):
        _tiny_config(max_clean=0)
    with pytest.raises(ValueError, match="'bn' and 'none'"):
        G.make_configs(norms=["bn", "gn"], seeds=[0], data=DataConfig(),
                       corruption=CorruptionConfig(flip_rate=0.1), arch="lenet",
                       train=TrainConfig(), measure=GradNormMeasure())
    assert _tiny_config(measure_epochs=(2, 0, 2)).measure.measure_epochs == (0, 2)
    assert _tiny_config().key() != _tiny_config(seed=1).key()


def test_measured_samples():
    kind = torch.tensor([0, 1, 0, 0, 2, 0, 1, 0])
    idx = G.measured_samples(kind, max_clean=2, max_noisy=None, seed=0)
    assert (kind[idx] != 0).sum() == 3 and (kind[idx] == 0).sum() == 2
    assert torch.equal(idx, idx.sort().values)
    assert torch.equal(idx, G.measured_samples(kind, max_clean=2, max_noisy=None, seed=0))
    assert len(G.measured_samples(kind, max_clean=None, max_noisy=1, seed=0)) == 6


def test_run_caches_and_rebuilds_damaged_files(tmp_path):
    config = _tiny_config()
    [r] = G.run([config], "cpu", tmp_path, progress=False)
    assert not r.cached and r.epochs == [0, 2] and set(r.norms) == {"eval", "train"}
    m = len(r.index)
    assert m == 10 + 12 and int((r.kind != 0).sum()) == 12           # all 12 flips, 10 clean
    assert r.norms["train"].shape == (2, m) and r.layer_norms["eval"].shape == (2, m, len(r.layer_names))
    assert torch.allclose(r.layer_norms["eval"].square().sum(-1).sqrt(), r.norms["eval"])
    assert list(r.history["epoch"]) == [1, 2]
    [c] = G.run([config], "cpu", tmp_path, progress=False)
    assert c.cached and torch.equal(c.norms["train"], r.norms["train"]) and c.epochs == r.epochs
    assert c.history.equals(r.history)
    path = G.cache_path(tmp_path, config.key("cpu"))
    path.write_bytes(path.read_bytes()[:-40])                          # a damaged file
    with pytest.warns(UserWarning, match="rebuilding a damaged cache entry"):
        [again] = G.run([config], "cpu", tmp_path, progress=False)
    assert not again.cached and torch.allclose(again.norms["eval"], r.norms["eval"])
    [none] = G.run([_tiny_config(norm="none")], "cpu", tmp_path, progress=False)
    assert set(none.norms) == {"eval"}                                  # train coincides: not recomputed


def _fake_result(norm: str, seed: int, clean: float, noisy: float, epochs=(0, 5, 10),
                 arch: str = "lenet") -> G.GradNormResult:
    """Clean samples' norms around ``clean``, noisy ones around ``noisy``, at every epoch."""
    kind = torch.tensor([0] * 6 + [1] * 4)
    base = torch.tensor([0.8, 0.9, 1.0, 1.0, 1.1, 1.2, 0.9, 1.0, 1.0, 1.1], dtype=torch.float64)
    scale = torch.where(kind == 0, clean, noisy).double()
    e = len(epochs)
    t = torch.stack([base * scale * (1 + 0.1 * i) for i in range(e)])    # (E, m)
    config = RunConfig.gradnorm(norm=norm, seed=seed, epochs=max(epochs), measure_epochs=epochs,
                                arch=arch)
    defs = ("eval", "train") if norm == "bn" else ("eval",)
    return G.GradNormResult(
        config=config, key=f"{norm}{seed}", epochs=list(epochs), index=torch.arange(10), kind=kind,
        norms={d: t for d in defs}, layer_norms={d: torch.stack([t / 2**0.5, t / 2**0.5], -1) for d in defs},
        layer_names=["a", "b"], loss=torch.zeros(e, 10, dtype=torch.float64),
        correct=torch.zeros(e, 10, dtype=torch.bool), history=None)


#: The zoo's setting, for the results' fields.
_CONFIG = RunConfig.gradnorm(dataset="digits", arch="lenet", norm="bn", flip_rate=0.1)


def _fake_results(bn_noisy: float, none_noisy: float):
    out = []
    for s, jitter in enumerate((1.0, 1.1, 0.9)):
        out += [_fake_result("bn", s, 1.0, bn_noisy * jitter), _fake_result("none", s, 1.0, none_noisy * jitter)]
    return out


def test_summaries_on_known_ratios(tmp_path):
    results = _fake_results(bn_noisy=8.0, none_noisy=2.0)
    frame = G.norms_frame(results)
    assert set(frame["definition"]) == {"eval", "train"}                # none filled under train
    assert len(frame) == 3 * 2 * 2 * 3 * 10
    table = G.median_table(frame)
    bn0 = table[(table["norm"] == "bn") & (table["seed"] == 0) & (table["epoch"] == 0)]
    assert float(bn0["ratio"].iloc[0]) == pytest.approx(8.0)           # medians 8 and 1
    ratios = G.ratio_estimates(table)
    ep, est = G.estimate_at(ratios, "final", norm="bn", definition="train")
    assert ep == 10 and est.mean == pytest.approx(8.0, rel=0.01) and est.lo < 8.0 < est.hi and est.n == 3
    versus = G.noisy_vs_all(table)
    _, vs = G.estimate_at(versus, "final", definition="eval")
    assert vs.mean == pytest.approx(4.0) and vs.lo > 1
    assert _judged(ratios, versus, tmp_path) == {"C2a": "reproduced", "C2b": "reproduced",
                                                 "C2c": "reproduced"}
    flipped = _judged(*_summaries(_fake_results(bn_noisy=2.0, none_noisy=8.0)), tmp_path)
    assert flipped["C2b"] == "not reproduced"
    layers = G.layer_ratio_frame(results)
    assert set(layers["layer"]) == {"a", "b"} and layers["ratio"].between(1.5, 9).all()


def _judged(ratios, versus, folder) -> dict[str, str]:
    """The verdicts notebook 03 shows: its records, judged by the claims table's rules."""
    from bnmem_utils.analyses import report

    recorded = ResultsFile(folder / "03.json")
    for what, value, extras in G.result_records(ratios, versus, [_CONFIG]):
        recorded.record(what, value, **extras)
    frame = report.ClaimsView(report.notebook_rows("03_gradient_norms", recorded.values)).frame
    return dict(zip(frame.index, frame["verdict"], strict=True))


def _summaries(results):
    table = G.median_table(G.norms_frame(results))
    return G.ratio_estimates(table), G.noisy_vs_all(table)


def test_each_setting_is_summarized_recorded_and_named_apart(tmp_path):
    """Two networks in one notebook-03 run: every frame keeps them apart, each gets its own
    records (its network in the key) and figure names, and the claims table links a row to its
    setting's figure."""
    from bnmem_utils.analyses import report

    lenet = _fake_results(bn_noisy=8.0, none_noisy=2.0)
    mlp = [_fake_result(n, s, 1.0, x * j, arch="mlp") for s, j in enumerate((1.0, 1.1, 0.9))
           for n, x in (("bn", 0.5), ("none", 2.0))]
    configs = [r.config for r in lenet + mlp]
    assert [s for _, s in G.per_setting(configs)] == ["_digits_lenet", "_digits_mlp"]
    assert G.per_setting([r.config for r in lenet]) == [({"dataset": "digits", "arch": "lenet"}, "")]
    ratios, versus = _summaries(lenet + mlp)
    assert set(ratios["arch"]) == set(versus["arch"]) == {"lenet", "mlp"}
    _, vs = G.estimate_at(versus, "final", definition="eval", arch="mlp")
    assert vs.mean == pytest.approx(0.25)                                 # mlp's BN/none: 0.5/2
    assert G.estimate_at(versus, "final", definition="eval", arch="lenet")[1].mean == pytest.approx(4.0)
    got = {r.key: v for r, v, _ in G.result_records(ratios, versus, configs)}
    assert got["gn_over_bn_none_digits_lenet_flip10_noisy_eval_final"].mean == pytest.approx(4.0)
    assert got["gn_over_bn_none_digits_mlp_flip10_noisy_eval_final"].mean == pytest.approx(0.25)
    layers = G.layer_ratio_frame([r for r in lenet + mlp if r.config.model.arch == "mlp"])
    assert set(layers["arch"]) == {"mlp"}
    (tmp_path / "03_ecdf_final_digits_mlp.png").write_bytes(b"")
    (tmp_path / "03_ecdf_final.png").write_bytes(b"")
    recorded = ResultsFile(tmp_path / "03.json")
    for what, value, extras in G.result_records(ratios, versus, configs):
        recorded.record(what, value, **extras)
    c2a = [c for c in report.CLAIMS if c.id == "C2a"]
    figures = {r["setting"]: r["figure"]
               for r in report.notebook_rows("03_gradient_norms", recorded.values, tmp_path, c2a)}
    assert len(figures) == 4, figures                      # two networks, two definitions
    assert {f for s, f in figures.items() if "MLP" in s} == {"03_ecdf_final_digits_mlp"}
    assert {f for s, f in figures.items() if "LeNet" in s} == {"03_ecdf_final"}  # none of its own


def test_geometric_ci_is_symmetric_on_the_log_scale():
    est = G.geometric_ci([2.0, 0.5])
    assert est.mean == pytest.approx(1.0) and est.lo * est.hi == pytest.approx(1.0)


def test_figures_and_records(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = _fake_results(bn_noisy=8.0, none_noisy=2.0)
    frame = G.norms_frame(results)
    table = G.median_table(frame)
    ratios, versus = G.ratio_estimates(table), G.noisy_vs_all(table)
    for fig, data in (plots_gradnorm.plot_ecdf(frame, 5, batch_size=128), plots_gradnorm.plot_ratio_curves(table),
                      plots_gradnorm.plot_versus(versus), plots_gradnorm.plot_layers(G.layer_ratio_frame(results, epoch=5))):
        assert len(data) > 0
        titles = " ".join(ax.get_title() for ax in fig.axes)
        assert "eval mode" in titles and "train mode" in titles       # every figure names its definition
        plt.close(fig)
    with pytest.raises(ValueError, match="epoch 7 was not measured"):
        plots_gradnorm.plot_ecdf(frame, 7)

    got = {r.key: v for r, v, _ in G.result_records(ratios, versus, [_CONFIG])}
    assert all(k.startswith("gn_") and "_digits_lenet_flip10" in k for k in got)
    assert got["gn_ratio_bn_digits_lenet_flip10_train_final"].mean == pytest.approx(8.0, rel=0.01)
    assert got["gn_over_bn_none_digits_lenet_flip10_noisy_eval_final"].mean == pytest.approx(4.0)
    assert "gn_ratio_none_digits_lenet_flip10_eval_final" in got
    assert "gn_ratio_none_digits_lenet_flip10_train_final" not in got
    assert "gn_noisy_acc_bn_digits_lenet_flip10_final" in got


def test_closed_form_on_a_one_unit_bn_model():
    """x -> w x -> BN(gamma, beta) with loss l_i = t_i * out_i, in float64: both definitions
    against their closed forms, independent of autograd. With batch statistics the gradient on w
    is t_i gamma (x_i - mu) eps / (w^2 v + eps)^(3/2) (BN makes the output scale-invariant in w
    up to eps); with running statistics it is t_i gamma x_i / sqrt(rv + eps)."""
    torch.manual_seed(0)
    eps, w, gamma, beta, rm, rv = 0.5, 1.3, 0.7, 0.2, 0.1, 2.0
    bn = nn.BatchNorm1d(1, eps=eps).double()
    lin = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        lin.weight.fill_(w)
        bn.weight.fill_(gamma)
        bn.bias.fill_(beta)
        bn.running_mean.fill_(rm)
        bn.running_var.fill_(rv)
    model = nn.Sequential(lin, bn)
    x = torch.randn(7, 1, dtype=torch.float64)
    t = torch.randn(7, dtype=torch.float64)

    def loss(out, tt):
        return out[:, 0] * tt

    xs = x[:, 0]
    mu, v = xs.mean(), xs.var(unbiased=False)
    xhat = w * (xs - mu) / torch.sqrt(w**2 * v + eps)
    g_w = t * gamma * (xs - mu) * eps / (w**2 * v + eps) ** 1.5
    train = PS.per_sample_grad_norms(model, x, t, definition="train", loss_fn=loss)
    assert torch.allclose(train.layers["0"], g_w.abs(), rtol=1e-10)
    assert torch.allclose(train.layers["1"], t.abs() * torch.sqrt(xhat**2 + 1), rtol=1e-10)
    xhat_eval = (w * xs - rm) / (rv + eps) ** 0.5
    ev = PS.per_sample_grad_norms(model, x, t, definition="eval", loss_fn=loss)
    assert torch.allclose(ev.layers["0"], (t * gamma * xs / (rv + eps) ** 0.5).abs(), rtol=1e-10)
    assert torch.allclose(ev.layers["1"], t.abs() * torch.sqrt(xhat_eval**2 + 1), rtol=1e-10)
