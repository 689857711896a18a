"""Which of this run's prompts any other committed run drew: the workload of run.sh composed as the harness composes
it (its prompts, per phase, from the target's tokenizer), against the prompt ids of every ``requests.parquet`` under
bench/results outside this folder. Registered before the run: 17, all by the main job on the tiny pair
(docs/registration/adaptive-regimes-batch-edge.md).

    python bench/results/adaptive-regimes-batch-edge-it-smollm2-cpu-20261207/unseen.py
"""

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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
# run.sh's workload, as it gives it to the harness
OVERRIDES = ["+workload=shift-it", "models=smollm2", "workload.task_max_new_tokens=128", "workload.profile=short",
             "workload.splits=[train,evaluate,select]"] + [f"workload.phases.{i}.token_budget=6144" for i in range(4)]
log = logging.getLogger("unseen")


def main() -> None:
    schemas.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=OVERRIDES)
    folder, _ = materialise(cfg.models.target.name_or_path)
    prompts = load_workload(cfg.workload, AutoTokenizer.from_pretrained(folder)).prompts
    ids = {p.id for p in prompts}
    log.info("%d prompts, per phase %s", len(ids), dict(Counter(p.phase for p in prompts)))
    drawn = Counter()
    for path in sorted((ROOT / "bench" / "results").rglob(rundir.REQUESTS.name)):
        if HERE in path.parents:
            continue
        seen = ids & set(pd.read_parquet(path, columns=["prompt_id"])["prompt_id"].astype(str))
        if seen:
            drawn[str(path.relative_to(ROOT))] = len(seen)
    log.info("drawn by other committed runs: %d prompts %s", sum(drawn.values()), dict(drawn))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
