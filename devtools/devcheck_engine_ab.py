"""GPU check: whole engine steps with an EngineConfig switch off and on (A/B), kept only if the step is faster.

    PYTHONPATH=. python3 -m devtools.devcheck_engine_ab --switch yield_prefetch|rows_two_waves
        [--points 131072:8,131072:16,131072:60] [--builds 3] [--reps 5] [--host-gib 8] [--out FILE.json]

dualdecoder-cache on Llama-3-8B at 4x the budget (8,192 tokens), at the committed grid's rates
(devtools/devcheck_cachefill.RATES). Each point is built `--builds` times per side, each build a fresh engine
and seed, the sides interleaved (off, on, off, on, ...) so that drift hits both; each build is
kernels/engine/sweep.run_point (CUDA-graph replays, CUDA events after warm-up). Per point: min / median /
max step of each side, on/off of the medians, and `faster` only where the on side's slowest build beats
the off side's fastest (an effect larger than the spread).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys

import torch

from devtools._common import command, context_batches, refusal
from devtools.devcheck_cachefill import CACHE_TOKENS, RATES

SWITCHES = ("yield_prefetch", "rows_two_waves")


def _side(rows):
    ok = [r["step_ms"] for r in rows if r["status"] == "ok"]
    return (min(ok), statistics.median(ok), max(ok)) if ok else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--switch", required=True, choices=SWITCHES)
    ap.add_argument("--points", default="131072:8,131072:16,131072:60")
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--host-gib", type=float, default=8.0)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    why = refusal("devcheck_engine_ab", a.reps)
    if not why and a.builds < 1:
        why = "devcheck_engine_ab: --builds must be at least 1"
    if not why:
        pts, why = context_batches("devcheck_engine_ab", a.points, RATES)
    if why:
        print(why, file=sys.stderr)
        return 2
    from ddbench.core.catalog import get_model
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.engine.points import PointSetup, PointTiming, alloc_host, hbm_gbps, make_config, run_point
    from ddbench.kernels.timing import provenance
    model = get_model("llama-3-8b")
    hbm = hbm_gbps()
    weights = Weights.random(model, "cuda", seed=0)
    flat = alloc_host(a.host_gib)[0]
    out = dict(provenance=provenance(command("devcheck_engine_ab", argv)), switch=a.switch, hbm_copy_gbps=hbm,
               rows=[], points=[])
    for ctx, B in pts:
        urgent, churn = RATES[ctx]
        sides = {False: [], True: []}
        for rep in range(a.builds):
            for on in (False, True):
                timing = PointTiming(urgent, reps=a.reps, seed=rep)
                cfg = make_config(ctx, B, timing, cache_tokens=CACHE_TOKENS, churn_rate=churn)
                cfg = dataclasses.replace(cfg, **{a.switch: on})
                r = run_point(PointSetup(model, weights, flat, hbm, log=lambda t: None), "dualdecoder-cache", ctx, B,
                              timing, cfg=cfg)
                row = dict(context=ctx, batch=B, build=rep, on=int(on), status=r["status"],
                           **{k: r.get(k) for k in ("step_ms", "step_ms_min", "step_ms_max", "tok_s", "floor_ms",
                                                    "urgent_mib", "prefetch_mib")})
                sides[on].append(row)
                out["rows"].append(row)
                print(f"{a.switch}={int(on)} ctx={ctx} B={B} build={rep} {r['status']} step={r.get('step_ms')}",
                      flush=True)
                gc.collect()
                torch.cuda.empty_cache()
        off, on = _side(sides[False]), _side(sides[True])
        p = dict(context=ctx, batch=B, off_ms=off, on_ms=on)
        if off and on:
            p.update(on_over_off=on[1] / off[1], faster=on[2] < off[0], slower=on[0] > off[2])
            print(f"ctx={ctx} B={B}: off {off[1]:.3f} [{off[0]:.3f}-{off[2]:.3f}] ms, on {on[1]:.3f}"
                  f" [{on[0]:.3f}-{on[2]:.3f}] ms, on/off {p['on_over_off']:.3f}", flush=True)
        out["points"].append(p)
        if a.out:
            with open(a.out, "w", encoding="utf-8") as f:
                json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
