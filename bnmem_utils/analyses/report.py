"""The reproduction report: the paper's claims against our numbers, judged and rendered.

Each :class:`Claim` names the paper's statement, the fields of the results that measure it (a
notebook records them through ``nb.record`` as a :class:`~bnmem_utils.core.results.Result`), and a
written rule that turns the number and its interval into a verdict: ``reproduced``, ``not
reproduced``, ``inconclusive``, or ``missing`` when the notebook has recorded no such number for
this profile. Nothing is guessed: a missing number stays missing. A row's setting is told in
words from the record's fields, never read back from its key.

Rules (also printed in notebook 06):
- ``effect``: a difference with a 95% interval, claimed positive (BN minus its alternative).
  reproduced when the interval lies above zero; not reproduced when it lies below zero, or when
  the paper states a magnitude and the interval lies below it; inconclusive otherwise.
- ``at_least``: a value that must reach a bound (e.g. a fraction above one half): reproduced when
  its interval (or the value, if it has none) is above the bound, not reproduced when below,
  inconclusive when the interval straddles it.
- ``at_most`` / ``within``: numerical checks of the theory (a relative error at most a tolerance;
  a slope within a tolerance of its predicted value).

Each claim declares, before the runs that judge it, its **primary** setting (:attr:`Claim.primary`):
the one row that carries its verdict; its other rows are secondary, shown but not counted. The
primary rows of a profile form one family: their p-values, read back from each row's interval
(:func:`bnmem_utils.core.stats.p_from_interval`), are Holm-adjusted, and a primary verdict
stands only where the adjusted p-value is below 0.05. Every row names its interval method. The
paper's claims read reproduced / not reproduced / inconclusive; the project's own questions
(:attr:`Claim.source` ``"project"``) read supported / contradicted / inconclusive. Rows that rest
on a choice the project made after seeing data are marked exploratory (:attr:`Claim.exploratory`).
"""

from __future__ import annotations

import fnmatch
import html
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bnmem_utils.core.outputs import aligned, breakable, value_html
from bnmem_utils.core.paths import figures_dir
from bnmem_utils.core.results import FIELDS, NothingToReport, format_result, load_results
from bnmem_utils.core.stats import BOOTSTRAP, PAIRED_T, REPLICATE_T, WELCH, holm, p_from_interval

VERDICTS = ("reproduced", "not reproduced", "supported", "contradicted", "inconclusive", "missing")
#: The project's own questions are answered in their own words.
_PROJECT_WORDS = {"reproduced": "supported", "not reproduced": "contradicted"}
ALPHA = 0.05  # the family-wise error rate of the primary rows
#: A percentile bootstrap of a smooth statistic is nearly symmetric around its estimate. When one
#: side is more than this many times the other, the bootstrap distribution has a wall or a kink
#: there (a matched-gap estimate read where the curves barely overlap) and its interval is not
#: trusted: the row is inconclusive and says why. The factor is the project's choice, set while
#: the digits' M3 rows read 5.2 and 11.2 and every Fashion-MNIST row at most 2.6.
LOPSIDED = 3.0


