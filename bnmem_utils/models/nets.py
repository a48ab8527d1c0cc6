"""The architectures of the paper (LeNet-5, CIFAR-style ResNets, DenseNet-BC, an MLP), each with a
switchable normalization layer, so that BN and its alternatives are compared on the same network.

Every model is built by :func:`build_model` and takes ``norm`` in :data:`NORMS`:

* ``"bn"``: BatchNorm (``BatchNorm2d`` after convolutions, ``BatchNorm1d`` after hidden linear layers);
* ``"none"``: identity (convolutions and linear layers then carry a bias);
* ``"gn"``: GroupNorm with ``G`` groups, ``G`` = the largest divisor of ``C`` that is at most
  ``min(32, C // 2)`` (:func:`gn_groups`): 32 groups as in Wu & He (2018) for wide layers, and at
  least two channels per group for narrow ones (6 channels -> 3 groups, 16 -> 8, 64 -> 32);
* ``"ln"``: LayerNorm over all features of a sample: ``GroupNorm(1, C)`` (over C, H, W) after
  convolutions and ``nn.LayerNorm(C)`` after linear layers.

All of them go through one factory, :func:`make_norm`.

**Any input size.** Every convolutional model ends with adaptive average pooling, so it accepts
any spatial size at run time (the MLP fixes ``in_channels * image_size**2`` inputs when built).
The embedded digits are fed at their native 8x8: LeNet pads its 5x5 convolutions ("same"
padding) so two 2x2 poolings leave a 2x2 map; at 28x28 and 32x32 its classifier sees the
classic 16x5x5 features.

**Initialisation (why the BN-free variants train).** Convolutions and linear layers use Kaiming
(He) normal initialisation for ReLU in fan_in mode (it preserves the forward activation scale,
which is what a net without a norm needs; torchvision's fan_out would amplify it wherever a
layer narrows, e.g. DenseNet's bottlenecks), biases zero, norm scales one and shifts zero. Plain feed-forward nets (LeNet, MLP, DenseNet: whose
concatenations do not add variances up) keep unit-order activations at any depth under Kaiming,
so they train without a norm. LeNet's and the MLP's classifier is zero-initialised (uniform
initial predictions), which is what lets the BN-free LeNet learn in its first epochs (on the
digits, 4 epochs: 79-84% test accuracy instead of 17-82% over 3 seeds). Residual sums do add variances
up, so a ResNet without a norm uses Fixup's initialisation (Zhang et al. 2019): the last
convolution of every residual branch starts at zero (each block starts as the identity), the
first is scaled by ``L**-0.5`` for ``L`` blocks, and the branch carries a learnable scalar
multiplier (initialised to one). The ResNets' classifier keeps a random (fan_in, gain 1) init
for every norm: with zero branches *and* a zero classifier no gradient reaches the branches at
the first step. On the digits this Fixup variant of ResNet-20 reaches 96% test accuracy in 15
epochs, against 85% for a zero-initialised scalar ("SkipInit") that we tried first. With a norm
the networks are the textbook ones, so BN's gamma/sigma statistics are those of a standard BN
network.

*Known limitation:* the BN-free DenseNet learns slowly. At initialisation its pooled features
barely vary between samples (on the digits the between-sample std of a pooled channel is about
0.05 against a mean of 0.3: nothing re-centres the features, which BN does), so on 400 digits,
10 epochs of SGD reach 61% test accuracy against 94% with BN. Its classifier is random (fan_in,
gain 1), which helps here (18% with a zero classifier). Compare DenseNet norms with that in mind.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from bnmem_utils.core.checks import check_choice, check_registration

#: Architectures whose banks train K models at once on every device
#: (:func:`bnmem_utils.jobs.config.bank_trainer`): LeNet and the MLP.
SMALL_ARCHS = ("lenet", "mlp")



def trains_channels_last(arch: str, device: torch.device) -> bool | None:
    """The memory layout a model of ``arch`` trains in on ``device``, as the ``channels_last``
    argument of :func:`bnmem_utils.training.loop.train_model`: True for the wide networks (every
    architecture outside :data:`SMALL_ARCHS`) on a CPU, where oneDNN's convolution backward and
    batch norm run faster channels-last than NCHW (``benchmarks/bench_cpu_archs.py --layout``);
    None elsewhere, the loop's own rule (channels-last images on CUDA, NCHW on a CPU, so LeNet
    and the MLP keep the layout their committed CPU results were trained in). The layout
    changes the convolutions' summation order, so it is part of every cache key."""
    return True if device.type == "cpu" and arch not in SMALL_ARCHS else None


