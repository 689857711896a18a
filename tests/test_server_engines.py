"""vLLM and SGLang as server engines: the commands, requests, stream events and /metrics pages of their flavours
(spectune/engines/vllm.py, sglang.py), against what those projects define.

The streams and /metrics pages are fixtures written from vLLM v0.34.0's and SGLang v0.5.23's source, and the option
lists come from their own argument parsers (tests/data/engines/README.md): no server runs here. A command with a
misspelled flag, a speculative-config key vLLM does not take, a γ that is not the one asked for, a malformed event
or a method an engine cannot run fails these tests. The engines (VllmEngine, SglangEngine) are checked as the
harness builds them: a bench run with engine=vllm|sglang where the server cannot start fails in one line before any
model loads.
"""

from __future__ import annotations

import json
import sys

import pytest

from spectune.engines.server import ServerFailure, StreamEvent
from spectune.engines.sglang import ALGORITHMS, SglangConfig, SglangEngine, SglangFlavour
from spectune.engines.vllm import METHODS, VllmConfig, VllmEngine, VllmFlavour
from spectune.errors import SpectuneError
from spectune.methods import AA, AR, Method
from spectune.sampling import SamplingParams
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "engines"
OUTPUT_IDS = [12366, 13, 578, 6864, 315, 9822, 374, 12366, 13, 128009]  # the fixtures' ten tokens
PER_EVENT = [1, 2, 4, 1, 2]  # tokens per event: prefill's token, then verification steps accepting 0, 2(+1), ...


@pytest.fixture(scope="module")
def composed():
    """conf/engine/<name>.yaml composed with the Llama pair and read through its schema, as the harness reads it."""
    from harness.tasks import schemas
    from spectune.config import typed
    from tests.conftest import compose_overrides

    schemas.register()

    def compose(engine: str, *overrides: str):
        cfg = compose_overrides(f"engine={engine}", "models=llama3-8b-1b", *overrides)
        return typed({"vllm": VllmConfig, "sglang": SglangConfig}[engine], cfg.engine, "engine")

    return compose


@pytest.fixture(scope="module")
def vllm(composed) -> VllmFlavour:
    return VllmFlavour(composed("vllm", "engine.drafts.eagle=org/eagle", "engine.drafts.eagle3=org/eagle3"))


@pytest.fixture(scope="module")
def sglang(composed) -> SglangFlavour:
    return SglangFlavour(composed("sglang", "engine.drafts.eagle=org/eagle", "engine.drafts.eagle3=org/eagle3"))


def sse(name: str) -> list[dict]:
    """The JSON events of a server-sent-event transcript, up to ``data: [DONE]``."""
    events = []
    for block in (DATA / name).read_text(encoding="utf-8").split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block.removeprefix("data: ")
        if payload == "[DONE]":
            return events
        events.append(json.loads(payload))
    raise AssertionError(f"{name} has no [DONE]")


def options(name: str) -> set[str]:
    return set((DATA / name).read_text(encoding="utf-8").split())


def flags(command: list[str]) -> list[str]:
    return [arg for arg in command if arg.startswith("-") and not arg.lstrip("-").replace(".", "").isdigit()]


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and message, message
    return message


# ---- vLLM ----------------------------------------------------------------------------------------------------

def test_the_composed_vllm_config_takes_the_pair_and_the_runs_seed(composed):
    cfg = composed("vllm", "seed=11")
    assert (cfg.model, cfg.drafts.draft_model, cfg.seed) == ("meta-llama/Llama-3.1-8B-Instruct",
                                                            "meta-llama/Llama-3.2-1B-Instruct", 11)


