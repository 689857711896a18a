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

A method is ``engine.method`` (a key of :data:`ALGORITHMS`) at each γ of the grid, beside AR (no
``--speculative-algorithm``); :class:`SglangEngine` runs one server per method (:mod:`spectune.engines.server`) with
``engine.python`` (null: this Python), so SGLang may live in an environment of its own.

Every flag of :meth:`SglangFlavour.command` is an option of v0.5.23's own parser (``ServerArgs.add_cli_args``;
tests/data/engines/ holds the list and the tests check it). Other releases may differ: pin SGLang to the release
above, or check these files in yours.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from spectune.config import typed
from spectune.engines.prometheus import read_metrics
from spectune.engines.server import ServerEngine, ServerFailure, StreamEvent, check_server_settings
from spectune.errors import SpectuneError
from spectune.methods import Method

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"
# spectune's method name -> SGLang's --speculative-algorithm, and whether it needs a draft (its drafts key)
ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "nextn": "NEXTN", "standalone": "STANDALONE", "ngram": "NGRAM"}
NEEDS_DRAFT = ("eagle", "eagle3", "standalone")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # fields/model.py dtype choices
OWNED_FLAGS = ("--host", "--port", "--random-seed", "--max-running-requests", "--enable-metrics",
               "--incremental-streaming-output", "--speculative-algorithm", "--speculative-num-steps")
