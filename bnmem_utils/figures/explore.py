"""Widget explorers that draw right on first display, and their static twins for headless runs.

An explorer here is a column of sliders, a text readout and an image. It draws once when it is
built and then once per slider release: every slider is a ``SelectionSlider`` over exact values
(its initial value is one of them, so the browser never snaps it and never starts a second
redraw) with ``continuous_update=False``, and the figure is rendered to PNG bytes and put into
an ``ipywidgets.Image`` in one assignment, so no half-drawn output area is ever shown. Figures
are made with :class:`matplotlib.figure.Figure`, not pyplot, so the inline backend never shows
a stray copy.

Under papermill (:func:`bnmem_utils.run.notebook.in_papermill`) a notebook calls the explorer's
``show_*`` twin instead, which prints the same readout and displays the default view as a
figure: the exported HTML then holds an image, not an empty widget box.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bnmem_utils.analyses.theory import explore_ratio, format_exploration
from bnmem_utils.core.outputs import text_html
from bnmem_utils.figures.memorization import plot_curves
from bnmem_utils.figures.plotting import words
from bnmem_utils.figures.privacy import plot_sample_privacy, score_text
from bnmem_utils.figures.theory import plot_exploration
from bnmem_utils.models.nets import NORM_LABELS
from bnmem_utils.privacy import attacks

if TYPE_CHECKING:
    from bnmem_utils.jobs.config import RunConfig


def figure_png(fig: Figure) -> bytes:
    """The figure as PNG bytes (100 dpi)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def selection_slider(name: str, options: Sequence, value, *, description: str | None = None):
    """A ``SelectionSlider`` over the exact ``options`` starting at ``value`` (which must be one
    of them), updating on release only."""
    import ipywidgets as widgets

    options = list(options)
    if not any(o == value for o in options):
        raise ValueError(f"initial value {value!r} of slider {name!r} is not among its options "
                         f"{options}")
    return widgets.SelectionSlider(
        options=[(f"{o:g}" if isinstance(o, float) else str(o), o) for o in options],
        value=value, description=description or name, continuous_update=False,
        style={"description_width": "initial"}, layout=widgets.Layout(width="420px"))


class _Panel:
    """Controls above a readout and an image, drawn once when built and then once per change
    of a control. A subclass gives ``_current_view() -> (text, figure)``; ``draws`` counts the
    views drawn (tests read it)."""

    _quiet = False  # True while one change moves several controls: no redraw per control

    def _build(self, title: str, controls: Sequence) -> None:
        """Lay out the title, ``controls``, the readout and the image; draw the first view."""
        import ipywidgets as widgets

        self.draws = 0
        self.readout = widgets.HTML(layout=widgets.Layout(min_height="3em"))
        self.readout.add_class("bnmem-readout")
        # the image at its own size: a VBox would stretch it to the row's width, blurring it
        self.image = widgets.Image(format="png", layout=widgets.Layout(
            align_self="flex-start", max_width="100%", height="auto"))
        self.image.add_class("bnmem-figure")
        head = [widgets.HTML(f"<b>{title}</b>")] if title else []
        self.widget = widgets.VBox([*head, *controls, self.readout, self.image])
        self.widget.add_class("bnmem-explorer")
        self.redraw()

    def _changed(self, change) -> None:
        if not self._quiet and change.get("old") != change.get("new"):
            self.redraw()

    def redraw(self) -> None:
        """Draw the view of the controls' current values: readout, then image, each in one
        assignment."""
        text, fig = self._current_view()
        self.readout.value = text_html(text)
        self.image.value = figure_png(fig)
        self.draws += 1

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


class Explorer(_Panel):
    """Sliders, a readout and an image; ``view(**values) -> (text, figure)`` makes one view.

    ``sliders`` maps a keyword of ``view`` to ``(options, initial value)``. The first view is
    drawn in the constructor, once; each later slider release draws one more.
    """

    def __init__(self, view: Callable[..., tuple[str, Figure]],
                 sliders: Mapping[str, tuple[Sequence, object]], *, title: str = "",
                 descriptions: Mapping[str, str] | None = None):
        self._view = view
        descriptions = descriptions or {}
        self.sliders = {name: selection_slider(name, options, value,
                                               description=descriptions.get(name))
                        for name, (options, value) in sliders.items()}
        self._build(title, self.sliders.values())
        for slider in self.sliders.values():
            slider.observe(self._changed, names="value")

    def values(self) -> dict:
        return {name: s.value for name, s in self.sliders.items()}

    def _current_view(self) -> tuple[str, Figure]:
        return self._view(**self.values())


