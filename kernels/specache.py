"""SpeCache's importance scoring on a 2-bit key copy (KIVI style: per channel, groups of 64 tokens).

    quantize_keys_2bit(k, group=64) -> QuantKeys(codes uint8 [B, H, T/4, d], scale, zero [B, H, T/group, d])
        codes pack 4 consecutive tokens per byte (2 bits each); key ~ zero + scale * code.
    random_quant_keys(B, H, T, d, group=64, generator=None) -> random QuantKeys (timing inputs)
    dequantize_keys(qk) -> [B, H, T, d]
    specache_scores(q, qk) -> probs [B, nq, H, T] fp32: max over the GQA group of softmax_t(q . k~_t / sqrt(d))
    specache_scores_ref(q, qk)                          twin: dequantize in fp32, then the same softmax/max
    specache_scores_triton(q, qk, *, chunk=0, splits=None, rows=None) -> the same [B, nq, H, T] (chunk=0),
        or the max over each chunk of `chunk` tokens, [B, nq, H, T/chunk] (what the engine's top-k needs)
    spec_block_m(nq, G, impl="codes", rows=None) -> query rows per program (pass 1's scratch / pml stride):
        the group's nq x GP rows padded to 8 (codes: the rows are the N of its dots, an mma is 8 wide) or
        16 (dequant, or rows=16: the layout before issue 9's last change)
    specache_chunk_scores_ref(q, qk, chunk)             twin of the chunk form
`specache_scores` (torch): scores are q.zero + (q*scale).code per group, so the codes are unpacked
once in the query dtype and never rescaled element-wise.

The Triton kernel (impl="codes", the default) scores on the raw codes: the score of token t of group
g is (q * scale_g) . code_t + q . zero_g. Programs are (request, KV head, group split); each first
writes q . zero_g of its groups (one dot per 16 groups) to a small fp32 buffer, then takes
`groups_per_iter` groups per iteration, one per warp (a batched dot): the group's fp16
q * scale * log2(e)/sqrt(d) is the B operand [d, query rows], the codes the A operand [byte rows, d],
one dot per token phase (the 4 tokens of a byte). Each code becomes an exact fp16 0..3 in registers:
per 4 packed bytes two PRMT (shared by the phases), then per pair of codes one LOP3 (the code's bits
under the fp16 exponent of 1024) and one HFMA2 (x 4^-phase - 1024 x 4^-phase), about 1.1 instructions
per code against 11.5 for the dequantising kernel. q . zero_g enters the softmax per row (max and
exp argument), never per score. Pass 1 keeps each row's running max and sum of exp per warp slot
(combined at the end) and, for the chunk form, writes each row's chunk maxima (a chunk's byte rows are
placed in one thread's registers, so its max needs no shuffle); pass 2 of the per-token form
recomputes the scores, normalises and writes the max over the GQA group. In the CPU interpreter
(no inline asm) the codes are unpacked with shifts; the arithmetic is otherwise the same.
impl="dequant" is the previous kernel (zero + scale x code in fp16 registers, fp16 keys into the dot),
kept for comparison.
"""

from __future__ import annotations

import math
from typing import NamedTuple
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError
from ddbench.kernels.grouprows import group_rows, load_group_queries, sm_count

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class QuantKeys:
    codes: torch.Tensor  # uint8 [B, H, T // 4, d]
    scale: torch.Tensor  # [B, H, T // group, d]
    zero: torch.Tensor   # [B, H, T // group, d]
    group: int

    @property
    def tokens(self) -> int:
        return self.codes.shape[2] * 4


