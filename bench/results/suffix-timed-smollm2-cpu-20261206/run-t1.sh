#!/usr/bin/env bash
# The T = 1 runs of REGISTERED.md (reported, not judged), one after another, from a clean worktree of the commit
# that adds this script.
# usage: bash run-t1.sh OUT_DIR   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run-t1.sh OUT_DIR}
tasks='workload.tasks=[chat,summarise,qa,translate,rewrite,code]'
for lang in en it; do
  start=$(date +%s)
  python -m harness task=bench models=smollm2 proposer=suffix workload.sampling.temperature=1 +workload="$lang" \
    "$tasks" 'workload.splits=[evaluate]' workload.num_prompts=48 'gamma=[24]' task.repeats=1 \
    hardware.threads=2 hydra.run.dir="$out/t1-$lang"
  echo "t1-$lang: $(( $(date +%s) - start )) s" >>"$out/run.log"
done
