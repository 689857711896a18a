"""The front doors of spectune's command lines: one way to report bad input, one logging setup.

Two kinds of application share them:

- Hydra applications: ``python -m harness`` (the front door: every task, ``task=train`` and ``task=evaluate``
  included; the console script ``spectune``) and its aliases ``python -m policies.train`` and
  ``python -m policies.evaluate``, which run one task of conf/config.yaml::

      @hydra.main(config_path=str(cli.CONF), config_name="config", version_base="1.3")
      def main(cfg): return cli.run_job(train_policies, cfg)

      if __name__ == "__main__": cli.task_alias(main, "train", "python -m policies.train")

- argparse applications (``python -m analysis.report``, ``analysis.costmodel``, ``analysis.comparison``,
  ``policies.train.fit_classifier``)::

      def main(argv=None): return cli.run_command(parser, body, argv)

For both, bad input (a :class:`~spectune.errors.SpectuneError`, a malformed override, an unknown key or option, a
value of the wrong type for its schema (:mod:`spectune.config`), a bad argument) is one line ``error: <what is
wrong>`` on stderr and exit code 2, before any work starts when it can be told then, and never losing results
already written (every writer is atomic). In a Hydra multirun a job's bad input also lands in ``error.json`` in
its job directory: the sweep goes on and exits 2 at its end (:class:`harness.sweeps.FailedJobsExit`). Logging:
the Hydra applications log through the job logging config (conf/hydra/job_logging/spectune.yaml: messages on
stdout, warnings and errors on stderr, a timestamped job log in the run directory); the argparse ones log plain
messages on stdout. Both route ``warnings.warn`` into logging.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from spectune import config
from spectune.errors import SpectuneError
from spectune.run import rundir
from spectune.run.logs import capture_warnings

log = logging.getLogger(__name__)

CONF = Path(__file__).resolve().parents[2] / "conf"
# The config groups a command line chooses options of: conf/'s folders (hydra/ is Hydra's own), so that a new group
# (conf/proposer/) has its options checked without a change here.
GROUPS = tuple(sorted(d.name for d in CONF.iterdir() if d.is_dir() and d.name != "hydra"))
EXIT_BAD_INPUT = 2


def error_line(message: object) -> str:
    """The one line every front door prints for bad input."""
    return f"error: {str(message).strip().splitlines()[0] if str(message).strip() else message}"


def fail(message: object) -> NoReturn:
    """Print the error line on stderr and exit 2 (before logging is set up: argument checks)."""
    print(error_line(message), file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


# ---- Hydra applications ---------------------------------------------------------------------------------

def check_override_syntax(argv: list[str], config_name: str = "config") -> None:
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
    if args.multirun:
        check_swept_groups(parsed)
    # A sweep's jobs share their keys: the first job's overrides stand for all of them; its other values are
    # checked against the schemas on the first job's config.
    check_keys_exist([_first_job(o) for o in parsed], config_name,
                     [o for o in parsed if o.is_sweep_override()] if args.multirun else [])


def check_swept_groups(parsed: list[Any]) -> None:
    """``-m +workload=it,en workload.num_prompts=2`` fails in one line: Hydra composes a multirun once without its
    swept overrides, where the appended group (and so its keys) does not exist yet, and stops with a several-line
    "Could not override". ``++`` (add or override) is what such a key needs; a swept key composes per job as is."""
    swept = {o.key_or_group for o in parsed if o.is_sweep_override() and o.is_add()}
    for override in parsed:
        key = override.key_or_group
        if override.is_sweep_override() or override.is_add() or override.is_force_add():
            continue
        group = next((g for g in swept if key.startswith(f"{g}.")), None)
        if group is not None:
            raise SpectuneError(f"{override.input_line} cannot be set while +{group}=... is swept (Hydra composes "
                                f"the sweep once without +{group} first): write ++{override.input_line}")


def _first_job(override: Any) -> str:
    """The override as the first job of its sweep sees it (``gamma=1,2`` → ``gamma=1``); others unchanged."""
    if not override.is_sweep_override():
        return override.input_line
    return f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}"


def check_keys_exist(overrides: list[str], config_name: str = "config", sweeps: Sequence[Any] = ()) -> None:
    """A key that is not in the config (``task.alfas=...``) or a value of the wrong type for its schema
    (``task.warmup=abc``) fails in one line naming it, before Hydra composes (whose own message is several lines,
    once per job of a sweep). ``sweeps``: the sweep overrides (parsed), whose every value is checked too."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    own = [o for o in overrides if not o.lstrip("~+").startswith("hydra.") and not o.startswith("hydra/")]
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=own)
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
        if isinstance(cause, OmegaConfBaseException):
            raise SpectuneError(config.one_line(cause)) from None
        raise SpectuneError(f"cannot apply the overrides: {str(cause).strip().splitlines()[0]}") from None
    check_swept_values(cfg, sweeps)


