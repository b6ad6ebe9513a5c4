"""`bench kernels` rows of the smaller selection indexes (issue 47): each index's whole selection (pass 1,
and pass 2 for two levels, with the engine's fused top-k) at Llama-3-8B's 128K shape, beside its HBM floor.

    bench_index(rows, dev, hbm_gbps, quick)   rows kernel "index", variant = the index's name

The floor of a row is ddbench.core.index.selection_bytes over the HBM copy rate measured in the same run:
the landmarks and scales each level reads (two levels: every super-chunk, and each query token's kept
super-chunks' chunks), plus the fp16 scores each pass writes and its top-k reads back. `vs` is the flat
bf16 index (today's selection) at the same batch.
"""

from __future__ import annotations

import torch

from ddbench.core.index import parse_index, selection_bytes
from ddbench.kernels.indexkernels import build_index, index_select
from ddbench.kernels.timing import time_cuda

SPECS = ("flat", "fp8", "int4", "two-level:8", "two-level:8,1,fp8", "two-level:8,1,int4", "two-level:8,2,int4",
         "two-level:16,1,int4")
SHAPE = dict(Hq=32, H=8, d=128, T=131072, k=256, nq=2)       # Llama-3-8B, 128K, 2048-token budget, dual token


def bench_index(rows, dev, hbm_gbps, quick: bool, specs=SPECS):
    Hq, H, d, T, k, nq = (SHAPE[x] for x in ("Hq", "H", "d", "T", "k", "nq"))
    N = T // 8
    for B in ((8,) if quick else (8, 32)):
        keys = torch.randn(B, H, T, d, device=dev, dtype=torch.bfloat16)
        q = torch.randn(B, nq, Hq, d, device=dev, dtype=torch.bfloat16)
        for name in specs:
            spec = parse_index(name)
            ix = build_index(keys, spec)
            nbytes = B * H * selection_bytes(spec, N, d, k, score_rows=nq * Hq // H, tokens=nq)
            t = time_cuda(lambda: index_select(q, ix, k), inner=3, reps=15)
            rows.add("index", spec.name, B, f"{N} landmarks, nq={nq}, k={k}", nbytes, t, nbytes / hbm_gbps / 1e6,
                     None if spec.name == "flat" else "flat",
                     notes=f"index {ix.nbytes / B / 2**20:.1f} MiB per request and layer; floor: landmark + scale"
                           " reads and fp16 scores written and read (core.index.selection_bytes)")
            del ix
        del keys, q
