#!/bin/bash
# The held-out run of docs/registration/adaptive-regimes-batch-edge.md: the controller as committed with that file (a
# batch of two rows or more drafts only above the band's upper edge), on Italian prompts no smollm2 run has drawn (the
# short profile's train, evaluate and select splits, 192), 48 a phase, against AR, match-length γ 8 (the best single
# static setting and the rule) and the per-regime map that Italian's training run chose (map-it.json, copied). From a
# clean worktree of the registering commit, alone on a quiet machine; R is this folder.
set -euo pipefail
R=${R:?set R to the results folder}
SHAPE=(+workload=shift-it models=smollm2 proposer=lookup hardware.threads=2 task.repeats=1 task.warmup=1
       workload.task_max_new_tokens=128 workload.profile=short 'workload.splits=[train,evaluate,select]'
       workload.phases.0.token_budget=6144 workload.phases.1.token_budget=6144
       workload.phases.2.token_budget=6144 workload.phases.3.token_budget=6144)
COMPARE="[{name: match-length, gamma: 8}, {name: regime-map, path: $R/map-it.json, gamma: 8}]"
python -m harness task=bench "${SHAPE[@]}" policy=hysteresis 'gamma=[8]' "task.compare=$COMPARE" \
  hydra.run.dir=$R/held-out-it
