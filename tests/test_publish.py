"""The exports for readers: offline HTML pages, LaTeX for the write-up, and the claims tables'
rendering (whole cells, whole keys)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess

import matplotlib

matplotlib.use("Agg")

import nbformat  # noqa: E402
import pytest  # noqa: E402

from bnmem_utils.analyses import report  # noqa: E402
from bnmem_utils.core.outputs import read_manifest  # noqa: E402
from bnmem_utils.core.results import Result, ResultsFile, results_path  # noqa: E402
from bnmem_utils.figures.plotting import new_figure, save_figure  # noqa: E402
from bnmem_utils.run import publish  # noqa: E402

LATEX_PACKAGE = "texlive-latex-recommended"


def _results(tmp_path, notebook, values, profile="quick"):
    rf = ResultsFile(results_path(profile, notebook, tmp_path))
    for key, val in values.items():
        rf.record(key, val["value"], lo=val.get("lo"), hi=val.get("hi"), n=5)


def _executed(tmp_path, name="01_theory", profile="quick", cells=()):
    run_dir = tmp_path / "runs" / profile
    run_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(r"# hello\n\nThe ratio is $(\gamma/\sigma)^2$."),
                nbformat.v4.new_code_cell("1 + 1"), *cells]
    nbformat.write(nb, run_dir / f"{name}.ipynb")
    return run_dir


def _figure(tmp_path, name="02_curves", title="accuracy on the corrupted samples",
            description=""):
    fig = new_figure()
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_title(title)
    return save_figure(fig, name, folder=tmp_path / "runs" / "quick" / "figures",
                       notebook="02_forced_memorization", profile="quick", commit="abc1234",
                       description=description)


def _c1a(arch: str, setting: str, label: str) -> Result:
    return Result("mem_diff", norm="bn", versus="none", dataset="digits", arch=arch,
                  setting=setting, label=label, when="at10")


_C1A = {_c1a("lenet", "flip_1pct", "flip 1%"): {"value": 0.4, "lo": 0.1, "hi": 0.7},
        _c1a("mlp", "ood_2pct_gaussian", "OOD 2% (gaussian)"): {"value": 0.3, "lo": -0.1,
                                                                "hi": 0.5}}


# --- HTML --------------------------------------------------------------------------------------


def test_html_pages_load_every_script_from_beside_them(tmp_path):
    run_dir = _executed(tmp_path)
    _results(tmp_path, "01_theory", {"theory_max_rel_error": {"value": 1e-9}})
    index = publish.export_html("quick", report.CLAIMS, out_dir=tmp_path)
    html_dir = run_dir / "html"
    page = (html_dir / "01_theory.html").read_text()
    scripts = re.findall(r'<script[^>]*\bsrc="([^"]*)"', page)
    assert scripts and not [s for s in scripts if "://" in s], scripts
    assert 'src="mathjax/MathJax.js?config=' in page
    assert (html_dir / "mathjax" / "MathJax.js").exists()
    # the bundle's own fonts: MathJax's default TeX fonts are not in it
    assert publish.MATHJAX_CONFIG in page and 'webFont: "STIX-Web"' in publish.MATHJAX_CONFIG
    assert (html_dir / "mathjax" / "jax" / "output" / "HTML-CSS" / "fonts" / "STIX-Web"
            / "fontdata.js").exists()
    assert "about:blank" not in publish.MATHJAX_CONFIG
    assert r"$(\gamma/\sigma)^2$" in page  # the formula, for MathJax to typeset
    assert "://" not in "".join(re.findall(r'<script[^>]*\bsrc="([^"]*)"', index.read_text()))


def test_html_report_of_smoke_says_its_numbers_mean_nothing(tmp_path):
    _executed(tmp_path, profile="smoke")
    assert "its numbers mean nothing" in publish.export_html("smoke", [], tmp_path).read_text()
    _executed(tmp_path, profile="quick")
    assert "mean nothing" not in publish.export_html("quick", [], tmp_path).read_text()


def test_html_export_keeps_an_existing_mathjax_copy(tmp_path):
    _executed(tmp_path)
    publish.export_html("quick", [], out_dir=tmp_path)
    marker = tmp_path / "runs" / "quick" / "html" / "mathjax" / "kept"
    marker.write_text("x")
    publish.export_html("quick", [], out_dir=tmp_path)
    assert marker.exists()


def test_html_export_without_runs_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="bnmem reproduce --profile quick"):
        publish.export_html("quick", [], out_dir=tmp_path)
    assert not (tmp_path / "runs" / "quick" / "html").exists()


def test_report_cli_without_runs_leaves_no_folder(tmp_path, capsys):
    from bnmem_utils.run.cli import main

    assert main(["report", "--profile", "quick", "--out", str(tmp_path), "--latex"]) == 2
    assert "bnmem reproduce" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "quick" / "html").exists()
    assert not (tmp_path / "runs" / "quick" / "latex").exists()


def test_figures_captioned_from_the_manifest(tmp_path):
    _executed(tmp_path)
    entry = _figure(tmp_path, description="Accuracy on the corrupted samples over   epochs.")
    assert entry["description"] == "Accuracy on the corrupted samples over epochs."
    assert read_manifest(tmp_path / "runs" / "quick" / "figures")["02_curves"] == entry
    _figure(tmp_path, "02_loss", title="digits / mlp")  # no description: its title, as a sentence
    page = publish.export_html("quick", [], out_dir=tmp_path).read_text()
    assert ("02_curves: Accuracy on the corrupted samples over epochs. (notebook "
            "02_forced_memorization, profile quick, commit abc1234)") in page
    assert "02_loss: Digits / mlp. (notebook" in page


_PROGRESS = {"model_id": "m1", "version_major": 2, "version_minor": 0}
_WIDGET_STATE = {"state": {
    "m1": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_m2", "IPY_MODEL_m3",
                                                             "IPY_MODEL_m4"]}},
    "m2": {"model_name": "HTMLModel", "state": {"value": "3\u2007banks:\u2007100%"}},
    "m3": {"model_name": "FloatProgressModel", "state": {"value": 4.0, "max": 4.0}},
    "m4": {"model_name": "HTMLModel", "state": {"value": "\u20074/4\u2007[00:01&lt;00:00]"}}},
    "version_major": 2, "version_minor": 0}


def _widget_notebook(tmp_path):
    """An executed notebook as papermill leaves one with a tqdm bar: a widget view whose text
    is the bar's first state, and the widgets' last state in the notebook's metadata."""
    cell = nbformat.v4.new_code_cell("for _ in tqdm(range(4)): pass", outputs=[
        nbformat.v4.new_output("display_data", data={
            "application/vnd.jupyter.widget-view+json": _PROGRESS,
            "text/plain": "3 banks:   0%|          | 0/4 [00:00<?, ?it/s]"}),
        nbformat.v4.new_output("display_data", data={
            "application/vnd.jupyter.widget-view+json": {**_PROGRESS, "model_id": "gone"}})])
    run_dir = _executed(tmp_path, "04_lira", cells=[cell])
    nb = nbformat.read(run_dir / "04_lira.ipynb", as_version=4)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": _WIDGET_STATE}
    nbformat.write(nb, run_dir / "04_lira.ipynb")
    return run_dir


