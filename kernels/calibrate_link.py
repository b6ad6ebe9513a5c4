"""The transfer sections of `ddbench calibrate` (kernels/calibrate.py's Calibrator takes them from
LinkSections) and the measuring helpers every section uses.

  link          copy engine (H2D, D2H, both at once) by transfer size; UVA gather/scatter kernel
                (reads/writes the pinned host pointer) by chunk size and thread blocks, each
                direction and both at once; CPU gather (index_select into pinned staging + one
                copy) and its D2H twin; one cudaMemcpyAsync per chunk
  interference  an urgent 2 MiB transfer while a 256 MiB background transfer is in flight, by
                method and stream priority, and a decode GEMM beside the background

Timing: CUDA events around the region, warm-up first, the median of several repeats, random data
(never zeros).
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

MiB = 1 << 20


# ----------------------------------------------------------------------------- the UVA chunk copy

@triton.jit
def _uva_copy_chunks(src, src_ids, dst, dst_ids, n, W: tl.constexpr, BLOCK: tl.constexpr):
    """Persistent chunk copy: program p moves chunks p, p+G, ...; chunk c goes from
    src[src_ids[c]] to dst[dst_ids[c]] (W elements each). Either side may be a pinned host
    tensor, read or written through its UVA pointer."""
    p = tl.program_id(0)
    g = tl.num_programs(0)
    for c in range(p, n, g):
        i = tl.load(src_ids + c).to(tl.int64)
        j = tl.load(dst_ids + c).to(tl.int64)
        for off in tl.static_range(0, W, BLOCK):
            o = off + tl.arange(0, BLOCK)
            tl.store(dst + j * W + o, tl.load(src + i * W + o))


def uva_copy(src: torch.Tensor, src_ids: torch.Tensor, dst: torch.Tensor, dst_ids: torch.Tensor,
             blocks: int = 32) -> None:
    """dst[dst_ids[c]] = src[src_ids[c]] for rows of 2-D tensors (one chunk per row)."""
    n, w = src_ids.numel(), src.shape[1]
    _uva_copy_chunks[(min(blocks, n),)](src, src_ids, dst, dst_ids, n, W=w, BLOCK=min(w, 2048), num_warps=4)



# ----------------------------------------------------------------------------- timing and data

def sync():
    torch.cuda.synchronize()


def time_ms(fn, target_ms: float = 25.0, max_iters: int = 50, min_iters: int = 3) -> float:
    """Median CUDA-event time of fn() in ms (kernels/timing.event_times): a warm-up call and one
    timed call size the repeats to fill target_ms."""
    from ddbench.kernels.timing import event_times
    first = max(event_times(fn, 1, warmup=1)[0], 1e-3)
    iters = int(max(min_iters, min(max_iters, target_ms / first)))
    ts = sorted(event_times(fn, iters, warmup=0))
    return ts[len(ts) // 2]


def host_time_ms(fn, iters: int = 5) -> float:
    """Median wall time in ms of fn() followed by a device synchronisation (CPU-side work)."""
    fn()
    sync()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def rand_bf16(*shape, device="cuda", pin=False):
    """Random bf16 data (never zeros): normal on the GPU, random finite bit patterns on the host."""
    if device == "cuda":
        return torch.randn(*shape, dtype=torch.bfloat16, device="cuda")
    t = torch.empty(*shape, dtype=torch.bfloat16, pin_memory=pin)
    t.view(torch.int16).random_(-16000, 16000)
    return t



# ----------------------------------------------------------------------------- sections

def _row(nbytes, ms, total=None):
    return {"latency_ms": ms, "gbps": (total or nbytes) / ms / 1e6}


def _on_two_streams(s1, s2, first, second):
    """first() on s1 and second() on s2 at once, both ordered after the current stream's work."""
    cur = torch.cuda.current_stream()
    s1.wait_stream(cur)
    s2.wait_stream(cur)
    with torch.cuda.stream(s1):
        first()
    with torch.cuda.stream(s2):
        second()
    cur.wait_stream(s1)
    cur.wait_stream(s2)


