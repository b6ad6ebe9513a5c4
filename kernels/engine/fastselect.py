"""Chunk selection for the engine: scores, softmax, max over the GQA group and top-k with one pass
over the selection state and no torch top-k or sort.

    select_topk(q, lm, k, scores=SCORES) -> idx [B, nq, H, k] int32, ascending chunk ids     (landmarks)
    specache_select_topk(q, qk, chunk, k, rows=None, splits=None, scores=SCORES) -> the same from SpeCache's
        2-bit keys
        (`rows`: the codes kernel's fewest query rows per program, kernels.specache.spec_block_m; `splits`
        its programs per (request, KV head), automatic by default)
    topk_from_scratch(scratch, pml, B, H, nq, G, N, k, blk=None, num_warps=None, method=None, search=None,
                      seg=None, slots=None, cuts=None, plan=None, block_m=None)
        -> the fused normalise + group-max + top-k ("seg": the default wherever its merge fits in
           MAX_MERGE candidates, else "bits"; "stream" and "bits" on request); `out`: None, one
           [B, nq, H, k] tensor, or a tuple of nq (<= 2) [B, H, k] tensors, one per token (the
           engine's true selection and next-step prediction, written in place); `plan=(pred,
           transfer.plan_buffers(...))`: the "seg" merge kernel also plans token 0's misses against
           `pred` (transfer.plan_row_sorted; `fused_plan_fits` says where it applies)
    probs_from_scratch_ref(...)  torch twin of the kernels' group-max probabilities
    topk_from_scratch_ref(scratch, pml, B, H, nq, G, N, k)   torch twin of the kernel (same fp32
        probabilities, same tie rule), used by the tests
    select_topk_ref(q, lm, k) = kernels.select.select_chunks_ref                 torch twin

Pass 1 is kernels/select.py's `_score_pass1` (landmarks, raw scores of the group's rows to a
scratch and each split's row max / sum of exp) or kernels/specache.py's `spec_pass1` (2-bit keys,
per-row chunk maxima of the raw scores). The scratch holds them in `scores` (fp16 by default,
SCORES: half the traffic of fp32 for pass 1's writes and the top-k's reads; the row statistics come
from the unrounded scores, and the top-k kernels compute in fp32). The second kernel runs one
program per (request, KV head, query token) and combines the splits' max / sum into each row's
normaliser. Probabilities are
non-negative fp32, so their bits order as int32. The contract, for both methods: the k chunks that
are largest in the order (probability descending, id ascending), written ascending: every chunk
above the k-th largest probability, then chunks equal to it in id order until k. Ties at the
threshold may therefore pick other (equal-probability) chunks than torch.topk.

"stream" (`_stream_topk_kernel`, issue 9): the program streams its row in blocks of `blk` chunks
(group-max probabilities of a block in registers only, so many programs share an SM and their loads
overlap), appends the block's chunks whose probability bits exceed a running threshold T to a
per-program candidate buffer in global memory (ids ascending, order-preserving prefix sum), and when
the buffer could overflow on the next block (more than CAP - blk entries, CAP = next power of two
>= k + blk) cuts it to its exact top-k in that order (31-step bit search over the <= CAP candidates
only) and sets T to the k-th largest. Exact: top-k(A u B) = top-k(top-k(A) u B) in that total order,
and a later chunk equal to T ranks below every kept one (larger id), so only chunks strictly above T
are appended. The final top-k of the buffer is the answer. Extra memory: 2 x CAP int32 per program.
The cut's K-th largest is a 31-step binary search (default) or, with search="5ary", a 5-ary search
with packed counts (14 reductions; not timed on the GPU yet). Measured on the H200 (the issue-9
check, tree 0149cb3): 1.40x faster than the bit search at 128K, batch 64 (3.67x its byte floor), about
equal at batch 4, slower at N = 4096 (hence STREAM_MIN_N).
"bits" (`_bits_topk_kernel`, the first kernel; the default only where "seg"'s merge would exceed
MAX_MERGE candidates, i.e. k close to N at large N): the whole row in registers, a 31-step binary
search on the bits over all N entries.

"seg" (two kernels, the default): stage 1 (`_seg_topk_kernel`) runs one program per (row, segment of
`seg` chunks; 4096, or 2048 when there are few rows), so even batch 1 has 64 programs: the segment's
group-max probabilities in registers, then a coarse cut: T rises from the segment's smallest value by
a search that counts `cuts` (default 2) evenly spaced thresholds per reduction (16-bit fields of one
sum) and stops as soon as at most `slots` (default 2 k) chunks are >= T (at least k are). Those
chunks (a superset of the segment's top-k in the contract's order; with exact ties all the way down
T is the k-th largest and its ties are cut by id) go, in id order, to the segment's slots, with
(count, T, segment max). Stage 2 (`_merge_topk_kernel`, one program per row) takes the exact top-k
of the candidates with the same search between max(T) (k candidates lie above each T) and the
largest candidate, stopping at count == k, and writes the ids ascending. Exact: every chunk of the
row's top-k is in its segment's top-k, hence among the candidates, and the candidates' top-k in the
same total order is the row's. Extra memory: 2 x slots int32 per (row, segment). search="radix"
(a 4-digit radix select with tl.histogram), "binary" or "5ary" make both stages exact searches
instead (slower, kept for comparison). Measured on the H200 (traces/engine/h200/devcheck-topk.json,
`python3 -m devtools.devcheck_topk`): at 128K 1.6-2.9x faster than "stream" and
1.5-2.9x than "bits" (batch 16, 2 tokens: 51.4 against 86.2 and 93.9 us, 3.3x its byte floor); at
32K 1.0-1.3x faster than "bits" (batch 16, 2 tokens: even). Stage 1 is most of it (42.9 of 51.4 us
there): its load and its search alternate within each program.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.engine.transfer import plan_row_sorted
from kernels.select import LOG2E, _check, _score_pass1, select_chunks_ref

MAX_CAP = 8192          # candidate buffer (entries) of the stream kernel; larger k: bits
STREAM_MIN_N = 8192     # shorter rows: bits (measured faster at N = 4096, see docs/engine.md)
# pass 1's stored scores (log2 domain): fp16 halves their write and the top-k's read of them (the
# largest traffic of the selection after the landmarks: 8 rows x N per KV head with two tokens)
SCORES = torch.float16
MAX_MERGE = 16384       # "seg": most candidates (power of two) stage 2 holds in registers; more: bits
SEG_MAX = 4096          # "seg": longest segment (chunks) of stage 1 (8192 with 4 warps: 5-10 % faster alone,
                        # with the scores warm in L2, but no faster in the engine's steps; docs/engine.md)
SEG_MIN = 2048          # "seg": shortest default segment (batch 1 at 32K: 2048 with 8 warps measured fastest)
SEG_PROGRAMS = 64       # "seg": segments halve while stage 1 would have fewer programs than this
SEG_FEW = 128           # "seg": stage 1 with fewer programs than this runs 8 warps each (shorter search latency)
SEG_CUTS = 2            # "seg": cuts counted per reduction of the search (1: bisection; 2 or 4: packed counts)
PASS1_MIN_SPLIT = 256   # landmark pass 1: splits of at least this many chunks (was 1024; measured faster at batch 1)


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
def _bits_topk_kernel(scratch, pml, out, out1, N, H, G, NQ, n_split, K,
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
def _stream_topk_kernel(scratch, pml, out, out1, buf, N, H, G, NQ, n_split, K,
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
def _seg_topk_kernel(scratch, pml, cbits, cids, cinfo, N, H, G, NQ, n_split, K, KK, S, count,
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
def _merge_topk_kernel(cbits, cids, cinfo, out, out1, H, NQ, K, KK, S,
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


def _geometry(B, H, nq, G, N, k, blk, num_warps, device):
    """Block length and warps of the stream kernel: long blocks and more warps when there are too few
    programs to fill the GPU (each program then needs more bytes in flight)."""
    rows = B * H * nq
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    if blk is None:
        blk = 1024 if rows >= 4 * sms else 2048
    blk = max(16, min(blk, triton.next_power_of_2(N)))
    if num_warps is None:
        num_warps = 4 if blk <= 1024 else 8
    return blk, num_warps


def _seg_geometry(B, H, nq, N, k, seg, device, slots=None):
    """Segment length of "seg" (a power of two): SEG_MAX (fewer, longer segments: fewer candidates to
    merge), halved down to SEG_MIN while stage 1 would have fewer than SEG_PROGRAMS programs (batch 1).
    Segments of at most 2 k chunks are passed whole to stage 2."""
    rows = B * H * nq
    if seg is None:
        seg = SEG_MAX
        while seg > SEG_MIN and rows * triton.cdiv(N, seg) < SEG_PROGRAMS:
            seg //= 2
    seg = max(16, min(triton.next_power_of_2(seg), triton.next_power_of_2(N)))
    S = triton.cdiv(N, seg)
    KK = min(seg, max(k, slots or 2 * k))      # candidate slots per segment (the coarse cut leaves k..KK)
    return seg, S, KK, triton.next_power_of_2(S * KK)


def _seg_warps(seg, programs):
    """Warps of a stage-1 program: 4 up to 2048 chunks, 8 for longer segments or when there are few
    programs (measured on the H200: 8 warps at batch 1, 4 at batch 16 / 64 for 2048 chunks)."""
    if seg < 256:
        return max(1, seg // 64)
    return 8 if seg > 2048 or programs < SEG_FEW else 4


def _outputs(out, B, H, nq, k, device):
    """`out`: None (a new [B, nq, H, k]), one [B, nq, H, k] tensor, or a tuple of nq contiguous [B, H, k]
    int32 tensors, one per token (nq <= 2). Returns (what to return, first pointer, second, per token)."""
    if out is None:
        out = torch.empty(B, nq, H, k, device=device, dtype=torch.int32)
    if isinstance(out, torch.Tensor):
        if out.shape != (B, nq, H, k) or not out.is_contiguous() or out.dtype != torch.int32:
            raise ValueError(f"out must be a contiguous int32 [{B}, {nq}, {H}, {k}] tensor")
        return out, out, out, False
    out = tuple(out)
    if len(out) != nq or nq > 2 or any(o.shape != (B, H, k) or not o.is_contiguous() or o.dtype != torch.int32
                                        for o in out):
        raise ValueError(f"per-token outputs: {nq} contiguous int32 [{B}, {H}, {k}] tensors (at most 2)")
    return out, out[0], out[-1], True


def _block_m(nq, G, block_m=None):
    """Rows per (request, KV head) in scratch and pml: pass 1's BLOCK_M (16 unless it says otherwise,
    as kernels.specache.spec_block_m does)."""
    rows = max(16, triton.next_power_of_2(nq * triton.next_power_of_2(G))) if block_m is None else block_m
    if rows < nq * triton.next_power_of_2(G) or rows & (rows - 1):
        raise ValueError(f"block_m {rows} cannot hold {nq} tokens x {G} heads")
    return rows


def topk_from_scratch(scratch, pml, B, H, nq, G, N, k, out=None, *, blk=None, num_warps=None, method=None,
                      search=None, seg=None, slots=None, cuts=None, plan=None, block_m=None):
    GP = triton.next_power_of_2(G)
    BLOCK_M = _block_m(nq, G, block_m)
    n_split = pml.numel() // (2 * B * H * BLOCK_M)
    if not 0 < k <= N:
        raise ValueError(f"budget of {k} chunks must be within 1..{N}")
    out, o0, o1, per_token = _outputs(out, B, H, nq, k, scratch.device)
    SP = triton.next_power_of_2(n_split)
    if method is None or method == "seg":
        seg, S, KK, CP = _seg_geometry(B, H, nq, N, k, seg, scratch.device, slots)
        if method is None:
            method = "seg" if CP <= MAX_MERGE else "bits"
    if plan is not None and method != "seg":
        raise ValueError("a fused miss plan needs the 'seg' top-k")
    if method == "seg":
        if CP > MAX_MERGE:
            raise ValueError(f"seg top-k: {S} segments x {KK} candidates exceed {MAX_MERGE}; use method='bits'")
        pargs, pkw = _plan_args(plan, B, H, N, k, o0)
        sv = {None: 0, "bisect": 0, "radix": 1, "binary": 2, "5ary": 3}[search]
        rows = B * H * nq
        cbits = torch.empty(rows * S * KK, device=scratch.device, dtype=torch.int32)
        cids = torch.empty(rows * S * KK, device=scratch.device, dtype=torch.int32)
        cinfo = torch.empty(rows * S * 4, device=scratch.device, dtype=torch.int32)
        cuts = cuts or SEG_CUTS
        _seg_topk_kernel[(rows, S)](scratch, pml, cbits, cids, cinfo, N, H, G, nq, n_split, k, KK, S, pargs[1],
                                    GP=GP, BLOCK_M=BLOCK_M, SP=SP, SEG=seg, SEARCH=sv, CUTS=cuts, PLAN=pkw["PLAN"],
                                    num_warps=num_warps or _seg_warps(seg, rows * S))
        _merge_topk_kernel[(rows,)](cbits, cids, cinfo, o0, o1, H, nq, k, KK, S, *pargs, PER_TOKEN=per_token, CP=CP,
                                    SP2=triton.next_power_of_2(S), SEARCH=sv, CUTS=cuts, **pkw,
                                    num_warps=16 if CP >= 8192 else max(1, min(8, CP // 256)))
        return out
    if search not in (None, "binary", "5ary"):
        raise ValueError(f"unknown search {search!r} for method {method!r}")
    blk, nw = _geometry(B, H, nq, G, N, k, blk, num_warps, scratch.device)
    cap = triton.next_power_of_2(k + blk)
    if method is None:
        method = "stream" if cap <= MAX_CAP and N >= STREAM_MIN_N else "bits"
    if method == "stream":
        buf = torch.empty(B * H * nq * 2 * cap, device=scratch.device, dtype=torch.int32)
        _stream_topk_kernel[(B * H * nq,)](scratch, pml, o0, o1, buf, N, H, G, nq, n_split, k, PER_TOKEN=per_token,
                                           GP=GP, BLOCK_M=BLOCK_M, SP=SP, BLK=blk, CAP=cap,
                                           FIVE=search == "5ary", num_warps=nw)
    elif method == "bits":
        NP = triton.next_power_of_2(N)
        nw = 16 if NP >= 8192 else (8 if NP >= 2048 else 4)
        _bits_topk_kernel[(B * H * nq,)](scratch, pml, o0, o1, N, H, G, nq, n_split, k, PER_TOKEN=per_token,
                                         GP=GP, BLOCK_M=BLOCK_M, SP=SP, NP=NP, num_warps=nw)
    else:
        raise ValueError(f"unknown top-k method {method!r}")
    return out


def fused_plan_fits(B, H, N, k) -> bool:
    """Whether topk_from_scratch(plan=...) takes B x H rows of 2 tokens, N chunks, budget k: its
    default method is "seg" there, and (chunk id, slot) keys fit in int32."""
    return 0 < k <= N and _seg_geometry(B, H, 2, N, k, None, torch.device("cpu"))[3] <= MAX_MERGE and _keys_fit(N, k)


def _keys_fit(N, k) -> bool:
    """The fused plan's (chunk id, slot) keys, id * next_power_of_2(k) + slot, fit in int32."""
    return N * triton.next_power_of_2(k) < 2**31


