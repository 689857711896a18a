"""vLLM as a server engine (``engine=vllm``): the flavour the server runner drives, and the schema of its config.

Every flag, key and name below was read in vLLM **v0.34.0**'s source (the PyPI wheel; on GitHub under the tag
``v0.34.0``) and its documentation, file by file:

- the server: ``vllm serve MODEL`` (``vllm/entrypoints/cli/serve.py``; the console script is
  ``vllm.entrypoints.cli.main:main``, so ``python -m vllm.entrypoints.cli.main serve`` is the same program, run by
  the Python of spectune's environment); ``--host``, ``--port`` (``vllm/entrypoints/common/cli_args.py``);
  ``--seed``, ``--dtype``, ``--revision``, ``--max-model-len``, ``--generation-config``,
  ``--tensor-parallel-size``, ``--gpu-memory-utilization``, ``--max-num-seqs``, ``--speculative-config``
  (``vllm/engine/arg_utils.py``); ``--per-request-spec-decode-metrics none|summary|detailed``
  (``vllm/config/observability.py``; refused without ``--speculative-config``: ``vllm/config/vllm.py``).
  ``--disable-log-requests`` is the inverse of ``--enable-log-requests`` (off by default;
  ``vllm/utils/argparse_utils.py`` pairs every ``--enable-x`` with ``--disable-x``), given so that releases where
  logging was on by default log no prompt either.
  ``--generation-config vllm`` keeps the model's ``generation_config.json`` out of the sampling law (its default
  ``auto`` would add e.g. a repetition penalty the request did not ask for).
- ``--speculative-config`` is a JSON ``SpeculativeConfig`` (``vllm/config/speculative.py``, pydantic, extra keys
  forbidden): ``method`` one of ``ngram``, ``suffix``, ``draft_model``, ``eagle``, ``eagle3``, ``mtp`` (and others
  spectune does not drive: ``ngram_gpu``, ``dflash``, ``dspark``, ``extract_hidden_states``),
  ``num_speculative_tokens`` (> 0: γ), ``model`` (the draft or head; ``mtp`` defaults to the target),
  ``prompt_lookup_max``/``prompt_lookup_min`` (``ngram``), ``suffix_decoding_max_tree_depth``,
  ``suffix_decoding_max_cached_requests`` (``suffix``; its ``suffix_decoding_max_spec_factor`` and
  ``suffix_decoding_min_token_prob`` are deprecated and have no effect in v0.34.0, so they are not written).
- the request: ``POST /v1/completions`` with ``prompt`` a list of token ids, ``stream``,
  ``stream_options.include_usage``, ``return_token_ids`` (each chunk's ``choices[0].token_ids``), ``top_k`` (0:
  off), ``seed``, ``ignore_eos`` (``vllm/entrypoints/openai/completion/protocol.py``); the stream ends with a
  ``choices: []`` chunk carrying ``usage`` and, with ``--per-request-spec-decode-metrics``,
  ``metrics.speculative_decoding`` (``num_spec_steps``, ``num_draft_tokens``, ``num_accepted_draft_tokens``,
  ``mean_acceptance_length``, ``draft_acceptance_rate``, ``acceptance_histogram``, ``num_spec_tokens``:
  ``vllm/entrypoints/generate/base/protocol.py``, ``.../openai/completion/serving.py``; docs
  ``features/speculative_decoding/acceptance_metrics.md``), then ``data: [DONE]``. An error mid-stream is a
  chunk ``{"error": {"message", "type", "param", "code"}}`` (``vllm/entrypoints/serve/engine/protocol.py``).
- ``GET /health`` (200 when the engine is up, 503 when it died: ``vllm/entrypoints/serve/instrumentator/health.py``)
  and ``GET /metrics``: counters ``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
  ``vllm:spec_decode_num_accepted_tokens_total``, ``vllm:spec_decode_num_accepted_tokens_per_pos_total`` (label
  ``position``), ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``,
  each with labels ``model_name`` and ``engine`` (``vllm/v1/spec_decode/metrics.py``, ``vllm/v1/metrics/loggers.py``).

Every flag of :meth:`VllmFlavour.command` is an option of v0.34.0's own ``vllm serve`` parser, and every key it writes
into ``--speculative-config`` a field of its ``SpeculativeConfig`` (tests/data/engines/ holds both lists, and the
tests check them). Other releases differ (the per-request acceptance is recent and marked experimental): pin vLLM to
the release above, or check these files in yours.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from spectune.engines.prometheus import read_metrics
from spectune.engines.server import StreamEvent
from spectune.errors import SpectuneError
from spectune.methods import Method

logger = logging.getLogger(__name__)

VLLM_VERSION = "0.34.0"
METHODS = ("ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp")  # speculative methods spectune drives
NEEDS_DRAFT = ("draft_model", "eagle", "eagle3")  # methods whose `model` is a draft or head spectune must name
# SpeculativeConfig fields a method's settings may set (vllm/config/speculative.py, v0.34.0): extra keys are
# refused by vLLM, so they are refused here first; `method` and `num_speculative_tokens` are the method's own
SETTINGS = frozenset({"model", "revision", "quantization", "draft_tensor_parallel_size", "max_model_len",
                      "prompt_lookup_max", "prompt_lookup_min", "suffix_decoding_max_tree_depth",
                      "suffix_decoding_max_cached_requests", "suffix_decoding_corpus_tokens",
                      "rejection_sample_method", "draft_sample_method", "enforce_eager", "attention_backend",
                      "kv_cache_dtype"})
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # vllm/config/model.py ModelDType
OWNED_FLAGS = ("--host", "--port", "--seed", "--max-num-seqs", "--speculative-config", "-sc",
               "--per-request-spec-decode-metrics", "--generation-config", "--disable-log-requests",
               "--enable-log-requests")
SPEC_COUNTERS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "num_spec_tokens",
                 "mean_acceptance_length", "draft_acceptance_rate")
METRICS_SUMMED = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                  "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                  "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total")


@dataclass
class VllmDrafts:
    """``engine.drafts``: what drafts for each model-based method (a hub id or a folder; null: none given)."""

    draft_model: str | None = MISSING  # a small model of the target's vocabulary
    eagle: str | None = MISSING  # an EAGLE head trained on the target
    eagle3: str | None = MISSING  # an EAGLE-3 head trained on the target


@dataclass
class VllmNgram:
    """``engine.ngram``: prompt lookup's n-gram lengths (``prompt_lookup_min`` to ``prompt_lookup_max``)."""

    prompt_lookup_min: int = MISSING
    prompt_lookup_max: int = MISSING


