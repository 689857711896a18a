"""`task=verify task.source=models`: the exactness audit on the real (target, draft) pair.

Two levels, both through the project's own code (no re-implementation of the rule):

1. Sampler level. For the first K prompts of the workload, p and q are the warped next-token laws of the
   target and the draft (:func:`spectune.sampling.warp.warp` at the workload's settings, renormalised in
   float64); :func:`spectune.audit.montecarlo.first_token_counts` drives every sampler of ``get_sampler`` on shared
   proposals and uniforms, and the counts are judged on cells (:mod:`spectune.audit.bins`).
2. Engine level. The :class:`~spectune.engine.Engine` generates 2 tokens for many identical requests of one
   prompt. Token 1 comes from the target's prefill, token 2 from the first speculative cycle, so the law
   of token 2 given token 1 must be p(· | prompt, t1). Tested: (a) for the most frequent t1, the binned
   conditional law; (b) pooled over every request, the event "t2 ∈ A(t1) = {x : p(x|t1) > q(x|t1)}" —
   the set where the residual lives, so it is the event a wrong rejection branch moves first. Its
   definition uses (p, q) only, never the counts. The family (a) + (b) is Bonferroni-corrected.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import torch

from spectune.audit.bins import Bins, EventTest, binned_fit, chi2_power, event_test
from spectune.audit.fit import FitResult, FitRule, fit, fmt
from spectune.audit.laws import PositionLaws
from spectune.audit.montecarlo import first_token_counts
from spectune.engine import Engine, Request
from spectune.engine.features import HiddenTap, reads_features
from spectune.engine.kv import cache_argument
from spectune.engine.policy import FixedGamma
from spectune.sampling import SamplingParams, warp
from spectune.sampling.rejection import RejectionSampler

_CHUNK = 256  # continuations scored per forward at the engine level


def _as_law(probs: torch.Tensor) -> np.ndarray:
    """float32 warp output → float64 rows that sum to 1 (the exact laws are computed in float64)."""
    law = probs.double().cpu().numpy()
    return law / law.sum(axis=-1, keepdims=True)


@torch.inference_mode()
def next_law(model: torch.nn.Module, prompt: list[int], sampling: SamplingParams,
             vocab: int | None = None) -> np.ndarray:
    """The law actually sampled for the token after ``prompt`` (one forward, last position only), over
    the first ``vocab`` ids (the tokenizer's; see check_pair)."""
    ids = torch.tensor([prompt], device=model.device)
    return _as_law(warp(model(input_ids=ids, logits_to_keep=1).logits[0, -1, :vocab], sampling))


@torch.inference_mode()
def continuation_laws(model: torch.nn.Module, prompt: list[int], firsts: list[int],
                      sampling: SamplingParams, vocab: int | None = None) -> np.ndarray:
    """p(· | prompt, t) for every t in ``firsts``, [len(firsts), V]: the prompt's KV cache is computed
    once per chunk and repeated, so each continuation costs one single-token step."""
    ids = torch.tensor([prompt], device=model.device)
    rows = []
    for start in range(0, len(firsts), _CHUNK):
        chunk = torch.tensor(firsts[start:start + _CHUNK], device=model.device)
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        kwarg = cache_argument(model)
        cache = out[kwarg]
        cache.batch_repeat_interleave(len(chunk))
        logits = model(input_ids=chunk[:, None], use_cache=True, **{kwarg: cache}).logits[:, -1]
        rows.append(_as_law(warp(logits[..., :vocab], sampling)))
    return np.concatenate(rows) if rows else np.zeros((0, vocab or model.config.vocab_size))


def _prompt_features(target: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    """The target's features f_0..f_{P-1} over the prompt, [1, P, H]."""
    tap = HiddenTap.on(target)
    target(input_ids=torch.tensor([prompt], device=target.device), logits_to_keep=1)
    return tap.last


@torch.inference_mode()
def draft_next_law(pair: Any, prompt: list[int], sampling: SamplingParams) -> np.ndarray:
    """The draft's law for the token after ``prompt``; a draft that reads the target's features gets them (its
    entries x_1..x_{P-1} with f_0..f_{P-2}, as a cycle after this prompt feeds it)."""
    if not reads_features(pair.draft):
        return next_law(pair.draft, prompt, sampling, pair.vocab_size)
    feats = _prompt_features(pair.target, prompt)
    ids = torch.tensor([prompt[1:]], device=pair.draft.device)
    logits = pair.draft(input_ids=ids, features=feats[:, :-1], logits_to_keep=1).logits
    return _as_law(warp(logits[0, -1, : pair.vocab_size], sampling))


@torch.inference_mode()
def draft_continuation_laws(pair: Any, prompt: list[int], firsts: list[int], sampling: SamplingParams) -> np.ndarray:
    """q(· | prompt, t) for every t in ``firsts`` (see :func:`continuation_laws`); a feature-reading draft's entry
    for t carries the target's feature f_{P-1} at the prompt's last token."""
    if not reads_features(pair.draft):
        return continuation_laws(pair.draft, prompt, firsts, sampling, pair.vocab_size)
    from transformers import DynamicCache

    draft, feats = pair.draft, _prompt_features(pair.target, prompt)
    ids = torch.tensor([prompt[1:]], device=draft.device)
    kwarg = cache_argument(draft)
    rows = []
    for start in range(0, len(firsts), _CHUNK):
        chunk = torch.tensor(firsts[start:start + _CHUNK], device=draft.device)
        cache = DynamicCache()
        draft(input_ids=ids, features=feats[:, :-1], use_cache=True, logits_to_keep=1, **{kwarg: cache})
        cache.batch_repeat_interleave(len(chunk))
        logits = draft(input_ids=chunk[:, None], features=feats[:, -1:].expand(len(chunk), -1, -1), use_cache=True,
                       **{kwarg: cache}).logits[:, -1]
        rows.append(_as_law(warp(logits[..., : pair.vocab_size], sampling)))
    return np.concatenate(rows) if rows else np.zeros((0, pair.vocab_size))


def sampler_level(pair: Any, prompts: list[Any], sampling: SamplingParams, samplers: dict[str, RejectionSampler],
                  trials: int, seed: int, rule: FitRule, min_expected: float) -> list[dict[str, Any]]:
    """Monte Carlo of one position per prompt on the pair's real laws, judged on cells."""
    out = []
    for k, prompt in enumerate(prompts):
        p = next_law(pair.target, prompt.input_ids, sampling, pair.vocab_size)
        q = draft_next_law(pair, prompt.input_ids, sampling)
        laws = PositionLaws.of(p, q)
        counts = first_token_counts(samplers, p, q, trials, seed + 10 * k)
        fits: dict[str, FitResult] = {}
        bins: Bins | None = None
        for name, c in counts.items():
            fits[name], bins = binned_fit(c, p, min_expected, rule)
        out.append({"prompt": prompt, "laws": laws, "fits": fits, "bins": bins, "seed": seed + 10 * k,
                    "power": chi2_power(bins.law(p), bins.law(laws.naive), trials, rule.min_pvalue)})
    return out


def _pairs(records: Any, eos: int | None) -> tuple[list[int], list[int], int]:
    """(t1, t2) of every request that produced two tokens; and how many ended at t1 = EOS."""
    t1, t2, ended = [], [], 0
    for rec in records.requests:
        if len(rec.output_ids) == 2:
            t1.append(rec.output_ids[0])
            t2.append(rec.output_ids[1])
        elif rec.output_ids and rec.output_ids[0] == eos:
            ended += 1
    return t1, t2, ended


def _judge_engine(t1: list[int], t2: list[int], laws: dict[int, tuple[np.ndarray, np.ndarray]], conditions: int,
                  rule: FitRule, min_expected: float) -> dict[str, Any]:
    """Conditional binned fits for the most frequent t1 + the pooled residual-set event, Bonferroni."""
    by_first = Counter(t1)
    top = sorted(by_first, key=lambda t: (-by_first[t], t))[:conditions]
    raw = []
    for first in top:
        seconds = np.bincount([b for a, b in zip(t1, t2, strict=True) if a == first],
                              minlength=len(laws[first][0]))
        res, bins = binned_fit(seconds, laws[first][0], min_expected, rule)
        raw.append((first, res, bins, res.chi2_dof >= 1 or bool(res.zero_prob_hits)))
    p_rows = np.array([laws[a][0] for a in t1]) if t1 else np.zeros((0, 1))
    q_rows = np.array([laws[a][1] for a in t1]) if t1 else np.zeros((0, 1))
    in_a = p_rows > q_rows
    z_mass = np.clip(p_rows - q_rows, 0, None).sum(-1)
    p_a, q_a = (p_rows * in_a).sum(-1), (q_rows * in_a).sum(-1)
    hit = np.array([in_a[i, b] for i, b in enumerate(t2)], dtype=bool)
    event = event_test(hit, p_a, alt_prob=q_a + z_mass * p_a)  # naive law of A: q(A) + Z·p(A)
    family = sum(1 for *_, tested in raw if tested) + 1
    strict = FitRule(z_max=rule.z_max, min_pvalue=rule.min_pvalue / family)
    conds = []
    for first, res, bins, tested in raw:
        judged = fit(res.counts, res.law, strict) if tested else res
        conds.append({"t1": int(first), "n": res.n, "cells": bins.labels, "tested": tested,
                      "fit": judged.as_dict(), "passed": judged.passed or not tested})
    event_ok = event.pvalue > rule.min_pvalue / family
    return {"n": len(t1), "distinct_first_tokens": len(by_first), "family_size": family,
            "pvalue_threshold": rule.min_pvalue / family, "conditions": conds,
            "residual_event": {**event.as_dict(), "passed": event_ok,
                               "power_vs_naive": event.alt_power(rule.min_pvalue / family)},
            "passed": event_ok and all(c["passed"] for c in conds)}


def engine_level(pair: Any, prompt: Any, sampling: SamplingParams, samplers: dict[str, RejectionSampler],
                 opts: dict[str, Any], seed: int, rule: FitRule) -> dict[str, Any]:
    """Run the Engine once per sampler on ``requests`` copies of ``prompt`` (2 new tokens) and judge."""
    begin = time.perf_counter()
    eos = pair.tokenizer.eos_token_id
    runs: dict[str, tuple[list[int], list[int], int, float]] = {}
    for name, sampler in samplers.items():
        engine = Engine(pair.target, pair.draft, sampling=sampling, sampler=sampler, device=pair.target.device,
                        eos_token_ids=[eos] if eos is not None else [], seed=seed, vocab_size=pair.vocab_size)
        requests = [Request(i, prompt.id, prompt.language, prompt.input_ids, 2, category=prompt.category)
                    for i in range(opts["requests"])]
        start = time.perf_counter()
        records = engine.run(requests, FixedGamma(opts["gamma"]), opts["concurrency"])
        runs[name] = (*_pairs(records, eos), time.perf_counter() - start)
    firsts = sorted({a for t1, *_ in runs.values() for a in t1})
    p_rows = continuation_laws(pair.target, prompt.input_ids, firsts, sampling, pair.vocab_size)
    q_rows = draft_continuation_laws(pair, prompt.input_ids, firsts, sampling)
    laws = {t: (p_rows[i], q_rows[i]) for i, t in enumerate(firsts)}
    variants = {}
    for name, (t1, t2, ended, wall) in runs.items():
        judged = _judge_engine(t1, t2, laws, opts["conditions"], rule, opts["min_expected"])
        variants[name] = {**judged, "ended_at_eos": ended, "engine_wall_s": wall}
    return {"prompt_id": prompt.id, "wall_s": time.perf_counter() - begin, "prompt_tokens": len(prompt.input_ids),
            "requests": opts["requests"],
            "concurrency": opts["concurrency"], "gamma": opts["gamma"], "max_new_tokens": 2, "seed": seed,
            "variants": variants}


def mixed_engine_level(pair: Any, prompt: Any, settings: list[SamplingParams], samplers: dict[str, RejectionSampler],
                       opts: dict[str, Any], seed: int, rule: FitRule) -> dict[str, Any]:
    """The engine level on a mixed batch: per sampler, one run of ``requests`` copies of ``prompt`` whose settings
    take ``settings`` in turn (so every batch mixes them, row by row); per setting, the law of token 2 given token 1
    judged against that setting's laws as :func:`engine_level` judges one (binned conditional laws, the residual-set
    event, Bonferroni per setting), a greedy setting by its one possible token: every t2 must be the argmax of
    p(· | prompt, t1). Exactness must hold row by row, and a wrong rule must be caught on the rows that sample."""
    begin = time.perf_counter()
    eos = pair.tokenizer.eos_token_id
    runs: dict[str, tuple[dict[int, list], float]] = {}
    for name, sampler in samplers.items():
        engine = Engine(pair.target, pair.draft, sampling=settings[0], sampler=sampler, device=pair.target.device,
                        eos_token_ids=[eos] if eos is not None else [], seed=seed, vocab_size=pair.vocab_size)
        requests = [Request(i, prompt.id, prompt.language, prompt.input_ids, 2, category=prompt.category,
                            sampling=settings[i % len(settings)]) for i in range(opts["requests"])]
        start = time.perf_counter()
        records = engine.run(requests, FixedGamma(opts["gamma"]), opts["concurrency"])
        groups = {k: [r for r in records.requests if r.request_id % len(settings) == k] for k in range(len(settings))}
        runs[name] = (groups, time.perf_counter() - start)
    variants: dict[str, Any] = {name: {"by_setting": [], "engine_wall_s": wall} for name, (_, wall) in runs.items()}
    for k, setting in enumerate(settings):
        pairs = {name: _pairs(_Records(groups[k]), eos) for name, (groups, _) in runs.items()}
        firsts = sorted({a for t1, *_ in pairs.values() for a in t1})
        p_rows = continuation_laws(pair.target, prompt.input_ids, firsts, setting, pair.vocab_size)
        q_rows = draft_continuation_laws(pair, prompt.input_ids, firsts, setting)
        laws = {t: (p_rows[i], q_rows[i]) for i, t in enumerate(firsts)}
        for name, (t1, t2, ended) in pairs.items():
            if setting.greedy:
                wrong = sum(1 for a, b in zip(t1, t2, strict=True) if b != int(np.argmax(laws[a][0])))
                judged = {"n": len(t1), "not_the_argmax": wrong, "passed": wrong == 0}
            else:
                judged = _judge_engine(t1, t2, laws, opts["conditions"], rule, opts["min_expected"])
            variants[name]["by_setting"].append({"sampling": setting.describe(), "ended_at_eos": ended, **judged})
    for entry in variants.values():
        entry["passed"] = all(s["passed"] for s in entry["by_setting"])
    return {"prompt_id": prompt.id, "wall_s": time.perf_counter() - begin, "requests": opts["requests"],
            "concurrency": opts["concurrency"], "gamma": opts["gamma"], "max_new_tokens": 2, "seed": seed,
            "settings": [s.describe() for s in settings], "variants": variants}


class _Records:
    """Some request records where :func:`_pairs` reads a run's."""

    def __init__(self, requests: list[Any]) -> None:
        self.requests = requests


def sampler_level_json(rows: list[dict[str, Any]], trials: int, min_expected: float) -> dict[str, Any]:
    return {"gamma": 1, "trials": trials, "shared": "proposal x ~ q and acceptance uniforms",
            "prompts": [{"prompt_id": r["prompt"].id, "prompt_tokens": len(r["prompt"].input_ids), "seed": r["seed"],
                         "Z": r["laws"].z, "accepted_total": r["laws"].accepted_total,
                         "tv_naive_vs_p": r["laws"].tv_naive, "tv_corrected_vs_p": r["laws"].tv_corrected,
                         "cells": r["bins"].describe(min_expected), "cell_labels": r["bins"].labels,
                         "chi2_power_vs_naive": r["power"],
                         "variants": {k: v.as_dict() for k, v in r["fits"].items()}} for r in rows]}


def print_sampler_level(rows: list[dict[str, Any]], trials: int, min_expected: float, configured: str,
                        wall_s: float) -> None:
    print(f"Sampler level, γ = 1: {trials} trials per prompt, next-token laws of the real pair "
          f"(proposal and uniforms shared by the variants; {wall_s:.0f} s)")
    print(f"{'prompt':>22} {'Z':>6} {'TV(naive,p)':>11} {'cells':>5} {'power':>6} {'variant':>8} "
          f"{'TV obs':>8} {'max|Δ|/SE':>9} {'chi2 p':>9}  verdict")
    for r in rows:
        power = "-" if r["power"] is None else f"{r['power']:.3f}"
        for name, res in r["fits"].items():
            chi = "n/a" if res.chi2_pvalue is None else f"{res.chi2_pvalue:.3g}"
            mark = " (configured)" if name == configured else ""
            print(f"{r['prompt'].id[:22]:>22} {r['laws'].z:6.3f} {r['laws'].tv_naive:11.6f} {r['bins'].size:5d} "
                  f"{power:>6} {name:>8} {res.tv:8.5f} {res.max_z:9.2f} {chi:>9}  {res.verdict}{mark}")
    print(f"cells: tokens with n*p >= {min_expected:g} on their own, the other p>0 tokens in 'rest', p=0 tokens "
          "in 'p=0'; power = P(chi-square part fails | naive law), noncentral chi-square")


def print_mixed_engine_level(result: dict[str, Any], configured: str) -> None:
    print(f"\nEngine level, mixed batch: {result['requests']} requests of {result['prompt_id']} per sampler, settings "
          f"in turn {result['settings']}, γ = {result['gamma']}, concurrency {result['concurrency']}; each setting's "
          f"law of token 2 given token 1 vs its own target law ({result['wall_s']:.0f} s)")
    for name, v in result["variants"].items():
        mark = " (configured)" if name == configured else ""
        parts = []
        for s in v["by_setting"]:
            how = (f"{s['not_the_argmax']} not the argmax" if "not_the_argmax" in s
                   else f"event p {s['residual_event']['pvalue']:.3g}")
            parts.append(f"T={s['sampling']['temperature']} k={s['sampling']['top_k']} p={s['sampling']['top_p']}: "
                         f"{s['n']} pairs, {how}, {'PASS' if s['passed'] else 'FAIL'}")
        print(f"{name}{mark}: " + "; ".join(parts) + f" -> {'PASS' if v['passed'] else 'FAIL'}")


def print_engine_level(result: dict[str, Any], configured: str) -> None:
    print(f"\nEngine level: {result['requests']} identical requests of {result['prompt_id']} "
          f"({result['prompt_tokens']} tokens) per sampler, γ = {result['gamma']}, concurrency "
          f"{result['concurrency']}, 2 new tokens; law of token 2 given token 1 vs one target forward "
          f"({result['wall_s']:.0f} s)")
    for name, v in result["variants"].items():
        mark = " (configured)" if name == configured else ""
        print(f"{name}{mark}: {v['n']} pairs ({v['ended_at_eos']} ended at EOS), {v['distinct_first_tokens']} "
              f"distinct t1, engine {v['engine_wall_s']:.1f} s; Bonferroni family {v['family_size']}, "
              f"p-value threshold {v['pvalue_threshold']:.3g}")
        for c in v["conditions"]:
            fit_ = c["fit"]
            chi = fit_["chi2"]["pvalue"]
            state = ("PASS" if c["passed"] else "FAIL") if c["tested"] else "untestable (one cell at this n)"
            print(f"   t1={c['t1']:>6} n={c['n']:>5} cells={len(c['cells']):>3} max|Δ|/SE "
                  f"{fmt(fit_['max_abs_error_over_se'], 6, 2)} chi2 p {'n/a' if chi is None else f'{chi:.3g}':>8}"
                  f"  {state}")
        e: EventTest | dict = v["residual_event"]
        power = "-" if e["power_vs_naive"] is None else f"{e['power_vs_naive']:.2f}"
        print(f"   t2 in A(t1)={{p>q}}: hits {e['hits']} expected {e['expected']:.1f} z {e['z']:+.2f} "
              f"p {e['pvalue']:.3g} (naive: mean z {e['alt_z']:+.2f}, power {power})  "
              f"{'PASS' if e['passed'] else 'FAIL'}")
        print(f"   -> {'PASS' if v['passed'] else 'FAIL'}")
