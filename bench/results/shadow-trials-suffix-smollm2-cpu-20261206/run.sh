#!/usr/bin/env bash
# The timed run of REGISTERED.md, from a clean worktree of the registering commit.
# usage: bash run.sh OUT_DIR   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run.sh OUT_DIR}
start=$(date +%s)
python -m policies.evaluate models=smollm2 +proposer=suffix +workload=en \
  'workload.tasks=[chat,summarise,qa,translate,rewrite,code]' 'workload.splits=[evaluate]' \
  workload.sampling.temperature=0 \
  'train.features=[position,context_length,recent_acceptance,c,g,match_length,matches,suffix_score,suffix_prob]' \
  train.train_prompts=12 train.heldout_prompts=24 train.max_gamma=24 hardware.threads=2 \
  'evaluate.grid=[12]' 'evaluate.policies=[suffix-prob,match-length,ppo]' \
  'evaluate.concurrency=[1]' evaluate.repeats=1 \
  evaluate.policies_from="$PWD/bench/results/adaptive-suffix-smollm2-cpu-20261206/evaluate-en/train" \
  hydra.run.dir="$out/evaluate-en"
echo "evaluate-en: $(( $(date +%s) - start )) s" >>"$out/run.log"
