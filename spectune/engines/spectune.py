"""``engine=spectune`` (the default): spectune's own engine, in this process, as a
:class:`~spectune.engines.base.MeasuringEngine`.

A method is a draft-length policy (``Method("fixed", 4)``, ``Method("match-length", 8)``) and what drafts is the
configured proposer; the policy of a speculative method comes from ``make`` (the harness passes
``policies.registry.make_policy``, which the library cannot import). A method's first block builds its policy, the
method's later blocks of the same repeat go on with what it learned (:func:`spectune.measure.measure_point` with
``reset_policy=False``), warm-up before the first block only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from spectune.engine.records import Request
from spectune.measure.point import Frames, measure_point, warm_up
from spectune.methods import Method

if TYPE_CHECKING:
    from spectune.engine import Engine
    from spectune.engine.policy import DraftLengthPolicy
    from spectune.run.progress import RunProgress

log = logging.getLogger(__name__)

MakePolicy = Callable[[Method], "DraftLengthPolicy"]


class SpectuneEngine:
    """The in-process engine ``inner`` (:func:`spectune.measure.open_engine`), each speculative method's policy
    built by ``make``; ``max_context`` bounds the positions a slot may use (a γ that overflows fails its point)."""

    engine = "spectune"
    in_process = True  # runs on the models loaded in this process

    def __init__(self, inner: Engine, make: MakePolicy, max_context: int | None) -> None:
        self.inner, self.make, self.max_context = inner, make, max_context
        self.policies: dict[str, DraftLengthPolicy | None] = {}

    @classmethod
    def method_names(cls, cfg: Any) -> tuple[str, ...]:
        """What names this engine's speculative methods: the draft-length policy (``policy.name``)."""
        return (str(cfg.policy.name),)

    @classmethod
    def check_config(cls, cfg: Any, methods: Sequence[Method]) -> None:
        """Nothing beyond what the policies' own checks say (the harness builds each policy before models load)."""

    @classmethod
    def from_config(cls, cfg: Any, *, inprocess: Callable[[], Engine], make: MakePolicy, max_context: int | None,
                    **_: Any) -> SpectuneEngine:
        """The engine a harness task configures: ``inprocess()`` builds the in-process engine on the loaded models."""
        return cls(inprocess(), make, max_context)

    def check(self, methods: Sequence[Method]) -> None:
        for method in methods:
            if method.speculative:
                self.make(method)  # an unknown policy or a bad parameter: one line

    def open(self, methods: Sequence[Method]) -> None:
        """Nothing to start: the models are loaded and the engine is built."""

    def measure(self, requests: list[Request], method: Method, *, concurrency: int, warmup: int,
                first_block: bool, progress: RunProgress | None = None) -> Frames:
        if first_block or method.label not in self.policies:
            self.policies[method.label] = self.make(method) if method.speculative else None
        return measure_point(self.inner, requests, self.policies[method.label], method.label, method.gamma,
                             concurrency=concurrency, warmup=warmup if first_block else 0,
                             max_context=self.max_context, reset_policy=first_block, progress=progress)

    def warm_shapes(self, requests: list[Request], method: Method, concurrencies: Sequence[int], count: int) -> None:
        """Warm-up at each of ``concurrencies`` before a phased point (its first phase's is the point's own): the
        method's policy as its first block will build it, so the shapes it runs are compiled."""
        policy = self.make(method) if method.speculative else None
        for concurrency in concurrencies:
            warm_up(self.inner, requests, policy, concurrency, count)

    def describe(self) -> dict[str, Any]:
        return {"engine": self.engine, "in_process": True}

    def close(self) -> None:
        self.policies.clear()
