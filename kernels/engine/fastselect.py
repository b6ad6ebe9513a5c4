"""Chunk selection for the engine: scores, softmax, max over the GQA group and top-k with one pass
over the selection state and no torch top-k or sort.

    select_topk(q, lm, k, scores=SCORES) -> idx [B, nq, H, k] int32, ascending chunk ids     (landmarks)
    specache_select_topk(q, qk, chunk, k, rows=None, splits=None, scores=SCORES) -> the same from SpeCache's
        2-bit keys
        (`rows`: the codes kernel's fewest query rows per program, ddbench.kernels.specache.spec_block_m; `splits`
        its programs per (request, KV head), automatic by default)
    topk_from_scratch(scratch, pml, TopkShape(B, H, nq, G, N, k), out=None, how=TopkMethod(), plan=None, block_m=None)
        -> the fused normalise + group-max + top-k ("seg": the default wherever its merge fits in
           MAX_MERGE candidates, else "bits"; "stream" and "bits" on request); `out`: None, one
           [B, nq, H, k] tensor, or a tuple of nq (<= 2) [B, H, k] tensors, one per token (the
           engine's true selection and next-step prediction, written in place); `plan=(pred,
           transfer.plan_buffers(...))`: the "seg" merge kernel also plans token 0's misses against
           `pred` (transfer.plan_row_sorted; `fused_plan_fits` says where it applies)
    probs_from_scratch_ref(...)  torch twin of the kernels' group-max probabilities
    topk_from_scratch_ref(scratch, pml, B, H, nq, G, N, k)   torch twin of the kernel (same fp32
        probabilities, same tie rule), used by the tests
    select_topk_ref(q, lm, k) = ddbench.kernels.select.select_chunks_ref                 torch twin

Pass 1 is kernels/select.py's `score_pass1_kernel` (landmarks, raw scores of the group's rows to a
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

"stream" (`stream_topk_kernel`, issue 9): the program streams its row in blocks of `blk` chunks
(group-max probabilities of a block in registers only, so many programs share an SM and their loads
overlap), appends the block's chunks whose probability bits exceed a running threshold T to a
per-program candidate buffer in global memory (ids ascending, order-preserving prefix sum), and when
the buffer could overflow on the next block (more than CAP - blk entries, CAP = next power of two
>= k + blk) cuts it to its exact top-k in that order (31-step bit search over the <= CAP candidates
only) and sets T to the k-th largest. Exact: top-k(A u B) = top-k(top-k(A) u B) in that total order,
and a later chunk equal to T ranks below every kept one (larger id), so only chunks strictly above T
are appended. The final top-k of the buffer is the answer. Extra memory: 2 x CAP int32 per program.
The cut's K-th largest is a 31-step binary search (default) or, with search="5ary", a 5-ary search
with packed counts (14 reductions; not timed on the GPU yet). Measured on the H200 (the
selection's device check): 1.40x faster than the bit search at 128K, batch 64 (3.67x its byte floor), about
equal at batch 4, slower at N = 4096 (hence STREAM_MIN_N).
"bits" (`bits_topk_kernel`, the first kernel; the default only where "seg"'s merge would exceed
MAX_MERGE candidates, i.e. k close to N at large N): the whole row in registers, a 31-step binary
search on the bits over all N entries.

"seg" (two kernels, the default): stage 1 (`seg_topk_kernel`) runs one program per (row, segment of
`seg` chunks; 4096, or 2048 when there are few rows), so even batch 1 has 64 programs: the segment's
group-max probabilities in registers, then a coarse cut: T rises from the segment's smallest value by
a search that counts `cuts` (default 2) evenly spaced thresholds per reduction (16-bit fields of one
sum) and stops as soon as at most `slots` (default 2 k) chunks are >= T (at least k are). Those
chunks (a superset of the segment's top-k in the contract's order; with exact ties all the way down
T is the k-th largest and its ties are cut by id) go, in id order, to the segment's slots, with
(count, T, segment max). Stage 2 (`merge_topk_kernel`, one program per row) takes the exact top-k
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

The kernels themselves: kernels/engine/topk_kernels.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton

from ddbench.kernels.engine.topk_kernels import bits_topk_kernel, merge_topk_kernel, seg_topk_kernel, stream_topk_kernel
from ddbench.kernels.select import LOG2E, check_select_args, score_pass1_kernel, select_chunks_ref

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
PASS1_SPLITS = 16       # landmark pass 1: at least this many splits per (request, KV head) where the rows have them.
                        # One split per row from B x H = 4 x SMs on left a wave's tail of programs (Qwen2.5-7B 128K,
                        # batch 181: 724 programs, 0.95 ms against 0.78 at 16 splits); 16 is within 1 % of the best
                        # count at every point measured (traces/kernels/h200-pass1-waves)


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
    as ddbench.kernels.specache.spec_block_m does)."""
    rows = max(16, triton.next_power_of_2(nq * triton.next_power_of_2(G))) if block_m is None else block_m
    if rows < nq * triton.next_power_of_2(G) or rows & (rows - 1):
        raise ValueError(f"block_m {rows} cannot hold {nq} tokens x {G} heads")
    return rows


