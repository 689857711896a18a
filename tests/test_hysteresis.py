"""The hysteresis controller (policy=hysteresis) in offline replay, on recorded-cycle traces whose acceptance is
known: a model-free draft's cycles (chains to the ceiling, so shadow tests exist) simulated with a known per-cycle
acceptance α, mixed greedy / T = 1 requests, alone and four to a batch, priced by the shipped tiny profile and
replayed through the product's replay (policies.envs.replay: the engine's own drafting loop). The controller is
told each request's settings, never which setting accepts well."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pytest
import torch

from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas, replay_scores
from policies.hysteresis import Hysteresis
from spectune.costmodel.profile import Profile, load_profile
from spectune.engine import Engine
from spectune.engine.policy import CycleFeedback
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

GREEDY, HOT = SamplingParams(temperature=0), SamplingParams(temperature=1.0)
CEILING = 8
HIGH, LOW = 0.85, 0.1  # per-token acceptance of a greedy row and of a T = 1 row (prompt lookup-like)
PROFILE = "tiny-cpu-2core-vm"  # batch sizes 1, 2, 4; break-even α ≈ 0.19 at one row


@dataclass
class Stream:
    """One simulated request: its settings and α for each of its cycles."""

    request_id: int
    sampling: SamplingParams
    alphas: list[float]
    matches: list[int] | None = None  # each cycle's chain match length (None: 3 throughout, lookup's longest)


def simulate(streams_by_slot: list[list[Stream]], rng: np.random.Generator, first_cycle: int = 0) -> pd.DataFrame:
    """Trace rows of slots serving their streams one after another, all slots in every cycle while any is busy; each
    position's acceptance an independent Bernoulli(α) of that cycle (the chain always reaches the ceiling)."""
    queues = [[(s, k) for s in streams for k in range(len(s.alphas))] for streams in streams_by_slot]
    rows, cycle = [], first_cycle
    while any(queues):
        busy = [slot for slot, queue in enumerate(queues) if queue]
        for slot in busy:
            stream, k = queues[slot].pop(0)
            alpha = stream.alphas[k]
            match = 3.0 if stream.matches is None else float(stream.matches[k])
            accepted = rng.random(CEILING) < alpha
            for position in range(1, CEILING + 1):
                rows.append({"cycle": cycle, "row": slot, "request_id": stream.request_id, "batch_size": len(busy),
                             "position": position, "context_length": 32 + 4 * k, "token_prob": 1.0,
                             "entropy": 0.0, "margin": 1.0, "cum_prob": 1.0, "accept_prob": alpha,
                             "accepted": bool(accepted[position - 1]), "recent_acceptance": 0.5, "drafted": True,
                             "match_length": match, "matches": 1.0, "suffix_score": 1.0, "suffix_prob": 1.0})
        cycle += 1
    return pd.DataFrame(rows)


def by_request(traces: TraceSet, gammas: np.ndarray) -> dict[int, np.ndarray]:
    """Each request's γ, cycle by cycle."""
    return {int(r): gammas[traces.request_id == r] for r in np.unique(traces.request_id)}


def workload(rng: np.random.Generator) -> tuple[TraceSet, dict[int, SamplingParams]]:
    """Phase c1: greedy, T = 1, greedy, T = 1 (48 cycles each), then a T = 1 request whose α rises from 0.1 to 0.85
    after 40 of its 100 cycles (a copied passage begins). Phase c4 follows in the same traces: four slots, two greedy
    and two T = 1 requests (48 cycles each) in every batch: 292 cycles alone (2,336 positions), 48 of four rows
    (1,536)."""
    c1 = [Stream(0, GREEDY, [HIGH] * 48), Stream(1, HOT, [LOW] * 48), Stream(2, GREEDY, [HIGH] * 48),
          Stream(3, HOT, [LOW] * 48), Stream(4, HOT, [LOW] * 40 + [HIGH] * 60)]
    c4 = [[Stream(10 + slot, GREEDY if slot < 2 else HOT, [HIGH if slot < 2 else LOW] * 48)] for slot in range(4)]
    alone = simulate([c1], rng)
    frame = pd.concat([alone, simulate(c4, rng, first_cycle=int(alone["cycle"].max()) + 1)])
    sampling = {s.request_id: s.sampling for s in c1} | {10: GREEDY, 11: GREEDY, 12: HOT, 13: HOT}
    return TraceSet(frame, {"concurrency": 4}, "simulated"), sampling


