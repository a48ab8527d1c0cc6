"""Exports of a run for readers: HTML pages that work offline, and LaTeX for the write-up.

``export_html`` turns each executed notebook of a profile into an HTML page, with an index page
holding the claims table and every figure. The pages load MathJax from a copy beside them
(``html/mathjax/``, from the ``jupyter-server-mathjax`` package, which bundles MathJax 2.7), not
from a CDN, so the formulas render without a network.

``export_latex`` writes two files a paper can ``\\input``: the claims table as a booktabs table
(``claims.tex``: claim, paper, setting, ours with its interval, verdict) and the figures
(``figures.tex``: one ``\\includegraphics`` of each exported PDF, its caption from the figures'
manifest). Both need ``\\usepackage{booktabs,graphicx}`` in the preamble.
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
from bnmem_utils.core.paths import figures_dir, runs_dir

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; }}
table {{ border-collapse: collapse; width: 100%; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
figure {{ display: inline-block; width: 48%; margin: 0.5%; vertical-align: top; }}
figure img {{ width: 100%; }}
figcaption {{ font-size: 0.8em; color: #444; }}
{claims_css}
</style>
<script type="text/x-mathjax-config">
MathJax.Hub.Config({{tex2jax: {{inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], processEscapes: true}}}});
</script>
<script src="{mathjax}"></script>
</head><body>
{body}
</body></html>
"""

#: MathJax beside the pages, with the configuration nbconvert's own CDN default uses.
MATHJAX_DIR = "mathjax"
MATHJAX_URL = f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"


def _rel(target: Path, start: Path) -> str:
    return os.path.relpath(target, start).replace(os.sep, "/")


def mathjax_source() -> Path:
    """The folder of the bundled MathJax (``MathJax.js`` and its parts)."""
    try:
        import jupyter_server_mathjax
    except ImportError as exc:
        raise ImportError("the offline HTML export needs MathJax from the jupyter-server-mathjax "
                          "package: pip install -e . (or pip install jupyter-server-mathjax)"
                          ) from exc
    return Path(jupyter_server_mathjax.__file__).parent / "static"


def copy_mathjax(html_dir: Path) -> Path:
    """Copy the bundled MathJax to ``html_dir/mathjax`` (once: an existing copy of the same
    ``MathJax.js`` is kept); return the folder."""
    src, dst = mathjax_source(), html_dir / MATHJAX_DIR
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


def notebook_html(path: Path) -> str:
    """One executed notebook as an HTML page whose scripts all come from beside it."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", mathjax_url=MATHJAX_URL)
    body, _ = exporter.from_filename(str(path))
    return _CDN_SCRIPT.sub("", body)


def export_html(profile: str, claims: list[Claim] | None = None,
                out_dir: str | os.PathLike | None = None) -> Path:
    """Export each executed notebook of ``profile`` to HTML, plus an index page; return its path.

    Reads ``runs/<profile>/NN_*.ipynb`` (written by ``bnmem reproduce``; a failed notebook's
    ``NN_*.failed.ipynb`` too) and writes ``runs/<profile>/html/NN_*.html``,
    ``runs/<profile>/html/index.html`` with every notebook and its status in the last run (failures
    included), the claims table and every figure of ``figures/<profile>/``, and MathJax under
    ``html/mathjax/``. Without executed notebooks it raises :class:`FileNotFoundError` and
    writes nothing.
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
            rows, style=False,
            figure_href=lambda r: _rel(fig_dir / (r["figure"] + ".png"), html_dir)))
        parts.append("<p><small>Hover a row for its results key; <code>bnmem report</code> prints "
                     "the keys, and <code>claims.json</code> holds every row.</small></p>")
    parts += _figures_html(fig_dir, html_dir)
    index = html_dir / "index.html"
    atomic_write_text(index, _PAGE.format(title=f"bnmem report ({profile})", body="\n".join(parts),
                                          claims_css=CLAIMS_CSS, mathjax=MATHJAX_URL))
    return index


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


def figure_caption(name: str, meta: dict) -> str:
    """A figure's caption from its manifest entry: its title (when recorded) or name, then the
    notebook, profile and commit that made it."""
    title = meta.get("title") or name.split("_", 1)[-1].replace("_", " ")
    made = ", ".join(f"{k} {meta[k]}" for k in ("notebook", "profile", "commit") if meta.get(k))
    return f"{title} ({made})" if made else title