ARCHS = ("lenet", "resnet18", "resnet20", "densenet", "mlp")
"""The architectures :func:`build_model` knows; :func:`register_arch` adds one."""
NORMS = ("bn", "none", "gn", "ln")
"""The normalizers, in the order every table and figure lists them."""
NORM_LABELS = {"bn": "BatchNorm", "none": "no norm", "gn": "GroupNorm", "ln": "LayerNorm"}


def ordered_norms(values) -> list[str]:
    """The distinct norms among ``values`` in :data:`NORMS` order (unknown names last)."""
    present = list(dict.fromkeys(values))
    return [n for n in NORMS if n in present] + [n for n in present if n not in NORMS]


_BUILT_IN = frozenset(ARCHS)

#: Architectures added with :func:`register_arch`: name -> builder.
_REGISTERED: dict[str, Callable[..., nn.Module]] = {}


def register_arch(name: str, builder: Callable[..., nn.Module], *, replace: bool = False) -> None:
    """Add an architecture under ``name``, for every experiment of the package (grids, banks,
    gradient norms, the mitigation) and for the notebooks' parameters.

    ``builder(norm=..., in_channels=..., num_classes=..., image_size=..., width=...)`` returns
    the model, its normalization layers made by :func:`make_norm` so that ``norm`` switches
    them. Cached results of a registered architecture are keyed by the builder's code
    (:func:`code_fingerprint`: its source, defaults and closure, and the source of the user's
    functions and classes it calls and the constants it reads), so editing any of them
    retrains rather than reads stale runs.
    ``replace`` re-registers a name added before (a built-in name cannot be replaced).
    """
    global ARCHS
    check_registration("architecture", name, builder, built_in=_BUILT_IN,
                       registered=_REGISTERED, replace=replace)
    _REGISTERED[name] = builder
    ARCHS = tuple(dict.fromkeys((*ARCHS, name)))


def code_fingerprint(arch: str) -> str | None:
    """A digest of a registered architecture's builder (:func:`source_digest`); None for the
    built-in ones, whose code the cache versions cover."""
    builder = _REGISTERED.get(arch)
    return None if builder is None else source_digest(builder)


def source_digest(fn: Callable) -> str:
    """sha256 of what ``fn`` computes with: its source code, its defaults and closure, and,
    followed through its global names (and the attributes it reads of the user's modules), the
    source of the user's own functions and classes it calls and the values of the constants it
    reads (``HIDDEN = 64``, an array). Libraries (installed packages, the standard library,
    this package) stand in by their names: their versions and the package's own digest cover
    them. The qualified name stands in where no source can be read."""
    seen: set[int] = set()
    h = hashlib.sha256()
    todo = [fn]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            h.update(inspect.getsource(obj).encode())
        except (OSError, TypeError):
            h.update(_name(obj).encode())
        funcs = [v for v in vars(obj).values() if inspect.isfunction(v)] \
            if inspect.isclass(obj) else [obj]
        for f in filter(inspect.isfunction, funcs):
            names = _names(f.__code__)
            values = [f.__defaults__, f.__kwdefaults__,
                      [c.cell_contents for c in f.__closure__ or () if c.cell_contents is not None]]
            for n in sorted(names & set(f.__globals__)):
                v = f.__globals__[n]
                values.append((n, v))
                if inspect.ismodule(v) and _user_module(v.__name__):   # mod.helper()
                    values += [(f"{n}.{a}", getattr(v, a)) for a in sorted(names) if hasattr(v, a)]
            h.update(_token(values, todo).encode())
    return h.hexdigest()[:16]


def _names(code) -> set[str]:
    """The global and attribute names ``code`` and the functions nested in it read."""
    out = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            out |= _names(const)
    return out


def _name(obj) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _user_module(name: str) -> bool:
    """A module of the user's own code: not of the standard library, an installed package or
    this package (a notebook's ``__main__``, a file beside it)."""
    root = name.split(".")[0]
    if root in sys.stdlib_module_names or root in ("builtins", "bnmem_utils"):
        return False
    file = str(getattr(sys.modules.get(name), "__file__", "") or "")
    return "site-packages" not in file and "dist-packages" not in file


