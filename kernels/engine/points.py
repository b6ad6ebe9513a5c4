"""One engine point: its design label, its config, and the code that builds it and times it.

    Label.parse("dualdecoder-cache@8192+fp8") -> Label(design, cache_tokens=8192, kv_bits=8); str() gives it back
    ('+fp8cache': the fp8 host KV and an fp8 GPU chunk cache, cache_bits 8)
    design_spec(name)      the registry design of a name or label ('<design>-single': one query token per step)
    PointSetup(model, weights, flat, hbm, limit, ...)   what every point of a process shares
    PointTiming(miss_rate, transfers, graph, reps, ...)  how one point runs
    make_config(ctx, batch, timing, **knobs) -> ddbench.kernels.engine.engine.EngineConfig
    run_point(setup, design, ctx, batch, timing) -> row: build, pre-decode, warm up, capture, time
    reuse_fetch_point(model, flat, ctx, batch, miss_rate, ...) -> row: ShadowKV's fetch of one layer alone
    copy_gbps, hbm_gbps, gather_gbps, alloc_host, fp8_host, host_view: the start-up rates and the host KV

Below the phases (kernels/engine/phases.py), the paper phase (paper.py) and the CLI (sweep.py); it
imports none of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ddbench.core.catalog.gpus import get_gpu
from ddbench.core.defaults import FORCED_MISS
from ddbench.core.designs import DESIGNS as SYSTEMS, SHADOWKV
from ddbench.core.enginepoint import FP8, FP8_CACHE, EnginePoint as Label  # noqa: F401
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import max_batch

GIB = 1 << 30


# ------------------------------------------------------------------ the point's design

def design_spec(name):
    """The registry design of a name or label; '<design>-single': its switches with one query token per step
    (ddbench.core.enginepoint)."""
    return Label(Label.parse(name).design).spec()


def design_labels(designs, cache_tokens, kv_bits=(16,), cache_bits=(16,)) -> list[str]:
    """The paper phase's labels: a design, a chunk-cache design once per capacity (design@tokens), and
    with 8 in kv_bits each design that keeps its KV on the host once more in fp8 (label + '+fp8'), a
    chunk-cache design with 8 in cache_bits too with an fp8 cache ('+fp8cache')."""
    from ddbench.core.memory import keeps_kv_on_host
    out = []
    for bits in kv_bits:
        for d in designs:
            if bits == 8 and not keeps_kv_on_host(design_spec(d)):
                continue
            cache = design_spec(d).chunk_cache
            for t in (cache_tokens if cache else (None,)):
                for cb in (cache_bits if (cache and bits == 8) else (16,)):
                    out.append(str(Label(d, t, bits, cb)))
    return out


@dataclass(frozen=True, eq=False)
class PointSetup:
    """What every engine point of a process shares: the model and its weights, the pinned host buffer the
    host KV is viewed from, and the start-up measurements and limits."""
    model: object
    weights: object = None
    flat: object = None             # the pinned host buffer (alloc_host); None: no host KV (transfers off)
    hbm: float | None = None        # device copy rate in GB/s (hbm_gbps): the floor; None: no floor
    limit: int | None = None        # bytes torch may allocate; None: no check
    mem_gpu: object = None          # the memory model's GPU for model_max_batch (None: the H200)
    overhead: int = 0               # bytes outside torch's allocator (the CUDA context and cuBLAS)
    log: Callable = print


@dataclass(frozen=True)
class PointTiming:
    """How one point runs: the forced miss rate (None: the model's own prediction), transfers on or off,
    CUDA-graph replays or eager steps, how many timed, the urgent fetch's programs and the seed."""
    miss_rate: float | None = FORCED_MISS
    transfers: bool = True
    graph: bool = True
    reps: int = 5
    urgent_programs: int = 64
    seed: int = 0


_DEFAULT_ON_NONE = ("budget", "chunk", "cache_tokens")     # None: the workload's default


def make_config(ctx, batch, timing: PointTiming = PointTiming(), **knobs):
    """The EngineConfig of a point: `timing`'s miss rate, transfers, urgent programs and seed, and the
    workload and engine knobs of EngineConfig.of (budget, chunk, cache_tokens: None is the default)."""
    knobs = {k: v for k, v in knobs.items() if v is not None or k not in _DEFAULT_ON_NONE}
    from ddbench.kernels.engine.engine import EngineConfig
    return EngineConfig.of(context=ctx, batch=batch, miss_rate=timing.miss_rate, transfers=timing.transfers,
                           urgent_programs=timing.urgent_programs, seed=timing.seed, **knobs)


# ------------------------------------------------------------------ start-up rates and the host KV

def copy_gbps(nbytes=GIB, reps=5):
    from ddbench.kernels.timing import event_times
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ts = event_times(lambda: dst.copy_(src, non_blocking=True), reps)
    del src, dst
    return nbytes / (statistics.median(ts) * 1e-3) / 1e9


def hbm_gbps(nbytes=2 * GIB, reps=10):
    """Device-to-device copy rate, bytes read + written."""
    from ddbench.kernels.timing import event_times
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ts = event_times(lambda: b.copy_(a), reps, warmup=2)
    del a, b
    return 2 * nbytes / (statistics.median(ts) * 1e-3) / 1e9


def gather_gbps(host, programs=32, reps=5):
    """The persistent UVA gather alone on this host buffer (one layer, every chunk of a 256-chunk budget)."""
    from ddbench.kernels.gather import gather_uva
    from ddbench.kernels.timing import event_times
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
    values quantised on the GPU one GiB at a time (ddbench.kernels.fp8.quantize_host_kv, one scale per `piece` =
    C * d elements), made once and kept for the process."""
    from ddbench.kernels.fp8 import quantize_host_kv
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
    """(view, alias) of the pinned buffer as the point's host KV (ddbench.kernels.layout.host_kv_view: aliased
    layers, then with `requests` aliased requests), or (None, None) where it does not fit."""
    from ddbench.kernels.layout import host_kv_view
    view, alias = host_kv_view(flat, model.num_layers, batch, model.num_kv_heads, ctx // chunk, chunk, model.head_dim)
    if alias == "layers+requests" and not requests:
        return None, None
    return view, alias


# ------------------------------------------------------------------ one engine point

@contextlib.contextmanager
def point_memory(row, stage=None):
    """Around one point's GPU work: cached memory freed and the peak reset first; an out-of-memory
    error anywhere in the exception's chain (ddbench.kernels.engine.capture.is_oom: a capture that runs out
    included) sets row["status"] = "oom", row["error"] (where: `stage`, a dict whose "now" the point
    updates) and the reserved peak; anything else, or a capture whose end left torch's state suspect
    (capture.is_sticky), propagates."""
    from ddbench.kernels.engine import capture as cap
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


def check_gpu_state(row, sticky, gpu_state, where, health=None, log=None):
    """After a point (or a model's weights) that is not ok: the cache released and the GPU state checked
    (`health`, default ddbench.kernels.engine.capture.gpu_health); where it is unusable or the failure was sticky,
    the row's error says so and gpu_state["poisoned"] names `where`: no later point of the process runs."""
    from ddbench.kernels.engine import capture as cap
    cap.release()
    ok, why = (health or cap.gpu_health)()
    if sticky or not ok:
        why = why or "a sticky CUDA error"
        row["error"] = (row.get("error") or row.get("status", "")) + f" | the GPU state is unusable after it: {why}"
        gpu_state["poisoned"] = f"{where} ({why})"
        if log:
            log(f"the GPU state is unusable after {gpu_state['poisoned']}: no later point runs")


def run_point(setup: PointSetup, design, ctx, batch, timing: PointTiming = PointTiming(), *, cfg=None, keep=False):
    """One engine point: build, pre-decode, warm up, capture, time `timing.reps` graph replays (2 steps each).

    Memory: `setup.limit` (bytes torch may allocate; None: no check) refuses a point whose planned bytes
    (what is allocated now, the weights, + ddbench.kernels.engine.engine.plan_bytes) exceed it, before
    allocating: status oom, planned_gib. Every row has the peak (allocated and reserved) and the peak by
    category: mem_weights_gib (allocated before the point), the plan's categories, mem_activations_gib (the
    rest of the allocated peak: transient work and the CUDA graph's pool), mem_runtime_overhead_gib
    (`setup.overhead`: the CUDA context and cuBLAS outside torch's allocator); model_max_batch and
    model_mem_gib are the memory model's (ddbench.core.memory) on `setup.mem_gpu` (default the H200) for the
    same workload. `cfg`: the point's EngineConfig (default make_config(ctx, batch, timing)); `keep`:
    return (row, engine)."""
    from ddbench.kernels.engine.engine import plan_bytes
    model, log = setup.model, setup.log
    spec = design_spec(design)
    cfg = cfg or make_config(ctx, batch, timing)
    row = _point_row(setup, design, ctx, batch, cfg, timing)
    host = scales = None
    if not spec.kv_on_gpu and timing.transfers:
        host, scales = _point_host_kv(row, setup.flat, model, cfg, (ctx, batch), timing.seed)
        if host is None:
            return row
    plan = plan_bytes(model, spec, cfg)
    e = None
    stage = dict(now="build")
    with point_memory(row, stage):
        resident = torch.cuda.memory_allocated()
        row["planned_gib"] = (resident + sum(plan.values())) / GIB
        if setup.limit is not None and resident + sum(plan.values()) > setup.limit:
            row.update(status="oom", error=f"planned {row['planned_gib']:.2f} GiB > the limit"
                                           f" {setup.limit / GIB:.2f} GiB (not allocated)")
            log(f"  {design:26s} ctx={ctx:6d} B={batch:3d}: oom (planned {row['planned_gib']:.1f} GiB)")
            return row
        e, times, steps = _build_and_time(setup, spec, cfg, (host, scales), stage, timing)
        counters = _step_counters(e)
    if row["status"] == "oom":
        e = None
        gc.collect()
        torch.cuda.empty_cache()
        log(f"  {design:26s} ctx={ctx:6d} B={batch:3d}: oom in {stage['now']} (planned {row['planned_gib']:.1f} GiB)")
        return row
    _record_times(row, (times, steps), counters, plan, (resident, setup.overhead), setup.hbm)
    if keep:
        return row, e
    del e
    gc.collect()
    torch.cuda.empty_cache()
    log(_point_line(row))
    return row


def _point_row(setup, design, ctx, batch, cfg, timing):
    """The point's identity and the memory model's largest batch and bytes for its workload."""
    from ddbench.core.memory import memory_breakdown
    model, gpu = setup.model, setup.mem_gpu or get_gpu("h200")
    spec = design_spec(design)
    base = design_spec(Label.parse(design).base)       # the registry design (its own tokens per step)
    miss_rate = timing.miss_rate
    row = dict(model=model.name, design=design, context=ctx, batch=batch,
               miss_rate="none" if miss_rate is None else miss_rate, transfers=int(timing.transfers),
               graph=int(timing.graph), urgent_programs=timing.urgent_programs, host_layers=0, host_alias="",
               status="ok", model_max_batch=max_batch(base, model, gpu, cfg.workload),
               model_mem_gib=memory_breakdown(base, model, gpu,
                                              dataclasses.replace(cfg.workload, batch=batch)).total / GIB)
    if spec.chunk_cache:
        row.update(cache_tokens=cfg.workload.cache_tokens, churn_rate=cfg.churn_rate)
    row["kv_bits"] = cfg.workload.kv_bits
    row["cache_bits"] = cfg.workload.cache_bits
    return row


def _point_host_kv(row, flat, model, cfg, point, seed):
    """(host KV view, fp8 scales or None) of the pinned buffer for this point (context, batch); (None, None)
    and status host-limit where it does not fit."""
    ctx, batch = point
    scales = None
    if cfg.workload.kv_bits == 8:
        flat, scales = fp8_host(flat, cfg.chunk * model.head_dim, seed)
    host, alias = host_view(flat, model, ctx, batch, cfg.chunk)
    if host is None:
        row["status"] = "host-limit"
        return None, None
    row["host_layers"], row["host_alias"] = host.shape[0], alias
    return host, scales


def _build_and_time(setup, spec, cfg, host_kv, stage, timing):
    """(engine, step times in ms, steps timed): the pre-decoding and a warm-up step eagerly, then `reps`
    CUDA-graph replays of two steps (graph) or `reps` eager steps; stage["now"] names the part running.
    host_kv: (host KV view, fp8 scales), each None where there is none."""
    from ddbench.kernels.engine.engine import Engine
    from ddbench.kernels.timing import event_times
    host, scales = host_kv
    graph, reps = timing.graph, timing.reps
    e = Engine(setup.model, spec, cfg, setup.weights, "cuda", host_kv=host, host_scales=scales)
    stage["now"] = "the eager steps"
    e.step()                                  # pre-decoding step (prediction designs) or warm-up
    e.step()                                  # eager warm-up
    if not graph:
        return e, event_times(e.step, reps, warmup=1), reps
    torch.cuda.synchronize()
    torch.cuda.empty_cache()                  # the eager steps' cached blocks: not beside the graph's pool
    stage["now"] = "the capture"
    e.capture(2)
    stage["now"] = "the replays"
    return e, event_times(e.replay, reps, warmup=1, per_call=2), 2 * reps


def _step_counters(e):
    """The link bytes of the last step (read after the timed steps), the floor's bytes and the peaks."""
    torch.cuda.synchronize()
    pf, ur = e.step_bytes()
    return dict(prefetch=pf, urgent=ur, floor=e.floor_bytes(), peak=torch.cuda.max_memory_allocated(),
                peak_reserved=torch.cuda.max_memory_reserved())


def _record_times(row, timed, c, plan, outside, hbm):
    """The row's step times, tokens/s, floor, link traffic and memory by category. timed: (step times in ms,
    steps timed); outside: (bytes allocated before the point, bytes outside torch's allocator)."""
    from ddbench.kernels.engine.engine import PLAN_CATEGORIES
    times, steps = timed
    resident, overhead = outside
    batch = row["batch"]
    step = statistics.median(times)
    fb, pf, ur = c["floor"], c["prefetch"], c["urgent"]
    floor = fb["total"] / (hbm * 1e9) * 1e3 if hbm else None
    row.update({f"mem_{k}_gib": plan[k] / GIB for k in PLAN_CATEGORIES})
    row.update(mem_weights_gib=resident / GIB, mem_activations_gib=(c["peak"] - resident - sum(plan.values())) / GIB,
               mem_runtime_overhead_gib=overhead / GIB, peak_reserved_gib=c["peak_reserved"] / GIB,
               tok_s_min=batch / max(times) * 1e3, tok_s_max=batch / min(times) * 1e3)
    row.update(step_ms=step, step_ms_min=min(times), step_ms_max=max(times), tok_s=batch / step * 1e3,
               peak_gib=c["peak"] / GIB, prefetch_mib=pf / 2**20, urgent_mib=ur / 2**20, link_mib=(pf + ur) / 2**20,
               link_gbps=(pf + ur) / (step * 1e-3) / 1e9, steps=steps, floor_ms=floor,
               step_over_floor=step / floor if floor else None, weights_gib=fb["weights"] / GIB,
               selection_gib=fb["selection"] / GIB, kv_gib=fb["kv"] / GIB)


def _point_line(r):
    floor = r["floor_ms"]
    return (f"  {r['design']:26s} ctx={r['context']:6d} B={r['batch']:3d} miss={r['miss_rate']} xfer={r['transfers']}"
            f" graph={r['graph']} step={r['step_ms']:8.3f} ms [{r['step_ms_min']:.3f}-{r['step_ms_max']:.3f}]"
            + (f" floor={floor:7.3f} x{r['step_ms'] / floor:5.2f}" if floor else "")
            + f" link={r['link_gbps']:5.1f} GB/s peak={r['peak_gib']:6.1f} GiB")


# ------------------------------------------------------------------ ShadowKV's fetch of one layer

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
    from ddbench.kernels.engine.ops import engine_ops
    t0 = time.perf_counter()
    gather = engine_ops(False).gather               # the engine's gather (ddbench.kernels.gather.gather_uva)
    geo, row = _reuse_geometry(model, ctx, batch, miss_rate, reps, seed, gather)
    host, _ = host_view(flat, model, ctx, batch, chunk=geo["C"], requests=False)
    if host is None:
        row["status"] = "host-limit"
        return row
    row["host_layers"] = host.shape[0]
    L, times, miss = geo["L"], {}, 0
    with point_memory(row):
        parts = _reuse_parts(gather, host, geo, batch, miss_rate, seed, device)
        miss = _count_misses(parts["fetch"])  # eager: the miss count of every layer
        times = _time_parts(parts, reps, L)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    parts = None
    gc.collect()
    torch.cuda.empty_cache()
    if row["status"] == "oom":
        log(f"  reuse-fetch ctx={ctx:6d} B={batch:3d} miss={miss_rate}: oom")
        return row
    per_layer = miss / L
    row.update({f"{n}_ms": statistics.median(t) for n, t in times.items()})
    row.update(miss_chunks=int(per_layer) if per_layer == int(per_layer) else per_layer,
               link_mib=per_layer * row["chunk_bytes"] / 2**20, fetch_ms_min=min(times["fetch"]),
               fetch_ms_max=max(times["fetch"]), peak_gib=peak / GIB, wall_s=time.perf_counter() - t0)
    log(_reuse_line(row))
    return row


def _reuse_geometry(model, ctx, batch, miss_rate, reps, seed, gather):
    """(shapes of the fetch, the row's identity and launch): ShadowKV's config at the point, values only
    where every layer rebuilds its keys, the engine's buffer rows and the gather's launch."""
    from ddbench.kernels.engine.engine import buffer_rows, reuse_launch
    sys_ = SYSTEMS[SHADOWKV]
    cfg = make_config(ctx, batch, PointTiming(miss_rate, seed=seed))
    cfg.validate(model)
    C = cfg.chunk
    geo = dict(L=model.num_layers, H=model.num_kv_heads, d=model.head_dim, C=C, N=ctx // C, k=cfg.budget // C,
               S=buffer_rows(cfg, sys_)[3], vo=sys_.lowrank_keys == "all")   # the layers that rebuild keys fetch values only
    launch = reuse_launch(gather)
    chunk_bytes = C * geo["d"] * torch.bfloat16.itemsize * (1 if geo["vo"] else 2)
    slots = batch * geo["H"] * geo["k"]
    row = dict(model=model.name, design=SHADOWKV, context=ctx, batch=batch, miss_rate=miss_rate, transfers=1,
               graph=1, status="ok", layers=geo["L"], host_layers=0, slots=slots, chunk_bytes=chunk_bytes,
               rounds=-(-slots // (launch["programs"] * launch["items"])), replays=reps, buffer_tokens=geo["S"],
               **launch)
    return geo, row


def _reuse_parts(gather, host, geo, batch, miss_rate, seed, device):
    """{copy, plan, gather, fetch}: each the L layers' calls back to back, on per-layer buffers, the
    previous selections (random sorted k-subsets) and this step's (the engine's forced-miss draw)."""
    from ddbench.kernels.engine.engine import reuse_copy, reuse_fetch, reuse_gather
    from ddbench.kernels.engine.transfer import perturb_fast
    from ddbench.kernels.indexsets import reuse_plan
    L, H, d, N, k, C, S, vo = (geo[x] for x in ("L", "H", "d", "N", "k", "C", "S", "vo"))
    hl = host.shape[0]
    g = torch.Generator(device=device).manual_seed(seed + 11)
    prev = torch.stack([torch.rand(batch, H, N, device=device, generator=g).topk(k, -1).indices.sort(-1).values
                        for _ in range(L)]).to(torch.int32)
    seed_dev = torch.full((1,), seed + 1, device=device, dtype=torch.int32)
    true = torch.stack([perturb_fast(prev[i], miss_rate, N, seed_dev, i) for i in range(L)])
    vbuf = [torch.zeros(batch, H, S, d, device=device, dtype=torch.bfloat16) for _ in range(L + 1)]
    kbuf = None if vo else [torch.zeros_like(v) for v in vbuf]
    pv = vbuf[L][:, :, :k * C]
    pk = None if vo else kbuf[L][:, :, :k * C]

    def kb(i):
        return None if vo else kbuf[i]

    return {
        "copy": lambda: [reuse_copy(kb(i), vbuf[i], pk, pv) for i in range(L)],
        "plan": lambda: [reuse_plan(prev[i], true[i]) for i in range(L)],
        "gather": lambda: [reuse_gather(gather, host, i % hl, true[i], prev[i], kb(i), vbuf[i], pk, pv)
                           for i in range(L)],
        "fetch": lambda: [reuse_fetch(gather, host, i % hl, true[i], prev[i], kb(i), vbuf[i], pk, pv)
                          for i in range(L)],
    }


def _count_misses(fetch):
    """Chunks every layer's fetch read from the host (its plan's negative sources), run once eagerly."""
    return int(sum(int((x < 0).sum()) for x in fetch()))


def _time_parts(parts, reps, L):
    """Each part captured as one CUDA graph and replayed: its times per layer (ms)."""
    from ddbench.kernels.timing import capture_graph, event_times
    times = {}
    for name, body in parts.items():
        gr = capture_graph(body, [body])
        times[name] = event_times(gr.replay, reps, warmup=1, per_call=L)
        del gr
    return times


def _reuse_line(r):
    us = {n: r[f"{n}_ms"] * 1e3 for n in ("copy", "plan", "gather", "fetch")}
    return (f"  reuse-fetch ctx={r['context']:6d} B={r['batch']:3d} miss={r['miss_rate']:4.2f} slots={r['slots']:6d} "
            f"miss_chunks={r['miss_chunks']:6} copy={us['copy']:7.1f} plan={us['plan']:6.1f} gather={us['gather']:7.1f} "
            f"fetch={us['fetch']:7.1f} us/layer [{r['fetch_ms_min'] * 1e3:.1f}-{r['fetch_ms_max'] * 1e3:.1f}]"
            f" link={r['link_mib']:6.1f} MiB ({r['wall_s']:.1f} s)")
