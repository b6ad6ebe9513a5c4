"""Chunk selection for the engine: scores, softmax, max over the GQA group and top-k with one pass
over the selection state and no torch top-k or sort.

    select_topk(q, lm, k) -> idx [B, nq, H, k] int32, ascending chunk ids     (landmarks)
    specache_select_topk(q, qk, chunk, k) -> the same from SpeCache's 2-bit keys
    topk_from_scratch(scratch, pml, B, H, nq, G, N, k) -> the fused normalise + group-max + top-k
    select_topk_ref(q, lm, k) = kernels.select.select_chunks_ref                 torch twin

Pass 1 is kernels/select.py's `_score_pass1` (landmarks, raw scores of the group's rows to a
scratch and each split's row max / sum of exp) or kernels/specache.py's `spec_pass1` (2-bit keys,
per-row chunk maxima of the raw scores). The second kernel, one program per (request, KV head,
query token), combines the splits' max / sum into each row's normaliser, builds the row of group-max
probabilities in registers, finds the k-th largest by a 31-step binary search on the float bits
(probabilities are non-negative, so their bits order as integers), and writes the chosen ids in
ascending order with a prefix sum: every chunk above the threshold, then chunks equal to it in id
order until k. Ties at the threshold may pick other (equal-probability) chunks than torch.topk.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.select import LOG2E, _check, _score_pass1, select_chunks_ref


@triton.jit
def _norm_topk_kernel(scratch, pml, out, N, H, G, NQ, n_split, K,
                      GP: tl.constexpr, BLOCK_M: tl.constexpr, SP: tl.constexpr, NP: tl.constexpr):
    pid = tl.program_id(0)              # (b * H + h) * NQ + t
    t = pid % NQ
    bh = pid // NQ
    b = bh // H
    h = bh % H
    n = tl.arange(0, NP)
    nv = n < N
    ss = tl.arange(0, SP)
    sv = ss < n_split
    sb = scratch + bh.to(tl.int64) * BLOCK_M * N
    p = tl.zeros([NP], tl.float32)
    for g in tl.static_range(GP):
        if g < G:
            r = t * GP + g
            pi = 2 * ((bh * n_split + ss) * BLOCK_M + r)
            pm = tl.load(pml + pi, mask=sv, other=-1.0e30)
            pl = tl.load(pml + pi + 1, mask=sv, other=0.0)
            m = tl.max(pm, 0)
            inv = 1.0 / tl.sum(pl * tl.exp2(pm - m), 0)
            s = tl.load(sb + r * N + n, mask=nv, other=float("-inf"))
            p = tl.maximum(p, tl.exp2(s - m) * inv)
    bits = p.to(tl.int32, bitcast=True)
    bits = tl.where(nv, bits, -1)       # padding is never chosen
    thr = tl.zeros([], tl.int32)
    for i in tl.static_range(31):
        cand = thr | (1 << (30 - i))
        cnt = tl.sum((bits >= cand).to(tl.int32), 0)
        thr = tl.where(cnt >= K, cand, thr)
    gt = bits > thr
    eq = bits == thr
    need = K - tl.sum(gt.to(tl.int32), 0)
    er = tl.cumsum(eq.to(tl.int32), 0)
    take = gt | (eq & (er <= need))
    pos = tl.cumsum(take.to(tl.int32), 0) - 1
    ob = out + ((b * NQ + t) * H + h).to(tl.int64) * K
    tl.store(ob + pos, n, mask=take)


def topk_from_scratch(scratch, pml, B, H, nq, G, N, k, out=None):
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    n_split = pml.numel() // (2 * B * H * BLOCK_M)
    if out is None:
        out = torch.empty(B, nq, H, k, device=scratch.device, dtype=torch.int32)
    NP = triton.next_power_of_2(N)
    nw = 16 if NP >= 8192 else (8 if NP >= 2048 else 4)
    _norm_topk_kernel[(B * H * nq,)](scratch, pml, out, N, H, G, nq, n_split, k,
                                     GP=GP, BLOCK_M=BLOCK_M, SP=triton.next_power_of_2(n_split), NP=NP,
                                     num_warps=nw)
    return out


def select_topk(q, lm, k, *, block_n=64, splits=None):
    B, nq, Hq, d, H, N = _check(q, lm)
    if not 0 < k <= N:
        raise ValueError(f"budget of {k} chunks must be within 1..{N} landmarks")
    G = Hq // H
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        splits = max(1, min(triton.cdiv(4 * sms, B * H), N // 1024))
    split_len = triton.cdiv(triton.cdiv(N, splits), block_n) * block_n
    n_split = triton.cdiv(N, split_len)
    scratch = torch.empty(B * H * BLOCK_M * N, device=q.device, dtype=torch.float32)
    pml = torch.empty(B * H * n_split * BLOCK_M * 2, device=q.device, dtype=torch.float32)
    _score_pass1[(B * H, n_split)](q, lm, scratch, pml, N, q.stride(0), q.stride(1), q.stride(2), *lm.stride()[:3],
                                   H, G, nq, n_split, split_len, LOG2E / math.sqrt(d),
                                   D=d, GP=GP, BLOCK_M=BLOCK_M, BLOCK_N=block_n, num_warps=4)
    return topk_from_scratch(scratch, pml, B, H, nq, G, N, k)


def specache_select_topk(q, qk, chunk, k):
    from kernels.specache import spec_pass1
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    scratch, pml = spec_pass1(q, qk, chunk)
    return topk_from_scratch(scratch, pml, B, H, nq, Hq // H, qk.tokens // chunk, k)


def select_topk_ref(q, lm, k):
    return select_chunks_ref(q, lm, k)


def specache_select_topk_ref(q, qk, chunk, k):
    from kernels.specache import specache_chunk_scores_ref
    p = specache_chunk_scores_ref(q, qk, chunk)
    return p.topk(k, dim=-1).indices.sort(-1).values.to(torch.int32)
