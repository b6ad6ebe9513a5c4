"""The gather's link against its ceiling: bf16 and fp8 pieces, interference with compute, urgent latency.

    python -m ddbench.kernels.linkbench [--rounds 3] [--sizes 8,32,64,128,256] [--only gather,interference,urgent]
                                        [--out DIR] [--force]
    (or `ddbench bench link [--quick] [--out DIR] [--force]`: 3 rounds, or with --quick 1 round at 8 and 64 MiB)

Every round measures, one after the other (CUDA events after a warm-up, the median of --reps calls), the
tests of --only (default all):
  copy       the pinned host-to-device big copy (the copy engine) of each call's link bytes: the ceiling
             (without the gather test: of the 256 MiB fp8 prefetch's bytes alone)
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
             and 132 x 8) of about 1/4/16 MiB alone, and issued while a 256 MiB fp8 prefetch (low priority)
             is in flight, for each way to issue the prefetch (PREFETCHES, variant beside-<prefetch>):
               prefetch-32x8, prefetch-16x8    one gather_uva launch: the engine's, and half its pieces in flight
               sliced-4x-prefetch-32x8, sliced-16x-prefetch-32x8
                          the same pieces in 4 or 16 launches of 1/S of the chunks each, back to back, so
                          the urgent launch's blocks can be scheduled between two of them
               yielding-prefetch-32x8   one launch of the yielding gather (kernels/yieldgather.py): its
                          programs issue no new pieces while the urgent side holds a device flag, which
                          it raises just before its gather and lowers after (a fill each, on its stream;
                          the raise is inside the urgent latency, the lowering is not)
             plus alone-flagged: the urgent gather alone between the flag's raise and lowering, both timed,
             against alone: the flag's own cost. latency_ratio = latency / alone; link_busy = (prefetch +
             urgent bytes) / (window x the copy's rate), the window from the prefetch's start to the later
             end of the two; the note gives the prefetch's time beside the urgent fetch and alone, and for
             the yielding one the most polls of one program that found the flag raised (SPIN: its budget).
             The urgent launch is issued once the whole prefetch is (16 launches take the host longer),
             always inside it
  prefetch   (with urgent) each prefetch variant alone: its time and rate; pct_of_copy against the round's
             copy rate
Rows (link.csv): round, test, variant, piece_bytes, programs, items, call_bytes, ms, gbps, pct_of_copy,
latency_ratio, link_busy, note; summary.json: min / median / max over the rounds of every (test,
variant, size), and the provenance (ddbench.kernels.timing.provenance).
"""

from __future__ import annotations

import statistics
import sys
from typing import NamedTuple

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


