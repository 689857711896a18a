"""Methods interleaved prompt block by prompt block, so that a drifting machine drifts under every method alike.

A point of :func:`spectune.measure.repeats.run_points` is one method run once over all prompts; the methods of a repeat
run one after the other. On a machine whose speed drifts by ±15% over minutes (a cloud VM's neighbours, thermal
or frequency changes), that drift lands whole on whichever method ran at the time, and a paired (repeat,
prompt) bootstrap cannot see it: the pairing assumes the two methods met the same conditions. Cutting the
prompts into blocks and running every method on a block before the next block starts brings the methods of a
pair minutes closer: the drift between them becomes the drift over one block.

A (method, repeat) point is still the unit the statistics see: its blocks are merged into one run's rows
(:func:`merge_blocks`), each block's clock shifted to start where the previous block ended, so durations and
throughputs are those of the method's own work, with no other method's time between its blocks. A policy keeps
its state from block to block of a repeat (the caller builds it once per point and runs later blocks with
``reset_policy=False``): a policy that learns across requests sees the same requests in the same order as in one
run. At concurrency > 1 each block drains its batch before the next starts (a block of ``k·concurrency``
prompts keeps that tail small); at concurrency 1 a block changes nothing but when a prompt runs.

A workload in phases (``workload.phases``: each its own concurrency) runs phase by phase inside every point: its
requests come in run order, each tagged with its phase; a block never straddles two phases and runs at its phase's
concurrency; in the blocked design a point is its phases run one after the other, merged like blocks. The policy
keeps its state across phases (a controller must see the shift to react to it), and the warm-up before a point's
first phase runs at every phase's concurrency.

The order of the methods on each block follows a Williams design, not a rotation. A run leaves the process in
some state: the allocator, the caches, garbage to collect. Under a rotation each method always follows the same
predecessor, so that carry-over stays fixed on one method. Measured with a rotation on smollm2: AR against
itself, run right after AR, +4.6% [+1.8, +11.6]. Garbage is also collected before every timed run
(:func:`spectune.measure.point.measure_point`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from spectune.engine.records import Request, add_counters, summarise
from spectune.errors import SpectuneError
from spectune.measure.point import Frames
from spectune.measure.repeats import Grid, _tag
from spectune.methods import Method
from spectune.options import integer
from spectune.run.progress import RunProgress
from spectune.stats.compare import rotation

log = logging.getLogger(__name__)

BlockRun = Callable[[str, int, int, int, list[Request]], Frames]  # (label, γ, repeat, block, its requests)
_FAILURES = (RuntimeError, MemoryError, ValueError)


def block_size(value: Any, key: str, concurrency: list[int], against: str) -> int | None:
    """The option ``key``: null, or an integer >= 1 that every concurrency divides, so that each block starts
    with full batches (``against`` names the concurrency option as the user gave it, for the error)."""
    if value is None:
        return None
    size = integer(value, key, lo=1)
    uneven = [c for c in concurrency if size % c]
    if uneven:
        raise SpectuneError(f"{key}={size} is invalid with {against}: must be a multiple of every concurrency "
                            f"(not of {uneven[0]}), or null")
    return size


DESIGNS = ("interleaved", "blocked")


def design_option(value: Any, key: str, block: int | None, rate: float | None) -> str:
    """The option ``key`` (``task.design``): "interleaved" (every method runs a block of prompts before the next
    block starts: the default in a closed loop), "blocked" (every method runs all prompts at once, one after the
    other: the default, and the only design, in an open loop, where arrivals follow a clock), or null (the
    default). ``block`` is the block size the user gave (only interleaving takes one)."""
    if block is not None and rate is not None:
        raise SpectuneError(f"block_prompts={block} is invalid with request_rate={rate}: blocks need a closed loop "
                            "(request_rate=null)")
    if value is None:
        return "blocked" if rate is not None else "interleaved"
    if value not in DESIGNS:
        raise SpectuneError(f"{key}={value!r} is invalid: must be one of {', '.join(DESIGNS)} or null")
    if value == "interleaved" and rate is not None:
        raise SpectuneError(f"{key}=interleaved is invalid with request_rate={rate}: blocks need a closed loop "
                            "(request_rate=null)")
    if value == "blocked" and block is not None:
        raise SpectuneError(f"{key}=blocked is invalid with block_prompts={block}: only the interleaved design "
                            "runs blocks")
    return str(value)


def block_for(design: str, block_prompts: int | None, concurrency: int) -> int | None:
    """The block size a run at ``concurrency`` uses: None in the blocked design; else the one given, or by default
    one batch (``concurrency`` prompts: at concurrency 1 every method runs each prompt before the next)."""
    if design == "blocked":
        return None
    return block_prompts or concurrency


def blocks_of(requests: list[Request], size: int | None) -> list[list[Request]]:
    """``requests`` cut in order into blocks of ``size`` (the last may be shorter); ``None``: one block."""
    if size is None or size >= len(requests):
        return [list(requests)] if requests else []
    return [list(requests[i:i + size]) for i in range(0, len(requests), size)]


def williams_orders(n: int) -> list[list[int]]:
    """A Williams design for ``n`` treatments: orders of 0..n-1 in which every index takes every place equally
    often and every ordered pair (a directly before b) occurs equally often: n orders for even n, 2n for odd n
    (the n rows and their reverses). Rotating one order keeps each method's predecessor fixed, so whatever a
    run leaves behind (allocator state, caches, garbage) always lands on the same successor; this balances it."""
    if n <= 1:
        return [list(range(n))]
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def block_order(methods: list[tuple[str, int]], repeat: int, block: int, blocks: int) -> list[tuple[str, int]]:
    """The methods' order on one block: the next order of a Williams design (:func:`williams_orders`), counting
    blocks across repeats, so that every method takes every place and follows every other method equally often
    over a full cycle of the design."""
    orders = williams_orders(len(methods))
    return [methods[i] for i in orders[(repeat * blocks + block) % len(orders)]]


def _shift(frame: pd.DataFrame, columns: tuple[str, ...], by: float) -> pd.DataFrame:
    for column in columns:
        if column in frame:
            frame[column] = frame[column] + by
    return frame


def merge_blocks(parts: list[Frames]) -> Frames:
    """One point's blocks as one run: request and cycle rows concatenated with each block's clock shifted to
    start where the previous block's last request finished, cycle numbers continued, the summary recomputed
    from the merged rows (peak memory: the highest block's; conditions: combined, :func:`merge_conditions`)."""
    requests, cycles = [], []
    offset, cycle_offset = 0.0, 0
    for req, cyc, _ in parts:
        req, cyc = req.copy(), cyc.copy()
        start = float(req["arrival_s"].min()) if len(req) and req["arrival_s"].notna().any() else 0.0
        by = offset - start
        _shift(req, ("arrival_s", "admitted_s", "first_token_s", "finish_s"), by)
        if "token_times_s" in req:
            req["token_times_s"] = [[t + by for t in times] for times in req["token_times_s"]]
        if len(cyc):
            _shift(cyc, ("start_s",), by)
            cyc["cycle"] = cyc["cycle"] + cycle_offset
            cycle_offset = int(cyc["cycle"].max()) + 1
        if len(req) and req["finish_s"].notna().any():
            offset = float(req["finish_s"].max())
        requests.append(req)
        cycles.append(cyc)
    req = pd.concat(requests, ignore_index=True)
    cyc = pd.concat(cycles, ignore_index=True)
    first = parts[0][2]
    counters = add_counters([p[2].get("engine_counters") for p in parts])
    summary = {"method": first["method"], "gamma": first["gamma"], "status": "ok", "blocks": len(parts),
               **summarise(req, cyc, counters)}
    if counters is not None:
        summary["engine_counters"] = counters
    for key, value in first.items():  # peak memory: the highest block's
        if key.startswith("peak_") and all(key in p[2] for p in parts):
            summary[key] = max(p[2][key] for p in parts)
        elif key == "memory_method":
            summary[key] = value
    summary["policy"] = parts[-1][2].get("policy")
    windows = [p[2]["conditions"] for p in parts if p[2].get("conditions")]
    if windows:
        summary["conditions"] = merge_conditions(windows)
    return req, cyc, summary


def merge_conditions(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The conditions of a point measured in several windows: shares weighted by each window's wall time, the
    load average at the first window's start and the last one's end, the GPU's worst window; where it ran is
    the first window's (a point's blocks run in one process)."""
    wall = sum(w.get("wall_s") or 0.0 for w in windows) or 1e-9
    out = {**windows[0], "wall_s": round(sum(w.get("wall_s") or 0.0 for w in windows), 4),
           "load1_end": windows[-1].get("load1_end"), "windows": len(windows)}
    for key in ("others_cpu_share", "steal_share"):
        values = [(w.get(key), w.get("wall_s") or 0.0) for w in windows if w.get(key) is not None]
        out[key] = round(sum(v * t for v, t in values) / wall, 4) if values else None
    gpu = [w["gpu_others_util"] for w in windows if w.get("gpu_others_util") is not None]
    out["gpu_others_util"] = max(gpu) if gpu else None
    return out


Phases = Mapping[str, int]  # a phased workload: each phase's name -> its concurrency


def by_phase(requests: list[Request]) -> list[tuple[str | None, list[Request]]]:
    """``requests`` cut where their phase changes (in run order; one part when they have no phases)."""
    parts: list[tuple[str | None, list[Request]]] = []
    for request in requests:
        if not parts or parts[-1][0] != request.phase:
            parts.append((request.phase, []))
        parts[-1][1].append(request)
    return parts


def phase_blocks(requests: list[Request], size: int | None, phases: Phases) -> list[list[Request]]:
    """Each phase's requests cut into blocks of ``size`` (None: one batch of the phase's concurrency)."""
    return [block for name, part in by_phase(requests) for block in blocks_of(part, size or phases[name])]


def _warm_shapes(engine: Any, requests: list[Request], method: Method, warmup: int, phases: Phases | None,
                 measured: int) -> None:
    """Before a point's first phase: warm-up at every other phase's concurrency (``measured``'s is warmed up by the
    engine's own first block). Phases run on an engine that warms shapes (spectune's, in process)."""
    others = sorted(set((phases or {}).values()) - {measured})
    if others:
        engine.warm_shapes(requests, method, others, warmup)


def block_runner(engine: Any, methods: Mapping[str, Method], *, concurrency: int, warmup: int,
                 progress: RunProgress | None = None, phases: Phases | None = None) -> BlockRun:
    """A :data:`BlockRun` that measures a block on ``engine`` (a :class:`~spectune.engines.base.MeasuringEngine`):
    the method of a label from ``methods``, its first block of a repeat ``first_block`` (a policy starts afresh, a
    server starts clean) with the warm-up before it, its later blocks going on from there; each block's conditions
    recorded (merged per point by :func:`merge_blocks`), each finished request counted on ``progress`` (the run's one
    line). With ``phases`` a block runs at its phase's concurrency."""
    from spectune.run.conditions import Window

    def run(label: str, gamma: int, repeat: int, index: int, part: list[Request]) -> Frames:
        batch = phases[part[0].phase] if phases else concurrency
        if index == 0 and warmup and phases:
            _warm_shapes(engine, part, methods[label], warmup, phases, batch)
        with Window() as window:
            req, cyc, summary = engine.measure(part, methods[label], concurrency=batch,
                                               warmup=warmup if index == 0 else 0, first_block=index == 0,
                                               progress=progress)
        return req, cyc, {**summary, "conditions": window.record}

    return run


