"""Measuring engine: draft proposer, target scorer, per-slot KV and the continuous-batching loop.

The names below load on first use (PEP 562), so that importing a light part of the engine (a proposer's settings,
read while a command line is checked: ``proposers/``) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectune.engine.engine import Engine, RunRecords
    from spectune.engine.records import CycleRecord, Request, RequestRecord

__all__ = ["CycleRecord", "Engine", "Request", "RequestRecord", "RunRecords"]
_HOME = {"Engine": "spectune.engine.engine", "RunRecords": "spectune.engine.engine",
         "CycleRecord": "spectune.engine.records", "Request": "spectune.engine.records",
         "RequestRecord": "spectune.engine.records"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
