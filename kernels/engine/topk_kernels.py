"""The Triton kernels of the engine's fused top-k (kernels/engine/fastselect.py, whose docstring says
how each method works and what was measured): the row normalisers, "bits" (`bits_topk_kernel`),
"stream" (`stream_topk_kernel`) and the two stages of "seg" (`seg_topk_kernel`, `merge_topk_kernel`)
with the searches they share. fastselect.topk_from_scratch launches them; their torch twins are there.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ddbench.kernels.engine.transfer import plan_row_sorted


@triton.jit
def _row_norm(pml, bh, n_split, r, BLOCK_M: tl.constexpr, SP: tl.constexpr):
    """Row r's softmax normaliser from the splits' (max, sum of exp): (max, 1 / sum), as pass 1 wrote them."""
    ss = tl.arange(0, SP)
    sv = ss < n_split
    pi = 2 * ((bh * n_split + ss) * BLOCK_M + r)
    pm = tl.load(pml + pi, mask=sv, other=-1.0e30)
    pl = tl.load(pml + pi + 1, mask=sv, other=0.0)
    m = tl.max(pm, 0)
    return m, 1.0 / tl.sum(pl * tl.exp2(pm - m), 0)


@triton.jit
def _group_norms(pml, bh, n_split, t, G, GP: tl.constexpr, BLOCK_M: tl.constexpr, SP: tl.constexpr):
    """Token t's group rows' normalisers as vectors [GP] (rows g >= G: 0, so their probabilities are
    0), each computed exactly as `_row_norm` (the bits kernel's fp32 results)."""
    gg = tl.arange(0, GP)
    mv = tl.zeros([GP], tl.float32)
    iv = tl.zeros([GP], tl.float32)
    for g in tl.static_range(GP):
        if g < G:
            m, inv = _row_norm(pml, bh, n_split, t * GP + g, BLOCK_M, SP)
            mv = tl.where(gg == g, m, mv)
            iv = tl.where(gg == g, inv, iv)
    return mv, iv


@triton.jit
def _out_row(out, out1, b, t, h, H, NQ, K, PER_TOKEN: tl.constexpr):
    """Where the ids of row (request b, token t, KV head h) go: `out` [B, NQ, H, K], or with PER_TOKEN
    one [B, H, K] tensor per token (`out` for token 0, `out1` for token 1): the engine's true selection
    and next-step prediction, written in place without a copy."""
    if PER_TOKEN:
        r = (b * H + h).to(tl.int64) * K
        if t == 0:
            p = out + r
        else:
            p = out1 + r
    else:
        p = out + ((b * NQ + t) * H + h).to(tl.int64) * K
    return p


@triton.jit
def bits_topk_kernel(scratch, pml, out, out1, N, H, G, NQ, n_split, K,
                     PER_TOKEN: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, SP: tl.constexpr, NP: tl.constexpr):
    pid = tl.program_id(0)              # (b * H + h) * NQ + t
    t = pid % NQ
    bh = pid // NQ
    b = bh // H
    h = bh % H
    n = tl.arange(0, NP)
    nv = n < N
    sb = scratch + bh.to(tl.int64) * BLOCK_M * N
    p = tl.zeros([NP], tl.float32)
    for g in tl.static_range(GP):
        if g < G:
            r = t * GP + g
            m, inv = _row_norm(pml, bh, n_split, r, BLOCK_M, SP)
            s = tl.load(sb + r * N + n, mask=nv, other=float("-inf")).to(tl.float32)
            p = tl.maximum(p, tl.exp2(s - m) * inv)
    bits = p.to(tl.int32, bitcast=True)
    bits = tl.where(nv, bits, -1)       # padding is never chosen
    thr = _kth_binary(bits, K)
    gt = bits > thr
    eq = bits == thr
    need = K - tl.sum(gt.to(tl.int32), 0)
    er = tl.cumsum(eq.to(tl.int32), 0)
    take = gt | (eq & (er <= need))
    pos = tl.cumsum(take.to(tl.int32), 0) - 1
    ob = _out_row(out, out1, b, t, h, H, NQ, K, PER_TOKEN)
    tl.store(ob + pos, n, mask=take)


@triton.jit
def _kth_binary(vb, K):
    """The K-th largest of `vb` (non-negative int32 bits; -1 = empty): a 31-step binary search on the bits."""
    thr = tl.zeros([], tl.int32)
    for i in tl.static_range(31):
        cand = thr | (1 << (30 - i))
        cnt = tl.sum((vb >= cand).to(tl.int32), 0)
        thr = tl.where(cnt >= K, cand, thr)
    return thr


@triton.jit
def _take_topk(vb, K, FIVE: tl.constexpr):
    """Top-K of `vb` (non-negative int32 bits, -1 = empty; at most 65535 entries) in the order (value
    desc, position asc): the K-th largest value, the mask of the taken entries and their rank in
    position order. The K-th largest by a 31-step binary search on the bits (FIVE false, the default,
    measured) or by a 5-ary search (FIVE true; not yet timed on the GPU): 4 cut points per pass, their
    4 counts packed in 16-bit fields of one int64 sum, 14 passes (one reduction each) instead of 31."""
    if FIVE:
        thr = _kth_5ary(vb, K)
    else:
        thr = _kth_binary(vb, K)
    gt = vb > thr
    eq = vb == thr
    ce = tl.sum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), 0)
    need = K - (ce & 0xFFFF)
    if (ce >> 16) > need:               # more ties at the threshold than needed: lowest ids first
        er = tl.cumsum(eq.to(tl.int32), 0)
        take = gt | (eq & (er <= need))
    else:
        take = gt | eq
    pos = tl.cumsum(take.to(tl.int32), 0) - 1
    return thr, take, pos