def test_widget_views_become_their_last_text(tmp_path):
    run_dir = _widget_notebook(tmp_path)
    publish.export_html("quick", [], out_dir=tmp_path)
    page = (run_dir / "html" / "04_lira.html").read_text()
    assert "3 banks: 100%|██████████| 4/4 [00:01&lt;00:00]" in page  # its last state
    assert "0/4" not in page
    for what in ("unpkg", "widget-state", "widget-view", "embed-amd"):
        assert what not in page, what
    assert nbformat.read(run_dir / "04_lira.ipynb", as_version=4).metadata["widgets"]  # kept


def _local_links(page: str) -> list[str]:
    links = re.findall(r'\b(?:src|href)="([^"]+)"', page)
    return [u.split("#")[0].split("?")[0] for u in links
            if not u.startswith(("#", "data:", "http://", "https://", "mailto:"))]


def test_html_export_moves_as_a_folder(tmp_path):
    """The export folder moved elsewhere (its run and figures gone): every image, script and
    link of its pages resolves inside it."""
    link = nbformat.v4.new_markdown_cell("See [the paper](../docs/paper.md#the-claims).")
    _executed(tmp_path, cells=[link])
    _results(tmp_path, "01_theory", {"theory_max_rel_error": {"value": 1e-9}})
    _figure(tmp_path, "01_ratio_vs_gamma_sigma")
    _figure(tmp_path)
    publish.export_html("quick", report.CLAIMS, out_dir=tmp_path)
    moved = tmp_path / "elsewhere" / "report"
    moved.parent.mkdir()
    shutil.move(tmp_path / "runs" / "quick" / "html", moved)
    shutil.rmtree(tmp_path / "runs")
    pages = sorted(moved.glob("*.html"))
    assert [p.name for p in pages] == ["01_theory.html", "index.html"]
    images = re.findall(r'<img[^>]*\bsrc="([^"]+)"', (moved / "index.html").read_text())
    assert images == ["figures/01_ratio_vs_gamma_sigma.png", "figures/02_curves.png"]
    for page in pages:
        for link in _local_links(page.read_text()):
            assert (moved / link).is_file(), f"{page.name}: {link}"
    assert 'href="docs/paper.md#the-claims"' in (moved / "01_theory.html").read_text()


