"""``hydra/launcher=slurm``: hydra-submitit-launcher's SLURM launcher, with what a sweep on a shared cluster needs.

Hydra instantiates launchers from the ``hydra_plugins`` package only, hence this module's place. On top of the
stock launcher (one job array, ``array_parallelism`` at once, results in the sweep directory):

- before submitting, the request is checked against ``sinfo`` (``spectune.run.slurm.check_request``), and an sbatch
  refusal is one ``error:`` line naming the values asked and what the cluster offers; exit code 2, nothing of an
  earlier run in the sweep directory touched;
- ``additional_parameters.exclusive: false`` (or null) leaves the flag out, since sbatch has no ``--exclusive=false``;
- where the cluster keeps no accounting, job states come from squeue (``spectune.run.slurm.SqueueJob``);
- a job that ends without a result (cancelled, killed, crashed, out of requeues) is written to ``error.json`` in
  its run directory and the sweep goes on collecting the others; ``harness.sweeps.FailedJobsExit`` then lists the
  failures and exits 2. The stock launcher instead raises at the first such job, with a traceback.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import OmegaConf, open_dict

from spectune.run import rundir

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ImportError:  # no `cluster` extra: Hydra imports every plugin at start, which must not warn on every run
    from hydra.plugins.launcher import Launcher as SlurmLauncher

log = logging.getLogger("spectune.run.slurm")


class SpectuneSlurmLauncher(SlurmLauncher):
    """The stock SLURM launcher plus request checks, one-line refusals and per-job failure reports."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        extra = dict(self.params.get("additional_parameters") or {})
        if not extra.get("exclusive"):  # false / null: share nodes; sbatch knows only --exclusive[=user|mcs]
            extra.pop("exclusive", None)
        self.params["additional_parameters"] = extra

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit
        from submitit.core.utils import FailedJobError

        from spectune.errors import SpectuneError
        from spectune.run import slurm

        assert self.config is not None and job_overrides
        try:
            slurm.check_request(self.params)
        except SpectuneError as err:
            self._refuse(err)
        executor = self._executor(submitit)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Submitit 'slurm' sweep output dir : {sweep_dir}")
        params = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        captured = io.StringIO()
        try:
            with contextlib.redirect_stderr(captured):  # submitit prints sbatch's stderr before raising
                jobs = executor.map_array(self, *zip(*params, strict=True))
        except FailedJobError as err:
            self._refuse(slurm.refusal(str(err) or captured.getvalue(), self.params))
        log.info("submitted: SLURM job %s (%d array tasks)", jobs[0].job_id.split("_")[0], len(jobs))
        if slurm.accounting_enabled() is False:  # nothing in sacct: the same jobs, their states read from squeue
            folder = Path(self.params["submitit_folder"]).expanduser().absolute()
            jobs = [slurm.SqueueJob(folder=folder, job_id=job.job_id, tasks=job._tasks) for job in jobs]
        return [self._outcome(job, list(overrides), idx)
                for idx, overrides, job in zip(range(initial_job_idx, initial_job_idx + len(jobs)), job_overrides,
                                               jobs, strict=True)]

    # -- helpers ----------------------------------------------------------------------------------------------

    def _executor(self, submitit: Any) -> Any:
        """As the stock launcher builds it: ``max_num_timeout`` at construction, the rest as parameters."""
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        init = {"folder": self.params["submitit_folder"], "slurm_max_num_timeout": self.params["max_num_timeout"]}
        executor = submitit.AutoExecutor(cluster="slurm", **init)
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in self.params.items()
                                      if k not in ("submitit_folder", "max_num_timeout")})
        return executor

    @staticmethod
    def _refuse(err: Exception) -> None:
        log.error(f"error: {err}")
        sys.exit(2)

    def _outcome(self, job: Any, overrides: list[str], idx: int) -> JobReturn:
        """The job's JobReturn; a job that failed or ended without a result becomes an ``error.json``."""
        try:
            ret = job.results()[0]
        except Exception as err:  # UncompletedJobError / FailedJobError: cancelled, killed, crashed
            why = "out of requeues" if "timed-out too many times" in str(err) else f"state {job.state}"
            return self._failed(idx, overrides, f"SLURM job {job.job_id} ended without a result ({why}); "
                                                f"its log: {job.paths.stderr}")
        if ret.status == JobStatus.FAILED:
            err = ret._return_value
            return self._failed(idx, overrides, f"SLURM job {job.job_id} failed: {type(err).__name__}: {err}; "
                                                f"its log: {job.paths.stderr}")
        return ret

    def _run_dir(self, idx: int, overrides: list[str]) -> Path:
        """The job's run directory, as Hydra names it (``hydra.sweep.dir``/``hydra.sweep.subdir``)."""
        assert self.config is not None and self.hydra_context is not None
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.num = idx
            return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        except Exception:  # an unresolvable subdir: next to the others, by number
            return Path(str(self.config.hydra.sweep.dir)) / str(idx)

    def _failed(self, idx: int, overrides: list[str], message: str) -> JobReturn:
        run_dir = self._run_dir(idx, overrides)
        run_dir.mkdir(parents=True, exist_ok=True)
        if not rundir.ERROR.exists(run_dir):  # the job's own report (bad input) says more
            rundir.ERROR.write(run_dir, {"error": message, "overrides": filter_overrides(overrides)})
        ret = JobReturn(overrides=overrides, working_dir=str(run_dir), status=JobStatus.COMPLETED)
        ret.return_value = 2
        return ret
