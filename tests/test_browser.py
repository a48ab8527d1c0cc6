"""What a reader sees: notebooks 01 and 04 run with Run All in JupyterLab, in headless Chromium.

The test starts JupyterLab on 127.0.0.1 (a free port, a token, ``--no-browser``) over a temporary
folder holding copies of the two notebooks whose parameters cell sets ``profile = "smoke"`` (the
profile switch a reader would make; :func:`bnmem_utils.run.notebook.apply_profile`) and an output
folder inside the temporary folder, so nothing is written into the repository but the
screenshots. In Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright) it opens each
notebook, runs all cells from the Run menu and checks:

* no cell shows an error;
* each explorer's image is drawn on first display and is not blank (pixel variance of the
  rendered image);
* moving a control (a slider in 01, the sample in 04) changes both the image and the readout;
* 04's controls stay in step: a typed index moves the "most exposed" list with it (blank when
  the list does not hold it), an out-of-range index is named in the readout, not clamped, and
  the smoke readout says its numbers mean nothing;
* 04's claims table (``nb.claims()``) at 1024 px with the file browser open: no cell overflows;
* what a reader sees at 1024 px with the file browser open, in 01 and 04 as run and in 02, 04b and
  06 as executed headless and then opened (:data:`_NARROW`): no output wider than its output area
  (a table that would need scrolling sideways), no value broken across two lines (a
  ``.bnmem-value`` span, or a number in an explorer's readout or in text a notebook prints
  through ``nb.say``), and in 01 no display equation wider than its cell;
* 01's link to ``../docs/paper.md#the-theory-worked-out`` opens the document at that section, the
  heading at the top of the view (JupyterLab started at the folder that holds ``notebooks/`` and
  ``docs/``, as ``bnmem lab`` starts it at the repository root).

Every page runs with the network blocked: a request that is neither a file nor the test's own
JupyterLab server on 127.0.0.1 is aborted, and the test fails naming it.

Then notebooks 01 (formulas), 02, 04 (progress bars), 04b and 06 run headless (``bnmem
reproduce --profile smoke --only 01,02,04,04b,06 --html``), and every exported page must load with no failed request, no
console error, no "Math Processing Error" and no formula left as text (MathJax and its fonts
from beside the page), every image drawn, also after the export folder is moved elsewhere; and
the index page's claims table must fit 1024 px, and so must each notebook's page (the same
checks as in JupyterLab).

Screenshots (whole page and each explorer) are kept under ``runs/browser-screenshots/``; the
test prints the folder. Without Chromium or Playwright the test skips and says what to install.
Marked slow: about 5-11 minutes on 2 cores, depending on load.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from bnmem_utils.core.paths import project_root
from bnmem_utils.run.cli import lab_command

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
INSTALL = ("install them with: apt-get install -y chromium && pip install -e '.[test]' "
           "(Playwright drives Debian's /usr/bin/chromium; no browser download is needed)")
SHOTS = project_root() / "runs" / "browser-screenshots"
RUN_TIMEOUT_S = 240


def _skip_reason() -> str:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing; {INSTALL}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"playwright is not installed; {INSTALL}"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _smoke_copy(name: str, folder: Path, out_dir: Path) -> Path:
    """A copy of ``notebooks/<name>.ipynb`` whose parameters cell sets the smoke profile and an
    output folder: what a reader would type into the cell."""
    nb = json.loads((project_root() / "notebooks" / f"{name}.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    src = "".join(cell["source"])
    src, n1 = re.subn(r'^profile = "quick"', 'profile = "smoke"', src, flags=re.M)
    src, n2 = re.subn(r'^out_dir = ""', f"out_dir = {str(out_dir)!r}", src, flags=re.M)
    assert n1 == n2 == 1, f"{name}: parameters cell without the expected profile/out_dir lines"
    cell["source"] = src.splitlines(keepends=True)
    path = folder / f"{name}.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    return path


def _wait_until_serving(url: str, token: str, proc: subprocess.Popen, log, log_path: Path) -> None:
    """Wait (at most 90 s) for the Jupyter server at ``url`` to answer; fail with the end of its
    log if it exits or does not answer."""
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                log.flush()
                pytest.fail("JupyterLab did not start:\n" + log_path.read_text()[-3000:])
            time.sleep(0.5)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 over a temporary folder with the two smoke copies."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("lab")
    (root / "notebooks").mkdir()
    for name in ("01_theory", "04_lira"):
        _smoke_copy(name, root / "notebooks", root / "out")
    # the repository's layout: the notebooks link to ../docs/paper.md
    (root / "docs").mkdir()
    shutil.copy(project_root() / "docs" / "paper.md", root / "docs" / "paper.md")
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    notebook_settings = root / "settings" / "@jupyterlab" / "notebook-extension"
    notebook_settings.mkdir(parents=True)
    # every cell in the page (no windowing), so the explorers can be found without scrolling
    (notebook_settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MPLBACKEND", "BNMEM_HEADLESS", "BNMEM_ROOT")}
    env.update(JUPYTERLAB_SETTINGS_DIR=str(root / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(root / "runtime"), BNMEM_CACHE=str(root / "cache"))
    log = open(root / "jupyterlab.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(  # what `bnmem lab` runs (root folder, --allow-root as root)
        lab_command(["--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                     "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"],
                    root=root),
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, token, proc, log, root / "jupyterlab.log")
        yield {"url": url, "token": token, "root": root}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def chromium(lab):  # not "browser": pytest-playwright, when installed, owns that name
    if SHOTS.exists():
        shutil.rmtree(SHOTS)
    SHOTS.mkdir(parents=True)
    print(f"\nbrowser screenshots: {SHOTS}")
    with launched_chromium() as b:
        yield b


@contextlib.contextmanager
def launched_chromium():
    """Debian's Chromium driven by Playwright, closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _png_array(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float)


