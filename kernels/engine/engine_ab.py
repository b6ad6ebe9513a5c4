"""Same-run A/B of whole engine steps (GPU), shared by the devchecks.

    engine_ab(rows, hbm, points, designs, variants, reps, fits=None)

For each (context, batch) point and design, one engine is built (compute only: no host reads, CUDA
graph, the model's own selection, Llama-3-8B with random weights), then `reps` times every variant in
turn is applied (`variants`: name -> fn(engine)), captured and timed: the median of 5 replays of 2
steps. `fits(engine)` -> False skips a design. Appends one row per (design, point, repetition) with
`<variant>_ms` and the floor, and, where both DualDecoder steps ran, one dual / single row per
repetition with each variant's ratio; prints each as it goes.
"""
from __future__ import annotations

import gc
import statistics

import torch


def engine_ab(rows, hbm, points, designs, variants, reps, fits=None):
    from ddbench.core.catalog import get_model
    from kernels.engine.bench import run_point
    from kernels.engine.model import Weights
    from kernels.timing import event_times
    model = get_model("llama-3-8b")
    weights = Weights.random(model, "cuda", seed=0)
    for ctx, B in points:
        t = {}
        for design in designs:
            r = run_point(model, weights, None, design, ctx, B, miss_rate=None, transfers=False, graph=True,
                          reps=5, hbm=hbm, keep=True)
            if not isinstance(r, tuple):
                print(f"engine {design} {ctx}:{B}: {r['status']}", flush=True)
                continue
            row, e = r
            if fits is not None and not fits(e):
                print(f"engine {design} {ctx}:{B}: the variants do not fit", flush=True)
                continue
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
