"""What else ran while a repeat was measured, and which repeats to distrust.

A paired comparison is only as good as the conditions it pairs: on a shared node, AR measured while another job
computed and γ = 4 measured after it stopped gives a speed-up that is the other job's, not speculation's. So every
grid point records, over its own timed window, the share of the node's CPU time spent by processes other than
this one (``psutil``: system busy time minus this process's time), the steal share (a hypervisor's other guests),
the 1-minute load average at both ends, GPU utilisation by other processes where there is a GPU (NVML), and where
it ran (``spectune.placement``: job id, restart count, node, CPU model).

The repeat (AR and every γ, in its rotated order) is the unit of comparison: a repeat is flagged when any of its
points ran beside others using more than :data:`OTHERS_LIMIT` of the node's CPU (or GPU), or when its points come
from different allocations. A resumed run keeps whole repeats only (:func:`whole_repeats`), so a repeat's points
always share one allocation, and speed-ups are computed within each repeat (:func:`speedups_per_repeat`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import pandas as pd

from spectune.methods import BASELINE
from spectune.placement import placement

log = logging.getLogger(__name__)

OTHERS_LIMIT = 0.10  # others' share of the node's CPU (or GPU) time above which a repeat is flagged
RunPoint = Callable[[str, int], tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]]


# ----------------------------------------------------------------------------------------------------------
# One grid point's window.


def _cpu_ticks() -> tuple[float, float, float]:
    """(busy, total, steal) CPU seconds of the whole node since boot. ``guest`` is already inside ``user``."""
    import psutil

    t = psutil.cpu_times()
    fields = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    total = sum(getattr(t, f, 0.0) for f in fields)
    idle = t.idle + getattr(t, "iowait", 0.0)
    steal = getattr(t, "steal", 0.0)
    return total - idle - steal, total, steal


def _own_seconds() -> float:
    """CPU seconds of this process (all its threads), its waited-for children, and its live descendants: a server
    engine's llama-server or vLLM process is the run's own work, not other load on the node."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:  # it exited between the listing and the reading
            continue
        total += c.user + c.system + c.children_user + c.children_system
    return total


class GpuWatch:
    """GPU utilisation by other processes over a window, from NVML's per-process samples (pynvml); inactive
    where there is no NVML or no GPU. nvidia-smi cannot attribute utilisation to processes, so it is not used."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.start_us = 0
        try:
            import pynvml

            pynvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            count = pynvml.nvmlDeviceGetCount()
            indices = [int(i) for i in visible.split(",") if i.strip().isdigit()] if visible else range(count)
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices if i < count]
            self.nvml = pynvml
        except Exception:  # no pynvml, no driver, no GPU: nothing to watch
            self.handles = []

    def start(self) -> None:
        self.start_us = int(time.time() * 1e6)

    def others_util(self) -> float | None:
        """Mean SM utilisation (0..1) of other processes' samples since :meth:`start`, summed over processes."""
        if not self.handles:
            return None
        me, total, samples = os.getpid(), 0.0, 0
        for handle in self.handles:
            try:
                rows = self.nvml.nvmlDeviceGetProcessUtilization(handle, self.start_us)
            except Exception:  # NVML_ERROR_NOT_FOUND: no sample in the window
                continue
            stamps = {r.timeStamp for r in rows}
            samples += len(stamps)
            total += sum(r.smUtil for r in rows if r.pid != me)
        return total / samples / 100.0 if samples else 0.0


_GPU: GpuWatch | None = None


def _gpu() -> GpuWatch:
    global _GPU
    if _GPU is None:
        _GPU = GpuWatch()
    return _GPU


class Window:
    """Conditions over one timed window: ``with Window() as w: ...`` then ``w.record``."""

    def __enter__(self) -> Window:
        self.load_start = os.getloadavg()[0]
        _gpu().start()
        self.busy0, self.total0, self.steal0 = _cpu_ticks()
        self.own0, self.wall0 = _own_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        busy, total, steal = _cpu_ticks()
        own, wall = _own_seconds(), time.perf_counter()
        span = max(total - self.total0, 1e-9)
        others = max(0.0, (busy - self.busy0) - (own - self.own0)) / span
        self.record: dict[str, Any] = {
            **placement(), "wall_s": round(wall - self.wall0, 4), "others_cpu_share": round(others, 4),
            "steal_share": round(max(0.0, steal - self.steal0) / span, 4),
            "load1_start": round(self.load_start, 2), "load1_end": round(os.getloadavg()[0], 2),
            "gpu_others_util": _gpu().others_util()}


def watched(run_point: RunPoint) -> RunPoint:
    """``run_point`` whose summary gains ``conditions``: what else ran during the point (see module doc)."""
    def run(label: str, gamma: int) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
        with Window() as window:
            req, cyc, summary = run_point(label, gamma)
        return req, cyc, {**summary, "conditions": window.record}

    return run


