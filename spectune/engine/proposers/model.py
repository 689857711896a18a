"""``proposer=model`` (the default): the pair's draft model drafts, the independent one or a draft that reads the
target's features, whichever ``models=...`` loads. It has no settings.

The draft stands in the engine's draft slot as the model itself; the engine builds its proposer
(:class:`~spectune.engine.model_proposer.DraftProposer`, or :class:`~spectune.engine.feature_proposer.FeatureProposer`
for a draft that reads features: ``spectune/engine/factory.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spectune.engine.proposers.base import DraftSources, ProposerEntry
from spectune.errors import SpectuneError
from spectune.vllm_export import VllmMethod


@dataclass
class ModelSettings:
    """conf/proposer/model.yaml's one key: its name."""

    name: str

    def check(self) -> None:
        """Nothing to check: the pair is the models group's."""


def draft(settings: ModelSettings, sources: DraftSources) -> Any:
    if sources.draft_model is None:
        raise SpectuneError("proposer=model needs the pair's draft model, which was loaded without it "
                            "(load_models(..., draft=True))")
    return sources.draft_model


def label(node: Mapping[str, Any], models: Mapping[str, Any]) -> str:
    drafted = models.get("draft") or {}
    where = str(drafted.get("name_or_path", "?"))
    kind = "feature draft" if "feature" in where or drafted.get("reads_target_features") else "draft"
    return f"{kind} `{where}`"


def vllm(node: Mapping[str, Any], draft_name: str | None) -> VllmMethod:
    return VllmMethod({"method": "draft_model", "model": draft_name})


PROPOSER = ProposerEntry(name="model", settings=ModelSettings, draft=draft, label=label, vllm=vllm,
                         needs_draft_model=True)
