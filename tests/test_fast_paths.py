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
from bnmem_utils.training.steps import compile_mode, precision

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds.x_train[:512], ds.y_train[:512], ds.x_test[:256], ds.y_test[:256]


def _train(digits, *, amp: str = "off", compile: str = "auto", **kw):
    x, y, x_test, _ = digits
    seed_everything(0)
    model = build_model("lenet", "bn", in_channels=1, num_classes=10, image_size=8)
    history = train_model(model, x, y, config=TrainConfig(epochs=2, batch_size=64, lr=0.05,
                                                          amp=amp, compile=compile),
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
    fast, fast_logits = _train(digits, compile="default")
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
    # the optimizer's step compiles again once it holds state: past a warm-up of 2 steps, none
    steady = gpu_step.bare_step("lenet", dev, bf16=False, compile=True, batch=32, steps=3,
                                warm=2, shape=(1, 28, 28))
    assert steady["graphs"] == 0
    assert gpu_step.flops_per_image("resnet18") == pytest.approx(3.33e9, rel=0.01)


def test_compile_auto_is_eager_on_a_cpu_and_with_the_penalty(monkeypatch):
    import torch.utils._triton as triton

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compile_mode("auto", cpu) == "off"                 # the committed CPU results
    assert compile_mode("default", cpu) == "default"          # asked for: compiled anywhere
    assert compile_mode("reduce-overhead", cuda, regularized=True) == "off"
    monkeypatch.setattr(triton, "has_triton", lambda: True)
    assert compile_mode("auto", cuda) == "default"
    monkeypatch.setenv("BNMEM_COMPILE", "off")                 # the escape hatch
    assert compile_mode("auto", cuda) == "off" and compile_mode("default", cuda) == "default"
    monkeypatch.delenv("BNMEM_COMPILE")
    monkeypatch.setattr(triton, "has_triton", lambda: False)
    assert compile_mode("auto", cuda) == "off"                # no GPU compiler: eager, keyed so
    with pytest.raises(ValueError, match="compile mode.*'fast'.*reduce-overhead"):
        TrainConfig(compile="fast")


def test_the_cache_key_holds_the_precision_and_what_compile_resolves_to(monkeypatch):
    import torch.utils._triton as triton

    from bnmem_utils.core import device
    from bnmem_utils.jobs.config import RunConfig

    bank = RunConfig.bank(dataset="digits", arch="resnet18", n_models=4)
    monkeypatch.setattr(device, "resolve_device", lambda d="auto": torch.device(d))  # a GPU
    monkeypatch.setattr(triton, "has_triton", lambda: True)
    compiled = bank.key("cuda")
    monkeypatch.setattr(triton, "has_triton", lambda: False)
    assert bank.key("cuda") != compiled            # the same config, trained otherwise
    assert bank.replace(compile="off").key("cpu") != bank.key("cpu")
    assert precision("auto", torch.device("cuda")) == "bf16" == precision("bf16", torch.device("cpu"))
    assert precision("auto", torch.device("cpu")) == "fp32" == precision("off", torch.device("cuda"))
    assert bank.replace(amp="bf16").key("cpu") != bank.key("cpu")


@pytest.mark.slow(minutes=1)
def test_a_bank_compiles_its_step_once_for_all_its_models():
    """Three members of a sequential bank, each on its own subset (so each epoch ends on a
    batch of its own size): the training forward compiles once, the later models reuse it
    (the parameters are inputs of the compiled code), and each model is its eager twin."""
    if reason := _compiles():
        pytest.skip(reason)
    import numpy as np
    from torch._dynamo.utils import counters

    from bnmem_utils.jobs.bank_models import prepare_data, train_members
    from bnmem_utils.jobs.config import RunConfig

    config = RunConfig.bank(dataset="digits", arch="lenet", n_models=4, epochs=2, batch_size=64,
                            train_size=400, test_size=100, population_size=50, compile="default")
    data = prepare_data(config, "cpu")
    keep = np.random.default_rng(0).random((3, data.n_samples)) < 0.5
    assert len({int(k.sum()) % 64 for k in keep}) == 3            # three last-batch sizes
    seeds = np.arange(3) + 10
    torch._dynamo.reset()
    counters.clear()
    compiled = train_members(config, keep, range(3), data, seeds=seeds)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    eager = train_members(config.replace(compile="off"), keep, range(3), data, seeds=seeds)
    for i in range(3):
        torch.testing.assert_close(compiled[i]["logits"], eager[i]["logits"], atol=1e-3,
                                   rtol=1e-3)


@pytest.mark.parametrize("vectorised", [False, True], ids=["one after another", "K at once"])
def test_bank_queries_run_in_the_precision_the_members_trained_in(monkeypatch, vectorised):
    """A bank member's eval- and train-mode queries and its test evaluation run under the
    autocast it trained under: bf16 with ``amp="bf16"``, float32 with ``amp="auto"`` on a CPU
    (so the CPU's banks compute what they computed before); the logits come back float32 and
    near float32 queries' (bf16 keeps 8 bits of mantissa)."""
    import numpy as np

    from bnmem_utils.jobs import bank_models as MB
    from bnmem_utils.jobs.config import RunConfig
    from bnmem_utils.training import stacked as S

    seen = []

    def spy(forward):
        def wrapped(*args, **kw):
            seen.append(torch.is_autocast_enabled("cpu"))
            return forward(*args, **kw)
        return wrapped

    monkeypatch.setattr(MB, "predict_logits", spy(MB.predict_logits))     # pool, population
    monkeypatch.setattr(MB, "evaluate", spy(MB.evaluate))                 # test accuracy
    for name in ("logits", "logits_batch_stats"):                         # K at once
        monkeypatch.setattr(S.StackedModels, name, spy(getattr(S.StackedModels, name)))
    records = {}
    for amp in ("auto", "bf16"):
        config = RunConfig.bank(dataset="digits", arch="lenet", norm="bn", n_models=4, epochs=1,
                                train_size=200, test_size=60, population_size=30, amp=amp)
        data = MB.prepare_data(config, "cpu")
        keep = np.random.default_rng(0).random((2, data.n_samples)) < 0.5
        seen.clear()
        records[amp] = MB.train_members(config, keep, [0, 1], data, seeds=np.arange(2),
                                        vectorised=vectorised)
        assert len(seen) >= 3 and set(seen) == {amp == "bf16"}, seen
    for i in (0, 1):
        fp32, bf16 = records["auto"][i]["logits"], records["bf16"][i]["logits"]
        assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)
        torch.testing.assert_close(bf16, fp32, atol=0.5, rtol=0.1)   # trained apart, 1 epoch


@pytest.mark.parametrize("arch, layout", [("lenet", torch.contiguous_format),
                                          ("resnet20", torch.channels_last)])
def test_a_wide_network_trains_channels_last_on_a_cpu(arch, layout, monkeypatch):
    """A grid run trains ResNet-20 channels-last on a CPU (oneDNN's faster layout there) and
    LeNet in NCHW, the layout of its committed CPU results."""
    from torch import nn

    from bnmem_utils.jobs import grid
    from bnmem_utils.jobs.config import RunConfig

    trained = []
    real = grid.train_model
    monkeypatch.setattr(grid, "train_model", lambda model, *a, **kw: (trained.append(model),
                                                                      real(model, *a, **kw))[1])
    (run,) = grid.make_grid(datasets=["digits"], archs=[arch], norms=["bn"], corruptions=[],
                            seeds=[0], train=TrainConfig(epochs=1), train_size=64, test_size=32,
                            track=())
    assert isinstance(run, RunConfig)
    grid.train_run(run, load_dataset("digits", train_size=64, test_size=32), torch.device("cpu"))
    conv = [m for m in trained[0].modules() if isinstance(m, nn.Conv2d)][-1]
    assert conv.weight.is_contiguous(memory_format=layout)