def _plan_args(plan, B, H, N, k, o0):
    """Pointer arguments and constexprs of the fused miss plan: `plan` is None or (pred [B, H, k] int32,
    a transfer.MissPlan of outputs from transfer.plan_buffers); unused pointers get `o0`."""
    if plan is None:
        return (o0,) * 6, dict(PLAN=False)
    pred, mp = plan
    if pred.shape != (B, H, k) or pred.dtype != torch.int32 or not pred.is_contiguous() or mp.k != k:
        raise ValueError(f"fused miss plan: pred must be a contiguous int32 [{B}, {H}, {k}] tensor")
    if not _keys_fit(N, k):
        raise ValueError(f"fused miss plan: {N} chunks x {k} slots overflow its int32 keys")
    KP = triton.next_power_of_2(k)
    return (pred, mp.count, mp.bh, mp.chunk, mp.slot, mp.assembled), dict(PLAN=True, KP=KP, LOG_KP=KP.bit_length() - 1)


def _score_dtype(scores):
    if scores not in (torch.float16, torch.float32):
        raise ValueError(f"stored scores must be torch.float16 or torch.float32, got {scores}")
    return scores


def probs_from_scratch_ref(scratch, pml, B, H, nq, G, N, block_m=None):
    """Torch twin of the kernels' group-max probabilities [B*H, nq, N] (fp32, the same formula; on the
    GPU tl.exp2 may differ from torch.exp2 in the last bits)."""
    GP = triton.next_power_of_2(G)
    BLOCK_M = _block_m(nq, G, block_m)
    n_split = pml.numel() // (2 * B * H * BLOCK_M)
    sc = scratch.view(B * H, BLOCK_M, N)
    st = pml.view(B * H, n_split, BLOCK_M, 2)
    p = torch.zeros(B * H, nq, N, dtype=torch.float32, device=scratch.device)
    for t in range(nq):
        for g in range(G):
            r = t * GP + g
            pm, pl = st[:, :, r, 0], st[:, :, r, 1]
            m = pm.max(-1, keepdim=True).values
            inv = 1.0 / (pl * torch.exp2(pm - m)).sum(-1, keepdim=True)
            p[:, t] = torch.maximum(p[:, t], torch.exp2(sc[:, r].float() - m) * inv)
    return p


