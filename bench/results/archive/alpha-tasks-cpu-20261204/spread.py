"""Tables of this page from the committed run directories (their acceptance.json only).

python bench/results/alpha-tasks-cpu-20261204/spread.py   # prints the markdown tables and the spread comparison

Per (pair, language, category) α and its interval are the product's own (`alpha_by_category`), per (pair, language) the
run's `alpha` / `alpha_ci95_over_prompts`. The spreads (max − min) and their intervals are the registered percentile
bootstrap: 10,000 resamples of prompts within each (language, category) stratum, seed 0 per pair, every statistic on the
same resample (analysis.alpha_spread computes them). `tiny48` is the amendment's larger tiny set (8 prompts per
category, 128 new tokens). The basic-bootstrap column (2·estimate − the percentile bounds) is a sensitivity check added
after the runs, not registered: it reflects the upward bias of a max − min statistic, which the percentile interval does
not.
"""
from __future__ import annotations

from pathlib import Path

from analysis.alpha_spread import page

HERE = Path(__file__).resolve().parent
PAIRS = {"tiny": ["it", "en", "zh", "es"], "tiny48": ["it", "en", "zh", "es"], "smollm2": ["en", "it"],
         "smollm2-eagle": ["en", "it"]}


if __name__ == "__main__":
    print("\n".join(page(HERE, PAIRS)))
