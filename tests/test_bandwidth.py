"""spectune.measure.bandwidth: the roofline arithmetic on synthetic runs, and the STREAM kernels on a small array."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from spectune.errors import SpectuneError
from spectune.measure.bandwidth import Bandwidth, roofline, runs_under, stream, weight_bytes
from spectune.run import rundir

BW = Bandwidth(read=1e9, copy=2e9, triad=3e9, array_bytes=1 << 20, threads=1, runs=1, cpu_model="test")


def synthetic_run(where, *, engine, tpot_ms=20.0, parameters=1_000_000, dtype="float32", concurrency=1):
    where.mkdir(parents=True)
    rundir.METADATA.write(where, {"task": "bench", "engine": engine, "settings": {"concurrency": concurrency},
                                  "models": {"target": {"name_or_path": "org/target", "dtype": dtype,
                                                        "parameters": parameters}}})
    rundir.SUMMARY.write(where, {"methods": [{"method": "ar", "gamma": 0, "status": "ok", "median_tpot_ms": tpot_ms},
                                             {"method": "fixed:gamma=2", "gamma": 2, "status": "ok",
                                              "median_tpot_ms": 5.0}]})
    return where


@pytest.mark.parametrize(("dtype", "per_param"), [("float32", 4), ("bfloat16", 2)])
def test_spectune_runs_read_the_targets_parameter_bytes_per_token(tmp_path, dtype, per_param):
    """20 ms a token is 50 tok/s; 1e6 parameters of 4 (2) bytes are 4 (2) MB a token: 200 (100) MB/s, 20% (10%) of
    a 1 GB/s read bandwidth. The speculative method's TPOT is not read."""
    run = synthetic_run(tmp_path / "run", engine={"engine": "spectune"}, dtype=dtype)
    row = roofline(run, BW)
    assert (row["engine"], row["model"], row["concurrency"]) == ("spectune", "org/target", 1)
    assert row["bytes_per_token"] == per_param * 1_000_000
    assert math.isclose(row["ar_decode_tok_s"], 50.0) and math.isclose(row["bytes_per_s"], 50.0 * per_param * 1e6)
    assert math.isclose(row["fraction_of_bandwidth"], per_param * 0.05)


def test_a_llamacpp_run_reads_its_served_gguf_once_per_token(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"\0" * 3000)
    run = synthetic_run(tmp_path / "run", engine={"engine": "llamacpp", "model": str(gguf)}, tpot_ms=1.0)
    assert weight_bytes(rundir.METADATA.read(run)) == ("llamacpp", "model.gguf", 3000)
    assert math.isclose(roofline(run, BW)["fraction_of_bandwidth"], 1000 * 3000 / 1e9)
    gguf.unlink()
    with pytest.raises(SpectuneError, match=r"model\.gguf"):
        roofline(run, BW)


def test_a_run_without_an_ar_baseline_is_one_line_and_a_multirun_is_searched(tmp_path):
    run = synthetic_run(tmp_path / "sweep" / "0", engine={"engine": "spectune"})
    synthetic_run(tmp_path / "sweep" / "1", engine={"engine": "spectune"}, concurrency=2)
    assert runs_under(tmp_path / "sweep") == [tmp_path / "sweep" / "0", tmp_path / "sweep" / "1"]
    assert runs_under(run) == [run]
    rundir.SUMMARY.write(run, {"methods": [{"method": "fixed:gamma=2", "status": "ok", "median_tpot_ms": 5.0}]})
    with pytest.raises(SpectuneError, match="no measured AR baseline") as err:
        roofline(run, BW)
    assert "\n" not in str(err.value)
    with pytest.raises(SpectuneError, match="no run directory"):
        runs_under(tmp_path / "empty")


def test_stream_measures_each_kernel_on_the_array_and_threads_asked_and_restores_torchs_threads():
    """A smoke test on a 1 MiB array (in cache: the rates are not the machine's bandwidth, only finite and > 0)."""
    before = torch.get_num_threads()
    bw = stream(array_bytes=1 << 20, threads=1, runs=2)
    assert torch.get_num_threads() == before
    assert (bw.array_bytes, bw.threads, bw.runs) == (1 << 20, 1, 2) and bw.cpu_model
    assert all(math.isfinite(r) and r > 0 for r in (bw.read, bw.copy, bw.triad)) and bw.best == bw.read


def test_the_bench_script_prints_one_line_per_run_and_bad_input_in_one_line(tmp_path, caplog, capsys):
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("bandwidth_script", REPO / "bench" / "bandwidth.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    synthetic_run(tmp_path / "sweep" / "0", engine={"engine": "spectune"})
    synthetic_run(tmp_path / "sweep" / "1", engine={"engine": "spectune"}, concurrency=2)
    caplog.set_level(logging.INFO)
    assert script.main([str(tmp_path / "sweep"), "--mib", "1", "--runs", "1", "--threads", "1"]) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("memory bandwidth: read")
    assert [line.split()[0] for line in lines[1:]] == ["spectune", "spectune"]
    assert "c=1:" in lines[1] and "c=2:" in lines[2] and "50.0 tok/s x 4.0 MB/token" in lines[1]
    capsys.readouterr()
    assert script.main([str(tmp_path / "sweep"), "--mib", "1", "--runs", "1", "--threads", "1", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # the data alone on stdout
    assert [r["concurrency"] for r in rows] == [1, 2] and all(r["bandwidth"]["array_bytes"] == 1 << 20 for r in rows)
    assert script.main([str(tmp_path / "nothing"), "--mib", "1"]) == 2
    assert script.main([str(tmp_path / "sweep"), "--runs", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: {tmp_path / 'nothing'}: no run directory (metadata.json with summary.json) here or below",
                   "error: --runs=0 is invalid: an integer >= 1"]
