"""`python -m harness`: the Hydra application. Composes conf/config.yaml and runs ``task``."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.errors import SpectuneError
from harness.io import write_json
from harness.tasks import run_task


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        code = run_task(cfg, run_dir)
    except SpectuneError as err:
        print(f"error: {err}", file=sys.stderr)
        if hydra_cfg.mode == RunMode.MULTIRUN:  # the sweep goes on; harness.sweeps exits 2 at its end
            write_json(run_dir / "error.json", {"error": str(err), "overrides": list(hydra_cfg.overrides.task)})
            return 2
        sys.exit(2)
    if code and hydra_cfg.mode != RunMode.MULTIRUN:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
