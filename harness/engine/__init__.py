"""Measuring engine: draft proposer, target scorer, per-slot KV and the continuous-batching loop."""

from harness.engine.engine import Engine, RunRecords
from harness.engine.records import CycleRecord, Request, RequestRecord

__all__ = ["CycleRecord", "Engine", "Request", "RequestRecord", "RunRecords"]
