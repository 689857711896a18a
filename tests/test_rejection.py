"""The exact sampler and the analytic laws it must follow.

Statistical tests are seeded; each states its sample size and tolerance. Tolerances are 4.5 standard
errors per token (two-sided false-alarm ≈ 7e-6 per token), so a failure means a real defect.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spectune.audit.laws import (
    PositionLaws,
    accepted_mass,
    corrected_law,
    naive_law,
    rejection_probability,
    residual,
    total_variation,
    validate_pair,
)
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams, sample, warp
from spectune.sampling.rejection import Verdict, get_sampler

P_SEED = np.array([0.5, 0.3, 0.2])
Q_SEED = np.array([0.2, 0.5, 0.3])


def test_seed_example_laws() -> None:
    laws = PositionLaws.of(P_SEED, Q_SEED)
    np.testing.assert_allclose(laws.accepted_mass, [0.20, 0.30, 0.20], atol=1e-12)
    assert laws.accepted_total == pytest.approx(0.70, abs=1e-12)
    assert laws.z == pytest.approx(0.30, abs=1e-12)
    np.testing.assert_allclose(laws.residual, [1.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(laws.corrected, P_SEED, atol=1e-12)
    np.testing.assert_allclose(laws.naive, [0.35, 0.39, 0.26], atol=1e-12)
    assert laws.tv_naive == pytest.approx(0.15, abs=1e-12)
    assert laws.tv_corrected == pytest.approx(0.0, abs=1e-12)


@st.composite
def distributions(draw: st.DrawFn, size: int) -> np.ndarray:
    """Random laws with exact zeros (about one entry in three) and at least one positive entry."""
    weights = draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1.0)), min_size=size, max_size=size))
    assume(sum(weights) > 0)
    w = np.asarray(weights, dtype=np.float64)
    return w / w.sum()


@st.composite
def pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    size = draw(st.integers(1, 8))
    p = draw(distributions(size))
    q = p.copy() if draw(st.booleans()) and draw(st.booleans()) else draw(distributions(size))  # ~1/4: p = q
    return p, q


@settings(max_examples=300, deadline=None)
@given(pairs())
def test_corrected_law_is_p(pq: tuple[np.ndarray, np.ndarray]) -> None:
    p, q = pq
    law = corrected_law(p, q)
    assert np.all(np.isfinite(law))
    np.testing.assert_allclose(law, p, atol=1e-9, rtol=0)
    assert float(accepted_mass(p, q).sum()) + rejection_probability(p, q) == pytest.approx(1.0, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(pairs())
def test_naive_law_differs_exactly_when_theory_says(pq: tuple[np.ndarray, np.ndarray]) -> None:
    """naive − p = (m + Z·p) − (m + Z·r) = Z·(p − r): biased iff Z > 0 and r ≠ p, by TV = Z·TV(p, r)."""
    p, q = pq
    z, r, naive = rejection_probability(p, q), residual(p, q), naive_law(p, q)
    if r is None:  # Z = 0: the residual is never evaluated and both rules agree
        assert z == 0.0
        np.testing.assert_allclose(naive, p, atol=1e-12)
        return
    expected_tv = z * total_variation(p, r)
    assert total_variation(naive, p) == pytest.approx(expected_tv, abs=1e-12)
    if z > 1e-9 and total_variation(p, r) > 1e-9:
        assert total_variation(naive, p) > 1e-12


def test_p_equal_q_has_no_residual() -> None:
    p = np.array([0.25, 0.0, 0.75])
    assert rejection_probability(p, p) == 0.0
    assert residual(p, p) is None
    np.testing.assert_array_equal(corrected_law(p, p), p)


@pytest.mark.parametrize(("p", "q", "fragment"), [
    ([0.5, -0.1, 0.6], [0.2, 0.5, 0.3], "p[1]=-0.1"),
    ([0.5, float("nan"), 0.5], [0.2, 0.5, 0.3], "p[1]=nan"),
    ([0.5, 0.3, 0.3], [0.2, 0.5, 0.3], "sums to 1.1"),
    ([0.5, 0.5], [0.2, 0.5, 0.3], "p has 2 entries and q has 3"),
    ([], [0.2, 0.5, 0.3], "non-empty"),
    ([0.5, 0.3, 0.2], [0.2, 0.5, 0.3000001], None),  # off by 1e-7 < 1e-6: accepted, renormalised
])
def test_validate_pair(p: list[float], q: list[float], fragment: str | None) -> None:
    if fragment is None:
        _, q_arr = validate_pair(p, q)
        assert q_arr.sum() == pytest.approx(1.0, abs=1e-15)
        return
    with pytest.raises(SpectuneError) as err:
        validate_pair(p, q)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def _single_position(p: np.ndarray, q: np.ndarray, n: int, seed: int, name: str = "exact") -> np.ndarray:
    """First emitted token of n independent γ = 1 blocks, drawn by the real sampler."""
    gen = torch.Generator().manual_seed(seed)
    p_t, q_t = torch.tensor(p), torch.tensor(q)
    target, draft = p_t.expand(n, 2, len(p)), q_t.expand(n, 1, len(q))
    tokens = sample(draft[:, 0], gen).unsqueeze(1)
    verdict = get_sampler(name)(target, draft, tokens, generator=gen)
    return verdict.emitted(tokens)[:, 0].numpy()


def _assert_law(tokens: np.ndarray, law: np.ndarray, z_max: float = 4.5) -> None:
    n = len(tokens)
    freq = np.bincount(tokens, minlength=len(law)) / n
    se = np.sqrt(law * (1 - law) / n)
    assert np.all(freq[law == 0] == 0), f"tokens with p=0 emitted: {freq}"
    assert np.all(np.abs(freq - law) <= z_max * se + 1e-12), f"freq {freq} vs law {law} (SE {se})"


def test_sampler_empirical_law_matches_p() -> None:
    """n = 6000 draws, V = 5 with a zero in p and in q; every |freq − p| ≤ 4.5 SE (SE ≤ 0.0065)."""
    p = np.array([0.35, 0.25, 0.0, 0.15, 0.25])
    q = np.array([0.10, 0.40, 0.20, 0.30, 0.0])
    _assert_law(_single_position(p, q, 6000, seed=1), p)


def test_naive_sampler_empirical_law_is_biased() -> None:
    """n = 6000 on the three-symbol example: naive freq of A ≈ 0.35, far outside 4.5 SE (≈ 0.029) of 0.5."""
    tokens = _single_position(P_SEED, Q_SEED, 6000, seed=2, name="naive")
    _assert_law(tokens, naive_law(P_SEED, Q_SEED))
    assert abs(np.mean(tokens == 0) - 0.5) > 0.1


def test_tokens_with_q_zero_are_reachable_through_residual() -> None:
    """q(C) = 0 so C is never proposed; p(C) = 0.4 must still be emitted: n = 4000, tolerance 4.5 SE."""
    p, q = np.array([0.3, 0.3, 0.4]), np.array([0.5, 0.5, 0.0])
    tokens = _single_position(p, q, 4000, seed=3)
    _assert_law(tokens, p)
    assert np.mean(tokens == 2) > 0.3


def test_block_positions_follow_p_and_acceptance_is_geometric() -> None:
    """γ = 3, context-free p and q at every position, n = 6000 blocks.

    Given that position k is emitted, its token ~ p (4.5 SE); P(N ≥ k) = α^k with α = Σ min(p, q)
    (4.5 binomial SE).
    """
    p, q = np.array([0.5, 0.2, 0.2, 0.1]), np.array([0.25, 0.25, 0.25, 0.25])
    n, gamma = 6000, 3
    gen = torch.Generator().manual_seed(4)
    target = torch.tensor(p).expand(n, gamma + 1, 4)
    draft = torch.tensor(q).expand(n, gamma, 4)
    tokens = sample(draft, gen)
    verdict = get_sampler("exact")(target, draft, tokens, generator=gen)
    emitted = verdict.emitted(tokens).numpy()
    accepted = verdict.num_accepted.numpy()
    alpha = float(np.minimum(p, q).sum())
    for k in range(gamma + 1):
        _assert_law(emitted[accepted >= k, k], p)
        if k:
            frac = np.mean(accepted >= k)
            assert abs(frac - alpha**k) <= 4.5 * np.sqrt(alpha**k * (1 - alpha**k) / n)
    assert np.all(emitted[np.arange(gamma + 1) > accepted[:, None]] == -1)


def test_p_equal_q_accepts_everything_without_nan() -> None:
    """Same logits warped once for both models (the realistic p = q): all γ drafts kept, bonus from p[γ]."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(500, 5, 7, generator=gen)
    logits[:, :, 3] = float("-inf")  # a masked token: zero in both laws
    probs = warp(logits, SamplingParams(temperature=0.8, top_k=5))
    tokens = sample(probs[:, :4], gen)
    verdict = get_sampler("exact")(probs, probs[:, :4], tokens, generator=gen)
    assert torch.all(verdict.num_accepted == 4)
    assert not torch.any(verdict.next_token == 3)
    assert torch.all(probs[torch.arange(500), 4, verdict.next_token] > 0)


