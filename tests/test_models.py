"""Every architecture with every norm: forward/backward, shapes, finiteness; BN-free nets train."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from bnmem_utils.models.nets import ARCHS, NORMS, build_model, gn_groups, make_norm


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("channels,size", [(1, 8), (3, 12)])
def test_forward_backward(arch, norm, channels, size):
    torch.manual_seed(0)
    model = build_model(arch, norm, in_channels=channels, num_classes=7, image_size=size)
    x = torch.randn(4, channels, size, size)
    out = model(x)
    assert out.shape == (4, 7)
    assert torch.isfinite(out).all()
    F.cross_entropy(out, torch.arange(4) % 7).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # Some gradient is non-zero (SkipInit's zero scalars still pass a gradient to themselves).
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("norm,kinds", [
    ("bn", (nn.BatchNorm2d, nn.BatchNorm1d)), ("gn", (nn.GroupNorm,)),
    ("ln", (nn.GroupNorm, nn.LayerNorm)), ("none", ())])
def test_norm_layers_present(norm, kinds):
    model = build_model("lenet", norm, in_channels=1, image_size=8)
    norm_mods = [m for m in model.modules()
                 if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm))]
    assert all(isinstance(m, kinds) for m in norm_mods)
    assert (len(norm_mods) > 0) == (norm != "none")
    if norm == "ln":  # LayerNorm over (C, H, W) for convs is GroupNorm with one group
        assert all(m.num_groups == 1 for m in norm_mods if isinstance(m, nn.GroupNorm))


def test_make_norm_and_groups():
    assert gn_groups(6) == 3 and gn_groups(16) == 8 and gn_groups(64) == 32 and gn_groups(512) == 32
    assert gn_groups(1) == 1 and gn_groups(7) == 1
    assert isinstance(make_norm("ln", 10, dim=1), nn.LayerNorm)
    assert isinstance(make_norm("none", 10), nn.Identity)


def test_any_input_size_at_run_time():
    model = build_model("lenet", "bn", in_channels=1, image_size=28).eval()
    for size in (8, 28, 32):
        assert model(torch.randn(2, 1, size, size)).shape == (2, 10)


@pytest.mark.parametrize("arch", ["resnet20", "densenet", "lenet", "mlp"])
def test_bn_free_model_lowers_loss(arch):
    """Without a norm, the documented init (Kaiming; SkipInit scalars in ResNets) lets a few
    Adam steps (25) cut the loss on a small fixed batch clearly."""
    torch.manual_seed(0)
    model = build_model(arch, "none", in_channels=1, num_classes=10, image_size=8)
    x, y = torch.randn(32, 1, 8, 8), torch.arange(32) % 10
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses


def test_bad_arch_and_norm():
    with pytest.raises(ValueError, match=r"unknown architecture 'vgg'.*lenet"):
        build_model("vgg")
    with pytest.raises(ValueError, match=r"unknown norm 'in'.*bn, none, gn, ln"):
        build_model("lenet", "in")
    with pytest.raises(ValueError, match="unknown norm"):
        make_norm("batch", 4)
