"""A model-based draft length: each request's acceptance by position, plugged into the cost model, argmax speed.

The cost model's S(γ) = E(γ) / cost(γ), with E the tokens a cycle is expected to emit. Here E is built from
per-position acceptance rates of the request itself, shrunk towards the rates pooled over every request while
it has few observations of its own, and the costs are the ones this run pays, measured from its own cycles:
the time of one draft step, the verification as an affine function of the positions verified, and the rest of
the cycle, each per batch size. Both sides are the library's (:mod:`spectune.costmodel.cycle`): E from the per-position
rates, and the cycle's seconds as a :class:`~spectune.costmodel.profile.CycleCosts` built from the measurements, the
cost a profile's replay charges. Every cycle each row drafts the γ that maximises its expected tokens per second
(γ = 0, a plain target step, when no γ pays). No draft signal is read: the decision is made once per cycle, from
the requests ``before_cycle`` names, and rows are stopped at their own γ without a host sync at steps where no
row stops (none at all when every row chose the same γ).

It is the model-based baseline a learned policy has to beat: if reinforcement learning cannot do better than
"estimate acceptance, plug it into the cost model", it adds nothing.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from policies.rows import RowTracker
from spectune.costmodel.cycle import expected_tokens_from_rates
from spectune.costmodel.profile import CycleCosts
from spectune.engine.policy import (
    RECENT_PRIOR,
    CycleFeedback,
    DraftLengthPolicy,
    DraftStep,
    acceptance_trials,
)
from spectune.errors import SpectuneError
from spectune.options import check_gamma

# Position 1 starts from the protocol's prior (RECENT_PRIOR) before any cycle was observed; a position not yet
# observed assumes the pooled rate of the position before it (acceptance is roughly flat along a chain).


class _Ewm:
    """An exponentially weighted mean with a half-life in updates (costs drift with load and cache size)."""

    def __init__(self, halflife: float) -> None:
        self.keep = 0.5 ** (1.0 / halflife)
        self.weight = 0.0
        self.total = 0.0

    def update(self, value: float) -> None:
        self.weight = self.keep * self.weight + 1.0
        self.total = self.keep * self.total + value

    @property
    def mean(self) -> float:
        return self.total / self.weight


class MeasuredCosts:
    """What a cycle costs at one batch size, measured from the run's own cycles (synchronised seconds): the draft
    step, the verification against positions verified and the rest of the cycle, each an exponentially weighted
    mean. :meth:`costs` gives them as the library's :class:`~spectune.costmodel.profile.CycleCosts`, whose cycle a
    profile's replay charges too."""

    def __init__(self, halflife: float, verify_slope: float) -> None:
        self.halflife, self.verify_slope = halflife, verify_slope
        self.step = _Ewm(halflife)  # one draft step
        self.rest = _Ewm(halflife)  # the cycle's own work outside drafting and verification
        self.verify: dict[int, _Ewm] = {}  # positions verified -> verification time
        self._line: tuple[float, float] | None = None  # the verification line, refitted after an observation

    def observe(self, steps: int, feedback: CycleFeedback) -> None:
        if steps > 0:
            self.step.update(feedback.draft_s / steps)
        self.verify.setdefault(steps + 1, _Ewm(self.halflife)).update(feedback.verify_s)
        self.rest.update(max(0.0, feedback.cycle_s - feedback.draft_s - feedback.verify_s))
        self._line = None

    def line(self) -> tuple[float, float]:
        """(intercept, slope) of the verification time against positions verified, for the widths not measured yet:
        least squares through the measured means of the drafted widths (2 positions or more; slope ≥ 0); with one
        width measured, the prior slope as a fraction of that time per position. A plain step (1 position) is left
        out of the fit where a width was drafted: it is another computation (smollm2 on a 2-vCPU CPU: 74 ms, against
        124 ms to verify one drafted token), and a line through both prices a short verification too low. Fitted
        once per observation, not per decision."""
        if self._line is None:
            drafted = sorted(k for k in self.verify if k >= 2)
            n = np.array(drafted or sorted(self.verify), dtype=float)
            t = np.array([self.verify[int(k)].mean for k in n])
            if len(n) >= 2:  # closed-form least squares: np.polyfit's SVD costs ~50 µs a call
                dn = n - n.mean()
                slope = float((dn * (t - t.mean())).sum() / (dn * dn).sum())
                intercept = float(t.mean() - slope * n.mean())
                if slope < 0:
                    slope, intercept = 0.0, float(t.mean())
            else:
                slope = self.verify_slope * float(t[0])
                intercept = float(t[0] - slope * n[0])
            self._line = (intercept, slope)
        return self._line

    def verify_s(self, positions: np.ndarray) -> np.ndarray:
        """Verification time at each number of positions: a width measured at its own measured mean, a width not
        measured yet on :meth:`line`. Why not the line everywhere: the times are not linear in the width. On smollm2
        on a 2-vCPU CPU, verifying one or two drafted tokens took 126 and 145 ms and eight 120 ms (the output
        projection's matrix product takes a slower path for two and three rows than for four or more), so a line
        prices the short verifications too low and a controller drafts one or two tokens where eight cost less."""
        intercept, slope = self.line()
        positions = np.asarray(positions, dtype=float)
        times = np.maximum(intercept + slope * positions, 1e-9)
        for width, mean in self.verify.items():
            times = np.where(positions == width, mean.mean, times)
        return times

    def costs(self, step_s: float, max_drafts: int) -> CycleCosts:
        """The cycle's costs for 0..``max_drafts`` drafts: draft steps of ``step_s`` (measured here or at another
        batch size), :meth:`verify_s` at 1..``max_drafts`` + 1 positions, the rest as the overhead."""
        return CycleCosts(step_s, self.verify_s(np.arange(1.0, max_drafts + 2.0)), self.rest.mean)


