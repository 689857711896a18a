"""The models a measuring run drafts and verifies with, loaded once per process: a process that traces, profiles
and fine-tunes (``task=train``) loads the configured pair once, and asks here what drafts (:func:`draft_of`) for the
configured proposer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from spectune.hardware import ExecutionPath
    from spectune.models.loading import ModelPair


@dataclass(frozen=True)
class Models:
    """A loaded pair on its device: what an engine is built from, and what a profile or a result names."""

    pair: ModelPair
    device: torch.device
    path: ExecutionPath
    max_context: int | None  # positions a slot may use (the model's, or the static cache's when smaller)
    hardware: dict[str, Any]  # hardware.describe() plus the device name a profile is matched on

    @property
    def tokenizer(self) -> Any:
        return self.pair.tokenizer


_LOADED: dict[str, Models] = {}


def _key(*nodes: Any) -> str:
    from omegaconf import DictConfig, OmegaConf

    return json.dumps([OmegaConf.to_container(n, resolve=True) if isinstance(n, DictConfig) else n for n in nodes],
                      sort_keys=True, default=str)


def load_models(models_cfg: Any, hardware_cfg: Any, draft: bool = True) -> Models:
    """The configured pair on the configured hardware, loaded once per process (same configs: same objects).

    ``draft=False``: the target alone, for a model-free draft (:func:`needs_draft_model`); its ``pair.draft`` and
    the metadata's ``draft`` are None. Either way round, a process loads the target once."""
    key = _key(models_cfg, hardware_cfg)
    held = _LOADED.get(key)
    if held is None or (draft and held.pair.draft is None):
        from spectune import hardware as hw
        from spectune.costmodel.profile import device_name
        from spectune.models.loading import load_pair

        device = hw.setup(hardware_cfg)
        path = hw.execution_path(hardware_cfg)
        pair = load_pair(models_cfg, hardware_cfg, draft=draft, loaded_target=held.pair if held else None)
        max_context = getattr(pair.target.config, "max_position_embeddings", None)
        if path.static:  # a static cache holds prompt + output + one block per slot
            max_context = min(max_context or path.max_cache_len, path.max_cache_len)
        hardware = {**hw.describe(hardware_cfg, device), "device_name": device_name(device)}
        held = _LOADED[key] = Models(pair, device, path, max_context, hardware)
    if draft or held.pair.draft is None:
        return held
    pair = replace(held.pair, draft=None, metadata={**held.pair.metadata, "draft": None,
                                                    "vocabulary_check": "target only"})
    return replace(held, pair=pair)


def needs_draft_model(proposer: Any = None) -> bool:
    """Whether the configured proposer (:func:`draft_of`'s node; None: the pair's draft model) drafts with the
    pair's draft model, so that it must be loaded."""
    from spectune.engine import proposers

    return proposers.needs_draft_model(proposer)


def draft_of(models: Models, proposer: Any = None, corpus: Iterable[Sequence[int]] = ()) -> Any:
    """What drafts, as the configured proposer's entry builds it (:mod:`spectune.engine.proposers`; ``proposer``
    None: the pair's draft model) from ``models`` and, where the entry asks for them, the workload's training
    prompts (``corpus``). No model-free draft ever proposes the tokenizer's special (chat-template) ids. An unknown
    proposer or setting, or a setting out of range, is a one-line error."""
    from spectune.engine import proposers

    entry, settings = proposers.settings_of(proposer)
    special = tuple(getattr(models.tokenizer, "all_special_ids", ()) or ())
    return entry.draft(settings, proposers.DraftSources(models.pair.draft, special, list(corpus)))