@dataclass(frozen=True)
class Claim:
    """One checkable statement of the paper and where this project measures it."""

    id: str
    title: str
    paper: str  # the paper's statement, in its own terms
    notebook: str  # notebook that records the number
    metric: str  # the metric of the results that measure it (results.Result.metric)
    rule: str  # "effect", "at_least", "at_most" or "within"
    bound: float = 0.0  # the bound of at_least / at_most, the target of within
    tolerance: float = 0.0  # for within
    magnitude: float | None = None  # the paper's stated size of an effect, if any
    figure: str = ""  # stem of the figure that shows it (runs/<profile>/figures/<figure>.png)
    scale: float = 1.0  # display scale (100 for percentage points)
    unit: str = ""
    sign: int = 1  # +1: the paper claims a positive effect; -1: a negative one (a reduction)
    #: the other fields a result must have, each a glob (``{"setting": "ood*"}``); every
    #: result of the metric that has them is a row (one per data set, model, setting...)
    where: dict[str, str] = field(default_factory=dict)
    #: for a difference of ``norm`` minus ``versus``: the metric of its two arms, recorded with
    #: the same fields but one norm each and no ``versus`` or ``when`` (``{when}`` stands for
    #: the row's own, e.g. ``mem_{when}``): when both sit at 0% or 100% the setting is saturated
    arms: str = ""
    setting: str = ""  # the setting in words, for a claim measured in one fixed setting
    #: the fields (globs) of the claim's primary row, declared before the runs; None: the
    #: claim has no primary row of its own (a sensitivity check of another claim)
    primary: dict[str, str] | None = field(default_factory=dict)
    source: str = "paper"  # "paper": the paper's claim; "project": this project's own question
    method: str = ""  # how the interval of its number is made
    exploratory: str = ""  # the choice made after seeing data that its rows rest on, if any
    bank: bool = False  # measured on shadow-model banks (replicates: banks per arm)

    def matches(self, entry: dict) -> bool:
        """Whether a results entry measures this claim: its fields (``entry["fields"]``) have
        the claim's metric and every field of :attr:`where`."""
        fields = entry.get("fields") or {}
        return fields.get("metric") == self.metric and all(
            fnmatch.fnmatchcase(fields.get(k, ""), glob) for k, glob in self.where.items())

    def is_primary(self, entry: dict | None) -> bool:
        """Whether ``entry`` is this claim's primary row."""
        fields = (entry or {}).get("fields") or {}
        if entry is None:                         # a missing number stands for its claim
            return self.primary is not None
        return self.primary is not None and all(
            fnmatch.fnmatchcase(fields.get(k, ""), glob) for k, glob in self.primary.items())

    def words(self, verdict: str) -> str:
        """``verdict`` in the claim's own words (supported / contradicted for the project's)."""
        return _PROJECT_WORDS.get(verdict, verdict) if self.source == "project" else verdict

    @property
    def pattern(self) -> str:
        """The keys of the results it reads, as a glob (for messages; rows match by fields)."""
        if not self.where:
            return self.metric
        parts = [self.metric] + [self.where.get(n, "*") for n in FIELDS[1:]]
        return "_".join(p for i, p in enumerate(parts) if not (p == "*" == parts[i - 1]))


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def judge(claim: Claim, entry: dict | None) -> tuple[str, str]:
    """Verdict (in the claim's words) and a one-line reason for ``claim`` given its results
    entry (``None``: missing)."""
    verdict, reason = _judge(claim, entry)
    return claim.words(verdict), reason


def _lopsided(claim: Claim, entry: dict, value: float, lo: float, hi: float) -> str:
    """Why a percentile-bootstrap interval is not trusted (see :data:`LOPSIDED`), else ``""``."""
    if BOOTSTRAP not in (entry.get("method") or claim.method):
        return ""
    near, far = sorted((value - lo, hi - value))
    if near > 0 and far <= LOPSIDED * near:
        return ""
    skew = "at one end of" if near <= 0 else f"{far / near:.1f}x nearer one end of"
    return (f"interval not trusted: the estimate sits {skew} its percentile bootstrap interval, "
            "a statistic not smooth there")


def _effect(claim: Claim, lo: float, hi: float, has_ci: bool) -> tuple[str, str]:
    """The ``effect`` rule: the interval (in the claimed direction) against zero and the
    paper's stated size."""
    if not has_ci:
        return "inconclusive", "no interval (a single run cannot carry the claim)"
    # the side in the value's own sign: a claimed reduction lies below zero
    claimed, opposite = ("below", "above") if claim.sign < 0 else ("above", "below")
    if lo > 0:
        size = ""
        if claim.magnitude is not None:
            size = (" and reaches the paper's size" if hi >= claim.magnitude
                    else " but stays below the paper's size")
        return "reproduced", f"95% interval {claimed} zero{size}"
    if hi < 0:
        return "not reproduced", f"95% interval {opposite} zero: the opposite effect"
    if claim.magnitude is not None and hi < claim.magnitude:
        return "not reproduced", "95% interval includes zero and excludes the paper's size"
    return "inconclusive", "95% interval includes zero"