def _not_blank(png: bytes) -> float:
    """Pixel standard deviation of a PNG (0 for a blank image)."""
    return float(_png_array(png).std())


def _kernels_idle(lab, name: str | None = None) -> bool:
    """Every kernel idle, and (with ``name``) the notebook's own kernel started."""
    with urllib.request.urlopen(f"{lab['url']}/api/kernels?token={lab['token']}", timeout=5) as r:
        kernels = json.loads(r.read())
    if name is not None:
        with urllib.request.urlopen(f"{lab['url']}/api/sessions?token={lab['token']}",
                                    timeout=5) as r:
            sessions = json.loads(r.read())
        if not any(x.get("path", "").endswith(f"{name}.ipynb") and x.get("kernel")
                   for x in sessions):
            return False
    return bool(kernels) and all(k.get("execution_state") == "idle" for k in kernels)


def _accept_kernel_dialog(page) -> None:
    """JupyterLab may ask which kernel to start (a second notebook, a slow start): take the
    proposed one (the notebook's own, Python 3)."""
    dialog = page.locator(".jp-Dialog").filter(has_text="Select Kernel")
    if dialog.count() and dialog.first.is_visible():
        dialog.first.locator(".jp-Dialog-button.jp-mod-accept").click()


def _saved(page, lab, name: str) -> list[dict]:
    """Save the notebook (Ctrl+S) and return its code cells as saved: the notebook's model, not
    the page (JupyterLab renders only the cells near the viewport)."""
    page.keyboard.press("Control+s")
    time.sleep(1.0)
    nb = json.loads((lab["root"] / "notebooks" / f"{name}.ipynb").read_text())
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _errors(cells: list[dict]) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for c in cells for o in c.get("outputs", [])
            if o.get("output_type") == "error"]


def _watched_page(chromium, lab_url: str = "", width: int = 1400, height: int = 900):
    """A page that may load files and the test's own JupyterLab server and nothing else:
    every other request is aborted. Returns the page and a list that collects each blocked or
    failed request, console error and uncaught exception."""
    page = chromium.new_page(viewport={"width": width, "height": height})
    problems: list[str] = []

    def route(r):
        url = r.request.url
        if url.startswith("file:") or (lab_url and url.startswith(f"{lab_url}/")):
            r.continue_()
        else:
            problems.append(f"blocked: {url}")
            r.abort()

    page.route("**/*", route)
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} ({r.failure})"))
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    return page, problems


def _no_network(problems: list[str]) -> None:
    blocked = [p for p in problems if p.startswith("blocked:")]
    assert not blocked, f"requests outside this machine: {blocked}"


