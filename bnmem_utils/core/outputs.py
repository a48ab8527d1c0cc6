"""A notebook's outputs written aside and promoted together, and the figures' manifest.

Under the runner a notebook writes nothing where a previous run's outputs are: its figures (PDF,
PNG, CSV and their manifest entries) go to the run's staging folder,
``runs/<profile>/.staging/<run id>/<notebook>/figures/`` (``$BNMEM_STAGING``, read by
:class:`bnmem_utils.run.notebook.NotebookContext`), its executed copy to the same staging folder and
its results to ``results/<notebook>.pending.json``. Only when the notebook succeeded does the
runner promote them, all in one :class:`Promotion`: every file that has to be written (the
merged ``manifest.json`` and ``manifest.md``, the stamped results, ``summary.json``) is first
written completely beside its final name, and only then is each renamed over the old one, with
Ctrl-C held back until the last rename. An interrupt or a full disk (any ``OSError`` while
writing) therefore leaves either every output of the previous run or every output of the new
one, never a mix; a failed write is reported as an :class:`OutputError`, one line naming the
path.

A figure the notebook saved in an earlier run but not in this one leaves the manifest (and its
files go) with the promotion: ``runs/<profile>/figures/`` holds one run's figures of each notebook.

The command line's text tables are laid out here too (:func:`aligned`, :func:`truncate`).
"""

from __future__ import annotations

import contextlib
import errno
import html
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from bnmem_utils.core.cache import promote, temp_prefix

STAGING = ".staging"
MANIFEST = "manifest.json"
MANIFEST_MD = "manifest.md"


class OutputError(Exception):
    """An output could not be written (full disk, quota, permissions); the message is one line
    naming the path, and the previous good outputs are all still in place."""

    def __init__(self, path: str | os.PathLike, exc: OSError):
        reason = exc.strerror or str(exc) or type(exc).__name__
        super().__init__(f"cannot write {path}: {reason}; every output of the previous good run "
                         "is kept")
        self.path, self.errno = str(path), exc.errno


#: How a failed write reads in a kernel's exception: a cache record's
#: (:func:`bnmem_utils.core.cache.write`: torch's own words after what to do), the kernel's own
#: :class:`OutputError`, or an ``OSError``'s ``[Errno N] reason: 'path'``.
_KERNEL_ERRORS = (
    re.compile(r"\[Errno (?P<errno>\d+)\] cannot write the cache record (?P<path>.+?) "
               r"\((?P<free>\d+ MiB free there); (?P<todo>[^)]*)\): .*"),
    re.compile(r"cannot write (?P<path>.+?): (?P<reason>.+?); every output of the previous good "
               r"run is kept"),
    re.compile(r"\[Errno (?P<errno>\d+)\] (?P<reason>.*?)(?:: '(?P<path>.+)')?"))


def kernel_output_error(text: str, where: str | os.PathLike) -> OutputError:
    """The :class:`OutputError` of a write that failed in a notebook's kernel, from its
    exception's ``text``: the path it names and the OS error in words (a cache record's with
    the space left and what to do, torch's own words left out), else ``where`` (the notebook's
    staging folder) and the whole text; one line, no errno, no second path."""
    text = " ".join(text.split())
    for pattern in _KERNEL_ERRORS:
        if m := pattern.fullmatch(text):
            found = m.groupdict()
            code = int(found.get("errno") or errno.ENOSPC)
            reason = found.get("reason") or (f"{os.strerror(code).lower()} ({found['free']}); "
                                             f"{found['todo']}")
            return OutputError(m["path"] or where, OSError(code, reason))
    return OutputError(where, OSError(errno.ENOSPC, text))


def staging_folder(runs_dir: Path, run_id: str, notebook: str) -> Path:
    """The (new, empty) folder where one notebook of run ``run_id`` writes its outputs aside."""
    folder = runs_dir / STAGING / run_id / notebook
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "figures").mkdir(parents=True)
    return folder


def discard_staging(runs_dir: Path, run_id: str = "") -> None:
    """Remove the staging folder of run ``run_id`` (of every run when ``""``: what a killed run
    left; the output folder's lock guarantees no other run is using one)."""
    root = runs_dir / STAGING
    shutil.rmtree(root / run_id if run_id else root, ignore_errors=True)
    with contextlib.suppress(OSError):
        root.rmdir()  # only when empty


@contextlib.contextmanager
def held_interrupt() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) and SIGTERM back for the duration of the block; one that arrived
    meanwhile is raised again when the block ends, to the handler it would have met (SIGINT's:
    :class:`KeyboardInterrupt`). Outside the main thread (where no signal handler can be set)
    the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.default_int_handler
                          if sig == signal.SIGINT else signal.SIG_DFL)
    if caught:
        signal.raise_signal(caught[0])


