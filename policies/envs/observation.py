"""The observations of the environments and of the PPO policies inside the engine — their one definition.

Each observation kind has one builder here (:class:`Observation`): :data:`GAMMA` (per draft step) and :data:`CYCLE`
(once per cycle, before drafting). Its sources only hand it what they hold: the environments and the replay a trace
row (:meth:`Observation.from_trace`), the live policies the engine's :class:`DraftStep` and their own history
(:meth:`Observation.from_step`, or :meth:`Observation.constants` and :meth:`Observation.build` with cached
columns). What each field means is written once, in :data:`STEP_FEATURES`, :data:`ROW_FEATURES` and
:data:`BEFORE_DRAFTING`, so adding a feature is one edit in this module (:data:`VERSION` changes only with a
field's meaning).

**γ** (``spectune/DraftGamma-v0``, :class:`policies.ppo.PPOGamma`): the raw values of :data:`GAMMA_FIELDS`
(any subset, in a policy file's order; by default :data:`OBS_FIELDS`, 0–9) become the vector with
:func:`scale_gamma` — divided by :data:`SCALE` in float64, then float32 — whether they come from a recorded cycle,
the live session or a :class:`DraftStep` inside the engine. :func:`gamma_observation` is the same by name. The
fields, in order:

====  =====================  ==========================================================================
idx   name                   value (scaling)
====  =====================  ==========================================================================
0     token_prob             q(x) of the token just drafted (0 before the first draft step)
1     entropy                entropy of q at this step, nats / 10
2     margin                 top-1 minus top-2 probability of q
3     cum_prob               product of token_prob over this cycle's drafts (1 before the first step)
4     position               draft steps taken this cycle / 10 (LTD's step/10)
5     context_length         tokens in the row's sequence before the cycle / 1000 (LTD's seq_len/1000)
6     batch_size             rows in flight / 32
7     recent_acceptance      accepted / (accepted + rejections) over the row's previous cycles (0.5 before any)
                             (live under a model-free draft: a cycle that verified nothing counts its first draft
                             against the emitted token, CycleFeedback.shadow_accepted)
8     c                      profile's draft step over AR step, c(b)
9     g                      profile's verification of one more position, g(position + 1, b)
10    match_length           tokens of the context's end the chain matched / 10
11    matches                earlier occurrences of that end followed by a token / 100
12    suffix_score           the drafted token's frequency score count(child)/count(node) (prompt lookup: 1)
13    suffix_prob            product of suffix_score over this cycle's drafts
====  =====================  ==========================================================================

Indices 0–3 are :data:`spectune.engine.policy.DRAFT_SIGNALS` (same names, same order), 10–13
:data:`spectune.engine.policy.MATCH_SIGNALS`: a model-free draft's (prompt lookup, suffix decoding), whose q is a point
mass, so that 0–3 say nothing there. 10–13 are opt-in: the default (:data:`OBS_FIELDS`), and what files that name no
features observe, is 0–9; a draft model has no match (its :class:`DraftStep` leaves them None, read as their values
before drafting), and the environment refuses them on traces that did not record them. Before drafting they are 0:
the chain, and with it the match, is found at the cycle's first draft step.

**Cycle** (``spectune/CycleGamma-v0``, :class:`policies.ppo_cycle.PPOCycle`): the γ is chosen once, before
drafting, so the observation holds only what is known then: :data:`CYCLE_FIELDS`, the γ observation's
fields 5–9 with their values at step 0 (g is g(1, b)), scaled alike (:func:`cycle_observation`).

A policy file names its observation in ``spectune.json`` (:meth:`Observation.schema`: kind, version, features);
:func:`read_schema` reads it back, a file without a version as version 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from spectune.engine.policy import DRAFT_SIGNALS, MATCH_SIGNALS, SIGNALS
from spectune.errors import SpectuneError

if TYPE_CHECKING:
    from spectune.costmodel.profile import CycleCosts
    from spectune.engine.policy import DraftStep

OBS_FIELDS: tuple[str, ...] = (*DRAFT_SIGNALS, "position", "context_length", "batch_size", "recent_acceptance",
                               "c", "g")
# Every field a γ policy file may name: the default ones, then the match signals of a model-free draft (opt-in: a
# draft model has none, so they are not in the default, and files that name no features keep observing what they did).
GAMMA_FIELDS: tuple[str, ...] = (*OBS_FIELDS, *MATCH_SIGNALS)
SCALE: dict[str, float] = {"entropy": 10.0, "position": 10.0, "context_length": 1000.0, "batch_size": 32.0,
                           "match_length": 10.0, "matches": 100.0}
OBS_HIGH = 1e4  # every field is >= 0; a finite bound keeps gymnasium's checker quiet
assert OBS_FIELDS[:4] == tuple(DRAFT_SIGNALS)


FIELD = {name: i for i, name in enumerate(OBS_FIELDS)}  # name -> index in the default vector


def scales(fields: tuple[str, ...] = OBS_FIELDS) -> np.ndarray:
    """The divisor of each field (1 for those used as they are), float64."""
    return np.array([SCALE.get(name, 1.0) for name in fields], dtype=np.float64)


def scale_gamma(raw: np.ndarray, fields: tuple[str, ...] = OBS_FIELDS, out: np.ndarray | None = None) -> np.ndarray:
    """The observation from raw values [..., F] of ``fields``: divided by their scales in float64, then float32
    (into ``out`` when given)."""
    scaled = np.asarray(raw, dtype=np.float64) / scales(fields)
    if out is None:
        return scaled.astype(np.float32)
    out[...] = scaled
    return out


def scale_rows(columns: Sequence[Sequence[float]], divisors: Sequence[float]) -> np.ndarray:
    """:func:`scale_gamma` for values given column by column as Python numbers ([F] columns of [B] each, the
    divisors of :func:`scales` as floats): the same float64 division and float32 result, bit for bit, in one array
    construction. The engine-side policies use it: their decisions run between forwards, on caches the models have
    just evicted, where every numpy call costs tens of µs."""
    rows = len(columns[0]) if columns else 0
    return np.array([[column[row] / divisor for column, divisor in zip(columns, divisors, strict=True)]
                     for row in range(rows)], dtype=np.float32)


# -- what each field is, once ------------------------------------------------------------------------------
def _g_of_one_more(drafted: int, batch: int, costs: CycleCosts) -> float:
    """g of verifying one more position than the ``drafted`` drafts so far, capped at the profile's deepest.

    :meth:`CycleCosts.g` (k) is the verification of k drafts (k + 1 positions) over one position. The environment
    counts its drafts as ``gamma`` (after k draft steps, γ = k) and used g(γ + 1); the engine's
    :class:`DraftStep` is 0-based (after ``step`` s, s + 1 drafts exist) and used g(step + 2). Both are g(drafted + 1):
    the same quantity, ``drafted = gamma = step + 1``. Sources give ``drafted``; only this function adds the 1."""
    return costs.g(min(drafted + 1, len(costs.t_verify) - 1))


# fields the same for every row at a point of a cycle: name -> raw value from (drafts so far, rows in flight, costs)
STEP_FEATURES: dict[str, Callable[[int, int, CycleCosts], float]] = {
    "position": lambda drafted, batch, costs: drafted,
    "batch_size": lambda drafted, batch, costs: batch,
    "c": lambda drafted, batch, costs: costs.c,
    "g": _g_of_one_more,
}
# fields per row and constant over its cycle: the source hands their raw values (contexts, its acceptance history)
ROW_FEATURES: tuple[str, ...] = ("context_length", "recent_acceptance")
# the draft signals' values before anything is drafted (the environment's step 0, the policy's begin_cycle)
BEFORE_DRAFTING: dict[str, float] = {"token_prob": 0.0, "entropy": 0.0, "margin": 0.0, "cum_prob": 1.0,
                                     # the match is found with the chain, at the first draft step
                                     "match_length": 0.0, "matches": 0.0, "suffix_score": 0.0, "suffix_prob": 0.0}
VERSION = 1  # of the fields' definitions: bump it when a field's meaning changes, not when one is added
assert set(GAMMA_FIELDS) == set(STEP_FEATURES) | set(ROW_FEATURES) | set(SIGNALS)
assert set(BEFORE_DRAFTING) == set(SIGNALS)

Column = Callable[[str], Sequence[float]]  # a per-row field's raw values over the rows, by name


class Observation:
    """The one builder of an observation kind, for a policy file's ``features`` (a subset of the kind's fields, in
    the file's order). ``exact``: the kind takes only its whole field list (the cycle policy's files)."""

    def __init__(self, kind: str, fields: tuple[str, ...], drafts: bool, exact: bool,
                 features: tuple[str, ...] | None = None) -> None:
        self.kind, self.fields, self.drafts, self.exact = kind, fields, drafts, exact
        self.features = fields if features is None else tuple(features)
        assert set(self.features) <= set(fields), (kind, self.features)
        self.divisors = scales(self.features).tolist()
        self.step_fields = frozenset(f for f in self.features if f in STEP_FEATURES)
        self.signals = frozenset(f for f in self.features if f in SIGNALS)  # what the engine computes for it
        self.row_fields = frozenset(self.features) - self.step_fields - self.signals

    def of(self, features: Sequence[str]) -> Observation:
        """This kind's builder for a file's ``features``."""
        return Observation(self.kind, self.fields, self.drafts, self.exact, tuple(features))

    def schema(self) -> dict[str, Any]:
        """What a policy file stores under ``spectune.json``'s ``observation``."""
        return {"kind": self.kind, "version": VERSION, "features": list(self.features)}

    def constants(self, drafted: int, batch: int, costs: CycleCosts) -> dict[str, float]:
        """The raw values of the fields the same for every row after ``drafted`` drafts at ``batch`` rows in
        flight (cache them per (batch, drafted): they are all a step needs besides the per-row columns)."""
        return {name: float(STEP_FEATURES[name](drafted, batch, costs)) for name in self.features
                if name in STEP_FEATURES}

    def build(self, constants: Mapping[str, float], rows: int, column: Column) -> np.ndarray:
        """[rows, F] float32: the scaled observation from the step's ``constants`` and ``column(name)`` for the
        per-row fields (signals, context, recent acceptance), by :func:`scale_rows` (bit for bit
        :func:`scale_gamma`)."""
        return scale_rows([(constants[name],) * rows if name in constants else column(name)
                           for name in self.features], self.divisors)

    def from_trace(self, drafted: int, batch: int, costs: CycleCosts, context: float, recent: float,
                   signals: Sequence[float] | None = None) -> np.ndarray:
        """[F] float32 of one recorded row (an environment, the replay): after ``drafted`` drafts whose last
        position's ``signals`` (SIGNALS order: the q-derived ones, then the match signals where the trace holds them;
        None before drafting) were recorded."""
        recorded = BEFORE_DRAFTING if signals is None else dict(zip(SIGNALS, signals, strict=False))
        values = {"context_length": (float(context),), "recent_acceptance": (float(recent),),
                  **{name: (float(value),) for name, value in recorded.items()}}
        return self.build(self.constants(drafted, batch, costs), 1, values.__getitem__)[0]

    def step_column(self, step: DraftStep | None, context: Sequence[float], recent: Sequence[float]) -> Column:
        """The per-row columns of the engine's draft ``step`` (its signals; None: before drafting, the signals'
        :data:`BEFORE_DRAFTING` values), with the rows' ``context`` and ``recent`` acceptance."""
        def column(name: str) -> Sequence[float]:
            if name == "context_length":
                return context
            if name == "recent_acceptance":
                return recent
            value = None if step is None else getattr(step, name)
            return value.tolist() if value is not None else [BEFORE_DRAFTING[name]] * len(context)
        return column

    def from_step(self, step: DraftStep, batch: int, costs: CycleCosts, context: Sequence[float],
                  recent: Sequence[float]) -> np.ndarray:
        """[slots, F] float32 of the engine's draft ``step`` (0-based: ``step.step + 1`` drafts so far) at ``batch``
        rows in flight."""
        return self.build(self.constants(step.step + 1, batch, costs), len(context),
                          self.step_column(step, context, recent))


