#!/bin/bash
# The held-out runs of docs/registration/adaptive-regimes-matched.md: the controller with estimates per match length
# and a batch-priced cycle, on each language's select prompts (no run of the controller has seen them), against the
# static answers its training runs chose (map-<language>.json, copied from the two earlier folders). Each run from a
# clean worktree of the registering commit, one at a time on a quiet machine; R is this folder.
set -euo pipefail
R=${R:?set R to the results folder}
LANG_CODE=${1:?it|en}
SHAPE=(+workload=shift-$LANG_CODE models=smollm2 proposer=lookup hardware.threads=2 task.repeats=1 task.warmup=1
       workload.task_max_new_tokens=128)
# The best single static setting of both training runs is match-length γ 8 (also the rule): listed once, with the map.
COMPARE="[{name: match-length, gamma: 8}, {name: regime-map, path: $R/map-$LANG_CODE.json, gamma: 8}]"
python -m harness task=bench "${SHAPE[@]}" policy=hysteresis 'gamma=[8]' 'workload.splits=[select]' \
  "task.compare=$COMPARE" hydra.run.dir=$R/held-out-$LANG_CODE