def _figures_html(fig_dir: Path, html_dir: Path) -> list[str]:
    figures = sorted(fig_dir.glob("*.png")) if fig_dir.is_dir() else []
    if not figures:
        return []
    manifest, parts = read_manifest(fig_dir), ["<h2>Figures</h2>"]
    for png in figures:
        src = _rel(png, html_dir)
        caption = f"{png.stem}: {figure_caption(png.stem, manifest.get(png.stem, {}))}"
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


def claims_latex(rows: list[dict], *, caption: str = "", label: str = "tab:bnmem-claims") -> str:
    """The claims table as a booktabs ``table``: claim (once per claim), the paper's statement,
    the setting, our number with its 95% interval, and the verdict; cells wrap."""
    lines = [r"% bnmem claims table: needs \usepackage{booktabs}",
             r"\begin{table}[htbp]", r"\centering", r"\scriptsize",
             r"\begin{tabular}{@{}p{0.18\linewidth}p{0.18\linewidth}p{0.18\linewidth}"
             r"p{0.18\linewidth}l@{}}", r"\toprule",
             r"claim & paper & setting & ours (95\% CI) & verdict \\", r"\midrule"]
    previous = None
    for r in rows:
        first = r["id"] != previous
        if first and previous is not None:
            lines.append(r"\addlinespace")
        previous = r["id"]
        cells = [rf"\textbf{{{tex_escape(r['id'])}}}: {tex_escape(r['claim'])}" if first else "",
                 tex_escape(r["paper"]) if first else "", tex_escape(r.get("setting") or ""),
                 tex_escape(r["ours"]), tex_escape(r["verdict"])]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}",
              rf"\caption{{{tex_escape(caption)}}}" if caption else "", rf"\label{{{label}}}",
              r"\end{table}", ""]
    return "\n".join(line for line in lines if line)


def figures_latex(fig_dir: Path) -> str:
    """One ``figure`` per PDF of ``fig_dir``: ``\\includegraphics`` under ``\\bnmemfigdir``
    (the figures' absolute path, unless the document defines it first) and the caption from
    the manifest."""
    pdfs = sorted(fig_dir.glob("*.pdf")) if fig_dir.is_dir() else []
    manifest = read_manifest(fig_dir)
    lines = [r"% bnmem figures: needs \usepackage{graphicx}; define \bnmemfigdir before "
             r"\input to move the PDFs",
             rf"\providecommand{{\bnmemfigdir}}{{{fig_dir.resolve().as_posix()}/}}"]
    for pdf in pdfs:
        caption = tex_with_math(figure_caption(pdf.stem, manifest.get(pdf.stem, {})))
        lines += [r"\begin{figure}[htbp]", r"\centering",
                  rf"\includegraphics[width=\linewidth]{{\bnmemfigdir {pdf.name}}}",
                  rf"\caption{{{caption}}}", rf"\label{{fig:bnmem-{pdf.stem.replace('_', '-')}}}",
                  r"\end{figure}"]
    return "\n".join(lines) + "\n"


def export_latex(profile: str, claims: list[Claim],
                 out_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Write ``runs/<profile>/latex/claims.tex`` and ``figures.tex`` (see the module docstring);
    return both paths. Without any results for the profile it raises
    :class:`FileNotFoundError` and writes nothing."""
    run_dir = runs_dir(profile, out_dir)
    if not any((run_dir / "results").glob("[0-9][0-9]_*.json")):
        raise FileNotFoundError(f"no results under {run_dir / 'results'}; run `bnmem reproduce "
                                f"--profile {profile}` first")
    latex_dir = run_dir / "latex"
    latex_dir.mkdir(parents=True, exist_ok=True)
    rows = claims_table(claims, profile, out_dir)
    table = latex_dir / "claims.tex"
    atomic_write_text(table, claims_latex(rows, caption=(
        f"The claims of arXiv 2605.24420 against our numbers (profile {profile}); intervals are "
        "95%.")))
    figures = latex_dir / "figures.tex"
    atomic_write_text(figures, figures_latex(figures_dir(profile, out_dir)))
    return table, figures
