"""Tiny real HF Llama models for engine tests (random weights, float64 so batched and unbatched math agree)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spectune.engine.records import Request


def tiny_llama(vocab: int = 64, hidden: int = 32, layers: int = 2, seed: int = 0, init: float = 0.02,
               dtype: torch.dtype = torch.float64, attn: str = "sdpa") -> LlamaForCausalLM:
    """A real LlamaForCausalLM small enough to run thousands of steps in a test.

    ``init`` is the weight scale: large values give peaked next-token laws (more signal in law tests).
    """
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=init, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = attn
    return LlamaForCausalLM(config).eval().to(dtype)


def perturbed(model: LlamaForCausalLM, scale: float, seed: int) -> LlamaForCausalLM:
    """A copy of ``model`` with Gaussian noise on every weight: a draft that agrees partly."""
    copy = tiny_llama(model.config.vocab_size, model.config.hidden_size, model.config.num_hidden_layers, seed=seed,
                      dtype=model.dtype)
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            param.add_(scale * param.std() * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return copy


def random_requests(count: int, max_new: int, vocab: int = 64, seed: int = 0) -> list[Request]:
    """``count`` requests with seeded random prompts of 4–8 tokens (ids below ``vocab``)."""
    gen = torch.Generator().manual_seed(seed)
    return [Request(i, f"p{i}", "en", torch.randint(0, vocab, (4 + i % 5,), generator=gen).tolist(), max_new)
            for i in range(count)]


def tiny_pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """The engine tests' target and a draft that agrees with it in part (noise of scale 0.3 on every weight)."""
    target = tiny_llama(vocab=64, hidden=32, layers=2, seed=1, init=0.1)
    return target, perturbed(target, scale=0.3, seed=2)


def record_three_requests(pair, gamma: int, slots: int):
    """(engine, requests, traces, outputs): 3 random requests × 14 new tokens at T = 1, seed 5, drafted to ``gamma``
    every cycle at ``slots`` rows — the recording the one-definition tests replay."""
    from policies.envs.data import TraceSet
    from spectune.engine import Engine
    from spectune.engine.traces import record
    from spectune.sampling import SamplingParams
    from spectune.sampling.rejection import get_sampler

    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=5)
    requests = random_requests(3, max_new=14, seed=4)
    session = engine.session(requests, None, slots, keep_laws=True)
    frame = record(session, requests, gamma)
    outputs = {r.request_id: r.output_ids for r in session.result().requests}
    return engine, requests, TraceSet(frame, {"concurrency": slots}, "memory"), outputs


def constant_law_llama(law: list[float], hidden: int = 32, seed: int = 0) -> LlamaForCausalLM:
    """A real LlamaForCausalLM whose next-token law is ``law`` after every context (at temperature 1).

    Every token embeds to the same vector, so every position's final hidden state h is the same whatever the
    tokens; the head's rows are log(law_i)·h/|h|², so the logits are log(law). Under plain sampling its outputs are
    i.i.d. draws from ``law``: a known truth that an exactness test can compare emitted tokens with, token by token.
    """
    model = tiny_llama(vocab=len(law), hidden=hidden, layers=1, seed=seed, init=0.5)
    with torch.no_grad():
        model.model.embed_tokens.weight[:] = model.model.embed_tokens.weight[0].clone()
        h = model.model(input_ids=torch.zeros(1, 1, dtype=torch.long)).last_hidden_state[0, -1]
        log_law = torch.tensor(law, dtype=model.dtype).log()
        model.lm_head.weight[:] = log_law[:, None] * h[None, :] / h.dot(h)
    return model


# The law of constant_law_llama in the exactness audits of the model-free drafts (tests/test_lookup.py,
# tests/test_suffix.py): frequent tokens first, so that a chain copied from a prompt of them is often right.
CONSTANT_LAW = [0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.01, 0.01]
AUDIT_PROMPT = [0, 1, 0, 2, 0, 1, 0, 2, 0, 1]  # repeats frequent tokens: the drafts find matches in it


