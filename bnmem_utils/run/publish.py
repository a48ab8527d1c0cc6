"""Exports of a run for readers: HTML pages that work offline, and LaTeX for the write-up.

``export_html`` turns each executed notebook of a profile into an HTML page, with an index page
holding the claims table and every figure. The export folder (``runs/<profile>/html/``) holds
everything its pages show, linked relatively, so it can be moved or zipped: MathJax (from the
``jupyter-server-mathjax`` package, which bundles MathJax 2.7 with the STIX-Web fonts) under
``mathjax/``, the figures under ``figures/``, and the repository files the notebooks link to
(``docs/paper.md``). No page asks the network for anything: progress-bar widgets are written as
their last text, not as widgets a CDN script would draw.

``export_latex`` writes files a paper can ``\\input``: the claims table as a booktabs
``longtable`` that breaks over pages (``claims.tex``: claim, paper, setting, ours with its
interval, verdict; ``claims_primary.tex`` with the primary rows alone) and the figures
(``figures.tex``: one ``\\includegraphics`` of each exported PDF, at most 0.9 of the text
height, its caption the one-sentence description saved with the figure). They need
``\\usepackage{booktabs,longtable,graphicx}`` in the preamble.
"""

from __future__ import annotations

import html
import os
import re
import shutil
from pathlib import Path

