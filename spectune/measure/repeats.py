"""Repeats: a point (:mod:`spectune.measure.point`) is one method run once on all prompts, keyed (method, repeat).
Repeat r runs the methods in the order rotated r times (ABC, BCA, CAB, ...) (:func:`schedule`, :func:`run_points`);
:func:`pooled` gives the per-method medians written after every point, :func:`aggregate` the per-method summaries with
paired CIs, the best method, its indistinguishable set, the MAD rule's pick, the noise floor and (with SLOs) goodput.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from spectune.engine.records import summarise_repeats
from spectune.errors import SpectuneError
from spectune.measure.point import Frames
from spectune.stats.compare import AA_LABEL, Comparison, compare, latency_intervals, rotation
from spectune.stats.goodput import good_requests, p99_check

if TYPE_CHECKING:
    from spectune.run.progress import RunProgress

log = logging.getLogger(__name__)

Point = tuple[str, int, int]  # (method label, γ, repeat)
RunPoint = Callable[[str, int], Frames]


def repeats_option(value: Any) -> int:
    """``task.repeats``: an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpectuneError(f"task.repeats={value!r} is invalid: must be an integer >= 1")
    return value


def schedule(methods: list[tuple[str, int]], repeats: int) -> list[Point]:
    """Every (method, γ) once per repeat, in the order rotated by the repeat's index."""
    return [(label, gamma, r) for r in range(repeats) for label, gamma in rotation(methods, r)]


@dataclass
class Grid:
    """What has been measured so far: per-point summaries and their request / cycle rows."""

    points: list[dict[str, Any]] = field(default_factory=list)
    requests: list[pd.DataFrame] = field(default_factory=list)
    cycles: list[pd.DataFrame] = field(default_factory=list)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        req = pd.concat(self.requests, ignore_index=True) if self.requests else pd.DataFrame()
        cyc = pd.concat(self.cycles, ignore_index=True) if self.cycles else pd.DataFrame()
        return req, cyc


def _tag(frame: pd.DataFrame, repeat: int) -> pd.DataFrame:
    frame = frame.copy()
    if "repeat" in frame:
        frame["repeat"] = repeat
    else:
        frame.insert(1, "repeat", repeat)
    return frame


def run_points(points: list[Point], run_point: RunPoint, *, done: Any = None,
               on_point: Callable[[Grid], None] | None = None, progress: RunProgress | None = None) -> Grid:
    """Run (or take from ``done``, a resume.Completed) every point; a point that raises RuntimeError,
    MemoryError or ValueError is recorded as failed and the others go on (bad input still stops). ``progress``
    counts the points (``run_point`` advances its requests)."""
    grid = Grid()
    for label, gamma, repeat in points:
        key = (label, repeat)
        resumed = done is not None and key in done
        if resumed:
            log.info("resume: %s%s already complete, skipped", label, f" repeat {repeat}" if repeat else "")
            summary = done.summaries[key]
            grid.requests.append(done.requests[key])
            grid.cycles.append(done.cycles[key])
            if progress is not None:
                progress.skip(len(done.requests[key]), points=1)
        else:
            try:
                req, cyc, summary = run_point(label, gamma)
                grid.requests.append(_tag(req, repeat))
                grid.cycles.append(_tag(cyc, repeat))
            except SpectuneError:
                raise  # bad input is the user's to fix, not a failed measurement
            except (RuntimeError, MemoryError, ValueError) as err:
                summary = {"method": label, "gamma": gamma, "status": "failed", "error": f"{type(err).__name__}: {err}"}
                log.error(f"grid point {label} failed (repeat {repeat}): {summary['error']}")
            summary = {**summary, "repeat": repeat}
        grid.points.append(summary)
        if progress is not None and not resumed:
            progress.point_done()
        if on_point is not None:
            on_point(grid)
    return grid


def _method_order(points: list[dict[str, Any]]) -> list[tuple[str, int]]:
    seen: dict[str, int] = {}
    for p in points:
        seen.setdefault(p["method"], int(p.get("gamma", 0)))
    return list(seen.items())