class LinkSections:
    """The link and interference sections; mixed into kernels/calibrate.py's Calibrator (self.point,
    self.finish)."""

    # -- link
    def link(self):
        big = 256 * MiB
        h = torch.empty(big, dtype=torch.uint8, pin_memory=True)
        h.random_(0, 255)
        d = torch.empty(big, dtype=torch.uint8, device="cuda")
        d.random_(0, 255)
        streams = torch.cuda.Stream(), torch.cuda.Stream()
        self._link_copy_engine(h, d, streams)
        # pool of chunks in pinned host memory, as kernels/layout.py lays out K|V per (head, chunk)
        pool = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
        pool.random_(0, 255)
        g = torch.Generator().manual_seed(0)
        for chunk in [2048, 4096, 16384, 65536]:
            for total in ([8 * MiB, 64 * MiB] if chunk == 4096 else [64 * MiB]):
                self._link_chunks(pool, chunk, total, g, streams)
        del pool, h, d
        torch.cuda.empty_cache()
        self.finish("link", "cpu_gather bidir not measured (needs two host threads);"
                            " uva_gather bidir = one gather H2D and one scatter D2H on two streams")

    def _link_copy_engine(self, h, d, streams):
        """cudaMemcpyAsync of one contiguous transfer by size: H2D, D2H, and both at once."""
        for size in [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]:
            for direction in ["h2d", "d2h"]:
                key = {"method": "copy_engine", "direction": direction, "transfer_bytes": size,
                       "chunk_bytes": size, "blocks": 0}
                if direction == "h2d":
                    self.point("link", key, lambda: _row(size, time_ms(
                        lambda: d[:size].copy_(h[:size], non_blocking=True))))
                else:
                    self.point("link", key, lambda: _row(size, time_ms(
                        lambda: h[:size].copy_(d[:size], non_blocking=True))))
        h2 = torch.empty(h.numel(), dtype=torch.uint8, pin_memory=True)
        d2 = torch.empty(d.numel(), dtype=torch.uint8, device="cuda")
        for size in [1 << 20, 16 << 20, 256 << 20]:
            def bidir():
                _on_two_streams(*streams, lambda: d[:size].copy_(h[:size], non_blocking=True),
                                lambda: h2[:size].copy_(d2[:size], non_blocking=True))
            self.point("link", {"method": "copy_engine", "direction": "bidir", "transfer_bytes": size,
                                "chunk_bytes": size, "blocks": 0},
                       lambda: _row(size, time_ms(bidir), total=2 * size))
        del d2, h2

    def _link_chunks(self, pool, chunk, total, g, streams):
        """`total` bytes in random `chunk`-byte pieces of the pinned pool: the UVA gather (and at 64 MiB
        its scatter, both at once, the CPU gather and one copy per chunk)."""
        n = total // chunk
        w = chunk // 2
        src = pool.view(torch.bfloat16).view(-1, w)
        ids = torch.randperm(src.shape[0], generator=g)[:n].sort().values
        ids_d = ids.cuda()
        seq = torch.arange(n, device="cuda")
        dst = torch.empty(n, w, dtype=torch.bfloat16, device="cuda")
        for blocks in ([32, 132] if total == 64 * MiB and chunk in (2048, 4096) else [32]):
            key = {"method": "uva_gather", "direction": "h2d", "transfer_bytes": total,
                   "chunk_bytes": chunk, "blocks": blocks}
            self.point("link", key, lambda: _row(total, time_ms(
                lambda: uva_copy(src, ids_d, dst, seq, blocks))))
        if total == 64 * MiB:
            # D2H: the kernel writes chunks into the pinned pool through its UVA pointer
            key = {"method": "uva_gather", "direction": "d2h", "transfer_bytes": total,
                   "chunk_bytes": chunk, "blocks": 32}
            self.point("link", key, lambda: _row(total, time_ms(
                lambda: uva_copy(dst, seq, src, ids_d, 32))))
            if chunk == 4096:
                self._link_uva_bidir(src, ids_d, dst, seq, g, chunk, total, streams)
            self._link_cpu_gather(src, ids, dst, chunk, total)
            if chunk in (4096, 65536):
                self._link_per_chunk(src, ids, dst, chunk)
        del dst

    def _link_uva_bidir(self, src, ids_d, dst, seq, g, chunk, total, streams):
        """One gather H2D and one scatter D2H of as many chunks on two streams."""
        dst2 = torch.empty_like(dst)
        ids2 = torch.randperm(src.shape[0], generator=g)[:seq.numel()].sort().values.cuda()

        def uva_bidir():
            _on_two_streams(*streams, lambda: uva_copy(src, ids_d, dst, seq, 32),
                            lambda: uva_copy(dst2, seq, src, ids2, 32))
        key = {"method": "uva_gather", "direction": "bidir", "transfer_bytes": total,
               "chunk_bytes": chunk, "blocks": 32}
        self.point("link", key, lambda: _row(total, time_ms(uva_bidir), total=2 * total))
        del dst2

    def _link_cpu_gather(self, src, ids, dst, chunk, total):
        """CPU gather: index_select into pinned staging, then one copy (and its D2H twin at 4 KiB)."""
        stage = torch.empty(dst.shape, dtype=torch.bfloat16, pin_memory=True)

        def cpu_h2d():
            torch.index_select(src, 0, ids, out=stage)
            dst.copy_(stage, non_blocking=True)

        def cpu_d2h():
            stage.copy_(dst, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            src.index_copy_(0, ids, stage)
        for direction, fn in [("h2d", cpu_h2d), ("d2h", cpu_d2h)]:
            if direction == "d2h" and chunk != 4096:
                continue
            key = {"method": "cpu_gather", "direction": direction, "transfer_bytes": total,
                   "chunk_bytes": chunk, "blocks": 0}
            self.point("link", key, lambda: _row(total, host_time_ms(fn)))
        del stage

    def _link_per_chunk(self, src, ids, dst, chunk):
        """One cudaMemcpyAsync per chunk (at most 2048 of them)."""
        m = min(ids.numel(), 2048)
        il = ids[:m].tolist()

        def per_chunk():
            for j, i in enumerate(il):
                dst[j].copy_(src[i], non_blocking=True)
        key = {"method": "memcpy_per_chunk", "direction": "h2d", "transfer_bytes": m * chunk,
               "chunk_bytes": chunk, "blocks": 0}
        self.point("link", key, lambda: _row(m * chunk, time_ms(per_chunk, target_ms=20, min_iters=2)))

    # -- interference
    def interference(self):
        w = 2048  # 4 KiB chunks of bf16
        pool_rows = 1 << 18  # 1 GiB pinned
        pool = torch.empty(pool_rows, w, dtype=torch.bfloat16, pin_memory=True)
        pool.view(torch.int16).random_(-1000, 1000)
        bg_n, urg_n = 65536, 512  # 256 MiB background, 2 MiB urgent
        g = torch.Generator().manual_seed(1)
        bg_ids = torch.randint(0, pool_rows, (bg_n,), generator=g).cuda()
        urg_ids = torch.randint(0, pool_rows, (urg_n,), generator=g).cuda()
        bg_seq = torch.arange(bg_n, device="cuda")
        urg_seq = torch.arange(urg_n, device="cuda")
        bg_dst = torch.empty(bg_n, w, dtype=torch.bfloat16, device="cuda")
        urg_dst = torch.empty(urg_n, w, dtype=torch.bfloat16, device="cuda")
        bg_src = pool[:bg_n]
        urg_src = pool[bg_n:bg_n + urg_n]
        lo, hi, comp = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-3), torch.cuda.Stream(priority=-1)
        xa, wb = rand_bf16(128, 4096), rand_bf16(28672, 4096)  # Llama-3-8B gate_up at 128 tokens

        def background(kind, blocks):
            if kind == "copy_engine":
                bg_dst.copy_(bg_src, non_blocking=True)
            else:
                uva_copy(pool, bg_ids, bg_dst, bg_seq, blocks)

        def urgent(kind):
            if kind == "copy_engine":
                urg_dst.copy_(urg_src, non_blocking=True)
            else:
                uva_copy(pool, urg_ids, urg_dst, urg_seq, 132)

        alone = {k: time_ms(lambda: urgent(k)) for k in ["copy_engine", "uva_gather"]}
        gemm_alone = time_ms(lambda: torch.nn.functional.linear(xa, wb))
        for bg, blocks in [("copy_engine", 0), ("uva_gather", 32), ("uva_gather", 132)]:
            for ug in ["copy_engine", "uva_gather"]:
                for sname in ["low", "high"]:
                    def meas():
                        us = hi if sname == "high" else torch.cuda.Stream(priority=0)
                        lat, gem = [], []
                        for rep in range(6):
                            sync()
                            with torch.cuda.stream(lo):
                                background(bg, blocks)
                            t0 = time.perf_counter()
                            while time.perf_counter() - t0 < 0.001:
                                pass
                            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            with torch.cuda.stream(us):
                                s.record(us)
                                urgent(ug)
                                e.record(us)
                            s2, e2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            with torch.cuda.stream(comp):
                                s2.record(comp)
                                torch.nn.functional.linear(xa, wb)
                                e2.record(comp)
                            sync()
                            if rep:
                                lat.append(s.elapsed_time(e))
                                gem.append(s2.elapsed_time(e2))
                        lat.sort()
                        gem.sort()
                        u, gm = lat[len(lat) // 2], gem[len(gem) // 2]
                        return {"urgent_alone_ms": alone[ug], "urgent_ms": u, "urgent_slowdown": u / alone[ug],
                                "gemm_alone_ms": gemm_alone, "gemm_ms": gm, "gemm_slowdown": gm / gemm_alone}
                    self.point("interference", {"background": bg, "background_blocks": blocks, "urgent": ug,
                                                "urgent_stream": sname}, meas)
        del pool
        torch.cuda.empty_cache()
        self.finish("interference", "urgent 2 MiB (512 x 4 KiB chunks) issued 1 ms after a 256 MiB background"
                                    " transfer; latency from its enqueue to its end; GEMM = Llama-3-8B gate_up at"
                                    " 128 tokens on a third stream")
