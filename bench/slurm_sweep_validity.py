"""Is a two-job SLURM sweep's γ speed-up the one each job measures alone? Three configurations, one after another:

1. alone:     each job of the sweep (``+workload=it``, ``+workload=en``) submitted on its own, the node idle;
2. exclusive: the two-job sweep ``+workload=it,en`` with the launcher's defaults (each job gets the node alone);
3. shared:    the same sweep with ``additional_parameters.exclusive=false`` beside a CPU-burning SLURM job.

Goal: in (2) every job's γ = GAMMA speed-up over AR lies within the 95% CI of the same job in (1) and no repeat is
flagged; in (3) the interference is flagged. Flags see every process on the node, not only SLURM's: on a machine
other people use, (1) and (2) are flagged too, which is the flag doing its job; rerun on a quiet machine.

    python bench/slurm_sweep_validity.py                 # needs a running cluster: scripts/slurm-local up
    python bench/slurm_sweep_validity.py --repeats 3 --prompts 6 --max-new 32 --gammas 1,2,4

Prints the verdict with the numbers and writes bench/results/slurm-sweep-validity-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from spectune.methods import Method  # noqa: E402
from spectune.run import rundir  # noqa: E402

WORKLOADS = ("it", "en")


def squeue_empty() -> bool:
    out = subprocess.run(["squeue", "--noheader", "--format=%i"], capture_output=True, text=True).stdout
    return not out.strip()


def wait_idle(timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not squeue_empty():
        if time.monotonic() > deadline:
            sys.exit("error: the cluster's queue did not empty within 10 minutes: squeue")
        time.sleep(2)


def sweep(workloads: str, sweep_dir: Path, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """One ``hydra/launcher=slurm`` sweep; its jobs' γ speed-ups, CIs and flags."""
    cmd = [sys.executable, "-m", "harness", "-m", "hydra/launcher=slurm", f"+workload={workloads}",
           f"++workload.num_prompts={args.prompts}", f"++workload.max_new_tokens={args.max_new}", "task.warmup=1",
           f"task.repeats={args.repeats}", f"gamma=[{args.gammas}]", f"hydra.sweep.dir={sweep_dir}", *extra]
    load = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode != 0:
        sys.exit(f"error: the sweep failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}")
    jobs = {}
    for i, name in enumerate(workloads.split(",")):
        summary = rundir.SUMMARY.read(sweep_dir / str(i))
        entry = next(m for m in summary["methods"] if m["method"] == Method.fixed(args.gamma).label)
        cond = summary["conditions"]
        jobs[name] = {"speedup": entry["speedup"], "ci95": [entry["speedup_ci95_lo"], entry["speedup_ci95_hi"]],
                      "speedup_per_repeat": summary["speedup_per_repeat"][entry["method"]],
                      "flagged_repeats": cond["flagged_repeats"],
                      "others_cpu_share_max": max(r["others_cpu_share_max"] for r in cond["repeats"]),
                      "load1_max": max(r["load1_max"] for r in cond["repeats"]),
                      "job_id": cond["repeats"][0]["job_id"]}
    return {"jobs": jobs, "wall_s": round(time.monotonic() - started, 1), "load1_before": round(load, 2),
            "load1_after": round(os.getloadavg()[0], 2), "command": " ".join(cmd[1:])}


