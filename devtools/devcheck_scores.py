"""fp16 against fp32 stored scores in the engine's selection: kernels alone and whole steps (H200).

    PYTHONPATH=. python3 -m devtools.devcheck_scores [--reps 3] [--out FILE.json] [--skip-engine | --topk-grid]

Pass 1 stores the raw (log2-domain) scores of the group's rows, which the top-k reads back: with two
query tokens 8 rows x N per KV head, the selection's largest traffic after the landmarks. fp16 halves
it (fastselect.SCORES).
(a) Kernels: landmark selection (fastselect.select_topk) of Llama-3-8B heads (32 q / 8 KV, d = 128),
    budget 256 chunks, one and two tokens, and SpeCache's (specache_select_topk, 2-bit keys, chunk 8),
    on fresh random bf16 inputs: the share of ids both dtypes choose, then CUDA-graph timings (2 input
    sets alternated, median of 20 replays), `--reps` times interleaved.
(b) Engine: DualDecoder, its single-token step and SpeCache, compute only (CUDA graph, the model's own
    selection, Llama-3-8B with random weights), each engine built once, then `--reps` times captured
    with its selection ops storing fp32 and fp16 scores in turn (`with_scores`), each the median of 5
    replays of 2 steps; dual / single with each.
--topk-grid: instead, the seg top-k's segment, cuts and warps on fp16 pass-1 output (see topk_grid).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import statistics
import sys

import torch

from devtools._common import command, refusal

KERNEL_POINTS = ((32768, 16), (131072, 16), (131072, 64))
ENGINE_POINTS = ((32768, 64), (131072, 16), (131072, 64))
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def _shared(a, b, k):
    """Mean share of a row's k ids that both selections hold."""
    hits = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).sum(-1)
    return float(hits.float().mean()) / k


def kernels(reps, rows):
    from ddbench.kernels.engine import fastselect
    from ddbench.kernels.specache import random_quant_keys
    from ddbench.kernels.timing import capture_graph, event_times
    g = torch.Generator(device="cuda").manual_seed(7)
    k = 256
    for ctx, B in KERNEL_POINTS:
        N = ctx // 8
        for method, nq in (("landmarks", 1), ("landmarks", 2), ("specache", 2)):
            if method == "landmarks":
                sets = [(torch.randn(B, nq, 32, 128, device="cuda", generator=g).to(torch.bfloat16),
                         torch.randn(B, 8, N, 128, device="cuda", generator=g).to(torch.bfloat16)) for _ in range(2)]

                def fn(s, dt):
                    return fastselect.select_topk(*s, k, scores=dt)
            else:
                sets = [(torch.randn(B, nq, 32, 128, device="cuda", generator=g).to(torch.bfloat16),
                         random_quant_keys(B, 8, ctx, 128, generator=g)) for _ in range(2)]

                def fn(s, dt):
                    return fastselect.specache_select_topk(*s, 8, k, scores=dt)
            shared = _shared(fn(sets[0], torch.float32), fn(sets[0], torch.float16), k)
            for rep in range(reps):
                t = {}
                for name, dt in DTYPES.items():
                    calls = [lambda s=s, dt=dt: fn(s, dt) for s in sets]
                    graph = capture_graph(lambda: [c() for c in calls for _ in range(2)], calls)
                    t[name] = statistics.median(event_times(graph.replay, 20, warmup=3, per_call=4))
                rows.append(dict(part="kernels", method=method, context=ctx, batch=B, nq=nq, rep=rep,
                                 fp32_ms=t["fp32"], fp16_ms=t["fp16"], fp32_over_fp16=t["fp32"] / t["fp16"],
                                 ids_shared=shared))
                print(f"kernels {method:9s} {ctx:6d} B={B:3d} nq={nq} rep {rep}: fp32 {t['fp32'] * 1e3:8.1f} us, "
                      f"fp16 {t['fp16'] * 1e3:8.1f} us ({t['fp32'] / t['fp16']:.3f}); ids shared {shared:.4f}",
                      flush=True)
            del sets
            torch.cuda.empty_cache()


