"""Sweeps that survive: a killed multirun keeps complete files only, and resume=true runs only what is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from spectune.errors import SpectuneError
from spectune.run import resume
from tests.conftest import REPO, SMALL_BENCH


def _read_all(job_dir: Path) -> dict[str, object]:
    """Every result file of a job read back in full (raises on a truncated or half-written file)."""
    files: dict[str, object] = {}
    for name in ("metadata.json", "summary.json"):
        if (job_dir / name).exists():
            files[name] = json.loads((job_dir / name).read_text())
    for name in ("requests.parquet", "cycles.parquet"):
        if (job_dir / name).exists():
            files[name] = pd.read_parquet(job_dir / name)
    return files


@pytest.mark.slow(reason="kills and reruns a whole sweep through the CLI")
def test_a_killed_sweep_keeps_complete_files_and_resume_runs_only_the_rest(tmp_path):
    sweep = ["-m", *SMALL_BENCH, "task.baseline=false", "gamma=1,2", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.Popen([sys.executable, "-m", "harness", *sweep], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = tmp_path / "0" / "summary.json"
    deadline = time.monotonic() + 300
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), "the first job never finished"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "interrupted by SIGTERM" in errors[0] and "resume=true" in errors[0], err[-2000:]
    assert "Traceback" not in err

    # Every file on disk is complete: it reads back, and no temporary is left behind.
    assert not list(tmp_path.rglob("*.tmp")), list(tmp_path.rglob("*.tmp"))
    before = {d.name: _read_all(d) for d in tmp_path.iterdir() if d.is_dir() and d.name.isdigit()}
    done_before = {name for name, files in before.items() if "summary.json" in files}
    assert done_before == {"0"}, "the kill came too late to test anything"
    stamp = (tmp_path / "0" / "requests.parquet").stat().st_mtime_ns
    for name in done_before:
        summary = before[name]["summary.json"]
        assert [m["status"] for m in summary["methods"]] == ["ok"]
        assert len(before[name]["requests.parquet"]) == summary["methods"][0]["completed"] == 3

    rerun = subprocess.run([sys.executable, "-m", "harness", *sweep, "resume=true"], cwd=REPO, text=True,
                           capture_output=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    for name in done_before:  # skipped before any model loaded: its files were not rewritten
        assert "nothing to run" in (tmp_path / name / "__main__.log").read_text()
    assert (tmp_path / "0" / "requests.parquet").stat().st_mtime_ns == stamp
    for g, name in ((1, "0"), (2, "1")):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert [m["method"] for m in summary["methods"]] == [f"fixed:gamma={g}"]
        assert summary["methods"][0]["status"] == "ok"
    log = (tmp_path / "1" / "__main__.log").read_text()
    assert "nothing to run" not in log and "fixed:gamma=2" in log  # the missing job ran and logged its table
    assert "req/s" not in log and "\r" not in log  # progress bars stay on the terminal


@pytest.mark.slow(reason="bench runs through the CLI, twice")
def test_resume_reruns_only_the_missing_repeat_and_rejects_another_config(cli, tmp_path):
    """The repeat is the unit of resuming: a complete repeat is kept as it is, a partial one reruns whole (its
    points would otherwise pair measurements of two runs)."""
    args = [*[a for a in SMALL_BENCH if not a.startswith("task.repeats")], "task.repeats=2", "task.baseline=false",
            "gamma=[1,2]", f"hydra.run.dir={tmp_path}"]
    assert cli(*args).returncode == 0
    # Drop the last grid point from the summary, as if the run had been killed before it: repeat 1 is partial.
    summary = json.loads((tmp_path / "summary.json").read_text())
    summary["points"] = summary["points"][:-1]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    kept = pd.read_parquet(tmp_path / "requests.parquet")

    proc = cli(*args, "resume=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resume: repeat 0 already complete, skipped" in proc.stdout  # interleaved: a repeat is the unit
    assert "resume: repeat 1 is partial (1 of 2 points); rerunning it whole" in proc.stdout
    methods = [m["method"] for m in json.loads((tmp_path / "summary.json").read_text())["methods"]]
    assert methods == ["fixed:gamma=1", "fixed:gamma=2"]
    after = pd.read_parquet(tmp_path / "requests.parquet")
    first = after["repeat"] == 0  # the kept repeat's rows are the very same rows
    pd.testing.assert_frame_equal(after[first].reset_index(drop=True),
                                  kept[kept["repeat"] == 0].reset_index(drop=True))
    assert len(after[~first]) == 2 * 3
    points = json.loads((tmp_path / "summary.json").read_text())["points"]
    assert [(p["method"], p["repeat"]) for p in points] == [("fixed:gamma=1", 0), ("fixed:gamma=2", 0),
                                                            ("fixed:gamma=2", 1), ("fixed:gamma=1", 1)]
    assert json.loads((tmp_path / "metadata.json").read_text())["resumed_points"] == ["fixed:gamma=1",
                                                                                      "fixed:gamma=2"]

    other = cli(*[a for a in args if not a.startswith("gamma=")], "gamma=[1,3]", "resume=true")
    assert other.returncode == 2
    errors = [line for line in other.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "gamma was [1, 2], now [1, 3]" in errors[0], other.stderr[-2000:]


def _cfg(**over: object):
    base = {"seed": 1, "resume": True, "gamma": [1, 2], "task": {"name": "bench", "warmup": 1}}
    return OmegaConf.create({**base, **over})


def _write_run(run_dir: Path, cfg, methods: list[dict], rows: dict[str, int]) -> None:
    config = OmegaConf.to_container(cfg, resolve=True)
    (run_dir / "metadata.json").write_text(json.dumps({"config": {**config, "resume": False}}))
    (run_dir / "summary.json").write_text(json.dumps({"methods": methods}))
    req = pd.DataFrame({"method": [m for m, n in rows.items() for _ in range(n)]})
    req.to_parquet(run_dir / "requests.parquet")
    cyc = pd.DataFrame({"method": [m for m, n in rows.items() for _ in range(n)], "num_drafts": 0})
    cyc.to_parquet(run_dir / "cycles.parquet")


def test_load_completed_counts_only_points_whose_rows_are_all_there(tmp_path):
    cfg = _cfg()
    methods = [{"method": "a", "status": "ok", "completed": 2, "failed": 0},
               {"method": "b", "status": "ok", "completed": 3, "failed": 0},   # only 1 row on disk
               {"method": "c", "status": "failed", "error": "oom"}]
    _write_run(tmp_path, cfg, methods, {"a": 2, "b": 1})
    done = resume.load_completed(tmp_path, cfg, [("a", 0), ("b", 0), ("c", 0)])
    assert ("a", 0) in done and ("b", 0) not in done and ("c", 0) not in done
    assert len(done.requests[("a", 0)]) == 2
    assert not done.covers([("a", 0), ("b", 0)])


def test_load_completed_reruns_everything_when_a_file_is_unreadable(tmp_path):
    cfg = _cfg()
    _write_run(tmp_path, cfg, [{"method": "a", "status": "ok", "completed": 2, "failed": 0}], {"a": 2})
    (tmp_path / "requests.parquet").write_bytes(b"PAR1 not really")
    assert resume.load_completed(tmp_path, cfg, [("a", 0)]).summaries == {}
    assert resume.load_completed(tmp_path / "absent", cfg, [("a", 0)]).summaries == {}


def test_a_different_config_names_the_first_differing_key(tmp_path):
    _write_run(tmp_path, _cfg(), [], {})
    with pytest.raises(SpectuneError, match=r"task\.warmup was 1, now 2") as err:
        resume.load_completed(tmp_path, _cfg(task={"name": "bench", "warmup": 2}), [("a", 0)])
    assert "\n" not in str(err.value)
    resume.load_completed(tmp_path, _cfg(resume=False), [("a", 0)])  # `resume` itself may differ


def test_a_signal_during_the_writes_is_raised_after_them():
    with resume.stop_on_signals():
        with pytest.raises(resume.Interrupted) as stop, resume.deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            written = True  # the handler only recorded the signal
        assert written and stop.value.exit_code == 143
        with pytest.raises(resume.Interrupted) as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert stop.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_signal_inside_a_log_call_is_not_swallowed():
    """A signal that lands while a log record is being written (a handler that raises stands in for the signal
    arriving inside emit) still stops the job: logging's handleError catches Exception, not the interruption."""
    import logging

    class Arrives(logging.Handler):
        def emit(self, record):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            except Exception:  # what logging.StreamHandler.emit does with an error: handleError, then go on
                self.handleError(record)

    logger = logging.getLogger("spectune.test.signal")
    handler = Arrives()
    logger.addHandler(handler)
    try:
        with resume.stop_on_signals(), pytest.raises(resume.Interrupted) as stop:
            logger.warning("a table line")
        assert stop.value.exit_code == 143
    finally:
        logger.removeHandler(handler)


