"""Draft-length (γ) policies. They see per-step draft signals and per-cycle outcomes, never model internals.

By role: the policies themselves are this package's modules (one per policy, ``registry`` names them all);
``envs/`` holds what they are trained and replayed on (traces as data, replay, the gymnasium environments, the
observation builder); ``train/`` trains them (``python -m policies.train``); ``evaluate/`` compares them live
against the best fixed γ (``python -m policies.evaluate``).

Importing the package loads nothing: a policy is imported from its module (``policies.confidence``), all of them
by name through ``policies.registry``, and the gymnasium environments are registered explicitly
(``policies.envs.register_envs``, which ``policies.envs.make_env`` calls).
"""