def phase_point(engine: Any, requests: list[Request], method: Method, *, phases: Phases, warmup: int,
                progress: RunProgress | None = None) -> Frames:
    """One point of a phased workload in the blocked design: its phases one after the other on ``engine``, each at
    its concurrency, an adaptive method carrying what it learned from phase to phase; merged into one run
    (:func:`merge_blocks`)."""
    parts = by_phase(requests)
    if warmup:
        _warm_shapes(engine, requests, method, warmup, phases, phases[parts[0][0]])
    frames = [engine.measure(part, method, concurrency=phases[name], warmup=warmup if index == 0 else 0,
                             first_block=index == 0, progress=progress)
              for index, (name, part) in enumerate(parts)]
    return merge_blocks(frames)


def run_interleaved(methods: list[tuple[str, int]], repeats: int, blocks: list[list[Request]],
                    run_block: BlockRun, *, done: Any = None, on_point: Callable[[Grid], None] | None = None,
                    progress: RunProgress | None = None) -> Grid:
    """Every method on every block, block after block, ``repeats`` times; one merged point per (method, repeat).

    ``done`` (a resume.Completed) supplies whole repeats measured before: a repeat all of whose points it holds is
    taken from it, any other is measured whole (its blocks interleave its methods, so a part of it cannot be
    reused). ``on_point`` sees the grid after each point is added. A block that raises RuntimeError, MemoryError or
    ValueError fails its (method, repeat) point: the method's later blocks of that repeat are skipped and the
    others go on (bad input, a SpectuneError, still stops). ``progress`` counts the points as they are merged
    (``run_block`` advances its requests)."""
    grid = Grid()

    def add(summary: dict[str, Any], frames: tuple[pd.DataFrame, pd.DataFrame] | None, repeat: int) -> None:
        if frames is not None:
            grid.requests.append(_tag(frames[0], repeat))
            grid.cycles.append(_tag(frames[1], repeat))
        grid.points.append({**summary, "repeat": repeat})
        if progress is not None:
            progress.point_done()
        if on_point is not None:
            on_point(grid)

    for repeat in range(repeats):
        order = rotation(methods, repeat)
        if done is not None and all((label, repeat) in done for label, _ in order):
            log.info("resume: repeat %d already complete, skipped", repeat)
            for label, _ in order:
                key = (label, repeat)
                grid.requests.append(done.requests[key])
                grid.cycles.append(done.cycles[key])
                grid.points.append({**done.summaries[key], "repeat": repeat})
                if progress is not None:
                    progress.skip(len(done.requests[key]), points=1)
            continue
        parts: dict[str, list[Frames]] = {label: [] for label, _ in methods}
        failed: dict[str, str] = {}
        for b, block in enumerate(blocks):
            for label, gamma in block_order(methods, repeat, b, len(blocks)):
                if label in failed:
                    continue
                try:
                    parts[label].append(run_block(label, gamma, repeat, b, block))
                except SpectuneError:
                    raise
                except _FAILURES as err:
                    failed[label] = f"{type(err).__name__}: {err}"
                    log.error(f"grid point {label} failed on block {b} (repeat {repeat}): {failed[label]}")
        for label, gamma in order:
            if label in failed or not parts[label]:
                add({"method": label, "gamma": gamma, "status": "failed", "error": failed.get(label, "no block ran")},
                    None, repeat)
            else:
                req, cyc, summary = merge_blocks(parts[label])
                add(summary, (req, cyc), repeat)
    return grid