def test_a_requeued_submitit_job_resumes_on_its_own(tmp_path, monkeypatch):
    cfg = _cfg(resume=False)
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert not resume.wants_resume(cfg, tmp_path) and resume.wants_resume(_cfg(), tmp_path)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setattr(resume, "job_identity", lambda: {"submitit_job_id": "42"})
    assert not resume.wants_resume(cfg, tmp_path)  # first attempt: nothing recorded
    (tmp_path / "metadata.json").write_text(json.dumps({"job": {"submitit_job_id": "42"}}))
    assert resume.wants_resume(cfg, tmp_path)  # the same job again: requeued
    (tmp_path / "metadata.json").write_text(json.dumps({"job": {"submitit_job_id": "7"}}))
    assert not resume.wants_resume(cfg, tmp_path)  # another submission into the same directory
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert resume.wants_resume(cfg, tmp_path)


@pytest.mark.slow(reason="a submitit_local sweep requeued through the CLI")
def test_a_requeued_submitit_job_resumes_where_it_stopped(tmp_path):
    """submitit's own signal (SIGUSR2) checkpoints and requeues the job, which reruns the same command:
    it must keep the repeat it had finished instead of starting over."""
    args = [sys.executable, "-m", "harness", "-m", "hydra/launcher=submitit_local",
            *[a for a in SMALL_BENCH if not a.startswith("task.repeats")], "task.repeats=2",
            "task.baseline=false", "gamma=[1,2]", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.Popen(args, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    job_dir, deadline = tmp_path / "0", time.monotonic() + 300

    def points() -> int:
        try:
            return len(json.loads((job_dir / "summary.json").read_text())["points"])
        except (FileNotFoundError, ValueError, KeyError):
            return 0

    while points() < 2 and proc.poll() is None and time.monotonic() < deadline:  # repeat 0 complete
        time.sleep(0.05)
    meta = json.loads((job_dir / "metadata.json").read_text())
    assert meta["job"]["executor"] == "local" and meta["resumed_points"] == []
    job = subprocess.run(["pgrep", "-f", f"submitit.core._submit {tmp_path}"], capture_output=True,
                         text=True).stdout.split()  # this sweep's job process (its folder is in the command)
    assert len(job) == 1, job
    os.kill(int(job[0]), signal.SIGUSR2)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    log = (job_dir / "__main__.log").read_text()
    assert "requeued job: resuming" in log and "resume: repeat 0 already complete, skipped" in log
    summary = json.loads((job_dir / "summary.json").read_text())
    assert [m["method"] for m in summary["methods"]] == ["fixed:gamma=1", "fixed:gamma=2"]
    resumed = json.loads((job_dir / "metadata.json").read_text())["resumed_points"]
    assert resumed[:2] == ["fixed:gamma=1", "fixed:gamma=2"] and len(summary["points"]) == 4
