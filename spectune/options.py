"""Read task options from the Hydra config with one-line errors that name the key and what is allowed.

Hydra has checked the types of a composed config against its schemas (:mod:`spectune.config`); these helpers check
the ranges, and the types too where a config did not come through a schema (a plain dict built by a caller)."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from spectune.errors import SpectuneError


def required(node: Any, key: str, name: str) -> Any:
    """A key the task's YAML always sets (defaults live in conf/ only, never repeated in code): missing is a
    one-line error instead of a silent default or Hydra's multi-line one."""
    if not isinstance(node, DictConfig | dict) or key not in node:
        raise SpectuneError(f"{name} is missing: set it in its conf/ file or on the command line ({name}=...)")
    return node[key]


def flag(value: Any, key: str) -> bool:
    """A YAML boolean: true or false (a string such as "no" would otherwise count as true)."""
    if not isinstance(value, bool):
        raise SpectuneError(f"{key}={value!r} is invalid: must be true or false")
    return value


def number(value: Any, key: str, *, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, allowed: str = "") -> float:
    """A finite real within [lo, hi] (``lo_open`` makes the lower bound strict)."""
    what = allowed or _range_text(lo, hi, lo_open)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpectuneError(f"{key}={value!r} is invalid: must be a finite number {what}".rstrip())
    low_bad = lo is not None and (value <= lo if lo_open else value < lo)
    if low_bad or (hi is not None and value > hi):
        raise SpectuneError(f"{key}={value!r} is out of range: must be {what}")
    return float(value)


def integer(value: Any, key: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (an integral float such as 2e5 is accepted) within [lo, hi]."""
    what = _range_text(lo, hi, False)
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral:
        raise SpectuneError(f"{key}={value!r} is invalid: must be an integer {what}".rstrip())
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise SpectuneError(f"{key}={value!r} is out of range: must be an integer {what}")
    return int(value)


def fresh_prompts(value: Any, key: str, unit: int) -> int | None:
    """A count of fresh prompts on which a pick is measured again (``task.confirm_prompts``,
    ``task.validate_prompts``): null, or an integer of at least two units of ``unit`` prompts (an interval needs
    two units), and a whole number of them."""
    if value is None:
        return None
    count = integer(value, key, lo=2 * unit)
    if count % unit:
        raise SpectuneError(f"{key}={count} is invalid: must be a multiple of the unit ({unit} prompts)")
    return count


def check_gamma(value: Any, what: str = "γ", *, key: str = "gamma") -> int:
    """γ as the grid, every policy and the cost model take it: an integer >= 1 (a bool is not one, nor is 4.0: a
    draft length is counted, never measured); a one-line error naming ``key`` and ``what`` it is for. The one γ
    check: whether a γ fits a context is another question (:func:`spectune.measure.check_context_fits`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpectuneError(f"{key}={value!r} is invalid: {what} must be an integer >= 1")
    return value


def as_list(value: Any, key: str) -> list[Any]:
    """A list from the config; a lone scalar becomes a one-element list (``task.alphas=0.7``)."""
    if isinstance(value, ListConfig | DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, list | tuple):
        if not value:
            raise SpectuneError(f"{key}=[] is invalid: must list at least one value")
        return list(value)
    if value is None:
        raise SpectuneError(f"{key} is missing: give a list such as {key}=[...]")
    return [value]


def _range_text(lo: float | None, hi: float | None, lo_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f"<= {hi:g}"
    return ""
