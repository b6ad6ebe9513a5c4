"""GPU check of the sparse decode attention over fp8 (e4m3) KV (issue 32) against the bf16 kernel.

    PYTHONPATH=. python3 devtools/devcheck_attention_fp8.py [--batches 1 16 64] [--reps 3] [--out FILE.json]

The engine's chunk-cache shape: Llama-3-8B heads (32 q / 8 KV, d=128), S = 4096 + 128 physical rows in
slots of chunk 8 read through `rows` (a random slot permutation, ddbench.kernels.attention.chunk_cache_rows),
2 query tokens, every row attended (lengths = S - 2), automatic splits, as the engine calls it.
(a) per batch, on fresh random bf16 inputs quantised with ddbench.kernels.fp8.quantize_chunks (NaN-poisoned
    outputs): the fp8 kernel against its torch twin (PASS below 1e-2, relative), and fp8 against bf16
    on the unquantised K/V: max abs error, max abs / max |bf16|, relative (norm) error.
(b) CUDA-event timing of CUDA-graph replays after warm-up, each replay `inner` calls over rotated input
    sets (together at least 256 MiB of K/V, so calls miss L2); per repeat the median over `--timed`
    replays; `--reps` repeats interleaved across the variants, reported as min / median / max.
    Floor: bytes read and written / HBM, HBM = 4.14e12 B/s (../shared/ANCHORS.md section 1, the
    device-to-device copy measured on the H200); bytes = K+V buffers (2 or 1 B per element) + fp8 scales
    + q + out + rows (int32). The copy rate measured in this run is reported beside it.
"""
from __future__ import annotations

import math
import statistics
import sys

import torch

from devtools._common import command, refusal

HBM = 4.14e12
SHAPE = dict(Hq=32, H=8, d=128, S=4096 + 128, chunk=8, nq=2)
VARIANTS = {"bf16": dict(fp8=False), "fp8": dict(fp8=True), "fp8 block_n 128": dict(fp8=True, block_n=128)}
MiB = 1 << 20


