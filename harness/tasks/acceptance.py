"""`python -m harness task=acceptance +workload=<lang>`: the acceptance rate α and the cost ratio c.

α is the probability that one draft token is accepted, E_x[Σ_v min(p(v|x), q(v|x))], with p and q the
laws actually sampled (both through :func:`spectune.sampling.warp.warp` with the workload's settings). It is
measured on the workload's held-out prompts, *teacher-forced along continuations sampled from the
target* at those same settings (greedy when temperature is 0): the contexts a speculative decoder really
visits, since every emitted token follows p. Prompts are the workload's, rendered through the target's chat
template when ``workload.chat_template`` applies (the default for a tokenizer that has one). α is pooled
over all positions; its spread over positions and its mean by position index are reported too, because the
same mean can hide different accepted-length distributions. For a draft that reads the target's features
(EAGLE-style), α is its first draft step's (the target's features in) and ``alpha_by_draft_step`` gives every
step up to ``task.feature_max_gamma``: deeper steps read the draft's own predicted features.

c is the draft's per-token decode time over the target's (median of KV-cached single-token steps, after a
warm-up, same tokens for both models) on this machine: the other input of the γ cost model.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from analysis.acceptance import format_alpha_by_category
from spectune.engine.features import HiddenTap, reads_features
from spectune.engine.kv import cache_argument
from spectune.errors import SpectuneError
from spectune.models.feature_draft import unrolled
from spectune.options import integer, required
from spectune.run import rundir
from spectune.run.metadata import base_metadata
from spectune.run.progress import RunProgress
from spectune.sampling import SamplingParams, sample, warp
from spectune.stats.by_category import alpha_by_category
from spectune.stats.intervals import ratio_interval
from workloads.answers import finish_reason, repetition_rate

PERCENTILES = (5, 10, 25, 50, 75, 90, 95)
log = logging.getLogger(__name__)


@torch.no_grad()
def decode(model, prompt: list[int], steps: int, params: SamplingParams, gen: torch.Generator | None,
           forced: list[int] | None = None, eos: int | None = None,
           vocab: int | None = None) -> tuple[list[int], list[float]]:
    """KV-cached decoding, one token per forward. Samples from ``warp(logits)`` unless ``forced`` gives
    the tokens to feed. Returns (new tokens, seconds per single-token forward; the prefill excluded)."""
    device = model.device
    cache_arg = cache_argument(model)  # transformers 5.24 says cache, older 5.x past_key_values
    out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
    past, logits = out[cache_arg], out.logits[:, -1]
    tokens: list[int] = []
    times: list[float] = []
    for i in range(steps if forced is None else len(forced)):
        token = int(sample(warp(logits[..., :vocab], params), gen)) if forced is None else forced[i]
        tokens.append(token)
        if (eos is not None and token == eos) or len(tokens) == steps:
            break
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model(input_ids=torch.tensor([[token]], device=device), use_cache=True, **{cache_arg: past})
        logits = out.logits[:, -1]
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        past = out[cache_arg]
    return tokens, times


@torch.no_grad()
def overlap(target, draft, prompt: list[int], continuation: list[int], params: SamplingParams,
            vocab: int | None = None) -> torch.Tensor:
    """Σ_v min(p, q) at each position that predicts a continuation token (teacher-forced, one pass each)."""
    ids = torch.tensor([prompt + continuation[:-1]], device=target.device)
    span = slice(len(prompt) - 1, None)
    p = warp(target(input_ids=ids).logits[0, span, :vocab], params)  # the tokenizer's ids (see check_pair)
    q = warp(draft(input_ids=ids).logits[0, span, :vocab], params)
    return torch.minimum(p, q).sum(-1).cpu()


@torch.no_grad()
def feature_overlap(target, draft, prompt: list[int], continuation: list[int], params: SamplingParams,
                    vocab: int | None, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a draft that reads the target's features: Σ_v min(p, q) at each continuation position for draft steps
    1..``gamma`` ([gamma, n]; step 1 reads the target's features, step k the draft's own k − 1 deep, as in a cycle
    begun k − 1 tokens earlier whose drafts were the continuation's), and the target's features [len, H]."""
    ids = torch.tensor([prompt + continuation[:-1]], device=target.device)
    tap = HiddenTap.on(target)
    p = warp(target(input_ids=ids).logits[0, len(prompt) - 1:, :vocab], params)
    features = tap.last
    entries = ids[:, 1:]
    steps = unrolled(draft, entries, features[:, :-1], torch.ones_like(entries), gamma)
    span = slice(len(prompt) - 2, None)  # entry j (column j - 1) predicts token j + 1
    laws = [warp(draft.lm_head(h[0, span])[:, :vocab], params) for h in steps]
    return torch.stack([torch.minimum(p, q).sum(-1) for q in laws]).cpu(), features[0]


