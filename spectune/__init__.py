"""spectune: the measuring library below the applications.

Exact speculative sampling (sampling/), its audit (audit/), the models and their loading (models/), the engine that
runs them (engine/), what a run measures and how it is repeated and interleaved (measure, interleave, profiling,
profile), the statistics that decide (stats/), and the run directory every application writes (rundir, io,
metadata). The applications sit on top: ``python -m harness`` (harness/), policy training and evaluation
(policies/), the analysis CLIs and notebooks (analysis/).

Data path: workloads → engine → records (Parquet/JSON in the Hydra run dir) → analysis.
"""

__version__ = "0.1.0"
