"""Engine measurement sweep on the local CUDA GPU: a model's shapes (--model, default Llama-3-8B), every design.

    python -m kernels.engine.sweep [--quick] [--reps 3] [--host-gib 16] [--budget-s 420] [--out DIR]
    python -m kernels.engine.sweep --point dualdecoder:131072:16 [--miss 0.33] [--budget 2048] [--chunk 8]
    python -m kernels.engine.sweep --phases paper --model qwen2.5-32b --contexts 64k,128k,256k --gpu-mem-cap h100-80gb

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
  paper      (not in the default list) the paper's own points: every design at the largest batch that fits
             under --gpu-mem-cap at each context of --contexts, with the batches its search measured (the
             throughput-against-batch series), GPU memory by category and the memory model's largest
             batch per row; forced miss rate --miss (default 1 - the core's default hit rate). See
             kernels/engine/paper.py.

--model: a catalog model or a path to a Hugging Face config.json (rows carry its name: `model`).
--gpu-mem-cap GB (or a catalog GPU name, e.g. h100-80gb): emulate a smaller GPU; a point whose planned
bytes exceed it is reported `oom` with them (planned_gib) and not allocated; a cap at or below the
weights, or above the GPU's memory, is one line and exit 2.

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
from ddbench.core.memory import max_batch
from ddbench.core.paths import traces_dir
from ddbench.core.designs import DESIGNS as SYSTEMS
from kernels.engine import paper as paper_phase
from kernels.engine.designspec import design_spec  # noqa: F401  (sweep.design_spec: its old home)

GIB = 1 << 30
SCHEMA = 3    # engine.csv and reuse_fetch.csv; 3: the model column, memory by category, the paper phase's columns
MEM_COLUMNS = ["mem_weights_gib", "mem_resident_kv_gib", "mem_landmarks_gib", "mem_aux_residency_gib",
               "mem_sparse_kv_buffers_gib", "mem_activations_gib", "mem_runtime_overhead_gib"]
COLUMNS = ["phase", "model", "rep", "design", "context", "batch", "miss_rate", "transfers", "graph", "urgent_programs",
           "host_layers", "host_alias", "status", "step_ms", "step_ms_min", "step_ms_max", "tok_s", "tok_s_min",
           "tok_s_max", "peak_gib", "peak_reserved_gib", "planned_gib", *MEM_COLUMNS,
           "floor_ms", "step_over_floor", "weights_gib", "selection_gib", "kv_gib",
           "prefetch_mib", "urgent_mib", "link_mib", "link_gbps", "link_util", "floor_link_ms",
           "model_max_batch", "model_mem_gib", "gpu_mem_cap", "cap_gib", "largest_batch", "largest_basis",
           "next_planned_gib", "paper_role", "steps", "wall_s", "error", "cache_tokens", "churn_rate", "design_label",
           "kv_bits"]
K128, K32 = 131072, 32768
DEFAULT_MODEL = "llama-3-8b"
MECH_POINTS = ((1, 0.33), (2, 0.33), (4, 0.33), (16, 0.33), (2, 0.174), (4, 0.174))   # (batch, miss rate) at 128K


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


_FP8_HOST = {}        # (bytes, seed, piece) -> (e4m3 flat, scales): made once per process, on first need


def fp8_host(flat, piece, seed=0):
    """(e4m3 flat, fp32 scales) of the same pinned bytes as the bf16 host buffer `flat`: random normal
    values quantised on the GPU one GiB at a time (kernels.fp8.quantize_host_kv, one scale per `piece` =
    C * d elements), made once and kept for the process."""
    from kernels.fp8 import quantize_host_kv
    key = (flat.numel() * flat.element_size(), seed, piece)
    if key not in _FP8_HOST:
        n = key[0] // (2 * piece) * (2 * piece)
        q = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        sc = torch.empty(n // piece, dtype=torch.float32, pin_memory=True)
        g = torch.Generator(device="cuda").manual_seed(3 + seed)
        step = GIB // 4 // (2 * piece) * (2 * piece)     # 1 GiB of fp32 at a time
        for s in range(0, n, step):
            e = min(n, s + step)
            x = torch.randn(e - s, device="cuda", generator=g).view(-1, 2, 1, piece)   # one scale per piece
            qq, ss = quantize_host_kv(x)
            q[s:e].copy_(qq.view(torch.uint8).view(-1))
            sc[s // piece:e // piece].copy_(ss)
        torch.cuda.synchronize()
        _FP8_HOST[key] = (q.view(torch.float8_e4m3fn), sc)
    return _FP8_HOST[key]


def host_view(flat, model, ctx, batch, chunk=8, requests=True):
    """(view, alias) of the pinned buffer as the point's host KV (kernels.layout.host_kv_view: aliased
    layers, then with `requests` aliased requests), or (None, None) where it does not fit."""
    from kernels.layout import host_kv_view
    view, alias = host_kv_view(flat, model.num_layers, batch, model.num_kv_heads, ctx // chunk, chunk, model.head_dim)
    if alias == "layers+requests" and not requests:
        return None, None
    return view, alias


def make_config(ctx, batch, miss_rate=0.174, transfers=True, urgent_programs=64, budget=None, chunk=None, seed=0,
                quant_values=False, cache_tokens=None, churn_rate=None, kv_bits=16):
    wl = {"kv_bits": kv_bits}
    if cache_tokens is not None:
        wl["cache_tokens"] = cache_tokens
    if budget is not None:
        wl["budget"] = budget
    if chunk is not None:
        wl["chunk"] = chunk
    from kernels.engine.engine import EngineConfig
    return EngineConfig.of(context=ctx, batch=batch, miss_rate=miss_rate, transfers=transfers,
                           urgent_programs=urgent_programs, seed=seed, quant_values=quant_values,
                           churn_rate=churn_rate, **wl)


@contextlib.contextmanager
def point_memory(row, stage=None):
    """Around one point's GPU work: cached memory freed and the peak reset first; an out-of-memory
    error anywhere in the exception's chain (kernels.engine.capture.is_oom: a capture that runs out
    included) sets row["status"] = "oom", row["error"] (where: `stage`, a dict whose "now" the point
    updates) and the reserved peak; anything else, or a capture whose end left torch's state suspect
    (capture.is_sticky), propagates."""
    from kernels.engine import capture as cap
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - classified below
        if not cap.is_oom(exc) or cap.is_sticky(exc):
            raise
        where = (stage or {}).get("now")
        row.update(status="oom", error=f"out of memory{' in ' + where if where else ''}: {cap.describe(exc)[:160]}",
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / GIB)


def run_point(model, weights, flat, design, ctx, batch, *, miss_rate=0.174, transfers=True, graph=True,
              reps=5, urgent_programs=64, hbm=None, cfg=None, log=print, keep=False, seed=0, limit=None,
              mem_gpu=None, overhead=0):
    """One engine point: build, pre-decode, warm up, capture, time `reps` graph replays (2 steps each).

    Memory: `limit` (bytes torch may allocate; None: no check) refuses a point whose planned bytes (what
    is allocated now, the weights, + kernels.engine.engine.plan_bytes) exceed it, before allocating:
    status oom, planned_gib. Every row has the peak (allocated and reserved) and the peak by category:
    mem_weights_gib (allocated before the point), the plan's categories, mem_activations_gib (the rest of
    the allocated peak: transient work and the CUDA graph's pool), mem_runtime_overhead_gib (`overhead`:
    the CUDA context and cuBLAS outside torch's allocator); model_max_batch and model_mem_gib are the
    memory model's (ddbench.core.memory) on `mem_gpu` (default the H200) for the same workload."""
    from dataclasses import replace

    from ddbench.core.memory import memory_breakdown
    from kernels.engine.engine import PLAN_CATEGORIES, Engine, plan_bytes
    from kernels.timing import event_times
    sys_ = design_spec(design)
    base = SYSTEMS[design[:-7]] if design.endswith("-single") else sys_
    cfg = cfg or make_config(ctx, batch, miss_rate, transfers, urgent_programs, seed=seed)
    gpu = mem_gpu or get_gpu("h200")
    row = dict(model=model.name, design=design, context=ctx, batch=batch,
               miss_rate="none" if miss_rate is None else miss_rate, transfers=int(transfers), graph=int(graph),
               urgent_programs=urgent_programs, host_layers=0, host_alias="", status="ok",
               model_max_batch=max_batch(base, model, gpu, cfg.workload),
               model_mem_gib=memory_breakdown(base, model, gpu, replace(cfg.workload, batch=batch)).total / GIB)
    if sys_.chunk_cache:
        row.update(cache_tokens=cfg.workload.cache_tokens, churn_rate=cfg.churn_rate)
    host = scales = None
    row["kv_bits"] = cfg.workload.kv_bits
    if not sys_.kv_on_gpu and transfers:
        if cfg.workload.kv_bits == 8:
            flat, scales = fp8_host(flat, cfg.chunk * model.head_dim, seed)
        host, alias = host_view(flat, model, ctx, batch, cfg.chunk)
        if host is None:
            row["status"] = "host-limit"
            return row
        row["host_layers"], row["host_alias"] = host.shape[0], alias
    plan = plan_bytes(model, sys_, cfg)
    e = None
    stage = dict(now="build")
    with point_memory(row, stage):
        resident = torch.cuda.memory_allocated()
        row["planned_gib"] = (resident + sum(plan.values())) / GIB
        if limit is not None and resident + sum(plan.values()) > limit:
            row.update(status="oom", error=f"planned {row['planned_gib']:.2f} GiB > the limit {limit / GIB:.2f} GiB"
                                           " (not allocated)")
            log(f"  {design:26s} ctx={ctx:6d} B={batch:3d}: oom (planned {row['planned_gib']:.1f} GiB)")
            return row
        e = Engine(model, sys_, cfg, weights, "cuda", host_kv=host, host_scales=scales)
        stage["now"] = "the eager steps"
        e.step()                                  # pre-decoding step (prediction designs) or warm-up
        e.step()                                  # eager warm-up
        if graph:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()              # the eager steps' cached blocks: not beside the graph's pool
            stage["now"] = "the capture"
            e.capture(2)
            stage["now"] = "the replays"
            times = event_times(e.replay, reps, warmup=1, per_call=2)
            steps = 2 * reps
        else:
            times = event_times(e.step, reps, warmup=1)
            steps = reps
        torch.cuda.synchronize()
        pf, ur = e.step_bytes()                   # miss counts of the last step, read after the timed steps
        fb = e.floor_bytes()
        peak = torch.cuda.max_memory_allocated()
        peak_res = torch.cuda.max_memory_reserved()
    if row["status"] == "oom":
        e = None
        gc.collect()
        torch.cuda.empty_cache()
        log(f"  {design:26s} ctx={ctx:6d} B={batch:3d}: oom in {stage['now']} (planned {row['planned_gib']:.1f} GiB)")
        return row
    step = statistics.median(times)
    floor = fb["total"] / (hbm * 1e9) * 1e3 if hbm else None
    row.update({f"mem_{c}_gib": plan[c] / GIB for c in PLAN_CATEGORIES})
    row.update(mem_weights_gib=resident / GIB, mem_activations_gib=(peak - resident - sum(plan.values())) / GIB,
               mem_runtime_overhead_gib=overhead / GIB, peak_reserved_gib=peak_res / GIB,
               tok_s_min=batch / max(times) * 1e3, tok_s_max=batch / min(times) * 1e3)
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
    row = dict(model=model.name, design="shadowkv", context=ctx, batch=batch, miss_rate=miss_rate, transfers=1,
               graph=1, status="ok", layers=L, host_layers=0, slots=slots, chunk_bytes=chunk_bytes,
               rounds=-(-slots // per_round), replays=reps, buffer_tokens=S, **launch)
    host, _ = host_view(flat, model, ctx, batch, chunk=C, requests=False)
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


PHASES = ("floor", "mechanism", "validation", "reuse-fetch")     # the default run
PAPER = paper_phase.PAPER
ALL_PHASES = PHASES + (PAPER,)            # `paper` only when asked for (--phases paper)
REUSE = "reuse-fetch"
REUSE_BATCHES = ((K32, (1, 2, 4, 8, 16, 32, 64)), (K128, (16,)))   # (context, batches) of the reuse-fetch record
REUSE_MISS = (0.0, 0.25, 1.0)             # all hits (HBM), the mix, all host reads
REUSE_COLUMNS = ["phase", "model", "rep", "design", "context", "batch", "miss_rate", "status", "layers", "host_layers",
                 "slots", "miss_chunks", "chunk_bytes", "programs", "items", "rounds", "link_mib", "copy_ms",
                 "plan_ms", "gather_ms", "fetch_ms", "fetch_ms_min", "fetch_ms_max", "replays", "buffer_tokens",
                 "peak_gib", "wall_s", "error"]
FORCED_MISS = 0.174                       # the floor phase's forced-miss twins (harness cost, see below)
VAL_MISS = 0.25                           # validation: miss rates and batches the other phases do not use
VAL_BATCHES = (2, 8, 32)


def parse_phases(text):
    """'floor,validation' -> ('floor', 'validation') in run order; one-line error for an unknown name."""
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in names if x not in ALL_PHASES]
    if bad or not names:
        raise DDBenchError(f"--phases takes a comma-separated subset of {', '.join(ALL_PHASES)}, got {text!r}")
    return tuple(p for p in ALL_PHASES if p in names)


def out_folder(gpu, phases, folder=None, model=DEFAULT_MODEL):
    """The sweep's folder name under --out: --folder, else the GPU's catalog name for all phases, else
    '<gpu>-<phases joined by +>' (a partial run never overwrites a full sweep's folder); another model
    than the default adds '-<model>', except to the paper phase's folder (one folder, every model)."""
    if folder:
        return folder
    name = gpu if tuple(phases) == PHASES else gpu + "-" + "+".join(phases)
    return name if model == DEFAULT_MODEL or tuple(phases) == (PAPER,) else f"{name}-{model}"


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
        return [p for p in pts if p[0] in phases]
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
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every mechanism point (>= 3 for ratios); in"
                                                        " the paper phase, the timed replays of every point")
    ap.add_argument("--host-gib", type=float, default=16.0,
                    help="pinned host KV buffer (aliased across layers, then requests, where a point needs more)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new points after this many seconds")
    ap.add_argument("--replays", type=int, default=5, help="timed graph replays (2 steps each) per point")
    ap.add_argument("--out", help="output root (default: the data root's engine/)")
    ap.add_argument("--resume", action="store_true", help="skip points already in <out>/<gpu>/rows.jsonl")
    ap.add_argument("--force", action="store_true", help="replace an earlier sweep in the folder (ddbench's own files"
                                                         " only)")
    ap.add_argument("--profile", action="store_true", help="also write a one-step kernel timeline (torch.profiler)")
    ap.add_argument("--point", help="one point only: DESIGN:CONTEXT:BATCH (checked, then run and printed)")
    ap.add_argument("--miss", type=float, help="forced miss rate (default 0.174 for --point; the paper phase: 1 -"
                                               " the core's default hit rate)")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="a catalog model (llama-3-8b, qwen2.5-14b, qwen2.5-32b, ...) or a path to a config.json")
    ap.add_argument("--gpu-mem-cap", help="emulate a GPU of this many GB (1e9 bytes) or a catalog GPU's memory"
                                          " (h100-80gb); default: this GPU's own")
    ap.add_argument("--contexts", help="paper phase: comma-separated contexts (default 128k; --quick 32k)")
    ap.add_argument("--paper-points", help="paper phase: ordered MODEL:CONTEXT pairs, comma-separated, in one process"
                                           " (qwen2.5-32b:128k,llama-3-8b:128k); default --model at each of --contexts")
    ap.add_argument("--designs", help="paper phase: comma-separated designs to search (default"
                                      " dualdecoder,shadowkv,specache,full-kv; dualdecoder-cache too)")
    ap.add_argument("--cache-tokens", help="paper phase: comma-separated chunk-cache capacities in tokens per (layer, KV"
                                           " head), each searched for dualdecoder-cache (default the Workload's)")
    ap.add_argument("--kv-bits", default="16", help="paper phase: comma-separated 16 (bf16) and/or 8 (fp8 e4m3 host KV,"
                                                    " dequantised by the gathers): with 8, each design that keeps its"
                                                    " KV on the host is searched in fp8 too (label design+fp8)")
    ap.add_argument("--churn", type=float, help="dualdecoder-cache: forced share of each step's prediction new"
                                                " against the last (with --miss: the urgent share), instead of the"
                                                " profile's measured rates")
    ap.add_argument("--repeats", type=int, default=1,
                    help="paper phase: build and measure each design's largest (or fixed) batch this many times, each a"
                         " new engine (seed + rep): min / median / max over independent builds")
    ap.add_argument("--max-batch", type=int, help=f"paper phase: the largest batch searched (default"
                                                  f" {paper_phase.MAX_BATCH}; --quick {paper_phase.QUICK['max_batch']})")
    ap.add_argument("--budget", type=int, help="sparse budget in tokens (default: the core Workload's)")
    ap.add_argument("--chunk", type=int, help="tokens per chunk (default: the core Workload's)")
    ap.add_argument("--no-transfers", action="store_true")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help="comma-separated phases to run (floor, mechanism, validation, reuse-fetch; default"
                         " these; paper only when named)")
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
    finally:
        release_cap()


