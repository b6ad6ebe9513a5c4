"""Per-row candidate selection against the seg top-k: kernels alone and whole engine steps (H200).

    PYTHONPATH=. python -m kernels.engine.devcheck_rowcand [--reps 3] [--out FILE.json] [--skip-engine | --split]

(a) Kernels: landmark selection of Llama-3-8B heads (32 q / 8 KV, d = 128), budget 256 chunks, one and
    two query tokens, fastselect.select_topk (pass 1 writes every score; "seg" top-k) against
    rowcand.select_topk_rowcand, on fresh random bf16 inputs: the ids compared (rows that differ), then
    CUDA-graph timings (2 input sets alternated, median of 20 replays), `--reps` times interleaved.
--split: instead, the device time of each kernel of both methods (torch.profiler, 5 eager calls) at 32K,
    batch 16 and 128K, batch 64, two tokens.
(b) Engine: DualDecoder's and its single-token step, compute only (CUDA graph, the model's own
    selection), each engine built once and captured with `Engine.rowcand` off and on in turn, `--reps`
    times; dual / single with each method.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

KERNEL_POINTS = ((32768, 1), (32768, 16), (131072, 16), (131072, 64))
ENGINE_POINTS = ((32768, 16), (131072, 16), (131072, 64))


def kernels(reps, rows):
    from kernels.engine import fastselect, rowcand
    from kernels.timing import capture_graph, event_times
    g = torch.Generator(device="cuda").manual_seed(5)
    for ctx, B in KERNEL_POINTS:
        N, k = ctx // 8, 256
        for nq in (1, 2):
            sets = [(torch.randn(B, nq, 32, 128, device="cuda", generator=g).to(torch.bfloat16),
                     torch.randn(B, 8, N, 128, device="cuda", generator=g).to(torch.bfloat16)) for _ in range(2)]
            a = fastselect.select_topk(*sets[0], k)
            b = rowcand.select_topk_rowcand(*sets[0], k)
            diff = int((a != b).any(-1).sum())
            fns = {"seg": lambda q, lm: fastselect.select_topk(q, lm, k),
                   "rowcand": lambda q, lm: rowcand.select_topk_rowcand(q, lm, k)}
            for rep in range(reps):
                t = {}
                for name, fn in fns.items():
                    calls = [lambda s=s, fn=fn: fn(*s) for s in sets]
                    for c in calls:
                        c()
                    graph = capture_graph(lambda: [c() for c in calls for _ in range(2)], calls)
                    t[name] = statistics.median(event_times(graph.replay, 20, warmup=3, per_call=4))
                rows.append(dict(part="kernels", context=ctx, batch=B, nq=nq, rep=rep, seg_ms=t["seg"],
                                 rowcand_ms=t["rowcand"], seg_over_rowcand=t["seg"] / t["rowcand"],
                                 rows_differing=diff, rows=B * nq * 8))
                print(f"kernels {ctx:6d} B={B:3d} nq={nq} rep {rep}: seg {t['seg'] * 1e3:8.1f} us, rowcand "
                      f"{t['rowcand'] * 1e3:8.1f} us ({t['seg'] / t['rowcand']:.3f}); rows differing {diff} of "
                      f"{B * nq * 8}", flush=True)
            del sets
            torch.cuda.empty_cache()


def kernel_split(rows):
    """Device time per kernel (torch.profiler, 5 eager calls each) of both methods at two points."""
    from torch.profiler import ProfilerActivity, profile
    from kernels.engine import fastselect, rowcand
    g = torch.Generator(device="cuda").manual_seed(6)
    for ctx, B in ((32768, 16), (131072, 64)):
        q = torch.randn(B, 2, 32, 128, device="cuda", generator=g).to(torch.bfloat16)
        lm = torch.randn(B, 8, ctx // 8, 128, device="cuda", generator=g).to(torch.bfloat16)
        for name, fn in (("seg", lambda: fastselect.select_topk(q, lm, 256)),
                         ("rowcand", lambda: rowcand.select_topk_rowcand(q, lm, 256))):
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
            for ev in p.key_averages():
                us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
                if us > 0:
                    rows.append(dict(part="split", context=ctx, batch=B, nq=2, method=name, kernel=ev.key,
                                     us_per_call=us / 5))
                    print(f"split {ctx:6d} B={B:3d} {name:8s} {ev.key[:40]:40s} {us / 5:9.1f} us per call", flush=True)
        del q, lm
        torch.cuda.empty_cache()


def engine(reps, rows, hbm):
    from kernels.engine.engine_ab import engine_ab
    from kernels.engine.rowcand import rowcand_fits

    def fits(e):
        return rowcand_fits(e.B, e.H, e.nq, e.Hq // e.H, e.N, e.kc, device=e.dev)
    engine_ab(rows, hbm, ENGINE_POINTS, ("dualdecoder-single", "dualdecoder"),
              {"seg": lambda e: setattr(e, "rowcand", False), "rowcand": lambda e: setattr(e, "rowcand", True)},
              reps, fits)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--split", action="store_true", help="only the per-kernel split (torch.profiler)")
    a = ap.parse_args(argv)
    from kernels.timing import devcheck_refusal
    if (err := devcheck_refusal("devcheck_rowcand", a.reps)):
        print(err, file=sys.stderr)
        return 2
    from kernels.engine.bench import hbm_gbps
    from kernels.timing import provenance
    hbm = hbm_gbps()
    rows = []
    if a.split:
        kernel_split(rows)
    else:
        kernels(a.reps, rows)
    if not a.skip_engine and not a.split:
        engine(a.reps, rows, hbm)
    if a.out:
        from ddbench.core.io import write_json
        write_json(a.out, dict(provenance=provenance("python -m kernels.engine.devcheck_rowcand"), hbm_copy_gbps=hbm,
                               rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