def check_swept_values(cfg: DictConfig, sweeps: Sequence[Any]) -> None:
    """Every value of a swept key (``-m task.warmup=1,abc``) is set on the first job's config, so that a later
    job's value of the wrong type fails in one line before any job starts (Hydra would compose that job only when
    it comes, and stop the sweep there in several lines). Swept config groups are checked by their choices."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in sweeps:
        key = override.key_or_group
        if override.is_delete() or key.startswith("hydra") or ("." not in key and key in GROUPS):
            continue
        for text in override.sweep_string_iterator():
            value = parser.parse_override(f"{override.get_key_element()}={text}").value()
            try:
                OmegaConf.update(cfg, key, value, merge=True, force_add=override.is_add() or override.is_force_add())
            except OmegaConfBaseException as err:
                raise SpectuneError(f"{config.one_line(err)} (a value of the sweep {override.input_line})") from None


def check_group_choices(argv: list[str]) -> None:
    """An unknown option of a config group (``policy=greedy-guess``), or of one of Hydra's own groups
    (``hydra/launcher=slrum``), fails in one line naming the choices, before Hydra composes (whose own message is
    several lines)."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or not value or (key not in GROUPS and not key.startswith("hydra/")):
            continue
        options = _group_options(key)
        if not options and key not in GROUPS:  # a hydra/ group Hydra does not know: its own error says so
            continue
        values = value[len("choice("):-1] if value.startswith("choice(") else value
        for choice in values.split(","):
            if choice.strip() not in options:
                raise SpectuneError(f"{key}={choice.strip()!r} is unknown: choose one of {', '.join(options)}")


def _group_options(key: str) -> list[str]:
    """A group's options: conf/'s files for the project's groups; what Hydra finds (its plugins' included) for its
    own ``hydra/...`` groups, which only Hydra's config loader knows."""
    if key in GROUPS:
        return sorted(f.stem for f in (CONF / key).glob("*.yaml") if not f.stem.startswith("_"))
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return sorted(GlobalHydra.instance().config_loader().get_group_options(key))


# Groups every application's config has a default for: ``+group=option`` (Hydra's "append", an error for a group
# already in the defaults list) means ``group=option``. policies.train/evaluate took ``+proposer=lookup`` before
# their configs had a proposer default, and committed results' commands say so.
DEFAULTED_GROUPS = ("proposer",)


def settle_appended_groups(argv: list[str]) -> list[str]:
    """``argv`` with ``+proposer=lookup`` written ``proposer=lookup`` (:data:`DEFAULTED_GROUPS`); others as given."""
    return [arg[1:] if arg.startswith("+") and not arg.startswith("++")
            and arg[1:].partition("=")[0] in DEFAULTED_GROUPS else arg for arg in argv]


def hydra_entry(main: Callable[[], Any], config_name: str, resumable: bool = False) -> None:
    """``if __name__ == "__main__"`` of a Hydra application: check the command line (one line, exit 2, no job
    started), then run ``main``. ``resumable``: SIGTERM/SIGINT stop the process cleanly between and inside jobs
    (the harness tasks, whose reruns resume); not under submitit, whose signals are its own."""
    from spectune.run.resume import install_handlers, under_submitit

    sys.argv[1:] = settle_appended_groups(sys.argv[1:])  # before Hydra reads them
    try:
        check_group_choices(sys.argv[1:])
        check_override_syntax(sys.argv[1:], config_name)
    except SpectuneError as err:
        fail(err)
    if resumable and not under_submitit():
        install_handlers()
    main()


