"""Measuring engine: draft proposer, target scorer, per-slot KV and the continuous-batching loop."""

from spectune.engine.engine import Engine, RunRecords
from spectune.engine.records import CycleRecord, Request, RequestRecord

__all__ = ["CycleRecord", "Engine", "Request", "RequestRecord", "RunRecords"]