@dataclass
class VllmSuffix:
    """``engine.suffix``: suffix decoding's tree depth and its cross-request cache (0: per-request trees only)."""

    max_tree_depth: int = MISSING
    max_cached_requests: int = MISSING


@dataclass
class VllmConfig:
    """``engine=vllm``: conf/engine/vllm.yaml."""

    name: str = MISSING
    model: str = MISSING  # the target: a hub id or a folder
    revision: str | None = MISSING
    seed: int = MISSING  # --seed (the run's seed)
    methods: list[str] = MISSING  # the grid's speculative methods, each at every γ, beside AR
    drafts: VllmDrafts = dataclasses.field(default_factory=VllmDrafts)
    ngram: VllmNgram = dataclasses.field(default_factory=VllmNgram)
    suffix: VllmSuffix = dataclasses.field(default_factory=VllmSuffix)
    tensor_parallel_size: int = MISSING
    gpu_memory_utilization: float | None = MISSING  # null: vLLM's default
    dtype: str = MISSING
    max_model_len: int | None = MISSING  # null: the model's
    per_request_metrics: bool = MISSING  # --per-request-spec-decode-metrics summary on speculative servers
    extra_args: list[str] = MISSING  # further `vllm serve` flags, verbatim


class VllmFlavour:
    """What the server runner needs to start, feed and read a vLLM server for one method."""

    name = "vllm"
    schema = VllmConfig
    health_path = "/health"
    metrics_path = "/metrics"

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self._check_config()

    def _check_config(self) -> None:
        """The settings no method changes, checked once: one line each, before any server starts."""
        cfg = self.config
        unknown = [m for m in cfg.methods if m not in METHODS]
        if unknown:
            raise SpectuneError(f"engine.methods={unknown} is invalid for engine=vllm: choose from "
                                f"{', '.join(METHODS)}")
        if cfg.dtype not in DTYPES:
            raise SpectuneError(f"engine.dtype={cfg.dtype!r} is invalid for engine=vllm: one of {', '.join(DTYPES)}")
        if cfg.tensor_parallel_size < 1:
            raise SpectuneError(f"engine.tensor_parallel_size={cfg.tensor_parallel_size} is invalid: an integer >= 1")
        if cfg.gpu_memory_utilization is not None and not 0 < cfg.gpu_memory_utilization <= 1:
            raise SpectuneError(f"engine.gpu_memory_utilization={cfg.gpu_memory_utilization} is invalid: in (0, 1] "
                                "or null")
        owned = [a for a in cfg.extra_args if a.split("=", 1)[0] in OWNED_FLAGS]
        if owned:
            raise SpectuneError(f"engine.extra_args={owned} sets flags spectune sets itself ({', '.join(OWNED_FLAGS)})"
                                ": give them through the engine's config or the task")

    def check(self, method: Method) -> None:
        """``method`` is one vLLM runs with these settings, or a one-line :class:`SpectuneError`."""
        self.speculative_config(method)

    def speculative_config(self, method: Method) -> dict[str, Any] | None:
        """``--speculative-config`` for ``method`` (None: AR, no speculation). ``num_speculative_tokens`` is γ; the
        method's settings (:data:`SETTINGS`) override the engine's for this method."""
        if not method.speculative:
            return None
        if method.name not in METHODS:
            raise SpectuneError(f"method {method.name!r} is not one engine=vllm runs: its speculative methods are "
                                f"{', '.join(METHODS)}")
        unknown = sorted(set(method.settings) - SETTINGS)
        if unknown:
            raise SpectuneError(f"method {method.label!r} sets {unknown}, which vLLM's --speculative-config does not "
                                f"take (v{VLLM_VERSION}): allowed {', '.join(sorted(SETTINGS))}")
        spec: dict[str, Any] = {"method": method.name, "num_speculative_tokens": method.gamma}
        if method.name == "ngram":
            spec.update(prompt_lookup_max=self.config.ngram.prompt_lookup_max,
                        prompt_lookup_min=self.config.ngram.prompt_lookup_min)
        elif method.name == "suffix":
            spec.update(suffix_decoding_max_tree_depth=self.config.suffix.max_tree_depth,
                        suffix_decoding_max_cached_requests=self.config.suffix.max_cached_requests)
        elif method.name in NEEDS_DRAFT:
            spec["model"] = getattr(self.config.drafts, method.name)
        spec.update(method.settings)
        if method.name in NEEDS_DRAFT and not spec.get("model"):
            raise SpectuneError(f"method {method.label!r} needs engine.drafts.{method.name} (what drafts for vLLM's "
                                f"{method.name!r} method): set it in conf/engine/vllm.yaml or on the command line")
        if method.name == "ngram":
            low, high = spec["prompt_lookup_min"], spec["prompt_lookup_max"]
            if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
                raise SpectuneError(f"method {method.label!r}: prompt_lookup_min={low!r} and prompt_lookup_max="
                                    f"{high!r} are invalid: integers with 1 <= prompt_lookup_min <= prompt_lookup_max")
        return spec

    def command(self, method: Method, port: int, threads: int, slots: int) -> list[str]:
        """The exact ``vllm serve`` command for ``method`` on ``port`` with ``slots`` concurrent sequences
        (``--max-num-seqs``). ``threads`` is not used: vLLM runs on the GPU and sizes its own CPU threads."""
        cfg = self.config
        spec = self.speculative_config(method)
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", cfg.model,
               "--host", "127.0.0.1", "--port", str(port), "--seed", str(cfg.seed), "--max-num-seqs", str(slots),
               "--tensor-parallel-size", str(cfg.tensor_parallel_size), "--dtype", cfg.dtype,
               "--generation-config", "vllm", "--disable-log-requests"]
        if cfg.revision is not None:
            cmd += ["--revision", cfg.revision]
        if cfg.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
        if cfg.max_model_len is not None:
            cmd += ["--max-model-len", str(cfg.max_model_len)]
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec)]
            if cfg.per_request_metrics:
                cmd += ["--per-request-spec-decode-metrics", "summary"]
        return [*cmd, *cfg.extra_args]

    def request(self, prompt_ids: Sequence[int], max_tokens: int, sampling: Any, seed: int) -> tuple[str, dict]:
        """``POST /v1/completions``: the prompt as token ids, streamed, every chunk with its token ids, usage (and
        the per-request acceptance) in the last chunk. ``sampling`` has ``temperature``, ``top_p`` and ``top_k``
        (0: off, as vLLM reads it); EOS ends a request as it would for a user."""
        return "/v1/completions", {
            "model": self.config.model, "prompt": [int(t) for t in prompt_ids], "max_tokens": int(max_tokens),
            "temperature": float(sampling.temperature), "top_p": float(sampling.top_p), "top_k": int(sampling.top_k),
            "seed": int(seed), "ignore_eos": False, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}

    def parse_event(self, event: Mapping[str, Any]) -> StreamEvent:
        """One chunk of the stream: its token ids, or on the closing usage chunk (``choices: []``) the request's
        counters (``prompt_tokens``, ``completion_tokens``; with per-request metrics, :data:`SPEC_COUNTERS` and
        ``acceptance_histogram[j]``). Anything else is a one-line :class:`SpectuneError`."""
        if not isinstance(event, Mapping):
            raise SpectuneError(f"engine=vllm sent a stream event that is not a JSON object: {event!r:.200}")
        if "error" in event:
            error = event["error"]
            message = error.get("message") if isinstance(error, Mapping) else error
            raise SpectuneError(f"engine=vllm failed the request: {message}")
        choices = event.get("choices")
        if not isinstance(choices, list) or len(choices) > 1:
            raise SpectuneError(f"engine=vllm sent a stream event without one choice or none: {dict(event)!r:.200}")
        if not choices:
            return StreamEvent(done=True, counters=_final_counters(event))
        ids = choices[0].get("token_ids") if isinstance(choices[0], Mapping) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise SpectuneError(f"engine=vllm sent a chunk without its token ids (choices[0].token_ids): "
                                f"{dict(event)!r:.200}")
        return StreamEvent(token_ids=tuple(ids), tokens=len(ids))

    def parse_metrics(self, text: str) -> dict[str, float]:
        """The speculative and token counters of ``GET /metrics`` (:data:`METRICS_SUMMED`), each summed over its
        series; per-position acceptance keyed by ``position``. A server without speculation has no
        ``vllm:spec_decode_*`` counters, and they are absent here."""
        return read_metrics(text, self.name, summed=METRICS_SUMMED,
                            split={"vllm:spec_decode_num_accepted_tokens_per_pos_total": "position"})


def _final_counters(event: Mapping[str, Any]) -> dict[str, float]:
    """The closing chunk's usage and per-request acceptance, as numbers under vLLM's names."""
    usage = event.get("usage")
    if not isinstance(usage, Mapping):
        raise SpectuneError(f"engine=vllm closed the stream without usage (stream_options.include_usage): "
                            f"{dict(event)!r:.200}")
    counters = {key: float(usage[key]) for key in ("prompt_tokens", "completion_tokens")
                if isinstance(usage.get(key), int | float)}
    spec = (event.get("metrics") or {}).get("speculative_decoding") or {}
    counters.update({key: float(spec[key]) for key in SPEC_COUNTERS if isinstance(spec.get(key), int | float)})
    for j, count in enumerate(spec.get("acceptance_histogram") or []):
        counters[f"acceptance_histogram[{j}]"] = float(count)
    return counters
