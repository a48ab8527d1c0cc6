"""BN's effect against depth: each claim's BN-against-no-norm number per architecture, with the
architecture's number of BN layers on the axis, and the measured gamma/sigma per layer of each
(the theory amplifies every BN layer's margin growth by (gamma/sigma)^2).
"""

from __future__ import annotations

import functools
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from torch import nn

from bnmem_utils.core.device import git_commit
from bnmem_utils.core.paths import project_root
from bnmem_utils.figures.plotting import panel_grid, save_figure
from bnmem_utils.models.nets import build_model

#: The architectures compared, in order of depth, with the words of their rows.
ARCH_WORDS = {"lenet": "LeNet", "resnet20": "ResNet-20", "densenet": "DenseNet"}


@functools.cache
def bn_layers(arch: str) -> int:
    """The number of BatchNorm layers of ``arch`` built with BN (1 channel, 28x28)."""
    model = build_model(arch, "bn", in_channels=1, num_classes=10, image_size=28)
    return sum(isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)) for m in model.modules())


def _claim_panel(ax, rows: pd.DataFrame, cid: str, label: str) -> None:
    """One claim: each architecture's number and interval at its count of BN layers."""
    for _, r in rows.sort_values("bn_layers").iterrows():
        err = [[r["value"] - r["lo"]], [r["hi"] - r["value"]]] if np.isfinite(r["lo"]) else None
        ax.errorbar(r["bn_layers"], r["value"], yerr=err, fmt="o", capsize=3, color="C0")
        setting = r["setting"].split(", ")[0]
        ax.annotate(f"{setting}\n{r['verdict']}", (r["bn_layers"], r["value"]), fontsize=7,
                    xytext=(5, 0), textcoords="offset points", va="center")
    ax.axhline(1.0 if cid.startswith("C2") else 0.0, color="0.5", lw=0.8, ls=":")
    ticks = rows.drop_duplicates("arch").sort_values("bn_layers")
    ax.set_xscale("log")
    ax.set_xticks(ticks["bn_layers"], [f"{w}\n({n} BN)" for w, n in
                                       zip(ticks["arch_words"], ticks["bn_layers"])])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_xlim(2.5, 90)
    ax.set_title(f"{cid}: {label}", fontsize=9)


def plot_depth(points: pd.DataFrame, layers: pd.DataFrame, claims: dict[str, str]):
    """One panel per claim (``claims``: id -> axis label): each architecture's number with its
    95% interval at its count of BN layers (log axis), labelled with its setting and verdict; a
    last panel with the median gamma/sigma of each BN layer (over channels and seeds) against
    the layer's relative depth, with the interquartile range, per architecture."""
    fig, axes = panel_grid(2, 2, 4.6, 3.2)
    axes = np.atleast_1d(axes).ravel()
    for ax, (cid, label) in zip(axes, claims.items(), strict=False):
        _claim_panel(ax, points[points["claim"] == cid], cid, label)
    ax = axes[-1]
    for i, (arch, frame) in enumerate(layers.groupby("arch", sort=False)):
        frame = frame.sort_values("position")
        ax.plot(frame["position"], frame["median"], marker=".", color=f"C{i + 1}",
                label=ARCH_WORDS.get(arch, arch))
        ax.fill_between(frame["position"], frame["q25"], frame["q75"], color=f"C{i + 1}",
                        alpha=0.2)
    ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("relative depth of the BN layer (0 first, 1 last)")
    ax.set_title("gamma/sigma per BN layer (median, IQR over channels)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def depth_layers(root: Path | None = None):
    """The median and quartiles of gamma/sigma (running statistics) per BN layer of each BN
    network, over channels, seeds and settings, from notebook 02's ``02_gamma_sigma.csv`` of
    ``fmnist`` (the LeNet) and ``archs``; ``position``: the layer's depth over the deepest's."""
    root = root or project_root()
    frames = []
    for profile, archs in (("fmnist", ("lenet",)), ("archs", ("resnet20", "densenet"))):
        path = root / "figures" / profile / "02_gamma_sigma.csv"
        if path.exists():
            f = pd.read_csv(path)
            frames.append(f[(f["norm"] == "bn") & f["arch"].isin(archs)])
    if not frames:
        return pd.DataFrame(columns=["arch", "depth", "position", "median", "q25", "q75"])
    f = pd.concat(frames)
    g = f.groupby(["arch", "depth"], sort=False)["ratio"]
    out = pd.DataFrame({"median": g.median(), "q25": g.quantile(0.25),
                        "q75": g.quantile(0.75)}).reset_index()
    out["position"] = out["depth"] / out.groupby("arch")["depth"].transform("max").clip(lower=1)
    return out


def save_depth_figure(points: pd.DataFrame, claims: dict[str, str], folder: Path,
                      root: Path | None = None, *, name: str,
                      parameters: dict | None = None) -> Path:
    """``folder/<name>.{pdf,png,csv}`` (of the profile ``folder`` is named for): the ``claims``'
    ``points`` (one row per claim and architecture, :func:`bnmem_utils.run.docs.depth_points`)
    against each network's number of BN layers, beside the gamma/sigma per BN layer of
    :func:`depth_layers` (of ``root``); its manifest entry carries ``parameters`` and the commit
    of the code that drew it."""
    layers = depth_layers(root)
    fig = plot_depth(points, layers, claims)
    deep = sorted(set(points.loc[points["arch"] != "lenet", "profile"]))
    save_figure(fig, name, _one_csv(points, layers), folder=folder, profile=folder.name,
                parameters=parameters, commit=git_commit(),
                description="BN minus no norm against the network's number of BN layers "
                            f"(LeNet from fmnist, ResNet-20 and DenseNet-BC from {', '.join(deep)}, "
                            "Fashion-MNIST's rows where there are any), and gamma/sigma per BN "
                            "layer of each")
    plt.close(fig)
    return folder / f"{name}.png"


def _one_csv(points, layers):
    """The figure's two tables as one CSV: a ``part`` column says which."""
    return pd.concat([points.assign(part="claims"), layers.assign(part="gamma_sigma")],
                     ignore_index=True)
