"""The registered readings of the Italian adaptive-regimes runs (docs/registration/adaptive-regimes-priced.md),
printed from the run directories beside this file (:func:`analysis.regimes.judge`):

    python bench/results/adaptive-regimes-it-smollm2-cpu-20261207/judge.py [--write]

``--write`` also writes TABLES.md here. Every number comes from ``held-out-it/requests.parquet`` (the held-out run,
all methods interleaved in one grid) and ``map-it.json`` (the static answers chosen on the training run).
"""

import argparse
from pathlib import Path

from analysis.regimes import judge

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="also write TABLES.md beside this file")
    text = judge(HERE / "held-out-it", HERE / "map-it.json", "Italian")
    if parser.parse_args().write:
        (HERE / "TABLES.md").write_text(text)
    print(text)
