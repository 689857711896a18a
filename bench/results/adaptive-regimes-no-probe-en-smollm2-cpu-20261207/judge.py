"""The registered readings of the adaptive-regimes run without probes under prompt lookup
(docs/registration/adaptive-regimes-no-probe.md), printed from the run directory beside this file
(:func:`analysis.regimes.main`):

    python bench/results/adaptive-regimes-no-probe-en-smollm2-cpu-20261207/judge.py [--write]

``--write`` also writes TABLES.md here, from ``held-out-en/`` and ``map-en.json``.
"""

from pathlib import Path

from analysis.regimes import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parent)
