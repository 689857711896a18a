"""GPU check of the engine's execution paths against the raw compiled forward step.

Llama-shaped models with random weights (timing does not depend on weight values): a target and a
draft sharing its vocabulary. For each path (`cuda` eager HF DynamicCache; `cuda-compiled` static
per-slot KV + torch.compile reduce-overhead) it runs the AR baseline and one γ through the Engine at
batch 1 and reports ms per output token (TPOT, median over requests). The reference is the raw step:
the target's forward on one token with HF's StaticCache under the same torch.compile mode, median of
CUDA-event timings after warm-up — the method of shared/design/h200-measurements.md.

Goal: compiled AR ms/token <= 1.15 x raw compiled forward.

Runs without hydra (the GPU image has none):
    PYTHONUNBUFFERED=1 python bench/gpu_check.py --out "$OUT"
Tested on CPU with tiny shapes:  python bench/gpu_check.py --device cpu --size tiny --compile-mode default
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from spectune.engine import Engine, Request
from spectune.engine.kv import model_kwargs
from spectune.engine.policy import FixedGamma
from spectune.hardware import ExecutionPath
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab
    "llama3-1b": (2048, 16, 32, 8, 8192, 128256),
    "llama-160m": (768, 12, 12, 12, 3072, 128256),
    "tiny-target": (128, 2, 4, 2, 256, 512),
    "tiny-draft": (64, 1, 4, 2, 128, 512),
}
SIZES = {"real": ("llama3-1b", "llama-160m"), "tiny": ("tiny-target", "tiny-draft")}


def build(shape: str, device: torch.device, dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    hidden, layers, heads, kv_heads, inter, vocab = SHAPES[shape]
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=inter, vocab_size=vocab,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def timed(fn, device: torch.device, repeats: int, warmup: int = 3) -> list[float]:
    """ms per call: CUDA events on a GPU, perf_counter after the work on a CPU."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


@torch.inference_mode()
def raw_step_ms(model, device: torch.device, context: int, mode: str | None, repeats: int) -> dict:
    """The target's one-token forward over ``context`` cached tokens, HF StaticCache, compiled as asked."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=context + 64)
    prompt = torch.randint(0, model.config.vocab_size, (1, context), device=device)
    model(input_ids=prompt, **model_kwargs(model, cache, 0, context, True, device))
    forward = torch.compile(model.forward, mode=mode, dynamic=False) if mode else model.forward
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    position = torch.tensor([[context]], device=device)

    def step():  # rewrites the same column each time: the cost of one decode step at this context
        kwargs = model_kwargs(model, cache, context, 1, True, device)
        if "cache_position" not in kwargs and hasattr(cache.layers[0], "cumulative_length"):
            for layer in cache.layers:  # transformers >= 5.24 tracks the write position itself
                layer.cumulative_length.fill_(context)
        forward(input_ids=token, position_ids=position, **kwargs)

    start = time.perf_counter()
    step()
    compile_s = time.perf_counter() - start
    times = timed(step, device, repeats)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "first_call_s": compile_s,
            "method": f"HF StaticCache, torch.compile(mode={mode!r}), median of {repeats} after 3 warm-ups"}


def run_engine(target, draft, device, path: ExecutionPath, gamma: int, prompt_len: int, new_tokens: int,
               requests: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    reqs = [Request(i, str(i), "-", torch.randint(0, vocab, (prompt_len,), generator=gen).tolist(), new_tokens)
            for i in range(requests)]
    engine = Engine(target, draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device=device, eos_token_ids=[], seed=seed, path=path)
    policy = FixedGamma(gamma) if gamma else None
    start = time.perf_counter()
    engine.run(reqs[:1], policy, 1)  # warm-up: compiles every shape of this grid point
    engine.run(reqs[:1], policy, 1)
    warm_s = time.perf_counter() - start
    result = engine.run(reqs, policy, 1)
    tpots = [(r.finish_s - r.first_token_s) / (len(r.output_ids) - 1) * 1e3 for r in result.requests]
    spec = [c for c in result.cycles if c.num_drafts]
    return {
        "gamma": gamma, "tpot_ms_median": statistics.median(tpots), "tpot_ms_all": tpots,
        "tokens_per_s": sum(len(r.output_ids) for r in result.requests) / result.wall_s,
        "acceptance_length": 1 + sum(c.accepted for c in spec) / len(spec) if spec else None,
        "cycle_ms_median": statistics.median((c.draft_s + c.verify_s + c.rest_s) * 1e3 for c in result.cycles),
        "draft_ms_median": statistics.median(c.draft_s * 1e3 for c in spec) if spec else None,
        "verify_ms_median": statistics.median(c.verify_s * 1e3 for c in result.cycles),
        "warmup_s": warm_s, "memory": result.memory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default="real")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compile-mode", default="reduce-overhead")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--paths", nargs="+", default=["eager", "compiled"])
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target_shape, draft_shape = SIZES[args.size]
    target, draft = build(target_shape, device, dtype, 1), build(draft_shape, device, dtype, 2)
    max_len = args.prompt_len + args.new_tokens + args.gamma + 16
    paths = {"eager": ExecutionPath(),
             "compiled": ExecutionPath(static=True, max_cache_len=max_len, compile_mode=args.compile_mode)}
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "python": platform.python_version(), "dtype": args.dtype, "target": target_shape, "draft": draft_shape,
              "args": vars(args), "weights": "random init (timing does not depend on values)", "rows": []}
    report["raw_compiled_step"] = raw_step_ms(target, device, args.prompt_len, args.compile_mode, 50)
    report["raw_eager_step"] = raw_step_ms(target, device, args.prompt_len, None, 50)
    report["raw_draft_compiled_step"] = raw_step_ms(draft, device, args.prompt_len, args.compile_mode, 50)
    print(f"raw compiled target step {report['raw_compiled_step']['median_ms']:.3f} ms, eager "
          f"{report['raw_eager_step']['median_ms']:.3f} ms, compiled draft "
          f"{report['raw_draft_compiled_step']['median_ms']:.3f} ms", flush=True)
    for name in args.paths:
        for gamma in (0, args.gamma):
            try:
                row = run_engine(target, draft, device, paths[name], gamma, args.prompt_len, args.new_tokens,
                                 args.requests, seed=0)
            except Exception as err:  # report and go on: one failed path must not lose the others
                row = {"gamma": gamma, "error": f"{type(err).__name__}: {err}"}
            row["path"] = name
            report["rows"].append(row)
            if "error" in row:
                print(f"{name:9s} γ={gamma}: FAILED {row['error']}", flush=True)
                continue
            ratio = row["tpot_ms_median"] / report["raw_compiled_step"]["median_ms"]
            print(f"{name:9s} γ={gamma}: {row['tpot_ms_median']:.3f} ms/token ({ratio:.2f}x raw compiled step), "
                  f"{row['tokens_per_s']:.1f} tok/s, acceptance length {row['acceptance_length']}, "
                  f"warm-up {row['warmup_s']:.1f} s", flush=True)
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    ar = next((r for r in report["rows"] if r["path"] == "compiled" and r["gamma"] == 0 and "error" not in r), None)
    if ar:
        ratio = ar["tpot_ms_median"] / report["raw_compiled_step"]["median_ms"]
        report["goal"] = {"compiled_ar_over_raw": ratio, "goal": 1.15, "met": ratio <= 1.15}
        print(f"goal: compiled AR ms/token / raw compiled step = {ratio:.3f} (goal <= 1.15): "
              f"{'MET' if ratio <= 1.15 else 'NOT MET'}")
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
