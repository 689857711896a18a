"""Sweeps through a real SLURM cluster (``hydra/launcher=slurm``): jobs through sbatch as a job array, the GPU request
checked by the scheduler, bad requests in one line, a failing job reported while the others finish, ``scontrol
requeue`` and the time limit resumed from whole repeats, ``scancel`` leaving every completed point readable.

Marker ``cluster``: they need a running cluster (``scripts/slurm-local up``; ``.ci/run`` starts one) and are skipped,
with the reason, when none answers. Small runs (3 prompts, 8 new tokens) except where a job must still be running
when it is requeued or reaches its time limit. Never run them beside a measurement: they load the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow(reason="sweeps through sbatch on the one-node cluster")]

SMALL = ["++workload.categories=[chat-lines]", "++workload.num_prompts=3", "++workload.max_new_tokens=8",
         "task.warmup=1"]
LONG = ["++workload.categories=[chat-lines]", "++workload.num_prompts=8", "++workload.max_new_tokens=64",
        "task.warmup=1"]  # 3-7 s per point


def sweep(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "-m", "hydra/launcher=slurm", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", "-m", "hydra/launcher=slurm", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def points(run_dir: Path) -> list[dict]:
    try:
        return json.loads((run_dir / "summary.json").read_text())["points"]
    except (FileNotFoundError, ValueError, KeyError):
        return []


def wait_for(condition, timeout: float = 600, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def job_field(job_id: str, field: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return next((tok.split("=", 1)[1] for tok in out.split() if tok.startswith(f"{field}=")), "")


def repeats_whole(pts: list[dict]) -> bool:
    """Every repeat's points were measured in one allocation (same job, restart and node)."""
    seen: dict[int, set] = {}
    for p in pts:
        c = p["conditions"]
        seen.setdefault(p["repeat"], set()).add((c["job_id"], c["restart_count"], c["node"]))
    return all(len(v) == 1 for v in seen.values())


