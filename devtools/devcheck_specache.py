"""GPU check of SpeCache's 2-bit scoring (kernels/specache.py): correctness, then its launch variants timed.

    PYTHONPATH=. python3 -m devtools.devcheck_specache [--quick] [--reps 3] [--out FILE.json] [--waves]

(a) against the fp32 twins on fresh random bf16 inputs (queries and keys), NaN-poisoned outputs:
    the per-token and per-chunk forms, 1 and 2 query tokens, odd split counts, each launch variant,
    and the engine's top-256 (fastselect.specache_select_topk) against the twin's top-k except near-ties;
(b) CUDA-event timing of CUDA-graph replays (8 calls per replay, 2 input sets alternated so the codes
    do not stay in L2), after warm-up; min / median / max over 25 replays, per call; Llama-3-8B heads
    (32 q / 8 KV, d=128), 2 query tokens, chunk 8, B=8 x 32K and B=16 x 128K tokens. Floors: bytes read
    (codes, scales, zeros) and written (the output) at 4.25 TB/s, and at the copy rate measured here.
The dequantising kernel (impl="dequant": dequantise in registers, dot on fp16 keys; "old" in the rows) is
timed in the same run. --waves: instead, pass 1 and the engine's path at 2 / 4 / 8 / 16 programs per SM.
"""
from __future__ import annotations

import statistics
import sys

import torch

from devtools._common import command, refusal

HBM = 4.25e12


