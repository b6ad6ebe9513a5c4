"""Engine measurement sweep on the local CUDA GPU: Llama-3-8B shapes, every design, 32K and 128K.

    python -m kernels.engine.sweep [--quick] [--reps 3] [--host-gib 16] [--budget-s 420] [--out DIR]
    python -m kernels.engine.sweep --point dualdecoder:131072:16 [--miss 0.33] [--budget 2048] [--chunk 8]

Every step is timed as CUDA-graph replays (kernels/timing.event_times: events between back-to-back
replays, no host sync inside or between them) after the pre-decoding step, one eager warm-up step
and one warm-up replay; a graph holds two whole steps (Engine.capture). The CPU-gather ablation
needs the host inside the step and runs eagerly (marked graph=0), beside an eager GPU-gather twin.

Phases (one process, one run):
  floor      compute only (no host reads), graph: every design x {32K, 128K} x batch {1, 16, 64},
             and DualDecoder with one query token (dual/single); each step against its floor =
             HBM bytes of weights + resident selection state + attended KV (Engine.floor_bytes) over
             the device-to-device copy rate measured in this run (read + write counted). Also
             dualdecoder, shadowkv and specache compute-only with 17.4 % forced misses: the
             difference is the harness's cost of drawing them (sim/validate.py adds it).
  mechanism  --reps repetitions, interleaved (rep is the outer loop): priority vs FIFO at 128K, 33 %
             misses, batch 1/4/16 with their compute-only twins (exposed-transfer share); at batch 16:
             two passes (with and without transfers), per-layer buffers, CPU gather and the eager
             GPU gather.
  validation points the floor phase does not measure, for sim/validate.py: dualdecoder, shadowkv and
             specache at 32K and 128K, batch 2/8/32, 25 % misses, each with its compute-only twin;
             full-kv at 32K, batch 2/8; FIFO at 128K, batch 2/8/32; dualdecoder at 128K, batch 8, 10 %.
  reuse-fetch ShadowKV's fetch of one layer alone (kernels/engine/engine.py reuse_fetch, the code of
             _sparse_attention's reuse branch: values only, the engine's chunk and gather launch):
             batch 1/2/4/8/16/32/64 at 32K and batch 16 at 128K, forced miss rates 0, 0.25, 1.0. Each
             of copy, plan (reuse_plan alone), gather (its plan included) and the whole fetch is one
             CUDA graph of the 32 layers' calls back to back; median of the replays / 32 (ms per
             layer). Written to reuse_fetch.csv (not engine.csv: no step to replay); sim/README.md.

--phases floor,validation runs a subset (default all, reuse-fetch last) into <out>/<gpu>-<phases>
(e.g. h200-validation; --folder names it); --seed seeds the weights, the host KV values and the forced-miss draws; meta.json
holds a run_id (kept on --resume), the phases and the seed. An independent validation sweep is a
separate run: `--phases validation --seed 1`.

Writes <out>/<gpu>/engine.csv (one row per step point), reuse_fetch.csv (the reuse-fetch records),
rows.jsonl (every point, resumable: --resume), meta.json and summary.json (floors, ratios with
min/median/max over repetitions, the reuse-fetch records, provenance). A point that does
not fit reports `oom` and the sweep goes on; an invalid --point gives one line and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import os
import statistics
import sys
import time

import torch

from ddbench.core.catalog import get_model
from ddbench.core.catalog.gpus import catalog_gpu_name, get_gpu
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload, max_batch
from ddbench.core.paths import traces_dir
from ddbench.core.designs import DESIGNS as SYSTEMS

GIB = 1 << 30
COLUMNS = ["phase", "rep", "design", "context", "batch", "miss_rate", "transfers", "graph", "urgent_programs",
           "host_layers", "status", "step_ms", "step_ms_min", "step_ms_max", "tok_s", "peak_gib",
           "floor_ms", "step_over_floor", "weights_gib", "selection_gib", "kv_gib",
           "prefetch_mib", "urgent_mib", "link_mib", "link_gbps", "link_util", "floor_link_ms",
           "model_max_batch", "steps", "error"]
K128, K32 = 131072, 32768
MECH_POINTS = ((1, 0.33), (2, 0.33), (4, 0.33), (16, 0.33), (2, 0.174), (4, 0.174))   # (batch, miss rate) at 128K


def design_spec(name):
    """A registry design, or '<design>-single': the same switches with one query token per step."""
    import dataclasses
    if name.endswith("-single"):
        return dataclasses.replace(SYSTEMS[name[:-7]], name=name, tokens_per_step=1)
    if name not in SYSTEMS:
        raise DDBenchError(f"unknown design {name!r}; known: {', '.join(SYSTEMS)} (or <design>-single)")
    return SYSTEMS[name]


def copy_gbps(nbytes=GIB, reps=5):
    from kernels.timing import event_times
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ts = event_times(lambda: dst.copy_(src, non_blocking=True), reps)
    del src, dst
    return nbytes / (statistics.median(ts) * 1e-3) / 1e9


def hbm_gbps(nbytes=2 * GIB, reps=10):
    """Device-to-device copy rate, bytes read + written."""
    from kernels.timing import event_times
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ts = event_times(lambda: b.copy_(a), reps, warmup=2)
    del a, b
    return 2 * nbytes / (statistics.median(ts) * 1e-3) / 1e9


def gather_gbps(host, programs=32, reps=5):
    """The persistent UVA gather alone on this host buffer (one layer, every chunk of a 256-chunk budget)."""
    from kernels.gather import gather_uva
    from kernels.timing import event_times
    L, B, H, N, _, C, d = host.shape
    k = min(256, N)
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = torch.rand(B, H, N, device="cuda", generator=g).argsort(-1)[..., :k].sort(-1).values.int()
    kb = torch.empty(B, H, k * C, d, device="cuda", dtype=host.dtype)
    vb = torch.empty_like(kb)
    ts = event_times(lambda: gather_uva(host, 0, idx, kb, vb, programs=programs), reps)
    return idx.numel() * 2 * C * d * host.element_size() / (statistics.median(ts) * 1e-3) / 1e9


def alloc_host(gib, seed=0):
    t0 = time.perf_counter()
    n = int(gib * GIB) // 2
    flat = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    t1 = time.perf_counter()
    g = torch.Generator(device="cuda").manual_seed(2 + seed)
    step = GIB // 2
    tmp = torch.empty(step, dtype=torch.bfloat16, device="cuda")
    for s in range(0, n, step):
        e = min(n, s + step)
        tmp[:e - s].normal_(generator=g)
        flat[s:e].copy_(tmp[:e - s])
    torch.cuda.synchronize()
    del tmp
    return flat, t1 - t0, time.perf_counter() - t1


def host_view(flat, model, ctx, batch, chunk=8):
    H, d = model.num_kv_heads, model.head_dim
    N = ctx // chunk
    per_layer = batch * H * N * 2 * chunk * d
    hl = min(model.num_layers, flat.numel() // per_layer)
    if hl == 0:
        return None
    return flat[:hl * per_layer].view(hl, batch, H, N, 2, chunk, d)


def make_config(ctx, batch, miss_rate=0.174, transfers=True, urgent_programs=64, budget=None, chunk=None, seed=0):
    wl = {}
    if budget is not None:
        wl["budget"] = budget
    if chunk is not None:
        wl["chunk"] = chunk
    from kernels.engine.engine import EngineConfig
    return EngineConfig.of(context=ctx, batch=batch, miss_rate=miss_rate, transfers=transfers,
                           urgent_programs=urgent_programs, seed=seed, **wl)


@contextlib.contextmanager
def point_memory(row):
    """Around one point's GPU work: cached memory freed and the peak reset first; an out-of-memory
    error (a capture that runs out surfaces as a RuntimeError) sets row["status"] = "oom"."""
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        row["status"] = "oom"
    except RuntimeError as exc:
        if "out of memory" not in str(exc).lower():
            raise
        row["status"] = "oom"


def run_point(model, weights, flat, design, ctx, batch, *, miss_rate=0.174, transfers=True, graph=True,
              reps=5, urgent_programs=64, hbm=None, cfg=None, log=print, keep=False, seed=0):
    """One engine point: build, pre-decode, warm up, capture, time `reps` graph replays (2 steps each)."""
    from kernels.engine.engine import Engine
    from kernels.timing import event_times
    sys_ = design_spec(design)
    base = SYSTEMS[design[:-7]] if design.endswith("-single") else sys_
    row = dict(design=design, context=ctx, batch=batch, miss_rate="none" if miss_rate is None else miss_rate,
               transfers=int(transfers), graph=int(graph), urgent_programs=urgent_programs, host_layers=0,
               status="ok", model_max_batch=max_batch(base, model, get_gpu("h200"), Workload(context=ctx)))
    cfg = cfg or make_config(ctx, batch, miss_rate, transfers, urgent_programs, seed=seed)
    host = None
    if not sys_.kv_on_gpu and transfers:
        host = host_view(flat, model, ctx, batch)
        if host is None:
            row["status"] = "host-limit"
            return row
        row["host_layers"] = host.shape[0]
    e = None
    with point_memory(row):
        e = Engine(model, sys_, cfg, weights, "cuda", host_kv=host)
        e.step()                                  # pre-decoding step (prediction designs) or warm-up
        e.step()                                  # eager warm-up
        if graph:
            e.capture(2)
            times = event_times(e.replay, reps, warmup=1, per_call=2)
            steps = 2 * reps
        else:
            times = event_times(e.step, reps, warmup=1)
            steps = reps
        torch.cuda.synchronize()
        pf, ur = e.step_bytes()                   # miss counts of the last step, read after the timed steps
        fb = e.floor_bytes()
        peak = torch.cuda.max_memory_allocated()
    if row["status"] == "oom":
        e = None
        gc.collect()
        torch.cuda.empty_cache()
        log(f"  {design:26s} ctx={ctx:6d} B={batch:3d}: oom")
        return row
    step = statistics.median(times)
    floor = fb["total"] / (hbm * 1e9) * 1e3 if hbm else None
    row.update(step_ms=step, step_ms_min=min(times), step_ms_max=max(times), tok_s=batch / step * 1e3,
               peak_gib=peak / GIB, prefetch_mib=pf / 2**20, urgent_mib=ur / 2**20, link_mib=(pf + ur) / 2**20,
               link_gbps=(pf + ur) / (step * 1e-3) / 1e9, steps=steps, floor_ms=floor,
               step_over_floor=step / floor if floor else None, weights_gib=fb["weights"] / GIB,
               selection_gib=fb["selection"] / GIB, kv_gib=fb["kv"] / GIB)
    if keep:
        return row, e
    del e
    gc.collect()
    torch.cuda.empty_cache()
    log(f"  {design:26s} ctx={ctx:6d} B={batch:3d} miss={row['miss_rate']} xfer={int(transfers)} graph={int(graph)} "
        f"step={step:8.3f} ms [{min(times):.3f}-{max(times):.3f}]"
        + (f" floor={floor:7.3f} x{step / floor:5.2f}" if floor else "")
        + f" link={row['link_gbps']:5.1f} GB/s peak={row['peak_gib']:6.1f} GiB")
    return row


def reuse_fetch_point(model, flat, ctx, batch, miss_rate, *, reps=5, seed=0, log=print, device="cuda"):
    """The reuse-fetch record of one point (ShadowKV at ctx, batch, forced miss rate): the engine's
    fetch of one layer (engine.reuse_fetch with the engine's Triton gather and its launch), set up as
    _sparse_attention's reuse branch has it: every layer its own [B, H, S, d] value buffer (S =
    engine.buffer_rows), one spare whose first k*C tokens take the previous selection, host layer
    l % host_layers, the previous selection a sorted random k-subset per (b, h) and this step's the
    engine's forced-miss draw over it (perturb_fast, salt = the layer). copy, plan, gather and the
    whole fetch are each captured as one CUDA graph of the model's L layers back to back; each is the
    median of `reps` replays (after one warm-up replay) / L, in ms per layer. miss_chunks is counted
    from the gather's own plan (an eager fetch of every layer before the graphs)."""
    from kernels.engine.engine import _ops, buffer_rows, reuse_copy, reuse_fetch, reuse_gather, reuse_launch
    from kernels.engine.transfer import perturb_fast
    from kernels.indexsets import reuse_plan
    from kernels.timing import capture_graph, event_times
    t0 = time.perf_counter()
    sys_ = SYSTEMS["shadowkv"]
    cfg = make_config(ctx, batch, miss_rate, True, seed=seed)
    cfg.validate(model)
    L, H, d = model.num_layers, model.num_kv_heads, model.head_dim
    C, N, k = cfg.chunk, ctx // cfg.chunk, cfg.budget // cfg.chunk
    S = buffer_rows(cfg, sys_)[3]
    vo = sys_.lowrank_keys == "all"           # the engine's layers that rebuild keys fetch values only
    gather = _ops(False).gather               # the engine's gather (kernels.gather.gather_uva)
    launch = reuse_launch(gather)
    dt = torch.bfloat16
    chunk_bytes = C * d * dt.itemsize * (1 if vo else 2)
    slots = batch * H * k
    per_round = launch["programs"] * launch["items"]
    row = dict(design="shadowkv", context=ctx, batch=batch, miss_rate=miss_rate, transfers=1, graph=1,
               status="ok", layers=L, host_layers=0, slots=slots, chunk_bytes=chunk_bytes,
               rounds=-(-slots // per_round), replays=reps, buffer_tokens=S, **launch)
    host = host_view(flat, model, ctx, batch, chunk=C)
    if host is None:
        row["status"] = "host-limit"
        return row
    hl = row["host_layers"] = host.shape[0]
    st = {}
    with point_memory(row):
        g = torch.Generator(device=device).manual_seed(seed + 11)
        prev = torch.stack([torch.rand(batch, H, N, device=device, generator=g).topk(k, -1).indices.sort(-1).values
                            for _ in range(L)]).to(torch.int32)
        seed_dev = torch.full((1,), seed + 1, device=device, dtype=torch.int32)
        true = torch.stack([perturb_fast(prev[i], miss_rate, N, seed_dev, i) for i in range(L)])
        vbuf = [torch.zeros(batch, H, S, d, device=device, dtype=dt) for _ in range(L + 1)]
        kbuf = None if vo else [torch.zeros_like(v) for v in vbuf]
        pv = vbuf[L][:, :, :k * C]
        pk = None if vo else kbuf[L][:, :, :k * C]

        def kb(i):
            return None if vo else kbuf[i]

        parts = {
            "copy": lambda: [reuse_copy(kb(i), vbuf[i], pk, pv) for i in range(L)],
            "plan": lambda: [reuse_plan(prev[i], true[i]) for i in range(L)],
            "gather": lambda: [reuse_gather(gather, host, i % hl, true[i], prev[i], kb(i), vbuf[i], pk, pv)
                               for i in range(L)],
            "fetch": lambda: [reuse_fetch(gather, host, i % hl, true[i], prev[i], kb(i), vbuf[i], pk, pv)
                              for i in range(L)],
        }
        src = parts["fetch"]()                                        # eager: the miss count of every layer
        miss = int(sum(int((x < 0).sum()) for x in src))
        for name, body in parts.items():
            gr = capture_graph(body, [body])
            st[name] = event_times(gr.replay, reps, warmup=1, per_call=L)
            del gr
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    prev = true = vbuf = kbuf = pv = pk = parts = src = None
    gc.collect()
    torch.cuda.empty_cache()
    if row["status"] == "oom":
        log(f"  reuse-fetch ctx={ctx:6d} B={batch:3d} miss={miss_rate}: oom")
        return row
    per_layer = miss / L
    row.update({f"{n}_ms": statistics.median(t) for n, t in st.items()})
    row.update(miss_chunks=int(per_layer) if per_layer == int(per_layer) else per_layer,
               link_mib=per_layer * chunk_bytes / 2**20, fetch_ms_min=min(st["fetch"]), fetch_ms_max=max(st["fetch"]),
               peak_gib=peak / GIB, wall_s=time.perf_counter() - t0)
    log(f"  reuse-fetch ctx={ctx:6d} B={batch:3d} miss={miss_rate:4.2f} slots={slots:6d} "
        f"miss_chunks={row['miss_chunks']:6} copy={row['copy_ms'] * 1e3:7.1f} plan={row['plan_ms'] * 1e3:6.1f} gather={row['gather_ms'] * 1e3:7.1f} "
        f"fetch={row['fetch_ms'] * 1e3:7.1f} us/layer [{row['fetch_ms_min'] * 1e3:.1f}-{row['fetch_ms_max'] * 1e3:.1f}]"
        f" link={row['link_mib']:6.1f} MiB ({row['wall_s']:.1f} s)")
    return row


PHASES = ("floor", "mechanism", "validation", "reuse-fetch")
REUSE = "reuse-fetch"
REUSE_BATCHES = ((K32, (1, 2, 4, 8, 16, 32, 64)), (K128, (16,)))   # (context, batches) of the reuse-fetch record
REUSE_MISS = (0.0, 0.25, 1.0)             # all hits (HBM), the mix, all host reads
REUSE_COLUMNS = ["phase", "rep", "design", "context", "batch", "miss_rate", "status", "layers", "host_layers",
                 "slots", "miss_chunks", "chunk_bytes", "programs", "items", "rounds", "link_mib", "copy_ms",
                 "plan_ms", "gather_ms", "fetch_ms", "fetch_ms_min", "fetch_ms_max", "replays", "buffer_tokens",
                 "peak_gib", "wall_s", "error"]
FORCED_MISS = 0.174                       # the floor phase's forced-miss twins (harness cost, see below)
VAL_MISS = 0.25                           # validation: miss rates and batches the other phases do not use
VAL_BATCHES = (2, 8, 32)


def parse_phases(text):
    """'floor,validation' -> ('floor', 'validation') in run order; one-line error for an unknown name."""
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in names if x not in PHASES]
    if bad or not names:
        raise DDBenchError(f"--phases takes a comma-separated subset of {', '.join(PHASES)}, got {text!r}")
    return tuple(p for p in PHASES if p in names)


def out_folder(gpu, phases, folder=None):
    """The sweep's folder name under --out: --folder, else the GPU's catalog name for all phases, else
    '<gpu>-<phases joined by +>' (a partial run never overwrites a full sweep's folder)."""
    if folder:
        return folder
    return gpu if tuple(phases) == PHASES else gpu + "-" + "+".join(phases)


def plan_points(quick, reps, phases=PHASES):
    """(phase, rep, design, context, batch, miss, transfers, graph) in run order, for the selected phases.

    floor: compute-only steps with the model's own selection (the simulator's calibration), and for
    the designs that draw forced misses the same steps with a forced miss rate: their difference is
    the harness's cost of drawing the misses (not a design cost), which sim/validate.py adds to
    forced-miss points. validation: points the floor phase does not measure (batches 2, 8, 32, miss
    rates 0.25 and 0.1), full steps with their compute-only twins."""
    pts = []
    if quick:
        for d in ("dualdecoder", "dualdecoder-single", "shadowkv", "specache", "full-kv"):
            pts.append(("floor", 0, d, K32, 4, 0.174, False, True))
        for d, B in (("dualdecoder", 16), ("dualdecoder", 64), ("dualdecoder-single", 64), ("shadowkv", 16),
                     ("specache", 16), ("full-kv", 1)):
            pts.append(("floor", 0, d, K128, B, 0.174, False, True))
        for d in ("dualdecoder", "dualdecoder-fifo", "shadowkv", "specache", "dualdecoder-per-layer",
                  "dualdecoder-two-pass"):
            pts.append(("mechanism", 0, d, K32, 4, 0.33, True, True))
        pts.append(("mechanism", 0, "dualdecoder-cpu-gather", K32, 2, 0.33, True, False))
        pts.append((REUSE, 0, "shadowkv", K32, 4, 0.25, True, True))
        return pts
    for c in (K32, K128):
        for B in (1, 16, 64):
            for d in ("dualdecoder", "dualdecoder-single", "shadowkv", "specache", "full-kv"):
                pts.append(("floor", 0, d, c, B, None, False, True))   # the model's own selection
            for d in ("dualdecoder", "shadowkv", "specache"):      # the harness's forced-miss draw
                pts.append(("floor", 0, d, c, B, FORCED_MISS, False, True))
    pts = [p for p in pts if p[0] in phases]
    if "mechanism" in phases:
        pts += _mechanism_points(reps)
    if "validation" in phases:
        pts += _validation_points()
    if REUSE in phases:
        pts += reuse_points()
    return pts


def reuse_points():
    """The reuse-fetch record's points: ShadowKV (its fetch, values only), every batch of REUSE_BATCHES
    at its context, each forced miss rate of REUSE_MISS; graph, with transfers (a fetch alone)."""
    return [(REUSE, 0, "shadowkv", c, B, m, True, True) for c, bs in REUSE_BATCHES for B in bs for m in REUSE_MISS]


def _mechanism_points(reps):
    pts = []
    for r in range(reps):
        for B, m in MECH_POINTS:
            for d in ("dualdecoder", "dualdecoder-fifo"):
                pts.append(("mechanism", r, d, K128, B, m, True, True))
            pts.append(("mechanism", r, "dualdecoder", K128, B, m, False, True))
        pts.append(("mechanism", r, "dualdecoder-two-pass", K128, 16, 0.33, True, True))
        pts.append(("mechanism", r, "dualdecoder-two-pass", K128, 16, 0.33, False, True))
        pts.append(("mechanism", r, "dualdecoder-per-layer", K128, 16, 0.33, True, True))
        pts.append(("mechanism", r, "dualdecoder-cpu-gather", K128, 16, 0.33, True, False))
        pts.append(("mechanism", r, "dualdecoder", K128, 16, 0.33, True, False))
    return pts


def _validation_points():
    pts = []
    for c in (K32, K128):
        for B in VAL_BATCHES:
            for d in ("dualdecoder", "shadowkv", "specache"):
                pts.append(("validation", 0, d, c, B, VAL_MISS, True, True))
                pts.append(("validation", 0, d, c, B, VAL_MISS, False, True))   # its compute-only twin
        for B in ((2, 8) if c == K32 else ()):   # full-kv at 128K: calibrated at batch 1 only (16 is oom)
            pts.append(("validation", 0, "full-kv", c, B, None, True, True))
    for B in VAL_BATCHES:
        pts.append(("validation", 0, "dualdecoder-fifo", K128, B, VAL_MISS, True, True))
    for x in (True, False):
        pts.append(("validation", 0, "dualdecoder", K128, 8, 0.1, x, True))
    return pts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every mechanism point (>= 3 for ratios)")
    ap.add_argument("--host-gib", type=float, default=16.0)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new points after this many seconds")
    ap.add_argument("--replays", type=int, default=5, help="timed graph replays (2 steps each) per point")
    ap.add_argument("--out", help="output root (default: the data root's engine/)")
    ap.add_argument("--resume", action="store_true", help="skip points already in <out>/<gpu>/rows.jsonl")
    ap.add_argument("--force", action="store_true", help="replace an earlier sweep in the folder (ddbench's own files"
                                                         " only)")
    ap.add_argument("--profile", action="store_true", help="also write a one-step kernel timeline (torch.profiler)")
    ap.add_argument("--point", help="one point only: DESIGN:CONTEXT:BATCH (checked, then run and printed)")
    ap.add_argument("--miss", type=float, default=0.174)
    ap.add_argument("--budget", type=int, help="sparse budget in tokens (default: the core Workload's)")
    ap.add_argument("--chunk", type=int, help="tokens per chunk (default: the core Workload's)")
    ap.add_argument("--no-transfers", action="store_true")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help="comma-separated phases to run (floor, mechanism, validation, reuse-fetch;"
                         " default all)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the weights, the host KV values and the forced-miss draws (default 0)")
    ap.add_argument("--folder", help="output folder under --out (default the GPU's name for all phases, else"
                                     " <gpu>-<phases>, e.g. h200-validation)")
    a = ap.parse_args(argv)
    try:
        if a.point:
            return run_one(a)
        return run(a)
    except DDBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def parse_point(text):
    parts = text.split(":")
    if len(parts) != 3:
        raise DDBenchError(f"--point must be DESIGN:CONTEXT:BATCH, got {text!r}")
    d, c, b = parts
    design_spec(d)
    try:
        c, b = int(c), int(b)
    except ValueError:
        raise DDBenchError(f"--point context and batch must be integers, got {text!r}") from None
    return d, c, b


