"""Every draft-length policy against the best fixed γ, live, on held-out prompts: ``python -m harness
task=evaluate`` (harness/tasks/evaluate.py; ``python -m policies.evaluate`` is an alias, ``__main__``).

pipeline (the steps in order: grid search, the learned policies, held-out runs, the oracle; :func:`pipeline.run`),
schema (conf/task/evaluate.yaml's). Importing the package loads nothing, so that ``python -m harness`` registers
the schema without loading the models' libraries.
"""
