"""An online draft-length controller with hysteresis: per request, an acceptance estimate priced by the cost model;
speculation off where it stops paying, back on only once the estimate has clearly recovered.

Nothing tells it the regime (greedy or sampled, alone or in a batch). Each cycle, for each busy row:

1. **Acceptance estimate.** The request's acceptance tests (:func:`~spectune.engine.policy.acceptance_trials`:
   accepted drafts plus the first rejection, the censored-geometric count that does not fall with γ), discounted
   with a half-life of ``halflife`` tests so that the estimate follows a request whose text changes (a copied
   passage starts or ends), and shrunk towards a pool of every request that samples with the same settings
   (temperature, top-k, top-p) with the weight of ``prior_strength`` tests. Why a pool per setting: a greedy request
   and a T = 1 request of the same prompt accept differently (prompt lookup on smollm2: 2.06× AR at γ 8 greedy,
   0.78× at T = 1), so a new request starts from what its own setting did recently, not from a blend; the policy is
   never told which setting is the "good" one, it learns each from its own tests. The pool averages each row-cycle's
   rate (accepted over tests), not tests: pooled tests would weigh a row drafting 8 at high acceptance about 8 times
   a row probing one token, and a few well-accepting requests would set every new request's prior.
2. **Expected speed-up.** The cost model's two sides (:mod:`spectune.costmodel.cycle`): E(γ) = (1 − α^(γ+1)) /
   (1 − α) tokens per cycle, at the price of a cycle of γ drafts at the batch's busy rows (verification grows with
   the rows): S(γ) = E(γ) · AR step / cycle(γ). The prices come from ``profile`` (its batch dimension, interpolated)
   or, with no profile, from this run's own cycles per batch size, as ``model-based`` measures them.
3. **Hysteresis.** A row drafts argmax_γ S(γ) while on. It turns off (γ 0, a plain target step) once the best
   S falls below 1 − ``margin`` and back on only once it rises above 1 + ``margin``; a new request starts in the
   state its pooled estimate gives (on iff best S ≥ 1). Why a band: near break-even the estimate's noise would
   flip the row every few cycles, and each flip is paid (a row turned on at α just under break-even loses). With
   the default half-life (16 tests, about 46 effective tests) the estimate's standard error near α = 0.3 is about
   0.07, which moves S(1) by 0.04–0.05 on smollm2's CPU costs: the default ``margin`` 0.05 is about one such error
   each side.
4. **Learning while off.** A row that drafts nothing runs no acceptance test, so an estimate frozen low would
   never let it back. Two sources keep it learning: under a model-free draft (prompt lookup, suffix decoding) the
   engine's shadow test (:attr:`~spectune.engine.policy.CycleFeedback.shadow_accepted`: the chain's first token
   against the token the target emitted, a fair test at any temperature, bought with a chain search instead of a
   verification), where the row has a chain; and where the draft gives no shadow tests (a draft model), a probe:
   one draft every K cycles without a test. A model-free draft never probes: a row with no chain has nothing to
   draft, and one with a chain is tested for free (a probe there paid a verification for the same test). K is
   not a free constant but the cost model's: a probe at α = 0 pays a cycle of one draft for the one token an AR
   step gives, a loss of cycle(1) / AR − 1, so K = ceil(that loss / ``probe_budget``) keeps the probes' cost under
   ``probe_budget`` of the row's throughput while off (on smollm2's CPU costs one draft costs ~0.6 of an AR step:
   K ≈ 30 at 2%; a GPU's nearly free verification gives K of 2 or 3). One draft because the second test happens
   only after a first acceptance, which at low α is rare: one draft is the cheapest test.

5. **What the match says.** Under a model-free draft the chain's match (the tokens of the context's end it covers)
   is known at the first draft step, before anything is verified, and it moves acceptance more than anything else
   a row shows: on the Italian shifting workload the controller verified 82% of its greedy cycles where the
   match-length rule (verify from a 2-token match) verified 55%, and lost 6% to it. So every estimate above (the
   request's tests, its pool, its on/off state) is kept per match length, lengths from ``match_buckets`` on sharing
   one; the decision is taken at the first draft step, once the match is seen. Under a draft model (no match) there
   is one estimate, decided before drafting.
6. **The batch pays for every row's verification.** Rows draft in lockstep, so one row drafting γ makes the whole
   batch's cycle cost cycle(γ) while the rows that drafted nothing gain nothing. With ``per_batch``, the batch
   drafts to the depth d that maximises its rows' expected tokens together, Σ E_i(min(d, γ_i)), over cycle(d), and
   drafts nothing unless that clears the band's upper edge (1 + margin) against b rows' plain step; a probe's K is
   multiplied by the busy rows, since each off row's probe is paid by all of them. Alone (b = 1) the row's own band
   decides. Why the upper edge in any batch: a row that is on was chosen for an estimate above the line, so the
   batch's estimate leans optimistic; and rows that draft advance unevenly, so a batch whose rows end a few tokens
   apart runs its last cycles with fewer rows. On the Italian run, four rows at T = 1 verified something on 12% of
   cycles, at 138–217 ms against 111 ms for a plain step of the batch, and lost 7%; one or two rows that were on among
   rows that were off made 4% (en) and 14% (it) of such cycles draft, returning 0.58–0.94 of a plain step's tokens
   per second. With every row on, the lower edge (1 − margin) still let four rows at T = 1 draft on 44–53% of their
   cycles, for 0.97–1.02 of a plain step's rate, and their rows ended apart (English, the short profile's prompts).

Rows of a batch draft in lockstep until their deepest row stops; each row keeps its own γ
(:class:`~policies.rows.RowLimits`: rows stop at their γ and a row that is off is cut to no draft, so it verifies
nothing even in a cycle others draft). The cut reads only the policy's state, never the target: exactness
is untouched. One parameter set for every regime: nothing here is tuned per temperature or concurrency.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from policies.model_based import MeasuredCosts, nearest_costs
from policies.rows import RowLimits
from spectune.costmodel.cycle import expected_tokens_from_rates
from spectune.costmodel.profile import CycleCosts, Profile, load_profile
from spectune.engine.policy import RECENT_PRIOR, CycleFeedback, DraftStep, acceptance_trials
from spectune.errors import SpectuneError
from spectune.options import check_gamma
from spectune.sampling import SamplingParams

log = logging.getLogger(__name__)

SettingKey = tuple[float, int, float] | None  # a request's (temperature, top_k, top_p); None: not told
Bucket = int | None  # a chain's match length, capped at match_buckets; None: not known (a draft model, or not yet)


def setting_key(sampling: SamplingParams | None) -> SettingKey:
    """The pool a request's tests join: its sampling settings (None where the caller does not say them)."""
    if sampling is None:
        return None
    return (round(float(sampling.temperature), 3), int(sampling.top_k), round(float(sampling.top_p), 3))