from bnmem_utils.analyses.report import CLAIMS_CSS, Claim, claims_html, claims_table
from bnmem_utils.core.cache import atomic_write_text
from bnmem_utils.core.outputs import read_json, read_manifest
from bnmem_utils.core.paths import figures_dir, project_root, runs_dir

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; }}
table {{ border-collapse: collapse; width: 100%; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
figure {{ display: block; width: 100%; margin: 1em 0; }}  /* one per row: text at its size */
figure img {{ width: 100%; }}
figcaption {{ font-size: 0.8em; color: #444; }}
{claims_css}
</style>
{mathjax_config}<script src="{mathjax}"></script>
</head><body>
{body}
</body></html>
"""

#: MathJax beside the pages, with the configuration nbconvert's own CDN default uses.
MATHJAX_DIR = "mathjax"
MATHJAX_URL = f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"
#: Every page's MathJax settings. The bundle has the STIX-Web fonts, not MathJax's default TeX
#: ones (whose font data and files fail to load, and formulas fall back to a system font or to
#: "Math Processing Error"); the probe font MathJax_Blank comes from no URL (``about:blank`` is
#: a failed request); the hidden MathML copy for screen readers asks for no TeX font file.
MATHJAX_CONFIG = """<script type="text/x-mathjax-config">
MathJax.Hub.Config({tex2jax: {inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], processEscapes: true},
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null,
    styles: {"@font-face": {"font-family": "MathJax_Blank", src: "local('MathJax_Blank')"}}}});
</script>
<style>.MJX_Assistive_MathML [mathvariant] { font-family: inherit !important; }</style>
"""
#: Where the index page's figures are copied, inside the export folder.
FIGURES_DIR = "figures"


def copy_mathjax(html_dir: Path) -> Path:
    """Copy the bundled MathJax (``MathJax.js`` and its parts) to ``html_dir/mathjax`` (once: an
    existing copy of the same ``MathJax.js`` is kept); return the folder."""
    try:
        import jupyter_server_mathjax
    except ImportError as exc:
        raise ImportError("the offline HTML export needs MathJax from the jupyter-server-mathjax "
                          "package: pip install -e . (or pip install jupyter-server-mathjax)"
                          ) from exc
    src = Path(jupyter_server_mathjax.__file__).parent / "static"
    dst = html_dir / MATHJAX_DIR
    if (dst / "MathJax.js").exists() and (
            (dst / "MathJax.js").read_bytes() == (src / "MathJax.js").read_bytes()):
        return dst
    tmp = html_dir / f".{MATHJAX_DIR}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


#: Scripts the nbconvert "lab" template loads from a CDN, of no use in a page without widgets.
_CDN_SCRIPT = re.compile(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>\s*')
_WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def widget_text(state: dict, model_id: str) -> str:
    """A saved widget's last state as text: a progress bar (tqdm's box of labels and bar) reads
    ``6 banks (24 models): 100%|██████████| 24/24 [00:03<00:00, ...]``."""
    entry = state.get(model_id) or {}
    values = entry.get("state") or {}
    if values.get("children"):
        return "".join(widget_text(state, c.removeprefix("IPY_MODEL_"))
                       for c in values["children"])
    if entry.get("model_name", "").endswith("ProgressModel") and values.get("max"):
        filled = max(0, min(10, round(10 * (values.get("value") or 0) / values["max"])))
        return "|" + "█" * filled + " " * (10 - filled) + "|"
    text = values.get("value") if isinstance(values.get("value"), str) else ""
    return html.unescape(re.sub(r"<[^>]*>", "", text)).replace("\u2007", " ")


def strip_widgets(nb) -> None:
    """Drop ``nb``'s widget state and widget views (in place): each view becomes its widget's
    last state as text (:func:`widget_text`), else the text the kernel sent with it; the page
    then loads no widget script."""
    state = nb.metadata.pop("widgets", {}).get(_WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).pop(_WIDGET_VIEW, None)
            text = widget_text(state, view.get("model_id", "")) if view else ""
            if text:
                out["data"]["text/plain"] = text
        if "outputs" in cell:  # a view with no text left behind goes
            cell["outputs"] = [o for o in cell["outputs"] if o.get("data", True)]


#: A link of a notebook to a file of the repository, relative to notebooks/.
_REPO_LINK = re.compile(r'\b(href|src)="(\.\./[^"#?:]+)')


def _carry_repo_links(page: str, html_dir: Path) -> str:
    """``page`` with its links to repository files (``../docs/paper.md``) pointed at copies of
    them in ``html_dir`` (made here), so the export works wherever it is moved."""
    root = project_root().resolve()

    def carry(m: re.Match) -> str:
        target = (root / "notebooks" / m[2]).resolve()
        if not target.is_file() or not target.is_relative_to(root):
            return m[0]
        rel = target.relative_to(root).as_posix()
        (html_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target, html_dir / rel)
        return f'{m[1]}="{rel}'

    return _REPO_LINK.sub(carry, page)


def notebook_html(path: Path, html_dir: Path | None = None) -> str:
    """One executed notebook as an HTML page for ``html_dir`` (default: ``html/`` beside the
    notebook) that needs no network: its scripts, fonts and linked files all come from there."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    strip_widgets(nb)
    exporter = HTMLExporter(template_name="lab", mathjax_url=MATHJAX_URL)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": path.stem}})
    body = _CDN_SCRIPT.sub("", body).replace("</head>", MATHJAX_CONFIG + "</head>", 1)
    return _carry_repo_links(body, html_dir or path.parent / "html")


def export_html(profile: str, claims: list[Claim] | None = None,
                out_dir: str | os.PathLike | None = None) -> Path:
    """Export each executed notebook of ``profile`` to HTML, plus an index page; return its path.

    Reads ``runs/<profile>/NN_*.ipynb`` (written by ``bnmem reproduce``; a failed notebook's
    ``NN_*.failed.ipynb`` too) and writes ``runs/<profile>/html/NN_*.html``,
    ``runs/<profile>/html/index.html`` with every notebook and its status in the last run (failures
    included), the claims table and every figure of ``runs/<profile>/figures/`` (copied to
    ``html/figures/``), and MathJax under ``html/mathjax/``: the folder can be moved. Without
    executed notebooks it raises :class:`FileNotFoundError` and writes nothing.
    """
    run_dir = runs_dir(profile, out_dir)
    html_dir = run_dir / "html"
    from bnmem_utils.run.plan import NOTEBOOK_PATTERN

    executed = sorted(p for p in run_dir.glob("[0-9][0-9]*_*.ipynb")
                      if NOTEBOOK_PATTERN.match(p.stem.removesuffix(".failed")))
    if not executed:
        raise FileNotFoundError(f"no executed notebooks under {run_dir}; run `bnmem reproduce "
                                f"--profile {profile}` first")
    html_dir.mkdir(parents=True, exist_ok=True)
    copy_mathjax(html_dir)
    for path in executed:
        atomic_write_text(html_dir / f"{path.stem}.html", notebook_html(path))
    parts = [f"<h1>bnmem reproduction report: profile <code>{html.escape(profile)}</code></h1>",
             "<p>Companion to <em>Batch Normalization Amplifies Memorization and Privacy "
             "Risks</em> (Doan, Gu and Alouani, arXiv 2605.24420).</p>",
             "<h2>Executed notebooks</h2><ul>\n" + "\n".join(_notebook_items(run_dir, executed))
             + "\n</ul>"]
    if profile == "smoke":
        parts.insert(1, '<p style="color:#a4161a"><b>Profile smoke: a wiring check with tiny '
                        "models and banks; its numbers mean nothing.</b></p>")
    fig_dir = figures_dir(profile, out_dir)
    if claims:
        rows = claims_table(claims, profile, out_dir)
        parts.append("<h2>Claims</h2>" + claims_html(
            rows, style=False, figure_href=lambda r: (
                f"{FIGURES_DIR}/{r['figure']}.png"
                if (fig_dir / f"{r['figure']}.png").is_file() else "")))
        parts.append("<p><small>Hover a row for its results key; <code>bnmem report</code> prints "
                     "the keys, and <code>claims.json</code> holds every row.</small></p>")
    parts += _figures_html(fig_dir, html_dir)
    index = html_dir / "index.html"
    atomic_write_text(index, _PAGE.format(title=f"bnmem report ({profile})", body="\n".join(parts),
                                          claims_css=CLAIMS_CSS, mathjax=MATHJAX_URL,
                                          mathjax_config=MATHJAX_CONFIG))
    return index


def figure_description(name: str, meta: dict) -> str:
    """A figure's one sentence from its manifest entry: the description saved with it, else its
    title (or name) written as a sentence."""
    text = " ".join(str(meta.get("description") or meta.get("title")
                        or name.split("_", 1)[-1].replace("_", " ")).split())
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "?", "!")) else f"{text}."