def assert_point_mass_draft_is_exact(draft, requests: int = 400, new_tokens: int = 12) -> None:
    """The exactness audit of a model-free ``draft`` (a point-mass proposal) at T = 1, γ = 4: ``requests`` ×
    (``new_tokens`` − 1) emitted tokens per sampler (seed 0; 400 × 11 = 4,400), each a draw from CONSTANT_LAW under an
    exact rule wherever a chain was proposed; chi-square goodness of fit against that known law. The exact rule passes
    at alpha = 0.001 with more than 1,000 drafts proposed (the test is about their verification); "resample from p"
    and "accept when the target's argmax matches" (both wrong at T > 0) are rejected (p-value < 1e-6)."""
    import numpy as np
    from scipy.stats import chisquare

    from spectune.engine import Engine
    from spectune.engine.policy import FixedGamma
    from spectune.sampling import SamplingParams
    from spectune.sampling.rejection import get_sampler

    target = constant_law_llama(CONSTANT_LAW)
    expected = np.array(CONSTANT_LAW)

    def emitted_counts(sampler: str) -> tuple[np.ndarray, int]:
        engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler(sampler),
                        device="cpu", seed=0)
        batch = [Request(i, f"s{i}", "en", AUDIT_PROMPT, new_tokens) for i in range(requests)]
        result = engine.run(batch, FixedGamma(4), 40)
        counts = np.bincount([t for r in result.requests for t in r.output_ids[1:]], minlength=len(CONSTANT_LAW))
        return counts, sum(c.num_drafts for c in result.cycles)

    counts, drafted = emitted_counts("exact")
    assert drafted > 1000, drafted
    assert chisquare(counts, expected * counts.sum()).pvalue > 0.001, counts
    for wrong in ("naive", "argmax-match"):
        counts, _ = emitted_counts(wrong)
        assert chisquare(counts, expected * counts.sum()).pvalue < 1e-6, (wrong, counts)


def copying_target() -> LlamaForCausalLM:
    """The model-free drafts' greedy tests' target (tests/test_lookup.py, tests/test_suffix.py): peaked laws (weight
    scale 0.1), so that greedy outputs repeat and the drafts find matches."""
    return tiny_llama(vocab=64, hidden=32, layers=2, seed=3, init=0.1)