def show_static(text: str, fig: Figure) -> None:
    """Headless twin of an explorer: print the readout and display the figure (an image in the
    executed notebook and in its HTML export)."""
    print(text)
    show_figure(fig)


def show_figure(fig) -> None:
    """Display a figure as a PNG image and close it: works under any matplotlib backend (a
    headless run with ``MPLBACKEND=Agg`` included), so an explorer's static view always lands in
    the executed notebook."""
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    display(Image(data=figure_png(fig)))
    plt.close(fig)  # a no-op for a Figure made outside pyplot


# --------------------------------------------------------------------------------------------
# Notebook 04: one training sample's privacy exposure, BN next to no norm
# --------------------------------------------------------------------------------------------


def setting_groups(banks) -> dict[str, list]:
    """The banks of each setting (data set, architecture, corruption and everything else but
    the norm), ``{"digits/lenet, OOD 1%": [bn_bank, none_bank, ...]}`` in the order given.

    The banks of one group share their pool, labels and keep matrix: all three depend on the
    data set, the corruption and the seed, never on the norm (:func:`bnmem_utils.jobs.bank.keep_matrix`,
    :func:`bnmem_utils.jobs.bank.prepare_data`), so a sample's numbers compare across norms.
    """
    groups: dict = {}
    for b in banks:
        groups.setdefault(b.config.replace(norm="bn"), []).append(b)
    return {f"{k.data.dataset}/{k.model.arch}, {k.setting}": v for k, v in groups.items()}


def _check_shared(banks) -> None:
    first = banks[0]
    for b in banks[1:]:
        if not (np.array_equal(b.keep, first.keep) and np.array_equal(b.labels, first.labels)
                and np.array_equal(b.kind, first.kind)):
            raise ValueError(f"banks {first.config.arm} and {b.config.arm} do not share their "
                             "pool and keep matrix; compare banks of one setting only")


_POOLS: dict = {}


def pool_images(config: RunConfig, data=None) -> np.ndarray:
    """The pool of a bank as a float array (M, C, H, W) on the CPU: from ``data`` (a
    :class:`bnmem_utils.jobs.bank.BankData`) when given, else rebuilt with
    :func:`bnmem_utils.jobs.bank.prepare_data` (the same corruption, seeded) and kept in memory."""
    if data is not None:
        return data.x.detach().cpu().numpy()
    key = config.replace(norm="bn")
    if key not in _POOLS:
        from bnmem_utils.jobs.bank_models import prepare_data

        _POOLS[key] = prepare_data(config, "cpu").x.numpy()
    return _POOLS[key]


def _attack_scores(bank, attack: str) -> np.ndarray:
    """(N, M) leave-one-out attack scores of every target, reusing the bank's cached evaluation."""
    for loo in bank._loo.values():
        if attack in loo.member_scores:
            return loo.member_scores[attack]
    return bank.evaluate((attack, *(a for a in attacks.ATTACKS if a != attack))).member_scores[attack]


def headline(banks, attack: str = "auto") -> str:
    """``attack``, or for ``"auto"`` the headline attack of the banks, from the shadows a side
    their keep matrices leave (:func:`bnmem_utils.privacy.attacks.resolve_attack`)."""
    return attacks.resolve_attack(attack, *(banks if isinstance(banks, Sequence) else [banks]))


def exposure(bank, attack: str = "auto") -> np.ndarray:
    """(M,) how exposed each sample is: the mean attack score it gets from the targets that
    trained on it (each target attacked with the other models as shadows)."""
    s = _attack_scores(bank, headline(bank, attack))
    keep = bank.keep
    return np.where(keep, s, 0.0).sum(axis=0) / keep.sum(axis=0)


def most_exposed(banks, k: int = 20, attack: str = "auto", norm: str = "bn") -> list[int]:
    """Indices of the ``k`` samples most exposed under the ``norm`` bank of a setting (the first
    bank when there is none of that norm), most exposed first."""
    b = next((b for b in banks if b.config.model.norm == norm), banks[0])
    return [int(i) for i in np.argsort(-exposure(b, attack), kind="stable")[:k]]


