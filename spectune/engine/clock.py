"""Timing and memory that can be trusted: synchronise the device before every clock read."""

from __future__ import annotations

import time
from typing import Any

import torch

try:  # psutil is a dependency, but the GPU machine's image may lack it: fall back to the stdlib peak
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


class DeviceClock:
    """``now()`` returns perf_counter seconds after all queued device work has finished.

    CUDA kernels run asynchronously: reading a host clock without a synchronise measures the launch,
    not the work. Phases inside a cycle are timed with :meth:`mark` instead — CUDA events on a GPU,
    read after the cycle's one unavoidable sync — so timing adds no stall between draft and verify.
    On CPU there is nothing to wait for and marks are plain perf_counter readings.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.synchronises = device.type == "cuda"

    def now(self) -> float:
        if self.synchronises:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self) -> torch.cuda.Event | float:
        if not self.synchronises:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: torch.cuda.Event | float, end: torch.cuda.Event | float) -> float:
        """Time between two marks; on CUDA ``end`` must have completed (waits for it otherwise)."""
        if not self.synchronises:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3


class MemoryTracker:
    """Peak memory over a run: torch allocator (+ NVML device 'used') on CUDA, process RSS on CPU.

    RSS is sampled at each call to :meth:`sample` (once per cycle), so it is a peak over samples.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.process = psutil.Process() if psutil is not None else None
        self.peak_rss = 0
        self.peak_nvml = 0
        self._nvml: Any = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            try:
                import pynvml

                pynvml.nvmlInit()
                index = device.index if device.index is not None else torch.cuda.current_device()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
            except Exception:  # NVML is optional: report the allocator only
                self._nvml = None
        self.sample()

    def sample(self) -> None:
        if self.process is not None:
            self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
        else:
            import resource

            self.peak_rss = max(self.peak_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        if self._nvml is not None:
            nvml, handle = self._nvml
            self.peak_nvml = max(self.peak_nvml, int(nvml.nvmlDeviceGetMemoryInfo(handle).used))

    def report(self) -> dict[str, Any]:
        self.sample()
        out: dict[str, Any] = {"peak_rss_bytes": self.peak_rss, "memory_method": "process RSS sampled per cycle"}
        if self.device.type == "cuda":
            out.update(
                peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
                peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device),
                peak_nvml_used_bytes=self.peak_nvml or None,
                memory_method="torch.cuda.max_memory_allocated/reserved after reset; NVML used sampled per cycle",
            )
        return out
