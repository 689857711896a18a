"""Rebuild the shipped H200 profiles from the compiled rows of an H200 step-cost measurement.

``python -m spectune.costmodel.profiles.build /path/to/h200-compiled-step-costs.json`` writes
``spectune/costmodel/profiles/h200-llama3-8b-1b.json`` and ``h200-llama3-8b-160m.json``.

What was measured (one H200, torch 2.11, transformers 5.17, bf16, random weights of the real shapes,
StaticCache + torch.compile reduce-overhead, context 256, median of 20 CUDA-event timings): the 8B target
at n = 1 and 8 positions for batch 1 and 32, the 1B and 160M drafts at batch 1. Everything else is built,
and flagged: verification is linear in n through the two measured points (extrapolated past n = 8);
batch sizes between 1 and 32 are interpolated linearly in b; the drafts at batch > 1 are scaled by the
target's own batch-1 → batch-b ratio (an assumption: not measured); the engine overhead is 0 (not measured).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from spectune.costmodel.profile import Profile
from spectune.io import write_json

BATCHES = [1, 2, 4, 8, 16, 32]
MAX_POSITIONS = 13  # max_gamma 12
DRAFTS = {"1b": ("llama3-1b", "meta-llama/Llama-3.2-1B-Instruct"), "160m": ("llama-160m", "JackFram/llama-160m")}


def _ms(rows: list[dict], model: str, batch: int, n: int) -> float | None:
    hits = [r["compiled_ms"] for r in rows if r["model"] == model and r.get("batch", 1) == batch and r["n"] == n]
    return hits[0] if hits else None


def build(data: dict, draft: str) -> Profile:
    rows = data["rows"]
    draft_model, draft_name = DRAFTS[draft]
    measured = {b: (_ms(rows, "llama3-8b", b, 1), _ms(rows, "llama3-8b", b, 8)) for b in (1, 32)}
    base = {b: (one, (eight - one) / 7) for b, (one, eight) in measured.items()}  # ms at n = 1, ms per extra position

    def target(b: int) -> tuple[float, float]:
        w = (b - 1) / 31
        return tuple((1 - w) * base[1][i] + w * base[32][i] for i in range(2))

    d1 = _ms(rows, draft_model, 1, 1)
    t_verify, t_draft = {}, {}
    for b in BATCHES:
        a, slope = target(b)
        t_verify[b] = [(a + slope * (n - 1)) / 1e3 for n in range(1, MAX_POSITIONS + 1)]
        t_draft[b] = d1 * (a / base[1][0]) / 1e3
    meta = data.get("meta", {})
    notes = [
        f"measured on one NVIDIA H200 ({meta.get('torch')}, transformers {meta.get('transformers')}, "
        f"{meta.get('dtype')}, random weights of the real shapes): {meta.get('method')}",
        "t_verify linear in n through the measured n = 1 and n = 8 (extrapolated past n = 8)",
        "batch sizes 2-16 interpolated linearly in b between the measured batch 1 and batch 32 (flagged)",
        f"draft ({draft_model}) measured at batch 1 only; at batch b it is scaled by the target's t(b)/t(1) "
        "(assumption, flagged)",
        "overhead_s = 0: the engine's per-cycle overhead was not measured on this machine",
    ]
    fit = {"t_verify_s ~ a + b*n": {str(b): {"a": t_verify[b][0] - (t_verify[b][1] - t_verify[b][0]),
                                            "b": t_verify[b][1] - t_verify[b][0], "max_rel_residual": 0.0}
                                   for b in BATCHES}}
    return Profile(
        label=f"h200-llama3-8b-{draft}", batch_sizes=BATCHES, max_positions=MAX_POSITIONS, t_draft_s=t_draft,
        t_verify_s=t_verify, overhead_s={b: 0.0 for b in BATCHES}, synthetic=False, notes=notes,
        models={"name": f"llama3-8b-{draft}",
                "target": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "revision": None, "weights": "random"},
                "draft": {"name_or_path": draft_name, "revision": None, "weights": "random"}},
        hardware={"setup": "cuda-compiled", "device": "cuda", "device_name": "NVIDIA H200", "dtype": "bfloat16",
                  "execution_path": "compiled"},
        interpolated={b: b != 1 for b in BATCHES},  # 2-16 interpolated; at 32 the draft is scaled, not measured
        fit=fit, metadata={"source": "h200-compiled-step-costs.json", "meta": meta})


def main(argv: list[str]) -> int:
    source = Path(argv[0] if argv else "../shared/data/h200-compiled-step-costs.json")
    data = json.loads(source.read_text(encoding="utf-8"))
    for draft in DRAFTS:
        profile = build(data, draft)
        path = write_json(Path(__file__).parent / f"{profile.label}.json", profile.to_json())
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
