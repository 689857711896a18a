"""A server engine's streamed completion, one event at a time, as every engine's flavour reads it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StreamEvent:
    """One server-sent event of a streaming completion, read by an engine's flavour (``parse_event``).

    ``token_ids``: the tokens this event delivers, where the engine sends their ids; ``tokens``: how many tokens it
    delivers (the length of ``token_ids``, or the engine's count where it sends no ids); ``done``: this is the
    request's last event; ``counters``: on the last event, the engine's own per-request counters under its own
    names (prompt and completion tokens, verification steps, accepted drafts), only those it reports."""

    token_ids: tuple[int, ...] = ()
    tokens: int = 0
    done: bool = False
    counters: Mapping[str, float] = field(default_factory=dict)
