"""Each selection index's whole selection (kernels/indexkernels.py: pass 1, and pass 2 for two levels, with the
engine's top-k) against its HBM floor, at Llama-3-8B's shapes, over contexts and batches.

    PYTHONPATH=. python3 -m devtools.gpu_index_bench [--out FILE.csv] [--points 131072:1,131072:16,...]
        [--specs 'flat;fp8;two-level:8,1,int4'] [--reps 3]

Each (context, batch, index) is timed `--reps` times (each a CUDA-event median of 15 graph replays of 3
calls, kernels/timing.time_cuda) on fresh random keys and queries; the floor is ddbench.core.index
.selection_bytes over the HBM copy rate measured at the start of the run. Rows: kernels/microbench.py's
columns plus context and rep; the file's last columns are the run's provenance.
"""
from __future__ import annotations

import argparse
import csv
import sys

from devtools._common import command, context_batches, refusal

SPECS = "flat;fp8;int4;two-level:8;two-level:8,1,fp8;two-level:8,1,int4;two-level:16,1,int4"   # ;-separated
POINTS = "32768:1,32768:16,32768:64,32768:95,131072:1,131072:16,131072:60,131072:64,131072:90"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu-index-bench.csv")
    ap.add_argument("--points", default=POINTS)
    ap.add_argument("--specs", default=SPECS)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    err = refusal("gpu_index_bench", a.reps)
    pts = None
    if not err:
        pts, err = context_batches("gpu_index_bench", a.points)
    if err:
        print(err, file=sys.stderr)
        return 2
    import torch
    from ddbench.core.index import parse_index, selection_bytes
    from ddbench.kernels.indexkernels import build_index, index_select
    from ddbench.kernels.microbench import Rows, ceilings
    from ddbench.kernels.timing import provenance, time_cuda
    Hq, H, d, k, nq = 32, 8, 128, 256, 2          # Llama-3-8B, the 2048-token budget in chunks of 8, dual token
    hbm = ceilings(torch.device("cuda"))["hbm_copy_gbps_rw"]
    rows, extra = Rows(), []
    for T, B in pts:
        N = T // 8
        keys = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
        for name in filter(None, a.specs.split(";")):
            spec = parse_index(name)
            ix = build_index(keys, spec)
            nbytes = B * H * selection_bytes(spec, N, d, k, score_rows=nq * Hq // H, tokens=nq)
            for rep in range(a.reps):
                q = torch.randn(B, nq, Hq, d, device="cuda", dtype=torch.bfloat16)
                t = time_cuda(lambda: index_select(q, ix, k), inner=3, reps=15)
                rows.add("index", spec.name, B, f"{N} landmarks, nq={nq}, k={k}", nbytes, t, nbytes / hbm / 1e6,
                         None if spec.name == "flat" else "flat",
                         notes=f"index {ix.nbytes / B / 2 ** 20:.2f} MiB per request and layer")
                extra.append(dict(context=T, rep=rep))
            del ix
        del keys
        torch.cuda.empty_cache()
    prov = provenance(command("gpu_index_bench", argv))
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*rows[0].keys(), "context", "rep", "hbm_copy_gbps_rw", *prov.keys()])
        w.writeheader()
        for r, x in zip(rows, extra):
            w.writerow({**r, **x, "hbm_copy_gbps_rw": round(hbm, 1), **prov})
    print(f"gpu_index_bench: wrote {a.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
