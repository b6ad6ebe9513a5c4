"""GPU check of the engine's top-k and forced-miss kernels (issue 9), in one call:

    PYTHONPATH=. python3 -m kernels.engine.devcheck_select [out.json]
    PYTHONPATH=. python3 -m kernels.engine.devcheck_select topk [out.json]    # the two-stage "seg" top-k
        against "stream" / "bits", 128K and 32K, batch 1 / 16 / 64, one and two query tokens (see topk_main;
        TOPK_WARM=only fills Triton's cache in parallel processes and stops, TOPK_WARM=0 skips that)

With a cold Triton cache the compiles of part (a) take about 2 minutes on the H200 (run 2 of issue 9
timed nothing but the perturbation); keep TRITON_CACHE_DIR across calls or raise the time guards.

(a) correctness on fresh random inputs, outputs poisoned (-7) first: the streaming and bit-search
    top-k kernels and the previous kernel (as it was before issue 9) against the exact
    torch twin `topk_from_scratch_ref`, on pass-1 output from bf16 and fp32 queries / landmarks and on
    tie-heavy synthetic scratch, N not a power of two, k == N; perturb_fast against perturb_fast_ref and
    its contract; both captured in a CUDA graph and replayed.
(b) timing, before / after in the same process: each call captured alone in a CUDA graph, L2 flushed
    and the GPU kept busy (a sleep kernel) before the start event, so the interval is device time of
    the kernel only; min / median / max of REPS replays after warm-up; against the byte floor (bytes
    that must be read / 4.25 TB/s, the H200's measured HBM copy rate). Llama-3-8B shapes: 8 KV heads,
    group 4, 2 query tokens, k = 256, N = 4096 (32K context) and 16384 (128K), batch 4 / 16 / 64.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

HBM = 4.25e12
REPS = 25
T0 = time.time()


# --- the kernels as they were before issue 9 (commit 144f93e), for the before / after timing -------
# The previous top-k kernel is kept in fastselect as `_bits_topk_kernel` (the same arithmetic); it is
# launched here with its previous geometry.

def old_topk_from_scratch(scratch, pml, B, H, nq, G, N, k, out):
    GP = triton.next_power_of_2(G)
    BLOCK_M = max(16, triton.next_power_of_2(nq * GP))
    n_split = pml.numel() // (2 * B * H * BLOCK_M)
    NP = triton.next_power_of_2(N)
    nw = 16 if NP >= 8192 else (8 if NP >= 2048 else 4)
    from kernels.engine.fastselect import _bits_topk_kernel
    _bits_topk_kernel[(B * H * nq,)](scratch, pml, out, N, H, G, nq, n_split, k,
                                     GP=GP, BLOCK_M=BLOCK_M, SP=triton.next_power_of_2(n_split), NP=NP,
                                     num_warps=nw)
    return out


@triton.jit
def _old_perturb_kernel(base, out, seed_ptr, salt, K, M, N, stride_f, KP: tl.constexpr, BI: tl.constexpr):
    bh = tl.program_id(0)
    j = tl.arange(0, KP)
    jv = j < K
    b = tl.load(base + bh * K + j, mask=jv, other=0)
    seed = tl.load(seed_ptr) * 1000003 + salt
    off = bh * KP
    r = tl.rand(seed, off + j)
    rank = tl.zeros([KP], tl.int32)
    for i0 in tl.static_range(0, KP, BI):
        i = i0 + tl.arange(0, BI)
        ri = tl.rand(seed, off + i)
        ri = tl.where(i < K, ri, 2.0)
        before = (ri[None, :] < r[:, None]) | ((ri[None, :] == r[:, None]) & (i[None, :] < j[:, None]))
        rank += tl.sum(before.to(tl.int32), 1)
    drop = jv & (rank < M)
    u = tl.rand(seed + 7919, off + rank)
    c = ((rank.to(tl.float32) + u) * stride_f).to(tl.int32)
    x = c
    go = 1
    while go > 0:
        cnt = tl.zeros([KP], tl.int32)
        for i0 in tl.static_range(0, KP, BI):
            i = i0 + tl.arange(0, BI)
            bi = tl.load(base + bh * K + i, mask=i < K, other=2147483647)
            cnt += tl.sum((bi[None, :] <= x[:, None]).to(tl.int32), 1)
        xn = c + cnt
        go = tl.sum((drop & (xn != x)).to(tl.int32), 0)
        x = xn
    tl.store(out + bh * K + j, tl.where(drop, x, b), mask=jv)


def old_perturb_fast(base, miss_rate, n_chunks, seed, salt, out):
    B, H, k = base.shape
    m = int(round(miss_rate * k))
    KP = triton.next_power_of_2(k)
    _old_perturb_kernel[(B * H,)](base, out, seed, salt, k, m, n_chunks, (n_chunks - k) / m,
                                  KP=KP, BI=min(32, KP), num_warps=4)
    return out


# --- helpers ----------------------------------------------------------------------------------------
def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


_flush = None


def device_time(fn, reps=REPS):
    """fn captured alone in a graph; per replay: L2 flush, a sleep kernel, events around the replay."""
    global _flush
    if _flush is None:
        _flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    from kernels.timing import capture_graph
    g = capture_graph(fn, [fn, fn])
    g.replay()
    torch.cuda.synchronize()
    evs = []
    for _ in range(reps):
        _flush.zero_()
        torch.cuda._sleep(200_000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        evs.append((a, b))
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) * 1e3 for a, b in evs)   # us
    return ts[0], ts[len(ts) // 2], ts[-1]


def main(argv):
    from kernels.engine import fastselect
    from kernels.engine.transfer import perturb_fast, perturb_fast_ref
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    res = {"checks": [], "timing": []}
    dev = "cuda"
    log(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    fails = 0

    # ---------------- (a) correctness ----------------
    def check_topk(label, sc, pml, B, H, nq, G, N, k):
        """The three kernels give the same ids (same fp32 arithmetic); against the twin: ids, and the
        chosen chunks' probabilities against the top-k probabilities (tl.exp2 on the GPU may differ
        from torch.exp2 in the last bits, which can reorder exact ties)."""
        nonlocal fails
        want = fastselect.topk_from_scratch_ref(sc, pml, B, H, nq, G, N, k)
        p = fastselect.probs_from_scratch_ref(sc, pml, B, H, nq, G, N)
        outs = {}
        for name in ("stream", "bits", "old"):
            out = torch.full((B, nq, H, k), -7, dtype=torch.int32, device=dev)
            if name == "old":
                old_topk_from_scratch(sc, pml, B, H, nq, G, N, k, out)
            else:
                fastselect.topk_from_scratch(sc, pml, B, H, nq, G, N, k, out=out, method=name)
            outs[name] = out
        same = all(torch.equal(o, outs["old"]) for o in outs.values())
        got = outs["stream"].transpose(1, 2).reshape(B * H, nq, k).long()
        close = bool(torch.allclose(p.gather(-1, got).sort(-1).values, p.topk(k, dim=-1).values.sort(-1).values,
                                    rtol=1e-5, atol=1e-12)) and bool((outs["stream"].diff(dim=-1) > 0).all())
        twin_ids = bool(torch.equal(outs["stream"], want))
        fails += not (same and close)
        res["checks"].append(dict(what=label, kernels_equal=same, twin_probs=close, twin_ids=twin_ids))
        log(f"check top-k {label}: stream == bits == old {same}; top-k probabilities {close}; ids == twin {twin_ids}")

    def synth(B, H, nq, G, N, n_split, ties, seed):
        g = torch.Generator().manual_seed(seed)
        GP = triton.next_power_of_2(G)
        BM = max(16, triton.next_power_of_2(nq * GP))
        sc = torch.randn(B * H, BM, N, generator=g) * 3
        if ties:
            sc = (sc / 2).round() / 2
        pm = torch.randn(B * H, n_split, BM, generator=g) + sc.amax(-1)[:, None, :]
        pl = torch.rand(B * H, n_split, BM, generator=g) * 50 + 1
        return sc.reshape(-1).to(dev), torch.stack([pm, pl], -1).reshape(-1).to(dev)

    for dt in (torch.bfloat16, torch.float32):
        for B, nq, N, k in [(4, 2, 16384, 256), (2, 1, 4096, 256), (2, 2, 3000, 3000), (1, 2, 5001, 640)]:
            try:
                q = torch.randn(B, nq, 32, 128, device=dev, dtype=dt)
                lm = torch.randn(B, 8, N, 128, device=dev, dtype=dt)
                sc, pml, G = fastselect._landmark_pass1(q, lm)
                check_topk(f"{str(dt)[6:]} pass1 B={B} nq={nq} N={N} k={k}", sc, pml, B, 8, nq, G, N, k)
            except Exception as e:  # noqa: BLE001
                fails += dt == torch.bfloat16
                log(f"top-k check error ({dt}, N={N}):", repr(e)[:300])
    for B, nq, G, N, k in [(2, 2, 4, 16384, 256), (2, 2, 8, 777, 100), (1, 1, 1, 4095, 4095), (2, 2, 3, 2000, 300)]:
        try:
            sc, pml = synth(B, 8, nq, G, N, 3, True, N + k)
            check_topk(f"ties synthetic B={B} nq={nq} G={G} N={N} k={k}", sc, pml, B, 8, nq, G, N, k)
        except Exception as e:  # noqa: BLE001
            fails += 1
            log(f"top-k check error (ties, N={N}):", repr(e)[:300])

    try:
        for B, N, k, rate, asc in [(4, 16384, 256, 0.33, True), (16, 16384, 256, 0.174, True),
                                   (4, 16384, 256, 0.33, False), (3, 1000, 37, 0.5, False)]:
            g = torch.Generator().manual_seed(B + N)
            base = torch.rand(B, 8, N, generator=g).argsort(-1)[..., :k]
            base = (base.sort(-1).values if asc else base).int().contiguous().to(dev)
            seed = torch.tensor([1234], dtype=torch.int32, device=dev)
            out = torch.full_like(base, -7)
            p = perturb_fast(base, rate, N, seed, 7, out=out)
            twin = bool(torch.equal(p, perturb_fast_ref(base, rate, N, seed, 7)))
            m = round(rate * k)
            same = p == base
            inb = (p[..., :, None] == base[..., None, :]).any(-1)
            contract = bool((same.sum(-1) == k - m).all() and (inb == same).all()
                            and (p.sort(-1).values.diff(dim=-1) > 0).all() and int(p.min()) >= 0 and int(p.max()) < N)
            # captured in a graph: replays with an advanced seed give the twin's draw of that seed
            gout = torch.full_like(base, -7)
            s2 = torch.cuda.Stream()
            s2.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s2):
                perturb_fast(base, rate, N, seed, 7, out=gout)
            torch.cuda.current_stream().wait_stream(s2)
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                perturb_fast(base, rate, N, seed, 7, out=gout)
            seed.add_(1)
            gr.replay()
            torch.cuda.synchronize()
            graph = bool(torch.equal(gout, perturb_fast_ref(base, rate, N, seed, 7)))
            fails += not (twin and contract and graph)
            res["checks"].append(dict(what=f"perturb B={B} N={N} k={k} rate={rate} asc={asc}", twin=twin,
                                      contract=contract, graph=graph))
            log(f"check perturb B={B} N={N} k={k} rate={rate} ascending={asc}: twin {twin} contract {contract} "
                f"graph replay {graph}")
    except Exception as e:  # noqa: BLE001
        fails += 1
        log("perturb check error:", repr(e))

    # ---------------- (b) timing ----------------
    variants = [("auto (default)", {}), ("stream blk1024 w4", dict(blk=1024, num_warps=4, method="stream")),
                ("stream blk2048 w8", dict(blk=2048, num_warps=8, method="stream")),
                ("stream 5-ary cut blk1024 w4", dict(blk=1024, num_warps=4, method="stream", search="5ary"))]
    log("auto: bits when N < 8192; else stream, blk 1024 / 4 warps when programs >= 4 x SMs, else blk 2048 / 8 warps")
    H, G, nq, k = 8, 4, 2, 256
    for N in (16384, 4096):
        for B in (64, 16, 4):
            if time.time() - T0 > 125:
                log("time guard: stopping the top-k timing here")
                break
            q = torch.randn(B, nq, 32, 128, device=dev, dtype=torch.bfloat16)
            lm = torch.randn(B, H, N, 128, device=dev, dtype=torch.bfloat16)
            sc, pml, _ = fastselect._landmark_pass1(q, lm)
            del lm
            floor = B * H * nq * G * N * 4 / HBM * 1e6
            out = torch.empty(B, nq, H, k, device=dev, dtype=torch.int32)
            t_old = device_time(lambda: old_topk_from_scratch(sc, pml, B, H, nq, G, N, k, out))
            ref_out = out.clone()
            line = dict(kernel="top-k", N=N, context=N * 8, B=B, floor_us=floor, old=t_old)
            log(f"top-k N={N:5d} ({N * 8 // 1024}K) B={B:2d}: floor {floor:7.1f} us | old min/med/max "
                f"{t_old[0]:7.1f}/{t_old[1]:7.1f}/{t_old[2]:7.1f} us ({t_old[1] / floor:5.2f}x floor)")
            for name, kw in variants:
                if time.time() - T0 > 132:
                    break
                t = device_time(lambda: fastselect.topk_from_scratch(sc, pml, B, H, nq, G, N, k, out=out, **kw))
                same = bool(torch.equal(out, ref_out))
                line[name] = t
                log(f"    {name:18s} min/med/max {t[0]:7.1f}/{t[1]:7.1f}/{t[2]:7.1f} us ({t[1] / floor:5.2f}x floor, "
                    f"{t_old[1] / t[1]:5.2f}x faster than old) same ids as old: {same}")
            res["timing"].append(line)
            del sc, pml
            torch.cuda.empty_cache()
    for N in (16384, 4096):
        for B in (4, 16, 64):
            if time.time() - T0 > 138:
                break
            g = torch.Generator().manual_seed(B)
            base = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].sort(-1).values.int().contiguous().to(dev)
            seed = torch.tensor([77], dtype=torch.int32, device=dev)
            out = torch.empty_like(base)
            floor = 2 * base.numel() * 4 / HBM * 1e6
            for rate in (0.33, 0.174):
                t_old = device_time(lambda: old_perturb_fast(base, rate, N, seed, 3, out))
                t_new = device_time(lambda: perturb_fast(base, rate, N, seed, 3, out=out))
                res["timing"].append(dict(kernel="perturb", N=N, B=B, rate=rate, floor_us=floor, old=t_old, new=t_new))
                log(f"perturb N={N:5d} B={B:2d} rate={rate}: floor {floor:5.2f} us | old min/med/max "
                    f"{t_old[0]:6.1f}/{t_old[1]:6.1f}/{t_old[2]:6.1f} us | new {t_new[0]:6.1f}/{t_new[1]:6.1f}/"
                    f"{t_new[2]:6.1f} us ({t_old[1] / t_new[1]:5.1f}x faster)")
    res["fails"] = fails
    path = argv[0] if argv else os.path.join(os.environ.get("OUT", "."), "devcheck_select.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    log(f"correctness failures: {fails}; wrote {path}")
    return 1 if fails else 0


# --- the two-stage "seg" top-k against the stream / bits kernels (issue: faster exact top-k) ---------
#     PYTHONPATH=. python3 -m kernels.engine.devcheck_select topk [out.json]
# Pass-1 output of random bf16 queries / landmarks (Llama-3-8B: 32 query heads, 8 KV heads, d 128),
# k = 256, N = 16384 (128K) and 4096 (32K), batch 1 / 16 / 64, one and two query tokens. First, in
# parallel processes, one launch of every variant (fills Triton's disk cache: compiles dominate a cold
# run); then, in this process, each variant timed as above (graph, L2 flush, REPS replays) against the
# byte floor: the scratch rows read once (B * H * nq * G * N fp32) at the HBM copy rate measured here.
# Also pass 1 with more splits (min split 256 chunks instead of 1024) and the top-k on its output.

TOPK_POINTS = [(N, B, nq) for N in (16384, 4096) for B in (1, 16, 64) for nq in (2, 1)]
SEG_SWEEP = {(16384, 1, 2), (16384, 16, 2), (16384, 64, 2), (4096, 1, 2), (4096, 16, 2), (4096, 64, 2),
             (16384, 1, 1), (4096, 1, 1)}


def _splits(N, B, H, min_split):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(triton.cdiv(4 * sms, B * H), N // min_split))


def _topk_inputs(N, B, nq, min_split=1024, seed=0):
    from kernels.engine import fastselect
    g = torch.Generator(device="cuda").manual_seed(seed + N + B + nq)
    q = torch.randn(B, nq, 32, 128, device="cuda", generator=g).bfloat16()
    lm = torch.randn(B, 8, N, 128, device="cuda", generator=g).bfloat16()
    sc, pml, G = fastselect._landmark_pass1(q, lm, splits=_splits(N, B, 8, min_split))
    return q, lm, sc, pml, G


def _topk_variants(N, B, nq):
    v = [("bits", dict(method="bits")), ("stream", dict(method="stream")), ("seg", dict(method="seg")),
         ("seg cuts 1", dict(method="seg", cuts=1)), ("seg cuts 4", dict(method="seg", cuts=4))]
    if (N, B, nq) in SEG_SWEEP:
        v += [(f"seg {s}", dict(method="seg", seg=s)) for s in (1024, 2048, 4096)]
        v += [("seg 4096 w4", dict(method="seg", seg=4096, num_warps=4)),
              ("seg 2048 w8", dict(method="seg", seg=2048, num_warps=8)),
              ("seg radix", dict(method="seg", search="radix"))]
    return v


def _seg_stage1(sc, pml, B, H, nq, G, N, k):
    """Stage 1 of the default "seg" alone (for the split of its time between the stages)."""
    from kernels.engine import fastselect as fs
    GP = triton.next_power_of_2(G)
    BM = max(16, triton.next_power_of_2(nq * GP))
    n_split = pml.numel() // (2 * B * H * BM)
    seg, S, KK, CP = fs._seg_geometry(B, H, nq, N, k, None, sc.device)
    rows = B * H * nq
    cb = torch.empty(rows * S * KK, device="cuda", dtype=torch.int32)
    ci = torch.empty_like(cb)
    info = torch.empty(rows * S * 4, device="cuda", dtype=torch.int32)
    return lambda: fs._seg_topk_kernel[(rows, S)](sc, pml, cb, ci, info, N, H, G, nq, n_split, k, KK, S, GP=GP,
                                                  BLOCK_M=BM, SP=triton.next_power_of_2(n_split), SEG=seg, SEARCH=0,
                                                  CUTS=fs.SEG_CUTS, num_warps=fs._seg_warps(seg, rows * S))


@triton.jit
def _empty_kernel(x):
    pass


def _warm_worker(points):
    from kernels.engine import fastselect
    for N, B, nq in points:
        for ms in (1024, 256):
            q, lm, sc, pml, G = _topk_inputs(N, B, nq, ms)
            vs = _topk_variants(N, B, nq) if ms == 1024 else [("seg", dict(method="seg"))]
            for name, kw in vs:
                try:
                    fastselect.topk_from_scratch(sc, pml, B, 8, nq, G, N, 256, **kw)
                except Exception as e:  # noqa: BLE001  (reported again, and skipped, by the timing)
                    print(f"warm-up {name} N={N} B={B} nq={nq}: {e!r}"[:400], flush=True)
            if ms == 1024:
                _seg_stage1(sc, pml, B, 8, nq, G, N, 256)()
            torch.cuda.synchronize()
            del q, lm, sc, pml
    return len(points)


def topk_main(argv):
    import multiprocessing as mp
    from kernels.engine import fastselect
    from kernels.engine.devcheck_select import _warm_worker     # by module name (spawned processes)
    from kernels.timing import provenance
    path = argv[0] if argv else os.path.join(os.environ.get("OUT", "."), "devcheck-topk.json")
    res = dict(schema=1, what="engine chunk-selection top-k: two-stage 'seg' against 'stream' / 'bits'",
               provenance=provenance("PYTHONPATH=. python3 -m kernels.engine.devcheck_select topk"),
               reps=REPS, k=256, H=8, G=4, timing=[], checks=[])
    log(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    # warm Triton's cache in parallel (one process per point)
    warm = os.environ.get("TOPK_WARM", "1")     # 0: the cache is warm already; only: warm it and stop
    if warm != "0":
        ctx = mp.get_context("spawn")
        with ctx.Pool(min(12, len(TOPK_POINTS))) as pool:
            pool.map(_warm_worker, [[p] for p in TOPK_POINTS], chunksize=1)
        log("compiled (parallel warm-up done)")
        if warm == "only":
            return 0
    # HBM rate measured here (reported; the floors use HBM = 4.25 TB/s, the H200 copy rate of the README)
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    tc = device_time(lambda: y.copy_(x))
    tr = device_time(lambda: torch.sum(x))
    res["hbm_copy_gbps_here"] = 2 * 4 * x.numel() / (tc[1] * 1e-6) / 1e9
    res["hbm_read_gbps_here"] = 4 * x.numel() / (tr[1] * 1e-6) / 1e9
    del x, y
    hbm = HBM
    res["floor_hbm_gbps"] = HBM / 1e9
    z = torch.zeros(1, device="cuda")
    res["empty_kernel_us"] = device_time(lambda: _empty_kernel[(1,)](z))
    log(f"HBM here: copy (1 GiB fp32 read + write) {res['hbm_copy_gbps_here']:.0f} GB/s, read (sum) "
        f"{res['hbm_read_gbps_here']:.0f} GB/s; floors at {HBM / 1e9:.0f} GB/s; an empty kernel: "
        f"{res['empty_kernel_us'][1]:.1f} us (launch floor of this timing)")
    fails = 0

    def dump():
        res["fails"] = fails
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    H, k = 8, 256
    for N, B, nq in TOPK_POINTS:
        if time.time() - T0 > float(os.environ.get("TOPK_GUARD_S", "200")):
            log("time guard: stopping the timing here")
            break
        q, lm, sc, pml, G = _topk_inputs(N, B, nq)
        floor = B * H * nq * G * N * 4 / hbm * 1e6
        line = dict(N=N, context=N * 8, B=B, nq=nq, floor_us=floor, n_split=pml.numel() // (2 * B * H * 16),
                    seg_default=fastselect._seg_geometry(B, H, nq, N, k, None, sc.device)[0],
                    cuts_default=fastselect.SEG_CUTS)
        outs = {}
        for name, kw in _topk_variants(N, B, nq):
            out = torch.full((B, nq, H, k), -7, dtype=torch.int32, device="cuda")
            try:
                t = device_time(lambda: fastselect.topk_from_scratch(sc, pml, B, H, nq, G, N, k, out=out, **kw))
            except Exception as e:  # noqa: BLE001
                fails += 1
                log(f"{name} failed: {e!r}"[:400])
                continue
            outs[name] = out
            line[name] = t
        try:
            line["seg stage 1"] = device_time(_seg_stage1(sc, pml, B, H, nq, G, N, k))
            same = {n: bool(torch.equal(o, outs["bits"])) for n, o in outs.items()}
            p = fastselect.probs_from_scratch_ref(sc, pml, B, H, nq, G, N)
            want = p.topk(k, dim=-1).values.sort(-1).values
            got = outs["seg"].transpose(1, 2).reshape(B * H, nq, k).long()
            probs_ok = bool(torch.allclose(p.gather(-1, got).sort(-1).values, want, rtol=1e-5, atol=1e-12)) \
                and bool((outs["seg"].diff(dim=-1) > 0).all())
            fails += not (all(same.values()) and probs_ok)
            res["checks"].append(dict(N=N, B=B, nq=nq, same_ids_as_bits=same, seg_topk_probs=probs_ok))
            del p, want, got
            # pass 1 with min split 256 (more programs at small batch), and the seg top-k on its output
            s_old, s_new = _splits(N, B, H, 1024), _splits(N, B, H, 256)
            line["pass1_splits"] = [s_old, s_new]
            line["pass1 (min split 1024)"] = device_time(lambda: fastselect._landmark_pass1(q, lm, splits=s_old))
            if s_new != s_old:
                line["pass1 (min split 256)"] = device_time(lambda: fastselect._landmark_pass1(q, lm, splits=s_new))
                sc2, pml2, _ = fastselect._landmark_pass1(q, lm, splits=s_new)
                out = torch.empty(B, nq, H, k, dtype=torch.int32, device="cuda")
                line["seg (pass1 min split 256)"] = device_time(
                    lambda: fastselect.topk_from_scratch(sc2, pml2, B, H, nq, G, N, k, out=out, method="seg"))
                line["seg ids equal across pass-1 splits"] = bool(torch.equal(out, outs["seg"]))
                del sc2, pml2
        except Exception as e:  # noqa: BLE001
            fails += 1
            log(f"N={N} B={B} nq={nq}: {e!r}"[:400])
        res["timing"].append(line)
        msg = " | ".join(f"{n} {line[n][1]:.1f} ({line[n][1] / floor:.2f}x)" for n, _ in _topk_variants(N, B, nq)
                         if n in line)
        nan = [0, float("nan")]
        log(f"N={N} B={B} nq={nq} floor {floor:.1f} us seg={line['seg_default']} | {msg} | stage1 "
            f"{line.get('seg stage 1', nan)[1]:.1f} | checks {res['checks'][-1:]} | pass1 splits "
            f"{line.get('pass1_splits')}: {line.get('pass1 (min split 1024)', nan)[1]:.1f} -> "
            f"{line.get('pass1 (min split 256)', nan)[1]:.1f} us, seg after {line.get('seg (pass1 min split 256)', nan)[1]:.1f}")
        dump()
        del q, lm, sc, pml
        torch.cuda.empty_cache()
    dump()
    log(f"failures: {fails}; wrote {path}")
    return 1 if fails else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["topk"]:
        sys.exit(topk_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
