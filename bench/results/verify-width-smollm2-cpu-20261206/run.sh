#!/usr/bin/env bash
# The runs of REGISTERED.md, one after another, from a clean worktree of the commit that adds this script.
# usage: bash run.sh OUT_DIR   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run.sh OUT_DIR}
start=$(date +%s)
python -m harness task=profile models=smollm2 +workload=en 'workload.tasks=[summarise,rewrite,code]' \
  'workload.splits=[evaluate]' 'task.batch_sizes=[1]' task.max_gamma=11 task.repeats=10 task.warmup=2 \
  hardware.threads=2 hydra.run.dir="$out/profile-en"
echo "profile-en: $(( $(date +%s) - start )) s" >>"$out/run.log"
start=$(date +%s)
python -m harness task=bench models=smollm2 workload.sampling.temperature=0 +workload=en \
  'workload.tasks=[chat,summarise,qa,translate,rewrite,code]' 'workload.splits=[evaluate]' workload.num_prompts=12 \
  'gamma=[2,4]' task.repeats=1 hardware.threads=2 hydra.run.dir="$out/gamma-en"
echo "gamma-en: $(( $(date +%s) - start )) s" >>"$out/run.log"
