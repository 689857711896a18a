"""The speculative-decoding cost model (Leviathan et al. 2023), in modules by role (imported by their own names;
this file holds no code): :mod:`~analysis.costmodel.model`, expected tokens per cycle against the cycle's price in
target steps, the speed-up, its sweep and optima; :mod:`~analysis.costmodel.fit`, the model fitted to a cost
profile and recorded traces; :mod:`~analysis.costmodel.cli`, ``python -m analysis.costmodel``.
"""
