"""The registered readings of the adaptive-regimes runs on select prompts
(docs/registration/adaptive-regimes-matched.md), printed from the run directories beside this file
(:func:`analysis.regimes.main`):

    python bench/results/adaptive-regimes-select-smollm2-cpu-20261207/judge.py [--write]

``--write`` also writes TABLES.md here, from ``held-out-<language>/`` and ``map-<language>.json`` per language.
"""

from pathlib import Path

from analysis.regimes import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parent)