def _judge(claim: Claim, entry: dict | None) -> tuple[str, str]:
    if entry is None:
        return "missing", f"{claim.notebook} recorded no {claim.pattern!r} for this profile"
    if entry.get("value") is None:  # recorded without a number: the claim's premise failed
        return "not reproduced", entry.get("description") or "no number: the notebook found none"
    value = _num(entry["value"])
    lo, hi = _num(entry.get("lo")), _num(entry.get("hi"))
    if claim.sign < 0:  # judge the claimed reduction as a positive effect
        value, lo, hi = -value, -hi, -lo
    has_ci = math.isfinite(lo) and math.isfinite(hi)
    if has_ci and (untrusted := _lopsided(claim, entry, value, lo, hi)):
        return "inconclusive", untrusted
    if claim.rule == "effect":
        return _effect(claim, lo, hi, has_ci)
    if claim.rule == "at_least":
        low, high = (lo, hi) if has_ci else (value, value)
        bound = f"{claim.sign * claim.bound * claim.scale:g}{' ' + claim.unit if claim.unit else ''}"
        if low > claim.bound:
            return "reproduced", f"{'below' if claim.sign < 0 else 'above'} {bound}"
        if high < claim.bound:
            return "not reproduced", f"{'above' if claim.sign < 0 else 'below'} {bound}"
        return "inconclusive", f"interval straddles {bound}"
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


def _rows(claim: Claim, recorded: dict, fig_dir: Path) -> list[dict]:
    """The claim's rows: one per results entry whose fields it matches; one ``missing`` row
    when none does."""
    hits = [(k, v) for k, v in recorded.items() if claim.matches(v)]
    rows = [_row(claim, key, entry, fig_dir, recorded)
            for key, entry in hits or [(claim.pattern, None)]]
    if recorded and not any("fields" in e for e in recorded.values()):
        rows[0]["reason"] = (f"{claim.notebook}'s results file was written before results "
                             "carried their fields: rerun the notebook (on a warm model cache it "
                             "reads its trained models back)")
    return rows


def claims_table(claims: list[Claim], profile: str,
                 out_dir: str | os.PathLike | None = None) -> list[dict]:
    """One row per claim and matching result: id, claim, paper, setting, ours (value [lo, hi]),
    verdict, reason, notebook, key, figure. A claim whose fields several results have
    (architectures, outlier rates) gives one row each."""
    results = load_results(profile, out_dir)
    if claims and not [nb for nb in results if not nb.endswith("_report")]:
        raise NothingToReport(profile)   # no results but a report's own: the table would be empty
    fig_dir = figures_dir(profile, out_dir)
    rows = []
    for claim in claims:
        rows += _rows(claim, results.get(claim.notebook, {}).get("results", {}), fig_dir)
    return adjust_primary(rows)


def notebook_rows(notebook: str, recorded: dict, fig_dir: str | os.PathLike = "",
                  claims: list[Claim] | None = None) -> list[dict]:
    """The claims table's rows for the claims ``notebook`` measures, judged from the numbers it
    has just recorded (``{key: entry}``)."""
    return [r for c in (CLAIMS if claims is None else claims) if c.notebook == notebook
            for r in _rows(c, recorded, Path(fig_dir))]


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


#: Words for the values of a result's fields (a value not listed is shown as it is; one mapped to
#: "" is implied by the claim and left out).
WORDS = {
    "versus": {"none": "", "gn": "BN minus GroupNorm", "ln": "BN minus LayerNorm",
               "groupnorm": "against GroupNorm", "layernorm": "against LayerNorm"},
    "dataset": {"digits": "digits 8x8", "mnist": "MNIST", "fashion_mnist": "Fashion-MNIST",
                "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"},
    "arch": {"lenet": "LeNet", "mlp": "MLP", "resnet18": "ResNet-18", "resnet20": "ResNet-20",
             "densenet": "DenseNet"},
    "mode": {"eval": "eval-mode gradients (running BN statistics)",
             "train": "train-mode gradients (batch BN statistics)"},
    "when": {"low": "low matched gap", "mid": "middle matched gap", "high": "high matched gap"},
    "ruler": {"accgap": "matched on the accuracy gap", "lossgap": "matched on the loss gap",
              "globalauc": "matched on the global attack's AUC"},
    "attack": {"lira_online": "secondary: LiRA with per-sample variances (lira_online)"},
}


