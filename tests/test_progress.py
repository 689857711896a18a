"""One progress line per run (spectune.run.progress): few whole lines in a log file, one line rewritten on a terminal,
an ETA from this run's own rate. A hand-driven clock makes every case exact."""

from __future__ import annotations

import io
import itertools
import re

import pytest

from spectune.run.progress import LOG_EVERY_S, RunProgress, duration

LINE = re.compile(r"^measuring: points \d+/6, requests \d+/600 \(\d+%\), elapsed \S+(, ETA \S+)?$")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(tty: bool, step_s: float) -> tuple[str, Clock]:
    """600 requests in 6 points of 100, one request every ``step_s`` seconds."""
    out, clock = io.StringIO(), Clock()
    with RunProgress("measuring", 600, points=6, stream=out, tty=tty, clock=clock) as progress:
        for _ in range(6):
            for _ in range(100):
                clock.now += step_s
                progress.advance()
            progress.point_done()
    return out.getvalue(), clock


def test_a_log_file_gets_a_line_per_tenth_and_a_last_line_whatever_the_points_and_blocks():
    """600 requests in 60 s: nine lines at 10%..90% and the last one; never a carriage return."""
    text, _ = _run(tty=False, step_s=0.1)
    lines = text.splitlines()
    assert "\r" not in text and len(lines) == 10
    assert all(LINE.match(line) for line in lines), lines
    assert lines[0] == "measuring: points 0/6, requests 60/600 (10%), elapsed 6s, ETA 54s"
    assert lines[-1] == "measuring: points 6/6, requests 600/600 (100%), elapsed 1m00s"


def test_a_slow_run_still_writes_a_line_every_so_often():
    """600 requests in 600 s (a tenth every minute): besides the tenths, one line per LOG_EVERY_S without one; the
    bound 10 + elapsed / LOG_EVERY_S holds."""
    text, clock = _run(tty=False, step_s=1.0)
    lines = text.splitlines()
    assert len(lines) <= 10 + clock.now / LOG_EVERY_S
    text, clock = _run(tty=False, step_s=3.0)  # a tenth every 3 minutes: the heartbeat shows it is alive
    lines = text.splitlines()
    assert 10 + 1 < len(lines) <= 10 + clock.now / LOG_EVERY_S
    times = [0, *(_elapsed(line) for line in lines)]
    assert max(b - a for a, b in itertools.pairwise(times)) <= LOG_EVERY_S + 3  # one request late at most


def _elapsed(line: str) -> float:
    m = re.search(r"elapsed (?:(\d+)m)?(\d+)s", line)
    assert m, line
    return 60 * int(m.group(1) or 0) + int(m.group(2))


def test_a_terminal_gets_one_line_rewritten_in_place_and_ended_once():
    text, _ = _run(tty=True, step_s=0.01)  # 6 s of work: a rewrite at most every 0.5 s
    assert text.count("\n") == 1 and text.endswith("\n")
    frames = text.rstrip("\n").split("\r")[1:]
    assert 2 <= len(frames) <= 6 / 0.5 + 1
    assert frames[-1].rstrip() == "measuring: points 6/6, requests 600/600 (100%), elapsed 6s"


def test_the_eta_counts_only_this_runs_work():
    """Half the work taken from an earlier run (resume), then 10 requests in 10 s: 40 left at one a second."""
    out, clock = io.StringIO(), Clock()
    progress = RunProgress("measuring", 100, points=4, stream=out, tty=False, clock=clock)
    progress.skip(50, points=2)
    for _ in range(10):
        clock.now += 1.0
        progress.advance()
    assert progress.line() == "measuring: points 2/4, requests 60/100 (60%), elapsed 10s, ETA 40s"
    progress.close()  # nothing new since the 60% line: no last line
    progress.close()
    assert out.getvalue().splitlines() == [progress.line()]


def test_the_last_line_is_written_when_the_run_fails():
    out = io.StringIO()
    with pytest.raises(RuntimeError), RunProgress("measuring", 10, stream=out, tty=True, clock=Clock()) as progress:
        progress.advance(3)
        raise RuntimeError("a point failed")
    assert out.getvalue().endswith("requests 3/10 (30%), elapsed 0s, ETA 0s\n")


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (42.4, "42s"), (185, "3m05s"), (3725, "1h02m")])
def test_durations_are_short(seconds, text):
    assert duration(seconds) == text
