#!/bin/bash
# The Italian adaptive-regimes runs of 2026-12-07 (docs/registration/adaptive-regimes-priced.md), each run from a
# clean worktree of the registering commit, one at a time on a quiet machine; R is the results folder.
set -euo pipefail
R=${R:?set R to the results folder}
STEP=${1:?train|ppo|answers|heldout}
SHAPE=(+workload=shift-it models=smollm2 proposer=lookup hardware.threads=2 task.repeats=1 task.warmup=1
       workload.task_max_new_tokens=128)
TRAIN_BUDGET=(workload.phases.0.token_budget=1536 workload.phases.1.token_budget=1536
              workload.phases.2.token_budget=1536 workload.phases.3.token_budget=1536)
case $STEP in
  train)  # AR, fixed γ 2, 4, 8 and match-length γ 8, interleaved in one grid on training prompts
    python -m harness task=bench "${SHAPE[@]}" "${TRAIN_BUDGET[@]}" policy=fixed 'gamma=[2,4,8]' \
      'workload.splits=[train]' "task.compare=[{name: match-length, gamma: 8}]" hydra.run.dir=$R/train-it ;;
  ppo)
    python -m harness task=train +workload=it models=smollm2 proposer=lookup hardware.threads=2 \
      workload.task_max_new_tokens=128 'workload.categories=[chat,summarise,qa,translate,rewrite,code]' \
      'workload.splits=[train]' 'workload.sampling_mix=[{temperature:0,share:0.5},{temperature:1.0,share:0.5}]' \
      train.max_gamma=8 train.concurrency=1 train.train_prompts=24 hydra.run.dir=$R/ppo-it ;;
  answers)
    python -m policies.static_answers $R/train-it --out $R/map-it.json ;;
  heldout)  # COMPARE as the pilot registers: STATIC, the map, RULE (listed once where it is STATIC) and PPO
    python -m harness task=bench "${SHAPE[@]}" policy=hysteresis 'gamma=[8]' 'workload.splits=[evaluate]' \
      "task.compare=${COMPARE:?set COMPARE}" hydra.run.dir=$R/held-out-it ;;
esac
