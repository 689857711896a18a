"""What a proposer's module declares about it: one :class:`ProposerEntry`, read by everything outside the module.

Torch-free on purpose: the registry imports every entry to store the settings schemas before Hydra composes a
command line, and checks the chosen settings before any model loads; what drafts (a
:class:`~spectune.engine.proposer.DraftSpec`) imports its torch-side proposer only when a session asks for one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.vllm_export import VllmMethod


@dataclass(frozen=True)
class DraftSources:
    """What a proposer's draft is built from, besides its settings: the loaded pair's draft model (None where it
    was loaded without one), the tokenizer's special (chat-template) ids, which no model-free draft proposes, and
    the workload's training-split prompts where the entry asked for them (:attr:`ProposerEntry.training_prompts`)."""

    draft_model: Any = None
    special_ids: tuple[int, ...] = ()
    training_prompts: Sequence[Sequence[int]] = ()


def never(settings: Any) -> bool:
    return False


def by_settings(node: Mapping[str, Any], models: Mapping[str, Any]) -> str:
    """A proposer's label where its entry gives none: its name and its settings as recorded."""
    settings = ", ".join(f"{key} {value}" for key, value in node.items() if key != "name")
    return f"{node.get('name')} ({settings})" if settings else str(node.get("name"))


@dataclass(frozen=True)
class ProposerEntry:
    """One proposer (``proposer=<name>``), declared once in its module as ``PROPOSER = ProposerEntry(...)``.

    Args:
        name: its config name: ``conf/proposer/<name>.yaml``.
        settings: the dataclass of that file's keys (``name`` first, then the file's order), stored as the file's
            schema (/schema/proposer/<name>): it adds the types, the file holds the values (no field has a
            default). Its ``check()`` raises a one-line :class:`~spectune.errors.SpectuneError` naming the key, the
            value and what is allowed, for ranges and rules across keys; it runs before any model loads.
        draft: ``(settings, DraftSources) -> draft``: what stands in the engine's draft slot (the pair's draft
            model, or a :class:`~spectune.engine.proposer.DraftSpec`, which builds the per-session proposer).
        label: ``(recorded proposer node, recorded models metadata) -> str``: how the results index names what
            drafted (read from a run's files: a plain mapping, of a run possibly older than this code); default:
            its name and settings.
        vllm: ``(recorded proposer node, the draft model's name or None) -> VllmMethod``: vLLM's
            ``speculative_config`` method and keys for a γ map tuned with it, and where vLLM's method differs;
            None: vLLM has no such method (the export says so).
        needs_draft_model: it drafts with the pair's draft model, so the loading includes it.
        training_prompts: ``(settings) -> bool``: it wants the workload's training-split prompts (a corpus).
        replayable: ``task=predict`` can replay it exactly from greedy outputs (its draft gives ``request_chains``).
    """

    name: str
    settings: type
    draft: Callable[[Any, DraftSources], Any]
    label: Callable[[Mapping[str, Any], Mapping[str, Any]], str] = by_settings
    vllm: Callable[[Mapping[str, Any], str | None], VllmMethod] | None = None
    needs_draft_model: bool = False
    training_prompts: Callable[[Any], bool] = never
    replayable: bool = False
