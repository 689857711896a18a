"""How close each engine's AR decode comes to this machine's memory bandwidth: one line per bench run.

Measures the sustained read bandwidth (STREAM's read, copy and triad; :mod:`spectune.measure.bandwidth`), then for
every bench run directory given (or found below a multirun) prints the AR baseline's decode tok/s, the bytes each
token reads (the served GGUF's size for engine=llamacpp, the target's parameter bytes for spectune's engine) and
their product as a fraction of the read bandwidth. Compare runs measured on this machine only, and read it on a
quiet one: a busy machine lowers the bandwidth and the decode rate unevenly.

    python bench/bandwidth.py RUN_DIR [RUN_DIR ...] --threads 2 --mib 1024 --runs 5
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from spectune.errors import SpectuneError
from spectune.measure.bandwidth import roofline, runs_under, stream

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dirs", nargs="+", metavar="RUN_DIR", help="bench run directories (or a multirun)")
    parser.add_argument("--mib", type=int, default=1024, help="MiB per array (far above the last-level cache)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--runs", type=int, default=5, help="best of this many runs per kernel")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for flag in ("mib", "runs", "threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            return _error(f"--{flag}={value} is invalid: an integer >= 1")
    try:
        runs = [run for path in args.runs_dirs for run in runs_under(path)]
        bw = stream(args.mib << 20, args.threads, args.runs)
        rows = [roofline(run, bw) for run in runs]
    except SpectuneError as err:
        return _error(str(err))
    gb = 1e9
    log.info(f"memory bandwidth: read {bw.read / gb:.1f} GB/s, copy {bw.copy / gb:.1f}, triad {bw.triad / gb:.1f} "
             f"({bw.array_bytes >> 20} MiB arrays, {bw.threads} threads, best of {bw.runs}; {bw.cpu_model})")
    for row in rows:
        if args.json:  # the data on stdout (`> rows.jsonl`), the progress and summary lines on stderr
            sys.stdout.write(json.dumps({**row, "bandwidth": bw.describe()}) + "\n")
            continue
        log.info(f"{row['engine']:9s} {row['model']}  c={row['concurrency']}: AR {row['ar_decode_tok_s']:.1f} tok/s x "
                 f"{row['bytes_per_token'] / 1e6:.1f} MB/token = {row['bytes_per_s'] / gb:.2f} GB/s, "
                 f"{100 * row['fraction_of_bandwidth']:.0f}% of read bandwidth  ({row['run']})")
    return 0


def _error(line: str) -> int:
    """Bad input: one line on stderr, exit status 2 (as the harness's front door)."""
    sys.stderr.write(f"error: {line}\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