class Discounted:
    """Accepted drafts over acceptance tests, each test's weight halved every ``halflife`` later tests."""

    def __init__(self, halflife: float) -> None:
        self.keep = 0.5 ** (1.0 / halflife)
        self.accepted = self.trials = 0.0

    def add(self, accepted: float, trials: float) -> None:
        decay = self.keep ** trials
        self.accepted = decay * self.accepted + accepted
        self.trials = decay * self.trials + trials


@dataclass
class RequestState:
    """What the controller keeps of one request in flight: per match length, its tests and its on/off state."""

    key: SettingKey
    halflife: float
    tests: dict[Bucket, Discounted] = field(default_factory=dict)
    on: dict[Bucket, bool] = field(default_factory=dict)  # absent: no decision yet (the first takes the pool's side)
    since_test: int = 0  # cycles since its last acceptance test (a probe is due after K)

    def tests_at(self, bucket: Bucket) -> Discounted:
        return self.tests.setdefault(bucket, Discounted(self.halflife))


class Hysteresis(RowLimits):
    """Per row: argmax_γ of the expected speed-up while on, γ 0 while off, with a hysteresis band around 1 (the grid's
    γ is the ceiling).

    Args:
        gamma: the ceiling γ (the grid's value).
        halflife: acceptance tests after which a request's own test weighs half (how fast its estimate follows it).
        pool_halflife: row-cycles after which a row-cycle's rate weighs half in the pool of requests sharing its
            sampling settings (a new request's prior).
        prior_strength: tests of its own a request needs to weigh as much as its pool.
        margin: the band: off below 1 − margin of expected speed-up, on again above 1 + margin.
        probe_budget: the largest fraction of an off row's throughput its probes may cost (sets K, the cycles
            between probes, from the cycle's price; see the module).
        profile: a cost profile (path or shipped name) whose batch dimension prices the cycle; None: the costs
            this run measures from its own cycles per batch size (as ``model-based``).
        cost_halflife: cycles, how fast measured costs follow a change (no profile only).
        verify_slope: the verification's cost per extra position as a fraction of the measured one, until two
            widths were measured (no profile only).
        shadow_trials: under a model-free draft, a row that verified nothing still gets its chain's first token
            tested against the emitted one (the engine's shadow test); False: only probes.
        match_buckets: estimates are kept per match length, lengths from this one on sharing one estimate; 0: one
            estimate whatever the match (and the decision taken before drafting).
        per_batch: the batch drafts only where its rows' expected tokens together pay for the batch's cycle, and
            probes are budgeted per batch; False: each row decides as if every row were like it.
    """

    name = "hysteresis"
    reads_sampling = True
    signals = frozenset({"match_length"})

    def __init__(self, gamma: int, halflife: float = 16.0, pool_halflife: float = 64.0, prior_strength: float = 4.0,
                 margin: float = 0.05, probe_budget: float = 0.02, profile: str | None = None,
                 cost_halflife: float = 64.0, verify_slope: float = 0.05, shadow_trials: bool = True,
                 match_buckets: int = 4, per_batch: bool = True) -> None:
        check_gamma(gamma, "the hysteresis controller's ceiling")
        for key, value, low, high in (("halflife", halflife, 1.0, math.inf), ("pool_halflife", pool_halflife, 1.0,
                                      math.inf), ("prior_strength", prior_strength, 0.0, math.inf),
                                      ("margin", margin, 0.0, 0.5), ("probe_budget", probe_budget, 1e-6, 1.0),
                                      ("cost_halflife", cost_halflife, 1.0, math.inf),
                                      ("verify_slope", verify_slope, 0.0, math.inf)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or not low <= value <= high:
                bound = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
                raise SpectuneError(f"policy.{key}={value!r} is invalid: must be a finite number {bound}")
        self.ceiling = gamma
        self.halflife, self.pool_halflife, self.prior_strength = float(halflife), float(pool_halflife), \
            float(prior_strength)
        self.margin, self.probe_budget = float(margin), float(probe_budget)
        self.cost_halflife, self.verify_slope = float(cost_halflife), float(verify_slope)
        if isinstance(match_buckets, bool) or not isinstance(match_buckets, int) or match_buckets < 0:
            raise SpectuneError(f"policy.match_buckets={match_buckets!r} is invalid: must be an integer >= 0 (the "
                                "match length from which matches share one estimate; 0: one estimate whatever the "
                                "match)")
        self.shadow_trials, self.match_buckets, self.per_batch = bool(shadow_trials), match_buckets, bool(per_batch)
        self.profile_name = profile
        self.profile: Profile | None = load_profile(profile) if profile is not None else None
        if self.profile is not None and self.profile.max_positions < gamma + 1:
            raise SpectuneError(f"policy.profile={profile!r} verifies up to {self.profile.max_positions} positions: "
                                f"gamma={gamma} needs {gamma + 1}")
        self.reset()

    def reset(self) -> None:
        self.requests: dict[int, RequestState] = {}
        self.pools: dict[SettingKey, Discounted] = {}
        self.measured: dict[int, MeasuredCosts] = {}
        self.set_limits({})  # slot -> γ this cycle
        self.busy = 0
        self.serving: dict[int, int] = {}  # slot -> the request it serves this cycle (its state in self.requests)
        self.buckets: dict[int, Bucket] = {}  # request -> its chain's match bucket this cycle (seen at step 0)
        self.sees_match: bool | None = None  # whether the draft reports a match (None: no draft step seen yet)
        self.shadowed = False  # the engine gives shadow tests (a model-free draft): no probes are needed
        self.decided = False  # this cycle's limits are final (taken at step 0, or before drafting)

    # -- the estimate and the price -------------------------------------------------------------------------
    def pool(self, key: SettingKey, bucket: Bucket = None) -> Discounted:
        return self.pools.setdefault((key, bucket), Discounted(self.pool_halflife))

    def pooled_rate(self, key: SettingKey, bucket: Bucket = None) -> float:
        """The pool's acceptance (a discounted mean of its row-cycles' rates), :data:`RECENT_PRIOR` with the weight of
        one row-cycle before it has any."""
        pool = self.pool(key, bucket)
        return (pool.accepted + RECENT_PRIOR) / (pool.trials + 1.0)

    def acceptance(self, state: RequestState, bucket: Bucket = None) -> float:
        """The request's acceptance estimate at this match bucket: its discounted tests there shrunk towards its
        pool's rate there."""
        tests = state.tests_at(bucket)
        return (tests.accepted + self.prior_strength * self.pooled_rate(state.key, bucket)) / \
            max(tests.trials + self.prior_strength, 1e-12)

    def bucket(self, match_length: float) -> Bucket:
        return None if self.match_buckets == 0 else min(int(match_length), self.match_buckets)

    def costs(self, busy: int) -> CycleCosts | None:
        """The cycle's prices at ``busy`` rows: the profile's, or this run's measurements (None before any)."""
        if self.profile is not None:
            return self.profile.costs(busy)
        return nearest_costs(self.measured, busy, self.ceiling)

    def expected_tokens(self, alphas: np.ndarray) -> np.ndarray:
        """[rows, ceiling + 1] E(γ), the tokens a cycle of γ drafts emits: the cost model's
        (:func:`~spectune.costmodel.cycle.expected_tokens_from_rates` at a constant rate α, the closed form's series).
        A row's expected speed-up over an AR step is E(γ) · cycle(0) / cycle(γ)."""
        expected = np.array([expected_tokens_from_rates(np.full(self.ceiling, alpha)) for alpha in alphas])
        return expected.reshape(len(alphas), self.ceiling + 1)

    def probe_every(self, seconds: np.ndarray, busy: int = 1) -> int:
        """K: cycles between probes of an off row, so that a probe's worst loss (one draft emitting one token, an
        AR step's worth, for the price of cycle(1)) spread over K cycles stays within ``probe_budget``; with
        ``per_batch``, K times the busy rows, since each row's probe costs the whole batch that loss."""
        loss = max(float(seconds[1] / seconds[0]) - 1.0, 0.0) * (busy if self.per_batch else 1)
        return max(1, math.ceil(loss / self.probe_budget))

    def decide(self, states: list[RequestState], busy: int, buckets: list[Bucket] | None = None) -> list[int]:
        """Each row's γ this cycle (and each request's on/off state at its bucket updated, with the band)."""
        costs = self.costs(busy)
        if costs is None:  # nothing measured yet: draft the ceiling (which measures the deep end first)
            return [self.ceiling] * len(states)
        buckets = buckets if buckets is not None else [None] * len(states)
        seconds = np.asarray(costs.cycle_s(np.arange(self.ceiling + 1)), dtype=float)
        expected = self.expected_tokens(np.array([self.acceptance(s, b) for s, b in zip(states, buckets, strict=True)]))
        gains = expected * seconds[0] / seconds[None, :]
        probe = self.probe_every(seconds, busy)
        wanted, probes = [], []
        for state, bucket, gain in zip(states, buckets, gains, strict=True):
            best = 1 + int(np.argmax(gain[1:]))  # ties to the smaller γ
            on = state.on.get(bucket)
            if on is None:
                on = bool(gain[best] >= 1.0)
            elif on and gain[best] < 1.0 - self.margin:
                on = False
            elif not on and gain[best] > 1.0 + self.margin:
                on = True
            state.on[bucket] = on
            wanted.append(best if on else 0)
            probes.append(not on and not self.shadowed and state.since_test >= probe)
        if self.per_batch and any(wanted):
            wanted = self.batch_depths(wanted, expected, seconds)
        return [1 if probe_due and g == 0 else g for g, probe_due in zip(wanted, probes, strict=True)]

    def batch_depths(self, wanted: list[int], expected: np.ndarray, seconds: np.ndarray) -> list[int]:
        """The rows' γ once the batch's cycle is priced: the depth d maximising the rows' expected tokens together
        (``expected``: each row's E(γ)) over cycle(d), each row drafting min(d, its γ); none unless that clears the
        band's upper edge against a plain step of the batch (rows chosen for estimates above the line lean
        optimistic, and drafting rows end apart). A lone row that is on keeps its own band's lower edge."""
        limits = np.asarray(wanted)
        depths = np.arange(1, self.ceiling + 1)
        tokens = np.array([expected[np.arange(len(wanted)), np.minimum(d, limits)].sum() for d in depths])
        batch_gain = tokens / seconds[depths] * seconds[0] / len(wanted)
        best = int(np.argmax(batch_gain))  # ties to the shallower depth
        edge = 1.0 - self.margin if len(limits) == 1 else 1.0 + self.margin
        if batch_gain[best] < edge:
            return [0] * len(wanted)
        return np.minimum(limits, depths[best]).tolist()

    # -- the protocol --------------------------------------------------------------------------------------
    def before_cycle(self, rows: list[int], request_ids: list[int], context_lengths: list[int] | None = None,
                     sampling: list[SamplingParams] | None = None) -> None:
        settings = sampling if sampling is not None else [None] * len(rows)
        states = []
        for request, setting in zip(request_ids, settings, strict=True):
            state = self.requests.get(request)
            if state is None:
                state = RequestState(setting_key(setting), self.halflife)
            states.append(state)
        self.requests = dict(zip(request_ids, states, strict=True))  # every busy slot is in every cycle: the rest ended
        self.serving = dict(zip(rows, request_ids, strict=True))
        self.busy, self.buckets = len(rows), {}
        if self.match_buckets and self.sees_match is not False and self.costs(self.busy) is not None:
            # a model-free draft shows its match at the first step: draft it (a chain search), decide there
            self.set_limits(dict.fromkeys(rows, self.ceiling))
            self.decided = False
        else:
            self.set_limits(dict(zip(rows, self.decide(states, self.busy), strict=True)))
            self.decided = True

    def decide_at_match(self, step: DraftStep) -> None:
        """At the cycle's first draft step: each row's γ from its estimate at its chain's match bucket."""
        self.decided = True
        # a draft model reports no match: one estimate, decided before drafting from now on
        self.sees_match = step.match_length is not None
        buckets = None
        if self.sees_match:
            matches = step.match_length.tolist()
            buckets = [self.bucket(matches[row]) for row in self.serving]
            self.buckets = dict(zip(self.serving.values(), buckets, strict=True))
        states = [self.requests[request] for request in self.serving.values()]
        self.set_limits(dict(zip(self.serving, self.decide(states, self.busy, buckets), strict=True)))

    def continue_drafting(self, step: DraftStep) -> torch.Tensor | None:
        if not self.decided:
            self.decide_at_match(step)
        return super().continue_drafting(step)

    def end_drafting(self, step: DraftStep) -> list[int] | None:
        if not self.decided:  # a depth of one: the first step is the last
            self.decide_at_match(step)
        return super().end_drafting(step)

    def observe(self, feedback: CycleFeedback) -> None:
        if self.profile is None and feedback.num_drafts:
            batch, steps = len(feedback.num_drafts), max(feedback.num_drafts)
            self.measured.setdefault(batch, MeasuredCosts(self.cost_halflife, self.verify_slope)).observe(steps,
                                                                                                          feedback)
        if feedback.request_ids is None:
            return
        self.shadowed = self.shadowed or (self.shadow_trials and feedback.shadow_accepted is not None)
        shadows = feedback.shadow_accepted or [None] * len(feedback.request_ids)
        for request, drafted, accepted, shadow in zip(feedback.request_ids, feedback.num_drafts,
                                                      feedback.num_accepted, shadows, strict=True):
            state = self.requests.get(request)
            if state is None:
                continue
            if drafted == 0 and shadow is not None and self.shadow_trials:
                accepted, drafted = int(shadow), 1
            trials = acceptance_trials(accepted, drafted)
            if trials == 0:
                state.since_test += 1
                continue
            bucket = self.buckets.get(request)
            state.since_test = 0
            state.tests_at(bucket).add(accepted, trials)
            self.pool(state.key, bucket).add(accepted / trials, 1)

    def describe(self) -> dict:
        return {"name": self.name, "ceiling": self.ceiling, "halflife": self.halflife,
                "pool_halflife": self.pool_halflife, "prior_strength": self.prior_strength, "margin": self.margin,
                "probe_budget": self.probe_budget, "shadow_trials": self.shadow_trials,
                "match_buckets": self.match_buckets, "per_batch": self.per_batch,
                "costs": self.profile_name or "measured in this run", "per": "request"}
