"""Exact landmark selection without writing every score: per-row candidates (issue 9).

    select_topk_rowcand(q, lm, k, out=None, *, plan=None, splits=None, cap=None, block_m=None)
        -> the ids of fastselect.select_topk(q, lm, k, out, plan=...) (same contract, same outputs)

fastselect's landmark path writes every query row's fp32 score of every chunk (pass 1) and reads
them back to take the top-k of the group maximum g(n) = max_r p_r(n) of the rows' softmax
probabilities: g cannot be formed while the scores stream, since each row's normaliser is known only
at the end. But the top-k of g (order: probability descending, id ascending) lies in the union over
the rows of each row's own top-k in that order: if n is in g's top-k and r is a row with g(n) =
p_r(n), then k chunks before n in row r's order would each be at least as large in g and earlier on
ties. Within a row the probability is monotone in the raw score, so:

- pass 1 (`_cand_pass1_kernel`, one program per (request, KV head, split) as select.py's pass 1)
  keeps per row only the split's top-k raw scores: a buffer of `cap` (key, id) pairs per row, in id
  order, to which only scores above the row's threshold are appended; when a block could overflow
  it, every row is cut to its top-k (a 32-step search on order-preserving int keys) and the
  threshold rises to the k-th largest. Its split max / sum of exp go to `pml` as in select.py.
- the merge (`_cand_merge_kernel`, one program per (request, KV head, token)): (A) per row, its
  candidates' probabilities from the splits' max / sum (fastselect's formula, so the same fp32
  values) and the row's top-k over its splits; (B) over the rows, every candidate keeps only if no
  other row lists its id with a larger probability (the lowest row on equal ones; the other rows'
  lists are sorted by id and searched in registers), the top-k of those (the smallest ids on ties at
  the threshold), written ascending; with `plan`, token 0's rows then plan their misses against the
  prediction (transfer.plan_row_sorted), as fastselect's seg merge does.

Measured on the H200 (`python -m kernels.engine.devcheck_rowcand`, traces/engine/h200/devcheck-rowcand.json,
tree 6e6764a, 3 repetitions): the same ids as the seg path in every row of every point, but slower:
selection alone 2.8-12x (32K, batch 16, 2 tokens: 697 against 57 us), whole compute-only steps 2.2-4.9x
(128K, batch 64: 130.5 against 34.8 ms). Pass 1 is the cost (`--split`, devcheck-rowcand-split.json,
2 tokens): 670 against select.py's 40 us at 32K, batch 16, and 4000 against 609 us at 128K, batch 64,
while the merge is cheaper than the seg top-k's two kernels there (100 against 137 us); a larger
buffer (fewer, longer cuts) did not help (cap 1024: 775 against 720 us at 32K, batch 16). A pass 1 at
select.py's speed less its score writes would make the selection about 646 against 746 us per layer
at 128K, batch 64 (an estimate from these numbers, -3.2 ms per step). The engine does not use it
(`Engine.rowcand`, off by default, switches it on for such A/B runs).

Exact, with one caveat: two raw scores of one row that exp2 maps to the same fp32 probability are
ordered by score in pass 1 and by id in the merge, so at a row's k-th place such a tie can resolve to
the other chunk. Bytes: per row and split, up to `cap` pairs of int32 in buffers that stay in L2,
instead of one fp32 score per chunk and row written to HBM and read back.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.engine.fastselect import PASS1_MIN_SPLIT, _bisect, _out_row, _outputs, _plan_args, _row_norm
from kernels.engine.transfer import plan_row_sorted
from kernels.grouprows import group_rows, load_group_queries
from kernels.select import LOG2E, _check, landmark_block

INT_MIN: tl.constexpr = tl.constexpr(-2147483648)
INT_MAX: tl.constexpr = tl.constexpr(2147483647)


@triton.jit
def _f2key(x):
    """fp32 -> int32 whose signed order is the floats' order (negative floats: magnitude bits flipped).
    Its own inverse on the bits."""
    b = x.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _key2f(k):
    return (k ^ ((k >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _row_cut(ckey, cid, rowbase, cnt, T, K, CAP: tl.constexpr):
    """Cut each row's buffer (rowbase[r] .. + cnt[r]) to its top-K in the order (key desc, position
    asc), compacted in place (order kept). Rows with at least K entries get the K-th largest key as
    their new threshold; the others keep theirs and all their entries."""
    c = tl.arange(0, CAP)
    valid = c[None, :] < cnt[:, None]
    a = rowbase[:, None] + c[None, :]
    v = tl.load(ckey + a, mask=valid, other=0)
    ids = tl.load(cid + a, mask=valid, other=0)
    u = v.to(tl.int64) - INT_MIN                      # [0, 2^32), the keys' order
    thr = tl.zeros(cnt.shape, tl.int64)
    for i in tl.static_range(32):
        cand = thr + (1 << (31 - i))
        n = tl.sum((valid & (u >= cand[:, None])).to(tl.int32), 1)
        thr = tl.where(n >= K, cand, thr)
    gt = valid & (u > thr[:, None])
    eq = valid & (u == thr[:, None])
    need = K - tl.sum(gt.to(tl.int32), 1)
    take = gt | (eq & (tl.cumsum(eq.to(tl.int32), 1) <= need[:, None]))
    pos = tl.cumsum(take.to(tl.int32), 1) - 1
    tl.debug_barrier()                                # every entry is in registers before any moves
    tl.store(ckey + rowbase[:, None] + pos, v, mask=take)
    tl.store(cid + rowbase[:, None] + pos, ids, mask=take)
    tl.debug_barrier()
    full = cnt >= K
    return tl.where(full, K, cnt), tl.where(full, (thr + INT_MIN).to(tl.int32), T)


@triton.jit
def _cand_pass1_kernel(q, lm, ckey, cid, cinfo, pml, count, N, s_qb, s_qt, s_qh, s_lb, s_lh, s_ln,
                       H, G, NQ, n_split, split_len, scale_log2, K,
                       D: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       CAP: tl.constexpr, PLAN: tl.constexpr):
    """One (request, KV head, split): raw scores of the group's rows block by block (select.py's
    landmark_block, as its pass 1), each row's top-K of them (key, chunk id) in id order to its
    buffer, the count to cinfo, the split's row max and sum of exp to pml."""
    bh, sp, b, h, r, t, g, rv = group_rows(H, G, NQ, GP, BLOCK_M)
    if PLAN:                                          # the fused miss plan's counter, before the merge adds
        if bh + sp == 0:
            tl.store(count, 0)
    qt = load_group_queries(q, b, h, t, g, rv, s_qb, s_qt, s_qh, G, D)
    dd = tl.arange(0, D)
    lb = lm + b.to(tl.int64) * s_lb + h * s_lh
    slot = (bh * n_split + sp) * BLOCK_M + r
    rowbase = slot.to(tl.int64) * CAP
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    cnt = tl.zeros([BLOCK_M], tl.int32)
    T = tl.full([BLOCK_M], INT_MIN, tl.int32)
    end = tl.minimum(sp * split_len + split_len, N)
    for n0 in range(sp * split_len, end, BLOCK_N):
        n, nv, s, m, l = landmark_block(qt, lb, n0, end, s_ln, dd, m, l, scale_log2, BLOCK_N)
        key = _f2key(s)
        keep = rv[:, None] & nv[None, :] & (key > T[:, None])
        pos = cnt[:, None] + tl.cumsum(keep.to(tl.int32), 1) - 1
        tl.store(ckey + rowbase[:, None] + pos, key, mask=keep)
        tl.store(cid + rowbase[:, None] + pos, n[None, :] + tl.zeros([BLOCK_M, BLOCK_N], tl.int32), mask=keep)
        cnt += tl.sum(keep.to(tl.int32), 1)
        if tl.max(cnt, 0) > CAP - BLOCK_N:            # the next block could overflow a row: cut all
            tl.debug_barrier()
            cnt, T = _row_cut(ckey, cid, rowbase, cnt, T, K, CAP)
    if tl.max(cnt, 0) > K:
        tl.debug_barrier()
        cnt, T = _row_cut(ckey, cid, rowbase, cnt, T, K, CAP)
    tl.store(cinfo + slot, cnt)
    tl.store(pml + 2 * slot, m)
    tl.store(pml + 2 * slot + 1, l)