def release_cap():
    """Give torch's allocator the whole GPU back (--gpu-mem-cap holds it for the run only: a caller in the
    same process, such as a test session, must not inherit the cap)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_per_process_memory_fraction(1.0)


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
    """The --point's config; a label design[@tokens][+fp8] sets the cache capacity and the fp8 host KV."""
    _, lt, bits = paper_phase.parse_label(design)
    ct = (lt or a.paper_cache_tokens[0]) if design_spec(design).chunk_cache else None
    from ddbench.core.memory import keeps_kv_on_host
    if bits == 8 and not keeps_kv_on_host(design_spec(design)):
        raise DDBenchError(f"--point {design}: fp8 applies to designs that keep their KV on the host")
    cfg = make_config(ctx, batch, a.miss, not a.no_transfers, budget=a.budget, chunk=a.chunk, cache_tokens=ct,
                      churn_rate=a.churn if design_spec(design).chunk_cache else None, kv_bits=bits)
    cfg.validate(model)
    if ct is not None and ct < cfg.budget:
        raise DDBenchError(f"--cache-tokens {ct} is smaller than the budget ({cfg.budget} tokens)")
    return cfg


def parse_contexts(text, model):
    """--contexts '64k,128k' -> (65536, 131072), each checked against the model (one-line errors)."""
    from ddbench.core.units import parse_tokens
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise DDBenchError(f"--contexts takes comma-separated contexts (128k,256k), got {text!r}")
    out = tuple(parse_tokens(x, "--contexts") for x in items)
    for c in out:
        make_config(c, 1).validate(model)
    return out


