"""Real GPU kernels for ddbench (issue 3). Each has a Triton kernel and a torch twin (`*_ref`).

Public API (shapes: B requests, Hq query heads, H KV heads, d head dim, C tokens per chunk,
N chunks per request and head, nq = 1 or 2 new query tokens per request):

  ddbench.kernels.landmarks  build_landmarks(k, chunk=8) -> lm [B, H, N, d]
  ddbench.kernels.select     score_chunks(q, lm) -> probs [B, nq, H, N] fp32
                             select_chunks(q, lm, budget_chunks) -> idx [B, nq, H, k] int32, sorted
                             index_overlap(a, b) -> [..] fraction of a's chunks also in b
  ddbench.kernels.layout     alloc_host_kv(L, B, H, N, chunk, d) -> pinned [L, B, H, N, 2, C, d]
  ddbench.kernels.gather     gather_uva(host_kv, layer, idx, k_out, v_out, prev=None, programs=32)
                             reuse_plan(prev_idx, idx) -> src_slot (-1 = miss)
                             gather_cpu_staging(...), gather_per_chunk(...)  (Figure 19 baselines)
  ddbench.kernels.attention  dual_sparse_attention(q, k_buf, v_buf, lengths, splits=None) -> o [B, nq, Hq, d]
  ddbench.kernels.rebuild    rebuild_keys(U, SV, idx, k_out, chunk=8, rope_theta=...)
  ddbench.kernels.specache   quantize_keys_2bit(k) -> QuantKeys ; specache_scores(q, qk) -> [B, nq, H, T]

The package imports torch and triton; ddbench imports it lazily (GPU commands only).
"""