def setting_words(claim: Claim, entry: dict | None) -> str:
    """The setting a row measures, in words, from its result's fields: the other norm where the
    claim compares several, data set, model, corruption (the record's own words), the gradient
    definition, the matched-gap position; then the claim's fixed setting, if it has one."""
    fields = (entry or {}).get("fields") or {}
    words = [WORDS["versus"].get(fields.get("versus", ""), fields.get("versus", "")),
             *(WORDS[n].get(fields[n], fields[n]) for n in ("dataset", "arch") if n in fields),
             (entry or {}).get("label") or fields.get("setting", ""),
             WORDS["mode"].get(fields.get("mode", ""), ""),
             WORDS["when"].get(fields.get("when", ""), ""),
             WORDS["ruler"].get(fields.get("ruler", ""), ""),
             WORDS["attack"].get(fields.get("attack", ""), fields.get("attack", ""))]
    return "; ".join(w for w in (", ".join(w for w in words if w), claim.setting) if w)


def _saturated(claim: Claim, entry: dict | None, recorded: dict) -> str:
    """``"saturated: both 100%"`` (or ``0%``) when the two arms behind a difference sit at the
    same extreme, so the setting cannot show one; else ``""``."""
    if not claim.arms or entry is None or entry.get("value") is None:
        return ""
    fields = dict(entry.get("fields") or {})
    metric = claim.arms.format(when=fields.pop("when", ""))
    norms = fields.pop("norm", ""), fields.pop("versus", "")
    want = [{**fields, "metric": metric, "norm": n} for n in norms]
    arms = [next((e.get("value") for e in recorded.values() if e.get("fields") == w), None)
            for w in want]
    if any(not isinstance(v, int | float) for v in arms):
        return ""
    for extreme, word in ((1.0, "100%"), (0.0, "0%")):
        if all(abs(v - extreme) < 1e-9 for v in arms):
            return f"saturated: both {word}"
    return ""


def _row(claim: Claim, key: str, entry: dict | None, fig_dir: Path, recorded: dict) -> dict:
    verdict, reason = judge(claim, entry)
    ours = "—"
    if entry is not None and entry.get("value") is not None:
        scaled = dict(entry)
        for k in ("value", "lo", "hi"):
            if isinstance(scaled.get(k), int | float) and not isinstance(scaled.get(k), bool):
                scaled[k] = scaled[k] * claim.scale
        ours = format_result(scaled) + (f" {claim.unit}" if claim.unit else "")
    saturated = _saturated(claim, entry, recorded)
    if saturated:
        ours, verdict = saturated, "inconclusive"
        reason = (f"{saturated.split(': ')[1]}: BN and no norm alike, so this setting cannot "
                  "show a difference")
    fields = (e := entry or {}).get("fields") or {}      # its data set and network name a figure
    if e.get("clipped"):
        ours += " (interval clipped to the metric's range)"
    drawn = [f for f in (f"{claim.figure}_{fields.get('dataset')}_{fields.get('arch')}", claim.figure)
             if claim.figure and (fig_dir / f"{f}.png").exists()]    # the setting's own first
    return {"id": claim.id, "claim": claim.title, "paper": claim.paper,
            "setting": setting_words(claim, entry), "ours": ours, "verdict": verdict,
            "reason": reason, "notebook": claim.notebook, "key": key,
            "figure": drawn[0] if drawn else "", "primary": claim.is_primary(entry),
            "source": claim.source, "method": e.get("method") or claim.method,
            "replicates": e.get("replicates", 1) if claim.bank else None,
            "exploratory": claim.exploratory, "p": _p_value(claim, entry, verdict, reason),
            **{k: e.get(k) for k in ("value", "lo", "hi")}}


def _p_value(claim: Claim, entry: dict | None, verdict: str, reason: str) -> float | None:
    """The p-value against the boundary that decided the row's verdict (zero, the claim's
    bound, or the paper's stated size), read back from its interval; None where no interval
    decides (theory checks, missing or saturated rows)."""
    # zero for an effect, the bound of at_least; None for the theory's numerical checks
    null = 0.0 if claim.rule == "effect" else claim.bound if claim.rule == "at_least" else None
    if null is None or entry is None or verdict == "missing" or "saturated" in reason:
        return None
    if claim.rule == "effect" and "paper's size" in reason and "excludes" in reason:
        null = claim.magnitude
    value, lo, hi = (_num(entry.get(k)) for k in ("value", "lo", "hi"))
    if claim.sign < 0:
        value, lo, hi = -value, -hi, -lo
    method = entry.get("method") or claim.method
    t_based = re.search(r"\bt\b", method) and "bootstrap" not in method   # n - 1 d.o.f.
    p = p_from_interval(value, lo, hi, null, n=int(entry.get("n") or 0) if t_based else 0)
    return None if math.isnan(p) else p


