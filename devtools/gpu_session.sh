#!/usr/bin/env bash
# The next GPU session's calls for the engine issues (matched rates; the smaller selection index), one STEP per
# device call, each sized under one call's 600 s. Run from the repository root on an H200:
#     DDBENCH_GIT_SHA=<sha> SEED=0 bash devtools/gpu_session.sh STEP          -> $OUT/<step>[-s<seed>].tar.gz
# In this order (expected wall time from the same scripts' last calls on an H200; a fresh machine adds its start):
#   tests        300-450 s  the whole `pytest -m gpu` at HEAD, alone in its call (last whole run: efd2e08)
#   memcheck     ~300 s     compute-sanitizer memcheck: the engine's self-check per design, the index kernels' tests
#   index        ~200 s     devtools.gpu_index_bench: every index at 32K and 128K, batch 1/16/64 and the largest, 3 reps
#   index-steps  ~500 s     once per SEED 0, 1, 2 (separate processes): dualdecoder-cache@8192 and ShadowKV at 128K,
#                           each index of INDEXES (default flat, fp8, two-level:16,2: the ones that keep every rate
#                           inside flat's interval on SmolLM2 and Gemma 3, docs/profiling.md) at the memory model's
#                           largest batch for that index, compute only and with transfers, at the matched rate set
#   grid-64k     ~250 s     the 64K cache grid's missing seed 2 (traces/engine/h200-rate-grid), SEED=2
#   qwen         ~550 s     once per SEED: every design at its largest batch, Qwen2.5-7B and 14B at 128K, matched rates
# 30 minutes of device time take tests, memcheck, index and one index-steps seed; the rest is the next session's.
set -euo pipefail
STEP=${1:?usage: gpu_session.sh tests|memcheck|index|index-steps|grid-64k|qwen}
: "${DDBENCH_GIT_SHA:?set DDBENCH_GIT_SHA to the commit under test}"
: "${OUT:?run on the device machine, where \$OUT is the folder that comes back}"
SEED=${SEED:-0}
export PYTHONPATH=. DDBENCH_GIT_SHA
W=$(mktemp -d)
nvidia-smi > "$W/nvidia-smi.txt"

batch() {   # the memory model's largest batch: MODEL DESIGN INDEX [plan flags]
  python3 -m ddbench plan --model "$1" --gpu h200 --context 128k --design "$2" --index "$3" "${@:4}" --json \
    | python3 -c "import json, sys; print(json.load(sys.stdin)['systems'][0]['max_batch'])"
}

case "$STEP" in
  tests)
    python3 -m pytest -m gpu -rs -q -p no:cacheprovider > "$W/gpu-tests-$DDBENCH_GIT_SHA.log" 2>&1 || true ;;
  memcheck)
    for d in dualdecoder dualdecoder-fifo shadowkv specache dualdecoder-cpu-gather dualdecoder-cache lru-cache; do
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python3 -m ddbench.kernels.engine.selfcheck "$d" >> "$W/memcheck-engine.log" 2>&1 || echo "FAILED $d" >> "$W/memcheck-engine.log"
    done
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_index.py > "$W/memcheck-index.log" 2>&1 || true ;;
  index)
    python3 -m devtools.gpu_index_bench --out "$W/index-bench.csv" --reps 3 \
      --specs 'flat;fp8;int4;two-level:8;two-level:16,2;two-level:8,1,fp8;two-level:8,1,int4;two-level:16,2,fp8' \
      --points 32768:1,32768:16,32768:64,32768:95,131072:1,131072:16,131072:60,131072:64,131072:78,131072:90 \
      > "$W/index-bench.log" 2>&1 ;;
  index-steps)
    for ix in ${INDEXES:-flat fp8 two-level:16,2}; do
      for d in dualdecoder-cache@8192 shadowkv; do
        if [ "$d" = shadowkv ]; then b=$(batch llama-3-8b shadowkv "$ix"); else b=$(batch llama-3-8b dualdecoder-cache "$ix" --cache-tokens 8192); fi
        for x in "" --no-transfers; do
          python3 -m ddbench.kernels.engine.sweep --point "$d:131072:$b" --index "$ix" --seed "$SEED" --host-gib 8 \
            --replays 3 $x --out "$W/engine" --folder "index-s$SEED" --resume >> "$W/points.log" 2>&1 || echo "FAILED $d $ix $x" >> "$W/points.log"
        done
      done
    done ;;
  grid-64k)
    C=""; for u in 0.01 0.06 0.2; do for c in 0.05 0.2 0.5; do C="$C;79:$u:$c"; done; done
    python3 -m devtools.gpu_rate_grid --out "$W/c64" --seed "$SEED" --context 65536 --cache "${C#;}" > "$W/sweep.log" 2>&1 ;;
  qwen)
    for m in qwen2.5-7b qwen2.5-14b; do
      for d in dualdecoder-cache shadowkv dualdecoder; do
        if [ "$d" = dualdecoder-cache ]; then b=$(batch "$m" "$d" flat --cache-tokens 8192); p="$d@8192"; else b=$(batch "$m" "$d" flat); p=$d; fi
        python3 -m ddbench.kernels.engine.sweep --model "$m" --point "$p:131072:$b" --seed "$SEED" --host-gib 8 --replays 3 \
          --out "$W/engine" --folder "qwen-s$SEED" --resume >> "$W/points.log" 2>&1 || echo "FAILED $m $d" >> "$W/points.log"
      done
    done ;;
  *) echo "gpu_session.sh: unknown step '$STEP' (tests, memcheck, index, index-steps, grid-64k, qwen)" >&2; exit 2 ;;
esac
name=$STEP; [ "$STEP" = tests ] || [ "$STEP" = memcheck ] || [ "$STEP" = index ] || name="$STEP-s$SEED"
tar -czf "$OUT/$name.tar.gz" -C "$W" .
echo "gpu_session.sh: $STEP done: $OUT/$name.tar.gz"