def test_html_export_drops_figures_no_longer_made(tmp_path):
    _executed(tmp_path)
    _figure(tmp_path, "02_old")
    publish.export_html("quick", [], out_dir=tmp_path)
    (tmp_path / "runs" / "quick" / "figures" / "02_old.png").unlink()
    _figure(tmp_path)
    publish.export_html("quick", [], out_dir=tmp_path)
    copies = tmp_path / "runs" / "quick" / "html" / "figures"
    assert sorted(p.name for p in copies.iterdir()) == ["02_curves.png"]


# --- the claims tables -------------------------------------------------------------------------


def test_claims_text_lists_whole_keys(tmp_path):
    _results(tmp_path, "02_forced_memorization", _C1A)
    rows = [r for r in report.claims_table(report.CLAIMS, "quick", tmp_path) if r["id"] == "C1a"]
    text = report.claims_text(rows)
    for what in _C1A:
        assert what.key in text
    assert "…" not in text
    assert "0.3 [-0.1, 0.5]" in text or "30 [-10, 50] pt" in text


def test_claims_html_wraps_cells_and_never_squeezes_the_verdict(tmp_path):
    _results(tmp_path, "02_forced_memorization", _C1A)
    rows = [r for r in report.claims_table(report.CLAIMS, "quick", tmp_path) if r["id"] == "C1a"]
    page = report.claims_html(rows)
    table = re.search(r'<table class="bnmem-claims" style="([^"]*)"', page)[1]
    assert "table-layout:auto" in table  # inline: JupyterLab's own table style says fixed
    verdicts = re.findall(r'<td class="verdict" style="([^"]*)">', page)
    assert len(verdicts) == 2 and all(v.endswith("overflow-wrap:normal") for v in verdicts)
    assert html.escape("BN memorizes corrupted samples faster (at the profile's speed epoch") in page


def test_a_notebook_shows_its_claims_whole_with_a_note(tmp_path):
    recorded = {r.key: {**v, "fields": r.fields(), "label": r.label} for r, v in _C1A.items()}
    rows = report.notebook_rows("02_forced_memorization", recorded)
    view = report.ClaimsView(rows, note="its numbers mean nothing")
    page = view._repr_html_()
    assert page.startswith("<p><b>its numbers mean nothing</b></p>")
    claim = next(c for c in report.CLAIMS if c.id == "C1a")
    assert html.escape(claim.title) in page  # whole, never cut with "…"
    assert "digits 8x8, MLP, OOD 2% (gaussian)" in page
    assert list(view.frame.loc["C1a"].verdict) == ["reproduced", "inconclusive"]
    assert "its numbers mean nothing" in repr(view)


# --- LaTeX -------------------------------------------------------------------------------------


def test_tex_escape_writes_specials_and_names_an_unknown_character():
    assert publish.tex_escape("5% of x_1 & {y} ~ ^2") == (
        r"5\% of x\_1 \& \{y\} \textasciitilde{} \textasciicircum{}2")
    assert publish.tex_escape("‖x‖²") == r"\ensuremath{\|}x\ensuremath{\|}\textsuperscript{2}"
    with pytest.raises(ValueError, match="U\\+263A"):
        publish.tex_escape("☺")


def test_every_claim_has_a_latex_form():
    for claim in report.CLAIMS:
        tex = publish.tex_escape(claim.title + claim.paper + claim.setting)
        assert tex.isascii(), (claim.id, tex)
        # with its escapes and commands taken out, no character LaTeX treats as special is left
        bare = re.sub(r"\\(?:[&%$#_{}|]|[A-Za-z]+(?:\{\})?)", "", tex)
        assert not set(bare) & set("\\&%$#_^~<>"), (claim.id, tex)


def _latex_export(tmp_path, claims=report.CLAIMS):
    _results(tmp_path, "02_forced_memorization", _C1A)
    _results(tmp_path, "01_theory", {"theory_max_rel_error": {"value": 1e-9}})
    _figure(tmp_path, description="Accuracy on the corrupted samples over epochs, 95% band.")
    _figure(tmp_path, "01_ratio_vs_gamma_sigma", title="digits / mlp",
            description=r"The measured ratio against $(\gamma/\sigma_B)^2$.")
    fig = new_figure(figsize=(3, 14))  # taller than a page: height-limited
    fig.subplots(4, 1)
    save_figure(fig, "06_claims_forest", folder=tmp_path / "runs" / "quick" / "figures")
    return publish.export_latex("quick", claims, out_dir=tmp_path)