@triton.jit
def _kth_5ary(vb, K):
    lo = tl.zeros([], tl.int64)                     # count(vb >= lo) >= K
    hi = tl.zeros([], tl.int64) + 2147483648       # count(vb >= hi) < K
    v = vb.to(tl.int64)
    for _ in tl.static_range(14):
        w = hi - lo
        c1 = lo + w // 5
        c2 = lo + (w * 2) // 5
        c3 = lo + (w * 3) // 5
        c4 = lo + (w * 4) // 5
        x = (v >= c1).to(tl.int64) + ((v >= c2).to(tl.int64) << 16) + ((v >= c3).to(tl.int64) << 32) \
            + ((v >= c4).to(tl.int64) << 48)
        sm = tl.sum(x, 0)
        n1 = sm & 0xFFFF
        n2 = (sm >> 16) & 0xFFFF
        n3 = (sm >> 32) & 0xFFFF
        n4 = (sm >> 48) & 0xFFFF
        nlo = tl.where(n4 >= K, c4, tl.where(n3 >= K, c3, tl.where(n2 >= K, c2, tl.where(n1 >= K, c1, lo))))
        nhi = tl.where(n1 < K, c1, tl.where(n2 < K, c2, tl.where(n3 < K, c3, tl.where(n4 < K, c4, hi))))
        lo = tl.maximum(lo, nlo)
        hi = tl.minimum(hi, tl.maximum(nhi, lo + 1))
    return lo.to(tl.int32)


@triton.jit
def stream_topk_kernel(scratch, pml, out, out1, buf, N, H, G, NQ, n_split, K,
                       PER_TOKEN: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, SP: tl.constexpr,
                       BLK: tl.constexpr, CAP: tl.constexpr, FIVE: tl.constexpr):
    pid = tl.program_id(0)              # (b * H + h) * NQ + t
    t = pid % NQ
    bh = pid // NQ
    b = bh // H
    h = bh % H
    gg = tl.arange(0, GP)
    gv = gg < G
    mv, iv = _group_norms(pml, bh, n_split, t, G, GP, BLOCK_M, SP)
    sb = scratch + bh.to(tl.int64) * BLOCK_M * N + (t * GP + gg).to(tl.int64)[:, None] * N
    bb = buf + pid.to(tl.int64) * (2 * CAP)        # bits at [0, CAP), chunk ids at [CAP, 2 CAP)
    cnt = tl.zeros([], tl.int32)
    T = tl.zeros([], tl.int32) - 1
    for n0 in range(0, N, BLK):
        n = n0 + tl.arange(0, BLK)
        nv = n < N
        s = tl.load(sb + n[None, :], mask=gv[:, None] & nv[None, :], other=float("-inf")).to(tl.float32)
        e = tl.exp2(s - mv[:, None]) * iv[:, None]         # rows g >= G: exp2(-inf) * 0 = 0
        bits = tl.max(e, 0).to(tl.int32, bitcast=True)
        keep = nv & (bits > T)
        nk = tl.sum(keep.to(tl.int32), 0)
        if nk > 0:
            c = cnt + tl.cumsum(keep.to(tl.int32), 0) - 1
            tl.store(bb + c, bits, mask=keep)
            tl.store(bb + CAP + c, n, mask=keep)
            cnt += nk
            if cnt > CAP - BLK:             # the next block could overflow: cut to the top-K
                tl.debug_barrier()
                idx = tl.arange(0, CAP)
                vb = tl.load(bb + idx, mask=idx < cnt, other=-1)
                vi = tl.load(bb + CAP + idx, mask=idx < cnt, other=0)
                thr, take, pos = _take_topk(vb, K, FIVE)
                tl.debug_barrier()
                tl.store(bb + pos, vb, mask=take)
                tl.store(bb + CAP + pos, vi, mask=take)
                cnt = tl.zeros([], tl.int32) + K
                T = thr
    tl.debug_barrier()
    idx = tl.arange(0, CAP)
    vb = tl.load(bb + idx, mask=idx < cnt, other=-1)
    vi = tl.load(bb + CAP + idx, mask=idx < cnt, other=0)
    thr, take, pos = _take_topk(vb, K, FIVE)
    ob = _out_row(out, out1, b, t, h, H, NQ, K, PER_TOKEN)
    tl.store(ob + pos, vi, mask=take)


