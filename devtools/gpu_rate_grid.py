"""Engine steps over a grid of forced rates, in one process (one seed): the surface that the simulator is
checked against, whatever rate set a question brings.

    PYTHONPATH=. python3 -m devtools.gpu_rate_grid [--out DIR] [--seed 0] [--model llama-3-8b] [--context 131072]
        [--cache POINTS] [--shadowkv POINTS] [--dualdecoder POINTS] [--replays 3] [--host-gib 8]

POINTS are `;`-separated:
  --cache        BATCH:URGENT:CHURN        dualdecoder-cache@8192 (urgent share and churn of the budget per step)
  --shadowkv     BATCH:MISS                shadowkv (misses: 1 - reuse)
  --dualdecoder  BATCH:MISS                dualdecoder (urgent share)
Each point is built once in this process (kernels/engine/points.run_point: CUDA-graph replays, with
transfers) with the weights, host KV and forced draws of `--seed`; separate-process builds are separate
invocations with other seeds. Writes DIR/rows-s<seed>.jsonl (one engine row per point, with
`rate_grid` = the forced rates as given and the seed) and prints one line a point.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from devtools._common import command, refusal


def _points(text, fields):
    out = []
    for p in filter(None, (x.strip() for x in (text or "").split(";"))):
        v = p.split(":")
        if len(v) != fields:
            raise ValueError(f"gpu_rate_grid: point {p!r} needs {fields} ':'-separated fields")
        try:
            out.append((int(v[0]), *(float(x) for x in v[1:])))
        except ValueError:
            raise ValueError(f"gpu_rate_grid: point {p!r} is not BATCH:RATE[:RATE] numbers") from None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu-rate-grid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--cache", default="")
    ap.add_argument("--shadowkv", default="")
    ap.add_argument("--dualdecoder", default="")
    ap.add_argument("--cache-tokens", type=int, default=8192)
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--host-gib", type=float, default=8.0)
    a = ap.parse_args(argv)
    err = refusal("gpu_rate_grid")
    if not err:
        try:
            todo = [("dualdecoder-cache", b, u, c) for b, u, c in _points(a.cache, 3)]
            todo += [("shadowkv", b, m, None) for b, m in _points(a.shadowkv, 2)]
            todo += [("dualdecoder", b, m, None) for b, m in _points(a.dualdecoder, 2)]
        except ValueError as exc:
            err = str(exc)
    if err:
        print(err, file=sys.stderr)
        return 2
    import torch
    from ddbench.core.catalog import get_model
    from ddbench.kernels.engine import points as pt
    from ddbench.kernels.engine.model import Weights
    model = get_model(a.model)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"rows-s{a.seed}.jsonl")
    flat = pt.alloc_host(a.host_gib, seed=a.seed)[0]
    hbm = pt.hbm_gbps()
    weights = Weights.random(model, "cuda", seed=a.seed)
    cmd = command("gpu_rate_grid")
    with open(path, "a") as fh:
        for design, batch, miss, churn in todo:
            t0 = time.perf_counter()
            cache = design == "dualdecoder-cache"
            timing = pt.PointTiming(miss, reps=a.replays, seed=a.seed)
            cfg = pt.make_config(a.context, batch, timing, cache_tokens=a.cache_tokens if cache else None,
                                 churn_rate=churn)
            cfg.validate(model)
            row = pt.run_point(pt.PointSetup(model, weights, flat, hbm), design, a.context, batch, timing, cfg=cfg)
            row.update(rate_grid=dict(miss=miss, churn=churn), seed=a.seed, process_command=cmd,
                       wall_point_s=time.perf_counter() - t0)
            fh.write(json.dumps(row, default=str) + "\n")
            fh.flush()
            torch.cuda.empty_cache()
    print(f"gpu_rate_grid: wrote {path} ({len(todo)} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
