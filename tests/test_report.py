"""The claims table's verdict rules, key patterns, missing results and the HTML export."""

from __future__ import annotations

import nbformat
import pandas as pd
import pytest

from bnmem_utils.analyses import report
from bnmem_utils.analyses.report import Claim, judge
from bnmem_utils.core.results import Result, ResultsFile, results_path
from bnmem_utils.core.stats import REPLICATE_T, Estimate
from bnmem_utils.run import publish


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
    assert judge(effect(sign=-1), reduction) == ("reproduced", "95% interval below zero")
    assert judge(effect(), reduction) == ("not reproduced",
                                          "95% interval below zero: the opposite effect")
    rise = {"value": 0.8, "lo": 0.7, "hi": 0.9}   # the reason names the side in the value's sign
    assert judge(effect(sign=-1), rise) == ("not reproduced",
                                            "95% interval above zero: the opposite effect")


def test_a_lopsided_bootstrap_interval_is_not_trusted():
    """A percentile-bootstrap interval far from symmetric around its estimate (the digits' M3:
    -5.38 [-7.43, 5.37] pt) leaves its row inconclusive, saying why; a t interval is symmetric by
    construction, and a bootstrap interval near symmetry is judged as usual."""
    boot = effect(method=f"{report.BOOTSTRAP} over each bank's targets")
    verdict, reason = judge(boot, {"value": 0.02, "lo": 0.015, "hi": 0.2})
    assert verdict == "inconclusive" and reason.startswith("interval not trusted")
    assert "36.0x nearer one end" in reason
    assert "at one end of" in judge(boot, {"value": 0.02, "lo": 0.02, "hi": 0.2})[1]
    assert judge(boot, {"value": 0.02, "lo": 0.01, "hi": 0.045})[0] == "reproduced"   # 2.5x
    assert judge(effect(method="Student t"), {"value": 0.02, "lo": 0.015, "hi": 0.2})[0] == \
        "reproduced"
    m3 = next(c for c in report.CLAIMS if c.id == "M3")
    assert judge(m3, {"value": -0.0538, "lo": -0.0743, "hi": 0.0537})[1].startswith(
        "interval not trusted: the estimate sits 5.2x nearer")


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
    for what, val in values.items():
        rf.record(what, val["value"], lo=val.get("lo"), hi=val.get("hi"), n=val.get("n", 5))


def _lira(setting="ood1", arch="lenet", dataset="digits", label="OOD 1%", **kw) -> Result:
    return Result("lira_auc_diff", norm="bn", versus="none", dataset=dataset, arch=arch,
                  setting=setting, subset="all", label=label, **kw)


def test_claims_table_selects_results_by_their_fields_and_lists_missing(tmp_path):
    _results(tmp_path, "04_lira", {
        _lira(): {"value": 0.01, "lo": -0.01, "hi": 0.03},
        _lira(arch="mlp"): {"value": 0.05, "lo": 0.04, "hi": 0.06},
        _lira(setting="ood5"): {"value": 0.05, "lo": 0.04, "hi": 0.06},      # another setting
        Result("lira_auc", norm="bn", dataset="digits", arch="lenet", setting="ood1",
               subset="all"): {"value": 0.55, "lo": 0.54, "hi": 0.56},          # another metric
    })
    claims = [
        Claim("C3", "t", "p", "04_lira", "lira_auc_diff", "effect", scale=100,
              where={"norm": "bn", "versus": "none", "setting": "ood1", "subset": "all"}),
        Claim("C9", "t", "p", "02_forced_memorization", "mem_x", "effect"),
    ]
    rows = report.claims_table(claims, "quick", tmp_path)
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) == {"lira_auc_diff_bn_none_digits_lenet_ood1_all",
                           "lira_auc_diff_bn_none_digits_mlp_ood1_all", "mem_x"}
    mlp = by_key["lira_auc_diff_bn_none_digits_mlp_ood1_all"]
    assert mlp["verdict"] == "reproduced" and mlp["ours"].startswith("5 [4, 6]")
    assert by_key["lira_auc_diff_bn_none_digits_lenet_ood1_all"]["verdict"] == "inconclusive"
    assert by_key["mem_x"]["verdict"] == "missing"
    assert report.verdict_counts(rows) == {**dict.fromkeys(report.VERDICTS, 0), "reproduced": 1,
                                           "inconclusive": 1, "missing": 1}


