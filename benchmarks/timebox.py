"""A time budget for the parts of a one-shot benchmark (``gpu_smoke.py``): each part runs until
its deadline, is stopped there, and a part that fails is reported in one line; the run goes on
to its end either way, so that a single call on a lent GPU machine always prints and writes
what it measured."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time

import torch


class OutOfTime(BaseException):
    """The run's ``--budget`` ran out inside a measurement (not an ``Exception``, so that no
    ``except Exception`` inside torch's compiler swallows it)."""


class Clock:
    """A part's time: ``left()`` seconds until ``deadline`` (``time.perf_counter()``'s; infinite:
    no limit); inside ``limit()`` a measurement is stopped there by :class:`OutOfTime`
    (SIGALRM, so only on the main thread). ``words``: that time, for the output."""

    def __init__(self, deadline: float = math.inf, words: str = ""):
        self.deadline, self.words = deadline, words

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    @contextlib.contextmanager
    def limit(self):
        if math.isinf(self.deadline) or threading.current_thread() is not threading.main_thread():
            yield
            return
        left = self.left()
        if left <= 0:
            raise OutOfTime()

        def alarm(_signum, _frame):
            raise OutOfTime()

        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, left)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def run_part(label: str, measure, clock: Clock, out: dict, dev: torch.device) -> dict:
    """``measure(out)`` under the clock, ``out`` filled as it goes (what a stopped or failed
    part measured is kept): a part past the budget is skipped, one that runs out of time is
    stopped, one that fails is reported in one line, and each says so in ``out`` ("skipped",
    "stopped", "error") and in the output; the run goes on to its end either way."""
    if clock.left() <= 0:
        out["skipped"] = f"not run: {clock.words} was spent"
        print(f"{label} {out['skipped']}", flush=True)
        return out
    try:
        with clock.limit():
            measure(out)
    except OutOfTime:
        out["stopped"] = f"stopped: {clock.words} was spent; only what it measured is shown"
        print(f"{label} {out['stopped']}", flush=True)
    except Exception as exc:                     # a part's failure must not lose the others
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        print(f"{label} FAILED: {out['error']}", flush=True)
    try:
        if {"stopped", "error"} & set(out):
            import torch._dynamo

            torch._dynamo.reset()                # no half-built compilation for the next part
        if dev.type == "cuda":
            torch.cuda.empty_cache()             # what a failed part held (an OOM) goes back
    except Exception as exc:                     # a device left unusable: the JSON still comes
        print(f"{label} cleanup failed: {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
    return out