@torch.no_grad()
def time_feature_draft(draft, prompt: list[int], tokens: list[int], features: torch.Tensor) -> list[float]:
    """Seconds per KV-cached single-entry forward of a feature-reading draft along ``tokens`` (after a prefill of the
    prompt's entries): the same work a draft step does."""
    from transformers import DynamicCache

    device = draft.device
    cache, cache_arg = DynamicCache(), cache_argument(draft)
    ids = torch.tensor([prompt[1:]], device=device)
    draft(input_ids=ids, features=features[None, : len(prompt) - 1], use_cache=True, **{cache_arg: cache})
    times = []
    for i, token in enumerate(tokens[:-1]):
        feature = features[None, len(prompt) - 1 + i: len(prompt) + i]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        draft(input_ids=torch.tensor([[token]], device=device), features=feature, use_cache=True, logits_to_keep=1,
              **{cache_arg: cache})
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def spread(values: torch.Tensor) -> dict[str, float]:
    v = values.double()
    out = {f"p{k}": float(torch.quantile(v, k / 100)) for k in PERCENTILES}
    out.update(mean=float(v.mean()), std=float(v.std()) if len(v) > 1 else 0.0, count=len(v))
    return out


def _median_ms(times: list[float]) -> float:
    return float(torch.tensor(times).median()) * 1e3


