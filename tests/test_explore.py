"""The per-sample privacy explorer of notebook 04 (bnmem_utils.figures.explore), on fake banks."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from test_bank import CFG, FakeTrainer, fake_data  # noqa: E402

from bnmem_utils.figures import explore as X  # noqa: E402
from bnmem_utils.figures import memorization as plots_memorization
from bnmem_utils.figures import privacy as plots_privacy
from bnmem_utils.jobs import bank as B  # noqa: E402
from bnmem_utils.privacy import attacks as A  # noqa: E402


@pytest.fixture(scope="module")
def banks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("banks")
    return [B.train_bank(CFG.replace(norm=n), folder, device="cpu", data=fake_data(),
                         progress=False, trainer=FakeTrainer()) for n in ("bn", "none")]


def test_banks_of_one_setting_share_pool_and_keep(banks):
    groups = X.setting_groups(banks)
    assert list(groups) == ["digits/lenet, OOD 5%"] and len(groups["digits/lenet, OOD 5%"]) == 2
    np.testing.assert_array_equal(banks[0].keep, banks[1].keep)
    # The real thing: the keep matrix and the corruption depend on the seed, not on the norm.
    assert B.keep_matrix(8, 50, 3).tolist() == B.keep_matrix(8, 50, 3).tolist()


def test_sample_privacy_rows(banks):
    j, t = 5, 2
    df = X.sample_privacy(banks, j, target=t)
    assert df.norm.tolist() == ["bn", "none"]
    b = banks[0]
    r = df.iloc[0]
    assert r["member"] == bool(b.keep[t, j]) and r["target_score"] == b.scores[t, j, 0]
    n_in = int(b.keep[:, j].sum()) - int(b.keep[t, j])
    assert len(r["in_scores"]) == n_in and len(r["out_scores"]) == b.n_models - 1 - n_in
    assert r["memorization"] == pytest.approx(b.memorization()[j])
    # the headline attack by default: N = 6 leaves 2 shadows a side, the pooled variance
    assert r["attack"] == "lira_online_fixed" == A.headline_attack(b.n_models)
    assert r["attack_score"] == pytest.approx(b.evaluate().member_scores["lira_online_fixed"][t, j])
    other = X.sample_privacy(banks, j, target=t, attack="lira_online").iloc[0]
    assert other["attack_score"] == pytest.approx(b.evaluate().member_scores["lira_online"][t, j])
    # members get +3 on their label's logit in the fake banks: IN scores sit above OUT scores
    assert np.median(r["in_scores"]) > np.median(r["out_scores"])
    text = X.format_sample_privacy(df)
    assert f"sample #{j}" in text and "BatchNorm" in text and "no norm" in text


def test_sample_privacy_rejects_bad_input(banks):
    with pytest.raises(ValueError, match="out of range: the pool has 40 samples"):
        X.sample_privacy(banks, 40)
    with pytest.raises(ValueError, match="target model 9 is out of range"):
        X.sample_privacy(banks, 0, target=9)
    other = B.train_bank(CFG.replace(norm="none", seed=1), banks[0].folder.parent.parent,
                         device="cpu", data=fake_data(), progress=False, trainer=FakeTrainer())
    with pytest.raises(ValueError, match="do not share their pool and keep matrix"):
        X.sample_privacy([banks[0], other], 0)


def test_most_exposed_ranks_by_the_members_attack_scores(banks):
    e = X.exposure(banks[0])
    top = X.most_exposed(banks, 5)
    assert len(top) == 5 and e[top[0]] == e.max()
    assert all(e[a] >= e[b] for a, b in zip(top, top[1:], strict=False))


def test_plot_and_static_view(banks, capsys, monkeypatch):
    df = X.sample_privacy(banks, 3)
    fig = plots_privacy.plot_sample_privacy(df, fake_data().x[3].numpy())
    axes = fig.get_axes()
    assert len(axes) == 3 and axes[0].images  # the image, then BN and no norm
    assert axes[1].get_xlim() == axes[2].get_xlim()  # one score axis for both norms
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    X.show_sample_privacy(banks, data=fake_data())
    assert "sample #" in capsys.readouterr().out and shown[0].data[:4] == b"\x89PNG"


def test_sample_explorer_draws_once_and_redraws_on_change(banks):
    pytest.importorskip("ipywidgets")
    ex = X.sample_explorer(banks, data=fake_data(), k=5)
    assert ex.draws == 1
    first_image, first_text = ex.image.value, ex.readout.value
    assert ex.index.value == X.most_exposed(banks, 1)[0] and ex.image.value[:4] == b"\x89PNG"
    other = next(i for i in range(40) if i != ex.index.value)
    ex.index.value = other
    assert ex.draws == 2 and ex.image.value != first_image and ex.readout.value != first_text
    assert f"sample #{other}" in ex.readout.value
    ex.exposed.value = ex.exposed.options[1][1]  # picking from the list moves the index: one draw
    assert ex.draws == 3 and ex.index.value == ex.exposed.options[1][1]
    ex.target.value = 1
    assert ex.draws == 4 and "target model 1" in ex.readout.value


def test_sample_explorer_keeps_its_list_in_step_and_names_a_bad_index(banks):
    pytest.importorskip("ipywidgets")
    ex = X.sample_explorer(banks, data=fake_data(), k=5, note="smoke: its numbers mean nothing")
    assert ex.exposed.value == ex.index.value  # the list shows the sample drawn
    assert "smoke: its numbers mean nothing" in ex.readout.value
    listed = [v for _, v in ex.exposed.options]
    ex.index.value = listed[2]  # typed: the list follows, one draw
    assert ex.exposed.value == listed[2] and ex.draws == 2
    unlisted = next(i for i in range(40) if i not in listed)
    ex.index.value = unlisted  # not in the list: blank, not the old entry
    assert ex.exposed.value is None and ex.draws == 3 and f"sample #{unlisted}:" in ex.readout.value
    image, m = ex.image.value, banks[0].n_samples
    ex.index.value = m  # out of range: said, not clamped; the last view stays
    assert ex.index.value == m and ex.image.value == image
    assert f"sample index {m} is out of range" in ex.readout.value
    ex.index.value = listed[0]
    assert ex.exposed.value == listed[0] and f"sample #{listed[0]}:" in ex.readout.value


@pytest.mark.parametrize("attack", ["auto", "lira_online", "lira_online_nig"])
def test_the_readout_and_the_titles_show_the_attacks_own_llr_at_one_query(banks, attack):
    df = X.sample_privacy(banks, 3, target=1, attack=attack)
    name = df.attack.iloc[0]
    text = X.format_sample_privacy(df, note="a note")
    assert text.startswith("a note\n")
    for term in ("target score:", "LLR: ", f"{name} score:", "exposure:", "memorization:",
                 "acc IN", "identity query alone"):
        assert term in text
    q = banks[0].scores.shape[2]
    assert f"the LLR's mean over {q} queries" in text
    fig = plots_privacy.plot_sample_privacy(df)
    for ax, (_, r), b in zip(fig.get_axes()[1:], df.iterrows(), banks, strict=True):
        # the title's number is the readout's LLR column: the attack's own term at this query,
        # whose mean over the queries is the attack's score
        assert f"LLR {r['llr']:.2f} (identity query)" in ax.get_title()
        assert f"{r['llr']:>10.3f}" in text
        shadows = np.arange(b.n_models) != 1
        split = A.ShadowSplit(b.keep[shadows], b.scores[shadows], b.scores[1])
        terms = A.online_fit(split, A.ONLINE[name]).log_ratio(split.target)[3]
        assert r["llr"] == pytest.approx(terms[0])
        assert r["attack_score"] == pytest.approx(terms.mean())


def test_a_score_at_four_digits_says_why_beside_it(banks):
    """One sample whose shadows all score alike: its per-sample variance sits at the floor and
    the LLR is huge; the readout and the title give the reason beside the number."""
    b = banks[0]
    scores = b.scores.copy()
    scores[:, 7, :] = np.where(b.keep[:, 7], 2.0, 1.0)[:, None]   # no spread on either side
    scores[1, 7, :] = 2.5                                   # the target's: between and beyond
    flat = dataclasses.replace(b, scores=scores, _loo={})
    df = X.sample_privacy([flat], 7, target=1, attack="lira_online")
    r = df.iloc[0]
    assert abs(r["llr"]) >= 1000 and r["fit"]["floor_in"] and r["fit"]["floor_out"]
    assert r["reasons"]["LLR"] == f"IN and OUT variance at floor ({r['fit']['k']} shadows a side)"
    text = X.format_sample_privacy(df)
    row = next(line for line in text.splitlines() if line.startswith("BatchNorm"))
    assert "<- LLR: IN and OUT variance at floor" in row and "score: variance at floor in" in row
    title = plots_privacy.plot_sample_privacy(df).get_axes()[1].get_title()
    assert "variance at floor" in title
    # the pooled variance of the headline attack is not at the floor: a small, plain number
    assert abs(X.sample_privacy([flat], 7, target=1).iloc[0]["llr"]) < 1000


def test_curve_bands_stay_in_the_metrics_range_and_epochs_are_whole():
    rows = [{"setting": "s", "dataset": "d", "arch": "a", "norm": "bn", "seed": seed,
             "epoch": e, "corrupted_acc": v}
            for seed, vals in enumerate(([0.0, 0.9, 1.0], [1.0, 0.1, 1.0], [0.0, 0.5, 1.0]))
            for e, v in zip((1, 2, 3), vals, strict=True)]
    fig, _ = plots_memorization.plot_curves(pd.DataFrame(rows), "corrupted_acc")
    ax = fig.get_axes()[0]
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() >= 0.0 and band[:, 1].max() <= 1.0
    assert all(float(t).is_integer() for t in ax.get_xticks())
    assert plots_memorization.metric_bounds("train_loss") == (0.0, None)


def test_show_figure_displays_png_under_any_backend(monkeypatch):
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    X.show_figure(fig)
    assert shown[0].data[:4] == b"\x89PNG" and not plt.fignum_exists(fig.number)


#: ``attack`` parameters that name an attack already applied (a result's key field, a results
#: row's description, a readout's column), with no bank to resolve ``"auto"`` from.
ATTACK_LABELS = {"core.results.Result.__init__", "analyses.confound.records",
                 "figures.explore.format_sample_privacy"}


def attack_defaults() -> dict[str, object]:
    """{module.function: default} of every public function and method of the package that takes
    an ``attack`` parameter with a default (read by inspect.signature)."""
    import importlib
    import inspect

    from test_layers import MODULES, source

    out = {}
    for module in (m for m in MODULES if "attack" in source(m)):
        mod = importlib.import_module(f"bnmem_utils.{module}")
        for name, obj in vars(mod).items():
            members = vars(obj).items() if inspect.isclass(obj) else ()
            for fname, fn in [(name, obj), *((f"{name}.{k}", v) for k, v in members)]:
                if (name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != mod.__name__
                        or fname.split(".")[-1].startswith("_") and not fname.endswith(".__init__")):
                    continue
                p = inspect.signature(fn).parameters.get("attack")
                if p is not None and p.default is not inspect.Parameter.empty:
                    out[f"{module}.{fname}"] = p.default
    return out


def test_every_attack_parameter_defaults_to_the_headline_rule(banks):
    """Every public function with an ``attack`` parameter defaults to ``"auto"``: the headline
    attack, resolved from the banks' keep matrices (N = 6 here: 2 shadows a side, the pooled
    variance), as an explicit name would give it."""
    from bnmem_utils.analyses import leakage, matched_gap, mitigation

    defaults = attack_defaults()
    assert {"analyses.leakage.arm_table", "analyses.matched_gap.bank_point",
            "analyses.confound.target_frame", "figures.privacy.plot_roc_grid",
            "figures.explore.SampleExplorer.__init__"} <= set(defaults) and len(defaults) >= 20
    assert {f: d for f, d in defaults.items() if d != "auto"}.keys() == ATTACK_LABELS
    pooled = "lira_online_fixed"
    assert A.resolve_attack("auto", *banks) == X.headline(banks) == pooled
    pd.testing.assert_frame_equal(leakage.arm_table(banks), leakage.arm_table(banks, pooled))
    assert not leakage.arm_table(banks).equals(leakage.arm_table(banks, "lira_online"))
    assert set(leakage.norm_differences(banks).attack) == set(leakage.roc_frame(banks).attack) \
        == set(mitigation.bank_table(dict(enumerate(banks))).attack) == {pooled}
    pd.testing.assert_frame_equal(leakage.train_mode_ablation(banks),
                                  leakage.train_mode_ablation(banks, pooled))
    for got, want in zip(matched_gap.bank_point(banks[0]), matched_gap.bank_point(banks[0], pooled),
                         strict=True):
        np.testing.assert_array_equal(got, want)
    assert plots_privacy.plot_roc_grid(banks)._suptitle.get_text().startswith(
        "LiRA online, pooled variance")
