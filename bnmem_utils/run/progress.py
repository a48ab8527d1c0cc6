"""The live progress line of ``bnmem reproduce``: how a kernel's progress bars reach the terminal.

The runner names a state file per notebook in the kernel's ``$BNMEM_PROGRESS``. There
:func:`install` (called by :func:`bnmem_utils.start`) makes ``tqdm.auto.tqdm``, which every bar
of the package is made from (banks and grids in model-epochs or runs), a :class:`StateBar`: it
draws nothing, so no widget is saved in the executed notebook, and writes its count to the state
file (:class:`StateFile`: JSON, at most once a second, atomically), then prints its last frame
into the notebook's output when it closes. Without the variable (JupyterLab, a test) nothing
changes: the bars are tqdm's own, widgets in a notebook.

The runner reads the file (:func:`read_state`) and redraws one line per notebook
(:class:`LiveLine`, :func:`progress_line`), at most 80 columns: the time to go first (the whole
notebook's, from its previous run's time, when there is one), the notebook, the time elapsed and
the outermost open bar's count. This module sits in the presentation layer,
so no training code imports it and no cache key depends on it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from tqdm.std import tqdm as _std_tqdm

ENV = "BNMEM_PROGRESS"
_WRITE = threading.Lock()   # one writer of the terminal at a time: the live line, the notebook log


class StateFile:
    """A bar's state as JSON at ``path``, written at most once per ``interval`` seconds through a
    temporary file renamed over it, so that a reader never sees half a file. A state that comes
    sooner is written when the interval is up (the last one wins), unless ``force``d at once."""

    def __init__(self, path: str | os.PathLike, interval: float = 1.0, clock=time.monotonic):
        self.path, self.interval, self.clock = Path(path), interval, clock
        self.last: float | None = None
        self.pending: dict | None = None
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()

    def write(self, state: dict, *, force: bool = False) -> bool:
        """Write ``state`` now, or when the interval since the last write is up; True if now."""
        with self.lock:
            self.pending = state
            wait = 0.0 if force or self.last is None else self.last + self.interval - self.clock()
            if wait <= 0:
                return self._write()
            if self.timer is None:
                self.timer = threading.Timer(wait, self.flush)
                self.timer.daemon = True
                self.timer.start()
            return False

    def flush(self) -> None:
        with self.lock:
            self.timer = None
            self._write()

    def _write(self) -> bool:
        if self.pending is None:
            return False
        state, self.pending, self.last = self.pending, None, self.clock()
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)
        except OSError:     # the line is a courtesy: a full disk must not fail the notebook
            return False
        return True

    def clear(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
            self.timer, self.pending, self.last = None, None, None
            self.path.unlink(missing_ok=True)


class StateBar(_std_tqdm):
    """A tqdm bar that reports to :attr:`state` (the outermost open bar only) instead of drawing."""

    state: StateFile | None = None
    _open: list = []

    def __init__(self, *args, **kw):
        if not kw.get("disable"):
            StateBar._open.append(self)
        # every update reaches display(); the state file throttles the writes
        super().__init__(*args, **{**kw, "file": io.StringIO(), "disable": bool(kw.get("disable")),
                                   "mininterval": 0, "miniters": 1})

    def display(self, msg=None, pos=None) -> bool:
        if self.state is not None and StateBar._open[:1] == [self]:
            d = self.format_dict
            self.state.write({"desc": d["prefix"] or "", "unit": d["unit"], "n": d["n"],
                              "total": d["total"], "initial": d["initial"],
                              "elapsed": d["elapsed"], "time": time.time()})
        return True

    def close(self) -> None:
        if self in StateBar._open:
            outermost = StateBar._open[0] is self
            StateBar._open.remove(self)
            if self.leave is not False:
                # its last frame (at its mean rate), into the executed notebook
                print(self.format_meter(**{**self.format_dict, "rate": None}), flush=True)
            if outermost and self.state is not None:
                self.state.clear()
        super().close()


def install(path: str | os.PathLike | None = None) -> bool:
    """Make the bars report to ``path`` (default: ``$BNMEM_PROGRESS``); False, nothing changed,
    when there is none."""
    import tqdm.auto

    path = path or os.environ.get(ENV)
    if not path:
        return False
    StateBar.state = StateFile(path)
    tqdm.auto.tqdm = StateBar
    return True


def read_state(path: str | os.PathLike) -> dict | None:
    """The state a kernel's bar last wrote to ``path``, or None (no bar open)."""
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def duration(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour."""
    m, s = divmod(int(max(0.0, seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


#: The width the live line is cut to: an 80-column terminal less the cursor's column. The time
#: to go, the notebook and the time elapsed are kept whole; the bar's description is cut first.
WIDTH = 79


def _stage_to_go(state: dict, now: float) -> float | None:
    """Seconds the open bar still needs at its rate, less the time since it wrote; None when it
    has no total or no rate yet."""
    done, spent = state.get("n", 0) - (state.get("initial") or 0), state.get("elapsed") or 0.0
    if not state.get("total") or done <= 0 or spent <= 0:
        return None
    return max(0.0, (state["total"] - state["n"]) * spent / done - (now - state.get("time", 0.0)))


def progress_line(label: str, elapsed: float, state: dict | None, now: float | None = None,
                  *, expected: float | None = None, width: int = WIDTH) -> str:
    """``~m:ss to go  label  m:ss in  desc: n/total unit``, at most ``width`` characters.

    The time to go covers the whole notebook where a previous run of it took ``expected``
    seconds (at least what the open bar still needs: the stage now running), else the open
    bar's stage alone ("this stage"); with neither, it is left out. The bar's rate gives its
    own time to go, less the time since it wrote."""
    stage, go = _stage_to_go(state or {}, time.time() if now is None else now), ""
    if expected is not None and expected > 0:
        go = f"~{duration(max(expected - elapsed, stage or 0.0))} to go"
    elif stage is not None:
        go = f"~{duration(stage)} to go (this stage)"
    head = "  ".join(filter(None, (go, label, f"{duration(elapsed)} in")))
    if not state:
        return head
    n, total = state.get("n", 0), state.get("total")
    count = f"{n:,}/{total:,}" if total else f"{n:,}"
    tail, desc = f"{count} {state.get('unit') or 'it'}", state.get("desc") or "progress"
    room = width - len(head) - 2 - len(tail)       # what the description may take, with ": "
    if room >= len(desc) + 2:
        return f"{head}  {desc}: {tail}"
    if room >= 10:                                 # cut, marked with "..."
        return f"{head}  {desc[:room - 5]}...: {tail}"
    return f"{head}  {tail}" if room >= 0 else head


def say(text: str, stream=None, *, redraw: bool = False) -> None:
    """Write ``text`` to ``stream`` (stderr): over the live line on a terminal (``redraw``: as
    the new live line, left without a newline)."""
    stream = stream or sys.stderr
    with _WRITE:
        if redraw:
            stream.write(f"\r{text[:shutil.get_terminal_size().columns - 1]}\x1b[K")
        else:
            stream.write(("\r\x1b[K" if stream.isatty() else "") + text + "\n")
        stream.flush()


class LiveLine:
    """While a notebook runs, its progress line: redrawn every second on a terminal, printed
    once a minute elsewhere (a log file); cleared at the end."""

    def __init__(self, label: str, path: str | os.PathLike, stream=None, *, every: float | None = None,
                 expected: float | None = None):
        self.label, self.path, self.stream = label, Path(path), stream or sys.stderr
        self.expected = expected      # seconds the notebook's previous run took, if known
        self.tty = self.stream.isatty()
        self.every = every or (1.0 if self.tty else 60.0)
        self.start, self.stop = time.monotonic(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def line(self) -> str:
        return progress_line(self.label, time.monotonic() - self.start, read_state(self.path),
                             expected=self.expected)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            say(self.line(), self.stream, redraw=self.tty)

    def __enter__(self) -> LiveLine:
        if self.tty:
            say(self.line(), self.stream, redraw=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        if self.tty:
            say("", self.stream, redraw=True)
