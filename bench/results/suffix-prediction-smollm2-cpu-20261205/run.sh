#!/usr/bin/env bash
# The registered prediction's commands, one after another, from a clean worktree of the registering commit.
# usage: bash run.sh OUT_DIR   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run.sh OUT_DIR}
tasks='workload.tasks=[chat,summarise,qa,translate,rewrite,code]'
start=$(date +%s)
python -m harness task=profile models=smollm2 +workload=en "$tasks" 'workload.splits=[evaluate]' \
  workload.num_prompts=12 'task.batch_sizes=[1]' task.max_gamma=24 task.repeats=20 hardware.threads=2 \
  hydra.run.dir="$out/profile-en"
echo "profile-en: $(( $(date +%s) - start )) s" >>"$out/run.log"
for lang in en it; do
  start=$(date +%s)
  python -m harness task=predict proposer=suffix models=smollm2 +workload="$lang" workload.sampling.temperature=0 \
    "$tasks" 'workload.splits=[evaluate]' workload.num_prompts=48 hardware.threads=2 \
    'task.gammas=[1,2,3,4,6,8,12,16,24]' task.profile="$out/profile-en/profile.json" hydra.run.dir="$out/predict-$lang"
  echo "predict-$lang: $(( $(date +%s) - start )) s" >>"$out/run.log"
done