def test_a_two_job_sweep_runs_as_one_job_array_through_sbatch(slurm_cluster, tmp_path):
    done = sweep("+workload=it,en", *SMALL, "task.repeats=2", "gamma=[1,2]", f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    console = done.stdout + done.stderr
    assert "sacct" not in console and "Bypassing" not in console  # accounting is off here: states from squeue
    ids = []
    for job in ("0", "1"):
        summary = json.loads((tmp_path / job / "summary.json").read_text())
        meta = json.loads((tmp_path / job / "metadata.json").read_text())
        assert meta["job"]["executor"] == "slurm" and meta["hardware"]["torch_threads"] == 1  # cpus_per_task: 1
        assert [m["status"] for m in summary["methods"]] == ["ok"] * 3
        assert len(summary["conditions"]["repeats"]) == 2 and set(summary["speedup_per_repeat"]) == {
            "ar", "fixed:gamma=1", "fixed:gamma=2"}
        assert repeats_whole(summary["points"])
        ids.append(summary["points"][0]["conditions"]["job_id"])
    array = ids[0].split("_")[0]
    assert ids == [f"{array}_0", f"{array}_1"]  # one array, one task per sweep job
    assert "--exclusive" in (tmp_path / ".submitit" / array / f"{array}_submission.sh").read_text()
    assert job_field(ids[0], "OverSubscribe") == "NO"


def test_the_readme_gpu_settings_go_through_sbatch_and_get_a_gpu(slurm_cluster, tmp_path):
    """The README's one-GPU-per-job example, with this cluster's partition; the job runs on CPU here, but the
    scheduler allocated it the (device-less) GPU it asked for."""
    gpus = subprocess.run(["sinfo", "--noheader", "--format=%G"], capture_output=True, text=True).stdout
    if "gpu" not in gpus:
        pytest.skip(f"the cluster declares no GPU GRES ({gpus.strip()}); scripts/slurm-local up declares one")
    done = sweep("+workload=en", *SMALL, "task.repeats=1", "gamma=[2]", f"hydra.launcher.partition={slurm_cluster}",
                 "hydra.launcher.gpus_per_node=1", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
                 "hydra.launcher.timeout_min=20", f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    job = points(tmp_path / "0")[0]["conditions"]["job_id"]
    assert "gres/gpu=1" in job_field(job, "TRES") or "gpu:1" in job_field(job, "TresPerNode")


@pytest.mark.parametrize(("override", "named"), [
    ("hydra.launcher.partition=no-such-partition", "hydra.launcher.partition='no-such-partition'"),
    ("hydra.launcher.gpus_per_node=64", "hydra.launcher.gpus_per_node=64"),
    ("hydra.launcher.cpus_per_task=4096", "hydra.launcher.cpus_per_task=4096"),
    ("hydra.launcher.mem_gb=100000", "mem_gb=100000"),  # passes the checks; sbatch itself refuses
])
def test_a_request_the_cluster_cannot_meet_is_one_line_and_keeps_the_sweep_dir(slurm_cluster, tmp_path, override,
                                                                                named):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "summary.json").write_text('{"points": []}')  # what an earlier run completed
    done = sweep("+workload=it,en", *SMALL, override, f"hydra.sweep.dir={tmp_path}", timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], done.stderr
    assert slurm_cluster in lines[0]  # what the cluster offers
    assert (tmp_path / "0" / "summary.json").read_text() == '{"points": []}'


def test_a_failing_job_is_reported_in_its_error_json_while_the_other_finishes(slurm_cluster, tmp_path):
    done = sweep("+workload=en", *SMALL, "task.repeats=1", "gamma=[2]", "concurrency=1,0",
                 f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 2
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["methods"][0]["status"] == "ok"
    error = json.loads((tmp_path / "1" / "error.json").read_text())
    assert "concurrency=0" in error["error"] and "concurrency=0" in error["overrides"]
    assert "error: 1 job(s) of the sweep failed" in done.stderr


def test_scontrol_requeue_mid_sweep_resumes_and_keeps_whole_repeats(slurm_cluster, tmp_path):
    proc = start("+workload=en", *LONG, "task.repeats=3", "gamma=[1,2]", f"hydra.sweep.dir={tmp_path}")
    run = tmp_path / "0"
    wait_for(lambda: len(points(run)) >= 4 or proc.poll() is not None, what="repeat 1 to start")
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    before = points(run)
    job = before[0]["conditions"]["job_id"]
    subprocess.run(["scontrol", "requeue", job], check=True)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    after = points(run)
    assert len(after) == 9 and all(p["status"] == "ok" for p in after)
    assert repeats_whole(after)  # a partial repeat was rerun whole after the restart
    assert max(p["conditions"]["restart_count"] for p in after) >= 1
    kept = [p for p in after if p["conditions"]["restart_count"] == 0]
    assert {p["repeat"] for p in before if sum(q["repeat"] == p["repeat"] for q in before) == 3} <= {
        p["repeat"] for p in kept}  # every repeat complete before the requeue was kept, not rerun
    assert "requeued job: resuming" in (run / "__main__.log").read_text()


def test_a_job_at_its_time_limit_is_checkpointed_requeued_and_resumes(slurm_cluster, tmp_path):
    """Time limit 2 minutes, submitit's signal 50 s before it (the controller checks every 30 s, so it comes 40-70 s
    into the job): the job stops, requeues itself (max_num_timeout) and resumes from its whole repeats. The sweep is
    sized never to finish (200 repeats), so the test does not depend on the machine's speed; it is cancelled once a
    point of the resumed allocation is written. That a requeued job then runs to its end is the ``scontrol requeue``
    test's (the same resume path); waiting here for a time-limited job to end took 12 of CI's 22 minutes."""
    proc = start("+workload=en", *LONG, "task.repeats=200", "gamma=[1,2]", "hydra.launcher.timeout_min=2",
                 "hydra.launcher.signal_delay_s=50", "hydra.launcher.max_num_timeout=20",
                 f"hydra.sweep.dir={tmp_path}")
    run = tmp_path / "0"
    try:
        wait_for(lambda: any(p["conditions"]["restart_count"] >= 1 for p in points(run)) or proc.poll() is not None,
                 timeout=600, what="a point measured after the time-limit requeue")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        log = (run / "__main__.log").read_text()
        assert "this job is timed-out" in log and "Requeued job" in log, log[-2000:]
        assert "requeued job: resuming" in log
        after = points(run)
        first = [p for p in after if p["conditions"]["restart_count"] == 0]
        assert len(first) >= 3 and repeats_whole(after)  # whole repeats kept from before the limit; none split
        assert all(p["status"] == "ok" for p in after)
    finally:
        written = points(run)
        if written:
            subprocess.run(["scancel", written[0]["conditions"]["job_id"].split("_")[0]], check=False)
        proc.communicate(timeout=300)


def test_scancel_of_the_sweep_leaves_every_completed_point_readable(slurm_cluster, tmp_path):
    proc = start("+workload=it,en", *LONG, "task.repeats=3", "gamma=[1,2]", f"hydra.sweep.dir={tmp_path}")
    wait_for(lambda: len(points(tmp_path / "0")) >= 2 or proc.poll() is not None, what="two points")
    array = points(tmp_path / "0")[0]["conditions"]["job_id"].split("_")[0]
    subprocess.run(["scancel", array], check=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    kept = points(tmp_path / "0")
    assert len(kept) >= 2 and all(p["status"] == "ok" for p in kept)
    import pandas as pd

    assert len(pd.read_parquet(tmp_path / "0" / "requests.parquet")) >= 3 * 2
    cancelled = [d for d in ("0", "1") if (tmp_path / d / "error.json").exists()]
    assert "1" in cancelled and "CANCELLED" in json.loads((tmp_path / "1" / "error.json").read_text())["error"]
    assert "job(s) of the sweep failed" in err


def test_policies_evaluate_sweeps_through_sbatch(slurm_cluster, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "policies.evaluate", "-m", "hydra/launcher=slurm", "+workload=it,en",
         "++workload.max_new_tokens=8", "train.train_prompts=2", "train.heldout_prompts=2", "train.max_gamma=2",
         "evaluate.policies=[hf-heuristic]", "evaluate.concurrency=[1]", "evaluate.repeats=2", "evaluate.warmup=1",
         f"hydra.sweep.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    for job in ("0", "1"):
        assert (tmp_path / job / "comparison.parquet").exists()
        measured = json.loads((tmp_path / job / "conditions.json").read_text())["c1"]
        assert len(measured["conditions"]["repeats"]) == 2


def test_accounting_is_read_from_the_controller(slurm_cluster):
    from spectune.run import slurm

    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    off = "accounting_storage/none" in config
    assert slurm.accounting_enabled() is (not off)
    assert slurm_cluster in [p.name for p in slurm.partitions()]