@pytest.mark.parametrize("method", [AR, AA, *(Method(name, 3) for name in METHODS)], ids=str)
def test_every_vllm_flag_and_speculative_key_is_one_vllm_0_34_defines(vllm, method):
    """Each command parsed as vLLM's own parser reads it: its flags are options of `vllm serve`, its
    --speculative-config keys fields of SpeculativeConfig (which forbids others)."""
    command = vllm.command(method, port=8123, threads=4, slots=16)
    assert command[:3] == ["vllm", "serve", vllm.config.model]
    given = set(flags(command[3:]))  # after `vllm serve MODEL`
    assert given <= options("vllm-serve-options.txt"), given - options("vllm-serve-options.txt")
    args = dict(zip(command[3::2], command[4::2], strict=False))
    assert (args["--port"], args["--max-num-seqs"], args["--seed"], args["--host"]) == ("8123", "16", "20260923",
                                                                                         "127.0.0.1")
    if not method.speculative:
        assert "--speculative-config" not in command and "--per-request-spec-decode-metrics" not in command
        return
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert set(spec) <= options("vllm-speculative-config-fields.txt")
    assert (spec["method"], spec["num_speculative_tokens"]) == (method.name, 3)
    assert command[command.index("--per-request-spec-decode-metrics") + 1] == "summary"


@pytest.mark.parametrize(("gamma", "low", "high"), [(1, 1, 1), (4, 1, 3), (7, 2, 5)])
def test_a_vllm_ngram_command_carries_the_configured_lookup_and_gamma(composed, gamma, low, high):
    flavour = VllmFlavour(composed("vllm", f"engine.ngram.prompt_lookup_min={low}",
                                   f"engine.ngram.prompt_lookup_max={high}"))
    command = flavour.command(Method("ngram", gamma), port=1, threads=1, slots=1)
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": gamma, "prompt_lookup_min": low,
                    "prompt_lookup_max": high}


def test_a_vllm_method_takes_the_engines_settings_whatever_the_policy_node_it_carries(vllm):
    """bench gives a server's method the policy's node as its settings (fixed γ): vLLM's config comes from the
    engine's settings alone."""
    spec = vllm.speculative_config(Method("draft_model", 2, {"name": "fixed"}))
    assert spec == {"method": "draft_model", "num_speculative_tokens": 2, "model": "meta-llama/Llama-3.2-1B-Instruct"}


@pytest.mark.parametrize(("method", "overrides", "words"), [
    (Method("medusa", 3), [], "method 'medusa' is not one engine=vllm runs: its speculative methods are ngram"),
    (Method("eagle3", 3), [], "method 'eagle3:gamma=3' needs engine.drafts.eagle3"),
    (Method("ngram", 3), ["engine.ngram.prompt_lookup_min=4"], "engine.ngram.prompt_lookup_min=4 and "
                                                              "prompt_lookup_max=3 are invalid"),
])
def test_a_method_vllm_cannot_run_fails_in_one_line_before_any_server(composed, method, overrides, words):
    flavour = VllmFlavour(composed("vllm", *overrides))
    with pytest.raises(SpectuneError) as err:
        flavour.check(method)
    assert words in one_line(err)
    with pytest.raises(SpectuneError):
        flavour.command(method, port=1, threads=1, slots=1)


@pytest.mark.parametrize(("overrides", "words"), [
    (["engine.method=lookahead"], "engine.method='lookahead' is invalid for engine=vllm: choose one of ngram"),
    (["engine.port=80"], "engine.port=80 is invalid: 1024..65535"),
    (["engine.dtype=fp8"], "engine.dtype='fp8' is invalid for engine=vllm"),
    (["engine.gpu_memory_utilization=1.5"], "engine.gpu_memory_utilization=1.5 is invalid"),
    (["engine.extra_args=['--port=9','--enforce-eager']"], "engine.extra_args=['--port=9'] sets flags spectune sets"),
])
def test_a_bad_vllm_setting_fails_in_one_line(composed, overrides, words):
    with pytest.raises(SpectuneError) as err:
        VllmFlavour(composed("vllm", *overrides))
    assert words in one_line(err)