def parse_paper_points(text, cap):
    """--paper-points 'qwen2.5-32b:128k,llama-3-8b:128k:12' -> [(ModelSpec, 131072, None), (.., 131072, 12)]
    in that order (a third field: that batch only, no search); every model checked against the cap and
    every context against its model; one model spec per name."""
    specs, out = {}, []
    for item in (x.strip() for x in str(text).split(",")):
        parts = item.split(":")
        batch = None
        if len(parts) >= 3:
            try:
                batch = int(parts[-1])
            except ValueError:
                batch = None
            else:
                parts = parts[:-1]
                if batch < 1:
                    raise DDBenchError(f"--paper-points: the batch of {item!r} must be >= 1")
        name, ctx = ":".join(parts[:-1]), parts[-1] if len(parts) > 1 else ""
        if not name or not ctx:
            raise DDBenchError(f"--paper-points takes MODEL:CONTEXT[:BATCH] items (qwen2.5-32b:128k), got {item!r}")
        if name not in specs:
            specs[name] = get_model(name)
            paper_phase.check_cap(cap, specs[name])
        out.append((specs[name], parse_contexts(ctx, specs[name])[0], batch))
    return out


def check_args(a, phases=()):
    """Everything checkable without a GPU (bad input exits 2 anywhere): the models, the cap against the
    weights of each model the run uses (a.cap_models), the paper phase's points and bounds. Sets
    a.model_spec, a.cap, a.cap_label, a.paper_points, a.cap_models."""
    a.model_spec = get_model(a.model)
    a.cap, a.cap_label = paper_phase.parse_cap(a.gpu_mem_cap)
    if a.reps < 1 or a.replays < 1:
        raise DDBenchError("--reps and --replays must be >= 1")
    if not a.host_gib > 0 or not a.budget_s > 0:
        raise DDBenchError("--host-gib and --budget-s must be positive")
    q = paper_phase.QUICK if a.quick else {}
    a.paper_contexts = (parse_contexts(a.contexts, a.model_spec) if a.contexts else
                        q.get("contexts", paper_phase.DEFAULT_CONTEXTS))
    a.paper_points = parse_paper_points(a.paper_points, a.cap) if a.paper_points else \
        [(a.model_spec, c, None) for c in a.paper_contexts]
    if a.repeats < 1:
        raise DDBenchError(f"--repeats must be >= 1, got {a.repeats}")
    a.paper_designs = paper_phase.DESIGNS
    if a.designs:
        names = [x.strip() for x in a.designs.split(",")]
        for n in names:
            if not n or n not in SYSTEMS or SYSTEMS[n].gather != "gpu" or n == "ideal":
                raise DDBenchError(f"--designs: {n!r} is not a design the paper phase runs")
        a.paper_designs = tuple(names)
    a.paper_cache_tokens = (None,)
    if a.cache_tokens:
        from ddbench.core.units import parse_tokens
        a.paper_cache_tokens = tuple(parse_tokens(x.strip(), "--cache-tokens") for x in a.cache_tokens.split(","))
        from ddbench.core import defaults as D
        for t in a.paper_cache_tokens:
            make_config(paper_phase.DEFAULT_CONTEXTS[0], 1, cache_tokens=t).validate(a.model_spec)
            if t < (a.budget or D.BUDGET):
                raise DDBenchError(f"--cache-tokens {t} is smaller than the budget ({a.budget or D.BUDGET} tokens)")
    if a.paper_cache_tokens == (None,):
        from ddbench.core import defaults as D
        a.paper_cache_tokens = (D.CACHE_TOKENS,)
    try:
        a.paper_kv_bits = tuple(int(x) for x in str(a.kv_bits).split(","))
    except ValueError:
        a.paper_kv_bits = ()
    if not a.paper_kv_bits or any(b not in (8, 16) for b in a.paper_kv_bits):
        raise DDBenchError(f"--kv-bits takes 16 and/or 8 (comma-separated), got {a.kv_bits!r}")
    if a.churn is not None and not 0.0 <= a.churn <= 1.0:
        raise DDBenchError(f"--churn must be within 0..1, got {a.churn}")
    if a.churn is not None and a.miss is None:
        raise DDBenchError("--churn needs --miss (the urgent share beside it)")
    a.paper_cache_rates = None if a.churn is None else (
        lambda ctx, ct, prediction: (a.miss, None if prediction == "none" else a.churn,
                                     f"forced by --miss {a.miss:g} --churn {a.churn:g} (not the profile's)"))
    used = [m for m, _, _ in a.paper_points] if PAPER in phases else []
    if set(phases) - {PAPER} or not used:
        used = [a.model_spec] + used
    a.cap_models = list({m.name: m for m in used}.values())
    for m in a.cap_models:
        paper_phase.check_cap(a.cap, m)
    a.paper_max_batch = a.max_batch if a.max_batch is not None else q.get("max_batch", paper_phase.MAX_BATCH)
    if a.paper_max_batch < 1:
        raise DDBenchError(f"--max-batch must be >= 1, got {a.max_batch}")
    from ddbench.core import defaults as D
    a.paper_miss = a.miss if a.miss is not None else round(1.0 - D.HIT_RATE, 6)
    if not 0.0 <= a.paper_miss <= 1.0:
        raise DDBenchError(f"--miss must be within 0..1, got {a.miss}")


