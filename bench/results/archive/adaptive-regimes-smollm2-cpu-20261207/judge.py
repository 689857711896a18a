"""The registered readings of the English adaptive-regimes runs (docs/registration/adaptive-regimes.md and its
amendments), printed from the run directories beside this file (:func:`analysis.regimes.main`):

    python bench/results/adaptive-regimes-smollm2-cpu-20261207/judge.py [--write]

``--write`` also writes TABLES.md here, from ``held-out-en/`` and ``map-en.json``.
"""

from pathlib import Path

from analysis.regimes import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parent)
