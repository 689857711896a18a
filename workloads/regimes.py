"""Regimes in a workload: per-request sampling settings from a declared mix, and phases that shift the regime.

The draft length that wins under greedy decoding can lose at T = 1, and the one that wins alone can lose in a batch
of four. A workload can declare both shifts, seeded, so that a run measures them and a policy can react to them:

- ``workload.sampling_mix``: each request's temperature (top-k, top-p) drawn from a declared mix, e.g.
  ``[{temperature: 0, share: 0.5}, {temperature: 1.0, share: 0.5}]``. An entry's ``top_k`` and ``top_p`` are the
  workload's ``sampling`` ones unless it gives its own. The shares are met exactly (largest remainder: 12 requests
  at 0.5/0.5 are 6 and 6) and which request gets which is a seeded shuffle. null: every request samples with
  ``workload.sampling``.
- ``workload.phases``: a list of phases, each ``{name, concurrency, categories, sampling_mix, token_budget}``. A
  phase takes fresh prompts of its ``categories`` (null: the workload's; each in equal shares, as the workload
  interleaves them) until they ask for ``token_budget`` output tokens (requests × max_new_tokens), samples them
  with its own ``sampling_mix`` (null: the workload's), and runs at its ``concurrency`` (task=bench runs phase by
  phase).
  ``workload.phase_order``: ``listed`` (as written) or ``shuffled`` (a seeded shuffle of the list); either way the
  order is decided before anything runs and recorded in the run's metadata (``workload.phases``, in run order).

Every draw is keyed by the workload's seed and the phase's name, so the same config gives the same requests in the
same order, whatever else changes; everything is checked before any model loads (:func:`read_regimes`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams

ORDERS = ("listed", "shuffled")
MIX_KEYS = ("temperature", "top_k", "top_p", "share")
PHASE_KEYS = ("name", "concurrency", "categories", "sampling_mix", "token_budget")


@dataclass(frozen=True)
class SamplingShare:
    """One entry of a sampling mix: these settings for this share of the requests."""

    sampling: SamplingParams
    share: float

    def describe(self) -> dict[str, Any]:
        return {**self.sampling.describe(), "share": self.share}


@dataclass(frozen=True)
class Phase:
    """One phase of a workload: its requests' categories and settings, its batch and its budget of output tokens."""

    name: str
    concurrency: int
    categories: tuple[str, ...]
    mix: tuple[SamplingShare, ...]
    token_budget: int

    def requests(self, max_new_tokens: int) -> int:
        """How many requests the budget buys: enough for ``token_budget`` output tokens at ``max_new_tokens`` each."""
        return math.ceil(self.token_budget / max_new_tokens)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "concurrency": self.concurrency, "categories": list(self.categories),
                "sampling_mix": [m.describe() for m in self.mix], "token_budget": self.token_budget}


@dataclass(frozen=True)
class Regimes:
    """A workload's declared regimes: the requests' sampling mix (None: ``workload.sampling`` for all) and its
    phases in run order (empty: none)."""

    mix: tuple[SamplingShare, ...] | None = None
    phases: tuple[Phase, ...] = ()
    order: str = "listed"

    def describe(self) -> dict[str, Any]:
        """What a run's metadata records (only what is declared: a plain workload adds nothing)."""
        out: dict[str, Any] = {}
        if self.mix is not None:
            out["sampling_mix"] = [m.describe() for m in self.mix]
        if self.phases:
            out["phase_order"] = self.order
            out["phases"] = [p.describe() for p in self.phases]
        return out


