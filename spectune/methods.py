"""A method: what one grid point runs, as a value. Built here, labelled here, parsed here.

A method is autoregressive decoding (:data:`AR`, the baseline every speed-up is measured against) or speculation
with a draft-length rule: ``Method("fixed", 4)`` is the fixed γ = 4, ``Method("match-length", 8)`` the
match-length rule with its ceiling at 8. On spectune's own engine ``name`` is a draft-length policy
(``conf/policy/<name>.yaml``) and what drafts is the configured proposer; on a server engine (llama.cpp, vLLM,
SGLang) it is that engine's speculative type and ``gamma`` its draft length, a server setting.

The label is what tables, records and run directories carry (``ar``, ``fixed:gamma=4``); :meth:`Method.parse`
reads one back, so older run directories load as values too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spectune.errors import SpectuneError

BASELINE = "ar"  # the autoregressive baseline's label: the one place it is spelled
SEPARATOR = ":gamma="
DUPLICATE = "#2"  # what a method's second run in one grid adds to its label
AA_LABEL = BASELINE + DUPLICATE  # the second AR run of a repeat (task.noise_floor=true): the A/A comparison
FIXED = "fixed"  # the fixed γ's name: the grid every adaptive rule is measured against


@dataclass(frozen=True)
class Method:
    """One method of a grid: ``name`` (a policy, or a server engine's speculative type; ``ar``: none), its draft
    length ``gamma`` (0 for AR), its other ``settings`` (a policy's parameters beyond γ; compared, not labelled),
    and ``tag``, a label of its own where one method runs twice under two names (the A/A duplicate of AR)."""

    name: str = BASELINE
    gamma: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    tag: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 0:
            raise SpectuneError(f"gamma={self.gamma!r} is invalid for method {self.name!r}: an integer >= 0")
        if (self.name == BASELINE) != (self.gamma == 0):
            raise SpectuneError(f"method {self.name!r} with gamma={self.gamma} is invalid: γ = 0 is the "
                                f"autoregressive baseline ({BASELINE!r}) and only it")

    @property
    def speculative(self) -> bool:
        return self.gamma > 0

    @property
    def is_baseline(self) -> bool:
        """AR itself (not its A/A duplicate)."""
        return self.name == BASELINE and self.tag is None

    @property
    def is_fixed(self) -> bool:
        """A fixed γ, or its duplicate: a point of the grid, not an adaptive rule."""
        return self.name == FIXED and self.speculative

    @property
    def label(self) -> str:
        """``ar``, ``ar#2`` (the A/A duplicate) or ``<name>:gamma=<γ>``: the name in every table and record."""
        if self.tag is not None:
            return self.tag
        return BASELINE if not self.speculative else f"{self.name}{SEPARATOR}{self.gamma}"

    def duplicate(self) -> Method:
        """The same method under a label of its own, ``<label>#2``: its second run in one grid, whose difference
        from the first is the noise floor (:data:`AA` is AR's)."""
        return Method(self.name, self.gamma, self.settings, f"{self.label}{DUPLICATE}")

    def __str__(self) -> str:
        return self.label

    @classmethod
    def parse(cls, label: str) -> Method:
        """The method a label names (``ar``, ``ar#2``, ``fixed:gamma=4``); any other shape fails in one line."""
        if label == BASELINE:
            return AR
        if label == AA_LABEL:
            return AA
        name, sep, gamma = label.rpartition(SEPARATOR)
        if not sep or not name or not gamma.isdigit() or int(gamma) < 1:
            raise SpectuneError(f"{label!r} is not a method label: expected {BASELINE!r}, {AA_LABEL!r} or "
                                f"'<name>{SEPARATOR}<γ >= 1>'")
        return cls(name, int(gamma))

    @classmethod
    def fixed(cls, gamma: int) -> Method:
        """AR at γ 0, else the fixed γ."""
        return AR if gamma == 0 else cls(FIXED, gamma)


AR = Method()
AA = AR.duplicate()


def label_gammas(methods: Iterable[Method]) -> list[tuple[str, int]]:
    """(label, γ) per method: the pairs the measuring code (spectune.measure, its interleaved design) takes, built
    here only."""
    return [(m.label, m.gamma) for m in methods]


def is_label(label: str) -> bool:
    """Whether ``label`` parses as a method label."""
    try:
        Method.parse(label)
    except SpectuneError:
        return False
    return True


def is_fixed_label(label: str) -> bool:
    """Whether ``label`` names a fixed γ (``fixed:gamma=4``, or its duplicate ``fixed:gamma=4#2``, as a coverage
    run records it); AR, an adaptive rule and a table's own row names (``best fixed γ``) do not."""
    try:
        return Method.parse(label.removesuffix(DUPLICATE)).is_fixed
    except SpectuneError:
        return False
