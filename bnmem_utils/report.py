"""The reproduction report: the paper's claims against our numbers, judged and rendered.

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
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .paths import figures_dir
from .results import format_result, load_results, result_key

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
    #: results keys of the two arms behind a difference, ``{}`` standing for the part of the key
    #: the pattern's ``*`` matched (e.g. ``("lira_auc_bn_{}_all", "lira_auc_none_{}_all")``;
    #: ``{cond}`` and ``{epoch}`` split a ``<condition>_at<epoch>`` part): when both sit at 0%
    #: or 100%, the row says the setting is saturated
    arms: tuple[str, str] | None = None
    setting: str = ""  # the setting in words, for a claim measured in one fixed setting


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def judge(claim: Claim, entry: dict | None) -> tuple[str, str]:
    """Verdict and a one-line reason for ``claim`` given its results entry (``None``: missing)."""
    if entry is None:
        return "missing", f"{claim.notebook} recorded no {claim.key!r} for this profile"
    if entry.get("value") is None:  # recorded without a number: the claim's premise failed
        return "not reproduced", entry.get("description") or "no number: the notebook found none"
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
        reason = f"{value:.3g} {'<=' if ok else '>'} {claim.bound:g}"
    elif claim.rule == "within":
        ok = abs(value - claim.bound) <= claim.tolerance
        reason = f"|{value:.4g} - {claim.bound:g}| {'<=' if ok else '>'} {claim.tolerance:g}"
    else:
        raise ValueError(f"unknown rule {claim.rule!r}; valid choices: effect, at_least, at_most, "
                         "within")
    return ("reproduced" if ok else "not reproduced"), reason


def claims_for_key(key: str, claims: list[Claim] | None = None) -> list[Claim]:
    """The claims whose key pattern matches the results key ``key`` (default: :data:`CLAIMS`),
    so that a notebook judges a number by the claims table's own rules."""
    return [c for c in (CLAIMS if claims is None else claims) if fnmatch.fnmatchcase(key, c.key)]


def _rows(claim: Claim, recorded: dict, parameters: dict | None, fig_dir: Path) -> list[dict]:
    """The claim's rows: one per results entry its key (a glob pattern, e.g.
    ``lira_auc_diff_bn_none_*_all``) matches; one ``missing`` row when nothing matches."""
    hits = [(k, v) for k, v in recorded.items() if fnmatch.fnmatchcase(k, claim.key)]
    return [_row(claim, key, entry, fig_dir, recorded, parameters)
            for key, entry in hits or [(claim.key, None)]]


def claims_table(claims: list[Claim], profile: str,
                 out_dir: str | os.PathLike | None = None) -> list[dict]:
    """One row per claim and matching key: id, claim, paper, ours (value [lo, hi]), verdict,
    reason, notebook, key, figure. A key pattern matching several settings (architectures,
    outlier rates) gives one row each."""
    results = load_results(profile, out_dir)
    fig_dir = figures_dir(profile, out_dir)
    rows = []
    for claim in claims:
        saved = results.get(claim.notebook, {})
        rows += _rows(claim, saved.get("results", {}), saved.get("meta", {}).get("parameters", {}),
                      fig_dir)
    return rows


def notebook_rows(notebook: str, recorded: dict, parameters: dict | None = None,
                  fig_dir: str | os.PathLike = "", claims: list[Claim] | None = None) -> list[dict]:
    """The claims table's rows for the claims ``notebook`` measures, judged from the numbers it
    has just recorded (``{key: entry}``)."""
    return [r for c in (CLAIMS if claims is None else claims) if c.notebook == notebook
            for r in _rows(c, recorded, parameters, Path(fig_dir))]


def notebook_claims(notebook: str, recorded: dict, parameters: dict | None = None,
                    fig_dir: str | os.PathLike = "",
                    claims: list[Claim] | None = None) -> pd.DataFrame:
    """The verdicts of the claims ``notebook`` measures, from the numbers it has just recorded
    (``{key: entry}``), by the same judge as the claims table: a DataFrame with one row per
    claim and setting (claim, setting, ours, verdict, reason). What a notebook shows as its
    conclusion; notebook 06 and ``bnmem report`` judge the saved files the same way."""
    rows = notebook_rows(notebook, recorded, parameters, fig_dir, claims)
    return rows_frame(rows)[["id", "claim", "setting", "ours", "verdict", "reason"]].set_index("id")