def _user_code(obj) -> bool:
    """A function or class of the user's own code (:func:`_user_module`)."""
    return (inspect.isfunction(obj) or inspect.isclass(obj)) and \
        _user_module(getattr(obj, "__module__", None) or "")


def _token(value, todo: list) -> str:
    """A text that stands for ``value`` the same in every process (no memory addresses): the
    user's code by name (its source is hashed too: pushed on ``todo``), a library's function,
    class or module by name, an array or tensor by its bytes, containers item by item, plain
    values by their repr, any other object by its type."""
    if _user_code(value):
        todo.append(value)
        return f"<{_name(value)}>"
    if inspect.ismodule(value):
        return f"<module {value.__name__}>"
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        value = (str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes())
    if type(value).__module__ == "numpy" and hasattr(value, "tobytes"):
        value = (str(value.dtype), tuple(getattr(value, "shape", ())), value.tobytes())
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(map(repr, value)) if isinstance(value, (set, frozenset)) else value
        return f"{type(value).__name__}(" + ",".join(_token(v, todo) for v in items) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_token(k, todo)}:{_token(v, todo)}" for k, v in value.items()) + "}"
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    if value is None or isinstance(value, (int, float, str, bool, complex)):
        return repr(value)
    return f"<{_name(value) if callable(value) else _name(type(value))}>"