def test_a_vllm_request_streams_token_ids_with_usage_and_the_sampling_law(vllm):
    path, body = vllm.request([1, 2, 3], 64, SamplingParams(temperature=0.7, top_k=0, top_p=0.9), seed=5)
    assert path == "/v1/completions" and json.loads(json.dumps(body)) == body
    assert body == {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": [1, 2, 3], "max_tokens": 64,
                    "temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 5, "ignore_eos": False, "stream": True,
                    "stream_options": {"include_usage": True}, "return_token_ids": True}
    fixed = vllm.request([1], 8, SamplingParams(), seed=0, ignore_eos=True)[1]  # workload.ignore_eos=true
    assert fixed["ignore_eos"] is True and fixed["max_tokens"] == 8


def test_the_vllm_stream_gives_each_chunks_tokens_and_the_requests_acceptance_at_the_end(vllm):
    events = [vllm.parse_event(e) for e in sse("vllm-stream.sse")]
    assert all(isinstance(e, StreamEvent) for e in events)
    assert [e.count for e in events] == [*PER_EVENT, 0] and [e.done for e in events] == [False] * 5 + [True]
    assert [t for e in events for t in e.token_ids] == OUTPUT_IDS
    assert [e.finish_reason for e in events] == [None] * 4 + ["stop", None]  # the closing usage chunk has none
    last = events[-1]
    assert (last.prompt_tokens, last.drafted, last.accepted) == (6, 12, 5)
    # the fixture is self-consistent: every token is the prefill's or one of 4 verification steps'
    assert len(OUTPUT_IDS) == 1 + 4 + last.accepted


@pytest.mark.parametrize("event", [
    "not an object",
    {"id": "cmpl-1", "object": "text_completion"},
    {"choices": [{"token_ids": [1]}, {"token_ids": [2]}]},
    {"choices": [{"index": 0, "text": "a"}]},
    {"choices": [{"index": 0, "text": "a", "token_ids": [1, "2"]}]},
    {"choices": [], "metrics": {}},
    {"error": {"message": "max_tokens must be at least 1", "type": "BadRequestError", "code": 400}},
], ids=["not-object", "no-choices", "two-choices", "no-token-ids", "string-id", "no-usage", "error"])
def test_a_malformed_or_failed_vllm_event_is_one_line(vllm, event):
    with pytest.raises(ServerFailure) as err:
        vllm.parse_event(event)
    assert one_line(err).startswith("engine=vllm ")


def test_the_vllm_metrics_page_gives_the_speculative_counters_summed_and_per_position(vllm):
    got = vllm.parse_metrics((DATA / "vllm-metrics.txt").read_text(encoding="utf-8"))
    per_pos = {k: v for k, v in got.items() if "per_position" in k}
    assert per_pos == {f"spec_decode_accepted_tokens_per_position[{p}]": v
                       for p, v in enumerate([1800.0, 1100.0, 612.0])}
    assert sum(per_pos.values()) == got["spec_decode_accepted_tokens"] == 3512.0
    assert {k: v for k, v in got.items() if "per_position" not in k} == {
        "spec_decode_num_drafts": 2345.0, "spec_decode_draft_tokens": 7035.0, "spec_decode_accepted_tokens": 3512.0,
        "prompt_tokens": 1536.0, "generation_tokens": 8192.0, "requests": 32.0}


def test_a_metrics_page_without_speculation_has_no_speculative_counters_and_a_broken_one_is_one_line(vllm):
    text = "".join(line + "\n" for line in (DATA / "vllm-metrics.txt").read_text(encoding="utf-8").splitlines()
                   if "spec_decode" not in line)
    assert not any("spec_decode" in key for key in vllm.parse_metrics(text))
    with pytest.raises(SpectuneError) as err:
        vllm.parse_metrics('vllm:prompt_tokens_total{engine="0" 3\n')
    assert one_line(err).startswith("the /metrics page of engine=vllm is not Prometheus text")


# ---- SGLang --------------------------------------------------------------------------------------------------

