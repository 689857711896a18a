"""Fuzzing the inputs users type or hand over (hypothesis, derandomized): workload files and config overrides.

The claim under test, for every generated input: either it is accepted, or it fails with one SpectuneError
line naming what is wrong -- never another exception (a traceback for the user) and never a file written.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from spectune.errors import SpectuneError
from tests.conftest import REPO

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Values a user can produce with an override: numbers of every kind, bools, text, null, short lists.
SCALARS = st.one_of(
    st.integers(-3, 10), st.integers(-(2**63), 2**63), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=8), st.sampled_from(["1", "true", "null", "1e3", "nan", "-0"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4))


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


_COMPOSED: dict[tuple[str, ...], Any] = {}


def _fresh(*overrides: str):
    """A mutable copy of a composed config (composing once per override set: Hydra takes ~0.3 s a call)."""
    if overrides not in _COMPOSED:
        _COMPOSED[overrides] = OmegaConf.to_container(_compose(*overrides))
    return OmegaConf.create(_COMPOSED[overrides])


def _one_line_error(err: SpectuneError, *names: str) -> None:
    text = str(err)
    assert text and "\n" not in text, text
    assert any(name in text for name in names), (names, text)


@pytest.fixture(scope="module")
def bench_cfg():
    return _compose("+workload=en")


BENCH_KEYS = ["gamma", "concurrency", "request_rate", "burstiness", "task.warmup", "task.baseline"]


@FUZZ
@given(key=st.sampled_from(BENCH_KEYS), value=VALUES)
def test_bench_settings_accept_or_fail_in_one_line(bench_cfg, tmp_path, key, value):
    from harness.tasks import bench

    cfg = OmegaConf.create(OmegaConf.to_container(bench_cfg))
    OmegaConf.update(cfg, key, value, force_add=True)
    out = tmp_path / "run"
    try:
        s = bench.BenchSettings.from_cfg(cfg)
    except SpectuneError as err:
        _one_line_error(err, key.split(".")[-1])
        with pytest.raises(SpectuneError):  # the task itself stops before writing anything
            bench.run(cfg, out)
        assert not out.exists()
        return
    assert s.methods() and all(isinstance(g, int) and g >= 1 for g in s.gammas)
    assert len(set(s.gammas)) == len(s.gammas)
    assert isinstance(s.concurrency, int) and not isinstance(s.concurrency, bool) and s.concurrency >= 1
    assert s.request_rate is None or (math.isfinite(s.request_rate) and s.request_rate > 0)
    assert math.isfinite(s.burstiness) and s.burstiness > 0
    assert isinstance(s.warmup, int) and not isinstance(s.warmup, bool) and s.warmup >= 0



# ---- workload files -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workload_cfg():
    return _compose("+workload=en", "workload.categories=[chat-lines]", "workload.num_prompts=null",
                    "workload.prompt_tokens=null").workload


def _load(workload_cfg, tokenizer, path: Path, **over: Any):
    from workloads.loader import load_workload

    cfg = OmegaConf.create(OmegaConf.to_container(workload_cfg))
    cfg.path = str(path)
    for key, value in over.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return load_workload(cfg, tokenizer)


def _check_file(workload_cfg, tokenizer, tmp_path: Path, data: bytes, **over: Any) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    try:
        wl = _load(workload_cfg, tokenizer, path, **over)
    except SpectuneError as err:
        _one_line_error(err, str(path), "workload.", "prompt")
    else:
        assert wl.prompts and all(p.text.strip() and p.input_ids for p in wl.prompts)
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.jsonl"]  # reading writes nothing


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=3), max_leaves=8)
RECORDS = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries({"prompt": st.text(max_size=40)}, optional={"id": JSON_VALUES}),
    st.fixed_dictionaries({"prompt": JSON_VALUES, "id": st.text(max_size=5)}),
)
LINES = st.one_of(
    RECORDS.map(lambda r: json.dumps(r).encode()),
    RECORDS.map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.binary(max_size=40),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"\n", b"{", b"[]", b'{"prompt": "\\ud800 x"}', b'{"prompt": "  "}', b"\xef\xbb\xbf",
                     b'{"prompt": "ok"', b"[" * 5000 + b"]" * 5000]),
)


@FUZZ
@given(lines=st.lists(LINES, max_size=6), newline=st.sampled_from([b"\n", b"\r\n"]))
def test_workload_files_load_or_fail_in_one_line(workload_cfg, tokenizer, tmp_path_factory, lines, newline):
    _check_file(workload_cfg, tokenizer, tmp_path_factory.mktemp("wl"), newline.join(lines))


@pytest.mark.parametrize(("name", "data", "message"), [
    ("empty", b"", "no prompts in the file"),
    ("blank lines", b"\n \n\t\n", "no prompts in the file"),
    ("latin-1", '{"prompt": "perché no?"}\n'.encode("latin-1"), ":1: not UTF-8 text (byte 0xe9"),
    ("utf-16", '{"prompt": "hello"}\n'.encode("utf-16"), ":1: not UTF-8 text"),
    ("second line latin-1", b'{"prompt": "ok"}\n' + '{"prompt": "\xe0"}\n'.encode("latin-1"), ":2: not UTF-8"),
    ("lone surrogate", b'{"prompt": "a \\udc00 b"}\n', ":1: the 'prompt' text holds an unpaired surrogate"),
    ("empty prompt", b'{"prompt": ""}\n', ":1: the 'prompt' text is empty"),
    ("deep nesting", b"[" * 100000 + b"]" * 100000 + b"\n", ":1: malformed JSON"),
])
def test_bad_workload_files_are_named_by_line(workload_cfg, tokenizer, tmp_path, name, data, message):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    with pytest.raises(SpectuneError, match=re.escape(message)) as err:
        _load(workload_cfg, tokenizer, path)
    assert "\n" not in str(err.value)


def test_a_utf8_bom_mixed_ids_and_a_huge_line_load(workload_cfg, tokenizer, tmp_path):
    """What Arrow's JSON reader used to choke on: a BOM, ids of mixed types, one very long line (280 kB)."""
    huge = "parola " * 40_000
    rows = [{"id": 7, "prompt": "ciao"}, {"id": "x", "prompt": huge}, {"prompt": "no id here"}]
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r) for r in rows).encode())
    wl = _load(workload_cfg, tokenizer, path, shuffle=False)
    assert [p.id for p in wl.prompts] == ["7", "x", "prompts-0002"]
    assert wl.prompts[1].text == huge and len(wl.prompts[1].input_ids) > 10_000
    band = _load(workload_cfg, tokenizer, path, shuffle=False, prompt_tokens=[1, 48])
    assert [p.id for p in band.prompts] == ["7", "prompts-0002"]


