"""Draft-length (γ) policies. They see per-step draft signals and per-cycle outcomes, never model internals.

Importing the package loads nothing: a policy is imported from its module (``policies.confidence``), all of them
by name through ``policies.registry``, and the gymnasium environments are registered explicitly
(``policies.envs.register_envs``, which ``policies.envs.make_env`` calls).
"""
