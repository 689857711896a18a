"""SGLang as a server engine (``engine=sglang``): the flavour the server runner drives, and the schema of its config.

Every flag, key and name below was read in SGLang **v0.5.23**'s source (the PyPI wheel; on GitHub under
``python/`` at the tag ``v0.5.23``), file by file:

- the server: ``python -m sglang.launch_server`` (``sglang/launch_server.py``); its flags are the fields of
  ``sglang/srt/arg_groups/fields/*.py``, spelled ``--`` + the field name with ``-`` for ``_``
  (``sglang/srt/arg_groups/arg_utils.py``): ``--model-path``, ``--revision``, ``--dtype``, ``--context-length``
  (``model.py``); ``--host``, ``--port``, ``--incremental-streaming-output`` (``serving.py``: each streamed event
  then carries only its new ``output_ids``; by default they are cumulative); ``--random-seed``,
  ``--enable-deterministic-inference`` (``device.py``, ``exec_.py``); ``--tp-size`` (``parallel.py``);
  ``--mem-fraction-static``, ``--max-running-requests`` (``schedule.py``; without it speculative decoding resets
  it to 48: ``sglang/srt/arg_groups/speculative_hook.py``); ``--enable-metrics`` (``observability.py``: no
  ``/metrics`` without it).
- speculation (``spec.py``, checked in ``speculative_hook.py``): ``--speculative-algorithm`` EAGLE, EAGLE3, NEXTN
  (EAGLE's alias for multi-token-prediction layers), STANDALONE (a small draft model), NGRAM (and DFLASH, DSPARK,
  UNO, which spectune does not drive); ``--speculative-draft-model-path``, ``--speculative-num-steps``,
  ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``. For the EAGLE family γ is the number of steps,
  and with top-k 1 SGLang sets the draft tokens to steps + 1 (a chain); with top-k > 1 the tree's size is
  ``engine.num_draft_tokens``. For NGRAM the top-k is ``--speculative-ngram-max-bfs-breadth`` and the draft tokens
  count the last verified token as the tree's root (``sglang/srt/speculative/ngram_worker.py``,
  ``sglang/kernels/jit/csrc/ngram_corpus/result.cpp``): γ drafted tokens are ``--speculative-num-draft-tokens``
  γ + 1, a chain at breadth 1; ``--speculative-ngram-max-trie-depth`` and ``--speculative-ngram-match-type``
  (BFS, PROB) set its matching.
- the request: ``POST /generate`` with ``input_ids``, ``stream`` and ``sampling_params`` (``max_new_tokens``,
  ``temperature``, ``top_p``, ``top_k`` (-1: off; 0 is refused), ``ignore_eos``, ``sampling_seed``, which takes
  effect only under ``--enable-deterministic-inference``: ``sglang/srt/sampling/sampling_batch_info.py``) (schema
  ``sglang/api/v1/api_types.py``); each event is ``{"text", "output_ids", "meta_info"}``, the last with
  ``meta_info.finish_reason`` set and, on a speculative server, ``spec_verify_ct``, ``spec_num_correct_drafts``,
  ``spec_num_proposed_drafts``, ``spec_accept_rate``, ``spec_accept_length`` beside ``prompt_tokens``,
  ``completion_tokens`` and ``cached_tokens`` (``sglang/srt/managers/tokenizer_manager.py``); then
  ``data: [DONE]``. An error mid-stream is an event ``{"error": {"message", ...}}``
  (``sglang/srt/entrypoints/http_server.py``).
- ``GET /health`` is 503 while the server starts and 200 once it is up (with
  ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``, true by default, it generates one token when idle, like
  ``/health_generate``: ``http_server.py``, ``sglang/srt/environ.py``). ``GET /metrics`` has the counters
  ``sglang:spec_verify_calls_total``, ``sglang:generation_tokens_total``, ``sglang:prompt_tokens_total``,
  ``sglang:num_requests_total`` and the gauges ``sglang:spec_accept_length``, ``sglang:spec_accept_rate`` (the
  latest batch's, not cumulative) (``sglang/srt/observability/metrics_collector.py``).

Every flag of :meth:`SglangFlavour.command` is an option of v0.5.23's own parser (``ServerArgs.add_cli_args``;
tests/data/engines/ holds the list and the tests check it). Other releases may differ: pin SGLang to the release
above, or check these files in yours.
"""