def task_alias(main: Callable[[], Any], task: str, alias: str) -> None:
    """``if __name__ == "__main__"`` of an alias of one task (``python -m policies.train`` for ``python -m harness
    task=train``): the command line with ``task=<task>`` among its overrides, then :func:`hydra_entry`. Another
    ``task=...`` is one error line; ``--help`` says first that ``python -m harness task=<task>`` is the front door."""
    from hydra._internal.utils import get_args_parser

    argv = [arg for arg in sys.argv[1:] if arg != f"task={task}"]
    other = next((arg for arg in argv if arg.lstrip("+~").startswith("task=")), None)
    if other is not None:
        fail(f"{other} is invalid with {alias}: it runs task={task} (python -m harness {other} runs that task)")
    if "--help" in argv or "-h" in argv:
        print(f"{alias} is an alias of `python -m harness task={task}`, the front door (the same keys and outputs; "
              f"the console script `spectune task={task}` after pip install -e .).\n")
    overrides = get_args_parser().parse_known_args(argv)[0].overrides
    at = argv.index(overrides[0]) if overrides else len(argv)  # Hydra reads the overrides as one run of arguments
    sys.argv[1:] = [*argv[:at], f"task={task}", *argv[at:]]
    hydra_entry(main, "config")


def run_job(job: Callable[[DictConfig, Path], int], cfg: DictConfig, resumable: bool = False) -> int:
    """The body of a Hydra job: ``job(cfg, run_dir)``, bad input as one ``error:`` line and exit code 2 (in a
    multirun: ``error.json`` in the job directory, and the sweep goes on). Returns the job's exit code; a single
    run exits with it when it is not 0."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from spectune.run.resume import Interrupted, stop_on_signals, under_submitit

    capture_warnings()
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    where = f"hydra.sweep.dir={hydra_cfg.sweep.dir}" if multirun else f"hydra.run.dir={run_dir}"
    if multirun:  # a rerun into the same sweep directory (resume=true): this attempt decides, not the last one
        rundir.ERROR.path(run_dir).unlink(missing_ok=True)

    def bad_input(message: str) -> int:
        log.error(error_line(message))
        if not multirun:
            sys.exit(EXIT_BAD_INPUT)
        rundir.ERROR.write(run_dir, {"error": message, "overrides": list(hydra_cfg.overrides.task)})
        return EXIT_BAD_INPUT  # harness.sweeps.FailedJobsExit exits 2 at the sweep's end

    try:
        # Outside submitit a SIGTERM / SIGINT drops the grid point in flight (never a half-written set of
        # files); under submitit the signals stay submitit's (checkpoint + requeue; the rerun resumes).
        with stop_on_signals(enabled=resumable and not under_submitit(), hint=where):
            code = job(cfg, run_dir)
    except SpectuneError as err:
        return bad_input(str(err))
    except OmegaConfBaseException as err:  # e.g. an override whose ${interpolation} does not resolve
        return bad_input(config.one_line(err))
    except Interrupted as stop:
        log.error(f"error: {stop}: the grid point in flight was dropped, the completed ones are in {run_dir}; "
                  f"rerun the same command with resume=true {where} to finish")
        sys.exit(stop.exit_code)
    if code and not multirun:
        sys.exit(code)
    return code


# ---- argparse applications ------------------------------------------------------------------------------

class ArgumentParser(argparse.ArgumentParser):
    """argparse with spectune's error style: ``error: <what is wrong> (see <prog> --help)``, one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)")


def plain_logging() -> None:
    """Log lines as plain messages on stdout, unless the caller (a notebook, a test) configured logging;
    warnings go through logging too."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    capture_warnings()


def run_command(parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], int | None],
                argv: Sequence[str] | None = None) -> int:
    """The body of an argparse application: parse ``argv`` (bad arguments: one line, exit 2), set up logging, run
    ``body(args)`` (its exit code; None is 0); a :class:`SpectuneError` is one ``error:`` line on stderr and exit
    code 2."""
    args = parser.parse_args(argv)
    plain_logging()
    try:
        code = body(args)
        return 0 if code is None else code
    except SpectuneError as err:
        print(error_line(err), file=sys.stderr)
        return EXIT_BAD_INPUT
