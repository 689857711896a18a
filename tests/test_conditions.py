"""Measurement conditions (spectune.run.conditions, spectune.placement) and the SLURM request checks that need no
cluster: a CPU burner beside a window is seen, a repeat is flagged for it, a partial repeat is dropped on resume,
speed-ups pair points of the same repeat, torch's threads follow the allocation, sinfo's gres strings parse."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pandas as pd
import pytest

from spectune import placement
from spectune.run import conditions
from spectune.run.resume import Completed


def _point(method: str, repeat: int, tp: float, others: float = 0.0, job: str = "7_0", restart: int = 0) -> dict:
    return {"method": method, "repeat": repeat, "status": "ok", "output_throughput": tp,
            "conditions": {"job_id": job, "restart_count": restart, "node": "n1", "cpu_model": "cpu",
                           "others_cpu_share": others, "steal_share": 0.0, "load1_start": 0.1, "load1_end": 0.2,
                           "gpu_others_util": None}}


BURN = "import time\nt=time.time()\nwhile time.time()-t<3: pass"


def _orphan(code: str) -> int:
    """A process running ``code`` that is not this process's descendant (started by a parent that exits at once, so
    it is re-parented): another job's load on the node. Its pid."""
    spawn = ("import subprocess, sys\n"
             f"p = subprocess.Popen([sys.executable, '-c', {code!r}], start_new_session=True, "
             "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint(p.pid)")
    return int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True).stdout)


def test_a_cpu_burner_beside_the_window_is_counted_as_others():
    """One busy-looping process (not ours) for ~1.5 s on a node of os.cpu_count() CPUs: at least a third of one
    CPU's share is seen as others' (loose: a loaded machine gives the burner less and adds other processes' time)."""
    import os
    import signal
    import time

    burner = _orphan(BURN)
    try:
        with conditions.Window() as window:
            time.sleep(1.5)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it ended on its own
            os.kill(burner, signal.SIGKILL)

    assert window.record["others_cpu_share"] >= 0.33 / (os.cpu_count() or 1)
    assert window.record["wall_s"] >= 1.5 and window.record["load1_end"] >= 0
    assert window.record["node"] and window.record["cpu_model"]


def test_a_live_child_process_is_the_runs_own_work():
    """A server engine's process is a child the harness does not wait for while it runs: its CPU time counts as the
    run's own. A child that burns 1.0 s of CPU and then sleeps, still alive when read: the own seconds grow by at
    least 0.9 s (its 1.0 s, less the clock's resolution)."""
    code = ("import sys, time\nwhile time.process_time() < 1.0: pass\nprint('done', flush=True)\n"
            "time.sleep(30)")
    before = conditions._own_seconds()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        grown = conditions._own_seconds() - before
    finally:
        child.kill()
        child.wait()
    assert grown >= 0.9, grown


def test_a_repeat_with_others_beside_it_is_flagged_and_the_quiet_one_is_not():
    pts = [_point("ar", 0, 10.0), _point("fixed:gamma=4", 0, 15.0),
           _point("fixed:gamma=4", 1, 30.0, others=0.45), _point("ar", 1, 10.0)]
    out = conditions.assess(pts, limit=0.10)
    assert out["flagged_repeats"] == [1]
    assert "45%" in out["repeats"][1]["reasons"][0] and "fixed:gamma=4" in out["repeats"][1]["reasons"][0]
    assert not out["repeats"][0]["flagged"] and out["repeats"][0]["job_id"] == "7_0"


def test_a_repeat_split_over_two_allocations_is_flagged():
    pts = [_point("ar", 0, 10.0), _point("fixed:gamma=4", 0, 15.0, restart=1)]
    out = conditions.assess(pts)
    assert out["flagged_repeats"] == [0] and "2 allocations" in out["repeats"][0]["reasons"][0]


def test_speedups_are_computed_within_each_repeat():
    pts = [_point("ar", 0, 10.0), _point("fixed:gamma=4", 0, 15.0), _point("fixed:gamma=4", 1, 30.0),
           _point("ar", 1, 20.0)]
    assert conditions.speedups_per_repeat(pts) == {"ar": [1.0, 1.0], "fixed:gamma=4": [1.5, 1.5]}


def test_resume_keeps_whole_repeats_only():
    done = Completed()
    frame = pd.DataFrame({"x": [1]})
    for key in [("ar", 0), ("g", 0), ("ar", 1)]:  # repeat 0 whole, repeat 1 partial
        done.summaries[key], done.requests[key], done.cycles[key] = {"method": key[0]}, frame, frame
    kept = conditions.whole_repeats(done, [("ar", 0), ("g", 0), ("g", 1), ("ar", 1)])
    assert set(kept.summaries) == {("ar", 0), ("g", 0)} and set(kept.requests) == {("ar", 0), ("g", 0)}


def test_torch_threads_follow_the_slurm_allocation(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert placement.default_threads(None) == 3 and placement.default_threads(2) == 2  # an explicit setting wins
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert placement.default_threads(None) is None


def test_placement_names_the_array_task_and_its_restart(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-07")
    where = placement.placement()
    assert (where["job_id"], where["restart_count"], where["node"]) == ("41_2", 1, "gpu-07")


@pytest.mark.parametrize(("gres", "count"), [("gpu:1", 1), ("gpu:h200:8(S:0-1)", 8), ("(null)", 0),
                                             ("gpu:a100:4,shard:8", 4)])
def test_sinfo_gres_strings_give_the_gpus_per_node(gres, count):
    from spectune.run.slurm import _gpu_count

    assert _gpu_count(gres) == count


def test_an_sbatch_refusal_names_its_reason_and_the_request(monkeypatch):
    from spectune.run import slurm

    monkeypatch.setattr(slurm, "partitions", lambda: [slurm.Partition("gpu", True, 4, "64", "512000", 8, "2-00:00")])
    err = slurm.refusal("sbatch: error: Batch job submission failed: Invalid account or account/partition "
                        "combination specified", {"account": "nope", "partition": "gpu", "gpus_per_node": 1,
                                                   "additional_parameters": {"exclusive": True}})
    text = str(err)
    assert "\n" not in text and "Invalid account" in text and "account=nope" in text and "exclusive" in text
    assert "gpu (default): 4 nodes, 64 CPUs/node, 8 GPUs/node" in text
