"""Kernel benchmarks against their physical floors (run by `ddbench bench kernels`).

run_all(quick=False) -> (rows, ceilings): one dict per measurement with
    kernel, variant, batch, shape, bytes, latency_ms, gbps, floor_ms, pct_of_floor, vs, time_ratio_vs, notes
Floors are measured in the same run: the HBM device-to-device copy (read+write bytes over time)
for on-GPU kernels, and one big pinned host-to-device copy of the same bytes for the gathers.
pct_of_floor = 100 * floor_ms / latency_ms. time_ratio_vs = latency_ms / (latency of `vs`).
"""

from __future__ import annotations

import sys
import math

import torch

from ddbench.core.designs import SPECACHE
from ddbench.kernels.attention import dual_sparse_attention
from ddbench.kernels.indexbench import bench_index
from ddbench.kernels.gather import gather_cpu_staging, gather_per_chunk, gather_ref, gather_uva
from ddbench.kernels.landmarks import build_landmarks
from ddbench.kernels.layout import alloc_host_kv
from ddbench.kernels.rebuild import RebuildLaunch, rebuild_keys
from ddbench.kernels.select import score_chunks, select_chunks
from ddbench.kernels.specache import quantize_keys_2bit, specache_scores, specache_scores_triton
from ddbench.kernels.timing import time_cuda, time_host

MiB = 1 << 20
COLUMNS = ["kernel", "variant", "batch", "shape", "bytes", "latency_ms", "gbps", "floor_ms", "pct_of_floor",
           "vs", "time_ratio_vs", "notes"]


class Rows(list):
    def add(self, kernel, variant, batch, shape, nbytes, ms, floor_ms=None, vs=None, notes=""):
        # the latest row of `vs` at this batch: the one measured beside it (same shape loop)
        ref = next((r for r in reversed(self) if r["kernel"] == kernel and r["variant"] == vs and r["batch"] == batch),
                   None)
        self.append({"kernel": kernel, "variant": variant, "batch": batch, "shape": shape, "bytes": int(nbytes),
                     "latency_ms": round(ms, 5), "gbps": round(nbytes / ms / 1e6, 2) if nbytes else "",
                     "floor_ms": round(floor_ms, 5) if floor_ms else "",
                     "pct_of_floor": round(100 * floor_ms / ms, 1) if floor_ms else "",
                     "vs": vs or "", "time_ratio_vs": round(ms / ref["latency_ms"], 3) if ref else "", "notes": notes})
        print(f"  {kernel:10s} {variant:28s} B={batch:<3} {ms:9.4f} ms"
              + (f"  {nbytes / ms / 1e6:8.1f} GB/s" if nbytes else "")
              + (f"  {100 * floor_ms / ms:5.1f}% of floor" if floor_ms else "")
              + (f"  x{ms / ref['latency_ms']:.3f} vs {vs}" if ref else "") + (f"  {notes}" if notes else ""), flush=True)


def _rand_bf16(*shape, dev="cuda"):
    return torch.randn(*shape, device=dev, dtype=torch.bfloat16)


def ceilings(dev) -> dict:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    b = torch.empty_like(a)
    # no graph: a D2D memcpy node in a CUDA graph runs on a copy engine (~2.7 TB/s here), not on the SMs
    hbm = 2 * n / time_cuda(lambda: b.copy_(a), inner=5, reps=10, graph=False) / 1e6
    del a, b
    h = torch.empty(n, dtype=torch.uint8, pin_memory=True).random_(0, 255)
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    h2d = n / time_cuda(lambda: d.copy_(h, non_blocking=True), inner=1, reps=5) / 1e6
    return {"hbm_copy_gbps_rw": hbm, "h2d_1gib_gbps": h2d}


