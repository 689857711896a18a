"""Sweeps that survive: resume from the complete grid points on disk, stop cleanly on SIGTERM / SIGINT.

A grid point is the unit of work, keyed by ``(method label, repeat index)`` (repeat 0 when a run measures each
point once); the repeat is the unit that is kept (``spectune.run.conditions.whole_repeats``). A run rewrites its result
files atomically after every point, so a killed run leaves on disk exactly the points it finished. With
``resume=true`` a rerun into the same directory checks what is there -- same config (the recorded one minus
``resume``), readable files, a summary entry with status ok and the rows it counts -- and runs only the rest.

Preemption. Outside submitit, :func:`stop_on_signals` turns SIGTERM / SIGINT into :class:`Interrupted`: the
point in flight is dropped, the completed ones stay, and the application exits 128 + signal number with a
one-line message. Under submitit the signals are submitit's (SIGUSR2: checkpoint, requeue, rerun the job with
the same arguments); the rerun of the same submitit job is detected (its job id recorded in metadata.json, or
SLURM_RESTART_COUNT > 0) and resumes automatically through the same checks.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from spectune.errors import SpectuneError
from spectune.run import rundir

log = logging.getLogger(__name__)

PointKey = tuple[str, int]  # (method label, repeat index)
IGNORED_KEYS = ("resume",)  # config keys that may differ between the run and its resumption


# ----------------------------------------------------------------------------------------------------------
# Which run is this: a requeued submitit job resumes on its own.


def under_submitit() -> bool:
    """True inside a job started by submitit (local or SLURM): the signals are then submitit's."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def job_identity() -> dict[str, Any]:
    """What identifies this job across a requeue: submitit's job id (stable across SLURM's requeue and
    submitit-local's restart) and SLURM's restart count. Recorded in metadata.json."""
    if not under_submitit():
        return {}
    ident: dict[str, Any] = {"executor": os.environ["SUBMITIT_EXECUTOR"]}
    try:
        import submitit

        ident["submitit_job_id"] = str(submitit.JobEnvironment().job_id)
    except Exception as err:  # a missing id only disables the automatic resume
        log.warning("cannot read submitit's job id (%s); a requeued job will start over", err)
    if "SLURM_RESTART_COUNT" in os.environ:
        ident["slurm_restart_count"] = os.environ["SLURM_RESTART_COUNT"]
    return ident


def is_requeued(run_dir: Path) -> bool:
    """A submitit job that runs again after preemption: SLURM counts restarts; submitit-local does not,
    so the job id recorded by the previous attempt in ``metadata.json`` is compared with ours."""
    if not under_submitit():
        return False
    if int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0:
        return True
    previous = _read(rundir.METADATA, run_dir)
    job_id = job_identity().get("submitit_job_id")
    return bool(previous and job_id and previous.get("job", {}).get("submitit_job_id") == job_id)


def wants_resume(cfg: DictConfig, run_dir: Path) -> bool:
    """``resume=true``, or a requeued submitit job (which must not start its sweep over)."""
    if bool(cfg.resume):
        return True
    if is_requeued(run_dir):
        log.info("requeued job: resuming from the complete grid points in %s", run_dir)
        return True
    return False


# ----------------------------------------------------------------------------------------------------------
# What is already done.


@dataclass
class Completed:
    """The grid points found complete on disk, with their summary entries and their rows."""

    summaries: dict[PointKey, dict[str, Any]] = field(default_factory=dict)
    requests: dict[PointKey, pd.DataFrame] = field(default_factory=dict)
    cycles: dict[PointKey, pd.DataFrame] = field(default_factory=dict)

    def __contains__(self, key: PointKey) -> bool:
        return key in self.summaries

    def covers(self, keys: list[PointKey]) -> bool:
        return all(k in self for k in keys)


def point_key(row: dict[str, Any] | pd.Series) -> PointKey:
    """The key of a summary entry or a record row; runs without repeats are repeat 0."""
    repeat = row.get("repeat", 0)
    return str(row["method"]), 0 if repeat is None or pd.isna(repeat) else int(repeat)


def check_same_config(recorded: Any, cfg: DictConfig, run_dir: Path) -> None:
    """A resumed run must measure what the first one measured: the first differing key is a one-line error."""
    now = _comparable(OmegaConf.to_container(cfg, resolve=True))
    before = _comparable(recorded)
    diff = _first_difference(before, now)
    if diff is not None:
        key, old, new = diff
        raise SpectuneError(f"resume=true: {run_dir} holds results of another config: {key} was {old!r}, now "
                            f"{new!r}; use the same config or a new hydra.run.dir / hydra.sweep.dir")


