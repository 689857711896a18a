"""How close an engine's autoregressive decode comes to the machine's memory bandwidth.

Decoding one token at batch 1 reads every weight once, so a decode step cannot be faster than the weights' bytes
over the sustained read bandwidth: AR decode tok/s x bytes per token, as a fraction of that bandwidth, says how
much of the roofline an engine reaches (near 1: memory-bound and efficient; far below: overheads dominate, which
speculation cannot remove). :func:`stream` measures the bandwidth STREAM's way (McCalpin's read, copy and triad
kernels over arrays far larger than the last-level cache, best of K runs); :func:`roofline` reads a bench run
directory. ``bench/bandwidth.py`` prints both. Read it on a quiet machine: a shared one lowers both numbers unevenly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spectune.errors import SpectuneError
from spectune.methods import BASELINE
from spectune.placement import cpu_model
from spectune.run import rundir

log = logging.getLogger(__name__)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
ARRAY_BYTES = 1 << 30  # per array: far above any CPU's last-level cache (tens to hundreds of MiB)


@dataclass(frozen=True)
class Bandwidth:
    """Sustained bandwidth in bytes/s per kernel (STREAM's byte counts: read N, copy 2N, triad 3N; write-allocate
    traffic not counted), with what it was measured on."""

    read: float
    copy: float
    triad: float
    array_bytes: int
    threads: int
    runs: int
    cpu_model: str

    @property
    def best(self) -> float:
        """What decode is compared with: the read kernel's, since decoding reads weights and writes little."""
        return self.read

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def stream(array_bytes: int = ARRAY_BYTES, threads: int | None = None, runs: int = 5) -> Bandwidth:
    """Time read (a sum), copy and triad (a = b + s·c) on float32 arrays of ``array_bytes`` each with ``threads``
    torch threads (None: torch's setting), keeping each kernel's fastest of ``runs``."""
    import torch

    if array_bytes < 4 or runs < 1:
        raise SpectuneError(f"array_bytes={array_bytes}, runs={runs} are invalid: an array of >= 4 bytes, >= 1 run")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        n = array_bytes // 4
        a, b, c = (torch.full((n,), v, dtype=torch.float32) for v in (1.0, 2.0, 0.5))
        kernels = {"read": (lambda: a.sum(), 1), "copy": (lambda: a.copy_(b), 2),
                   "triad": (lambda: torch.add(b, c, alpha=3.0, out=a), 3)}
        rates = {}
        for name, (kernel, arrays) in kernels.items():
            kernel()  # first touch: pages mapped before any timing
            best = min(_timed(kernel) for _ in range(runs))
            rates[name] = arrays * n * 4 / best
        return Bandwidth(rates["read"], rates["copy"], rates["triad"], n * 4, torch.get_num_threads(), runs,
                         cpu_model())
    finally:
        torch.set_num_threads(before)


def _timed(kernel: Any) -> float:
    start = time.perf_counter()
    kernel()
    return max(time.perf_counter() - start, 1e-9)


def weight_bytes(metadata: dict[str, Any]) -> tuple[str, str, int]:
    """(engine, model, bytes read per decoded token) of a bench run: llama.cpp's served GGUF file (every token reads
    all of it once); for spectune's engine the target's parameters at the dtype it ran in."""
    engine = metadata.get("engine") or {}
    name = str(engine.get("engine", "spectune"))
    if name == "llamacpp":
        path = Path(str(engine.get("model")))
        if not path.is_file():
            raise SpectuneError(f"the GGUF this run served, {path}, is not on this machine: its size is the bytes "
                                "per token")
        return name, path.name, path.stat().st_size
    target = ((metadata.get("models") or {}).get("target")) or {}
    if name != "spectune" or "parameters" not in target:
        raise SpectuneError(f"engine={name}: its bytes per token are unknown here (spectune and llamacpp only)")
    dtype = str(target.get("dtype", "float32"))
    return name, str(target.get("name_or_path")), int(target["parameters"]) * DTYPE_BYTES.get(dtype, 4)


def roofline(run_dir: Path | str, bandwidth: Bandwidth) -> dict[str, Any]:
    """The AR baseline of a bench run against ``bandwidth``: decode tok/s is one request's (1000 / median TPOT in
    ms: a decode step reads the weights once whatever the batch), and the fraction is tok/s x bytes per token over
    the sustained read bandwidth."""
    metadata, summary = rundir.METADATA.read(run_dir), rundir.SUMMARY.read(run_dir)
    ar = next((m for m in summary.get("methods", []) if m.get("method") == BASELINE and m.get("status") == "ok"), None)
    if ar is None or not ar.get("median_tpot_ms"):
        raise SpectuneError(f"{run_dir}: no measured AR baseline with a TPOT in summary.json (task=bench with "
                            "task.baseline=true)")
    engine, model, per_token = weight_bytes(metadata)
    tok_s = 1000.0 / float(ar["median_tpot_ms"])
    used = tok_s * per_token
    return {"run": str(run_dir), "engine": engine, "model": model, "bytes_per_token": per_token,
            "concurrency": (metadata.get("settings") or {}).get("concurrency"), "ar_decode_tok_s": tok_s,
            "bytes_per_s": used, "fraction_of_bandwidth": used / bandwidth.best}


def runs_under(path: Path | str) -> list[Path]:
    """``path`` if it is a run directory (metadata.json and summary.json), else every run directory below it."""
    root = Path(path)
    if rundir.METADATA.exists(root) and rundir.SUMMARY.exists(root):
        return [root]
    found = sorted(p.parent for p in root.rglob(rundir.METADATA.name) if rundir.SUMMARY.exists(p.parent))
    if not found:
        raise SpectuneError(f"{path}: no run directory (metadata.json with summary.json) here or below")
    return found
