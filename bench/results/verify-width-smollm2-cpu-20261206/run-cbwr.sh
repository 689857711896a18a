#!/usr/bin/env bash
# The two profiles of REGISTERED.md's last section, without and with MKL_CBWR=AVX512, from a clean worktree of the
# commit that adds this script.  usage: bash run-cbwr.sh OUT_DIR   (from the worktree's root, the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run-cbwr.sh OUT_DIR}
for mode in default cbwr; do
  start=$(date +%s)
  env $([ "$mode" = cbwr ] && echo MKL_CBWR=AVX512) python -m harness task=profile models=smollm2 +workload=en \
    'workload.tasks=[summarise,rewrite,code]' 'workload.splits=[evaluate]' 'task.batch_sizes=[1]' task.max_gamma=11 \
    task.repeats=10 task.warmup=2 hardware.threads=2 task.label="smollm2-cpu-mkl-$mode" hydra.run.dir="$out/profile-en-$mode"
  echo "profile-en-$mode: $(( $(date +%s) - start )) s" >>"$out/run.log"
done
