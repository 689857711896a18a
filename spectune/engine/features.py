"""What the engine knows of a draft that reads the target's features: the flag it asks, and the tap.

The engine imports no model class: a draft model says it wants the target's features beside its tokens with a
``reads_target_features = True`` attribute (EAGLE-style drafts, :mod:`spectune.models.feature_draft`), and the tap
keeps the features its final norm produced at each forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def reads_features(model: nn.Module | None) -> bool:
    """Whether a draft model wants the target's features beside its tokens."""
    return bool(getattr(model, "reads_target_features", False))


class HiddenTap:
    """Keeps the output of a Llama-style model's final norm (the features its LM head reads) from each forward.

    A forward hook works the same on every transformers version (the engine runs on 5.17 and 5.24) and costs no
    extra computation: the norm runs over every position fed, also when only the last position's logits are kept.
    """

    def __init__(self, model: nn.Module) -> None:
        self.last: torch.Tensor | None = None
        self._handle = model.model.norm.register_forward_hook(self._keep)

    @classmethod
    def on(cls, model: nn.Module) -> HiddenTap:
        """The model's one tap (made at the first call): sessions come and go, hooks must not pile up."""
        tap = model.__dict__.get("_spectune_tap")
        if tap is None:
            tap = model.__dict__["_spectune_tap"] = cls(model)
        return tap

    def _keep(self, module: nn.Module, args: Any, out: torch.Tensor) -> None:
        self.last = out

    def remove(self) -> None:
        self._handle.remove()