class Promotion:
    """Files to put in place together: :meth:`write` (text), :meth:`move` (a staged file) and
    :meth:`remove` (files or folders), done by :meth:`commit` as the module docstring says."""

    def __init__(self) -> None:
        self.texts: list[tuple[Path, str]] = []
        self.moves: list[tuple[Path, Path]] = []
        self.removals: list[Path] = []

    def write(self, dst: str | os.PathLike, text: str) -> None:
        self.texts.append((Path(dst), text))

    def move(self, src: str | os.PathLike, dst: str | os.PathLike) -> None:
        self.moves.append((Path(src), Path(dst)))

    def remove(self, *paths: str | os.PathLike) -> None:
        self.removals.extend(Path(p) for p in paths)

    def _prepare(self) -> list[tuple[Path, Path]]:
        """Every new file complete beside its final name: ``[(ready file, final name)]``."""
        ready: list[tuple[Path, Path]] = []
        try:
            for dst, text in self.texts:
                ready.append((_beside(dst, lambda tmp, text=text: tmp.write_text(text)), dst))
            for src, dst in self.moves:
                if _same_device(src, dst):
                    ready.append((src, dst))
                else:  # another file system: a copy beside the target, then a rename
                    ready.append((_beside(dst, lambda tmp, src=src: shutil.copyfile(src, tmp)), dst))
        except BaseException:
            for tmp, dst in ready:
                if (tmp, dst) not in self.moves:
                    tmp.unlink(missing_ok=True)
            raise
        return ready

    def commit(self) -> None:
        """Write everything aside, then rename it all into place and remove what is to go.

        :class:`OutputError` when a file cannot be written (nothing is then changed: the renames,
        which need no space, come after every write); a Ctrl-C during the commit is raised after
        it."""
        with held_interrupt():
            ready = self._prepare()
            for i, (tmp, dst) in enumerate(ready):
                try:
                    promote(tmp, dst)
                except OSError as exc:
                    for left, _ in ready[i:]:
                        if (left, _) not in self.moves:
                            left.unlink(missing_ok=True)
                    raise OutputError(dst, exc) from None
            for path in self.removals:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)


def publish_folder(src: Path, dst: Path, extra: Mapping[str, str] | None = None) -> int:
    """Replace the folder ``dst`` by a copy of ``src`` (hidden files left out) and the files
    ``extra`` names (``{name: text}``); the number of files in it. The copy is made beside
    ``dst`` and swapped in by two renames, so a failure or an interrupt leaves the old folder
    whole; :class:`OutputError` naming ``dst``."""
    tmp, old = dst.with_name(f".{dst.name}.publishing"), dst.with_name(f".{dst.name}.replaced")
    with held_interrupt():
        for leftover in (tmp, old):
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(".*"))
            for name, text in (extra or {}).items():
                (tmp / name).write_text(text)
            if dst.exists():
                os.replace(dst, old)
            os.replace(tmp, dst)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not dst.exists():
                os.replace(old, dst)
            raise OutputError(dst, exc) from None
        shutil.rmtree(old, ignore_errors=True)
    return sum(1 for path in dst.rglob("*") if path.is_file())


def _same_device(src: Path, dst: Path) -> bool:
    """Whether ``src`` can be renamed to ``dst`` (one file system); creates ``dst``'s folder."""
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        return os.stat(src).st_dev == os.stat(dst.parent).st_dev
    except OSError as exc:
        raise OutputError(dst, exc) from None


def _beside(dst: Path, fill) -> Path:
    """A temporary file beside ``dst`` filled by ``fill(path)``; :class:`OutputError` naming
    ``dst`` (and no file left) when that fails."""
    tmp = None
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=temp_prefix(dst.name), suffix=".tmp", dir=dst.parent)
        os.close(fd)
        tmp = Path(name)
        fill(tmp)
        return tmp
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise OutputError(dst, exc) from None


# --------------------------------------------------------------------------------------------
# The figure manifest
# --------------------------------------------------------------------------------------------


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_manifest(folder: Path) -> dict[str, dict]:
    """``{figure: entry}`` of ``folder/manifest.json``; ``{}`` when missing or damaged, an entry
    that is no object left out (the runner rebuilds a damaged manifest first:
    :func:`rebuild_manifest`)."""
    manifest = {k: v for k, v in read_json(folder / MANIFEST).items() if isinstance(v, dict)}
    for old in manifest.values():  # entries written before the manifest dropped wall-clock times
        old.pop("created", None)
    return manifest


def manifest_problem(folder: Path) -> str:
    """Why ``folder``'s manifest cannot be merged into (``""``: it can): it is damaged (no JSON
    object of objects), or missing beside figures."""
    path = folder / MANIFEST
    if not path.exists():
        return f"{path} is missing beside figures" if any(folder.glob("[0-9]*_*.png")) else ""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path} is damaged ({exc})"
    if not isinstance(data, dict) or not all(isinstance(e, dict) for e in data.values()):
        return f"{path} is damaged (not a JSON object of figure entries)"
    return ""


