"""What the analysis command lines share: one-line usage errors (exit 2) and plain log lines on stdout."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse with spectune's error style: ``error: <what is wrong> (see <prog> --help)``, one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def plain_logging() -> None:
    """Log lines as plain messages on stdout, unless the caller (a notebook, a test) configured logging."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
