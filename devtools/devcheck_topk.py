"""GPU check of the engine's exact top-k (fastselect.topk_from_scratch): the two-stage "seg" kernels
(the default) against the "stream" and "bits" kernels, their ids and their time against the byte floor.

    PYTHONPATH=. python3 -m devtools.devcheck_topk [out.json]
        TOPK_WARM=only fills Triton's cache in parallel processes and stops, TOPK_WARM=0 skips that;
        TOPK_GUARD_S (default 200) stops starting new points after that many seconds

Pass-1 output of random bf16 queries / landmarks (Llama-3-8B: 32 query heads, 8 KV heads, d 128),
k = 256, N = 16384 (128K) and 4096 (32K), batch 1 / 16 / 64, one and two query tokens. First, in
parallel processes, one launch of every variant (fills Triton's disk cache: compiles dominate a cold
run); then, in this process, each variant captured alone in a CUDA graph, L2 flushed and the GPU kept
busy (a sleep kernel) before the start event, so the interval is device time of the kernel only;
min / median / max of REPS replays, against the byte floor: the stored scores read once
(B * H * nq * G * N in fastselect.SCORES, fp16; fp32 when devcheck-topk.json was recorded) at
4.25 TB/s (the H200's HBM copy rate; the rate measured here is reported beside it). Checks: every
variant's ids equal the bits kernel's, and the seg top-k's chosen probabilities are the top-k of the
torch twin's. Also pass 1 with more splits (min split 256 chunks instead of 1024) and the seg top-k
on its output.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton

HBM = 4.25e12
REPS = 25
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


_flush = None


def device_time(fn, reps=REPS):
    """fn captured alone in a graph; per replay: L2 flush, a sleep kernel, events around the replay."""
    global _flush
    if _flush is None:
        _flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    from ddbench.kernels.timing import capture_graph
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


TOPK_POINTS = [(N, B, nq) for N in (16384, 4096) for B in (1, 16, 64) for nq in (2, 1)]
SEG_SWEEP = {(16384, 1, 2), (16384, 16, 2), (16384, 64, 2), (4096, 1, 2), (4096, 16, 2), (4096, 64, 2),
             (16384, 1, 1), (4096, 1, 1)}


def _splits(N, B, H, min_split):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(triton.cdiv(4 * sms, B * H), N // min_split))


def _topk_inputs(N, B, nq, min_split=1024, seed=0):
    from ddbench.kernels.engine import fastselect
    g = torch.Generator(device="cuda").manual_seed(seed + N + B + nq)
    q = torch.randn(B, nq, 32, 128, device="cuda", generator=g).bfloat16()
    lm = torch.randn(B, 8, N, 128, device="cuda", generator=g).bfloat16()
    sc, pml, G = fastselect.landmark_pass1(q, lm, splits=_splits(N, B, 8, min_split))
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
    from ddbench.kernels.engine import fastselect as fs
    GP = triton.next_power_of_2(G)
    BM = max(16, triton.next_power_of_2(nq * GP))
    n_split = pml.numel() // (2 * B * H * BM)
    seg, S, KK, CP = fs._seg_geometry(B, H, nq, N, k, None, sc.device)
    rows = B * H * nq
    cb = torch.empty(rows * S * KK, device="cuda", dtype=torch.int32)
    ci = torch.empty_like(cb)
    info = torch.empty(rows * S * 4, device="cuda", dtype=torch.int32)
    return lambda: fs.seg_topk_kernel[(rows, S)](sc, pml, cb, ci, info, N, H, G, nq, n_split, k, KK, S, info, GP=GP,
                                                 BLOCK_M=BM, SP=triton.next_power_of_2(n_split), SEG=seg, SEARCH=0,
                                                 CUTS=fs.SEG_CUTS, num_warps=fs._seg_warps(seg, rows * S))


@triton.jit
def _empty_kernel(x):
    pass


def _warm_worker(points):
    from ddbench.kernels.engine import fastselect
    for N, B, nq in points:
        for ms in (1024, 256):
            q, lm, sc, pml, G = _topk_inputs(N, B, nq, ms)
            vs = _topk_variants(N, B, nq) if ms == 1024 else [("seg", dict(method="seg"))]
            for name, kw in vs:
                try:
                    fastselect.topk_from_scratch(sc, pml, fastselect.TopkShape(B, 8, nq, G, N, 256),
                                                 how=fastselect.TopkMethod(**kw))
                except Exception as e:  # noqa: BLE001  (reported again, and skipped, by the timing)
                    print(f"warm-up {name} N={N} B={B} nq={nq}: {e!r}"[:400], flush=True)
            if ms == 1024:
                _seg_stage1(sc, pml, B, 8, nq, G, N, 256)()
            torch.cuda.synchronize()
            del q, lm, sc, pml
    return len(points)


def topk_main(argv):
    from devtools._common import command
    from ddbench.kernels.timing import provenance
    path = argv[0] if argv else os.path.join(os.environ.get("OUT", "."), "devcheck-topk.json")
    res = dict(schema=1, what="engine chunk-selection top-k: two-stage 'seg' against 'stream' / 'bits'",
               provenance=provenance(command("devcheck_topk", argv)),
               reps=REPS, k=256, H=8, G=4, timing=[], checks=[], fails=0)
    log(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    warm = os.environ.get("TOPK_WARM", "1")     # 0: the cache is warm already; only: warm it and stop
    if warm != "0":
        _warm_in_parallel()
        if warm == "only":
            return 0
    _rates_here(res)

    def dump():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    for N, B, nq in TOPK_POINTS:
        if time.time() - T0 > float(os.environ.get("TOPK_GUARD_S", "200")):
            log("time guard: stopping the timing here")
            break
        _topk_point(res, N, B, nq)
        dump()
        torch.cuda.empty_cache()
    dump()
    log(f"failures: {res['fails']}; wrote {path}")
    return 1 if res["fails"] else 0


def _warm_in_parallel():
    """Triton's cache filled by one spawned process per point (compiles dominate a cold run)."""
    import multiprocessing as mp
    from devtools.devcheck_topk import _warm_worker     # by module name (spawned processes)
    ctx = mp.get_context("spawn")
    with ctx.Pool(min(12, len(TOPK_POINTS))) as pool:
        pool.map(_warm_worker, [[p] for p in TOPK_POINTS], chunksize=1)
    log("compiled (parallel warm-up done)")


