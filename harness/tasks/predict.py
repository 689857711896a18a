"""`python -m harness task=predict proposer=lookup +workload=en`: what a model-free draft would give, before timing.

The target decodes every prompt greedily, one request at a time (autoregressive: the outputs every greedy method
emits). From those outputs :mod:`spectune.engine.proposers.replay` replays prompt lookup (or suffix decoding,
``proposer=suffix``: any proposer whose entry is replayable) at each γ of ``task.gammas`` exactly (greedy
verification accepts a draft iff it is the target's own next token) and counts the copyable fraction; with a cost
profile of the same pair on this machine (``task.profile``: a ``task=profile`` run's profile.json, or a shipped
profile's name) it predicts the decode speed-up per category. Written down before the timed runs (``task=bench
proposer=lookup``), the prediction is what they confirm or refute. Writes ``prediction.parquet`` (a row per request
and γ), ``prediction.json`` (per category and γ, with an ``all`` row, and what the target wrote per category) and
``metadata.json``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from spectune.costmodel.profile import check_profile, load_profile
from spectune.engine import proposers
from spectune.engine.proposers.replay import COPY_N, GreedyOutput, replay
from spectune.engine.records import requests_frame
from spectune.errors import SpectuneError
from spectune.measure.point import requests_of
from spectune.measure.prediction import by_category, price
from spectune.options import as_list, integer
from spectune.run import rundir
from spectune.run.progress import RunProgress
from workloads.answers import answers_by_category, reading, warnings

log = logging.getLogger(__name__)


def check_greedy_lookup(cfg: DictConfig) -> None:
    """The replay is exact for greedy decoding and a model-free proposer only: say so before any model loads."""
    entry = proposers.entry_of(cfg.get("proposer"))
    if not entry.replayable:
        replayable = [name for name in proposers.names() if proposers.entry(name).replayable]
        raise SpectuneError(f"proposer={entry.name} cannot be predicted by task=predict: it replays a model-free "
                            f"proposer; add {' or '.join(f'proposer={name}' for name in replayable)}")
    temperature = cfg.workload.sampling.temperature if cfg.get("workload") else 0
    if float(temperature) != 0:
        raise SpectuneError(f"workload.sampling.temperature={temperature} is out of range for task=predict: its "
                            "replay is exact for greedy decoding only; allowed: 0")
    mix = cfg.workload.get("sampling_mix") if cfg.get("workload") else None
    if mix and any(float(entry.get("temperature", 0)) != 0 for entry in mix):
        raise SpectuneError("workload.sampling_mix has a temperature above 0, out of range for task=predict: its "
                            "replay is exact for greedy decoding only; allowed: null or temperature 0 throughout")


def run(cfg: DictConfig, run_dir: Path) -> int:
    from workloads.setup import open_setup

    task = cfg.task
    gammas = sorted({integer(g, "task.gammas", lo=1) for g in as_list(task.gammas, "task.gammas")})
    check_greedy_lookup(cfg)
    profile = load_profile(task.profile) if task.profile else None
    setup = open_setup(cfg, "predict")
    synthetic = check_profile(profile, setup.metadata, bool(task.allow_profile_mismatch)) if profile else None
    requests = requests_of(setup.workload.prompts, setup.workload.max_new_tokens, setup.workload.ignore_eos)
    engine = setup.engine
    log.info("decoding %d prompts greedily (autoregressive, one at a time)", len(requests))
    with RunProgress("greedy", len(requests)) as progress:
        finished = engine.run(requests, None, 1, on_finish=lambda _: progress.advance()).requests
    records = {r.request_id: r for r in finished}
    outputs = [GreedyOutput(r.request_id, r.prompt_id, r.category, r.input_ids, records[r.request_id].output_ids,
                            r.max_new_tokens) for r in requests]
    frame = replay(outputs, engine.draft, gammas, engine.eos)
    if profile is not None:
        frame = price(frame, profile.costs(1))
    table = by_category(frame)
    rundir.METADATA.write(run_dir, setup.metadata)
    rundir.PREDICTION.write(run_dir, frame)
    summary = {"proposer": {**OmegaConf.to_container(cfg.proposer, resolve=True),
                            "stop_ids": list(engine.draft.stop_ids)},
               "gammas": gammas, "copy_n": COPY_N, "profile": profile.label if profile else None,
               "synthetic": synthetic,
               "by_category": table.to_dict(orient="records")}
    # what the target wrote: a copy that is no answer (a translation left untranslated, a loop) is copyable too
    answers = answers_by_category(requests_frame(finished), *reading(setup.models.tokenizer),
                              setup.workload.max_new_tokens)
    summary["answers_by_category"] = answers.reset_index().to_dict(orient="records")
    path = rundir.PREDICTION_SUMMARY.write(run_dir, summary)
    for line in table_lines(table):
        log.info("%s", line)
    for line in warnings(answers):
        log.warning("%s", line)
    log.info("wrote %s", path)
    return 0


def table_lines(table: Any) -> list[str]:
    """The per-category prediction as printed: one line per (γ, category)."""
    priced = "predicted_speedup" in table
    head = f"{'gamma':>5}  {'category':<10} {'requests':>8} {'tokens':>7} {'copyable':>8} {'acc.len':>7} {'no-prop':>7}"
    lines = [head + (f" {'predicted':>9}" if priced else "")]
    for row in table.itertuples():
        line = (f"{row.gamma:>5}  {row.category:<10} {row.requests:>8} {row.output_tokens:>7} "
                f"{row.copyable_fraction:>8.2f} {row.acceptance_length:>7.2f} {row.no_proposal_share:>7.2f}")
        lines.append(line + (f" {row.predicted_speedup:>8.2f}x" if priced else ""))
    return lines
