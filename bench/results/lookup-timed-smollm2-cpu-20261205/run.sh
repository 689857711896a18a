#!/usr/bin/env bash
# The timed runs of REGISTERED.md, one after another, from a clean worktree of the registering commit.
# usage: bash run.sh OUT_DIR   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run.sh OUT_DIR}
tasks='workload.tasks=[chat,summarise,qa,translate,rewrite,code]'
for spec in "greedy 0 3" "t1 1 1"; do
  read -r name temperature repeats <<<"$spec"
  for lang in en it; do
    start=$(date +%s)
    python -m harness task=bench models=smollm2 proposer=lookup workload.sampling.temperature="$temperature" \
      +workload="$lang" "$tasks" 'workload.splits=[evaluate]' workload.num_prompts=48 'gamma=[8]' \
      task.repeats="$repeats" hardware.threads=2 hydra.run.dir="$out/$name-$lang"
    echo "$name-$lang: $(( $(date +%s) - start )) s" >>"$out/run.log"
  done
done
