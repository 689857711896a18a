"""``engine=llamacpp``: llama.cpp's ``llama-server`` on the CPU, built from the pinned llama-cpp-python sdist
(:mod:`spectune.engines.llamacpp_build`), one server per method (:mod:`spectune.engines.server`).

A method's name is a speculative type of llama-server (``--spec-type``) and its γ that type's draft length, a server
setting (this build compiles per-request speculative fields out, and ignores unknown request keys silently):

================  ==============================================  ======================================
spec type         γ is                                            what drafts
================  ==============================================  ======================================
none (AR)         0 (no ``--spec-type``: the server's default)    nothing
draft-simple      ``--spec-draft-n-max``                          a draft model (``engine.draft_model``)
ngram-simple      ``--spec-ngram-simple-size-m`` (1..1024)        the context's n-grams, looked up
ngram-map-k       ``--spec-ngram-map-k-size-m`` (1..1024)         an n-gram map of the context
ngram-map-k4v     ``--spec-ngram-map-k4v-size-m`` (1..1024)       the same, keeping 4 values per key
ngram-mod         ``--spec-ngram-mod-n-max`` (1..1024)            a hashed n-gram pool shared by requests
ngram-cache       fixed at 8 by this build                        an n-gram cache (γ = 8 only)
================  ==============================================  ======================================

With ``engine.draft_model`` null, draft-simple drafts with ``models.draft`` as a GGUF with the target's vocabulary,
written once by ``python -m spectune.engines.llamacpp_build --draft`` (:func:`draft_of`).

ngram-mod drops a draft shorter than ``--spec-ngram-mod-n-min`` (``engine.ngram_mod_n_min``, default 1: any draft
up to γ, as spectune's prompt lookup) and looks drafts up by the last ``--spec-ngram-mod-n-match`` tokens
(``engine.ngram_mod_n_match``, the server's default 24). Every flag was checked against this build's
``common/arg.cpp``; the types it has that need a draft of their own kind (draft-eagle3, draft-mtp, draft-dflash,
draft-dspark) are refused.

Each server runs with ``--poll 0`` (an idle server busy-waits otherwise, and every method's server is up at once),
``-np`` = the run's concurrency, ``-t`` = ``hardware.threads``, ``--metrics`` and no RAM prompt cache
(``--cache-ram 0``); each request turns ``cache_prompt`` off and sends the prompt's token ids (``/completion``,
``"prompt": [ids]``), so tokenisation cannot differ from spectune's; the prompt tokens the server evaluated are
checked against the ids sent. The sampling law is the workload's, in spectune's order (temperature, top-k, top-p;
min-p, penalties, DRY, XTC off), the seed per request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectune.config import typed
from spectune.engines import llamacpp_build as build
from spectune.engines.server import ServerEngine, StreamEvent, check_server_settings
from spectune.errors import SpectuneError
from spectune.methods import Method
from spectune.models import draft_vocab, gguf
from spectune.models.loading import resolve

log = logging.getLogger(__name__)

MAX_NGRAM = 1024  # the n-gram types' limit on their sizes (common/arg.cpp)
NGRAM_CACHE_DRAFT = 8  # ngram-cache drafts a fixed 8 tokens in this build (common/speculative.cpp)
# spec type -> the flag its γ sets (None: fixed by the build)
LENGTH_FLAG: dict[str, str | None] = {
    "draft-simple": "--spec-draft-n-max",
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
    "ngram-cache": None,
}
NEEDS_OWN_DRAFT = ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
WEIGHTS = ("shipped", "f32")
METRICS = {  # llama-server's Prometheus counters -> spectune's names
    "llamacpp:spec_decode_num_drafts_total": "spec_decode_num_drafts",
    "llamacpp:spec_decode_num_draft_tokens_total": "spec_decode_draft_tokens",
    "llamacpp:spec_decode_num_accepted_tokens_total": "spec_decode_accepted_tokens",
    "llamacpp:prompt_tokens_total": "prompt_tokens",
    "llamacpp:tokens_predicted_total": "generation_tokens",
    "llamacpp:n_decode_total": "decode_calls",
}


@dataclass
class LlamaCppConfig:
    """``engine=llamacpp``: conf/engine/llamacpp.yaml (read with :func:`spectune.config.typed`)."""

    name: str = "llamacpp"
    spec_type: Any = "ngram-mod"  # a type, or a list of them: every γ of the grid runs on each (:func:`types_of`)
    weights: str = "shipped"
    draft_model: str | None = None
    ngram_mod_n_min: int = 1
    ngram_mod_n_match: int = 24
    ngram_simple_size_n: int = 3
    ctx_size: int | None = None
    port: int | None = None
    ready_timeout_s: float = 120.0
    server_args: list[str] = field(default_factory=list)
    version: str = build.VERSION


def spec_types() -> list[str]:
    """The speculative types a method may name (AR, the server's default ``none``, is the baseline: task.baseline)."""
    return list(LENGTH_FLAG)


class LlamaCppFlavour:
    """llama-server, as :class:`~spectune.engines.server.ServerEngine` drives it."""

    health_path = "/health"
    metrics_path = "/metrics"

    def __init__(self, settings: LlamaCppConfig, *, server: Path, model: Path, draft: Path | None = None) -> None:
        self.settings, self.server, self.model, self.draft = settings, server, model, draft

    def check(self, method: Method) -> None:
        check_method(method, self.settings)

    def command(self, method: Method, port: int, threads: int | None, slots: int) -> list[str]:
        s = self.settings
        cmd = [str(self.server), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(slots), "--poll", "0", "--metrics", "--no-webui", "--cache-ram", "0"]
        if threads:
            cmd += ["-t", str(threads)]
        if s.ctx_size:
            cmd += ["-c", str(s.ctx_size)]
        if method.speculative:
            cmd += ["--spec-type", method.name]
            if LENGTH_FLAG[method.name]:
                cmd += [LENGTH_FLAG[method.name], str(method.gamma)]
            if method.name == "ngram-mod":
                cmd += ["--spec-ngram-mod-n-min", str(s.ngram_mod_n_min), "--spec-ngram-mod-n-match",
                        str(s.ngram_mod_n_match)]
            if method.name == "ngram-simple":
                cmd += ["--spec-ngram-simple-size-n", str(s.ngram_simple_size_n)]
            if method.name == "draft-simple":
                cmd += ["-md", str(self.draft)]
                if threads:
                    cmd += ["-td", str(threads)]
        return [*cmd, *map(str, s.server_args)]

    def request(self, prompt_ids: list[int], max_tokens: int, sampling: Any, seed: int,
                ignore_eos: bool = False) -> tuple[str, dict]:
        body = {"prompt": list(prompt_ids), "n_predict": int(max_tokens), "ignore_eos": bool(ignore_eos),
                "stream": True, "cache_prompt": False,
                "return_tokens": True, "temperature": float(sampling.temperature), "top_k": int(sampling.top_k),
                "top_p": float(sampling.top_p), "min_p": 0.0, "typical_p": 1.0, "top_n_sigma": -1.0,
                "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
                "xtc_probability": 0.0, "mirostat": 0, "n_probs": 0,
                "samplers": ["temperature", "top_k", "top_p"], "seed": int(seed)}
        return "/completion", body

    def parse_event(self, event: dict) -> StreamEvent:
        tokens = [int(t) for t in event.get("tokens") or []]
        if not event.get("stop"):
            return StreamEvent(tokens)
        timings = event.get("timings") or {}
        # draft_n / draft_n_accepted are present only when the request drafted (tools/server/server-common.cpp)
        drafted = timings.get("draft_n", 0) if timings else None
        accepted = timings.get("draft_n_accepted", 0) if timings else None
        return StreamEvent(tokens, done=True, prompt_tokens=event.get("tokens_evaluated"), drafted=drafted,
                           accepted=accepted, prompt_ms=timings.get("prompt_ms"), decode_ms=timings.get("predicted_ms"),
                           finish_reason=event.get("stop_type"))

    def parse_metrics(self, text: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.strip().partition(" ")
            if name in METRICS:
                try:
                    out[METRICS[name]] = float(value)
                except ValueError:
                    continue
        return out


def check_method(method: Method, s: LlamaCppConfig) -> None:
    """One line when llama-server cannot run ``method`` as configured."""
    if not method.speculative:
        return
    name, gamma = method.name, method.gamma
    if name in NEEDS_OWN_DRAFT:
        raise SpectuneError(f"spec type {name!r} needs a draft of its own kind, which spectune does not set up: "
                            f"choose one of {', '.join(spec_types())}")
    if name not in LENGTH_FLAG:
        raise SpectuneError(f"spec type {name!r} (method {method.label}) is unknown to llama-server "
                            f"{s.version}: choose one of {', '.join(spec_types())}")
    if name == "ngram-cache" and gamma != NGRAM_CACHE_DRAFT:
        raise SpectuneError(f"gamma={gamma} is invalid for spec type ngram-cache: llama-server {s.version} drafts a "
                            f"fixed {NGRAM_CACHE_DRAFT} tokens with it (gamma={NGRAM_CACHE_DRAFT} only)")
    if name.startswith("ngram-") and name != "ngram-cache" and not 1 <= gamma <= MAX_NGRAM:
        raise SpectuneError(f"gamma={gamma} is invalid for spec type {name}: 1..{MAX_NGRAM}")
    if name == "ngram-simple" and gamma < s.ngram_simple_size_n:
        raise SpectuneError(f"gamma={gamma} is invalid for spec type ngram-simple with engine.ngram_simple_size_n="
                            f"{s.ngram_simple_size_n}: llama-server drafts nothing when the draft length is below the "
                            f"lookup n-gram's size (common/ngram-map.cpp); use gamma >= {s.ngram_simple_size_n} or a "
                            "smaller engine.ngram_simple_size_n")
    if name == "ngram-mod" and not 0 <= s.ngram_mod_n_min <= gamma:
        raise SpectuneError(f"engine.ngram_mod_n_min={s.ngram_mod_n_min} is invalid with gamma={gamma}: "
                            f"0..{gamma} (a shorter draft is dropped)")


def types_of(value: Any) -> tuple[str, ...]:
    """``engine.spec_type`` as the types it names (one, or a list: every γ of the grid runs on each, all their servers
    up together and interleaved), each valid and named once; one line otherwise."""
    types = [value] if isinstance(value, str) else value
    if not isinstance(types, list | tuple) or not types or not all(isinstance(t, str) for t in types):
        raise SpectuneError(f"engine.spec_type={value!r} is invalid: a spec type or a list of them, from "
                            f"{', '.join(spec_types())}")
    for t in types:
        if t == "none":
            raise SpectuneError("engine.spec_type=none is the AR baseline (task.baseline=true runs it): choose one of "
                                f"{', '.join(spec_types())}")
        if t not in spec_types():
            raise SpectuneError(f"engine.spec_type={t!r} is invalid: choose one of {', '.join(spec_types())}")
    if len(set(types)) != len(types):
        raise SpectuneError(f"engine.spec_type={list(types)} is invalid: each spec type may appear once")
    return tuple(types)


def settings_of(cfg: Any) -> LlamaCppConfig:
    """``cfg.engine`` as typed settings, each bad value one line naming its key."""
    s = typed(LlamaCppConfig, cfg.engine, "engine")
    types_of(s.spec_type)  # one line when a type is bad
    if s.weights not in WEIGHTS:
        raise SpectuneError(f"engine.weights={s.weights!r} is invalid: shipped (the models' GGUF as it is) or f32 "
                            "(the same weights dequantised by llama-quantize: what engine=spectune computes with)")
    if not 1 <= s.ngram_mod_n_match <= MAX_NGRAM:
        raise SpectuneError(f"engine.ngram_mod_n_match={s.ngram_mod_n_match} is invalid: 1..{MAX_NGRAM} (the n-gram "
                            "a draft is looked up by; the server warns below 16)")
    if not 1 <= s.ngram_simple_size_n <= MAX_NGRAM:
        raise SpectuneError(f"engine.ngram_simple_size_n={s.ngram_simple_size_n} is invalid: 1..{MAX_NGRAM} (the "
                            "n-gram ngram-simple looks its draft up by)")
    check_server_settings(s.port, s.ready_timeout_s)
    return s


def gguf_of(name_or_path: str, what: str) -> Path:
    """A GGUF file from a ``gguf:`` name or a plain path; one line when it is neither."""
    if gguf.is_gguf(name_or_path):
        return gguf.locate(name_or_path)
    path = Path(os.path.expanduser(str(name_or_path)))
    if path.suffix == ".gguf":
        return path  # not checked here: a missing file is the server's to report (it never becomes ready)
    raise SpectuneError(f"engine=llamacpp needs a GGUF {what}: {name_or_path!r} is not one (use models=smollm2, "
                        "or a gguf:<package>/<file>.gguf or /path/to/file.gguf)")


def draft_of(cfg: Any, settings: LlamaCppConfig, shipped: Path) -> Path:
    """draft-simple's draft: ``engine.draft_model``, or (null) ``models.draft`` as the GGUF that
    ``python -m spectune.engines.llamacpp_build --draft`` wrote (:mod:`spectune.models.draft_gguf`: the target's full
    vocabulary, the ids outside the draft's at logit -1e4); one line naming that command when it was never written."""
    if settings.draft_model:
        return gguf_of(settings.draft_model, "draft model (engine.draft_model)")
    name = str((cfg.models.get("draft") or {}).get("name_or_path") or "")
    if gguf.is_gguf(name) or name.endswith(".gguf"):
        return gguf_of(name, "draft model (models.draft.name_or_path)")
    folder, local = resolve(name) if name else ("", False)
    if not local or not draft_vocab.is_reduced(folder):
        raise SpectuneError(f"spec type draft-simple needs a GGUF draft with the target's vocabulary: models.draft "
                            f"({name or 'none'}) is not a reduced-vocabulary draft spectune exports; set "
                            "engine.draft_model to a GGUF (a path, or gguf:<package>/<file>.gguf)")
    command = build.draft_command(name, str(cfg.models.target.name_or_path))
    if build.find_build(settings.version) is None:
        raise SpectuneError(f"llama.cpp (llama-cpp-python {settings.version}) is not built and the draft {name} has "
                            f"no GGUF for llama-server: run `{command}` (about 10 minutes, once)")
    found = build.draft_gguf(Path(folder), shipped, settings.version, write=False)
    if found is None:
        raise SpectuneError(f"the draft {name} has no GGUF for llama-server yet: run `{command}` (seconds, once)")
    return found


class LlamaCppEngine(ServerEngine):
    """``engine=llamacpp``: one llama-server per method (:class:`LlamaCppFlavour`)."""

    engine = "llamacpp"

    def __init__(self, settings: LlamaCppConfig, *, model: Path, shipped: Path, sampling: Any, seed: int,
                 threads: int | None, slots: int, log_dir: Path, draft: Path | None = None) -> None:
        self.settings, self.shipped = settings, shipped
        self.build = build.find_build(settings.version)
        server = Path(self.build["bin"]["llama-server"]) if self.build else build.server_binary(settings.version)
        if draft is None and settings.draft_model:
            draft = gguf_of(settings.draft_model, "draft model (engine.draft_model)")
        super().__init__(LlamaCppFlavour(settings, server=server, model=model, draft=draft), sampling=sampling,
                         seed=seed, threads=threads, slots=slots, log_dir=log_dir, port=settings.port,
                         ready_timeout_s=settings.ready_timeout_s)

    @classmethod
    def method_names(cls, cfg: Any) -> tuple[str, ...]:
        """What names this engine's speculative methods: ``engine.spec_type``'s types (checked here, before any model
        loads)."""
        return types_of(settings_of(cfg).spec_type)

    @classmethod
    def check_config(cls, cfg: Any, methods: Sequence[Method]) -> None:
        """Every method runs on llama-server as configured (spec type, draft length), the target is a GGUF and
        llama.cpp is built: one line otherwise, before any model loads or any server starts."""
        settings = settings_of(cfg)
        for method in methods:
            check_method(method, settings)
        shipped = gguf_of(str(cfg.models.target.name_or_path), "target (models.target.name_or_path)")
        if any(m.speculative and m.name == "draft-simple" for m in methods):
            draft_of(cfg, settings, shipped)  # one line naming the command that writes it (and builds llama.cpp)
        build.server_binary(settings.version)  # one line naming the build command when it is not built

    @classmethod
    def from_config(cls, cfg: Any, *, sampling: Any, slots: int, log_dir: Path, **_: Any) -> LlamaCppEngine:
        """The engine ``cfg`` configures (``engine``, ``models.target``, ``hardware.threads``, ``seed``); nothing
        starts until :meth:`open`. ``engine.weights=f32`` writes the F32 GGUF once (cached beside the binaries)."""
        settings = settings_of(cfg)
        shipped = gguf_of(str(cfg.models.target.name_or_path), "target (models.target.name_or_path)")
        build.server_binary(settings.version)  # one line naming the build command when it is not built
        model = build.f32_gguf(shipped, settings.version) if settings.weights == "f32" else shipped
        threads = cfg.hardware.get("threads")
        draft = draft_of(cfg, settings, shipped) if "draft-simple" in types_of(settings.spec_type) else None
        return cls(settings, model=model, shipped=shipped, sampling=sampling, seed=int(cfg.seed),
                   threads=int(threads) if threads else None, slots=slots, log_dir=log_dir, draft=draft)

    def describe(self) -> dict[str, Any]:
        info = self.build or {}
        return {**super().describe(), "llama_cpp_python": self.settings.version,
                "vendored_commit": info.get("vendored_commit"), "server_version": info.get("server_version"),
                "cmake_flags": info.get("cmake_flags"), "cpu": info.get("cpu"), "spec_type": self.settings.spec_type,
                "weights": self.settings.weights, "model": str(self.flavour.model),
                "draft_model": str(self.flavour.draft) if self.flavour.draft else None,
                "model_sha256": _sha(self.flavour.model), "shipped_model": str(self.shipped)}


def _sha(path: Path) -> str | None:
    try:
        return gguf.sha256(path)
    except OSError:
        return None