METRICS = {  # SGLang's Prometheus counters (each summed over its series) -> spectune's names
    "sglang:spec_verify_calls_total": "spec_decode_num_drafts",  # verification steps, as vLLM's drafts count them
    "sglang:prompt_tokens_total": "prompt_tokens",
    "sglang:generation_tokens_total": "generation_tokens",
    "sglang:num_requests_total": "requests",
}
GPU_NODE = "install SGLang on a GPU node and run there (docs/gpus.md)"


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
    python: str | None = MISSING  # the Python that has SGLang (a name on PATH or a path); null: this one
    model: str = MISSING  # the target: a hub id or a folder
    revision: str | None = MISSING
    seed: int = MISSING  # --random-seed (the run's seed)
    method: str = MISSING  # the speculative method every γ of the grid runs, beside AR
    drafts: SglangDrafts = dataclasses.field(default_factory=SglangDrafts)
    eagle_topk: int = MISSING  # 1: a chain of γ tokens; more: a tree of num_draft_tokens
    num_draft_tokens: int | None = MISSING  # the EAGLE tree's size when eagle_topk > 1
    ngram: SglangNgram = dataclasses.field(default_factory=SglangNgram)
    tp_size: int = MISSING
    mem_fraction_static: float | None = MISSING  # null: SGLang's choice
    dtype: str = MISSING
    context_length: int | None = MISSING  # null: the model's
    deterministic_inference: bool = MISSING  # --enable-deterministic-inference (then the request seed is used)
    port: int | None = MISSING  # null: a free port per server; N: servers on N, N+1, ...
    ready_timeout_s: float = MISSING  # loading and capturing CUDA graphs take minutes
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
        if cfg.method not in ALGORITHMS:
            raise SpectuneError(f"engine.method={cfg.method!r} is invalid for engine=sglang: choose one of "
                                f"{', '.join(ALGORITHMS)} (AR is the baseline: task.baseline=true)")
        if cfg.dtype not in DTYPES:
            raise SpectuneError(f"engine.dtype={cfg.dtype!r} is invalid for engine=sglang: one of "
                                f"{', '.join(DTYPES)}")
        for key in ("tp_size", "eagle_topk"):
            if getattr(cfg, key) < 1:
                raise SpectuneError(f"engine.{key}={getattr(cfg, key)} is invalid: an integer >= 1")
        if cfg.mem_fraction_static is not None and not 0 < cfg.mem_fraction_static < 1:
            raise SpectuneError(f"engine.mem_fraction_static={cfg.mem_fraction_static} is invalid: in (0, 1) or null")
        check_server_settings(cfg.port, cfg.ready_timeout_s)
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
        """The ``--speculative-*`` settings for ``method`` (without the prefix; empty: AR): γ and the engine's
        settings for that algorithm."""
        if not method.speculative:
            return {}
        if method.name not in ALGORITHMS:
            raise SpectuneError(f"method {method.name!r} is not one engine=sglang runs: its speculative methods are "
                                f"{', '.join(ALGORITHMS)}")
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
        if method.name != "ngram":
            topk, tokens = args["eagle_topk"], cfg.num_draft_tokens
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

    def command(self, method: Method, port: int, threads: int | None, slots: int) -> list[str]:
        """The exact ``python -m sglang.launch_server`` command for ``method`` on ``port`` with ``slots`` running
        requests (``--max-running-requests``). ``threads`` is not used: SGLang runs on the GPU."""
        cfg = self.config
        cmd = [cfg.python or sys.executable, "-m", "sglang.launch_server", "--model-path", cfg.model,
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
        return [*cmd, *map(str, cfg.extra_args)]

    def request(self, prompt_ids: Sequence[int], max_tokens: int, sampling: Any, seed: int,
                ignore_eos: bool = False) -> tuple[str, dict]:
        """``POST /generate`` with the prompt as token ids, streamed. ``sampling`` has ``temperature``, ``top_p``
        and ``top_k`` (spectune's 0 = off is SGLang's -1); EOS ends a request as it would for a user, unless
        ``ignore_eos``."""
        top_k = int(sampling.top_k)
        return "/generate", {
            "input_ids": [int(t) for t in prompt_ids], "stream": True,
            "sampling_params": {"max_new_tokens": int(max_tokens), "temperature": float(sampling.temperature),
                                "top_p": float(sampling.top_p), "top_k": top_k if top_k > 0 else -1,
                                "ignore_eos": bool(ignore_eos), "sampling_seed": int(seed)}}

    def parse_event(self, event: Mapping[str, Any]) -> StreamEvent:
        """One event of the stream: its new ``output_ids`` (the server streams increments), and on the last
        (``meta_info.finish_reason`` set) the request's prompt tokens, drafted (``spec_num_proposed_drafts``) and
        accepted (``spec_num_correct_drafts``) tokens where SGLang reports them. Anything else is a one-line
        :class:`~spectune.engines.server.ServerFailure`."""
        if not isinstance(event, Mapping):
            raise ServerFailure(f"engine=sglang sent a stream event that is not a JSON object: {event!r:.200}")
        if "error" in event:
            error = event["error"]
            message = error.get("message") if isinstance(error, Mapping) else error
            raise ServerFailure(f"engine=sglang failed the request: {message}")
        ids, meta = event.get("output_ids"), event.get("meta_info")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ServerFailure(f"engine=sglang sent an event without its output_ids: {dict(event)!r:.200}")
        if not isinstance(meta, Mapping):
            raise ServerFailure(f"engine=sglang sent an event without its meta_info: {dict(event)!r:.200}")
        finish = meta.get("finish_reason")
        if finish is None:
            return StreamEvent(list(ids))
        reason = finish.get("type") if isinstance(finish, Mapping) else str(finish)  # {"type": "length", ...}
        return StreamEvent(list(ids), done=True, prompt_tokens=_count(meta.get("prompt_tokens")),
                           drafted=_count(meta.get("spec_num_proposed_drafts")),
                           accepted=_count(meta.get("spec_num_correct_drafts")), finish_reason=reason)

    def parse_metrics(self, text: str) -> dict[str, float]:
        """The counters of ``GET /metrics`` by spectune's names (:data:`METRICS`), each summed over its series. The
        acceptance gauges (``sglang:spec_accept_length``, ``..._rate``) are the latest batch's, not counts over a
        block, and are not kept. A server without speculation has no ``sglang:spec_*`` samples: absent here."""
        raw = read_metrics(text, self.name, summed=METRICS)
        return {METRICS[key]: value for key, value in raw.items()}


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def settings_of(cfg: Any) -> SglangConfig:
    """``cfg.engine`` as typed, checked settings: each bad value one line naming its key."""
    settings = typed(SglangConfig, cfg.engine, "engine")
    SglangFlavour(settings)  # the settings no method changes
    return settings


def find_sglang(settings: SglangConfig) -> str:
    """The Python that runs ``sglang.launch_server`` (this one has SGLang, or ``engine.python`` is found), or one
    line naming what is missing and where to run."""
    if settings.python is None:
        if importlib.util.find_spec("sglang") is None:
            raise SpectuneError(f"engine=sglang needs SGLang, which this Python ({sys.executable}) cannot import: "
                                f"{GPU_NODE}, or set engine.python to a Python that has it")
        return sys.executable
    found = shutil.which(settings.python)
    if found is None:
        raise SpectuneError(f"engine=sglang needs engine.python={settings.python!r}, which is not on PATH here: "
                            f"{GPU_NODE}, or set engine.python to the path of a Python that has it")
    return found


class SglangEngine(ServerEngine):
    """``engine=sglang``: one ``python -m sglang.launch_server`` per method (:class:`SglangFlavour`)."""

    engine = "sglang"

    def __init__(self, settings: SglangConfig, *, python: str, sampling: Any, slots: int, log_dir: Path) -> None:
        self.settings = settings
        settings = dataclasses.replace(settings, python=python)
        super().__init__(SglangFlavour(settings), sampling=sampling, seed=settings.seed, threads=None, slots=slots,
                         log_dir=log_dir, port=settings.port, ready_timeout_s=settings.ready_timeout_s)

    @classmethod
    def method_names(cls, cfg: Any) -> tuple[str, ...]:
        """What names this engine's speculative methods: ``engine.method`` (checked here, before any model loads)."""
        return (settings_of(cfg).method,)

    @classmethod
    def check_config(cls, cfg: Any, methods: Sequence[Method]) -> None:
        """Every method runs on SGLang as configured and a Python with SGLang is found: one line otherwise, before
        any model loads or any server starts."""
        settings = settings_of(cfg)
        flavour = SglangFlavour(settings)
        for method in methods:
            flavour.check(method)
        find_sglang(settings)

    @classmethod
    def from_config(cls, cfg: Any, *, sampling: Any, slots: int, log_dir: Path, **_: Any) -> SglangEngine:
        """The engine ``cfg`` configures; nothing starts until :meth:`open`."""
        settings = settings_of(cfg)
        return cls(settings, python=find_sglang(settings), sampling=sampling, slots=slots, log_dir=log_dir)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "checked_against": f"SGLang {SGLANG_VERSION}", "method": self.settings.method,
                "python": self.flavour.config.python, "model": self.settings.model,
                "revision": self.settings.revision}
