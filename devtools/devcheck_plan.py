"""The fused miss plan against the separate plan kernel, in whole engine steps (H200).

    PYTHONPATH=. python3 -m devtools.devcheck_plan [--reps 3] [--out FILE.json]

DualDecoder's compute-only step (CUDA graph, the model's own selection: the step plans its misses
against the last prediction) at 32K batch 1 and 16, 128K batch 16 and 64. Each engine is built
once, then captured with the plan fused into the top-k's merge kernel (`Engine.fuse_plan`) and with
the separate `_plan_kernel` in turn, `--reps` times, and timed (median of 5 replays of 2 steps).
The single-token step of the same point is timed once beside it (its ratio is the dual-token cost).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys

import torch

POINTS = ((32768, 1), (32768, 16), (131072, 16), (131072, 64))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from devtools._common import command, refusal
    if (err := refusal("devcheck_plan", a.reps)):
        print(err, file=sys.stderr)
        return 2
    from ddbench.core.catalog import get_model
    from ddbench.kernels.engine.points import PointSetup, PointTiming, hbm_gbps, run_point
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.timing import event_times, provenance
    model, hbm = get_model("llama-3-8b"), hbm_gbps()
    weights = Weights.random(model, "cuda", seed=0)
    rows = []
    for ctx, batch in POINTS:
        setup, timing = PointSetup(model, weights, hbm=hbm), PointTiming(miss_rate=None, transfers=False, reps=5)
        single = run_point(setup, "dualdecoder-single", ctx, batch, timing)
        r = run_point(setup, "dualdecoder", ctx, batch, timing, keep=True)
        if not isinstance(r, tuple) or single.get("status") != "ok":
            print(f"{ctx}:{batch}: {r['status'] if isinstance(r, dict) else single['status']}", flush=True)
            continue
        row, e = r
        if not e.fuse_plan:
            print(f"{ctx}:{batch}: the fused plan does not apply", flush=True)
            continue
        for rep in range(a.reps):
            t = {}
            for fuse in (False, True):
                e.fuse_plan = fuse
                e.capture(2)
                t[fuse] = statistics.median(event_times(e.replay, 5, warmup=1, per_call=2))
            rows.append(dict(context=ctx, batch=batch, rep=rep, separate_ms=t[False], fused_ms=t[True],
                             separate_over_fused=t[False] / t[True], single_ms=single["step_ms"],
                             floor_ms=row["floor_ms"]))
            print(f"{ctx:6d} B={batch:3d} rep {rep}: separate plan {t[False]:.3f} ms, fused {t[True]:.3f} ms "
                  f"({t[False] / t[True]:.3f}); single {single['step_ms']:.3f} ms: dual/single "
                  f"{t[False] / single['step_ms']:.3f} -> {t[True] / single['step_ms']:.3f}", flush=True)
        del e
        gc.collect()
        torch.cuda.empty_cache()
    if a.out:
        from ddbench.core.io import write_json
        write_json(a.out, dict(provenance=provenance(command("devcheck_plan", argv)), hbm_copy_gbps=hbm,
                               rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
