"""The registered readings of the Italian adaptive-regimes runs (docs/registration/adaptive-regimes-priced.md),
printed from the run directories beside this file (:func:`analysis.regimes.main`):

    python bench/results/adaptive-regimes-it-smollm2-cpu-20261207/judge.py [--write]

``--write`` also writes TABLES.md here, from ``held-out-it/`` and ``map-it.json``.
"""

from pathlib import Path

from analysis.regimes import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parent)
