"""`python -m harness`: the Hydra application. Composes conf/config.yaml and runs ``task``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from harness import rundir
from harness.errors import SpectuneError
from harness.logs import capture_warnings
from harness.resume import Interrupted, install_handlers, stop_on_signals, under_submitit
from harness.tasks import run_task

log = logging.getLogger("harness")

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("task", "models", "hardware", "policy", "workload")


def check_override_syntax(argv: list[str]) -> None:
    """A malformed override (``gamma=[1,``) fails in one line, before Hydra prints its several-line message."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    args = get_args_parser().parse_known_args(argv)[0]
    parser = OverridesParser.create()
    parsed = []
    for override in args.overrides:
        try:
            parsed += parser.parse_overrides([override])
        except OverrideParseException as err:
            first = str(err).strip().splitlines()[0]
            raise SpectuneError(f"{override} is not a valid override: {first} (quote lists: 'key=[a,b]'; "
                                "grammar: https://hydra.cc/docs/advanced/override_grammar/basic)") from None
    # A sweep's jobs share their keys: the first job's overrides stand for all of them.
    check_keys_exist([_first_job(o) for o in parsed])


def _first_job(override: Any) -> str:
    """The override as the first job of its sweep sees it (``gamma=1,2`` → ``gamma=1``); others unchanged."""
    if not override.is_sweep_override():
        return override.input_line
    return f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}"


def check_keys_exist(overrides: list[str]) -> None:
    """A key that is not in the config (``task.alfas=...``) fails in one line naming it, before Hydra composes
    (whose own message is several lines, once per job of a sweep)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    own = [o for o in overrides if not o.lstrip("~+").startswith("hydra.") and not o.startswith("hydra/")]
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            compose(config_name="config", overrides=own)
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
        key = getattr(cause, "full_key", None)
        first = str(cause).strip().splitlines()[0]
        if "not in struct" in first and key:
            raise SpectuneError(f"{key} is not a key of the config: check its spelling, or add it with "
                                f"+{key}=...") from None
        raise SpectuneError(f"cannot apply the overrides: {first}") from None


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
        rundir.ERROR.path(run_dir).unlink(missing_ok=True)
    try:
        # Outside submitit a SIGTERM / SIGINT drops the grid point in flight (never a half-written set of
        # files); under submitit the signals stay submitit's (checkpoint + requeue; the rerun resumes).
        with stop_on_signals(enabled=not under_submitit(), hint=where):
            code = run_task(cfg, run_dir)
    except SpectuneError as err:
        log.error(f"error: {err}")
        if multirun:  # the sweep goes on; harness.sweeps exits 2 at its end
            rundir.ERROR.write(run_dir, {"error": str(err), "overrides": list(hydra_cfg.overrides.task)})
            return 2
        sys.exit(2)
    except OmegaConfBaseException as err:  # e.g. an override whose ${interpolation} does not resolve
        key = getattr(err, "full_key", None)
        first = str(err).strip().splitlines()[0]
        log.error(f"error: {key + ': ' if key else ''}{first}")
        if multirun:
            rundir.ERROR.write(run_dir, {"error": first, "overrides": list(hydra_cfg.overrides.task)})
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
        check_override_syntax(sys.argv[1:])
    except SpectuneError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if not under_submitit():
        install_handlers()
    main()
