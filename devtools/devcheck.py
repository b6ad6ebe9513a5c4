"""Device-side checks used while bringing the engine to its floor (H200).

    PYTHONPATH=. python3 -m devtools.devcheck spec           SpeCache Triton scoring and its top-256 against
                                                             the bytes they read (codes + scales)
    PYTHONPATH=. python3 -m devtools.devcheck select         the fused landmark selection (fastselect) against
                                                             the torch top-k path and the landmark floor
    PYTHONPATH=. python3 -m devtools.devcheck prof D:C:B ... kernel time by name in one graph replay of a
                                                             compute-only step (design:context:batch)
"""
from __future__ import annotations

import argparse
import sys

import torch

from devtools._common import rand_bf16, refusal


def specache_kernel():
    from ddbench.kernels.engine.sweep import hbm_gbps
    from ddbench.kernels.engine.fastselect import specache_select_topk
    from ddbench.kernels.specache import quantize_keys_2bit, spec_pass1, specache_scores_triton
    from ddbench.kernels.timing import time_cuda
    hbm = hbm_gbps()
    Hq, H, d = 32, 8, 128
    for B, T in [(8, 32768), (16, 131072)]:
        sets = [(rand_bf16(B, 2, Hq, d), quantize_keys_2bit(rand_bf16(B, H, T, d))) for _ in range(2)]
        qk = sets[0][1]
        read = qk.codes.numel() + 2 * qk.scale.numel() * 2
        fl = read / hbm / 1e6
        t = time_cuda([lambda q=q, qk=qk: spec_pass1(q, qk, 8) for q, qk in sets], inner=2, reps=10)
        print(f"spec pass1 B={B:3d} T={T:6d} (default launch): {t:.4f} ms  floor(codes+scales) {fl:.4f} ms  "
              f"{100 * fl / t:5.1f}%", flush=True)
        out_b = B * 2 * H * (T // 8) * 4
        t = time_cuda([lambda q=q, qk=qk: specache_scores_triton(q, qk, chunk=8) for q, qk in sets], inner=2, reps=10)
        f2 = (read + out_b) / hbm / 1e6
        print(f"spec scores chunk=8 B={B} T={T}: {t:.4f} ms floor {f2:.4f} ms {100 * f2 / t:5.1f}%", flush=True)
        t = time_cuda([lambda q=q, qk=qk: specache_scores_triton(q, qk, chunk=0) for q, qk in sets], inner=2, reps=10)
        f0 = (read + B * 2 * H * T * 4) / hbm / 1e6
        print(f"spec scores chunk=0 B={B} T={T}: {t:.4f} ms floor {f0:.4f} ms {100 * f0 / t:5.1f}%", flush=True)
        t = time_cuda([lambda q=q, qk=qk: specache_select_topk(q, qk, 8, 256) for q, qk in sets], inner=2, reps=10)
        print(f"spec select top-256 B={B} T={T}: {t:.4f} ms floor(codes+scales) {fl:.4f} ms {100 * fl / t:5.1f}%",
              flush=True)
        del sets
        torch.cuda.empty_cache()


def select_kernel():
    from ddbench.kernels.engine.sweep import hbm_gbps
    from ddbench.kernels.engine.fastselect import select_topk
    from ddbench.kernels.select import select_chunks
    from ddbench.kernels.timing import time_cuda
    hbm = hbm_gbps()
    for B, N, nq in [(4, 4096, 2), (16, 16384, 2), (64, 16384, 2), (64, 16384, 1)]:
        sets = [(rand_bf16(B, nq, 32, 128), rand_bf16(B, 8, N, 128)) for _ in range(2)]
        fl = B * 8 * N * 128 * 2 / hbm / 1e6
        t1 = time_cuda([lambda q=q, lm=lm: select_topk(q, lm, 256) for q, lm in sets], inner=2, reps=10)
        t0 = time_cuda([lambda q=q, lm=lm: select_chunks(q, lm, 256) for q, lm in sets], inner=2, reps=10)
        print(f"select B={B} N={N} nq={nq}: fused {t1:.4f} ms, torch top-k path {t0:.4f} ms, landmark floor {fl:.4f} ms"
              f" ({100 * fl / t1:.0f}% / {100 * fl / t0:.0f}%)", flush=True)
        del sets


def profile(points):
    from torch.profiler import ProfilerActivity, profile as prof
    from ddbench.core.catalog import get_model
    from ddbench.kernels.engine.points import PointSetup, PointTiming, hbm_gbps, run_point
    from ddbench.kernels.engine.model import Weights
    model = get_model("llama-3-8b")
    w = Weights.random(model, "cuda", seed=0)
    hbm = hbm_gbps()
    for p in points:
        d, c, b = p.split(":")
        r = run_point(PointSetup(model, w, hbm=hbm), d, int(c), int(b), PointTiming(transfers=False, reps=3), keep=True)
        if not isinstance(r, tuple):
            print(f"== {p}: {r['status']}", flush=True)
            continue
        row, e = r
        with prof(activities=[ProfilerActivity.CUDA]) as pr:
            e.replay()
            torch.cuda.synchronize()
        agg = {}
        for ev in pr.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                a = agg.setdefault(ev.name[:70], [0, 0.0])
                a[0] += 1
                a[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        tot = sum(v[1] for v in agg.values())
        print(f"== {p}: step {row['step_ms']:.3f} ms, floor {row['floor_ms']:.3f} ms (x{row['step_over_floor']:.2f}); "
              f"kernels per 2 steps {sum(v[0] for v in agg.values())}, busy {tot / 2e3:.3f} ms/step", flush=True)
        for name, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:14]:
            print(f"   {us / 2e3:8.3f} ms/step  {n // 2:5d}/step  {name}")
        del e
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=("spec", "select", "prof"))
    ap.add_argument("points", nargs="*", help="prof: design:context:batch points (e.g. dualdecoder:131072:16)")
    a = ap.parse_args(argv)
    if (err := refusal("devcheck")):
        print(err, file=sys.stderr)
        return 2
    if a.check == "spec":
        specache_kernel()
    elif a.check == "select":
        select_kernel()
    else:
        profile(a.points)
    return 0


if __name__ == "__main__":
    sys.exit(main())
