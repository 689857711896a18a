"""spectune's engine vs transformers' assisted generation vs plain `generate`, side by side in one run.

Same models, same prompts, greedy decoding, batch 1, same γ (HF: num_assistant_tokens=γ, schedule
"constant", assistant_confidence_threshold=0 so HF drafts exactly γ like we do). transformers 5.x reads
these from the *assistant's* generation_config and silently ignores them as generate() arguments (it then
drafts with its defaults: γ = 20 cut by a 0.4 confidence stop), so they are set there; forward hooks count
both models' calls to prove the γ really used. Each method is warmed
up, then every prompt is timed on its own (wall clock; on CUDA after synchronize). Throughput is
generated tokens (target tokenizer ids) / summed time. Greedy outputs are compared token for token.

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

import torch
from hydra import compose, initialize_config_dir

from harness import hardware as hw
from harness.engine import Engine, Request
from harness.engine.policy import FixedGamma
from harness.io import write_json
from harness.metadata import base_metadata
from harness.models.loading import load_pair
from harness.sampling import SamplingParams
from harness.sampling.rejection import get_sampler
from workloads.loader import load_workload

CONF = Path(__file__).resolve().parent.parent / "conf"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_hf(model, prompts: list[list[int]], max_new: int, device: torch.device, **kwargs) -> tuple[float, list]:
    total, outputs = 0.0, []
    for ids in prompts:
        inputs = torch.tensor([ids], device=device)
        _sync(device)
        start = time.perf_counter()
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new,
                             min_new_tokens=max_new, do_sample=False, **kwargs)
        _sync(device)
        total += time.perf_counter() - start
        outputs.append(out[0, len(ids):].tolist())
    return total, outputs


class CallCounter:
    """Counts forward calls of a model (HF assisted generation: drafts per target call)."""

    def __init__(self, model) -> None:
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *_) -> None:
        self.calls += 1


def set_assistant(draft, gamma: int) -> None:
    config = draft.generation_config
    config.num_assistant_tokens = gamma
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0


def time_spectune(engine: Engine, prompts: list[list[int]], max_new: int, gamma: int) -> tuple[float, list]:
    total, outputs = 0.0, []
    for i, ids in enumerate(prompts):
        request = Request(i, str(i), "-", ids, max_new)
        policy = FixedGamma(gamma) if gamma else None
        start = engine.clock.now()
        result = engine.run([request], policy, 1)
        total += engine.clock.now() - start
        outputs.append(result.requests[0].output_ids)
    return total, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="en")
    parser.add_argument("--models", default="tiny")
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+workload={args.workload}", f"models={args.models}",
                                           f"hardware={args.hardware}", f"workload.num_prompts={args.prompts}"])
    device = hw.setup(cfg.hardware)
    pair = load_pair(cfg.models, cfg.hardware)
    workload = load_workload(cfg.workload, pair.tokenizer)
    prompts = [p.input_ids for p in workload.prompts]
    warm = prompts[: args.warmup]
    # No EOS stop on either side: every method generates exactly max_new_tokens, so times compare.
    engine = Engine(pair.target, pair.draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    vocab_size=pair.vocab_size,
                    device=device, eos_token_ids=[], seed=0)
    hf_common = {"pad_token_id": pair.tokenizer.pad_token_id or 0, "eos_token_id": None}
    target_calls, draft_calls = CallCounter(pair.target), CallCounter(pair.draft)

    rows = []
    time_hf(pair.target, warm, args.max_new_tokens, device, **hf_common)
    hf_plain_s, reference = time_hf(pair.target, prompts, args.max_new_tokens, device, **hf_common)
    time_spectune(engine, warm, args.max_new_tokens, 0)
    ar_s, ar_out = time_spectune(engine, prompts, args.max_new_tokens, 0)
    tokens = sum(len(o) for o in reference)
    rows.append({"gamma": 0, "hf_generate_tok_s": tokens / hf_plain_s, "spectune_tok_s": tokens / ar_s,
                 "spectune_over_hf": hf_plain_s / ar_s, "outputs_match": ar_out == reference})
    for gamma in args.gammas:
        set_assistant(pair.draft, gamma)
        assisted = dict(hf_common, assistant_model=pair.draft)
        time_hf(pair.target, warm, args.max_new_tokens, device, **assisted)
        target_calls.calls = draft_calls.calls = 0
        hf_s, hf_out = time_hf(pair.target, prompts, args.max_new_tokens, device, **assisted)
        hf_drafts_per_cycle = draft_calls.calls / max(1, target_calls.calls - len(prompts))  # minus prefills
        time_spectune(engine, warm, args.max_new_tokens, gamma)
        sp_s, sp_out = time_spectune(engine, prompts, args.max_new_tokens, gamma)
        rows.append({"gamma": gamma, "hf_assisted_tok_s": tokens / hf_s, "spectune_tok_s": tokens / sp_s,
                     "spectune_over_hf": hf_s / sp_s, "speedup_vs_hf_generate": hf_plain_s / sp_s,
                     "outputs_match": sp_out == reference and hf_out == reference,
                     "hf_draft_forwards_per_target_forward": hf_drafts_per_cycle})
        print(f"γ={gamma}: spectune {tokens / sp_s:8.1f} tok/s   HF assisted {tokens / hf_s:8.1f} tok/s   "
              f"ratio {hf_s / sp_s:5.2f}x   vs plain generate {hf_plain_s / sp_s:5.2f}x   "
              f"greedy outputs equal: {rows[-1]['outputs_match']}   HF drafts/cycle {hf_drafts_per_cycle:.2f}",
              flush=True)
    ar = rows[0]
    print(f"AR:  spectune {ar['spectune_tok_s']:8.1f} tok/s   HF generate {ar['hf_generate_tok_s']:8.1f} tok/s"
          f"   ratio {rows[0]['spectune_over_hf']:5.2f}x   equal: {rows[0]['outputs_match']}")

    host = socket.gethostname()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M")
    out = Path(args.out) / f"vs_hf-{args.hardware}-{stamp}.json"
    write_json(out, {**base_metadata(), "command": "python bench/vs_hf.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items() if k != "out"),
        "machine": {"host": host, "cpu": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads()},
        "models": pair.metadata, "workload": workload.describe(), "generated_tokens": tokens, "rows": rows})
    print(f"written: {out}")


if __name__ == "__main__":
    main()
