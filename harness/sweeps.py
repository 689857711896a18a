"""Multirun behaviour: a job with bad input fails in one line, the sweep goes on, the exit code says so.

Each failing job writes ``error.json`` in its own run directory; at the end of the sweep this callback
(registered in conf/config.yaml) lists them and exits 2. Scanning the sweep directory works for every
launcher, including submitit's, whose jobs run in other processes. The lines are logged at ERROR, which the
logging configs (conf/hydra/*_logging/spectune.yaml) send to stderr as plain one-liners.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from spectune.errors import SpectuneError
from spectune.run import rundir

log = logging.getLogger(__name__)


class FlaggedRepeats(Callback):
    """At the end of a sweep, one console line per job with repeats measured under other load
    (``conditions.flagged_repeats`` in its summary.json, spectune.run.conditions): the jobs' own warnings are in
    their logs, which a submitit sweep's user does not see."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        for path in sorted(Path(config.hydra.sweep.dir).rglob(rundir.SUMMARY.name)):
            try:
                conditions = rundir.read_json(path).get("conditions") or {}
            except (SpectuneError, OSError, ValueError):
                continue
            flagged = [r for r in conditions.get("repeats", []) if r.get("flagged")]
            if flagged:
                worst = max(r.get("others_cpu_share_max", 0.0) for r in flagged)
                log.warning(f"warning: job {path.parent.name}: repeat(s) {', '.join(str(r['repeat']) for r in flagged)}"
                            f" measured under other load (others used up to {worst:.0%} of the node's CPU): "
                            f"see conditions in {path}")


class FailedJobsExit(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        errors = sorted(sweep_dir.rglob(rundir.ERROR.name))
        if not errors:
            return
        for path in errors:
            info = rundir.ERROR.read(path.parent)
            log.error(f"error: job {path.parent.name} ({' '.join(info['overrides'])}): {info['error']}")
        log.error(f"error: {len(errors)} job(s) of the sweep failed; the others' results are in {sweep_dir}")
        sys.exit(2)