def read_schema(extra: Mapping[str, Any], builder: Observation, where: str) -> Observation:
    """The builder of a policy file's observation (``extra``: its ``spectune.json``; ``where``: ``key='path'``).
    A file without ``observation`` is version 1 with the fields files had before they named theirs
    (:data:`UNNAMED`); a list of names (files before the version) is version 1 with those. A kind, version or
    names the builder does not make fail in one line."""
    entry = extra.get("observation")
    if entry is None:
        kind, version, features = builder.kind, 1, list(UNNAMED[builder.kind])
    elif isinstance(entry, list):
        kind, version, features = builder.kind, 1, entry
    elif isinstance(entry, dict):
        kind, version, features = entry.get("kind"), entry.get("version", 1), entry.get("features")
    else:
        kind, version, features = None, None, entry
    known = isinstance(features, list) and all(isinstance(f, str) for f in features) and (
        tuple(features) == builder.fields if builder.exact else set(features) <= set(builder.fields))
    if kind != builder.kind or version != VERSION or not known:
        raise SpectuneError(f"{where} is invalid: its observation {kind!r} version {version!r} features {features} "
                            f"are not the {builder.kind} observation's version {VERSION} features "
                            f"{list(builder.fields)}{'' if builder.exact else ' (any of them, in any order)'}")
    return builder.of(features)


