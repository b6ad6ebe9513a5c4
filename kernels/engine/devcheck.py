"""Device-side checks used while bringing the engine to its floor (one call, several checks).

    python -m kernels.engine.devcheck spec      SpeCache Triton scoring: groups per iteration x warps
    python -m kernels.engine.devcheck prof D:C:B [...]   kernel time by name in one graph replay
"""
from __future__ import annotations

import sys

import torch


def specache_kernel():
    from kernels.bench import _rand_bf16
    from kernels.engine.bench import hbm_gbps
    from kernels.specache import quantize_keys_2bit, specache_scores_triton
    from kernels.timing import time_cuda
    hbm = hbm_gbps()
    Hq, H, d = 32, 8, 128
    for B, T in [(8, 32768), (16, 131072)]:
        sets = [(_rand_bf16(B, 2, Hq, d), quantize_keys_2bit(_rand_bf16(B, H, T, d))) for _ in range(2)]
        qk = sets[0][1]
        read = qk.codes.numel() + 2 * qk.scale.numel() * 2
        for chunk in (0, 8):
            out_b = B * 2 * H * (T // chunk if chunk else T) * 4
            for gb in (2, 4, 8):
                for nw in (4, 8):
                    for sp in (None, 64):
                        try:
                            t = time_cuda([lambda q=q, qk=qk: specache_scores_triton(
                                q, qk, chunk=chunk, groups_per_iter=gb, num_warps=nw, splits=sp) for q, qk in sets],
                                inner=2, reps=10)
                        except Exception as exc:  # noqa: BLE001
                            print(f"B={B} T={T} c{chunk} gb{gb} w{nw} s{sp}: {type(exc).__name__} {str(exc)[:80]}")
                            continue
                        fl = (read + out_b) / hbm / 1e6
                        print(f"spec B={B:3d} T={T:6d} chunk={chunk} gb={gb} warps={nw} splits={sp}: {t:.4f} ms"
                              f"  floor {fl:.4f} ms  {100 * fl / t:5.1f}% of floor", flush=True)
        del sets
        torch.cuda.empty_cache()


def profile(points):
    from torch.profiler import ProfilerActivity, profile as prof
    from ddbench.core.catalog import get_model
    from kernels.engine.bench import hbm_gbps, run_point
    from kernels.engine.model import Weights
    model = get_model("llama-3-8b")
    w = Weights.random(model, "cuda", seed=0)
    hbm = hbm_gbps()
    for p in points:
        d, c, b = p.split(":")
        row, e = run_point(model, w, None, d, int(c), int(b), transfers=False, graph=True, reps=3, hbm=hbm, keep=True)
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


if __name__ == "__main__":
    if sys.argv[1] == "spec":
        specache_kernel()
    elif sys.argv[1] == "prof":
        profile(sys.argv[2:])
