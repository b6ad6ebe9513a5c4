"""Which weight layout runs the engine's decode GEMMs closest to their HBM floor? (H200)

    PYTHONPATH=. python3 -m devtools.devcheck_gemm [--out FILE.json]

Llama-3-8B's four linear layers (qkv 4096x6144, o 4096x4096, gate_up 4096x28672, down 14336x4096),
bf16, at M = 1, 16, 64, 128 rows (batch x query tokens): `x @ w` with w stored [K, N] (the engine's layout)
against `x @ w.T` with w stored [N, K] (nn.Linear's), and F.linear on the latter. Each timing is a
CUDA graph of 8 GEMMs over 8 distinct weights (no L2 reuse), median of 20 replays; floor = weight
bytes / the device-to-device copy rate measured in the same run. 3 repetitions per point.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
MS = (1, 16, 64, 128)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    from devtools._common import command, refusal
    if (err := refusal("devcheck_gemm", a.reps)):
        print(err, file=sys.stderr)
        return 2
    from ddbench.kernels.engine.sweep import hbm_gbps
    from ddbench.kernels.timing import capture_graph, event_times
    hbm = hbm_gbps()
    dev, bf = torch.device("cuda"), torch.bfloat16
    rows = []
    for name, (K, N) in SHAPES.items():
        w_kn = [torch.randn(K, N, device=dev, dtype=bf) for _ in range(8)]
        w_nk = [w.t().contiguous() for w in w_kn]
        floor = K * N * 2 / (hbm * 1e9) * 1e3
        for M in MS:
            x = torch.randn(M, K, device=dev, dtype=bf)
            ok = torch.allclose((x @ w_kn[0]).float(), (x @ w_nk[0].t()).float(), rtol=2e-2, atol=2e-1)
            variants = {"kn": lambda: [x @ w for w in w_kn], "nk": lambda: [x @ w.t() for w in w_nk],
                        "linear": lambda: [torch.nn.functional.linear(x, w) for w in w_nk]}
            for rep in range(a.reps):
                t = {}
                for v, fn in variants.items():
                    g = capture_graph(fn, [fn])
                    t[v] = statistics.median(event_times(g.replay, 20, warmup=3)) / 8
                rows.append(dict(layer=name, K=K, N=N, M=M, rep=rep, floor_ms=floor, same=ok,
                                 **{f"{v}_ms": t[v] for v in t}, **{f"{v}_over_floor": t[v] / floor for v in t}))
                print(f"{name:8s} M={M:4d} rep {rep}: " + "  ".join(f"{v} {t[v] * 1e3:7.1f} us ({t[v] / floor:.2f}x)"
                                                                     for v in t) + f"  floor {floor * 1e3:.1f} us",
                      flush=True)
    if a.out:
        from ddbench.core.io import write_json
        from ddbench.kernels.timing import provenance
        write_json(a.out, dict(provenance=provenance(command("devcheck_gemm", argv)), hbm_copy_gbps=hbm,
                               rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