def test_greedy_is_exact_match_acceptance() -> None:
    """Temperature 0: keep the longest prefix equal to the target's argmax, then emit the target argmax."""
    gen = torch.Generator().manual_seed(6)
    batch, gamma, vocab = 64, 4, 5
    greedy = SamplingParams(temperature=0.0)
    t_logits = torch.randn(batch, gamma + 1, vocab, generator=gen)
    d_logits = t_logits[:, :gamma] + 0.8 * torch.randn(batch, gamma, vocab, generator=gen)
    p, q = warp(t_logits, greedy), warp(d_logits, greedy)
    tokens = q.argmax(-1)
    verdict = get_sampler("exact")(p, q, tokens, generator=gen)
    match = (tokens == t_logits[:, :gamma].argmax(-1)).long()
    expected_n = match.cumprod(1).sum(1)
    assert torch.equal(verdict.num_accepted, expected_n)
    assert 0 < int((expected_n < gamma).sum()) < batch  # both branches exercised
    assert torch.equal(verdict.next_token, t_logits.argmax(-1)[torch.arange(batch), expected_n])


def test_shared_uniforms_give_identical_acceptance_across_variants() -> None:
    gen = torch.Generator().manual_seed(7)
    n = 2000
    target = torch.tensor(P_SEED).expand(n, 2, 3)
    draft = torch.tensor(Q_SEED).expand(n, 1, 3)
    tokens = sample(draft[:, 0], gen).unsqueeze(1)
    u = torch.rand(n, 1, generator=gen, dtype=torch.float64)
    exact = get_sampler("exact")(target, draft, tokens, generator=gen, uniforms=u)
    naive = get_sampler("naive")(target, draft, tokens, generator=gen, uniforms=u)
    assert torch.equal(exact.num_accepted, naive.num_accepted)
    assert torch.equal(exact.num_accepted, (u[:, 0] * torch.tensor(Q_SEED)[tokens[:, 0]]
                                            < torch.tensor(P_SEED)[tokens[:, 0]]).long())


