"""What every engine gives the measuring code: check the methods, open, measure a block of requests, describe, close.

bench, tune and coverage drive an engine only through :class:`MeasuringEngine`, so a grid, its interleaved design,
its repeats and its intervals are the same on every engine. What a block returns is :data:`Frames`: the request rows
(the columns of :func:`spectune.engine.records.requests_frame`: TTFT from ``first_token_s``, per-token arrival times
``token_times_s`` (ITL, TPOT), ``finish_s`` (E2E), ``output_ids``; acceptance where the engine counts it), the cycle
rows (empty where the engine reports none: a server gives per-request totals at most) and the block's summary. What
an engine cannot report is absent from its rows (a missing column, or None), never invented.

Beside the protocol, each engine class gives the harness three class methods (``task=bench`` calls them through
:func:`workloads.setup.measuring_engine`): ``method_names(cfg)`` (what names its speculative methods: the policy on
spectune's engine, the speculative types on a server), ``check_config(cfg, methods)`` (every method valid as
configured: one line before any model loads) and ``from_config(cfg, *, inprocess, make, max_context, sampling,
slots, log_dir)`` (the engine, not yet opened). A server engine is a
:class:`~spectune.engines.server.ServerEngine` over a small flavour (:class:`~spectune.engines.server.ServerFlavour`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pandas as pd

from spectune.engine.records import Request
from spectune.methods import Method

if TYPE_CHECKING:
    from spectune.run.progress import RunProgress

Frames = tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]  # requests, cycles, summary of one measured block


@runtime_checkable
class MeasuringEngine(Protocol):
    """An engine the harness measures on. ``engine`` (a class attribute) is its config name."""

    engine: str

    def check(self, methods: Sequence[Method]) -> None:
        """Every method is one this engine runs, with valid settings: a one-line
        :class:`~spectune.errors.SpectuneError` otherwise, before any model loads or any server starts."""

    def open(self, methods: Sequence[Method]) -> None:
        """Get ready to measure ``methods`` (load models; start, and wait for, one server per method)."""

    def measure(self, requests: list[Request], method: Method, *, concurrency: int, warmup: int,
                first_block: bool, progress: RunProgress | None = None) -> Frames:
        """Run ``requests`` with ``method`` at ``concurrency`` (closed loop, or open loop where requests carry
        arrival times), after ``warmup`` discarded requests. ``first_block`` False: a later block of the same
        (method, repeat), which keeps what an adaptive method learned and takes no warm-up. ``progress``: the run's
        one progress line, advanced per finished request."""

    def describe(self) -> dict[str, Any]:
        """What a result records about the engine: its name and version, and per method how it ran (a server's
        exact command and build flags)."""

    def close(self) -> None:
        """Release everything :meth:`open` took (stop servers); safe to call twice, and on failure."""


@contextmanager
def opened(engine: MeasuringEngine, methods: Sequence[Method]) -> Iterator[MeasuringEngine]:
    """``engine`` checked for ``methods`` (one line before any server starts), opened for them, and closed however
    the block ends (its servers stopped on success, failure and Ctrl-C alike)."""
    engine.check(methods)
    try:
        engine.open(methods)
        yield engine
    finally:
        engine.close()
