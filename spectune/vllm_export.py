"""A tuned γ map in vLLM's own format: ``--speculative-config`` with ``num_speculative_tokens_per_batch_size``.

Library, not application: ``task=tune`` writes it into its recommendation and ``analysis.comparison`` into its
report, so it lives below both (an application module that another application imports is a package cycle).
"""

from __future__ import annotations

import json
from typing import Any

VLLM_VERSION = "0.25.0"
VLLM_DOCS = (f"https://docs.vllm.ai/en/v{VLLM_VERSION}/features/speculative_decoding/"
             "dynamic_speculative_decoding/")


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


def vllm_form(best_k: dict[int, int], draft: str) -> dict[str, Any]:
    """The recommendation as vLLM v0.25.0's ``--speculative-config`` JSON (or speculation off)."""
    table = vllm_schedule(best_k)
    max_k = max(best_k.values())
    form: dict[str, Any] = {"vllm_version": VLLM_VERSION, "docs": VLLM_DOCS}
    if max_k == 0:
        form.update(speculative_config=None, cli="(no --speculative-config: speculation off at every measured "
                                                 "concurrency)")
        return form
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": max_k,
              "num_speculative_tokens_per_batch_size": table}
    form.update(speculative_config=config, cli=f"--speculative-config '{json.dumps(config)}'")
    form["notes"] = [
        "num_speculative_tokens is the largest K of the table (vLLM requires every K <= it); K = 0: no drafting",
        f"batch sizes above {max(best_k)} were not measured; vLLM uses the last range's K for them",
        "vLLM's docs list Dynamic SD as tested with EAGLE, EAGLE-3 and DFlash drafters; with method "
        "'draft_model' check that your vLLM build honours the table",
    ]
    return form
