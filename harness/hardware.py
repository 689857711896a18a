"""Hardware setups (conf/hardware/*.yaml): validate them and describe the path that produced a number."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from harness.errors import SpectuneError

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
    if hardware.get("compile"):
        raise SpectuneError(f"hardware={hardware.name}: the compiled path (static cache + CUDA graphs) is not built "
                            "yet; use hardware=cuda (eager) or hardware=cpu")
    return device


def describe(hardware: DictConfig, device: torch.device) -> dict[str, Any]:
    """What goes into metadata: which execution path produced the numbers."""
    info: dict[str, Any] = {
        "setup": hardware.name,
        "device": str(device),
        "dtype": hardware.dtype,
        "attn_implementation": hardware.attn_implementation,
        "execution_path": "compiled" if hardware.get("compile") else "eager",
        "torch_threads": torch.get_num_threads(),
        "clock": "perf_counter after torch.cuda.synchronize()" if device.type == "cuda" else "perf_counter",
    }
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info
