"""The proposer factory: what drafts for a session, built from what stands in the engine's draft slot.

A draft that needs no model stands there as a :class:`~spectune.engine.proposer.DraftSpec` and builds its own
proposer (``proposers/``: prompt lookup, suffix decoding, each one module). A draft model gets
:class:`~spectune.engine.model_proposer.DraftProposer`, or the feature proposer where it reads the target's features
(it says so: :func:`~spectune.engine.features.reads_features`). The session imports this factory, never a model
class nor a model-free draft.
"""

from __future__ import annotations

from spectune.engine.feature_proposer import FeatureProposer
from spectune.engine.features import reads_features
from spectune.engine.model_proposer import DraftProposer
from spectune.engine.proposer import DraftSpec, EngineParts, Proposer


def proposer_for(engine: EngineParts, batch: int) -> Proposer:
    """The proposer for ``engine.draft`` over ``batch`` slots (a cleared draft cache where it needs one)."""
    draft = engine.draft
    if isinstance(draft, DraftSpec):
        return draft.proposer(engine, batch)
    proposer = FeatureProposer if reads_features(draft) else DraftProposer
    return proposer(draft, engine.cache(draft, batch), engine.sampling, engine.vocab_size)
