"""The reproduction report: the paper's claims against our numbers, and the HTML export.

Each :class:`Claim` names the paper's statement, the results key (written by a notebook through
``nb.record``) that measures it, and a written rule that turns the number and its interval into a
verdict: ``reproduced``, ``not reproduced``, ``inconclusive``, or ``missing`` when the notebook
has not recorded the key for this profile. Nothing is guessed: a missing number stays missing.

Rules (also printed in notebook 06):
- ``effect``: a difference with a 95% interval, claimed positive (BN minus its alternative).
  reproduced when the interval lies above zero; not reproduced when it lies below zero, or when
  the paper states a magnitude and the interval lies below it; inconclusive otherwise.
- ``at_least``: a value that must reach a bound (e.g. a fraction above one half): reproduced when
  its interval (or the value, if it has none) is above the bound, not reproduced when below,
  inconclusive when the interval straddles it.
- ``at_most`` / ``within``: numerical checks of the theory (a relative error at most a tolerance;
  a slope within a tolerance of its predicted value).
"""

from __future__ import annotations

import fnmatch
import html
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .paths import atomic_write_text, figures_dir, runs_dir
from .results import format_result, load_results

VERDICTS = ("reproduced", "not reproduced", "inconclusive", "missing")


@dataclass(frozen=True)
class Claim:
    """One checkable statement of the paper and where this project measures it."""

    id: str
    title: str
    paper: str  # the paper's statement, in its own terms
    notebook: str  # notebook that records the key
    key: str  # results key with value (and lo/hi when it has an interval)
    rule: str  # "effect", "at_least", "at_most" or "within"
    bound: float = 0.0  # the bound of at_least / at_most, the target of within
    tolerance: float = 0.0  # for within
    magnitude: float | None = None  # the paper's stated size of an effect, if any
    figure: str = ""  # stem of the figure that shows it (figures/<profile>/<figure>.png)
    scale: float = 1.0  # display scale (100 for percentage points)
    unit: str = ""
    sign: int = 1  # +1: the paper claims a positive effect; -1: a negative one (a reduction)


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def judge(claim: Claim, entry: dict | None) -> tuple[str, str]:
    """Verdict and a one-line reason for ``claim`` given its results entry (``None``: missing)."""
    if entry is None or entry.get("value") is None:
        return "missing", f"{claim.notebook} recorded no {claim.key!r} for this profile"
    value = _num(entry["value"])
    lo, hi = _num(entry.get("lo")), _num(entry.get("hi"))
    if claim.sign < 0:  # judge the claimed reduction as a positive effect
        value, lo, hi = -value, -hi, -lo
    has_ci = math.isfinite(lo) and math.isfinite(hi)
    if claim.rule == "effect":
        if not has_ci:
            return "inconclusive", "no interval (a single run cannot carry the claim)"
        if lo > 0:
            size = ""
            if claim.magnitude is not None:
                size = (" and reaches the paper's size" if hi >= claim.magnitude
                        else " but stays below the paper's size")
            return "reproduced", f"95% interval above zero{size}"
        if hi < 0:
            return "not reproduced", "95% interval below zero: the opposite effect"
        if claim.magnitude is not None and hi < claim.magnitude:
            return "not reproduced", "95% interval includes zero and excludes the paper's size"
        return "inconclusive", "95% interval includes zero"
    if claim.rule == "at_least":
        low, high = (lo, hi) if has_ci else (value, value)
        if low > claim.bound:
            return "reproduced", f"above {claim.bound:g}"
        if high < claim.bound:
            return "not reproduced", f"below {claim.bound:g}"
        return "inconclusive", f"interval straddles {claim.bound:g}"
    if claim.rule == "at_most":
        ok = value <= claim.bound
        return ("reproduced" if ok else "not reproduced"), f"{value:.3g} {'<=' if ok else '>'} {claim.bound:g}"
    if claim.rule == "within":
        ok = abs(value - claim.bound) <= claim.tolerance
        return (("reproduced" if ok else "not reproduced"),
                f"|{value:.4g} - {claim.bound:g}| {'<=' if ok else '>'} {claim.tolerance:g}")
    raise ValueError(f"unknown rule {claim.rule!r}; valid choices: effect, at_least, at_most, within")


def _matches(claim: Claim, recorded: dict) -> list[tuple[str, dict | None]]:
    """The results entries a claim's key (a glob pattern, e.g. ``lira_auc_diff_bn_none_*_all``)
    matches; one ``(key, None)`` when nothing matches, so the claim is listed as missing."""
    if not any(c in claim.key for c in "*?["):
        return [(claim.key, recorded.get(claim.key))]
    hits = [(k, v) for k, v in recorded.items() if fnmatch.fnmatchcase(k, claim.key)]
    return hits or [(claim.key, None)]


