"""The numbers of README.md and docs/results.md, generated from the committed runs.

A document marks each generated part ``<!-- generated:NAME -->...<!-- /generated -->`` (a whole
table, or one number inline in a sentence); :func:`regenerate` rewrites every marked part from
the committed CSVs (``figures/<profile>/06_claims_forest.csv`` and the other figures' CSVs), so
a number in the prose cannot drift from the run it cites. Names:

* ``table claims``: the headline table (one row per claim: Fashion-MNIST, MNIST and digits);
* ``table rows PROFILE``: every measured row of a profile's claims forest;
* ``table archs``: per claim, the LeNet's primary row beside ResNet-20's and DenseNet-BC's
  rows of profile ``archs``;
* ``table agreement A B``: each claim's primary row in profiles A and B (the same sizes on two
  data sets) side by side, and whether their verdicts agree;
* ``table calibration PROFILE``: one bank's interval against the replicate banks'
  (``figures/PROFILE/06_calibration.csv``); ``table changes STEM``: the verdicts a change of
  method moved (``figures/changes/STEM.csv``); ``table ladder PROFILE``: the confound study's
  ladder rung by rung (``figures/PROFILE/04b_auc_vs_gap_ladder.csv``);
* ``claim ID PROFILE`` / ``verdict ID PROFILE``: a row's number (with its unit) or verdict; the
  claim's headline row, or with ``| words; words`` the one row whose setting holds them all;
* ``counts PROFILE [ID]``: how many rows (of one claim) have each verdict; ``commit PROFILE``: the
  commits of the runs that made its figures (``figures/PROFILE/manifest.json``; not of a figure
  drawn from committed CSVs, whose entry's parameters name :data:`DRAWN_BY`);
* ``value PROFILE/STEM COLUMN [pt|%] | col=value; ...``: ``COLUMN [COLUMN_lo, COLUMN_hi]`` of
  the one row of ``figures/PROFILE/STEM.csv`` that has those values (``pt``/``%``: times 100);
* ``fresh-clone``: the README's two commands timed on a fresh clone, from the committed record
  ``docs/fresh_clone.json`` (:func:`fresh_clone_sentence`; :mod:`bnmem_utils.run.fresh_clone`
  records it).

``bnmem report --docs`` rewrites the files; tests/test_docs.py fails when a committed file
differs from its regeneration, and on any number with an interval outside a generated part
that no committed CSV holds.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import re
from collections import Counter
from pathlib import Path

from bnmem_utils.analyses import report
from bnmem_utils.analyses.report import CLAIMS, VERDICTS
from bnmem_utils.core.paths import project_root
from bnmem_utils.run.summary import read_forest

DOCS = ("README.md", "docs/results.md")
DIGITS, FMNIST, MNIST = "quick", "fmnist", "mnist"

#: The headline row of each claim with several settings, for a committed claims table written
#: before its rows carried their ``primary`` flag: the words of the claim's declared primary
#: setting (:attr:`bnmem_utils.analyses.report.Claim.primary`). A table with the flag is read by
#: it.
HEADLINE: dict[str, tuple[str, ...]] = {
    "C1a": ("LeNet", "flip 1%"), "C1b": ("LeNet", "flip 1%"), "T3": ("LeNet", "flip 1%"),
    "C2a": ("eval-mode",), "C2b": ("eval-mode",), "C2c": ("eval-mode",),
    "C3a": ("OOD 1%",), "C3f": ("clean",), "C3e": ("middle",), "C3g": ("GroupNorm",),
    "C3h": ("no norm",), "M3": ("GroupNorm",),
}
#: The Fashion-MNIST profile of a claim where it is not ``fmnist``: the profile sized to decide it.
FMNIST_SOURCE = {"C3e": "confound", "C3g": "confound", "C3h": "confound", "M1": "mitigation",
                 "M2": "mitigation", "M3": "mitigation"}
#: The unit of a claim whose number the forest prints without one.
UNITS = {"C2a": "x clean", "C2b": "x no norm", "C2c": "x no norm", "T1a": "rel. error",
         "T1b": "slope", "T1c": "x paper's factor", "T1d": "x paper's factor",
         "T2a": "share of dL/dgamma", "T2b": "in gamma", "T3": "of channels"}
#: The committed record of the README's two commands on a fresh clone
#: (:mod:`bnmem_utils.run.fresh_clone` writes it), from the repository's root.
FRESH_CLONE = "docs/fresh_clone.json"
#: The manifest parameter of a figure drawn from committed CSVs rather than by a run: what drew it.
DRAWN_BY = "drawn_by"
_MARK = re.compile(r"<!-- generated:(?P<name>[^>]*?) -->(?P<body>.*?)<!-- /generated -->", re.S)


@functools.cache
def forest(profile: str, root: Path | None = None) -> tuple[dict, ...]:
    """The rows of ``figures/<profile>/06_claims_forest.csv`` (empty when it is not there)."""
    return read_forest((root or project_root()) / "figures" / profile)


def select(claim: str, profile: str, words: tuple[str, ...] | None = None,
           root: Path | None = None) -> dict | None:
    """The one measured row of ``claim`` in ``profile`` whose setting holds every word (the
    claim's :data:`HEADLINE` words by default; where several do, the one whose setting has each
    word as a whole part of it); ``None`` when the profile does not measure it,
    or measures only secondary rows in other settings (another network's: profile ``archs``)."""
    rows = [r for r in forest(profile, root) if r["id"] == claim and r["verdict"] != "missing"]
    named = words is not None
    if not rows:
        return None
    primary = [r for r in rows if r.get("primary") == "True"]
    if not named and all(r.get("primary") == "False" for r in rows) and (profile in DEEP_PROFILES
            or any(c.id == claim and c.primary for c in CLAIMS)):  # secondary rows only
        return None
    if words is None and primary:                        # the claim's declared primary row
        hits = primary
    else:            # named words; or a claim with no primary row of its own (its HEADLINE)
        words = HEADLINE.get(claim, ()) if words is None else words
        hits = [r for r in rows if all(w in r["setting"] for w in words)]
        exact = [r for r in hits if set(words) <= set(r["setting"].split(", "))]   # MNIST, not
        hits = exact if len(hits) > 1 and exact else hits                    # Fashion-MNIST
        if len(hits) > 1 and not any("secondary" in w for w in words):   # the headline attack's
            hits = [r for r in hits if "secondary:" not in r["setting"]]
    if not hits and not named and not primary:
        return None
    if len(hits) != 1:
        raise ValueError(f"{claim} in {profile}: {len(hits)} rows hold {words!r}; settings: "
                         + "; ".join(r["setting"] for r in rows))
    return hits[0]


def number(row: dict) -> str:
    """A row's number as the forest prints it, with its unit."""
    ours = row["ours"]
    unit = UNITS.get(row["id"], "")
    return f"{ours} {unit}" if unit and not ours.startswith("saturated") else ours


def _cell(row: dict | None, profile: str, home: str) -> str:
    if row is None:
        return "not measured"
    where = "" if profile == home else f" (`{profile}`)"
    return f"{number(row)}, **{row['verdict']}**{where}"


def _setting(row: dict) -> str:
    """A row's setting without its data set (the column names it)."""
    words = [w for w in row["setting"].split(", ")
             if w not in ("Fashion-MNIST", "MNIST", "digits 8x8")]
    return ", ".join(words)


def _table(head: list[str], body: list[list[str]]) -> str:
    return "".join("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"
                   for cells in [head, ["---"] * len(head), *body])


def compare_table(claims: list[report.Claim], profiles: list[str],
                  out_dir: str | os.PathLike | None = None) -> str:
    """The claims table with one number column and one verdict column per profile, side by
    side, from the profiles' results files (``bnmem report --compare``; one line per claim, a
    claim matching several settings lists each with its number)."""
    tables = {p: report.claims_table(claims, p, out_dir) for p in profiles}
    head = ["claim", "paper"] + [f"{p}: {col}" for p in profiles
                                 for col in ("ours (95% CI)", "verdict")]
    body = []
    for claim in claims:
        cells = [f"{claim.id}: {claim.title}", claim.paper]
        for p in profiles:
            rows = [r for r in tables[p] if r["id"] == claim.id]
            numbers = [f"{r['setting']}: {r['ours']}" if len(rows) > 1 else r["ours"]
                       for r in rows]
            verdict = (report.counts_text(rows) if len(rows) > 1
                       else rows[0]["verdict"] if rows else "missing")
            cells += ["; ".join(numbers) or "—", verdict]
        body.append(cells)
    return _table(head, body)


def claims_table(root: Path | None = None) -> str:
    """One row per claim: the paper's words, its primary setting, its Fashion-MNIST number
    (from :data:`FMNIST_SOURCE`'s profile, else ``fmnist``), its MNIST number (``mnist``, the
    same sizes as ``fmnist``) and its digits number (``quick``).

    Where several claims test one sentence of the paper, each adds what it tests (its title);
    a claim with no primary row of its own says so beside its setting: its verdict is not
    adjusted with the primary rows (Holm), so it can differ from a sibling's on one number."""
    shared = Counter(c.paper for c in CLAIMS)
    body = []
    for claim in CLAIMS:
        source = FMNIST_SOURCE.get(claim.id, FMNIST)
        fm, mn, dg = (select(claim.id, p, root=root) for p in (source, MNIST, DIGITS))
        shown = fm or mn or dg
        paper = claim.paper
        if shared[paper] > 1:
            paper += "; tested here: " + claim.title.removeprefix("... ").removeprefix("and ")
        setting = _setting(shown) if shown else ""
        if claim.primary is None:
            setting += " (a sensitivity check: no primary row, no Holm adjustment)"
        body.append([f"**{claim.id}**", paper, setting, _cell(fm, source, FMNIST),
                     _cell(mn, MNIST, MNIST), _cell(dg, DIGITS, DIGITS)])
    return _table(["claim", "the paper says", "primary setting", "Fashion-MNIST", "MNIST",
                   "digits 8x8"], body)


ARCHS_PROFILE = "archs"
#: The profiles that measure the deeper networks: :data:`bnmem_utils.run.cpu_work.CPU_PROFILES`
#: (tests/test_cpu_work.py holds the two alike; each profile's file says what it measures).
DEEP_PROFILES = ("archs", "densenet", "densenet_fmnist", "confound_resnet20", "confound_resnet20_mnist")
#: The deeper networks, by the words their rows' settings carry.
DEEP = (("ResNet-20", "ResNet-20"), ("DenseNet-BC", "DenseNet"))


def _deep_rows(claim: str, word: str, root: Path | None, at: tuple[str, ...] = ()) -> list[dict]:
    """The measured rows of ``claim`` in :data:`DEEP_PROFILES` of the network named ``word`` in
    their setting, the headline attack's only, each with its ``profile``; with ``at``, only
    those whose setting holds each of its words (a matched gap's position and ruler)."""
    return [{**r, "profile": p} for p in DEEP_PROFILES for r in forest(p, root)
            if r["id"] == claim and r["verdict"] != "missing" and word in r["setting"].split(", ")
            and "secondary:" not in r["setting"] and set(at) <= set(r["setting"].split(", "))]


#: A deeper network fits its data set when, at notebook 02's last epoch, BN and no norm alike
#: have fitted at least this share of their clean training images (mean over seeds); each row of
#: one that did not says so beside its number.
FITTED = 0.99


def _fit_note(row: dict, word: str, fit: dict[tuple[str, str, str], dict]) -> str:
    """`` (under-fitted in 02: ...)`` where the network ``word`` on ``row``'s data set did not
    fit (:data:`FITTED`; ``fit``: notebook 02's clean training accuracy at its last epoch, as
    :func:`_final_rows` reads it), naming each norm that fell short and how far it got."""
    from bnmem_utils.models.nets import NORM_LABELS

    words, setting = report.WORDS, row["setting"].split(", ")
    short = [f"{NORM_LABELS.get(n, n)} {100 * float(r['mean']):.3g}%"
             for (d, a, n), r in fit.items()
             if words["arch"].get(a) == word and words["dataset"].get(d) in setting
             and float(r["mean"]) < FITTED]
    return f" (under-fitted in 02: {', '.join(short)} of the clean training images)" if short else ""


def _deep_cell(claim: str, word: str, fit: dict, root: Path | None,
               at: tuple[str, ...] = ()) -> str:
    """A deeper network's rows of ``claim`` in :data:`DEEP_PROFILES` (at ``at``: those of
    :func:`_deep_rows`), each with its setting (its data set included), as they are secondary
    rows in other settings than the LeNet's primary one, its profile where that is not
    ``archs``, and where its network did not fit that data set, how far it got
    (:func:`_fit_note`)."""
    rows = _deep_rows(claim, word, root, at)
    if not rows:
        return "not measured"

    def where(r: dict) -> str:
        setting = ", ".join(w for w in r["setting"].split(", ") if w != word)
        return setting if r["profile"] == ARCHS_PROFILE else f"{setting} (`{r['profile']}`)"

    return "; ".join(f"{where(r)}: {number(r)}, **{r['verdict']}**{_fit_note(r, word, fit)}"
                     for r in rows)


def archs_table(root: Path | None = None) -> str:
    """Per claim that the :data:`DEEP_PROFILES` measure: the LeNet's primary row on
    Fashion-MNIST (from :data:`FMNIST_SOURCE`'s profile, else ``fmnist``) beside ResNet-20's and
    DenseNet-BC's secondary rows, each with its setting; where the LeNet's row is read at a
    matched gap, theirs at the same position and ruler."""
    measured = {r["id"] for p in DEEP_PROFILES for r in forest(p, root) if r["verdict"] != "missing"}
    fit = _final_rows((root or project_root()) / "figures" / ARCHS_PROFILE /
                      "02_train_accuracy_curves.csv", "clean_acc")
    body = []
    for claim in CLAIMS:
        if claim.id not in measured:
            continue
        source = FMNIST_SOURCE.get(claim.id, FMNIST)
        lenet = select(claim.id, source, root=root)
        words = _setting(lenet).split(", ") if lenet else []
        at = tuple(w for w in words if "matched" in w)
        cells = [_deep_cell(claim.id, word, fit, root, at) for _, word in DEEP]
        setting = ", ".join(w for w in words if w != "LeNet")
        body.append([f"**{claim.id}**", claim.paper,
                     f"{setting}: {_cell(lenet, source, FMNIST)}" if lenet else "not measured",
                     *cells])
    head = ["claim", "the paper says", "LeNet (primary, `fmnist` unless named)",
            *(f"{name} (`{ARCHS_PROFILE}` unless named)" for name, _ in DEEP)]
    return _table(head, body) if body else f"No claim was measured by `{ARCHS_PROFILE}`.\n"


def _csv(path: Path) -> list[dict]:
    """The rows of a CSV file, an empty list when it does not exist."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _final_rows(path: Path, metric: str) -> dict[tuple[str, str, str], dict]:
    """``{(dataset, arch, norm): row}`` of a notebook-02 curve CSV at its last epoch."""
    rows = sorted((r for r in _csv(path) if r["metric"] == metric), key=lambda r: int(r["epoch"]))
    return {(r["dataset"], r["arch"], r["norm"]): r for r in rows}


def _percent(row: dict | None, mean: str = "mean", lo: str = "lo", hi: str = "hi", *,
             floor: float = 0.0, unit: str = "%") -> str:
    """``mean [lo, hi]%`` of a CSV row's fraction, its interval clipped to [floor, 100]."""
    if row is None:
        return "not measured"
    v, a, b = (100 * float(row[c]) for c in (mean, lo, hi))
    return f"{v:.3g} [{max(a, floor):.3g}, {min(b, 100):.3g}]{unit}"


def fit_table(root: Path | None = None) -> str:
    """How far each network of ``archs`` fitted its training data, per data set, network and
    norm: in notebook 02 the clean training images fitted, the flipped ones fitted and the
    test accuracy at the last epoch (mean and 95% t interval over seeds), and in notebook 04
    (of :data:`DEEP_PROFILES`) the bank members' train-test gap on clean data (over replicate
    banks); an interval is clipped to the metric's range."""
    from bnmem_utils.models.nets import NORM_LABELS

    folder = (root or project_root()) / "figures" / ARCHS_PROFILE
    train = _final_rows(folder / "02_train_accuracy_curves.csv", "clean_acc")
    flips = _final_rows(folder / "02_memorization_curves.csv", "corrupted_acc")
    test = _final_rows(folder / "02_test_accuracy_curves.csv", "test_acc")
    gaps = {tuple(r["arm"].split("/")[:3]): r for p in DEEP_PROFILES
            for r in _csv(folder.parent / p / "04_auc_vs_gap.csv")
            if r["arm"].split("/")[3] == "clean"}
    words = report.WORDS
    body = []
    for key in dict.fromkeys([*train, *flips, *test, *gaps]):
        dataset, arch, norm = key
        gap = gaps.get(key)
        body.append([words["dataset"].get(dataset, dataset), words["arch"].get(arch, arch),
                     NORM_LABELS.get(norm, norm), _percent(train.get(key)), _percent(flips.get(key)),
                     _percent(test.get(key)),
                     "not measured" if gap is None else
                     _percent(gap, "gap", "gap_lo", "gap_hi", floor=-100, unit=" pt")])
    head = ["data set", "network", "norm", "clean training images fitted (02)",
            "flipped labels fitted (02)", "test accuracy (02)", "members' train-test gap (04)"]
    return _table(head, body) if body else f"`{ARCHS_PROFILE}` has no results yet.\n"


#: The claims the depth figure shows, with their axis labels (value scaled as the claim shows it).
DEPTH_CLAIMS = {"C1b": "BN minus no norm, flipped fitted (pt)",
                "C2a": "noisy over clean gradient norm (BN)",
                "C3a": "BN minus no norm, LiRA AUC (pt)"}
DEPTH_FIGURE = "07_depth"


def depth_points(root: Path | None = None):
    """One row per claim of :data:`DEPTH_CLAIMS` and architecture: the LeNet's primary row
    (``fmnist``) and ResNet-20's and DenseNet-BC's rows (:data:`DEEP_PROFILES`; Fashion-MNIST's
    where there is one), with the network's number of BN layers (a claim an architecture was
    not measured on has no row)."""
    import pandas as pd

    from bnmem_utils.figures.depth import ARCH_WORDS, bn_layers

    out = []
    for cid in DEPTH_CLAIMS:
        scale = next(c.scale for c in CLAIMS if c.id == cid)
        for arch, word in ARCH_WORDS.items():
            rows = ([select(cid, FMNIST, root=root)] if arch == "lenet" else   # the LeNet's data set first
                    sorted(_deep_rows(cid, word, root),
                           key=lambda r: "Fashion-MNIST" not in r["setting"].split(", "))[:1])
            for r in filter(None, rows):
                vals = [float(r[k]) * scale if r[k] not in ("", None) else float("nan")
                        for k in ("value", "lo", "hi")]
                setting = ", ".join(w for w in _setting(r).split(", ") if w != word)
                out.append({"claim": cid, "arch": arch, "arch_words": word,
                            "bn_layers": bn_layers(arch), "setting": setting,
                            "value": vals[0], "lo": vals[1], "hi": vals[2],
                            "verdict": r["verdict"],
                            "profile": FMNIST if arch == "lenet" else r["profile"]})
    return pd.DataFrame(out)


def write_depth_figure(root: Path | None = None) -> Path | None:
    """``figures/archs/07_depth.{pdf,png,csv}`` from the committed CSVs (None when ``archs``
    has not run): BN's effect against each network's number of BN layers
    (:func:`bnmem_utils.figures.depth.save_depth_figure`), its manifest entry marked
    :data:`DRAWN_BY`."""
    root = root or project_root()
    points = depth_points(root)
    if points.empty or set(points["arch"]) == {"lenet"}:
        return None
    from bnmem_utils.figures.depth import save_depth_figure

    return save_depth_figure(points, DEPTH_CLAIMS, root / "figures" / ARCHS_PROFILE, root,
                             name=DEPTH_FIGURE, parameters={DRAWN_BY: "bnmem report --docs"})


#: The ladder table's columns: a per-target column of ``04b_auc_vs_gap_ladder.csv``, its
#: heading and its unit (a percentage; "": nats, unbounded).
LADDER = (("train_acc", "training accuracy", "%"), ("test_acc", "test accuracy", "%"),
          ("gap", "accuracy gap", " pt"), ("loss_gap", "loss gap (nats)", ""),
          ("global_auc", "global attack's AUC", " pt"), ("auc", "LiRA AUC", " pt"))


def ladder_table(profile: str, root: Path | None = None) -> str:
    """The confound study's ladder (notebook 04b) of ``profile``, rung by rung: per norm and
    training length, each :data:`LADDER` column's bank mean over its targets, averaged over the
    replicate ladders with a 95% Student t interval over them (clipped to the metric's range)."""
    import pandas as pd

    from bnmem_utils.core.stats import mean_ci
    from bnmem_utils.models.nets import NORM_LABELS

    f = pd.read_csv((root or project_root()) / "figures" / profile / "04b_auc_vs_gap_ladder.csv")
    banks = f[f["knob"] == "epochs"].groupby(["norm", "epochs", "replicate"], sort=False).mean(True)
    body = []
    for (norm, epochs), g in banks.groupby(level=["norm", "epochs"], sort=False):
        es = [(mean_ci(g[col].to_numpy()), col, unit) for col, _, unit in LADDER]
        body.append([NORM_LABELS.get(norm, norm), str(epochs), *(
            _percent(vars(e), floor=-100 if col == "gap" else 0, unit=unit) if unit
            else f"{e.mean:.3g} [{e.lo:.3g}, {e.hi:.3g}]" for e, col, unit in es)])
    return _table(["norm", "epochs", *(head for _, head, _ in LADDER)], body)


def agreement_table(first: str, second: str, root: Path | None = None) -> str:
    """Each claim's primary row in two profiles of the same sizes on two data sets (``fmnist``
    and ``mnist``), number and verdict side by side, and whether the verdicts agree; then how
    many agree, of the claims both measure."""
    body, same, both = [], 0, 0
    for claim in CLAIMS:
        a, b = select(claim.id, first, root=root), select(claim.id, second, root=root)
        if a is None and b is None:
            continue
        agree = a is not None and b is not None and a["verdict"] == b["verdict"]
        both += a is not None and b is not None
        same += agree
        body.append([f"**{claim.id}**", _setting(a or b), _cell(a, first, first),
                     _cell(b, second, second),
                     "same" if agree else "**differ**" if a and b else "one measures it"])
    head = ["claim", "primary setting", f"`{first}`", f"`{second}`", "verdicts"]
    return (_table(head, body) + f"\nThe verdicts agree on {same} of the {both} claims both "
            "profiles measure.\n")


def rows_table(profile: str, root: Path | None = None) -> str:
    """Every measured row of a profile's claims forest, then the claims it does not measure."""
    rows = [r for r in forest(profile, root) if r["verdict"] != "missing"]
    body = [[f"**{r['id']}**", r["setting"], number(r), f"**{r['verdict']}**", r["reason"]]
            for r in rows]
    text = _table(["claim", "setting", "ours (95% CI)", "verdict", "why"], body)
    missing = sorted({r["id"] for r in forest(profile, root)} - {r["id"] for r in rows},
                     key=[c.id for c in CLAIMS].index)
    return text + (f"\nNot measured by this profile: {', '.join(missing)}.\n" if missing else "")


def calibration_table(profile: str, root: Path | None = None) -> str:
    """Notebook 06's calibration table of a profile: one bank's interval against the replicate
    banks' (empty when the profile has no replicate banks)."""
    path = (root or project_root()) / "figures" / profile / "06_calibration.csv"
    if not path.exists():
        return f"No number of `{profile}` was measured on replicate banks.\n"
    rows = _csv(path)
    widths = ("one-bank half-width", "replicate-aware half-width", "one bank with retraining")
    body = [[r["claims"], r["setting"], r["replicates"],
             *(f"{float(r[c]):.3g} {r['unit']}".strip() for c in widths),
             f"{float(r['ratio']):.2f}x" if r["ratio"] else "", r["one bank covers the others' mean"]]
            for r in rows]
    return _table(["claims", "setting", "replicate banks", "one bank's own: +-",
                   "mean of the replicates: +-", "one bank with retraining: +-", "ratio",
                   "one bank's interval covers the others' mean"], body)


def changes_table(stem: str, root: Path | None = None) -> str:
    """The verdicts one change of method moved (``figures/changes/<stem>.csv``: one row per
    claims row whose verdict moved, before and after, written when the change's runs were
    published)."""
    with open((root or project_root()) / "figures" / "changes" / f"{stem}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    body = [[f"**{r['id']}**" + (" (primary)" if r["primary"] == "True" else ""), r["profile"],
             r["setting"], f"{r['before']}, {r['before_verdict']}", f"{r['after']}, "
             f"**{r['after_verdict']}**"] for r in rows]
    return _table(["claim", "profile", "setting", "before", "after"], body)


