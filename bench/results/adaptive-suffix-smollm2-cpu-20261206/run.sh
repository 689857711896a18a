#!/usr/bin/env bash
# The timed runs of REGISTERED.md, one after another, from a clean worktree of the registering commit.
# usage: bash run.sh OUT_DIR   (run from the worktree's root with the project's python on PATH)
set -euo pipefail
out=${1:?usage: bash run.sh OUT_DIR}
for lang in en it; do
  start=$(date +%s)
  python -m policies.evaluate models=smollm2 +proposer=suffix +workload="$lang" \
    'workload.tasks=[chat,summarise,qa,translate,rewrite,code]' 'workload.splits=[evaluate]' \
    workload.sampling.temperature=0 \
    'train.features=[position,context_length,recent_acceptance,c,g,match_length,matches,suffix_score,suffix_prob]' \
    train.train_prompts=12 train.heldout_prompts=24 train.max_gamma=24 hardware.threads=2 \
    'evaluate.grid=[2,4,6,8,12,16,24]' 'evaluate.policies=[suffix-prob,match-length,ppo]' \
    'evaluate.concurrency=[1]' evaluate.repeats=1 \
    hydra.run.dir="$out/evaluate-$lang"
  echo "evaluate-$lang: $(( $(date +%s) - start )) s" >>"$out/run.log"
done
