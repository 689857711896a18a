"""Measure a cost profile: what a draft step, a verification and a cycle's overhead cost on this setup.

Measured through the engine's own session (the costs a replay must reproduce are the engine's, not bare
forwards'), with the device clock (synchronised reads; CUDA events inside a cycle): for every batch size b
and every n = 1 .. max_gamma+1, ``warmup`` cycles are discarded and ``repeats`` cycles of γ = n − 1 are
timed on rows of real workload prompts (EOS ignored, so every row stays busy). Recorded, as means
(throughput needs the expected cost, tail included): a cycle's first draft step t_first_draft(b) (over every cycle
with a draft; it also feeds the draft the tokens the last cycle emitted), every later draft step t_draft(b) (over
the cycles of γ ≥ 2), the verification t_verify(b, n) (n = 1 is the autoregressive step), and the per-cycle
overhead outside both (rollback, emission, bookkeeping). A least-squares line t_verify ≈ a + b·n per batch is
reported with its largest relative residual. ``task=profile`` writes the result; ``policies.train`` measures
one when it is given none.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from typing import Any

from spectune.costmodel.profile import Profile, dearer_note, fit_linear
from spectune.engine.policy import FixedGamma
from spectune.engine.records import Request
from spectune.errors import SpectuneError
from spectune.measure.models import Models
from spectune.measure.point import check_context_fits

log = logging.getLogger(__name__)


class _Gamma(FixedGamma):
    """γ = ``gamma`` every cycle, including 0 (the autoregressive step through the same session)."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma


def measure_cycles(engine: Any, requests: list[Request], batch: int, gamma: int, warmup: int, repeats: int) -> list:
    """``repeats`` timed cycles at ``gamma`` with ``batch`` busy rows (after ``warmup`` discarded ones)."""
    timed = []
    while len(timed) < repeats:
        session = engine.session(requests[:batch], _Gamma(gamma), batch)
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
                                f"{seen} cycles at γ {gamma}; lower task.warmup or raise workload.max_new_tokens")
    return timed


def measure_costs(engine: Any, requests: list[Request], sizes: list[int], max_gamma: int, warmup: int, repeats: int
                  ) -> tuple[dict, dict, dict, dict, dict]:
    """Means of the later draft steps, verification per n, overhead and a cycle's first draft step per batch size,
    and the linear fits.

    Means, not medians: throughput is total tokens over total time, so a replay must charge the expected
    cost of a step, tail included (on a shared machine the median understates it).
    """
    positions = max_gamma + 1
    draft, first, verify, overhead, fit = {}, {}, {}, {}, {}
    for b in sizes:
        firsts, steps, rests, verify[b] = [], [], [], []
        for n in range(1, positions + 1):
            cycles = measure_cycles(engine, requests, b, n - 1, warmup, repeats)
            verify[b].append(statistics.fmean(c.verify_s for c in cycles))
            rests += [c.rest_s for c in cycles]
            for c in cycles:
                if c.draft_step_s:  # step end times from the cycle's start
                    firsts.append(c.draft_step_s[0])
                    steps += [t1 - t0 for t0, t1 in itertools.pairwise(c.draft_step_s)]
        first[b] = statistics.fmean(firsts) if firsts else 0.0
        draft[b] = statistics.fmean(steps) if steps else first[b]  # max_gamma 1: no later step to tell apart
        overhead[b] = statistics.fmean(rests)
        fit[str(b)] = fit_linear(list(range(1, positions + 1)), verify[b])
        log.info("batch %d: first draft step %.3f ms, later draft step %.3f ms, AR step %.3f ms, verify(n=%d) "
                 "%.3f ms, overhead %.3f ms; c = %.3f, g(%d) = %.3f; fit a + b*n: a %.3f ms, b %.3f ms, max rel "
                 "residual %.1f%%", b, first[b] * 1e3, draft[b] * 1e3, verify[b][0] * 1e3, positions,
                 verify[b][-1] * 1e3, overhead[b] * 1e3, draft[b] / verify[b][0], max_gamma,
                 verify[b][-1] / verify[b][0], fit[str(b)]["a"] * 1e3,
                 fit[str(b)]["b"] * 1e3, fit[str(b)]["max_rel_residual"] * 100)
    return draft, verify, overhead, first, fit




def measure_profile(engine: Any, requests: list[Request], models: Models, sizes: list[int], max_gamma: int,
                    warmup: int, repeats: int, label: str, metadata: dict[str, Any]) -> Profile:
    """The cost profile of ``engine`` (on ``models``) at each batch size of ``sizes`` and γ 0..max_gamma,
    on rows of ``requests``' prompts (repeated to fill the largest batch; EOS ignored while measuring)."""
    eos, engine.eos = engine.eos, set()  # costs do not depend on content: keep every row busy
    try:
        positions = max_gamma + 1
        max_new = (warmup + repeats) * positions + 1  # enough tokens for warm-up + repeats at the deepest γ
        rows = [Request(i, r.prompt_id, r.language, r.input_ids, max_new, category=r.category)
                for i, r in enumerate(requests[i % len(requests)] for i in range(max(sizes)))]
        check_context_fits(rows, max_gamma, models.max_context)
        draft, verify, overhead, first, fit = measure_costs(engine, rows, sizes, max_gamma, warmup, repeats)
    finally:
        engine.eos = eos
    hardware = models.hardware
    dearer = [note for b in sizes if (note := dearer_note(b, verify[b]))]
    for note in dearer:
        log.warning(note)
    return Profile(
        label=str(label), batch_sizes=sizes, max_positions=positions, t_draft_s=draft, t_verify_s=verify,
        overhead_s=overhead, synthetic=False, models=models.pair.metadata, hardware=hardware,
        interpolated={b: False for b in sizes}, fit={"t_verify_s ~ a + b*n": fit},
        notes=[f"measured by task=profile through the engine's session: means of {repeats} cycles per (batch, n) "
               f"after {warmup} warm-up cycles; EOS ignored; clock: {hardware.get('clock')}",
               "t_first_draft_s: a cycle's first draft step (it also feeds the tokens the last cycle emitted); "
               "t_draft_s: every later draft step, as the engine runs it (forward, warp, draw); "
               "t_verify_s: target forward of n positions + exact sampler + the cycle's host sync; "
               "overhead_s: rollback, emission, bookkeeping",
               "not included: prefill and admission (per request, not per cycle)", *dearer],
        metadata={**metadata, "repeats": repeats, "warmup": warmup}, t_first_draft_s=first)