def read_regimes(spec: dict[str, Any], sampling: SamplingParams, categories: Sequence[str]) -> Regimes:
    """The regimes of a workload node (a plain dict), checked: each bad value a one-line error naming its key.
    ``sampling`` is the workload's own settings, ``categories`` its category selection; reads no model."""
    mix = read_mix(spec.get("sampling_mix"), "workload.sampling_mix", sampling)
    order = spec.get("phase_order", "listed")
    if order not in ORDERS:
        raise SpectuneError(f"workload.phase_order={order!r} is invalid: choose {' or '.join(ORDERS)}")
    node = spec.get("phases")
    if node is None:
        return Regimes(mix, (), str(order))
    if not isinstance(node, list | tuple) or not node:
        raise SpectuneError(f"workload.phases={node!r} is invalid: a non-empty list of phases ({', '.join(PHASE_KEYS)})"
                            " or null")
    if spec.get("num_prompts") is not None:
        raise SpectuneError(f"workload.num_prompts={spec['num_prompts']!r} is invalid with workload.phases: each "
                            "phase's token_budget decides its prompts; set workload.num_prompts=null")
    phases = [_phase(item, f"workload.phases[{i}]", sampling, mix, tuple(categories)) for i, item in enumerate(node)]
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise SpectuneError(f"workload.phases has the name {twice!r} twice: each phase needs its own name")
    if order == "shuffled":
        random.Random(f"{spec.get('seed')}:phases").shuffle(phases)
    return Regimes(mix, tuple(phases), str(order))


def read_mix(node: Any, key: str, base: SamplingParams) -> tuple[SamplingShare, ...] | None:
    """A sampling mix (null: None); an entry's top_k and top_p default to ``base``'s; the shares are > 0 and sum
    to 1 (within 1e-6)."""
    if node is None:
        return None
    if not isinstance(node, list | tuple) or not node:
        raise SpectuneError(f"{key}={node!r} is invalid: a non-empty list of {{temperature, share}} entries "
                            "(top_k, top_p optional) or null")
    out = []
    for i, entry in enumerate(node):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict) or "temperature" not in entry or "share" not in entry:
            raise SpectuneError(f"{where}={entry!r} is invalid: give temperature and share (top_k, top_p optional)")
        unknown = sorted(set(entry) - set(MIX_KEYS))
        if unknown:
            raise SpectuneError(f"{where}.{unknown[0]} is not a key of a mix entry: allowed {', '.join(MIX_KEYS)}")
        share = entry["share"]
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise SpectuneError(f"{where}.share={share!r} is invalid: must be a number in (0, 1]")
        try:
            settings = SamplingParams(temperature=entry["temperature"], top_k=entry.get("top_k", base.top_k),
                                      top_p=entry.get("top_p", base.top_p))
        except SpectuneError as err:
            raise SpectuneError(f"{where}: {err}") from None
        out.append(SamplingShare(settings, float(share)))
    total = sum(m.share for m in out)
    if abs(total - 1) > 1e-6:
        raise SpectuneError(f"{key} shares sum to {total:g}: they must sum to 1")
    return tuple(out)


def _phase(item: Any, key: str, sampling: SamplingParams, mix: tuple[SamplingShare, ...] | None,
           categories: tuple[str, ...]) -> Phase:
    if not isinstance(item, dict):
        raise SpectuneError(f"{key}={item!r} is invalid: a mapping of {', '.join(PHASE_KEYS)}")
    missing = [k for k in ("name", "concurrency", "token_budget") if k not in item]
    if missing:
        raise SpectuneError(f"{key}.{missing[0]} is missing: a phase sets name, concurrency and token_budget "
                            "(categories and sampling_mix: null takes the workload's)")
    if "tasks" in item:  # its name before 2026-12-06 (spectune.names)
        raise SpectuneError(f"{key}.tasks is now {key}.categories: what a prompt asks for is its category "
                            "(task= is the job)")
    unknown = sorted(set(item) - set(PHASE_KEYS))
    if unknown:
        raise SpectuneError(f"{key}.{unknown[0]} is not a key of a phase: allowed {', '.join(PHASE_KEYS)}")
    name = item["name"]
    if not isinstance(name, str) or not name:
        raise SpectuneError(f"{key}.name={name!r} is invalid: must be a non-empty string")
    for field in ("concurrency", "token_budget"):
        value = item[field]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpectuneError(f"{key}.{field}={value!r} is invalid: must be an integer >= 1")
    own = item.get("categories")
    if own is None:
        chosen = categories
    else:
        chosen = tuple(own) if isinstance(own, list | tuple) else (own,)
        strange = [c for c in chosen if c not in categories]
        if not chosen or strange:
            raise SpectuneError(f"{key}.categories={own!r} is invalid: a non-empty list of the workload's categories "
                                f"({', '.join(categories)}) or null")
    phase_mix = read_mix(item.get("sampling_mix"), f"{key}.sampling_mix", sampling) or mix
    return Phase(name, item["concurrency"], tuple(chosen), phase_mix or (SamplingShare(sampling, 1.0),),
                 item["token_budget"])


