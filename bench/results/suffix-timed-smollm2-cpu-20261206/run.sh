#!/usr/bin/env bash
# The timed runs registered in ../suffix-prediction-smollm2-cpu-20261205/REGISTERED.md, one after another, from a
# clean worktree of the commit that adds this script.
# usage: bash run.sh OUT_DIR REPEATS   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run.sh OUT_DIR REPEATS}
repeats=${2:?usage: bash run.sh OUT_DIR REPEATS}
tasks='workload.tasks=[chat,summarise,qa,translate,rewrite,code]'
for lang in en it; do
  start=$(date +%s)
  python -m harness task=bench models=smollm2 proposer=suffix workload.sampling.temperature=0 +workload="$lang" \
    "$tasks" 'workload.splits=[evaluate]' workload.num_prompts=48 'gamma=[24]' task.repeats="$repeats" \
    hardware.threads=2 hydra.run.dir="$out/greedy-$lang"
  echo "greedy-$lang: $(( $(date +%s) - start )) s" >>"$out/run.log"
done
