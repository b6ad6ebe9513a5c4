"""Small gather runs (plain, values-only, reuse, an odd grid; bf16 and fp8 hosts; the engine's slot
gather in fp8) for `compute-sanitizer --tool memcheck`.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=. compute-sanitizer --tool memcheck python3 -m devtools.sanitize_gather
Exits non-zero if any result differs from the torch twin (2 without a CUDA GPU).
"""

import sys

import torch

from devtools._common import refusal


def main() -> int:
    if (err := refusal("sanitize_gather")):
        print(err, file=sys.stderr)
        return 2
    from ddbench.kernels.engine.transfer import gather_slots, gather_slots_ref, perturb, plan_misses
    from ddbench.kernels.fp8 import quantize_host_kv
    from ddbench.kernels.gather import gather_ref, gather_uva
    from ddbench.kernels.layout import alloc_host_kv
    B, H, N, n, C, d = 2, 8, 64, 13, 8, 128
    host = alloc_host_kv(2, B, H, N, C, d)
    host.copy_(torch.randn(host.shape).to(torch.bfloat16))
    q, s = quantize_host_kv(host.float())
    hosts = {"bf16": (host, {}), "fp8": (q.pin_memory(), {"scales": s.pin_memory()})}
    idx = torch.rand(B, H, N, device="cuda").argsort(-1)[..., :n].int()
    prev_idx = torch.rand(B, H, N, device="cuda").argsort(-1)[..., :n].int()
    pk, pv = (torch.randn(B, H, n * C, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bad = 0
    for name, (h, extra) in hosts.items():
        for kw, with_k in (({}, True), ({}, False), ({"prev": (prev_idx, pk, pv)}, True),
                           ({"programs": 5, "items": 4}, True)):
            outs = [torch.full((B, H, n * C, d), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
            k, v, kr, vr = outs
            gather_uva(h, 1, idx, k if with_k else None, v, **kw, **extra)
            gather_ref(h, 1, idx, kr if with_k else None, vr, **kw, **extra)
            torch.cuda.synchronize()
            ok = torch.equal(v, vr) and (not with_k or torch.equal(k, kr))
            print(f"gather {name} {sorted(kw) or 'plain'} with_k={with_k}: {'ok' if ok else 'MISMATCH'}")
            bad += not ok
    plan = plan_misses(idx, perturb(idx, 0.33, N, None))
    h, extra = hosts["fp8"]
    k, v, kr, vr = (torch.full((B, H, n * C, d), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(4))
    gather_slots(h, 0, plan, k, v, programs=7, **extra)
    gather_slots_ref(h, 0, plan, kr, vr, **extra)
    torch.cuda.synchronize()
    ok = torch.equal(k.nan_to_num(), kr.nan_to_num()) and torch.equal(v.nan_to_num(), vr.nan_to_num())
    print(f"slot gather fp8: {'ok' if ok else 'MISMATCH'}")
    return bad + (not ok)


if __name__ == "__main__":
    raise SystemExit(main())
