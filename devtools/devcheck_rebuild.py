"""GPU check of the low-rank key rebuild (kernels/rebuild.py): correctness, then its launch variants timed.

    PYTHONPATH=. python3 -m devtools.devcheck_rebuild [--out FILE.json] [--quick] [--final]

(a) every timed variant against the fp32 twin (rebuild_keys_ref) on fresh random bf16 factors, NaN-poisoned
    key buffers, ShadowKV's shapes (r=160, H=8, d=128, C=8, n=256 chunks, slot offset 32), and the fast
    RoPE path with fp32 keys out at positions near 128K; a variant that fails is not timed.
(b) CUDA-event timing of CUDA-graph replays after warm-up: each replay is preceded by an L2 flush (a
    256 MiB write outside the timed span) and runs `sets` launches over distinct input sets (U, SV, idx,
    k_out; together over 200 MB of touched bytes where memory allows, so repeats miss L2), per launch;
    min / median / max over 30 replays; B = 1, 16, 64 and T = 32768, 131072.
    Floor: bytes / 4.3 TB/s, bytes = distinct selected U rows (b, token) over the heads * r * 2
    + SV (B*H*r*d*2) + K written (B*H*n*C*d*2) + idx (B*H*n*4). `floor_brief_us` counts U rows once per
    (b, selected slot) without the per-head factor (B*n*C*r*2), which holds only when every head selects
    the same chunks; the engine's heads select different ones.
The variants: the default (impl="auto"), the block kernel's launch grid (block_chunks, rank_block, warps,
stages), the SV-resident kernel's, and libdevice sin/cos; the fastest correct ones are rebuild.LAUNCH.
--final times only the default and the two launches of rebuild.LAUNCH. BUDGET_S (default 200) skips
the shapes not started after that many seconds.
(traces/engine/h200/devcheck-rebuild.json also holds the kernel before issue 9, timed in that run.)
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

import torch

from devtools._common import command, refusal

HBM = 4.3e12
R, H, D, C, N = 160, 8, 128, 8, 256


def variants(quick=False, final=False):
    """name -> callable(U, SV, idx, k_out, **kw). `blocks` launches kernels/rebuild.py's block kernel with the given
    block_chunks (bc), rank_block (rb), num_warps (w), num_stages (s); `resident` its SV-resident kernel
    (impl="resident"; programs per SM, or rebuild_keys' default); `default` is rebuild_keys as it stands.
    final: the default and the launches LAUNCH names (the check of the chosen default)."""
    from ddbench.kernels.rebuild import LAUNCH, RebuildLaunch, rebuild_keys
    v = {"default rebuild_keys (impl auto)": rebuild_keys}
    cfgs = [(4, 32, 4, 3), (8, 32, 4, 3), (8, 32, 8, 3), (8, 64, 4, 3), (16, 32, 8, 2), (16, 32, 8, 3),
            (16, 64, 8, 3), (16, 32, 16, 3), (32, 32, 16, 3), (32, 32, 8, 3)]
    res = [(8, 4, 2, 2), (8, 8, 2, 2), (16, 8, 2, 2), (8, 4, 2, 4), (4, 4, 3, 2), (4, 4, 3, None)]
    if quick:
        cfgs, res = cfgs[:1] + cfgs[4:5], res[:1]
    if final:
        b, r = LAUNCH["blocks"], LAUNCH["resident"]
        cfgs = [(b["block_chunks"], b["rank_block"], b["num_warps"], b["num_stages"])]
        res = [(r["block_chunks"], r["num_warps"], r["num_stages"], None)]
    for bc, rb, w, s in cfgs:
        kw = dict(impl="blocks", block_chunks=bc, rank_block=rb, num_warps=w, num_stages=s)
        v[f"blocks bc{bc} rb{rb} w{w} s{s}"] = (lambda *a, kw=kw, **k: rebuild_keys(*a, launch=RebuildLaunch(**kw), **k))
    for bc, w, s, per_sm in res:
        kw = dict(impl="resident", block_chunks=bc, num_warps=w, num_stages=s)
        name = f"resident bc{bc} w{w} s{s} " + (f"{per_sm}/SM" if per_sm else "default programs")
        v[name] = (lambda *a, kw=kw, per_sm=per_sm, **k: rebuild_keys(*a, launch=RebuildLaunch(
            **kw, programs=per_sm and per_sm * torch.cuda.get_device_properties(0).multi_processor_count), **k))
    if not final:
        v["blocks bc16 rb32 w8 s3 libdevice sin/cos"] = (
            lambda *a, **k: rebuild_keys(*a, launch=RebuildLaunch(impl="blocks", block_chunks=16, rank_block=32,
                                                                  num_warps=8, num_stages=3, fast_rope=False), **k))
    return v


def _inputs(B, T, gen, n=N):
    U = (torch.randn(B, T, R, device="cuda", generator=gen) / math.sqrt(R)).to(torch.bfloat16)
    SV = torch.randn(B, H, R, D, device="cuda", generator=gen).to(torch.bfloat16)
    idx = torch.rand(B, H, T // C, device="cuda", generator=gen).argsort(-1)[..., :n].int().contiguous()
    return U, SV, idx


def correctness(vs):
    from ddbench.kernels.rebuild import rebuild_keys_ref
    g = torch.Generator(device="cuda").manual_seed(1234)
    ok = {}
    cases = [(2, 32768, 256, 32, torch.bfloat16, None, 1e-2), (2, 32768, 250, 5, torch.bfloat16, None, 1e-2),
             (1, 131072, 200, 8, torch.float32, 300, 1e-4)]
    data = []
    for B, T, n, off, odt, last, tol in cases:
        U, SV, idx = _inputs(B, T, g, n)
        if last is not None:       # positions near the end of the context (RoPE angles ~1.3e5 rad)
            idx = (T // C - last + torch.rand(B, H, last, device="cuda", generator=g).argsort(-1)[..., :n]).int()
        ref = torch.full((B, H, off + n * C + 5, D), float("nan"), dtype=odt, device="cuda")
        rebuild_keys_ref(U, SV, idx, ref, slot_offset=off)
        data.append((U, SV, idx, ref, off, n, tol, f"B={B} T={T} n={n} off={off} out={str(odt)[6:]}"))
    for name, fn in vs.items():
        ok[name] = True
        for U, SV, idx, ref, off, n, tol, what in data:
            out = torch.full_like(ref, float("nan"))
            try:
                fn(U, SV, idx, out, chunk=C, slot_offset=off)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"check {name:44s} {what}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                ok[name] = False
                break
            a, b = out[:, :, off:off + n * C].float(), ref[:, :, off:off + n * C].float()
            err = float((a - b).norm() / b.norm())
            good = (not a.isnan().any().item()) and err < tol and bool(out[:, :, :off].isnan().all()) and bool(
                out[:, :, off + n * C:].isnan().all())
            ok[name] &= good
            print(f"check {name:44s} {what}: rel err {err:.2e} (tol {tol:g}) {'PASS' if good else 'FAIL'}", flush=True)
    return ok


def copy_rate():
    from ddbench.kernels.timing import capture_graph, event_times
    bufs = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(2)]

    def cp(b=bufs):
        b[1].copy_(b[0])
    t = statistics.median(event_times(capture_graph(cp, [cp]).replay, 10, warmup=2))
    bufs.clear()
    return 2 * (1 << 30) / (t * 1e-3)


def _cold_times(fns, flush, reps=30):
    """per-launch ms of a graph replay of all `fns` (one launch per input set), an L2 flush before each replay."""
    from ddbench.kernels.timing import capture_graph

    def body():
        for f in fns:
            f()
    g = capture_graph(body, fns)
    for _ in range(3):
        flush.zero_()
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        flush.zero_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / len(fns))
    return ts


def floors(B, idx, T):
    rows = torch.unique((idx.long() + torch.arange(B, device="cuda").view(B, 1, 1) * (T // C)).view(-1)).numel() * C
    n = idx.shape[2]
    k_bytes, sv_bytes, idx_bytes = B * H * n * C * D * 2, B * H * R * D * 2, B * H * n * 4
    exact = rows * R * 2 + sv_bytes + k_bytes + idx_bytes
    brief = B * n * C * R * 2 + sv_bytes + k_bytes
    return exact, brief, rows


def timing(vs, ok, out_path, prov, quick=False, t_start=None, budget_s=200.0):
    """Shapes are skipped once budget_s seconds have passed since t_start (the process start)."""
    t_start = t_start or time.time()
    rate = copy_rate()
    print(f"HBM copy rate measured: {rate / 1e9:.0f} GB/s (floors at {HBM / 1e9:.0f} GB/s)", flush=True)
    res = dict(provenance=prov, hbm_bytes_per_s=HBM, copy_rate_bytes_per_s=rate,
               floor_formula="(distinct selected (b, token) U rows over heads * r * 2 + B*H*r*d*2 (SV) + "
                             "B*H*n*C*d*2 (K) + B*H*n*4 (idx)) / 4.3e12 B/s",
               floor_brief_formula="(B*n*C*r*2 + B*H*r*d*2 + B*H*n*C*d*2) / 4.3e12 B/s",
               shapes=dict(r=R, H=H, d=D, C=C, n=N, dtype="bfloat16", rope_theta=500000.0),
               method="CUDA-graph replay of one launch per input set (sets distinct U/SV/idx/k_out), L2 flushed "
                      "(256 MiB zero_) before each replay outside the events; per-launch ms; 30 replays after 3",
               correctness={k: bool(v) for k, v in ok.items()}, rows=[])
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    shapes = [(16, 131072), (64, 131072), (1, 131072), (16, 32768), (64, 32768), (1, 32768)]
    for B, T in shapes:
        if time.time() - t_start > budget_s:
            print(f"B={B} T={T}: skipped (time budget)", flush=True)
            continue
        per_call = B * H * N * C * (R * 2 + D * 2)
        nsets = max(1, min(8, math.ceil(200e6 / per_call)))
        free = torch.cuda.mem_get_info()[0]
        nsets = max(1, min(nsets, int(0.5 * free // (B * T * R * 2 + B * H * (N * C + 32) * D * 2))))
        sets = []
        for _ in range(nsets):
            U, SV, idx = _inputs(B, T, g)
            sets.append((U, SV, idx, torch.empty(B, H, N * C + 32, D, dtype=torch.bfloat16, device="cuda")))
        exact, brief, rows = floors(B, sets[0][2], T)
        f_us, fb_us = exact / HBM * 1e6, brief / HBM * 1e6
        print(f"B={B} T={T}: {nsets} input sets; floor {f_us:.1f} us ({exact / 1e6:.1f} MB, {rows} distinct U rows of "
              f"{B * H * N * C}), brief floor {fb_us:.1f} us", flush=True)
        for name, fn in vs.items():
            if not ok.get(name):
                continue
            try:
                ts = _cold_times([lambda s=s, fn=fn: fn(s[0], s[1], s[2], s[3], chunk=C, slot_offset=32) for s in sets],
                                 flush)
            except Exception as e:  # noqa: BLE001
                print(f"B={B:2d} T={T:6d} {name:44s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            us = [t * 1e3 for t in ts]
            med = statistics.median(us)
            row = dict(variant=name, B=B, T=T, sets=nsets, min_us=min(us), median_us=med, max_us=max(us),
                       floor_us=f_us, floor_brief_us=fb_us, ratio_to_floor=med / f_us, ratio_to_brief_floor=med / fb_us,
                       bytes=exact, distinct_u_rows=rows)
            res["rows"].append(row)
            print(f"B={B:2d} T={T:6d} {name:44s} min {min(us):8.1f} med {med:8.1f} max {max(us):8.1f} us  "
                  f"x{med / f_us:.2f} floor  x{med / fb_us:.2f} brief floor", flush=True)
        del sets
        torch.cuda.empty_cache()
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    # best variant: lowest geometric mean of the medians over the shapes every variant ran
    by = {}
    for r in res["rows"]:
        by.setdefault(r["variant"], {})[(r["B"], r["T"])] = r["median_us"]
    common = set.intersection(*(set(v) for v in by.values())) if by else set()
    gm = {k: math.exp(statistics.fmean(math.log(v[s]) for s in common)) for k, v in by.items() if common}
    res["geomean_median_us"] = gm
    if gm:
        res["best"] = min(gm, key=gm.get)
        for k in sorted(gm, key=gm.get):
            print(f"geomean {gm[k]:8.1f} us  {k}", flush=True)
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    return res


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "devcheck-rebuild.json"))
    ap.add_argument("--quick", action="store_true", help="fewer launch variants (two of the block kernel, one resident)")
    ap.add_argument("--final", action="store_true", help="only the default and rebuild.LAUNCH's two launches")
    a = ap.parse_args(argv)
    if (err := refusal("devcheck_rebuild")):
        print(err, file=sys.stderr)
        return 2
    from ddbench.kernels.timing import provenance
    t0 = time.time()
    prov = provenance(command("devcheck_rebuild", argv))
    print(prov, flush=True)
    vs = variants(quick=a.quick, final=a.final)
    ok = correctness(vs)
    print(f"correctness: {'ALL PASS' if all(ok.values()) else 'SOME FAIL'}", flush=True)
    timing(vs, ok, a.out, prov, quick=a.quick, t_start=t0, budget_s=float(os.environ.get("BUDGET_S", 200)))
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