def _run_all(page, lab, name: str):
    """Open a notebook, run all its cells from the Run menu, wait until the saved copy shows
    every code cell executed and the kernel is idle; fail on the first error output."""
    # a workspace of its own: only this notebook open, nothing restored from another test
    page.goto(f"{lab['url']}/lab/workspaces/{name}/tree/notebooks/{name}.ipynb"
              f"?reset&token={lab['token']}")
    page.wait_for_selector(".jp-NotebookPanel:visible .jp-CodeCell", timeout=90_000)
    page.wait_for_function("!document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
                           ".jp-Spinner')", timeout=90_000)
    deadline = time.time() + 90
    while time.time() < deadline:  # the kernel starts with the notebook
        _accept_kernel_dialog(page)
        try:
            if _kernels_idle(lab, name):
                break
        except OSError:
            pass
        time.sleep(0.5)
    else:
        page.screenshot(path=str(SHOTS / f"{name}_no_kernel.png"))
        pytest.fail(f"{name}: its kernel did not start")
    page.locator(".jp-NotebookPanel:visible .jp-Notebook").first.focus()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    deadline = time.time() + RUN_TIMEOUT_S
    while time.time() < deadline:
        time.sleep(3.0)
        _accept_kernel_dialog(page)
        cells = _saved(page, lab, name)
        if _errors(cells):
            break
        if all(c.get("execution_count") for c in cells) and _kernels_idle(lab):
            return
    page.screenshot(path=str(SHOTS / f"{name}_failed.png"))
    pytest.fail(f"{name}: Run All did not finish within {RUN_TIMEOUT_S} s or failed; errors: "
                f"{_errors(_saved(page, lab, name))}")


def _assert_no_errors(page, lab, name: str):
    cells = _saved(page, lab, name)
    assert all(c.get("execution_count") for c in cells), f"{name}: not every cell ran"
    assert not _errors(cells), f"{name}: error outputs: {_errors(cells)}"


def _explorer(page, name: str):
    ex = page.locator(".bnmem-explorer").first
    ex.wait_for(state="visible", timeout=30_000)
    ex.scroll_into_view_if_needed()
    img = ex.locator("img.bnmem-figure")
    page.wait_for_function("(el) => el.complete && el.naturalWidth > 0", arg=img.element_handle(),
                           timeout=30_000)
    return ex, img


def _wait_changed(page, locator, before: str, what: str, timeout_s: float = 60):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        now = locator.inner_text()
        if now != before:
            return now
        time.sleep(0.3)
    pytest.fail(f"{what} did not change")


def th_options(name: str) -> tuple:
    from bnmem_utils.analyses.theory import EXPLORER_OPTIONS

    return EXPLORER_OPTIONS[name]


def _image_src(img) -> str:
    return img.get_attribute("src") or ""


def _open_explorer(lab, chromium, name: str):
    """Run All on ``name`` in a fresh page (network blocked), check it holds no error, and
    return the page, the explorer, its image, its readout and the page's problems."""
    page, problems = _watched_page(chromium, lab["url"])
    _run_all(page, lab, name)
    _assert_no_errors(page, lab, name)
    ex, img = _explorer(page, name)
    readout = ex.locator(".bnmem-readout")
    return page, ex, img, readout, problems


def _wait_image_changed(img, first_src: str, what: str) -> None:
    """Wait up to 30 s for the explorer's image to be replaced; fail naming ``what``."""
    deadline = time.time() + 30
    while _image_src(img) == first_src and time.time() < deadline:
        time.sleep(0.3)
    assert _image_src(img) != first_src, f"{what}'s image did not change"


def test_theory_explorer_in_jupyterlab(lab, chromium):
    page, ex, img, readout, problems = _open_explorer(lab, chromium, "01_theory")
    first_text = readout.inner_text()
    assert "(gamma/sigma_B)^2 = 4" in first_text and "measured 4 " in first_text, first_text
    ex.screenshot(path=str(SHOTS / "01_explorer_first.png"))
    page.screenshot(path=str(SHOTS / "01_page.png"))
    first_png = img.screenshot()
    assert _not_blank(first_png) > 10, "the explorer's first image is blank"
    first_src = _image_src(img)
    # Move the gamma slider one step to the right (keyboard on the focused handle): 2 -> 2.5.
    handle = ex.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press("ArrowRight")
    if readout.inner_text() == first_text:
        time.sleep(3)
    if readout.inner_text() == first_text:  # no keyboard support: drag the handle instead
        box = handle.bounding_box()
        track = ex.locator(".noUi-target").first.bounding_box()
        step = track["width"] / (len(th_options("gamma")) - 1)
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] / 2 + step, box["y"] + box["height"] / 2, steps=5)
        page.mouse.up()
    text = _wait_changed(page, readout, first_text, "the 01 explorer's readout")
    assert "gamma 2.5," in text and "(gamma/sigma_B)^2 = 6.25" in text, text
    assert "measured 6.25 " in text, text  # the chart's numbers match the sliders exactly
    _wait_image_changed(img, first_src, "the 01 explorer")
    second_png = img.screenshot()
    assert _not_blank(second_png) > 10
    ex.screenshot(path=str(SHOTS / "01_explorer_moved.png"))
    _fits_1024_px(page, "01_theory", equations=True)
    page.close()
    _no_network(problems)