@triton.jit
def _nth_smallest(ids, sel, need):
    """The need-th smallest of the non-negative int32 `ids` where `sel` (31-step bit search)."""
    x = tl.zeros([], tl.int32)
    for i in tl.static_range(31):
        cand = x | (1 << (30 - i))
        x = tl.where(tl.sum((sel & (ids < cand)).to(tl.int32), 0) < need, cand, x)
    return x


@triton.jit
def _cand_merge_kernel(ckey, cid, cinfo, pml, sbits, sids, scnt, out, out1, H, G, NQ, n_split, K,
                       pred, count, bh_out, chunk_out, slot_out, assembled,
                       PER_TOKEN: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, SP: tl.constexpr,
                       CAP: tl.constexpr, SKP: tl.constexpr, KP: tl.constexpr, LOG_KP: tl.constexpr,
                       CUTS: tl.constexpr, PLAN: tl.constexpr):
    row = tl.program_id(0)                            # (b * H + h) * NQ + t
    t = row % NQ
    bh = row // NQ
    b = bh // H
    h = bh % H
    sb = row.to(tl.int64) * (GP * KP)
    # (A) per row: probabilities of its candidates over the splits, and its own top-K (ids ascending)
    i = tl.arange(0, SKP)
    si = i // K
    ji = i - si * K
    for g in tl.static_range(GP):
        if g < G:
            rr = t * GP + g
            mr, inv = _row_norm(pml, bh, n_split, rr, BLOCK_M, SP)
            slot = (bh * n_split + si) * BLOCK_M + rr
            cnt = tl.load(cinfo + slot, mask=si < n_split, other=0)
            valid = (si < n_split) & (ji < cnt)
            a = slot.to(tl.int64) * CAP + ji
            key = tl.load(ckey + a, mask=valid, other=0)
            ids = tl.load(cid + a, mask=valid, other=0)
            pb = tl.where(valid, (tl.exp2(_key2f(key) - mr) * inv).to(tl.int32, bitcast=True), -1)
            nval = tl.sum(valid.to(tl.int32), 0)
            if nval > K:
                thr, c = _bisect(pb, K, tl.zeros([], tl.int32), tl.max(pb, 0), nval, K, CUTS)
                gt = pb > thr
                eq = pb == thr
                take = gt | (eq & (tl.cumsum(eq.to(tl.int32), 0) <= K - tl.sum(gt.to(tl.int32), 0)))
            else:
                take = valid
            pos = tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(sbits + sb + g * KP + pos, pb, mask=take)
            tl.store(sids + sb + g * KP + pos, ids, mask=take)
            tl.store(scnt + row * GP + g, tl.minimum(nval, K))
    tl.debug_barrier()
    # (B) over the rows: each id's largest probability once, then the top-K of those
    e = tl.arange(0, GP * KP)
    rg = e // KP
    cn = tl.load(scnt + row * GP + rg, mask=rg < G, other=0)
    valid = (rg < G) & ((e - rg * KP) < cn)
    pb = tl.load(sbits + sb + e, mask=valid, other=-1)
    ids = tl.load(sids + sb + e, mask=valid, other=INT_MAX)
    dom = tl.zeros([GP * KP], tl.int1)
    for off in tl.static_range(1, GP):
        r2 = (rg + off) % GP
        c2 = tl.load(scnt + row * GP + r2, mask=r2 < G, other=0)
        lo = tl.zeros([GP * KP], tl.int32)
        for s in tl.static_range(LOG_KP + 1):
            c = lo + (KP >> s)
            v = tl.gather(ids, r2 * KP + tl.minimum(c - 1, KP - 1), 0)
            lo = tl.where((c <= c2) & (v < ids), c, lo)
        at = r2 * KP + tl.minimum(lo, KP - 1)
        hit = valid & (lo < c2) & (tl.gather(ids, at, 0) == ids)
        p2 = tl.gather(pb, at, 0)
        dom = dom | (hit & ((p2 > pb) | ((p2 == pb) & (r2 < rg))))
    vb = tl.where(valid & (dom == 0), pb, -1)
    nv = tl.sum((vb >= 0).to(tl.int32), 0)
    thr, c = _bisect(vb, K, tl.zeros([], tl.int32), tl.max(vb, 0), nv, K, CUTS)
    gt = vb > thr
    eq = vb == thr
    need = K - tl.sum(gt.to(tl.int32), 0)
    if tl.sum(eq.to(tl.int32), 0) > need:             # ties at the threshold: the smallest ids
        take = gt | (eq & (ids <= _nth_smallest(ids, eq, need)))
    else:
        take = gt | eq
    srt = tl.sort(tl.where(take, ids, INT_MAX))
    ob = _out_row(out, out1, b, t, h, H, NQ, K, PER_TOKEN)
    tl.store(ob + e, srt, mask=e < K)
    if PLAN:
        if t == 0:
            plan_row_sorted(ob, pred, bh, count, bh_out, chunk_out, slot_out, assembled, K, KP, LOG_KP)


