"""The statistics measuring needs: bootstrap intervals over (repeat, prompt) clusters (``intervals``), paired
comparisons of methods, the best and its indistinguishable set (``compare``), and goodput under SLOs (``goodput``)."""