def topk_from_scratch_ref(scratch, pml, B, H, nq, G, N, k, block_m=None):
    """Torch twin: the probabilities of probs_from_scratch_ref and the contract's order (probability
    descending, id ascending), ids written ascending [B, nq, H, k]."""
    p = probs_from_scratch_ref(scratch, pml, B, H, nq, G, N, block_m)
    bits = p.view(torch.int32).long()
    key = bits * (N + 1) + (N - torch.arange(N, device=p.device))         # value desc, then id asc
    ids = key.topk(k, dim=-1).indices.sort(-1).values.to(torch.int32)       # [B*H, nq, k]
    return ids.view(B, H, nq, k).transpose(1, 2).contiguous()


def select_topk(q, lm, k, *, block_n=64, splits=None, scores=SCORES, **topk_kw):
    B, nq, Hq, d, H, N = _check(q, lm)
    if not 0 < k <= N:
        raise ValueError(f"budget of {k} chunks must be within 1..{N} landmarks")
    scratch, pml, G = _landmark_pass1(q, lm, block_n=block_n, splits=splits, scores=scores)
    return topk_from_scratch(scratch, pml, B, H, nq, G, N, k, **topk_kw)


def _landmark_pass1(q, lm, *, block_n=64, splits=None, scores=SCORES):
    B, nq, Hq, d, H, N = _check(q, lm)
    G = Hq // H
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        splits = max(1, min(triton.cdiv(4 * sms, B * H), N // PASS1_MIN_SPLIT))
    split_len = triton.cdiv(triton.cdiv(N, splits), block_n) * block_n
    n_split = triton.cdiv(N, split_len)
    scratch = torch.empty(B * H * BLOCK_M * N, device=q.device, dtype=_score_dtype(scores))
    pml = torch.empty(B * H * n_split * BLOCK_M * 2, device=q.device, dtype=torch.float32)
    _score_pass1[(B * H, n_split)](q, lm, scratch, pml, N, q.stride(0), q.stride(1), q.stride(2), *lm.stride()[:3],
                                   H, G, nq, n_split, split_len, LOG2E / math.sqrt(d),
                                   D=d, GP=GP, BLOCK_M=BLOCK_M, BLOCK_N=block_n, num_warps=4)
    return scratch, pml, G


def specache_select_topk(q, qk, chunk, k, *, rows=None, splits=None, scores=SCORES, **topk_kw):
    from kernels.specache import spec_block_m, spec_pass1
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    scratch, pml = spec_pass1(q, qk, chunk, rows=rows, splits=splits, scores=_score_dtype(scores))
    return topk_from_scratch(scratch, pml, B, H, nq, Hq // H, qk.tokens // chunk, k,
                             block_m=spec_block_m(nq, Hq // H, rows=rows), **topk_kw)


def _into(ids, out):
    """The twins' ids [B, nq, H, k] delivered as the kernels deliver them (`out` of topk_from_scratch)."""
    if out is None:
        return ids
    if isinstance(out, torch.Tensor):
        out.copy_(ids)
        return out
    for t, o in enumerate(out):
        o.copy_(ids[:, t])
    return out


def select_topk_ref(q, lm, k, out=None):
    return _into(select_chunks_ref(q, lm, k), out)


def specache_select_topk_ref(q, qk, chunk, k, out=None):
    from kernels.specache import specache_chunk_scores_ref
    p = specache_chunk_scores_ref(q, qk, chunk)
    return _into(p.topk(k, dim=-1).indices.sort(-1).values.to(torch.int32), out)
