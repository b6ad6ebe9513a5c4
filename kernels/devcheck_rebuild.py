"""GPU check of the low-rank key rebuild (kernels/rebuild.py): correctness, then old vs new timing.

    PYTHONPATH=. python3 kernels/devcheck_rebuild.py [--out FILE.json] [--quick] [--final]

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
The old kernel (kernels/rebuild.py at 69d6717, copied below verbatim as the baseline) runs in the same process.
--final times only the old kernel, the default (impl="auto") and the two launches of rebuild.LAUNCH.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

HBM = 4.3e12
R, H, D, C, N = 160, 8, 128, 8, 256


# ---- baseline: _rebuild_kernel and its launch as of 69d6717 (libdevice sin/cos, 4 chunks, rank 32, 4 warps)
@triton.jit
def _old_rebuild_kernel(U, SV, idx, inv_freq, k_out, n_sel, R, H,
                        s_ub, s_ut, s_sb, s_sh, s_sr, s_ob, s_oh, s_ot, slot_offset,
                        C: tl.constexpr, D: tl.constexpr, BC: tl.constexpr, RB: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    HALF: tl.constexpr = D // 2
    BT: tl.constexpr = BC * C
    rr = tl.arange(0, BT)
    j = tl.program_id(1) * BC + rr // C
    jv = j < n_sel
    ch = tl.load(idx + bh.to(tl.int64) * n_sel + j, mask=jv, other=0)
    tok = (ch * C + rr % C).to(tl.int64)
    hd = tl.arange(0, HALF)
    ub = U + b.to(tl.int64) * s_ub
    sb = SV + b.to(tl.int64) * s_sb + h * s_sh
    x1 = tl.zeros([BT, HALF], tl.float32)
    x2 = tl.zeros([BT, HALF], tl.float32)
    for r0 in range(0, R, RB):
        rk = r0 + tl.arange(0, RB)
        rkv = rk < R
        u = tl.load(ub + tok[:, None] * s_ut + rk[None, :], mask=jv[:, None] & rkv[None, :], other=0.0)
        s1 = tl.load(sb + rk[:, None] * s_sr + hd[None, :], mask=rkv[:, None], other=0.0)
        s2 = tl.load(sb + rk[:, None] * s_sr + HALF + hd[None, :], mask=rkv[:, None], other=0.0)
        x1 += tl.dot(u, s1)
        x2 += tl.dot(u, s2)
    ang = tok.to(tl.float32)[:, None] * tl.load(inv_freq + hd)[None, :]
    kk = tl.floor(ang * 0.15915494309189535 + 0.5)
    ang = (ang - kk * 6.28125) - kk * 1.9353071795864769e-3
    cos = tl.cos(ang)
    sin = tl.sin(ang)
    dst = k_out + b.to(tl.int64) * s_ob + h * s_oh + (slot_offset + j * C + rr % C).to(tl.int64)[:, None] * s_ot + hd[None, :]
    ty = k_out.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=jv[:, None])
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=jv[:, None])


def old_rebuild_keys(U, SV, idx, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0, block_chunks=4, rank_block=32,
                     num_warps=4):
    from kernels.rebuild import _check, rope_inv_freq
    B, T, R_, H_, d = _check(U, SV, idx, k_out, chunk, slot_offset)
    n = idx.shape[2]
    idx = idx.to(device=U.device, dtype=torch.int32).contiguous()
    inv = rope_inv_freq(d, rope_theta, U.device)
    _old_rebuild_kernel[(B * H_, triton.cdiv(n, block_chunks))](
        U, SV, idx, inv, k_out, n, R_, H_, U.stride(0), U.stride(1), SV.stride(0), SV.stride(1), SV.stride(2),
        *k_out.stride()[:3], slot_offset, C=chunk, D=d, BC=block_chunks, RB=rank_block, num_warps=num_warps)
    return k_out
# ---- end of the baseline


def variants(quick=False, final=False):
    """name -> callable(U, SV, idx, k_out, **kw). `new` launches kernels/rebuild.py's block kernel with the given
    block_chunks (bc), rank_block (rb), num_warps (w), num_stages (s); `resident` its SV-resident kernel
    (impl="resident"; programs per SM, or rebuild_keys' default); `default` is rebuild_keys as it stands.
    final: the old kernel, the default and the launches LAUNCH names (the check of the chosen default)."""
    from kernels.rebuild import LAUNCH, rebuild_keys
    v = {"old 69d6717 bc4 rb32 w4 (libdevice sin/cos)": old_rebuild_keys,
         "default rebuild_keys (impl auto)": rebuild_keys}
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
        v[f"new bc{bc} rb{rb} w{w} s{s}"] = (lambda *a, kw=kw, **k: rebuild_keys(*a, **kw, **k))
    for bc, w, s, per_sm in res:
        kw = dict(impl="resident", block_chunks=bc, num_warps=w, num_stages=s)
        name = f"resident bc{bc} w{w} s{s} " + (f"{per_sm}/SM" if per_sm else "default programs")
        v[name] = (lambda *a, kw=kw, per_sm=per_sm, **k: rebuild_keys(
            *a, **kw, programs=per_sm and per_sm * torch.cuda.get_device_properties(0).multi_processor_count, **k))
    if not final:
        v["new bc16 rb32 w8 s3 libdevice sin/cos"] = (
            lambda *a, **k: rebuild_keys(*a, impl="blocks", block_chunks=16, rank_block=32, num_warps=8, num_stages=3,
                                         fast_rope=False, **k))
    return v


def _inputs(B, T, gen, n=N):
    U = (torch.randn(B, T, R, device="cuda", generator=gen) / math.sqrt(R)).to(torch.bfloat16)
    SV = torch.randn(B, H, R, D, device="cuda", generator=gen).to(torch.bfloat16)
    idx = torch.rand(B, H, T // C, device="cuda", generator=gen).argsort(-1)[..., :n].int().contiguous()
    return U, SV, idx


def correctness(vs):
    from kernels.rebuild import rebuild_keys_ref
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
    from kernels.timing import capture_graph, event_times
    bufs = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(2)]

    def cp(b=bufs):
        b[1].copy_(b[0])
    t = statistics.median(event_times(capture_graph(cp, [cp]).replay, 10, warmup=2))
    bufs.clear()
    return 2 * (1 << 30) / (t * 1e-3)


def _cold_times(fns, flush, reps=30):
    """per-launch ms of a graph replay of all `fns` (one launch per input set), an L2 flush before each replay."""
    from kernels.timing import capture_graph

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


if __name__ == "__main__":
    from kernels.timing import provenance
    args = sys.argv[1:]
    out = args[args.index("--out") + 1] if "--out" in args else os.path.join(os.environ.get("OUT", "."),
                                                                             "devcheck-rebuild.json")
    t0 = time.time()
    prov = provenance("PYTHONPATH=. python3 kernels/devcheck_rebuild.py " + " ".join(args))
    print(prov, flush=True)
    vs = variants(quick="--quick" in args, final="--final" in args)
    ok = correctness(vs)
    print(f"correctness: {'ALL PASS' if all(ok.values()) else 'SOME FAIL'}", flush=True)
    timing(vs, ok, out, prov, quick="--quick" in args, t_start=t0, budget_s=float(os.environ.get("BUDGET_S", 200)))