def topk_grid(rows):
    """The seg top-k's parameters on fp16 pass-1 output (real landmark scores), two tokens with the
    fused miss plan as the engine runs it, and one token: every (segment, cuts, warps) once, then the
    default and the fastest three again, 3 times interleaved."""
    import itertools
    from ddbench.kernels.engine import fastselect
    from ddbench.kernels.engine.transfer import plan_buffers
    from ddbench.kernels.timing import capture_graph, event_times
    g = torch.Generator(device="cuda").manual_seed(8)
    k = 256
    for ctx, B, nq in ((131072, 64, 2), (131072, 64, 1), (32768, 64, 2), (131072, 16, 2)):
        N = ctx // 8
        q = torch.randn(B, nq, 32, 128, device="cuda", generator=g).to(torch.bfloat16)
        lm = torch.randn(B, 8, N, 128, device="cuda", generator=g).to(torch.bfloat16)
        sc, pml, G = fastselect.landmark_pass1(q, lm)
        pred = torch.rand(B * 8, N, device="cuda", generator=g).topk(k).indices.sort(-1).values
        pred = pred.to(torch.int32).view(B, 8, k)
        plan = (pred, plan_buffers(B, 8, k, q.device)) if nq == 2 else None
        outs = tuple(torch.empty(B, 8, k, device="cuda", dtype=torch.int32) for _ in range(nq))
        want = fastselect.topk_from_scratch(sc, pml, fastselect.TopkShape(B, 8, nq, G, N, k))

        def timed(cfg):
            fn = lambda: fastselect.topk_from_scratch(sc, pml, fastselect.TopkShape(B, 8, nq, G, N, k), outs,  # noqa: E731
                                                      how=fastselect.TopkMethod(**cfg), plan=plan)
            fn()
            same = all(torch.equal(o, want[:, t]) for t, o in enumerate(outs))
            graph = capture_graph(lambda: [fn() for _ in range(4)], [fn])
            return statistics.median(event_times(graph.replay, 20, warmup=3, per_call=4)), same

        grid = [dict(seg=s, cuts=c, num_warps=w) for s, c, w in itertools.product((2048, 4096, 8192), (1, 2, 3), (4, 8))]
        first = []
        for cfg in [{}] + grid:
            try:
                first.append((timed(cfg)[0], cfg))
            except Exception as exc:  # noqa: BLE001  (a config that does not compile or fit is recorded)
                rows.append(dict(part="topk-grid", context=ctx, batch=B, nq=nq, config=str(cfg),
                                 error=str(exc).splitlines()[0][:200]))
        best = [c for _, c in sorted(first, key=lambda x: x[0]) if c][:3]
        for rep in range(3):
            for cfg in [{}] + best:
                ms, same = timed(cfg)
                rows.append(dict(part="topk-grid", context=ctx, batch=B, nq=nq, config=str(cfg or "default"),
                                 rep=rep, ms=ms, same_ids=same))
                print(f"topk-grid {ctx:6d} B={B:3d} nq={nq} {str(cfg or 'default'):45s} rep {rep}: "
                      f"{ms * 1e3:8.1f} us  same ids {same}", flush=True)
        del q, lm, sc, pml
        torch.cuda.empty_cache()


def with_scores(dt):
    """fn(engine): the engine's selection ops (landmarks and SpeCache) store pass 1's scores in `dt`
    (the engine itself always uses fastselect.SCORES)."""
    from ddbench.kernels.engine import fastselect

    def apply(e):
        e.ops = dataclasses.replace(e.ops, select=functools.partial(fastselect.select_topk, scores=dt),
                                    spec_select=functools.partial(fastselect.specache_select_topk, scores=dt))
    return apply


def engine(reps, rows, hbm, points=ENGINE_POINTS, designs=("dualdecoder-single", "dualdecoder", "specache")):
    """Same-run A/B of whole steps: per point and design one engine, then `reps` times each dtype in
    turn applied, captured and timed. One row per (design, point, repetition), and one dual / single
    row per repetition where both DualDecoder steps ran."""
    from ddbench.core.catalog import get_model
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.engine.points import PointSetup, PointTiming, run_point
    from ddbench.kernels.timing import event_times
    model = get_model("llama-3-8b")
    weights = Weights.random(model, "cuda", seed=0)
    variants = {name: with_scores(dt) for name, dt in DTYPES.items()}
    for ctx, B in points:
        t = {}
        for design in designs:
            r = run_point(PointSetup(model, weights, hbm=hbm), design, ctx, B,
                          PointTiming(miss_rate=None, transfers=False, reps=5), keep=True)
            if not isinstance(r, tuple):
                print(f"engine {design} {ctx}:{B}: {r['status']}", flush=True)
                continue
            row, e = r
            for rep in range(reps):
                for name, apply in variants.items():
                    apply(e)
                    e.capture(2)
                    t[(design, name, rep)] = statistics.median(event_times(e.replay, 5, warmup=1, per_call=2))
                ms = {n: t[(design, n, rep)] for n in variants}
                rows.append(dict(part="engine", design=design, context=ctx, batch=B, rep=rep,
                                 **{f"{n}_ms": v for n, v in ms.items()}, floor_ms=row["floor_ms"]))
                print(f"engine {design:18s} {ctx:6d} B={B:3d} rep {rep}: "
                      + ", ".join(f"{n} {v:.3f} ms" for n, v in ms.items()) + f", floor {row['floor_ms']:.3f} ms",
                      flush=True)
            del e, r
            gc.collect()
            torch.cuda.empty_cache()
        for rep in range(reps):
            if all((d, n, rep) in t for d in ("dualdecoder-single", "dualdecoder") for n in variants):
                ratio = {n: t[("dualdecoder", n, rep)] / t[("dualdecoder-single", n, rep)] for n in variants}
                rows.append(dict(part="dual/single", context=ctx, batch=B, rep=rep, **ratio))
                print(f"engine dual/single {ctx:6d} B={B:3d} rep {rep}: "
                      + ", ".join(f"{n} {v:.3f}" for n, v in ratio.items()), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--topk-grid", action="store_true", help="only the seg top-k's parameter grid on fp16 scores")
    a = ap.parse_args(argv)
    if (err := refusal("devcheck_scores", a.reps)):
        print(err, file=sys.stderr)
        return 2
    from ddbench.kernels.engine.sweep import hbm_gbps
    from ddbench.kernels.timing import provenance
    hbm = hbm_gbps()
    rows = []
    if a.topk_grid:
        topk_grid(rows)
    else:
        kernels(a.reps, rows)
    if not a.skip_engine and not a.topk_grid:
        engine(a.reps, rows, hbm)
    if a.out:
        from ddbench.core.io import write_json
        write_json(a.out, dict(provenance=provenance(command("devcheck_scores", argv)), hbm_copy_gbps=hbm,
                               rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
