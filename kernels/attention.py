"""Dual-token sparse decode attention (DualDecoder §5.2), GQA, with a split-K path.

    dual_sparse_attention(q, k_buf, v_buf, lengths, *, out=None, splits=None, block_n=64) -> o [B, nq, Hq, d]
        q       [B, nq, Hq, d]  nq = 1 (single token) or 2 (T_i, then speculative T'_{i+1})
        k_buf   [B, H, S, d]    per request: lengths[b] context tokens (gathered sparse chunks,
        v_buf   [B, H, S, d]    outliers, local window, in any order), then the nq new tokens'
                                K/V at lengths[b] .. lengths[b]+nq-1
        lengths [B] int32       context tokens per request (excluding the new ones)
        Query t sees key s iff s < lengths[b] + t + 1: T_i never sees T'.
        splits: KV splits per (b, h) (flash-decoding); None picks one from the SM count.
        cache   CacheView(rows, k_scale, v_scale, chunk, tail, kc): how the buffers map to tokens (a chunk cache)
        rows    [B, H, S] int32 (optional): token n of (b, h) is physical row rows[b, h, n] of the buffers
    fp8 KV (e4m3): k_buf, v_buf torch.float8_e4m3fn with k_scale, v_scale fp32 [B, H, S_phys // chunk], one
        scale per chunk of physical rows per (b, h) (ddbench.kernels.fp8.quantize_chunks); row r's scale is
        scale[b, h, r // chunk]. The kernel multiplies the scores' columns by the K scales and the
        probabilities' columns by the V scales (the e4m3 tiles convert exactly to q's dtype for the dots).
    tail=(tk, tv), kc: logical tokens kc.. are rows 0.. of the 16-bit tk, tv [B, H, T, d] (an fp8 chunk cache's
        resident window, generated and new tokens, kept in q's dtype); tokens below kc go through rows
    dual_sparse_attention_ref(q, k_buf, v_buf, lengths, cache=CacheView()) -> o
        torch twin (fp32 math; fp8 buffers dequantised with ddbench.kernels.fp8.dequantize_chunks)
    chunk_cache_rows(B, H, n_tokens, n_slots, chunk, generator=None, device=None) -> rows
        a chunk cache's random slot permutation as rows (test and benchmark inputs)

One program owns one (request, KV head, split): all nq * (Hq/H) query rows of the group share
each K/V tile read from HBM, so two query tokens cost about the bytes of one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError
from ddbench.kernels.fp8 import E4M3, dequantize_chunks
from ddbench.kernels.grouprows import group_rows, load_group_queries

LOG2E = 1.4426950408889634


@triton.jit
def _tile(qt, kb, vb, s_kt, pr, n, nv, limit, m, l, acc, ksc, vsc, scale_log2, dd, FP8: tl.constexpr,
          CHUNK: tl.constexpr):
    """One BLOCK_N tile of logical tokens n (valid nv) at physical rows pr of kb / vb: the online softmax's
    (m, l, acc) after it. FP8: e4m3 rows with their chunk scales at ksc / vsc + pr // CHUNK."""
    kt = tl.load(kb + pr[None, :] * s_kt + dd[:, None], mask=nv[None, :], other=0.0)
    if FP8:       # e4m3 -> q's dtype is exact; row scales applied to the score columns
        ks = tl.load(ksc + pr // CHUNK, mask=nv, other=0.0)
        s = tl.dot(qt, kt.to(qt.dtype)) * (ks * scale_log2)[None, :]
    else:
        s = tl.dot(qt, kt) * scale_log2
    s = tl.where((n[None, :] < limit[:, None]) & nv[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    vt = tl.load(vb + pr[:, None] * s_kt + dd[None, :], mask=nv[:, None], other=0.0)
    if FP8:       # p @ (v * vs) = (p * vs) @ v
        p = p * tl.load(vsc + pr // CHUNK, mask=nv, other=0.0)[None, :]
        vt = vt.to(qt.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
    return m_new, l, acc


@triton.jit
def _attn_kernel(q, k, v, lengths, o, po, pml, rows, ksc, vsc, tk, tv,
                 s_qb, s_qt, s_qh, s_kb, s_kh, s_kt, s_ob, s_ot, s_oh, s_rows, s_sb, s_sh, s_tb, s_th, s_tt, KC,
                 H, G, NQ, n_split, split_len, scale_log2,
                 D: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 SPLIT: tl.constexpr, ROWS: tl.constexpr, FP8: tl.constexpr, CHUNK: tl.constexpr,
                 TAIL: tl.constexpr):
    bh, sp, b, h, r, t, g, rv = group_rows(H, G, NQ, GP, BLOCK_M)
    qt = load_group_queries(q, b, h, t, g, rv, s_qb, s_qt, s_qh, G, D)
    dd = tl.arange(0, D)
    L0 = tl.load(lengths + b)
    start = sp * split_len
    end = tl.minimum(start + split_len, L0 + NQ)
    limit = L0 + t + 1
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    kb = k + b.to(tl.int64) * s_kb + h * s_kh
    vb = v + b.to(tl.int64) * s_kb + h * s_kh
    rb = rows + (b.to(tl.int64) * H + h) * s_rows
    sb = b.to(tl.int64) * s_sb + h * s_sh   # the (b, h) row of k_scale / v_scale (FP8)
    # TAIL: logical tokens from KC on are rows n - KC of the 16-bit tail buffers tk / tv, the rest as below
    mid = tl.minimum(tl.maximum(start, KC), end) if TAIL else end
    for n0 in range(start, mid, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nv = n < mid
        if ROWS:      # logical token -> physical row (a chunk cache's slots)
            pr = tl.load(rb + n, mask=nv, other=0).to(tl.int64)
        else:
            pr = n
        m, l, acc = _tile(qt, kb, vb, s_kt, pr, n, nv, limit, m, l, acc, ksc + sb, vsc + sb, scale_log2, dd,
                          FP8=FP8, CHUNK=CHUNK)
    if TAIL:
        tkb = tk + b.to(tl.int64) * s_tb + h * s_th
        tvb = tv + b.to(tl.int64) * s_tb + h * s_th
        for n0 in range(mid, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            nv = n < end
            m, l, acc = _tile(qt, tkb, tvb, s_tt, n - KC, n, nv, limit, m, l, acc, ksc, vsc,
                              scale_log2, dd, FP8=False, CHUNK=1)
    if SPLIT:
        base = (bh * n_split + sp) * BLOCK_M
        tl.store(po + (base + r)[:, None] * D + dd[None, :], acc)
        tl.store(pml + 2 * (base + r), m)
        tl.store(pml + 2 * (base + r) + 1, l)
    else:
        out = acc / l[:, None]
        tl.store(o + b * s_ob + t[:, None] * s_ot + (h * G + g)[:, None] * s_oh + dd[None, :],
                 out.to(o.dtype.element_ty), mask=rv[:, None])


@triton.jit
def _combine_kernel(po, pml, o, s_ob, s_ot, s_oh, H, G, n_split,
                    D: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, SP: tl.constexpr):
    bh = tl.program_id(0)
    i = tl.program_id(1)  # valid row: token t = i // G, head g = i % G
    b = bh // H
    h = bh % H
    t = i // G
    g = i % G
    r = t * GP + g
    s = tl.arange(0, SP)
    sv = s < n_split
    base = (bh * n_split + s) * BLOCK_M + r
    m = tl.load(pml + 2 * base, mask=sv, other=-1.0e30)
    l = tl.load(pml + 2 * base + 1, mask=sv, other=0.0)
    mm = tl.max(m, 0)
    w = tl.exp2(m - mm)
    dd = tl.arange(0, D)
    acc = tl.load(po + base[:, None] * D + dd[None, :], mask=sv[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(o + b * s_ob + t * s_ot + (h * G + g) * s_oh + dd, out.to(o.dtype.element_ty))


def _sm_count(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def auto_splits(batch: int, kv_heads: int, capacity: int, device) -> int:
    """About one wave of (b, h, split) programs, each split at least 256 tokens.

    H200, 2048 tokens (run 1 sweep): B=8 best at 2 splits, B=32 and B=64 at 1.
    """
    return max(1, min(_sm_count(device) // (batch * kv_heads), capacity // 256))


def _check_tail(tail, kc, S, q, k_buf, rows):
    """(tk, tv) of a tail (tk, tv) [B, H, T >= S - kc, d] in q's dtype, or placeholders (k_buf) without one."""
    if tail is None:
        return k_buf, k_buf
    if rows is None:
        raise DDBenchError("a tail goes with rows (a chunk cache's slots before it)")
    tk, tv = tail
    B, H, _, d = k_buf.shape
    if not 0 <= kc <= S or tk.shape != tv.shape or tk.dim() != 4 or tuple(tk.shape[:2]) != (B, H) \
            or tk.shape[3] != d or tk.shape[2] < S - kc or tk.dtype != q.dtype or tk.stride() != tv.stride() \
            or tk.stride(3) != 1 or tk.device != q.device:
        raise DDBenchError(f"tail must be two [B={B}, H={H}, >= {max(S - kc, 0)}, d={d}] {q.dtype} tensors of equal strides"
                           f" with 0 <= kc <= {S}")
    return tk, tv


def _check_rows(rows, B, H, S_phys):
    """rows [B, H, S_log] int32 (logical token -> physical row of k_buf / v_buf); returns S_log."""
    if rows.dim() != 3 or rows.shape[:2] != (B, H) or rows.dtype != torch.int32 or not rows.is_contiguous():
        raise DDBenchError(f"rows must be a contiguous int32 [B={B}, H={H}, S] tensor")
    return rows.shape[2]


def chunk_cache_rows(B, H, n_tokens, n_slots, chunk, generator=None, device=None):
    """int32 [B, H, n_tokens]: token n of (b, h) in slot perm[b, h, n // chunk] (a random permutation of the
    n_slots slots of `chunk` physical rows each), at row slot * chunk + n % chunk, as a chunk cache holds them."""
    n_chunks = -(-n_tokens // chunk)
    if n_chunks > n_slots:
        raise DDBenchError(f"{n_tokens} tokens need {n_chunks} slots of {chunk} rows, the cache has {n_slots}")
    perm = torch.rand(B, H, n_slots, generator=generator).argsort(-1)[..., :n_chunks]
    n = torch.arange(n_tokens)
    rows = perm[..., n // chunk] * chunk + n % chunk
    return rows.to(device=device, dtype=torch.int32).contiguous()


def _check(q, k_buf, v_buf, lengths):
    if q.dim() != 4 or k_buf.dim() != 4 or k_buf.shape != v_buf.shape:
        raise DDBenchError("need q [B, nq, Hq, d] and k_buf, v_buf [B, H, S, d] of equal shape")
    B, nq, Hq, d = q.shape
    if k_buf.shape[0] != B or k_buf.shape[3] != d or Hq % k_buf.shape[1]:
        raise DDBenchError(f"q {tuple(q.shape)} does not match KV buffers {tuple(k_buf.shape)} (GQA needs H | Hq)")
    if nq not in (1, 2):
        raise DDBenchError(f"nq must be 1 or 2 query tokens, got {nq}")
    if d & (d - 1) or k_buf.stride(3) != 1 or v_buf.stride() != k_buf.stride() or q.stride(3) != 1:
        raise DDBenchError("head_dim must be a power of two with unit stride; k_buf and v_buf equal strides")
    if lengths.shape != (B,):
        raise DDBenchError(f"lengths must be [B={B}]")
    return B, nq, Hq, d, k_buf.shape[1]


def _check_scales(k_buf, v_buf, k_scale, v_scale, chunk) -> bool:
    """True for e4m3 buffers with their fp32 [B, H, S_phys // chunk] scales; one-line DDBenchError otherwise."""
    fp8 = k_buf.dtype == E4M3
    if fp8 != (v_buf.dtype == E4M3):
        raise DDBenchError(f"k_buf and v_buf must both be fp8 or neither, got {k_buf.dtype} and {v_buf.dtype}")
    if not fp8:
        if k_scale is not None or v_scale is not None:
            raise DDBenchError(f"k_scale / v_scale belong to fp8 KV buffers, not {k_buf.dtype} ones")
        return False
    if k_scale is None or v_scale is None:
        raise DDBenchError("fp8 KV buffers need k_scale and v_scale (ddbench.kernels.fp8.quantize_chunks)")
    B, H, S_phys = k_buf.shape[:3]
    if chunk < 1 or S_phys % chunk:
        raise DDBenchError(f"fp8 KV: the buffers' {S_phys} rows are not a multiple of the chunk {chunk}")
    need = (B, H, S_phys // chunk)
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if sc.shape != need or sc.dtype != torch.float32 or not sc.is_contiguous() or sc.device != k_buf.device:
            raise DDBenchError(f"{name} must be a contiguous fp32 {list(need)} tensor on {k_buf.device} (one scale per "
                               f"chunk of {chunk} rows), got {sc.dtype} {list(sc.shape)} on {sc.device}")
    return True


@dataclass(frozen=True, eq=False)
class CacheView:
    """How the attention reads its buffers where they are a chunk cache (the default: plain buffers).
    rows [B, H, S] int32: token n of (b, h) is row rows[b, h, n] of k_buf / v_buf (the cache's slots; its
    values < k_buf's rows). fp8 k_buf / v_buf: k_scale, v_scale fp32 [B, H, S_phys // chunk]. tail (tk, tv)
    [B, H, T, d] in q's dtype: logical tokens kc.. are their rows 0.. (an fp8 chunk cache's 16-bit tail;
    rows[..., kc:] unread)."""
    rows: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    chunk: int = 8
    tail: tuple | None = None
    kc: int = 0


PLAIN = CacheView()


def dual_sparse_attention(q, k_buf, v_buf, lengths, *, out=None, splits=None, block_n=64, num_warps=4, num_stages=3,
                          cache: CacheView = PLAIN):
    """See module docstring. Caller guarantees lengths[b] + nq <= S. cache: CacheView (rows, fp8 scales, tail)."""
    rows, k_scale, v_scale, chunk, tail, kc = (cache.rows, cache.k_scale, cache.v_scale, cache.chunk, cache.tail,
                                               cache.kc)
    B, nq, Hq, d, H = _check(q, k_buf, v_buf, lengths)
    fp8 = _check_scales(k_buf, v_buf, k_scale, v_scale, chunk)
    G = Hq // H
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    S = k_buf.shape[2] if rows is None else _check_rows(rows, B, H, k_buf.shape[2])
    tk, tv = _check_tail(tail, kc, S, q, k_buf, rows)
    lengths = lengths.to(device=q.device, dtype=torch.int32)
    n_split = auto_splits(B, H, S, q.device) if splits is None else int(splits)
    n_split = max(1, min(n_split, triton.cdiv(S, block_n)))
    split_len = triton.cdiv(triton.cdiv(S, n_split), block_n) * block_n
    n_split = triton.cdiv(S, split_len)
    o = torch.empty_like(q) if out is None else out
    if o.shape != q.shape or o.stride(3) != 1:
        raise DDBenchError(f"out must be shaped like q {tuple(q.shape)}")
    scale = LOG2E / math.sqrt(d)
    if n_split > 1:
        po = torch.empty(B * H * n_split * BLOCK_M * d, device=q.device, dtype=torch.float32)
        pml = torch.empty(B * H * n_split * BLOCK_M * 2, device=q.device, dtype=torch.float32)
    else:
        po = pml = o
    ks, vs = (k_scale, v_scale) if fp8 else (lengths, lengths)   # placeholders where FP8 is off
    _attn_kernel[(B * H, n_split)](q, k_buf, v_buf, lengths, o, po, pml, lengths if rows is None else rows, ks, vs,
                                   tk, tv, q.stride(0), q.stride(1), q.stride(2), *k_buf.stride()[:3],
                                   o.stride(0), o.stride(1), o.stride(2), S,
                                   H * ks.shape[-1] if fp8 else 0, ks.shape[-1] if fp8 else 0,
                                   *tk.stride()[:3], kc, H, G, nq, n_split, split_len, scale,
                                   D=d, GP=GP, BLOCK_M=BLOCK_M, BLOCK_N=block_n, SPLIT=n_split > 1,
                                   ROWS=rows is not None, FP8=fp8, CHUNK=chunk if fp8 else 1, TAIL=tail is not None,
                                   num_warps=num_warps, num_stages=num_stages)
    if n_split > 1:
        _combine_kernel[(B * H, nq * G)](po, pml, o, o.stride(0), o.stride(1), o.stride(2), H, G, n_split,
                                         D=d, GP=GP, BLOCK_M=BLOCK_M, SP=triton.next_power_of_2(n_split),
                                         num_warps=4)
    return o


def dual_sparse_attention_ref(q, k_buf, v_buf, lengths, cache: CacheView = PLAIN, **_):
    """Torch twin in fp32, one request at a time (fp8 buffers: dequantised first; rows: read through them;
    tail: logical tokens kc.. from its rows)."""
    rows, k_scale, v_scale, chunk, tail, kc = (cache.rows, cache.k_scale, cache.v_scale, cache.chunk, cache.tail,
                                               cache.kc)
    B, nq, Hq, d, H = _check(q, k_buf, v_buf, lengths)
    S = k_buf.shape[2] if rows is None else _check_rows(rows, B, H, k_buf.shape[2])
    tk, tv = _check_tail(tail, kc, S, q, k_buf, rows)
    if _check_scales(k_buf, v_buf, k_scale, v_scale, chunk):
        k_buf, v_buf = dequantize_chunks(k_buf, k_scale, chunk), dequantize_chunks(v_buf, v_scale, chunk)
    if rows is not None:
        n = kc if tail is not None else S
        idx = rows[..., :n].long()[..., None].expand(B, H, n, d)
        k_buf, v_buf = k_buf.float().gather(2, idx), v_buf.float().gather(2, idx)
        if tail is not None:
            k_buf, v_buf = torch.cat([k_buf, tk[:, :, :S - kc].float()], 2), torch.cat([v_buf, tv[:, :, :S - kc].float()], 2)
    out = torch.empty_like(q)
    for b in range(B):
        L0 = int(lengths[b])
        k = k_buf[b, :, :L0 + nq].float().repeat_interleave(Hq // H, 0)  # [Hq, S, d]
        v = v_buf[b, :, :L0 + nq].float().repeat_interleave(Hq // H, 0)
        s = torch.einsum("thd,hsd->hts", q[b].float(), k) / math.sqrt(d)
        pos = torch.arange(L0 + nq, device=q.device)
        mask = pos[None, :] < (L0 + 1 + torch.arange(nq, device=q.device))[:, None]  # [nq, S]
        s = s.masked_fill(~mask, float("-inf"))
        out[b] = torch.einsum("hts,hsd->thd", s.softmax(-1), v).to(q.dtype)
    return out
