"""Hardware setups (conf/hardware/*.yaml): validate them and describe the path that produced a number."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from harness.errors import SpectuneError

if TYPE_CHECKING:  # the engine imports this module; it runs without Hydra (e.g. on the GPU image)
    from omegaconf import DictConfig


@dataclass(frozen=True)
class ExecutionPath:
    """How forwards run. Eager: HF DynamicCache, shapes grow. Static: preallocated per-slot buffers of
    ``max_cache_len`` columns and fixed shapes, optionally under ``torch.compile(mode=compile_mode)``
    (``"reduce-overhead"`` = CUDA graphs on a GPU). Recorded with every result."""

    static: bool = False
    max_cache_len: int = 0
    compile_mode: str | None = None
    compile_backend: str = "inductor"

    def describe(self) -> dict:
        return {"kv_cache": "static" if self.static else "dynamic", "max_cache_len": self.max_cache_len or None,
                "compile_mode": self.compile_mode,
                "compile_backend": self.compile_backend if self.compile_mode else None}



DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def setup(hardware: DictConfig) -> torch.device:
    """Apply thread settings and check that the device exists; returns it."""
    if hardware.dtype not in DTYPES:
        raise SpectuneError(f"hardware.dtype={hardware.dtype!r} is unknown: choose one of {', '.join(DTYPES)}")
    if hardware.get("threads") is not None:
        if int(hardware.threads) < 1:
            raise SpectuneError(f"hardware.threads={hardware.threads!r} is invalid: must be >= 1 or null")
        torch.set_num_threads(int(hardware.threads))
    device = torch.device(hardware.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpectuneError(f"hardware={hardware.name} needs a CUDA device, but torch sees none "
                            f"(torch {torch.__version__}); use hardware=cpu")
    execution_path(hardware)  # validates kv_cache / max_cache_len / compile
    return device


def execution_path(hardware: DictConfig) -> ExecutionPath:
    """The engine's execution path from a hardware setup (eager dynamic cache unless it says otherwise)."""
    kv = hardware.get("kv_cache", "dynamic")
    if kv not in ("dynamic", "static"):
        raise SpectuneError(f"hardware.kv_cache={kv!r} is unknown: choose dynamic or static")
    max_len = hardware.get("max_cache_len")
    if kv == "static" and not (isinstance(max_len, int) and max_len >= 8):
        raise SpectuneError(f"hardware.max_cache_len={max_len!r} is invalid: a static cache needs an integer >= 8")
    mode = hardware.get("compile")
    modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    if mode is not None and mode not in modes:
        raise SpectuneError(f"hardware.compile={mode!r} is unknown: choose null or one of {', '.join(modes)}")
    if mode is not None and kv != "static":
        raise SpectuneError(f"hardware.compile={mode!r} needs hardware.kv_cache=static (growing caches recompile "
                            "every step)")
    return ExecutionPath(static=kv == "static", max_cache_len=max_len or 0, compile_mode=mode,
                         compile_backend=hardware.get("compile_backend", "inductor"))


def describe(hardware: DictConfig, device: torch.device) -> dict[str, Any]:
    """What goes into metadata: which execution path produced the numbers."""
    info: dict[str, Any] = {
        "setup": hardware.name,
        "device": str(device),
        "dtype": hardware.dtype,
        "attn_implementation": hardware.attn_implementation,
        "execution_path": "compiled" if hardware.get("compile") else "eager",
        **execution_path(hardware).describe(),
        "torch_threads": torch.get_num_threads(),
        "clock": "perf_counter after torch.cuda.synchronize()" if device.type == "cuda" else "perf_counter",
    }
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info
