"""Where a measurement ran: the scheduler's job, its restart, the node, the CPU model, the CPUs it was given.

Recorded with every repeat (``spectune.run.conditions``): two repeats compare only when they ran in comparable places,
and a resumed job's repeats come from another allocation. Also the one place that turns the allocation into
torch's thread count: a SLURM job given ``--cpus-per-task=N`` computes on N threads, not on every core of the
node (torch's default), which would spill onto CPUs another job was given.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
from typing import Any


def slurm_job_id() -> str | None:
    """The id ``squeue`` shows: ``ARRAY_TASK`` for an array task (``123_4``), else the job id; None outside SLURM."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def restart_count() -> int:
    """SLURM's requeue counter (0 on the first run and outside SLURM)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def allocated_cpus() -> int | None:
    """``SLURM_CPUS_PER_TASK`` when the job asked for CPUs per task, else None (no allocation to follow)."""
    raw = os.environ.get("SLURM_CPUS_PER_TASK")
    try:
        value = int(raw) if raw else 0
    except ValueError:
        return None
    return value if value > 0 else None


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo, keys lower-cased (Linux; empty where it cannot be read)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform reports."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


NATIVE_BF16 = ("avx512_bf16", "amx_bf16")  # CPU flags with bfloat16 dot products; without them torch emulates bf16


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux; empty where it cannot be read)."""
    return frozenset(_cpuinfo().get("flags", "").split())


RECORDED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni", "avx_vnni")


def recorded_cpu_flags() -> list[str]:
    """The CPU flags that decide a model's speed here (vector width, bfloat16 and int8 dot products), as every
    result records them: two "AMD EPYC" VMs can differ in exactly these."""
    flags = cpu_flags()
    return [flag for flag in RECORDED_FLAGS if flag in flags]


def cpu_bf16(flags: frozenset[str] | None = None) -> str:
    """"native" when the CPU multiplies bfloat16 in hardware, "emulated" when its flags are known and lack that
    (bfloat16 then runs slower than float32 and changes which γ pays), "unknown" without flags."""
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return "unknown"
    return "native" if any(flag in flags for flag in NATIVE_BF16) else "emulated"


def placement() -> dict[str, Any]:
    """The job, restart, node and CPU model of the measurement running now (job fields None outside SLURM)."""
    return {"job_id": slurm_job_id(), "restart_count": restart_count(),
            "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(), "cpu_model": cpu_model(),
            "cpus_allocated": allocated_cpus(), "cpus_on_node": os.cpu_count()}


def default_threads(configured: int | None) -> int | None:
    """torch's thread count: ``hardware.threads`` when set, else the SLURM allocation's CPUs per task, else None
    (torch's own default)."""
    return configured if configured is not None else allocated_cpus()
