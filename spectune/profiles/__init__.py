"""Shipped hardware cost profiles (``<name>.json``, see :mod:`spectune.profile`); build.py rebuilds the H200 ones."""