def nearest_costs(costs: dict[int, MeasuredCosts], batch_size: int, max_drafts: int) -> CycleCosts | None:
    """The costs measured at the batch size nearest ``batch_size`` (None before any), with the draft step's at the
    nearest one where a draft step was measured (a batch size that only ran plain target steps has not measured
    one; none anywhere: 0, which makes drafting look cheap, so it is tried and measured)."""
    if not costs:
        return None

    def nearest(sizes: list[int]) -> int:
        return min(sizes, key=lambda b: (abs(b - batch_size), b))

    drafted = [b for b, c in costs.items() if c.step.weight]
    step_s = costs[nearest(drafted)].step.mean if drafted else 0.0
    return costs[nearest(list(costs))].costs(step_s, max_drafts)


class ModelBased(DraftLengthPolicy):
    """argmax over γ ∈ ``min_gamma``..γ of E_request(γ) / cost(γ), per row, every cycle (the grid's γ is the ceiling).

    ``prior_strength`` is how many observations of its own a request needs to weigh as much as the pooled rates;
    ``cost_halflife`` (cycles) how fast the measured costs follow a change; ``verify_slope`` the verification's
    cost per extra position, as a fraction of the measured verification, until two sizes have been measured.
    Until a batch size has been measured the row drafts the ceiling (which measures the deep end first).

    ``refresh``: told the cycle's requests (``before_cycle``), the choices are recomputed every ``refresh`` cycles
    and whenever a request is new; in between the outcomes are only queued. Why: the decision runs between
    forwards, on caches they have just evicted, where even this arithmetic costs ~0.3 ms a cycle (measured on the
    embedded pair: 3.5% of a cycle), while one more observation moves a request's estimate by at most
    1 / (observations + ``prior_strength``) and the costs by 1 / ``cost_halflife``-th of a half-life.
    """

    name = "model-based"

    def __init__(self, gamma: int, min_gamma: int, prior_strength: float, cost_halflife: float,
                 verify_slope: float, refresh: int = 1) -> None:
        check_gamma(gamma, "the model-based ceiling")
        if not (isinstance(min_gamma, int) and not isinstance(min_gamma, bool) and 0 <= min_gamma <= gamma):
            raise SpectuneError(f"model-based gamma={gamma!r}, policy.min_gamma={min_gamma!r} are invalid: "
                                "need integers with 0 <= min_gamma <= gamma and gamma >= 1")
        for key, value, low in (("prior_strength", prior_strength, 0.0), ("cost_halflife", cost_halflife, 1.0),
                                ("verify_slope", verify_slope, 0.0)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value < low:
                raise SpectuneError(f"policy.{key}={value!r} is invalid: must be a finite number >= {low:g}")
        if isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 1:
            raise SpectuneError(f"policy.refresh={refresh!r} is invalid: must be an integer >= 1 (cycles between "
                                "recomputed choices)")
        self.ceiling, self.min_gamma, self.refresh = gamma, min_gamma, refresh
        self.prior_strength, self.cost_halflife, self.verify_slope = float(prior_strength), float(cost_halflife), \
            float(verify_slope)
        self.reset()

    def reset(self) -> None:
        self.rows = RowTracker()
        size = self.ceiling + 1  # index k = position k (1-based); index 0 unused
        self.pooled = np.zeros((2, size))  # [accepted, trials] per position, every request
        self.requests: dict[int, np.ndarray] = {}  # request id -> [accepted, trials] per position
        self.slot_request: dict[int, int] = {}  # slot -> request id it held in the last cycle
        self.costs: dict[int, MeasuredCosts] = {}
        self.limits: dict[int, int] = {}  # slot -> γ chosen this cycle
        self.default = self.ceiling  # γ for a row whose request is new this cycle
        self.chosen: dict[int, int] = {}  # request -> γ at the last refresh (told path)
        self.first_stop = 0  # the smallest row γ this cycle (told path): no row stops at an earlier step
        self.since = 0  # cycles since the last refresh
        self.pending: list[tuple[list[int] | None, CycleFeedback]] = []  # outcomes not learned from yet

    # -- estimates ----------------------------------------------------------------------------------------
    def pooled_rates(self) -> np.ndarray:
        rates, prior = np.empty(self.ceiling), RECENT_PRIOR
        for k in range(1, self.ceiling + 1):
            accepted, trials = self.pooled[:, k]
            rates[k - 1] = prior = (accepted + self.prior_strength * prior) / (trials + self.prior_strength) \
                if trials + self.prior_strength > 0 else prior
        return rates

    def rates(self, request_id: int | None, pooled: np.ndarray) -> np.ndarray:
        own = self.requests.get(request_id) if request_id is not None else None
        if own is None:
            return pooled
        accepted, trials = own[0, 1:], own[1, 1:]
        return (accepted + self.prior_strength * pooled) / np.maximum(trials + self.prior_strength, 1e-12)

    def seconds(self, costs: CycleCosts | None) -> np.ndarray | None:
        """The cycle's seconds at each γ in min_gamma..ceiling (None before any cycle was measured): computed once
        per cycle, not per row."""
        if costs is None:
            return None
        return costs.cycle_s(np.arange(self.min_gamma, self.ceiling + 1))

    def choose(self, rates: np.ndarray, seconds: np.ndarray | None) -> int:
        """argmax over γ of E(γ) / seconds(γ) (:meth:`seconds`); the ceiling while nothing was measured."""
        if seconds is None:
            return self.ceiling
        speed = expected_tokens_from_rates(rates)[self.min_gamma:] / seconds
        return self.min_gamma + int(np.argmax(speed))  # ties to the smaller γ

    def costs_at(self, batch_size: int) -> CycleCosts | None:
        """The costs measured at the nearest batch size (:func:`nearest_costs`)."""
        return nearest_costs(self.costs, batch_size, self.ceiling)

    # -- the protocol -------------------------------------------------------------------------------------
    def before_cycle(self, rows: list[int], request_ids: list[int], context_lengths: list[int] | None = None) -> None:
        self.rows.see_cycle(rows, request_ids, context_lengths)

    def begin_cycle(self, batch_size: int) -> int:
        """Every row's γ, chosen once per cycle. Told the cycle's requests (``before_cycle``), a new one gets the
        pooled rates and the batch drafts to its deepest row; otherwise new requests are found at step 0."""
        self.rows.begin_cycle()
        if self.rows.told:
            serving = self.rows.serving
            self.since += 1
            if self.since >= self.refresh or any(request not in self.chosen for request in serving.values()):
                self.refresh_choices(batch_size)
            self.limits = {slot: self.chosen[request] for slot, request in serving.items()}
            ceiling = max(self.limits.values(), default=0)
            # A drafting cycle drafts once for every row: one that chose 0 stops after it (as after step 0 below).
            self.limits = {slot: max(1, gamma) for slot, gamma in self.limits.items()}
            self.first_stop = min(self.limits.values(), default=0)
            return ceiling
        seconds, pooled = self.seconds(self.costs_at(batch_size)), self.pooled_rates()
        self.default = self.choose(pooled, seconds)
        self.limits = {slot: self.choose(self.rates(request, pooled), seconds)
                       for slot, request in self.slot_request.items()}
        ceiling = max([self.default, *self.limits.values()])
        if ceiling == 0:
            return 0
        # At least 2 so that step 0 is shown (new requests are seen there); rows stop at their own γ.
        return min(self.ceiling, max(2, ceiling))

    def refresh_choices(self, batch_size: int) -> None:
        """Learn from the queued outcomes, then choose γ for every request in flight (a request with no cycle of its
        own yet gets the pooled rates' choice, computed once)."""
        self.learn()
        seconds, pooled = self.seconds(self.costs_at(batch_size)), self.pooled_rates()
        default: int | None = None
        self.chosen = {}
        for request in self.rows.serving.values():
            if request in self.requests:
                self.chosen[request] = self.choose(self.rates(request, pooled), seconds)
            else:
                default = self.choose(pooled, seconds) if default is None else default
                self.chosen[request] = default
        self.since = 0

    def continue_drafting(self, step: DraftStep) -> torch.Tensor | None:
        told = self.rows.told
        if told and step.step + 1 < self.first_stop:
            return None  # nobody stops here: no host sync (the common case, checked first: it runs every step)
        if step.step == 0 and not told:
            self.rows.on_step(step)
            busy = self.rows.busy_rows()
            self.limits = {row: self.default if row in self.rows.new_rows else self.limits.get(row, self.default)
                           for row in busy}
            self.limits = {row: max(1, gamma) for row, gamma in self.limits.items()}  # step 0 is drafted already
        if all(gamma != step.step + 1 for gamma in self.limits.values()):
            return None  # nobody stops here (rows that stopped at an earlier step stay stopped): no host sync
        limit = torch.tensor([self.limits.get(row, 0) for row in range(step.active.shape[0])],
                             device=step.active.device)
        return limit > step.step + 1

    def observe(self, feedback: CycleFeedback) -> None:
        """Queued when told the requests (learned at the next refresh), else learned now."""
        if self.rows.told:
            self.pending.append((feedback.rows, feedback))
            return
        self.pending.append((self.rows.observe(feedback), feedback))
        self.learn()

    def learn(self) -> None:
        """Fold the queued outcomes into the costs and the acceptance counts, in order."""
        for slots, feedback in self.pending:
            self._learn(slots, feedback)
        self.pending.clear()

    def _learn(self, slots: list[int] | None, feedback: CycleFeedback) -> None:
        requests = feedback.request_ids
        steps = max(feedback.num_drafts, default=0)
        batch = len(feedback.num_drafts)
        if batch:
            self.costs.setdefault(batch, MeasuredCosts(self.cost_halflife, self.verify_slope)).observe(steps, feedback)
        if requests is None:
            return
        for index, (request, drafted, accepted) in enumerate(
                zip(requests, feedback.num_drafts, feedback.num_accepted, strict=True)):
            counts = self.requests.setdefault(request, np.zeros((2, self.ceiling + 1)))
            tried = acceptance_trials(accepted, drafted)
            counts[1, 1:tried + 1] += 1
            counts[0, 1:accepted + 1] += 1
            self.pooled[1, 1:tried + 1] += 1
            self.pooled[0, 1:accepted + 1] += 1
            if slots is not None:
                self.slot_request[slots[index]] = request
        if slots is not None:
            self.slot_request = {slot: self.slot_request[slot] for slot in slots}

    def describe(self) -> dict:
        return {"name": self.name, "ceiling": self.ceiling, "min_gamma": self.min_gamma,
                "prior_strength": self.prior_strength, "cost_halflife": self.cost_halflife,
                "verify_slope": self.verify_slope, "refresh": self.refresh, "costs": "measured in this run",
                "per": "request"}
