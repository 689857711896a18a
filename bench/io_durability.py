"""What durability costs: spectune.io's writers (fsync the file, chmod to the umask, rename, fsync the directory)
against the same atomic write without the fsyncs, side by side, on result files of a bench run's size.

    python bench/io_durability.py --repeats 50 --dir /tmp/io-bench

Prints the median milliseconds per write of each variant and their ratio. A bench run writes its three
files once per grid point, whose measurement takes seconds, so the absolute difference is what matters.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from spectune.io import write_json, write_parquet


def plain_atomic(path: Path, write) -> None:
    """The writer before durability: temporary file, rename; no fsync, mkstemp's mode."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def requests_like(rows: int) -> pd.DataFrame:
    """A requests.parquet of ``rows`` requests (7 grid points x 16 prompts by default), 48 tokens each."""
    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "method": [f"fixed:gamma={i % 7}" for i in range(rows)], "ttft_ms": rng.random(rows),
        "output_ids": [rng.integers(0, 8000, 48).tolist() for _ in range(rows)],
        "token_times_s": [rng.random(48).tolist() for _ in range(rows)],
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rows", type=int, default=112)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    frame = requests_like(args.rows)
    summary = {"methods": [{"method": f"m{i}", "p99_ttft_ms": 1.0 * i} for i in range(7)]}
    cases = {
        "parquet": (lambda p: write_parquet(p, frame), lambda p: plain_atomic(p, lambda t: frame.to_parquet(t))),
        "json": (lambda p: write_json(p, summary),
                 lambda p: plain_atomic(p, lambda t: t.write_text(json.dumps(summary, indent=2)))),
    }
    for name, (durable, plain) in cases.items():
        times: dict[str, list[float]] = {"durable": [], "plain": []}
        for _ in range(args.repeats):  # interleaved, so both see the same disk and load
            for label, write in (("durable", durable), ("plain", plain)):
                start = time.perf_counter()
                write(out / f"bench-{label}.{name}")
                times[label].append(time.perf_counter() - start)
        d, p = (statistics.median(times[k]) * 1e3 for k in ("durable", "plain"))
        print(f"{name:>8}: durable {d:.3f} ms, plain {p:.3f} ms, ratio {d / p:.2f}x, +{d - p:.3f} ms per write "
              f"(median of {args.repeats})")


if __name__ == "__main__":
    main()
