"""The claims table's verdict rules, key patterns, missing results and the HTML export."""

from __future__ import annotations

import nbformat
import pandas as pd
import pytest

from bnmem_utils import publish, report
from bnmem_utils.report import Claim, judge
from bnmem_utils.results import ResultsFile, results_path


def effect(**kw) -> Claim:
    return Claim("X", "t", "p", "02_nb", "k", "effect", **kw)


@pytest.mark.parametrize(("entry", "verdict"), [
    ({"value": 0.2, "lo": 0.1, "hi": 0.3}, "reproduced"),
    ({"value": -0.2, "lo": -0.3, "hi": -0.1}, "not reproduced"),
    ({"value": 0.05, "lo": -0.1, "hi": 0.2}, "inconclusive"),
    ({"value": 0.05}, "inconclusive"),  # a single run carries no interval
    (None, "missing"),
    ({"value": None}, "not reproduced"),  # recorded without a number: the premise failed
])
def test_effect_rule(entry, verdict):
    assert judge(effect(), entry)[0] == verdict


def test_a_number_recorded_as_none_names_its_reason():
    verdict, reason = judge(effect(), {"value": None, "description": "no penalty qualified"})
    assert (verdict, reason) == ("not reproduced", "no penalty qualified")


def test_effect_rule_with_negative_sign_judges_a_reduction():
    reduction = {"value": -0.8, "lo": -0.9, "hi": -0.7}
    assert judge(effect(sign=-1), reduction)[0] == "reproduced"
    assert judge(effect(), reduction)[0] == "not reproduced"


def test_effect_rule_against_the_papers_magnitude():
    small = {"value": 0.005, "lo": -0.004, "hi": 0.014}
    assert judge(effect(magnitude=0.03), small)[0] == "not reproduced"
    verdict, reason = judge(effect(magnitude=0.03), {"value": 0.01, "lo": 0.001, "hi": 0.02})
    assert verdict == "reproduced" and "below the paper's size" in reason


@pytest.mark.parametrize(("entry", "verdict"), [
    ({"value": 0.7, "lo": 0.6, "hi": 0.8}, "reproduced"),
    ({"value": 0.3, "lo": 0.2, "hi": 0.4}, "not reproduced"),
    ({"value": 0.5, "lo": 0.4, "hi": 0.6}, "inconclusive"),
    ({"value": 0.7}, "reproduced"),
])
def test_at_least_rule(entry, verdict):
    assert judge(Claim("X", "t", "p", "nb", "k", "at_least", bound=0.5), entry)[0] == verdict


def test_theory_checks():
    at_most = Claim("T", "t", "p", "nb", "k", "at_most", bound=1e-3)
    within = Claim("T", "t", "p", "nb", "k", "within", bound=2.0, tolerance=0.01)
    assert judge(at_most, {"value": 1e-4})[0] == "reproduced"
    assert judge(at_most, {"value": 1e-2})[0] == "not reproduced"
    assert judge(within, {"value": 2.005})[0] == "reproduced"
    assert judge(within, {"value": 1.98})[0] == "not reproduced"


def test_unknown_rule_is_an_error():
    with pytest.raises(ValueError, match="unknown rule 'bigger'"):
        judge(Claim("X", "t", "p", "nb", "k", "bigger"), {"value": 1.0})


def _results(tmp_path, notebook, values):
    rf = ResultsFile(results_path("quick", notebook, tmp_path))
    for key, val in values.items():
        rf.record(key, val["value"], lo=val.get("lo"), hi=val.get("hi"), n=5)


def test_claims_table_expands_patterns_and_lists_missing(tmp_path):
    _results(tmp_path, "04_lira", {
        "lira_auc_diff_bn_none_digits_lenet_ood1_all": {"value": 0.01, "lo": -0.01, "hi": 0.03},
        "lira_auc_diff_bn_none_mlp_ood1_all": {"value": 0.05, "lo": 0.04, "hi": 0.06},
        "lira_auc_bn_digits_lenet_clean_all": {"value": 0.55, "lo": 0.54, "hi": 0.56},
    })
    claims = [
        Claim("C3", "t", "p", "04_lira", "lira_auc_diff_bn_none_*_ood1_all", "effect", scale=100),
        Claim("C9", "t", "p", "02_forced_memorization", "mem_x", "effect"),
    ]
    rows = report.claims_table(claims, "quick", tmp_path)
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) == {"lira_auc_diff_bn_none_digits_lenet_ood1_all",
                           "lira_auc_diff_bn_none_mlp_ood1_all", "mem_x"}
    assert by_key["lira_auc_diff_bn_none_mlp_ood1_all"]["verdict"] == "reproduced"
    assert by_key["lira_auc_diff_bn_none_mlp_ood1_all"]["ours"].startswith("5 [4, 6]")
    assert by_key["lira_auc_diff_bn_none_digits_lenet_ood1_all"]["verdict"] == "inconclusive"
    assert by_key["mem_x"]["verdict"] == "missing"
    assert report.verdict_counts(rows) == {"reproduced": 1, "not reproduced": 0,
                                           "inconclusive": 1, "missing": 1}
    assert "| C3: t |" in report.claims_markdown(rows)