def repetitive_requests(count: int, max_new: int, vocab: int = 64, seed: int = 0) -> list[Request]:
    """Prompts that repeat a random phrase (so a model-free draft matches), except every third: random (no match)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        phrase = torch.randint(0, vocab, (3 + i % 4,), generator=gen).tolist()
        prompt = phrase * 3 if i % 3 else torch.randint(0, vocab, (9,), generator=gen).tolist()
        out.append(Request(i, f"p{i}", "en", prompt, max_new))
    return out


def greedy_runs(target, spec, lengths: tuple[int, ...], gammas: tuple[int, ...],
                concurrencies: tuple[int, ...]) -> tuple[int, int]:
    """Each (max_new_tokens, γ, concurrency) over 7 :func:`repetitive_requests`: the engine's greedy outputs with the
    model-free draft ``spec`` equal plain decoding's, and no row drafts past γ; returns (drafts accepted, cycles where
    rows with and without a chain shared the batch)."""
    import itertools

    from spectune.engine import Engine
    from spectune.engine.policy import FixedGamma
    from spectune.sampling import SamplingParams
    from spectune.sampling.rejection import get_sampler

    greedy = SamplingParams(temperature=0)
    plain = Engine(target, None, sampling=greedy, sampler=get_sampler("exact"), device="cpu", seed=0)
    engine = Engine(target, spec, sampling=greedy, sampler=get_sampler("exact"), device="cpu", seed=0)
    accepted = mixed = 0
    for max_new in lengths:
        requests = repetitive_requests(7, max_new)
        reference = {r.request_id: r.output_ids for r in plain.run(requests, None, 1).requests}
        assert all(len(ids) == max_new for ids in reference.values())
        for gamma, concurrency in itertools.product(gammas, concurrencies):
            result = engine.run(requests, FixedGamma(gamma), concurrency)
            assert {r.request_id: r.output_ids for r in result.requests} == reference, (max_new, gamma, concurrency)
            by_cycle: dict[int, list[int]] = {}
            for c in result.cycles:
                assert c.num_drafts <= gamma and c.accepted <= c.num_drafts
                by_cycle.setdefault(c.cycle, []).append(c.num_drafts)
            accepted += sum(c.accepted for c in result.cycles)
            mixed += sum(1 for drafts in by_cycle.values() if 0 in drafts and max(drafts) > 0)
    return accepted, mixed


def assert_chains_stop_at_stop_ids_and_the_length_limit(spec) -> None:
    """The model-free draft ``spec`` (whose stop ids hold 9; EOS is 8), through its session proposer over two rows:
    row 0's context ``1 2 3 4 1 2 | 3`` repeats ``2 3``, so its chain is ``4 1 2 3``; row 1's ``5 6 9 7 5 | 6`` would
    go on with 9, a stop id, so it has none. With 3 new tokens allowed (the first is ``last``, one is the
    verification's own) the chain is cut to 1 token; a chain that would go on with EOS is empty."""
    from spectune.engine.proposers.chain import ChainProposer

    proposer = ChainProposer(spec, batch=2, vocab_size=16, device="cpu", eos=[8])
    proposer.prefill([0, 1], [[1, 2, 3, 4, 1, 2], [5, 6, 9, 7, 5]], limits=[64, 64])
    proposer.begin(torch.tensor([3, 6]))
    assert proposer._chains == [[4, 1, 2, 3], []]
    proposer.prefill([0], [[1, 2, 3, 4, 1, 2]], limits=[3])
    proposer.begin(torch.tensor([3, 6]))
    assert proposer._chains[0] == [4]
    proposer.prefill([0], [[1, 2, 3, 8, 1, 2]], limits=[64])  # EOS ends the chain
    proposer.begin(torch.tensor([3, 6]))
    assert proposer._chains[0] == []


LOOKUP_MAX_NEW = 12  # new tokens per request of record_lookup


def record_lookup(pair, gamma: int, slots: int, draft=None):
    """(engine, requests, traces frame, outputs): prompt lookup (max_n 3; or the model-free ``draft`` given, e.g.
    suffix decoding) on the tiny pair's target, greedy (it loops: matches of every length), seed 5,
    4 requests whose prompts repeat a random phrase three times, LOOKUP_MAX_NEW new tokens each, drafted to ``gamma``
    every cycle at ``slots`` rows — the model-free recording the match-signal tests read."""
    from spectune.engine import Engine
    from spectune.engine.proposers.lookup import PromptLookup
    from spectune.engine.traces import record
    from spectune.sampling import SamplingParams
    from spectune.sampling.rejection import get_sampler

    target, _ = pair
    engine = Engine(target, draft or PromptLookup(max_n=3), sampling=SamplingParams(temperature=0),
                    sampler=get_sampler("exact"), device="cpu", seed=5)
    requests = [Request(r.request_id, r.prompt_id, r.language, r.input_ids * 3, LOOKUP_MAX_NEW)
                for r in random_requests(4, max_new=LOOKUP_MAX_NEW, seed=6)]
    session = engine.session(requests, None, slots, keep_laws=True)
    frame = record(session, requests, gamma)
    return engine, requests, frame, {r.request_id: r.output_ids for r in session.result().requests}


def live_against_replay(engine, requests, policy, traces, positions, traced, replayed) -> tuple[int, dict]:
    """Run ``policy`` live (greedy, concurrency 1) and check every live cycle that starts where a recorded one does,
    with the same text so far, verifies what ``replayed`` (the policy's replay of the recording, TraceSet order)
    decided there; (cycles compared, {(request, output position): replayed γ}). ``positions``: each recorded
    (cycle, row)'s output position at its start; ``traced``: the recording's outputs by request."""
    decided = {(int(r), int(p)): int(g) for r, p, g in zip(traces.request_id, positions, replayed, strict=True)}
    live = engine.run(requests, policy, 1)
    outputs = {r.request_id: r.output_ids for r in live.requests}
    start = {r.request_id: 1 for r in requests}
    compared = 0
    for c in live.cycles:
        pos = start[c.request_id]
        start[c.request_id] += c.emitted
        if (c.request_id, pos) in decided and outputs[c.request_id][:pos] == traced[c.request_id][:pos]:
            assert c.num_drafts == decided[(c.request_id, pos)], (c.request_id, pos)
            compared += 1
    return compared, decided


def tuned_in_replay(name: str, node: dict, values: tuple, traces, profile, gamma: int):
    """``tune`` of one threshold policy on ``traces``: its grid is ``values`` (``GRIDS``), every value replayed once,
    exactly one chosen, and the chosen one the replay's argmax; returns the tuning table for the caller's checks."""
    from policies.train.tuning import GRIDS, tune

    parameter = GRIDS[name][0]
    assert GRIDS[name] == (parameter, values)
    tuned, table = tune({name: node}, traces, profile, gamma)
    assert list(table["value"]) == list(values) and table["chosen"].sum() == 1
    assert tuned[name][parameter] == table.loc[table["replay_tok_s"].idxmax(), "value"]
    return table