def bench_gather(rows: Rows, dev, quick: bool):
    H, N, n, C, d = 8, 2048, 256, 8, 128  # 2048-token budget of 4 KiB chunks per (request, head)
    batches = (1, 8) if quick else (1, 8, 32)
    host = alloc_host_kv(1, max(batches), H, N, C, d)
    tile = torch.empty(128 * MiB, dtype=torch.int16).random_(-16000, 16000)  # finite bf16 bit patterns
    words = host.view(torch.int16).view(-1)
    for s in range(0, words.numel(), tile.numel()):  # repeat a 256 MiB random tile (fast fill)
        words[s:s + tile.numel()] = tile[:words.numel() - s]
    flat = host.view(-1)
    for B in batches:
        hkv = host[:, :B]
        nbytes = B * H * n * 4096
        idx = torch.rand(B, H, N, device=dev).argsort(-1)[..., :n].sort(-1).values.int()
        k_out = torch.full((B, H, n * C, d), float("nan"), device=dev, dtype=torch.bfloat16)
        v_out = torch.full_like(k_out, float("nan"))
        shape = f"{B}x{H}x{n} chunks of 4KiB"
        big = torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16)
        t_big = time_cuda(lambda: big.copy_(flat[:nbytes // 2], non_blocking=True), inner=2, reps=10)
        rows.add("gather", "one_big_copy", B, f"{nbytes // MiB} MiB contiguous", nbytes, t_big)
        gather_uva(hkv, 0, idx, k_out, v_out)
        kr, vr = torch.empty_like(k_out), torch.empty_like(v_out)
        gather_ref(hkv, 0, idx, kr, vr)
        ok = torch.equal(k_out.view(torch.int16), kr.view(torch.int16)) and torch.equal(v_out.view(torch.int16), vr.view(torch.int16))
        del kr, vr
        t = time_cuda(lambda: gather_uva(hkv, 0, idx, k_out, v_out), inner=2, reps=10)
        rows.add("gather", "uva_persistent_32", B, shape, nbytes, t, t_big, "one_big_copy", f"equal_to_ref={ok}")
        if B == 8:
            for progs in (16, 64, 132):
                t = time_cuda(lambda: gather_uva(hkv, 0, idx, k_out, v_out, programs=progs), inner=2, reps=10)
                rows.add("gather", f"uva_persistent_{progs}", B, shape, nbytes, t, t_big, "one_big_copy")
            for items in (1, 4):
                t = time_cuda(lambda: gather_uva(hkv, 0, idx, k_out, v_out, items=items), inner=2, reps=10)
                rows.add("gather", f"uva_persistent_32_items{items}", B, shape, nbytes, t, t_big, "one_big_copy")
        # ShadowKV: values only (2 KiB runs), and reuse of the previous selection (~80% hits)
        t = time_cuda(lambda: gather_uva(hkv, 0, idx, None, v_out), inner=2, reps=10)
        rows.add("gather", "uva_values_only", B, f"{B}x{H}x{n} chunks of 2KiB", nbytes // 2, t,
                 t_big / 2, "one_big_copy", "floor: half the big copy")
        prev_idx = idx.clone()
        swap = torch.rand(B, H, n, device=dev) < 0.2
        prev_idx[swap] = -1  # misses: 20% of the chunks are not in the previous selection
        pk, pv = k_out.clone(), v_out.clone()
        src = gather_uva(hkv, 0, idx, k_out, v_out, prev=(prev_idx, pk, pv))
        miss = float((src < 0).float().mean())
        t = time_cuda(lambda: gather_uva(hkv, 0, idx, k_out, v_out, prev=(prev_idx, pk, pv)), inner=2, reps=10)
        rows.add("gather", "uva_reuse_prev", B, shape, nbytes, t, t_big * miss, "one_big_copy",
                 f"miss_fraction={miss:.3f}; floor: big copy of the misses; incl. reuse_plan")
        if B == 8:
            t = time_cuda(lambda: gather_uva(hkv, 0, idx, k_out, v_out, prev=(prev_idx, pk, pv), programs=132),
                          inner=2, reps=10)
            rows.add("gather", "uva_reuse_prev_132", B, shape, nbytes, t, t_big * miss, "one_big_copy",
                     f"miss_fraction={miss:.3f}; 132 programs")
        # Figure 19 baselines
        idx_cpu = idx.cpu()
        staging = torch.empty(B * H * n, 2 * C * d, dtype=torch.bfloat16, pin_memory=True)
        dev_stage = torch.empty(B * H * n, 2 * C * d, dtype=torch.bfloat16, device=dev)
        t = time_host(lambda: gather_cpu_staging(hkv, 0, idx_cpu, staging, dev_stage, k_out, v_out), reps=5)
        rows.add("gather", "cpu_index_select_staging", B, shape, nbytes, t, t_big, "uva_persistent_32",
                 f"{torch.get_num_threads()} host threads")
        if B <= 8:
            il = idx_cpu.tolist()
            t = time_host(lambda: gather_per_chunk(hkv, 0, il, dev_stage, k_out, v_out), reps=3)
            rows.add("gather", "memcpy_per_chunk", B, shape, nbytes, t, t_big, "uva_persistent_32")
        del staging, dev_stage, big, k_out, v_out, pk, pv
    del host, flat


def bench_attention(rows: Rows, dev, hbm_gbps, quick: bool):
    Hq, H, d, L = 32, 8, 128, 2048
    for B in ((8, 32) if quick else (8, 32, 64)):
        kv_bytes = B * H * (L + 2) * d * 2 * 2
        sets = []
        for _ in range(max(1, math.ceil(256 * MiB / kv_bytes))):
            k, v = _rand_bf16(B, H, L + 2, d), _rand_bf16(B, H, L + 2, d)
            sets.append((_rand_bf16(B, 2, Hq, d), k, v))
        lengths = torch.full((B,), L, device=dev, dtype=torch.int32)
        shape = f"Hq{Hq}/H{H} d{d} {L} sparse tokens"
        floor2 = kv_bytes / hbm_gbps / 1e6
        floor1 = B * H * (L + 1) * d * 4 / hbm_gbps / 1e6

        def t_of(f, **kw):
            return time_cuda([lambda s=s: f(s, **kw) for s in sets], inner=3, reps=15)

        t1 = t_of(lambda s, **kw: dual_sparse_attention(s[0][:, :1], s[1], s[2], lengths, **kw))
        rows.add("attention", "single_token", B, shape, floor1 * hbm_gbps * 1e6, t1, floor1)
        t2 = t_of(lambda s, **kw: dual_sparse_attention(s[0], s[1], s[2], lengths, **kw))
        rows.add("attention", "dual_token", B, shape, kv_bytes, t2, floor2, "single_token")
        for sp in (1, 2, 4, 8, 16):
            t = t_of(lambda s, **kw: dual_sparse_attention(s[0], s[1], s[2], lengths, **kw), splits=sp)
            rows.add("attention", f"dual_token_splits{sp}", B, shape, kv_bytes, t, floor2, "dual_token")

        def two_pass(s):
            dual_sparse_attention(s[0][:, :1], s[1], s[2], lengths)
            dual_sparse_attention(s[0][:, 1:], s[1], s[2], lengths + 1)
        rows.add("attention", "two_pass", B, shape, 2 * kv_bytes, t_of(two_pass), floor2, "dual_token")
        pos = torch.arange(L + 2, device=dev)
        mask = pos[None, :] < (L + 1 + torch.arange(2, device=dev))[:, None]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        t = t_of(lambda s: sdpa(s[0].transpose(1, 2), s[1], s[2], attn_mask=mask, enable_gqa=True))
        rows.add("attention", "torch_sdpa_two_query", B, shape, kv_bytes, t, floor2, "dual_token")
        t = t_of(lambda s: sdpa(s[0][:, :1].transpose(1, 2), s[1][:, :, :L + 1], s[2][:, :, :L + 1], enable_gqa=True))
        rows.add("attention", "torch_sdpa_one_query", B, shape, kv_bytes // 2, t, floor1, "single_token")
        q, k, v = sets[0]
        ref = sdpa(q.transpose(1, 2).float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True).transpose(1, 2)
        out = dual_sparse_attention(q, k, v, lengths).float()
        err = float((out - ref).norm() / ref.norm())
        next(r for r in rows if r["batch"] == B and r["variant"] == "dual_token")["notes"] = \
            f"rel_err_vs_fp32_sdpa={err:.2e}"
        del sets


def bench_select(rows: Rows, dev, hbm_gbps, quick: bool):
    Hq, H, d, N, k = 32, 8, 128, 16384, 256  # 128K context, 2048-token budget
    for B in ((8,) if quick else (8, 32)):
        lm = _rand_bf16(B, H, N, d)
        lm_bytes = lm.numel() * 2
        for nq in (1, 2):
            q = _rand_bf16(B, nq, Hq, d)
            scratch = torch.empty(B * H * 16 * N, device=dev, dtype=torch.float32)
            floor = lm_bytes / hbm_gbps / 1e6
            shape = f"{N} landmarks, nq={nq}"
            t = time_cuda(lambda: score_chunks(q, lm, scratch=scratch), inner=3, reps=15)
            rows.add("select", f"score_nq{nq}", B, shape, lm_bytes, t, floor, notes="floor: landmark read")
            t = time_cuda(lambda: select_chunks(q, lm, k, scratch=scratch), inner=3, reps=15)
            rows.add("select", f"score_topk{k}_nq{nq}", B, shape, lm_bytes, t, floor, f"score_nq{nq}")
            for sp in (1, 4, 16):
                t = time_cuda(lambda: score_chunks(q, lm, scratch=scratch, splits=sp), inner=3, reps=15)
                rows.add("select", f"score_nq{nq}_splits{sp}", B, shape, lm_bytes, t, floor, f"score_nq{nq}")
        del lm, scratch
    B, T = 8, 32768
    kk = _rand_bf16(B, H, T, d)
    out = torch.empty(B, H, T // 8, d, device=dev, dtype=torch.bfloat16)
    nbytes = kk.numel() * 2 + out.numel() * 2
    t = time_cuda(lambda: build_landmarks(kk, 8, out), inner=3, reps=15)
    rows.add("landmarks", "mean_of_8", B, f"T={T}", nbytes, t, nbytes / hbm_gbps / 1e6)
    del kk, out


def bench_rebuild(rows: Rows, dev, hbm_gbps, quick: bool):
    H, d, R, T, n, C = 8, 128, 160, 131072, 256, 8
    for B in ((8,) if quick else (8, 32)):
        U = _rand_bf16(B, T, R) / R ** 0.5
        SV = _rand_bf16(B, H, R, d)
        idx = torch.rand(B, H, T // C, device=dev).argsort(-1)[..., :n].sort(-1).values.int()
        k_out = torch.empty(B, H, n * C, d, device=dev, dtype=torch.bfloat16)
        nbytes = B * H * n * C * R * 2 + SV.numel() * 2 + k_out.numel() * 2 + idx.numel() * 4
        flops = 2 * B * H * n * C * R * d
        t = time_cuda(lambda: rebuild_keys(U, SV, idx, k_out, chunk=C), inner=3, reps=15)
        rows.add("rebuild", f"lowrank_r{R}_rope", B, f"T={T} n={n * C} tokens", nbytes, t, nbytes / hbm_gbps / 1e6,
                 notes=f"gflop={flops / 1e9:.1f}")
        for bc, rb, nw in ((8, 32, 4), (16, 32, 4), (16, 32, 8), (8, 64, 4), (16, 64, 8)):
            t = time_cuda(lambda: rebuild_keys(U, SV, idx, k_out, chunk=C, launch=RebuildLaunch(
                block_chunks=bc, rank_block=rb, num_warps=nw)), inner=3, reps=15)
            rows.add("rebuild", f"lowrank_bc{bc}_rb{rb}_w{nw}", B, f"T={T} n={n * C} tokens", nbytes, t,
                     nbytes / hbm_gbps / 1e6, f"lowrank_r{R}_rope")
        del U, SV, k_out


def bench_specache(rows: Rows, dev, hbm_gbps, quick: bool):
    Hq, H, d, T = 32, 8, 128, 32768
    B = 8
    k = _rand_bf16(B, H, T, d)
    q = _rand_bf16(B, 2, Hq, d)
    t = time_cuda(lambda: quantize_keys_2bit(k), inner=1, reps=5)
    rows.add(SPECACHE, "quantize_2bit_g64", B, f"T={T}", k.numel() * 2, t, k.numel() * 2.25 / hbm_gbps / 1e6,
             notes="torch")
    qk = quantize_keys_2bit(k)
    nbytes = qk.codes.numel() + 2 * qk.scale.numel() * 2
    t = time_cuda(lambda: specache_scores(q, qk), inner=2, reps=10)
    rows.add(SPECACHE, "score_2bit_nq2", B, f"T={T}", nbytes, t, nbytes / hbm_gbps / 1e6,
             notes="torch; floor: read 2-bit codes + scales")
    bench_specache_triton(rows, dev, hbm_gbps, [(8, 32768), (16, 131072)] if not quick else [(8, 32768)])


def bench_specache_triton(rows: Rows, dev, hbm_gbps, shapes, splits=(None,)):
    """The Triton 2-bit scoring (two passes over the codes) against its floor: the codes, scales
    and zeros read once plus the output written once (per token fp32, or per chunk of 8)."""
    Hq, H, d = 32, 8, 128
    for B, T in shapes:
        sets = []
        for _ in range(2):   # two input sets, rotated (their codes exceed L2 together)
            k = _rand_bf16(B, H, T, d)
            sets.append((_rand_bf16(B, 2, Hq, d), quantize_keys_2bit(k)))
            del k
        qk = sets[0][1]
        read = qk.codes.numel() + 2 * qk.scale.numel() * 2
        for chunk in (0, 8):
            out_b = B * 2 * H * (T // chunk if chunk else T) * 4
            for sp in splits:
                t = time_cuda([lambda q=q, qk=qk: specache_scores_triton(q, qk, chunk=chunk, splits=sp)
                               for q, qk in sets], inner=2, reps=10)
                rows.add(SPECACHE, f"score_2bit_nq2_triton_c{chunk}" + (f"_s{sp}" if sp else ""), B, f"T={T}",
                         read + out_b, t, (read + out_b) / hbm_gbps / 1e6,
                         notes="triton, two passes over the codes; floor: codes + scales read once, output written once")
        del sets
        torch.cuda.empty_cache()


def run_all(quick: bool = False):
    dev = torch.device("cuda")
    rows = Rows()
    ceil = ceilings(dev)
    print(f"  ceilings: HBM copy {ceil['hbm_copy_gbps_rw']:.0f} GB/s (read+write), "
          f"pinned H2D 1 GiB {ceil['h2d_1gib_gbps']:.1f} GB/s", flush=True)
    rows.add("ceiling", "hbm_d2d_copy_1GiB", 0, "read+write", 2 << 30, 2 * (1 << 30) / ceil["hbm_copy_gbps_rw"] / 1e6)
    rows.add("ceiling", "h2d_pinned_copy_1GiB", 0, "", 1 << 30, (1 << 30) / ceil["h2d_1gib_gbps"] / 1e6)
    hbm = ceil["hbm_copy_gbps_rw"]
    stages = [("gather", lambda: bench_gather(rows, dev, quick)),
              ("attention", lambda: bench_attention(rows, dev, hbm, quick)),
              ("selection", lambda: bench_select(rows, dev, hbm, quick)),
              ("selection index", lambda: bench_index(rows, dev, hbm, quick)),
              ("key rebuild", lambda: bench_rebuild(rows, dev, hbm, quick)),
              ("specache scoring", lambda: bench_specache(rows, dev, hbm, quick))]
    bar = _progress(len(stages))
    for name, stage in stages:
        bar.set_postfix_str(name)
        stage()
        bar.update()
    bar.close()
    return rows, ceil


def _progress(total: int):
    """A tqdm bar on a terminal (stderr); a silent stand-in where tqdm is missing (the GPU machine)."""
    try:
        from tqdm import tqdm
    except ImportError:
        class _Quiet:
            def set_postfix_str(self, _): pass
            def update(self): pass
            def close(self): pass
        return _Quiet()
    return tqdm(total=total, desc="bench kernels", unit="stage", disable=not sys.stderr.isatty())