def test_every_claim_names_a_known_notebook_and_rule():
    from bnmem_utils.runplan import discover_notebooks

    notebooks = set(discover_notebooks())
    for claim in report.CLAIMS:
        assert claim.notebook in notebooks, claim
        assert claim.rule in ("effect", "at_least", "at_most", "within"), claim


def test_export_html_writes_pages_and_index(tmp_path):
    run_dir = tmp_path / "runs" / "quick"
    run_dir.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# hello"), nbformat.v4.new_code_cell("1 + 1")]
    nbformat.write(nb, run_dir / "01_theory.ipynb")
    _results(tmp_path, "01_theory", {"theory_max_rel_error": {"value": 1e-9}})
    claims = [Claim("T1a", "ratio", "paper says", "01_theory", "theory_max_rel_error", "at_most",
                    bound=1e-3)]
    index = publish.export_html("quick", claims, out_dir=tmp_path)
    page = index.read_text()
    assert (run_dir / "html" / "01_theory.html").exists()
    assert 'href="01_theory.html"' in page and "reproduced" in page


def test_export_html_without_runs_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="bnmem reproduce --profile quick"):
        publish.export_html("quick", [], out_dir=tmp_path)


def test_report_cli_on_missing_runs_exits_2(tmp_path, capsys):
    from bnmem_utils.cli import main

    assert main(["report", "--profile", "quick", "--out", str(tmp_path)]) == 2
    assert "bnmem reproduce" in capsys.readouterr().err


def test_rows_name_their_setting_in_words(tmp_path):
    _results(tmp_path, "02_forced_memorization", {
        "mem_diff_bn_none_digits_lenet_flip_1pct_at10": {"value": 0.4, "lo": 0.1, "hi": 0.7},
        "mem_diff_bn_none_digits_mlp_ood_2pct_gaussian_at10": {"value": 0.3, "lo": 0.1, "hi": 0.5},
        "mem_t3_frac_above1_fashion_mnist_resnet18_flip_0p5pct": {"value": 0.7, "lo": 0.6, "hi": 0.8},
    })
    _results(tmp_path, "04_lira", {
        "lira_auc_diff_bn_none_digits_lenet_ood1_all": {"value": 0.04, "lo": 0.03, "hi": 0.05},
        "lira_auc_diff_bn_none_digits_lenet_clean_all": {"value": 0.01, "lo": 0.0, "hi": 0.02}})
    _results(tmp_path, "03_gradient_norms", {"gn_ratio_bn_eval_final": {"value": 2.0, "lo": 1.5, "hi": 3}})
    by_id = {}
    for r in report.claims_table(report.CLAIMS, "quick", tmp_path):
        by_id.setdefault(r["id"], []).append(r["setting"])
    assert by_id["C1a"] == ["digits 8x8, LeNet, 1% label flips",
                            "digits 8x8, MLP, 2% OOD inserts (gaussian)"]
    assert by_id["T3"] == ["Fashion-MNIST, ResNet-18, 0.5% label flips"]
    assert by_id["C3b"] == ["digits 8x8, LeNet, 1% OOD inserts"]  # the key names the data set
    assert by_id["C3d"] == ["digits 8x8, LeNet, clean data"]
    assert by_id["C2a"] == ["eval-mode gradients (running BN statistics)"]
    assert by_id["T1a"] == ["one channel + linear classifier (float64)"]
    # the notebook's parameters fill in what a key leaves out (04's keys before they named the
    # data set)
    rf = ResultsFile(results_path("quick", "04_lira", tmp_path),
                     meta={"parameters": {"lira_datasets": ["digits"]}})
    rf.record("lira_auc_diff_bn_none_lenet_ood1_all", 0.04, lo=0.03, hi=0.05)
    rows = report.claims_table(report.CLAIMS, "quick", tmp_path)
    assert next(r for r in rows if r["id"] == "C3b")["setting"] == "digits 8x8, LeNet, 1% OOD inserts"


