"""Policies by config name: ``conf/policy/<name>.yaml`` holds each policy's parameters (defaults live there only).

The grid's γ reaches every policy as ``gamma`` (the fixed length, a start value or a ceiling); every other
parameter comes from the policy's config node, so ``policy=confidence policy.threshold=0.3`` works.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from policies.adaedl import AdaEDL
from policies.bandit import UCBBandit
from policies.classifier import AcceptanceClassifier
from policies.confidence import AdaptiveConfidence, ConfidenceStop, StepThresholds
from policies.heuristic import HFHeuristic, HFHeuristicTransient
from policies.model_based import ModelBased
from policies.ppo import PPODepth
from policies.ppo_cycle import PPOCycle
from policies.ppo_distilled import PPODistilled
from policies.svip import SVIP
from spectune.engine.policy import DraftLengthPolicy, FixedGamma
from spectune.errors import SpectuneError

POLICIES: dict[str, type[DraftLengthPolicy]] = {cls.name: cls for cls in (
    FixedGamma, HFHeuristic, HFHeuristicTransient, ConfidenceStop, AdaptiveConfidence, StepThresholds, SVIP, AdaEDL,
    AcceptanceClassifier, UCBBandit, ModelBased, PPODepth, PPODistilled, PPOCycle,
)}


def make_policy(node: Mapping[str, Any], gamma: int) -> DraftLengthPolicy:
    """Build the policy a config node names, at the grid's ``gamma``. Unknown names or parameters fail in one line."""
    params = dict(node)
    name = params.pop("name", None)
    if name not in POLICIES:
        raise SpectuneError(f"policy={name!r} is unknown: choose one of {', '.join(sorted(POLICIES))}")
    cls = POLICIES[name]
    parameters = inspect.signature(cls.__init__).parameters
    # keyword-only parameters are for code (an object already built), never a config's
    accepted = [p for p, spec in parameters.items()
                if p not in ("self", "gamma") and spec.kind is not inspect.Parameter.KEYWORD_ONLY]
    for key in params:
        if key not in accepted:
            raise SpectuneError(f"policy.{key} is not a parameter of policy={name}: "
                                f"its parameters are {', '.join(accepted) or 'none'}")
    missing = [key for key in accepted if key not in params and parameters[key].default is inspect.Parameter.empty]
    if missing:
        raise SpectuneError(f"policy={name} needs policy.{missing[0]} (set it in conf/policy/{name}.yaml "
                            "or on the command line)")
    return cls(gamma=gamma, **params)

