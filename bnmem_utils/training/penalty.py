"""The gamma/sigma penalty (the paper's mitigation), on the training layer.

The theory (notebook 01) says BatchNorm multiplies the per-step margin growth on an outlier by
``(gamma / sigma_B)^2``. :class:`GammaSigmaPenalty` penalises that factor directly during
training: after every train-mode forward it holds, for each BatchNorm channel, the scale gamma
and the standard deviation sigma_B of the channel's input in the CURRENT batch, and adds

    lam * reduce_over_channels( (gamma / sigma_B)^2 )            form="square"
    lam * reduce_over_channels( relu(|gamma| / sigma_B - tau)^2 )  form="hinge"

to the loss. It follows the :func:`bnmem_utils.training.loop.train_model` regularizer protocol: call
``.attach(model)`` once, then ``reg(model)`` after each forward returns the scalar to add::

    reg = GammaSigmaPenalty(lam=0.01, form="hinge", tau=1.0)
    history = train_model(model, x, y, config=cfg, regularizer=reg)

A run or a bank names its penalty in its description
(:class:`PenaltyConfig`, the ``penalty`` field of a
:class:`~bnmem_utils.jobs.config.RunConfig`), which :func:`from_config` turns into the penalty;
notebook 05's sweep and analyses live in :mod:`bnmem_utils.analyses.mitigation`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
from torch import Tensor, nn

from bnmem_utils.core.checks import check_choice
from bnmem_utils.models.gamma_sigma import batch_sigma, bn_layers

PENALTY_FORMS = ("square", "hinge")
PENALTY_REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class PenaltyConfig:
    """The gamma/sigma penalty added to every training step
    (:class:`bnmem_utils.training.penalty.GammaSigmaPenalty` explains each field)."""

    lam: float                          # strength (0: an exact zero, training unchanged)
    form: str = "square"                # "square" or "hinge"
    tau: float = 1.0                    # hinge threshold (ignored by "square")
    reduction: str = "mean"             # over all BN channels: "mean" or "sum"
    through_sigma: bool = True          # the gradient also flows through sigma_B

    def __post_init__(self) -> None:
        for name in ("lam", "tau"):
            v = getattr(self, name)
            if not isinstance(v, int | float | np.floating | np.integer) or isinstance(v, bool):
                raise ValueError(f"penalty {name} must be a finite number >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        self.validate()

    def validate(self) -> None:
        check_choice("gamma/sigma penalty form", self.form, PENALTY_FORMS)
        check_choice("reduction", self.reduction, PENALTY_REDUCTIONS)
        for name in ("lam", "tau"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"penalty {name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def of(cls, value) -> PenaltyConfig | None:
        """None (or ``{}``), a PenaltyConfig, or its fields as a dict (``kind``, if given, must
        be ``"gamma_sigma"``)."""
        if value is None or isinstance(value, PenaltyConfig):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"a penalty is a PenaltyConfig, a dict or None, got {value!r}")
        if not value:
            return None
        d = dict(value)
        kind = d.pop("kind", "gamma_sigma")
        if kind != "gamma_sigma":
            raise ValueError(f"unknown penalty kind {kind!r}; valid choices: gamma_sigma")
        valid = {f.name for f in fields(cls)}
        if set(d) - valid:
            raise ValueError(f"unknown penalty option(s) {sorted(set(d) - valid)}; valid: "
                             f"{sorted(valid)}")
        if "lam" not in d:
            raise ValueError("a gamma/sigma penalty needs 'lam'")
        return cls(**d)

    @property
    def label(self) -> str:
        """``gamma_sigma form=square lam=0.1`` (tau for the hinge; other options where they
        differ from their defaults)."""
        parts = {"form": self.form, "lam": self.lam}
        if self.form == "hinge":
            parts["tau"] = self.tau
        if self.reduction != "mean":
            parts["reduction"] = self.reduction
        if not self.through_sigma:
            parts["through_sigma"] = False
        return " ".join(["gamma_sigma", *(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in sorted(parts.items()))])


def _ratio(gamma: Tensor | None, sigma: Tensor) -> Tensor:
    """|gamma| / sigma_B per channel (``gamma`` None: a BN layer without affine parameters,
    whose scale is 1)."""
    return (torch.ones_like(sigma) if gamma is None else gamma.float().abs()) / sigma


class GammaSigmaPenalty:
    """Penalty on gamma/sigma_B over every BatchNorm channel, sigma_B from the current batch.

    Parameters
    ----------
    lam:
        Strength lambda (>= 0). ``lam=0`` adds an exact zero and captures nothing, so training
        is bit-for-bit the same as with no regularizer (a test checks this).
    form:
        ``"square"``: (gamma / sigma_B)^2, pulls every ratio towards 0.
        ``"hinge"``: relu(|gamma| / sigma_B - tau)^2, only ratios above ``tau`` are penalised,
        so channels that do not amplify (ratio <= tau) are left alone.
    tau:
        Hinge threshold (ignored by ``"square"``). tau = 1 is the point where the theory's
        amplification factor (gamma/sigma)^2 exceeds 1.
    reduction:
        ``"mean"`` (default) over all channels of all BN layers pooled, so lambda means the same
        thing for a narrow and a wide or deep network; ``"sum"`` scales with the channel count.
    through_sigma:
        If True (default) the gradient also flows through sigma_B into the weights of the layers
        before each BN. sigma_B scales with the norm of the preceding filter, to which BN makes
        the output invariant, so the penalty can lower gamma/sigma_B by shrinking gamma or by
        growing those weights. The second route changes no prediction but lowers their effective
        learning rate (their gradient scales as 1/||w||): the same (gamma/sigma)^2 factor the
        theory says speeds up memorization; weight decay pulls the other way. One layer up,
        sigma_B of a deeper BN layer scales with the gamma of the BN layer before it (ReLU in
        between), so the penalty on layer l pushes gamma of layer l-1 UP while the one on layer
        l-1 pushes it down; only products of ratios along the depth are pinned. With a large lam
        this route can inflate the preceding weights in a few steps and drive every ratio far
        below 1 (a test shows the penalty falling; notebook 05 shows what it does to training).
        ``through_sigma=False`` treats sigma_B as a constant (an ablation: only gamma is
        constrained, and the hinge then stops exactly at ratio = tau).

    Only forwards with BN in train mode (batch statistics) and gradients enabled are captured;
    eval-mode forwards (per-epoch evaluation) leave the captured values untouched.
    """

    def __init__(self, lam: float, form: str = "square", tau: float = 1.0, *,
                 reduction: str = "mean", through_sigma: bool = True):
        PenaltyConfig(lam, form, tau, reduction, through_sigma)    # checks every value
        self.lam = float(lam)
        self.form = form
        self.tau = float(tau)
        self.reduction = reduction
        self.through_sigma = bool(through_sigma)
        self._model: nn.Module | None = None
        self._layers: list[tuple[str, nn.modules.batchnorm._BatchNorm]] = []
        self._handles: list = []
        self._sigma: dict[int, Tensor] = {}             # layer index -> (C,) sigma_B of the last batch

    def __repr__(self) -> str:
        return (f"GammaSigmaPenalty(lam={self.lam:g}, form={self.form!r}, tau={self.tau:g}, "
                f"reduction={self.reduction!r}, through_sigma={self.through_sigma})")

    def attach(self, model: nn.Module) -> GammaSigmaPenalty:
        """Register a forward hook on every BatchNorm layer of ``model``; return self.

        A model without BatchNorm is an error: the penalty would be zero and a sweep over lambda
        would silently repeat the same run.
        """
        if self._model is not None:
            if self._model is model:
                return self
            raise RuntimeError("this GammaSigmaPenalty is attached to another model; call .detach() first")
        layers = bn_layers(model)
        if not layers:
            raise ValueError(f"{type(model).__name__} has no BatchNorm layer; the gamma/sigma penalty "
                             "applies to BN models only (norm='bn')")
        self._model, self._layers, self._sigma = model, layers, {}
        self._handles = [m.register_forward_hook(self._make_hook(i)) for i, (_, m) in enumerate(layers)]
        return self

    def detach(self) -> None:
        """Remove the hooks and forget the model (safe to call twice)."""
        for h in self._handles:
            h.remove()
        self._handles, self._layers, self._sigma, self._model = [], [], {}, None

    def _check_attached(self) -> None:
        if self._model is None:
            raise RuntimeError("GammaSigmaPenalty is not attached; call .attach(model) first")

    def _make_hook(self, index: int):
        def hook(module, inputs, output):
            if self.lam == 0.0 or not torch.is_grad_enabled():
                return None
            if not (module.training or module.running_var is None):
                return None                             # running statistics: no batch sigma
            sigma = batch_sigma(module, inputs[0])      # (C,)
            self._sigma[index] = sigma if self.through_sigma else sigma.detach()
            return None
        return hook

    def ratios(self) -> list[Tensor]:
        """|gamma| / sigma_B per layer from the last captured batch (differentiable), one (C,) each."""
        self._check_attached()
        missing = [name for i, (name, _) in enumerate(self._layers) if i not in self._sigma]
        if missing:
            raise RuntimeError("no batch statistics captured for BN layer(s) "
                               f"{', '.join(missing[:3])}{'...' if len(missing) > 3 else ''}: call the "
                               "penalty after a train-mode forward with gradients enabled")
        return [_ratio(m.weight, self._sigma[i]) for i, (_, m) in enumerate(self._layers)]

    def _reduce(self, r: Tensor) -> Tensor:
        """The penalty's form and reduction over the last axis of the ratios ``r``."""
        terms = r.square() if self.form == "square" else torch.relu(r - self.tau).square()
        return terms.mean(-1) if self.reduction == "mean" else terms.sum(-1)

    def penalty(self) -> Tensor:
        """The unscaled penalty (without lam) of the last captured batch, a scalar tensor."""
        return self._reduce(torch.cat(self.ratios()))   # over (sum of C over layers,)

    def per_model(self, gammas: list[Tensor | None], sigmas: list[Tensor]) -> Tensor:
        """lam * penalty of K models trained at once (:func:`bnmem_utils.training.vectorised.train_models`):
        ``gammas[l]`` (K, C) the stacked scales of BN layer l (None: no affine) and ``sigmas[l]``
        (K, C) the sigma_B of its input in each model's current batch -> (K,)."""
        ratios = [_ratio(gamma, sigma if self.through_sigma else sigma.detach())   # (K, C)
                  for gamma, sigma in zip(gammas, sigmas, strict=True)]
        return self.lam * self._reduce(torch.cat(ratios, 1))

    def __call__(self, model: nn.Module) -> Tensor:
        """lam * penalty for the batch just forwarded through ``model``; clears the captured batch."""
        self._check_attached()
        if model is not self._model:
            raise RuntimeError("GammaSigmaPenalty was attached to a different model")
        if self.lam == 0.0:
            p = next(model.parameters(), None)
            return torch.zeros((), device=p.device if p is not None else "cpu")
        value = self.lam * self.penalty()
        self._sigma = {}                                # release the batch's graph
        return value


def from_config(config: PenaltyConfig | Mapping | None) -> GammaSigmaPenalty | None:
    """The penalty a run describes: a :class:`PenaltyConfig`, its fields as a dict
    (``{"lam": 0.01, "form": "hinge", "tau": 1.0}``) or None (no penalty)."""
    cfg = PenaltyConfig.of(config)
    return None if cfg is None else GammaSigmaPenalty(**asdict(cfg))