def _rates_here(res):
    """The HBM rates measured here (reported; the floors use HBM = 4.25 TB/s, the H200 copy rate of the
    README) and an empty kernel's time (the launch floor of this timing)."""
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    tc = device_time(lambda: y.copy_(x))
    tr = device_time(lambda: torch.sum(x))
    res["hbm_copy_gbps_here"] = 2 * 4 * x.numel() / (tc[1] * 1e-6) / 1e9
    res["hbm_read_gbps_here"] = 4 * x.numel() / (tr[1] * 1e-6) / 1e9
    del x, y
    res["floor_hbm_gbps"] = HBM / 1e9
    z = torch.zeros(1, device="cuda")
    res["empty_kernel_us"] = device_time(lambda: _empty_kernel[(1,)](z))
    log(f"HBM here: copy (1 GiB fp32 read + write) {res['hbm_copy_gbps_here']:.0f} GB/s, read (sum) "
        f"{res['hbm_read_gbps_here']:.0f} GB/s; floors at {HBM / 1e9:.0f} GB/s; an empty kernel: "
        f"{res['empty_kernel_us'][1]:.1f} us (launch floor of this timing)")


def _topk_point(res, N, B, nq, H=8, k=256):
    """One point: every variant timed against the floor, then the checks and the pass-1 splits."""
    from ddbench.kernels.engine import fastselect
    q, lm, sc, pml, G = _topk_inputs(N, B, nq)
    floor = B * H * nq * G * N * sc.element_size() / HBM * 1e6     # the stored scores, read once
    line = dict(N=N, context=N * 8, B=B, nq=nq, floor_us=floor, n_split=pml.numel() // (2 * B * H * 16),
                seg_default=fastselect._seg_geometry(B, H, nq, N, k, None, sc.device)[0],
                cuts_default=fastselect.SEG_CUTS)
    outs = {}
    for name, kw in _topk_variants(N, B, nq):
        out = torch.full((B, nq, H, k), -7, dtype=torch.int32, device="cuda")
        try:
            t = device_time(lambda: fastselect.topk_from_scratch(sc, pml, fastselect.TopkShape(B, H, nq, G, N, k), out,
                                                                 how=fastselect.TopkMethod(**kw)))
        except Exception as e:  # noqa: BLE001
            res["fails"] += 1
            log(f"{name} failed: {e!r}"[:400])
            continue
        outs[name] = out
        line[name] = t
    try:
        line["seg stage 1"] = device_time(_seg_stage1(sc, pml, B, H, nq, G, N, k))
        res["fails"] += not _check_ids(res, outs, sc, pml, B, H, nq, G, N, k)
        _pass1_splits(line, outs, q, lm, B, H, nq, G, N, k)
    except Exception as e:  # noqa: BLE001
        res["fails"] += 1
        log(f"N={N} B={B} nq={nq}: {e!r}"[:400])
    res["timing"].append(line)
    _log_point(res, line, N, B, nq, floor)