GAMMA = Observation("gamma", GAMMA_FIELDS, drafts=True, exact=False, features=OBS_FIELDS)  # default: OBS_FIELDS
# What files that name no features observe: every field there was when files began to name them. Fields added
# since then are named by every file that uses them.
UNNAMED: dict[str, tuple[str, ...]] = {"gamma": ("token_prob", "entropy", "margin", "cum_prob", "position",
                                                 "context_length", "batch_size", "recent_acceptance", "c", "g")}


def gamma_observation(fields: tuple[str, ...] = OBS_FIELDS, **values: Any) -> np.ndarray:
    """:func:`scale_gamma` by name (tests; the sources call :data:`GAMMA`): ``values`` holds a raw value per field
    of ``fields``, scalars for one row (→ [F]) or arrays [B] for many (→ [B, F])."""
    return scale_gamma(np.stack(np.broadcast_arrays(*[np.asarray(values[f], dtype=np.float64) for f in fields]),
                                axis=-1), fields)


# -- the cycle observation --------------------------------------------------------------------------------
CYCLE_FIELDS: tuple[str, ...] = ("context_length", "batch_size", "recent_acceptance", "c", "g")
assert set(CYCLE_FIELDS) < set(OBS_FIELDS)
CYCLE = Observation("cycle", CYCLE_FIELDS, drafts=False, exact=True)  # at drafted = 0: g is g(1, b)
UNNAMED["cycle"] = CYCLE_FIELDS


