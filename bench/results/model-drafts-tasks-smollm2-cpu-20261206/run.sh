#!/usr/bin/env bash
# The timed runs of REGISTERED.md, one after another, from a clean worktree of the registering commit.
# usage: bash run.sh OUT_DIR   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run.sh OUT_DIR}
tasks='workload.tasks=[chat,summarise,qa,translate,rewrite,code]'
for models in smollm2-eagle smollm2; do
  for lang in en it; do
    start=$(date +%s)
    python -m harness task=bench models="$models" workload.sampling.temperature=0 +workload="$lang" "$tasks" \
      'workload.splits=[evaluate]' workload.num_prompts=24 'gamma=[2]' task.repeats=1 hardware.threads=2 \
      hydra.run.dir="$out/$models-$lang"
    echo "$models-$lang: $(( $(date +%s) - start )) s" >>"$out/run.log"
  done
done
