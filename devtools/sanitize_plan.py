"""Small miss-plan runs for `compute-sanitizer` (memcheck, initcheck): the one-launch bitmap plan
(`transfer.plan_misses_fast`, the forced-miss path) on predictions with repeated ids (an all-zero row,
mixed repeats) and without, against its twin `plan_misses`.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=. compute-sanitizer --tool memcheck python3 -m devtools.sanitize_plan
    (also --tool initcheck). Exits non-zero if any plan differs from the twin (per (b, h) the same items
    in the same order; 2 without a CUDA GPU).
"""

import sys

import torch

from devtools._common import refusal


def _items(mp):
    n = int(mp.count)
    rows = sorted(range(n), key=lambda i: int(mp.bh[i]))          # stable: the twin's order per (b, h)
    return n, [(int(mp.bh[i]), int(mp.chunk[i]), int(mp.slot[i])) for i in rows]


def main() -> int:
    if (err := refusal("sanitize_plan")):
        print(err, file=sys.stderr)
        return 2
    from ddbench.kernels.engine.transfer import plan_misses, plan_misses_fast
    g = torch.Generator(device="cuda").manual_seed(3)
    bad = 0
    for B, H, N, k in ((2, 8, 512, 64), (3, 4, 4096, 256)):
        true = torch.rand(B, H, N, device="cuda", generator=g).argsort(-1)[..., :k].sort(-1).values.int()
        for case in ("distinct", "zeros", "mixed"):
            pred = torch.rand(B, H, N, device="cuda", generator=g).argsort(-1)[..., :k].int()
            if case == "zeros":
                pred[0, 0] = 0
            elif case == "mixed":
                pred[:, :, 1::3] = pred[:, :, ::3][..., : pred[:, :, 1::3].shape[-1]]
            got, want = plan_misses_fast(pred, true, n_chunks=N), plan_misses(pred, true)
            torch.cuda.synchronize()
            ok = _items(got) == _items(want) and torch.equal(got.assembled, want.assembled)
            print(f"plan B={B} H={H} N={N} k={k} {case}: {'ok' if ok else 'MISMATCH'}", flush=True)
            bad += not ok
    return bad


if __name__ == "__main__":
    raise SystemExit(main())