def test_num_drafts_caps_acceptance_and_takes_bonus_from_that_position() -> None:
    """Rows drafting fewer than γ tokens: accepted ≤ num_drafts, bonus drawn from p[num_drafts]."""
    vocab = 4
    target = torch.nn.functional.one_hot(torch.tensor([[0, 1, 2, 3]] * 3), vocab).double()
    tokens = torch.tensor([[0, 1, 2]] * 3)  # every draft matches the (one-hot) target
    draft = torch.nn.functional.one_hot(tokens, vocab).double()
    verdict = get_sampler("exact")(target, draft, tokens, num_drafts=torch.tensor([1, 3, 0]))
    assert verdict.num_accepted.tolist() == [1, 3, 0]
    assert verdict.next_token.tolist() == [1, 3, 0]


def test_verdict_emitted() -> None:
    tokens = torch.tensor([[7, 8, 9], [7, 8, 9], [7, 8, 9]])
    verdict = Verdict(num_accepted=torch.tensor([0, 2, 3]), next_token=torch.tensor([1, 2, 3]))
    assert verdict.emitted(tokens).tolist() == [[1, -1, -1, -1], [7, 8, 2, -1], [7, 8, 9, 3]]
    assert verdict.emitted(tokens, pad=0)[0].tolist() == [1, 0, 0, 0]


def test_unknown_sampler_is_a_one_line_error() -> None:
    with pytest.raises(SpectuneError, match="sampler='greedy' is unknown"):
        get_sampler("greedy")


def test_the_audit_task_in_process_passes_the_exact_sampler_and_catches_both_mutants(compose_config, tmp_path) -> None:
    """``task=verify`` without the process around it (spectune.audit.montecarlo through the real batched sampler,
    the rule of spectune.audit.fit): the default p, q; n = 5,000 trials per check, seed 20260923, the audit's own
    rule (every |freq − p| < 4.5 SE, chi-square p-value > 1e-3), for γ = 1 and the γ = 2 pair law. The naive law
    is 0.15 from p in TV, at least 10 SE on every token at this n; "accept when the target's argmax matches" is
    0.2·δ_0 + 0.8·p = (0.6, 0.24, 0.16) at γ = 1, 0.1 from p in TV."""
    from harness.tasks import verify
    from spectune.run import rundir

    code = verify.run(compose_config("task=verify", "task.trials=5000"), tmp_path)
    out = rundir.VERIFY.read(tmp_path)
    assert code == 0 and out["verdict"] == {"exact": "PASS", "naive": "FAIL", "argmax-match": "FAIL"}
    assert out["n"] == 5000 and out["seed"] == 20260923 and out["configured_sampler"] == "exact"
    assert out["metadata"][rundir.VERSION_KEY] == rundir.FORMAT_VERSION
