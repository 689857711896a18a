"""`python -m harness task=profile +workload=en`: what a draft step, a verification and a cycle cost here.

Measured through the engine's own session (the costs a replay must reproduce are the engine's, not bare
forwards'), with the device clock (synchronised reads; CUDA events inside a cycle): for every batch size b
and every n = 1 .. max_depth+1, ``task.warmup`` cycles are discarded and ``task.repeats`` cycles of depth
n − 1 are timed on rows of real workload prompts (EOS ignored, so every row stays busy). Recorded, as
means (throughput needs the expected cost, tail included): the draft step t_draft(b) (over every step of
every cycle with a draft), the verification t_verify(b, n) (n = 1 is the autoregressive step), and the
per-cycle overhead outside both (rollback, emission, bookkeeping). A least-squares line
t_verify ≈ a + b·n per batch is reported with its largest relative residual. Writes ``profile.json``
(schema: :mod:`harness.profile`).
"""

from __future__ import annotations

import itertools
import logging
import statistics
from pathlib import Path

from omegaconf import DictConfig

from harness import rundir
from harness.engine.policy import FixedGamma
from harness.errors import SpectuneError
from harness.profile import Profile, device_name, fit_linear
from harness.tasks._options import as_list, integer
from harness.tasks.trace import build_setup, check_depth, workload_requests

log = logging.getLogger(__name__)


class _Depth(FixedGamma):
    """γ = depth every cycle, including 0 (the autoregressive step through the same session)."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma


def measure(engine, requests: list, batch: int, depth: int, warmup: int, repeats: int) -> list:
    """``repeats`` timed cycles at ``depth`` with ``batch`` busy rows (after ``warmup`` discarded ones)."""
    timed = []
    while len(timed) < repeats:
        session = engine.session(requests[:batch], _Depth(depth), batch)
        seen = 0
        while not session.done and len(timed) < repeats:
            outcome = session.step()
            if outcome is None or len(outcome.rows) < batch:
                continue
            seen += 1
            if seen > warmup:
                timed.append(outcome)
        if seen <= warmup:
            raise SpectuneError(f"task.warmup={warmup} is out of range: a request of this workload allows only "
                                f"{seen} cycles at depth {depth}; lower task.warmup or raise workload.max_new_tokens")
    return timed


def measure_costs(engine, requests: list, sizes: list[int], max_depth: int, warmup: int, repeats: int
                  ) -> tuple[dict, dict, dict, dict]:
    """Means of the draft step, verification per n and overhead per batch size, and the linear fits.

    Means, not medians: throughput is total tokens over total time, so a replay must charge the expected
    cost of a step, tail included (on a shared machine the median understates it).
    """
    positions = max_depth + 1
    draft, verify, overhead, fit = {}, {}, {}, {}
    for b in sizes:
        steps, rests, verify[b] = [], [], []
        for n in range(1, positions + 1):
            cycles = measure(engine, requests, b, n - 1, warmup, repeats)
            verify[b].append(statistics.fmean(c.verify_s for c in cycles))
            rests += [c.rest_s for c in cycles]
            for c in cycles:
                marks = [0.0, *c.draft_step_s]
                steps += [t1 - t0 for t0, t1 in itertools.pairwise(marks)]
        draft[b], overhead[b] = statistics.fmean(steps), statistics.fmean(rests)
        fit[str(b)] = fit_linear(list(range(1, positions + 1)), verify[b])
        log.info("batch %d: draft step %.3f ms, AR step %.3f ms, verify(n=%d) %.3f ms, overhead %.3f ms; "
                 "c = %.3f, g(%d) = %.3f; fit a + b*n: a %.3f ms, b %.3f ms, max rel residual %.1f%%", b,
                 draft[b] * 1e3, verify[b][0] * 1e3, positions, verify[b][-1] * 1e3, overhead[b] * 1e3,
                 draft[b] / verify[b][0], max_depth, verify[b][-1] / verify[b][0], fit[str(b)]["a"] * 1e3,
                 fit[str(b)]["b"] * 1e3, fit[str(b)]["max_rel_residual"] * 100)

    return draft, verify, overhead, fit


def run(cfg: DictConfig, run_dir: Path) -> int:
    task = cfg.task
    sizes = sorted({integer(b, "task.batch_sizes", lo=1) for b in as_list(task.get("batch_sizes"), "task.batch_sizes")})
    max_depth = integer(task.get("max_depth"), "task.max_depth", lo=1)
    repeats = integer(task.get("repeats"), "task.repeats", lo=1)
    warmup = integer(task.get("warmup"), "task.warmup", lo=0)
    setup = build_setup(cfg, "profile")
    engine = setup.engine
    engine.eos = set()  # costs do not depend on content: keep every row busy
    positions = max_depth + 1
    # Enough tokens per request for warm-up + repeats cycles at the deepest depth.
    base = workload_requests(setup.workload)
    max_new = (warmup + repeats) * positions + 1
    requests = [type(r)(i, r.prompt_id, r.language, r.input_ids, max_new)
                for i, r in enumerate(base[i % len(base)] for i in range(max(sizes)))]
    check_depth(requests, max_depth, setup.max_context)

    draft, verify, overhead, fit = measure_costs(engine, requests, sizes, max_depth, warmup, repeats)

    meta = setup.metadata
    hardware = {**meta["hardware"], "device_name": device_name(setup.device)}
    label = task.get("label") or f"{cfg.models.name}-{cfg.hardware.name}"
    profile = Profile(
        label=str(label), batch_sizes=sizes, max_positions=positions, t_draft_s=draft, t_verify_s=verify,
        overhead_s=overhead, synthetic=False, models=meta["models"], hardware=hardware,
        interpolated={b: False for b in sizes}, fit={"t_verify_s ~ a + b*n": fit},
        notes=[f"measured by task=profile through the engine's session: means of {repeats} cycles per (batch, n) "
               f"after {warmup} warm-up cycles; EOS ignored; clock: {hardware.get('clock')}",
               "t_draft_s: one draft step as the engine runs it (forward, warp, draw); t_verify_s: target forward "
               "of n positions + exact sampler + the cycle's host sync; overhead_s: rollback, emission, bookkeeping",
               "not included: prefill and admission (per request, not per cycle)"],
        metadata={**meta, "repeats": repeats, "warmup": warmup})
    path = rundir.PROFILE.write(run_dir, profile.to_json())
    log.info("wrote %s", path)
    return 0
