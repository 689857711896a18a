"""Measuring, shared by every application that drives the engine, one module per role (imported by their own
names; this file holds no code):

- :mod:`~spectune.measure.models`: load the configured pair once per process (``load_models``) and build what
  drafts for the configured proposer (``draft_of``).
- :mod:`~spectune.measure.point`: open an engine on the models for a workload's sampling settings, turn prompts into
  requests, and measure one point: one method run once on all requests, after warm-up requests of the same shape.
- :mod:`~spectune.measure.repeats`: the points of a run in rotated order, repeat by repeat (``schedule``,
  ``run_points``, ``Grid``), their pooled medians and their aggregate with paired CIs and the ranking.
- :mod:`~spectune.measure.interleave`: methods block by block of prompts (the interleaved design);
  :mod:`~spectune.measure.confirm`: a pick measured again against AR on prompts it never saw;
  :mod:`~spectune.measure.profiling`: measure a cost profile; :mod:`~spectune.measure.prediction`: a model-free
  proposer's replay priced by a profile, before timing.
"""
