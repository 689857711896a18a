#!/usr/bin/env bash
# The runs of REGISTERED.md, one after another, from a clean worktree of the registering commit, on a quiet machine.
# usage: bash run.sh OUT_DIR   (from the worktree's root, the project's python on PATH, llama.cpp built)
set -euo pipefail
out=${1:?usage: bash run.sh OUT_DIR}
common=(task=bench models=smollm2 'workload.categories=[chat,summarise,qa,translate,rewrite,code]'
        'workload.splits=[evaluate]' task.repeats=1 hardware.threads=2)
ngram=(engine=llamacpp 'engine.spec_type=[ngram-mod,ngram-simple]')
step() {  # NAME OVERRIDES...: one run, its wall time logged
  local name=$1; shift
  local start; start=$(date +%s)
  python -m harness "${common[@]}" "$@" hydra.run.dir="$out/$name"
  echo "$name: $(( $(date +%s) - start )) s" >>"$out/run.log"
}
# 1. the language tables: llama.cpp Q4_1, n-gram types at γ 4 and 8, greedy and T = 1, concurrency 1
for lang in en it; do
  for t in 0 1; do
    step "ngram-t$t-$lang" +workload="$lang" "${ngram[@]}" 'gamma=[4,8]' workload.sampling.temperature="$t" \
      workload.num_prompts=24
  done
done
# 2. load: English, greedy, γ 8, concurrency 2 and 4 (llama-server slots, closed loop)
for c in 2 4; do
  step "ngram-t0-en-c$c" +workload=en "${ngram[@]}" 'gamma=[8]' workload.sampling.temperature=0 \
    workload.num_prompts=24 concurrency="$c"
done
# 3. a draft model: spectune's distilled draft as a full-vocabulary F32 GGUF, γ 2 and 4, greedy and T = 1
for t in 0 1; do
  step "draft-t$t-en" +workload=en engine=llamacpp engine.spec_type=draft-simple 'gamma=[2,4]' \
    workload.sampling.temperature="$t" workload.num_prompts=12
done
# 4. the same weights in F32 (what spectune's engine computes with), greedy, γ 8
step "ngram-t0-en-f32" +workload=en "${ngram[@]}" engine.weights=f32 'gamma=[8]' workload.sampling.temperature=0 \
  workload.num_prompts=12
# 5. spectune's engine beside it, the same 24 English prompts: prompt lookup γ 8, greedy
step "spectune-lookup-t0-en" +workload=en proposer=lookup 'gamma=[8]' workload.sampling.temperature=0 \
  workload.num_prompts=24
# 6. the read bandwidth beside each engine's AR decode rate
python bench/bandwidth.py "$out/ngram-t0-en" "$out/ngram-t0-en-f32" "$out/spectune-lookup-t0-en" --threads 2 \
  --json >"$out/bandwidth.jsonl"