@triton.jit
def _radix_digit(vb, pre, kk, SH: tl.constexpr, W: tl.constexpr):
    """One digit of the radix select: among the entries whose bits above SH + W equal `pre`, the digit
    (bits SH .. SH + W - 1) of the kk-th largest, from one 256-bin histogram. Entries that do not match
    (and empty ones, -1) are counted in bin 0, which is never above the chosen digit, so they change
    neither the digit nor the count above it."""
    bins = tl.arange(0, 256)
    match = (vb >> (SH + W)) == pre
    h = tl.histogram(tl.where(match, (vb >> SH) & ((1 << W) - 1), 0), 256)
    ge = tl.cumsum(h, 0, reverse=True)              # matching entries with digit >= d (bin 0: all entries)
    ok = ge >= kk                                   # a prefix [0, digit] of the bins
    x = tl.sum(ok.to(tl.int32) + (tl.where(ok, 0, h) << 9), 0)
    return (pre << W) | ((x & 511) - 1), kk - (x >> 9)


@triton.jit
def _take_at(vb, thr, need):
    """The entries above `thr` and the first `need` equal to it (position order): (mask, rank in
    position order), with one scan of both running counts (fewer than 65536 entries)."""
    gt = vb > thr
    eq = vb == thr
    c = tl.cumsum(eq.to(tl.int32) + (gt.to(tl.int32) << 16), 0)
    er = c & 0xFFFF
    return gt | (eq & (er <= need)), (c >> 16) + tl.minimum(er, need) - 1


