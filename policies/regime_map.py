"""A static answer per regime: each row drafts the fixed γ its regime's entry names (0: speculation off), the regime
being its request's temperature and the batch's busy rows.

This is the comparison piece an adaptive controller has to match without being told the regime: the best fixed γ
per (temperature, concurrency), chosen beforehand on training prompts (:mod:`policies.static_answers` writes the
map from a bench run over the regimes). It reads the request's settings and the busy rows as ``hysteresis`` does,
and knows nothing else. A row whose temperature the map does not list, or a batch size between the listed
concurrencies, takes the entry of the nearest listed one at or below it (the smallest above it when none is below),
the way vLLM's per-batch-size table carries a K forward; a temperature not listed takes the map's single best
static γ. Entries are fixed γ or 0; a rule as an entry is not supported (a rule reads signals a map cannot hold).

The map file (JSON): ``{"kind": "spectune-regime-map", "version": 1, "static": γ, "regimes": [{"temperature": T,
"concurrency": c, "gamma": γ, "method": label}, ...], ...}`` (other keys: provenance, ignored here).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.rows import RowLimits
from spectune.errors import SpectuneError
from spectune.options import check_gamma
from spectune.sampling import SamplingParams

log = logging.getLogger(__name__)

KIND, VERSION = "spectune-regime-map", 1


@dataclass(frozen=True)
class RegimeTable:
    """γ by (temperature, concurrency), and the single static γ for a temperature the table does not list."""

    entries: dict[float, dict[int, int]]  # temperature -> {concurrency: γ}
    static: int

    def gamma(self, temperature: float | None, busy: int) -> int:
        """The γ of a row at ``temperature`` in a batch of ``busy`` rows (see the module for the nearest entry)."""
        table = self.entries.get(round(float(temperature), 3)) if temperature is not None else None
        if not table:
            return self.static
        below = [c for c in table if c <= busy]
        return table[max(below)] if below else table[min(table)]

    @classmethod
    def read(cls, path: str | Path) -> RegimeTable:
        """The map a file holds, or one line naming what is wrong with it."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise SpectuneError(f"policy.path={str(path)!r} is invalid: cannot read it as JSON ({err})") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: Any, source: str = "map") -> RegimeTable:
        if not isinstance(data, dict) or data.get("kind") != KIND or data.get("version") != VERSION:
            raise SpectuneError(f"policy.path={source!r} is invalid: not a {KIND} version {VERSION} file (write one "
                                "with python -m policies.static_answers)")
        entries: dict[float, dict[int, int]] = {}
        try:
            static = int(data["static"])
            for entry in data["regimes"]:
                gamma, concurrency = int(entry["gamma"]), int(entry["concurrency"])
                entries.setdefault(round(float(entry["temperature"]), 3), {})[concurrency] = gamma
        except (KeyError, TypeError, ValueError) as err:
            raise SpectuneError(f"policy.path={source!r} is invalid: missing or malformed field ({err})") from None
        if static < 0 or any(g < 0 for t in entries.values() for g in t.values()) \
                or any(c < 1 for t in entries.values() for c in t):
            raise SpectuneError(f"policy.path={source!r} is invalid: every γ must be >= 0 and every concurrency >= 1")
        return cls(entries, static)


class RegimeMap(RowLimits):
    """Each busy row drafts its regime's fixed γ from the map (0: no draft), capped at the grid's γ (the ceiling)."""

    name = "regime-map"
    reads_sampling = True

    def __init__(self, gamma: int, path: str | None) -> None:
        check_gamma(gamma, "the regime map's ceiling")
        if path is None:
            raise SpectuneError("policy.path is missing: give the map python -m policies.static_answers wrote "
                                "(policy.path=MAP.json)")
        self.ceiling, self.path = gamma, str(path)
        self.table = RegimeTable.read(path)
        self.set_limits({})

    def before_cycle(self, rows: list[int], request_ids: list[int], context_lengths: list[int] | None = None,
                     sampling: list[SamplingParams] | None = None) -> None:
        settings = sampling if sampling is not None else [None] * len(rows)
        self.set_limits({row: min(self.ceiling, self.table.gamma(s.temperature if s is not None else None,
                                                                   len(rows)))
                         for row, s in zip(rows, settings, strict=True)})

    def describe(self) -> dict:
        return {"name": self.name, "ceiling": self.ceiling, "path": self.path, "static": self.table.static,
                "regimes": {str(t): dict(sorted(c.items())) for t, c in self.table.entries.items()}}
