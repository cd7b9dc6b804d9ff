"""Progress display for long work (collection, training, rounds, evaluation, studies).

:func:`progress_bar` is the one way every long loop reports progress. It has two faces:

* **interactive** (stderr is a terminal): a rich bar with count, elapsed time and ETA;
* **plain** (stderr is a file, a pipe, a CI log): rich's bar would print nothing until the loop
  ends, so one plain line is printed at the start, then whenever another ~10 % is done or 30 s have
  passed, and at the end, e.g.
  ``[lensemble] warm start 450/1500 (30 %), 2m10s elapsed, ETA 5m03s · pred 0.41``.

``LENSEMBLE_PROGRESS=plain`` (or ``bar``) forces one face; ``enabled=False`` silences both (tests).
:class:`Heartbeat` prints a status line every so often from a background thread, for work whose
progress is only visible from outside (a federation whose participants run elsewhere).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

PREFIX = "[lensemble]"
#: Plain mode prints a line whenever this share of the total is newly done ...
PLAIN_STEP = 0.10
#: ... or this many seconds have passed since the last line.
PLAIN_SECONDS = 30.0


def interactive(stream=None) -> bool:
    """Whether progress on ``stream`` (default stderr) should be a live bar.

    ``LENSEMBLE_PROGRESS=plain|bar`` decides when set; otherwise a terminal gets a bar and
    anything else (file, pipe, captured output) plain lines.
    """
    forced = os.environ.get("LENSEMBLE_PROGRESS", "").strip().lower()
    if forced in ("plain", "bar"):
        return forced == "bar"
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def format_bytes(n: float) -> str:
    """``669952`` -> ``670.0 KB`` (powers of 1000)."""
    n = float(n)
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1000
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """``7.3`` -> ``7.3s``, ``130`` -> ``2m10s``, ``3725`` -> ``1h02m05s``."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def eta_seconds(done: float, total: float, elapsed: float, initial: float = 0) -> float | None:
    """Remaining time at the mean rate so far; None before anything is done.

    ``initial`` units were already done when the clock started (a resumed study's finished runs):
    they count toward ``done`` but not toward the rate, or a resume would promise minutes for hours.
    """
    if done - initial <= 0 or total <= 0 or elapsed <= 0:
        return None
    return max(0.0, elapsed * (total - done) / (done - initial))


def progress_line(description: str, done: int, total: int, elapsed: float, info: str = "", *,
                  finished: bool = False, initial: int = 0) -> str:
    """One plain progress line (without the ``[lensemble]`` prefix); ``initial`` as in :func:`eta_seconds`."""
    pct = 100.0 * done / total if total else 100.0
    line = f"{description} {done}/{total} ({pct:.0f} %), {format_duration(elapsed)} elapsed"
    if finished:
        line += ", done"
    else:
        eta = eta_seconds(done, total, elapsed, initial)
        if eta is not None:
            line += f", ETA {format_duration(eta)}"
    if info:
        line += f" · {info}"
    return line


class PlainProgress:
    """The plain face of :func:`progress_bar`: throttled lines on a stream."""

    def __init__(self, description: str, total: int, *, stream=None, step: float = PLAIN_STEP,
                 seconds: float = PLAIN_SECONDS, clock: Callable[[], float] = time.monotonic, initial: int = 0):
        self.description = description
        self.total = max(int(total), 0)
        self.stream = stream
        self.step = step
        self.seconds = seconds
        self.clock = clock
        self.initial = max(int(initial), 0)
        self.done = self.initial
        self.info = ""
        self.started = clock()
        self._last_time = self.started
        self._last_share = self.done / self.total if self.total else 0.0
        self._finished = False
        self._emit(self.description + (f" {self.done}/{self.total}" if self.total else "") + ", started"
                   + (f" ({self.initial} already done)" if self.initial else ""))

    def _emit(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        print(f"{PREFIX} {text}", file=stream, flush=True)

    def advance(self, n: int = 1, info: str = "", description: str | None = None, **_) -> None:
        self.done = min(self.done + int(n), self.total) if self.total else self.done + int(n)
        if info:
            self.info = info
        if description:
            self.description = description
        now = self.clock()
        share = self.done / self.total if self.total else 0.0
        if self.total and self.done >= self.total:
            self.finish()
            return
        if share - self._last_share >= self.step - 1e-9 or now - self._last_time >= self.seconds:
            self._emit(progress_line(self.description, self.done, self.total, now - self.started, self.info,
                                     initial=self.initial))
            self._last_time = now
            self._last_share = share

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._emit(progress_line(self.description, self.done, self.total, self.clock() - self.started,
                                 self.info, finished=True))


@contextmanager
def progress_bar(description: str, total: int, *, enabled: bool = True, initial: int = 0):
    """Yield ``advance(n=1, info="", description=None)``; shows progress on stderr when ``enabled``.

    A live rich bar in a terminal, plain periodic lines otherwise (see the module docstring).
    ``description`` renames the step (e.g. the collection's current group). ``initial`` units
    are done before the clock starts: shown in the count, left out of the ETA's rate.
    """
    if not enabled:
        yield lambda n=1, **_: None
        return
    if not interactive():
        plain = PlainProgress(description, total, initial=initial)
        yield plain.advance
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(file=sys.stderr)
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=False, refresh_per_second=4) as prog:
        task = prog.add_task(description, total=total, completed=initial, info="")  # rich's speed counts advances only

        def advance(n: int = 1, info: str = "", description: str | None = None, **_):
            fields = {"description": description} if description else {}
            prog.update(task, advance=n, info=info, **fields)

        yield advance


def say(text: str, *, enabled: bool = True) -> None:
    """One ``[lensemble]`` line on stderr (flushed): readable in a terminal and in a log alike."""
    if enabled:
        print(f"{PREFIX} {text}", file=sys.stderr, flush=True)


class Heartbeat:
    """Calls ``status()`` every ``every`` seconds on a daemon thread and prints what it returns.

    ``status`` returns a line, or None to stay quiet this time. Use as a context manager; the
    thread stops when the block ends (also on an exception). Errors inside ``status`` are
    swallowed: a progress display must never break the work it reports on.
    """

    def __init__(self, status: Callable[[], str | None], *, every: float = PLAIN_SECONDS,
                 enabled: bool = True, stream=None):
        self.status = status
        self.every = float(every)
        self.enabled = enabled
        self.stream = stream
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                line = self.status()
            except Exception:  # noqa: BLE001 - see the class docstring
                continue
            if line:
                print(f"{PREFIX} {line}", file=self.stream if self.stream is not None else sys.stderr, flush=True)

    def __enter__(self) -> "Heartbeat":
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="lensemble-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


__all__ = ["Heartbeat", "PlainProgress", "format_bytes", "format_duration", "interactive", "progress_bar", "progress_line", "say"]
