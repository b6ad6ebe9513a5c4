"""Our sparse attention and top-k against flashinfer's (issue 31 part 4; `ddbench bench kernels --peer flashinfer`).

run_peer(quick=False) -> (rows, ceilings): rows in kernels/microbench.py's COLUMNS, each against its HBM floor
(the bytes the kernel cannot avoid reading, over the same run's device-to-device copy rate).

Shapes: Llama-3-8B's heads (32 query, 8 KV, d 128), a 2048-token budget of 8-token chunks, batch 1 / 16 / 64
at 32K and 128K. Every (request, KV head) selects its own 256 chunks, so flashinfer sees each (request, KV
head) as one of its requests with one KV head and the group's 4 query heads; a page is a chunk.

Attention (single token: the step's own; dual: it and the speculative token, causal):
  ours_gathered       dual_sparse_attention over a gathered buffer [B, H, 2048 + nq, d] (DualDecoder's)
  ours_rows           the same kernel reading the chunks in place in a paged pool through `rows` (the chunk
                      cache's layout, dualdecoder-cache)
  flashinfer_decode[_tc]  BatchDecodeWithPagedKVCacheWrapper over the same pool (page = chunk, kv_indices =
                      the selected chunks, then the page of the new tokens); _tc: use_tensor_cores
  flashinfer_prefill_causal  BatchPrefillWithPagedKVCacheWrapper, 2 query tokens per request, causal
                      (the dual case: token 0 does not see token 1); the fa2 backend (as _tc), whose
                      kernels JIT-compile in a minute where fa3's take several
  floor: K and V of the attended tokens, read once.
Top-k over the selection's probabilities (2 query tokens, N = context / 8 chunks, k = 256):
  ours_fused_topk     the engine's normalise + group max + top-k (kernels/engine/fastselect.py) from pass 1's
                      fp16 scratch (floor: that scratch, 4 rows of a group per token)
  flashinfer_top_k / torch_topk   over the fp32 group-max probabilities [B * 2 * H, N] (floor: those)
  ours_select / ours_scores+flashinfer_top_k   the whole selection from the landmarks (floor: the landmarks)
Timing: CUDA graphs of `inner` calls (kernels/timing.py time_cuda), inputs rotated over enough copies that
they do not stay in L2 where they fit; flashinfer's plan() runs once per input set, outside the timing.
"""

from __future__ import annotations

import math

import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.attention import CacheView, dual_sparse_attention
from ddbench.kernels.timing import time_cuda

HQ, H, D, BUDGET, CHUNK = 32, 8, 128, 2048, 8
G = HQ // H
K_CHUNKS = BUDGET // CHUNK
ROTATE_BYTES = 256 << 20          # rotate input copies until their bytes exceed this (L2 is 60 MB)
MAX_SETS = 32
WORKSPACE = 128 << 20


