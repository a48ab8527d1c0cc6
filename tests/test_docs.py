"""The generated numbers of README.md and docs/results.md (bnmem_utils.run.docs): the committed
text is its own regeneration from the committed CSVs, no number with an interval stands outside
a generated part unless a committed CSV holds it, and the generator itself picks, formats and
refuses as it says."""

from __future__ import annotations

import csv
import functools
import io
import json
import re
import subprocess
import tarfile
from decimal import Decimal
from pathlib import Path

import pytest

from bnmem_utils.analyses.report import CLAIMS
from bnmem_utils.core.paths import project_root
from bnmem_utils.run import cli, docs, summary

ROOT = project_root()
_NUM = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
_INTERVAL = re.compile(rf"(?<![\w.])({_NUM})\s*(?:%|x|pt)?\s*\[\s*({_NUM})\s*,\s*({_NUM})\s*\]")


@functools.cache
def committed_triples(root: Path) -> frozenset[tuple[float, float, float]]:
    """Every ``(value, lo, hi)`` of the committed figures' CSVs: ``X, X_lo, X_hi`` columns, and
    the column before ``lo, hi``."""
    out = set()
    for path in sorted(root.glob("figures/*/*.csv")):
        with open(path, newline="") as f:
            reader = csv.reader(f)
            cols = next(reader, [])
            groups = [(cols.index(c), cols.index(f"{c}_lo"), cols.index(f"{c}_hi"))
                      for c in cols if f"{c}_lo" in cols and f"{c}_hi" in cols]
            if "lo" in cols and "hi" in cols and cols.index("lo") > 0:
                groups.append((cols.index("lo") - 1, cols.index("lo"), cols.index("hi")))
            if not groups:
                continue
            for row in reader:
                for g in groups:
                    try:
                        out.add(tuple(float(row[i]) for i in g))
                    except (ValueError, IndexError):
                        continue
    return frozenset(out)


def _close(printed: str, x: float) -> bool:
    """Whether ``x`` rounds to ``printed`` at the precision it is printed with."""
    quantum = Decimal(10) ** Decimal(printed).as_tuple().exponent
    return abs(Decimal(repr(x)) - Decimal(printed)) <= quantum / 2 * Decimal("1.000001")


def unmatched_intervals(text: str, root: Path) -> list[str]:
    """The numbers with an interval outside ``text``'s generated parts that no committed CSV
    under ``root`` holds (as printed, or times 100)."""
    bare = docs._MARK.sub("", text)
    triples = committed_triples(root)
    return [m[0] for m in _INTERVAL.finditer(bare)
            if not any(all(_close(p, s * x) for p, x in zip(m.groups(), t, strict=True))
                       for t in triples for s in (1, 100))]


@pytest.fixture(scope="session")
def committed(tmp_path_factory) -> Path:
    """The docs and figures as committed (git's HEAD), whatever a run has written since: a
    reader's ``bnmem reproduce`` (or a ``--publish``) changes the working tree, not what the
    committed docs quote. Outside a git checkout: the working tree."""
    try:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD", "--", *docs.DOCS,
                              "figures", docs.FRESH_CLONE], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ROOT
    folder = tmp_path_factory.mktemp("committed")
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(folder, filter="data")
    return folder


def test_the_committed_tree_is_what_git_holds_not_the_working_tree(committed, tmp_path):
    """A figure rewritten after the commit does not reach the tree the docs are checked on."""
    if committed == ROOT:
        pytest.skip("not a git checkout: the docs are checked on the working tree")
    forest = "figures/fmnist/06_claims_forest.csv"
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{forest}"], check=True,
                           capture_output=True, text=True).stdout
    assert (committed / forest).read_text() == shown


@pytest.mark.parametrize("name", docs.DOCS)
def test_committed_docs_are_their_own_regeneration(name, committed):
    text = (committed / name).read_text()
    assert "<!-- generated:" in text
    assert docs.regenerate(text, committed) == text, (
        f"{name} differs from the committed CSVs: run `bnmem report --docs` and commit it")


@pytest.mark.parametrize("name", docs.DOCS)
def test_no_hand_typed_interval_outside_the_committed_runs(name, committed):
    assert unmatched_intervals((committed / name).read_text(), committed) == []


def test_the_readme_is_short_and_leads_with_scope_commands_and_findings():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    head = "\n".join(lines[:80])
    for part in ("## Scope", "## Quickstart", "## Findings", "bnmem reproduce", "-m pytest"):
        assert part in head


def _profiles_with_results(root: Path) -> list[str]:
    """The profiles whose claims forest is committed."""
    return sorted(p.parent.name for p in root.glob("figures/*/06_claims_forest.csv"))


