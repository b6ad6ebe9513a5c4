"""GPU check of the chunk cache's fused fill (issue 32, kernels/cachefill.py), and the cache-only design.

    PYTHONPATH=. python3 -m devtools.devcheck_cachefill [--out FILE.json] [--builds 3] [--reps 5]
        [--host-gib 8] [--points 131072:1,32768:1,131072:60] [--no-profile] [--runs design:fill,...]
        [--transfers 0,1]

(a) one fill, fused against the torch twin (ChunkCache.fill + set_rows), at the engine's shapes (Llama-3-8B:
    8 KV heads, k = 256 chunks of 8, 4x and 8x cache slots, 128K context): timed with CUDA events after
    warm-up, each fill on a fresh random selection (60 % from a hot set). Floor: the bytes a fill must
    touch (the ids, their map entries, the ages and chunk ids of every slot, the plan and rows written)
    at the HBM copy rate of this run.
(b) whole engine steps (kernels/engine/sweep.run_point: CUDA-graph replays), each point `--builds` times
    with a fresh engine and seed: dualdecoder-cache with the fused fill and with the twin's, lru-cache
    (fused), and dualdecoder, compute only and with transfers, at the forced rates below. Each row: step,
    tokens/s, the HBM floor (Engine.floor_bytes) and the step over it; with profiling (one build), one
    replay's kernel time by category (kernels/engine/breakdown.py).

Rates: dualdecoder-cache's are the committed grid's (traces/engine/h200-rates: urgent 0.0444 / churn
0.1271 at 128K, 0.0229 / 0.0730 at 32K, 4x capacity); lru-cache's forced miss is `--lru-miss` (default:
the same churn, the share of a step's selection new against the last one's when the prediction is the
next step's selection).
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys

import torch

from devtools._common import command, context_batches, refusal

POINTS = "131072:1,32768:1,131072:60"
RATES = {131072: (0.0444, 0.1271), 32768: (0.0229, 0.0730)}      # (urgent, churn) at 4x: traces/engine/h200-rates
CACHE_TOKENS = 8192


def fill_rows(hbm, log, reps, rows):
    from ddbench.kernels.engine.chunkcache import CacheShape, ChunkCache
    from ddbench.kernels.timing import event_times
    H, k, C, ctx = 8, 256, 8, 131072
    N = ctx // C
    for B in (1, 16, 60):
        for slots in (4 * k, 8 * k):
            rnd = random.Random(B * slots)
            caches = {f: ChunkCache(CacheShape(1, B, H, N, slots, C, 8, 8, k), "cuda", torch.bfloat16, fused=f)
                      for f in (False, True)}
            hot = rnd.sample(range(N), slots)
            pool = [torch.tensor([[sorted(rnd.sample(hot if rnd.random() < 0.6 else range(N), k)) for _ in range(H)]
                                  for _ in range(B)], dtype=torch.int32, device="cuda") for _ in range(8)]
            step = torch.zeros(1, dtype=torch.int32, device="cuda")
            ok = True
            for t, ids in enumerate(pool[:4]):          # the same fills into both: the states stay equal
                step.fill_(t)
                out = [caches[f].fill_rows(0, ids, step, mul=2, add=1, rows=True) for f in (False, True)]
                same = all(torch.equal(getattr(caches[False], m)[..., :-1], getattr(caches[True], m)[..., :-1])
                           for m in ("slot_of", "chunk_of", "age"))          # [..., -1]: the twin's scatter sink
                ok &= torch.equal(out[0][1], out[1][1]) and same
                ok &= int(out[0][0].count) == int(out[1][0].count)
            t_ms = {}
            for f, c in caches.items():
                it = iter(range(10 ** 9))

                def one(c=c, it=it):
                    j = next(it)
                    c.fill_rows(0, pool[j % len(pool)], step, mul=2, add=1, rows=True)
                t_ms[f] = statistics.median(event_times(one, 30, warmup=5))
            touched = B * H * (k * 4 * 3 + k * 2 + (slots + 1) * 4 * 2 * 2 + 3 * k * 4 + k * C * 4)
            floor_us = touched / (hbm * 1e9) * 1e6
            rows.append(dict(kind="fill", batch=B, heads=H, k=k, slots=slots, context=ctx, ok=bool(ok),
                             fused_us=t_ms[True] * 1e3, twin_us=t_ms[False] * 1e3, floor_us=floor_us,
                             fused_over_floor=t_ms[True] * 1e3 / floor_us, speedup=t_ms[False] / t_ms[True]))
            log(f"fill B={B:3d} slots={slots:5d} ok={ok} fused={t_ms[True] * 1e3:8.1f} us twin={t_ms[False] * 1e3:8.1f} us"
                f" floor={floor_us:6.1f} us x{t_ms[True] * 1e3 / floor_us:.1f}")
            del caches, pool
            torch.cuda.empty_cache()


RUNS = "dualdecoder-cache:fused,dualdecoder-cache:twin,lru-cache:fused,dualdecoder:-"


def engine_rows(points, builds, reps, host_gib, lru_miss, profile, hbm, log, rows, runs=RUNS, xfers=(False, True)):
    from dataclasses import replace

    from ddbench.core.catalog import get_model
    from ddbench.kernels.engine import breakdown
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.engine.points import PointSetup, PointTiming, alloc_host, make_config, run_point
    model = get_model("llama-3-8b")
    weights = Weights.random(model, "cuda", seed=0)
    flat = alloc_host(host_gib)[0]
    for ctx, B in points:
        urgent, churn = RATES[ctx]
        every = {("dualdecoder-cache", "fused"): (urgent, churn), ("dualdecoder-cache", "twin"): (urgent, churn),
                 ("lru-cache", "fused"): (lru_miss if lru_miss is not None else churn, None),
                 ("dualdecoder", "-"): (0.12, None)}
        for design, fill in (tuple(r.split(":")) for r in runs.split(",")):
            miss, ch = every[(design, fill)]
            for transfers in xfers:
                for rep in range(builds):
                    cache = design.endswith("cache")
                    timing = PointTiming(miss, transfers, reps=reps, seed=rep)
                    cfg = make_config(ctx, B, timing, cache_tokens=CACHE_TOKENS if cache else None, churn_rate=ch)
                    cfg = replace(cfg, fused_fill=fill != "twin")
                    prof = profile and rep == 0
                    r = run_point(PointSetup(model, weights, flat if transfers else None, hbm, log=log), design, ctx, B,
                                  timing, cfg=cfg, keep=prof)
                    row, e = r if isinstance(r, tuple) else (r, None)
                    out = dict(kind="engine", design=design, fill=fill, context=ctx, batch=B, transfers=int(transfers),
                               build=rep, miss_rate=miss, churn_rate=ch, cache_tokens=CACHE_TOKENS if cache else None,
                               status=row["status"])
                    if row["status"] == "ok":
                        out.update({k: row[k] for k in ("step_ms", "step_ms_min", "step_ms_max", "tok_s", "floor_ms",
                                                        "step_over_floor", "link_mib", "urgent_mib", "prefetch_mib",
                                                        "peak_gib")})
                    if row["status"] == "ok":
                        log(f"{design:18s} fill={fill:5s} ctx={ctx:6d} B={B:3d} xfer={int(transfers)} build={rep}"
                            f" step={row['step_ms']:8.3f} ms floor={row['floor_ms']:7.3f} x{row['step_over_floor']:.2f}")
                    if e is not None:
                        s = breakdown.summarize(row, breakdown.profile_replay(e, e.graph_steps), e.graph_steps, hbm)
                        out.update(busy_ms=s["busy_ms"], categories=s["categories"], top_kernels_ms=s["top_kernels_ms"])
                        cats = " ".join(f"{k}={v['ms']:.2f}" for k, v in s["categories"].items())
                        log(f"   {design} fill={fill} xfer={int(transfers)} | {cats}")
                    rows.append(out)
                    del e, r
                    gc.collect()
                    torch.cuda.empty_cache()


class Rows(list):
    """The rows so far, rewritten to --out after each one (a run cut by its time limit keeps what it measured)."""

    def __init__(self, out, prov, hbm):
        super().__init__()
        self.out, self.head = out, dict(provenance=prov, hbm_copy_gbps=hbm)

    def append(self, row):
        super().append(row)
        if self.out:
            with open(self.out, "w", encoding="utf-8") as f:
                json.dump(dict(self.head, rows=list(self)), f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--points", default=POINTS)
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--host-gib", type=float, default=8.0)
    ap.add_argument("--lru-miss", type=float)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--skip-fill", action="store_true")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--runs", default=RUNS, help=f"design:fill pairs of the engine part (default {RUNS})")
    ap.add_argument("--transfers", default="0,1", help="0 (compute only), 1 (with transfers) or both (default 0,1)")
    a = ap.parse_args(argv)
    why = refusal("devcheck_cachefill", a.reps)
    known = set(RUNS.split(","))
    if not why and (not a.runs or any(r not in known for r in a.runs.split(","))):
        why = f"devcheck_cachefill: --runs takes design:fill pairs among {RUNS}"
    if not why and (not a.transfers or any(x not in ("0", "1") for x in a.transfers.split(","))):
        why = "devcheck_cachefill: --transfers takes 0, 1 or 0,1"
    if not why:
        pts, why = context_batches("devcheck_cachefill", a.points, RATES)
    if why:
        print(why, file=sys.stderr)
        return 2
    from ddbench.kernels.engine.sweep import hbm_gbps
    from ddbench.kernels.timing import provenance
    hbm = hbm_gbps()
    print(f"HBM copy {hbm:.0f} GB/s", flush=True)
    log = lambda t: print(t, flush=True)   # noqa: E731
    rows = Rows(a.out, provenance(command("devcheck_cachefill", argv)), hbm)
    if not a.skip_fill:
        fill_rows(hbm, log, a.reps, rows)
    if not a.skip_engine:
        engine_rows(pts, a.builds, a.reps, a.host_gib, a.lru_miss, not a.no_profile, hbm, log, rows, a.runs,
                    tuple(x == "1" for x in a.transfers.split(",")))
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