_OVERLAPS = """(table) => {
  const bad = [];
  for (const td of table.querySelectorAll('td, th')) {
    if (td.scrollWidth > td.clientWidth + 1) bad.push('overflows: ' + td.innerText.slice(0, 40));
  }
  const box = table.parentElement.getBoundingClientRect();
  if (table.getBoundingClientRect().right > box.right + 1) bad.push('table wider than its box');
  return bad;
}"""


def _exposed_text(ex) -> str:
    """The text of the option the "most exposed (BN)" list shows ("" when blank)."""
    select = ex.locator(".widget-dropdown", has_text="most exposed").locator("select")
    text = select.evaluate("(s) => s.selectedIndex < 0 ? '' : s.options[s.selectedIndex].text")
    return text.replace("\xa0", " ")  # ipywidgets writes the options' spaces as no-break ones


def _type_index(ex, value: int) -> None:
    box = ex.locator(".widget-inline-hbox", has_text="sample index").locator("input")
    box.fill(str(value))
    box.press("Enter")


def test_privacy_explorer_in_jupyterlab(lab, chromium):
    page, ex, img, readout, problems = _open_explorer(lab, chromium, "04_lira")
    first_text = readout.inner_text()
    assert "sample #" in first_text and "BatchNorm" in first_text and "no norm" in first_text
    assert "its numbers mean nothing" in first_text  # the smoke profile says so
    assert "exposure: the mean" in first_text  # the terms, defined where they are shown
    first = int(re.search(r"sample #(\d+)", first_text)[1])
    assert _exposed_text(ex).startswith(f"#{first} ")
    ex.screenshot(path=str(SHOTS / "04_explorer_first.png"))
    first_png = img.screenshot()
    assert _not_blank(first_png) > 10, "the privacy explorer's first image is blank"
    first_src = _image_src(img)
    # Type the index of another listed sample: the list follows it.
    select = ex.locator(".widget-dropdown", has_text="most exposed").locator("select")
    listed = [int(m) for m in re.findall(r"^#(\d+)\s", "\n".join(
        select.locator("option").all_inner_texts()), flags=re.M)]
    other = next(i for i in listed if i != first)
    _type_index(ex, other)
    text = _wait_changed(page, readout, first_text, "the 04 explorer's readout")
    assert f"sample #{other}:" in text, text
    _wait_image_changed(img, first_src, "the 04 explorer")
    assert _exposed_text(ex).startswith(f"#{other} "), _exposed_text(ex)
    assert _not_blank(img.screenshot()) > 10
    ex.screenshot(path=str(SHOTS / "04_explorer_moved.png"))
    # An index the list does not hold: the list goes blank, the view follows.
    unlisted = next(i for i in range(len(listed) + 1) if i not in listed)
    src = _image_src(img)
    _type_index(ex, unlisted)
    text = _wait_changed(page, readout, text, "the 04 explorer's readout")
    assert f"sample #{unlisted}:" in text and _exposed_text(ex) == "", _exposed_text(ex)
    _wait_image_changed(img, src, "the 04 explorer")  # the image follows its readout
    # Out of range: said in the readout, not clamped; the view stays.
    src = _image_src(img)
    _type_index(ex, 999_999)
    text = _wait_changed(page, readout, text, "the 04 explorer's readout")
    assert "sample index 999999 is out of range" in text, text
    time.sleep(2)
    assert _image_src(img) == src
    ex.screenshot(path=str(SHOTS / "04_explorer_out_of_range.png"))
    page.screenshot(path=str(SHOTS / "04_page.png"))
    _claims_fit_1024_px(page)
    _fits_1024_px(page, "04_lira")
    page.close()
    _no_network(problems)


