"""GPU check: the sparse attention through a chunk cache's `rows` against the gathered buffer, by KV splits.

    PYTHONPATH=. python3 -m devtools.devcheck_rows_splits [--batches 4 8 16 32 64] [--splits 1 2 4 8] [--out FILE.json]

`bench kernels --peer flashinfer` (traces/kernels/h200/peer-flashinfer.csv) measured our kernel through
`rows` at 51 % of its HBM floor at batch 16 where the gathered buffer reaches 86 %, both at the automatic
split count (kernels/attention.py auto_splits: one program per (request, KV head) there). This times both
layouts at each split count (kernels/peerbench.py AttnCase: Llama-3-8B heads, 2,048 selected tokens of a
32K pool, 2 query tokens, inputs rotated past L2), CUDA graphs, CUDA events after warm-up, 3 repeats
(min / median / max), each against the floor of the K/V bytes over the same run's HBM copy rate; the
outputs of every split count are checked against the automatic one's (fresh random inputs).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from devtools._common import command, refusal


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    why = refusal("devcheck_rows_splits", a.reps)
    if why:
        print(why, file=sys.stderr)
        return 2
    from ddbench.kernels.attention import CacheView, auto_splits, dual_sparse_attention
    from ddbench.kernels.microbench import ceilings
    from ddbench.kernels.peerbench import H, AttnCase
    from ddbench.kernels.timing import time_cuda
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    hbm = ceilings(dev)["hbm_copy_gbps_rw"]
    out = {"command": command("devcheck_rows_splits", argv), "hbm_copy_gbps": hbm, "points": []}
    for B in a.batches:
        case = AttnCase(B, 32768, 2, dev, gen)
        floor_ms = case.floor_bytes / hbm / 1e6
        auto = auto_splits(B, H, case.rows[0].shape[2], dev)
        ref = dual_sparse_attention(case.q[0], *case.pool(0), case.lengths, cache=CacheView(case.rows[0])).float()
        for layout in ("rows", "gathered"):
            for sp in a.splits:
                def call(s, sp=sp, layout=layout):
                    if layout == "rows":
                        return dual_sparse_attention(case.q[s], *case.pool(s), case.lengths,
                                                     cache=CacheView(case.rows[s]), splits=sp)
                    return dual_sparse_attention(case.q[s], case.gk[s], case.gv[s], case.lengths, splits=sp)
                err = float((call(0).float() - ref).norm() / ref.norm())
                ts = [time_cuda([lambda s=s: call(s) for s in range(case.S)], inner=3, reps=15) for _ in range(a.reps)]
                p = dict(batch=B, layout=layout, splits=sp, auto_splits=auto, ms_min=min(ts), ms=statistics.median(ts),
                         ms_max=max(ts), pct_of_floor=100 * floor_ms / statistics.median(ts), rel_err_vs_auto_rows=err)
                out["points"].append(p)
                print(f"B={B:3d} {layout:8s} splits={sp:2d} (auto {auto}) {p['ms'] * 1e3:7.1f} us"
                      f" [{p['ms_min'] * 1e3:.1f}-{p['ms_max'] * 1e3:.1f}] {p['pct_of_floor']:5.1f} % of floor"
                      f" err {err:.1e}", flush=True)
        del case
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
