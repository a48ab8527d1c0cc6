"""Widget explorers that draw right on first display, and their static twins for headless runs.

An explorer here is a column of sliders, a text readout and an image. It draws once when it is
built and then once per slider release: every slider is a ``SelectionSlider`` over exact values
(its initial value is one of them, so the browser never snaps it and never starts a second
redraw) with ``continuous_update=False``, and the figure is rendered to PNG bytes and put into
an ``ipywidgets.Image`` in one assignment, so no half-drawn output area is ever shown. Figures
are made with :class:`matplotlib.figure.Figure`, not pyplot, so the inline backend never shows
a stray copy.

Under papermill (:func:`bnmem_utils.notebook.in_papermill`) a notebook calls the explorer's
``show_*`` twin instead, which prints the same readout and displays the default view as a
figure: the exported HTML then holds an image, not an empty widget box.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["Explorer", "SampleExplorer", "figure_png", "most_exposed", "new_figure",
           "plot_sample_privacy", "sample_explorer", "sample_privacy", "selection_slider",
           "setting_groups", "show_sample_privacy", "show_static"]


def new_figure(figsize=(6.4, 3.0)) -> Figure:
    """A figure outside pyplot (never shown by the inline backend on its own)."""
    return Figure(figsize=figsize, layout="constrained")


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _IMAGE_LAYOUT():  # noqa: N802 (a constant, made fresh for each widget)
    """The image at its own size: a VBox would stretch it to the row's width, blurring it."""
    import ipywidgets as widgets

    return widgets.Layout(align_self="flex-start", max_width="100%", height="auto")


