"""Hardware setups (conf/hardware/*.yaml): validate them and describe the path that produced a number."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from spectune.errors import SpectuneError
from spectune.placement import cpu_bf16, cpu_model, default_threads, recorded_cpu_flags

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
KV_CACHES = ("dynamic", "static")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MAX_THREADS = 4096


def _get(hardware: DictConfig, key: str) -> Any:
    """Every conf/hardware/*.yaml sets every key (the defaults live there only): a missing one is a one-line error."""
    if key not in hardware:
        raise SpectuneError(f"hardware.{key} is missing: every conf/hardware/*.yaml sets it")
    return hardware[key]


def _name(hardware: DictConfig, key: str) -> str:
    value = _get(hardware, key)
    if not isinstance(value, str) or not value:
        raise SpectuneError(f"hardware.{key}={value!r} is invalid: must be a non-empty string")
    return value


def setup(hardware: DictConfig) -> torch.device:
    """Validate the whole setup (one place), apply the thread setting and check that the device exists."""
    _name(hardware, "name")
    _name(hardware, "attn_implementation")
    dtype = _get(hardware, "dtype")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SpectuneError(f"hardware.dtype={dtype!r} is unknown: choose one of {', '.join(DTYPES)}")
    threads = _get(hardware, "threads")
    if threads is not None and not (isinstance(threads, int) and not isinstance(threads, bool)
                                    and 1 <= threads <= MAX_THREADS):
        raise SpectuneError(f"hardware.threads={threads!r} is invalid: must be an integer in [1, {MAX_THREADS}] "
                            "or null (torch's default)")
    raw = _name(hardware, "device")
    try:
        device = torch.device(raw)
    except (RuntimeError, TypeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise SpectuneError(f"hardware.device={raw!r} is invalid: cpu, cuda or cuda:N")
    execution_path(hardware)  # validates kv_cache / max_cache_len / compile
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpectuneError(f"hardware={hardware.name} needs a CUDA device, but torch sees none "
                            f"(torch {torch.__version__}); use hardware=cpu")
    threads = default_threads(threads)  # null: the SLURM allocation's CPUs per task, where there is one
    if threads is not None:
        torch.set_num_threads(threads)
    return device


def execution_path(hardware: DictConfig) -> ExecutionPath:
    """The engine's execution path from a hardware setup (eager dynamic cache unless it says otherwise)."""
    kv = _get(hardware, "kv_cache")
    if kv not in KV_CACHES:
        raise SpectuneError(f"hardware.kv_cache={kv!r} is unknown: choose dynamic or static")
    max_len = _get(hardware, "max_cache_len")
    static = kv == "static"
    if static and not (isinstance(max_len, int) and not isinstance(max_len, bool) and max_len >= 8):
        raise SpectuneError(f"hardware.max_cache_len={max_len!r} is invalid: a static cache needs an integer >= 8")
    mode = _get(hardware, "compile")
    if mode is not None and mode not in COMPILE_MODES:
        raise SpectuneError(f"hardware.compile={mode!r} is unknown: choose null or one of {', '.join(COMPILE_MODES)}")
    if mode is not None and not static:
        raise SpectuneError(f"hardware.compile={mode!r} needs hardware.kv_cache=static (growing caches recompile "
                            "every step)")
    return ExecutionPath(static=static, max_cache_len=max_len if static else 0, compile_mode=mode,
                         compile_backend=_name(hardware, "compile_backend"))


def describe(hardware: DictConfig, device: torch.device) -> dict[str, Any]:
    """What goes into metadata: which execution path produced the numbers."""
    info: dict[str, Any] = {
        "setup": hardware.name,
        "device": str(device),
        "dtype": hardware.dtype,
        "attn_implementation": hardware.attn_implementation,
        "execution_path": "compiled" if hardware.compile else "eager",
        **execution_path(hardware).describe(),
        "torch_threads": torch.get_num_threads(),
        "clock": "perf_counter after torch.cuda.synchronize()" if device.type == "cuda" else "perf_counter",
    }
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    else:  # what decides a CPU's costs: its vector units, and whether bfloat16 runs in hardware
        info.update(cpu_model=cpu_model(), cpu_capability=torch.backends.cpu.get_cpu_capability(), cpu_bf16=cpu_bf16(),
                    cpu_flags=recorded_cpu_flags())
    return info
