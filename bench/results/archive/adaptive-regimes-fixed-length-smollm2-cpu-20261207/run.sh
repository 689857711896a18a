#!/bin/bash
# The run of docs/registration/adaptive-regimes-fixed-length.md: T = 1 four to a batch alone, the 48 English prompts
# of the repeats run (short profile), every answer run to its 128 tokens (workload.ignore_eos=true), five repeats; the
# controller as committed at a1a8743 against AR and the map (AR's exact computation in this regime: the noise floor,
# read in the same run). From a clean worktree of the registering commit, alone on a quiet machine; R is this folder.
set -euo pipefail
R=${R:?set R to the results folder}
SHAPE=(+workload=shift-en models=smollm2 proposer=lookup hardware.threads=2 task.repeats=5 task.warmup=1
       workload.task_max_new_tokens=128 workload.ignore_eos=true workload.profile=short
       'workload.splits=[evaluate,select]'
       'workload.phases=[{name: t1-c4, concurrency: 4, categories: null, sampling_mix: [{temperature: 1.0, share: 1.0}], token_budget: 6144}]')
COMPARE="[{name: regime-map, path: $R/map-en.json, gamma: 8}]"
python -m harness task=bench "${SHAPE[@]}" policy=hysteresis 'gamma=[8]' "task.compare=$COMPARE" \
  hydra.run.dir=$R/t1-c4-en