from __future__ import annotations

import dataclasses
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

SGLANG_VERSION = "0.5.23"
# spectune's method name -> SGLang's --speculative-algorithm, and whether it needs a draft (its drafts key)
ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "nextn": "NEXTN", "standalone": "STANDALONE", "ngram": "NGRAM"}
NEEDS_DRAFT = ("eagle", "eagle3", "standalone")
# --speculative-* fields a method's settings may set (sglang/srt/arg_groups/fields/spec.py, v0.5.23, without the
# prefix); algorithm and num_steps are the method's own
SETTINGS = frozenset({"draft_model_path", "draft_model_revision", "eagle_topk", "num_draft_tokens",
                      "ngram_min_bfs_breadth", "ngram_max_bfs_breadth", "ngram_match_type", "ngram_max_trie_depth",
                      "ngram_capacity", "use_rejection_sampling", "token_map", "attention_mode",
                      "draft_attention_backend"})
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # fields/model.py dtype choices
OWNED_FLAGS = ("--host", "--port", "--random-seed", "--max-running-requests", "--enable-metrics",
               "--incremental-streaming-output", "--speculative-algorithm", "--speculative-num-steps")
META_COUNTERS = ("prompt_tokens", "completion_tokens", "cached_tokens", "spec_verify_ct", "spec_num_correct_drafts",
                 "spec_num_proposed_drafts", "spec_accept_rate", "spec_accept_length")
METRICS_SUMMED = ("sglang:spec_verify_calls_total", "sglang:generation_tokens_total", "sglang:prompt_tokens_total",
                  "sglang:num_requests_total")
METRICS_AVERAGED = ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_num_steps",
                    "sglang:spec_num_draft_tokens")


@dataclass
class SglangDrafts:
    """``engine.drafts``: what drafts for each model-based algorithm (a hub id or a folder; null: none given)."""

    eagle: str | None = MISSING  # an EAGLE head trained on the target
    eagle3: str | None = MISSING  # an EAGLE-3 head trained on the target
    standalone: str | None = MISSING  # a small model of the target's vocabulary
    nextn: str | None = MISSING  # null: the target's own multi-token-prediction layers


@dataclass
class SglangNgram:
    """``engine.ngram``: NGRAM's tree breadth (1: a chain), its trie's depth and how it picks matches."""

    max_bfs_breadth: int = MISSING
    min_bfs_breadth: int = MISSING
    max_trie_depth: int = MISSING
    match_type: str = MISSING  # BFS or PROB


@dataclass
class SglangConfig:
    """``engine=sglang``: conf/engine/sglang.yaml."""

    name: str = MISSING
    model: str = MISSING  # the target: a hub id or a folder
    revision: str | None = MISSING
    seed: int = MISSING  # --random-seed (the run's seed)
    methods: list[str] = MISSING  # the grid's speculative methods, each at every γ, beside AR
    drafts: SglangDrafts = dataclasses.field(default_factory=SglangDrafts)
    eagle_topk: int = MISSING  # 1: a chain of γ tokens; more: a tree of num_draft_tokens
    num_draft_tokens: int | None = MISSING  # the EAGLE tree's size when eagle_topk > 1
    ngram: SglangNgram = dataclasses.field(default_factory=SglangNgram)
    tp_size: int = MISSING
    mem_fraction_static: float | None = MISSING  # null: SGLang's choice
    dtype: str = MISSING
    context_length: int | None = MISSING  # null: the model's
    deterministic_inference: bool = MISSING  # --enable-deterministic-inference (then the request seed is used)
    extra_args: list[str] = MISSING  # further launch_server flags, verbatim


