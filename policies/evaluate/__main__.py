"""`python -m policies.evaluate +workload=it`: the command line of :mod:`policies.evaluate` (``conf/evaluate.yaml``).

Hydra's entry point lives here, in the module Python runs, so that Hydra finds ``conf/`` relative to this file.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from policies.evaluate import run, schema
from spectune import cli
from spectune.engine import proposers

schema.register()  # conf/evaluate.yaml's schemas (and train.yaml's), before Hydra composes (spectune/config.py)


def checked_evaluation(cfg: DictConfig, run_dir: Path) -> int:
    """``run`` once the proposer's settings are valid: one error line before any model loads."""
    proposers.check(cfg.get("proposer"))
    return run(cfg, run_dir)


@hydra.main(config_path="../../conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> int:
    return cli.run_job(checked_evaluation, cfg)


if __name__ == "__main__":
    cli.hydra_entry(main, "evaluate")
