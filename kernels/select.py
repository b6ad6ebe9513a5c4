"""Chunk selection: score queries against landmarks, softmax, max over the GQA group, top-k.

    score_chunks(q, lm, *, out=None, scratch=None) -> probs [B, nq, H, N] fp32
        q [B, nq, Hq, d] (nq = 1, or 2: output token and speculative token, each scored alone);
        lm [B, H, N, d]. probs[b, t, h, n] = max over the group's heads of softmax_n(q . lm / sqrt(d)).
    select_chunks(q, lm, budget_chunks) -> idx [B, nq, H, k] int32, ascending chunk ids
        (k = budget_chunks, e.g. 2048 tokens / 8 = 256). Top-k by torch.topk over the kernel's probs.
    score_chunks_ref / select_chunks_ref                   torch twins
    index_overlap(a, b)  (from ddbench.kernels.indexsets)          per (layer, head) overlap of two index sets

Two Triton passes over (request, KV head, landmark split) programs: pass 1 streams the landmarks
once for every query row of the group (both tokens), writes raw fp32 scores of the valid rows to
scratch and the split's row max/sum; pass 2 combines the splits' max/sum and normalises.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError
from ddbench.kernels.grouprows import group_rows, load_group_queries, sm_count
from ddbench.kernels.indexsets import index_overlap  # noqa: F401  (re-exported)

LOG2E = 1.4426950408889634


@triton.jit
def landmark_block(qt, lb, n0, end, s_ln, dd, m, l, scale_log2, BLOCK_N: tl.constexpr):
    """One block of landmarks in pass 1: the group rows' raw log2-domain scores [BLOCK_M, BLOCK_N]
    (-inf past `end`), and the rows' running max and sum of exp updated with them. Returns (n, nv, s, m, l)."""
    n = n0 + tl.arange(0, BLOCK_N)
    nv = n < end
    kt = tl.load(lb + n[None, :].to(tl.int64) * s_ln + dd[:, None], mask=nv[None, :], other=0.0)
    s = tl.where(nv[None, :], tl.dot(qt, kt) * scale_log2, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
    return n, nv, s, m_new, l


@triton.jit
def score_pass1_kernel(q, lm, scratch, pml, N, s_qb, s_qt, s_qh, s_lb, s_lh, s_ln,
                       H, G, NQ, n_split, split_len, scale_log2,
                       D: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Raw scores of one (request, KV head, split) to scratch (in its dtype: fp32, or fp16 for the
    engine); that split's row max and sum, from the unrounded scores."""
    bh, sp, b, h, r, t, g, rv = group_rows(H, G, NQ, GP, BLOCK_M)
    qt = load_group_queries(q, b, h, t, g, rv, s_qb, s_qt, s_qh, G, D)
    dd = tl.arange(0, D)
    lb = lm + b.to(tl.int64) * s_lb + h * s_lh
    sb = scratch + bh.to(tl.int64) * BLOCK_M * N
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    end = tl.minimum(sp * split_len + split_len, N)
    for n0 in range(sp * split_len, end, BLOCK_N):
        n, nv, s, m, l = landmark_block(qt, lb, n0, end, s_ln, dd, m, l, scale_log2, BLOCK_N)
        tl.store(sb + r[:, None] * N + n[None, :], s.to(scratch.dtype.element_ty),
                 mask=rv[:, None] & nv[None, :])
    base = (bh * n_split + sp) * BLOCK_M + r
    tl.store(pml + 2 * base, m)
    tl.store(pml + 2 * base + 1, l)


@triton.jit
def score_pass2_kernel(scratch, pml, out, N, H, G, NQ, n_split, split_len,
                       GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SP: tl.constexpr):
    """Softmax with the global row max and sum, then the max over the group, for one split."""
    bh, sp, b, h, r, t, g, rv = group_rows(H, G, NQ, GP, BLOCK_M)
    ss = tl.arange(0, SP)
    pidx = (bh * n_split + ss)[:, None] * BLOCK_M + r[None, :]
    pm = tl.load(pml + 2 * pidx, mask=(ss < n_split)[:, None], other=-1.0e30)
    pl = tl.load(pml + 2 * pidx + 1, mask=(ss < n_split)[:, None], other=0.0)
    m = tl.max(pm, 0)
    inv = 1.0 / tl.sum(pl * tl.exp2(pm - m[None, :]), 0)
    sb = scratch + bh.to(tl.int64) * BLOCK_M * N
    ob = out + (b * NQ * H + h).to(tl.int64) * N
    end = tl.minimum(sp * split_len + split_len, N)
    for n0 in range(sp * split_len, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nv = n < end
        s = tl.load(sb + r[:, None] * N + n[None, :], mask=rv[:, None] & nv[None, :],
                    other=float("-inf")).to(tl.float32)
        p = tl.exp2(s - m[:, None]) * inv[:, None]
        for tt in tl.static_range(2):
            if tt < NQ:
                best = tl.max(tl.where(rv[:, None] & (t[:, None] == tt), p, 0.0), 0)
                tl.store(ob + tt * H * N + n, best, mask=nv)


def check_select_args(q, lm):
    """(B, nq, Hq, d, H, N) of queries [B, nq, Hq, d] and landmarks [B, H, N, d], or DDBenchError."""
    if q.dim() != 4 or lm.dim() != 4 or q.shape[0] != lm.shape[0] or q.shape[3] != lm.shape[3]:
        raise DDBenchError(f"need q [B, nq, Hq, d] and landmarks [B, H, N, d], got {tuple(q.shape)}, {tuple(lm.shape)}")
    B, nq, Hq, d = q.shape
    H = lm.shape[1]
    if Hq % H or nq not in (1, 2) or d & (d - 1) or q.stride(3) != 1 or lm.stride(3) != 1:
        raise DDBenchError("GQA needs H | Hq, nq in (1, 2), power-of-two head_dim with unit stride")
    return B, nq, Hq, d, H, lm.shape[2]


def score_chunks(q, lm, *, out=None, block_n=64, splits=None, scratch=None):
    """splits: landmark splits per (request, head); None gives ~4 waves of programs, >= 1024 chunks each."""
    B, nq, Hq, d, H, N = check_select_args(q, lm)
    G = Hq // H
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    if splits is None:
        splits = max(1, min(triton.cdiv(4 * sm_count(q.device), B * H), N // 1024))
    split_len = triton.cdiv(triton.cdiv(N, splits), block_n) * block_n
    n_split = triton.cdiv(N, split_len)
    if scratch is None or scratch.numel() < B * H * BLOCK_M * N:
        scratch = torch.empty(B * H * BLOCK_M * N, device=q.device, dtype=torch.float32)
    if out is None:
        out = torch.empty(B, nq, H, N, device=q.device, dtype=torch.float32)
    if out.shape != (B, nq, H, N) or out.dtype != torch.float32 or not out.is_contiguous():
        raise DDBenchError(f"out must be a contiguous fp32 [B, nq, H, N] = {(B, nq, H, N)} tensor")
    pml = torch.empty(B * H * n_split * BLOCK_M * 2, device=q.device, dtype=torch.float32)
    grid = (B * H, n_split)
    score_pass1_kernel[grid](q, lm, scratch, pml, N, q.stride(0), q.stride(1), q.stride(2), *lm.stride()[:3],
                             H, G, nq, n_split, split_len, LOG2E / math.sqrt(d),
                             D=d, GP=GP, BLOCK_M=BLOCK_M, BLOCK_N=block_n, num_warps=4)
    score_pass2_kernel[grid](scratch, pml, out, N, H, G, nq, n_split, split_len,
                             GP=GP, BLOCK_M=BLOCK_M, BLOCK_N=block_n, SP=triton.next_power_of_2(n_split), num_warps=4)
    return out


def score_chunks_ref(q, lm):
    B, nq, Hq, d, H, N = check_select_args(q, lm)
    s = torch.einsum("bthd,bhnd->bthn", q.float(), lm.float().repeat_interleave(Hq // H, 1)) / math.sqrt(d)
    return s.softmax(-1).view(B, nq, H, Hq // H, N).amax(3)


def _topk(probs, budget_chunks):
    N = probs.shape[-1]
    if not 0 < budget_chunks <= N:
        raise DDBenchError(f"budget of {budget_chunks} chunks must be within 1..{N} landmarks")
    return probs.topk(budget_chunks, dim=-1).indices.sort(dim=-1).values.to(torch.int32)


def select_chunks(q, lm, budget_chunks: int, **kw):
    return _topk(score_chunks(q, lm, **kw), budget_chunks)


def select_chunks_ref(q, lm, budget_chunks: int):
    return _topk(score_chunks_ref(q, lm), budget_chunks)