@triton.jit
def _cut(lo, hi, w, J: tl.constexpr, CUTS: tl.constexpr):
    """Cut J of CUTS evenly spaced in (lo, hi] (w = hi - lo >= 1; int64 arithmetic, no overflow)."""
    return tl.minimum(lo + ((w * J) // (CUTS + 1)).to(tl.int32) + 1, hi)


@triton.jit
def _bisect(vb, K, lo, hi, cnt, STOP, CUTS: tl.constexpr):
    """Search on the bits: from count(vb >= lo) = cnt >= K and the K-th largest <= hi, raise lo (the
    K-th largest itself once lo == hi) and stop early as soon as count(vb >= lo) <= STOP. Each step
    counts CUTS evenly spaced cuts of (lo, hi] in one reduction (16-bit fields of one int32 sum for
    CUTS <= 2, int64 for up to 4; fewer than 32768 entries) and keeps the part between the last cut
    with count >= K and the next one. Returns (lo, count(vb >= lo))."""
    while (lo < hi) & (cnt > STOP):
        w = (hi - lo).to(tl.int64)
        if CUTS <= 2:
            x = tl.zeros(vb.shape, tl.int32)
            for J in tl.static_range(1, CUTS + 1):
                x += (vb >= _cut(lo, hi, w, J, CUTS)).to(tl.int32) << (16 * (J - 1))
        else:
            x = tl.zeros(vb.shape, tl.int64)
            for J in tl.static_range(1, CUTS + 1):
                x += (vb >= _cut(lo, hi, w, J, CUTS)).to(tl.int64) << (16 * (J - 1))
        sm = tl.sum(x, 0)
        nlo = lo
        ncnt = cnt
        nhi = _cut(lo, hi, w, 1, CUTS) - 1                     # no cut reaches K: below the first
        for J in tl.static_range(1, CUTS + 1):
            c = ((sm >> (16 * (J - 1))) & 0xFFFF).to(tl.int32)
            up = c >= K                                           # counts fall with J: the last such J wins
            nlo = tl.where(up, _cut(lo, hi, w, J, CUTS), nlo)
            ncnt = tl.where(up, c, ncnt)
            if J < CUTS:
                nhi = tl.where(up, _cut(lo, hi, w, J + 1, CUTS) - 1, nhi)
            else:
                nhi = tl.where(up, hi, nhi)
        lo = nlo
        cnt = ncnt
        hi = nhi
    return lo, cnt


@triton.jit
def _minmax(a0, a1, b0, b1):
    return tl.minimum(a0, b0), tl.maximum(a1, b1)


@triton.jit
def _select_topk(vb, K, SEARCH: tl.constexpr, CUTS: tl.constexpr):
    """Top-K of `vb` (non-negative int32 bits, -1 = empty, at least K entries non-empty, fewer than 32768
    entries) in the order (value desc, position asc): (mask of the taken entries, their rank in position
    order). SEARCH 0: `_bisect` from [0, max] with an early stop at count == K; 1: radix select from
    the top, digits of 8 / 8 / 8 / 7 bits (one 256-bin histogram each); 2: 31-step binary search on the
    bits; 3: 5-ary packed-count search (`_take_topk`)."""
    if SEARCH == 0:
        hi = tl.max(vb, 0)
        thr, cnt = _bisect(vb, K, tl.zeros([], tl.int32), hi, tl.sum((vb >= 0).to(tl.int32), 0), K, CUTS)
        take, pos = _take_at(vb, thr, K - tl.sum((vb > thr).to(tl.int32), 0))
    elif SEARCH == 1:
        pre = tl.zeros([], tl.int32)
        kk = tl.zeros([], tl.int32) + K
        pre, kk = _radix_digit(vb, pre, kk, 23, 8)
        pre, kk = _radix_digit(vb, pre, kk, 15, 8)
        pre, kk = _radix_digit(vb, pre, kk, 7, 8)
        thr, need = _radix_digit(vb, pre, kk, 0, 7)  # thr: the K-th largest; need: how many equal to it
        take, pos = _take_at(vb, thr, need)
    else:
        thr, take, pos = _take_topk(vb, K, SEARCH == 3)
    return take, pos


@triton.jit
def seg_topk_kernel(scratch, pml, cbits, cids, cinfo, N, H, G, NQ, n_split, K, KK, S, count,
                    GP: tl.constexpr, BLOCK_M: tl.constexpr, SP: tl.constexpr, SEG: tl.constexpr,
                    SEARCH: tl.constexpr, CUTS: tl.constexpr, PLAN: tl.constexpr = False):
    """Stage 1 of "seg": one program per (row, segment of SEG chunks): the segment's group-max
    probabilities in registers, and a candidate set that contains the segment's top-K in the
    contract's order, at most KK entries, written (bits, chunk id) in id order to the segment's KK
    slots; (count, lower bound T, the segment's largest bits) to cinfo. SEARCH 0: a coarse cut, every
    chunk >= T where T rises from the segment's smallest value (`_bisect`, CUTS cuts per step) only
    until at most KK chunks remain >= T (at least K do; with exact ties all the way down, T is the
    K-th largest and its ties are cut by id); other SEARCH: the exact top-K."""
    row = tl.program_id(0)              # (b * H + h) * NQ + t
    s = tl.program_id(1)
    if PLAN:                            # the fused miss plan's counter, before stage 2 adds to it
        if row + s == 0:
            tl.store(count, 0)
    t = row % NQ
    bh = row // NQ
    gg = tl.arange(0, GP)
    gv = gg < G
    mv, iv = _group_norms(pml, bh, n_split, t, G, GP, BLOCK_M, SP)
    sb = scratch + bh.to(tl.int64) * BLOCK_M * N + (t * GP + gg).to(tl.int64)[:, None] * N
    n = s * SEG + tl.arange(0, SEG)
    nv = n < N
    x = tl.load(sb + n[None, :], mask=gv[:, None] & nv[None, :], other=float("-inf")).to(tl.float32)
    e = tl.exp2(x - mv[:, None]) * iv[:, None]             # rows g >= G: exp2(-inf) * 0 = 0
    bits = tl.where(nv, tl.max(e, 0).to(tl.int32, bitcast=True), -1)
    ci = (row * S + s).to(tl.int64)
    cb = ci * KK
    nval = tl.minimum(N - s * SEG, SEG)
    if nval <= KK:                      # short segment: keep it whole
        j = tl.arange(0, SEG)
        tl.store(cbits + cb + j, bits, mask=nv)
        tl.store(cids + cb + j, n, mask=nv)
        tl.store(cinfo + 4 * ci, nval)
        tl.store(cinfo + 4 * ci + 1, 0)
        tl.store(cinfo + 4 * ci + 2, tl.max(bits, 0))
    else:
        if SEARCH == 0:
            mn, mx = tl.reduce((tl.where(nv, bits, 2147483647), bits), 0, _minmax)
            thr, cnt = _bisect(bits, K, mn, mx, nval, KK, CUTS)
            if cnt <= KK:
                take = bits >= thr
                pos = tl.cumsum(take.to(tl.int32), 0) - 1
            else:                       # ties at the K-th largest: cut them by id
                take, pos = _take_at(bits, thr, K - tl.sum((bits > thr).to(tl.int32), 0))
                cnt = tl.zeros([], tl.int32) + K
        else:
            take, pos = _select_topk(bits, K, SEARCH, CUTS)
            cnt = tl.zeros([], tl.int32) + K
            thr = tl.zeros([], tl.int32)
            mx = tl.max(bits, 0)
        tl.store(cbits + cb + pos, bits, mask=take)
        tl.store(cids + cb + pos, n, mask=take)
        tl.store(cinfo + 4 * ci, cnt)
        tl.store(cinfo + 4 * ci + 1, thr)
        tl.store(cinfo + 4 * ci + 2, mx)


@triton.jit
def merge_topk_kernel(cbits, cids, cinfo, out, out1, H, NQ, K, KK, S,
                      pred, count, bh_out, chunk_out, slot_out, assembled,
                      PER_TOKEN: tl.constexpr, CP: tl.constexpr, SP2: tl.constexpr, SEARCH: tl.constexpr, CUTS: tl.constexpr,
                      PLAN: tl.constexpr = False, KP: tl.constexpr = 1, LOG_KP: tl.constexpr = 0):
    """Stage 2 of "seg": one program per row, the exact top-K of its segments' candidates (in id order,
    so position order is id order), ids written ascending. SEARCH 0: `_bisect` between the largest
    segment bound T (at least K candidates >= it) and the largest candidate, stopping at count == K.
    PLAN: token 0's rows (the true selection) then plan their misses against `pred` (transfer.py's
    plan_row_sorted; the count was zeroed by stage 1), so the plan costs no launch of its own."""
    row = tl.program_id(0)
    t = row % NQ
    bh = row // NQ
    b = bh // H
    h = bh % H
    i = tl.arange(0, CP)
    sg = i // KK
    sv = sg < S
    ib = row.to(tl.int64) * S
    cnt = tl.load(cinfo + 4 * (ib + sg), mask=sv, other=0)
    valid = sv & (i - sg * KK < cnt)
    cb = ib * KK
    vb = tl.load(cbits + cb + i, mask=valid, other=-1)
    vi = tl.load(cids + cb + i, mask=valid, other=0)
    if SEARCH == 0:
        ss = tl.arange(0, SP2)
        lo = tl.max(tl.load(cinfo + 4 * (ib + ss) + 1, mask=ss < S, other=0), 0)
        hi = tl.max(tl.load(cinfo + 4 * (ib + ss) + 2, mask=ss < S, other=0), 0)
        thr, c = _bisect(vb, K, lo, hi, tl.sum((vb >= lo).to(tl.int32), 0), K, CUTS)
        take, pos = _take_at(vb, thr, K - tl.sum((vb > thr).to(tl.int32), 0))
    else:
        take, pos = _select_topk(vb, K, SEARCH, CUTS)
    ob = _out_row(out, out1, b, t, h, H, NQ, K, PER_TOKEN)
    tl.store(ob + pos, vi, mask=take)
    if PLAN:
        if t == 0:
            plan_row_sorted(ob, pred, bh, count, bh_out, chunk_out, slot_out, assembled, K, KP, LOG_KP)
