"""The exactness audit: exact laws, Monte Carlo through the real sampler, the stated rule, the real pair.

Submodules are imported directly (``spectune.audit.fit`` is torch-free so bad input fails before torch loads).
"""