def test_a_results_key_is_derived_from_its_fields_and_bad_fields_are_refused():
    assert _lira().key == "lira_auc_diff_bn_none_digits_lenet_ood1_all"
    assert Result("theory_loglog_slope").key == "theory_loglog_slope"
    assert _lira().fields()["versus"] == "none" and "label" not in _lira().fields()
    with pytest.raises(ValueError, match="norm='Batch Norm' must be a lower-case key fragment"):
        Result("lira_auc", norm="Batch Norm")
    with pytest.raises(ValueError, match="needs its metric"):
        Result("")


def test_a_result_of_a_run_description_names_its_setting():
    from bnmem_utils.jobs.config import RunConfig

    config = RunConfig.bank(dataset="digits", arch="lenet", norm="bn", ood_rate=0.01)
    result = Result.of(config, "lira_auc", subset="all")
    assert result.key == "lira_auc_bn_digits_lenet_ood1_all"
    assert result.label == config.corruption.label() == "OOD 1%"
    assert Result.of(config, "lira_gap", norm="").key == "lira_gap_digits_lenet_ood1"


def test_a_results_file_written_before_fields_says_how_to_regenerate_it(tmp_path):
    path = results_path("quick", "04_lira", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"meta": {}, "results": {"lira_auc_diff_bn_none_digits_lenet_ood1_all": '
                    '{"value": 0.04, "lo": 0.03, "hi": 0.05}}}')
    row = next(r for r in report.claims_table(report.CLAIMS, "quick", tmp_path) if r["id"] == "C3b")
    assert row["verdict"] == "missing" and "rerun the notebook" in row["reason"]


def test_every_claim_names_a_known_notebook_and_rule():
    from bnmem_utils.run.plan import discover_notebooks

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
    from bnmem_utils.run.cli import main

    assert main(["report", "--profile", "quick", "--out", str(tmp_path)]) == 2
    assert f"`bnmem reproduce --profile quick --out {tmp_path}`" in capsys.readouterr().err


def test_report_of_a_profile_file_never_run_suggests_running_that_file_with_its_out(tmp_path,
                                                                                      capsys):
    from bnmem_utils.run.cli import main

    path = tmp_path / "mine.yml"
    path.write_text("mem_epochs: 2\n")
    out = tmp_path / "o"
    out.mkdir()
    for argv in (["--profile", str(path)], ["--compare", f"{path},quick"]):
        assert main(["report", *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"run `bnmem reproduce --profile {path} --out {out}` first" in err, err


def test_report_out_that_is_a_file_says_so(tmp_path, capsys):
    from bnmem_utils.run.cli import main

    path = tmp_path / "passwd"
    path.write_text("x\n")
    for argv in ([], ["--profile", "nosuch"]):
        assert main(["report", *argv, "--out", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"bnmem report: error: --out {path} is not a folder; give the folder that "
                       "`bnmem reproduce --out DIR` wrote to (or leave --out out)"), err


def _mem(arch="lenet", setting="flip_1pct", label="flip 1%", metric="mem_diff", **kw) -> Result:
    fields = {"norm": "bn", "versus": "none", "when": "at10"} if metric == "mem_diff" else {}
    return Result(metric, dataset="digits", arch=arch, setting=setting, label=label,
                  **{**fields, **kw})


def test_rows_name_their_setting_in_words(tmp_path):
    _results(tmp_path, "02_forced_memorization", {
        _mem(): {"value": 0.4, "lo": 0.1, "hi": 0.7},
        _mem("mlp", "ood_2pct_gaussian", "OOD 2% (gaussian)"): {"value": 0.3, "lo": 0.1, "hi": 0.5},
        Result("mem_t3_frac_above1", dataset="fashion_mnist", arch="resnet18",
               setting="flip_0p5pct", label="flip 0.5%"): {"value": 0.7, "lo": 0.6, "hi": 0.8},
    })
    _results(tmp_path, "04_lira", {
        _lira(): {"value": 0.04, "lo": 0.03, "hi": 0.05},
        _lira(setting="clean", label="clean"): {"value": 0.01, "lo": 0.0, "hi": 0.02}})
    _results(tmp_path, "03_gradient_norms", {
        Result("gn_ratio", norm="bn", dataset="fashion_mnist", arch="lenet", setting="flip10",
               label="flip 10%", mode="eval", when="final"): {"value": 2.0, "lo": 1.5, "hi": 3}})
    by_id = {}
    for r in report.claims_table(report.CLAIMS, "quick", tmp_path):
        by_id.setdefault(r["id"], []).append(r["setting"])
    assert by_id["C1a"] == ["digits 8x8, LeNet, flip 1%", "digits 8x8, MLP, OOD 2% (gaussian)"]
    assert by_id["T3"] == ["Fashion-MNIST, ResNet-18, flip 0.5%"]
    assert by_id["C3b"] == ["digits 8x8, LeNet, OOD 1%"]
    assert by_id["C3d"] == ["digits 8x8, LeNet, clean"]
    assert by_id["C2a"] == ["Fashion-MNIST, LeNet, flip 10%, eval-mode gradients (running BN "
                            "statistics)"]
    assert by_id["T1a"] == ["one channel + linear classifier (float64)"]


def test_the_lira_controls_name_their_settings_and_judge_a_missing_match(tmp_path):
    def confound(versus, at):
        return Result("confound_auc_diff", norm="bn", versus=versus, dataset="digits",
                      arch="lenet", setting="ood1", label="OOD 1%", when=at, ruler="lossgap")

    def trainmode(setting, label):
        return Result("lira_eval_minus_trainmode_auc", norm="bn", dataset="digits", arch="lenet",
                      setting=setting, label=label)

    cf = ResultsFile(results_path("quick", "04b_confound", tmp_path))
    for at in ("low", "mid"):
        cf.record(confound("none", at), None, description="no matched gap: the gap ranges do "
                                                          "not overlap")
    cf.record(confound("ln", "mid"), 0.01, lo=0.002, hi=0.02, n=16)
    cf.record(confound("ln", "low"), -0.01, lo=-0.02, hi=-0.002, n=16)
    rf = ResultsFile(results_path("quick", "04_lira", tmp_path))
    rf.record(trainmode("clean", "clean"), 0.015, lo=0.01, hi=0.02, n=16)
    rf.record(trainmode("ood1", "OOD 1%"), 0.02, lo=0.01, hi=0.03, n=16)
    rows = report.claims_table(report.CLAIMS, "quick", tmp_path)
    c3e = [r for r in rows if r["id"] == "C3e"]
    c3f = [r for r in rows if r["id"] == "C3f"]
    assert [r["setting"] for r in c3e] == [
        f"digits 8x8, LeNet, OOD 1%, {at} matched gap, matched on the loss gap"
        for at in ("low", "middle")]
    assert c3e[0]["verdict"] == "contradicted" and "do not overlap" in c3e[0]["reason"]
    c3g = [r for r in rows if r["id"] == "C3g"]              # the middle gap only, per norm
    assert [(r["setting"], r["verdict"]) for r in c3g] == [
        ("BN minus LayerNorm, digits 8x8, LeNet, OOD 1%, middle matched gap, matched on the loss "
         "gap", "supported")]
    assert [r["setting"] for r in c3f] == ["digits 8x8, LeNet, clean", "digits 8x8, LeNet, OOD 1%"]
    assert all(r["verdict"] == "supported" for r in c3f)        # the project's own question


def test_a_saturated_setting_says_so(tmp_path):
    arm = {"arch": "mlp", "setting": "ood_2pct_gaussian", "label": "OOD 2% (gaussian)"}
    _results(tmp_path, "02_forced_memorization", {
        _mem(**arm): {"value": 0.0, "lo": 0.0, "hi": 0.0},
        _mem(**arm, metric="mem_at10", norm="bn"): {"value": 1.0, "lo": 1.0, "hi": 1.0},
        _mem(**arm, metric="mem_at10", norm="none"): {"value": 1.0, "lo": 1.0, "hi": 1.0},
        _mem(**arm, when="final"): {"value": 0.0, "lo": 0.0, "hi": 0.0},
        _mem(**arm, metric="mem_final", norm="bn"): {"value": 1.0},
        _mem(**arm, metric="mem_final", norm="none"): {"value": 0.97},  # not both at 100%
    })
    rows = {r["key"]: r for r in report.claims_table(report.CLAIMS, "quick", tmp_path)}
    at10 = rows[_mem(**arm).key]
    assert at10["ours"] == "saturated: both 100%" and at10["verdict"] == "inconclusive"
    assert "cannot show a difference" in at10["reason"]
    assert rows[_mem(**arm, when="final").key]["ours"].startswith("0 [0, 0]")


def test_claims_tables_fit_a_laptop_screen(tmp_path):
    _results(tmp_path, "02_forced_memorization", {
        _mem(): {"value": 0.4, "lo": 0.1, "hi": 0.7},
        _mem("mlp"): {"value": 0.3, "lo": 0.1, "hi": 0.5}})
    rows = [r for r in report.claims_table(report.CLAIMS, "quick", tmp_path) if r["id"] == "C1a"]
    page = report.claims_html(rows)
    assert "<th" in page and ">setting</th>" in page and ">key</th>" not in page
    assert "table-layout:auto" in page and "overflow-wrap: anywhere" in page
    assert page.count("BN memorizes corrupted samples faster") == 1  # the claim once, then settings
    assert "digits 8x8, MLP, flip 1%" in page


def test_html_report_claims_table_has_the_setting_column(tmp_path):
    run_dir = tmp_path / "runs" / "quick"
    run_dir.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), run_dir / "02_forced_memorization.ipynb")
    _results(tmp_path, "02_forced_memorization", {_mem(): {"value": 0.4, "lo": 0.1, "hi": 0.7}})
    page = publish.export_html("quick", report.CLAIMS, out_dir=tmp_path).read_text()
    assert ">setting</th>" in page and "digits 8x8, LeNet, flip 1%" in page
    assert "table.bnmem-claims" in page  # the wrapping style


def test_a_notebook_judges_its_own_claims_by_the_same_rule(tmp_path):
    """What a notebook shows as its verdicts equals the claims table's rows for it."""
    claims = [Claim("A", "effect", "p", "02_nb", "d", "effect"),
              Claim("B", "bound", "p", "02_nb", "r", "at_least", bound=1.0),
              Claim("C", "other notebook", "p", "03_nb", "x", "effect")]
    recorded = {Result("d", setting="flip"): {"value": 0.2, "lo": 0.1, "hi": 0.3},
                Result("d", setting="ood"): {"value": 0.1, "lo": -0.1, "hi": 0.3},
                Result("r"): {"value": 0.8}}
    f = ResultsFile(results_path("p", "02_nb", tmp_path))
    for what, v in recorded.items():
        f.record(what, v["value"], lo=v.get("lo"), hi=v.get("hi"))
    frame = report.ClaimsView(report.notebook_rows("02_nb", f.values, claims=claims)).frame
    assert list(frame.index) == ["A", "A", "B"]            # C belongs to another notebook
    assert list(frame.verdict) == ["reproduced", "inconclusive", "not reproduced"]
    table = report.claims_table(claims[:2], "p", tmp_path)
    assert [r["verdict"] for r in table] == list(frame.verdict)


def test_key_numbers_show_matching_records_with_their_intervals(tmp_path):
    from bnmem_utils.core.results import ResultsFile, key_numbers

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


# --- results with fields ------------------------------------------------------------------------
def test_every_claim_reads_fields_results_have():
    """Each claim selects by fields of :data:`bnmem_utils.core.results.FIELDS` only, and its pattern
    (for messages) starts with its metric."""
    from bnmem_utils.core.results import FIELDS

    for claim in report.CLAIMS:
        assert set(claim.where) <= set(FIELDS[1:]), claim.id
        assert claim.pattern.startswith(claim.metric), claim.id


def test_primary_rows_are_holm_adjusted_and_alone_counted(tmp_path):
    """Three primary rows, each significant alone (p about 0.03, 0.03 and 0.002), and a
    secondary one: Holm keeps the strong one, turns the borderline ones inconclusive saying why,
    leaves the secondary row's unadjusted verdict, and counts primary rows only."""
    _results(tmp_path, "04_lira", {
        _lira(): {"value": 0.02, "lo": 0.002, "hi": 0.038, "n": 30},
        _lira(dataset="mnist"): {"value": 0.02, "lo": 0.002, "hi": 0.038, "n": 30},
        _lira(arch="mlp"): {"value": 0.05, "lo": 0.02, "hi": 0.08, "n": 30},
        _lira(setting="ood5"): {"value": 0.02, "lo": 0.002, "hi": 0.038, "n": 30},
    })
    where = {"norm": "bn", "versus": "none", "subset": "all"}
    claims = [Claim("A", "t", "p", "04_lira", "lira_auc_diff", "effect", method="Welch t",
                    where={**where, "setting": "ood1"}),
              Claim("B", "t", "p", "04_lira", "lira_auc_diff", "effect", method="Welch t",
                    where={**where, "setting": "ood5"}, primary=None)]
    rows = {r["key"]: r for r in report.claims_table(claims, "quick", tmp_path)}
    lenet, mlp = (rows[f"lira_auc_diff_bn_none_digits_{a}_ood1_all"] for a in ("lenet", "mlp"))
    secondary = rows["lira_auc_diff_bn_none_digits_lenet_ood5_all"]
    assert lenet["primary"] and mlp["primary"] and not secondary["primary"]
    assert 0.03 < lenet["p"] < 0.05 and lenet["p_holm"] == pytest.approx(2 * lenet["p"])
    assert lenet["verdict"] == "inconclusive" and "Holm" in lenet["reason"]
    assert mlp["verdict"] == "reproduced" and mlp["p_holm"] < 0.05
    assert secondary["verdict"] == "reproduced" and "p_holm" not in secondary
    assert report.verdict_counts(list(rows.values()))["reproduced"] == 1
    assert lenet["method"] == "Welch t"


def test_an_interval_past_the_metrics_range_is_clipped_and_says_so(tmp_path):
    rf = ResultsFile(results_path("quick", "02_forced_memorization", tmp_path))
    rf.record(_mem(when="final"),
              Estimate(0.619, -0.12, 1.36, 3, method="paired t"))
    rows = [r for r in report.claims_table(report.CLAIMS, "quick", tmp_path) if r["id"] == "C1b"]
    (row,) = rows
    assert (row["lo"], row["hi"]) == (-0.12, 1.0) and "clipped" in row["ours"]
    assert row["method"] == "paired t" and row["primary"]


def test_a_replicate_interval_reads_its_p_value_with_r_minus_1_degrees_of_freedom(tmp_path):
    """A number on three replicate banks (a Student t over them, ``n`` = 3): its p-value is the
    t test with two degrees of freedom that its interval inverts, not a normal one."""
    from scipy import stats as st

    rf = ResultsFile(results_path("quick", "04_lira", tmp_path))
    rf.record(_lira(), Estimate(0.05, 0.01, 0.09, 3, method=REPLICATE_T), replicates=3)
    claim = Claim("A", "t", "p", "04_lira", "lira_auc_diff", "effect", bank=True,
                  method="Welch t", where={"norm": "bn", "versus": "none", "subset": "all"})
    (row,) = report.claims_table([claim], "quick", tmp_path)
    assert row["method"] == REPLICATE_T and row["replicates"] == 3
    t2 = st.t(2)
    assert row["p"] == pytest.approx(2 * t2.sf(0.05 / 0.04 * t2.ppf(0.975)))          # 0.033
    assert row["p"] > 0.03                                # a normal reading would say 0.014


def test_calibration_table_lists_each_replicated_number_once(tmp_path):
    """Notebook 06's calibration table: one row per results key measured on replicate banks,
    every claim that reads it named, half-widths in points, and the docs' Markdown of its CSV."""
    from bnmem_utils.analyses.calibration import calibration_table
    from bnmem_utils.run import docs

    results = ResultsFile(results_path("mine", "04_lira", tmp_path))
    fields = dict(norm="bn", versus="none", dataset="digits", arch="lenet", subset="all")
    cal = {"replicates": 3, "one_bank_halfwidth": 0.01, "replicate_halfwidth": 0.012,
           "one_bank_needed_halfwidth": 0.012 * 3 ** 0.5, "covers_others": 1 / 3}
    results.record(Result("lira_auc_diff", setting="ood1", label="OOD 1%", **fields),
                   Estimate(0.05, 0.038, 0.062, 3), replicates=3, calibration=cal)
    results.record(Result("lira_auc_diff", setting="clean", label="clean", **fields),
                   Estimate(0.01, -0.01, 0.03, 16), replicates=1)        # one bank: no row
    table = calibration_table(report.CLAIMS, "mine", tmp_path)
    assert len(table) == 1
    row = table.iloc[0]
    assert row.claims == "C3a, C3b" and row.replicates == 3 and row.unit == "pt"
    assert row["one-bank half-width"] == pytest.approx(1.0)
    assert row.ratio == pytest.approx(1.2 * 3 ** 0.5)
    assert row["one bank covers the others' mean"] == "1 of 3"
    assert calibration_table(report.CLAIMS, "other", tmp_path).empty
    (tmp_path / "figures" / "mine").mkdir(parents=True)
    table.to_csv(tmp_path / "figures" / "mine" / "06_calibration.csv", index=False)
    text = docs.calibration_table("mine", tmp_path)
    assert "| C3a, C3b | digits 8x8, LeNet, OOD 1% | 3 | 1 pt | 1.2 pt | 2.08 pt | 2.08x | 1 of 3 |" in text
    assert "was measured on replicate banks" in docs.calibration_table("other", tmp_path)


def test_the_per_sample_attack_beside_the_headline_is_a_secondary_row(tmp_path):
    """Notebook 04 records the headline LiRA's numbers and, where the rule picks the pooled
    variance, the per-sample attack's beside them (``attack`` field): the claims read both, the
    per-sample row secondary (not counted), named as such, its key ending in the attack."""
    _results(tmp_path, "04_lira", {
        _lira(): {"value": 0.04, "lo": 0.035, "hi": 0.045},
        _lira(attack="lira_online"): {"value": 0.01, "lo": -0.01, "hi": 0.03},
        _lira(setting="clean", label="clean"): {"value": 0.01, "lo": 0.005, "hi": 0.015},
        _lira(setting="clean", label="clean", attack="lira_online"): {"value": 0.0, "lo": -0.01,
                                                                       "hi": 0.01}})
    rows = [r for r in report.claims_table(report.CLAIMS, "quick", tmp_path)
            if r["id"] in ("C3a", "C3b", "C3d")]
    by = {(r["id"], r["key"]): r for r in rows}
    head = by["C3a", "lira_auc_diff_bn_none_digits_lenet_ood1_all"]
    side = by["C3a", "lira_auc_diff_bn_none_digits_lenet_ood1_all_lira_online"]
    assert head["primary"] and not side["primary"]
    assert side["setting"].endswith("secondary: LiRA with per-sample variances (lira_online)")
    assert by["C3b", "lira_auc_diff_bn_none_digits_lenet_ood1_all"]["primary"]
    assert not by["C3b", "lira_auc_diff_bn_none_digits_lenet_ood1_all_lira_online"]["primary"]
    assert by["C3d", "lira_auc_diff_bn_none_digits_lenet_clean_all"]["primary"]
    assert not by["C3d", "lira_auc_diff_bn_none_digits_lenet_clean_all_lira_online"]["primary"]
    assert sum(r["primary"] for r in rows) == 3                     # one per claim, as before


def test_a_deeper_networks_rows_are_secondary_and_the_lenets_primary():
    """Each claim's primary setting is the LeNet's, declared before the deeper networks ran:
    ResNet-20's and DenseNet's rows of the memorization, gradient-norm and LiRA claims are
    secondary (shown, judged, not counted in Holm's family)."""
    from bnmem_utils.analyses.report import CLAIMS

    fields = {"C1b": {"setting": "flip_1pct"}, "T3": {"setting": "flip_1pct"},
              "C2a": {"mode": "eval"}, "C2b": {"mode": "eval"}, "C3a": {"setting": "ood1"},
              "C3b": {"setting": "ood1"}, "C3d": {"setting": "clean"},
              "C3f": {"setting": "clean"}}
    by_id = {c.id: c for c in CLAIMS}
    for cid, f in fields.items():
        claim = by_id[cid]
        lenet = {"fields": {**f, "arch": "lenet", "attack": ""}}
        assert claim.is_primary(lenet), cid
        for arch in ("resnet20", "densenet"):
            assert not claim.is_primary({"fields": {**f, "arch": arch, "attack": ""}}), (cid, arch)
