"""The SLURM side of ``hydra/launcher=slurm``: what the cluster offers, checked before a sweep is submitted, and how
its jobs' states are read when the cluster keeps no accounting.

- :func:`check_request`: an unknown partition, or more GPUs per node than the partition's nodes have, fails in
  one line naming the value and what the cluster offers (parsed from ``sinfo``), before anything is submitted.
- :func:`refusal`: sbatch's own refusal (account, QOS, time limit, ...) as the same kind of line.
- :class:`SqueueJob`: submitit asks ``sacct`` for job states; a cluster without accounting storage
  (``AccountingStorageType=accounting_storage/none``, as on a workstation) has nothing there, so every poll
  warns ("Bypassing sacct error") and a job that ended without a result (cancelled, killed) is never seen to end:
  the sweep would wait forever. Where accounting is known to be off, the states come from ``squeue`` instead
  (it lists ended jobs for the controller's MinJobAge); where it is on or unknown, submitit's ``sacct`` stays.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from spectune.errors import SpectuneError

log = logging.getLogger(__name__)
START_HINT = "start a one-node cluster here with scripts/slurm-local up, or run on the cluster's login node"


def _run(*command: str, timeout: float = 30) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def accounting_enabled() -> bool | None:
    """False when the controller says ``AccountingStorageType = accounting_storage/none``, True for any other
    storage, None when it cannot be asked."""
    done = _run("scontrol", "show", "config")
    if done is None or done.returncode != 0:
        return None
    match = re.search(r"^AccountingStorageType\s*=\s*(\S+)", done.stdout, re.MULTILINE)
    return None if match is None else match.group(1) != "accounting_storage/none"


# ----------------------------------------------------------------------------------------------------------
# What the cluster offers.


@dataclass
class Partition:
    name: str
    default: bool
    nodes: int
    cpus: str        # per node, as sinfo writes it ("2", "32+")
    memory_mb: str
    gpus: int        # the most GPUs (gres gpu) one node of it has
    time_limit: str

    def describe(self) -> str:
        gpu = f", {self.gpus} GPU{'s' if self.gpus != 1 else ''}/node" if self.gpus else ", no GPUs"
        return (f"{self.name}{' (default)' if self.default else ''}: {self.nodes} node{'s' if self.nodes != 1 else ''}"
                f", {self.cpus} CPUs/node{gpu}, time limit {self.time_limit}")


def _gpu_count(gres: str) -> int:
    """The GPUs in a gres string (``gpu:1``, ``gpu:h200:8(S:0-1)``, ``gpu:a100:4,shard:8``); 0 for ``(null)``."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total = max(total, int(parts[-1]))
    return total


def partitions() -> list[Partition]:
    """The partitions ``sinfo`` lists (one entry per partition, its node groups merged)."""
    if shutil.which("sinfo") is None:
        raise SpectuneError(f"hydra/launcher=slurm needs SLURM's commands (sinfo, sbatch) and there are none on PATH: "
                            f"{START_HINT}")
    done = _run("sinfo", "--noheader", "--format=%P|%D|%c|%m|%G|%l")
    if done is None or done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no answer"])[-1] if done is not None else "timed out"
        raise SpectuneError(f"sinfo cannot reach the SLURM controller ({why}): {START_HINT}")
    found: dict[str, Partition] = {}
    for line in done.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        raw, nodes, cpus, mem, gres, limit = fields
        name = raw.rstrip("*")
        entry = found.setdefault(name, Partition(name, raw.endswith("*"), 0, cpus, mem, 0, limit))
        entry.nodes += int(nodes) if nodes.isdigit() else 0
        entry.gpus = max(entry.gpus, _gpu_count(gres))
    return list(found.values())


def offer(parts: list[Partition]) -> str:
    return "; ".join(p.describe() for p in parts) or "no partitions"


def _requested_gpus(params: dict[str, Any]) -> tuple[str, int] | None:
    """(the launcher key, GPUs per node) that the request implies, or None when it asks none."""
    if params.get("gpus_per_node"):
        value = params["gpus_per_node"]
        count = int(str(value).rsplit(":", 1)[-1]) if str(value).rsplit(":", 1)[-1].isdigit() else 0
        return f"gpus_per_node={value}", count
    if params.get("gpus_per_task"):
        return (f"gpus_per_task={params['gpus_per_task']}",
                int(params["gpus_per_task"]) * int(params.get("tasks_per_node") or 1))
    return None