def test_the_lira_controls_name_their_settings_and_judge_a_missing_match(tmp_path):
    cf = ResultsFile(results_path("quick", "04b_confound", tmp_path))
    for at in ("low", "mid"):
        cf.record(f"confound_auc_diff_bn_none_digits_lenet_ood1_{at}", None,
                  description="no matched gap: the gap ranges do not overlap")
    cf.record("confound_auc_diff_bn_ln_digits_lenet_ood1_mid", 0.01, lo=0.002, hi=0.02, n=16)
    cf.record("confound_auc_diff_bn_ln_digits_lenet_ood1_low", -0.01, lo=-0.02, hi=-0.002, n=16)
    rf = ResultsFile(results_path("quick", "04_lira", tmp_path))
    rf.record("lira_eval_minus_trainmode_auc_bn_digits_lenet_clean", 0.015, lo=0.01, hi=0.02, n=16)
    rf.record("lira_eval_minus_trainmode_auc_bn_digits_lenet_ood1", 0.02, lo=0.01, hi=0.03, n=16)
    rows = report.claims_table(report.CLAIMS, "quick", tmp_path)
    c3e = [r for r in rows if r["id"] == "C3e"]
    c3f = [r for r in rows if r["id"] == "C3f"]
    assert [r["setting"] for r in c3e] == ["digits 8x8, LeNet, 1% OOD inserts, low matched gap",
                                           "digits 8x8, LeNet, 1% OOD inserts, middle matched gap"]
    assert c3e[0]["verdict"] == "not reproduced" and "do not overlap" in c3e[0]["reason"]
    c3g = [r for r in rows if r["id"] == "C3g"]              # the middle gap only, per norm
    assert [(r["setting"], r["verdict"]) for r in c3g] == [
        ("BN minus LayerNorm, digits 8x8, LeNet, 1% OOD inserts, middle matched gap", "reproduced")]
    assert [r["setting"] for r in c3f] == ["digits 8x8, LeNet, clean data",
                                           "digits 8x8, LeNet, 1% OOD inserts"]
    assert all(r["verdict"] == "reproduced" for r in c3f)


def test_a_saturated_setting_says_so(tmp_path):
    cond = "digits_mlp_ood_2pct_gaussian"
    _results(tmp_path, "02_forced_memorization", {
        f"mem_diff_bn_none_{cond}_at10": {"value": 0.0, "lo": 0.0, "hi": 0.0},
        f"mem_{cond}_bn_mem_at10": {"value": 1.0, "lo": 1.0, "hi": 1.0},
        f"mem_{cond}_none_mem_at10": {"value": 1.0, "lo": 1.0, "hi": 1.0},
        f"mem_diff_bn_none_{cond}_final": {"value": 0.0, "lo": 0.0, "hi": 0.0},
        f"mem_{cond}_bn_final_mem": {"value": 1.0},
        f"mem_{cond}_none_final_mem": {"value": 0.97},  # not both at 100%: judged as usual
    })
    rows = {r["key"]: r for r in report.claims_table(report.CLAIMS, "quick", tmp_path)}
    at10 = rows[f"mem_diff_bn_none_{cond}_at10"]
    assert at10["ours"] == "saturated: both 100%" and at10["verdict"] == "inconclusive"
    assert "cannot show a difference" in at10["reason"]
    assert rows[f"mem_diff_bn_none_{cond}_final"]["ours"].startswith("0 [0, 0]")


def test_claims_tables_fit_a_laptop_screen(tmp_path):
    _results(tmp_path, "02_forced_memorization", {
        "mem_diff_bn_none_digits_lenet_flip_1pct_at10": {"value": 0.4, "lo": 0.1, "hi": 0.7},
        "mem_diff_bn_none_digits_mlp_flip_1pct_at10": {"value": 0.3, "lo": 0.1, "hi": 0.5}})
    rows = [r for r in report.claims_table(report.CLAIMS, "quick", tmp_path) if r["id"] == "C1a"]
    page = report.claims_html(rows)
    assert "<th" in page and ">setting</th>" in page and ">key</th>" not in page
    assert "table-layout:auto" in page and "overflow-wrap: anywhere" in page
    assert page.count("BN memorizes corrupted samples faster") == 1  # the claim once, then settings
    assert "digits 8x8, MLP, 1% label flips" in page
    md = report.claims_markdown(rows)
    assert "| setting |" in md and "`mem_diff" not in md