def figure_provenance(meta: dict) -> str:
    """The notebook, profile and commit that made a figure (manifest entry ``meta``)."""
    return ", ".join(f"{k} {meta[k]}" for k in ("notebook", "profile", "commit") if meta.get(k))


def _notebook_items(run_dir: Path, executed: list[Path]) -> list[str]:
    """One list item per notebook of the last run (its newer summary: ``summary.json`` or
    ``summary.failed.json``) and per other executed notebook: its page, its status (a failure's
    error and the page of its executed copy) and whether its results are an earlier run's."""
    summaries = [p for p in (run_dir / "summary.json", run_dir / "summary.failed.json") if p.exists()]
    last = read_json(max(summaries, key=lambda p: p.stat().st_mtime)) if summaries else {}
    runs = {n.get("notebook"): n for n in last.get("notebooks") or [] if isinstance(n, dict)}
    pages = {p.stem for p in executed}
    items = []
    for stem in sorted(set(runs) | {s.removesuffix(".failed") for s in pages}):
        entry, name = runs.get(stem, {}), html.escape(str(stem))
        text = f'<a href="{name}.html">{name}</a>' if stem in pages else name
        status = str(entry.get("status", "not run by the last run"))
        text += f": <b>{html.escape(status)}</b>"
        if entry.get("error"):
            text += f" ({html.escape(str(entry['error']))})"
        if f"{stem}.failed" in pages:
            text += f' <a href="{name}.failed.html">executed copy with the traceback</a>'
        if entry and entry.get("status") != "ok":
            text += ("; results and executed notebook kept from an earlier run" if entry.get("kept")
                     else "; no earlier results")
        items.append(f"<li>{text}</li>")
    return items