# ----------------------------------------------------------------------------------------------------------
# Per repeat: flags and speed-ups.


def _reasons(points: list[dict[str, Any]], limit: float) -> list[str]:
    reasons = []
    for key, what in (("others_cpu_share", "the node's CPU"), ("gpu_others_util", "the GPU")):
        busy = [(p["method"], p["conditions"][key]) for p in points
                if (p.get("conditions") or {}).get(key) is not None and p["conditions"][key] > limit]
        if busy:
            reasons.append(f"others used up to {max(v for _, v in busy):.0%} of {what} "
                           f"(during {', '.join(m for m, _ in busy)})")
    places = {(c.get("job_id"), c.get("restart_count"), c.get("node"))
              for c in (p.get("conditions") or {} for p in points) if c}
    if len(places) > 1:
        reasons.append(f"its points ran in {len(places)} allocations (job, restart, node)")
    return reasons


def assess(points: list[dict[str, Any]], limit: float = OTHERS_LIMIT) -> dict[str, Any]:
    """Per repeat: where it ran, the worst interference of its points, and whether it is flagged (with why)."""
    repeats: list[dict[str, Any]] = []
    for r in sorted({int(p.get("repeat", 0)) for p in points}):
        mine = [p for p in points if int(p.get("repeat", 0)) == r and p.get("status") == "ok"]
        conds = [p["conditions"] for p in mine if p.get("conditions")]
        if not conds:
            continue
        first = conds[0]
        gpu = [c["gpu_others_util"] for c in conds if c.get("gpu_others_util") is not None]
        reasons = _reasons(mine, limit)
        repeats.append({"repeat": r, "job_id": first.get("job_id"), "restart_count": first.get("restart_count"),
                        "node": first.get("node"), "cpu_model": first.get("cpu_model"),
                        "others_cpu_share_max": max(c.get("others_cpu_share", 0.0) for c in conds),
                        "steal_share_max": max(c.get("steal_share", 0.0) for c in conds),
                        "load1_max": max(max(c.get("load1_start", 0.0), c.get("load1_end", 0.0)) for c in conds),
                        "gpu_others_util_max": max(gpu) if gpu else None,
                        "flagged": bool(reasons), "reasons": reasons})
    return {"limit_others_share": limit, "flagged_repeats": [r["repeat"] for r in repeats if r["flagged"]],
            "nodes": sorted({str(r["node"]) for r in repeats}), "cpu_models": sorted({str(r["cpu_model"])
                                                                                     for r in repeats}),
            "repeats": repeats}


def speedups_per_repeat(points: list[dict[str, Any]], baseline: str = BASELINE) -> dict[str, list[float | None]]:
    """Per method, its throughput over the baseline's in the same repeat (None where either failed)."""
    ok = {(p["method"], int(p.get("repeat", 0))): p.get("output_throughput") for p in points
          if p.get("status") == "ok"}
    repeats = sorted({int(p.get("repeat", 0)) for p in points})
    methods = list(dict.fromkeys(p["method"] for p in points))
    out: dict[str, list[float | None]] = {}
    for m in methods:
        row: list[float | None] = []
        for r in repeats:
            num, den = ok.get((m, r)), ok.get((baseline, r))
            row.append(round(num / den, 4) if num and den else None)
        out[m] = row
    return out


def summary_fields(points: list[dict[str, Any]]) -> dict[str, Any]:
    """What summary.json gains: ``conditions`` (per repeat, flags) and ``speedup_per_repeat`` (within repeats)."""
    return {"conditions": assess(points), "speedup_per_repeat": speedups_per_repeat(points)}


def warn_flagged(assessment: dict[str, Any]) -> None:
    """One warning line per flagged repeat (stderr and the job log)."""
    for r in assessment["repeats"]:
        if r["flagged"]:
            log.warning(f"warning: repeat {r['repeat']} was measured under other load ({'; '.join(r['reasons'])}; "
                        f"limit {assessment['limit_others_share']:.0%}): its speed-ups are not comparable")


# ----------------------------------------------------------------------------------------------------------
# Resuming whole repeats.


def whole_repeats(done: Any, keys: list[tuple[str, int]]) -> Any:
    """``done`` (a resume.Completed) without the points of a repeat that is not complete: a resumed job reruns
    a partial repeat whole, in its own allocation, so that every repeat pairs points measured together."""
    wanted: dict[int, list[tuple[str, int]]] = {}
    for key in keys:
        wanted.setdefault(key[1], []).append(key)
    for repeat, mine in wanted.items():
        have = [k for k in mine if k in done]
        if have and len(have) < len(mine):
            log.info("resume: repeat %d is partial (%d of %d points); rerunning it whole", repeat, len(have),
                     len(mine))
            for k in have:
                for table in (done.summaries, done.requests, done.cycles):
                    table.pop(k, None)
    return done
