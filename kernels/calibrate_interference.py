"""Calibration section `compute_interference`: each kind of decode-step kernel timed alone and beside the
engine's prefetch gather, the interference that the simulator prices per kind of compute.

A loop of one kernel family (about 3 ms alone) runs on the compute stream while a 512 MiB bf16 gather of
4 KiB pieces (ddbench.kernels.gather.gather_uva at its defaults, 32 programs: the engine's prefetch launch) is in
flight on a stream of the same priority, issued 0.3 ms before the loop, as the engine issues a layer's
prefetch before the compute it hides behind. The gather must outlast the loop (else the row is an error,
never a shorter window). Rows: the loop's time alone and beside it (medians of 5 timed rounds after a
warm-up, CUDA events), their ratio, and the gather's rate alone and beside it.

Families, at Llama-3-8B's shapes and at several sizes (the simulator interpolates in `size`):
  gemm         the gate_up projection at 2 to 240 tokens (the decode linears, the LM head and the
               low-rank key rebuild)
  selection    landmark scoring and top-k (ddbench.kernels.select.select_chunks, budget 2048): 1 to 95 requests
               at 32K and 128K (size: landmarks read)
  attention    dual-token sparse attention (ddbench.kernels.attention), 1 to 64 requests over 2048 + 128 rows
  elementwise  an RMS norm over 64 MiB of bf16 (memory-bound torch glue)
"""

from __future__ import annotations

import time

import torch

from ddbench.kernels.calibrate_link import rand_bf16, sync

MiB = 1 << 20
FAMILIES = ("gemm", "selection", "attention", "elementwise")    # the simulator's kinds of compute
LOOP_MS = 3.0          # each family's loop alone
LEAD_S = 3e-4          # the gather is issued this long before the loop
ROUNDS = 5


def _shapes():
    """(family, shape, size, size_unit, one call) at Llama-3-8B's shapes: the sizes the simulator interpolates
    in (gemm: tokens; selection: landmarks read, requests x chunks; attention: requests; elementwise: rows)."""
    from ddbench.kernels.attention import dual_sparse_attention
    from ddbench.kernels.select import select_chunks
    w = rand_bf16(28672, 4096)
    for m in (2, 32, 128, 240):                 # batch 1, 16, 64, 120 with two query tokens
        x = rand_bf16(m, 4096)
        yield "gemm", f"{m}x4096x28672", m, "tokens", lambda x=x: torch.nn.functional.linear(x, w)
        del x
    for b, ctx in ((1, 131072), (16, 131072), (60, 131072), (16, 32768), (95, 32768)):
        q, lm = rand_bf16(b, 2, 32, 128), rand_bf16(b, 8, ctx // 8, 128)
        yield ("selection", f"b{b} {ctx // 1024}K landmarks top-256", b * ctx // 8, "landmarks",
               lambda q=q, lm=lm: select_chunks(q, lm, 256))
        del q, lm
    for b in (1, 16, 64):
        q, kb, vb = rand_bf16(b, 2, 32, 128), rand_bf16(b, 8, 2176, 128), rand_bf16(b, 8, 2176, 128)
        n = torch.full((b,), 2174, dtype=torch.int32, device="cuda")
        yield ("attention", f"b{b} nq2 32q/8kv 2176 rows", b, "requests",
               lambda q=q, kb=kb, vb=vb, n=n: dual_sparse_attention(q, kb, vb, n))
        del q, kb, vb, n
    h = rand_bf16(8192, 4096)
    yield ("elementwise", "rmsnorm 8192x4096", 8192, "rows",
           lambda: h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype))


class _Gather:
    """The background: the engine's prefetch gather of 512 MiB of random 4 KiB bf16 pieces."""

    def __init__(self):
        from ddbench.kernels.layout import alloc_host_kv
        B, H, N, C, d = 8, 8, 8192, 8, 128
        self.host = alloc_host_kv(1, B, H, N, C, d)
        self.host.view(torch.int16).random_(-16000, 16000)
        g = torch.Generator().manual_seed(3)
        n = 2048          # chunks per (request, head): 8 x 8 x 2048 x 8 KiB (K+V) = 512 MiB
        self.idx = torch.randint(0, N, (B, H, n), generator=g, dtype=torch.int32).cuda()
        self.k = torch.empty(B, H, n * C, d, dtype=torch.bfloat16, device="cuda")
        self.v = torch.empty_like(self.k)
        self.bytes = 2 * self.k.numel() * 2

    def __call__(self):
        from ddbench.kernels.gather import gather_uva
        gather_uva(self.host, 0, self.idx, self.k, self.v)


def _loop(fn, n):
    for _ in range(n):
        fn()


def _timed(stream, fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        s.record(stream)
        fn()
        e.record(stream)
    return s, e


def measure_family(fn, gather: _Gather, comp, bg) -> dict:
    """One family's row (module doc): its loop alone and beside the gather."""
    fn()
    sync()
    s, e = _timed(comp, fn)
    sync()
    n = max(1, int(LOOP_MS / max(s.elapsed_time(e), 1e-3)))
    alone, beside, g_alone, g_beside = [], [], [], []
    for r in range(ROUNDS + 1):
        s, e = _timed(comp, lambda: _loop(fn, n))
        sync()
        gs, ge = _timed(bg, gather)
        sync()
        gs2, ge2 = _timed(bg, gather)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < LEAD_S:
            pass
        s2, e2 = _timed(comp, lambda: _loop(fn, n))
        sync()
        if e2.elapsed_time(ge2) <= 0:
            raise RuntimeError(f"the gather ({gs2.elapsed_time(ge2):.2f} ms) ended before the loop")
        if r:       # round 0 warms up
            alone.append(s.elapsed_time(e))
            beside.append(s2.elapsed_time(e2))
            g_alone.append(gs.elapsed_time(ge))
            g_beside.append(gs2.elapsed_time(ge2))
    med = lambda xs: sorted(xs)[len(xs) // 2]     # noqa: E731
    a, b = med(alone), med(beside)
    return {"calls": n, "alone_ms": a, "beside_ms": b, "slowdown": b / a,
            "gather_gbps_alone": gather.bytes / med(g_alone) / 1e6,
            "gather_gbps_beside": gather.bytes / med(g_beside) / 1e6}


class InterferenceSections:
    """The compute_interference section; mixed into kernels/calibrate.py's Calibrator."""

    def compute_interference(self):
        gather = _Gather()
        comp, bg = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=0)
        for family, shape, size, unit, fn in _shapes():
            self.point("compute_interference", {"family": family, "shape": shape, "gather_programs": 32},
                       lambda fn=fn, size=size, unit=unit: dict(measure_family(fn, gather, comp, bg), size=size,
                                                                size_unit=unit))
        del gather
        torch.cuda.empty_cache()
        self.finish("compute_interference", f"each family's loop (~{LOOP_MS:g} ms alone) on the compute stream,"
                                            " beside the engine's 32-program bf16 prefetch gather of 512 MiB"
                                            " (4 KiB pieces) issued 0.3 ms before it on a stream of the same"
                                            " priority; medians of 5 rounds")
