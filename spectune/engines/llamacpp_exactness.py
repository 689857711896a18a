"""Is llama-server's speculation exact? Two checks on the real server, against the same build's AR server.

1. **Greedy** (:func:`greedy_check`): each prompt's output of every speculative server against the AR server's;
   at a first diverging token the AR server is asked for its top-2 log-probabilities given the prompt and the
   common prefix, and the divergence is classified (:mod:`spectune.audit.divergence`).
2. **T = 1** (:func:`distribution_check`): tokens a speculative server drew inside a speculated span, against p
   read from the AR server (:mod:`spectune.audit.draft_law`). A fixed context C (a copy-heavy prompt plus an AR
   greedy prefix, cut where the next token is nearly certain and the one after is not) and many seeded requests
   of 3 new tokens: the first token x1 comes from the prompt pass; with 2 tokens left the server drafts at most one
   (llama-server caps a draft at the tokens remaining minus one, so ``n_predict`` 2 never drafts), and where the
   request's timings report ``draft_n`` > 0 the second token x2 was decided by verifying that draft. For the most
   frequent x1, x2's counts are judged against p(· | C, x1) from the AR server (its top N plus a remainder bin),
   with as many draws as the chi-square needs for the target power against "on rejection, resample from p".

Requests go to llama-server's native ``/completion`` as token ids, sampling as
:class:`~spectune.engines.llamacpp.LlamaCppFlavour` sends it (temperature, top-k 0, top-p 1; min-p, penalties,
DRY, XTC off), one seed per request. ``n_probs`` N returns, per generated token, ``completion_probabilities[i]``
with ``top_logprobs``: the N most likely tokens' log-probabilities from the raw logits (``post_sampling_probs``
off, tools/server/server-context.cpp ``populate_token_probs``), i.e. the T = 1 law whatever the request's
temperature. The outputs compared (greedy) are computed with ``cache_prompt`` off, as ``task=bench`` measures them;
the requests that share one context (the AR server's top-2 queries, the T = 1 draws) reuse the slot's cached prefix
(``cache_prompt`` on), which saves re-reading C per request and changes nothing of how the new tokens are drawn.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from spectune.audit import draft_law
from spectune.audit.divergence import Divergence, TopTwo, compare
from spectune.audit.fit import FitRule
from spectune.engines.llamacpp import LlamaCppFlavour
from spectune.engines.server import HOST, ManagedServer, ServerFailure

log = logging.getLogger(__name__)

GREEDY = SimpleNamespace(temperature=0.0, top_k=0, top_p=1.0)
T1 = SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0)  # top-k 0 is off in llama.cpp (k <= 0: no-op)
DRAW_TOKENS = 3  # x1 from the prompt pass, x2 verified against a one-token draft, x3 (ignored)
# The teeth: the rule on this many seeded simulations of the wrong rule at the test's n must reject in at least the
# target power's share of them (one simulation alone misses in 1 − power of cases)
TEETH_SIMULATIONS = 200


@dataclass
class Completion:
    """One non-streamed completion: its tokens, per token the top-N (ids, log-probabilities) where asked, and the
    request's draft counters (0 when the server drafted nothing: it then leaves them out of ``timings``)."""

    tokens: list[int]
    top: list[list[tuple[int, float]]]
    drafted: int
    accepted: int


def complete(server: ManagedServer, flavour: LlamaCppFlavour, ids: Sequence[int], n_predict: int, sampling: Any,
             seed: int, n_probs: int = 0, cache_prompt: bool = False, timeout_s: float = 600) -> Completion:
    """POST one completion of ``ids`` (not streamed) and read it; a refusal or a dead server is a ServerFailure.
    ``cache_prompt``: reuse the slot's KV cache of the longest common prefix (the many requests that share one
    context; every token generated is still decoded and sampled as without it)."""
    path, body = flavour.request(list(ids), n_predict, sampling, seed)
    body.update(stream=False, n_probs=int(n_probs), cache_prompt=bool(cache_prompt))
    conn = http.client.HTTPConnection(HOST, server.port, timeout=timeout_s)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as err:
        raise (server.died() if not server.alive(grace_s=5) else
               ServerFailure(f"the request to the server for {server.label} failed: {err}")) from None
    finally:
        conn.close()
    if response.status != 200:
        raise ServerFailure(f"the server for {server.label} answered {response.status}: {text[:300]}")
    data = json.loads(text)
    if not cache_prompt and data.get("tokens_evaluated") is not None and data["tokens_evaluated"] != len(ids):
        raise ServerFailure(f"the server for {server.label} evaluated {data['tokens_evaluated']} prompt tokens, "
                            f"{len(ids)} were sent")
    top = [[(int(t["id"]), float(t["logprob"])) for t in entry.get("top_logprobs", [])]
           for entry in data.get("completion_probabilities", [])]
    timings = data.get("timings") or {}
    return Completion([int(t) for t in data.get("tokens", [])], top, int(timings.get("draft_n", 0)),
                      int(timings.get("draft_n_accepted", 0)))


