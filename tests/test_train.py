"""The training loop: determinism, group metrics against the training labels, divergence,
hooks, regularizers, schedules, augmentation, evaluation helpers and bad configs."""

from __future__ import annotations

import math

import pytest
import torch

from bnmem_utils.data.datasets import corrupt
from bnmem_utils.jobs.config import TrainConfig
from bnmem_utils.models.nets import build_model
from bnmem_utils.training.loop import evaluate, predict_logits, train_model
from bnmem_utils.training.steps import History, shift_fill, shift_flip


@pytest.fixture(scope="module")
def small(digits):
    """300 training digits with 10% flipped labels, and 100 test digits."""
    sub = type(digits)(digits.name, digits.x_train[:300], digits.y_train[:300],
                       digits.x_test[:100], digits.y_test[:100], 10, digits.mean, digits.std)
    return sub, corrupt(sub, flip_rate=0.1, seed=0)


def _fit(small, norm="bn", seed=0, epochs=2, **kw):
    ds, cs = small
    torch.manual_seed(seed)
    model = build_model("lenet", norm, in_channels=1, image_size=8)
    cfg = TrainConfig(epochs=epochs, batch_size=64, **kw)
    hist = train_model(model, cs.x, cs.y, config=cfg, seed=seed, groups=cs.groups(),
                       test=(ds.x_test, ds.y_test))
    return model, hist


def test_same_seed_identical_history(small):
    _, a = _fit(small, seed=3)
    _, b = _fit(small, seed=3)
    _, c = _fit(small, seed=4)
    assert a.rows == b.rows                       # exact equality, every number of every epoch
    assert a.rows != c.rows
    assert [r["epoch"] for r in a.rows] == [1, 2] and not a.diverged
    for key in ("train_loss", "lr", "clean_acc", "clean_loss", "flipped_acc", "flipped_loss",
                "test_acc", "test_loss"):
        assert key in a.rows[-1] and math.isfinite(a.rows[-1][key])


def test_group_metrics_use_training_labels(small):
    ds, cs = small
    model, hist = _fit(small, epochs=3, augment=False)
    last = hist.last()
    for name, mask in cs.groups().items():
        loss, acc = evaluate(model, cs.x[mask], cs.y[mask])
        assert last[f"{name}_acc"] == pytest.approx(acc, abs=1e-6)
        assert last[f"{name}_loss"] == pytest.approx(loss, rel=1e-5)
    # On flipped samples, accuracy against the trained (wrong) labels and against the original
    # labels are different numbers that cannot add up to more than one.
    m = cs.groups()["flipped"]
    _, acc_orig = evaluate(model, cs.x[m], cs.orig_y[m])
    assert acc_orig != last["flipped_acc"] and acc_orig + last["flipped_acc"] <= 1 + 1e-9
    assert last["test_acc"] == pytest.approx(evaluate(model, ds.x_test, ds.y_test)[1])


class _NaNAfter:
    """A regularizer that returns 0 for ``k - 1`` steps, then NaN."""

    def __init__(self, k: int):
        self.k, self.calls, self.attached = k, 0, 0

    def attach(self, model):
        self.attached += 1

    def __call__(self, model):
        self.calls += 1
        return torch.tensor(float("nan") if self.calls >= self.k else 0.0)


def test_non_finite_loss_stops_with_message(small):
    ds, cs = small
    reg = _NaNAfter(k=7)                          # 300 samples / 64 = 5 steps per epoch -> epoch 2 step 2
    model = build_model("mlp", "bn", in_channels=1, image_size=8)
    with pytest.warns(RuntimeWarning, match="diverged"):
        hist = train_model(model, cs.x, cs.y, config=TrainConfig(epochs=5, batch_size=64),
                           regularizer=reg, groups=cs.groups())
    assert hist.diverged and reg.attached == 1
    assert "epoch 2, step 2 of 5" in hist.message and "nan" in hist.message
    assert len(hist.rows) == 2 and math.isnan(hist.rows[-1]["train_loss"])
    with pytest.raises(RuntimeError, match="diverged"):
        hist.raise_if_diverged()


def test_huge_lr_diverges_not_silently(small):
    ds, cs = small
    torch.manual_seed(0)
    model = build_model("mlp", "none", in_channels=1, image_size=8)
    with pytest.warns(RuntimeWarning, match="diverged"):
        hist = train_model(model, cs.x, cs.y, config=TrainConfig(epochs=3, lr=1e12, momentum=0.0))
    assert hist.diverged and "epoch 1" in hist.message


def test_hooks_and_regularizer(small):
    ds, cs = small
    seen = []

    def hook(epoch, model, row):
        seen.append((epoch, model.training, "test_acc" in row))
        return {"double_epoch": 2 * epoch}

    class Half:
        def attach(self, model):
            self.p = next(model.parameters())

        def __call__(self, model):
            return 0.5 * self.p.pow(2).sum()

    model = build_model("lenet", "gn", in_channels=1, image_size=8)
    hist = train_model(model, cs.x, cs.y, config=TrainConfig(epochs=2, batch_size=64),
                       test=(ds.x_test, ds.y_test), hooks=[hook], regularizer=Half())
    assert seen == [(1, False, True), (2, False, True)]
    assert [r["double_epoch"] for r in hist.rows] == [2, 4]
    assert all(r["reg_loss"] > 0 for r in hist.rows)
    frame = hist.as_frame()
    assert list(frame["epoch"]) == [1, 2] and "reg_loss" in frame
    assert History.from_dict(hist.to_dict()).rows == hist.rows