def online_view(bank, attack: str, target: int, index: int, query: int) -> dict | None:
    """What an online LiRA (:data:`bnmem_utils.privacy.attacks.ONLINE`) fits for one sample of
    one target, at one query: the IN and OUT predictives (``loc_``, ``scale_``, ``dof_``), the
    shadows a side ``k``, whether each scale sits at the floor, the per-query log-likelihood
    ratio ``llr`` (the attack's score is its mean over the queries) and ``floors``, how many
    of the ``queries`` have a scale at the floor. None for the other attacks."""
    if attack not in attacks.ONLINE:
        return None
    shadows = np.arange(bank.n_models) != target
    split = attacks.ShadowSplit(bank.keep[shadows], bank.scores[shadows], bank.scores[target])
    fit = attacks.online_fit(split, attacks.ONLINE[attack])
    j, q = int(index), int(query)
    out = {f"{name}_{side}": float(getattr(fit, f"{name}_{side}")[j, q])
           for name in ("loc", "scale", "dof") for side in ("in", "out")}
    floors = fit.floor_in[j] | fit.floor_out[j]
    return {**out, "k": fit.k, "floor_in": bool(fit.floor_in[j, q]),
            "floor_out": bool(fit.floor_out[j, q]), "floors": int(floors.sum()),
            "queries": int(floors.size),
            "llr": float(fit.log_ratio(split.target)[j, q])}


def _why(fit: dict | None, value: float, target_score: float, mean: bool = False) -> str:
    """Why an attack number reaches four digits (``""`` below 1000): a fitted scale at the
    floor, or the target's score far out in the fits' tails."""
    if abs(value) < 1000 or fit is None:
        return ""
    if mean and fit["floors"]:
        return (f"variance at floor in {fit['floors']} of {fit['queries']} queries "
                f"({fit['k']} shadows a side)")
    floor = [s.upper() for s in ("in", "out") if fit[f"floor_{s}"]]
    if floor:
        return f"{' and '.join(floor)} variance at floor ({fit['k']} shadows a side)"
    z = max(abs(target_score - fit[f"loc_{s}"]) / fit[f"scale_{s}"] for s in ("in", "out"))
    return f"target score {z:.0f} scales from a fit's centre ({fit['k']} shadows a side)"


def sample_privacy(banks, index: int, *, target: int = 0, attack: str = "auto",
                   query: int = 0) -> pd.DataFrame:
    """One pool sample seen by each bank of a setting (BN next to no norm): one row per bank.

    Columns: ``norm``, ``arm``, ``index``, ``label`` (trained on), ``kind`` (clean, flipped,
    ood), ``target``, ``member`` (did the target train on it), ``target_score`` (the target's
    LiRA score ``log p_y - log sum_{y' != y} p_y'`` on the sample, query ``query``, eval mode),
    ``in_scores`` / ``out_scores`` (the same score under the shadows, the other N - 1 models,
    that did / did not train on it), ``attack`` (``"auto"`` resolved), ``fit`` (the attack's
    fit at this query, :func:`online_view`; None for an attack that is not an online LiRA),
    ``llr`` (its log-likelihood ratio at this query; NaN without a fit), ``attack_score`` (the
    leave-one-out attack's membership score for the target: for LiRA, the LLR averaged over
    the queries), ``exposure`` (:func:`exposure`), ``reasons`` (``{column: reason}`` beside
    any of those numbers at four digits; ``why``: the same in words), ``memorization`` (Feldman-Zhang: accuracy of the models that
    trained on it minus that of the others), ``acc_in`` and ``acc_out``.
    """
    from bnmem_utils.data.datasets import KIND_NAMES

    banks = list(banks)
    if not banks:
        raise ValueError("no banks given")
    _check_shared(banks)
    attack = headline(banks, attack)
    n, m = banks[0].keep.shape
    if not 0 <= int(index) < m:
        raise ValueError(f"sample index {index} is out of range: the pool has {m} samples (0..{m - 1})")
    if not 0 <= int(target) < n:
        raise ValueError(f"target model {target} is out of range: the bank has {n} models (0..{n - 1})")
    j, t = int(index), int(target)
    rows = []
    for b in banks:
        keep_j, shadows = b.keep[:, j], np.arange(n) != t
        s, correct = b.scores[:, j, query], b.correct[:, j]
        fit = online_view(b, attack, t, j, query)
        row = {"norm": b.config.model.norm, "arm": b.config.arm, "index": j,
               "label": int(b.labels[j]), "kind": KIND_NAMES.get(int(b.kind[j]), str(b.kind[j])),
               "target": t, "member": bool(keep_j[t]), "target_score": float(s[t]),
               "in_scores": s[shadows & keep_j], "out_scores": s[shadows & ~keep_j],
               "attack": attack, "fit": fit, "llr": np.nan if fit is None else fit["llr"],
               "attack_score": float(_attack_scores(b, attack)[t, j]),
               "exposure": float(exposure(b, attack)[j]),
               "memorization": float(b.memorization()[j]),
               "acc_in": float(correct[keep_j].mean()), "acc_out": float(correct[~keep_j].mean()),
               "queries": int(b.scores.shape[2]), "query": _query_name(b.config, query)}
        reasons = _reasons(b, row, attack)
        rows.append({**row, "reasons": reasons,
                     "why": "; ".join(f"{k}: {v}" for k, v in reasons.items())})
    return pd.DataFrame(rows)


