"""How reproducible is the default bench's answer? Run `python -m harness +workload=it` N times (default 5)
and report each run's wall time, declared best γ, the set indistinguishable from it and the MAD rule's pick.

The claim to check: the declared best agrees in at least 4 of 5 runs, or the runs' tables say that the
top γ are indistinguishable (every run's best lies in every other run's indistinguishable set).

    python bench/default_agreement.py                 # 5 runs, results into bench/results/
    python bench/default_agreement.py --runs 3 -- task.repeats=2
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spectune import rundir  # noqa: E402
from spectune.io import write_json  # noqa: E402
from spectune.metadata import base_metadata  # noqa: E402

log = logging.getLogger("bench.default_agreement")


def one_run(run_dir: Path, extra: list[str]) -> dict:
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "harness", "+workload=it", *extra, f"hydra.run.dir={run_dir}"],
                          cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = rundir.SUMMARY.read(run_dir)
    rank = summary["ranking"]["output_throughput"]
    methods = {m["method"]: m for m in summary["methods"]}
    return {"wall_s": round(wall, 1), "load_avg_1min": [load_before, os.getloadavg()[0]],
            "best": rank["best"], "indistinguishable": rank["indistinguishable"],
            "mad_pick": rank["mad_pick"], "noise_floor_pct": rank.get("noise_floor_pct"),
            "speedup": {m: [e.get("speedup"), e.get("speedup_ci95_lo"), e.get("speedup_ci95_hi")]
                        for m, e in methods.items()},
            "table": proc.stdout[proc.stdout.find("workload="):]}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            runs.append(one_run(Path(tmp) / str(i), args.overrides))
            r = runs[-1]
            log.info(f"run {i + 1}/{args.runs}: {r['wall_s']:.1f} s (load {r['load_avg_1min'][0]:.1f})"
                     f"  best {r['best']}  indistinguishable "
                     f"{r['indistinguishable']}  MAD rule {r['mad_pick']}")
    best = collections.Counter(r["best"] for r in runs)
    mad = collections.Counter(r["mad_pick"] for r in runs)
    top, count = best.most_common(1)[0]
    # the tables agree on "these are indistinguishable" if every run's best is in every run's set
    overlap = all(r["best"] in other["indistinguishable"] for r in runs for other in runs)
    verdict = ("agree" if count >= 4 * args.runs / 5 else
               "indistinguishable top γ (each run's best is in every run's indistinguishable set)" if overlap
               else "DISAGREE")
    result = {"command": "python -m harness +workload=it " + " ".join(args.overrides),
              "machine": f"{platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs".strip(),
              "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}, "runs": runs,
              "best_counts": dict(best), "mad_counts": dict(mad), "most_common_best": [top, count],
              "verdict": verdict, "wall_s": [r["wall_s"] for r in runs], "metadata": base_metadata()}
    log.info(f"best γ counts {dict(best)}; MAD rule counts {dict(mad)}; wall {result['wall_s']} s -> {verdict}")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M")
    path = write_json(args.out / f"default-agreement-cpu-{stamp}.json", result)
    log.info(f"wrote {path}")


if __name__ == "__main__":
    main()
