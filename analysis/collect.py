"""Gather bench runs (single runs, Hydra multirun sweep directories, or lists of them) into pandas tables.

The loaders live in :mod:`analysis.load`; this module keeps the names the README and older notebooks use.
Frames hold every recorded field under its recorded name (``output_throughput``, ``p99_tpot_ms``, ...),
the run's Hydra config as ``cfg.*`` columns and its key metadata. The printed table of one run is a view:
``bench_table(frame[frame["run"] == run].to_dict("records"))``.
"""

from __future__ import annotations

from analysis.load import (
    add_speedups,
    find_runs,
    load_cycles,
    load_points,
    load_requests,
    load_summaries,
    load_traces,
    run_context,
    swept,
)

__all__ = ["add_speedups", "find_runs", "load_cycles", "load_points", "load_requests", "load_summaries",
           "load_traces", "run_context", "swept"]
