"""The proposer factory: what drafts for a session, built from what stands in the engine's draft slot.

A draft model gets :class:`~spectune.engine.proposer.DraftProposer`, or the feature proposer where it reads the
target's features (it says so: :func:`~spectune.engine.features.reads_features`); a model-free draft
(:class:`~spectune.engine.lookup.PromptLookup`, :class:`~spectune.engine.suffix.SuffixDrafting`) gets its own
proposer and no cache. The session imports this factory, never a model class.
"""

from __future__ import annotations

from typing import Any

from spectune.engine.feature_proposer import FeatureProposer
from spectune.engine.features import reads_features
from spectune.engine.lookup import LookupProposer, PromptLookup
from spectune.engine.proposer import DraftProposer
from spectune.engine.suffix import SuffixDrafting, SuffixProposer


def proposer_for(engine: Any, batch: int) -> Any:
    """The proposer for ``engine.draft`` over ``batch`` slots (a cleared draft cache where it needs one);
    ``engine``: the session's :class:`~spectune.engine.session.EngineParts`."""
    draft = engine.draft
    if isinstance(draft, (PromptLookup, SuffixDrafting)):
        width = engine.vocab_size or engine.target.get_output_embeddings().weight.shape[0]
        proposer = LookupProposer if isinstance(draft, PromptLookup) else SuffixProposer
        return proposer(draft, batch, width, engine.device, engine.eos)
    proposer = FeatureProposer if reads_features(draft) else DraftProposer
    return proposer(draft, engine.cache(draft, batch), engine.sampling, engine.vocab_size)