def spec_flags(command: list[str]) -> dict[str, str | bool]:
    """The --speculative-* flags of a command, with their values (True for a bare flag)."""
    out: dict[str, str | bool] = {}
    for i, arg in enumerate(command):
        if arg.startswith("--speculative-"):
            following = command[i + 1] if i + 1 < len(command) else "--"
            out[arg] = True if following.startswith("--") else following
    return out


@pytest.mark.parametrize("method", [AR, *(Method(name, 3) for name in ALGORITHMS)], ids=str)
def test_every_sglang_flag_is_one_sglang_0_5_23_defines(sglang, method):
    command = sglang.command(method, port=30123, threads=4, slots=16)
    assert command[:5] == [sys.executable, "-m", "sglang.launch_server", "--model-path", sglang.config.model]
    given = set(flags(command[3:]))  # after `python -m sglang.launch_server`
    assert given <= options("sglang-launch-server-options.txt"), given - options("sglang-launch-server-options.txt")
    for flag, value in [("--port", "30123"), ("--max-running-requests", "16"), ("--random-seed", "20260923")]:
        assert command[command.index(flag) + 1] == value
    assert {"--enable-metrics", "--incremental-streaming-output"} <= set(command)
    if not method.speculative:
        assert not spec_flags(command)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_an_sglang_chain_drafts_gamma_tokens_in_gamma_plus_one_draft_tokens(sglang, gamma):
    """EAGLE family at top-k 1: γ steps and γ + 1 draft tokens; NGRAM at breadth 1: γ + 1 draft tokens, the root
    being the last verified token (its steps are SGLang's to derive)."""
    eagle = spec_flags(sglang.command(Method("eagle3", gamma), port=1, threads=1, slots=1))
    assert eagle == {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": str(gamma),
                     "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": str(gamma + 1),
                     "--speculative-draft-model-path": "org/eagle3"}
    ngram = spec_flags(sglang.command(Method("ngram", gamma), port=1, threads=1, slots=1))
    assert ngram == {"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": str(gamma + 1),
                     "--speculative-ngram-max-bfs-breadth": "1", "--speculative-ngram-min-bfs-breadth": "1",
                     "--speculative-ngram-max-trie-depth": "18", "--speculative-ngram-match-type": "BFS"}


def test_an_sglang_tree_takes_its_size_from_the_config(composed):
    flavour = SglangFlavour(composed("sglang", "engine.eagle_topk=4", "engine.num_draft_tokens=8"))
    got = spec_flags(flavour.command(Method("standalone", 5), port=1, threads=1, slots=1))
    assert (got["--speculative-eagle-topk"], got["--speculative-num-draft-tokens"]) == ("4", "8")


@pytest.mark.parametrize(("method", "overrides", "words"), [
    (Method("suffix", 3), [], "method 'suffix' is not one engine=sglang runs: its speculative methods are eagle"),
    (Method("eagle", 3), [], "method 'eagle:gamma=3' needs engine.drafts.eagle"),
    (Method("eagle3", 3), ["engine.drafts.eagle3=org/h", "engine.eagle_topk=4"], "with eagle_topk=4 needs "
                                                                                  "engine.num_draft_tokens"),
])
def test_a_method_sglang_cannot_run_fails_in_one_line_before_any_server(composed, method, overrides, words):
    flavour = SglangFlavour(composed("sglang", *overrides))
    with pytest.raises(SpectuneError) as err:
        flavour.check(method)
    assert words in one_line(err)


def test_an_sglang_request_streams_token_ids_and_maps_top_k_off_to_minus_one(sglang):
    path, body = sglang.request([1, 2], 32, SamplingParams(temperature=0.0, top_k=0, top_p=1.0), seed=9)
    assert path == "/generate" and json.loads(json.dumps(body)) == body
    assert body == {"input_ids": [1, 2], "stream": True,
                    "sampling_params": {"max_new_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": -1,
                                        "ignore_eos": False, "sampling_seed": 9}}
    assert sglang.request([1], 1, SamplingParams(top_k=20), seed=0)[1]["sampling_params"]["top_k"] == 20
    assert sglang.request([1], 1, SamplingParams(), seed=0, ignore_eos=True)[1]["sampling_params"]["ignore_eos"] is True