def adjust_primary(rows: list[dict]) -> list[dict]:
    """Holm's adjustment over the primary rows that carry a p-value (one family per table):
    each gets ``p_holm``, and a decided verdict whose adjusted p-value is not below
    :data:`ALPHA` becomes inconclusive, saying so. Secondary rows keep their unadjusted
    verdicts (and say they are secondary)."""
    family = [r for r in rows if r["primary"] and r.get("p") is not None]
    for r, adjusted in zip(family, holm([r["p"] for r in family]), strict=True):
        r["p_holm"] = float(adjusted)
        if adjusted >= ALPHA and r["verdict"] not in ("inconclusive", "missing"):
            r["reason"] += (f"; not after Holm's adjustment over {len(family)} primary rows "
                            f"(p = {adjusted:.2g})")
            r["verdict"] = "inconclusive"
    return rows


#: Style of the claims table in the notebooks and the HTML report: fits a laptop screen with
#: JupyterLab's file browser open. Cells wrap at spaces and after a name's underscores (also where
#: JupyterLab drops the styles it does not trust), the verdict only between its words, a value's
#: number nowhere (its interval after its comma); the automatic layout never makes a column narrower
#: than its longest unbreakable word, so no cell runs into the next.
#: Each verdict's own colour everywhere (HTML table, notebook 06's figures), dark enough for text.
VERDICT_COLOURS = {"reproduced": "#0a6b2b", "not reproduced": "#a4161a",
                   "supported": "#1f5fa8", "contradicted": "#7b2d8e",
                   "inconclusive": "#8a6d00", "missing": "#666666"}
_VERDICT_STYLE = {v: f"color:{c};" + ("font-style:italic" if v == "missing" else "font-weight:bold")
                  for v, c in VERDICT_COLOURS.items()}
CLAIMS_CSS = """
table.bnmem-claims { border-collapse: collapse; width: 100%; max-width: 1200px;
  table-layout: auto; font-size: 0.86em; }
table.bnmem-claims th, table.bnmem-claims td { border: 1px solid #ccc; padding: 3px 6px;
  text-align: left !important; vertical-align: top; white-space: normal; overflow-wrap: anywhere; }
table.bnmem-claims th { background: #f3f3f3; }
table.bnmem-claims tr.first td { border-top: 2px solid #999; }
table.bnmem-claims td.verdict { overflow-wrap: normal; }
""" + "".join(f"table.bnmem-claims .{v.replace(' ', '-')} {{ {style}; }}\n"
              for v, style in _VERDICT_STYLE.items())
_COLUMNS = ("claim", "paper", "setting", "ours (95% CI)", "verdict", "why", "figure")
#: the same, inline (JupyterLab drops <style> from the outputs of a notebook it does not trust)
_TABLE_STYLE = "border-collapse:collapse;width:100%;max-width:1200px;table-layout:auto;font-size:0.86em"
_CELL_STYLE = ("text-align:left;vertical-align:top;border:1px solid #ccc;padding:3px 6px;"
               "white-space:normal;overflow-wrap:anywhere")


def claims_html(rows: list[dict], *, figure_href=None, style: bool = True) -> str:
    """The claims table as HTML: the claim and the paper's words once per claim, then one row
    per setting in words; long cells wrap, so it fits a laptop screen. ``figure_href(row)``
    gives the link of a row's figure (no figure column when None)."""
    cols = [c for c in _COLUMNS if figure_href is not None or c != "figure"]
    cell = _CELL_STYLE
    head = "".join(f'<th style="{cell}">{html.escape(n)}</th>' for n in cols)
    body = []
    previous = shown_figure = None
    for r in rows:
        first, verdict = r["id"] != previous, r["verdict"]
        previous = r["id"]
        value, sep, rest = r["ours"].partition(" (")   # a remark after the value
        number, gap, interval = value.partition(" [")    # the number whole, its interval wraps
        cells = [f"<b>{html.escape(r['id'])}</b>: {breakable(r['claim'])}" if first else "",
                 breakable(r["paper"]) if first else "", breakable(r.get("setting", "")),
                 value_html(number) + html.escape(gap + interval + sep + rest),
                 f'<span class="{verdict.replace(" ", "-")}" '
                 f'style="{_VERDICT_STYLE.get(verdict, "")}">{html.escape(verdict)}</span>',
                 breakable(r["reason"])]
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
    table = [("claim", "key", "ours (95% CI)", "verdict"),
             *((r["id"], r["key"], r["ours"], r["verdict"]) for r in rows)]
    return "\n".join([*aligned(table), counts_text(rows)])


