"""A tuned γ map in vLLM's own format: ``--speculative-config`` with ``num_speculative_tokens_per_batch_size``, for
the draft model (``draft_model``), prompt lookup (``ngram``) or suffix decoding (``suffix``).

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
from collections.abc import Mapping
from typing import Any

VLLM_VERSION = "0.25.0"  # the first release that reads the table
VLLM_CHECKED = "0.34.0"  # the release whose source the format and the notes were checked against
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


def method_config(draft: str | None, proposer: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """vLLM's keys for what drafted (``proposer``: the run's ``proposer`` node; None: the pair's draft model), and
    where vLLM's method differs from the one measured."""
    node = dict(proposer or {"name": "model"})
    name = node.get("name", "model")
    if name == "lookup":
        return ({"method": "ngram", "prompt_lookup_max": int(node["max_n"]), "prompt_lookup_min": int(node["min_n"])},
                ["vLLM's ngram proposer matches the prompt and the output so far, longest n first, as prompt lookup "
                 "here"])
    if name == "suffix":
        depth = int(node["max_tree_depth"])
        adaptive = bool(node["adaptive"])
        # adaptive false: no cap by match length; a factor of the tree's depth makes vLLM's floor(factor * m) reach
        # the ceiling for every match length m >= 1
        factor = float(node["max_spec_factor"]) if adaptive else float(depth)
        notes = ["vLLM's global suffix tree grows with every response it serves "
                 "(suffix_decoding_max_cached_requests); the one measured here was frozen: "
                 f"proposer.corpus={getattr(node.get('corpus'), 'name', node.get('corpus'))} (train: the workload's "
                 "training-split prompts; none: per-request trees only)"]
        if not adaptive:
            notes.append("measured with proposer.adaptive=false: suffix_decoding_max_spec_factor is the tree's "
                         "depth so that no match length caps a chain below num_speculative_tokens")
        notes.append(f"vLLM v{VLLM_CHECKED} accepts suffix_decoding_max_spec_factor and "
                     "suffix_decoding_min_token_prob but ignores them (deprecated: its GPU suffix speculator always "
                     "drafts num_speculative_tokens, vllm/config/speculative.py), so there it does not cut chains as "
                     "the suffix decoding measured here did")
        return ({"method": "suffix", "suffix_decoding_max_tree_depth": depth,
                 "suffix_decoding_max_spec_factor": factor,
                 "suffix_decoding_min_token_prob": float(node["min_token_prob"])}, notes)
    return {"method": "draft_model", "model": draft}, []


def chain_ceiling(proposer: Mapping[str, Any] | None) -> int | None:
    """The longest chain the measured proposer could draft whatever γ allowed (suffix decoding: ``max_gamma``, else
    the tries' depth: ``SuffixDrafting.ceiling``'s rule, read from the config node because this library layer sits
    below the engine), or None where only γ bounds it."""
    node = dict(proposer or {})
    if node.get("name") != "suffix":
        return None
    return int(node["max_gamma"]) if node.get("max_gamma") is not None else int(node["max_tree_depth"])


def vllm_form(best_k: dict[int, int], draft: str | None, proposer: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The recommendation as vLLM's ``--speculative-config`` JSON (v0.25.0 on, checked on v0.34.0; or speculation
    off), for the draft model
    ``draft`` or the model-free ``proposer`` that was measured (:func:`method_config`).

    A K above the proposer's own chain ceiling drafted no more than the ceiling when measured: vLLM gets the
    ceiling, which is what ran."""
    ceiling = chain_ceiling(proposer)
    if ceiling is not None:
        best_k = {c: min(k, ceiling) for c, k in best_k.items()}
    table = vllm_schedule(best_k)
    max_k = max(best_k.values())
    form: dict[str, Any] = {"vllm_version": VLLM_VERSION, "docs": VLLM_DOCS}
    if max_k == 0:
        form.update(speculative_config=None, cli="(no --speculative-config: speculation off at every measured "
                                                 "concurrency)")
        return form
    method, differences = method_config(draft, proposer)
    config = {**method, "num_speculative_tokens": max_k, "num_speculative_tokens_per_batch_size": table}
    form.update(speculative_config=config, cli=f"--speculative-config '{json.dumps(config)}'")
    form["notes"] = [
        "num_speculative_tokens is the largest K of the table (vLLM requires every K <= it); K = 0: no drafting",
        f"batch sizes above {max(best_k)} were not measured; vLLM uses the last range's K for them",
        "vLLM picks K by the number of requests it runs in a step (at most the concurrency measured); with "
        "--data-parallel-size > 1 it ignores the table and drafts num_speculative_tokens",
        f"format checked against vLLM v{VLLM_CHECKED}'s source (vllm/config/speculative.py, "
        "vllm/v1/spec_decode/dynamic/utils.py)",
        "vLLM's docs list Dynamic SD as tested with EAGLE, EAGLE-3 and DFlash drafters; with method "
        f"{method['method']!r} check that your vLLM build honours the table",
        *differences,
    ]
    return form