def _reasons(bank, row: dict, attack: str) -> dict[str, str]:
    """The reason beside each of a row's four-digit numbers: ``{"LLR" | "score" | "exposure":
    reason}``, empty when none reaches four digits."""
    fit, j = row["fit"], row["index"]
    out = {"LLR": _why(fit, row["llr"], row["target_score"]),
           "score": _why(fit, row["attack_score"], row["target_score"], mean=True)}
    if abs(row["exposure"]) >= 1000:
        s = np.where(bank.keep[:, j], _attack_scores(bank, attack)[:, j], 0.0)
        top = int(np.argmax(np.abs(s)))
        out["exposure"] = f"target {top}'s score {score_text(s[top])} dominates the mean"
    return {k: v for k, v in out.items() if v}


def _query_name(config: RunConfig, query: int) -> str:
    names = config.measure.queries
    return str(names[query]) if query < len(names) else f"query {query}"


def format_sample_privacy(df: pd.DataFrame, attack: str | None = None, note: str = "") -> str:
    """The readout of :func:`sample_privacy`: the sample, one line per norm (each number at four
    digits with its reason beside it), then what each column means (and ``note`` first, e.g.
    that a smoke run's numbers mean nothing)."""
    r0 = df.iloc[0]
    attack = attack or r0.get("attack", "lira_online")
    kind = {"clean": "clean sample", "flipped": "label flipped", "ood": "OOD insert"}.get(
        r0["kind"], r0["kind"])
    q, query = int(r0.get("queries", 1)), r0.get("query", "identity")
    w = len(attack) + 2
    lines = [note] if note else []
    lines += [f"sample #{r0['index']}: label {r0['label']} (trained on), {kind}; target model "
              f"{r0['target']} {'trained on it (member)' if r0['member'] else 'did not train on it'}",
              f"{'':<10}{'target':>9}{'LLR':>10}{attack:>{w}}{'exposure':>10}{'memorization':>13}"
              f"{'acc IN':>8}{'acc OUT':>9}",
              f"{'':<10}{'score':>9}{query[:9]:>10}{'score':>{w}}"]
    for _, r in df.iterrows():
        why = f"  <- {r['why']}" if r.get("why") else ""
        lines.append(f"{NORM_LABELS.get(r['norm'], r['norm']):<10}{r['target_score']:>9.3f}"
                     f"{score_text(r['llr'], 3):>10}{score_text(r['attack_score'], 3):>{w}}"
                     f"{score_text(r['exposure'], 3):>10}{r['memorization']:>13.3f}"
                     f"{r['acc_in']:>8.2f}{r['acc_out']:>9.2f}{why}")
    no_fit = r0.get("fit") is None
    lines += ["", f"target score: log p_y - log sum_(y' != y) p_y' of the target model on the "
              f"sample,\n  {query} query (the dashed line of the plot)",
              (f"LLR: none ({attack} is not an online LiRA; the plot draws each side's median "
               "and standard deviation for the eye)" if no_fit else
               f"LLR: {attack}'s log p_IN - log p_OUT of the target score, {query} query alone,\n"
               "  under the fits drawn (the number in the plot's titles)"),
              f"{attack} score: the attack's membership score for the target"
              + ("" if no_fit else f", the LLR's mean over {q} {'query' if q == 1 else 'queries'}"),
              f"exposure: the mean {attack} score of the sample over every model that trained "
              "on it",
              "memorization: acc IN - acc OUT (Feldman-Zhang); acc IN / acc OUT: the share of "
              "the models\n  that did / did not train on the sample that classify it correctly"]
    return "\n".join(lines)


def sample_view(banks, index: int, *, target: int = 0, attack: str = "auto",
                data=None, note: str = "") -> tuple[str, object]:
    """One view of the per-sample explorer: ``(readout, figure)``, the headline attack by
    default (``"auto"``)."""
    df = sample_privacy(banks, index, target=target, attack=attack)
    image = pool_images(banks[0].config, data)[int(index)]
    return format_sample_privacy(df, note=note), plot_sample_privacy(df, image, note=note)