def geometry(B, H, nq, G, N, k, *, splits=None, block_n=64, cap=None, block_m=None, device=None):
    """(BLOCK_M, n_split, split_len, CAP, SKP, KP) of the two kernels: pass 1's splits as select.py's
    (about 4 programs per SM, at least PASS1_MIN_SPLIT chunks each); CAP >= k + block_n; BLOCK_M the
    group's rows (select.py pads them to 16: its raw scores are this kernel's only where the dot's shape
    sums in the same order, as on the GPU's mma; the CPU interpreter's matmul may not)."""
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(2, triton.next_power_of_2(nq * GP)) if block_m is None else block_m
    if BLOCK_M < nq * GP or BLOCK_M & (BLOCK_M - 1):
        raise ValueError(f"block_m {BLOCK_M} cannot hold {nq} tokens x {GP} rows")
    if splits is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device is not None and \
            device.type == "cuda" else 4
        splits = max(1, min(triton.cdiv(4 * sms, B * H), N // PASS1_MIN_SPLIT))
    split_len = triton.cdiv(triton.cdiv(N, splits), block_n) * block_n
    n_split = triton.cdiv(N, split_len)
    cap = triton.next_power_of_2(k + block_n) if cap is None else cap
    if cap < k + block_n or cap & (cap - 1):
        raise ValueError(f"cap {cap} must be a power of two >= k + block_n = {k + block_n}")
    KP = triton.next_power_of_2(k)
    return BLOCK_M, n_split, split_len, cap, triton.next_power_of_2(n_split * k), KP


def rowcand_fits(B, H, nq, G, N, k, *, splits=None, device=None) -> bool:
    """Whether the merge's searches hold its candidates (fewer than 32768 per search)."""
    if not 0 < k <= N:
        return False
    _, n_split, _, _, SKP, KP = geometry(B, H, nq, G, N, k, splits=splits, device=device)
    return SKP < 32768 and triton.next_power_of_2(G) * KP < 32768


def select_topk_rowcand(q, lm, k, out=None, *, plan=None, splits=None, block_n=64, cap=None, block_m=None, cuts=2):
    B, nq, Hq, d, H, N = _check(q, lm)
    if not 0 < k <= N:
        raise ValueError(f"budget of {k} chunks must be within 1..{N} landmarks")
    G = Hq // H
    GP = triton.next_power_of_2(G)
    if not rowcand_fits(B, H, nq, G, N, k, splits=splits, device=q.device):
        raise ValueError(f"row candidates: {k} chunks x the splits or the group exceed one search")
    BLOCK_M, n_split, split_len, CAP, SKP, KP = geometry(B, H, nq, G, N, k, splits=splits, block_n=block_n,
                                                         cap=cap, block_m=block_m, device=q.device)
    out, o0, o1, per_token = _outputs(out, B, H, nq, k, q.device)
    pargs, pkw = _plan_args(plan, B, H, N, k, o0)
    dev = q.device
    i32 = dict(device=dev, dtype=torch.int32)
    slots = B * H * n_split * BLOCK_M
    ckey, cid = torch.empty(slots * CAP, **i32), torch.empty(slots * CAP, **i32)
    cinfo = torch.empty(slots, **i32)
    pml = torch.empty(slots * 2, device=dev, dtype=torch.float32)
    rows = B * H * nq
    sbits, sids = torch.empty(rows * GP * KP, **i32), torch.empty(rows * GP * KP, **i32)
    scnt = torch.empty(rows * GP, **i32)
    _cand_pass1_kernel[(B * H, n_split)](q, lm, ckey, cid, cinfo, pml, pargs[1], N, q.stride(0), q.stride(1),
                                         q.stride(2), *lm.stride()[:3], H, G, nq, n_split, split_len,
                                         LOG2E / math.sqrt(d), k, D=d, GP=GP, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                                         CAP=CAP, PLAN=pkw["PLAN"], num_warps=4)
    _cand_merge_kernel[(rows,)](ckey, cid, cinfo, pml, sbits, sids, scnt, o0, o1, H, G, nq, n_split, k, *pargs,
                                PER_TOKEN=per_token, GP=GP, BLOCK_M=BLOCK_M, SP=triton.next_power_of_2(n_split),
                                CAP=CAP, SKP=SKP, KP=KP, LOG_KP=KP.bit_length() - 1, CUTS=cuts, PLAN=pkw["PLAN"],
                                num_warps=max(4, min(8, max(SKP, GP * KP) // 256)))
    return out
