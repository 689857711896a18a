"""A workload served by an engine on the configured models and hardware: what every application that measures
opens first (the harness tasks, ``policies.train``, ``policies.evaluate``).

The models come from :func:`spectune.measure.models.load_models` (loaded once per process), the prompts from
:func:`workloads.loader.load_workload` with the target's tokenizer, the engine from
:func:`spectune.measure.point.open_engine` with the workload's sampling settings. What runs the methods (``engine=``,
conf/engine/) is :func:`measuring_engine`'s: spectune's own engine in process, or a server per method
(:mod:`spectune.engines`); the tasks that read the engine's internals (traces, profiles, training) run in process
only (:func:`require_in_process`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spectune.engine import proposers
from spectune.engines import engine_class
from spectune.errors import SpectuneError
from spectune.measure.models import Models, load_models
from spectune.measure.point import open_engine
from spectune.run.metadata import base_metadata
from workloads.categories import check_workload
from workloads.loader import Workload, load_workload
from workloads.regimes import refuse_phases


@dataclass
class Setup:
    """What a task that drives the engine on the configured models and workload needs."""

    models: Models
    workload: Workload
    engine: Any
    metadata: dict[str, Any]  # what every result of the task carries

    @property
    def max_context(self) -> int | None:
        return self.models.max_context

    @property
    def device(self) -> Any:
        return self.models.device


def open_setup(cfg: Any, task: str) -> Setup:
    """Load (or reuse) the models, load the workload, build the engine, and the metadata of ``task``'s results.

    ``cfg`` holds ``models``, ``hardware``, ``workload``, ``sampler`` and ``seed`` (a Hydra config)."""
    from omegaconf import OmegaConf

    if not cfg.get("workload"):
        raise SpectuneError(f"task={task} needs a workload: add +workload=it|en|zh|es|mix")
    require_in_process(cfg, task)
    check_workload(cfg.workload)  # task selection errors before any model loads
    refuse_phases(cfg.workload, f"task={task}")
    models = models_of(cfg)
    workload = load_workload(cfg.workload, models.tokenizer)
    engine = engine_of(cfg, models, workload.sampling)
    metadata = {**base_metadata(), "task": task, "models": models.pair.metadata, "hardware": models.hardware,
                "workload": workload.describe(), "sampling": vars(workload.sampling), "sampler": cfg.sampler,
                "seed": int(cfg.seed), "config": OmegaConf.to_container(cfg, resolve=True)}
    return Setup(models, workload, engine, metadata)


def proposer_node(cfg: Any) -> dict[str, Any] | None:
    """The configured proposer as a plain dict (None: the pair's draft model)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg.proposer, resolve=True) if cfg.get("proposer") else None


def engine_name(cfg: Any) -> str:
    """``engine.name`` (``spectune`` where the config has no engine node: train.yaml, evaluate.yaml)."""
    return str(cfg.engine.name) if cfg.get("engine") else "spectune"


def in_process(cfg: Any) -> bool:
    """Whether the configured engine runs in this process on the loaded models (spectune's own)."""
    return bool(getattr(engine_class(engine_name(cfg)), "in_process", False))


def require_in_process(cfg: Any, task: str) -> None:
    """One line when ``task`` is asked of an engine that is not spectune's own: it reads what only the in-process
    engine records (its cycles, traces, costs)."""
    if not in_process(cfg):
        raise SpectuneError(f"task={task} runs on engine=spectune only (engine={engine_name(cfg)} is a server; "
                            "task=bench measures it)")


def models_of(cfg: Any) -> Models:
    """The configured models (:func:`spectune.measure.models.load_models`), the pair's draft model only where the
    configured proposer drafts with it on spectune's own engine (a server engine needs the target's tokenizer,
    context and provenance only); the proposer's settings are checked first, before any weights load."""
    entry, _ = proposers.settings_of(proposer_node(cfg))
    return load_models(cfg.models, cfg.hardware, draft=entry.needs_draft_model and in_process(cfg))


def measuring_engine(cfg: Any, models: Models, sampling: Any, make: Any, *, slots: int, log_dir: Any,
                     inprocess: Any = None) -> Any:
    """The configured :class:`~spectune.engines.base.MeasuringEngine`, not yet opened: spectune's own on
    ``models`` (its speculative methods' policies from ``make``; ``inprocess()``, where given, the in-process engine
    to measure on, else a new one), or a server engine serving ``slots`` requests at once, its servers' logs in
    ``log_dir``."""
    cls = engine_class(engine_name(cfg))
    return cls.from_config(cfg, inprocess=inprocess or (lambda: engine_of(cfg, models, sampling)), make=make,
                           max_context=models.max_context, sampling=sampling, slots=slots, log_dir=log_dir)


def engine_of(cfg: Any, models: Models, sampling: Any) -> Any:
    """The engine of the configured proposer on ``models`` (:func:`spectune.measure.point.open_engine`), what every
    application opens: a proposer whose entry asks for the workload's training prompts (suffix decoding's frozen
    global trie, ``proposer.corpus=train``) gets them here."""
    proposer = proposer_node(cfg)
    entry, settings = proposers.settings_of(proposer)
    corpus = training_prompts(cfg, models.tokenizer) if entry.training_prompts(settings) else []
    return open_engine(models, sampling, cfg.sampler, int(cfg.seed), proposer, corpus)


def training_prompts(cfg: Any, tokenizer: Any) -> list[list[int]]:
    """A proposer's corpus (suffix decoding's, ``proposer.corpus=train``): the rendered prompts of the workload's
    training split (same language, tasks and profile; every prompt), of which no evaluated prompt is part."""
    from omegaconf import OmegaConf

    spec = {**OmegaConf.to_container(cfg.workload, resolve=True), "splits": ["train"], "num_prompts": None}
    return [list(p.input_ids) for p in load_workload(spec, tokenizer).prompts]
