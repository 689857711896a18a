"""User-facing errors: one line naming the bad value and what is allowed, exit code 2, no traceback."""

from __future__ import annotations


class SpectuneError(ValueError):
    """A problem with the user's input or environment, reported as one line.

    Raised anywhere in spectune; the CLI catches it, prints ``error: <message>`` and exits 2.
    Results already written stay on disk (every writer is atomic).
    """


def require(condition: bool, message: str) -> None:
    """Raise :class:`SpectuneError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise SpectuneError(message)
