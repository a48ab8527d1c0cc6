"""gamma/sigma statistics: values against BN's own definitions, batch sigma, no side effects."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bnmem_utils.models.gamma_sigma import (
    bn_layers,
    frozen_bn_stats,
    gamma_sigma_stats,
)
from bnmem_utils.models.nets import build_model


def _trained_lenet():
    torch.manual_seed(0)
    model = build_model("lenet", "bn", in_channels=1, image_size=8)
    model.train()
    with torch.no_grad():
        for _, bn in bn_layers(model):
            bn.weight.uniform_(0.5, 2.0)               # gamma away from 1, some above sigma
        for _ in range(5):                             # give the running statistics values
            model(torch.randn(64, 1, 8, 8) * 3 + 1)
    return model


def test_running_ratio_matches_definition():
    model = _trained_lenet()
    stats = gamma_sigma_stats(model)
    layers = bn_layers(model)
    assert len(stats) == sum(m.num_features for _, m in layers) == 6 + 16 + 120 + 84
    assert list(stats["layer"].unique()) == [name for name, _ in layers]
    assert list(stats["depth"].unique()) == [0, 1, 2, 3]
    name, bn = layers[1]
    rows = stats[stats["layer"] == name]
    sigma = torch.sqrt(bn.running_var + bn.eps)
    assert rows["running_sigma"].to_numpy() == pytest.approx(sigma.numpy(), rel=1e-6)
    assert rows["ratio"].to_numpy() == pytest.approx((bn.weight.abs() / sigma).detach().numpy(),
                                                     rel=1e-6)
    assert "batch_sigma" not in stats


def test_batch_sigma_is_bn_batch_std_and_changes_nothing():
    model = _trained_lenet().eval()
    x = torch.randn(32, 1, 8, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = gamma_sigma_stats(model, x)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training
    # The first BN layer sees conv1(x): its batch std over (N, H, W) is what BN divides by.
    conv1, bn1 = model.features[0], model.features[1]
    with torch.no_grad():
        z = conv1(x)
    expect = torch.sqrt(z.var(dim=(0, 2, 3), unbiased=False) + bn1.eps)
    first = stats[stats["depth"] == 0]
    assert first["batch_sigma"].to_numpy() == pytest.approx(expect.numpy(), rel=1e-5)
    assert first["batch_ratio"].to_numpy() == pytest.approx(
        (bn1.weight.abs() / expect).detach().numpy(), rel=1e-5)
    # Train mode check: normalising by that sigma reproduces BN's train-mode output.
    bn1.train()
    with frozen_bn_stats(model), torch.no_grad():
        y = bn1(z)
    manual = (z - z.mean((0, 2, 3), keepdim=True)) / expect.view(1, -1, 1, 1) \
        * bn1.weight.view(1, -1, 1, 1) + bn1.bias.view(1, -1, 1, 1)
    assert torch.allclose(y, manual, atol=1e-5)


def test_no_bn_model_gives_empty_frame():
    for norm in ("none", "gn", "ln"):
        stats = gamma_sigma_stats(build_model("mlp", norm, in_channels=1, image_size=8),
                                  torch.randn(4, 1, 8, 8))
        assert stats.empty and "batch_ratio" in stats.columns


def test_frozen_bn_stats_restores_buffers():
    bn = nn.BatchNorm1d(3)
    model = nn.Sequential(bn)
    with frozen_bn_stats(model):
        model.train()(torch.randn(8, 3) + 5)
        assert bn.running_mean.abs().sum() > 0
    assert bn.running_mean.abs().sum() == 0 and int(bn.num_batches_tracked) == 0