def test_latex_export_writes_the_table_and_one_figure_per_pdf(tmp_path):
    table, figures = _latex_export(tmp_path)
    tex = table.read_text()
    assert r"\begin{longtable}" in tex and r"\endhead" in tex  # breaks over pages
    assert r"\begin{table}" not in tex
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert tex.count(r"claim & paper & setting & ours (95\% CI) & verdict \\") == 2  # each page
    assert r"40 [10, 70] pt" in tex and "inconclusive" in tex and "missing" in tex
    assert tex.count(r"\textbf{C1a}") == 1  # the claim once, then its settings
    primary = (table.parent / "claims_primary.tex").read_text()      # the primary rows alone
    assert r"\label{tab:bnmem-claims-primary}" in primary
    rows = report.claims_table(report.CLAIMS, "quick", tmp_path)
    assert primary.count(r"\tabularnewline") == sum(bool(r["primary"]) for r in rows) > 0
    fig = figures.read_text()
    assert fig.count(r"\includegraphics") == 3
    assert fig.count(r"[width=\linewidth,height=0.9\textheight,keepaspectratio]") == 3
    assert r"{\bnmemfigdir 02_curves.pdf}" in fig
    assert r"\caption{Accuracy on the corrupted samples over epochs, 95\% band.}" in fig
    assert r"\caption{The measured ratio against $(\gamma/\sigma_B)^2$.}" in fig  # not the title
    assert r"\caption{Claims forest.}" in fig  # no description, no title: its name
    assert "% 02_curves: notebook 02_forced_memorization, profile quick, commit abc1234" in fig


def test_latex_export_without_results_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="bnmem reproduce --profile quick"):
        publish.export_latex("quick", report.CLAIMS, out_dir=tmp_path)
    assert not (tmp_path / "runs" / "quick" / "latex").exists()


def test_latex_export_compiles_and_fits_the_pages(tmp_path):
    engine = shutil.which("pdflatex")
    if engine is None:
        pytest.skip(f"no pdflatex; install it with: apt-get install -y {LATEX_PACKAGE}")
    table, figures = _latex_export(tmp_path)
    doc = tmp_path / "paper"
    doc.mkdir()
    (doc / "main.tex").write_text(
        "\\documentclass{article}\n\\usepackage{booktabs,longtable,graphicx}\n"
        f"\\begin{{document}}\n\\input{{{table.as_posix()}}}\n\\clearpage\n"
        f"\\input{{{figures.as_posix()}}}\n\\end{{document}}\n")
    run = subprocess.run([engine, "-interaction=nonstopmode", "-halt-on-error", "main.tex"],
                         cwd=doc, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:]
    log = (doc / "main.log").read_text(errors="replace")
    assert "LaTeX Warning: File" not in log  # every figure found
    assert "Float too large" not in log  # the tall figure fits its page
    assert "Overfull \\hbox" not in log, re.findall(r"Overfull \\hbox.*", log)
    pages = int(re.search(r"Output written on main\.pdf \((\d+) pages?", log)[1])
    # every claim's rows over more than one page, then one page per figure at most
    assert pages >= 2 + 1, pages


# --- the command line --------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "streams"), [
    ([], False), (["--html"], False), (["--latex"], False), (["-v"], True),
    (["--html", "--verbose"], True), (["--quiet"], False), (["--html", "-q", "-v"], False)])
def test_reproduce_streams_the_notebooks_only_when_verbose(flags, streams):
    from bnmem_utils.run.cli import _stream_notebooks, build_parser

    args = build_parser().parse_args(["reproduce", *flags])
    assert _stream_notebooks(args) is streams


@pytest.mark.parametrize("euid", [0, 1000])
def test_lab_starts_at_the_repository_root_as_root_too(monkeypatch, euid):
    from bnmem_utils.core.paths import project_root
    from bnmem_utils.run import cli

    monkeypatch.setattr(cli.os, "geteuid", lambda: euid)
    cmd = cli.lab_command(["--port", "8899"])
    assert cmd[1:4] == ["-m", "jupyter", "lab"]
    assert f"--ServerApp.root_dir={project_root()}" in cmd
    assert ("--allow-root" in cmd) is (euid == 0)
    assert cmd[-2:] == ["--port", "8899"]
