"""`python -m harness task=profile +workload=en`: what a draft step, a verification and a cycle cost here.

Measured through the engine's own session (the costs a replay must reproduce are the engine's, not bare
forwards'), with the device clock (synchronised reads; CUDA events inside a cycle): for every batch size b
and every n = 1 .. max_gamma+1, ``task.warmup`` cycles are discarded and ``task.repeats`` cycles of γ
n − 1 are timed on rows of real workload prompts (EOS ignored, so every row stays busy). Recorded, as
means (throughput needs the expected cost, tail included): a cycle's first draft step t_first_draft(b) (over
every cycle with a draft; it also feeds the draft the tokens the last cycle emitted), every later draft step
t_draft(b) (over the cycles of γ ≥ 2), the verification t_verify(b, n) (n = 1 is the autoregressive step), and the
per-cycle overhead outside both (rollback, emission, bookkeeping). A least-squares line
t_verify ≈ a + b·n per batch is reported with its largest relative residual. Writes ``profile.json``
(schema: :mod:`spectune.costmodel.profile`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from spectune.measure.point import requests_of
from spectune.measure.profiling import measure_profile
from spectune.options import as_list, integer
from spectune.run import rundir

log = logging.getLogger(__name__)


def run(cfg: DictConfig, run_dir: Path) -> int:
    from workloads.setup import open_setup

    task = cfg.task
    sizes = sorted({integer(b, "task.batch_sizes", lo=1) for b in as_list(task.get("batch_sizes"), "task.batch_sizes")})
    max_gamma = integer(task.get("max_gamma"), "task.max_gamma", lo=1)
    repeats = integer(task.get("repeats"), "task.repeats", lo=1)
    warmup = integer(task.get("warmup"), "task.warmup", lo=0)
    setup = open_setup(cfg, "profile")
    label = task.get("label") or f"{cfg.models.name}-{cfg.hardware.name}"
    profile = measure_profile(setup.engine, requests_of(setup.workload.prompts, setup.workload.max_new_tokens),
                              setup.models, sizes, max_gamma, warmup, repeats, label, setup.metadata)
    path = rundir.PROFILE.write(run_dir, profile.to_json())
    log.info("wrote %s", path)
    return 0
