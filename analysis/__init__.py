"""Offline analysis: the cost model and (later) result tables and plots."""
