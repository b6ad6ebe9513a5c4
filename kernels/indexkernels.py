"""Smaller selection indexes (issue 47): low-bit chunk landmarks (fp8, int4) and a two-level index,
with their torch twins. The formats and their bytes: ddbench/core/index.py.

    L = quantize_landmarks(lm, fmt)             # Landmarks (fmt, data, scale) from fp32/bf16 lm [B, H, N, d]
    dequantize_landmarks(L) -> fp32 [B, H, N, d]
    ix = build_index(keys, spec, chunk=8)       # Index, built once at prefill: chunk means (the Triton
                                                # landmark kernel, fp32), super-chunk means, each quantized
    build_index_ref(keys, spec, chunk=8)        # torch twin
    index_select(q, ix, k, keep=None, scores=torch.float16) -> idx [B, nq, H, k] int32 ascending
    index_select_ref(q, ix, k, keep=None)       # torch twin (fp32 scores, torch.topk)
    index_pass1(q, L, cand=None, scores=...) -> (scratch, pml, NC)   pass 1 of one level (the kernel)
    index_scores_ref(q, L, cand=None) -> group-max softmax probabilities [B, nq, H, NC] (twin)

The flat bf16 index is today's path, unchanged: kernels/engine/fastselect.select_topk.
Scoring (`_index_pass1`, one program per (request, KV head[, query token], split), as select.py's pass 1):
  bf16  q . lm with tl.dot;
  fp8   the e4m3 bytes bitcast and widened to q's dtype (exact), q . code with tl.dot, times the scale;
  int4  the packed bytes of a block once: low and high nibbles (even and odd dims) times their group's scale,
        rounded to q's dtype (as the twin does), two tl.dot of D/2 against q's even and odd dims. (The first
        version, two K=16 dots per group of 32 dims, ran at 14 % of its floor on the H200: traces/kernels/h200-index.)
Raw log2-domain scores go to the scratch and each split's row (max, sum of exp) to pml, the layout that
fastselect.topk_from_scratch's normalise + group max + top-k reads. With `cand` [B, nq, H, NC] (chunk ids,
ascending; ids >= N are padding, scored -inf) each query token's program gathers its own candidates: pass
2 of the two-level index. Two levels: pass 1 of the super-chunks and its top-k' (k' = keep), candidates =
every chunk of the kept super-chunks, pass 2 and its top-k over the candidates, positions mapped to ids.
Softmax of pass 2 is over the candidates (with every super-chunk kept: over all chunks, i.e. flat).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError
from ddbench.core.index import FORMATS, INT4_GROUP, IndexSpec, parse_index, vector_bytes
from ddbench.kernels.engine import fastselect
from ddbench.kernels.fp8 import quantize_chunks
from ddbench.kernels.grouprows import sm_count
from ddbench.kernels.landmarks import build_landmarks
from ddbench.kernels.select import LOG2E

INT4_MAX = 7


@dataclass
class Landmarks:
    """One level of an index: `data` bf16 [B, H, N, d] | e4m3 [B, H, N, d] | uint8 [B, H, N, d // 2] (two
    int4 codes per byte, even dim in the low nibble, biased by 8); `scale` None | fp32 [B, H, N] |
    fp32 [B, H, N, d // INT4_GROUP]."""
    fmt: str
    data: torch.Tensor
    scale: torch.Tensor | None
    head_dim: int

    @property
    def n(self) -> int:
        return self.data.shape[2]

    @property
    def nbytes(self) -> int:
        return self.data.shape[0] * self.data.shape[1] * self.n * vector_bytes(self.fmt, self.head_dim)


@dataclass
class Index:
    spec: IndexSpec
    fine: Landmarks
    coarse: Landmarks | None = None

    @property
    def nbytes(self) -> int:
        return self.fine.nbytes + (self.coarse.nbytes if self.coarse is not None else 0)


def quantize_landmarks(lm: torch.Tensor, fmt: str, dtype=torch.bfloat16) -> Landmarks:
    """Landmarks of `lm` [B, H, N, d] in `fmt` (from its fp32 values; "bf16": 16-bit in `dtype`, the keys'
    dtype); DDBenchError on a head dim int4 cannot pack or a non-finite landmark."""
    if lm.dim() != 4:
        raise DDBenchError(f"landmarks must be [B, H, N, d], got {tuple(lm.shape)}")
    d = lm.shape[-1]
    if fmt == "bf16":
        return Landmarks(fmt, lm.to(dtype).contiguous(), None, d)
    if fmt == "fp8":
        codes, scale = quantize_chunks(lm.float().contiguous(), 1)
        return Landmarks(fmt, codes.contiguous(), scale.contiguous(), d)
    if fmt != "int4":
        raise DDBenchError(f"unknown index format {fmt!r}; use {', '.join(FORMATS)}")
    if d % INT4_GROUP:
        raise DDBenchError(f"int4 landmarks pack groups of {INT4_GROUP} dims; head_dim {d} is not a multiple")
    x = lm.float().reshape(*lm.shape[:3], d // INT4_GROUP, INT4_GROUP)
    amax = x.abs().amax(-1)
    if not bool(torch.isfinite(amax).all()):
        raise DDBenchError("int4 landmarks: a landmark holds inf or NaN; it has no finite scale")
    scale = torch.where(amax > 0, amax / INT4_MAX, torch.ones_like(amax))
    codes = (x / scale[..., None]).round().clamp(-8, INT4_MAX).to(torch.int32).reshape(*lm.shape[:3], d) + 8
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return Landmarks(fmt, packed.contiguous(), scale.contiguous(), d)


def dequantize_landmarks(L: Landmarks) -> torch.Tensor:
    """fp32 [B, H, N, d] of a level (the values the kernels score against)."""
    if L.fmt == "bf16":
        return L.data.float()
    if L.fmt == "fp8":
        return L.data.float() * L.scale[..., None]
    lo = (L.data & 15).to(torch.int32) - 8
    hi = (L.data >> 4).to(torch.int32) - 8
    codes = torch.stack([lo, hi], -1).reshape(*L.data.shape[:3], L.head_dim).float()
    return (codes.view(*codes.shape[:3], -1, INT4_GROUP) * L.scale[..., None]).reshape(codes.shape)


def _super_means(lm32: torch.Tensor, group: int, kernel: bool = True) -> torch.Tensor:
    """Super-chunk landmarks: the mean of each `group` consecutive chunk landmarks (the last one of
    what remains), fp32 [B, H, ceil(N / group), d]; by the landmark kernel, or (kernel False) in torch."""
    B, H, N, d = lm32.shape
    full = N // group * group
    parts = []
    if full and not kernel:
        parts.append(lm32[:, :, :full].reshape(B, H, full // group, group, d).mean(3))
    elif full:
        out = torch.empty(B, H, full // group, d, device=lm32.device, dtype=torch.float32)
        parts.append(build_landmarks(lm32[:, :, :full], group, out))
    if full < N:
        parts.append(lm32[:, :, full:].mean(2, keepdim=True))
    return torch.cat(parts, 2) if len(parts) > 1 else parts[0]


def _check_keys(keys, chunk):
    if keys.dim() != 4 or keys.shape[2] % chunk or keys.shape[2] == 0:
        raise DDBenchError(f"keys must be [B, H, T, d] with T a positive multiple of chunk={chunk}, got {tuple(keys.shape)}")


def index_from_landmarks(lm32: torch.Tensor, spec, dtype=torch.bfloat16, kernel: bool = True) -> Index:
    """The index of fp32 chunk landmarks [B, H, N, d]: super-chunk means (two levels; `kernel` False: in
    torch, for the twins off the GPU), each level quantized."""
    spec = parse_index(spec)
    coarse = quantize_landmarks(_super_means(lm32, spec.group, kernel), spec.coarse, dtype) if spec.two_level else None
    return Index(spec, quantize_landmarks(lm32, spec.fmt, dtype), coarse)


def random_index(B: int, H: int, N: int, d: int, spec, dtype, generator, device, kernel: bool = True) -> Index:
    """An index of random fp32 landmarks [B, H, N, d] (the engine's stand-in for a prefill), built one request at
    a time into tensors allocated once: the transient fp32 landmarks and the quantisation's temporaries are
    one request's, never the batch's (a batch-sized fp32 tensor per layer ran a large batch out of memory)."""
    out = None
    for b in range(B):
        one = index_from_landmarks(torch.empty(1, H, N, d, device=device).normal_(generator=generator), spec, dtype,
                                   kernel)
        levels = [one.fine] + ([one.coarse] if one.coarse is not None else [])
        if out is None:
            def grow(L):
                return Landmarks(L.fmt, L.data.new_empty((B,) + tuple(L.data.shape[1:])),
                                 None if L.scale is None else L.scale.new_empty((B,) + tuple(L.scale.shape[1:])),
                                 L.head_dim)
            out = Index(one.spec, grow(one.fine), grow(one.coarse) if one.coarse is not None else None)
        for have, L in zip([out.fine] + ([out.coarse] if out.coarse is not None else []), levels):
            have.data[b:b + 1].copy_(L.data)
            if L.scale is not None:
                have.scale[b:b + 1].copy_(L.scale)
    return out


def build_index(keys: torch.Tensor, spec, chunk: int = 8) -> Index:
    """The index of post-RoPE `keys` [B, H, T, d], once at prefill: chunk means by the Triton landmark
    kernel in fp32, super-chunk means of those, each level quantized to its format."""
    _check_keys(keys, chunk)
    B, H, T, d = keys.shape
    lm32 = build_landmarks(keys.contiguous(), chunk, torch.empty(B, H, T // chunk, d, device=keys.device,
                                                                  dtype=torch.float32))
    return index_from_landmarks(lm32, spec, keys.dtype)


def build_index_ref(keys: torch.Tensor, spec, chunk: int = 8) -> Index:
    spec = parse_index(spec)
    _check_keys(keys, chunk)
    B, H, T, d = keys.shape
    lm32 = keys.float().view(B, H, T // chunk, chunk, d).mean(3)
    coarse = None
    if spec.two_level:
        n = lm32.shape[2]
        sup = [lm32[:, :, s:s + spec.group].mean(2) for s in range(0, n, spec.group)]
        coarse = quantize_landmarks(torch.stack(sup, 2), spec.coarse, keys.dtype)
    return Index(spec, quantize_landmarks(lm32, spec.fmt, keys.dtype), coarse)


@triton.jit
def _level_scores(q, qrow, rv, data, scale, ids, nv, s_dn, s_sn, scale_log2,
                  FMT: tl.constexpr, D: tl.constexpr, GS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Raw log2-domain scores [BLOCK_M, BLOCK_N] of the group rows (query row pointers `qrow`, masked rows
    load 0) against the landmarks `ids` of one (request, KV head) in format FMT (0 bf16, 1 fp8, 2 int4)."""
    col = ids.to(tl.int64)
    if FMT == 2:
        HD: tl.constexpr = D // 2
        jj = tl.arange(0, HD)
        byte = tl.load(data + col[None, :] * s_dn + jj[:, None], mask=nv[None, :], other=136)       # [D/2, BLOCK_N]
        sc = tl.load(scale + col[None, :] * s_sn + (2 * jj[:, None]) // GS, mask=nv[None, :], other=0.0)
        lo = (((byte & 15).to(tl.int32) - 8).to(tl.float32) * sc).to(q.dtype.element_ty)          # even dims
        hi = (((byte >> 4).to(tl.int32) - 8).to(tl.float32) * sc).to(q.dtype.element_ty)          # odd dims
        qe = tl.load(qrow[:, None] + 2 * jj[None, :], mask=rv[:, None], other=0.0)
        qo = tl.load(qrow[:, None] + 2 * jj[None, :] + 1, mask=rv[:, None], other=0.0)
        acc = tl.dot(qe, lo) + tl.dot(qo, hi)
    else:
        dd = tl.arange(0, D)
        qt = tl.load(qrow[:, None] + dd[None, :], mask=rv[:, None], other=0.0)
        kt = tl.load(data + col[None, :] * s_dn + dd[:, None], mask=nv[None, :], other=0)
        if FMT == 1:
            kt = kt.to(tl.float8e4nv, bitcast=True).to(q.dtype.element_ty)
            acc = tl.dot(qt, kt) * tl.load(scale + col * s_sn, mask=nv, other=0.0)[None, :]
        else:
            acc = tl.dot(qt, kt.to(q.dtype.element_ty))
    return tl.where(nv[None, :], acc * scale_log2, float("-inf"))


@triton.jit
def _index_pass1(q, data, scale, cand, scratch, pml, NC, NL, s_qb, s_qt, s_qh, s_db, s_dh, s_dn, s_sb, s_sh, s_sn,
                 H, G, NQ, n_split, split_len, scale_log2,
                 FMT: tl.constexpr, GATHER: tl.constexpr, D: tl.constexpr, GS: tl.constexpr, GP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One (request, KV head[, query token when GATHER], split): raw scores of the rows to the scratch
    [B*H, BLOCK_M, NC] (its dtype) and the split's row (max, sum of exp) to pml, from unrounded scores."""
    pid = tl.program_id(0)
    sp = tl.program_id(1)
    if GATHER:
        bh = pid // NQ
        tt = pid % NQ
    else:
        bh = pid
        tt = 0
    b = bh // H
    h = bh % H
    r = tl.arange(0, BLOCK_M)
    t = r // GP
    g = r % GP
    rv = (t < NQ) & (g < G)
    if GATHER:
        rv = rv & (t == tt)
    qrow = q + b * s_qb + t * s_qt + (h * G + g) * s_qh
    db = data + b.to(tl.int64) * s_db + h * s_dh
    sb = scale + b.to(tl.int64) * s_sb + h * s_sh
    cb = cand + ((b * NQ + tt) * H + h).to(tl.int64) * NC
    scr = scratch + bh.to(tl.int64) * BLOCK_M * NC
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    end = tl.minimum(sp * split_len + split_len, NC)
    for n0 in range(sp * split_len, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        inb = n < end
        if GATHER:
            ids = tl.load(cb + n, mask=inb, other=0)
            nv = inb & (ids < NL)
        else:
            ids = n
            nv = inb
        s = _level_scores(q, qrow, rv, db, sb, ids, nv, s_dn, s_sn, scale_log2, FMT, D, GS, BLOCK_M, BLOCK_N)
        m_new = tl.maximum(m, tl.max(s, 1))
        l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
        m = m_new
        tl.store(scr + r[:, None] * NC + n[None, :], s.to(scratch.dtype.element_ty), mask=rv[:, None] & inb[None, :])
    base = (bh * n_split + sp) * BLOCK_M + r
    tl.store(pml + 2 * base, m, mask=rv)
    tl.store(pml + 2 * base + 1, l, mask=rv)


_FMT = {"bf16": 0, "fp8": 1, "int4": 2}


def _check_q(q, L: Landmarks):
    if q.dim() != 4 or q.shape[0] != L.data.shape[0] or q.shape[3] != L.head_dim or q.shape[1] not in (1, 2):
        raise DDBenchError(f"need q [B, nq (1 or 2), Hq, d] for landmarks of {tuple(L.data.shape)}, got {tuple(q.shape)}")
    d, H = L.head_dim, L.data.shape[1]
    if q.shape[2] % H or d & (d - 1) or d < 16 or q.stride(3) != 1 or not L.data.is_contiguous():
        raise DDBenchError("GQA needs H | Hq, a power-of-two head_dim >= 16 with unit stride, contiguous landmarks")
    return q.shape[0], q.shape[1], q.shape[2], d, H


def index_pass1(q, L: Landmarks, cand=None, *, block_n=32, splits=None, scores=fastselect.SCORES, scratch=None):
    """Pass 1 of one level in its format; `cand` [B, nq, H, NC] int32: score those chunk ids only, each
    query token its own (pass 2 of two levels). `scratch`: None, or (scores, pml) buffers large enough
    (the tests poison them). Returns (scratch, pml, NC) for topk_from_scratch."""
    B, nq, Hq, d, H = _check_q(q, L)
    G = Hq // H
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    NC = L.n if cand is None else cand.shape[-1]
    if cand is not None and (cand.shape != (B, nq, H, NC) or cand.dtype != torch.int32 or not cand.is_contiguous()):
        raise DDBenchError(f"candidates must be a contiguous int32 [{B}, {nq}, {H}, NC] tensor")
    if splits is None:
        splits = max(1, min(max(triton.cdiv(4 * sm_count(q.device), B * H), fastselect.PASS1_SPLITS),
                            NC // fastselect.PASS1_MIN_SPLIT))
    split_len = triton.cdiv(triton.cdiv(NC, splits), block_n) * block_n
    n_split = triton.cdiv(NC, split_len)
    if scratch is None:
        scratch = (torch.empty(B * H * BLOCK_M * NC, device=q.device, dtype=fastselect.checked_score_dtype(scores)),
                   torch.empty(B * H * n_split * BLOCK_M * 2, device=q.device, dtype=torch.float32))
    scratch, pml = scratch[0][:B * H * BLOCK_M * NC], scratch[1][:B * H * n_split * BLOCK_M * 2]
    data = L.data.view(torch.uint8) if L.fmt == "fp8" else L.data
    sc = L.scale if L.scale is not None else pml
    ss = sc.stride()[:3] if L.scale is not None else (0, 0, 0)
    gather = cand is not None
    grid = (B * H * (nq if gather else 1), n_split)
    _index_pass1[grid](q, data, sc, cand if gather else pml, scratch, pml, NC, L.n, q.stride(0), q.stride(1),
                       q.stride(2), *data.stride()[:3], *ss, H, G, nq, n_split, split_len, LOG2E / math.sqrt(d),
                       FMT=_FMT[L.fmt], GATHER=gather, D=d, GS=INT4_GROUP, GP=GP, BLOCK_M=BLOCK_M,
                       BLOCK_N=block_n, num_warps=4)
    return scratch, pml, NC


def _candidates(sup: torch.Tensor, group: int) -> torch.Tensor:
    """Chunk ids [B, nq, H, k' * G] (ascending) of the kept super-chunks `sup` [B, nq, H, k'] (ascending)."""
    off = torch.arange(group, device=sup.device, dtype=torch.int32)
    return (sup[..., None] * group + off).flatten(-2).contiguous()


def _keep(ix: Index, k: int, keep) -> int:
    S = ix.coarse.n
    kk = ix.spec.kept(k, ix.fine.n) if keep is None else min(int(keep), S)
    if kk * ix.spec.group < k or kk < 1:
        raise DDBenchError(f"two-level index: {kk} super-chunks of {ix.spec.group} chunks cannot hold a budget of {k}")
    return kk


def index_select(q, ix: Index, k: int, keep=None, *, out=None, scores=fastselect.SCORES, block_n=32, splits=None,
                 **topk_kw):
    """Top-k chunk ids [B, nq, H, k] int32 (ascending) by the index `ix`, into `out` where given (as
    fastselect.topk_from_scratch takes it); `keep`: k' super-chunks (default the spec's M x k). A flat
    bf16 index takes today's path, fastselect.select_topk."""
    B, nq, Hq, d, H = _check_q(q, ix.fine)
    if not 0 < k <= ix.fine.n:
        raise DDBenchError(f"budget of {k} chunks must be within 1..{ix.fine.n} landmarks")
    if ix.coarse is None:
        if ix.fine.fmt == "bf16":
            return fastselect.select_topk(q, ix.fine.data, k, block_n=max(block_n, 16), splits=splits, scores=scores,
                                          out=out, **topk_kw)
        scratch, pml, NC = index_pass1(q, ix.fine, block_n=block_n, splits=splits, scores=scores)
        return fastselect.topk_from_scratch(scratch, pml, fastselect.TopkShape(B, H, nq, Hq // H, NC, k), out=out,
                                            **topk_kw)
    kk = _keep(ix, k, keep)
    scratch, pml, S = index_pass1(q, ix.coarse, block_n=block_n, splits=splits, scores=scores)
    sup = fastselect.topk_from_scratch(scratch, pml, fastselect.TopkShape(B, H, nq, Hq // H, S, kk))
    cand = _candidates(sup, ix.spec.group)
    scratch, pml, NC = index_pass1(q, ix.fine, cand, block_n=block_n, splits=splits, scores=scores)
    pos = fastselect.topk_from_scratch(scratch, pml, fastselect.TopkShape(B, H, nq, Hq // H, NC, k), **topk_kw)
    return fastselect.deliver_ids(cand.gather(-1, pos.long()), out)


def index_scores_ref(q, L: Landmarks, cand=None) -> torch.Tensor:
    """Torch twin of a level's scoring: max over the GQA group of the softmax (over the landmarks, or
    over each row's candidates `cand`; ids >= N score -inf) of q . dequantized landmark / sqrt(d)."""
    B, nq, Hq, d, H = _check_q(q, L)
    lm = dequantize_landmarks(L)
    if L.fmt == "int4":                  # the kernel scores code x scale rounded to q's dtype
        lm = lm.to(q.dtype).float()
    lm = lm.repeat_interleave(Hq // H, 1)                                       # [B, Hq, N, d]
    s = torch.einsum("bthd,bhnd->bthn", q.float(), lm) / math.sqrt(d)           # [B, nq, Hq, N]
    if cand is not None:
        c = cand.long().repeat_interleave(Hq // H, 2)                           # [B, nq, Hq, NC]
        s = torch.where(c < L.n, s.gather(-1, c.clamp(max=L.n - 1)), float("-inf"))
    return s.softmax(-1).view(B, nq, H, Hq // H, -1).amax(3)


def _topk_ref(p, k):
    """The k largest probabilities' ids, written ascending."""
    return p.topk(k, dim=-1).indices.sort(-1).values.to(torch.int32)


def index_select_ref(q, ix: Index, k: int, keep=None, out=None) -> torch.Tensor:
    """Torch twin of index_select (fp32 scores, torch.topk), into `out` as index_select takes it."""
    if ix.coarse is None:
        return fastselect.deliver_ids(_topk_ref(index_scores_ref(q, ix.fine), k), out)
    sup = _topk_ref(index_scores_ref(q, ix.coarse), _keep(ix, k, keep))
    cand = _candidates(sup, ix.spec.group)
    return fastselect.deliver_ids(cand.gather(-1, _topk_ref(index_scores_ref(q, ix.fine, cand), k).long()), out)