@pytest.mark.parametrize("key", ["name", "language", "seed", "shuffle", "sampling", "source", "field", "path",
                                 "num_prompts", "max_new_tokens", "prompt_tokens", "chat_template"])
def test_a_workload_key_missing_from_the_yaml_is_a_one_line_error(workload_cfg, tokenizer, key):
    from workloads.loader import load_workload

    spec = OmegaConf.to_container(workload_cfg, resolve=True)  # a plain dict, as the composed node resolves
    del spec[key]
    with pytest.raises(SpectuneError, match=rf"workload\.{key} is missing") as err:
        load_workload(spec, tokenizer)
    assert "\n" not in str(err.value)


WORKLOAD_KEYS = ["num_prompts", "max_new_tokens", "seed", "shuffle", "prompt_tokens", "field", "source",
                 "languages", "sampling.temperature", "sampling.top_k", "sampling.top_p", "name", "chat_template"]


@FUZZ
@given(key=st.sampled_from(WORKLOAD_KEYS), value=VALUES)
def test_workload_overrides_accept_or_fail_in_one_line(workload_cfg, tokenizer, key, value):
    from workloads.loader import load_workload

    cfg = OmegaConf.create(OmegaConf.to_container(workload_cfg))
    cfg.path = str(REPO / "workloads/prompts/en.jsonl")
    cfg.num_prompts = 2
    OmegaConf.update(cfg, key, value, force_add=True)
    try:
        wl = load_workload(cfg, tokenizer)
    except SpectuneError as err:
        _one_line_error(err, key.split(".")[-1], "workload", "prompt")
    else:
        assert wl.prompts and wl.max_new_tokens >= 1