@pytest.fixture(scope="module")
def mixed() -> tuple[TraceSet, dict[int, SamplingParams]]:
    return workload(np.random.default_rng(20261206))


def test_the_controller_turns_low_acceptance_rows_off_keeps_greedy_rows_on_and_comes_back_when_acceptance_rises(
        mixed):
    """Seed 20261206, the workload above, ceiling 8, the shipped tiny profile, the config's parameters. Greedy rows
    (α 0.85) draft on every cycle; T = 1 rows (α 0.1, below the profile's break-even 0.19) verify nothing on at least
    90% of their cycles after their first 16; the second T = 1 request starts off from its first cycle (its pool,
    the T = 1 requests', says so: the estimates are per setting); the request whose α rises is off for at least 90%
    of cycles 16–39 and back on within 12 cycles of the rise, then on for every cycle of its last 40; in the
    batches of four the greedy rows draft and the T = 1 rows do not in the same cycles. Profile-priced replay
    tok/s beats the best fixed γ of the same traces (its γ and margin reported)."""
    traces, sampling = mixed
    policy = Hysteresis(CEILING, profile=PROFILE)
    gammas = replay_gammas(policy, traces, CEILING, load_profile(PROFILE), sampling)
    runs = by_request(traces, gammas)
    for greedy in (0, 2, 10, 11):
        assert (runs[greedy] >= 1).all(), (greedy, runs[greedy])
    for hot in (1, 3, 12, 13):
        assert (runs[hot][16:] == 0).mean() >= 0.9, (hot, runs[hot])
    assert runs[3][0] == 0 and runs[4][0] == 0  # a new T = 1 request starts off: its pool's estimate
    rising = runs[4]
    assert (rising[16:40] == 0).mean() >= 0.9, rising
    back = 40 + int(np.argmax(rising[40:] >= 1))
    assert back - 40 <= 12 and (rising[-40:] >= 1).all(), rising
    c4 = traces.batch_size == 4
    hot_rows = np.isin(traces.request_id, [12, 13]) & c4
    greedy_rows = np.isin(traces.request_id, [10, 11]) & c4
    assert (gammas[greedy_rows] >= 1).all() and (gammas[hot_rows][32:] == 0).mean() >= 0.9
    scores = replay_scores(traces, load_profile(PROFILE), CEILING, gammas, oracles=False)
    assert scores["vs_best_fixed_pct"] > 0, scores


def test_without_shadow_tests_an_off_row_probes_every_k_cycles_and_still_comes_back(mixed):
    """The same traces, shadow tests off (a draft model gives none): an off row drafts one token every K cycles,
    K = ceil((cycle(1) / AR − 1) / probe_budget) = 10 at one row of the tiny profile; no other γ while off. The
    T = 1 requests at one row probe on at most 1/K + 2% of their cycles after their first 16; the request whose α
    rises is off on at least 2/3 of cycles 16–39 (a lucky probe on a thin estimate may turn it on for a few cycles)
    and back on within 2K + 5 cycles of the rise (slower than with shadow tests: probes are its only tests), then on
    for its last 30."""
    traces, sampling = mixed
    profile = load_profile(PROFILE)
    policy = Hysteresis(CEILING, profile=PROFILE, shadow_trials=False)
    costs = profile.costs(1)
    k = policy.probe_every(np.asarray(costs.cycle_s(np.arange(CEILING + 1))))
    assert k == int(np.ceil((costs.cycle_s(1) / costs.ar_s - 1) / policy.probe_budget)) == 10
    runs = by_request(traces, replay_gammas(policy, traces, CEILING, profile, sampling))
    for hot in (1, 3):
        late = runs[hot][16:]
        assert set(late.tolist()) <= {0, 1} and 0 < (late == 1).mean() <= 1 / k + 0.02, (hot, runs[hot])
    rising = runs[4]
    back = 40 + int(np.argmax(rising[40:] >= 1))
    assert (rising[16:40] == 0).mean() >= 2 / 3 and back - 40 <= 2 * k + 5 and (rising[-30:] >= 1).all(), rising


