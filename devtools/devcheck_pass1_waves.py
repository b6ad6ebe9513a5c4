"""The landmark pass 1's splits against the GPU's waves (H200): at the engine's largest batches.

    PYTHONPATH=. python3 -m devtools.devcheck_pass1_waves [--reps 3] [--out FILE.json]

Pass 1 (kernels/select.py's score_pass1_kernel, launched by fastselect.landmark_pass1) runs one program per
(request, KV head, split). Its splits once aimed at 4 x SMs programs ("old"), so past B x H = 4 x SMs it ran
one split: B x H programs, a little over one wave of resident programs at some batches; the default now
runs at least fastselect.PASS1_SPLITS. Here, at each model's largest batches (Llama-3-8B, Qwen2.5-7B and
14B heads, two query tokens), pass 1 is timed (CUDA graph replays, median of 15, fresh random bf16
inputs) at the old count, the default and fixed counts, `--reps`
times interleaved; GB/s counts the landmarks read and the scores written, against a device copy timed in
the same run. The top-k's ids from each split count are compared with the default's (the same set of
chunks but for fp ties of the row normalisers), and the kernel's registers and shared memory give its
resident programs per SM.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from devtools._common import command, rand_bf16, refusal

SHAPES = {"llama-3-8b": (32, 8), "qwen2.5-7b": (28, 4), "qwen2.5-14b": (40, 8)}    # (query heads, KV heads)
POINTS = (("llama-3-8b", 131072, (1, 8, 16, 32, 46, 60, 64, 79)), ("llama-3-8b", 65536, (79, 117)),
          ("llama-3-8b", 32768, (94, 154)), ("qwen2.5-7b", 131072, (128, 137, 181)),
          ("qwen2.5-14b", 131072, (27, 35, 47)))
SPLITS = ("old", None, 1, 2, 3, 4, 6, 8, 12, 16)   # "old": one split per row from B x H = 4 x SMs on (before PASS1_SPLITS)
CHUNK, K, D = 8, 256, 128


def occupancy(q, lm):
    """Registers, shared bytes and resident programs per SM of pass 1 (one split per program here; the
    kernel is the same at every split count), from the launch's compiled kernel."""
    import math
    from ddbench.kernels.select import LOG2E, score_pass1_kernel
    B, _, Hq, d = q.shape
    H, N = lm.shape[1], lm.shape[2]
    scratch = torch.empty(B * H * 16 * N, device="cuda", dtype=torch.float16)
    pml = torch.empty(B * H * 16 * 2, device="cuda", dtype=torch.float32)
    try:
        k = score_pass1_kernel[(B * H, 1)](q, lm, scratch, pml, N, q.stride(0), q.stride(1), q.stride(2), *lm.stride()[:3],
                                           H, Hq // H, 2, 1, N, LOG2E / math.sqrt(d), D=d, GP=4, BLOCK_M=16, BLOCK_N=64,
                                           num_warps=4)
        torch.cuda.synchronize()
        props = torch.cuda.get_device_properties(0)
        warps = k.metadata.num_warps
        per_sm = min(props.max_threads_per_multi_processor // (32 * warps), 65536 // max(1, k.n_regs * 32 * warps),
                     (227 << 10) // max(1, k.metadata.shared + 1024))
        return dict(n_regs=k.n_regs, shared=k.metadata.shared, warps=warps, resident_per_sm=per_sm)
    except Exception as exc:      # the handle's fields differ between Triton versions: the timings still run
        return dict(error=f"{type(exc).__name__}: {exc}")


def point(model, ctx, B, reps, hbm):
    from ddbench.kernels.engine import fastselect
    from ddbench.kernels.timing import time_cuda
    Hq, H = SHAPES[model]
    N = ctx // CHUNK
    q, lm = rand_bf16(B, 2, Hq, D), rand_bf16(B, H, N, D)
    G = Hq // H
    moved = lm.numel() * 2 + B * H * 2 * G * N * 2
    ref = fastselect.topk_from_scratch(*fastselect.landmark_pass1(q, lm)[:2], fastselect.TopkShape(B, H, 2, G, N, K))
    rows = []
    times = {s: [] for s in SPLITS}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    old = max(1, min(-(-4 * sms // (B * H)), N // fastselect.PASS1_MIN_SPLIT))
    split_of = {s: old if s == "old" else s for s in SPLITS}
    for _ in range(reps):
        for s in SPLITS:
            times[s].append(time_cuda(lambda s=s: fastselect.landmark_pass1(q, lm, splits=split_of[s]), inner=3, reps=15))
    for s in SPLITS:
        sc, pml, _ = fastselect.landmark_pass1(q, lm, splits=split_of[s])
        ids = fastselect.topk_from_scratch(sc, pml, fastselect.TopkShape(B, H, 2, G, N, K))
        same = float((ids.unsqueeze(-1) == ref.unsqueeze(-2)).any(-1).float().mean())
        n_split = pml.numel() // (2 * B * H * 16)
        ms = statistics.median(times[s])
        rows.append(dict(model=model, context=ctx, batch=B, splits="default" if s is None else s, n_split=n_split,
                         programs=B * H * n_split, ms=ms, ms_min=min(times[s]), ms_max=max(times[s]),
                         gbps=moved / ms / 1e6, of_copy=moved / ms / 1e6 / hbm, ids_same=same))
        print(f"{model} {ctx // 1024}K b{B} splits {rows[-1]['splits']} ({n_split}, {B * H * n_split} programs):"
              f" {ms:.3f} ms ({min(times[s]):.3f}-{max(times[s]):.3f}), {rows[-1]['of_copy']:.1%} of copy,"
              f" ids same {same:.4f}", flush=True)
    del q, lm
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    why = refusal("devcheck_pass1_waves", a.reps)
    if why:
        print(why, file=sys.stderr)
        return 2
    from ddbench.kernels.timing import provenance
    from ddbench.kernels.engine.points import hbm_gbps
    hbm = hbm_gbps()
    print(f"device copy {hbm:.0f} GB/s", flush=True)
    occ = occupancy(rand_bf16(60, 2, 32, D), rand_bf16(60, 8, 16384, D))
    print(f"pass 1: {occ}", flush=True)
    rows = []
    for model, ctx, batches in POINTS:
        for B in batches:
            rows += point(model, ctx, B, a.reps, hbm)
            torch.cuda.empty_cache()
    out = dict(provenance=provenance(command("devcheck_pass1_waves", argv)), hbm_copy_gbps=hbm,
               sms=torch.cuda.get_device_properties(0).multi_processor_count, occupancy=occ, rows=rows)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