class ClaimsView:
    """A notebook's verdicts as it shows them: the claims table's HTML (every cell whole,
    wrapping) in a browser, the text table elsewhere; ``frame`` holds them as a DataFrame.
    ``note`` (e.g. that a smoke run's numbers mean nothing) is shown above the table."""

    def __init__(self, rows: list[dict], note: str = ""):
        self.rows, self.note = rows, note
        self.frame = rows_frame(rows)[["id", "claim", "setting", "ours", "verdict",
                                       "reason"]].set_index("id")

    def _repr_html_(self) -> str:
        note = f"<p><b>{html.escape(self.note)}</b></p>" if self.note else ""
        return note + claims_html(self.rows)

    def __repr__(self) -> str:
        return (f"{self.note}\n" if self.note else "") + claims_text(self.rows)


def _head(pattern: str) -> str | None:
    """A glob pattern's literal head, before its first wildcard (``None``: no wildcard)."""
    first = re.search(r"[*?[]", pattern)
    return pattern[:first.start()] if first else None


def _wildcard_part(pattern: str, key: str) -> str:
    """What a glob pattern's wildcards matched in ``key``: the key between the pattern's literal
    head (before its first wildcard) and tail (after its last): ``digits_lenet_ood1`` for
    ``lira_auc_diff_bn_none_*_ood*_all`` and ``lira_auc_diff_bn_none_digits_lenet_ood1_all``."""
    head = _head(pattern)
    tail = pattern[pattern.rfind("*") + 1:] if "*" in pattern else ""
    if head is None or not (key.startswith(head) and key.endswith(tail)):
        return ""
    return key[len(head):len(key) - len(tail) if tail else None]


