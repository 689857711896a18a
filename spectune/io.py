"""Atomic result writers: a killed run never leaves a truncated JSON, CSV or Parquet file.

Each writer writes a temporary file beside the target, makes it durable (fsync), gives it the mode a plain
``open(path, "w")`` would (0666 minus the umask: ``tempfile.mkstemp`` creates 0600, which a colleague or a
notebook server under another user cannot read on a shared filesystem), renames it over the target
(atomic on POSIX within one filesystem) and fsyncs the directory, so that after a crash the name points to
the old file or the new one, never to an empty one.
"""

from __future__ import annotations

import enum
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd


def _current_umask() -> int:
    """The process umask. Reading it means setting it; the two calls are back to back."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync(path: Path, directory: bool = False) -> None:
    """Flush ``path``'s data (or a directory's entries) to the disk."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # some filesystems / platforms cannot open a directory: the rename stays atomic
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:  # a directory fsync is best effort (not supported everywhere)
            raise
    finally:
        os.close(fd)


def write_atomic(path: Path | str, write: Callable[[Path], None]) -> Path:
    """Write through ``write(tmp)`` into a temporary file beside ``path``, then rename over it.

    For any format: ``write`` receives the temporary path and must close what it opens.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)  # the writers close their file: the data is in the OS, not in a Python buffer
        _fsync(tmp)
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, path)  # atomic on POSIX within one filesystem
    finally:
        tmp.unlink(missing_ok=True)
    _fsync(path.parent, directory=True)  # make the rename itself durable
    return path


def _jsonable(obj: Any) -> Any:
    """Turn numpy/torch scalars, non-finite floats and enum members into plain JSON values (NaN/inf → null)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return _jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, enum.Enum):  # a typed config's choice (spectune.config): written as its name
        return obj.name
    return obj


def json_text(data: Any, sort_keys: bool = False) -> str:
    """``data`` as the JSON every run file uses: enum choices by name, NaN/inf as null, never Python-only tokens."""
    return json.dumps(_jsonable(data), indent=2, ensure_ascii=False, allow_nan=False, sort_keys=sort_keys) + "\n"


def write_json(path: Path | str, data: Any) -> Path:
    text = json_text(data)
    return write_atomic(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_csv(path: Path | str, frame: pd.DataFrame) -> Path:
    return write_atomic(Path(path), lambda tmp: frame.to_csv(tmp, index=False))


def write_parquet(path: Path | str, frame: pd.DataFrame) -> Path:
    return write_atomic(Path(path), lambda tmp: frame.to_parquet(tmp, index=False))


def write_figure(path: Path | str, figure: Any) -> Path:
    """Save a matplotlib figure atomically (format from the final name's suffix)."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    return write_atomic(Path(path), lambda tmp: figure.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight"))


def write_text(path: Path | str, text: str) -> Path:
    return write_atomic(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))