def _hosts(torch, bf16=True):
    """(bf16 host flat or None, e4m3 host flat, its scales): HOST_BYTES each, random normal values."""
    from ddbench.kernels.fp8 import quantize_host_kv
    n = HOST_BYTES // 2
    h16 = torch.empty(n, dtype=torch.bfloat16, pin_memory=True) if bf16 else None
    q8 = torch.empty(HOST_BYTES, dtype=torch.uint8, pin_memory=True)
    sc = torch.empty(HOST_BYTES // (C * D), dtype=torch.float32, pin_memory=True)
    g = torch.Generator(device="cuda").manual_seed(11)
    step = GiB // 4
    for s in range(0, HOST_BYTES, step):
        x = torch.randn(step, device="cuda", generator=g)
        if h16 is not None and s < n:
            h16[s:s + step].copy_(x.to(torch.bfloat16)[: min(step, n - s)])
        q, scale = quantize_host_kv(x.view(-1, 2, C, D))
        q8[s:s + step].copy_(q.view(torch.uint8).view(-1))
        sc[s // (C * D):(s + step) // (C * D)].copy_(scale)
    torch.cuda.synchronize()
    return h16, q8.view(torch.float8_e4m3fn), sc


PIECE = {"bf16": 2 * C * D * 2, "fp8": 2 * (C * D + 4), "fp8-values": C * D + 4}     # link bytes per chunk-head


def call_shape(kind, call_bytes):
    """(B requests, k chunks per (request, head), link bytes) of a gather call of about `call_bytes`."""
    n_items = call_bytes // PIECE[kind]
    k = max(1, min(K, n_items // H))                # chunks per (request, head); a small call: one request
    B = max(1, n_items // (H * k))
    return B, k, B * H * k * PIECE[kind]


class Case:
    """One gather call of `items` chunk-heads of `kind` (bf16 | fp8 | fp8-values) over the host buffers."""

    def __init__(self, torch, hosts, kind, call_bytes, seed=0):
        from ddbench.kernels.layout import host_kv_view
        h16, q8, sc = hosts
        self.kind = kind
        self.piece = PIECE[kind]
        B, k, self.bytes = call_shape(kind, call_bytes)
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
        self.parts = {}

    def sliced(self, slices):
        """Each index set cut into `slices` contiguous parts (made once, before any timing)."""
        from ddbench.kernels.yieldgather import prefetch_slices
        if slices not in self.parts:
            self.parts[slices] = [prefetch_slices(idx, slices, C) for idx in self.idx]
        return self.parts[slices]

    def __call__(self, programs=32, items=2, slices=1, flag=None, polls=None):
        """One gather call: gather_uva, or `slices` gather_uva launches (the sliced prefetch), or with
        `flag` the yielding gather (kernels/yieldgather.py); the next index set each call."""
        from ddbench.kernels.gather import gather_uva
        from ddbench.kernels.yieldgather import YieldFlag, gather_sliced, gather_yielding
        s = self.calls % SETS
        self.calls += 1
        kw = dict(programs=programs, items=items, scales=self.scales)
        if flag is not None:
            gather_yielding(self.host, 0, self.idx[s], self.k, self.v, YieldFlag(flag, polls=polls), **kw)
        elif slices > 1:
            gather_sliced(self.host, 0, self.sliced(slices)[s], self.k, self.v, **kw)
        else:
            gather_uva(self.host, 0, self.idx[s], self.k, self.v, **kw)


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


def _overlap(torch, first, second, lo, hi, after=None):
    """Launch first() on `lo` and second() on `hi` (second after first is issued), then after() on `hi`
    (outside the timed span); the (start, end) events of first and of second."""
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
        if after is not None:
            after()
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
URGENT_MIB = (1, 4, 16)


class Prefetch(NamedTuple):
    """A 256 MiB fp8 prefetch beside the urgent fetch: `slices` launches of programs x items each, or
    (yielding) one launch of the yielding gather, whose programs wait while the urgent side holds the flag."""
    programs: int
    items: int
    slices: int = 1
    yielding: bool = False

    @property
    def name(self):
        how = f"sliced-{self.slices}x-" if self.slices > 1 else "yielding-" if self.yielding else ""
        return f"{how}prefetch-{self.programs}x{self.items}"

    def describe(self):
        if self.slices > 1:
            return f"{self.slices} launches of 1/{self.slices} of the pieces, {self.programs} programs x {self.items} each"
        if self.yielding:
            return f"the yielding gather (no new pieces while the flag is raised), {self.programs} programs x {self.items}"
        return f"{self.programs} programs x {self.items}"


# the engine's prefetch launch, one with half its pieces in flight, the sliced ones, the yielding one
PREFETCHES = (Prefetch(32, 8), Prefetch(16, 8), Prefetch(32, 8, slices=4), Prefetch(32, 8, slices=16),
              Prefetch(32, 8, yielding=True))


def _prefetch_fn(pre, p, flag, polls):
    return lambda: pre(p.programs, p.items, slices=p.slices, flag=flag if p.yielding else None,
                       polls=polls if p.yielding else None)


def bench_prefetches(torch, pre, rows, rnd, reps, copy_gbps, lo, flag, polls):
    """Each prefetch variant alone on the low-priority stream (the flag lowered): its own cost. Returns
    {name: ms}. The first calls compile and slice, so nothing is built inside a timed overlap."""
    out = {}
    with torch.cuda.stream(lo):
        for p in PREFETCHES:
            pre.sliced(p.slices)
            t = _ms(torch, _prefetch_fn(pre, p, flag, polls), reps)
            out[p.name] = t
            rows.append(dict(round=rnd, test="prefetch", variant=p.name, piece_bytes=pre.piece, programs=p.programs,
                             items=p.items, call_bytes=pre.bytes, ms=t, gbps=pre.bytes / t / 1e6,
                             pct_of_copy=100 * pre.bytes / t / 1e6 / copy_gbps,
                             note=f"alone, low priority; {p.describe()}; pct_of_copy against the round's copy rate"))
    return out


def _beside(torch, pre, urg, p, launch, streams, yielding, n, copy_gbps):
    """n overlaps of the prefetch `p` and the urgent call: medians of (urgent ms, link busy, prefetch ms,
    the most polls of a prefetch program that found the flag raised). streams: (low, high priority);
    yielding: (the yield flag, the prefetch programs' poll counters)."""
    up, ui = launch
    (lo, hi), (flag, polls) = streams, yielding
    first = _prefetch_fn(pre, p, flag, polls)
    if p.yielding:
        from ddbench.kernels.yieldgather import lower_flag, raise_flag
        second, after = (lambda: (raise_flag(flag), urg(up, ui))), (lambda: lower_flag(flag))
    else:
        second, after = (lambda: urg(up, ui)), None
    lat, busy, pre_ms, held = [], [], [], []
    for _ in range(n):
        # the prefetch is launched first and runs about 5 ms; the urgent fetch starts inside it
        e = _overlap(torch, first, second, lo, hi, after)
        lat.append(e[2].elapsed_time(e[3]))
        window = max(e[0].elapsed_time(e[1]), e[0].elapsed_time(e[3]))
        busy.append((pre.bytes + urg.bytes) / (window * 1e-3) / (copy_gbps * 1e9))
        pre_ms.append(e[0].elapsed_time(e[1]))
        if p.yielding:
            held.append(int(polls.max().item()))
    med = statistics.median
    return med(lat), med(busy), med(pre_ms), (med(held) if held else None)


def bench_urgent(torch, hosts, rows, rnd, reps, copy_gbps):
    from ddbench.kernels.yieldgather import SPIN, lower_flag, raise_flag
    pre = Case(torch, hosts, "fp8", 256 * MiB, seed=100 + rnd)
    lo, hi = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    polls = torch.zeros(max(p.programs for p in PREFETCHES), dtype=torch.int32, device="cuda")
    pre_alone = bench_prefetches(torch, pre, rows, rnd, reps, copy_gbps, lo, flag, polls)
    for mib in URGENT_MIB:
        urg = Case(torch, hosts, "fp8", mib * MiB, seed=200 + rnd)
        for up, ui in URGENT_LAUNCHES:
            base = dict(round=rnd, test="urgent", piece_bytes=urg.piece, programs=up, items=ui, call_bytes=urg.bytes)
            alone = _ms(torch, lambda: urg(up, ui), 4 * reps)
            rows.append(dict(base, variant="alone", ms=alone, gbps=urg.bytes / alone / 1e6, latency_ratio=1.0))
            t = _ms(torch, lambda: (raise_flag(flag), urg(up, ui), lower_flag(flag)), 4 * reps)
            rows.append(dict(base, variant="alone-flagged", ms=t, gbps=urg.bytes / t / 1e6, latency_ratio=t / alone,
                             note="raise the yield flag, the urgent gather, lower it (the flag's two fills timed too)"))
            for p in PREFETCHES:
                m, busy, pms, held = _beside(torch, pre, urg, p, (up, ui), (lo, hi), (flag, polls), 2 * reps,
                                             copy_gbps)
                note = (f"prefetch 256 MiB fp8, {p.describe()}, low priority; prefetch {pms:.2f} ms beside"
                        f" ({pre_alone[p.name]:.2f} alone)")
                if held is not None:
                    note += f"; polls that found the flag raised, most of one program: {held:g} (budget {SPIN})"
                rows.append(dict(base, variant=f"beside-{p.name}", ms=m, gbps=urg.bytes / m / 1e6,
                                 latency_ratio=m / alone, link_busy=busy, note=note))
                print(f"  round {rnd} urgent {mib:2d} MiB {up}x{ui} beside-{p.name:28s} x{m / alone:5.2f} of alone"
                      f" ({alone:.3f} ms), link busy {busy:.2f}", flush=True)
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


TESTS = ("gather", "interference", "urgent")


def bench_copy(torch, rows, rnd, reps, cp_src, cp_dst):
    """The big copy of the 256 MiB fp8 prefetch's link bytes: the round's copy rate when the gather test
    (which measures the copy at every size) is not run."""
    nbytes = call_shape("fp8", 256 * MiB)[2]
    t = _copy_ms(torch, cp_src, cp_dst, nbytes, reps)
    rows.append(dict(round=rnd, test="copy", variant="fp8", piece_bytes=PIECE["fp8"], call_bytes=nbytes, ms=t,
                     gbps=nbytes / t / 1e6))


def _parse(argv):
    ap = OneLineParser(prog="python -m ddbench.kernels.linkbench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of the whole sweep (>= 3 for a stated ratio)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per measurement (their median)")
    ap.add_argument("--sizes", default="8,32,64,128,256", help="link MiB per gather call, comma-separated (8..256)")
    ap.add_argument("--only", default=",".join(TESTS), help=f"the tests to run, comma-separated ({', '.join(TESTS)})")
    ap.add_argument("--out", default=None, help="output folder (default the data root's link/<gpu>)")
    ap.add_argument("--force", action="store_true", help="replace an earlier run's files (ddbench's own only)")
    a = ap.parse_args(argv)
    try:
        sizes = sorted({int(x) for x in a.sizes.split(",")})
    except ValueError:
        raise DDBenchError(f"--sizes takes comma-separated MiB, got {a.sizes!r}") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > 512:
        raise DDBenchError(f"--sizes must be within 1..512 MiB, got {a.sizes!r}")
    if not 1 <= a.rounds <= 20 or not 1 <= a.reps <= 100:
        raise DDBenchError("--rounds must be within 1..20 and --reps within 1..100")
    tests = [t.strip() for t in a.only.split(",")]
    if not tests or any(t not in TESTS for t in tests):
        raise DDBenchError(f"--only takes a comma list of {', '.join(TESTS)}; got {a.only!r}")
    return a, sizes, [t for t in TESTS if t in tests]


def _rounds(torch, a, sizes, tests, rows):
    hosts = _hosts(torch, bf16="gather" in tests)
    cp_mib = max(sizes) if "gather" in tests else 256
    cp_src = torch.empty(cp_mib * MiB + MiB, dtype=torch.uint8, pin_memory=True).random_()
    cp_dst = torch.empty_like(cp_src, device="cuda")
    for rnd in range(a.rounds):
        if "gather" in tests:
            bench_gather(torch, hosts, rows, rnd, sizes, a.reps, cp_src, cp_dst)
        else:
            bench_copy(torch, rows, rnd, a.reps, cp_src, cp_dst)
        copy_gbps = max(r["gbps"] for r in rows if r["round"] == rnd and r["test"] == "copy")
        if "interference" in tests:
            bench_interference(torch, hosts, rows, rnd, a.reps, copy_gbps)
        if "urgent" in tests:
            bench_urgent(torch, hosts, rows, rnd, a.reps, copy_gbps)


def main(argv=None) -> int:
    import json
    try:
        a, sizes, tests = _parse(argv)
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
            rows = []
            _rounds(torch, a, sizes, tests, rows)
            write_rows_csv(w.stage_path("link.csv"), rows, COLUMNS, prov)
            with open(w.stage_path("summary.json"), "w", encoding="utf-8") as fh:
                json.dump({"provenance": prov, "sizes_mib": sizes, "tests": tests, "rounds": a.rounds, "reps": a.reps,
                           "host_bytes": HOST_BYTES, "summary": summarise(rows)}, fh, indent=1)
    except DDBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