def _narrow(page) -> None:
    """A laptop's view: 1024 x 800 px with JupyterLab's file browser open."""
    page.set_viewport_size({"width": 1024, "height": 800})
    if not page.locator(".jp-FileBrowser").first.is_visible():
        page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="filebrowser"]').click()
    page.locator(".jp-FileBrowser").first.wait_for(state="visible", timeout=10_000)
    page.wait_for_timeout(500)


#: What does not fit the open notebook: each output wider than its output area (a table a reader
#: would scroll sideways), each value broken over two lines (a ``.bnmem-value`` span, or a number
#: standing alone, not inside a name or a path, in an explorer's readout or a printed text) and
#: each display equation wider than its cell.
_NARROW = r"""() => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)') || document.body;
  const lines = (rects) => new Set([...rects].map(r => Math.round(r.top))).size;
  const wide = [], broken = [], equations = [];
  for (const o of nb.querySelectorAll('.jp-OutputArea-output')) {
    if (o.scrollWidth > o.clientWidth + 1)
      wide.push(`${o.scrollWidth} > ${o.clientWidth} px: ${o.innerText.slice(0, 60)}`);
  }
  for (const v of nb.querySelectorAll('.bnmem-value'))
    if (lines(v.getClientRects()) > 1) broken.push(v.innerText);
  for (const pre of nb.querySelectorAll('.bnmem-readout pre, pre.bnmem-text')) {
    const walk = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      for (const m of n.data.matchAll(/(?<![\w.\/-])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w\/])/g)) {
        const r = document.createRange();
        r.setStart(n, m.index);
        r.setEnd(n, m.index + m[0].length);
        if (lines(r.getClientRects()) > 1) broken.push(m[0]);
      }
    }
  }
  const displayed = '.jp-MarkdownOutput mjx-container[display="true"], .jp-MarkdownOutput .MathJax_Display';
  for (const eq of nb.querySelectorAll(displayed)) {
    const cell = eq.closest('.jp-MarkdownOutput').getBoundingClientRect();
    if (eq.scrollWidth > eq.clientWidth + 1 || eq.getBoundingClientRect().right > cell.right + 1)
      equations.push(`${eq.scrollWidth} > ${eq.clientWidth} px: ${eq.innerText.slice(0, 40)}`);
  }
  return {wide, broken, equations,
          shown: nb.querySelectorAll('.jp-OutputArea-output').length,
          texts: nb.querySelectorAll('pre.bnmem-text').length,
          typeset: nb.querySelectorAll(displayed).length};
}"""


def _fits_1024_px(page, name: str, *, equations: bool = False) -> dict:
    """At 1024 px with the file browser open, ``name``'s outputs fit its width and no value
    breaks over two lines (:data:`_NARROW`); with ``equations``, its display equations are
    typeset and fit too. Screenshots the top of the notebook."""
    _narrow(page)
    if equations:
        page.wait_for_function("document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) "
                               ".jp-MarkdownOutput mjx-container[display=\"true\"]').length > 1",
                               timeout=60_000)
        page.wait_for_timeout(1000)  # the last formulas and fonts
    found = page.evaluate(_NARROW)
    page.screenshot(path=str(SHOTS / f"{name}_1024.png"))
    assert found["shown"] > 0, f"{name}: no output shown"
    assert found["texts"] > 0, f"{name}: no printed text shown through nb.say"
    assert found["wide"] == [], f"{name}: outputs wider than the notebook at 1024 px: {found['wide']}"
    assert found["broken"] == [], f"{name}: values broken over two lines: {found['broken']}"
    if equations:
        assert found["typeset"] > 1 and found["equations"] == [], \
            f"{name}: display equations wider than their cell: {found['equations']}"
    return found


def _claims_fit_1024_px(page) -> None:
    """The notebook's claims table (what nb.claims() shows) at 1024 px with the file browser
    open: no cell runs into the next, nothing is cut."""
    _narrow(page)
    table = page.locator("table.bnmem-claims").first
    table.wait_for(state="attached", timeout=30_000)
    table.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    assert table.evaluate(_OVERLAPS) == []
    assert "…" not in table.inner_text()
    table.screenshot(path=str(SHOTS / "04_claims_1024.png"))
    page.screenshot(path=str(SHOTS / "04_claims_1024_page.png"))


