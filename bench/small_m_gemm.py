"""What a verification of n positions costs in matrix products: a target's linear layers at M = 1..N rows.

Speculation pays only if the target's forward over γ + 1 positions costs little more than over one. On a GPU the
forward is memory-bound and it does; on a CPU the BLAS behind ``F.linear`` takes a matrix-vector path at M = 1
and a packed matrix-matrix path at M ≥ 2, and on some CPUs the second costs several times the first for the same
weights (measured: the 576 × 49,152 LM head of SmolLM2-135M on a 2-vCPU AMD EPYC VM). This script times each of
the target's weight shapes (from its config) at M = 1..N, median of ``--reps`` calls, with ``F.linear`` and with
oneDNN on a pre-packed weight (``torch.utils.mkldnn``'s path) side by side in one run, and prints each time
over its own M = 1 time, so a reader sees where a verification's cost comes from before reading a γ grid.

    python bench/small_m_gemm.py --models smollm2 --threads 1 --json bench/results/small-m-gemm-cpu-DATE.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import torch
from gpu_check import timed  # a sibling script (run as python bench/small_m_gemm.py)
from omegaconf import OmegaConf

from spectune.io import write_text
from spectune.run.metadata import base_metadata

log = logging.getLogger("bench.small_m_gemm")
ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def target_shapes(models: str) -> dict[str, tuple[int, int]]:
    """(in, out) of the target's linear layers, read from its config (no weights loaded)."""
    from transformers import AutoConfig

    from spectune.engine.static_kv import kv_shape
    from spectune.models import gguf
    from spectune.models.loading import resolve

    name = str(OmegaConf.load(ROOT / "conf" / "models" / f"{models}.yaml").target.name_or_path)
    cfg = AutoConfig.from_pretrained(gguf.materialise(name)[0] if gguf.is_gguf(name) else resolve(name)[0])
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    kv_heads, head_dim = kv_shape(cfg)  # the KV cache's own reading of the config (head_dim may be None)
    kv = kv_heads * head_dim
    return {"q, o": (hidden, hidden), "k, v": (hidden, kv), "gate, up": (hidden, inter), "down": (inter, hidden),
            "lm head": (hidden, cfg.vocab_size)}


def packed_unavailable(dtype: torch.dtype) -> str | None:
    """Why oneDNN's packed linear cannot run in ``dtype`` on this CPU (its bfloat16 path needs AVX-512 or
    AVX-NE-CONVERT), or None when it runs."""
    w = torch.ones(4, 4, dtype=dtype).to_mkldnn()
    try:
        torch._C._nn.mkldnn_linear(torch.ones(1, 4, dtype=dtype).to_mkldnn(), w, None)
    except RuntimeError as error:
        return str(error).splitlines()[0]
    return None


def measure(shapes: dict[str, tuple[int, int]], rows: int, reps: int, seed: int,
            dtype: torch.dtype = torch.float32) -> list[dict]:
    """Median ms per call of each path at M = 1..rows; a path this CPU cannot run in ``dtype`` is left out (logged)."""
    torch.manual_seed(seed)
    out = []
    missing = packed_unavailable(dtype)
    if missing:
        log.warning(f"oneDNN packed path left out in {dtype}: {missing}")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for name, (fan_in, fan_out) in shapes.items():
        weight = (torch.randn(fan_out, fan_in) / fan_in**0.5).to(dtype)
        calls = {"F.linear": lambda x, w=weight: torch.nn.functional.linear(x, w)}
        if not missing:
            packed = weight.to_mkldnn()
            calls["oneDNN packed"] = lambda x, w=packed: torch._C._nn.mkldnn_linear(x.to_mkldnn(), w, None).to_dense()
        n_reps = max(5, reps // max(1, fan_out * fan_in // 2_000_000))  # fewer calls for the big head
        for kind, call in calls.items():
            for m in range(1, rows + 1):
                x = torch.randn(m, fan_in).to(dtype)
                # both paths must compute the same product, or the comparison means nothing
                torch.testing.assert_close(call(x), torch.nn.functional.linear(x, weight), rtol=tol, atol=tol)
                out.append({"layer": name, "shape": f"{fan_in}x{fan_out}", "dtype": str(dtype), "path": kind, "rows": m,
                            "ms": statistics.median(timed(lambda call=call, x=x: call(x), CPU, n_reps)),
                            "calls": n_reps})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2", help="a pair under conf/models: its target's shapes")
    parser.add_argument("--rows", type=int, default=9, help="M = 1..ROWS (a verification of γ + 1 positions)")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16 (weights and inputs)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for flag in ("rows", "reps", "threads"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag}={getattr(args, flag)} is invalid: an integer >= 1")
    if not (ROOT / "conf" / "models" / f"{args.models}.yaml").is_file():
        raise SystemExit(f"error: --models={args.models!r} is invalid: no conf/models/{args.models}.yaml")
    if args.dtype not in ("float32", "bfloat16"):
        raise SystemExit(f"error: --dtype={args.dtype!r} is invalid: float32 or bfloat16")
    torch.set_num_threads(args.threads)
    results = measure(target_shapes(args.models), args.rows, args.reps, args.seed, getattr(torch, args.dtype))
    base = {(r["layer"], r["path"]): r["ms"] for r in results if r["rows"] == 1}
    lines = [f"{args.models} target's layers, {args.dtype}, torch threads {args.threads}; median ms per call, "
             "then ×(M = 1)"]
    for (layer, path), one in base.items():
        row = [r for r in results if r["layer"] == layer and r["path"] == path]
        lines.append(f"{layer:9s} {path:14s} " + " ".join(f"{r['ms']:7.3f}" for r in row))
        lines.append(f"{'':9s} {'':14s} " + " ".join(f"{r['ms'] / one:7.2f}" for r in row))
    log.info("\n".join(lines))
    if args.json:
        meta = {**base_metadata(), "command": "python bench/small_m_gemm.py " + " ".join(sys.argv[1:]),
                "threads": args.threads, "dtype": args.dtype}
        write_text(args.json, json.dumps({"metadata": meta, "results": results}, indent=2, default=str) + "\n")
        log.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