_DATASET_WORDS = {"digits": "digits 8x8", "mnist": "MNIST", "fashion_mnist": "Fashion-MNIST",
                  "fmnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}
_ARCH_WORDS = {"lenet": "LeNet", "mlp": "MLP", "resnet18": "ResNet-18", "resnet20": "ResNet-20",
               "densenet": "DenseNet"}
_DEFINITION_WORDS = {"eval": "eval-mode gradients (running BN statistics)",
                     "train": "train-mode gradients (batch BN statistics)"}


def _pct(text: str) -> str:
    return text.replace("p", ".") + "%"


def _corruption_words(slug: str) -> str:
    """``flip_1pct`` -> ``1% label flips``; ``ood_2pct_gaussian`` -> ``2% OOD inserts
    (gaussian)``; ``ood1`` -> ``1% OOD inserts``; ``ood20n`` -> ``20 OOD inserts``; ``clean``."""
    parts = []
    sources = ("gaussian", "uniform", "shuffled", *_DATASET_WORDS)
    for m in re.finditer(r"(flip|ood)_?(\d+(?:[p.]\d+)?)(pct|n)?(?:_([a-z][a-z0-9_]*))?", slug):
        what, amount, unit, rest = m.groups()
        noun = "label flips" if what == "flip" else "OOD inserts"
        count = amount if unit == "n" else _pct(amount)
        source = next((s for s in sources if rest and (rest == s or rest.startswith(s + "_"))), "")
        source = _DATASET_WORDS.get(source, source)
        extra = f" ({source})" if source and what == "ood" else ""
        parts.append(f"{count} {noun}{extra}")
    if parts:
        return " + ".join(parts)
    return "clean data" if "clean" in slug else ""


def setting_words(claim: Claim, key: str, parameters: dict | None = None) -> str:
    """The setting a row measures, in words: data set, model, corruption (and, for gradient
    norms, the definition), read from the key's wildcard part and the notebook's parameters."""
    parameters = parameters or {}
    if _head(key) is not None:  # nothing recorded: the pattern itself, no setting
        return ""
    if not _wildcard_part(claim.key, key):
        if claim.notebook == "05_mitigation" and parameters.get("mit_dataset"):
            ds, arch = parameters["mit_dataset"], parameters.get("mit_arch", "")
            flips = parameters.get("mit_flip_rate")
            where = _join(_DATASET_WORDS.get(ds, ds), _ARCH_WORDS.get(arch, arch),
                          f"{100 * flips:g}% label flips" if flips else "")
            return f"{where}; {claim.setting}" if claim.setting else where
        return claim.setting
    # everything after the pattern's literal head: the fixed tail may name the setting too
    # (``..._ood1_all`` of claim C3b)
    part = key[len(_head(claim.key)):]
    if claim.notebook == "04b_confound":  # BN minus which norm, where, then the setting
        return confound_words(part)
    tokens = part.split("_")
    dataset = next((t for t in _DATASET_WORDS if part.startswith(t + "_") or part == t), None)
    if dataset is None:  # keys without the data set (03; 04 before its keys named it): the
        # notebook's parameters say it
        ds = (parameters.get("lira_datasets") or [None]) if claim.notebook == "04_lira" else [
            parameters.get("gn_dataset")]
        dataset = ds[0] if len(ds) == 1 else None
    arch = next((t for t in tokens if t in _ARCH_WORDS), None)
    corruption = _corruption_words(part)
    if claim.notebook == "03_gradient_norms":  # its keys may name neither model nor corruption
        arch = arch or parameters.get("gn_arch")
        flips = parameters.get("gn_flip_rate")
        corruption = corruption or (f"{100 * flips:g}% label flips" if flips else "")
    definition = next((_DEFINITION_WORDS[t] for t in tokens if t in _DEFINITION_WORDS), "")
    return _join(_DATASET_WORDS.get(dataset, dataset) if dataset else "",
                 _ARCH_WORDS.get(arch, arch) if arch else "", corruption, definition) or part


def _join(*words: str) -> str:
    """The non-empty ``words``, comma-separated."""
    return ", ".join(w for w in words if w)


def _saturated(claim: Claim, key: str, entry: dict | None, recorded: dict) -> str:
    """``"saturated: both 100%"`` (or ``0%``) when the two arms behind a difference sit at the
    same extreme, so the setting cannot show one; else ``""``."""
    if claim.arms is None or entry is None or entry.get("value") is None:
        return ""
    part = _wildcard_part(claim.key, key)
    speed = re.fullmatch(r"(.*)_at(\d+)", part)   # C1a's "<condition>_at<epoch>"
    fields = {"cond": speed[1], "epoch": speed[2]} if speed else {}
    arms = [recorded.get(t.format(part, **fields), {}).get("value") for t in claim.arms]
    if any(not isinstance(v, int | float) for v in arms):
        return ""
    for extreme, word in ((1.0, "100%"), (0.0, "0%")):
        if all(abs(v - extreme) < 1e-9 for v in arms):
            return f"saturated: both {word}"
    return ""


def _row(claim: Claim, key: str, entry: dict | None, fig_dir: Path, recorded: dict,
         parameters: dict | None) -> dict:
    verdict, reason = judge(claim, entry)
    ours = "—"
    if entry is not None and entry.get("value") is not None:
        scaled = dict(entry)
        for k in ("value", "lo", "hi"):
            if isinstance(scaled.get(k), int | float) and not isinstance(scaled.get(k), bool):
                scaled[k] = scaled[k] * claim.scale
        ours = format_result(scaled) + (f" {claim.unit}" if claim.unit else "")
    saturated = _saturated(claim, key, entry, recorded)
    if saturated:
        ours, verdict = saturated, "inconclusive"
        reason = (f"{saturated.split(': ')[1]}: BN and no norm alike, so this setting cannot "
                  "show a difference")
    figure = claim.figure if claim.figure and (fig_dir / f"{claim.figure}.png").exists() else ""
    return {"id": claim.id, "claim": claim.title, "paper": claim.paper,
            "setting": setting_words(claim, key, parameters), "ours": ours,
            "verdict": verdict, "reason": reason, "notebook": claim.notebook, "key": key,
            "figure": figure,
            **{k: None if entry is None else entry.get(k) for k in ("value", "lo", "hi")}}


def claims_markdown(rows: list[dict]) -> str:
    """The claims table as Markdown (for the README): the claim and the paper's words once per
    claim, then one row per setting, named in words. Results keys are in ``claims_text`` and the
    JSON, not here: they are long and unbreakable."""
    body = []
    previous = None
    for r in rows:
        first = r["id"] != previous
        previous = r["id"]
        body.append([f"{r['id']}: {r['claim']}" if first else "", r["paper"] if first else "",
                     r.get("setting", ""), r["ours"], f"**{r['verdict']}**", r["reason"]])
    return _markdown(["claim", "paper", "setting", "ours (95% CI)", "verdict", "why"], body)


def _markdown(head: list[str], body: list[list[str]]) -> str:
    """A Markdown table, ``|`` in the cells escaped."""
    return "".join("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"
                   for cells in [head, ["---"] * len(head), *body])


#: Style of the claims table in the notebooks and the HTML report: fits a laptop screen with
#: JupyterLab's file browser open. Cells wrap at spaces, or anywhere in a long token, except the
#: verdict, which wraps only between its words; the automatic layout never makes a column
#: narrower than its longest unbreakable word, so no cell runs into the next.
CLAIMS_CSS = """
table.bnmem-claims { border-collapse: collapse; width: 100%; max-width: 1200px;
  table-layout: auto; font-size: 0.86em; }
table.bnmem-claims th, table.bnmem-claims td { border: 1px solid #ccc; padding: 3px 6px;
  text-align: left !important; vertical-align: top; white-space: normal; overflow-wrap: anywhere; }
table.bnmem-claims th { background: #f3f3f3; }
table.bnmem-claims tr.first td { border-top: 2px solid #999; }
table.bnmem-claims td.verdict { overflow-wrap: normal; }
table.bnmem-claims .reproduced { color: #0a6b2b; font-weight: bold; }
table.bnmem-claims .not-reproduced { color: #a4161a; font-weight: bold; }
table.bnmem-claims .inconclusive { color: #8a6d00; font-weight: bold; }
table.bnmem-claims .missing { color: #666; font-style: italic; }
"""
_COLUMNS = (("claim", "18%"), ("paper", "17%"), ("setting", "17%"), ("ours (95% CI)", "14%"),
            ("verdict", "10%"), ("why", "16%"), ("figure", "8%"))
#: the same, inline (JupyterLab drops <style> from the outputs of a notebook it does not trust)
_TABLE_STYLE = "border-collapse:collapse;width:100%;max-width:1200px;table-layout:auto"
_CELL_STYLE = ("text-align:left;vertical-align:top;border:1px solid #ccc;padding:3px 6px;"
               "white-space:normal;overflow-wrap:anywhere")


_VERDICT_STYLE = {"reproduced": "color:#0a6b2b;font-weight:bold",
                  "not reproduced": "color:#a4161a;font-weight:bold",
                  "inconclusive": "color:#8a6d00;font-weight:bold",
                  "missing": "color:#666;font-style:italic"}


def claims_html(rows: list[dict], *, figure_href=None, style: bool = True) -> str:
    """The claims table as HTML: the claim and the paper's words once per claim, then one row
    per setting in words; long cells wrap, so it fits a laptop screen. ``figure_href(row)``
    gives the link of a row's figure (no figure column when None)."""
    cols = [c for c in _COLUMNS if figure_href is not None or c[0] != "figure"]
    cell = _CELL_STYLE
    head = "".join(f'<th style="width:{w};{cell}">{html.escape(n)}</th>' for n, w in cols)
    body = []
    previous = shown_figure = None
    for r in rows:
        first, verdict = r["id"] != previous, r["verdict"]
        previous = r["id"]
        cells = [f"<b>{html.escape(r['id'])}</b>: {html.escape(r['claim'])}" if first else "",
                 html.escape(r["paper"]) if first else "", html.escape(r.get("setting", "")),
                 html.escape(r["ours"]),
                 f'<span class="{verdict.replace(" ", "-")}" '
                 f'style="{_VERDICT_STYLE.get(verdict, "")}">{html.escape(verdict)}</span>',
                 html.escape(r["reason"])]
        if figure_href is not None:  # once per claim, like its name
            href = figure_href(r) if r["figure"] and (first or r["figure"] != shown_figure) else ""
            shown_figure = r["figure"]
            text = html.escape(r["figure"].replace("_", " "))  # wraps at the spaces
            cells.append(f'<a href="{html.escape(href)}">{text}</a>' if href else "")
        tr = ' class="first"' if first else ""
        key = html.escape(r["key"], quote=True)
        tds = [f'<td style="{cell}">{c}</td>' for c in cells]
        tds[4] = f'<td class="verdict" style="{cell};overflow-wrap:normal">{cells[4]}</td>'
        body.append(f'<tr{tr} title="results key: {key}">' + "".join(tds) + "</tr>")
    css = f"<style>{CLAIMS_CSS}</style>" if style else ""
    return (f'{css}<table class="bnmem-claims" style="{_TABLE_STYLE}"><thead><tr>{head}</tr>'
            "</thead><tbody>" + "".join(body) + "</tbody></table>")


def claims_text(rows: list[dict]) -> str:
    """The claims table for a terminal: id, key (whole), ours, verdict."""
    width = max([len("key"), *(len(r["key"]) for r in rows)])
    ours = max([len("ours (95% CI)"), *(len(r["ours"]) for r in rows)])
    lines = [f"{'claim':<6} {'key':<{width}} {'ours (95% CI)':<{ours}} verdict"]
    lines += [f"{r['id']:<6} {r['key']:<{width}} {r['ours']:<{ours}} {r['verdict']}" for r in rows]
    lines.append(_counts_text(rows))
    return "\n".join(lines)


def verdict_counts(rows: list[dict]) -> dict[str, int]:
    """How many rows have each verdict."""
    return {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}


def _counts_text(rows: list[dict]) -> str:
    return ", ".join(f"{n} {v}" for v, n in verdict_counts(rows).items() if n)


def rows_frame(rows: list[dict]) -> pd.DataFrame:
    """The claims rows as a pandas DataFrame (columns in reading order)."""
    cols = ["id", "claim", "paper", "setting", "ours", "verdict", "reason", "notebook", "key",
            "figure", "value", "lo", "hi"]
    return pd.DataFrame(rows, columns=cols)


_ONE_CHANNEL = "one channel + linear classifier (float64)"
_TOY_LOOP = "toy task: one BN channel, one outlier in the batch"
_PENALTY = "BN with the gamma/sigma penalty against plain BN"
_PT = dict(scale=100, unit="pt")  # a difference of fractions, shown in percentage points
_LADDER = {"figure": "04b_auc_vs_gap_ladder", **_PT}  # the confound study's claims


def _auc_arms(arm: str) -> tuple[str, str]:
    """The two banks' AUC keys behind a BN-minus-no-norm AUC difference on all samples."""
    return tuple(result_key("lira_auc", norm=n, arm=arm, subset="all") for n in ("bn", "none"))


def _lira_diff(arm: str) -> str:
    return result_key("lira_auc_diff", norm="bn", arm=arm, subset="all")


#: The paper's claims (docs/paper.md) and the results keys that measure them. A key may be
#: a glob pattern: each matching key (one per architecture, data set or outlier setting) is a row.
CLAIMS: list[Claim] = [
    Claim("C1a", "BN memorizes corrupted samples faster (at the profile's speed epoch, "
          "mid-training: 10 of 20 in quick, 6 of 12 in fmnist)",
          "with BN, corrupted samples are fitted faster (lower loss sooner)",
          "02_forced_memorization", result_key("mem_diff", norm="bn", cond="*", when="at*"),
          "effect", figure="02_memorization_curves", **_PT,
          arms=tuple(result_key("mem", cond="{cond}", norm=n, metric="mem_at{epoch}")
                     for n in ("bn", "none"))),
    Claim("C1b", "BN memorizes corrupted samples to higher final accuracy",
          "with BN, corrupted samples are fitted to higher final accuracy",
          "02_forced_memorization", result_key("mem_diff", norm="bn", cond="*", when="final"),
          "effect", figure="02_memorization_curves", **_PT,
          arms=tuple(result_key("mem", cond="{}", norm=n, metric="final_mem")
                     for n in ("bn", "none"))),
    Claim("C2a", "noisy samples' gradient norms sit above clean ones' (BN)",
          "in BN models noisy samples' gradient norms are shifted clearly above clean samples'",
          "03_gradient_norms", result_key("gn_ratio", norm="bn", definition="*", when="final"),
          "at_least", bound=1.0, figure="03_ecdf_final"),
    Claim("C2b", "BN's noisy gradient norms above no norm's (final epoch)",
          "... and above the noisy samples of the BN-free model", "03_gradient_norms",
          result_key("gn_bn_over", reference="none", definition="*", when="final"),
          "at_least", bound=1.0, figure="03_bn_over_other_noisy"),
    Claim("C2c", "BN's noisy gradient norms above no norm's (at BN's peak epoch)",
          "... and above the noisy samples of the BN-free model", "03_gradient_norms",
          result_key("gn_bn_over", reference="none", definition="*", when="at_bn_peak"),
          "at_least", bound=1.0, figure="03_bn_over_other_noisy"),
    Claim("C3a", "BN raises LiRA AUC with outliers (direction)",
          "BN models give consistently higher attack AUC",
          "04_lira", _lira_diff("*_ood*"), "effect",
          figure="04_roc_loglog", **_PT, arms=_auc_arms("{}")),
    Claim("C3b", "... by at least 3 points at 1% outliers",
          "AUC rises by at least 3 points with 1% outliers",
          "04_lira", _lira_diff("*_ood1"), "at_least", bound=0.03,
          figure="04_roc_loglog", **_PT, arms=_auc_arms("{}_ood1")),
    Claim("C3c", "... by at least 4 points at 5% outliers",
          "AUC rises by at least 4 points with 5% outliers",
          "04_lira", _lira_diff("*_ood5"), "at_least", bound=0.04,
          figure="04_roc_loglog", **_PT, arms=_auc_arms("{}_ood5")),
    Claim("C3d", "BN raises LiRA AUC on clean data too",
          "the trend holds on clean data sets",
          "04_lira", _lira_diff("*_clean"), "effect",
          figure="04_roc_loglog", **_PT, arms=_auc_arms("{}_clean")),
    # Controls of C3 the paper does not state (04b; no overlap of the gap ranges: not reproduced)
    Claim("C3e", "BN leaks more at a matched generalization gap",
          "(a control of C3) BN's higher AUC is not just its larger train-test gap", "04b_confound",
          result_key("confound_auc_diff", norm="none", arm="*", at="*"), "effect", **_LADDER),
    Claim("C3g", "GroupNorm and LayerNorm leak less than BN at an equal gap",
          "(the paper's advice) use GN or LN instead of BN", "04b_confound",
          result_key("confound_auc_diff", norm="[gl]n", arm="*", at="mid"), "effect", **_LADDER),
    Claim("C3f", "querying BN models in train mode (the reference code's choice) understates "
          "the leakage",
          "(a control of C3) the reference LiRA code queries BN models in train mode",
          "04_lira", result_key("lira_eval_minus_trainmode", arm="*"), "effect",
          figure="04_roc_loglog", **_PT),
    Claim("T1a", "margin growth ratio = (gamma/sigma)^2, fixed statistics",
          "BN multiplies the per-step margin growth on an outlier by (gamma/sigma)^2",
          "01_theory", "theory_max_rel_error", "at_most", bound=1e-3,
          setting=_ONE_CHANNEL, figure="01_ratio_vs_gamma_sigma"),
    Claim("T1b", "log-log slope of the ratio against gamma/sigma is 2",
          "the amplification is quadratic in gamma/sigma",
          "01_theory", "theory_loglog_slope", "within", bound=2.0, tolerance=0.01,
          setting=_ONE_CHANNEL, figure="01_ratio_vs_gamma_sigma"),
    Claim("T1c", "full BN approaches (gamma/sigma)^2 ‖x-xbar‖²/‖x‖² (offset orthogonal to w)",
          "with gradients through the batch statistics the ratio tends to the same factor",
          "01_theory", "theory_fullbn_over_paper_at_largest", "within", bound=1.0,
          tolerance=0.02, setting=_ONE_CHANNEL, figure="01_fullbn_convergence"),
    Claim("T1d", "... and for an outlier offset not orthogonal to w (cosine 0.3)",
          "with gradients through the batch statistics the ratio tends to the same factor",
          "01_theory", "theory_fullbn_over_paper_aligned", "within", bound=1.0,
          tolerance=0.02, setting=_ONE_CHANNEL, figure="01_fullbn_convergence"),
    Claim("T2a", "the outlier dominates the gamma gradient while being fitted",
          "an outlier's pull on gamma dominates the batch's",
          "01_theory", "theory_outlier_share_excess", "effect",
          setting=_TOY_LOOP, figure="01_gamma_trajectories"),
    Claim("T2b", "an outlier in the batch makes gamma grow more",
          "outliers drive gamma to grow (a self-reinforcing loop)",
          "01_theory", "theory_gamma_growth_diff", "effect",
          setting=_TOY_LOOP, figure="01_gamma_trajectories"),
    Claim("T3", "most BN channels of trained networks have gamma/sigma > 1",
          "measured gamma/sigma ratios are above 1 in most cases",
          "02_forced_memorization", result_key("mem_t3", cond="*"), "at_least", bound=0.5,
          figure="02_gamma_sigma"),
    Claim("M1", "the gamma/sigma penalty cuts memorization of corrupted samples",
          "constraining gamma/sigma cuts memorization markedly",
          "05_mitigation", "mit_d_mem_chosen", "effect", sign=-1,
          setting=_PENALTY, figure="05_tradeoff", **_PT),
    Claim("M2", "... while clean test accuracy stays (within 1 point)",
          "clean-data performance stays",
          "05_mitigation", "mit_d_acc_chosen", "at_least", bound=-0.01,
          setting=_PENALTY, figure="05_tradeoff", **_PT),
    # M3 (05, section 6b): penalised BN minus the reference at equal accuracy; margin +1 AUC pt.
    Claim("M3", "at equal clean accuracy, BN with the penalty leaks no more than GroupNorm or "
          "LayerNorm (LiRA AUC within +1 point)",
          "(the mitigation's promise) constrained BN is as private as the BN-free alternatives",
          "05_mitigation", result_key("mit_m3_auc_diff", ref="*"), "at_least", bound=-0.01, sign=-1,
          figure="05_tradeoff", **_PT),
]


def compare_markdown(claims: list[Claim], profiles: list[str],
                     out_dir: str | os.PathLike | None = None) -> str:
    """The claims table with one number column and one verdict column per profile, side by
    side (one line per claim; a claim matching several settings lists each with its number)."""
    tables = {p: claims_table(claims, p, out_dir) for p in profiles}
    head = ["claim", "paper"] + [f"{p}: {col}" for p in profiles
                                 for col in ("ours (95% CI)", "verdict")]
    body = []
    for claim in claims:
        cells = [f"{claim.id}: {claim.title}", claim.paper]
        for p in profiles:
            rows = [r for r in tables[p] if r["id"] == claim.id]
            numbers = []
            for r in rows:
                setting = _wildcard_part(claim.key, r["key"]).strip("_") if len(rows) > 1 else ""
                numbers.append(f"{setting}: {r['ours']}" if setting else r["ours"])
            verdict = (_counts_text(rows) if len(rows) > 1
                       else rows[0]["verdict"] if rows else "missing")
            cells += ["; ".join(numbers) or "—", verdict]
        body.append(cells)
    return _markdown(head, body)


#: Words of the parts of a claim key of this study (report's setting column).
_CONFOUND_WORDS = {"gn": "BN minus GroupNorm", "ln": "BN minus LayerNorm", "low": "low matched gap",
              "mid": "middle matched gap", "high": "high matched gap"}


def confound_words(part: str) -> str:
    """The setting of a C3e/C3g row in words, from what its key pattern's wildcards matched
    (``gn_fashion_mnist_lenet_ood1_mid``: norm, data set, architecture, corruption, position)."""
    tokens = part.split("_")
    norm = [_CONFOUND_WORDS[tokens[0]]] if tokens[0] in ("gn", "ln") else []
    rest = "_".join(tokens[1:]) if norm else part
    dataset = next((t for t in _DATASET_WORDS if rest.startswith(t + "_")), "")
    arch = next((t for t in tokens if t in _ARCH_WORDS), "")
    where = [_CONFOUND_WORDS[t] for t in tokens[-1:] if t in ("low", "mid", "high")]
    return _join(*norm, _DATASET_WORDS.get(dataset, dataset), _ARCH_WORDS.get(arch, arch),
                 _corruption_words(rest), *where)