def pooled(grid: Grid) -> list[dict[str, Any]]:
    """Per method, the repeats pooled (medians and pooled percentiles; no intervals): cheap, written after
    every point so a killed run's summary.json still describes what finished."""
    req, cyc = grid.frames()
    out = []
    for label, gamma in _method_order(grid.points):
        pts = [p for p in grid.points if p["method"] == label]
        ok = [p for p in pts if p.get("status") == "ok"]
        if not ok:
            out.append({"method": label, "gamma": gamma, "status": "failed", "repeats": 0,
                        "error": next((p.get("error") for p in pts if p.get("error")), None)})
            continue
        mine_req = req[req["method"] == label] if len(req) else req
        mine_cyc = cyc[cyc["method"] == label] if len(cyc) else cyc
        entry = {"method": label, "gamma": gamma, "status": "ok", **summarise_repeats(ok, mine_req, mine_cyc),
                 "policy": ok[0].get("policy"), "failed_repeats": len(pts) - len(ok)}
        out.append(entry)
    return out


def aggregate(grid: Grid, *, seed: int, slo: Mapping[str, float] | None = None, unit_size: int = 1
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-method summaries with CIs over units of ``unit_size`` consecutive prompts (1: the prompt; at
    concurrency > 1 the prompts batched together, :func:`unit_size_of`), and the ranking (by throughput; also by
    goodput when SLOs are set). ``seed`` seeds the latency percentiles' bootstrap."""
    methods = pooled(grid)
    req, _ = grid.frames()
    ok_points = [p for p in grid.points if p.get("status") == "ok"]
    if not ok_points or not len(req):
        return methods, {}
    gammas = {m["method"]: int(m["gamma"]) for m in methods}
    ok_methods = {m["method"] for m in methods if m["status"] == "ok"}
    req = req[req["method"].isin(ok_methods)]
    ok_keys = {(p["method"], int(p["repeat"])) for p in ok_points}
    req = req[[(m, int(r)) in ok_keys for m, r in zip(req["method"], req["repeat"], strict=True)]]
    durations = {(p["method"], int(p["repeat"])): float(p["duration_s"]) for p in ok_points}
    per_repeat = {m: [p["output_throughput"] for p in ok_points if p["method"] == m] for m in ok_methods}
    by_tp = compare(req, durations, per_repeat, gammas, unit_size=unit_size)
    by_name = {m["method"]: m for m in methods}
    for label, fields in by_tp.fields.items():
        by_name[label].update(fields)
        by_name[label].update(latency_intervals(req[req["method"] == label], seed=seed))
    ranking = {"output_throughput": _ranking(by_tp)}
    if slo:
        req = req.assign(good=good_requests(req, slo).to_numpy())
        good_per_repeat = {m: [int(req[(req["method"] == m) & (req["repeat"] == p["repeat"])]["good"].sum())
                               / float(p["duration_s"]) for p in ok_points if p["method"] == m] for m in ok_methods}
        by_gp = compare(req, durations, good_per_repeat, gammas, value="good", metric="request_goodput",
                        unit_size=unit_size)
        for label, fields in by_gp.fields.items():
            entry = by_name[label]
            entry["request_goodput"] = float(np.median(good_per_repeat[label]))
            entry.update({(f"goodput_{k}" if k in ("best", "indistinguishable_from_best", "mad_score") else k): v
                          for k, v in fields.items()})
            entry.update(p99_check(req[req["method"] == label], slo))
        ranking["request_goodput"] = _ranking(by_gp)
        ranking["slo"] = dict(slo)
    return methods, ranking


def _ranking(comp: Comparison) -> dict[str, Any]:
    return {"best": comp.best, "best_resolved": comp.best_resolved, "indistinguishable": comp.indistinguishable,
            "mad_pick": comp.mad_pick,
            "noise_floor_pct": comp.noise_floor_pct, "statistics": comp.statistics,
            "aa_label": AA_LABEL if comp.noise_floor_pct is not None else None}