def test_the_band_flips_a_row_at_break_even_less_often_than_no_band():
    """One T = 1 request of 400 cycles at α 0.19 (the tiny profile's break-even at one row), seed 11: with the
    config's margin 0.05 the row switches on/off at most a third as often as with margin 0."""
    traces = TraceSet(simulate([[Stream(0, HOT, [0.19] * 400)]], np.random.default_rng(11)), {}, "simulated")
    profile = load_profile(PROFILE)

    def switches(margin: float) -> int:
        gammas = replay_gammas(Hysteresis(CEILING, margin=margin, profile=PROFILE), traces, CEILING, profile,
                               {0: HOT})
        on = gammas >= 1
        return int((on[1:] != on[:-1]).sum())

    banded, bare = switches(0.05), switches(0.0)
    assert bare >= 6 and banded * 3 <= bare, (banded, bare)


def _profile(tmp_path, verify_at_four: list[float]) -> str:
    """A profile of one and four rows: at one row verifying up to 9 positions costs 1.0–1.16 AR steps, at four the
    given line; drafting is free (a model-free draft)."""
    one = [1.0 + 0.02 * n for n in range(9)]
    profile = Profile("two-widths", [1, 4], 9, {1: 0.0, 4: 0.0}, {1: one, 4: verify_at_four}, {1: 0.0, 4: 0.0})
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile.to_json()), encoding="utf-8")
    return str(path)


def test_the_batch_prices_the_cycle_the_same_acceptance_speculates_alone_and_not_four_to_a_batch(tmp_path):
    """α 0.3 for every request (its pool told 200 row-cycles at that rate): at one row (verification +2% a position) the
    controller drafts; at four rows where verifying a second position costs 1.5 AR steps it does not, at once from
    its pooled estimate, without being told the concurrency's regime. Decided before drafting (match_buckets 0: one
    estimate whatever the match, as under a draft model)."""
    path = _profile(tmp_path, [1.0 + 0.5 * n for n in range(9)])
    policy = Hysteresis(CEILING, profile=path, match_buckets=0)
    for _ in range(200):
        policy.pool((1.0, 0, 1.0)).add(0.3, 1)
    policy.before_cycle([0], [1], sampling=[HOT])
    assert policy.begin_cycle(1) >= 1
    policy.before_cycle([0, 1, 2, 3], [2, 3, 4, 5], sampling=[HOT] * 4)
    assert policy.begin_cycle(4) == 0


def test_estimates_per_match_length_verify_long_matches_and_skip_short_ones():
    """One greedy request of 300 cycles whose chain matches 1 or 3 tokens (seeded draw, seed 3), α 0.05 after a
    1-token match and 0.85 after a 3-token one (an average ≈ 0.45, above the tiny profile's break-even 0.19), ceiling
    8, the shipped tiny profile, seed 7 for the outcomes. Per match length (the config's match_buckets) the
    controller drafts on every 3-token cycle after its first 20 cycles and verifies nothing on at least 90% of the
    1-token ones; with one estimate (match_buckets 0) it drafts on more than half of the 1-token cycles. Replay
    tok/s per match length beats one estimate on the same traces."""
    matches = np.random.default_rng(3).choice([1, 3], size=300).tolist()
    alphas = [0.85 if m == 3 else 0.05 for m in matches]
    traces = TraceSet(simulate([[Stream(0, GREEDY, alphas, matches)]], np.random.default_rng(7)), {}, "simulated")
    profile = load_profile(PROFILE)
    long_match = np.array(matches) == 3
    per_match = replay_gammas(Hysteresis(CEILING, profile=PROFILE), traces, CEILING, profile, {0: GREEDY})
    single = replay_gammas(Hysteresis(CEILING, profile=PROFILE, match_buckets=0), traces, CEILING, profile,
                           {0: GREEDY})
    late = np.arange(300) >= 20
    assert (per_match[late & long_match] >= 1).all(), per_match
    assert (per_match[late & ~long_match] == 0).mean() >= 0.9, per_match
    assert (single[late & ~long_match] >= 1).mean() > 0.5, single
    rate = {name: replay_scores(traces, profile, CEILING, gammas, oracles=False)["policy_tok_s"]
            for name, gammas in (("per_match", per_match), ("single", single))}
    assert rate["per_match"] > rate["single"], rate


