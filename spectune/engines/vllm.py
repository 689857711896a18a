"""vLLM as a server engine (``engine=vllm``): the flavour the server runner drives, and the schema of its config.

Every flag, key and name below was read in vLLM **v0.34.0**'s source (the PyPI wheel; on GitHub under the tag
``v0.34.0``) and its documentation, file by file:

- the server: ``vllm serve MODEL`` (``vllm/entrypoints/cli/serve.py``; the console script ``vllm`` is
  ``vllm.entrypoints.cli.main:main``). spectune runs ``engine.executable`` (``vllm`` on PATH by default), so vLLM
  may live in an environment of its own (its torch pin seldom matches spectune's); ``--host``, ``--port``
  (``vllm/entrypoints/common/cli_args.py``);
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

A method is ``engine.method`` (one of :data:`METHODS`) at each γ of the grid, beside AR (``vllm serve`` without
``--speculative-config``); :class:`VllmEngine` runs one server per method (:mod:`spectune.engines.server`).

Every flag of :meth:`VllmFlavour.command` is an option of v0.34.0's own ``vllm serve`` parser, and every key it writes
into ``--speculative-config`` a field of its ``SpeculativeConfig`` (tests/data/engines/ holds both lists, and the
tests check them). Other releases differ (the per-request acceptance is recent and marked experimental): pin vLLM to
the release above, or check these files in yours.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
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

VLLM_VERSION = "0.34.0"
METHODS = ("ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp")  # speculative methods spectune drives
NEEDS_DRAFT = ("draft_model", "eagle", "eagle3")  # methods whose `model` is a draft or head spectune must name
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # vllm/config/model.py ModelDType
OWNED_FLAGS = ("--host", "--port", "--seed", "--max-num-seqs", "--speculative-config", "-sc",
               "--per-request-spec-decode-metrics", "--generation-config", "--disable-log-requests",
               "--enable-log-requests")
METRICS = {  # vLLM's Prometheus counters (each summed over its series) -> spectune's names
    "vllm:spec_decode_num_drafts_total": "spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "spec_decode_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "spec_decode_accepted_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:request_success_total": "requests",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label `position`
GPU_NODE = "install vLLM on a GPU node and run there (docs/gpus.md)"


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
    executable: str = MISSING  # the `vllm` console script: a name on PATH or a path
    model: str = MISSING  # the target: a hub id or a folder
    revision: str | None = MISSING
    seed: int = MISSING  # --seed (the run's seed)
    method: str = MISSING  # the speculative method every γ of the grid runs, beside AR
    drafts: VllmDrafts = dataclasses.field(default_factory=VllmDrafts)
    ngram: VllmNgram = dataclasses.field(default_factory=VllmNgram)
    suffix: VllmSuffix = dataclasses.field(default_factory=VllmSuffix)
    tensor_parallel_size: int = MISSING
    gpu_memory_utilization: float | None = MISSING  # null: vLLM's default
    dtype: str = MISSING
    max_model_len: int | None = MISSING  # null: the model's
    per_request_metrics: bool = MISSING  # --per-request-spec-decode-metrics summary on speculative servers
    port: int | None = MISSING  # null: a free port per server; N: servers on N, N+1, ...
    ready_timeout_s: float = MISSING  # loading, compiling and capturing CUDA graphs take minutes
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
        if cfg.method not in METHODS:
            raise SpectuneError(f"engine.method={cfg.method!r} is invalid for engine=vllm: choose one of "
                                f"{', '.join(METHODS)} (AR is the baseline: task.baseline=true)")
        if cfg.dtype not in DTYPES:
            raise SpectuneError(f"engine.dtype={cfg.dtype!r} is invalid for engine=vllm: one of {', '.join(DTYPES)}")
        if cfg.tensor_parallel_size < 1:
            raise SpectuneError(f"engine.tensor_parallel_size={cfg.tensor_parallel_size} is invalid: an integer >= 1")
        if cfg.gpu_memory_utilization is not None and not 0 < cfg.gpu_memory_utilization <= 1:
            raise SpectuneError(f"engine.gpu_memory_utilization={cfg.gpu_memory_utilization} is invalid: in (0, 1] "
                                "or null")
        check_server_settings(cfg.port, cfg.ready_timeout_s)
        owned = [a for a in cfg.extra_args if a.split("=", 1)[0] in OWNED_FLAGS]
        if owned:
            raise SpectuneError(f"engine.extra_args={owned} sets flags spectune sets itself ({', '.join(OWNED_FLAGS)})"
                                ": give them through the engine's config or the task")

    def check(self, method: Method) -> None:
        """``method`` is one vLLM runs with these settings, or a one-line :class:`SpectuneError`."""
        self.speculative_config(method)

    def speculative_config(self, method: Method) -> dict[str, Any] | None:
        """``--speculative-config`` for ``method`` (None: AR, no speculation): ``num_speculative_tokens`` is γ, the
        rest the engine's settings for that method."""
        if not method.speculative:
            return None
        if method.name not in METHODS:
            raise SpectuneError(f"method {method.name!r} is not one engine=vllm runs: its speculative methods are "
                                f"{', '.join(METHODS)}")
        spec: dict[str, Any] = {"method": method.name, "num_speculative_tokens": method.gamma}
        if method.name == "ngram":
            low, high = self.config.ngram.prompt_lookup_min, self.config.ngram.prompt_lookup_max
            if not 1 <= low <= high:
                raise SpectuneError(f"engine.ngram.prompt_lookup_min={low} and prompt_lookup_max={high} are "
                                    "invalid: integers with 1 <= prompt_lookup_min <= prompt_lookup_max")
            spec.update(prompt_lookup_max=high, prompt_lookup_min=low)
        elif method.name == "suffix":
            spec.update(suffix_decoding_max_tree_depth=self.config.suffix.max_tree_depth,
                        suffix_decoding_max_cached_requests=self.config.suffix.max_cached_requests)
        elif method.name in NEEDS_DRAFT:
            spec["model"] = getattr(self.config.drafts, method.name)
            if not spec["model"]:
                raise SpectuneError(f"method {method.label!r} needs engine.drafts.{method.name} (what drafts for "
                                    f"vLLM's {method.name!r} method): set it in conf/engine/vllm.yaml or on the "
                                    "command line")
        return spec

    def command(self, method: Method, port: int, threads: int | None, slots: int) -> list[str]:
        """The exact ``vllm serve`` command for ``method`` on ``port`` with ``slots`` concurrent sequences
        (``--max-num-seqs``). ``threads`` is not used: vLLM runs on the GPU and sizes its own CPU threads."""
        cfg = self.config
        spec = self.speculative_config(method)
        cmd = [cfg.executable, "serve", cfg.model,
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
        return [*cmd, *map(str, cfg.extra_args)]

    def request(self, prompt_ids: Sequence[int], max_tokens: int, sampling: Any, seed: int,
                ignore_eos: bool = False) -> tuple[str, dict]:
        """``POST /v1/completions``: the prompt as token ids, streamed, every chunk with its token ids, usage (and
        the per-request acceptance) in the last chunk. ``sampling`` has ``temperature``, ``top_p`` and ``top_k``
        (0: off, as vLLM reads it); EOS ends a request as it would for a user, unless ``ignore_eos``."""
        return "/v1/completions", {
            "model": self.config.model, "prompt": [int(t) for t in prompt_ids], "max_tokens": int(max_tokens),
            "temperature": float(sampling.temperature), "top_p": float(sampling.top_p), "top_k": int(sampling.top_k),
            "seed": int(seed), "ignore_eos": bool(ignore_eos), "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}

    def parse_event(self, event: Mapping[str, Any]) -> StreamEvent:
        """One chunk of the stream: its token ids (and its ``finish_reason`` on the last one with a choice), or on
        the closing usage chunk (``choices: []``) the request's prompt tokens and, with per-request metrics, its
        drafted (``num_draft_tokens``) and accepted (``num_accepted_draft_tokens``) tokens. Anything else is a
        one-line :class:`~spectune.engines.server.ServerFailure`."""
        if not isinstance(event, Mapping):
            raise ServerFailure(f"engine=vllm sent a stream event that is not a JSON object: {event!r:.200}")
        if "error" in event:
            error = event["error"]
            message = error.get("message") if isinstance(error, Mapping) else error
            raise ServerFailure(f"engine=vllm failed the request: {message}")
        choices = event.get("choices")
        if not isinstance(choices, list) or len(choices) > 1:
            raise ServerFailure(f"engine=vllm sent a stream event without one choice or none: {dict(event)!r:.200}")
        if not choices:
            return _closing_event(event)
        ids = choices[0].get("token_ids") if isinstance(choices[0], Mapping) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ServerFailure(f"engine=vllm sent a chunk without its token ids (choices[0].token_ids): "
                                f"{dict(event)!r:.200}")
        return StreamEvent(list(ids), finish_reason=choices[0].get("finish_reason"))

    def parse_metrics(self, text: str) -> dict[str, float]:
        """The counters of ``GET /metrics`` by spectune's names (:data:`METRICS`), each summed over its series, and
        the accepted tokens per draft position (``spec_decode_accepted_tokens_per_position[j]``). A server
        without speculation has no ``vllm:spec_decode_*`` counters, and they are absent here."""
        raw = read_metrics(text, self.name, summed=[*METRICS, PER_POSITION], split={PER_POSITION: "position"})
        out = {METRICS[key]: value for key, value in raw.items() if key in METRICS}
        for key, value in raw.items():
            if key.startswith(PER_POSITION + "{"):
                position = key.split('"')[1]
                out[f"spec_decode_accepted_tokens_per_position[{position}]"] = value
        return out


def _closing_event(event: Mapping[str, Any]) -> StreamEvent:
    """The closing chunk: usage and, where vLLM reports them, the request's drafted and accepted tokens."""
    usage = event.get("usage")
    if not isinstance(usage, Mapping):
        raise ServerFailure(f"engine=vllm closed the stream without usage (stream_options.include_usage): "
                            f"{dict(event)!r:.200}")
    spec = (event.get("metrics") or {}).get("speculative_decoding") or {}
    return StreamEvent(done=True, prompt_tokens=_count(usage.get("prompt_tokens")),
                       drafted=_count(spec.get("num_draft_tokens")),
                       accepted=_count(spec.get("num_accepted_draft_tokens")))


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def settings_of(cfg: Any) -> VllmConfig:
    """``cfg.engine`` as typed, checked settings: each bad value one line naming its key."""
    settings = typed(VllmConfig, cfg.engine, "engine")
    VllmFlavour(settings)  # the settings no method changes
    return settings


def find_executable(settings: VllmConfig) -> Path:
    """The ``vllm`` console script, or one line naming what is missing and where to run."""
    found = shutil.which(settings.executable)
    if found is None:
        raise SpectuneError(f"engine=vllm needs the vllm executable (engine.executable={settings.executable!r}), "
                            f"which is not on PATH here: {GPU_NODE}, or set engine.executable to its path")
    return Path(found)


class VllmEngine(ServerEngine):
    """``engine=vllm``: one ``vllm serve`` per method (:class:`VllmFlavour`)."""

    engine = "vllm"

    def __init__(self, settings: VllmConfig, *, executable: Path, sampling: Any, slots: int, log_dir: Path) -> None:
        self.settings = settings
        settings = dataclasses.replace(settings, executable=str(executable))
        super().__init__(VllmFlavour(settings), sampling=sampling, seed=settings.seed, threads=None, slots=slots,
                         log_dir=log_dir, port=settings.port, ready_timeout_s=settings.ready_timeout_s)

    @classmethod
    def method_names(cls, cfg: Any) -> tuple[str, ...]:
        """What names this engine's speculative methods: ``engine.method`` (checked here, before any model loads)."""
        return (settings_of(cfg).method,)

    @classmethod
    def check_config(cls, cfg: Any, methods: Sequence[Method]) -> None:
        """Every method runs on vLLM as configured and the ``vllm`` executable is found: one line otherwise,
        before any model loads or any server starts."""
        settings = settings_of(cfg)
        flavour = VllmFlavour(settings)
        for method in methods:
            flavour.check(method)
        find_executable(settings)

    @classmethod
    def from_config(cls, cfg: Any, *, sampling: Any, slots: int, log_dir: Path, **_: Any) -> VllmEngine:
        """The engine ``cfg`` configures (``engine``, its model and seed interpolated from ``models`` and ``seed``);
        nothing starts until :meth:`open`."""
        settings = settings_of(cfg)
        return cls(settings, executable=find_executable(settings), sampling=sampling, slots=slots, log_dir=log_dir)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "checked_against": f"vLLM {VLLM_VERSION}", "method": self.settings.method,
                "executable": self.flavour.config.executable, "model": self.settings.model,
                "revision": self.settings.revision}
