#!/bin/bash
# The held-out run of docs/registration/adaptive-regimes-no-probe.md: the controller as committed with that file (a
# batch of two rows or more drafts only above the band's upper edge; under prompt lookup an off row never probes), on
# English prompts no committed run has drawn (the short profile's train split, 192), 48 a phase, against AR,
# match-length γ 8 (the best single static setting and the rule) and the per-regime map that English's training run
# chose (map-en.json, copied). From a clean worktree of the registering commit, alone on a quiet machine; R is this
# folder.
set -euo pipefail
R=${R:?set R to the results folder}
SHAPE=(+workload=shift-en models=smollm2 proposer=lookup hardware.threads=2 task.repeats=1 task.warmup=1
       workload.task_max_new_tokens=128 workload.profile=short 'workload.splits=[train]'
       workload.phases.0.token_budget=6144 workload.phases.1.token_budget=6144
       workload.phases.2.token_budget=6144 workload.phases.3.token_budget=6144)
COMPARE="[{name: match-length, gamma: 8}, {name: regime-map, path: $R/map-en.json, gamma: 8}]"
python -m harness task=bench "${SHAPE[@]}" policy=hysteresis 'gamma=[8]' "task.compare=$COMPARE" \
  hydra.run.dir=$R/held-out-en
