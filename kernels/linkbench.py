"""The gather's link against its ceiling: bf16 and fp8 pieces, interference with compute, urgent latency.

    python -m ddbench.kernels.linkbench [--rounds 3] [--sizes 8,32,64,128,256] [--out DIR] [--force]
    (or `ddbench bench link [--quick] [--out DIR] [--force]`: 3 rounds, or with --quick 1 round at 8 and 64 MiB)

Every round measures, one after the other (CUDA events after a warm-up, the median of --reps calls):
  copy       the pinned host-to-device big copy (the copy engine) of each call's link bytes: the ceiling
  gather     the persistent UVA gather (kernels/gather.py) of random chunk-heads of a 4 GiB pinned host
             KV (Llama-3-8B's 8 KV heads, chunk 8, head_dim 128; 256 chunks per (request, head)), at
             --sizes MiB of link bytes per call, for bf16 pieces (K+V 4 KiB), fp8 pieces (K+V 2 KiB + two
             fp32 scales, dequantised to bf16 in the kernel) and fp8 values alone (1 KiB + a scale), at
             several launches (programs x chunks in flight per program); pct_of_copy = 100 * copy / gather
             time for the same link bytes in the same round. Each case holds SETS random selections and
             uses them in turn, so no call finds the last call's pieces in L2 or its pages in the TLBs
  interference  a decode-like bf16 GEMM loop (64 tokens x 4096 x 14336) alone and with a 32-program
             fp8 gather running beside it on a low-priority stream: the GEMM's slowdown, the gather's rate
  urgent     an urgent fp8 gather (the high-priority stream; 64 programs x 4 as the engine launches it,
             and 132 x 8) of about 1/4/16 MiB alone, and issued while a 256 MiB prefetch gather (low
             priority; 32 x 8 as the engine, and 16 x 8) is in flight.
             latency_ratio = latency / alone; link_busy = (prefetch + urgent bytes) / (window x the copy's
             rate), the window from the prefetch's start to the later end of the two
Rows (link.csv): round, test, variant, piece_bytes, programs, items, call_bytes, ms, gbps, pct_of_copy,
latency_ratio, link_busy, note; summary.json: min / median / max over the rounds of every (test,
variant, size), and the provenance (ddbench.kernels.timing.provenance).
"""

from __future__ import annotations

import statistics
import sys

from ddbench.core.flags import OneLineParser
from ddbench.core.errors import DDBenchError

MiB = 1 << 20
GiB = 1 << 30
H, C, D, K = 8, 8, 128, 256          # KV heads, chunk tokens, head_dim, chunks per (request, head) at most
SETS = 4                             # index sets per case, used in turn: no call re-reads the last one's pieces
HOST_BYTES = 4 * GiB
LAUNCHES = ((32, 2), (32, 4), (32, 8), (64, 4), (132, 2), (132, 4))
COLUMNS = ["round", "test", "variant", "piece_bytes", "programs", "items", "call_bytes", "ms", "gbps", "pct_of_copy",
           "latency_ratio", "link_busy", "note"]


