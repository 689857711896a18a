"""Regenerate tests/data/tiny_sweep, the small run directory the analysis tests read.

    python -m tests.data.make_tiny_sweep            # rewrites tests/data/tiny_sweep
    python -m tests.data.make_tiny_sweep OUT_DIR    # writes elsewhere (the structure test does this)

It is a real sweep of the CLI on the embedded tiny pair: two jobs (concurrency 1 and 2), each with the AR
baseline and γ = 1, 2 on three English prompts of eight new tokens (about a minute on 2 CPU cores). What
differs from machine to machine and means nothing to the readers is dropped: Hydra's own ``hydra.yaml`` (the
launcher's absolute paths and environment) and the job logs. Regenerate it when the run format changes
(spectune.run.rundir.FORMAT_VERSION); tests/test_rundir.py checks that the committed copy has the structure the
CLI writes today.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from tests.conftest import REPO, SMALL_BENCH, run_cli

COMMITTED = REPO / "tests/data/tiny_sweep"
ARGS = ["-m", *SMALL_BENCH, "gamma=[1,2]", "concurrency=1,2"]
DROPPED = ("hydra.yaml", "*.log")


def make(out: Path) -> Path:
    """Run the sweep into ``out`` (replaced) and drop the machine-specific files."""
    out = Path(out)
    with tempfile.TemporaryDirectory() as scratch:
        sweep = Path(scratch) / "sweep"
        done = run_cli(*ARGS, f"hydra.sweep.dir={sweep}")
        if done.returncode != 0:
            raise RuntimeError(f"the sweep failed (exit {done.returncode}): {done.stderr[-2000:]}")
        for pattern in DROPPED:
            for path in sweep.rglob(pattern):
                path.unlink()
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(sweep, out)
    return out


if __name__ == "__main__":
    print(make(Path(sys.argv[1]) if len(sys.argv) > 1 else COMMITTED))
