"""Which of a held-out run's prompts other committed runs drew: its registration says they are unseen, and this
checks it. The run's workload is composed as the harness composes it, with the tasks' schemas (its prompts, per
phase, from the target's tokenizer); its prompt ids are looked up in every ``requests.parquet`` under bench/results
outside the run's own results folder. A results folder's ``unseen.py`` calls :func:`main` with its run's workload
overrides."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from harness.tasks import schemas
from spectune.models.gguf import materialise
from spectune.run import rundir
from workloads.loader import load_workload

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def workload_prompt_ids(overrides: list[str]) -> set[str]:
    """The prompt ids of the workload that ``overrides`` compose (logged with their count per phase)."""
    schemas.register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    folder, _ = materialise(cfg.models.target.name_or_path)
    prompts = load_workload(cfg.workload, AutoTokenizer.from_pretrained(folder)).prompts
    ids = {p.id for p in prompts}
    log.info("%d prompts, per phase %s", len(ids), dict(Counter(p.phase for p in prompts)))
    return ids


def drawn_by_others(ids: set[str], folder: Path, results: Path = RESULTS) -> Counter[str]:
    """How many of ``ids`` each ``requests.parquet`` under ``results`` (``bench/results``) outside ``folder`` drew,
    keyed by its path from the repository's root; files that drew none are left out."""
    drawn: Counter[str] = Counter()
    for path in sorted(results.rglob(rundir.REQUESTS.name)):
        if folder in path.parents:
            continue
        seen = ids & set(pd.read_parquet(path, columns=["prompt_id"])["prompt_id"].astype(str))
        if seen:
            drawn[str(path.relative_to(results.parents[1]))] = len(seen)
    return drawn


def main(folder: Path, overrides: list[str]) -> None:
    """A results folder's ``unseen.py``: log how many of its run's prompts other committed runs drew, and which."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    drawn = drawn_by_others(workload_prompt_ids(overrides), folder.resolve())
    log.info("drawn by other committed runs: %d prompts %s", sum(drawn.values()), dict(drawn))