# ---- the other config validators ------------------------------------------------------------------------

HARDWARE_KEYS = ["name", "device", "dtype", "attn_implementation", "threads", "kv_cache", "max_cache_len",
                 "compile", "compile_backend"]


@FUZZ
@given(setup=st.sampled_from(["cpu", "cpu-static"]), key=st.sampled_from(HARDWARE_KEYS),
       value=VALUES | st.sampled_from(["cuda:0", "cpu:0", "meta", "static", "reduce-overhead", "float16"]))
def test_hardware_setups_accept_or_fail_in_one_line(monkeypatch, setup, key, value):
    import torch

    from spectune import hardware as hw

    threads: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)  # never change this process's threads
    cfg = _fresh(f"hardware={setup}").hardware
    OmegaConf.update(cfg, key, value, force_add=True)
    try:
        device = hw.setup(cfg)
        path = hw.execution_path(cfg)
    except SpectuneError as err:
        _one_line_error(err, f"hardware.{key}", "hardware=", "CUDA")
        return
    assert device.type == "cpu" and (not path.static or path.max_cache_len >= 8)
    assert all(isinstance(t, int) and 1 <= t <= hw.MAX_THREADS for t in threads)


@pytest.mark.parametrize("key", HARDWARE_KEYS)
def test_a_hardware_key_missing_from_the_yaml_is_a_one_line_error(key):
    from spectune import hardware as hw

    cfg = _fresh().hardware
    del cfg[key]
    with pytest.raises(SpectuneError, match=rf"hardware\.{key} is missing"):
        hw.setup(cfg)


VERIFY_KEYS = ["task.trials", "task.z_max", "task.chi2_min_pvalue", "task.block_check", "task.p", "task.q",
               "task.source", "seed", "task.real.prompts", "task.real.trials", "task.real.min_expected",
               "task.real.engine_requests", "task.real.engine_gamma", "task.real.engine_conditions"]


# Where an accepted value of each key lands in the validated settings, per source (absent: not read there).
VERIFY_READS = {
    "lists": {"task.trials": lambda s: s["trials"], "seed": lambda s: s["seed"],
              "task.z_max": lambda s: s["rule"].z_max, "task.chi2_min_pvalue": lambda s: s["rule"].min_pvalue,
              "task.block_check": lambda s: s["block_check"], "task.p": lambda s: list(s["p"]),
              "task.q": lambda s: list(s["q"])},
    "models": {"seed": lambda s: s["seed"], "task.z_max": lambda s: s["rule"].z_max,
               "task.chi2_min_pvalue": lambda s: s["rule"].min_pvalue,
               "task.real.prompts": lambda s: s["prompts"], "task.real.trials": lambda s: s["trials"],
               "task.real.min_expected": lambda s: s["min_expected"],
               "task.real.engine_requests": lambda s: s["engine"]["requests"],
               "task.real.engine_gamma": lambda s: s["engine"]["gamma"],
               "task.real.engine_conditions": lambda s: s["engine"]["conditions"]},
}


def _verify_settings(cfg) -> tuple[str, dict[str, Any]]:
    """What ``task=verify`` validates before torch loads, in its order: the source, then that source's settings."""
    from harness.tasks import verify

    source = cfg.task.source
    if source not in verify.SOURCES:
        raise SpectuneError(f"task.source={source!r} is unknown: choose one of {', '.join(verify.SOURCES)}")
    return source, (verify._model_settings(cfg) if source == "models" else verify._settings(cfg))