def rebuild_manifest(folder: Path, results: Mapping[str, dict]) -> dict[str, dict]:
    """Write ``folder``'s manifest again from the figure files there and each notebook's results
    (``{notebook: results payload}``, whose meta holds the profile, parameters and commit the
    figures were made with); titles are lost, and each entry says ``"rebuilt": true``."""
    manifest: dict[str, dict] = {}
    order = {".pdf": 0, ".png": 1, ".csv": 2}
    for path in sorted(folder.glob("[0-9]*_*.*"), key=lambda p: (p.stem, order.get(p.suffix, 3))):
        if path.suffix in order:
            notebook = next((nb for nb in results if nb.split("_")[0] == path.stem.split("_")[0]), "")
            meta = results.get(notebook, {}).get("meta", {})
            manifest.setdefault(path.stem, {
                "figure": path.stem, "title": "", "notebook": notebook,
                "profile": meta.get("profile", ""), "parameters": meta.get("parameters", {}),
                "commit": meta.get("commit", ""), "files": [], "rebuilt": True,
            })["files"].append(path.name)
    promotion = Promotion()
    for file, text in manifest_texts(manifest).items():
        promotion.write(folder / file, text)
    promotion.commit()
    return manifest


def manifest_texts(manifest: Mapping[str, dict]) -> dict[str, str]:
    """The contents of ``manifest.json`` and ``manifest.md`` for ``manifest`` (sorted by name)."""
    manifest = dict(sorted(manifest.items()))
    return {MANIFEST: json.dumps(manifest, indent=1, default=str) + "\n",
            MANIFEST_MD: manifest_markdown(manifest)}


def manifest_markdown(manifest: Mapping[str, dict]) -> str:
    """The manifest as a Markdown table: figure, notebook, profile, commit, the data sets read
    (name and digest), parameters, and the figure's one-sentence description (a ``|`` in a cell
    escaped, so that ``$|\\gamma|/\\sigma$`` stays one cell and reads as written)."""
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    lines = ["# Figure manifest", "",
             "| figure | notebook | profile | commit | data | parameters | description |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in manifest.items():
        params = ", ".join(f"{k}={v}" for k, v in e.get("parameters", {}).items()
                           if k != "out_dir")
        data = ", ".join(f"{k} {v}" for k, v in sorted((e.get("data") or {}).items()))
        files = e.get("files") or [f"{name}.png"]  # a table saved alone links its CSV
        link = next((f for f in files if f.endswith(".png")), files[-1])
        lines.append(f"| [{name}]({link}) | {e.get('notebook', '')} | {e.get('profile', '')} | "
                     f"{e.get('commit', '')} | {cell(data)} | {cell(params)} | "
                     f"{cell(e.get('description', ''))} |")
    return "\n".join(lines) + "\n"


def promote_figures(promotion: Promotion, staged: Path, folder: Path, notebook: str) -> None:
    """Add to ``promotion`` the figures ``notebook`` staged in ``staged`` (files and manifest
    entries) and the merged manifest of ``folder``; the notebook's figures and files of an
    earlier run that this run did not make leave the manifest and the folder."""
    new = read_manifest(staged)
    manifest = read_manifest(folder)
    kept_files = {f for entry in new.values() for f in entry.get("files", [])}
    old = [name for name, entry in manifest.items() if entry.get("notebook") == notebook]
    if not new and not old:
        return  # no figure now, none before: the manifest stays as it is
    for name in old:  # the new run's entry of that name, if any, replaces it below
        promotion.remove(*(folder / f for f in manifest.pop(name).get("files", [])
                           if f not in kept_files and "/" not in f))
    for name, entry in new.items():
        for file in entry.get("files", []):
            promotion.move(staged / file, folder / file)
        manifest[name] = entry
    for file, text in manifest_texts(manifest).items():
        promotion.write(folder / file, text)


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """One line per row, every column but the last padded to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
            for row in rows]


def breakable(text: str) -> str:
    """``text`` escaped for HTML, a line break allowed after each ``_`` or ``/`` that a letter
    follows: a long key or path wraps inside a narrow table cell instead of widening it."""
    return re.sub(r"([_/])(?=[A-Za-z])", r"\1<wbr>", html.escape(str(text)))


def text_html(text: str, style: str = "", cls: str = "") -> str:
    """Plain text as HTML: its lines as written, wrapped only at spaces (JupyterLab's own CSS
    breaks an output's ``<pre>`` anywhere, a number included)."""
    klass = f" class='{cls}'" if cls else ""
    return (f"<pre{klass} style='margin:0;white-space:pre-wrap;word-break:normal;{style}'>"
            f"{html.escape(text)}</pre>")


def value_html(text: str) -> str:
    """A value with its interval (``-0.87 [-13.3, 11.6] pt``) as one unbreakable unit of HTML."""
    return f'<span class="bnmem-value" style="white-space:nowrap">{html.escape(str(text))}</span>'
