"""The fused chunk-cache fill's sort keys and warps (H200): int64 (age, slot) keys against int32 keys of the
age relative to the stamp (kernels/cachefill.py KEY32), at the engine's shapes.

    PYTHONPATH=. python3 -m devtools.devcheck_fill_keys [--reps 3] [--out FILE.json]

Llama-3-8B's 8 KV heads, k = 256 chunks of 8, 128K context, a cache of 1024 or 2048 slots per (request, KV
head): each variant fills 8 layers twice per CUDA-graph replay (two selections per layer, the second
sharing 90 % of the first's chunks, so every fill evicts), timed as the median of 15 replays / 16 fills,
`--reps` times interleaved. Every variant starts from the same state and fills the same ids; its maps,
ages, plan items and rows after the first replay are compared with the int64 4-warp variant's (`same`).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys

import torch

from devtools._common import command, refusal

VARIANTS = (("int64", False, 4), ("int64", False, 8), ("int32", True, 2), ("int32", True, 4), ("int32", True, 8))
L, H, K, C, N = 8, 8, 256, 8, 16384


def _ids(rnd, B, hot, base=None):
    out = []
    for b in range(B):
        row = []
        for h in range(H):
            if base is None:
                row.append(sorted(rnd.sample(hot, K)))
            else:               # 90 % of the base's chunks, the rest new
                keep = rnd.sample(base[b][h], K - K // 10)
                have = set(keep)
                new = [c for c in rnd.sample(range(N), 2 * K) if c not in have][:K // 10]
                row.append(sorted(keep + new))
        out.append(row)
    return out


def point(B, slots, reps):
    from ddbench.kernels.cachefill import fill_fused
    from ddbench.kernels.engine.chunkcache import ChunkCache
    from ddbench.kernels.timing import time_cuda
    rnd = random.Random(B * 7 + slots)
    hot = rnd.sample(range(N), slots)
    a = [_ids(rnd, B, hot) for _ in range(L)]
    sets = [(torch.tensor(x, dtype=torch.int32, device="cuda"), torch.tensor(_ids(rnd, B, hot, x), dtype=torch.int32,
                                                                               device="cuda")) for x in a]
    stamp = torch.ones(1, dtype=torch.int32, device="cuda")
    caches, fns = {}, {}
    for name, key32, warps in VARIANTS:
        c = ChunkCache(L, B, H, N, slots, C, 8, 8, "cuda", torch.bfloat16, K, fused=True)
        plan = c._plan("urgent", K)

        def fill(c=c, plan=plan, key32=key32, warps=warps):
            for layer, (x, y) in enumerate(sets):
                fill_fused(c, layer, x, stamp, plan, mul=2, add=1, rows=c.rows, key32=key32, num_warps=warps)
                fill_fused(c, layer, y, stamp, plan, mul=2, add=1, rows=c.rows, key32=key32, num_warps=warps)
        fill()
        torch.cuda.synchronize()
        caches[(name, warps)] = (c, sorted(zip(plan.bh[:int(plan.count)].tolist(), plan.chunk[:int(plan.count)].tolist(),
                                               plan.slot[:int(plan.count)].tolist())), c.rows.clone())
        fns[(name, warps)] = fill
    ref = caches[("int64", 4)]
    times = {v: [] for v in fns}
    for _ in range(reps):
        for v, f in fns.items():
            times[v].append(time_cuda(f, inner=1, reps=15, warmup=1) / (2 * L) * 1e3)
    rows = []
    for (name, warps), ts in times.items():
        c, items, r = caches[(name, warps)]
        same = all(torch.equal(getattr(c, m), getattr(ref[0], m)) for m in ("slot_of", "chunk_of", "age")) \
            and items == ref[1] and torch.equal(r, ref[2])
        rows.append(dict(batch=B, slots=slots, keys=name, warps=warps, us=statistics.median(ts), us_min=min(ts),
                         us_max=max(ts), same=same))
        print(f"b{B} slots {slots} {name} {warps} warps: {rows[-1]['us']:.1f} us ({min(ts):.1f}-{max(ts):.1f})"
              f" same {same}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    why = refusal("devcheck_fill_keys", a.reps)
    if why:
        print(why, file=sys.stderr)
        return 2
    from ddbench.kernels.timing import provenance
    rows = []
    for B in (1, 16, 60, 79):
        for slots in (1024, 2048):
            rows += point(B, slots, a.reps)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(dict(provenance=provenance(command("devcheck_fill_keys", argv)), rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