def copy_figures(fig_dir: Path, html_dir: Path) -> list[Path]:
    """Copy the PNGs of ``fig_dir`` to ``html_dir/figures`` (a PNG no longer there goes);
    return the copies."""
    dst = html_dir / FIGURES_DIR
    dst.mkdir(parents=True, exist_ok=True)
    figures = sorted(fig_dir.glob("*.png")) if fig_dir.is_dir() else []
    for old in set(dst.glob("*.png")) - {dst / p.name for p in figures}:
        old.unlink()
    for png in figures:
        shutil.copyfile(png, dst / png.name)
    return [dst / p.name for p in figures]


def _figures_html(fig_dir: Path, html_dir: Path) -> list[str]:
    figures = copy_figures(fig_dir, html_dir)
    if not figures:
        return []
    manifest, parts = read_manifest(fig_dir), ["<h2>Figures</h2>"]
    for png in figures:
        src = f"{FIGURES_DIR}/{png.name}"
        meta = manifest.get(png.stem, {})
        made = figure_provenance(meta)
        caption = (f"{png.stem}: {figure_description(png.stem, meta)}"
                   + (f" ({made})" if made else ""))
        parts.append(f'<figure><a href="{src}"><img src="{src}" alt="{html.escape(png.stem)}">'
                     f"</a><figcaption>{html.escape(caption)}</figcaption></figure>")
    return parts


# ------------------------------------------------------------------------------------------
# LaTeX
# ------------------------------------------------------------------------------------------

_TEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                "^": r"\textasciicircum{}", "<": r"\textless{}", ">": r"\textgreater{}"}
_TEX_UNICODE = {"‖": r"\ensuremath{\|}", "²": r"\textsuperscript{2}", "—": "---", "–": "--",
                "…": r"\dots{}", "γ": r"\ensuremath{\gamma}", "σ": r"\ensuremath{\sigma}",
                "≥": r"\ensuremath{\geq}", "≤": r"\ensuremath{\leq}", "×": r"\ensuremath{\times}",
                "−": "-", "’": "'", "‘": "`", "“": "``", "”": "''"}


def tex_escape(text: str) -> str:
    """``text`` as LaTeX source for pdfLaTeX: special characters escaped, the few non-ASCII
    characters the claims use written as LaTeX; any other non-ASCII character is an error
    naming it."""
    out = []
    for ch in str(text):
        if ch in _TEX_SPECIAL:
            out.append(_TEX_SPECIAL[ch])
        elif ch in _TEX_UNICODE:
            out.append(_TEX_UNICODE[ch])
        elif ord(ch) > 127:
            raise ValueError(f"no LaTeX form for the character {ch!r} (U+{ord(ch):04X}) in "
                             f"{text!r}; add it to bnmem_utils.run.publish._TEX_UNICODE")
        else:
            out.append(ch)
    return "".join(out)


def tex_with_math(text: str) -> str:
    """:func:`tex_escape` outside ``$...$`` spans; the spans (matplotlib's mathtext in figure
    titles, a subset of LaTeX's math) kept as they are."""
    parts = str(text).split("$")
    if len(parts) % 2 == 0:  # an unpaired $: no math
        return tex_escape(text)
    return "".join(tex_escape(p) if i % 2 == 0 else f"${p}$" for i, p in enumerate(parts))


_CLAIMS_HEAD = (r"\toprule", r"claim & paper & setting & ours (95\% CI) & verdict \\",
                r"\midrule")
#: Cells ragged-right (justified, narrow columns stretch their spaces); rows then end in
#: \tabularnewline, as \raggedright redefines \\
_RAGGED = "\\raggedright "


