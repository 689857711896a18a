"""Run metadata recorded beside every result: packages, git commit, host, hardware."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from spectune.run.rundir import FORMAT_VERSION, VERSION_KEY

_PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "pandas", "pyarrow", "hydra-core",
             "datasets", "stable-baselines3", "gymnasium", "spectune")
_REPO = Path(__file__).resolve().parents[2]


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> dict[str, Any]:
    """Commit of the spectune checkout and whether the tree had uncommitted changes."""
    def run(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=_REPO, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": run("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


# Environment variables that change which kernels the math libraries run, and so a CPU result: MKL_CBWR=AVX512 alone
# made verifying 2-12 positions 1.4-1.8x faster on one AVX-512 CPU (bench/results/verify-width-smollm2-cpu-20261206).
MATH_ENV_PREFIXES = ("MKL_", "OMP_", "KMP_", "OPENBLAS_", "ONEDNN_", "DNNL_", "ATEN_", "TORCH_CPU_")


def math_env() -> str:
    """The math libraries' settings this process runs under, as ``KEY=value`` words in name order (variables named
    by :data:`MATH_ENV_PREFIXES`; "" when none is set). One string, so a result's keys do not vary with the shell."""
    return " ".join(f"{key}={os.environ[key]}" for key in sorted(os.environ) if key.startswith(MATH_ENV_PREFIXES))


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "kernel": platform.release(),
        "math_env": math_env(),
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["cuda_device"] = torch.cuda.get_device_name(0)
            info["cuda_version"] = torch.version.cuda
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    return info


def base_metadata() -> dict[str, Any]:
    """What every result file carries regardless of task (first the run format it is written in)."""
    return {
        VERSION_KEY: FORMAT_VERSION,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "packages": package_versions(),
        "git": git_commit(),
        "host": host_info(),
    }


def finished_metadata(started: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A long run's metadata when it ends: what it started with (the code it ran is the commit read then), when it
    finished, and ``extra``; a tree or packages changed under the running job are recorded beside, not instead."""
    now = base_metadata()
    final = {**now, **started, "finished": True, "finished_utc": now["created_utc"], **extra}
    for key in ("git", "packages"):
        if key in started and now[key] != started[key]:
            final[f"{key}_at_finish"] = now[key]
    return final