def draw_settings(count: int, mix: Sequence[SamplingShare], key: str) -> list[SamplingParams]:
    """``count`` requests' settings: each entry's share met exactly (largest remainder, ties to the earlier entry),
    the order a shuffle seeded by ``key``."""
    exact = [m.share * count for m in mix]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(mix)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: count - sum(counts)]:
        counts[i] += 1
    out = [m.sampling for m, n in zip(mix, counts, strict=True) for _ in range(n)]
    random.Random(key).shuffle(out)
    return out


@dataclass(frozen=True)
class Assignment:
    """Which prompt of the pool a request takes, with its settings (None: the workload's) and phase (None)."""

    index: int
    sampling: SamplingParams | None
    phase: str | None


def assign(categories: Sequence[str], regimes: Regimes, max_new_tokens: int, seed: int,
           count: int | None) -> list[Assignment]:
    """The requests of a workload from its pool of prompts (``categories[i]``: the category of pool prompt i, in the
    pool's interleaved order). Without phases: the first ``count`` (None: all), each with its settings from the mix.
    With phases, in run order: each phase's prompts are the next unused ones of its categories, as many as its
    budget buys."""
    if not regimes.phases:
        size = len(categories) if count is None else count
        settings = (draw_settings(size, regimes.mix, f"{seed}:sampling") if regimes.mix is not None
                    else [None] * size)
        return [Assignment(i, s, None) for i, s in enumerate(settings)]
    used: set[int] = set()
    out: list[Assignment] = []
    for phase in regimes.phases:
        need = phase.requests(max_new_tokens)
        mine = [i for i, c in enumerate(categories) if i not in used and c in phase.categories][:need]
        if len(mine) < need:
            raise SpectuneError(f"workload.phases: phase {phase.name!r} needs {need} prompts of "
                                f"{', '.join(phase.categories)} (token_budget {phase.token_budget} / max_new_tokens "
                                f"{max_new_tokens}), the workload has {len(mine)} left: lower the token budgets, "
                                "or widen the workload")
        used.update(mine)
        settings = draw_settings(need, phase.mix, f"{seed}:sampling:{phase.name}")
        out.extend(Assignment(i, s, phase.name) for i, s in zip(mine, settings, strict=True))
    return out


def check_regimes(workload_cfg: Any) -> Regimes:
    """:func:`read_regimes` on a workload's config node (a Hydra ``DictConfig`` or a dict), before any model loads;
    a node without a sampling law or regimes (a hand-built one) has none."""
    from omegaconf import DictConfig, OmegaConf

    from workloads.categories import check_categories

    spec = OmegaConf.to_container(workload_cfg, resolve=True) if isinstance(workload_cfg, DictConfig) \
        else dict(workload_cfg or {})
    if not isinstance(spec.get("sampling"), dict) or not ({"sampling_mix", "phases"} & set(spec)):
        return Regimes()
    return read_regimes(spec, SamplingParams(**spec["sampling"]), check_categories(spec).categories)


def refuse_phases(workload_cfg: Any, task: str) -> None:
    """Only task=bench runs a workload phase by phase: any other task would silently run every phase at its own
    concurrency, so it refuses one (a sampling mix is fine everywhere: each request carries its settings)."""
    if check_regimes(workload_cfg).phases:
        raise SpectuneError(f"workload.phases is run by task=bench only, not by {task}: set workload.phases=null "
                            "(workload.sampling_mix still gives each request its own settings)")