def counts(profile: str, claim: str = "", root: Path | None = None) -> str:
    """How many measured rows of a profile (of one claim, if given) have each verdict, every
    verdict but missing named."""
    rows = [r for r in forest(profile, root) if r["id"] == claim or not claim]
    return ", ".join(f"{n} {v}" for v in VERDICTS if v != "missing"
                     if (n := sum(r["verdict"] == v for r in rows)))


def value(path: str, column: str, filters: dict[str, str], scale: str = "",
          root: Path | None = None) -> str:
    """``column [column_lo, column_hi]`` of the one row of ``figures/<path>.csv`` that has every
    value of ``filters`` (``lo`` and ``hi`` where the CSV's header puts them right after
    ``column``: a curve's mean, a forest's value, a ratio); ``scale`` ``pt`` or ``%`` multiplies
    by 100 and appends the unit, ``%`` (a share) with its interval clipped to [0, 100]. A
    ``ValueError`` for a column with no interval of its own (a generic ``lo`` of another column
    would pass for it)."""
    with open((root or project_root()) / "figures" / f"{path}.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if all(r.get(k) == v for k, v in filters.items())]
        header = list(reader.fieldnames or [])
    if len(rows) != 1:
        raise ValueError(f"{path}.csv: {len(rows)} rows have {filters}")
    factor = 100 if scale else 1
    generic = header[header.index("lo") - 1] if "lo" in header[1:] else None
    if f"{column}_lo" in header:
        bounds = (f"{column}_lo", f"{column}_hi")
    elif column == generic:
        bounds = ("lo", "hi")
    else:
        own = sorted({c[:-3] for c in header if c.endswith("_lo")} | ({generic} - {None}))
        raise ValueError(f"{path}.csv: column {column!r} has no interval of its own "
                         f"(columns with one: {', '.join(own) or 'none'})")
    v, lo, hi = (float(rows[0][c]) * factor for c in (column, *bounds))
    if scale == "%":                          # a share: its interval stays inside [0, 100]
        lo, hi = max(lo, 0.0), min(hi, 100.0)
    unit = {"pt": " pt", "%": "%"}.get(scale, "")
    return f"{v:.3g} [{lo:.3g}, {hi:.3g}]{unit}"


def _minutes(seconds: float) -> str:
    return f"**{seconds / 60:.1f} min** ({seconds:.0f} s"


def fresh_clone_sentence(rec: dict) -> str:
    """The README's sentence on the quickstart's times, from a record; a ValueError where the
    record does not show both commands passing on a clean tree (a failed run is no timing)."""
    stages = rec["stages"]
    bad = [name for name, s in stages.items() if s.get("rc") != 0 or s.get("clean") is False]
    if bad or set(stages) != {"install", "command 1", "command 2"}:
        missing = ", ".join(bad) or "a stage is missing"
        raise ValueError(f"{FRESH_CLONE}: the recorded run did not pass cleanly ({missing})")
    empty = ("every model trained: an empty cache" if rec["cache_files_before"] == 0
             else f"{rec['cache_files_before']} cache files already there")
    load = (rec["load_at_start"].split() or ["unknown"])[0]
    date = rec["recorded"][:10]
    return (f"On a fresh clone at commit {rec['commit']} ({date}, {rec['machine']}, load "
            f"{load} at the start; torch {rec['torch']}) the install took "
            f"**{stages['install']['seconds']:.0f} s**, command 1 "
            f"{_minutes(stages['command 1']['seconds'])}, {empty}; compared with the published "
            f"run, {rec['comparison']}) and command 2 {_minutes(stages['command 2']['seconds'])}, "
            f"{rec['pytest']}), `git status` clean after each")


def read_fresh_clone(root: Path | None = None) -> dict:
    """The committed record of a fresh clone's run (:data:`FRESH_CLONE`)."""
    return json.loads(((root or project_root()) / FRESH_CLONE).read_text())


def render(name: str, root: Path | None = None) -> str:
    """The text of the generated part ``name`` (see the module's docstring)."""
    head, _, rest = name.partition("|")
    kind, *args = head.split()
    words = tuple(w.strip() for w in rest.split(";") if w.strip()) if rest else None
    if kind == "table":
        table = (claims_table(root) if args == ["claims"] else
                 archs_table(root) if args == ["archs"] else
                 fit_table(root) if args == ["fit"] else
                 agreement_table(args[1], args[2], root) if args[0] == "agreement" else
                 calibration_table(args[1], root) if args[0] == "calibration" else
                 changes_table(args[1], root) if args[0] == "changes" else
                 ladder_table(args[1], root) if args[0] == "ladder" else
                 rows_table(args[1], root))
        return f"\n{table}\n"
    if kind in ("claim", "verdict"):
        row = select(args[0], args[1], words, root)
        if row is None:
            raise ValueError(f"{args[1]} does not measure {args[0]}")
        return number(row) if kind == "claim" else row["verdict"]
    if kind == "counts":
        return counts(args[0], args[1] if len(args) > 1 else "", root)
    if kind == "commit":  # the commits that made a profile's committed figures
        manifest = json.loads(((root or project_root()) / "figures" / args[0] /
                               "manifest.json").read_text())
        return ", ".join(sorted({e.get("commit") or "unknown" for e in manifest.values()
                                 if not e.get("parameters", {}).get(DRAWN_BY)}))
    if kind == "value":
        filters = dict(w.split("=", 1) for w in words or ())
        return value(args[0], args[1], filters, args[2] if len(args) > 2 else "", root)
    if kind == "fresh-clone":
        return fresh_clone_sentence(read_fresh_clone(root))
    raise ValueError(f"unknown generated part {name!r}; valid kinds: table, claim, verdict, "
                     "counts, commit, value, fresh-clone")


def regenerate(text: str, root: Path | None = None) -> str:
    """``text`` with every generated part rewritten from the committed CSVs."""
    return _MARK.sub(lambda m: f"<!-- generated:{m['name']} -->{render(m['name'], root)}"
                               "<!-- /generated -->", text)


def write_docs(root: Path | None = None) -> list[Path]:
    """Rewrite the generated parts of :data:`DOCS`; return the files that changed."""
    root = root or project_root()
    forest.cache_clear()
    changed = []
    for name in DOCS:
        path = root / name
        old = path.read_text()
        new = regenerate(old, root)
        if new != old:
            path.write_text(new)
            changed.append(path)
    return changed


def profile_summaries() -> dict[str, str]:
    """``{profile: its first sentence}``, read from each profile file's opening comment
    (``# Profile 'NAME': ...``)."""
    from bnmem_utils.run.plan import available_profiles

    out = {}
    for name, path in available_profiles().items():
        lines = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            lines.append(line.lstrip("# ").strip())
        text = " ".join(lines).split(":", 1)[-1].strip()
        out[name] = re.split(r"(?<=[.?])\s", text, maxsplit=1)[0]
    return out
