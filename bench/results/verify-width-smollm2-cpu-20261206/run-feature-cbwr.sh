#!/usr/bin/env bash
# The feature-draft run of REGISTERED.md under MKL_CBWR=AVX512, from a clean worktree of the commit that adds this script.
# usage: bash run-feature-cbwr.sh OUT_DIR   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run-feature-cbwr.sh OUT_DIR}
start=$(date +%s)
MKL_CBWR=AVX512 python -m harness task=bench models=smollm2-eagle workload.sampling.temperature=0 +workload=en \
  'workload.tasks=[chat,summarise,qa,translate,rewrite,code]' 'workload.splits=[evaluate]' workload.num_prompts=12 \
  'gamma=[2,4]' task.repeats=1 hardware.threads=2 hydra.run.dir="$out/feature-en-cbwr"
echo "feature-en-cbwr: $(( $(date +%s) - start )) s" >>"$out/run.log"