def load_completed(run_dir: Path, cfg: DictConfig, keys: list[PointKey]) -> Completed:
    """The points of ``keys`` whose complete results are in ``run_dir`` (none when nothing usable is there).

    Checked, not assumed: the config recorded in metadata.json equals ours (else SpectuneError), summary.json,
    requests.parquet and cycles.parquet read back, and each point counted done has status ok, as many request
    rows as its summary completed + failed, and as many drafting cycles as it reports.
    """
    done = Completed()
    meta = _read(rundir.METADATA, run_dir)
    if meta is None:
        log.info("resume: no readable metadata.json in %s; running every grid point", run_dir)
        return done
    if "config" not in meta:
        log.warning("resume: %s/metadata.json records no config; running every grid point", run_dir)
        return done
    check_same_config(meta["config"], cfg, run_dir)
    summary = _read(rundir.SUMMARY, run_dir)
    requests, cycles = _read(rundir.REQUESTS, run_dir), _read(rundir.CYCLES, run_dir)
    if summary is None or requests is None or cycles is None:
        log.info("resume: summary.json / requests.parquet / cycles.parquet missing or unreadable in %s; "
                 "running every grid point", run_dir)
        return done
    wanted = set(keys)
    for entry in summary.get("points", summary.get("methods", [])):  # per-point entries (runs with repeats)
        key = point_key(entry)
        if key not in wanted or entry.get("status") != "ok":
            continue
        req = _rows(requests, key)
        cyc = _rows(cycles, key)
        expected = int(entry.get("completed", -1)) + int(entry.get("failed", 0))
        drafting = int((cyc["num_drafts"] > 0).sum()) if "num_drafts" in cyc else 0
        if len(req) != expected or drafting != int(entry.get("spec_decode_num_drafts", 0)):
            log.warning("resume: grid point %s is incomplete on disk (%d request rows for %d requests); rerunning",
                        key[0], len(req), expected)
            continue
        done.summaries[key], done.requests[key], done.cycles[key] = entry, req, cyc
    return done


def _rows(frame: pd.DataFrame, key: PointKey) -> pd.DataFrame:
    if not len(frame) or "method" not in frame:
        return frame.iloc[0:0]
    repeat = frame["repeat"].fillna(0).astype(int) if "repeat" in frame else 0
    return frame[(frame["method"] == key[0]) & (repeat == key[1])].reset_index(drop=True)


def _read(file: rundir.RunFile, run_dir: Path) -> Any:
    """``file`` of ``run_dir``, or None when it is missing or unreadable (then every point runs again)."""
    if not file.exists(run_dir):
        return None
    try:  # tables: resume checks the columns it counts on itself (``_rows``), not the full reader's set
        return rundir.read_parquet(file.path(run_dir)) if file.kind == "parquet" else file.read(run_dir)
    except SpectuneError as err:
        log.warning("resume: %s", err)
        return None


def _comparable(config: Any) -> Any:
    if isinstance(config, dict):
        return {k: v for k, v in config.items() if k not in IGNORED_KEYS and k != "hydra"}
    return config


def _first_difference(a: Any, b: Any, prefix: str = "") -> tuple[str, Any, Any] | None:
    """(dotted key, old, new) of the first difference between two plain configs, in sorted key order."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if key not in a or key not in b:
                return dotted, a.get(key, "<absent>"), b.get(key, "<absent>")
            diff = _first_difference(a[key], b[key], dotted)
            if diff is not None:
                return diff
        return None
    return None if a == b else (prefix or "<root>", a, b)


# ----------------------------------------------------------------------------------------------------------
# Stopping cleanly.


class Interrupted(BaseException):
    """SIGTERM / SIGINT arrived: the grid point in flight is abandoned, the completed ones are on disk.

    A BaseException, as KeyboardInterrupt is: the signal handler raises it wherever the main thread is, and a
    generic ``except Exception`` there must not swallow it (measured: one arriving inside ``log.info`` was caught
    by logging's ``Handler.handleError``, printed as a logging error, and the sweep ran on to exit code 0)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 143 for SIGTERM, 130 for SIGINT


_state: dict[str, Any] = {"active": False, "critical": 0, "pending": None, "hint": ""}


def _on_signal(signum: int, frame: Any) -> None:
    if _state["critical"]:
        _state["pending"] = signum  # raised when the write in progress has finished
        return
    if _state["active"]:
        raise Interrupted(signum)  # inside a job: harness.__main__ reports it and exits
    # Between the jobs of a sweep (or before the first): nothing is in flight, everything done is on disk.
    log.error(f"error: interrupted by {signal.Signals(signum).name} between jobs: the completed jobs' results are "
              f"on disk; rerun the same command with resume=true {_state['hint']}".rstrip())
    raise SystemExit(128 + signum)


def install_handlers() -> None:
    """For the whole process (a basic-launcher sweep runs its jobs one after another in it): SIGTERM and
    SIGINT stop it cleanly between jobs as well as inside one. Not under submitit (its signals are its own)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)


@contextmanager
def stop_on_signals(enabled: bool = True, hint: str = "") -> Iterator[None]:
    """Within, SIGTERM and SIGINT raise :class:`Interrupted` (outside submitit; under it, pass False).
    ``hint`` (e.g. ``hydra.sweep.dir=DIR``) completes the message of a signal that arrives between jobs."""
    if not enabled:
        yield
        return
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    _state.update(active=True, critical=0, pending=None, hint=hint)
    try:
        yield
    finally:
        _state.update(active=False, critical=0, pending=None)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Write a grid point's files as one unit: a signal arriving meanwhile is raised once they are all
    written, so summary.json never disagrees with the parquet files about which points are done."""
    _state["critical"] += 1
    try:
        yield
    finally:
        _state["critical"] -= 1
    pending = _state["pending"]
    if pending is not None and not _state["critical"]:
        _state["pending"] = None
        raise Interrupted(pending)