def claims_latex(rows: list[dict], *, caption: str = "", label: str = "tab:bnmem-claims") -> str:
    """The claims table as a booktabs ``longtable``, which breaks over pages with its header
    on each: claim (once per claim), the paper's statement, the setting, our number with its
    95% interval, and the verdict; cells wrap ragged-right, the table fits the text width."""
    lines = [r"% bnmem claims table: needs \usepackage{booktabs,longtable}",
             r"\begingroup\scriptsize\setlength{\tabcolsep}{3pt}",
             r"\begin{longtable}{@{}p{0.2\linewidth}p{0.22\linewidth}p{0.18\linewidth}"
             r"p{0.16\linewidth}l@{}}",
             rf"\caption{{{tex_escape(caption)}}}\label{{{label}}}\\" if caption else "",
             *_CLAIMS_HEAD, r"\endfirsthead", *_CLAIMS_HEAD, r"\endhead",
             r"\midrule\multicolumn{5}{r}{\emph{continued on the next page}}\\", r"\endfoot",
             r"\bottomrule", r"\endlastfoot"]
    previous = None
    for r in rows:
        first = r["id"] != previous
        if first and previous is not None:
            lines.append(r"\addlinespace")
        previous = r["id"]
        cells = [rf"\textbf{{{tex_escape(r['id'])}}}: {tex_escape(r['claim'])}" if first else "",
                 tex_escape(r["paper"]) if first else "", tex_escape(r.get("setting") or ""),
                 tex_escape(r["ours"])]
        lines.append(" & ".join([*(_RAGGED + c for c in cells), tex_escape(r["verdict"])])
                     + r" \tabularnewline")
    lines += [r"\end{longtable}", r"\endgroup", ""]
    return "\n".join(line for line in lines if line)


def figures_latex(fig_dir: Path) -> str:
    """One ``figure`` per PDF of ``fig_dir``: ``\\includegraphics`` under ``\\bnmemfigdir``
    (the figures' absolute path, unless the document defines it first), as wide as the text
    and at most 0.9 of its height; the caption is the figure's one-sentence description
    (:func:`figure_description`), what made it a comment above."""
    pdfs = sorted(fig_dir.glob("*.pdf")) if fig_dir.is_dir() else []
    manifest = read_manifest(fig_dir)
    lines = [r"% bnmem figures: needs \usepackage{graphicx}; define \bnmemfigdir before "
             r"\input to move the PDFs",
             rf"\providecommand{{\bnmemfigdir}}{{{fig_dir.resolve().as_posix()}/}}"]
    for pdf in pdfs:
        meta = manifest.get(pdf.stem, {})
        lines += [f"% {pdf.stem}: {figure_provenance(meta)}", r"\begin{figure}[htbp]",
                  r"\centering", r"\includegraphics[width=\linewidth,height=0.9\textheight,"
                  rf"keepaspectratio]{{\bnmemfigdir {pdf.name}}}",
                  rf"\caption{{{tex_with_math(figure_description(pdf.stem, meta))}}}",
                  rf"\label{{fig:bnmem-{pdf.stem.replace('_', '-')}}}", r"\end{figure}"]
    return "\n".join(lines) + "\n"


def export_latex(profile: str, claims: list[Claim],
                 out_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Write ``runs/<profile>/latex/claims.tex``, ``figures.tex`` and ``claims_primary.tex``
    (see the module docstring); return the first two.
    Without any results for the profile it raises :class:`FileNotFoundError` and writes
    nothing."""
    run_dir = runs_dir(profile, out_dir)
    if not any((run_dir / "results").glob("[0-9][0-9]_*.json")):
        raise FileNotFoundError(f"no results under {run_dir / 'results'}; run `bnmem reproduce "
                                f"--profile {profile}` first")
    latex_dir = run_dir / "latex"
    latex_dir.mkdir(parents=True, exist_ok=True)
    rows = claims_table(claims, profile, out_dir)

    def caption(which: str) -> str:
        return (f"The {which}claims of arXiv 2605.24420 against our numbers (profile {profile}); "
                "intervals are 95%.")

    table = latex_dir / "claims.tex"
    atomic_write_text(table, claims_latex(rows, caption=caption("")))
    primary = [r for r in rows if r.get("primary")]  # from each claim's declared primary setting
    atomic_write_text(latex_dir / "claims_primary.tex", claims_latex(
        primary, caption=caption("primary "), label="tab:bnmem-claims-primary"))
    figures = latex_dir / "figures.tex"
    atomic_write_text(figures, figures_latex(figures_dir(profile, out_dir)))
    return table, figures