def default_sample(banks, attack: str = "auto") -> tuple[str, int]:
    """The explorer's first view: the first setting with outliers (else the first), and its
    most exposed sample under BN."""
    groups = setting_groups(banks)
    name = next((g for g, bs in groups.items() if bs[0].outliers.any()), next(iter(groups)))
    return name, most_exposed(groups[name], 1, attack)[0]


class SampleExplorer(_Panel):
    """Pick a setting and a training sample (by index, or from the most exposed under BN) and a
    target model; see the sample, its score under the target against the IN and OUT shadows,
    its LiRA and memorization scores, BN next to no norm. Drawn once on display, then once per
    change. The list of the most exposed shows the typed index when it holds it, and is blank
    otherwise; an index or target out of range is named in the readout, the view kept."""

    def __init__(self, banks, *, attack: str = "auto", k: int = 20, data=None,
                 note: str = ""):
        import ipywidgets as widgets

        self.groups = setting_groups(banks)
        self.attack, self.k, self.data, self.note = headline(banks, attack), k, data, note
        setting, index = default_sample(banks, attack)
        wide = {"style": {"description_width": "initial"}, "layout": widgets.Layout(width="420px")}
        self.setting = widgets.Dropdown(options=list(self.groups), value=setting,
                                        description="setting", **wide)
        self.exposed = widgets.Dropdown(options=self._exposed_options(setting), value=index,
                                        description="most exposed (BN)", **wide)
        # plain integer boxes: a bounded one would clamp an out-of-range entry without a word
        self.index = widgets.IntText(value=index, description="sample index", **wide)
        self.target = widgets.IntText(value=0, description="target model", **wide)
        self._build("one training sample: BN next to no norm",
                    [self.setting, self.exposed, self.index, self.target])
        self.setting.observe(self._setting_changed, names="value")
        self.exposed.observe(self._exposed_changed, names="value")
        self.index.observe(self._index_changed, names="value")
        self.target.observe(self._changed, names="value")

    def _exposed_options(self, setting: str) -> list[tuple[str, int]]:
        banks = self.groups[setting]
        ranked = most_exposed(banks, self.k, self.attack)
        score = {b.config.model.norm: exposure(b, self.attack) for b in banks}
        from bnmem_utils.data.datasets import KIND_NAMES

        b0 = banks[0]
        return [(f"#{i} ({KIND_NAMES.get(int(b0.kind[i]), '?')}, label {int(b0.labels[i])}): "
                 + ", ".join(f"{n} {score_text(s[i], 1)}" + (" (why: readout)" if abs(s[i]) >= 1000
                             else "") for n, s in score.items()), i) for i in ranked]

    def _setting_changed(self, change) -> None:
        self._quiet = True
        try:
            options = self._exposed_options(change["new"])
            self.exposed.options = options
            self.exposed.value = options[0][1]
            self.index.value = options[0][1]
        finally:
            self._quiet = False
        self.redraw()

    def _exposed_changed(self, change) -> None:
        if change["new"] is not None and not self._quiet:
            self.index.value = change["new"]  # redraws through _index_changed

    def _index_changed(self, change) -> None:
        """Keep the list in step with the typed index (blank when it does not hold it)."""
        listed = {v for _, v in self.exposed.options}
        was, self._quiet = self._quiet, True
        try:
            self.exposed.value = change["new"] if change["new"] in listed else None
        finally:
            self._quiet = was
        self._changed(change)

    def redraw(self) -> None:
        """Draw the current view; an index or target out of range is named in the readout and
        the last view stays."""
        try:
            super().redraw()
        except ValueError as exc:
            self.readout.value = text_html(f"{exc}; the view below is the last valid one",
                                              "color:#a4161a")

    def _current_view(self) -> tuple[str, Figure]:
        return sample_view(self.groups[self.setting.value], self.index.value,
                           target=self.target.value, attack=self.attack, data=self.data,
                           note=self.note)


#: The per-sample privacy explorer of notebook 04.
sample_explorer = SampleExplorer


def show_sample_privacy(banks, *, attack: str = "auto", data=None, note: str = "") -> None:
    """The explorer's default view (the most exposed sample of the first outlier setting) as
    printed text and a static figure (for headless runs)."""
    setting, index = default_sample(banks, attack)
    show_static(*sample_view(setting_groups(banks)[setting], index, attack=attack, data=data,
                             note=note))


