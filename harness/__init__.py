"""``python -m harness``: the Hydra application that runs one task (``task=bench``, ``tune``, ``verify``, ...).

One module per task under ``harness/tasks/``; ``harness.sweeps`` is the multirun callback. Everything they measure
with lives in the library, :mod:`spectune`.
"""
