"""Atomic result writers: a killed run never leaves a truncated JSON, CSV or Parquet file."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd


def _atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """Write through ``write(tmp)`` into a temporary file beside ``path``, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.replace(tmp, path)  # atomic on POSIX within one filesystem
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _jsonable(obj: Any) -> Any:
    """Turn numpy/torch scalars and non-finite floats into plain JSON values (NaN/inf → null)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return _jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: Path | str, data: Any) -> Path:
    text = json.dumps(_jsonable(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return _atomic(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_csv(path: Path | str, frame: pd.DataFrame) -> Path:
    return _atomic(Path(path), lambda tmp: frame.to_csv(tmp, index=False))


def write_parquet(path: Path | str, frame: pd.DataFrame) -> Path:
    return _atomic(Path(path), lambda tmp: frame.to_parquet(tmp, index=False))


def write_figure(path: Path | str, figure: Any) -> Path:
    """Save a matplotlib figure atomically (format from the final name's suffix)."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    return _atomic(Path(path), lambda tmp: figure.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight"))