def check_point(model, design, ctx, batch, a):
    cfg = make_config(ctx, batch, a.miss, not a.no_transfers, budget=a.budget, chunk=a.chunk)
    cfg.validate(model)
    return cfg


def run_one(a):
    model = get_model("llama-3-8b")
    d, c, b = parse_point(a.point)
    cfg = check_point(model, d, c, b, a)        # before touching the GPU: bad input exits 2 anywhere
    if not torch.cuda.is_available():
        raise DDBenchError("the engine bench needs a CUDA GPU; none is visible to torch")
    from kernels.engine.model import Weights
    flat = None if a.no_transfers else alloc_host(a.host_gib)[0]
    weights = Weights.random(model, "cuda", seed=0)
    hbm = hbm_gbps()
    row = run_point(model, weights, flat, d, c, b, miss_rate=a.miss, transfers=not a.no_transfers,
                    graph=design_spec(d).gather != "cpu", reps=a.replays, hbm=hbm, cfg=cfg)
    print(json.dumps(row))
    return 0


def _append(path, obj):
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(obj) + "\n")


def run(a):
    from kernels.timing import provenance
    phases = parse_phases(a.phases)             # before touching the GPU: bad input exits 2 anywhere
    if not torch.cuda.is_available():
        raise DDBenchError("the engine bench needs a CUDA GPU; none is visible to torch")
    if a.reps < 1 or a.replays < 1:
        raise DDBenchError("--reps and --replays must be >= 1")
    t_start = time.perf_counter()
    prov = provenance("python -m kernels.engine.sweep " + " ".join(sys.argv[1:]))
    model = get_model("llama-3-8b")
    out = os.path.join(a.out or str(traces_dir("engine")),
                       out_folder(catalog_gpu_name(prov["gpu"], torch.cuda.get_device_properties(0).total_memory),
                                  phases, a.folder))
    from ddbench.core.outputs import output_folder
    # written in place as points finish (--resume picks up): every file is one of the guard's live files,
    # refused up front where it exists and ddbench did not write it; an earlier sweep is replaced only
    # with --force or resumed with --resume
    with output_folder(out, command="python -m kernels.engine.sweep", shared=True, own_ok=a.resume,
                       force=a.force) as w:
        for name in OUT_FILES:
            if os.path.exists(os.path.join(out, name)) and not (a.resume or a.force):
                raise DDBenchError(f"{out} holds an earlier sweep ({name}); pass --resume or --force")
            w.live(name)
        return _sweep(a, phases, prov, model, out, t_start)