def gn_groups(channels: int) -> int:
    """GroupNorm group count: the largest divisor of ``channels`` at most ``min(32, channels // 2)``."""
    cap = max(1, min(32, channels // 2))
    return max(g for g in range(1, cap + 1) if channels % g == 0)


def make_norm(kind: str, channels: int, dim: int = 2) -> nn.Module:
    """The normalization layer ``kind`` for ``channels`` features of a conv (``dim=2``) or linear
    (``dim=1``) layer; ``"none"`` gives ``nn.Identity``."""
    check_choice("norm", kind, NORMS)
    if dim not in (1, 2):
        raise ValueError(f"norm dim must be 1 (linear) or 2 (conv), got {dim!r}")
    if kind == "bn":
        return nn.BatchNorm2d(channels) if dim == 2 else nn.BatchNorm1d(channels)
    if kind == "gn":
        return nn.GroupNorm(gn_groups(channels), channels)
    if kind == "ln":
        return nn.GroupNorm(1, channels) if dim == 2 else nn.LayerNorm(channels)
    return nn.Identity()


def _conv(cin: int, cout: int, k: int, norm: str, stride: int = 1, padding: int | None = None) -> nn.Conv2d:
    """A conv with a bias only when no norm follows it (a norm's shift makes the bias redundant)."""
    padding = k // 2 if padding is None else padding
    return nn.Conv2d(cin, cout, k, stride=stride, padding=padding, bias=(norm == "none"))


def init_weights(model: nn.Module) -> nn.Module:
    """Kaiming-normal (fan_in, ReLU) weights, zero biases, unit norm scales: see the module docstring."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
            if m.weight is not None:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
    return model


def _init_classifier(fc: nn.Linear) -> None:
    """Zero-initialise the classifier: uniform initial predictions (see the module docstring)."""
    nn.init.zeros_(fc.weight)
    nn.init.zeros_(fc.bias)


# ----------------------------------------------------------------------------------------------
# LeNet-5
# ----------------------------------------------------------------------------------------------
class LeNet(nn.Module):
    """LeNet-5: conv5(6)-norm-relu-pool, conv5(16)-norm-relu-pool, fc120-norm-relu, fc84-norm-relu,
    fc. Convolutions use "same" padding and the feature map is adaptively pooled to at most 5x5,
    so 28x28 and 32x32 inputs give the classic 16x5x5 features and 8x8 digits give 16x2x2."""

    def __init__(self, norm: str = "bn", in_channels: int = 1, num_classes: int = 10,
                 image_size: int = 28, width: int = 1):
        super().__init__()
        c1, c2, f1, f2 = 6 * width, 16 * width, 120 * width, 84 * width
        self.pool_size = max(1, min(5, image_size // 4))
        self.features = nn.Sequential(
            _conv(in_channels, c1, 5, norm), make_norm(norm, c1), nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
            _conv(c1, c2, 5, norm), make_norm(norm, c2), nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
        )
        self.pool = nn.AdaptiveAvgPool2d(self.pool_size)
        self.classifier = nn.Sequential(
            nn.Linear(c2 * self.pool_size**2, f1, bias=(norm == "none")), make_norm(norm, f1, 1),
            nn.ReLU(inplace=True),
            nn.Linear(f1, f2, bias=(norm == "none")), make_norm(norm, f2, 1), nn.ReLU(inplace=True),
            nn.Linear(f2, num_classes),
        )
        init_weights(self)
        _init_classifier(self.classifier[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)                       # (B, c2, ceil(H/4), ceil(W/4))
        if h.shape[-2:] != (self.pool_size, self.pool_size):
            h = self.pool(h)                       # (B, c2, p, p); skipped when already p x p
        return self.classifier(h.flatten(1))       # (B, num_classes)

    def flat_layers(self) -> list[tuple[str, nn.Module]]:
        """The forward as (parameter prefix, layer) applied in order: features, the adaptive
        pool (the identity when the map already has its size), flatten, classifier (the
        vectorised trainer's grouped path, :func:`bnmem_utils.training.grouped_layers.layer_plan`)."""
        return ([(f"features.{i}", m) for i, m in enumerate(self.features)]
                + [("pool", self.pool), ("", nn.Flatten())]
                + [(f"classifier.{i}", m) for i, m in enumerate(self.classifier)])


# ----------------------------------------------------------------------------------------------
# ResNets (CIFAR style: 3x3 stem, no max-pool)
# ----------------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """conv3-norm-relu-conv3-norm plus a shortcut (1x1 conv + norm when the shape changes), then relu.
    Without a norm the branch is multiplied by a learnable scalar (Fixup; see :class:`ResNet`)."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str):
        super().__init__()
        self.conv1 = _conv(cin, cout, 3, norm, stride=stride)
        self.n1 = make_norm(norm, cout)
        self.conv2 = _conv(cout, cout, 3, norm)
        self.n2 = make_norm(norm, cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(_conv(cin, cout, 1, norm, stride=stride, padding=0),
                                          make_norm(norm, cout))
        self.res_scale = nn.Parameter(torch.ones(())) if norm == "none" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.n1(self.conv1(x)))         # (B, cout, H/s, W/s)
        h = self.n2(self.conv2(h))
        if self.res_scale is not None:
            h = h * self.res_scale
        return F.relu(h + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stem, stages of :class:`BasicBlock` (stride 2 between stages),
    adaptive average pooling, linear classifier. Without a norm: Fixup initialisation."""

    def __init__(self, blocks: tuple[int, ...], widths: tuple[int, ...], norm: str = "bn",
                 in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(_conv(in_channels, widths[0], 3, norm), make_norm(norm, widths[0]),
                                  nn.ReLU(inplace=True))
        layers: list[nn.Module] = []
        cin = widths[0]
        for i, (n, w) in enumerate(zip(blocks, widths, strict=True)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, 2 if (i > 0 and j == 0) else 1, norm))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        init_weights(self)
        nn.init.kaiming_normal_(self.fc.weight, mode="fan_in", nonlinearity="linear")
        if norm == "none":   # Fixup: zero last conv of each branch, scale the first by L^-1/2
            n_blocks = len(layers)
            for block in layers:
                nn.init.zeros_(block.conv2.weight)
                block.conv1.weight.data.mul_(n_blocks**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(self.stem(x))              # (B, C_last, H/2^(S-1), W/2^(S-1))
        return self.fc(self.pool(h).flatten(1))    # (B, num_classes)


# ----------------------------------------------------------------------------------------------
# DenseNet-BC
# ----------------------------------------------------------------------------------------------
class DenseLayer(nn.Module):
    """Pre-activation bottleneck: norm-relu-conv1x1(4k)-norm-relu-conv3x3(k), concatenated to input."""

    def __init__(self, cin: int, growth: int, norm: str):
        super().__init__()
        self.n1 = make_norm(norm, cin)
        self.conv1 = _conv(cin, 4 * growth, 1, norm, padding=0)
        self.n2 = make_norm(norm, 4 * growth)
        self.conv2 = _conv(4 * growth, growth, 3, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.relu(self.n1(x)))
        h = self.conv2(F.relu(self.n2(h)))         # (B, growth, H, W)
        return torch.cat([x, h], 1)                # (B, cin + growth, H, W)


class Transition(nn.Module):
    """norm-relu-conv1x1 (compression) then 2x2 average pooling (ceil mode: odd sizes work)."""

    def __init__(self, cin: int, cout: int, norm: str):
        super().__init__()
        self.n = make_norm(norm, cin)
        self.conv = _conv(cin, cout, 1, norm, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(self.conv(F.relu(self.n(x))), 2, ceil_mode=True)


class DenseNet(nn.Module):
    """A small DenseNet-BC (Huang et al. 2017) of depth 40: three dense blocks of 6 bottleneck
    layers, compression 0.5 (``growth=12``: about 0.2 M parameters)."""

    def __init__(self, norm: str = "bn", in_channels: int = 3, num_classes: int = 10,
                 growth: int = 12):
        super().__init__()
        c = 2 * growth
        mods: list[nn.Module] = [_conv(in_channels, c, 3, norm)]
        for b in range(3):
            for _ in range(6):
                mods.append(DenseLayer(c, growth, norm))
                c += growth
            if b < 2:
                mods.append(Transition(c, c // 2, norm))
                c //= 2
        self.features = nn.Sequential(*mods)
        self.n_out = make_norm(norm, c)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)
        init_weights(self)
        nn.init.kaiming_normal_(self.fc.weight, mode="fan_in", nonlinearity="linear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.n_out(self.features(x)))   # (B, C, H/4, W/4)
        return self.fc(self.pool(h).flatten(1))    # (B, num_classes)


# ----------------------------------------------------------------------------------------------
# MLP
# ----------------------------------------------------------------------------------------------
class MLP(nn.Module):
    """Flatten, then hidden linear-norm-relu layers (default 256, 128), then a linear classifier."""

    def __init__(self, norm: str = "bn", in_features: int = 784, num_classes: int = 10,
                 hidden: tuple[int, ...] = (256, 128)):
        super().__init__()
        mods: list[nn.Module] = [nn.Flatten()]
        d = in_features
        for h in hidden:
            mods += [nn.Linear(d, h, bias=(norm == "none")), make_norm(norm, h, 1), nn.ReLU(inplace=True)]
            d = h
        mods.append(nn.Linear(d, num_classes))
        self.net = nn.Sequential(*mods)
        init_weights(self)
        _init_classifier(self.net[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)                          # (B, C*H*W) -> (B, num_classes)

    def flat_layers(self) -> list[tuple[str, nn.Module]]:
        """The forward as (parameter prefix, layer) applied in order (see :meth:`LeNet.flat_layers`)."""
        return [(f"net.{i}", m) for i, m in enumerate(self.net)]


def build_model(arch: str, norm: str = "bn", *, in_channels: int = 1, num_classes: int = 10,
                image_size: int = 28, width: int = 1) -> nn.Module:
    """Build ``arch`` (one of :data:`ARCHS`) with normalization ``norm`` (one of :data:`NORMS`).

    ``width`` multiplies the channel/unit counts (LeNet, MLP, ResNets; DenseNet's growth rate).
    ``image_size`` sizes LeNet's pooled features and the MLP's input; the convolutional
    models accept any size at run time anyway.
    """
    check_choice("architecture", arch, ARCHS)
    check_choice("norm", norm, NORMS)
    if width < 1 or int(width) != width:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    kw = {"norm": norm, "in_channels": in_channels, "num_classes": num_classes}
    if arch in _REGISTERED:
        return _REGISTERED[arch](image_size=image_size, width=width, **kw)
    if arch == "lenet":
        return LeNet(image_size=image_size, width=width, **kw)
    if arch == "resnet18":
        return ResNet((2, 2, 2, 2), tuple(w * width for w in (64, 128, 256, 512)), **kw)
    if arch == "resnet20":
        return ResNet((3, 3, 3), tuple(w * width for w in (16, 32, 64)), **kw)
    if arch == "densenet":
        return DenseNet(growth=12 * width, **kw)
    return MLP(norm, in_channels * image_size**2, num_classes,
               hidden=tuple(h * width for h in (256, 128)))