def test_the_sglang_stream_gives_each_increment_and_the_verification_counters_at_the_end(sglang):
    events = [sglang.parse_event(e) for e in sse("sglang-stream.sse")]
    assert [e.count for e in events] == PER_EVENT and [e.done for e in events] == [False] * 4 + [True]
    assert [t for e in events for t in e.token_ids] == OUTPUT_IDS
    last = events[-1]
    assert (last.prompt_tokens, last.drafted, last.accepted, last.finish_reason) == (6, 12, 5, "stop")
    assert len(OUTPUT_IDS) == 1 + 4 + last.accepted  # the prefill's token and 4 verification steps' (spec_verify_ct)


@pytest.mark.parametrize("event", [
    [1, 2],
    {"text": "a", "meta_info": {"finish_reason": None}},
    {"text": "a", "output_ids": [1]},
    {"text": "a", "output_ids": [True], "meta_info": {}},
    {"error": {"message": "Input length (9000 tokens) exceeds the maximum allowed length", "code": 400}},
], ids=["not-object", "no-output-ids", "no-meta-info", "bool-id", "error"])
def test_a_malformed_or_failed_sglang_event_is_one_line(sglang, event):
    with pytest.raises(ServerFailure) as err:
        sglang.parse_event(event)
    assert one_line(err).startswith("engine=sglang ")


def test_the_sglang_metrics_page_gives_its_counters_summed_and_no_gauge(sglang):
    """Counters by spectune's names; the latest batch's gauges are no count over a block and are left out."""
    got = sglang.parse_metrics((DATA / "sglang-metrics.txt").read_text(encoding="utf-8"))
    assert got == {"spec_decode_num_drafts": 3277.0, "generation_tokens": 8193.0, "prompt_tokens": 1542.0,
                   "requests": 33.0}


# ---- configuration -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "message"), [
    (["engine=vllm", "engine.tensor_parallel_size=two"],
     "error: engine.tensor_parallel_size='two' is invalid: must be an integer"),
    (["engine=sglang", "engine.ngram.max_trie_depth=[1]"],
     "error: engine.ngram.max_trie_depth=[1] is invalid: must be an integer"),
    (["engine=vllm", "engine.no_such_key=1"],
     "error: engine.no_such_key is not a key of the config: check its spelling, or add it with "
     "+engine.no_such_key=..."),
])
def test_an_engine_configs_wrong_type_or_unknown_key_fails_in_one_line_before_the_job(monkeypatch, capsys,
                                                                                    overrides, message):
    """conf/engine/<name>.yaml names its schema (registered by the harness), so Hydra types its keys as it
    composes: through the front door, one line and exit 2, and the job never starts."""
    from spectune.run.cli import hydra_entry

    started = []
    monkeypatch.setattr(sys, "argv", ["harness", *overrides])
    with pytest.raises(SystemExit) as stop:
        hydra_entry(lambda: started.append(True), "config")
    assert stop.value.code == 2 and not started
    assert capsys.readouterr().err.strip() == message


def test_the_engine_group_defaults_to_spectune_and_names_its_options_when_unknown(monkeypatch, capsys, composed):
    """conf/config.yaml's engine default is spectune's own engine, so engine=vllm needs no `+`; an unknown engine
    is one line listing conf/engine/."""
    from spectune.run.cli import hydra_entry
    from tests.conftest import compose_overrides

    composed("vllm")  # registers the schemas
    assert compose_overrides("+workload=en").engine.name == "spectune"
    options = ", ".join(sorted(p.stem for p in (REPO / "conf" / "engine").glob("*.yaml")))
    monkeypatch.setattr(sys, "argv", ["harness", "engine=vlm"])
    with pytest.raises(SystemExit) as stop:
        hydra_entry(lambda: None, "config")
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: engine='vlm' is unknown: choose one of {options}"


