"""Shipped hardware cost profiles (``<name>.json``, see :mod:`spectune.costmodel.profile`); build.py rebuilds the H200
ones."""
