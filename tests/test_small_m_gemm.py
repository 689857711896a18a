"""bench/small_m_gemm.py: the target's shapes from its config, both paths timed per row count and checked equal."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO


@pytest.fixture(scope="module")
def gemm():
    """The script as a module, with bench/ on the import path as when it runs (it imports a sibling script)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("small_m_gemm", REPO / "bench" / "small_m_gemm.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_shapes_come_from_the_target_config(gemm):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(REPO / "spectune" / "models" / "tiny" / "target")
    shapes = gemm.target_shapes("tiny")
    assert shapes["lm head"] == (cfg.hidden_size, cfg.vocab_size)
    assert shapes["down"] == (cfg.intermediate_size, cfg.hidden_size)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert shapes["k, v"] == (cfg.hidden_size, cfg.num_key_value_heads * head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_path_and_row_count_is_timed(gemm, dtype):
    """Every path this CPU can run is timed at every M; oneDNN's packed bfloat16 path needs AVX-512 or
    AVX-NE-CONVERT, and where it is missing it is left out rather than failing the benchmark."""
    results = gemm.measure({"layer": (16, 24)}, rows=3, reps=5, seed=0, dtype=dtype)
    paths = ("F.linear",) if gemm.packed_unavailable(dtype) else ("F.linear", "oneDNN packed")
    assert gemm.packed_unavailable(torch.float32) is None  # float32's packed path runs on every x86 CPU
    assert [(r["path"], r["rows"]) for r in results] == [(path, m) for path in paths for m in (1, 2, 3)]
    assert all(r["ms"] > 0 and r["shape"] == "16x24" and r["dtype"] == str(dtype) for r in results)


@pytest.mark.parametrize("args, message", [(["--rows", "0"], "--rows=0 is invalid"),
                                           (["--models", "nope"], "--models='nope' is invalid"),
                                           (["--dtype", "float16"], "--dtype='float16' is invalid")])
def test_bad_input_is_one_line_and_exit_code_not_zero(args, message):
    proc = subprocess.run([sys.executable, "bench/small_m_gemm.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
