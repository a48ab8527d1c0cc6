"""The per-sample privacy explorer of notebook 04 (bnmem_utils.explore), on fake banks."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from test_bank import CFG, FakeTrainer, fake_data  # noqa: E402

from bnmem_utils import bank as B  # noqa: E402
from bnmem_utils import explore as X  # noqa: E402
from bnmem_utils import plotting


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
    assert r["attack_score"] == pytest.approx(b.evaluate().member_scores["lira_online"][t, j])
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
    fig = plotting.plot_sample_privacy(df, fake_data().x[3].numpy())
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


def test_show_figure_displays_png_under_any_backend(monkeypatch):
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    X.show_figure(fig)
    assert shown[0].data[:4] == b"\x89PNG" and not plt.fignum_exists(fig.number)