@FUZZ
@given(key=st.sampled_from(VERIFY_KEYS), value=VALUES, models=st.booleans())
def test_verify_options_accept_or_fail_in_one_line(key, value, models):
    cfg = _fresh("task=verify", *(["task.source=models", "+workload=en"] if models else []))
    OmegaConf.update(cfg, key, value, force_add=True)
    try:
        source, s = _verify_settings(cfg)
    except SpectuneError as err:
        _one_line_error(err, key.split(".")[-1], "task.source")
        return
    # Accepted: every setting is in its range, and the fuzzed value is the one the task will use.
    assert source in ("lists", "models") and (key != "task.source" or value == source)
    assert isinstance(s["seed"], int) and s["seed"] >= 0 and isinstance(s["trials"], int) and s["trials"] >= 100
    assert 0 < s["rule"].z_max < math.inf and 0 <= s["rule"].min_pvalue <= 1
    if source == "lists":
        assert len(s["p"]) == len(s["q"]) and min(s["p"]) >= 0 and min(s["q"]) >= 0
        assert abs(sum(s["p"]) - 1) < 1e-6 and abs(sum(s["q"]) - 1) < 1e-6 and isinstance(s["block_check"], bool)
    else:
        assert s["prompts"] >= 1 and 0 < s["min_expected"] < math.inf and s["engine"]["gamma"] >= 1
        assert s["engine"]["requests"] >= 0 and s["engine"]["conditions"] >= 0
    read = VERIFY_READS[source].get(key)
    if read is not None:
        used, given_value = read(s), value if isinstance(value, list) else [value]
        assert [float(u) for u in (used if isinstance(used, list) else [used])] == [float(v) for v in given_value], \
            (key, value, used)


COSTMODEL_KEYS = ["task.alphas", "task.cs", "task.gamma_min", "task.gamma_max", "task.g", "task.overhead",
                  "task.joint", "task.plot"]


@FUZZ
@given(key=st.sampled_from(COSTMODEL_KEYS), value=VALUES | st.dictionaries(st.sampled_from(["1", "2", "x"]), SCALARS))
def test_costmodel_runs_or_fails_in_one_line_and_writes_nothing_on_failure(tmp_path_factory, key, value):
    from harness.tasks import costmodel

    out = tmp_path_factory.mktemp("cm")
    cfg = _fresh("task=costmodel", "task.plot=false", "task.gamma_max=4")
    OmegaConf.update(cfg, key, value, force_add=True)
    try:
        costmodel.run(cfg, out)
    except SpectuneError as err:
        _one_line_error(err, key.split(".")[-1])
        assert not list(out.iterdir()), list(out.iterdir())  # no partial result
        return
    assert (out / "costmodel.csv").exists() and (out / "costmodel.json").exists()


# ---- the command line itself ----------------------------------------------------------------------------

@pytest.mark.parametrize(("override", "message"), [
    ("gamma=[1,", "gamma=[1, is not a valid override"),
    ("task.alfas=[0.5]", "task.alfas is not a key of the config"),
    ("task.alphas=${oops}", "task.alphas: Interpolation key 'oops' not found"),
    ("task.gamma_max=2.5", "task.gamma_max=2.5"),
])
def test_command_line_mistakes_are_one_line_exit_2_and_write_no_result(cli, tmp_path, override, message):
    proc = cli("task=costmodel", override, run_dir=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and errors[0] == proc.stderr.strip(), proc.stderr[-2000:]
    assert not list(tmp_path.glob("costmodel.*"))


@pytest.mark.parametrize("sweep", ["task.gamma_max=2,3", "task.gamma_max=range(2,4)"])
def test_an_unknown_key_in_a_sweep_is_one_line_before_any_job_runs(cli, tmp_path, sweep):
    proc = cli("-m", "task=costmodel", sweep, "task.alfas=[0.5]", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip() == ("error: task.alfas is not a key of the config: check its spelling, or add it "
                                   "with +task.alfas=..."), proc.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # no job started