def gpu_memory(a):
    """On the GPU: the cap checked against its memory and the memory outside torch's allocator (CUDA
    context, cuBLAS). Returns dict(total, overhead, limit, cap, cap_label, gpu, mem_gpu) with `limit` the
    bytes torch may allocate: the cap (or the GPU's memory) less that overhead. apply_cap(mem) then
    holds torch's allocator to it (after the start-up measurements, whose buffers need not fit)."""
    x = torch.ones(64, 64, device="cuda")
    (x @ x).sum().item()                              # the CUDA context and cuBLAS exist from here
    del x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    overhead = max(0, total - free - torch.cuda.memory_reserved())
    gpu = catalog_gpu_name(torch.cuda.get_device_name(0), total)
    limit = (a.cap if a.cap is not None else total) - overhead
    from kernels.engine.model import weight_bytes
    for m in a.cap_models:
        paper_phase.check_cap(a.cap, m, total)
        if limit <= weight_bytes(m):
            raise DDBenchError(f"--gpu-mem-cap {a.cap_label}: {limit / 1e9:.1f} GB is left beside the CUDA context"
                               f" ({overhead / 1e9:.1f} GB), not above {m.name}'s weights ({weight_bytes(m) / 1e9:.1f} GB)")
    return dict(total=total, overhead=overhead, limit=limit, cap=a.cap, cap_label=a.cap_label, gpu=gpu,
                mem_gpu=paper_phase.cap_gpu(a.cap, a.cap_label, gpu))