def test_each_engine_file_is_typed_by_its_flavours_schema(composed):
    """register_schemas stores each flavour's schema where conf/engine/<name>.yaml names it."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from tests.conftest import compose_overrides

    composed("vllm")  # registers
    stored = ConfigStore.instance().repo["schema"]["engine"]
    assert {"vllm.yaml", "sglang.yaml"} <= set(stored)
    for name, schema in (("vllm", VllmConfig), ("sglang", SglangConfig)):
        assert OmegaConf.get_type(compose_overrides(f"engine={name}", "models=llama3-8b-1b").engine) is schema


# ---- the engines, as the harness builds them --------------------------------------------------------------------

@pytest.mark.parametrize(("engine", "overrides", "words"), [
    ("vllm", ["engine.executable=no-such-vllm"], "engine=vllm needs the vllm executable "
     "(engine.executable='no-such-vllm'), which is not on PATH here: install vLLM on a GPU node and run there "
     "(docs/gpus.md)"),
    ("sglang", ["engine.python=no-such-python"], "engine=sglang needs engine.python='no-such-python', which is not "
     "on PATH here: install SGLang on a GPU node and run there (docs/gpus.md)"),
    ("vllm", ["engine.method=eagle"], "method 'eagle:gamma=2' needs engine.drafts.eagle"),
    ("sglang", ["engine.method=medusa"], "engine.method='medusa' is invalid for engine=sglang"),
])
def test_a_bench_on_a_server_engine_that_cannot_start_fails_in_one_line_before_any_model_loads(
        engine, overrides, words):
    """BenchSettings.from_cfg runs before the models load: the engine's method, settings and server are checked
    there."""
    from harness.tasks.bench import BenchSettings
    from harness.tasks.schemas import register
    from tests.conftest import compose_overrides

    register()
    cfg = compose_overrides(f"engine={engine}", "models=llama3-8b-1b", "+workload=en", "gamma=[2]", *overrides)
    with pytest.raises(SpectuneError) as err:
        BenchSettings.from_cfg(cfg)
    assert words in one_line(err)


def test_a_server_engine_found_is_built_with_the_run_settings_and_starts_what_it_found(tmp_path):
    """With the server's program found (here a stand-in file on PATH: nothing runs), the harness's checks pass and
    the engine's servers would run it, one per method, sized by the run's concurrency."""
    from harness.tasks.bench import BenchSettings
    from harness.tasks.schemas import register
    from tests.conftest import compose_overrides

    register()
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\nexit 1\n")
    program.chmod(0o755)
    cfg = compose_overrides("engine=vllm", "models=llama3-8b-1b", "+workload=en", "gamma=[2,4]",
                            f"engine.executable={program}", "engine.method=suffix", "seed=3")
    settings = BenchSettings.from_cfg(cfg)
    assert settings.engine == "vllm" and [m.label for m in settings.methods()][1:] == ["suffix:gamma=2",
                                                                                        "suffix:gamma=4"]
    engine = VllmEngine.from_config(cfg, sampling=SamplingParams(), slots=4, log_dir=tmp_path)
    command = engine.flavour.command(settings.methods()[-1], port=9000, threads=None, slots=4)
    assert command[:3] == [str(program), "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert json.loads(command[command.index("--speculative-config") + 1])["num_speculative_tokens"] == 4
    assert engine.describe()["engine"] == "vllm" and engine.seed == 3
    sglang = SglangEngine.from_config(compose_overrides("engine=sglang", "models=llama3-8b-1b",
                                                        f"engine.python={sys.executable}"),
                                      sampling=SamplingParams(), slots=2, log_dir=tmp_path)
    assert sglang.flavour.command(AR, port=9000, threads=None, slots=2)[:3] == [sys.executable, "-m",
                                                                                "sglang.launch_server"]