def run_design(engine: Any, requests: list[Request], methods: Sequence[Method], repeats: int, *,
               block_prompts: int | None, concurrency: int, warmup: int, done: Any = None,
               on_point: Callable[[Grid], None] | None = None, what: str = "measuring",
               phases: Phases | None = None) -> Grid:
    """Every method of ``methods`` on ``requests``, ``repeats`` times, on ``engine`` (any
    :class:`~spectune.engines.base.MeasuringEngine`: spectune's own, or a server per method), in the run's
    design: interleaved block by block (:func:`run_interleaved`) when ``block_prompts`` is set, else each method on
    all prompts at once in the rotated order (:func:`spectune.measure.repeats.run_points`), every point's conditions
    recorded. ``phases`` (each phase's concurrency, the requests tagged with their phase in run order): every point
    runs phase by phase, and ``concurrency`` is not read. The run shows one progress line on stderr, ``what`` its
    first word (:class:`spectune.run.progress.RunProgress`)."""
    from spectune.measure.repeats import run_points, schedule
    from spectune.run.conditions import watched

    by_label = {m.label: m for m in methods}
    if len(by_label) != len(methods):
        raise SpectuneError(f"two methods share a label: {[m.label for m in methods]}")
    pairs = [(m.label, m.gamma) for m in methods]
    points = len(methods) * repeats
    with RunProgress(what, points * len(requests), points=points) as progress:
        if block_prompts is None:
            def point(label: str, gamma: int) -> Frames:
                if phases:
                    return phase_point(engine, requests, by_label[label], phases=phases, warmup=warmup,
                                       progress=progress)
                return engine.measure(requests, by_label[label], concurrency=concurrency, warmup=warmup,
                                      first_block=True, progress=progress)

            return run_points(schedule(pairs, repeats), watched(point), done=done, on_point=on_point,
                              progress=progress)
        block = block_runner(engine, by_label, concurrency=concurrency, warmup=warmup, progress=progress,
                             phases=phases)
        blocks = phase_blocks(requests, block_prompts, phases) if phases else blocks_of(requests, block_prompts)
        return run_interleaved(pairs, repeats, blocks, block, done=done, on_point=on_point, progress=progress)


def as_method(label: str, gamma: int, settings: Mapping[str, Any] | None = None) -> Method:
    """The method a (label, γ) pair of a task names: the label parsed where it is one (``ar``, ``fixed:gamma=4``),
    else a method tagged with it (a learned policy's own name, a duplicate such as ``fixed:gamma=4#2``), its name
    the policy's (``settings["name"]``). ``settings``: the policy node."""
    node = dict(settings or {})
    try:
        parsed = Method.parse(label)
    except SpectuneError:
        parsed = None
    if parsed is not None and parsed.gamma == gamma:
        return replace(parsed, settings=node)
    if gamma == 0:
        return Method(tag=label, settings=node)
    return Method(str(node.get("name") or label), gamma, settings=node, tag=label)