def make_set(B, Hq, H, d, S, chunk, nq, *, seed, device="cuda", dtype=torch.bfloat16):
    """One input set: q, bf16 K/V [B, H, S, d] and their e4m3 + scales, lengths S - nq, chunk-cache rows."""
    from ddbench.kernels.attention import chunk_cache_rows
    from ddbench.kernels.fp8 import quantize_chunks
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(*sh, device=device, generator=g).to(dtype)
               for sh in ((B, nq, Hq, d), (B, H, S, d), (B, H, S, d)))
    (k8, ks), (v8, vs) = quantize_chunks(k, chunk), quantize_chunks(v, chunk)
    rows = chunk_cache_rows(B, H, S, S // chunk, chunk, generator=torch.Generator().manual_seed(seed), device=device)
    lengths = torch.full((B,), S - nq, device=device, dtype=torch.int32)
    return dict(q=q, k=k, v=v, k8=k8, v8=v8, ks=ks, vs=vs, rows=rows, lengths=lengths, chunk=chunk,
                out=torch.empty_like(q))


def attend(x, fp8, out=None, **kw):
    """The kernel the engine would call on set x: bf16 buffers, or the e4m3 ones with their scales."""
    from ddbench.kernels.attention import CacheView, dual_sparse_attention
    if fp8:
        return dual_sparse_attention(x["q"], x["k8"], x["v8"], x["lengths"], out=out,
                                     cache=CacheView(x["rows"], x["ks"], x["vs"], x["chunk"]), **kw)
    return dual_sparse_attention(x["q"], x["k"], x["v"], x["lengths"], out=out, cache=CacheView(x["rows"]), **kw)


def floor_bytes(x, fp8) -> dict:
    """Bytes one call reads and writes (every row attended): K+V, scales (fp8), q, out, rows."""
    kv = x["k8"] if fp8 else x["k"]
    parts = dict(kv=2 * kv.numel() * kv.element_size(), scales=2 * x["ks"].numel() * 4 if fp8 else 0,
                 q=x["q"].numel() * x["q"].element_size(), out=x["q"].numel() * x["q"].element_size(),
                 rows=x["rows"].numel() * 4)
    parts["total"] = sum(parts.values())
    return parts


def errors(x, **kw) -> dict:
    """fp8 kernel against its twin, and fp8 against bf16 on the unquantised K/V (NaN-poisoned outputs)."""
    from ddbench.kernels.attention import CacheView, dual_sparse_attention_ref
    outs = {}
    for fp8 in (False, True):
        outs[fp8] = attend(x, fp8, out=torch.full_like(x["q"], float("nan")), **kw).float()
    twin = dual_sparse_attention_ref(x["q"], x["k8"], x["v8"], x["lengths"],
                                     CacheView(x["rows"], x["ks"], x["vs"], x["chunk"])).float()
    ref, got = outs[False], outs[True]
    diff = (got - ref).abs()
    return dict(nan=bool(got.isnan().any() or ref.isnan().any()),
                twin_rel=float((got - twin).norm() / twin.norm()),
                max_abs=float(diff.max()), max_abs_over_max=float(diff.max() / ref.abs().max()),
                rel_norm=float((got - ref).norm() / ref.norm()))


def _replay_times(fns, inner, timed):
    from ddbench.kernels.timing import capture_graph, event_times

    def body():
        for i in range(inner):
            fns[i % len(fns)]()
    return event_times(capture_graph(body, fns).replay, timed, warmup=3, per_call=inner)


def copy_rate():
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = statistics.median(_replay_times([lambda: y.copy_(x)], 4, 10))
    return 2 * x.numel() / (t * 1e-3)


def measure_batch(B, reps, timed, seed=0):
    """Rows (one per variant) for batch B: errors, then the timings of VARIANTS interleaved over reps."""
    first = make_set(B, **SHAPE, seed=seed)
    per_set = floor_bytes(first, False)["kv"]
    n_sets = min(32, max(2, math.ceil(256 * MiB / per_set)))
    sets = [first] + [make_set(B, **SHAPE, seed=seed + i) for i in range(1, n_sets)]
    err = errors(first)
    ok = not err["nan"] and err["twin_rel"] < 1e-2
    print(f"B={B:2d} fp8 vs twin rel {err['twin_rel']:.2e} {'PASS' if ok else 'FAIL'}; fp8 vs bf16: max abs "
          f"{err['max_abs']:.4f} ({err['max_abs_over_max']:.2e} of max), rel {err['rel_norm']:.4f}", flush=True)
    inner = max(8, len(sets))
    meds = {name: [] for name in VARIANTS}
    for _ in range(reps):
        for name, kw in VARIANTS.items():
            kw = dict(kw)
            fp8 = kw.pop("fp8")
            fns = [lambda x=x, fp8=fp8, kw=kw: attend(x, fp8, out=x["out"], **kw) for x in sets]
            meds[name].append(statistics.median(_replay_times(fns, inner, timed)))
    rows = []
    for name, ms in meds.items():
        by = floor_bytes(first, VARIANTS[name]["fp8"])
        floor = by["total"] / HBM * 1e3
        med = statistics.median(ms)
        rows.append(dict(B=B, variant=name, **{k: v for k, v in SHAPE.items()}, sets=len(sets), inner=inner,
                         min_ms=min(ms), median_ms=med, max_ms=max(ms), rep_ms=ms, bytes=by, floor_ms=floor,
                         ratio_to_floor=med / floor, hbm=HBM, check="pass" if ok else "fail", **err))
        print(f"B={B:2d} {name:16s} min {min(ms):.4f} med {med:.4f} max {max(ms):.4f} ms  floor {floor:.4f} ms  "
              f"x{med / floor:.2f} of floor", flush=True)
    del sets, first
    torch.cuda.empty_cache()
    return rows, ok


def parse(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="sparse decode attention over fp8 KV against bf16 on the GPU")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--reps", type=int, default=3, help="repeats of every timing, interleaved across the variants")
    ap.add_argument("--timed", type=int, default=25, help="timed graph replays per repeat (median taken)")
    ap.add_argument("--out", help="write the rows and the provenance to this JSON file")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    if (err := refusal("devcheck_attention_fp8", a.reps)):
        print(err, file=sys.stderr)
        return 2
    from ddbench.kernels.timing import provenance
    prov = provenance(command("devcheck_attention_fp8", argv))
    print(prov, flush=True)
    rate = copy_rate()
    print(f"HBM copy rate measured: {rate / 1e9:.0f} GB/s (floors at {HBM / 1e9:.0f} GB/s)", flush=True)
    rows, ok_all = [], True
    for B in a.batches:
        r, ok = measure_batch(B, a.reps, a.timed)
        rows += r
        ok_all &= ok
    if a.out:
        from ddbench.core.io import write_json
        write_json(a.out, dict(provenance=prov, copy_gbps=rate / 1e9, correctness="pass" if ok_all else "fail",
                               rows=rows))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