def burner() -> str:
    """A SLURM job keeping one CPU busy (sharing the node), started and running before the sweep is submitted."""
    job = subprocess.run(["sbatch", "--parsable", "--job-name=spectune-burner", "--cpus-per-task=1", "--time=60",
                          "--output=/dev/null", f"--wrap={sys.executable} -c 'while True: pass'"],
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while subprocess.run(["squeue", "--noheader", "--format=%T", "--jobs", job], capture_output=True,
                         text=True).stdout.strip() != "RUNNING":
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job])
            sys.exit("error: the CPU-burning job did not start within 2 minutes: squeue")
        time.sleep(1)
    return job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--gammas", default="2,4", help="the grid (AR is added); must contain --gamma")
    parser.add_argument("--gamma", type=int, default=4, help="the γ whose speed-up is compared")
    parser.add_argument("--out", type=Path, default=None, help="where the sweeps go (default: a temporary folder)")
    args = parser.parse_args()
    if str(args.gamma) not in args.gammas.split(","):
        sys.exit(f"error: --gamma {args.gamma} is not in --gammas {args.gammas}")
    if subprocess.run(["sinfo", "--noheader"], capture_output=True).returncode != 0:
        sys.exit("error: no SLURM cluster answers (sinfo): start one with scripts/slurm-local up")
    root = args.out or Path(tempfile.mkdtemp(prefix="slurm-validity-"))
    wait_idle()
    results: dict[str, Any] = {"alone": {"jobs": {}}}
    for name in WORKLOADS:  # 1. each job alone
        one = sweep(name, root / f"alone-{name}", args, [])
        results["alone"]["jobs"].update(one["jobs"])
        results["alone"].setdefault("runs", []).append({k: v for k, v in one.items() if k != "jobs"})
        wait_idle()
    results["exclusive"] = sweep(",".join(WORKLOADS), root / "exclusive", args, [])  # 2. the default sweep
    wait_idle()
    burn = burner()  # 3. shared nodes beside a CPU burner
    try:
        results["shared"] = sweep(",".join(WORKLOADS), root / "shared", args,
                                  ["hydra.launcher.additional_parameters.exclusive=false"])
    finally:
        subprocess.run(["scancel", burn])

    verdict = {}
    lines = [f"γ = {args.gamma} speed-up over AR, {args.repeats} repeats, {args.prompts} prompts × {args.max_new} new "
             f"tokens (95% CI: paired cluster bootstrap)", "",
             "| config | job | speed-up | 95% CI | per repeat | flagged repeats | others' CPU max | load1 max |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for config in ("alone", "exclusive", "shared"):
        for name, job in results[config]["jobs"].items():
            lines.append(f"| {config} | {name} | {job['speedup']:.3f} | [{job['ci95'][0]:.3f}, {job['ci95'][1]:.3f}] | "
                         f"{', '.join(f'{v:.2f}' for v in job['speedup_per_repeat'] if v is not None)} | "
                         f"{job['flagged_repeats'] or 'none'} | {job['others_cpu_share_max']:.0%} | "
                         f"{job['load1_max']:.2f} |")
    for name in WORKLOADS:
        alone, excl = results["alone"]["jobs"][name], results["exclusive"]["jobs"][name]
        verdict[f"exclusive {name}: γ={args.gamma} within the alone CI"] = alone["ci95"][0] <= excl["speedup"] <= \
            alone["ci95"][1]
        verdict[f"exclusive {name}: no repeat flagged"] = not excl["flagged_repeats"]
        verdict[f"shared {name}: interference flagged"] = bool(results["shared"]["jobs"][name]["flagged_repeats"])
    lines += ["", *[f"{'PASS' if ok else 'FAIL'}  {what}" for what, ok in verdict.items()]]
    quiet = max(j["others_cpu_share_max"] for c in ("alone", "exclusive") for j in results[c]["jobs"].values())
    if quiet > 0.10:
        lines.append(f"note: others used up to {quiet:.0%} of the node's CPU even alone / exclusive: processes outside "
                     "SLURM load this machine; the flags are right to fire, rerun on a quiet machine")
    print("\n".join(lines))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    out = REPO / "bench" / "results" / f"slurm-sweep-validity-{stamp}.json"
    out.write_text(json.dumps({"settings": vars(args) | {"out": str(root)}, "results": results,
                               "verdict": verdict, "table": lines, "cpu_count": os.cpu_count()}, indent=2) + "\n")
    print(f"results: {out.relative_to(REPO)}")
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