def run(cfg: DictConfig, run_dir: Path) -> int:
    from spectune.measure.models import load_models
    from workloads.loader import load_workload

    if not cfg.get("workload"):
        raise SpectuneError("task=acceptance needs a workload: add +workload=it|en|zh|es|mix")
    # the setup validated and its thread count applied before anything is timed; the models loaded once per process
    pair = load_models(cfg.models, cfg.hardware).pair
    wl = load_workload(cfg.workload, pair.tokenizer)
    params, eos = wl.sampling, pair.tokenizer.eos_token_id
    gen = torch.Generator(device=pair.target.device).manual_seed(wl.seed)

    features = reads_features(pair.draft)
    key = "task.feature_max_gamma"
    gamma = integer(required(cfg.task, "feature_max_gamma", key), key, lo=1, hi=16) if features else 1

    def draft_pass(prompt: list[int], cont: list[int]) -> tuple[torch.Tensor, list[float]]:
        """([gamma, n] Σ min(p, q) along ``cont``, the draft's seconds per token)."""
        if features:
            a, feats = feature_overlap(pair.target, pair.draft, prompt, cont, params, pair.vocab_size, gamma)
            return a, time_feature_draft(pair.draft, prompt, cont, feats)
        _, d_times = decode(pair.draft, prompt, len(cont), params, None, forced=cont)
        return overlap(pair.target, pair.draft, prompt, cont, params, vocab=pair.vocab_size).unsqueeze(0), d_times

    # Warm-up both models (allocator, kernels) on the first prompt, untimed.
    first = wl.prompts[0].input_ids
    warm, _ = decode(pair.target, first, min(8, wl.max_new_tokens), params, gen, vocab=pair.vocab_size)
    draft_pass(first, warm)

    per_prompt, per_position, by_language, deeper = [], [], {}, []
    finishes: list[str] = []  # what the target answered: stop / length, and how much it repeats itself
    repetition: list[float] = []
    target_times: list[float] = []
    draft_times: list[float] = []
    with RunProgress(f"acceptance {wl.name}", len(wl.prompts), unit="prompts") as progress:
        for prompt in wl.prompts:
            cont, t_times = decode(pair.target, prompt.input_ids, wl.max_new_tokens, params, gen, eos=eos,
                                   vocab=pair.vocab_size)
            by_gamma, d_times = draft_pass(prompt.input_ids, cont)
            target_times += t_times
            draft_times += d_times
            a = by_gamma[0]
            deeper.append(by_gamma)
            per_position.append(a)
            per_prompt.append(float(a.mean()))
            by_language.setdefault(prompt.language, []).append(a)
            finishes.append(finish_reason(cont, wl.max_new_tokens, [eos] if eos is not None else []))
            repetition.append(repetition_rate(cont))
            progress.advance()

    pooled = torch.cat(per_position)
    sums = [float(a.sum()) for a in per_position]
    counts = [len(a) for a in per_position]
    longest = max(len(a) for a in per_position)
    by_index = [float(torch.stack([a[k] for a in per_position if len(a) > k]).mean()) for k in range(longest)]
    t_ms, d_ms = _median_ms(target_times), _median_ms(draft_times)
    result: dict[str, Any] = {
        "task": "acceptance",
        "alpha": float(pooled.mean()),
        "alpha_definition": "mean over positions of sum_v min(p, q); p, q = warp(logits, workload sampling)",
        "continuations": "sampled from the target at the workload's sampling settings (greedy if T=0), "
                         "then teacher-forced through both models; stops at EOS or max_new_tokens",
        "alpha_spread_over_positions": spread(pooled),
        "alpha_spread_over_prompts": spread(torch.tensor(per_prompt)),
        # α pools positions, so its interval treats prompts as the units of the pooled ratio
        "alpha_ci95_over_prompts": ratio_interval(sums, counts).as_dict(),
        # one row per prompt, in workload order: two drafts measured on the same prompts compare paired
        "alpha_per_prompt": [{"id": p.id, "language": p.language, "category": p.category, "positions": int(n),
                              "alpha": a, "finish": f, "repetition": r}
                             for p, n, a, f, r in zip(wl.prompts, counts, per_prompt, finishes, repetition,
                                                      strict=True)],
        "alpha_by_position_index": by_index,
        "alpha_by_language": {lang: float(torch.cat(v).mean()) for lang, v in sorted(by_language.items())},
        # a draft that reads the target's features sees them only at a cycle's first step: α by draft step
        # (step k: k − 1 of its own predictions deep); an independent draft's α is the same at every step
        "alpha_by_draft_step": [float(torch.cat([d[k] for d in deeper]).mean()) for k in range(gamma)],
        "draft_reads_target_features": features,
        "c": d_ms / t_ms,
        "timing": {"target_ms_per_token": t_ms, "draft_ms_per_token": d_ms,
                   "target_ms_p90": float(torch.tensor(target_times).quantile(0.9)) * 1e3,
                   "draft_ms_p90": float(torch.tensor(draft_times).quantile(0.9)) * 1e3,
                   "steps_timed": {"target": len(target_times), "draft": len(draft_times)},
                   "method": "median of KV-cached single-token forwards, after a warm-up, same tokens",
                   "torch_threads": torch.get_num_threads()},
        "models": pair.metadata,
        "workload": wl.describe(),
        "hardware": OmegaConf.to_container(cfg.hardware, resolve=True),
        "metadata": base_metadata(),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    categories = [p.category for p in wl.prompts]
    if len(set(categories)) > 1:
        result["alpha_by_category"] = alpha_by_category(categories, sums, counts)
        for category, entry in result["alpha_by_category"].items():  # what the target did on the category
            mine = [i for i, c in enumerate(categories) if c == category]
            entry["stop_share"] = sum(finishes[i] == "stop" for i in mine) / len(mine)
            entry["repetition_p50"] = float(torch.tensor([repetition[i] for i in mine]).median())
    path = rundir.ACCEPTANCE.write(run_dir, result)
    sp = result["alpha_spread_over_positions"]
    if pair.metadata.get("weights_note"):
        log.info(f"models {pair.metadata['name']}: {pair.metadata['weights_note']}")
    log.info(f"workload {wl.name} ({len(wl.prompts)} prompts, {len(pooled)} positions, T={params.temperature}, "
             f"top_p={params.top_p}, top_k={params.top_k})")
    ci = result["alpha_ci95_over_prompts"]
    log.info(f"alpha = {result['alpha']:.4f}  (95% CI over {ci['n']} prompts {ci['lo']:.4f}–{ci['hi']:.4f}; "
             f"positions p10 {sp['p10']:.3f}, p50 {sp['p50']:.3f}, p90 {sp['p90']:.3f})")
    if len(by_language) > 1:
        log.info("alpha by language: " + ", ".join(f"{k} {v:.4f}" for k, v in result["alpha_by_language"].items()))
    if "alpha_by_category" in result:
        log.info(format_alpha_by_category(result["alpha_by_category"]))
    if features:
        log.info("alpha by draft step: " + ", ".join(f"{k + 1}: {v:.4f}"
                                                     for k, v in enumerate(result["alpha_by_draft_step"])))
    log.info(f"target {t_ms:.2f} ms/token, draft {d_ms:.2f} ms/token, c = {result['c']:.3f}")
    log.info(f"wrote {path}")
    return 0
