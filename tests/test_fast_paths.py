"""The GPU path's fast settings compute what the plain path computes, checked on the CPU.

:func:`bnmem_utils.training.loop.train_model` has three settings that exist for speed on a GPU:
channels-last memory (the layout of tensor-core convolutions), bf16 autocast, and a compiled
forward (``torch.compile``). Each is run here on the embedded digits (a LeNet with BN, 2
epochs) next to the plain path from the same seed:

* channels-last: the same model, up to float32 summation order (logits within 1e-4);
* bf16 autocast: bf16 keeps 8 bits of mantissa, so the two runs drift apart as any two training
  runs with rounding differences do. The stated tolerance: every epoch's training loss within
  0.05 nats of the plain run's, and the two models' predictions agree on at least 90% of the
  test images;
* compiled: the same model up to the compiler's reordering of float32 arithmetic (logits within
  1e-3); skipped, with the compiler's own message, where this CPU cannot compile.

The benchmark's bare step (``benchmarks/gpu_step.py``) is checked the same way: compiled and
eager give the same parameters after a few steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from bnmem_utils.core.device import seed_everything
from bnmem_utils.data.datasets import load_dataset
from bnmem_utils.models.nets import build_model
from bnmem_utils.training.loop import TrainConfig, train_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds.x_train[:512], ds.y_train[:512], ds.x_test[:256], ds.y_test[:256]


def _train(digits, *, amp: str = "off", **kw):
    x, y, x_test, _ = digits
    seed_everything(0)
    model = build_model("lenet", "bn", in_channels=1, num_classes=10, image_size=8)
    history = train_model(model, x, y, config=TrainConfig(epochs=2, batch_size=64, lr=0.05,
                                                          amp=amp),
                          seed=0, device="cpu", **kw)
    with torch.no_grad():
        logits = model(x_test.contiguous()).float()
    return history, logits


def test_channels_last_trains_the_same_model(digits):
    plain, logits = _train(digits)
    fast, fast_logits = _train(digits, channels_last=True)
    torch.testing.assert_close(fast_logits, logits, atol=1e-4, rtol=1e-4)
    assert [r["train_loss"] for r in fast.rows] == pytest.approx(
        [r["train_loss"] for r in plain.rows], abs=1e-5)


def test_bf16_autocast_stays_within_its_stated_tolerance(digits):
    plain, logits = _train(digits)
    fast, fast_logits = _train(digits, amp="bf16")
    assert not torch.equal(fast_logits, logits)          # bf16 did run
    for a, b in zip(fast.rows, plain.rows, strict=True):
        assert abs(a["train_loss"] - b["train_loss"]) < 0.05, (a, b)
    agree = (fast_logits.argmax(1) == logits.argmax(1)).float().mean().item()
    assert agree >= 0.90, agree


def _compiles() -> str:
    """Why ``torch.compile`` cannot run on this CPU, or "" when it can."""
    try:
        torch.compile(lambda t: t * 2 + 1)(torch.ones(4))
    except Exception as exc:  # noqa: BLE001 (whatever the compiler raises is the reason)
        return f"torch.compile does not run on this CPU: {type(exc).__name__}: {exc}"[:300]
    return ""


@pytest.mark.slow(minutes=1)
def test_a_compiled_forward_trains_the_same_model(digits):
    if reason := _compiles():
        pytest.skip(reason)
    plain, logits = _train(digits)
    fast, fast_logits = _train(digits, compile=True)
    torch.testing.assert_close(fast_logits, logits, atol=1e-3, rtol=1e-3)
    assert [r["train_loss"] for r in fast.rows] == pytest.approx(
        [r["train_loss"] for r in plain.rows], abs=1e-4)


@pytest.mark.slow(minutes=1)
def test_the_benchmarks_compiled_bare_step_is_the_eager_one():
    if reason := _compiles():
        pytest.skip(reason)
    import gpu_step

    dev = torch.device("cpu")
    results = {}
    for compile in (False, True):
        out = gpu_step.bare_step("lenet", dev, bf16=False, compile=compile, batch=32, steps=3,
                                 warm=1, shape=(1, 28, 28), keep_model=True)
        results[compile] = torch.cat([p.detach().flatten() for p in out["model"].parameters()])
        assert out["img_s"] > 0 and out["compile_s"] >= 0
    torch.testing.assert_close(results[True], results[False], atol=1e-4, rtol=1e-4)
    assert gpu_step.flops_per_image("resnet18") == pytest.approx(3.33e9, rel=0.01)