def _check_ids(res, outs, sc, pml, B, H, nq, G, N, k):
    """Every variant's ids equal the bits kernel's; the seg top-k's probabilities are the twin's top-k."""
    from ddbench.kernels.engine import fastselect
    same = {n: bool(torch.equal(o, outs["bits"])) for n, o in outs.items()}
    p = fastselect.probs_from_scratch_ref(sc, pml, B, H, nq, G, N)
    want = p.topk(k, dim=-1).values.sort(-1).values
    got = outs["seg"].transpose(1, 2).reshape(B * H, nq, k).long()
    probs_ok = bool(torch.allclose(p.gather(-1, got).sort(-1).values, want, rtol=1e-5, atol=1e-12)) \
        and bool((outs["seg"].diff(dim=-1) > 0).all())
    res["checks"].append(dict(N=N, B=B, nq=nq, same_ids_as_bits=same, seg_topk_probs=probs_ok))
    return all(same.values()) and probs_ok


def _pass1_splits(line, outs, q, lm, B, H, nq, G, N, k):
    """Pass 1 with min split 256 (more programs at small batch), and the seg top-k on its output."""
    from ddbench.kernels.engine import fastselect
    s_old, s_new = _splits(N, B, H, 1024), _splits(N, B, H, 256)
    line["pass1_splits"] = [s_old, s_new]
    line["pass1 (min split 1024)"] = device_time(lambda: fastselect.landmark_pass1(q, lm, splits=s_old))
    if s_new != s_old:
        line["pass1 (min split 256)"] = device_time(lambda: fastselect.landmark_pass1(q, lm, splits=s_new))
        sc2, pml2, _ = fastselect.landmark_pass1(q, lm, splits=s_new)
        out = torch.empty(B, nq, H, k, dtype=torch.int32, device="cuda")
        line["seg (pass1 min split 256)"] = device_time(
            lambda: fastselect.topk_from_scratch(sc2, pml2, fastselect.TopkShape(B, H, nq, G, N, k), out,
                                                 how=fastselect.TopkMethod(method="seg")))
        line["seg ids equal across pass-1 splits"] = bool(torch.equal(out, outs["seg"]))


def _log_point(res, line, N, B, nq, floor):
    msg = " | ".join(f"{n} {line[n][1]:.1f} ({line[n][1] / floor:.2f}x)" for n, _ in _topk_variants(N, B, nq)
                     if n in line)
    nan = [0, float("nan")]
    log(f"N={N} B={B} nq={nq} floor {floor:.1f} us seg={line['seg_default']} | {msg} | stage1 "
        f"{line.get('seg stage 1', nan)[1]:.1f} | checks {res['checks'][-1:]} | pass1 splits "
        f"{line.get('pass1_splits')}: {line.get('pass1 (min split 1024)', nan)[1]:.1f} -> "
        f"{line.get('pass1 (min split 256)', nan)[1]:.1f} us, seg after {line.get('seg (pass1 min split 256)', nan)[1]:.1f}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from devtools._common import refusal
    if (err := refusal("devcheck_topk")):
        print(err, file=sys.stderr)
        return 2
    return topk_main(argv)


if __name__ == "__main__":
    sys.exit(main())
