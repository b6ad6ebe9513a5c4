"""Small gather runs (plain, values-only, reuse, an odd grid) for `compute-sanitizer --tool memcheck`.

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
    from kernels.gather import gather_ref, gather_uva
    from kernels.layout import alloc_host_kv
    B, H, N, n, C, d = 2, 8, 64, 13, 8, 128
    host = alloc_host_kv(2, B, H, N, C, d)
    host.copy_(torch.randn(host.shape).to(torch.bfloat16))
    idx = torch.rand(B, H, N, device="cuda").argsort(-1)[..., :n].int()
    prev_idx = torch.rand(B, H, N, device="cuda").argsort(-1)[..., :n].int()
    pk, pv = (torch.randn(B, H, n * C, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bad = 0
    for kw, with_k in (({}, True), ({}, False), ({"prev": (prev_idx, pk, pv)}, True), ({"programs": 5, "items": 4}, True)):
        outs = [torch.full((B, H, n * C, d), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        k, v, kr, vr = outs
        gather_uva(host, 1, idx, k if with_k else None, v, **kw)
        gather_ref(host, 1, idx, kr if with_k else None, vr, **kw)
        torch.cuda.synchronize()
        ok = torch.equal(v, vr) and (not with_k or torch.equal(k, kr))
        print(f"gather {sorted(kw) or 'plain'} with_k={with_k}: {'ok' if ok else 'MISMATCH'}")
        bad += not ok
    return bad


if __name__ == "__main__":
    raise SystemExit(main())