def test_html_report_claims_table_has_the_setting_column(tmp_path):
    run_dir = tmp_path / "runs" / "quick"
    run_dir.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), run_dir / "02_forced_memorization.ipynb")
    _results(tmp_path, "02_forced_memorization", {
        "mem_diff_bn_none_digits_lenet_flip_1pct_at10": {"value": 0.4, "lo": 0.1, "hi": 0.7}})
    page = publish.export_html("quick", report.CLAIMS, out_dir=tmp_path).read_text()
    assert ">setting</th>" in page and "digits 8x8, LeNet, 1% label flips" in page
    assert "table.bnmem-claims" in page  # the wrapping style


def test_a_notebook_judges_its_own_claims_by_the_same_rule(tmp_path):
    """What a notebook shows as its verdicts equals the claims table's rows for it."""
    claims = [Claim("A", "effect", "p", "02_nb", "d_*", "effect"),
              Claim("B", "bound", "p", "02_nb", "r", "at_least", bound=1.0),
              Claim("C", "other notebook", "p", "03_nb", "x", "effect")]
    recorded = {"d_flip": {"value": 0.2, "lo": 0.1, "hi": 0.3},
                "d_ood": {"value": 0.1, "lo": -0.1, "hi": 0.3}, "r": {"value": 0.8}}
    frame = report.notebook_claims("02_nb", recorded, claims=claims)
    assert list(frame.index) == ["A", "A", "B"]            # C belongs to another notebook
    assert list(frame.verdict) == ["reproduced", "inconclusive", "not reproduced"]
    f = ResultsFile(results_path("p", "02_nb", tmp_path))
    for k, v in recorded.items():
        f.record(k, v["value"], lo=v.get("lo"), hi=v.get("hi"))
    table = report.claims_table(claims[:2], "p", tmp_path)
    assert [r["verdict"] for r in table] == list(frame.verdict)


def test_key_numbers_show_matching_records_with_their_intervals(tmp_path):
    from bnmem_utils.results import ResultsFile, key_numbers

    rf = ResultsFile(tmp_path / "r.json")
    rf.record("mem_diff_a", 0.25, lo=0.1, hi=0.4, n=3, description="a difference")
    rf.record("mem_final_a", 0.9)
    rf.record("mem_diff_b", None, description="no pair")
    table = key_numbers(rf.values, "mem_diff_*")
    assert list(table.index) == ["mem_diff_a", "mem_diff_b"]
    assert table.loc["mem_diff_a", "value"] == "0.25 [0.1, 0.4]"
    assert table.loc["mem_diff_b", "value"] == "None"
    assert table.loc["mem_diff_a", "n"] == 3 and pd.isna(table.loc["mem_diff_b", "n"])
    assert len(key_numbers(rf.values)) == 3


# --- results keys, written out once ---------------------------------------------------------------
def test_result_key_fills_a_family_and_refuses_bad_parts():
    from bnmem_utils.results import result_key

    assert result_key("lira_auc_diff", norm="bn", arm="digits_lenet_ood1", subset="all") \
        == "lira_auc_diff_bn_none_digits_lenet_ood1_all"
    assert result_key("mem_t3", cond="*") == "mem_t3_frac_above1_*"
    with pytest.raises(ValueError, match="unknown results-key family 'lira'; valid choices: .*lira_auc"):
        result_key("lira", arm="x")
    with pytest.raises(ValueError, match=r"needs the parts norm, arm, subset; got arm"):
        result_key("lira_auc", arm="x")


def test_every_assembled_claim_key_comes_from_a_key_family():
    """A claim whose key is a pattern reads a family of results.KEYS (the one place the key's
    shape is written), and so do the two arms behind a difference."""
    import re
    import string

    from bnmem_utils.results import KEYS

    def shapes():
        for template in KEYS.values():
            parts = string.Formatter().parse(template)
            yield re.compile("".join(re.escape(lit) + (".+" if name else "")
                                     for lit, name, _, _ in parts) + "$")

    families = list(shapes())
    for claim in report.CLAIMS:
        if any(c in claim.key for c in "*?["):
            assert any(f.match(claim.key) for f in families), claim.id
        for arm in claim.arms or ():
            assert any(f.match(arm) for f in families), (claim.id, arm)