class TopkShape(NamedTuple):
    """The rows a top-k reads: B requests, H KV heads, nq query tokens, G query heads per KV head, N chunks;
    k, the budget of chunks each row keeps."""
    B: int
    H: int
    nq: int
    G: int
    N: int
    k: int


@dataclass(frozen=True)
class TopkMethod:
    """Which top-k kernel and how it runs (the module docstring says what each does): method None (the
    default: "seg" where its merge fits, else "stream" or "bits"), "seg", "stream" or "bits"; search (seg:
    "bisect", "radix", "binary", "5ary"; stream, bits: "binary", "5ary"); seg: chunks per segment and slots
    (seg's geometry, default from the rows); cuts: counts per reduction (seg, default SEG_CUTS); blk: chunks
    per block and num_warps (stream, seg; default from the geometry)."""
    method: str | None = None
    search: str | None = None
    seg: int | None = None
    slots: int | None = None
    cuts: int | None = None
    blk: int | None = None
    num_warps: int | None = None


def topk_from_scratch(scratch, pml, shape: TopkShape, out=None, *, how: TopkMethod = TopkMethod(), plan=None,
                      block_m=None):
    B, H, nq, G, N, k = shape
    blk, num_warps, method, search, seg, slots, cuts = (how.blk, how.num_warps, how.method, how.search, how.seg,
                                                        how.slots, how.cuts)
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
        seg_topk_kernel[(rows, S)](scratch, pml, cbits, cids, cinfo, N, H, G, nq, n_split, k, KK, S, pargs[1],
                                   GP=GP, BLOCK_M=BLOCK_M, SP=SP, SEG=seg, SEARCH=sv, CUTS=cuts, PLAN=pkw["PLAN"],
                                   num_warps=num_warps or _seg_warps(seg, rows * S))
        merge_topk_kernel[(rows,)](cbits, cids, cinfo, o0, o1, H, nq, k, KK, S, *pargs, PER_TOKEN=per_token, CP=CP,
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
        stream_topk_kernel[(B * H * nq,)](scratch, pml, o0, o1, buf, N, H, G, nq, n_split, k, PER_TOKEN=per_token,
                                          GP=GP, BLOCK_M=BLOCK_M, SP=SP, BLK=blk, CAP=cap,
                                          FIVE=search == "5ary", num_warps=nw)
    elif method == "bits":
        NP = triton.next_power_of_2(N)
        nw = 16 if NP >= 8192 else (8 if NP >= 2048 else 4)
        bits_topk_kernel[(B * H * nq,)](scratch, pml, o0, o1, N, H, G, nq, n_split, k, PER_TOKEN=per_token,
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


def checked_score_dtype(scores):
    """The dtype the pass-1 scratch stores scores in: torch.float16 or torch.float32, else ValueError."""
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
    B, nq, Hq, d, H, N = check_select_args(q, lm)
    if not 0 < k <= N:
        raise ValueError(f"budget of {k} chunks must be within 1..{N} landmarks")
    scratch, pml, G = landmark_pass1(q, lm, block_n=block_n, splits=splits, scores=scores)
    return topk_from_scratch(scratch, pml, TopkShape(B, H, nq, G, N, k), **topk_kw)


def landmark_pass1(q, lm, *, block_n=64, splits=None, scores=SCORES):
    """Pass 1 over the landmarks: (scratch of raw scores, each split's row max and sum of exp, GQA group size G)."""
    B, nq, Hq, d, H, N = check_select_args(q, lm)
    G = Hq // H
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        splits = max(1, min(max(triton.cdiv(4 * sms, B * H), PASS1_SPLITS), N // PASS1_MIN_SPLIT))
    split_len = triton.cdiv(triton.cdiv(N, splits), block_n) * block_n
    n_split = triton.cdiv(N, split_len)
    scratch = torch.empty(B * H * BLOCK_M * N, device=q.device, dtype=checked_score_dtype(scores))
    pml = torch.empty(B * H * n_split * BLOCK_M * 2, device=q.device, dtype=torch.float32)
    score_pass1_kernel[(B * H, n_split)](q, lm, scratch, pml, N, q.stride(0), q.stride(1), q.stride(2), *lm.stride()[:3],
                                         H, G, nq, n_split, split_len, LOG2E / math.sqrt(d),
                                         D=d, GP=GP, BLOCK_M=BLOCK_M, BLOCK_N=block_n, num_warps=4)
    return scratch, pml, G


def specache_select_topk(q, qk, chunk, k, *, rows=None, splits=None, scores=SCORES, **topk_kw):
    from ddbench.kernels.specache import spec_block_m, spec_pass1
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    scratch, pml = spec_pass1(q, qk, chunk, rows=rows, splits=splits, scores=checked_score_dtype(scores))
    return topk_from_scratch(scratch, pml, TopkShape(B, H, nq, Hq // H, qk.tokens // chunk, k),
                             block_m=spec_block_m(nq, Hq // H, rows=rows), **topk_kw)


def deliver_ids(ids, out):
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
    return deliver_ids(select_chunks_ref(q, lm, k), out)


def specache_select_topk_ref(q, qk, chunk, k, out=None):
    from ddbench.kernels.specache import specache_chunk_scores_ref
    p = specache_chunk_scores_ref(q, qk, chunk)
    return deliver_ids(p.topk(k, dim=-1).indices.sort(-1).values.to(torch.int32), out)