class SglangFlavour:
    """What the server runner needs to start, feed and read an SGLang server for one method."""

    name = "sglang"
    schema = SglangConfig
    health_path = "/health"
    metrics_path = "/metrics"

    def __init__(self, config: SglangConfig) -> None:
        self.config = config
        self._check_config()

    def _check_config(self) -> None:
        """The settings no method changes, checked once: one line each, before any server starts."""
        cfg = self.config
        unknown = [m for m in cfg.methods if m not in ALGORITHMS]
        if unknown:
            raise SpectuneError(f"engine.methods={unknown} is invalid for engine=sglang: choose from "
                                f"{', '.join(ALGORITHMS)}")
        if cfg.dtype not in DTYPES:
            raise SpectuneError(f"engine.dtype={cfg.dtype!r} is invalid for engine=sglang: one of "
                                f"{', '.join(DTYPES)}")
        for key in ("tp_size", "eagle_topk"):
            if getattr(cfg, key) < 1:
                raise SpectuneError(f"engine.{key}={getattr(cfg, key)} is invalid: an integer >= 1")
        if cfg.mem_fraction_static is not None and not 0 < cfg.mem_fraction_static < 1:
            raise SpectuneError(f"engine.mem_fraction_static={cfg.mem_fraction_static} is invalid: in (0, 1) or null")
        if cfg.ngram.match_type not in ("BFS", "PROB"):
            raise SpectuneError(f"engine.ngram.match_type={cfg.ngram.match_type!r} is invalid: BFS or PROB")
        owned = [a for a in cfg.extra_args if a.split("=", 1)[0] in OWNED_FLAGS]
        if owned:
            raise SpectuneError(f"engine.extra_args={owned} sets flags spectune sets itself ({', '.join(OWNED_FLAGS)})"
                                ": give them through the engine's config or the task")

    def check(self, method: Method) -> None:
        """``method`` is one SGLang runs with these settings, or a one-line :class:`SpectuneError`."""
        self.speculative_args(method)

    def speculative_args(self, method: Method) -> dict[str, Any]:
        """The ``--speculative-*`` settings for ``method`` (without the prefix; empty: AR). The method's settings
        (:data:`SETTINGS`) override the engine's for this method."""
        if not method.speculative:
            return {}
        if method.name not in ALGORITHMS:
            raise SpectuneError(f"method {method.name!r} is not one engine=sglang runs: its speculative methods are "
                                f"{', '.join(ALGORITHMS)}")
        unknown = sorted(set(method.settings) - SETTINGS)
        if unknown:
            raise SpectuneError(f"method {method.label!r} sets {unknown}, which are not SGLang's --speculative-* "
                                f"settings (v{SGLANG_VERSION}): allowed {', '.join(sorted(SETTINGS))}")
        cfg = self.config
        args: dict[str, Any] = {"algorithm": ALGORITHMS[method.name]}
        if method.name == "ngram":
            args.update(num_draft_tokens=method.gamma + 1, ngram_max_bfs_breadth=cfg.ngram.max_bfs_breadth,
                        ngram_min_bfs_breadth=cfg.ngram.min_bfs_breadth, ngram_max_trie_depth=cfg.ngram.max_trie_depth,
                        ngram_match_type=cfg.ngram.match_type)
        else:
            args.update(num_steps=method.gamma, eagle_topk=cfg.eagle_topk)
            draft = getattr(cfg.drafts, method.name)
            if draft is not None:
                args["draft_model_path"] = draft
        args.update(method.settings)
        if method.name != "ngram":
            topk, tokens = args["eagle_topk"], args.get("num_draft_tokens", cfg.num_draft_tokens)
            if topk == 1:
                tokens = method.gamma + 1  # what SGLang sets for a chain (speculative_hook.py)
            elif tokens is None:
                raise SpectuneError(f"method {method.label!r} with eagle_topk={topk} needs engine.num_draft_tokens "
                                    "(the tree's size: SGLang sets it only for a chain, top-k 1)")
            args["num_draft_tokens"] = tokens
        if method.name in NEEDS_DRAFT and not args.get("draft_model_path"):
            raise SpectuneError(f"method {method.label!r} needs engine.drafts.{method.name} (the draft of SGLang's "
                                f"{ALGORITHMS[method.name]}): set it in conf/engine/sglang.yaml or on the command line")
        return args

    def command(self, method: Method, port: int, threads: int, slots: int) -> list[str]:
        """The exact ``python -m sglang.launch_server`` command for ``method`` on ``port`` with ``slots`` running
        requests (``--max-running-requests``). ``threads`` is not used: SGLang runs on the GPU."""
        cfg = self.config
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", cfg.model,
               "--host", "127.0.0.1", "--port", str(port), "--random-seed", str(cfg.seed),
               "--max-running-requests", str(slots), "--tp-size", str(cfg.tp_size), "--dtype", cfg.dtype,
               "--enable-metrics", "--incremental-streaming-output"]
        if cfg.revision is not None:
            cmd += ["--revision", cfg.revision]
        if cfg.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
        if cfg.context_length is not None:
            cmd += ["--context-length", str(cfg.context_length)]
        if cfg.deterministic_inference:
            cmd += ["--enable-deterministic-inference"]
        for key, value in self.speculative_args(method).items():
            flag = "--speculative-" + key.replace("_", "-")
            if isinstance(value, bool):  # SGLang's booleans are store_true flags
                cmd += [flag] if value else []
            elif value is not None:
                cmd += [flag, str(value)]
        return [*cmd, *cfg.extra_args]

    def request(self, prompt_ids: Sequence[int], max_tokens: int, sampling: Any, seed: int) -> tuple[str, dict]:
        """``POST /generate`` with the prompt as token ids, streamed. ``sampling`` has ``temperature``, ``top_p``
        and ``top_k`` (spectune's 0 = off is SGLang's -1); EOS ends a request as it would for a user."""
        top_k = int(sampling.top_k)
        return "/generate", {
            "input_ids": [int(t) for t in prompt_ids], "stream": True,
            "sampling_params": {"max_new_tokens": int(max_tokens), "temperature": float(sampling.temperature),
                                "top_p": float(sampling.top_p), "top_k": top_k if top_k > 0 else -1,
                                "ignore_eos": False, "sampling_seed": int(seed)}}

    def parse_event(self, event: Mapping[str, Any]) -> StreamEvent:
        """One event of the stream: its new ``output_ids`` (the server streams increments), and on the last
        (``meta_info.finish_reason`` set) the request's counters (:data:`META_COUNTERS`, those SGLang reports, and
        ``spec_correct_drafts_histogram[j]``). Anything else is a one-line :class:`SpectuneError`."""
        if not isinstance(event, Mapping):
            raise SpectuneError(f"engine=sglang sent a stream event that is not a JSON object: {event!r:.200}")
        if "error" in event:
            error = event["error"]
            message = error.get("message") if isinstance(error, Mapping) else error
            raise SpectuneError(f"engine=sglang failed the request: {message}")
        ids, meta = event.get("output_ids"), event.get("meta_info")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise SpectuneError(f"engine=sglang sent an event without its output_ids: {dict(event)!r:.200}")
        if not isinstance(meta, Mapping):
            raise SpectuneError(f"engine=sglang sent an event without its meta_info: {dict(event)!r:.200}")
        if meta.get("finish_reason") is None:
            return StreamEvent(token_ids=tuple(ids), tokens=len(ids))
        counters = {key: float(meta[key]) for key in META_COUNTERS
                    if isinstance(meta.get(key), int | float) and not isinstance(meta.get(key), bool)}
        for j, count in enumerate(meta.get("spec_correct_drafts_histogram") or []):
            counters[f"spec_correct_drafts_histogram[{j}]"] = float(count)
        return StreamEvent(token_ids=tuple(ids), tokens=len(ids), done=True, counters=counters)

    def parse_metrics(self, text: str) -> dict[str, float]:
        """The speculative and token counters of ``GET /metrics`` (:data:`METRICS_SUMMED`, summed over their
        series) and the latest batch's acceptance gauges (:data:`METRICS_AVERAGED`, averaged over their series).
        A server without speculation has no ``sglang:spec_*`` samples, and they are absent here."""
        return read_metrics(text, self.name, summed=METRICS_SUMMED, averaged=METRICS_AVERAGED)