def correctness():
    from ddbench.kernels.engine.fastselect import (TopkShape, specache_select_topk, specache_select_topk_ref,
                                                   topk_from_scratch)
    from ddbench.kernels.specache import (SpecKernel, quantize_keys_2bit, spec_block_m, spec_pass1, specache_chunk_scores_ref, specache_scores_ref,
                                  specache_scores_triton)
    ok_all = True
    g = torch.Generator(device="cuda").manual_seed(1234)
    variants = [dict(), dict(rows=16), dict(groups_per_iter=2, num_warps=2), dict(impl="dequant")]
    for B, nq, T, splits in [(2, 2, 16384, None), (3, 1, 8192, 3), (2, 2, 4096 + 64 * 5, 7)]:
        Hq, H, d = 32, 8, 128
        k = (torch.randn(B, H, T, d, device="cuda", generator=g) * (1 + torch.rand(1, H, 1, d, device="cuda", generator=g)))
        qk = quantize_keys_2bit(k.to(torch.bfloat16))
        q = torch.randn(B, nq, Hq, d, device="cuda", generator=g).to(torch.bfloat16)
        refs = {0: specache_scores_ref(q, qk), 8: specache_chunk_scores_ref(q, qk, 8)}
        for chunk in (0, 8):
            ref = refs[chunk]
            for v in variants:
                out = torch.full_like(ref, float("nan"))
                try:
                    got = specache_scores_triton(q, qk, chunk=chunk, out=out, splits=splits, **v)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"check scores {v}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                    ok_all = False
                    continue
                err = (got - ref).abs().max().item() / ref.max().item()
                ok = (not got.isnan().any().item()) and torch.allclose(got, ref, atol=3e-3 * ref.max().item(), rtol=1e-2)
                ok_all &= ok
                print(f"check scores B={B} nq={nq} T={T} splits={splits} chunk={chunk} {v}: max err / max prob "
                      f"{err:.2e} {'PASS' if ok else 'FAIL'}", flush=True)
        # the engine's selection: top-256 chunks equal the twin's except near-ties
        kk = 256
        ref_idx = specache_select_topk_ref(q, qk, 8, kk)
        p = refs[8]
        kth = p.topk(kk, -1).values[..., -1:]
        for name, fn in [("engine default", lambda: specache_select_topk(q, qk, 8, kk)),
                         ("engine rows16", lambda: specache_select_topk(q, qk, 8, kk, rows=16)),
                         ("maxnreg 168", lambda: topk_from_scratch(*spec_pass1(q, qk, 8, SpecKernel(maxnreg=168)),
                                                                   TopkShape(B, H, nq, Hq // H, T // 8, kk),
                                                                   block_m=spec_block_m(nq, Hq // H))),
                         ("dequant", lambda: topk_from_scratch(*spec_pass1(q, qk, 8, SpecKernel(impl="dequant")),
                                                               TopkShape(B, H, nq, Hq // H, T // 8, kk)))]:
            try:
                idx = fn().long()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"check top-{kk} {name}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                ok_all = False
                continue
            ok = True
            nd = 0
            for row_got, row_ref, prow, kv in zip(idx.view(-1, kk), ref_idx.long().view(-1, kk), p.view(-1, p.shape[-1]),
                                                  kth.view(-1)):
                diff = set(row_got.tolist()) ^ set(row_ref.tolist())
                nd += len(diff)
                if diff and not all(abs(prow[i].item() - kv.item()) <= 3e-3 * prow.max().item() for i in diff):
                    ok = False
            ok_all &= ok
            print(f"check top-{kk} B={B} nq={nq} T={T} {name}: {nd} differing ids (all near-ties: {ok}) "
                  f"{'PASS' if ok else 'FAIL'}", flush=True)
    return ok_all


def _graph_times(fns, inner=8, reps=25):
    from ddbench.kernels.timing import capture_graph, event_times
    for f in fns:
        f()
    torch.cuda.synchronize()

    def body():
        for i in range(inner):
            fns[i % len(fns)]()
    return event_times(capture_graph(body, fns).replay, reps, warmup=3, per_call=inner)


def copy_rate():
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = statistics.median(_graph_times([lambda x=x, y=y: y.copy_(x)], inner=4, reps=10))
    del x, y
    return 2 * (2 << 30) / (t * 1e-3)


def timing(quick=False, reps=3):
    """Every variant `reps` times, interleaved (rep 0 of each, then rep 1, ...); rows for the JSON."""
    from ddbench.kernels.engine.fastselect import TopkShape, specache_select_topk, topk_from_scratch
    from ddbench.kernels.specache import SpecKernel, random_quant_keys, spec_block_m, spec_pass1, specache_scores_triton
    rate = copy_rate()
    print(f"HBM copy rate measured: {rate / 1e9:.0f} GB/s (floors below at 4250 GB/s; x{HBM / rate:.3f} for the measured)",
          flush=True)
    out = []
    g = torch.Generator(device="cuda").manual_seed(7)
    Hq, H, d, C, kk = 32, 8, 128, 8, 256
    shapes = [(8, 32768), (16, 131072)]
    for B, T in shapes:
        sets = [(torch.randn(B, 2, Hq, d, device="cuda", generator=g).to(torch.bfloat16),
                 random_quant_keys(B, H, T, d, generator=g)) for _ in range(2)]
        qk0 = sets[0][1]
        read = qk0.codes.numel() + 2 * qk0.scale.numel() * 2
        f_p1 = read / HBM * 1e3
        f_ch = (read + B * 2 * H * (T // C) * 4) / HBM * 1e3
        f_tok = (read + B * 2 * H * T * 4) / HBM * 1e3
        G = Hq // H

        def row(name, fns, floor, rep):
            try:
                ts = _graph_times(fns)
            except Exception as e:  # noqa: BLE001  (a variant the installed Triton refuses: report, go on)
                print(f"B={B:2d} T={T:6d} {name:44s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                return
            med = statistics.median(ts)
            out.append(dict(B=B, T=T, variant=name, rep=rep, min_ms=min(ts), median_ms=med, max_ms=max(ts),
                            floor_ms=floor, pct_of_floor=100 * floor / med, copy_gbps=rate / 1e9))
            print(f"B={B:2d} T={T:6d} rep {rep} {name:44s} min {min(ts):.4f} med {med:.4f} max {max(ts):.4f} ms  "
                  f"floor {floor:.4f} ms  {100 * floor / med:5.1f}% of floor", flush=True)

        p1 = {"codes rows8 gb4 w4 (default)": dict(), "codes rows16 gb4 w4 (previous)": dict(rows=16),
              "codes rows8 gb2 w2": dict(kernel=SpecKernel(groups_per_iter=2, num_warps=2)),
              "codes rows8 gb8 w8": dict(kernel=SpecKernel(groups_per_iter=8, num_warps=8)),
              "codes rows8 maxnreg168": dict(kernel=SpecKernel(maxnreg=168)),
              "codes rows8 maxnreg128": dict(kernel=SpecKernel(maxnreg=128)),
              "old dequant gb2 w4": dict(kernel=SpecKernel(impl="dequant"))}
        if quick:
            p1 = {k: v for k, v in p1.items() if "maxnreg128" not in k}
        for rep in range(reps):
            for name, kw in p1.items():
                row(f"pass1 {name}", [lambda q=q, qk=qk, kw=kw: spec_pass1(q, qk, C, **kw) for q, qk in sets], f_p1, rep)
            for rows in (None, 16):
                row(f"engine pass1+top256 rows{rows or spec_block_m(2, G)}",
                    [lambda q=q, qk=qk, rows=rows: specache_select_topk(q, qk, C, kk, rows=rows) for q, qk in sets],
                    f_p1, rep)
            row("engine pass1+top256 old dequant",
                [lambda q=q, qk=qk: topk_from_scratch(*spec_pass1(q, qk, C, SpecKernel(impl="dequant")),
                                                      TopkShape(B, H, 2, G, T // C, kk))
                 for q, qk in sets], f_p1, rep)
            if quick and rep:
                continue
            for impl in ("codes", "dequant"):
                outs = [torch.empty(B, 2, H, T // C, device="cuda") for _ in sets]
                row(f"scores chunk=8 {impl}", [lambda q=q, qk=qk, o=o, impl=impl: specache_scores_triton(
                    q, qk, chunk=C, out=o, impl=impl) for (q, qk), o in zip(sets, outs)], f_ch, rep)
                del outs
                outs = [torch.empty(B, 2, H, T, device="cuda") for _ in sets]
                row(f"scores per token {impl}", [lambda q=q, qk=qk, o=o, impl=impl: specache_scores_triton(
                    q, qk, chunk=0, out=o, impl=impl) for (q, qk), o in zip(sets, outs)], f_tok, rep)
                del outs
        del sets
        torch.cuda.empty_cache()
    return out


def waves_sweep(reps=3):
    """Pass 1 and the engine's path (pass 1 + fused top-256) at automatic splits for 2 / 4 / 8 / 16
    programs per SM (the default: 8), `reps` times interleaved; rows for the JSON."""
    import triton
    from ddbench.kernels.engine.fastselect import specache_select_topk
    from ddbench.kernels.specache import random_quant_keys, spec_pass1
    out = []
    g = torch.Generator(device="cuda").manual_seed(9)
    Hq, H, d, C, kk = 32, 8, 128, 8, 256
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for B, T in [(1, 32768), (8, 32768), (32, 32768), (1, 131072), (16, 131072), (32, 131072)]:
        sets = [(torch.randn(B, 2, Hq, d, device="cuda", generator=g).to(torch.bfloat16),
                 random_quant_keys(B, H, T, d, generator=g)) for _ in range(2)]
        qk0 = sets[0][1]
        floor = (qk0.codes.numel() + 2 * qk0.scale.numel() * 2) / HBM * 1e3
        ng = T // 64
        for rep in range(reps):
            for waves in (2, 4, 8, 16):
                sp = max(1, min(triton.cdiv(waves * sms, B * H), ng // 16))
                for name, fn in (("pass1", lambda q, qk, sp=sp: spec_pass1(q, qk, C, splits=sp)),
                                 ("engine", lambda q, qk, sp=sp: specache_select_topk(q, qk, C, kk, splits=sp))):
                    ts = _graph_times([lambda q=q, qk=qk, fn=fn: fn(q, qk) for q, qk in sets])
                    med = statistics.median(ts)
                    out.append(dict(B=B, T=T, variant=f"{name} waves{waves}", splits=sp, rep=rep, min_ms=min(ts),
                                    median_ms=med, max_ms=max(ts), floor_ms=floor, pct_of_floor=100 * floor / med))
                    print(f"B={B:2d} T={T:6d} rep {rep} {name:6s} waves {waves:2d} splits {sp:3d}: med {med:.4f} ms "
                          f"({100 * floor / med:5.1f}% of floor)", flush=True)
        del sets
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="SpeCache 2-bit scoring on the GPU: correctness, then timing")
    ap.add_argument("--quick", action="store_true", help="skip maxnreg 128, and the full-score rows after rep 0")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every timing, interleaved")
    ap.add_argument("--out", help="write the timings and the provenance to this JSON file")
    ap.add_argument("--waves", action="store_true", help="only the programs-per-SM sweep (no correctness run)")
    a = ap.parse_args(argv)
    if (err := refusal("devcheck_specache", a.reps)):
        print(err, file=sys.stderr)
        return 2
    from ddbench.kernels.timing import provenance
    prov = provenance(command("devcheck_specache", argv))
    print(prov, flush=True)
    if a.waves:
        rows = waves_sweep(a.reps)
        if a.out:
            from ddbench.core.io import write_json
            write_json(a.out, dict(provenance=prov, rows=rows))
        return 0
    ok = correctness()
    print(f"correctness: {'ALL PASS' if ok else 'SOME FAIL'}", flush=True)
    rows = timing(quick=a.quick, reps=a.reps)
    if a.out:
        from ddbench.core.io import write_json
        write_json(a.out, dict(provenance=prov, correctness="pass" if ok else "fail", rows=rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
