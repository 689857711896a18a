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

from harness import rundir

log = logging.getLogger(__name__)


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