def claims_table(claims: list[Claim], profile: str, out_dir: str | os.PathLike | None = None) -> list[dict]:
    """One row per claim and matching key: id, claim, paper, ours (value [lo, hi]), verdict,
    reason, notebook, key, figure. A key pattern matching several settings (architectures,
    outlier rates) gives one row each."""
    results = load_results(profile, out_dir)
    fig_dir = figures_dir(profile, out_dir)
    rows = []
    for claim in claims:
        recorded = results.get(claim.notebook, {}).get("results", {})
        for key, entry in _matches(claim, recorded):
            rows.append(_row(claim, key, entry, fig_dir))
    return rows


def _row(claim: Claim, key: str, entry: dict | None, fig_dir: Path) -> dict:
    verdict, reason = judge(claim, entry)
    ours = "—"
    if entry is not None and entry.get("value") is not None:
        scaled = dict(entry)
        for k in ("value", "lo", "hi"):
            if isinstance(scaled.get(k), int | float) and not isinstance(scaled.get(k), bool):
                scaled[k] = scaled[k] * claim.scale
        ours = format_result(scaled) + (f" {claim.unit}" if claim.unit else "")
    figure = claim.figure if claim.figure and (fig_dir / f"{claim.figure}.png").exists() else ""
    return {"id": claim.id, "claim": claim.title, "paper": claim.paper, "ours": ours,
            "verdict": verdict, "reason": reason, "notebook": claim.notebook, "key": key,
            "figure": figure,
            "value": None if entry is None else entry.get("value"),
            "lo": None if entry is None else entry.get("lo"),
            "hi": None if entry is None else entry.get("hi")}


