"""Does programmatic dependent launch (PDL) shorten a CUDA graph of small dependent kernels? (H200)

    PYTHONPATH=. python3 -m devtools.devcheck_pdl [--out FILE.json]

A chain of `n` dependent elementwise Triton kernels (x -> y -> x ...) captured in one CUDA graph,
timed with CUDA events over graph replays (median of 20 after warm-up), without and with PDL
(`launch_pdl=True`; pdl=1: each program calls gdc_launch_dependents, then gdc_wait before its first
load; pdl=2: gdc_wait only, the dependents launch when the kernel completes).
Grids of 8 and 132 programs (glue at batch 1 and a full wave), alone and with a cuBLAS GEMV of
Llama-3-8B's qkv shape (1 x 4096 x 6144 bf16) every 4 kernels (the engine's mix). Per kernel:
(chain - GEMVs alone) / n. Checks that both chains compute the same values first.

The engine itself was tried with PDL on every Triton kernel of its step (commits c175bc5 and e5f1448,
reverted after): traces/engine/h200/devcheck-pdl-engine*.json, compute-only CUDA-graph steps at
6 points, 3 repetitions, each engine captured with and without PDL in turn. Triggering the
dependents at kernel start was 3-4 % slower at 128K, batch 16 (cause not isolated) and
-2..+2 % at batch 1; waiting only (no early trigger) was within 0.2-0.8 % of off. Neither is used.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _axpb(x, y, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL != 0:
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    tl.store(y + offs, v * 0.5 + 1.0, mask=m)


def chain(x, y, n_kernels, programs, pdl, gemv=None):
    n = x.numel()
    block = triton.next_power_of_2(triton.cdiv(n, programs))
    for i in range(n_kernels):
        a, b = (x, y) if i % 2 == 0 else (y, x)
        _axpb[(programs,)](a, b, n, BLOCK=block, PDL=pdl, num_warps=4, launch_pdl=pdl != 0)
        if gemv is not None and i % 4 == 3:
            gemv()


def timed(fn, reps=20):
    from ddbench.kernels.timing import capture_graph, event_times
    g = capture_graph(fn, [fn])
    return statistics.median(event_times(g.replay, reps, warmup=3))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernels", type=int, default=400)
    a = ap.parse_args(argv)
    from devtools._common import command, refusal
    if (err := refusal("devcheck_pdl", None)):
        print(err, file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = []
    w = torch.randn(6144, 4096, device=dev, dtype=torch.bfloat16)
    h = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    o = torch.empty(1, 6144, device=dev, dtype=torch.bfloat16)

    def gemv():
        torch.matmul(h, w.t(), out=o)

    n_gemv = a.kernels // 4
    t_gemv = timed(lambda: [gemv() for _ in range(n_gemv)])
    for programs in (8, 132):
        n = programs * 512
        x0 = torch.randn(n, device=dev)
        res = {}
        for pdl in (0, 1, 2):
            x, y = x0.clone(), torch.full_like(x0, float("nan"))
            chain(x, y, 6, programs, pdl)
            res[pdl] = x.clone()
        ok = torch.equal(res[0], res[1]) and torch.equal(res[0], res[2])
        for mix in (False, True):
            for pdl in (0, 1, 2):
                x, y = x0.clone(), torch.empty_like(x0)
                t = timed(lambda: chain(x, y, a.kernels, programs, pdl, gemv if mix else None))
                per = (t - (t_gemv if mix else 0.0)) / a.kernels * 1e3
                rows.append(dict(programs=programs, with_gemv=mix, pdl=pdl, chain_ms=t, per_kernel_us=per,
                                 same_values=ok))
                print(f"programs={programs:4d} gemv={mix!s:5} pdl={pdl}: {t:.4f} ms, {per:.2f} us/kernel "
                      f"(values equal: {ok})", flush=True)
    print(f"gemv alone x{n_gemv}: {t_gemv:.4f} ms", flush=True)
    if a.out:
        from ddbench.core.io import write_json
        from ddbench.kernels.timing import provenance
        write_json(a.out, dict(provenance=provenance(command("devcheck_pdl", argv)), gemv_ms=t_gemv,
                               kernels=a.kernels, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