def _hosts(torch):
    """(bf16 host flat, e4m3 host flat, its scales): HOST_BYTES each, random normal values."""
    from ddbench.kernels.fp8 import quantize_host_kv
    n = HOST_BYTES // 2
    h16 = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    q8 = torch.empty(HOST_BYTES, dtype=torch.uint8, pin_memory=True)
    sc = torch.empty(HOST_BYTES // (C * D), dtype=torch.float32, pin_memory=True)
    g = torch.Generator(device="cuda").manual_seed(11)
    step = GiB // 4
    for s in range(0, HOST_BYTES, step):
        x = torch.randn(step, device="cuda", generator=g)
        if s < n:
            h16[s:s + step].copy_(x.to(torch.bfloat16)[: min(step, n - s)])
        q, scale = quantize_host_kv(x.view(-1, 2, C, D))
        q8[s:s + step].copy_(q.view(torch.uint8).view(-1))
        sc[s // (C * D):(s + step) // (C * D)].copy_(scale)
    torch.cuda.synchronize()
    return h16, q8.view(torch.float8_e4m3fn), sc


class Case:
    """One gather call of `items` chunk-heads of `kind` (bf16 | fp8 | fp8-values) over the host buffers."""

    def __init__(self, torch, hosts, kind, call_bytes, seed=0):
        from ddbench.kernels.layout import host_kv_view
        h16, q8, sc = hosts
        self.kind = kind
        piece = {"bf16": 2 * C * D * 2, "fp8": 2 * (C * D + 4), "fp8-values": C * D + 4}[kind]
        self.piece = piece
        n_items = call_bytes // piece
        k = max(1, min(K, n_items // H))                # chunks per (request, head); a small call: one request
        B = max(1, n_items // (H * k))
        self.bytes = B * H * k * piece
        flat = h16 if kind == "bf16" else q8
        N = min(16384, flat.numel() // (B * H * 2 * C * D))
        if N < k:
            raise DDBenchError(f"{call_bytes / MiB:.0f} MiB per call does not fit the {HOST_BYTES >> 30} GiB host buffer")
        self.host, _ = host_kv_view(flat, 1, B, H, N, C, D)
        self.scales = None if kind == "bf16" else sc
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.idx = [torch.rand(B, H, N, device="cuda", generator=g).argsort(-1)[..., :k].sort(-1).values.int()
                    for _ in range(SETS)]
        self.calls = 0
        self.k = None if kind == "fp8-values" else torch.empty(B, H, k * C, D, device="cuda", dtype=torch.bfloat16)
        self.v = torch.empty(B, H, k * C, D, device="cuda", dtype=torch.bfloat16)

    def __call__(self, programs=32, items=2):
        from ddbench.kernels.gather import gather_uva
        idx = self.idx[self.calls % SETS]
        self.calls += 1
        gather_uva(self.host, 0, idx, self.k, self.v, programs=programs, items=items, scales=self.scales)


def _ms(torch, fn, reps):
    from ddbench.kernels.timing import event_times
    return statistics.median(event_times(fn, reps, warmup=2))


def _copy_ms(torch, src, dst, nbytes, reps):
    return _ms(torch, lambda: dst[:nbytes].copy_(src[:nbytes], non_blocking=True), reps)


def bench_gather(torch, hosts, rows, rnd, sizes, reps, cp_src, cp_dst):
    for mib in sizes:
        for kind in ("bf16", "fp8", "fp8-values"):
            if kind == "fp8-values" and mib not in (sizes[0], 64, sizes[-1]):
                continue
            case = Case(torch, hosts, kind, mib * MiB, seed=rnd)
            copy = _copy_ms(torch, cp_src, cp_dst, case.bytes, reps)
            rows.append(dict(round=rnd, test="copy", variant=kind, piece_bytes=case.piece, call_bytes=case.bytes,
                             ms=copy, gbps=case.bytes / copy / 1e6))
            for programs, items in LAUNCHES:
                t = _ms(torch, lambda: case(programs, items), reps)
                rows.append(dict(round=rnd, test="gather", variant=kind, piece_bytes=case.piece, programs=programs,
                                 items=items, call_bytes=case.bytes, ms=t, gbps=case.bytes / t / 1e6,
                                 pct_of_copy=100 * copy / t))
            print(f"  round {rnd} {mib:4d} MiB {kind:10s} copy {case.bytes / copy / 1e6:6.1f} GB/s  best gather "
                  f"{max(r['pct_of_copy'] for r in rows[-len(LAUNCHES):]):5.1f} %", flush=True)
            del case


def _overlap(torch, first, second, lo, hi):
    """Launch first() on `lo` and second() on `hi` (second after first is issued); the (start, end) events."""
    e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    torch.cuda.synchronize()
    with torch.cuda.stream(lo):
        e[0].record()
        first()
        e[1].record()
    with torch.cuda.stream(hi):
        e[2].record()
        second()
        e[3].record()
    torch.cuda.synchronize()
    return e


def bench_interference(torch, hosts, rows, rnd, reps, copy_gbps):
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16)
    loops = 60

    def gemm():
        for _ in range(loops):
            x @ w
    alone = _ms(torch, gemm, reps)
    case = Case(torch, hosts, "fp8", 256 * MiB, seed=rnd)
    lo, hi = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)
    slow, rate = [], []
    for _ in range(reps):
        e = _overlap(torch, lambda: [case(32, 4) for _ in range(3)], gemm, lo, hi)
        slow.append(e[2].elapsed_time(e[3]) / alone)
        rate.append(3 * case.bytes / e[0].elapsed_time(e[1]) / 1e6)
    rows.append(dict(round=rnd, test="interference", variant="gemm-beside-fp8-gather", programs=32, items=4,
                     call_bytes=3 * case.bytes, ms=statistics.median(slow) * alone, latency_ratio=statistics.median(slow),
                     gbps=statistics.median(rate), pct_of_copy=100 * statistics.median(rate) / copy_gbps,
                     note=f"GEMM loop alone {alone:.3f} ms; ratio = GEMM time beside the gather / alone"))
    print(f"  round {rnd} interference: GEMM x{statistics.median(slow):.3f}, gather {statistics.median(rate):.1f} GB/s",
          flush=True)


URGENT_LAUNCHES = ((64, 4), (132, 8))      # the engine's urgent launch, and one with 4x its pieces in flight
PREFETCH_LAUNCHES = ((32, 8), (16, 8))     # the engine's prefetch launch, and one with half its pieces in flight


def bench_urgent(torch, hosts, rows, rnd, reps, copy_gbps):
    pre = Case(torch, hosts, "fp8", 256 * MiB, seed=100 + rnd)
    lo, hi = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)
    for mib in (1, 4, 16):
        urg = Case(torch, hosts, "fp8", mib * MiB, seed=200 + rnd)
        for up, ui in URGENT_LAUNCHES:
            alone = _ms(torch, lambda: urg(up, ui), 4 * reps)
            rows.append(dict(round=rnd, test="urgent", variant="alone", piece_bytes=urg.piece, programs=up, items=ui,
                             call_bytes=urg.bytes, ms=alone, gbps=urg.bytes / alone / 1e6, latency_ratio=1.0))
            for pp, pi in PREFETCH_LAUNCHES:
                lat, busy = [], []
                for _ in range(2 * reps):
                    # the prefetch is launched first and runs about 5 ms; the urgent fetch starts inside it
                    e = _overlap(torch, lambda: pre(pp, pi), lambda: urg(up, ui), lo, hi)
                    lat.append(e[2].elapsed_time(e[3]))
                    window = max(e[0].elapsed_time(e[1]), e[0].elapsed_time(e[3]))
                    busy.append((pre.bytes + urg.bytes) / (window * 1e-3) / (copy_gbps * 1e9))
                m = statistics.median(lat)
                variant = f"beside-prefetch-{pp}x{pi}"
                rows.append(dict(round=rnd, test="urgent", variant=variant, piece_bytes=urg.piece, programs=up,
                                 items=ui, call_bytes=urg.bytes, ms=m, gbps=urg.bytes / m / 1e6, latency_ratio=m / alone,
                                 link_busy=statistics.median(busy),
                                 note=f"prefetch 256 MiB fp8, {pp} programs x {pi}, low priority"))
                print(f"  round {rnd} urgent {mib:2d} MiB {up}x{ui} {variant:24s} x{m / alone:5.2f} of alone"
                      f" ({alone:.3f} ms), link busy {statistics.median(busy):.2f}", flush=True)
        del urg


def summarise(rows):
    groups = {}
    for r in rows:
        key = (r["test"], r["variant"], r.get("programs"), r.get("items"), r["call_bytes"])
        groups.setdefault(key, []).append(r)
    out = []
    for (test, variant, programs, items, nbytes), rs in groups.items():
        e = dict(test=test, variant=variant, programs=programs, items=items, call_bytes=nbytes, n=len(rs))
        for c in ("gbps", "pct_of_copy", "latency_ratio", "link_busy"):
            v = sorted(float(r[c]) for r in rs if r.get(c) not in (None, ""))
            if v:
                e[c] = dict(min=v[0], median=statistics.median(v), max=v[-1])
        out.append(e)
    return out


def main(argv=None) -> int:
    import json
    ap = OneLineParser(prog="python -m ddbench.kernels.linkbench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of the whole sweep (>= 3 for a stated ratio)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per measurement (their median)")
    ap.add_argument("--sizes", default="8,32,64,128,256", help="link MiB per gather call, comma-separated (8..256)")
    ap.add_argument("--out", default=None, help="output folder (default the data root's link/<gpu>)")
    ap.add_argument("--force", action="store_true", help="replace an earlier run's files (ddbench's own only)")
    a = ap.parse_args(argv)
    try:
        try:
            sizes = sorted({int(x) for x in a.sizes.split(",")})
        except ValueError:
            raise DDBenchError(f"--sizes takes comma-separated MiB, got {a.sizes!r}") from None
        if not sizes or sizes[0] < 1 or sizes[-1] > 512:
            raise DDBenchError(f"--sizes must be within 1..512 MiB, got {a.sizes!r}")
        if not 1 <= a.rounds <= 20 or not 1 <= a.reps <= 100:
            raise DDBenchError("--rounds must be within 1..20 and --reps within 1..100")
        import torch
        if not torch.cuda.is_available():
            raise DDBenchError("the link bench needs a CUDA GPU; none is visible to torch")
        from ddbench.core.catalog.gpus import catalog_gpu_name
        from ddbench.core.io import write_rows_csv
        from ddbench.core.outputs import output_folder
        from ddbench.core.paths import traces_dir
        from ddbench.core.provenance import command_line
        from ddbench.kernels.timing import provenance
        gpu = catalog_gpu_name(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)
        out = a.out or str(traces_dir("link", gpu))
        prov = provenance(command_line("python -m ddbench.kernels.linkbench", argv))
        with output_folder(out, command="python -m ddbench.kernels.linkbench", force=a.force) as w:
            w.claim(["link.csv", "summary.json"])
            hosts = _hosts(torch)
            cp_src = torch.empty(max(sizes) * MiB + MiB, dtype=torch.uint8, pin_memory=True).random_()
            cp_dst = torch.empty_like(cp_src, device="cuda")
            rows = []
            for rnd in range(a.rounds):
                bench_gather(torch, hosts, rows, rnd, sizes, a.reps, cp_src, cp_dst)
                copy_gbps = max(r["gbps"] for r in rows if r["round"] == rnd and r["test"] == "copy")
                bench_interference(torch, hosts, rows, rnd, a.reps, copy_gbps)
                bench_urgent(torch, hosts, rows, rnd, a.reps, copy_gbps)
            write_rows_csv(w.stage_path("link.csv"), rows, COLUMNS, prov)
            with open(w.stage_path("summary.json"), "w", encoding="utf-8") as fh:
                json.dump({"provenance": prov, "sizes_mib": sizes, "rounds": a.rounds, "reps": a.reps,
                           "host_bytes": HOST_BYTES, "summary": summarise(rows)}, fh, indent=1)
    except DDBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