def test_every_claim_has_one_headline_row_where_it_is_measured(committed):
    """Each claim of each committed profile: exactly one headline row (select raises on none or
    several), so the README's table is well defined."""
    for profile in _profiles_with_results(committed):
        for claim in CLAIMS:
            row = docs.select(claim.id, profile, root=committed)
            assert row is None or row["id"] == claim.id
    assert set(docs.HEADLINE) <= {c.id for c in CLAIMS}
    assert set(docs.FMNIST_SOURCE.values()) <= set(_profiles_with_results(committed))


def test_claims_sharing_the_papers_words_say_what_each_tests(committed):
    """Two claims on one sentence of the paper (C2b and C2c, T1c and T1d) read apart in the
    README's table, and a claim with no primary row is marked: its verdict skips Holm's
    adjustment, so it may read reproduced where its sibling, on one number, reads inconclusive."""
    rows = {line.split(" | ")[0].strip("|* "): line.split(" | ")
            for line in docs.claims_table(committed).splitlines()[2:]}
    assert len({rows[c][1] for c in rows}) == len(rows)            # no two rows read alike
    for claim in CLAIMS:
        marked = "no primary row" in rows[claim.id][2]
        assert marked == (claim.primary is None), claim.id
    assert "final epoch" in rows["C2b"][1] and "peak epoch" in rows["C2c"][1]