def test_schedules(small):
    _, cs = small
    model = build_model("mlp", "none", in_channels=1, image_size=8)
    cos = train_model(model, cs.x, cs.y, config=TrainConfig(epochs=4, lr=0.1, schedule="cosine"))
    lrs = [r["lr"] for r in cos.rows]
    assert lrs[0] == pytest.approx(0.1) and all(a > b for a, b in zip(lrs, lrs[1:], strict=False))
    assert lrs[2] == pytest.approx(0.05)          # half-way through a cosine from 0.1 to 0
    flat = train_model(model, cs.x, cs.y, config=TrainConfig(epochs=2, lr=0.1, schedule="none"))
    assert [r["lr"] for r in flat.rows] == pytest.approx([0.1, 0.1])
    adam = train_model(model, cs.x, cs.y, config=TrainConfig(epochs=1, optimizer="adam", lr=1e-3,
                                                             schedule="none"))
    assert adam.rows[0]["lr"] == 1e-3


def test_shift_flip_moves_pixels():
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).view(2, 1, 4, 4)   # (B, C, H, W)
    pad_value = torch.full((1, 1, 1, 1), -1.0)
    centred = shift_flip(x, torch.tensor([[1, 1], [1, 1]]), None, 1, pad_value)
    assert torch.equal(centred, x)
    moved = shift_flip(x, torch.tensor([[0, 0], [2, 1]]), torch.tensor([False, True]), 1, pad_value)
    # Image 0: corner offset (0, 0) -> shifted down-right by one; the new border is the pad value.
    assert torch.equal(moved[0, 0, 1:, 1:], x[0, 0, :3, :3])
    assert (moved[0, 0, 0] == -1).all() and (moved[0, 0, :, 0] == -1).all()
    # Image 1: shifted up by one row, columns kept, then mirrored.
    expect = torch.cat([x[1, 0, 1:], torch.full((1, 4), -1.0)]).flip(1)
    assert torch.equal(moved[1, 0], expect)


def test_shift_fill_is_the_background_not_an_outlier(digits):
    """Shifts bring in the data set's background, whatever OOD inserts the training set holds;
    without ``fill`` they bring in the darkest pixel of x, here the insert's."""
    x = digits.x_train.clone()
    x[7] = -50.0                                                  # an extreme OOD insert
    background = digits.background
    torch.testing.assert_close(background, digits.x_train.amin(dim=(0, 2, 3)).view(1, 1, 1, 1))
    assert float(shift_fill(x)) == -50.0
    assert torch.equal(shift_fill(x, background), background)
    assert torch.equal(shift_fill(x, background.flatten()), background)
    with pytest.raises(ValueError, match="fill has 3 values, expected one per channel \\(1\\)"):
        shift_fill(x, torch.zeros(3))
    # a shift of a clean image then brings in background
    moved = shift_flip(x[:2], torch.tensor([[0, 0], [0, 0]]), None, 1, shift_fill(x, background))
    assert torch.equal(moved[:, :, 0], background.view(1, 1, 1).expand(2, 1, 8))


def test_bn_free_lenet_learns_digits(digits):
    torch.manual_seed(0)
    model = build_model("lenet", "none", in_channels=1, image_size=8)
    hist = train_model(model, digits.x_train, digits.y_train, config=TrainConfig(epochs=8),
                       test=(digits.x_test, digits.y_test))
    assert hist.last()["test_acc"] > 0.85, hist.rows


def test_single_sample_tail_is_dropped(digits):
    model = build_model("lenet", "bn", in_channels=1, image_size=8)
    x, y = digits.x_train[:129], digits.y_train[:129]        # 128 + 1: BN cannot take 1 sample
    hist = train_model(model, x, y, config=TrainConfig(epochs=1, batch_size=128))
    assert not hist.diverged and len(hist.rows) == 1


def test_evaluation_helpers(small):
    ds, cs = small
    model, _ = _fit(small, epochs=1)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = predict_logits(model, ds.x_test, batch_size=32)
    assert logits.shape == (100, 10) and logits.dtype == torch.float32 and model.training
    train_logits = predict_logits(model, ds.x_test, batch_size=32, train_mode=True)
    assert not torch.allclose(logits, train_logits)          # batch statistics differ from running
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats untouched
    loss, acc = evaluate(model, ds.x_test, ds.y_test)
    assert acc == pytest.approx(float((logits.argmax(1) == ds.y_test).float().mean()))
    assert model.training


@pytest.mark.parametrize("kw,match", [
    ({"optimizer": "rmsprop"}, r"unknown optimizer 'rmsprop'.*sgd, adam"),
    ({"schedule": "linear"}, r"unknown schedule 'linear'.*cosine, none"),
    ({"amp": "fp16"}, r"unknown amp mode 'fp16'.*auto, bf16, off"),
    ({"epochs": 0}, "epochs must be a positive integer, got 0"),
    ({"lr": -1.0}, "lr must be a positive number"),
])
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kw)


def test_bad_groups(small):
    _, cs = small
    model = build_model("mlp", "none", in_channels=1, image_size=8)
    with pytest.raises(ValueError, match=r"group 'x' must be a boolean mask of shape \(300,\)"):
        train_model(model, cs.x, cs.y, config=TrainConfig(epochs=1),
                    groups={"x": torch.ones(5, dtype=torch.bool)})
