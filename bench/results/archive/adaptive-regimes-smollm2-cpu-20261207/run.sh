#!/bin/bash
# The adaptive-regimes runs of 2026-12-07 (docs/registration/adaptive-regimes.md, amendment of that day), run from a
# clean worktree of the registering commit; R is the results folder.
set -euo pipefail
R=${R:?set R to the results folder}
STEP=${1:?probe|train|ppo|answers|heldout}
SHAPE=(+workload=shift-en models=smollm2 proposer=lookup hardware.threads=2 task.repeats=1 task.warmup=1
       workload.task_max_new_tokens=128)
TRAIN_BUDGET=(workload.phases.0.token_budget=1536 workload.phases.1.token_budget=1536
              workload.phases.2.token_budget=1536 workload.phases.3.token_budget=1536)
case $STEP in
  probe)  # the sizing probe (run from a clean tree of 0db7b8c, before the amendment), the first training run
    python -m harness task=bench "${SHAPE[@]}" "${TRAIN_BUDGET[@]}" policy=fixed 'gamma=[8]' 'workload.splits=[train]' \
      hydra.run.dir=$R/train-en-probe ;;
  train)
    python -m harness task=bench "${SHAPE[@]}" "${TRAIN_BUDGET[@]}" policy=fixed 'gamma=[2,4]' task.baseline=false \
      'workload.splits=[train]' "task.compare=[{name: match-length, gamma: 8}]" hydra.run.dir=$R/train-en ;;
  ppo)
    python -m harness task=train +workload=en models=smollm2 proposer=lookup hardware.threads=2 \
      workload.task_max_new_tokens=128 'workload.categories=[chat,summarise,qa,translate,rewrite,code]' \
      'workload.splits=[train]' 'workload.sampling_mix=[{temperature:0,share:0.5},{temperature:1.0,share:0.5}]' \
      train.max_gamma=8 train.concurrency=1 train.train_prompts=24 hydra.run.dir=$R/ppo-en ;;
  answers)
    python -m policies.static_answers $R/train-en-probe $R/train-en --out $R/map-en.json ;;
  heldout)  # COMPARE as registered: "[{name: match-length, gamma: 8}, {name: regime-map, path: $R/map-en.json,
            # gamma: 8}, {name: ppo, gamma_path: $R/ppo-en/gamma.zip, gamma: 8}]"
    python -m harness task=bench "${SHAPE[@]}" policy=hysteresis 'gamma=[8]' 'workload.splits=[evaluate]' \
      "task.compare=${COMPARE:?set COMPARE}" hydra.run.dir=$R/held-out-en ;;
esac
