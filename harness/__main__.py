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

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("task", "models", "hardware", "policy", "workload")


def check_group_choices(argv: list[str]) -> None:
    """An unknown option of a config group (``policy=greedy-guess``) fails in one line naming the choices,
    before Hydra composes (whose own message is several lines)."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS or not value:
            continue
        values = value[len("choice("):-1] if value.startswith("choice(") else value
        options = sorted(f.stem for f in (CONF / key).glob("*.yaml") if not f.stem.startswith("_"))
        for choice in values.split(","):
            if choice.strip() not in options:
                raise SpectuneError(f"{key}={choice.strip()!r} is unknown: choose one of {', '.join(options)}")


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
    try:
        check_group_choices(sys.argv[1:])
    except SpectuneError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