def top_two(entry: list[tuple[int, float]]) -> TopTwo:
    if len(entry) < 2:
        raise ServerFailure(f"the AR server reported {len(entry)} top log-probabilities where 2 were asked")
    return TopTwo((entry[0][0], entry[1][0]), (entry[0][1], entry[1][1]))


# -- 1. greedy ----------------------------------------------------------------------------------------------------
def greedy_check(ar: ManagedServer, speculative: dict[str, ManagedServer], flavour: LlamaCppFlavour,
                 prompts: Sequence[Any], max_new_tokens: int, bound: float, seed: int,
                 on_prompt: Callable[[int], None] | None = None) -> list[Divergence]:
    """Every prompt (``.id``, ``.category``: its category, ``.input_ids``) on AR and on each speculative server (by spec
    type), greedy; one :class:`Divergence` per (spec type, prompt)."""
    rows: list[Divergence] = []
    with ThreadPoolExecutor(max_workers=1 + len(speculative), thread_name_prefix="llamacpp-verify") as pool:
        for i, prompt in enumerate(prompts):
            ids = list(prompt.input_ids)
            # each server computes alone; the servers run side by side (outputs are compared, not timed)
            pending = pool.submit(complete, ar, flavour, ids, max_new_tokens, GREEDY, seed, n_probs=2)
            outs = {t: pool.submit(complete, srv, flavour, ids, max_new_tokens, GREEDY, seed)
                    for t, srv in speculative.items()}
            reference = pending.result()
            decode_gaps = [top_two(entry).gap if len(entry) >= 2 else None for entry in reference.top]

            def top_at(position: int, ids: list[int] = ids, ar_tokens: list[int] = reference.tokens) -> TopTwo:
                again = complete(ar, flavour, ids + ar_tokens[:position], 1, GREEDY, seed, n_probs=2,
                                 cache_prompt=True)
                return top_two(again.top[0])

            for spec_type, pending_out in outs.items():
                out = pending_out.result()
                rows.append(compare(spec_type, str(prompt.id), str(getattr(prompt, "category", "")), reference.tokens,
                                    out.tokens, top_at, bound, decode_gaps, out.drafted, out.accepted))
            said = [f"{r.spec_type} equal" if r.equal else
                    f"{r.spec_type} {r.verdict} (token {r.position}, gap {r.gap_nats:.4f} nats)"
                    for r in rows[-len(outs):]]
            log.info(f"greedy: prompt {i + 1}/{len(prompts)} {prompt.id}: {', '.join(said)}")
            if on_prompt is not None:
                on_prompt(i)
    return rows


# -- 2. T = 1 -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DrawSettings:
    """What the T = 1 check runs: ``prefix_tokens`` of AR greedy text to cut C from, ``pilot`` requests to find x1
    and the draft, ``n_probs`` tokens of p, the power ``target`` against the wrong rule, at most ``max_requests``
    requests, the binning's ``min_expected``, the audit's ``rule``; seeds from ``seed`` up, one per request."""

    prefix_tokens: int
    pilot: int
    n_probs: int
    target_power: float
    max_requests: int
    min_expected: float
    rule: FitRule
    seed: int
    lookup: int = 0  # the n-gram a draft is looked up by (ngram-mod's n_match); 0: no such filter on the cut
    min_cut: int = 4


def drafts_after(context: Sequence[int], lookup: int) -> bool:
    """Whether an n-gram lookup can draft after ``context``: its last ``lookup`` tokens occur earlier in it (what
    ngram-mod's pool, keyed by ``--spec-ngram-mod-n-match`` tokens, holds of the prompt and the text so far)."""
    if lookup < 1 or len(context) <= lookup:
        return lookup < 1
    tail = list(context[-lookup:])
    return any(list(context[i:i + lookup]) == tail for i in range(len(context) - lookup))


def choose_cut(top: list[list[tuple[int, float]]], min_cut: int,
               drafts: Callable[[int], bool] = lambda k: True) -> int | None:
    """Where to end C in an AR greedy continuation: the position k whose token is most certain (most draws share
    x1) while the token after it is least certain (the wrong rule moves P(d) by p(d)(1 − p(d))): the k maximising
    p_k(top) · p_{k+1}(top)(1 − p_{k+1}(top)), among those after whose token ``drafts(k)`` says a draft can follow;
    None when there is none."""
    scored = []
    for k in range(min_cut, len(top) - 1):
        p1, p2 = math.exp(top[k][0][1]), math.exp(top[k + 1][0][1])
        if drafts(k):
            scored.append((p1 * p2 * (1 - p2), -k))
    return -max(scored)[1] if scored else None


def _draws(server: ManagedServer, flavour: LlamaCppFlavour, context: list[int], seeds: range) -> list[Completion]:
    return [complete(server, flavour, context, DRAW_TOKENS, T1, s, cache_prompt=True) for s in seeds]