def test_a_notebook_link_opens_in_jupyterlab(lab, chromium):
    """01's link to docs/paper.md#the-theory-worked-out opens the document at that section
    (JupyterLab started at the root), at 1024 px with the file browser open."""
    page, problems = _watched_page(chromium, lab["url"])
    page.goto(f"{lab['url']}/lab/workspaces/links/tree/notebooks/01_theory.ipynb"
              f"?reset&token={lab['token']}")
    # JupyterLab rewrites a relative href to its own URL; the text names the file
    link = page.locator(".jp-RenderedMarkdown a", has_text="docs/paper.md").first
    link.wait_for(state="visible", timeout=90_000)
    assert (link.get_attribute("href") or "").endswith("#the-theory-worked-out")
    _narrow(page)
    link.click()
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="paper.md")
    tab.wait_for(state="visible", timeout=30_000)
    page.wait_for_timeout(1500)
    errors = page.locator(".jp-Dialog", has_text=re.compile("error|not found", re.I))
    assert errors.count() == 0, errors.first.inner_text()
    shown = page.locator(".jp-MainAreaWidget:visible").last.inner_text()
    headings = ("The paper, its claims", "The claims", "The theory, worked out", "Definitions")
    assert any(h in shown for h in headings), shown[:500]
    doc = page.locator(".jp-MainAreaWidget:visible").last
    heading = doc.locator("h2", has_text="The theory, worked out").first
    top, box = heading.bounding_box()["y"], doc.bounding_box()
    page.screenshot(path=str(SHOTS / "01_link_opened.png"))
    assert box["y"] <= top <= box["y"] + 120, \
        f"the link did not scroll to its section: heading at {top:.0f} px, document at {box['y']:.0f} px"
    page.close()
    _no_network(problems)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Notebooks 01 (formulas), 02, 04 (progress bars), 04b and 06 run headless on the smoke
    profile and exported to HTML with the claims table, as `bnmem reproduce --html` does."""
    if _skip_reason():
        pytest.skip(_skip_reason())
    out = tmp_path_factory.mktemp("export")
    env = {k: v for k, v in os.environ.items() if k not in ("BNMEM_ROOT",)}
    env.update(MPLBACKEND="Agg", BNMEM_CACHE=str(out / "cache"))
    run = subprocess.run([sys.executable, "-m", "bnmem_utils.run.cli", "reproduce", "--profile",
                          "smoke", "--only", "01,02,04,04b,06", "--out", str(out), "--html"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Executing Cell" not in run.stdout + run.stderr  # the summary, not a cell log
    return out / "runs" / "smoke" / "html", run.stdout


#: Every formula typeset and every font loaded: MathJax's queue empty, no message box left.
_TYPESET = ("window.MathJax && MathJax.Hub && MathJax.Hub.queue && MathJax.Hub.queue.pending === 0"
            " && !MathJax.Hub.queue.running && !document.getElementById('MathJax_Message')"
            "?.offsetParent")
_PAGE_STATE = """() => ({
  typeset: document.querySelectorAll('.MathJax, .MathJax_Display').length,
  mathErrors: (document.body.innerText.match(/Math Processing Error/g) || []).length,
  raw: ([...document.querySelectorAll('.jp-RenderedMarkdown')].map(e => e.innerText)
        .join('\\n').match(/\\$[^$\\n]{1,60}\\$/g) || []),
  images: [...document.images].length,
  broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
})"""


def _check_page(chromium, path: Path, width: int = 1280) -> dict:
    """Open an exported page offline, wait for MathJax and the images; fail on any blocked or
    failed request, console error, "Math Processing Error", formula left as text or image not
    drawn. Returns what the page holds (typeset formulas, images)."""
    page, problems = _watched_page(chromium, width=width)
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function(_TYPESET, timeout=60_000)
    page.wait_for_timeout(500)  # a font or image requested last, reported late
    state = page.evaluate(_PAGE_STATE)
    page.screenshot(path=str(SHOTS / f"html_{path.parent.name}_{path.stem}.png"))
    page.close()
    assert not problems, f"{path.name}: {problems}"
    assert state["mathErrors"] == 0, f"{path.name}: Math Processing Error x{state['mathErrors']}"
    assert state["raw"] == [], f"{path.name}: formulas left as text: {state['raw'][:5]}"
    assert state["broken"] == [], f"{path.name}: images not drawn: {state['broken']}"
    return state


def test_exported_pages_load_offline_without_errors(exported, chromium):
    html_dir, _ = exported
    pages = sorted(html_dir.glob("*.html"))
    assert [p.name for p in pages] == ["01_theory.html", "02_forced_memorization.html",
                                       "04_lira.html", "04b_confound.html", "06_report.html",
                                       "index.html"]
    states = {p.stem: _check_page(chromium, p) for p in pages}
    assert states["01_theory"]["typeset"] > 50  # the theory's formulas, each one typeset
    assert states["index"]["images"] >= 4  # 01's and 04's figures
    text = (html_dir / "04_lira.html").read_text()
    # the progress bars as their last frame, printed as text by the runner's bars: no widget
    assert "12 banks (48 models): 100%|##########| 48/48" in text  # 6 arms x 2 replicates
    assert "widget-view" not in text


def test_exported_pages_fit_1024_px(exported, chromium):
    """Each exported notebook at 1024 px: no output wider than its area, no value or printed
    number broken over two lines, no display equation wider than its cell (:data:`_NARROW`)."""
    html_dir, _ = exported
    for path in sorted(html_dir.glob("0*.html")):
        page, problems = _watched_page(chromium, width=1024, height=800)
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_function(_TYPESET, timeout=60_000)
        found = page.evaluate(_NARROW)
        page.screenshot(path=str(SHOTS / f"html_{path.stem}_1024.png"))
        page.close()
        assert not problems, f"{path.name}: {problems}"
        assert found["shown"] > 0 and found["texts"] > 0, f"{path.name}: {found}"
        assert found["wide"] == [], f"{path.name}: outputs wider than the page: {found['wide']}"
        assert found["broken"] == [], f"{path.name}: values broken over two lines: {found['broken']}"
        assert found["equations"] == [], f"{path.name}: equations too wide: {found['equations']}"
        if path.stem == "01_theory":
            assert found["typeset"] > 1, "01's display equations are not typeset"


def test_exported_folder_moves(exported, chromium):
    """The export folder moved away from its run: every page still shows every image."""
    html_dir, _ = exported
    moved = html_dir.parent.parent.parent / "moved" / "report"
    moved.parent.mkdir()
    shutil.move(html_dir, moved)
    try:
        assert _check_page(chromium, moved / "index.html")["images"] >= 4
        assert _check_page(chromium, moved / "01_theory.html")["typeset"] > 50
    finally:
        shutil.move(moved, html_dir)


def test_exported_report_table_fits_1024_px(exported, chromium):
    html_dir, stdout = exported
    assert stdout.count("claim  key") <= 1  # the claims table printed once
    page, problems = _watched_page(chromium, width=1024)
    page.goto((html_dir / "index.html").as_uri())
    table = page.locator("table.bnmem-claims")
    assert table.evaluate(_OVERLAPS) == []
    table.screenshot(path=str(SHOTS / "html_report_1024.png"))
    page.close()
    _no_network(problems)


@pytest.mark.parametrize("name", ["02_forced_memorization", "04b_confound", "06_report"])
def test_executed_notebooks_fit_1024_px(lab, exported, chromium, name):
    """A notebook executed headless (``bnmem reproduce``) and then opened in JupyterLab, as a
    reader opens it: not trusted, so only the inline styles of its outputs hold. At 1024 px with
    the file browser open its tables fit and its values are whole (:func:`_fits_1024_px`)."""
    html_dir, _ = exported
    shutil.copy(html_dir.parent / f"{name}.ipynb", lab["root"] / "notebooks" / f"{name}.ipynb")
    page, problems = _watched_page(chromium, lab["url"], width=1024, height=800)
    page.goto(f"{lab['url']}/lab/workspaces/{name}/tree/notebooks/{name}.ipynb"
              f"?reset&token={lab['token']}")
    page.wait_for_selector(".jp-NotebookPanel:visible .jp-OutputArea-output", timeout=90_000)
    _accept_kernel_dialog(page)
    _fits_1024_px(page, name)
    if name == "06_report":  # the summary's values and the claims table's
        assert page.locator("table.bnmem-summary .bnmem-value").count() > 10
    page.close()
    _no_network(problems)
