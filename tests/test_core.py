"""The lead's core modules: paths, device, stats, plotting, results, params and the notebook context.

All plain Python on tiny inputs; the whole file runs in a few seconds.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from scipy import stats as st  # noqa: E402

from bnmem_utils.core import (
    device,  # noqa: E402
    paths,
    results,
    stats,
)
from bnmem_utils.core.stats import Estimate  # noqa: E402
from bnmem_utils.figures import plotting
from bnmem_utils.run import notebook, params

# --------------------------------------------------------------------------------------------
# paths
# --------------------------------------------------------------------------------------------


def test_project_root_is_the_checkout_or_env(monkeypatch, tmp_path):
    monkeypatch.delenv("BNMEM_ROOT", raising=False)
    root = paths.project_root()
    assert (root / "bnmem_utils" / "core" / "paths.py").is_file()
    monkeypatch.setenv("BNMEM_ROOT", str(tmp_path))
    assert paths.project_root() == tmp_path.resolve()
    assert paths.notebooks_dir() == tmp_path.resolve() / "notebooks"


def test_output_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("BNMEM_ROOT", str(tmp_path / "root"))
    monkeypatch.delenv("BNMEM_CACHE", raising=False)
    monkeypatch.delenv("BNMEM_DATA", raising=False)
    root = (tmp_path / "root").resolve()
    assert paths.runs_dir("quick") == root / "runs" / "quick"
    assert paths.figures_dir("smoke") == root / "runs" / "smoke" / "figures"
    assert paths.runs_dir("quick", tmp_path / "o") == (tmp_path / "o").resolve() / "runs" / "quick"
    assert paths.figures_dir("paper", str(tmp_path / "o")) == (tmp_path / "o").resolve() / "runs" / "paper" / "figures"
    assert paths.cache_dir() == root / "runs" / "cache"
    assert paths.cache_dir(tmp_path / "o") == (tmp_path / "o").resolve() / "runs" / "cache"
    monkeypatch.setenv("BNMEM_CACHE", str(tmp_path / "c"))
    assert paths.cache_dir(tmp_path / "o") == (tmp_path / "c").resolve()
    assert paths.data_root() == root / "data"
    monkeypatch.setenv("BNMEM_DATA", str(tmp_path / "d"))
    assert paths.data_root() == (tmp_path / "d").resolve()
    assert paths.data_root(tmp_path / "e") == (tmp_path / "e").resolve()


# --------------------------------------------------------------------------------------------
# device
# --------------------------------------------------------------------------------------------


def test_resolve_device():
    auto = device.resolve_device("auto")
    expected = "cuda" if torch.cuda.is_available() else (
        "mps" if torch.backends.mps.is_available() else "cpu")
    assert auto.type == expected
    assert device.resolve_device("cpu") == torch.device("cpu")
    assert device.resolve_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; valid choices: auto, cpu, cuda, mps"):
        device.resolve_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_resolve_device_cuda_missing():
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        device.resolve_device("cuda")


def test_seed_everything_is_reproducible():
    def draw():
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    device.seed_everything(123)
    a = draw()
    device.seed_everything(123)
    assert draw() == a
    device.seed_everything(124)
    assert draw() != a
    g = device.seed_everything(5)
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=torch.Generator().manual_seed(5)))


def test_environment_report(capsys):
    report = device.environment_report("cpu")
    for key in ("python", "torch", "torchvision", "numpy", "device", "code_commit", "head",
                "cpu_count"):
        assert key in report
    assert report["device"] == "cpu"
    assert report["torch"] == torch.__version__ or torch.__version__.startswith(report["torch"])
    assert report["code_commit"] == "unknown" or len(report["code_commit"].split("+")[0]) >= 7
    assert report["head"] == "unknown" or len(report["head"]) >= 7
    device.print_environment("cpu")
    assert "torch" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# stats
# --------------------------------------------------------------------------------------------


def test_mean_ci_matches_the_t_interval():
    e = stats.mean_ci([1.0, 2.0, 3.0, np.nan])
    half = st.t.ppf(0.975, 2) * 1.0 / np.sqrt(3)
    assert (e.mean, e.n, e.std) == (2.0, 3, 1.0)
    assert e.lo == pytest.approx(2 - half) and e.hi == pytest.approx(2 + half)
    one = stats.mean_ci([4.0])
    assert one.mean == 4.0 and one.n == 1 and np.isnan(one.lo) and np.isnan(one.hi)
    assert stats.mean_ci([]).n == 0


def test_mean_ci_coverage_is_nominal():
    """Over 2000 samples of size 5 from N(0, 1) the 95% interval covers 0 about 95% of the time."""
    rng = np.random.default_rng(0)
    covered = [(e.lo <= 0 <= e.hi) for e in map(stats.mean_ci, rng.normal(size=(2000, 5)))]
    assert abs(np.mean(covered) - 0.95) < 0.015  # binomial sd is 0.005


def test_diff_ci_welch_and_paired_match_scipy():
    rng = np.random.default_rng(1)
    a, b = rng.normal(1.0, 1.0, 8), rng.normal(0.0, 2.0, 11)
    e = stats.diff_ci(a, b)
    ci = st.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert e.mean == pytest.approx(a.mean() - b.mean())
    assert (e.lo, e.hi) == pytest.approx((ci.low, ci.high))
    c = a + rng.normal(0.3, 0.1, 8)
    p = stats.diff_ci(c, a, paired=True)
    ci = st.ttest_rel(c, a).confidence_interval(0.95)
    assert (p.lo, p.hi) == pytest.approx((ci.low, ci.high))
    with pytest.raises(ValueError, match="equal lengths"):
        stats.diff_ci(a, b, paired=True)
    same = stats.diff_ci([1.0, 1.0], [0.0, 0.0])
    assert (same.mean, same.lo, same.hi) == (1.0, 1.0, 1.0)


def test_bootstrap_ci():
    rng = np.random.default_rng(2)
    x = rng.exponential(size=200)
    e = stats.bootstrap_ci(x, np.median, seed=3)
    assert e.lo < np.median(x) < e.hi and e.mean == pytest.approx(np.median(x))
    assert e.lo < np.log(2) < e.hi  # the true median of Exp(1)
    assert stats.bootstrap_ci(x, np.median, seed=3) == e  # seeded
    assert stats.bootstrap_ci([]).n == 0


def test_estimate_formatting():
    e = Estimate(0.5, 0.4, 0.6, 5, 0.1)
    assert e.fmt(1, scale=100) == "50.0 [40.0, 60.0]"
    assert str(e) == "0.5 [0.4, 0.6] (n=5)"


# --------------------------------------------------------------------------------------------
# plotting
# --------------------------------------------------------------------------------------------


def test_norm_colours_are_fixed_and_distinct():
    colours = [plotting.norm_color(n) for n in plotting.NORM_ORDER]
    assert len(set(colours)) == 4
    from bnmem_utils.models.nets import NORM_LABELS

    assert set(NORM_LABELS) == set(plotting.NORM_ORDER)
    with pytest.raises(ValueError, match="unknown norm 'batch'; valid choices: bn, none, gn, ln"):
        plotting.norm_color("batch")


def test_save_figure_writes_pdf_png_csv_and_manifest(tmp_path):
    plotting.set_style()
    assert matplotlib.rcParams["pdf.fonttype"] == 42
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1, 3, 2], color=plotting.norm_color("bn"))
    ax.set_title("embedded fonts")
    entry = plotting.save_figure(fig, "01_curve", {"x": [0, 1, 2], "y": [1, 3, 2]}, folder=tmp_path,
                                 notebook="01_theory", profile="smoke",
                                 parameters={"seed": 0, "out_dir": "/x"}, commit="abc1234")
    plt.close(fig)
    assert entry["files"] == ["01_curve.pdf", "01_curve.png", "01_curve.csv"]
    pdf = (tmp_path / "01_curve.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"/FontFile2" in pdf  # TrueType fonts embedded
    assert (tmp_path / "01_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    frame = pd.read_csv(tmp_path / "01_curve.csv")
    assert frame.to_dict("list") == {"x": [0, 1, 2], "y": [1, 3, 2]}
    fig2, _ = plt.subplots()
    plotting.save_figure(fig2, "01_other", None, folder=tmp_path, notebook="01_theory", profile="smoke")
    plt.close(fig2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert list(manifest) == ["01_curve", "01_other"]
    assert manifest["01_curve"]["commit"] == "abc1234" and manifest["01_curve"]["profile"] == "smoke"
    assert manifest["01_other"]["files"] == ["01_other.pdf", "01_other.png"]
    md = (tmp_path / "manifest.md").read_text()
    assert "[01_curve](01_curve.png) | 01_theory | smoke | abc1234 |  | seed=0 |" in md
    assert not list(tmp_path.glob(".*"))  # no temp files


def test_the_markdown_manifest_names_the_data_and_keeps_a_bar_in_its_cell():
    from bnmem_utils.core.outputs import manifest_markdown

    md = manifest_markdown({"05_gamma_sigma": {
        "notebook": "05_mitigation", "profile": "fmnist", "commit": "abc1234",
        "data": {"fashion_mnist": "8d4af5", "digits": "21cc28"}, "parameters": {"seed": 0},
        "description": "The distribution of $|\\gamma|/\\sigma$ over every channel."}})
    row = md.splitlines()[-1]
    assert "| abc1234 | digits 21cc28, fashion_mnist 8d4af5 | seed=0 |" in row
    assert "$\\|\\gamma\\|/\\sigma$" in row
    # seven cells: every bar that is not escaped separates two of them
    assert len([i for i, c in enumerate(row) if c == "|" and row[i - 1:i] != "\\"]) == 8


def test_save_figure_without_a_figure_writes_the_table_alone(tmp_path):
    entry = plotting.save_figure(None, "06_claims_forest", {"id": ["T1a"], "value": [0.5]},
                                 folder=tmp_path, notebook="06_report", description="the table")
    assert entry["files"] == ["06_claims_forest.csv"] and entry["title"] == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["06_claims_forest.csv", "manifest.json",
                                                          "manifest.md"]
    assert "[06_claims_forest](06_claims_forest.csv) | 06_report |" in \
        (tmp_path / "manifest.md").read_text()


def test_save_figure_over_a_broken_manifest_and_bad_names(tmp_path):
    fig, _ = plt.subplots()
    (tmp_path / "manifest.json").write_text("{broken")
    plotting.save_figure(fig, "after", None, folder=tmp_path)
    assert list(json.loads((tmp_path / "manifest.json").read_text())) == ["after"]
    for bad in ("", "a/b", "a b"):
        with pytest.raises(ValueError, match="must be non-empty"):
            plotting.save_figure(fig, bad, folder=tmp_path)
    plt.close(fig)


def test_plot_mean_ci_band_is_the_t_interval():
    runs = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])  # 3 seeds, 2 steps
    fig, ax = plt.subplots()
    out = plotting.plot_mean_ci([0, 1], runs, ax=ax, label="bn", color=plotting.norm_color("bn"))
    assert out is ax
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [2.0, 3.0])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    half = st.t.ppf(0.975, 2) * 2.0 / np.sqrt(3)
    assert band.min() == pytest.approx(2.0 - half) and band.max() == pytest.approx(3.0 + half)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


def test_results_file_records_and_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("BNMEM_ROOT", str(tmp_path))
    path = results.results_path("smoke", "01_theory")
    assert path == tmp_path.resolve() / "runs" / "smoke" / "results" / "01_theory.json"
    rf = results.ResultsFile(path, meta={"notebook": "01_theory"})
    rf.record("ratio", Estimate(2.0, 1.5, 2.5, 4, 0.3), description="gamma/sigma", unit="x")
    rf.record("bad", float("nan"))
    rf.record("array", np.array([1.0, np.inf]))
    rf.record("tensor", torch.tensor([[1, 2], [3, 4]]))
    rf.record("scalar", np.float32(0.25), lo=np.float64(0.125), hi=0.5)
    loaded = results.load_results("smoke")["01_theory"]
    assert loaded["meta"]["notebook"] == "01_theory" and "started" in loaded["meta"]
    r = loaded["results"]
    assert r["ratio"] == {"value": 2.0, "lo": 1.5, "hi": 2.5, "n": 4, "description": "gamma/sigma",
                          "unit": "x", "fields": {"metric": "ratio"}}
    assert r["bad"] == {"value": None, "fields": {"metric": "bad"}}
    assert r["array"]["value"] == [1.0, None]
    assert r["tensor"]["value"] == [[1, 2], [3, 4]]
    assert r["scalar"] == {"value": 0.25, "lo": 0.125, "hi": 0.5, "fields": {"metric": "scalar"}}
    with pytest.raises(ValueError, match="needs its metric"):
        rf.record("", 1)
    rf.record(results.Result("auc", norm="bn", setting="ood1", label="OOD 1%"), 0.6)
    assert rf.values["auc_bn_ood1"] == {"value": 0.6, "label": "OOD 1%", "fields": {
        "metric": "auc", "norm": "bn", "setting": "ood1"}}
    assert results.format_result(r["ratio"]) == "2 [1.5, 2.5]"
    assert results.format_result({"value": 0.123456}) == "0.123"
    assert results.format_result({"value": "yes"}) == "yes"


def test_load_results_reports_a_damaged_file(monkeypatch, tmp_path):
    monkeypatch.setenv("BNMEM_ROOT", str(tmp_path))
    assert results.load_results("quick") == {}
    bad = results.results_path("quick", "02_x")
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="02_x.json is not valid JSON"):
        results.load_results("quick")


# --------------------------------------------------------------------------------------------
# params
# --------------------------------------------------------------------------------------------


def _notebook(path: Path, source: str, tag: bool = True) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    if tag:
        cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), cell, nbformat.v4.new_code_cell("x = 1")]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def test_notebook_parameters_and_comments(tmp_path):
    src = ('"""Parameters."""\n'
           'profile = "quick"  # profile name\n'
           'lr: float = 0.1  # learning rate (per step)\n'
           'sep = "a#b"  # a string holding # and =\n'
           'grid = [1,\n        2]  # a list over two lines\n'
           'opts = {"a": None}\n'
           '# a lone comment\n')
    path = _notebook(tmp_path / "01_x.ipynb", src)
    assert params.notebook_parameters(path) == {"profile": "quick", "lr": 0.1, "sep": "a#b",
                                                "grid": [1, 2], "opts": {"a": None}}
    assert params.parameter_comments(path) == {"profile": "profile name",
                                               "lr": "learning rate (per step)",
                                               "sep": "a string holding # and =",
                                               "grid": "a list over two lines"}


@pytest.mark.parametrize("src, match", [
    ("n = 2 * 3\n", "not a literal"),
    ("import os\n", "only literal assignments"),
    ("a = b = 1\n", "only literal assignments"),
])
def test_parameters_cell_must_be_literal(tmp_path, src, match):
    with pytest.raises(ValueError, match=match):
        params.notebook_parameters(_notebook(tmp_path / "01_x.ipynb", src))


def test_parameters_cell_is_required(tmp_path):
    with pytest.raises(ValueError, match="no code cell is tagged 'parameters'"):
        params.notebook_parameters(_notebook(tmp_path / "01_x.ipynb", "n = 1\n", tag=False))


# --------------------------------------------------------------------------------------------
# notebook context
# --------------------------------------------------------------------------------------------


def test_notebook_context(monkeypatch, tmp_path, capsys):
    root = tmp_path / "proj"
    _notebook(root / "notebooks" / "07_demo.ipynb",
              'profile = "quick"  # p\ndevice = "auto"  # d\nout_dir = ""  # o\nseed = 0  # s\n'
              'demo_n = 3  # n\n')
    monkeypatch.setenv("BNMEM_ROOT", str(root))
    monkeypatch.delenv("BNMEM_CACHE", raising=False)
    with pytest.raises(ValueError, match="unknown notebook '07_dem'; valid choices: 07_demo"):
        notebook.start("07_dem", {})
    out = tmp_path / "out"
    nb = notebook.start("07_demo", {"profile": "smoke", "device": "cpu", "out_dir": str(out),
                                    "seed": 4, "demo_n": 5, "unrelated": 1})
    assert "notebook  07_demo" in capsys.readouterr().out
    assert nb.params == {"profile": "smoke", "device": "cpu", "out_dir": str(out), "seed": 4, "demo_n": 5}
    assert (nb.profile, nb.device, nb.seed) == ("smoke", torch.device("cpu"), 4)
    assert nb.figures_dir == out.resolve() / "runs" / "smoke" / "interactive" / "figures"
    assert nb.results_file == out.resolve() / "runs" / "smoke" / "interactive" / "results" / "07_demo.json"
    assert nb.cache_dir == out.resolve() / "runs" / "cache"
    nb.record("n", 5, description="demo")
    payload = json.loads(nb.results_file.read_text())
    assert payload["results"]["n"] == {"value": 5, "description": "demo", "fields": {"metric": "n"}}
    assert payload["meta"]["parameters"]["demo_n"] == 5 and "out_dir" not in payload["meta"]["parameters"]
    fig, _ = plt.subplots()
    entry = nb.save_figure(fig, "plot", data={"a": [1]})
    plt.close(fig)
    assert entry["figure"] == "07_plot" and (nb.figures_dir / "07_plot.png").is_file()
    assert entry["parameters"]["demo_n"] == 5
    # Defaults fill parameters missing from the namespace.
    assert notebook.start("07_demo", {"out_dir": str(out)}, verbose=False).params["demo_n"] == 3


def test_say_prints_in_a_terminal_and_shows_unbreakable_text_in_a_kernel(monkeypatch, capsys):
    import IPython
    import IPython.display

    notebook.NotebookContext.say("gap", 4.89, "[4.25, 5.49] pt", sep=" ")
    assert capsys.readouterr().out == "gap 4.89 [4.25, 5.49] pt\n"
    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("Shell", (), {"kernel": object()})())
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: shown.append((data, raw)))
    notebook.NotebookContext.say("a < b:", 0.5)
    assert capsys.readouterr().out == ""
    (data, raw), = shown
    assert raw and data["text/plain"] == "a < b: 0.5"
    assert data["text/html"].startswith("<pre class='bnmem-text' style='margin:0;white-space:pre-wrap;"
                                        "word-break:normal;")
    assert "a &lt; b: 0.5</pre>" in data["text/html"]


def test_in_papermill(monkeypatch):
    monkeypatch.delenv("BNMEM_HEADLESS", raising=False)
    assert notebook.in_papermill() is False
    monkeypatch.setenv("BNMEM_HEADLESS", "1")
    assert notebook.in_papermill() is True


def test_an_interval_read_back_as_a_p_value_and_holms_adjustment():
    from bnmem_utils.core.stats import holm, p_from_interval

    assert p_from_interval(1.0, 0.0, 2.0) == pytest.approx(0.05)          # touching the null
    assert p_from_interval(1.0, 0.0, 2.0, n=4) == pytest.approx(0.05)
    assert p_from_interval(1.0, 0.5, 1.5, n=4) > p_from_interval(1.0, 0.5, 1.5)  # t's tails
    assert p_from_interval(-1.0, -1.5, 0.5, n=10) == p_from_interval(1.0, -0.5, 1.5, n=10)
    assert np.isnan(p_from_interval(1.0, float("nan"), 2.0))
    adjusted = holm([0.01, 0.04, float("nan"), 0.03])
    assert list(adjusted[[0, 1, 3]]) == pytest.approx([0.03, 0.06, 0.06])
    assert np.isnan(adjusted[2])


def test_an_estimate_is_cut_to_its_range_and_says_so():
    est = stats.mean_ci([0.1, 0.9, 0.95])
    assert est.method == "Student t" and est.lo < 0 < 1 < est.hi
    cut = est.within(0.0, 1.0)
    assert (cut.lo, cut.hi, cut.clipped) == (0.0, 1.0, True) and cut.mean == est.mean
    assert stats.mean_ci([0.4, 0.5, 0.6]).within(0.0, 1.0).clipped is False


def test_the_replicate_interval_carries_bank_to_bank_variance():
    """Data built with bank-to-bank variance (each replicate's targets scatter tightly around
    their own bank's mean): the interval over one bank's targets is narrow and misses most
    other banks' means; the replicate one is a Student t over the replicates' own differences
    (R - 1 d.o.f., n = R), wider, and covers the true difference."""
    rng = np.random.default_rng(3)
    banks = rng.normal(0.02, 0.03, size=6)                     # per-replicate true differences
    a = [rng.normal(0.6 + d, 0.01, size=32) for d in banks]
    b = [rng.normal(0.6, 0.01, size=32) for _ in banks]
    one = stats.diff_ci(a[0], b[0])
    rep = stats.replicated(a, b)["estimate"]
    own = [x.mean() - y.mean() for x, y in zip(a, b, strict=True)]
    half = st.t.ppf(0.975, 5) * np.std(own, ddof=1) / np.sqrt(6)
    assert rep.mean == pytest.approx(np.mean(own)) and rep.hi - rep.mean == pytest.approx(half)
    assert rep.method == stats.REPLICATE_T and rep.n == 6 and rep.lo < 0.02 < rep.hi
    assert rep.hi - rep.lo > 2 * (one.hi - one.lo)
    assert sum(one.lo <= d <= one.hi for d in banks) <= 2       # one bank's interval under-covers
    assert stats.replicate_t(own) == rep
    # R - 1 d.o.f. as the report reads it back: at the interval's edge p is 0.05
    assert stats.p_from_interval(rep.mean, rep.lo, rep.hi, rep.lo, n=rep.n) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="same number"):
        stats.replicated(a, b[:2])


def test_one_bank_calibration_reports_under_coverage():
    rng = np.random.default_rng(4)
    shifts = rng.normal(0.0, 0.05, size=5)
    a = [rng.normal(0.6 + d, 0.01, size=32) for d in shifts]
    b = [rng.normal(0.6, 0.01, size=32) for _ in shifts]
    numbers = stats.replicated(a, b)
    cal, est = numbers["calibration"], numbers["estimate"]
    assert est.method == stats.REPLICATE_T and numbers["first"].method.startswith(stats.WELCH)
    assert cal["replicates"] == 5 and cal["replicate_halfwidth"] == (est.hi - est.lo) / 2
    own = [x.mean() - y.mean() for x, y in zip(a, b, strict=True)]
    assert cal["one_bank_needed_halfwidth"] == pytest.approx(1.959964 * np.std(own, ddof=1))
    assert cal["one_bank_needed_halfwidth"] > 2 * cal["one_bank_halfwidth"]
    assert cal["covers_others"] < 0.95
    calm = [rng.normal(0.6, 0.05, size=32) for _ in range(5)]  # no bank-to-bank variance
    calm = stats.replicated(calm, [rng.normal(0.6, 0.05, size=32) for _ in range(5)])["calibration"]
    assert calm["covers_others"] >= 0.6
    assert 0.5 < calm["one_bank_needed_halfwidth"] / calm["one_bank_halfwidth"] < 1.5
    with pytest.raises(ValueError, match="at least 2 replicates"):
        stats.one_bank_calibration([numbers["first"]], numbers["estimate"])


def test_one_replicate_keeps_the_one_bank_interval():
    """R = 1: the number is the bank's own (Welch, paired t, Student t), with no calibration."""
    rng = np.random.default_rng(5)
    a, b = rng.normal(0.6, 0.02, size=16), rng.normal(0.55, 0.02, size=16)
    one = "over one bank's targets"
    assert stats.replicated([a], [b])["estimate"] == replace(stats.diff_ci(a, b),
                                                              method=f"{stats.WELCH} {one}")
    paired = stats.replicated([a], [b], paired=True)
    assert paired["estimate"].method == f"{stats.PAIRED_T} {one}" and paired["calibration"] is None
    assert paired["estimate"].mean == pytest.approx(stats.diff_ci(a, b, paired=True).mean)
    assert stats.replicated([a])["estimate"] == replace(stats.mean_ci(a), method=f"{stats.T} {one}")
    one_arm = stats.replicated([a, b])                          # b None: one arm's mean
    assert one_arm["estimate"].mean == pytest.approx((a.mean() + b.mean()) / 2)
