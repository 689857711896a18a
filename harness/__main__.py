"""`python -m harness`: the Hydra application. Composes conf/config.yaml and runs ``task``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.errors import SpectuneError
from harness.io import write_json
from harness.logs import capture_warnings
from harness.resume import Interrupted, install_handlers, stop_on_signals, under_submitit
from harness.tasks import run_task

log = logging.getLogger("harness")

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
    capture_warnings()
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    where = f"hydra.sweep.dir={hydra_cfg.sweep.dir}" if multirun else f"hydra.run.dir={run_dir}"
    if multirun:  # a rerun into the same sweep directory (resume=true): this attempt decides, not the last one
        (run_dir / "error.json").unlink(missing_ok=True)
    try:
        # Outside submitit a SIGTERM / SIGINT drops the grid point in flight (never a half-written set of
        # files); under submitit the signals stay submitit's (checkpoint + requeue; the rerun resumes).
        with stop_on_signals(enabled=not under_submitit(), hint=where):
            code = run_task(cfg, run_dir)
    except SpectuneError as err:
        log.error(f"error: {err}")
        if multirun:  # the sweep goes on; harness.sweeps exits 2 at its end
            write_json(run_dir / "error.json", {"error": str(err), "overrides": list(hydra_cfg.overrides.task)})
            return 2
        sys.exit(2)
    except Interrupted as stop:
        log.error(f"error: {stop}: the grid point in flight was dropped, the completed ones are in {run_dir}; "
                  f"rerun the same command with resume=true {where} to finish")
        sys.exit(stop.exit_code)
    if code and not multirun:
        sys.exit(code)
    return code


if __name__ == "__main__":
    try:
        check_group_choices(sys.argv[1:])
    except SpectuneError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if not under_submitit():
        install_handlers()
    main()
