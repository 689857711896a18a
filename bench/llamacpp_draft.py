"""Does the draft's GGUF (spectune.models.draft_gguf) compute what the draft computes? Top-1 agreement, position by
position, between the Hugging Face draft (reduced vocabulary, spectune's loader) and its full-vocabulary GGUF served
alone by llama-server, on real prompts continued by the target; and the softmax mass the ids outside the draft's
vocabulary take in llama.cpp (its top-10 probabilities over the full vocabulary, per position).

    python -m spectune.engines.llamacpp_build --draft      # once: llama.cpp and the draft's GGUF
    python bench/llamacpp_draft.py --workload en --prompts 12 --continuation 32

Contexts: each prompt (chat template applied, as every task feeds it) followed by the target's greedy continuation;
every position from the prompt's last token on is one comparison (the draft predicts the next token). The Hugging
Face side runs in float32 (the draft's bfloat16 weights upcast); the GGUF holds the same values in F32.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from harness.tasks import schemas
from spectune.engines import llamacpp_build as build
from spectune.models import gguf
from spectune.models.loading import load_pair, resolve
from workloads.loader import load_workload

CONF = Path(__file__).resolve().parents[1] / "conf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


def start_server(model: Path, port: int, log: Path) -> subprocess.Popen:
    server = build.server_binary()
    proc = subprocess.Popen([str(server), "-m", str(model), "--port", str(port), "--host", "127.0.0.1", "-np", "1",
                             "--poll", "0", "-t", "1", "--no-webui"], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    raise SystemExit(f"error: llama-server did not become ready; see {log}")


def next_token_top10(port: int, context: list[int]) -> list[tuple[int, float]]:
    """llama.cpp's greedy next token after ``context`` and its top-10 (id, probability over the full vocabulary)."""
    out = post(port, {"prompt": context, "n_predict": 1, "cache_prompt": True, "samplers": ["top_k"], "top_k": 1,
                      "n_probs": 10, "return_tokens": True})
    top = [(int(p["id"]), math.exp(p["logprob"])) for p in out["completion_probabilities"][0]["top_logprobs"]]
    assert out["tokens"][0] == top[0][0], "the greedy token is not the top-probability one"
    return top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="en")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--continuation", type=int, default=32)
    parser.add_argument("--out", default=None, help="write the summary as JSON here")
    args = parser.parse_args()

    schemas.register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+workload={args.workload}", "models=smollm2", "hardware=cpu",
                                           f"workload.num_prompts={args.prompts}"])
    target_gguf = gguf.locate(str(cfg.models.target.name_or_path))
    draft_dir = Path(resolve(str(cfg.models.draft.name_or_path))[0])
    exported = build.draft_gguf(draft_dir, target_gguf)
    pair = load_pair(cfg.models, cfg.hardware)
    workload = load_workload(cfg.workload, pair.tokenizer)
    head = pair.draft.lm_head  # draft_vocab.ScatterHead
    mapped = torch.zeros(head.full_vocab_size, dtype=torch.bool)
    mapped[head.draft_to_target.cpu()] = True

    port, log = free_port(), Path(f"/tmp/llamacpp_draft_{os.getpid()}.log")
    proc = start_server(exported, port, log)
    rows = []
    try:
        for prompt in workload.prompts:
            ids = torch.tensor([prompt.input_ids])
            with torch.no_grad():
                cont = pair.target.generate(ids, max_new_tokens=args.continuation, do_sample=False)[0].tolist()
                logits = pair.draft(torch.tensor([cont])).logits[0].float()
            for pos in range(len(prompt.input_ids) - 1, len(cont) - 1):
                hf = logits[pos]
                hf_top = int(hf.argmax())
                hf_p = torch.softmax(hf, -1)
                top = next_token_top10(port, cont[: pos + 1])
                rows.append({"prompt": prompt.id, "pos": pos, "hf": hf_top, "cpp": top[0][0],
                             "hf_margin": float(hf.topk(2).values.diff().abs()),
                             "hf_unmapped_mass": float(hf_p[~mapped].sum()),
                             "cpp_unmapped_in_top10": sum(1 for t, _ in top if not mapped[t]),
                             "cpp_unmapped_top10_mass": sum(p for t, p in top if not mapped[t]),
                             "cpp_top1_unmapped": not bool(mapped[top[0][0]])})
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    agree = sum(r["hf"] == r["cpp"] for r in rows)
    summary = {"gguf": str(exported), "workload": args.workload, "prompts": len(workload.prompts),
               "positions": len(rows), "top1_agreement": agree / len(rows),
               "disagreements": [r for r in rows if r["hf"] != r["cpp"]],
               "hf_unmapped_mass_max": max(r["hf_unmapped_mass"] for r in rows),
               "cpp_positions_with_unmapped_in_top10": sum(r["cpp_unmapped_in_top10"] > 0 for r in rows),
               "cpp_unmapped_top10_mass_max": max(r["cpp_unmapped_top10_mass"] for r in rows),
               "cpp_top1_unmapped": sum(r["cpp_top1_unmapped"] for r in rows)}
    text = json.dumps(summary, indent=2)
    sys.stdout.write(text + "\n")
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