def distribution_check(ar: ManagedServer, spec: ManagedServer, flavour: LlamaCppFlavour,
                       candidates: Sequence[Sequence[int]], s: DrawSettings) -> dict[str, Any]:
    """The T = 1 check on one speculative server (see the module's docstring): C from the first of ``candidates``
    (prompts' token ids, in the order to try) whose AR greedy continuation has a cut after which an n-gram lookup
    can draft. A JSON-ready result whose ``passed`` is the audit's rule on the real draws and ``teeth`` the share
    of seeded simulations of the wrong rule at the same n that the rule rejects (it must reach the target power)."""
    for index, prompt_ids in enumerate(candidates):  # noqa: B007 (the one that gave a cut is kept)
        greedy = complete(ar, flavour, prompt_ids, s.prefix_tokens, GREEDY, s.seed, n_probs=2, cache_prompt=True)
        text, start = [*prompt_ids, *greedy.tokens], len(prompt_ids)
        cut = choose_cut(greedy.top, s.min_cut,
                         lambda k, text=text, start=start: drafts_after(text[:start + k + 1], s.lookup))
        if cut is not None:
            break
    else:
        return {"skipped": f"none of {len(candidates)} prompts' AR greedy continuations repeats an n-gram of "
                           f"{s.lookup} tokens: nothing would draft"}
    context = list(prompt_ids) + greedy.tokens[:cut]
    pilot = _draws(spec, flavour, context, range(s.seed, s.seed + s.pilot))
    drafted = [c for c in pilot if c.drafted > 0 and len(c.tokens) >= 2]
    if not drafted:
        return {"skipped": f"no pilot request of {s.pilot} drafted (draft_n = 0 throughout): nothing to test",
                "prompt_index": index, "cut": cut, "context_tokens": len(context)}
    x1 = Counter(c.tokens[0] for c in drafted).most_common(1)[0][0]
    share = sum(c.tokens[0] == x1 for c in drafted) / len(pilot)
    accepted = Counter(c.tokens[1] for c in drafted if c.tokens[0] == x1 and c.accepted > 0)
    p_top = complete(ar, flavour, [*context, x1], 1, T1, s.seed, n_probs=s.n_probs, cache_prompt=True).top[0]
    law = draft_law.TopLaw.of([t for t, _ in p_top], [math.exp(lp) for _, lp in p_top])
    draft, draft_seen = (accepted.most_common(1)[0][0], True) if accepted else (law.ids[0], False)
    wrong = law.wrong_rule(draft)
    needed = draft_law.draws_for_power(law.p, wrong, target=s.target_power, min_expected=s.min_expected,
                                       min_pvalue=s.rule.min_pvalue, max_draws=s.max_requests)
    requests = s.max_requests if needed is None else min(s.max_requests, math.ceil(1.25 * needed / share))
    log.info(f"T = 1: C = prompt + {cut} greedy tokens ({len(context)} tokens), x1 {x1} with a draft in "
             f"{share:.0%} of the pilot requests, draft {draft}; {needed} draws give power {s.target_power:g}: "
             f"{requests} requests")
    draws = _draws(spec, flavour, context, range(s.seed + s.pilot, s.seed + s.pilot + requests))
    kept = [c for c in draws if c.drafted > 0 and len(c.tokens) >= 2 and c.tokens[0] == x1]
    counts = law.counts([c.tokens[1] for c in kept])
    n = int(counts.sum())
    result, labels = draft_law.judge(counts, law, s.min_expected, s.rule)
    simulated = [draft_law.judge(draft_law.simulated_counts(wrong, n, s.seed + i), law, s.min_expected, s.rule)[0]
                 for i in range(TEETH_SIMULATIONS)]
    rejected = sum(not fit.passed for fit in simulated) / TEETH_SIMULATIONS
    power = draft_law.power_at(law.p, wrong, n, s.min_expected, s.rule.min_pvalue)
    return {
        "prompt_index": index, "cut": cut, "context_tokens": len(context), "x1": int(x1),
        "x1_share_of_pilot": share,
        "draft": int(draft), "draft_seen_accepted": draft_seen, "p_draft": float(law.p[law.index(draft)]),
        "pilot_requests": s.pilot, "requests": requests, "draws_needed": needed, "draws": n,
        "drafted_requests": sum(c.drafted > 0 for c in draws), "accepted_draws": sum(c.accepted > 0 for c in kept),
        "power_at_draws": power, "target_power": s.target_power, "top_ids": list(law.ids), "p": law.p.tolist(),
        "wrong_rule_law": wrong.tolist(), "cells": labels, "fit": result.as_dict(), "passed": result.passed,
        "teeth": {"law": "on rejection, resample from p", "simulations": TEETH_SIMULATIONS, "seeds_from": s.seed,
                  "rejected_share": rejected, "rejected": rejected >= s.target_power,
                  "first_fit": simulated[0].as_dict()},
    }
