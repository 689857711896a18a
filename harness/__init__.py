"""spectune harness: exact speculative sampling, measuring engine and CLI tasks.

Data path: workloads → engine → records (Parquet/JSON in the Hydra run dir) → analysis.
"""

__version__ = "0.1.0"
