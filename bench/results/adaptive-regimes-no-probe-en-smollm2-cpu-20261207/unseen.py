"""Which of this run's prompts any other committed run drew: the workload of run.sh composed as the harness composes
it (its prompts, per phase, from the target's tokenizer), against the prompt ids of every ``requests.parquet`` under
bench/results outside this folder. Registered before the run: none of the 192
(docs/registration/adaptive-regimes-no-probe.md).

    python bench/results/adaptive-regimes-no-probe-en-smollm2-cpu-20261207/unseen.py
"""

from pathlib import Path

from harness.unseen_prompts import main

# run.sh's workload, as it gives it to the harness
OVERRIDES = ["+workload=shift-en", "models=smollm2", "workload.task_max_new_tokens=128", "workload.profile=short",
             "workload.splits=[train]"] + [f"workload.phases.{i}.token_budget=6144" for i in range(4)]

if __name__ == "__main__":
    main(Path(__file__).resolve().parent, OVERRIDES)