def verdict_counts(rows: list[dict]) -> dict[str, int]:
    """How many primary rows have each verdict (secondary rows are not counted: they share
    their claim's data and are not tested as a family)."""
    return {v: sum(r["verdict"] == v for r in rows if r.get("primary")) for v in VERDICTS}


def counts_text(rows: list[dict]) -> str:
    """The verdict counts of ``rows``' primary rows, in one line."""
    counts = ", ".join(f"{n} {v}" for v, n in verdict_counts(rows).items() if n)
    return f"primary rows: {counts or 'none'}"


def rows_frame(rows: list[dict]) -> pd.DataFrame:
    """The claims rows as a pandas DataFrame (columns in reading order)."""
    cols = ["id", "claim", "paper", "setting", "ours", "verdict", "reason", "primary", "source",
            "method", "replicates", "exploratory", "p", "p_holm", "notebook", "key", "figure",
            "value", "lo", "hi"]
    return pd.DataFrame(rows, columns=cols)


_ONE_CHANNEL = "one channel + linear classifier (float64)"
_EXACT = {"method": "computed exactly (no sampling)"}
_TOY_LOOP = "toy task: one BN channel, one outlier in the batch"
_PENALTY = "BN with the gamma/sigma penalty against plain BN"
_PT = dict(scale=100, unit="pt")  # a difference of fractions, shown in percentage points
#: the confound study's claims: the project's own questions, on banks
_LADDER = {"figure": "04b_auc_vs_gap_ladder", **_PT, "source": "project", "bank": True,
           "method": f"{BOOTSTRAP} over each bank's targets, the rule applied in each replicate"}
#: the memorization claims' primary row: LeNet at 1% label flips, the one rate the paper names
#: that every CPU profile runs
_C1_PRIMARY = {"primary": {"arch": "lenet", "setting": "flip_1pct"},
               "method": f"{PAIRED_T} over seeds"}
#: the gradient-norm claims: the LeNet's eval-mode gradients (the deployed model's) are primary
_C2 = {"primary": {"arch": "lenet", "mode": "eval"},
       "method": "Student t of the log ratio over seeds, mapped back"}
_BANK_T = {"bank": True, "method": f"{WELCH} over the targets of one bank per arm, or {REPLICATE_T} "
                                   "with replicate banks"}
_SEEDS_T = f"{PAIRED_T} over measurement seeds"


_BN_VS_NONE = {"norm": "bn", "versus": "none"}
_HEADLINE = {"attack": ""}  # a bank's headline attack (results.Result.attack empty)


def _lira(setting: str, primary: dict | None = None) -> dict:
    """A BN-minus-no-norm LiRA AUC difference of ``setting``: the LeNet's headline rows primary."""
    return {"metric": "lira_auc_diff", "arms": "lira_auc",
            "primary": {**_HEADLINE, "arch": "lenet", **(primary or {})},
            "where": {**_BN_VS_NONE, "setting": setting, "subset": "all"}}


