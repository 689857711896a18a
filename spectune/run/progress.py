"""One progress line for a whole measuring run: points and requests done of their totals, elapsed time, ETA.

A run measures many points (a method on all prompts, once per repeat), and in the interleaved design every point
in blocks of one or a few prompts. A progress bar per point or per block (as tqdm was used here) prints hundreds
of bars: on a terminal they flicker past, and in a log file (stderr redirected) each leaves its own line.
:class:`RunProgress` keeps one line for the run instead, on stderr:

- on a terminal it is rewritten in place, at most every :data:`TERMINAL_EVERY_S` seconds;
- elsewhere (stderr is a file or a pipe) it writes a whole line each time another tenth of the work is done (10%
  to 90%), or after :data:`LOG_EVERY_S` seconds without a line (so a slow run still shows it is alive), and a last
  line when the run ends: at most 10 + elapsed / LOG_EVERY_S lines, whatever the number of points and blocks.

The ETA extrapolates the rate of this run's own work (what a resumed run took from earlier runs is not counted in
the rate). Warm-up requests are not counted: they are not measured.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

LOG_EVERY_S = 60.0  # a line at least this often in a log file while work goes on
LOG_STEP = 0.1  # and one each time this share of the work is done
TERMINAL_EVERY_S = 0.5  # a terminal's line is rewritten at most this often


def duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``: short enough for a progress line."""
    s = max(0, round(seconds))
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class RunProgress:
    """The progress of one run: ``total`` units of work (requests, prompts, processes: ``unit``), optionally in
    ``points`` (the run's (method, repeat) points), written to ``stream`` (stderr by default).

    Use it as a context manager (the last line is written on exit, also when the run fails), or call
    :meth:`close`. ``clock`` and ``tty`` exist for tests; ``tty`` None asks the stream."""

    def __init__(self, what: str, total: int, *, unit: str = "requests", points: int | None = None,
                 stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.total, self.unit, self.points = what, max(0, int(total)), unit, points
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.clock = clock
        self.done = 0
        self.points_done = 0
        self.start = clock()
        self._counted_from = 0  # work taken from earlier runs (resume): not in the rate
        self._last_write = self.start
        self._last_step = 0  # the tenths of the work reported so far
        self._width = 0  # the terminal line's length, to blank what a shorter line leaves
        self._written: tuple[int, int] | None = None  # (done, points done) at the last line
        self._closed = False

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def skip(self, units: int, points: int = 0) -> None:
        """Work taken as done without running it now (a resumed run's completed points): counted, not timed."""
        self.done += units
        self.points_done += points
        self._counted_from = self.done
        self._last_step = self._step()

    def advance(self, units: int = 1) -> None:
        """``units`` more of the work are done."""
        self.done += units
        self._maybe_write()

    def point_done(self) -> None:
        """One more (method, repeat) point is complete."""
        self.points_done += 1
        self._maybe_write()

    def close(self) -> None:
        """The last line (a terminal's line then ends; a log file's only when it says something new); later calls
        do nothing."""
        if self._closed:
            return
        self._closed = True
        if self.tty or self._written != (self.done, self.points_done):
            self._write(final=True)

    def line(self) -> str:
        """The progress as one line of text."""
        elapsed = self.clock() - self.start
        parts = []
        if self.points is not None:
            parts.append(f"points {self.points_done}/{self.points}")
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        parts.append(f"{self.unit} {self.done}/{self.total}{share}")
        parts.append(f"elapsed {duration(elapsed)}")
        measured = self.done - self._counted_from
        if measured > 0 and self.done < self.total:
            parts.append(f"ETA {duration(elapsed * (self.total - self.done) / measured)}")
        return f"{self.what}: {', '.join(parts)}"

    def _step(self) -> int:
        return int(self.done / self.total / LOG_STEP + 1e-9) if self.total else 0

    def _maybe_write(self) -> None:
        now = self.clock()
        if self.tty:
            if now - self._last_write >= TERMINAL_EVERY_S:
                self._write()
            return
        step = self._step()
        if (step > self._last_step and self.done < self.total) or now - self._last_write >= LOG_EVERY_S:
            self._last_step = max(step, self._last_step)
            self._write()

    def _write(self, final: bool = False) -> None:
        text = self.line()
        if self.tty:
            pad = " " * max(0, self._width - len(text))
            self.stream.write(f"\r{text}{pad}" + ("\n" if final else ""))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._last_write = self.clock()
        self._written = (self.done, self.points_done)