def _forest(tmp_path, rows):
    folder = tmp_path / "figures" / "p"
    folder.mkdir(parents=True)
    cols = ["id", "claim", "paper", "setting", "ours", "verdict", "reason", "value", "lo", "hi"]
    cols += ["primary"] if any("primary" in r for r in rows) else []
    with open(folder / "06_claims_forest.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, cols)
        writer.writeheader()
        writer.writerows({c: r.get(c, "") for c in cols} for r in rows)
    docs.forest.cache_clear()
    committed_triples.cache_clear()
    return tmp_path


def test_a_generated_part_is_rewritten_and_a_stale_one_caught(tmp_path):
    root = _forest(tmp_path, [
        {"id": "C3a", "setting": "MNIST, LeNet, OOD 1%", "ours": "2.5 [1.9, 3.1] pt",
         "verdict": "reproduced", "value": "0.025", "lo": "0.019", "hi": "0.031"},
        {"id": "C3a", "setting": "MNIST, LeNet, OOD 5%", "ours": "1.8 [1.1, 2.5] pt",
         "verdict": "reproduced", "value": "0.018", "lo": "0.011", "hi": "0.025"}])
    stale = "BN leads by <!-- generated:claim C3a p -->9.9 [9, 10] pt<!-- /generated -->, " \
            "<!-- generated:verdict C3a p | OOD 5% -->x<!-- /generated -->."
    fresh = docs.regenerate(stale, root)
    assert fresh == ("BN leads by <!-- generated:claim C3a p -->2.5 [1.9, 3.1] pt"
                     "<!-- /generated -->, <!-- generated:verdict C3a p | OOD 5% -->reproduced"
                     "<!-- /generated -->.")
    assert docs.regenerate(fresh, root) == fresh
    assert unmatched_intervals("it reads 2.5 [1.9, 3.1] pt and 1.8 [1.1, 2.5]", root) == []
    assert unmatched_intervals("it reads 2.6 [1.9, 3.1] pt", root) == ["2.6 [1.9, 3.1]"]
    assert unmatched_intervals(fresh.replace("2.5 [", "7.5 ["), root) == []  # generated


def test_an_ambiguous_or_unknown_part_is_refused(tmp_path):
    root = _forest(tmp_path, [
        {"id": "T3", "setting": "MNIST, LeNet, flip 1%", "ours": "0.8 [0.7, 0.9]",
         "verdict": "reproduced"},
        {"id": "T3", "setting": "MNIST, MLP, flip 1%", "ours": "0.4 [0.3, 0.5]",
         "verdict": "not reproduced"}])
    assert docs.render("claim T3 p", root) == "0.8 [0.7, 0.9] of channels"  # the headline row
    with pytest.raises(ValueError, match="2 rows"):
        docs.render("claim T3 p | flip 1%", root)
    with pytest.raises(ValueError, match="does not measure"):
        docs.render("claim C1a p", root)
    with pytest.raises(ValueError, match="valid kinds"):
        docs.render("figure T3 p", root)


def test_value_reads_one_row_of_a_figure_csv(tmp_path):
    (tmp_path / "figures" / "p").mkdir(parents=True)
    (tmp_path / "figures" / "p" / "f.csv").write_text(
        "arm,auc,auc_lo,auc_hi\nBN,0.678076,0.669424,0.686729\nGN,0.54567,0.538286,0.553054\n")
    assert docs.render("value p/f auc % | arm=BN", tmp_path) == "67.8 [66.9, 68.7]%"
    (tmp_path / "figures" / "p" / "g.csv").write_text("arm,mean,lo,hi\nBN,0.7,0.183,1.22\n")
    assert docs.render("value p/g mean % | arm=BN", tmp_path) == "70 [18.3, 100]%"  # a share
    assert docs.render("value p/g mean pt | arm=BN", tmp_path) == "70 [18.3, 122] pt"
    with pytest.raises(ValueError, match="0 rows"):
        docs.render("value p/f auc | arm=LN", tmp_path)
    (tmp_path / "figures" / "p" / "h.csv").write_text("arm,ratio,lo,hi,n,noisy_acc\nBN,2,1,3,3,0.9\n")
    assert docs.render("value p/h ratio | arm=BN", tmp_path) == "2 [1, 3]"
    with pytest.raises(ValueError, match=r"'noisy_acc' has no interval of its own \(columns "
                                         r"with one: ratio\)"):
        docs.render("value p/h noisy_acc % | arm=BN", tmp_path)   # lo and hi are the ratio's


def test_bnmem_report_docs_rewrites_only_what_changed(tmp_path, monkeypatch, capsys):
    root = _forest(tmp_path, [{"id": "C3d", "setting": "MNIST, LeNet, clean",
                               "ours": "2.2 [1.5, 2.9] pt", "verdict": "reproduced"}])
    (root / "docs").mkdir()
    (root / "README.md").write_text("<!-- generated:claim C3d p -->?<!-- /generated -->\n")
    (root / "docs" / "results.md").write_text("no generated part\n")
    monkeypatch.setenv("BNMEM_ROOT", str(root))
    assert cli.main(["report", "--docs"]) == 0
    assert "README.md" in capsys.readouterr().out
    assert (root / "README.md").read_text() == \
        "<!-- generated:claim C3d p -->2.2 [1.5, 2.9] pt<!-- /generated -->\n"
    assert cli.main(["report", "--docs"]) == 0
    assert "current" in capsys.readouterr().out


@pytest.mark.parametrize(("claim", "rows", "shown"), [
    # a table with the primary flag is read by it
    ("T3", [{"setting": "MNIST, LeNet, flip 1%", "ours": "0.8 [0.7, 0.9]",
             "verdict": "reproduced", "primary": "False"},
            {"setting": "MNIST, MLP, flip 10%", "ours": "0.4 [0.3, 0.5]",
             "verdict": "not reproduced", "primary": "True"}], "0.4 [0.3, 0.5] of channels"),
    # C2c is a sensitivity check of C2b: no row of it is primary, so the claims table shows
    # the row that its HEADLINE words name
    ("C2c", [{"setting": "MNIST, LeNet, flip 10%, train-mode gradients", "ours": "1.1 [0.9, 1.3]",
              "verdict": "inconclusive", "primary": "False"},
             {"setting": "MNIST, LeNet, flip 10%, eval-mode gradients", "ours": "2.2 [1.8, 2.7]",
              "verdict": "reproduced", "primary": "False"}], "2.2 [1.8, 2.7] x no norm"),
])
def test_the_shown_row_is_the_primary_one_else_the_headline_words(tmp_path, claim, rows, shown):
    root = _forest(tmp_path, [{"id": claim, **r} for r in rows])
    assert docs.render(f"claim {claim} p", root) == shown


def test_compare_table_puts_profiles_side_by_side(monkeypatch):
    """``bnmem report --compare``: one line per claim; a claim with several settings lists each
    and counts its primary rows' verdicts; a profile without the claim reads missing."""
    from bnmem_utils.analyses import report

    rows = {"a": [{"id": "C1b", "setting": "flip 1%", "ours": "16.9 [9.83, 23.9] pt",
                   "verdict": "reproduced", "primary": True},
                  {"id": "C1b", "setting": "flip 10%", "ours": "13.6 [11.2, 16.1] pt",
                   "verdict": "reproduced", "primary": False}],
            "b": []}
    monkeypatch.setattr(report, "claims_table", lambda claims, p, out_dir: rows[p])
    c1b = [c for c in report.CLAIMS if c.id == "C1b"]
    lines = docs.compare_table(c1b, ["a", "b"]).splitlines()
    assert lines[0] == "| claim | paper | a: ours (95% CI) | a: verdict | b: ours (95% CI) | b: verdict |"
    assert len(lines) == 3 and lines[2].startswith(f"| C1b: {c1b[0].title} | {c1b[0].paper} | ")
    assert lines[2].endswith("| flip 1%: 16.9 [9.83, 23.9] pt; flip 10%: 13.6 [11.2, 16.1] pt "
                             "| primary rows: 1 reproduced | — | missing |")


def _forest_rows(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cols = ["id", "setting", "ours", "verdict", "primary"]
    with open(folder / summary.FOREST, "w", newline="") as f:
        writer = csv.DictWriter(f, cols)
        writer.writeheader()
        writer.writerows(rows)
    return folder


def _published_and_run(tmp_path: Path) -> Path:
    """One C3b row published and rerun with another verdict; the path a changes file takes."""
    row = {"id": "C3b", "setting": "LeNet, OOD 1%", "primary": "True"}
    _forest_rows(tmp_path / "figures" / "fmnist", [{**row, "ours": "1.7 [1.2, 2.3] pt",
                                                   "verdict": "not reproduced"}])
    _forest_rows(tmp_path / "runs" / "fmnist" / "figures", [{**row, "ours": "2.5 [0.5, 4.5] pt",
                                                              "verdict": "inconclusive"}])
    changes = tmp_path / "figures" / "changes" / "rule.csv"
    changes.parent.mkdir(parents=True)
    return changes


def test_a_run_is_compared_with_the_published_one_row_by_row(tmp_path):
    def row(i, setting, ours, verdict, primary=False):
        return {"id": i, "setting": setting, "ours": ours, "verdict": verdict,
                "primary": str(primary)}

    published = _forest_rows(tmp_path / "published", [
        row("C3a", "OOD 1%", "1.7 [1.2, 2.3] pt", "not reproduced", True),
        row("C3f", "OOD 5%", "0.93 [0.16, 1.64] pt", "supported"),
        row("C1b", "flip 1%", "16.9 [9.8, 23.9] pt", "reproduced", True),
        row("T1a", "grid", "1e-09 [0, 2e-09]", "reproduced")])
    run = _forest_rows(tmp_path / "run", [
        row("C3a", "OOD 1%", "1.8 [1.1, 2.4] pt", "not reproduced", True),
        row("C3f", "OOD 5%", "0.56 [-0.37, 1.48] pt", "inconclusive"),
        row("C1b", "flip 1%", "16.9 [9.8, 23.9] pt", "reproduced", True),
        row("T2a", "new", "0.5 [0.4, 0.6]", "reproduced")])
    text = summary.compare_published(run, published)
    assert "2 of 3 verdicts match; 2 rows print other numbers" in text
    assert "C3f OOD 5%: 0.93 [0.16, 1.64] pt supported -> 0.56 [-0.37, 1.48] pt inconclusive" in text
    assert "PRIMARY" not in text and "no primary verdict moved" in text
    assert ("2 rows are in only one of the two runs: T2a (secondary) 1 only in this run's; "
            "T1a (secondary) 1 only in the published") in text and "last bits" in text
    moved = _forest_rows(tmp_path / "run2", [
        row("C3a", "OOD 1%", "-1.8 [-2.4, -1.1] pt", "contradicted", True)])
    text = summary.compare_published(moved, published)
    assert "PRIMARY C3a OOD 1%" in text and "a PRIMARY verdict moved: 1 row(s)" in text
    assert "nothing to compare" in summary.compare_published(tmp_path / "none", published)


def test_bnmem_report_compares_a_run_with_the_published_one(tmp_path, monkeypatch, capsys):
    row = {"id": "C3a", "setting": "OOD 1%", "ours": "1 [0, 2] pt", "verdict": "inconclusive",
           "primary": "True"}
    _forest_rows(tmp_path / "figures" / "quick", [row])
    _forest_rows(tmp_path / "runs" / "quick" / "figures", [row])
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setenv("BNMEM_ROOT", str(tmp_path))
    assert cli.main(["report", "--profile", "quick", "--compare-published"]) == 0
    assert "1 of 1 verdicts match; 0 rows print other numbers" in capsys.readouterr().out


def test_the_changes_table_lists_each_moved_verdict_before_and_after(tmp_path):
    folder = tmp_path / "figures" / "changes"
    folder.mkdir(parents=True)
    cols = ["id", "profile", "setting", "primary", "before", "before_verdict", "after",
            "after_verdict"]
    with open(folder / "rule.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, cols)
        writer.writeheader()
        writer.writerow({"id": "C3b", "profile": "fmnist", "setting": "LeNet, OOD 1%",
                         "primary": "True", "before": "1.73 [1.18, 2.3] pt",
                         "before_verdict": "not reproduced", "after": "2.5 [0.5, 4.5] pt",
                         "after_verdict": "inconclusive"})
    text = docs.render("table changes rule", tmp_path)
    assert "| **C3b** (primary) | fmnist | LeNet, OOD 1% | 1.73 [1.18, 2.3] pt, not reproduced | " \
           "2.5 [0.5, 4.5] pt, **inconclusive** |" in text


def test_recorded_changes_keep_other_profiles_and_feed_the_docs_table(tmp_path, monkeypatch,
                                                                      capsys):
    changes = _published_and_run(tmp_path)
    changes.write_text('profile,id,setting,primary,before,before_verdict,after,after_verdict\n'
                       'quick,C3f,clean,False,"1 [0.1, 2] pt",supported,"0.5 [-1, 2] pt",'
                       'inconclusive\n')
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setenv("BNMEM_ROOT", str(tmp_path))
    assert cli.main(["report", "--profile", "fmnist", "--compare-published",
                     "--record-changes", "rule"]) == 0
    assert "wrote 1 moved verdicts of fmnist" in capsys.readouterr().out
    text = docs.render("table changes rule", tmp_path)
    assert "| **C3f** | quick | clean | 1 [0.1, 2] pt, supported |" in text
    assert "| **C3b** (primary) | fmnist | LeNet, OOD 1% | 1.7 [1.2, 2.3] pt, not reproduced | " \
           "2.5 [0.5, 4.5] pt, **inconclusive** |" in text


def test_recording_changes_without_both_runs_or_with_a_path_is_refused(tmp_path, monkeypatch,
                                                                       capsys):
    """With no run (or no published run) to compare there is nothing to record: the changes
    file keeps this profile's rows, not a silent empty replacement. The name is a file name
    under figures/changes/, and --record-changes means nothing without --compare-published."""
    changes = tmp_path / "figures" / "changes" / "rule.csv"
    changes.parent.mkdir(parents=True)
    before = ('profile,id,setting,primary,before,before_verdict,after,after_verdict\n'
              'fmnist,C3f,clean,False,"1 [0.1, 2] pt",supported,"0.5 [-1, 2] pt",inconclusive\n')
    changes.write_text(before)
    _forest_rows(tmp_path / "figures" / "fmnist", [{"id": "C3b", "setting": "LeNet, OOD 1%",
                                                   "ours": "1 [0, 2] pt", "verdict": "supported",
                                                   "primary": "True"}])
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setenv("BNMEM_ROOT", str(tmp_path))
    for argv, words in (
            (["--compare-published", "--record-changes", "rule"], ["nothing to compare", "rule"]),
            (["--compare-published", "--record-changes", "../../x"], ["'../../x'", "file name"]),
            (["--compare-published", "--record-changes", ""], ["''", "file name"]),
            (["--record-changes", "rule"], ["--record-changes", "--compare-published"])):
        assert cli.main(["report", "--profile", "fmnist", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(w in err for w in words), (argv, err)
    assert changes.read_text() == before
    assert sorted(p.name for p in tmp_path.rglob("*.csv")) == ["06_claims_forest.csv", "rule.csv"]


def _archs_root(tmp_path):
    """A tree with the committed fmnist figures and a small archs forest and gamma/sigma table."""
    import shutil

    import pandas as pd

    (tmp_path / "figures").mkdir()
    shutil.copytree(ROOT / "figures" / "fmnist", tmp_path / "figures" / "fmnist")
    rows = pd.read_csv(ROOT / "figures" / "fmnist" / "06_claims_forest.csv", dtype=str)
    deep = []
    for arch, shift in (("ResNet-20", "0.1"), ("DenseNet", "-0.05")):
        for cid in ("C1b", "C2a", "C3a"):
            r = rows[(rows["id"] == cid) & (rows["primary"] == "True")].iloc[0].copy()
            r["setting"] = r["setting"].replace("LeNet", arch)
            r["value"], r["lo"], r["hi"] = shift, str(float(shift) - 0.1), str(float(shift) + 0.1)
            r["primary"] = "False"
            deep.append(r)
    archs = tmp_path / "figures" / "archs"
    archs.mkdir()
    pd.DataFrame(deep).to_csv(archs / "06_claims_forest.csv", index=False)
    pd.DataFrame({"arch": ["resnet20"] * 3 + ["densenet"] * 2, "norm": "bn",
                  "depth": [0, 1, 2, 0, 1], "ratio": [1.0, 1.2, 0.9, 1.1, 1.05]}
                 ).to_csv(archs / "02_gamma_sigma.csv", index=False)
    return tmp_path


def test_the_architectures_table_puts_the_lenet_beside_the_deeper_networks(tmp_path):
    docs.forest.cache_clear()
    root = _archs_root(tmp_path)
    table = docs.archs_table(root)
    lines = [ln for ln in table.splitlines() if ln.startswith("| **")]
    assert [ln.split(" | ")[0] for ln in lines] == ["| **C1b**", "| **C2a**", "| **C3a**"]
    c1b = lines[0]
    assert "flip 1%: 16.9 [9.16, 24.6] pt, **reproduced**" in c1b        # the LeNet's primary
    assert c1b.count("flip 1%:") == 3 and "not measured" not in c1b
    docs.forest.cache_clear()


def test_a_deeper_network_that_did_not_fit_says_so_beside_its_rows(tmp_path):
    """Where BN or no norm of a network fitted less than FITTED of its clean training images at
    notebook 02's last epoch on a data set, each of that network's rows on that data set names
    the norm and how far it got; a network that fitted, or another data set, reads as before."""
    import pandas as pd

    docs.forest.cache_clear()
    root = _archs_root(tmp_path)
    before = docs.archs_table(root)
    assert "under-fitted" not in before
    curve = {"setting": "flip 5%", "dataset": ["fashion_mnist"] * 6 + ["mnist"],
             "metric": "clean_acc", "n": 3,
             "arch": ["densenet"] * 4 + ["resnet20"] * 2 + ["densenet"],
             "norm": ["bn", "bn", "none", "none", "bn", "none", "none"],
             "epoch": [1, 30, 1, 30, 30, 30, 30], "mean": [0.5, 1.0, 0.99, 0.951, 1.0, 0.99, 0.5]}
    pd.DataFrame({**curve, "lo": 0.0, "hi": 1.0}).to_csv(
        root / "figures" / "archs" / "02_train_accuracy_curves.csv", index=False)
    lines = [ln for ln in docs.archs_table(root).splitlines() if ln.startswith("| **")]
    deep = [ln.split(" | ")[3:5] for ln in lines]
    assert all("under-fitted" not in resnet for resnet, _ in deep)          # both at >= 99%
    assert all(dense.count("(under-fitted in 02: no norm 95.1% of the clean training images)")
               == 1 for _, dense in deep)                # its last epoch's, not epoch 1's 99%
    assert "MNIST" not in " ".join(dense for _, dense in deep).replace("Fashion-MNIST", "")
    docs.forest.cache_clear()


def test_a_word_of_a_setting_picks_the_row_it_names_whole(tmp_path):
    """``MNIST`` is inside ``Fashion-MNIST``: the generated part that names MNIST reads MNIST's
    row, and a word that names no whole part still reads the one row that holds it."""
    import pandas as pd

    root = _archs_root(tmp_path)
    rows = pd.read_csv(root / "figures" / "archs" / "06_claims_forest.csv", dtype=str)
    dense = rows[rows["setting"].str.contains("DenseNet")].copy()
    assert dense["setting"].str.startswith("Fashion-MNIST, DenseNet").all()
    mnist = dense.assign(setting=dense["setting"].str.replace("Fashion-MNIST", "MNIST"), value="7")
    pd.concat([rows, mnist]).to_csv(root / "figures" / "archs" / "06_claims_forest.csv", index=False)
    docs.forest.cache_clear()
    hit = docs.select("C1b", "archs", ("DenseNet", "MNIST"), root)
    assert hit["setting"].split(", ")[:2] == ["MNIST", "DenseNet"] and hit["value"] == "7"
    fashion = docs.select("C1b", "archs", ("DenseNet", "Fashion"), root)
    assert fashion["setting"].startswith("Fashion-MNIST") and fashion["value"] == "-0.05"
    with pytest.raises(ValueError, match="2 rows hold"):
        docs.select("C1b", "archs", ("DenseNet",), root)
    docs.forest.cache_clear()


def test_the_depth_figure_is_drawn_from_the_committed_csvs(tmp_path):
    import pandas as pd

    docs.forest.cache_clear()
    root = _archs_root(tmp_path)
    points = docs.depth_points(root)
    assert list(points.groupby("claim")["bn_layers"].apply(list)) == [[4, 21, 39]] * 3
    c1b = points[points["claim"] == "C1b"].set_index("arch")["value"]
    assert c1b["resnet20"] == pytest.approx(10.0) and c1b["densenet"] == pytest.approx(-5.0)
    png = docs.write_depth_figure(root)
    data = pd.read_csv(png.with_suffix(".csv"))
    assert set(data["part"]) == {"claims", "gamma_sigma"}
    first = png.read_bytes()
    docs.write_depth_figure(root)
    assert png.read_bytes() == first          # the same bytes: `bnmem report --docs` keeps git clean
    entry = json.loads((png.parent / "manifest.json").read_text())[docs.DEPTH_FIGURE]
    assert entry["commit"] and entry["parameters"] == {docs.DRAWN_BY: "bnmem report --docs"}
    docs.forest.cache_clear()


def test_a_profiles_commits_are_its_runs_not_a_figure_drawn_from_them(tmp_path):
    folder = tmp_path / "figures" / "archs"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({
        "02_gamma_sigma": {"commit": "ef2cb20"}, "04_lira": {"commit": ""},
        "07_depth": {"commit": "1ab7f68", "parameters": {docs.DRAWN_BY: "bnmem report --docs"}}}))
    assert docs.render("commit archs", tmp_path) == "ef2cb20, unknown"


def test_the_fit_table_reads_the_last_epoch_of_each_network(tmp_path):
    import pandas as pd

    archs = tmp_path / "figures" / "archs"
    archs.mkdir(parents=True)
    curve = {"setting": "flip 5%", "dataset": "mnist", "arch": "resnet20", "norm": ["bn"] * 2,
             "epoch": [1, 30], "n": 3}
    pd.DataFrame({**curve, "metric": "clean_acc", "mean": [0.5, 0.97], "lo": [0.4, 0.95],
                  "hi": [0.6, 1.01]}).to_csv(archs / "02_train_accuracy_curves.csv", index=False)
    pd.DataFrame({**curve, "metric": "corrupted_acc", "mean": [0.0, 0.8], "lo": [-0.1, 0.7],
                  "hi": [0.1, 0.9]}).to_csv(archs / "02_memorization_curves.csv", index=False)
    pd.DataFrame({"arm": ["mnist/resnet20/bn/clean", "mnist/resnet20/bn/ood5"], "norm": "bn",
                  "gap": [0.02, 0.3], "gap_lo": [-0.01, 0.2], "gap_hi": [0.05, 0.4], "auc": 0.6,
                  "auc_lo": 0.5, "auc_hi": 0.7}).to_csv(archs / "04_auc_vs_gap.csv", index=False)
    (row,) = [ln for ln in docs.fit_table(tmp_path).splitlines() if ln.startswith("| MNIST")]
    assert row == ("| MNIST | ResNet-20 | BatchNorm | 97 [95, 100]% | 80 [70, 90]% | not measured "
                   "| 2 [-1, 5] pt |")
    assert "no results" in docs.fit_table(tmp_path / "elsewhere")


@pytest.mark.parametrize("content", [
    b"claim,verdict\nC3b,supported\n",                       # another table's columns
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00\x01",  # not text
    b'"profile\nid",x\n',                                    # a header cell across two lines
])
def test_recording_changes_into_a_file_that_is_no_changes_file_is_refused(tmp_path, monkeypatch,
                                                                          capsys, content):
    """figures/changes/NAME.csv that holds something else: one line naming it and the columns
    a changes file has, exit 2, the file as it was."""
    changes = _published_and_run(tmp_path)
    changes.write_bytes(content)
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setenv("BNMEM_ROOT", str(tmp_path))
    assert cli.main(["report", "--profile", "fmnist", "--compare-published",
                     "--record-changes", "rule"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{changes} is no changes file" in err and "profile, id, setting" in err, err
    assert changes.read_bytes() == content


def test_the_densenet_profiles_rows_join_the_deeper_networks_named_by_their_profile(tmp_path):
    """DenseNet-BC's banks and gradient norms run in profile ``densenet``: its rows stand in
    DenseNet-BC's cell beside those of ``archs`` with their profile named, its 04 gap in the fit
    table, and the depth figure takes them where ``archs`` has none (Fashion-MNIST's first)."""
    import pandas as pd

    docs.forest.cache_clear()
    root = _archs_root(tmp_path)
    forest = root / "figures" / "archs" / "06_claims_forest.csv"
    rows = pd.read_csv(forest, dtype=str)
    dense = rows["setting"].str.contains("DenseNet") & rows["id"].isin(["C2a", "C3a"])
    rows[~dense].to_csv(forest, index=False)                     # archs: DenseNet-BC's C1b alone
    own = root / "figures" / "densenet"
    own.mkdir()
    moved = rows[dense].assign(setting=rows[dense]["setting"].str.replace("Fashion-MNIST", "MNIST"),
                               value="0.3", lo="0.2", hi="0.4")
    moved.to_csv(own / "06_claims_forest.csv", index=False)
    pd.DataFrame({"arm": ["mnist/densenet/bn/clean"], "norm": "bn", "gap": [0.25],
                  "gap_lo": [0.2], "gap_hi": [0.3], "auc": 0.9, "auc_lo": 0.85, "auc_hi": 0.95}
                 ).to_csv(own / "04_auc_vs_gap.csv", index=False)
    lines = {ln.split(" | ")[0]: ln.split(" | ")[4] for ln in docs.archs_table(root).splitlines()
             if ln.startswith("| **")}
    assert "(`densenet`)" not in lines["| **C1b**"] and lines["| **C1b**"].startswith("Fashion")
    assert lines["| **C3a**"].startswith("MNIST, ") and "(`densenet`): " in lines["| **C3a**"]
    (gap,) = [ln for ln in docs.fit_table(root).splitlines() if "DenseNet" in ln]
    assert gap.endswith("| 25 [20, 30] pt |")
    points = docs.depth_points(root).set_index(["claim", "arch"])
    assert points.loc[("C3a", "densenet"), "profile"] == "densenet"
    assert points.loc[("C1b", "densenet"), "profile"] == "archs"
    assert points.loc[("C3a", "densenet"), "value"] == pytest.approx(0.3 * 100)
    docs.forest.cache_clear()


def test_every_published_profile_has_its_rows_in_the_results():
    text = (ROOT / "docs" / "results.md").read_text()
    published = sorted(p.parent.name for p in (ROOT / "figures").glob("*/06_claims_forest.csv"))
    assert published and [p for p in published
                          if f"<!-- generated:table rows {p} -->" not in text] == []


def test_a_deeper_networks_matched_gap_rows_are_shown_at_the_lenets_position_and_ruler(tmp_path):
    """ResNet-20's confound study (``confound_resnet20``) has a C3e row per matched position and
    ruler; the architectures table shows the one at the LeNet's primary row's (``confound``)."""
    import shutil

    import pandas as pd

    docs.forest.cache_clear()
    root = _archs_root(tmp_path)
    shutil.copytree(ROOT / "figures" / "confound", root / "figures" / "confound")
    rows = pd.read_csv(ROOT / "figures" / "confound" / "06_claims_forest.csv", dtype=str)
    ours = rows[rows["id"].isin(["C3e", "C3h"]) & ~rows["setting"].str.contains("Norm")].copy()
    ours["setting"] = ours["setting"].str.replace("LeNet", "ResNet-20")
    ours["primary"] = "False"
    (root / "figures" / "confound_resnet20").mkdir()
    ours.to_csv(root / "figures" / "confound_resnet20" / "06_claims_forest.csv", index=False)
    cells = {ln.split(" | ")[0]: ln.split(" | ")[2:4] for ln in docs.archs_table(root).splitlines()
             if ln.startswith("| **")}
    lenet, resnet = cells["| **C3e**"]
    assert "middle matched gap, matched on the loss gap" in lenet and "(`confound`)" in lenet
    assert resnet.count("matched gap") == 1 and "(`confound_resnet20`)" in resnet
    assert resnet.startswith("Fashion-MNIST, OOD 1%, middle matched gap, matched on the loss gap")
    docs.forest.cache_clear()


def test_the_ladder_table_averages_each_bank_over_its_targets_then_the_ladders(tmp_path):
    import pandas as pd
    from scipy import stats

    folder = tmp_path / "figures" / "cf"
    folder.mkdir(parents=True)
    rows = [{"norm": "bn", "knob": "epochs", "epochs": e, "replicate": r, "model": m, "arch": "x",
             "gap": 0.1 * e + 0.01 * r + 0.001 * m, "auc": 0.6, "loss_gap": 0.5, "global_auc": 0.55,
             "train_acc": 1.0, "test_acc": 0.7} for e in (2, 5) for r in (0, 1, 2) for m in (0, 1)]
    rows.append({**rows[0], "knob": "train_size", "gap": 9.0})        # another knob: left out
    pd.DataFrame(rows).to_csv(folder / "04b_auc_vs_gap_ladder.csv", index=False)
    lines = docs.ladder_table("cf", tmp_path).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| norm | epochs | training accuracy")
    cells = lines[2].split(" | ")
    assert cells[:2] == ["| BatchNorm", "2"]
    half = stats.t.ppf(0.975, 2) * 1.0 / 3 ** 0.5             # bank means 20.05, 21.05, 22.05 pt
    assert cells[4] == f"{21.05:.3g} [{21.05 - half:.3g}, {21.05 + half:.3g}] pt"
    assert cells[5] == "0.5 [0.5, 0.5]" and cells[2] == "100 [100, 100]%"