# --------------------------------------------------------------------------------------------
# The margin-ratio explorer (notebook 01)
# --------------------------------------------------------------------------------------------


#: The explorer's sliders: exact values (a 1-2-5-like grid), so the initial values are hit
#: exactly and never snapped by the browser.
_SCALES = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
           6.0, 8.0, 10.0)
EXPLORER_OPTIONS = {
    "gamma": _SCALES,
    "sigma": _SCALES,
    "distance": (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0),
    "batch_size": (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    "eta": (1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
    "cos": tuple(round(0.05 * k, 2) for k in range(20)) + (0.99,),
}


EXPLORER_DEFAULTS = {"gamma": 2.0, "sigma": 1.0, "distance": 8.0, "batch_size": 32, "eta": 1e-4,
                     "cos": 0.3}


def exploration_view(gamma: float = 2.0, sigma: float = 1.0, distance: float = 8.0,
                     batch_size: int = 32, eta: float = 1e-4, cos: float = 0.3, *, dim: int = 16,
                     seed: int = 0):
    """One view of the explorer: ``(readout text, figure)`` for the given setting."""
    res = explore_ratio(gamma, sigma, distance, batch_size, eta, cos=cos, dim=dim, seed=seed)
    head = (f"gamma {gamma:g}, sigma_B {sigma:g}, outlier distance {distance:g}, batch "
            f"{batch_size}, eta {eta:g}, cos {cos:g}:  (gamma/sigma_B)^2 = {(gamma / sigma) ** 2:.6g}")
    ax = plot_exploration(res)
    ax.set_title(f"gamma/sigma_B = {gamma / sigma:.4g}", fontsize=10)
    return head + "\n" + format_exploration(res), ax.figure


def ratio_explorer(*, cos: float = 0.3, dim: int = 16, seed: int = 0):
    """Sliders for gamma, sigma_B, outlier distance, batch size, eta and the cosine of the
    outlier's offset with w; the measured ratios against their predictions, as text and as a
    chart (:func:`plot_exploration`). Drawn once on display, then once per slider release
    (:class:`Explorer`)."""
    start = {**EXPLORER_DEFAULTS, "cos": cos}
    return Explorer(lambda **v: exploration_view(**v, dim=dim, seed=seed),
                    {k: (EXPLORER_OPTIONS[k], start[k]) for k in EXPLORER_OPTIONS},
                    title="one SGD step on the outlier: BN / no BN",
                    descriptions={"sigma": "sigma_B", "batch_size": "batch size",
                                  "distance": "outlier distance"})


def show_ratio_exploration(*, cos: float = 0.3, dim: int = 16, seed: int = 0) -> None:
    """The explorer's default view as printed text and a static figure (for headless runs)."""
    show_static(*exploration_view(**{**EXPLORER_DEFAULTS, "cos": cos}, dim=dim, seed=seed))


# --------------------------------------------------------------------------------------------
# The curve explorer (notebook 02)
# --------------------------------------------------------------------------------------------


def curve_explorer_default(hist: pd.DataFrame):
    """The explorer's first view as a figure (what headless runs show in its place): the
    accuracy on the corrupted samples in the first setting. Returns ``(fig, data)``."""
    metric = "corrupted_acc" if "corrupted_acc" in hist.columns else next(
        c for c in hist.columns if c.endswith(("_acc", "_loss")))
    first = hist["setting"].iloc[0]
    return plot_curves(hist[hist["setting"] == first], metric)


def curve_explorer(hist: pd.DataFrame):
    """An ipywidgets explorer of the per-epoch curves: pick a metric and a corruption setting,
    see one panel per data set and architecture (interactive use only; nothing depends on it)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    metrics = [c for c in hist.columns
               if c.endswith(("_acc", "_loss")) or c.startswith("gs_") or c == "gamma_abs_mean"]
    settings = list(dict.fromkeys(hist["setting"]))
    metric = widgets.Dropdown(options=[(words(m), m) for m in metrics], value="corrupted_acc" if "corrupted_acc" in metrics
                              else metrics[0], description="metric")
    setting = widgets.Dropdown(options=settings, value=settings[0], description="setting")
    logy = widgets.Checkbox(value=False, description="log y")
    out = widgets.Output()

    def redraw(_=None):
        out.clear_output(wait=True)
        with out:
            fig, _ = plot_curves(hist[hist["setting"] == setting.value], metric.value,
                                 logy=logy.value)
            plt.show()

    for w in (metric, setting, logy):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([metric, setting, logy]), out])
