"""Tables of this page from the committed run directories (their acceptance.json only).

python bench/results/alpha-tasks-smollm2-cpu-20261205/spread.py   # prints the markdown tables and the spreads

The same computation as bench/results/alpha-tasks-cpu-20261204/spread.py (registered there; both call
analysis.alpha_spread), on these runs. The basic-bootstrap column (2·estimate − the percentile bounds) is a sensitivity
check added after the runs, not registered.
"""
from __future__ import annotations

from pathlib import Path

from analysis.alpha_spread import page

HERE = Path(__file__).resolve().parent
PAIRS = {"smollm2-eagle": ["en", "it"], "smollm2": ["en", "it"]}


if __name__ == "__main__":
    print("\n".join(page(HERE, PAIRS)))