def test_the_batch_drafts_only_where_its_rows_tokens_together_pay_for_its_cycle(tmp_path):
    """Four rows at a profile whose four-row verification costs 0.25 AR steps a position (drafting free): greedy rows
    at α 0.6 (their pool told 200 row-cycles), T = 1 rows at α 0.02. Each greedy row alone at those prices would
    draft (E(1) / 1.25 ≈ 1.28). One greedy row among three T = 1 rows: with per_batch the batch drafts nothing
    (its best depth gives (1.6 + 3) / 4 / 1.25 ≈ 0.92 of a plain step), without it that row drafts. Where a row is
    off the batch must clear the band's upper edge (1.05): two greedy rows among two T = 1 rows draft nothing
    ((3.2 + 2) / 4 / 1.25 ≈ 1.04), three among one do ((4.8 + 1) / 4 / 1.25 ≈ 1.16), and the T = 1 row does not.
    Where every row is on the batch still needs the upper edge: four rows at α 0.26 draw 1.008 and draft nothing, at
    α 0.6 (1.28) they draft; one row alone at α 0.04 (1.02 of its plain step, inside the band) keeps its own band's
    lower edge and drafts. An off row's probe
    interval K at four rows is the busy rows times K per row (ceil(0.25 · 4 / 0.02) = 50 against 13). Decided before
    drafting (match_buckets 0)."""
    path = _profile(tmp_path, [1.0 + 0.25 * n for n in range(9)])
    greedy_key, hot_key = (0.0, 0, 1.0), (1.0, 0, 1.0)

    def told(per_batch: bool, greedy_alpha: float = 0.6) -> Hysteresis:
        policy = Hysteresis(CEILING, profile=path, match_buckets=0, per_batch=per_batch)
        for _ in range(200):
            policy.pool(greedy_key).add(greedy_alpha, 1)
            policy.pool(hot_key).add(0.02, 1)
        return policy

    lone = [GREEDY, HOT, HOT, HOT]
    for per_batch, drafts in ((True, False), (False, True)):
        policy = told(per_batch)
        policy.before_cycle([0, 1, 2, 3], [1, 2, 3, 4], sampling=lone)
        assert (policy.begin_cycle(4) >= 1) == drafts
        assert (policy.limits[0] >= 1) == drafts and policy.limits[1] == policy.limits[2] == policy.limits[3] == 0
    policy = told(True)
    policy.before_cycle([0, 1, 2, 3], [1, 2, 3, 4], sampling=[GREEDY, GREEDY, HOT, HOT])
    assert policy.begin_cycle(4) == 0 and all(policy.limits[row] == 0 for row in range(4)), policy.limits
    policy = told(True)
    policy.before_cycle([0, 1, 2, 3], [1, 2, 3, 4], sampling=[GREEDY, GREEDY, GREEDY, HOT])
    assert all(policy.limits[row] >= 1 for row in range(3)) and policy.limits[3] == 0, policy.limits
    policy = told(True, greedy_alpha=0.26)
    policy.before_cycle([0, 1, 2, 3], [1, 2, 3, 4], sampling=[GREEDY] * 4)
    assert policy.begin_cycle(4) == 0 and all(policy.limits[row] == 0 for row in range(4)), policy.limits
    policy = told(True)
    policy.before_cycle([0, 1, 2, 3], [1, 2, 3, 4], sampling=[GREEDY] * 4)
    assert all(policy.limits[row] >= 1 for row in range(4)), policy.limits
    policy = told(True, greedy_alpha=0.04)
    policy.before_cycle([0], [1], sampling=[GREEDY])
    assert policy.begin_cycle(1) >= 1 and policy.limits[0] >= 1, policy.limits
    seconds = np.asarray(load_profile(path).costs(4).cycle_s(np.arange(CEILING + 1)))
    assert told(True).probe_every(seconds, 4) == 50 and told(False).probe_every(seconds, 4) == 13


