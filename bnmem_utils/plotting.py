"""One plotting style and one ``save_figure`` that every notebook uses.

``save_figure`` writes PDF (embedded TrueType fonts) + PNG + the CSV of the plotted data and adds
an entry to ``figures/<profile>/manifest.json`` (and its Markdown twin ``manifest.md``) naming the
notebook, profile, parameters and commit that made the figure.

Outputs are byte-identical across reruns of the same data: the PDF and PNG carry fixed metadata
(no creation date), every CSV is written with one float format (:data:`CSV_FLOAT_FORMAT`, so a
float32 column and its float64 copy read back from a cache give the same text), and the manifest
holds no wall-clock time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from .paths import atomic_path, atomic_write_text

#: The one float format of every figure CSV (6 significant digits: float32 and float64 agree).
CSV_FLOAT_FORMAT = "%.6g"
#: Fixed figure metadata: no creation date, so saving the same figure twice gives the same bytes.
FIGURE_METADATA = {
    "pdf": {"CreationDate": None, "ModDate": None, "Producer": "bnmem (matplotlib)"},
    "png": {"Software": "bnmem (matplotlib)"},
}

NORM_ORDER = ("bn", "none", "gn", "ln")
NORM_LABELS = {"bn": "BatchNorm", "none": "no norm", "gn": "GroupNorm", "ln": "LayerNorm"}
_PALETTE = sns.color_palette("colorblind")
NORM_COLORS = {"bn": _PALETTE[3], "none": _PALETTE[0], "gn": _PALETTE[2], "ln": _PALETTE[4]}


def norm_color(norm: str):
    """The fixed colour of a norm kind (bn, none, gn, ln) in every figure."""
    if norm not in NORM_COLORS:
        raise ValueError(f"unknown norm {norm!r}; valid choices: {', '.join(NORM_ORDER)}")
    return NORM_COLORS[norm]


def set_style() -> None:
    """Seaborn whitegrid, colour-blind palette, embedded fonts in PDF and PS."""
    sns.set_theme(style="whitegrid", palette="colorblind", context="notebook")
    matplotlib.rcParams.update({
        "pdf.fonttype": 42,
        "ps.fonttype": 42,
        "savefig.bbox": "tight",
        "savefig.dpi": 150,
        "figure.dpi": 100,
        "axes.spines.top": False,
        "axes.spines.right": False,
    })


def plot_mean_ci(x, runs, ax=None, *, label=None, color=None, confidence: float = 0.95, **kw):
    """Plot the mean over runs (axis 0 of ``runs``) with a shaded t-interval; return the axes."""
    from scipy import stats as st

    ax = ax if ax is not None else plt.gca()
    runs = np.asarray(runs, dtype=float)
    if runs.ndim == 1:
        runs = runs[None]
    n = np.sum(~np.isnan(runs), axis=0)
    mean = np.nanmean(runs, axis=0)
    (line,) = ax.plot(x, mean, label=label, color=color, **kw)
    if runs.shape[0] > 1:
        sd = np.nanstd(runs, axis=0, ddof=1)
        half = st.t.ppf(0.5 + confidence / 2, np.maximum(n - 1, 1)) * sd / np.sqrt(np.maximum(n, 1))
        ax.fill_between(x, mean - half, mean + half, color=line.get_color(), alpha=0.2, linewidth=0)
    return ax


def _to_frame(data):
    import pandas as pd

    if data is None:
        return None
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, dict):
        lengths = {k: np.size(v) for k, v in data.items()}
        if len(set(lengths.values())) > 1:
            # Ragged columns: write long format (column, index, value).
            rows = [(k, i, v) for k, vals in data.items() for i, v in enumerate(np.ravel(vals))]
            return pd.DataFrame(rows, columns=["series", "index", "value"])
        return pd.DataFrame({k: np.ravel(v) for k, v in data.items()})
    return pd.DataFrame(data)


def save_figure(fig, name: str, data=None, *, folder: str | os.PathLike, notebook: str = "",
                profile: str = "", parameters: dict | None = None, commit: str = "") -> dict:
    """Write ``<folder>/<name>.pdf|.png|.csv`` and a manifest entry; return that entry.

    ``data`` is the plotted data (DataFrame, dict of columns or records), so every figure can be
    re-plotted or checked without re-running the notebook. Notebooks call this through
    :meth:`bnmem_utils.notebook.NotebookContext.save_figure`, which fills in the provenance.
    """
    if not name or any(c in name for c in "/\\ "):
        raise ValueError(f"figure name {name!r} must be non-empty without slashes or spaces")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for ext in ("pdf", "png"):
        path = folder / f"{name}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, metadata=FIGURE_METADATA[ext])
        files.append(path.name)
    frame = _to_frame(data)
    if frame is not None:
        path = folder / f"{name}.csv"
        with atomic_path(path) as tmp:
            frame.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT, lineterminator="\n")
        files.append(path.name)
    entry = {
        "figure": name,
        "notebook": notebook,
        "profile": profile,
        "parameters": parameters or {},
        "commit": commit,
        "files": files,
    }
    _update_manifest(folder, entry)
    return entry


def _update_manifest(folder: Path, entry: dict) -> None:
    path = folder / "manifest.json"
    manifest = {}
    if path.exists():
        try:
            manifest = json.loads(path.read_text())
        except json.JSONDecodeError:
            manifest = {}  # a damaged manifest is rebuilt from the figures saved from now on
    for old in manifest.values():  # entries written before the manifest dropped wall-clock times
        if isinstance(old, dict):
            old.pop("created", None)
    manifest[entry["figure"]] = entry
    manifest = dict(sorted(manifest.items()))
    atomic_write_text(path, json.dumps(manifest, indent=1, default=str) + "\n")
    atomic_write_text(folder / "manifest.md", manifest_markdown(manifest))


def manifest_markdown(manifest: dict) -> str:
    """The manifest as a Markdown table: figure, notebook, profile, commit, parameters."""
    lines = ["# Figure manifest", "",
             "| figure | notebook | profile | commit | parameters |",
             "| --- | --- | --- | --- | --- |"]
    for name, e in manifest.items():
        params = ", ".join(f"{k}={v}" for k, v in e.get("parameters", {}).items()
                           if k not in ("out_dir",))
        link = f"[{name}]({name}.png)"
        lines.append(f"| {link} | {e.get('notebook', '')} | {e.get('profile', '')} | "
                     f"{e.get('commit', '')} | {params.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