def check_request(params: dict[str, Any]) -> list[Partition]:
    """Refuse, in one line, a partition the cluster lacks or more GPUs than a node of it has; return the offer."""
    parts = partitions()
    wanted = params.get("partition")
    names = [p.name for p in parts]
    if wanted is not None and str(wanted) not in names:
        raise SpectuneError(f"hydra.launcher.partition={wanted!r} is not a partition of this cluster; it offers "
                            f"{offer(parts)}")
    target = next((p for p in parts if p.name == wanted), None) if wanted else next(
        (p for p in parts if p.default), None)
    cpus = int(params.get("cpus_per_task") or 1) * int(params.get("tasks_per_node") or 1)
    if target is not None and target.cpus.isdigit() and cpus > int(target.cpus):
        raise SpectuneError(f"hydra.launcher.cpus_per_task={params.get('cpus_per_task')} asks more CPUs per node than "
                            f"partition {target.name} has ({target.cpus}): the job would wait forever; the cluster "
                            f"offers {offer(parts)}")
    gpus = _requested_gpus(params)
    if gpus is not None and target is not None and gpus[1] > target.gpus:
        raise SpectuneError(f"hydra.launcher.{gpus[0]} asks more GPUs per node than partition {target.name} has "
                            f"({target.gpus}); the cluster offers {offer(parts)}")
    return parts


REQUEST_KEYS = ("partition", "account", "qos", "timeout_min", "nodes", "tasks_per_node", "cpus_per_task", "mem_gb",
                "gpus_per_node", "gpus_per_task", "constraint")


def refusal(stderr: str, params: dict[str, Any]) -> SpectuneError:
    """sbatch's refusal as one line: its reason, what was asked, what the cluster offers."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    reason = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "no message")
    reason = re.sub(r"^sbatch: error: ", "", reason)
    asked = " ".join(f"{k}={params[k]}" for k in REQUEST_KEYS if params.get(k) is not None)
    exclusive = (params.get("additional_parameters") or {}).get("exclusive")
    asked += " exclusive" if exclusive else ""
    try:
        offered = offer(partitions())
    except SpectuneError:
        offered = "unknown (sinfo does not answer)"
    return SpectuneError(f"sbatch refused the sweep: {reason} (asked: {asked.strip() or 'defaults'}); the cluster "
                         f"offers {offered}")


# ----------------------------------------------------------------------------------------------------------
# Job states without accounting.


class SqueueWatcher(SlurmInfoWatcher):
    """submitit's watcher reading ``squeue --states=all`` instead of ``sacct`` (see the module doc). A job squeue
    no longer lists has ended (state ``ENDED``): its result file, if any, says how."""

    def _make_command(self) -> list[str] | None:
        ids = sorted({x.split("_")[0] for x in self._registered - self._finished})
        if not ids:
            return None
        return ["squeue", "--noheader", "--states=all", "--array", "--format=%i|%T|%N", "--jobs", ",".join(ids)]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        info = {}
        for line in text.splitlines():
            job_id, _, rest = line.strip().partition("|")
            state, _, nodes = rest.partition("|")
            if job_id:
                info[job_id] = {"JobID": job_id, "State": state.split()[0] if state else "", "NodeList": nodes}
        return info

    def update(self) -> None:
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        done = _run(*command, timeout=60)
        if done is not None and (done.returncode == 0 or "Invalid job id" in done.stderr):
            info = self.read_info(done.stdout) if done.returncode == 0 else {}
            for job_id in self._registered - self._finished:
                info.setdefault(job_id, {"JobID": job_id, "State": "ENDED", "NodeList": ""})
            self._info_dict.update(info)
        else:  # a slow controller: keep the last states, ask again at the next poll
            log.debug("squeue gave no answer (%s)", done.stderr.strip() if done is not None else "timed out")
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)


class SqueueJob(SlurmJob):
    """A submitit SlurmJob whose states come from squeue (one watcher shared by all, as submitit's own)."""

    watcher = SqueueWatcher(delay_s=60)