def test_an_off_row_probes_only_where_the_draft_gives_no_shadow_tests(tmp_path):
    """A T = 1 row that is off (its pool told 200 row-cycles at α 0) and has gone K cycles without a test: before
    any feedback, and after feedback without shadow tests (a draft model), it probes (one draft); once a cycle's
    feedback carries shadow tests (a model-free draft), it never probes: a row with a chain gets the same test for
    free, and one without a chain has nothing to draft. Shadow tests turned off in the policy keep the probes."""
    path = _profile(tmp_path, [1.0 + 0.25 * n for n in range(9)])

    def probes_after(feedback: CycleFeedback | None, shadow_trials: bool = True) -> bool:
        policy = Hysteresis(CEILING, profile=path, match_buckets=0, shadow_trials=shadow_trials)
        for _ in range(200):
            policy.pool((1.0, 0, 1.0)).add(0.0, 1)
        policy.before_cycle([0], [1], sampling=[HOT])
        assert policy.limits[0] == 0, policy.limits  # off from its pool's estimate
        if feedback is not None:
            policy.observe(feedback)
        policy.requests[1].since_test = 10_000
        policy.before_cycle([0], [1], sampling=[HOT])
        return policy.limits[0] == 1

    plain = dict(num_drafts=[0], num_accepted=[0], draft_s=0.0, verify_s=0.1, cycle_s=0.1, rows=[0], request_ids=[1])
    assert probes_after(None)
    assert probes_after(CycleFeedback(**plain))
    assert not probes_after(CycleFeedback(**plain, shadow_accepted=[None]))
    assert probes_after(CycleFeedback(**plain, shadow_accepted=[None]), shadow_trials=False)


def test_bad_parameters_fail_in_one_line():
    with pytest.raises(SpectuneError, match=r"policy.margin=0.7 is invalid: must be a finite number in \[0, 0.5\]"):
        Hysteresis(4, margin=0.7)
    with pytest.raises(SpectuneError, match="verifies up to 13 positions: gamma=16 needs 17"):
        Hysteresis(16, profile=PROFILE)
    with pytest.raises(SpectuneError, match=r"policy.match_buckets=-1 is invalid: must be an integer >= 0"):
        Hysteresis(4, match_buckets=-1)


class RecordingHysteresis(Hysteresis):
    """The controller, remembering each cycle's γ per request (what the records must show)."""

    def reset(self) -> None:
        super().reset()
        self.choices: list[dict[int, int]] = []

    def observe(self, feedback) -> None:  # the limits are final once drafting ended (taken at its first step)
        self.choices.append({request: self.limits[row] for row, request in self.serving.items()})
        super().observe(feedback)


@torch.inference_mode()
def test_a_run_on_a_mixed_temperature_batch_records_the_controllers_gamma_for_every_row(pair):
    """The tiny pair, 8 requests alternating greedy and T = 1 (24 new tokens each) at concurrency 4, seed 5, ceiling
    4, priced by the shipped tiny profile (so its choices do not depend on this machine's clock). Every cycle record
    carries, per row, the γ the controller chose for that request (its drafts) and the cycle's ceiling (their
    largest, from the second cycle on: the first drafts to the ceiling until its first step shows whether the draft
    reports a match, which a draft model does not); the controller chose different γ for rows of one cycle at least
    once and γ 0 at least once; the greedy requests emit what autoregressive greedy decoding emits (the controller
    only picks γ)."""
    target, draft = pair
    requests = [replace(r, sampling=GREEDY if r.request_id % 2 == 0 else HOT)
                for r in random_requests(8, max_new=24)]
    engine = Engine(target, draft, sampling=HOT, sampler=get_sampler("exact"), device="cpu", seed=5)
    policy = RecordingHysteresis(4, profile=PROFILE)
    result = engine.run(requests, policy, 4)
    assert len(policy.choices) == len({c.cycle for c in result.cycles})
    for record in result.cycles:
        chosen = policy.choices[record.cycle]
        assert record.num_drafts == chosen[record.request_id], record
        assert record.gamma == max(chosen.values()) or record.cycle == 0, record
    assert any(len(set(c.values())) > 1 for c in policy.choices)
    assert any(0 in c.values() for c in policy.choices)
    engine.sampling = GREEDY
    greedy = [r for r in requests if r.sampling == GREEDY]
    reference = {r.request_id: r.output_ids for r in engine.run(greedy, None, 1).requests}
    assert {r.request_id: r.output_ids for r in result.requests if r.request_id in reference} == reference
