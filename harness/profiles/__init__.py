"""Shipped hardware cost profiles (``<name>.json``, see :mod:`harness.profile`); ``build.py`` rebuilds the H200 ones."""