def _label(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def selection_slider(name: str, options: Sequence, value, *, label: Callable | None = None,
                     description: str | None = None):
    """A ``SelectionSlider`` over the exact ``options`` starting at ``value`` (which must be one
    of them), updating on release only."""
    import ipywidgets as widgets

    options = list(options)
    if not any(o == value for o in options):
        raise ValueError(f"initial value {value!r} of slider {name!r} is not among its options "
                         f"{options}")
    fmt = label or _label
    return widgets.SelectionSlider(
        options=[(fmt(o), o) for o in options], value=value, description=description or name,
        continuous_update=False, style={"description_width": "initial"},
        layout=widgets.Layout(width="420px"))


class Explorer:
    """Sliders, a readout and an image; ``view(**values) -> (text, figure)`` makes one view.

    ``sliders`` maps a keyword of ``view`` to ``(options, initial value)`` (or to a ready
    widget with a ``value``). The first view is drawn in the constructor, once; each later
    slider release draws one more. ``draws`` counts the views drawn (tests read it).
    """

    def __init__(self, view: Callable[..., tuple[str, Figure]],
                 sliders: Mapping[str, object], *, title: str = "",
                 labels: Mapping[str, Callable] | None = None,
                 descriptions: Mapping[str, str] | None = None):
        import ipywidgets as widgets

        self._view = view
        self.draws = 0
        self.sliders = {}
        for name, spec in sliders.items():
            if hasattr(spec, "observe"):
                self.sliders[name] = spec
            else:
                options, value = spec
                self.sliders[name] = selection_slider(
                    name, options, value, label=(labels or {}).get(name),
                    description=(descriptions or {}).get(name))
        self.readout = widgets.HTML(layout=widgets.Layout(min_height="3em"))
        self.readout.add_class("bnmem-readout")
        self.image = widgets.Image(format="png", layout=_IMAGE_LAYOUT())
        self.image.add_class("bnmem-figure")
        head = [widgets.HTML(f"<b>{title}</b>")] if title else []
        self.widget = widgets.VBox([*head, *self.sliders.values(), self.readout, self.image])
        self.widget.add_class("bnmem-explorer")
        self.redraw()
        for slider in self.sliders.values():
            slider.observe(self._changed, names="value")

    def values(self) -> dict:
        return {name: s.value for name, s in self.sliders.items()}

    def _changed(self, change) -> None:
        if change.get("old") != change.get("new"):
            self.redraw()

    def redraw(self) -> None:
        """Draw the view of the sliders' current values: readout, then image, each in one
        assignment."""
        import html

        text, fig = self._view(**self.values())
        self.readout.value = f"<pre style='margin:0'>{html.escape(text)}</pre>"
        self.image.value = figure_png(fig)
        self.draws += 1

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def show_static(text: str, fig: Figure) -> None:
    """Headless twin of an explorer: print the readout and display the figure (an image in the
    executed notebook and in its HTML export)."""
    from IPython.display import Image, display

    print(text)
    display(Image(data=figure_png(fig)))


# --------------------------------------------------------------------------------------------
# Notebook 04: one training sample's privacy exposure, BN next to no norm
# --------------------------------------------------------------------------------------------


def setting_groups(banks) -> dict[str, list]:
    """The banks of each setting (data set, architecture, corruption and everything else but
    the norm), ``{"digits/lenet, OOD 1%": [bn_bank, none_bank, ...]}`` in the order given.

    The banks of one group share their pool, labels and keep matrix: all three depend on the
    data set, the corruption and the seed, never on the norm (:func:`bnmem_utils.bank.keep_matrix`,
    :func:`bnmem_utils.bank.prepare_data`), so a sample's numbers compare across norms.
    """
    groups: dict = {}
    for b in banks:
        groups.setdefault(b.config.replace(norm="bn"), []).append(b)
    return {f"{k.dataset}/{k.arch}, {k.setting}": v for k, v in groups.items()}


def _check_shared(banks) -> None:
    first = banks[0]
    for b in banks[1:]:
        if not (np.array_equal(b.keep, first.keep) and np.array_equal(b.labels, first.labels)
                and np.array_equal(b.kind, first.kind)):
            raise ValueError(f"banks {first.config.arm} and {b.config.arm} do not share their "
                             "pool and keep matrix; compare banks of one setting only")


_POOLS: dict = {}


def pool_images(config, data=None) -> np.ndarray:
    """The pool of a bank as a float array (M, C, H, W) on the CPU: from ``data`` (a
    :class:`bnmem_utils.bank.BankData`) when given, else rebuilt with
    :func:`bnmem_utils.bank.prepare_data` (the same corruption, seeded) and kept in memory."""
    if data is not None:
        return data.x.detach().cpu().numpy()
    key = config.replace(norm="bn")
    if key not in _POOLS:
        from .bank import prepare_data

        _POOLS[key] = prepare_data(config, "cpu").x.numpy()
    return _POOLS[key]


def _attack_scores(bank, attack: str) -> np.ndarray:
    """(N, M) leave-one-out attack scores of every target, reusing the bank's cached evaluation."""
    for loo in bank._loo.values():
        if attack in loo.member_scores:
            return loo.member_scores[attack]
    from . import attacks

    return bank.evaluate((attack, *(a for a in attacks.ATTACKS if a != attack))).member_scores[attack]


def exposure(bank, attack: str = "lira_online") -> np.ndarray:
    """(M,) how exposed each sample is: the mean attack score it gets from the targets that
    trained on it (each target attacked with the other models as shadows)."""
    s = _attack_scores(bank, attack)
    keep = bank.keep
    return np.where(keep, s, 0.0).sum(axis=0) / keep.sum(axis=0)


def most_exposed(banks, k: int = 20, attack: str = "lira_online", norm: str = "bn") -> list[int]:
    """Indices of the ``k`` samples most exposed under the ``norm`` bank of a setting (the first
    bank when there is none of that norm), most exposed first."""
    b = next((b for b in banks if b.config.norm == norm), banks[0])
    return [int(i) for i in np.argsort(-exposure(b, attack), kind="stable")[:k]]


def sample_privacy(banks, index: int, *, target: int = 0, attack: str = "lira_online",
                   query: int = 0) -> pd.DataFrame:
    """One pool sample seen by each bank of a setting (BN next to no norm): one row per bank.

    Columns: ``norm``, ``arm``, ``index``, ``label`` (trained on), ``kind`` (clean, flipped,
    ood), ``target``, ``member`` (did the target train on it), ``target_score`` (the target's
    LiRA score ``log p_y - log sum_{y' != y} p_y'`` on the sample, query ``query``, eval mode),
    ``in_scores`` / ``out_scores`` (the same score under the shadows, the other N - 1 models,
    that did / did not train on it), ``attack_score`` (the leave-one-out attack's membership
    score for the target: LiRA's log-likelihood ratio, averaged over the queries), ``exposure``
    (:func:`exposure`), ``memorization`` (Feldman-Zhang: accuracy of the models that trained on
    it minus that of the others), ``acc_in`` and ``acc_out``.
    """
    from .data import KIND_NAMES

    banks = list(banks)
    if not banks:
        raise ValueError("no banks given")
    _check_shared(banks)
    n, m = banks[0].keep.shape
    if not 0 <= int(index) < m:
        raise ValueError(f"sample index {index} is out of range: the pool has {m} samples (0..{m - 1})")
    if not 0 <= int(target) < n:
        raise ValueError(f"target model {target} is out of range: the bank has {n} models (0..{n - 1})")
    j, t = int(index), int(target)
    rows = []
    for b in banks:
        keep_j = b.keep[:, j]
        shadows = np.arange(n) != t
        s = b.scores[:, j, query]
        correct = b.correct[:, j]
        rows.append({
            "norm": b.config.norm, "arm": b.config.arm, "index": j, "label": int(b.labels[j]),
            "kind": KIND_NAMES.get(int(b.kind[j]), str(b.kind[j])), "target": t,
            "member": bool(keep_j[t]), "target_score": float(s[t]),
            "in_scores": s[shadows & keep_j], "out_scores": s[shadows & ~keep_j],
            "attack_score": float(_attack_scores(b, attack)[t, j]),
            "exposure": float(exposure(b, attack)[j]),
            "memorization": float(b.memorization()[j]),
            "acc_in": float(correct[keep_j].mean()), "acc_out": float(correct[~keep_j].mean()),
        })
    return pd.DataFrame(rows)


def format_sample_privacy(df: pd.DataFrame, attack: str = "lira_online") -> str:
    """The readout of :func:`sample_privacy`: the sample, then one line per norm."""
    from .plotting import NORM_LABELS

    r0 = df.iloc[0]
    kind = {"clean": "clean sample", "flipped": "label flipped", "ood": "OOD insert"}.get(
        r0["kind"], r0["kind"])
    lines = [f"sample #{r0['index']}: label {r0['label']} (trained on), {kind}; target model "
             f"{r0['target']} {'trained on it (member)' if r0['member'] else 'did not train on it'}",
             f"{'':<11}{'target score':>13}{attack + ' score':>20}{'exposure':>10}"
             f"{'memorization':>14}{'acc IN':>8}{'acc OUT':>9}"]
    for _, r in df.iterrows():
        lines.append(f"{NORM_LABELS.get(r['norm'], r['norm']):<11}{r['target_score']:>13.3f}"
                     f"{r['attack_score']:>20.3f}{r['exposure']:>10.3f}{r['memorization']:>14.3f}"
                     f"{r['acc_in']:>8.2f}{r['acc_out']:>9.2f}")
    return "\n".join(lines)


def plot_sample_privacy(df: pd.DataFrame, image: np.ndarray | None = None, *, fig=None,
                        attack: str = "lira_online"):
    """The sample's image, then one panel per norm: the shadows' scores on it (IN: trained on
    it, OUT: did not) as points with the Gaussians LiRA fits to them, and the target model's
    score as a vertical line. The score panels share their x axis. Returns the figure."""
    from matplotlib.ticker import MaxNLocator

    from .plotting import NORM_LABELS, norm_color

    k = len(df)
    fig = fig if fig is not None else new_figure((3.0 + 3.4 * k, 3.2))
    axes = fig.subplots(1, k + 1, gridspec_kw={"width_ratios": [0.8] + [1.2] * k})
    r0 = df.iloc[0]
    ax = axes[0]
    if image is not None:
        img = np.asarray(image, dtype=float)
        img = img[0] if img.ndim == 3 and img.shape[0] == 1 else np.moveaxis(img, 0, -1) if img.ndim == 3 else img
        lo, hi = float(img.min()), float(img.max())
        ax.imshow((img - lo) / (hi - lo or 1.0), cmap="gray_r" if img.ndim == 2 else None,
                  vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.set_title(f"#{r0['index']}: label {r0['label']}\n{r0['kind']}", fontsize=10)
    allv = np.concatenate([np.atleast_1d(v) for col in ("in_scores", "out_scores")
                           for v in df[col]] + [df["target_score"].to_numpy()])
    allv = allv[np.isfinite(allv)]
    span = (allv.max() - allv.min()) if allv.size else 1.0
    lo, hi = (allv.min() - 0.15 * span - 1e-6, allv.max() + 0.15 * span + 1e-6) if allv.size else (-1, 1)
    grid = np.linspace(lo, hi, 300)
    for ax, (_, r) in zip(axes[1:], df.iterrows(), strict=True):
        colour = norm_color(r["norm"])
        curves = []
        for name, vals, c in (("IN", r["in_scores"], colour), ("OUT", r["out_scores"], "0.45")):
            vals = np.asarray(vals, dtype=float)
            if vals.size:
                # centre and spread as LiRA fits them (median; a floor when one shadow is all)
                mu, sd = float(np.median(vals)), max(float(vals.std()), 0.05 * span + 1e-3)
                dens = np.exp(-0.5 * ((grid - mu) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
                curves.append((name, vals, c, dens))
        top = max([float(d.max()) for *_, d in curves] + [1e-3])
        for k_, (name, vals, c, dens) in enumerate(curves):
            ax.plot(grid, dens, color=c, lw=1.8, label=f"{name} shadows ({vals.size})")
            ax.plot(vals, np.full(vals.size, -(0.07 + 0.08 * k_) * top), "|", color=c, ms=9,
                    mew=1.5)  # each shadow's score
        ax.axvline(r["target_score"], color="k", lw=1.6, ls="--",
                   label=f"target {r['target']} ({'member' if r['member'] else 'non-member'})")
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # labels of neighbouring panels apart
        ax.set_ylim(-0.22 * top, top * 1.75)  # room for the legend above the curves
        ax.set_yticks([])
        ax.set_xlabel("score log p_y - log sum p_y'")
        ax.set_title(f"{NORM_LABELS.get(r['norm'], r['norm'])}: {attack} {r['attack_score']:.2f},"
                     f"\nmemorization {r['memorization']:.2f}", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", frameon=False)
    return fig


def sample_view(banks, index: int, *, target: int = 0, attack: str = "lira_online",
                data=None) -> tuple[str, object]:
    """One view of the per-sample explorer: ``(readout, figure)``."""
    df = sample_privacy(banks, index, target=target, attack=attack)
    image = pool_images(banks[0].config, data)[int(index)]
    return format_sample_privacy(df, attack), plot_sample_privacy(df, image, attack=attack)


def default_sample(banks, attack: str = "lira_online") -> tuple[str, int]:
    """The explorer's first view: the first setting with outliers (else the first), and its
    most exposed sample under BN."""
    groups = setting_groups(banks)
    name = next((g for g, bs in groups.items() if bs[0].outliers.any()), next(iter(groups)))
    return name, most_exposed(groups[name], 1, attack)[0]


class SampleExplorer:
    """Pick a setting and a training sample (by index, or from the most exposed under BN) and a
    target model; see the sample, its score under the target against the IN and OUT shadows,
    its LiRA and memorization scores, BN next to no norm. Drawn once on display, then once per
    change."""

    def __init__(self, banks, *, attack: str = "lira_online", k: int = 20, data=None):
        import ipywidgets as widgets

        self.groups = setting_groups(banks)
        self.attack, self.k, self.data = attack, k, data
        self.draws = 0
        setting, index = default_sample(banks, attack)
        first = self.groups[setting]
        wide = {"style": {"description_width": "initial"}, "layout": widgets.Layout(width="420px")}
        self.setting = widgets.Dropdown(options=list(self.groups), value=setting,
                                        description="setting", **wide)
        self.exposed = widgets.Dropdown(options=self._exposed_options(setting), value=index,
                                        description="most exposed (BN)", **wide)
        self.index = widgets.BoundedIntText(value=index, min=0, max=first[0].n_samples - 1,
                                            description="sample index", **wide)
        self.target = widgets.BoundedIntText(value=0, min=0, max=first[0].n_models - 1,
                                             description="target model", **wide)
        self.readout = widgets.HTML()
        self.readout.add_class("bnmem-readout")
        self.image = widgets.Image(format="png", layout=_IMAGE_LAYOUT())
        self.image.add_class("bnmem-figure")
        self.widget = widgets.VBox([widgets.HTML("<b>one training sample: BN next to no norm</b>"),
                                    self.setting, self.exposed, self.index, self.target,
                                    self.readout, self.image])
        self.widget.add_class("bnmem-explorer")
        self._quiet = False
        self.redraw()
        self.setting.observe(self._setting_changed, names="value")
        self.exposed.observe(self._exposed_changed, names="value")
        self.index.observe(self._changed, names="value")
        self.target.observe(self._changed, names="value")

    def _exposed_options(self, setting: str) -> list[tuple[str, int]]:
        banks = self.groups[setting]
        ranked = most_exposed(banks, self.k, self.attack)
        score = {b.config.norm: exposure(b, self.attack) for b in banks}
        from .data import KIND_NAMES

        b0 = banks[0]
        return [(f"#{i} ({KIND_NAMES.get(int(b0.kind[i]), '?')}, label {int(b0.labels[i])}): "
                 + ", ".join(f"{n} {s[i]:.1f}" for n, s in score.items()), i) for i in ranked]

    def _setting_changed(self, change) -> None:
        banks = self.groups[change["new"]]
        self._quiet = True
        try:
            options = self._exposed_options(change["new"])
            self.exposed.options = options
            self.exposed.value = options[0][1]
            self.index.max = banks[0].n_samples - 1
            self.index.value = options[0][1]
            self.target.max = banks[0].n_models - 1
        finally:
            self._quiet = False
        self.redraw()

    def _exposed_changed(self, change) -> None:
        if change["new"] is not None and not self._quiet:
            self.index.value = change["new"]  # redraws through _changed

    def _changed(self, change) -> None:
        if not self._quiet and change.get("old") != change.get("new"):
            self.redraw()

    def redraw(self) -> None:
        import html

        text, fig = sample_view(self.groups[self.setting.value], self.index.value,
                                target=self.target.value, attack=self.attack, data=self.data)
        self.readout.value = f"<pre style='margin:0'>{html.escape(text)}</pre>"
        self.image.value = figure_png(fig)
        self.draws += 1

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def sample_explorer(banks, *, attack: str = "lira_online", k: int = 20, data=None) -> SampleExplorer:
    """The per-sample privacy explorer of notebook 04 (see :class:`SampleExplorer`)."""
    return SampleExplorer(banks, attack=attack, k=k, data=data)


def show_sample_privacy(banks, *, attack: str = "lira_online", data=None) -> None:
    """The explorer's default view (the most exposed sample of the first outlier setting) as
    printed text and a static figure (for headless runs)."""
    setting, index = default_sample(banks, attack)
    show_static(*sample_view(setting_groups(banks)[setting], index, attack=attack, data=data))


def show_figure(fig) -> None:
    """Display a figure as a PNG image and close it: works under any matplotlib backend (a
    headless run with ``MPLBACKEND=Agg`` included), so an explorer's static view always lands in
    the executed notebook."""
    from IPython.display import Image, display

    display(Image(data=figure_png(fig)))
    try:
        import matplotlib.pyplot as plt

        plt.close(fig)
    except Exception:  # a Figure made outside pyplot
        pass