def claims_markdown(rows: list[dict]) -> str:
    """The claims table as Markdown (for notebooks and the README)."""
    lines = ["| claim | paper | ours (95% CI) | verdict | why | key |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = [f"{r['id']}: {r['claim']}", r["paper"], r["ours"], f"**{r['verdict']}**",
                 r["reason"], f"`{r['key']}`"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def claims_text(rows: list[dict], width: int = 48) -> str:
    """The claims table for a terminal: id, key, ours, verdict."""
    lines = [f"{'claim':<6} {'key':<{width}} {'ours (95% CI)':<34} verdict"]
    for r in rows:
        key = r["key"] if len(r["key"]) <= width else r["key"][: width - 1] + "…"
        lines.append(f"{r['id']:<6} {key:<{width}} {r['ours'][:34]:<34} {r['verdict']}")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    lines.append(", ".join(f"{n} {v}" for v, n in counts.items() if n))
    return "\n".join(lines)


def verdict_counts(rows: list[dict]) -> dict[str, int]:
    """How many rows have each verdict."""
    return {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}


# ------------------------------------------------------------------------------------------
# HTML export
# ------------------------------------------------------------------------------------------

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; }}
table {{ border-collapse: collapse; width: 100%; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
.reproduced {{ color: #0a6b2b; font-weight: bold; }}
.not-reproduced {{ color: #a4161a; font-weight: bold; }}
.inconclusive {{ color: #8a6d00; font-weight: bold; }}
.missing {{ color: #666; font-style: italic; }}
figure {{ display: inline-block; width: 48%; margin: 0.5%; vertical-align: top; }}
figure img {{ width: 100%; }}
figcaption {{ font-size: 0.8em; color: #444; }}
</style></head><body>
{body}
</body></html>
"""


def _rel(target: Path, start: Path) -> str:
    return os.path.relpath(target, start).replace(os.sep, "/")


def export_html(profile: str, claims: list[Claim] | None = None,
                out_dir: str | os.PathLike | None = None) -> Path:
    """Export each executed notebook of ``profile`` to HTML, plus an index page; return its path.

    Reads ``runs/<profile>/NN_*.ipynb`` (written by ``bnmem reproduce``) and writes
    ``runs/<profile>/html/NN_*.html`` and ``runs/<profile>/html/index.html`` with the claims table
    and every figure of ``figures/<profile>/``.
    """
    from nbconvert import HTMLExporter

    run_dir = runs_dir(profile, out_dir)
    html_dir = run_dir / "html"
    html_dir.mkdir(parents=True, exist_ok=True)
    executed = sorted(p for p in run_dir.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("."))
    if not executed:
        raise FileNotFoundError(f"no executed notebooks under {run_dir}; run `bnmem reproduce "
                                f"--profile {profile}` first")
    exporter = HTMLExporter(template_name="lab")
    links = []
    for path in executed:
        body, _ = exporter.from_filename(str(path))
        target = html_dir / f"{path.stem}.html"
        atomic_write_text(target, body)
        links.append(f'<li><a href="{target.name}">{html.escape(path.stem)}</a></li>')

    parts = [f"<h1>bnmem reproduction report: profile <code>{html.escape(profile)}</code></h1>",
             "<p>Companion to <em>Batch Normalization Amplifies Memorization and Privacy Risks</em> "
             "(Doan, Gu and Alouani, arXiv 2605.24420).</p>",
             "<h2>Executed notebooks</h2><ul>" + "".join(links) + "</ul>"]
    fig_dir = figures_dir(profile, out_dir)
    if claims:
        rows = claims_table(claims, profile, out_dir)
        cells = []
        for r in rows:
            fig = (f'<a href="{_rel(fig_dir / (r["figure"] + ".png"), html_dir)}">{r["figure"]}</a>'
                   if r["figure"] else "")
            cells.append(
                "<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in
                                 (f"{r['id']}: {r['claim']}", r["paper"], r["ours"]))
                + f'<td class="{r["verdict"].replace(" ", "-")}">{r["verdict"]}</td>'
                + f"<td>{html.escape(r['reason'])}</td><td>{fig}</td></tr>")
        parts.append("<h2>Claims</h2><table><tr><th>claim</th><th>paper</th><th>ours (95% CI)</th>"
                     "<th>verdict</th><th>why</th><th>figure</th></tr>" + "".join(cells) + "</table>")
    manifest = {}
    if (fig_dir / "manifest.json").exists():
        manifest = json.loads((fig_dir / "manifest.json").read_text())
    figures = sorted(fig_dir.glob("*.png")) if fig_dir.is_dir() else []
    if figures:
        parts.append("<h2>Figures</h2>")
        for png in figures:
            entry = manifest.get(png.stem, {})
            caption = f"{png.stem} ({entry.get('notebook', '?')}, commit {entry.get('commit', '?')})"
            parts.append(f'<figure><a href="{_rel(png, html_dir)}"><img src="{_rel(png, html_dir)}" '
                         f'alt="{html.escape(png.stem)}"></a><figcaption>{html.escape(caption)}'
                         "</figcaption></figure>")
    index = html_dir / "index.html"
    atomic_write_text(index, _PAGE.format(title=f"bnmem report ({profile})", body="\n".join(parts)))
    return index


def claims_json(rows: list[dict]) -> str:
    """Rows as JSON (what ``bnmem report`` writes beside the HTML)."""
    return json.dumps(rows, indent=1, default=str) + "\n"


def claim_dicts(claims: list[Claim]) -> list[dict]:
    """Claims as plain dicts, for display."""
    return [asdict(c) for c in claims]


def plot_claims(rows: list[dict], ax=None):
    """Forest plot of every row with an interval: our value and 95% CI, verdict-coloured; return ax."""
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["value"] is not None and r["lo"] is not None
             and r["hi"] is not None and isinstance(r["value"], int | float)]
    ax = ax if ax is not None else plt.gca()
    colours = {"reproduced": "#0a6b2b", "not reproduced": "#a4161a", "inconclusive": "#8a6d00"}
    for i, r in enumerate(shown):
        c = colours.get(r["verdict"], "#666666")
        ax.errorbar(r["value"], i, xerr=[[r["value"] - r["lo"]], [r["hi"] - r["value"]]],
                    fmt="o", color=c, capsize=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(shown)), [f"{r['id']} {r['key']}" for r in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("our value with 95% interval (native units: fractions, AUC, ratios)")
    return ax


def rows_frame(rows: list[dict]):
    """The claims rows as a pandas DataFrame (columns in reading order)."""
    import pandas as pd

    cols = ["id", "claim", "paper", "ours", "verdict", "reason", "notebook", "key", "figure",
            "value", "lo", "hi"]
    return pd.DataFrame(rows, columns=cols)


#: The paper's claims (docs/paper.md) and the results keys that measure them. A key may be
#: a glob pattern: each matching key (one per architecture, data set or outlier setting) is a row.
CLAIMS: list[Claim] = [
    Claim("C1a", "BN memorizes corrupted samples faster (at epoch 10)",
          "with BN, corrupted samples are fitted faster (lower loss sooner)",
          "02_forced_memorization", "mem_diff_bn_none_*_at10", "effect",
          figure="02_memorization_curves", scale=100, unit="pt"),
    Claim("C1b", "BN memorizes corrupted samples to higher final accuracy",
          "with BN, corrupted samples are fitted to higher final accuracy",
          "02_forced_memorization", "mem_diff_bn_none_*_final", "effect",
          figure="02_memorization_curves", scale=100, unit="pt"),
    Claim("C2a", "noisy samples' gradient norms sit above clean ones' (BN)",
          "in BN models noisy samples' gradient norms are shifted clearly above clean samples'",
          "03_gradient_norms", "gn_ratio_bn_*_final", "at_least", bound=1.0,
          figure="03_ecdf_final"),
    Claim("C2b", "BN's noisy gradient norms above no norm's (final epoch)",
          "... and above the noisy samples of the BN-free model",
          "03_gradient_norms", "gn_bn_over_none_noisy_*_final", "at_least", bound=1.0,
          figure="03_bn_over_other_noisy"),
    Claim("C2c", "BN's noisy gradient norms above no norm's (at BN's peak epoch)",
          "... and above the noisy samples of the BN-free model",
          "03_gradient_norms", "gn_bn_over_none_noisy_*_at_bn_peak", "at_least", bound=1.0,
          figure="03_bn_over_other_noisy"),
    Claim("C3a", "BN raises LiRA AUC with outliers (direction)",
          "BN models give consistently higher attack AUC",
          "04_lira", "lira_auc_diff_bn_none_*_ood*_all", "effect", figure="04_roc_loglog",
          scale=100, unit="pt"),
    Claim("C3b", "... by at least 3 points at 1% outliers",
          "AUC rises by at least 3 points with 1% outliers",
          "04_lira", "lira_auc_diff_bn_none_*_ood1_all", "at_least", bound=0.03,
          figure="04_roc_loglog", scale=100, unit="pt"),
    Claim("C3c", "... by at least 4 points at 5% outliers",
          "AUC rises by at least 4 points with 5% outliers",
          "04_lira", "lira_auc_diff_bn_none_*_ood5_all", "at_least", bound=0.04,
          figure="04_roc_loglog", scale=100, unit="pt"),
    Claim("C3d", "BN raises LiRA AUC on clean data too",
          "the trend holds on clean data sets",
          "04_lira", "lira_auc_diff_bn_none_*_clean_all", "effect", figure="04_roc_loglog",
          scale=100, unit="pt"),
    Claim("T1a", "margin growth ratio = (gamma/sigma)^2, fixed statistics",
          "BN multiplies the per-step margin growth on an outlier by (gamma/sigma)^2",
          "01_theory", "theory_max_rel_error", "at_most", bound=1e-3,
          figure="01_ratio_vs_gamma_sigma"),
    Claim("T1b", "log-log slope of the ratio against gamma/sigma is 2",
          "the amplification is quadratic in gamma/sigma",
          "01_theory", "theory_loglog_slope", "within", bound=2.0, tolerance=0.01,
          figure="01_ratio_vs_gamma_sigma"),
    Claim("T1c", "full BN approaches (gamma/sigma)^2 ‖x-xbar‖²/‖x‖² (offset orthogonal to w)",
          "with gradients through the batch statistics the ratio tends to the same factor",
          "01_theory", "theory_fullbn_over_paper_at_largest", "within", bound=1.0,
          tolerance=0.02, figure="01_fullbn_convergence"),
    Claim("T1d", "... and for an outlier offset not orthogonal to w (cosine 0.3)",
          "with gradients through the batch statistics the ratio tends to the same factor",
          "01_theory", "theory_fullbn_over_paper_aligned", "within", bound=1.0,
          tolerance=0.02, figure="01_fullbn_convergence"),
    Claim("T2a", "the outlier dominates the gamma gradient while being fitted",
          "an outlier's pull on gamma dominates the batch's",
          "01_theory", "theory_outlier_share_excess", "effect", figure="01_gamma_trajectories"),
    Claim("T2b", "an outlier in the batch makes gamma grow more",
          "outliers drive gamma to grow (a self-reinforcing loop)",
          "01_theory", "theory_gamma_growth_diff", "effect", figure="01_gamma_trajectories"),
    Claim("T3", "most BN channels of trained networks have gamma/sigma > 1",
          "measured gamma/sigma ratios are above 1 in most cases",
          "02_forced_memorization", "mem_t3_frac_above1_*", "at_least", bound=0.5,
          figure="02_gamma_sigma"),
    Claim("M1", "the gamma/sigma penalty cuts memorization of corrupted samples",
          "constraining gamma/sigma cuts memorization markedly",
          "05_mitigation", "mit_d_mem_chosen", "effect", sign=-1, figure="05_tradeoff",
          scale=100, unit="pt"),
    Claim("M2", "... while clean test accuracy stays (within 1 point)",
          "clean-data performance stays",
          "05_mitigation", "mit_d_acc_chosen", "at_least", bound=-0.01, figure="05_tradeoff",
          scale=100, unit="pt"),
]
