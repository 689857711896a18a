"""Logging for the Hydra application: plain lines on the console, a timestamped job log in the run directory.

Tasks log their progress lines and tables with ``logging.getLogger(__name__).info``. The job logging config
(conf/hydra/job_logging/spectune.yaml) sends records below WARNING to stdout as ``%(message)s`` (so the console
looks as it did when tasks printed, and the README transcripts stay true), WARNING and above to stderr (so
``error: ...`` lines stay one line on stderr), and everything to ``<run dir>/__main__.log`` with a timestamp.
A measuring run's progress line (:mod:`spectune.run.progress`) writes to stderr directly and never reaches the log.
"""

from __future__ import annotations

import logging


class BelowLevel(logging.Filter):
    """Pass only records strictly below ``level``: keeps warnings and errors off the stdout handler,
    which would otherwise print them twice (stdout and stderr)."""

    def __init__(self, level: str | int = "WARNING") -> None:
        super().__init__()
        self.level = logging.getLevelName(level) if isinstance(level, str) else level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


def below(level: str | int = "WARNING") -> BelowLevel:
    """Factory for logging's dictConfig (``"()": spectune.run.logs.below``)."""
    return BelowLevel(level)


def capture_warnings() -> None:
    """Route ``warnings.warn`` through the ``py.warnings`` logger, so warnings land in the job log too
    (and on stderr through the WARNING handler, as before).

    Reset first: ``logging.captureWarnings(True)`` is a no-op when logging believes it already captures, even after
    something else (a notebook, a test runner's ``catch_warnings``) put ``warnings.showwarning`` back; a second job
    in the same process would then lose its warnings."""
    logging.captureWarnings(False)
    logging.captureWarnings(True)
