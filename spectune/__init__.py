"""spectune: the measuring library below the applications.

Exact speculative sampling (sampling/), its audit (audit/), the models and their loading (models/), the engine that
runs them (engine/), what a run measures and how it is repeated and interleaved (measure/), what a cycle costs and
the cost profiles that price it (costmodel/), the statistics that decide (stats/), and a run's plumbing: the run
directory every application writes, resuming, the front doors' errors (run/). The applications sit on top:
``python -m harness`` (harness/), policy training and evaluation (policies/), the analysis CLIs and
notebooks (analysis/).

Data path: workloads → engine → records (Parquet/JSON in the Hydra run dir) → analysis.
"""

__version__ = "0.1.0"