def cycle_observation(**values: Any) -> np.ndarray:
    """The cycle observation from its raw values by name (tests; the sources call :data:`CYCLE`), scaled by
    :func:`scale_gamma`'s scales; one row (scalars → [F]) or many (arrays [B] → [B, F])."""
    return gamma_observation(CYCLE_FIELDS, **values)


# -- the size observation and cut ---------------------------------------------------------------------------
def size_observation(cum: np.ndarray, gammas: np.ndarray, batch: int, c: float, g: float,
                     obs_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The size policy's observation (``spectune/VerifySize-v0``, :class:`policies.ppo_size.PPOSize`) and the drafted
    tokens' order (flat indices into ``cum`` [B, D]): the cumulative draft probabilities of the drafted tokens in
    decreasing order (``obs_tokens``, zero padded), then batch size / 32, c(B), g(D, B).

    Only drafted positions (j < gammas[b]) count; ties go to earlier rows, then earlier positions (a stable
    sort), so since cumulative probabilities never grow along a chain each row's kept tokens are a prefix."""
    width = cum.shape[1] if cum.ndim == 2 else 0
    drafted = (np.arange(width)[None, :] < np.asarray(gammas)[:, None]).ravel()
    flat = np.asarray(cum, dtype=np.float64).reshape(-1)
    candidates = np.flatnonzero(drafted)
    order = candidates[np.argsort(-flat[candidates], kind="stable")]
    obs = np.zeros(obs_tokens + 3, dtype=np.float32)
    top = flat[order][:obs_tokens]
    obs[: len(top)] = top
    obs[-3:] = (batch / SCALE["batch_size"], c, g)
    return obs, order


def size_cut(order: np.ndarray, action: int, levels: int, gammas: np.ndarray, width: int) -> np.ndarray:
    """Per-row kept lengths for budget level ``action``: the first round(a / (levels−1) · Σ γ) of ``order``
    (flat indices into a [B, width] grid)."""
    gammas = np.asarray(gammas, dtype=int)
    budget = round(int(action) / (levels - 1) * int(gammas.sum()))
    keep = np.zeros(len(gammas) * width, dtype=int)
    keep[order[:budget]] = 1
    return keep.reshape(len(gammas), width).sum(1)