def random_quant_keys(B: int, H: int, T: int, d: int, group: int = 64, generator=None, device="cuda") -> QuantKeys:
    """Random 2-bit codes with bf16 scale and zero per group (timing inputs: quantizing real keys is slow)."""
    codes = torch.randint(0, 256, (B, H, T // 4, d), device=device, dtype=torch.uint8, generator=generator)
    scale = (torch.rand(B, H, T // group, d, device=device, generator=generator) * 0.5 + 0.05).to(torch.bfloat16)
    zero = torch.randn(B, H, T // group, d, device=device, generator=generator).to(torch.bfloat16)
    return QuantKeys(codes, scale, zero, group)


def quantize_keys_2bit(k: torch.Tensor, group: int = 64) -> QuantKeys:
    if k.dim() != 4 or k.shape[2] % group or group % 4:
        raise DDBenchError(f"keys must be [B, H, T, d] with T a multiple of group={group}")
    B, H, T, d = k.shape
    kg = k.float().view(B, H, T // group, group, d)
    lo, hi = kg.amin(3), kg.amax(3)
    scale = ((hi - lo) / 3).clamp_min(1e-8)
    code = ((kg - lo[:, :, :, None]) / scale[:, :, :, None]).round_().clamp_(0, 3).to(torch.uint8)
    c = code.view(B, H, T // 4, 4, d)
    packed = c[:, :, :, 0] | (c[:, :, :, 1] << 2) | (c[:, :, :, 2] << 4) | (c[:, :, :, 3] << 6)
    return QuantKeys(packed.contiguous(), scale.to(k.dtype), lo.to(k.dtype), group)


def _unpack(codes: torch.Tensor, dtype) -> torch.Tensor:
    B, H, T4, d = codes.shape
    shifts = torch.arange(0, 8, 2, device=codes.device, dtype=torch.uint8).view(1, 1, 1, 4, 1)
    return ((codes[:, :, :, None] >> shifts) & 3).to(dtype).view(B, H, T4 * 4, d)


def dequantize_keys(qk: QuantKeys, dtype=torch.float32) -> torch.Tensor:
    B, H, T, d = qk.codes.shape[0], qk.codes.shape[1], qk.tokens, qk.codes.shape[3]
    c = _unpack(qk.codes, torch.float32).view(B, H, T // qk.group, qk.group, d)
    return (qk.zero.float()[:, :, :, None] + qk.scale.float()[:, :, :, None] * c).view(B, H, T, d).to(dtype)


def _group_softmax_max(s: torch.Tensor, B, nq, H, G) -> torch.Tensor:
    return s.float().softmax(-1).view(B, nq, H, G, -1).amax(3)


def specache_scores(q: torch.Tensor, qk: QuantKeys) -> torch.Tensor:
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    if Hq % H or qk.codes.shape[0] != B or qk.codes.shape[3] != d:
        raise DDBenchError("q does not match the quantized keys")
    G, ng = Hq // H, qk.tokens // qk.group
    qh = q.view(B, nq, H, G, d).permute(0, 2, 1, 3, 4).reshape(B, H, nq * G, d)  # [B, H, M, d]
    codes = _unpack(qk.codes, q.dtype).view(B, H, ng, qk.group, d)
    qs = qh[:, :, None] * qk.scale[:, :, :, None]                              # [B, H, ng, M, d]
    s = torch.matmul(qs, codes.transpose(-1, -2))                              # [B, H, ng, M, group]
    s = s.float() + torch.matmul(qh[:, :, None], qk.zero[:, :, :, :, None]).float()  # + q.zero per group
    s = s.permute(0, 3, 1, 2, 4).reshape(B, nq, G, H, qk.tokens).transpose(2, 3).reshape(B, nq * H * G, -1)
    return _group_softmax_max(s / math.sqrt(d), B, nq, H, G)


def specache_scores_ref(q: torch.Tensor, qk: QuantKeys) -> torch.Tensor:
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    k = dequantize_keys(qk).repeat_interleave(Hq // H, 1)  # [B, Hq, T, d]
    s = torch.einsum("bthd,bhsd->bths", q.float(), k) / math.sqrt(d)
    return _group_softmax_max(s, B, nq, H, Hq // H)


def specache_chunk_scores_ref(q: torch.Tensor, qk: QuantKeys, chunk: int) -> torch.Tensor:
    s = specache_scores_ref(q, qk)
    return s.view(*s.shape[:3], -1, chunk).amax(-1)


@triton.jit
def _split_normalisers(pml, bh, n_split, r, BLOCK_M: tl.constexpr, SP: tl.constexpr):
    """Pass 2: each query row's softmax max and 1 / sum of exp over every split's (max, sum) of pass 1."""
    ss = tl.arange(0, SP)
    pidx = (bh * n_split + ss)[:, None] * BLOCK_M + r[None, :]
    pm = tl.load(pml + 2 * pidx, mask=(ss < n_split)[:, None], other=-1.0e30)
    pl = tl.load(pml + 2 * pidx + 1, mask=(ss < n_split)[:, None], other=0.0)
    m = tl.max(pm, 0)
    return m, 1.0 / tl.sum(pl * tl.exp2(pm - m[None, :]), 0)


@triton.jit
def _byte_row_scales(scale, zero, zb, gi, g1, rok, s_sg, D: tl.constexpr, R4: tl.constexpr, GB: tl.constexpr,
                     ROWLOAD: tl.constexpr):
    """The scale and zero of each byte row's group, [GB * R4, D] fp32, for the GB groups from gi."""
    dd = tl.arange(0, D)
    if ROWLOAD:   # each byte row loads its group's scale and zero (L1 hits), no layout shuffle
        rr = tl.arange(0, GB * R4)
        gsrc = zb + (gi + rr // R4)[:, None] * s_sg + dd[None, :]
        scb = tl.load(scale + gsrc, mask=rok[:, None], other=0.0).to(tl.float32)
        zeb = tl.load(zero + gsrc, mask=rok[:, None], other=0.0).to(tl.float32)
    else:
        gg = tl.arange(0, GB)
        gv = (gi + gg) < g1
        sc = tl.load(scale + zb + (gi + gg)[:, None] * s_sg + dd[None, :], mask=gv[:, None], other=0.0)
        ze = tl.load(zero + zb + (gi + gg)[:, None] * s_sg + dd[None, :], mask=gv[:, None], other=0.0)
        scb = tl.reshape(tl.broadcast_to(sc[:, None, :], (GB, R4, D)), (GB * R4, D)).to(tl.float32)
        zeb = tl.reshape(tl.broadcast_to(ze[:, None, :], (GB, R4, D)), (GB * R4, D)).to(tl.float32)
    return scb, zeb


@triton.jit
def _store_row_chunk_maxima(scratch, bh, r, rv, cmr, gi, g1, T_out, BLOCK_M: tl.constexpr, R4: tl.constexpr,
                            BR: tl.constexpr, CHUNK: tl.constexpr):
    """Pass 1: per query row, the max raw score of each chunk of the iteration's byte rows (`cmr`
    [BLOCK_M, BR], the max over the 4 token phases): the row's softmax is monotone, so the chunk's
    max probability follows from it and the row's normaliser (pass 2)."""
    PER1: tl.constexpr = CHUNK // 4
    NC1: tl.constexpr = BR // PER1
    crow = tl.max(tl.reshape(cmr, [BLOCK_M, NC1, PER1]), 2)
    cc1 = tl.arange(0, NC1)
    ch1 = gi * (R4 // PER1) + cc1
    cok1 = (gi + cc1 // (R4 // PER1)) < g1
    sb = scratch + bh.to(tl.int64) * BLOCK_M * T_out
    tl.store(sb + r[:, None] * T_out + ch1[None, :], crow.to(scratch.dtype.element_ty),
             mask=rv[:, None] & cok1[None, :])


@triton.jit
def _spec_kernel(q, codes, scale, zero, pml, out, scratch, n_groups, s_qb, s_qt, s_qh, s_cb, s_ch, s_ct,
                 s_sb, s_sh, s_sg, H, G, NQ, n_split, split_groups, scale_log2, T_out,
                 D: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr,
                 PASS: tl.constexpr, SP: tl.constexpr, CHUNK: tl.constexpr, GB: tl.constexpr,
                 ROWLOAD: tl.constexpr = False):
    """GB groups (GB * GROUP tokens, GB * GROUP / 4 byte rows) per iteration: the codes' 4 token
    phases are dequantised in registers (zero + scale * code, the group's scale broadcast over its
    rows) and each phase is one [rows, D] x [D, BLOCK_M] dot. Pass 1 (with CHUNK: the per-row chunk
    maxima too); pass 2 per token only (the chunk form's pass 2 is kernels/select.py's score_pass2_kernel)."""
    bh, sp, b, h, r, t, g, rv = group_rows(H, G, NQ, GP, BLOCK_M)
    qt = load_group_queries(q, b, h, t, g, rv, s_qb, s_qt, s_qh, G, D).to(tl.float16)
    dd = tl.arange(0, D)
    R4: tl.constexpr = GROUP // 4
    BR: tl.constexpr = GB * R4
    rr = tl.arange(0, BR)
    cb = codes + b.to(tl.int64) * s_cb + h.to(tl.int64) * s_ch
    zb = b.to(tl.int64) * s_sb + h.to(tl.int64) * s_sh
    base = (bh * n_split + sp) * BLOCK_M + r
    if PASS == 2:
        m, inv = _split_normalisers(pml, bh, n_split, r, BLOCK_M, SP)
        ob = out + (b * NQ * H + h).to(tl.int64) * T_out
        sel0 = rv & (t == 0)
        sel1 = rv & (t == 1)
    else:
        m = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
    g0 = sp * split_groups
    g1 = tl.minimum(g0 + split_groups, n_groups)
    for gi in range(g0, g1, GB):
        row = gi * R4 + rr
        rok = (gi + rr // R4) < g1
        scb, zeb = _byte_row_scales(scale, zero, zb, gi, g1, rok, s_sg, D, R4, GB, ROWLOAD)
        c = tl.load(cb + row[:, None].to(tl.int64) * s_ct + dd[None, :], mask=rok[:, None], other=0)
        if PASS == 1:
            if CHUNK != 0:
                cmr = tl.full([BLOCK_M, BR], float("-inf"), tl.float32)
        for j in tl.static_range(4):
            kj = (zeb + scb * ((c >> (2 * j)) & 3).to(tl.float32)).to(tl.float16)     # [BR, D]
            s = tl.dot(qt, tl.trans(kj)) * scale_log2                                    # [BLOCK_M, BR]
            s = tl.where(rok[None, :], s, float("-inf"))
            if PASS == 1:
                m_new = tl.maximum(m, tl.max(s, 1))
                l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
                m = m_new
                if CHUNK != 0:
                    cmr = tl.maximum(cmr, s)
            else:
                p = tl.exp2(s - m[:, None]) * inv[:, None]
                b0 = tl.max(tl.where(sel0[:, None], p, 0.0), 0)
                b1 = tl.max(tl.where(sel1[:, None], p, 0.0), 0)
                tok = 4 * row + j
                tl.store(ob + tok, b0, mask=rok)
                if NQ == 2:
                    tl.store(ob + H * T_out + tok, b1, mask=rok)
        if PASS == 1:
            if CHUNK != 0:
                _store_row_chunk_maxima(scratch, bh, r, rv, cmr, gi, g1, T_out, BLOCK_M, R4, BR, CHUNK)
    if PASS == 1:
        tl.store(pml + 2 * base, m)
        tl.store(pml + 2 * base + 1, l)


@triton.jit
def _codes_phase(c, P: tl.constexpr, ASM: tl.constexpr):
    """The fp16 codes of token phase P (bits 2P..2P+1 of each byte), exactly 0..3. On the GPU one
    inline-asm block per 4 packed bytes: two byte spreads (shared by the 4 phases after CSE), then per
    pair of codes one LOP3 (mask | 0x6400: fp16 1024 + 4^P code) and one HFMA2 (x 4^-P - 1024 4^-P)."""
    if ASM:
        MASK: tl.constexpr = 0x00030003 << (2 * P)
        SC: tl.constexpr = (0x3C003C00, 0x34003400, 0x2C002C00, 0x24002400)[P]
        NG: tl.constexpr = (0xE400E400, 0xDC00DC00, 0xD400D400, 0xCC00CC00)[P]
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t0, t1, s, n; prmt.b32 t0, $2, 0, 0x4140; prmt.b32 t1, $2, 0, 0x4342; "
            f"lop3.b32 t0, t0, {MASK}, 0x64006400, 0xEA; lop3.b32 t1, t1, {MASK}, 0x64006400, 0xEA; "
            f"mov.b32 s, {SC}; mov.b32 n, {NG}; fma.rn.f16x2 $0, t0, s, n; fma.rn.f16x2 $1, t1, s, n; }}",
            "=r,=r,r", [c], dtype=tl.float16, is_pure=True, pack=4)
    else:
        return ((c >> (2 * P)) & 3).to(tl.float16)


@triton.jit
def _store_phase(ob, tok, s, mz, inv, sel0, sel1, ok, H, T_out, NQ):
    """Pass 2 of the per-token form: one phase's probabilities, max over each token's query rows."""
    p = tl.exp2(s - mz) * inv
    tl.store(ob + tok, tl.max(tl.where(sel0, p, 0.0), 2), mask=ok)
    if NQ == 2:
        tl.store(ob + H * T_out + tok, tl.max(tl.where(sel1, p, 0.0), 2), mask=ok)


@triton.jit
def _zero_dots(zero, zb, qv, zsb, g0, g1, r, s_sg, scale_log2, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """q . zero_g (log2 units) of the split's groups g0..g1 into `zsb` [groups, BLOCK_M], 16 groups per dot."""
    dd = tl.arange(0, D)
    qT = tl.trans(qv.to(tl.float16))                                       # [D, rows]
    z16 = tl.arange(0, 16)
    for z0 in range(g0, g1, 16):
        zg = z0 + z16
        zt = tl.load(zero + zb + zg[:, None] * s_sg + dd[None, :], mask=(zg < g1)[:, None], other=0.0)
        zz = tl.dot(zt.to(tl.float16), qT) * scale_log2                    # [16 groups, rows]
        tl.store(zsb + (zg - g0)[:, None] * BLOCK_M + r[None, :], zz, mask=(zg < g1)[:, None])


@triton.jit
def _codes_kernel(q, codes, scale, zero, zs, pml, out, scratch, n_groups, s_qb, s_qt, s_qh, s_cb, s_ch, s_ct,
                  s_sb, s_sh, s_sg, H, G, NQ, n_split, split_groups, scale_log2, T_out,
                  D: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr,
                  PASS: tl.constexpr, SP: tl.constexpr, CHUNK: tl.constexpr, GB: tl.constexpr,
                  ASM: tl.constexpr):
    """Scores on the raw codes: per group g, s_t = (q * scale_g) . code_t + q . zero_g. One batched
    dot per token phase, [GB groups] x [byte rows (M), D] x [D, query rows]: the codes are the A
    operand, unpacked in registers (_codes_phase), the group's fp16 q * scale * log2(e)/sqrt(d) the B
    operand. q . zero_g of the split's groups comes first (one dot per 16 groups, to `zs`) and enters
    the softmax per row, never per score. M row m of a group is byte row (m % NCH) * PER + m // NCH,
    so a chunk's PER byte rows are M rows NCH apart: its max is a register-local max."""
    bh, sp, b, h, r, t, g, rv = group_rows(H, G, NQ, GP, BLOCK_M)
    qv = load_group_queries(q, b, h, t, g, rv, s_qb, s_qt, s_qh, G, D)
    qs = (qv.to(tl.float32) * scale_log2)[None, :, :]                      # [1, rows, D]
    dd = tl.arange(0, D)
    R4: tl.constexpr = GROUP // 4
    PER: tl.constexpr = CHUNK // 4 if CHUNK != 0 else 1
    NCH: tl.constexpr = R4 // PER
    mm = tl.arange(0, R4)
    brow = (mm % NCH) * PER + mm // NCH
    gg0 = tl.arange(0, GB)
    cb = codes + b.to(tl.int64) * s_cb + h.to(tl.int64) * s_ch
    zb = b.to(tl.int64) * s_sb + h.to(tl.int64) * s_sh
    g0 = sp * split_groups
    g1 = tl.minimum(g0 + split_groups, n_groups)
    zsb = zs + (bh * n_split + sp).to(tl.int64) * split_groups * BLOCK_M
    _zero_dots(zero, zb, qv, zsb, g0, g1, r, s_sg, scale_log2, D, BLOCK_M)
    tl.debug_barrier()
    if PASS == 2:
        mfin, inv = _split_normalisers(pml, bh, n_split, r, BLOCK_M, SP)
        inv = inv[None, None, :]
        ob = out + (b * NQ * H + h).to(tl.int64) * T_out
        sel0 = (rv & (t == 0))[None, None, :]
        sel1 = (rv & (t == 1))[None, None, :]
    else:
        m = tl.full([GB, BLOCK_M], -1.0e30, tl.float32)
        l = tl.zeros([GB, BLOCK_M], tl.float32)
        sbase = scratch + bh.to(tl.int64) * BLOCK_M * T_out
        cc = tl.arange(0, NCH)
    for gi in range(g0, g1, GB):
        gg = gi + gg0
        gv = gg < g1
        sc = tl.load(scale + zb + gg[:, None, None] * s_sg + dd[None, None, :], mask=gv[:, None, None], other=0.0)
        Bq = tl.permute((qs * sc.to(tl.float32)).to(tl.float16), (0, 2, 1))            # [GB, D, rows]
        zr = tl.load(zsb + (gg - g0)[:, None] * BLOCK_M + r[None, :], mask=gv[:, None], other=0.0)  # [GB, rows]
        c = tl.load(cb + (gg[:, None, None] * R4 + brow[None, :, None]).to(tl.int64) * s_ct + dd[None, None, :],
                    mask=gv[:, None, None], other=0)
        s0 = tl.dot(_codes_phase(c, 0, ASM), Bq)                                         # [GB, M, rows]
        s1 = tl.dot(_codes_phase(c, 1, ASM), Bq)
        s2 = tl.dot(_codes_phase(c, 2, ASM), Bq)
        s3 = tl.dot(_codes_phase(c, 3, ASM), Bq)
        if PASS == 1:
            smax = tl.where(gv[:, None, None], tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3)), float("-inf"))
            if CHUNK != 0:
                # the raw max of each chunk for every row: the row's softmax is monotone (pass 2 normalises)
                cm = tl.max(tl.reshape(smax, [GB, PER, NCH, BLOCK_M]), 1) + zr[:, None, :]     # [GB, chunk, rows]
                tl.store(sbase + r[None, None, :] * T_out + (gg[:, None, None] * NCH + cc[None, :, None]),
                         cm.to(scratch.dtype.element_ty),
                         mask=rv[None, None, :] & gv[:, None, None])
            m_new = tl.maximum(m, tl.max(smax, 1) + zr)
            mz = (m_new - zr)[:, None, :]
            e = tl.exp2(s0 - mz) + tl.exp2(s1 - mz) + tl.exp2(s2 - mz) + tl.exp2(s3 - mz)
            l = l * tl.exp2(m - m_new) + tl.sum(tl.where(gv[:, None, None], e, 0.0), 1)
            m = m_new
        else:
            mz = (mfin[None, :] - zr)[:, None, :]
            tok = 4 * (gg[:, None] * R4 + brow[None, :])                                  # [GB, M]
            ok = gv[:, None] & (brow[None, :] >= 0)
            _store_phase(ob, tok, s0, mz, inv, sel0, sel1, ok, H, T_out, NQ)
            _store_phase(ob, tok + 1, s1, mz, inv, sel0, sel1, ok, H, T_out, NQ)
            _store_phase(ob, tok + 2, s2, mz, inv, sel0, sel1, ok, H, T_out, NQ)
            _store_phase(ob, tok + 3, s3, mz, inv, sel0, sel1, ok, H, T_out, NQ)
    if PASS == 1:
        M = tl.max(m, 0)
        L = tl.sum(l * tl.exp2(m - M[None, :]), 0)
        base = (bh * n_split + sp) * BLOCK_M + r
        tl.store(pml + 2 * base, M)
        tl.store(pml + 2 * base + 1, L)


class _Launch(NamedTuple):
    codes: torch.Tensor
    sc: torch.Tensor
    ze: torch.Tensor
    G: int
    GP: int
    BLOCK_M: int
    ng: int
    split_groups: int
    n_split: int


def spec_block_m(nq: int, G: int, impl: str = "codes", rows: int | None = None) -> int:
    """Query rows per program (the scratch and pml row stride): the nq x GP rows of a KV head's group,
    padded to a power of two and to at least `rows` (default _MIN_ROWS[impl]). The codes kernel's
    query rows are the N of its dots, and an mma tile is 8 wide in N, so 8 suffices there: the dual-token
    step (2 x 4 rows) then forms and exponentiates no padding rows; 16 is the previous layout."""
    rows = _MIN_ROWS[impl] if rows is None else rows
    if rows not in (8, 16):
        raise DDBenchError(f"rows must be 8 or 16, got {rows}")
    return max(rows, triton.next_power_of_2(nq * triton.next_power_of_2(G)))


def _launch(q: torch.Tensor, qk: QuantKeys, splits: int | None, groups_per_iter: int, waves: int = 4,
            block_m: int = 16) -> _Launch:
    """Contiguous operands and the launch geometry shared by both entry points: the GQA group padded
    to a power of two, the query rows per program (`block_m`, from spec_block_m), and the split of the
    key groups over programs (automatic: about `waves` programs per SM, at least 4 iterations each)."""
    B, nq, Hq, _ = q.shape
    H = qk.codes.shape[1]
    codes = qk.codes if qk.codes.stride(3) == 1 else qk.codes.contiguous()
    sc, ze = qk.scale, qk.zero
    if sc.stride() != ze.stride() or sc.stride(3) != 1:
        sc, ze = sc.contiguous(), ze.contiguous()
    GP = triton.next_power_of_2(Hq // H)
    ng = qk.tokens // qk.group
    if splits is None:
        splits = max(1, min(triton.cdiv(waves * sm_count(q.device), B * H), ng // (4 * groups_per_iter)))
    split_groups = triton.cdiv(triton.cdiv(ng, splits), groups_per_iter) * groups_per_iter
    return _Launch(codes, sc, ze, Hq // H, GP, block_m, ng, split_groups, triton.cdiv(ng, split_groups))


def specache_scores_triton(q: torch.Tensor, qk: QuantKeys, *, chunk: int = 0, splits: int | None = None,
                           out: torch.Tensor | None = None, groups_per_iter: int | None = None,
                           num_warps: int = 4, impl: str = "codes", rows: int | None = None) -> torch.Tensor:
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    if (Hq % H or qk.codes.shape[0] != B or qk.codes.shape[3] != d or nq not in (1, 2) or d & (d - 1)
            or q.stride(3) != 1 or qk.group % 16 or qk.group < 64):
        raise DDBenchError("q does not match the quantized keys (nq 1 or 2, power-of-two head_dim, group >= 64)")
    if chunk and (chunk % 4 or qk.group % chunk):
        raise DDBenchError(f"chunk {chunk} must be a multiple of 4 dividing the group {qk.group}")
    gb = _groups_per_iter(impl, groups_per_iter, num_warps)
    L = _launch(q, qk, splits, gb, _WAVES[impl], _block_m(q, qk, impl, rows))
    codes, sc, ze, G, GP, BLOCK_M, ng, split_groups, n_split = L
    T_out = qk.tokens // chunk if chunk else qk.tokens
    if out is None:
        out = torch.empty(B, nq, H, T_out, device=q.device, dtype=torch.float32)
    if out.shape != (B, nq, H, T_out) or not out.is_contiguous() or out.dtype != torch.float32:
        raise DDBenchError(f"out must be a contiguous fp32 {(B, nq, H, T_out)} tensor")
    if chunk:   # one pass over the codes; pass 2 reads the per-row chunk maxima (select.py's pass 2)
        from ddbench.kernels.select import score_pass2_kernel
        scratch, pml = _pass1(q, qk, chunk, L, SpecKernel(impl, groups_per_iter, num_warps), gb)
        split_len = triton.cdiv(T_out, n_split)
        score_pass2_kernel[(B * H, n_split)](scratch, pml, out, T_out, H, G, nq, n_split, split_len,
                                             GP=GP, BLOCK_M=BLOCK_M, BLOCK_N=64, SP=triton.next_power_of_2(n_split),
                                             num_warps=4)
        return out
    pml = torch.empty(B * H * n_split * BLOCK_M * 2, device=q.device, dtype=torch.float32)
    grid = (B * H, n_split)
    if impl == "dequant":
        args = (q, codes, sc, ze, pml, out, pml, ng, q.stride(0), q.stride(1), q.stride(2), *codes.stride()[:3],
                *sc.stride()[:3], H, G, nq, n_split, split_groups, LOG2E / math.sqrt(d), T_out)
        kw = dict(D=d, GP=GP, BLOCK_M=BLOCK_M, GROUP=qk.group, SP=triton.next_power_of_2(n_split), CHUNK=0,
                  GB=gb, num_warps=num_warps)
        _spec_kernel[grid](*args, PASS=1, **kw)
        _spec_kernel[grid](*args, PASS=2, **kw)
        return out
    zs = torch.empty(B * H * n_split * split_groups * BLOCK_M, device=q.device, dtype=torch.float32)
    args = (q, codes, sc, ze, zs, pml, out, pml, ng, q.stride(0), q.stride(1), q.stride(2), *codes.stride()[:3],
            *sc.stride()[:3], H, G, nq, n_split, split_groups, LOG2E / math.sqrt(d), T_out)
    kw = dict(D=d, GP=GP, BLOCK_M=BLOCK_M, GROUP=qk.group, SP=triton.next_power_of_2(n_split), CHUNK=0,
              GB=gb, ASM=q.is_cuda, num_warps=num_warps)
    _codes_kernel[grid](*args, PASS=1, **kw)
    _codes_kernel[grid](*args, PASS=2, **kw)
    return out


# fewest query rows per program: codes 8 (its rows are the N of an mma, 8 wide), dequant 16 (its rows
# are the M of its dot, 16 tall)
_MIN_ROWS = {"codes": 8, "dequant": 16}


def _block_m(q: torch.Tensor, qk: QuantKeys, impl: str, rows: int | None) -> int:
    return spec_block_m(q.shape[1], q.shape[2] // qk.codes.shape[1], impl, rows)


# automatic splits: programs per SM. codes: 8 (2x the old default: 6 % faster at B=8, 32K and 5 % at
# B=16, 128K on the H200, 2026-11-30; 4x was slower); dequant: 4, as measured for it before
_WAVES = {"codes": 8, "dequant": 4}


def _groups_per_iter(impl: str, groups_per_iter: int | None, num_warps: int) -> int:
    if impl not in ("codes", "dequant"):
        raise DDBenchError(f"impl must be 'codes' or 'dequant', got {impl!r}")
    if groups_per_iter is None:     # codes: one group per warp; dequant: its measured best, 2
        return num_warps if impl == "codes" else 2
    return groups_per_iter


@dataclass(frozen=True)
class SpecKernel:
    """Which pass-1 kernel runs and how it is launched: impl "codes" (one pass over the 2-bit codes, the
    default) or "dequant" (the first kernel); key groups per iteration (None: the impl's measured best);
    warps; rowload (dequant: whole rows per load); maxnreg (codes: a register cap, None: Triton's)."""
    impl: str = "codes"
    groups_per_iter: int | None = None
    num_warps: int = 4
    rowload: bool = False
    maxnreg: int | None = None


def spec_pass1(q: torch.Tensor, qk: QuantKeys, chunk: int, kernel: SpecKernel = SpecKernel(), *, splits=None,
               rows: int | None = None, scores=torch.float32):
    """One pass over the codes: per (request, KV head) the raw log2-scaled scores' max per chunk for
    every query row of the group, in `scratch` [B*H, BLOCK_M, T/chunk] (valid rows only; in the dtype
    `scores`, fp32 or fp16), and each split's row max and sum of exp in `pml` (the layout of
    kernels/select.py's pass 1), with BLOCK_M = spec_block_m(nq, G, impl, rows): pass it to
    fastselect.topk_from_scratch as `block_m`."""
    gb = _groups_per_iter(kernel.impl, kernel.groups_per_iter, kernel.num_warps)
    L = _launch(q, qk, splits, gb, _WAVES[kernel.impl], _block_m(q, qk, kernel.impl, rows))
    return _pass1(q, qk, chunk, L, kernel, gb, scores)


def _pass1(q: torch.Tensor, qk: QuantKeys, chunk: int, L: _Launch, kernel: SpecKernel, groups_per_iter: int,
           scores=torch.float32):
    num_warps, rowload, impl, maxnreg = kernel.num_warps, kernel.rowload, kernel.impl, kernel.maxnreg
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    codes, sc, ze, G, GP, BLOCK_M, ng, split_groups, n_split = L
    Nc = qk.tokens // chunk
    scratch = torch.empty(B * H * BLOCK_M * Nc, device=q.device, dtype=scores)
    pml = torch.empty(B * H * n_split * BLOCK_M * 2, device=q.device, dtype=torch.float32)
    common = (ng, q.stride(0), q.stride(1), q.stride(2), *codes.stride()[:3], *sc.stride()[:3], H, G, nq, n_split,
              split_groups, LOG2E / math.sqrt(d), Nc)
    kw = dict(D=d, GP=GP, BLOCK_M=BLOCK_M, GROUP=qk.group, SP=triton.next_power_of_2(n_split), CHUNK=chunk,
              GB=groups_per_iter, num_warps=num_warps, PASS=1)
    if impl == "dequant":
        _spec_kernel[(B * H, n_split)](q, codes, sc, ze, pml, pml, scratch, *common, ROWLOAD=rowload, **kw)
    else:
        zs = torch.empty(B * H * n_split * split_groups * BLOCK_M, device=q.device, dtype=torch.float32)
        if maxnreg:
            kw["maxnreg"] = maxnreg
        _codes_kernel[(B * H, n_split)](q, codes, sc, ze, zs, pml, pml, scratch, *common, ASM=q.is_cuda, **kw)
    return scratch, pml