OUT_FILES = ("meta.json", "rows.jsonl", "current.json", "engine.csv", "summary.json", "reuse_fetch.csv",
             "timeline.json")


def _sweep(a, phases, prov, model, out, t_start):
    from kernels.engine.model import Weights
    print(f"[engine] {prov['gpu']}  torch {prov['torch']}  triton {prov['triton']}  sha {prov['git_sha']}", flush=True)
    cg = copy_gbps()
    hbm = hbm_gbps()
    flat, t_pin, t_fill = alloc_host(a.host_gib, a.seed)
    print(f"[engine] pinned {a.host_gib} GiB in {t_pin:.1f} s; H2D copy {cg:.1f} GB/s; HBM copy {hbm:.0f} GB/s",
          flush=True)
    hv = host_view(flat, model, 32768, 16)
    gg = gather_gbps(hv)
    print(f"[engine] thin gather (32 blocks) alone: {gg:.1f} GB/s", flush=True)
    # the reuse-fetch record builds no engine step: no weights for a run of that phase alone
    weights = Weights.random(model, "cuda", seed=a.seed) if set(phases) - {REUSE} else None
    torch.cuda.synchronize()
    from ddbench.core.io import write_json
    run_id = None
    if a.resume and os.path.exists(os.path.join(out, "meta.json")):   # a resumed run keeps its identity
        with open(os.path.join(out, "meta.json"), encoding="utf-8") as fh:
            run_id = json.load(fh).get("run_id")
    import uuid
    meta = dict(provenance=prov, run_id=run_id or uuid.uuid4().hex, phases=list(phases), seed=a.seed,
                copy_h2d_gbps=cg, hbm_copy_gbps=hbm, thin_gather_gbps=gg, host_gib=a.host_gib,
                pin_s=t_pin, fill_s=t_fill)
    write_json(os.path.join(out, "meta.json"), meta)
    rows, done = [], {}
    jl = os.path.join(out, "rows.jsonl")
    cur = os.path.join(out, "current.json")
    if a.resume and os.path.exists(jl):
        with open(jl, encoding="utf-8") as fh:
            for line in fh:
                r = json.loads(line)
                done[r["key"]] = r
        if os.path.exists(cur):   # the point that was running when the last process died
            with open(cur, encoding="utf-8") as fh:
                k = json.load(fh)["key"]
            if k not in done:
                ph, rep, d0, c0, b0, m0, x0, g0 = json.loads(k)
                done[k] = dict(key=k, row=dict(phase=ph, rep=rep, design=d0, context=c0, batch=b0, miss_rate=m0,
                                               transfers=int(x0), graph=int(g0), status="crashed"))
                _append(jl, done[k])
    elif os.path.exists(jl):
        os.remove(jl)
    pts = plan_points(a.quick, a.reps, phases)
    for (ph, rep, d, c, B, m, x, g) in pts:
        key = json.dumps([ph, rep, d, c, B, m, x, g])
        if key in done:
            rows.append(done[key]["row"])
            continue
        base = dict(phase=ph, rep=rep, design=d, context=c, batch=B, miss_rate="none" if m is None else m,
                    transfers=int(x), graph=int(g))
        if ph != REUSE:
            base["urgent_programs"] = 64
        if time.perf_counter() - t_start > a.budget_s:
            rows.append(dict(base, status="skipped-time"))
            continue
        with open(cur, "w", encoding="utf-8") as fh:
            json.dump(dict(key=key), fh)
        try:
            if ph == REUSE:
                r = reuse_fetch_point(model, flat, c, B, m, reps=a.replays, seed=a.seed,
                                      log=lambda t: print(t, flush=True))
            else:
                r = run_point(model, weights, flat, d, c, B, miss_rate=m, transfers=x, graph=g, reps=a.replays,
                              hbm=hbm, log=lambda t: print(t, flush=True), seed=a.seed)
        except Exception as exc:  # noqa: BLE001 - reported in the row and the log; the sweep goes on
            import traceback
            print(f"  {d} ctx={c} B={B}: ERROR\n" + traceback.format_exc(limit=8), flush=True)
            r = dict(status="error", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        r = {**base, **r}
        r["phase"], r["rep"] = ph, rep
        if r.get("step_ms"):
            r["floor_link_ms"] = r["link_mib"] * 2**20 / (cg * 1e9) * 1e3
            r["link_util"] = r["link_gbps"] / cg
        rows.append(r)
        _append(jl, dict(key=key, row=r))
    if os.path.exists(cur):
        os.remove(cur)
    summary = dict(schema=2, **meta, wall_s=time.perf_counter() - t_start)
    write(out, rows, summary)
    if a.profile and "mechanism" in phases:
        profile_one(model, weights, flat, out, hbm)
    print(f"[engine] wrote {out} ({len(rows)} points) in {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


PROFILE_POINT = ("dualdecoder", K128, 4, 0.33)


def profile_one(model, weights, flat, out, hbm):
    """Kernel timeline of one graph replay (two steps) at PROFILE_POINT: timeline.json, per stream."""
    from torch.profiler import ProfilerActivity, profile
    d, c, B, m = PROFILE_POINT
    row, e = run_point(model, weights, flat, d, c, B, miss_rate=m, transfers=True, graph=True, reps=3,
                       hbm=hbm, keep=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        e.replay()
        torch.cuda.synchronize()
    tmp = os.path.join(out, ".trace.json")
    p.export_chrome_trace(tmp)
    with open(tmp, encoding="utf-8") as fh:
        tr = json.load(fh)
    os.remove(tmp)
    ev = [x for x in tr.get("traceEvents", []) if x.get("ph") == "X" and x.get("cat") in ("kernel", "gpu_memcpy",
                                                                                          "gpu_memset")]
    t0 = min(x["ts"] for x in ev) if ev else 0
    streams = {}
    for x in ev:
        streams.setdefault(str(x.get("args", {}).get("stream", x.get("tid"))), []).append(
            [x["name"][:60], round(x["ts"] - t0, 2), round(x["dur"], 2)])
    from ddbench.core.io import write_json
    write_json(os.path.join(out, "timeline.json"), dict(
        point=dict(design=d, context=c, batch=B, miss_rate=m, graph_steps=2), row=row,
        stream_priority={"prefetch": e.sched.streams["prefetch"].priority,
                         "urgent": e.sched.streams["urgent"].priority},
        note="one CUDA-graph replay of two whole steps; times in microseconds from the first kernel",
        streams=streams))
    del e
    gc.collect()
    torch.cuda.empty_cache()


def _csv_row(r):
    """engine.csv names registry designs only: '<design>-single' is written as <design> with tokens=1."""
    d = r.get("design", "")
    single = d.endswith("-single")
    return dict(r, design=d[:-7] if single else d, tokens=1 if single or d == "full-kv" else
                (SYSTEMS[d].tokens_per_step if d in SYSTEMS else ""))


TWIN = {"dualdecoder-fifo": "dualdecoder", "dualdecoder-per-layer": "dualdecoder",
        "dualdecoder-cpu-gather": "dualdecoder"}


def add_exposed(rows):
    """exposed_ms = step with transfers - the compute-only step of the same design (the FIFO, per-layer
    and CPU-gather ablations compute exactly what DualDecoder computes), context and batch, from
    the same repetition where there is one; 0 for compute-only rows and full-kv (no transfers)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("step_ms")]
    for r in ok:
        if not r["transfers"] or r["design"] == "full-kv":
            r["exposed_ms"], r["exposed_share"] = 0.0, 0.0
            continue
        d = TWIN.get(r["design"], r["design"])
        twin = [t for t in ok if not t["transfers"] and t["design"] == d and t["context"] == r["context"]
                and t["batch"] == r["batch"]]
        same = [t for t in twin if t.get("rep") == r.get("rep") and t.get("phase") == r.get("phase")]
        t = (same or twin or [None])[0]
        if t is None:
            r["exposed_ms"] = r["exposed_share"] = None
            continue
        r["exposed_ms"] = max(0.0, r["step_ms"] - t["step_ms"])
        r["exposed_share"] = r["exposed_ms"] / r["step_ms"]
        r["compute_ms"] = t["step_ms"]


def write(out, rows, summary):
    from ddbench.core.io import atomic_path, write_json
    prov = summary["provenance"]
    pcols = list(prov)
    reuse = [r for r in rows if r.get("phase") == REUSE]     # no step: neither engine.csv nor the ratios
    rows = [r for r in rows if r.get("phase") != REUSE]
    add_exposed(rows)
    os.makedirs(out, exist_ok=True)
    if reuse:
        with atomic_path(os.path.join(out, "reuse_fetch.csv")) as tmp:
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                w = csv.DictWriter(fh, fieldnames=["schema"] + REUSE_COLUMNS + pcols, extrasaction="ignore")
                w.writeheader()
                for r in reuse:
                    w.writerow({"schema": 2, **r, **prov})
        summary["reuse_fetch"] = [{c: r.get(c) for c in REUSE_COLUMNS if c not in ("phase", "rep", "error")}
                                  for r in reuse]
    cols = ["schema"] + COLUMNS + ["tokens", "exposed_ms", "exposed_share", "compute_ms"] + pcols
    with atomic_path(os.path.join(out, "engine.csv")) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                rr = _csv_row(r)
                if rr.get("status") == "ok" and rr.get("exposed_ms") is None:
                    rr["status"] = "ok-no-twin"   # measured, but no compute-only twin to split off exposure
                w.writerow({"schema": 2, **rr, **prov})
    summary["ratios"] = ratios(rows)
    write_json(os.path.join(out, "summary.json"), summary)


def _spread(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return dict(n=len(xs), min=xs[0], median=statistics.median(xs), max=xs[-1])


def ratios(rows):
    """Step/floor per point, dual/single, and every mechanism ratio per repetition with min/median/max.
    `clear` says whether the effect (|median - 1|) exceeds the spread (max - min) of the ratio."""
    ok = [r for r in rows if str(r.get("status", "")).startswith("ok") and r.get("step_ms")]

    def pick(phase=None, **kw):
        return [r for r in ok if (phase is None or r.get("phase") == phase) and all(r.get(k) == v for k, v in kw.items())]

    res = {}
    floor = {}
    for r in pick("floor", miss_rate="none"):     # the model's own selection (not the forced-miss twins)
        floor[f"{r['design']}|{r['context']}|{r['batch']}"] = dict(step_ms=r["step_ms"], floor_ms=r["floor_ms"],
                                                                  step_over_floor=r["step_over_floor"])
    res["step_over_floor"] = floor
    ds = {}
    for c in (K32, K128):
        for B in (1, 16, 64):
            a = pick("floor", design="dualdecoder", context=c, batch=B, miss_rate="none")
            b = pick("floor", design="dualdecoder-single", context=c, batch=B, miss_rate="none")
            if a and b:
                ds[f"{c}|{B}"] = a[0]["step_ms"] / b[0]["step_ms"]
    res["dual_over_single"] = ds

    def per_rep(num, den):
        out = []
        for rep in sorted({r["rep"] for r in pick("mechanism")}):
            n = pick("mechanism", rep=rep, **num)
            d = pick("mechanism", rep=rep, **den)
            if n and d:
                out.append(n[0]["step_ms"] / d[0]["step_ms"])
        sp = _spread(out)
        if sp:
            sp["values"] = out
            sp["clear"] = abs(sp["median"] - 1) > (sp["max"] - sp["min"])
        return sp

    mech = {}
    for B, mr in MECH_POINTS:
        tag = f"b{B}_m{mr}"
        mech[f"fifo_over_priority_{tag}"] = per_rep(
            dict(design="dualdecoder-fifo", context=K128, batch=B, miss_rate=mr, transfers=1),
            dict(design="dualdecoder", context=K128, batch=B, miss_rate=mr, transfers=1, graph=1))
        sh, lu = [], []
        for rep in sorted({r["rep"] for r in pick("mechanism")}):
            x = pick("mechanism", rep=rep, design="dualdecoder", context=K128, batch=B, miss_rate=mr, transfers=1, graph=1)
            c = pick("mechanism", rep=rep, design="dualdecoder", context=K128, batch=B, miss_rate=mr, transfers=0)
            if x and c:
                sh.append((x[0]["step_ms"] - c[0]["step_ms"]) / x[0]["step_ms"])
                lu.append(x[0].get("link_util"))
        mech[f"exposed_share_{tag}"] = _spread(sh)
        if mech[f"exposed_share_{tag}"]:
            mech[f"exposed_share_{tag}"]["values"] = sh
            mech[f"exposed_share_{tag}"]["link_util"] = _spread(lu)
    base = dict(design="dualdecoder", context=K128, batch=16, miss_rate=0.33, transfers=1, graph=1)
    mech["two_pass_over_dual_b16"] = per_rep(dict(design="dualdecoder-two-pass", context=K128, batch=16, transfers=1), base)
    mech["two_pass_over_dual_compute_only_b16"] = per_rep(
        dict(design="dualdecoder-two-pass", context=K128, batch=16, transfers=0),
        dict(design="dualdecoder", context=K128, batch=16, miss_rate=0.33, transfers=0))
    mech["per_layer_over_pingpong_b16"] = per_rep(dict(design="dualdecoder-per-layer", context=K128, batch=16), base)
    mech["cpu_gather_over_gpu_gather_eager_b16"] = per_rep(
        dict(design="dualdecoder-cpu-gather", context=K128, batch=16),
        dict(design="dualdecoder", context=K128, batch=16, miss_rate=0.33, transfers=1, graph=0))
    mech["cpu_gather_over_gpu_gather_graph_b16"] = per_rep(dict(design="dualdecoder-cpu-gather", context=K128, batch=16), base)
    mech["eager_over_graph_b16"] = per_rep(dict(design="dualdecoder", context=K128, batch=16, miss_rate=0.33,
                                                transfers=1, graph=0), base)
    res["mechanism"] = mech
    pk = {}
    for d in ("dualdecoder", "dualdecoder-per-layer"):
        x = pick("mechanism", design=d, context=K128, batch=16, transfers=1, graph=1)
        if x:
            pk[d] = _spread([r["peak_gib"] for r in x])
    res["peak_gib_b16"] = pk
    res["link_util"] = {f"{r['design']}|{r['context']}|{r['batch']}|{r['miss_rate']}|rep{r.get('rep', 0)}": r["link_util"]
                        for r in ok if r["transfers"] and r.get("link_util")}
    return res


def rebuild(folder):
    """Write engine.csv, layers.csv and summary.json from rows.jsonl + meta.json (a run cut short)."""
    with open(os.path.join(folder, "meta.json"), encoding="utf-8") as fh:
        meta = json.load(fh)
    rows, seen = [], {}
    with open(os.path.join(folder, "rows.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            seen[r["key"]] = r
    for r in seen.values():
        rows.append(r["row"])
    meta["schema"] = 2
    write(folder, rows, meta)
    return rows


if __name__ == "__main__":
    sys.exit(main())
