"""A tuned γ map in vLLM's own format: ``--speculative-config`` with ``num_speculative_tokens_per_batch_size``, for
whatever drafted: its :class:`VllmMethod` (the draft model's ``draft_model``, prompt lookup's ``ngram``, suffix
decoding's ``suffix``) comes from its proposer's entry (:func:`spectune.engine.proposers.vllm_method`).

What vLLM reads, checked in its source. ``num_speculative_tokens_per_batch_size`` is a field of vLLM's
``SpeculativeConfig`` since v0.25.0 (docs: "Dynamic Speculative Decoding", :data:`VLLM_DOCS`) and is unchanged in
v0.34.0 (:data:`VLLM_CHECKED`): ``vllm/config/speculative.py`` types it ``list[tuple[int, int, int]]``, entries
``(range_start, range_end, K)`` with inclusive batch-size ranges, and
``vllm/v1/spec_decode/dynamic/utils.py`` accepts a table whose ranges are positive, sorted, non-overlapping and
start at 1, with every K >= 0 (0: no drafting); it carries the previous K over a gap and the last K to every batch
size above the table, and clamps each K to ``num_speculative_tokens`` (the docs require K <= it). The batch size
is the number of requests the scheduler runs in a step (``vllm/v1/core/sched/scheduler.py``), which a closed loop
of c clients keeps at or below c. With ``--data-parallel-size`` > 1 vLLM drops the table for the fixed
``num_speculative_tokens`` (``vllm/config/vllm.py``). :func:`vllm_form` writes exactly such a table: ranges from
1 up to each measured concurrency, contiguous, K >= 0, and ``num_speculative_tokens`` the largest K.

Library, not application: ``task=tune`` writes it into its recommendation and ``analysis.comparison`` into its
report, so it lives below both (an application module that another application imports is a package cycle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

VLLM_VERSION = "0.25.0"  # the first release that reads the table
VLLM_CHECKED = "0.34.0"  # the release whose source the format and the notes were checked against
VLLM_DOCS = (f"https://docs.vllm.ai/en/v{VLLM_VERSION}/features/speculative_decoding/"
             "dynamic_speculative_decoding/")


@dataclass(frozen=True)
class VllmMethod:
    """What drafted, in vLLM's terms: the ``speculative_config`` keys of its method (``{"method": "ngram", ...}``),
    where vLLM's method differs from the one measured, and the longest chain the measured proposer could draft
    whatever γ allowed (None: only γ bounds it)."""

    config: dict[str, Any]
    differences: tuple[str, ...] = ()
    ceiling: int | None = None


def vllm_schedule(best_k: dict[int, int]) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size`` from {measured concurrency: best K}: the range
    (previous measured concurrency, c] takes c's K; adjacent equal K merge. vLLM carries the last K
    forward to larger batches, which were not measured."""
    rows: list[list[int]] = []
    start = 1
    for c in sorted(best_k):
        if rows and rows[-1][2] == best_k[c]:
            rows[-1][1] = c
        else:
            rows.append([start, c, best_k[c]])
        start = c + 1
    return rows


def vllm_form(best_k: dict[int, int], method: VllmMethod | None) -> dict[str, Any]:
    """The recommendation as vLLM's ``--speculative-config`` JSON (v0.25.0 on, checked on v0.34.0; or speculation
    off), for the ``method`` that was measured (its proposer's entry gives it; None: vLLM has none, and the form
    says so).

    A K above the proposer's own chain ceiling drafted no more than the ceiling when measured: vLLM gets the
    ceiling, which is what ran."""
    if method is None:
        return {"vllm_version": VLLM_VERSION, "docs": VLLM_DOCS, "speculative_config": None,
                "cli": "(none: vLLM has no speculative method for the proposer that was measured)"}
    if method.ceiling is not None:
        best_k = {c: min(k, method.ceiling) for c, k in best_k.items()}
    table = vllm_schedule(best_k)
    max_k = max(best_k.values())
    form: dict[str, Any] = {"vllm_version": VLLM_VERSION, "docs": VLLM_DOCS}
    if max_k == 0:
        form.update(speculative_config=None, cli="(no --speculative-config: speculation off at every measured "
                                                 "concurrency)")
        return form
    config = {**method.config, "num_speculative_tokens": max_k, "num_speculative_tokens_per_batch_size": table}
    form.update(speculative_config=config, cli=f"--speculative-config '{json.dumps(config)}'")
    form["notes"] = [
        "num_speculative_tokens is the largest K of the table (vLLM requires every K <= it); K = 0: no drafting",
        f"batch sizes above {max(best_k)} were not measured; vLLM uses the last range's K for them",
        "vLLM picks K by the number of requests it runs in a step (at most the concurrency measured); with "
        "--data-parallel-size > 1 it ignores the table and drafts num_speculative_tokens",
        f"format checked against vLLM v{VLLM_CHECKED}'s source (vllm/config/speculative.py, "
        "vllm/v1/spec_decode/dynamic/utils.py)",
        "vLLM's docs list Dynamic SD as tested with EAGLE, EAGLE-3 and DFlash drafters; with method "
        f"{method.config['method']!r} check that your vLLM build honours the table",
        *method.differences,
    ]
    return form