def apply_cap(mem):
    """Torch's allocator held to mem['limit'] (emulating the capped GPU); no cap: left as it is."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if mem["cap"] is not None:
        torch.cuda.set_per_process_memory_fraction(min(1.0, mem["limit"] / mem["total"]))


def run_one(a):
    if a.miss is None:
        a.miss = 0.174
    check_args(a)
    model = a.model_spec
    d, c, b = parse_point(a.point)
    cfg = check_point(model, d, c, b, a)        # before touching the GPU: bad input exits 2 anywhere
    if not torch.cuda.is_available():
        raise DDBenchError("the engine bench needs a CUDA GPU; none is visible to torch")
    from kernels.engine.model import Weights
    mem = gpu_memory(a)
    flat = None if a.no_transfers else alloc_host(a.host_gib)[0]
    hbm = hbm_gbps()
    apply_cap(mem)
    weights = Weights.random(model, "cuda", seed=0)
    row = run_point(model, weights, flat, d, c, b, miss_rate=a.miss, transfers=not a.no_transfers,
                    graph=design_spec(d).gather != "cpu", reps=a.replays, hbm=hbm, cfg=cfg, limit=mem["limit"],
                    mem_gpu=mem["mem_gpu"], overhead=mem["overhead"])
    print(json.dumps(row))
    return 0


def _append(path, obj):
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(obj) + "\n")


SOURCE_DIRS = ("kernels", "ddbench")


def source_hash(root=None, dirs=SOURCE_DIRS) -> str:
    """The first 16 hex digits of the sha256 over the *.py files under `dirs` of the repository `root`
    (default: this checkout), in sorted order, each as its path relative to root ('/'-separated), a NUL,
    its bytes, a NUL: the code a run used, whether or not the tree's .git is there or current. Caches
    (__pycache__) and hidden folders are left out; file times do not count."""
    import hashlib
    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = []
    for d in dirs:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
            dirnames[:] = [x for x in dirnames if x != "__pycache__" and not x.startswith(".")]
            files += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    h = hashlib.sha256()
    for rel in sorted(os.path.relpath(f, root).replace(os.sep, "/") for f in files):
        h.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as fh:
            h.update(fh.read())
        h.update(b"\0")
    return h.hexdigest()[:16]


def run(a):
    from kernels.timing import provenance
    phases = parse_phases(a.phases)             # before touching the GPU: bad input exits 2 anywhere
    check_args(a, phases)
    if not torch.cuda.is_available():
        raise DDBenchError("the engine bench needs a CUDA GPU; none is visible to torch")
    t_start = time.perf_counter()
    from ddbench.core.provenance import command_line
    prov = provenance(command_line("python -m kernels.engine.sweep"))     # local paths cut
    prov["source_hash"] = source_hash()         # the code that ran, where the device's .git is stale
    model = a.model_spec
    mem = gpu_memory(a)
    out = os.path.join(a.out or str(traces_dir("engine")),
                       out_folder(catalog_gpu_name(prov["gpu"], torch.cuda.get_device_properties(0).total_memory),
                                  phases, a.folder, model.name))
    from ddbench.core.outputs import output_folder
    # written in place as points finish (--resume picks up): every file is one of the guard's live files,
    # refused up front where it exists and ddbench did not write it; an earlier sweep is replaced only
    # with --force or resumed with --resume
    with output_folder(out, command="python -m kernels.engine.sweep", shared=True, own_ok=a.resume,
                       force=a.force) as w:
        for name in OUT_FILES:
            w.live(name)             # an earlier sweep's file: refused unless --resume (own_ok) or --force
        return _sweep(a, phases, prov, model, out, t_start, mem)


OUT_FILES = ("meta.json", "rows.jsonl", "current.json", "engine.csv", "summary.json", "reuse_fetch.csv",
             "timeline.json")


def _sweep(a, phases, prov, model, out, t_start, mem):
    from kernels.engine.model import Weights
    print(f"[engine] {prov['gpu']}  torch {prov['torch']}  triton {prov['triton']}  sha {prov['git_sha']}"
          f"  source {prov.get('source_hash')}  model"
          f" {model.name}  cap {a.cap_label} (torch may allocate {mem['limit'] / GIB:.1f} GiB; outside it"
          f" {mem['overhead'] / GIB:.2f} GiB)", flush=True)
    cg = copy_gbps()
    hbm = hbm_gbps()
    flat, t_pin, t_fill = alloc_host(a.host_gib, a.seed)
    print(f"[engine] pinned {a.host_gib} GiB in {t_pin:.1f} s; H2D copy {cg:.1f} GB/s; HBM copy {hbm:.0f} GB/s",
          flush=True)
    hv, _ = host_view(flat, model, 32768, 16)
    gg = gather_gbps(hv)
    print(f"[engine] thin gather (32 blocks) alone: {gg:.1f} GB/s", flush=True)
    apply_cap(mem)
    # the reuse-fetch record builds no engine step: no weights for a run of that phase alone
    # (the paper phase allocates each of its models' weights itself)
    weights = Weights.random(model, "cuda", seed=a.seed) if set(phases) - {REUSE, PAPER} else None
    torch.cuda.synchronize()
    from ddbench.core.io import write_json
    prev = {}
    if a.resume and os.path.exists(os.path.join(out, "meta.json")):   # a resumed run keeps its identity
        with open(os.path.join(out, "meta.json"), encoding="utf-8") as fh:
            prev = json.load(fh)
    import uuid
    meta = dict(provenance=prov, source_hash=prov.get("source_hash") or source_hash(),
                run_id=prev.get("run_id") or uuid.uuid4().hex, phases=list(phases), seed=a.seed,
                copy_h2d_gbps=cg, hbm_copy_gbps=hbm, thin_gather_gbps=gg, host_gib=a.host_gib,
                pin_s=t_pin, fill_s=t_fill, model=model.name,
                models=sorted(set(prev.get("models", [])) | {model.name}
                              | {m.name for m in a.cap_models}),
                gpu_mem_cap=a.cap_label,
                gpu_mem_cap_bytes=a.cap, torch_limit_bytes=mem["limit"], runtime_overhead_bytes=mem["overhead"],
                gpu_total_bytes=mem["total"],
                host_kv=("one pinned buffer of host_gib; a point needing more reads aliased layers (l % host_layers),"
                         " then aliased requests (overlapping windows): row host_alias; every chunk still crosses"
                         " the link, only the values repeat"))
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
                kk = json.loads(k)
                if kk[0] == PAPER:    # the design's search is not retried: its crash is its result
                    _, m0, cap0, c0, d0, b0 = kk
                    done[k] = dict(key=k, row=dict(phase=PAPER, model=m0, gpu_mem_cap=cap0, design=d0, context=c0,
                                                   batch=b0, miss_rate=a.paper_miss, transfers=1, graph=1,
                                                   urgent_programs=64, status="crashed"))
                    dk = paper_phase.paper_key(m0, cap0, c0, d0)
                    done[dk] = dict(key=dk)
                    _append(jl, done[k])
                    _append(jl, done[dk])
                else:
                    ph, rep, d0, c0, b0, m0, x0, g0 = kk[:8]
                    done[k] = dict(key=k, row=dict(phase=ph, rep=rep, design=d0, context=c0, batch=b0, miss_rate=m0,
                                                   transfers=int(x0), graph=int(g0), status="crashed"))
                    _append(jl, done[k])
    elif os.path.exists(jl):
        os.remove(jl)
    src = meta["source_hash"]
    gpu_state = dict(poisoned=None)           # set where a failed point left the GPU state unusable
    completed = False
    try:
        weights = _run_points(a, phases, model, weights, flat, hbm, cg, mem, rows, done, jl, cur, t_start, src,
                              gpu_state)
        if PAPER in phases:
            box, weights = [weights], None    # the paper phase holds the only reference (it swaps models)
            weights = _run_paper_points(a, model, box, flat, hbm, cg, mem, rows, done, jl, cur, t_start, src,
                                        gpu_state)
        completed = True
    finally:
        # engine.csv and summary.json whatever happened (a crash of the sweep itself included); a
        # process killed outright leaves rows.jsonl for `rebuild` and current.json for --resume
        if completed and os.path.exists(cur):
            os.remove(cur)
        summary = dict(schema=SCHEMA, **meta, wall_s=time.perf_counter() - t_start,
                       gpu_state=gpu_state["poisoned"] or "ok", completed=completed)
        try:
            write(out, rows, summary)
        except Exception:  # noqa: BLE001 - do not hide the exception that ended the sweep
            if completed:
                raise
            import traceback
            print("[engine] writing engine.csv / summary.json failed:\n" + traceback.format_exc(limit=4), flush=True)
    if a.profile and "mechanism" in phases and not gpu_state["poisoned"]:
        profile_one(model, weights or Weights.random(model, "cuda", seed=a.seed), flat, out, hbm)
    print(f"[engine] wrote {out} ({len(rows)} points) in {time.perf_counter() - t_start:.0f} s"
          + (f"; the GPU state became unusable after {gpu_state['poisoned']}" if gpu_state["poisoned"] else ""),
          flush=True)
    return 0


def _run_points(a, phases, model, weights, flat, hbm, cg, mem, rows, done, jl, cur, t_start, src, gpu_state):
    """The plan_points phases (floor, mechanism, validation, reuse-fetch): one row each into `rows` and
    rows.jsonl. A point that raises is a row (`oom` where its exception's chain is out of memory, else
    `error`) and the sweep goes on; once the GPU state is unusable (capture.gpu_health) the remaining
    points are `error`, not run. Returns the weights (kept for the paper phase and --profile)."""
    from kernels.engine import capture as cap_mod
    pts = plan_points(a.quick, a.reps, phases)
    for (ph, rep, d, c, B, m, x, g) in pts:
        key = json.dumps([ph, rep, d, c, B, m, x, g] + ([] if model.name == DEFAULT_MODEL else [model.name]))
        if key in done:
            rows.append(done[key]["row"])
            continue
        base = dict(phase=ph, model=model.name, rep=rep, design=d, context=c, batch=B,
                    miss_rate="none" if m is None else m, transfers=int(x), graph=int(g))
        if ph != REUSE:
            base["urgent_programs"] = 64
        if time.perf_counter() - t_start > a.budget_s:
            rows.append(dict(base, status="skipped-time"))
            continue
        if gpu_state["poisoned"]:
            r = dict(base, status="error", error=f"not run: the GPU state is unusable after {gpu_state['poisoned']}",
                     source_hash=src)
            rows.append(r)
            _append(jl, dict(key=key, row=r))
            continue
        with open(cur, "w", encoding="utf-8") as fh:
            json.dump(dict(key=key), fh)
        failure = None
        try:
            if ph == REUSE:
                r = reuse_fetch_point(model, flat, c, B, m, reps=a.replays, seed=a.seed,
                                      log=lambda t: print(t, flush=True))
            else:
                r = run_point(model, weights, flat, d, c, B, miss_rate=m, transfers=x, graph=g, reps=a.replays,
                              hbm=hbm, log=lambda t: print(t, flush=True), seed=a.seed, limit=mem["limit"],
                              mem_gpu=mem["mem_gpu"], overhead=mem["overhead"])
        except Exception as exc:  # noqa: BLE001 - reported in the row and the log; the sweep goes on
            import traceback
            print(f"  {d} ctx={c} B={B}: ERROR\n" + traceback.format_exc(limit=8), flush=True)
            failure = cap_mod.classify(exc)
        if failure is not None:                   # out of the except block: the point's engine is gone
            r = dict(status=failure[0], error=failure[1])
        if r.get("status") != "ok":
            cap_mod.release()
            ok, why = cap_mod.gpu_health()
            if not ok or (failure is not None and failure[2]):
                why = why or "a sticky CUDA error"
                r["error"] = (r.get("error") or r["status"]) + f" | the GPU state is unusable after it: {why}"
                gpu_state["poisoned"] = f"{ph} {d} {c // 1024}K B={B} ({why})"
                print(f"[engine] the GPU state is unusable after {gpu_state['poisoned']}: no later point runs",
                      flush=True)
        r = {**base, **r}
        r["phase"], r["rep"] = ph, rep
        r.setdefault("source_hash", src)
        _link(r, cg)
        rows.append(r)
        _append(jl, dict(key=key, row=r))
    return weights


def _run_paper_points(a, model, box, flat, hbm, cg, mem, rows, done, jl, cur, t_start, src, gpu_state):
    """The paper phase's --paper-points in order, into `rows` and rows.jsonl: each model's weights built
    where the model changes, after every reference to the last model's (weights, engines, graphs) is
    dropped and the cache released (`box`: [the weights of `model` or None], emptied here: the caller
    keeps no reference). A model whose weights fail (out of memory included), or a search
    that raises, is rows (`oom` / `error`) and the next point runs; once the GPU state is unusable every
    later point is `error`, not run. Returns the weights of `model` if they are the ones held last."""
    from kernels.engine import capture as cap_mod
    from kernels.engine.model import Weights

    def append(key, row):
        if row is not None:
            row.setdefault("source_hash", src)
            _link(row, cg)
        _append(jl, dict(key=key) if row is None else dict(key=key, row=row))

    def current(key):
        with open(cur, "w", encoding="utf-8") as fh:
            json.dump(dict(key=key), fh)

    def not_run(pm, ctx, status, error):
        for r in paper_phase.not_run_rows(pm.name, (ctx,), cap_label=a.cap_label,
                                          cap_gib=None if a.cap is None else a.cap / GIB, miss_rate=a.paper_miss,
                                          status=status, error=error,
                                          designs=paper_phase.design_labels(a.paper_designs, a.paper_cache_tokens,
                                                                            a.paper_kv_bits)):
            append(paper_phase.paper_key(pm.name, a.cap_label, ctx, r["design"], r["batch"]), r)
            rows.append(r)

    log = lambda t: print(t, flush=True)      # noqa: E731
    weights = box.pop() if box else None
    held = (model, weights) if weights is not None else (None, None)
    weights = None
    for pm, ctx, fixed in a.paper_points:    # in the order given: the budget cuts the tail
        if gpu_state["poisoned"]:
            not_run(pm, ctx, "error", f"not run: the GPU state is unusable after {gpu_state['poisoned']}")
            continue
        if held[0] is not pm:
            held = None                       # the last model's weights: their only reference
            cap_mod.release()
            failure = None
            try:
                held = (pm, Weights.random(pm, "cuda", seed=a.seed))
            except Exception as exc:  # noqa: BLE001 - the model's points are rows; the next point runs
                import traceback
                log(f"  [paper] the weights of {pm.name} failed:\n" + traceback.format_exc(limit=6))
                failure = cap_mod.classify(exc)
            if failure is not None:
                held = (None, None)
                cap_mod.release()
                ok, why = cap_mod.gpu_health()
                text = f"the weights of {pm.name} failed: {failure[1]}"
                if not ok or failure[2]:
                    gpu_state["poisoned"] = f"the weights of {pm.name} ({why or 'a sticky CUDA error'})"
                    text += f" | the GPU state is unusable after it: {why or 'a sticky CUDA error'}"
                not_run(pm, ctx, failure[0], text)
                continue
        failure = None
        try:
            rows.extend(paper_phase.run_paper(
                pm, held[1], flat, (ctx,), cap=a.cap, cap_label=a.cap_label, limit=mem["limit"],
                mem_gpu=mem["mem_gpu"], overhead=mem["overhead"], reps=a.reps, max_batch=a.paper_max_batch,
                miss_rate=a.paper_miss, hbm=hbm, deadline=t_start + a.budget_s, done=done, append=append,
                current=current, seed=a.seed, log=log, gpu_state=gpu_state, health=cap_mod.gpu_health,
                fixed_batch=fixed, repeats=a.repeats, designs=a.paper_designs, cache_tokens=a.paper_cache_tokens,
                cache_rates=a.paper_cache_rates, kv_bits=a.paper_kv_bits, run_point=run_point,
                make_config=make_config))
        except Exception as exc:  # noqa: BLE001 - run_paper makes rows of its failures; this is a last guard
            import traceback
            log(f"  [paper] {pm.name} {ctx // 1024}K failed:\n" + traceback.format_exc(limit=8))
            failure = cap_mod.classify(exc)
        if failure is not None:
            cap_mod.release()
            not_run(pm, ctx, "error", f"the paper phase failed at {pm.name} {ctx // 1024}K: {failure[1]}")
    if held[0] is model:
        weights = held[1]
    held = None
    if a.resume:      # the searches of other models, caps and contexts in this folder stay in its files
        mine = {(r.get("model"), r.get("gpu_mem_cap"), r["context"], r["design"]) for r in rows
                if r.get("phase") == PAPER}
        rows += [e["row"] for k, e in done.items() if e.get("row") and json.loads(k)[0] == PAPER
                 and tuple(json.loads(k)[1:5]) not in mine]
    return weights


def _link(r, cg):
    """Link share of a measured row, against the run's pinned copy rate `cg` (GB/s)."""
    if r.get("step_ms"):
        r["floor_link_ms"] = r["link_mib"] * 2**20 / (cg * 1e9) * 1e3
        r["link_util"] = r["link_gbps"] / cg


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
                and t["batch"] == r["batch"] and t.get("model") == r.get("model")]
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
                    w.writerow({"schema": SCHEMA, **r, **prov})
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
                w.writerow({"schema": SCHEMA, **rr, **prov,
                            **({"source_hash": rr["source_hash"]} if rr.get("source_hash") else {})})
    summary["schema"] = SCHEMA
    summary["ratios"] = ratios(rows)
    if any(r.get("phase") == PAPER for r in rows):
        summary["paper"] = paper_phase.summarize(rows)
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
        if r.get("row"):              # not the paper phase's done markers
            rows.append(r["row"])
    meta["schema"] = SCHEMA
    write(folder, rows, meta)
    return rows


if __name__ == "__main__":
    sys.exit(main())