#: The paper's claims (docs/paper.md) and the fields of the results that measure them: each
#: result that has them (one per architecture, data set or outlier setting) is a row.
CLAIMS: list[Claim] = [
    Claim("C1a", "BN memorizes corrupted samples faster (at the profile's speed epoch, "
          "mid-training: 10 of 20 in quick, 6 of 12 in fmnist)",
          "with BN, corrupted samples are fitted faster (lower loss sooner)",
          "02_forced_memorization", "mem_diff", "effect", figure="02_memorization_curves",
          **_PT, where={**_BN_VS_NONE, "when": "at*"}, arms="mem_{when}", **_C1_PRIMARY,
          exploratory="the speed epoch (mid-training) was set by the project"),
    Claim("C1b", "BN memorizes corrupted samples to higher final accuracy",
          "with BN, corrupted samples are fitted to higher final accuracy",
          "02_forced_memorization", "mem_diff", "effect", figure="02_memorization_curves",
          **_PT, where={**_BN_VS_NONE, "when": "final"}, arms="mem_{when}", **_C1_PRIMARY),
    Claim("C2a", "noisy samples' gradient norms sit above clean ones' (BN)",
          "in BN models noisy samples' gradient norms are shifted clearly above clean samples'",
          "03_gradient_norms", "gn_ratio", "at_least", bound=1.0, figure="03_ecdf_final",
          where={"norm": "bn", "when": "final"}, **_C2),
    Claim("C2b", "BN's noisy gradient norms above no norm's (final epoch)",
          "... and above the noisy samples of the BN-free model", "03_gradient_norms",
          "gn_over", "at_least", bound=1.0, figure="03_bn_over_other_noisy",
          where={**_BN_VS_NONE, "when": "final"}, **_C2),
    Claim("C2c", "BN's noisy gradient norms above no norm's (at BN's peak epoch)",
          "... and above the noisy samples of the BN-free model", "03_gradient_norms",
          "gn_over", "at_least", bound=1.0, figure="03_bn_over_other_noisy",
          where={**_BN_VS_NONE, "when": "at_bn_peak"}, **{**_C2, "primary": None},
          exploratory="the epoch of BN's peak is read from the same runs"),
    Claim("C3a", "BN raises LiRA AUC with outliers (direction)",
          "BN models give consistently higher attack AUC",
          "04_lira", rule="effect", figure="04_roc_loglog", **_PT,
          **_lira("ood*", {"setting": "ood1"}), **_BANK_T),
    Claim("C3b", "... by at least 3 points at 1% outliers",
          "AUC rises by at least 3 points with 1% outliers",
          "04_lira", rule="at_least", bound=0.03, figure="04_roc_loglog", **_PT,
          **_lira("ood1"), **_BANK_T),
    Claim("C3c", "... by at least 4 points at 5% outliers",
          "AUC rises by at least 4 points with 5% outliers",
          "04_lira", rule="at_least", bound=0.04, figure="04_roc_loglog", **_PT,
          **_lira("ood5"), **_BANK_T),
    Claim("C3d", "BN raises LiRA AUC on clean data too", "the trend holds on clean data sets",
          "04_lira", rule="effect", figure="04_roc_loglog", **_PT, **_lira("clean"), **_BANK_T),
    # Controls of C3 the paper does not state (04b; no overlap of the gap ranges: not reproduced)
    Claim("C3e", "BN leaks more at a matched generalization gap (the accuracy gap, and the "
          "loss gap that a loss-threshold attack reads)",
          "(a control of C3) BN's higher AUC is not just its larger train-test gap", "04b_confound",
          "confound_auc_diff", "effect", where={**_BN_VS_NONE, "ruler": "[al]*"}, **_LADDER,
          primary={"when": "mid", "ruler": "lossgap", **_HEADLINE},
          exploratory="the matched-gap positions and the confound profile's training recipe "
          "were set by the project after pilot runs"),
    Claim("C3h", "at an equal global-attack AUC (loss threshold), BN's LiRA AUC is higher",
          "(a control of C3) BN leaks more per sample than its average leakage explains",
          "04b_confound", "confound_auc_diff", "effect",
          where={"norm": "bn", "when": "mid", "ruler": "globalauc"}, **_LADDER,
          primary={"versus": "none", **_HEADLINE},
          exploratory="the matched position was set by the project"),
    Claim("C3g", "GroupNorm and LayerNorm leak less than BN at an equal loss gap",
          "(the paper's advice) use GN or LN instead of BN", "04b_confound",
          "confound_auc_diff", "effect",
          where={"norm": "bn", "versus": "[gl]n", "when": "mid", "ruler": "lossgap"},
          **_LADDER, primary={"versus": "gn", **_HEADLINE},
          exploratory="the matched-gap position was set by the project"),
    Claim("C3f", "querying BN models in train mode (the reference code's choice) understates "
          "the leakage",
          "(a control of C3) the reference LiRA code queries BN models in train mode",
          "04_lira", "lira_eval_minus_trainmode_auc", "effect", where={"norm": "bn"},
          figure="04_roc_loglog", **_PT, source="project", bank=True,
          method=f"{PAIRED_T} over the targets of one bank, or {REPLICATE_T} with replicate banks",
          primary={"setting": "clean", "arch": "lenet", **_HEADLINE}),
    Claim("T1a", "margin growth ratio = (gamma/sigma)^2, fixed statistics",
          "BN multiplies the per-step margin growth on an outlier by (gamma/sigma)^2",
          "01_theory", "theory_max_rel_error", "at_most", bound=1e-3,
          setting=_ONE_CHANNEL, figure="01_ratio_vs_gamma_sigma", **_EXACT),
    Claim("T1b", "log-log slope of the ratio against gamma/sigma is 2",
          "the amplification is quadratic in gamma/sigma",
          "01_theory", "theory_loglog_slope", "within", bound=2.0, tolerance=0.01,
          setting=_ONE_CHANNEL, figure="01_ratio_vs_gamma_sigma", **_EXACT),
    Claim("T1c", "full BN approaches (gamma/sigma)^2 ‖x-xbar‖²/‖x‖² (offset orthogonal to w)",
          "with gradients through the batch statistics the ratio tends to the same factor",
          "01_theory", "theory_fullbn_over_paper_at_largest", "within", bound=1.0,
          tolerance=0.02, setting=_ONE_CHANNEL, figure="01_fullbn_convergence", **_EXACT),
    Claim("T1d", "... and for an outlier offset not orthogonal to w (cosine 0.3)",
          "with gradients through the batch statistics the ratio tends to the same factor",
          "01_theory", "theory_fullbn_over_paper_aligned", "within", bound=1.0,
          tolerance=0.02, setting=_ONE_CHANNEL, figure="01_fullbn_convergence",
          method="range over the offset distances (min to max), not a confidence interval"),
    Claim("T2a", "the outlier dominates the gamma gradient while being fitted",
          "an outlier's pull on gamma dominates the batch's",
          "01_theory", "theory_outlier_share_excess", "effect",
          setting=_TOY_LOOP, figure="01_gamma_trajectories", method=f"{PAIRED_T} over seeds"),
    Claim("T2b", "an outlier in the batch makes gamma grow more",
          "outliers drive gamma to grow (a self-reinforcing loop)",
          "01_theory", "theory_gamma_growth_diff", "effect",
          setting=_TOY_LOOP, figure="01_gamma_trajectories", method=f"{PAIRED_T} over seeds"),
    Claim("T3", "most BN channels of trained networks have gamma/sigma > 1",
          "measured gamma/sigma ratios are above 1 in most cases",
          "02_forced_memorization", "mem_t3_frac_above1", "at_least", bound=0.5,
          figure="02_gamma_sigma", primary=_C1_PRIMARY["primary"], method="Student t over seeds"),
    Claim("M1", "the gamma/sigma penalty cuts memorization of corrupted samples",
          "constraining gamma/sigma cuts memorization markedly",
          "05_mitigation", "mit_d_mem", "effect", sign=-1, where={"when": "chosen"},
          setting=_PENALTY, figure="05_tradeoff", **_PT, method=_SEEDS_T),
    Claim("M2", "... while clean test accuracy stays (within 1 point)",
          "clean-data performance stays",
          "05_mitigation", "mit_d_acc", "at_least", bound=-0.01, where={"when": "chosen"},
          setting=_PENALTY, figure="05_tradeoff", **_PT, method=_SEEDS_T,
          exploratory="the 1-point tolerance is the project's reading of 'stays'"),
    # M3 (05, section 6b): penalised BN minus the reference at equal accuracy; margin +1 AUC pt.
    Claim("M3", "at equal clean accuracy, BN with the penalty leaks no more than GroupNorm or "
          "LayerNorm (LiRA AUC within +1 point)",
          "(the mitigation's promise) constrained BN is as private as the BN-free alternatives",
          "05_mitigation", "mit_m3_auc_diff", "at_least", bound=-0.01, sign=-1,
          figure="05_tradeoff", **_PT, source="project", bank=True, primary={"versus": "groupnorm"},
          method=f"{BOOTSTRAP} over each bank's targets, the rule applied in each replicate",
          exploratory="the +1-point margin was set by the project"),
]
