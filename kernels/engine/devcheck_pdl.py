"""Does programmatic dependent launch (PDL) shorten a CUDA graph of small dependent kernels? (H200)

    PYTHONPATH=. python -m kernels.engine.devcheck_pdl [--out FILE.json]
    PYTHONPATH=. python -m kernels.engine.devcheck_pdl --engine [--reps 3] [--out FILE.json]

A chain of `n` dependent elementwise Triton kernels (x -> y -> x ...) captured in one CUDA graph,
timed with CUDA events over graph replays (median of 20 after warm-up), without and with PDL
(`launch_pdl=True`; pdl=1: each program calls gdc_launch_dependents, then gdc_wait before its first
load; pdl=2: gdc_wait only, the dependents launch when the kernel completes).
Grids of 8 and 132 programs (glue at batch 1 and a full wave), alone and with a cuBLAS GEMV of
Llama-3-8B's qkv shape (1 x 4096 x 6144 bf16) every 4 kernels (the engine's mix). Per kernel:
(chain - GEMVs alone) / n. Checks that both chains compute the same values first.

--engine: compute-only engine steps (CUDA graph, the model's own selection) at a few points; each
engine is built once, then captured with each DDBENCH_PDL setting (off, trigger at start, wait only) in turn, `--reps` times, and timed
(median of 5 replays of 2 steps per capture): step_ms per setting and their ratio per repetition.
"""
from __future__ import annotations

import argparse
import json
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
    from kernels.timing import capture_graph, event_times
    g = capture_graph(fn, [fn])
    return statistics.median(event_times(g.replay, reps, warmup=3))


FLAGS = ("0", "start", "wait")      # DDBENCH_PDL settings compared (kernels/pdl.py)
ENGINE_POINTS = (("dualdecoder", 32768, 1), ("dualdecoder", 131072, 16), ("dualdecoder-single", 131072, 16),
                 ("shadowkv", 32768, 1), ("specache", 32768, 1), ("full-kv", 32768, 1))


def engine_ab(reps: int) -> list[dict]:
    import os
    from ddbench.core.catalog import get_model
    from kernels.engine.bench import hbm_gbps, run_point
    from kernels.engine.model import Weights
    from kernels.timing import event_times
    model, hbm = get_model("llama-3-8b"), hbm_gbps()
    weights = Weights.random(model, "cuda", seed=0)
    rows = []
    for design, ctx, batch in ENGINE_POINTS:
        r = run_point(model, weights, None, design, ctx, batch, miss_rate=None, transfers=False, graph=True,
                      reps=5, hbm=hbm, keep=True)
        if not isinstance(r, tuple):
            print(f"{design} {ctx}:{batch}: {r['status']}", flush=True)
            continue
        row, e = r
        for rep in range(reps):
            t = {}
            for flag in FLAGS:
                os.environ["DDBENCH_PDL"] = flag
                e.capture(2)
                t[flag] = statistics.median(event_times(e.replay, 5, warmup=1, per_call=2))
            os.environ.pop("DDBENCH_PDL")
            rows.append(dict(design=design, context=ctx, batch=batch, rep=rep, floor_ms=row["floor_ms"],
                             **{f"step_ms_{f}": t[f] for f in FLAGS}, **{f"off_over_{f}": t["0"] / t[f] for f in FLAGS[1:]}))
            print(f"{design:20s} {ctx:6d} B={batch:3d} rep {rep}: " + ", ".join(
                f"PDL={f} {t[f]:.3f} ms ({t['0'] / t[f]:.3f})" for f in FLAGS) + f"; floor {row['floor_ms']:.2f}",
                flush=True)
        del e
        import gc
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernels", type=int, default=400)
    ap.add_argument("--engine", action="store_true", help="engine steps with and without PDL")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("devcheck_pdl: needs a CUDA GPU", file=sys.stderr)
        return 2
    if a.engine:
        rows = engine_ab(a.reps)
        if a.out:
            from kernels.timing import provenance
            with open(a.out, "w") as f:
                json.dump(dict(provenance=provenance("python -m kernels.engine.devcheck_pdl --engine"), rows=rows), f,
                          indent=1)
        return 0
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
        from kernels.timing import provenance
        with open(a.out, "w") as f:
            json.dump(dict(provenance=provenance("python -m kernels.engine.devcheck_pdl"), gemv_ms=t_gemv,
                           kernels=a.kernels, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
