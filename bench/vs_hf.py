"""spectune's engine vs transformers' assisted generation vs plain `generate`, side by side in one run.

Same models, same prompts, greedy decoding, batch 1, same γ (HF: num_assistant_tokens=γ, schedule
"constant", assistant_confidence_threshold=0 so HF drafts exactly γ like we do). transformers 5.x reads
these from the *assistant's* generation_config and silently ignores them as generate() arguments (it then
drafts with its defaults: γ = 20 cut by a 0.4 confidence stop), so they are set there; forward hooks count
both models' calls to prove the γ really used. Each method is warmed
up, then every prompt is timed on its own (wall clock; on CUDA after synchronize), the two methods alternating
which goes first on each prompt so drift hits both. Throughput is generated tokens (target tokenizer ids) / summed
time; the ratio's 95% interval is a paired bootstrap over prompts. Greedy outputs are compared token for token.
Per γ, a per-cycle breakdown of both: milliseconds in target forwards, draft forwards and the rest (the same
forward hooks on both methods); and each method at its own best γ against the other's.

    python bench/vs_hf.py --workload en --prompts 16 --max-new-tokens 48 --gammas 1 2 3 4 6 8

Writes bench/results/vs_hf-<host>-<date>.json and prints the ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import socket
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from harness.tasks import schemas
from spectune import hardware as hw
from spectune.engine import Engine, Request
from spectune.engine.features import reads_features
from spectune.engine.policy import FixedGamma
from spectune.io import write_json
from spectune.models.loading import load_pair
from spectune.run.metadata import base_metadata
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from workloads.loader import load_workload

CONF = Path(__file__).resolve().parent.parent / "conf"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_hf(model, ids: list[int], max_new: int, device: torch.device, **kwargs) -> tuple[float, list[int]]:
    """One prompt through ``generate`` (greedy, exactly ``max_new`` tokens): (seconds, output ids)."""
    inputs = torch.tensor([ids], device=device)
    _sync(device)
    start = time.perf_counter()
    out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new,
                         min_new_tokens=max_new, do_sample=False, **kwargs)
    _sync(device)
    return time.perf_counter() - start, out[0, len(ids):].tolist()


class TimedCalls:
    """Counts a model's forward calls and the seconds inside them (host clock; the bench runs on CPU, where a
    forward is synchronous). The same hooks sit on both methods, so their breakdowns compare."""

    def __init__(self, model) -> None:
        self.calls, self.seconds, self._start = 0, 0.0, 0.0
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)

    def _pre(self, *_) -> None:
        self._start = time.perf_counter()

    def _post(self, *_) -> None:
        self.calls += 1
        self.seconds += time.perf_counter() - self._start

    def reset(self) -> None:
        self.calls, self.seconds = 0, 0.0


def set_assistant(draft, gamma: int) -> None:
    config = draft.generation_config
    config.num_assistant_tokens = gamma
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0


def time_spectune(engine: Engine, index: int, ids: list[int], max_new: int, gamma: int) -> tuple[float, list[int]]:
    """One prompt through the engine at ``gamma`` (0: autoregressive): (seconds, output ids)."""
    request = Request(index, str(index), "-", ids, max_new)
    start = engine.clock.now()
    result = engine.run([request], FixedGamma(gamma) if gamma else None, 1)
    return engine.clock.now() - start, result.requests[0].output_ids


def ratio_ci(numerator: list[float], denominator: list[float], resamples: int = 2000, seed: int = 0
             ) -> tuple[float, float, float]:
    """Σ numerator / Σ denominator over prompts, with a paired percentile-bootstrap 95% interval over prompts."""
    a, b = np.asarray(numerator), np.asarray(denominator)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(a), (resamples, len(a)))
    boot = a[draws].sum(1) / b[draws].sum(1)
    return float(a.sum() / b.sum()), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def breakdown(total_s: float, calls: list, prompts: int) -> dict[str, float]:
    """Milliseconds per cycle (one target forward after the prefill) in target forwards, draft forwards and the
    rest (sampling, acceptance, bookkeeping, Python); prefill forwards included in the model columns. ``calls``:
    [target calls, draft calls, target seconds, draft seconds] summed over the prompts."""
    target_calls, draft_calls, target_s, draft_s = calls
    cycles = max(1, target_calls - prompts)
    return {"cycles": cycles, "target_ms": 1e3 * target_s / cycles, "draft_ms": 1e3 * draft_s / cycles,
            "rest_ms": 1e3 * (total_s - target_s - draft_s) / cycles, "draft_forwards_per_cycle": draft_calls / cycles}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="en")
    parser.add_argument("--models", default="tiny")
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="hardware.threads (default: the hardware's)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()

    schemas.register()  # conf/'s schemas, as the entry module registers them
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+workload={args.workload}", f"models={args.models}",
                                           f"hardware={args.hardware}", f"workload.num_prompts={args.prompts}",
                                           *([f"hardware.threads={args.threads}"] if args.threads else [])])
    device = hw.setup(cfg.hardware)
    pair = load_pair(cfg.models, cfg.hardware)
    if reads_features(pair.draft):
        raise SystemExit(f"error: --models {args.models} has a draft that reads the target's features; transformers' "
                         "assisted generation takes a standalone assistant only: compare with models=smollm2")
    workload = load_workload(cfg.workload, pair.tokenizer)
    prompts = [p.input_ids for p in workload.prompts]
    warm = prompts[: args.warmup]
    # No EOS stop on either side: every method generates exactly max_new_tokens, so times compare.
    engine = Engine(pair.target, pair.draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    vocab_size=pair.vocab_size,
                    device=device, eos_token_ids=[], seed=0)
    hf_common = {"pad_token_id": pair.tokenizer.pad_token_id or 0, "eos_token_id": None}
    target_calls, draft_calls = TimedCalls(pair.target), TimedCalls(pair.draft)

    def paired(gamma: int) -> dict:
        """Both methods on every prompt, alternating which goes first (drift hits both), after warm-up."""
        assisted = dict(hf_common, assistant_model=pair.draft) if gamma else hf_common
        if gamma:
            set_assistant(pair.draft, gamma)
        for i, ids in enumerate(warm):
            time_hf(pair.target, ids, args.max_new_tokens, device, **assisted)
            time_spectune(engine, -1 - i, ids, args.max_new_tokens, gamma)
        out = {"hf_s": [], "sp_s": [], "hf_out": [], "sp_out": [], "hf_calls": [0, 0, 0.0, 0.0],
               "sp_calls": [0, 0, 0.0, 0.0]}
        for i, ids in enumerate(prompts):
            for method in (("hf", "sp") if i % 2 == 0 else ("sp", "hf")):
                target_calls.reset()
                draft_calls.reset()
                if method == "hf":
                    seconds, ids_out = time_hf(pair.target, ids, args.max_new_tokens, device, **assisted)
                else:
                    seconds, ids_out = time_spectune(engine, i, ids, args.max_new_tokens, gamma)
                out[f"{method}_s"].append(seconds)
                out[f"{method}_out"].append(ids_out)
                calls = out[f"{method}_calls"]
                calls[0] += target_calls.calls
                calls[1] += draft_calls.calls
                calls[2] += target_calls.seconds
                calls[3] += draft_calls.seconds
        return out

    def cycle_breakdown(run: dict, method: str) -> dict[str, float]:
        return breakdown(sum(run[f"{method}_s"]), run[f"{method}_calls"], len(prompts))

    rows, runs = [], {}
    ar = runs[0] = paired(0)
    reference = ar["hf_out"]
    tokens = sum(len(o) for o in reference)
    ratio, lo, hi = ratio_ci(ar["hf_s"], ar["sp_s"])
    rows.append({"gamma": 0, "hf_generate_tok_s": tokens / sum(ar["hf_s"]), "spectune_tok_s": tokens / sum(ar["sp_s"]),
                 "spectune_over_hf": ratio, "ci95_lo": lo, "ci95_hi": hi, "outputs_match": ar["sp_out"] == reference})
    print(f"AR:  spectune {rows[0]['spectune_tok_s']:8.1f} tok/s   HF generate {rows[0]['hf_generate_tok_s']:8.1f} "
          f"tok/s   ratio {ratio:5.3f}x [{lo:.3f}, {hi:.3f}]   equal: {rows[0]['outputs_match']}", flush=True)
    for gamma in args.gammas:
        run = runs[gamma] = paired(gamma)
        ratio, lo, hi = ratio_ci(run["hf_s"], run["sp_s"])
        hf_s, sp_s = sum(run["hf_s"]), sum(run["sp_s"])
        rows.append({"gamma": gamma, "hf_assisted_tok_s": tokens / hf_s, "spectune_tok_s": tokens / sp_s,
                     "spectune_over_hf": ratio, "ci95_lo": lo, "ci95_hi": hi,
                     "speedup_vs_hf_generate": sum(ar["hf_s"]) / sp_s,
                     "outputs_match": run["sp_out"] == reference and run["hf_out"] == reference,
                     "per_cycle": {"spectune": cycle_breakdown(run, "sp"), "hf_assisted": cycle_breakdown(run, "hf")}})
        b_sp, b_hf = rows[-1]["per_cycle"]["spectune"], rows[-1]["per_cycle"]["hf_assisted"]
        print(f"γ={gamma}: spectune {tokens / sp_s:8.1f} tok/s   HF assisted {tokens / hf_s:8.1f} tok/s   "
              f"ratio {ratio:5.3f}x [{lo:.3f}, {hi:.3f}]   vs plain generate {sum(ar['hf_s']) / sp_s:5.2f}x   "
              f"greedy outputs equal: {rows[-1]['outputs_match']}\n"
              f"      per cycle (ms): spectune target {b_sp['target_ms']:.2f} draft {b_sp['draft_ms']:.2f} rest "
              f"{b_sp['rest_ms']:.2f} ({b_sp['cycles']} cycles)   HF target {b_hf['target_ms']:.2f} draft "
              f"{b_hf['draft_ms']:.2f} rest {b_hf['rest_ms']:.2f} ({b_hf['cycles']} cycles, "
              f"{b_hf['draft_forwards_per_cycle']:.2f} drafts/cycle)", flush=True)
    best_hf = max(args.gammas, key=lambda g: -sum(runs[g]["hf_s"]))
    best_sp = max(args.gammas, key=lambda g: -sum(runs[g]["sp_s"]))
    ratio, lo, hi = ratio_ci(runs[best_hf]["hf_s"], runs[best_sp]["sp_s"])
    best = {"hf_best_gamma": best_hf, "spectune_best_gamma": best_sp, "spectune_over_hf": ratio, "ci95_lo": lo,
            "ci95_hi": hi}
    print(f"each at its own best γ: spectune γ={best_sp} over HF assisted γ={best_hf}: {ratio:5.3f}x "
          f"[{lo:.3f}, {hi:.3f}]")

    host = socket.gethostname()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M")
    out = Path(args.out) / f"vs_hf-{args.hardware}-{stamp}.json"
    write_json(out, {**base_metadata(), "command": "python bench/vs_hf.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items() if k != "out"),
        "machine": {"host": host, "cpu": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads()},
        "models": pair.metadata, "workload": workload.describe(), "generated_tokens": tokens, "rows": rows,
        "best_vs_best": best, "statistics": "ratio of summed per-prompt times; 95% CI: paired percentile bootstrap "
        "over prompts (2000 resamples, seed 0); the two methods alternate which runs first on each prompt"})
    print(f"written: {out}")


if __name__ == "__main__":
    main()