def load_flashinfer():
    try:
        import flashinfer
    except Exception as exc:  # ImportError, or its own import-time errors (no CUDA toolchain)
        raise DDBenchError(f"bench kernels --peer flashinfer needs the flashinfer-python package (the optional extra"
                           f" ddbench[flashinfer], GPU only): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return flashinfer


def _sets(nbytes: int) -> int:
    return max(1, min(MAX_SETS, math.ceil(ROTATE_BYTES / max(nbytes, 1))))


def _selection(B, N, dev, gen):
    """[B, H, 256] distinct ascending chunk ids of N."""
    return torch.rand(B, H, N, device=dev, generator=gen).argsort(-1)[..., :K_CHUNKS].sort(-1).values


class AttnCase:
    """One (context, batch) point's inputs: a pool [S * B, H, N + 1 chunks, d] (chunk N of each (request, head):
    the new tokens), S input sets, each a selection, its rows, its flashinfer indices and a gathered copy."""

    def __init__(self, B, ctx, nq, dev, gen, sets=None):
        self.B, self.N, self.nq = B, ctx // CHUNK, nq
        kv_bytes = B * H * (BUDGET + nq) * D * 2 * 2
        self.S = sets or _sets(kv_bytes)
        rows_per = (self.N + 1) * CHUNK
        self.k = torch.randn(self.S * B, H, rows_per, D, device=dev, dtype=torch.bfloat16, generator=gen)
        self.v = torch.randn_like(self.k)
        self.q = [torch.randn(B, nq, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(self.S)]
        self.lengths = torch.full((B,), BUDGET, device=dev, dtype=torch.int32)
        lane = torch.arange(CHUNK, device=dev, dtype=torch.int32)
        tail = self.N * CHUNK + torch.arange(nq, device=dev, dtype=torch.int32)
        self.sel, self.rows, self.gk, self.gv = [], [], [], []
        for s in range(self.S):
            sel = _selection(B, self.N, dev, gen)
            rows = (sel.to(torch.int32)[..., None] * CHUNK + lane).reshape(B, H, BUDGET)
            rows = torch.cat([rows, tail.expand(B, H, nq)], -1).contiguous()
            kp, vp = self.pool(s)
            bi = torch.arange(B, device=dev)[:, None, None]
            hi = torch.arange(H, device=dev)[None, :, None]
            self.sel.append(sel)
            self.rows.append(rows)
            self.gk.append(kp[bi, hi, rows.long()].contiguous())
            self.gv.append(vp[bi, hi, rows.long()].contiguous())
        self.floor_bytes = kv_bytes

    def pool(self, s):
        return self.k[s * self.B:(s + 1) * self.B], self.v[s * self.B:(s + 1) * self.B]

    def pages(self, s):
        """flashinfer's paged view of set s: (k_cache, v_cache) [pages, 8, 1, d], indptr, indices, last_page_len."""
        B, N = self.B, self.N
        kp, vp = self.pool(s)
        base = (torch.arange(B * H, device=kp.device, dtype=torch.int32) * (N + 1))[:, None]
        idx = torch.cat([base + self.sel[s].reshape(B * H, K_CHUNKS).to(torch.int32), base + N], -1)
        indptr = torch.arange(B * H + 1, device=kp.device, dtype=torch.int32) * (K_CHUNKS + 1)
        last = torch.full((B * H,), self.nq, device=kp.device, dtype=torch.int32)
        cache = (kp.reshape(B * H * (N + 1), CHUNK, 1, D), vp.reshape(B * H * (N + 1), CHUNK, 1, D))
        return cache, indptr, idx.reshape(-1).contiguous(), last

    def fi_query(self, s):
        """q as flashinfer's [B * H * nq, G, d]: request (b, h), its tokens in order."""
        B, nq = self.B, self.nq
        return self.q[s].view(B, nq, H, G, D).permute(0, 2, 1, 3, 4).reshape(B * H * nq, G, D).contiguous()

    def from_fi(self, o):
        B, nq = self.B, self.nq
        return o.view(B, H, nq, G, D).permute(0, 2, 1, 3, 4).reshape(B, nq, HQ, D)


def _timed(fns):
    """(ms, how): the median call of CUDA-graph replays over the rotated input sets."""
    return time_cuda(fns, inner=3, reps=15), "graph"


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _fi_wrappers(fi, case, ws, kind):
    """One planned flashinfer wrapper per input set: kind 'decode', 'decode_tc' or 'prefill'."""
    out = []
    for s in range(case.S):
        cache, indptr, idx, last = case.pages(s)
        if kind == "prefill":
            w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout="NHD", backend="fa2")
            qo = torch.arange(case.B * H + 1, device=idx.device, dtype=torch.int32) * case.nq
            w.plan(qo, indptr, idx, last, G, 1, D, CHUNK, causal=True, q_data_type=torch.bfloat16,
                   kv_data_type=torch.bfloat16)
        else:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="NHD", use_tensor_cores=kind == "decode_tc",
                                                      **({"backend": "fa2"} if kind == "decode_tc" else {}))
            w.plan(indptr, idx, last, G, 1, D, CHUNK, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        out.append((w, cache, case.fi_query(s)))
    return out


def bench_attention(rows, fi, hbm_gbps, batches, contexts, dev, gen):
    ws = torch.zeros(WORKSPACE, dtype=torch.uint8, device=dev)
    for ctx in contexts:
        for B in batches:
            for nq in (1, 2):
                case = AttnCase(B, ctx, nq, dev, gen)
                floor = case.floor_bytes / hbm_gbps / 1e6
                shape = f"{ctx // 1024}K ctx, {BUDGET} sparse tokens, nq={nq}, {case.S} input sets"
                tok = "single" if nq == 1 else "dual"
                ours_g = [lambda s=s: dual_sparse_attention(case.q[s], case.gk[s], case.gv[s], case.lengths)
                          for s in range(case.S)]
                ours_r = [lambda s=s: dual_sparse_attention(case.q[s], *case.pool(s), case.lengths,
                                                            cache=CacheView(case.rows[s]))
                          for s in range(case.S)]
                o_ref = ours_r[0]()
                t, how = _timed(ours_g)
                rows.add("peer_attention", f"ours_gathered_{tok}", B, shape, case.floor_bytes, t, floor,
                         notes=f"{how}; rel_err_vs_ours_rows={_rel(ours_g[0](), o_ref):.1e}")
                t, how = _timed(ours_r)
                rows.add("peer_attention", f"ours_rows_{tok}", B, shape, case.floor_bytes, t, floor, notes=how)
                for kind in (("decode", "decode_tc") if nq == 1 else ("prefill",)):
                    wr = _fi_wrappers(fi, case, ws, kind)
                    fns = [lambda w=w, c=c, q=q: w.run(q, c) for w, c, q in wr]
                    o_fi = case.from_fi(fns[0]())
                    err = _rel(o_fi, o_ref)
                    t, how = _timed(fns)
                    name = {"decode": "flashinfer_decode", "decode_tc": "flashinfer_decode_tc",
                            "prefill": "flashinfer_prefill_causal"}[kind]
                    rows.add("peer_attention", f"{name}_{tok}", B, shape, case.floor_bytes, t, floor,
                             vs=f"ours_rows_{tok}", notes=f"{how}; rel_err_vs_ours_rows={err:.1e}")
                    del wr
                del case
                torch.cuda.empty_cache()


def bench_topk(rows, fi, hbm_gbps, batches, contexts, dev, gen):
    from ddbench.kernels.engine.fastselect import TopkShape, landmark_pass1, select_topk, topk_from_scratch
    from ddbench.kernels.select import score_chunks
    nq = 2
    for ctx in contexts:
        N = ctx // CHUNK
        for B in batches:
            lm_bytes = B * H * N * D * 2
            S = _sets(lm_bytes)
            lms = [torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(S)]
            qs = [torch.randn(B, nq, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(S)]
            p1 = [landmark_pass1(q, lm) for q, lm in zip(qs, lms)]
            probs = [score_chunks(q, lm).view(B * nq * H, N) for q, lm in zip(qs, lms)]
            shape = f"{ctx // 1024}K ctx, N={N} chunks, k={K_CHUNKS}, nq={nq}, {S} input sets"
            scratch_bytes = B * H * nq * G * N * 2
            p_bytes = B * nq * H * N * 4
            t, how = _timed([lambda s=s: topk_from_scratch(p1[s][0], p1[s][1], TopkShape(B, H, nq, G, N, K_CHUNKS))
                             for s in range(S)])
            rows.add("peer_topk", "ours_fused_topk", B, shape, scratch_bytes, t, scratch_bytes / hbm_gbps / 1e6,
                     notes=f"{how}; normalise + group max + top-k from pass 1's fp16 scratch")
            t, how = _timed([lambda s=s: torch.topk(probs[s], K_CHUNKS, sorted=False) for s in range(S)])
            rows.add("peer_topk", "torch_topk", B, shape, p_bytes, t, p_bytes / hbm_gbps / 1e6, notes=how)
            ti = fi.top_k(probs[0], K_CHUNKS)[1].sort(-1).values
            same = bool(torch.equal(ti, torch.topk(probs[0], K_CHUNKS).indices.sort(-1).values))
            t, how = _timed([lambda s=s: fi.top_k(probs[s], K_CHUNKS) for s in range(S)])
            rows.add("peer_topk", "flashinfer_top_k", B, shape, p_bytes, t, p_bytes / hbm_gbps / 1e6, vs="torch_topk",
                     notes=f"{how}; same_set_as_torch={same}")
            t, how = _timed([lambda s=s: select_topk(qs[s], lms[s], K_CHUNKS) for s in range(S)])
            rows.add("peer_select", "ours_select", B, shape, lm_bytes, t, lm_bytes / hbm_gbps / 1e6, notes=how)
            t, how = _timed([lambda s=s: fi.top_k(score_chunks(qs[s], lms[s]).view(B * nq * H, N), K_CHUNKS)
                             for s in range(S)])
            rows.add("peer_select", "ours_scores+flashinfer_top_k", B, shape, lm_bytes, t, lm_bytes / hbm_gbps / 1e6,
                     vs="ours_select", notes=how)
            del lms, qs, p1, probs
            torch.cuda.empty_cache()


def run_peer(quick: bool = False):
    from ddbench.kernels.microbench import Rows, ceilings
    fi = load_flashinfer()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = Rows()
    ceil = ceilings(dev)
    hbm = ceil["hbm_copy_gbps_rw"]
    rows.add("ceiling", "hbm_d2d_copy_1GiB", 0, "read+write", 2 << 30, 2 * (1 << 30) / hbm / 1e6,
             notes=f"peer: flashinfer {getattr(fi, '__version__', 'unknown')}")
    batches = (1, 16) if quick else (1, 16, 64)
    contexts = (32768,) if quick else (32768, 131072)
    for ctx in contexts:
        bench_topk(rows, fi, hbm, batches, (ctx,), dev, gen)
        bench_attention(rows, fi, hbm, batches, (ctx,), dev, gen)
    return rows, ceil
