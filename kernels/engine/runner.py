"""The engine sweep's run on the local GPU, from its options (kernels/engine/options.py):

    run_options(SweepOptions) -> exit code    one --point (printed), or a sweep into <out>/<folder>/
    gpu_memory, apply_cap, release_cap        the GPU's memory, the --gpu-mem-cap emulation
    source_hash()                             the code a run used
    profile_one(...)                          the one-step kernel timeline (--profile)

`python -m ddbench.kernels.engine.sweep` and `ddbench bench engine` both call run_options; the sweep's
docstring says what each phase measures and what the files hold.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import time

import torch

from ddbench.core.catalog.gpus import catalog_gpu_name
from ddbench.core.designs import DUALDECODER
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.kernels.engine import paper as paper_phase
from ddbench.kernels.engine import phases as ph
from ddbench.kernels.engine import points as pt
from ddbench.kernels.engine import results
from ddbench.kernels.engine.options import Checked, SweepOptions, check_args, check_point, parse_point

GIB = pt.GIB
COMMAND = "python -m ddbench.kernels.engine.sweep"
OUT_FILES = ("meta.json", "rows.jsonl", "current.json", "engine.csv", "summary.json", "reuse_fetch.csv",
             "timeline.json")
SOURCE_DIRS = ("kernels", "ddbench")
PROFILE_POINT = (DUALDECODER, ph.K128, 4, 0.33)


def run_options(opts: SweepOptions) -> int:
    """One --point or a sweep; a DDBenchError (bad input, no GPU) propagates for the caller to print."""
    try:
        return run_one(opts) if opts.point else run(opts)
    finally:
        release_cap()


# ------------------------------------------------------------------ GPU memory and the cap

def gpu_memory(a: Checked):
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
    from ddbench.kernels.engine.model import weight_bytes
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


def release_cap():
    """Give torch's allocator the whole GPU back (--gpu-mem-cap holds it for the run only: a caller in the
    same process, such as a test session, must not inherit the cap)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_per_process_memory_fraction(1.0)


def _need_cuda():
    if not torch.cuda.is_available():
        raise DDBenchError("the engine bench needs a CUDA GPU; none is visible to torch")


# ------------------------------------------------------------------ one point

def pt_rates_note(model, design, ctx, cfg, a) -> str:
    """The line of the rates a --point ran at (forced, or the matched rate set's: ddbench.core.rates)."""
    from ddbench.kernels.engine.options import point_rates
    from ddbench.kernels.engine.paper import Label
    return point_rates(model, Label.parse(design).design, ctx, cfg.workload.cache_tokens, a, note=True)[2]


def run_one(opts: SweepOptions) -> int:
    a = check_args(opts)
    model = a.model_spec
    d, c, b = parse_point(a.point)
    cfg = check_point(model, d, c, b, a)        # before touching the GPU: bad input exits 2 anywhere
    _need_cuda()
    from ddbench.kernels.engine.model import Weights
    mem = gpu_memory(a)
    flat = None if a.no_transfers else pt.alloc_host(a.host_gib)[0]
    hbm = pt.hbm_gbps()
    apply_cap(mem)
    weights = Weights.random(model, "cuda", seed=0)
    setup = pt.PointSetup(model, weights, flat, hbm, mem["limit"], mem["mem_gpu"], mem["overhead"])
    row = pt.run_point(setup, d, c, b, pt.PointTiming(cfg.miss_rate, not a.no_transfers,
                                                      graph=pt.design_spec(d).gather != "cpu", reps=a.replays),
                       cfg=cfg)
    row["rates_note"] = pt_rates_note(model, d, c, cfg, a)      # the rate set this row ran at
    print(json.dumps(row))
    return 0


# ------------------------------------------------------------------ a sweep

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


def run(opts: SweepOptions) -> int:
    from ddbench.kernels.timing import provenance
    phases = ph.parse_phases(opts.phases)       # before touching the GPU: bad input exits 2 anywhere
    a = check_args(opts, phases)
    _need_cuda()
    t_start = time.perf_counter()
    from ddbench.core.provenance import command_line
    prov = provenance(command_line(COMMAND))    # local paths cut
    prov["source_hash"] = source_hash()         # the code that ran, where the device's .git is stale
    model = a.model_spec
    mem = gpu_memory(a)
    out = os.path.join(a.out or str(traces_dir("engine")),
                       ph.out_folder(catalog_gpu_name(prov["gpu"], torch.cuda.get_device_properties(0).total_memory),
                                     phases, a.folder, model.name))
    from ddbench.core.outputs import output_folder
    # written in place as points finish (--resume picks up): every file is one of the guard's live files,
    # refused up front where it exists and ddbench did not write it; an earlier sweep is replaced only
    # with --force or resumed with --resume
    with output_folder(out, command=COMMAND, shared=True, own_ok=a.resume, force=a.force) as w:
        for name in OUT_FILES:
            w.live(name)             # an earlier sweep's file: refused unless --resume (own_ok) or --force
        return _sweep(a, phases, prov, model, out, t_start, mem)


def _start_up(a, prov, model, mem):
    """The run's own rates (pinned copy, HBM copy, the thin gather) and the pinned host KV buffer."""
    print(f"[engine] {prov['gpu']}  torch {prov['torch']}  triton {prov['triton']}  sha {prov['git_sha']}"
          f"  source {prov.get('source_hash')}  model"
          f" {model.name}  cap {a.cap_label} (torch may allocate {mem['limit'] / GIB:.1f} GiB; outside it"
          f" {mem['overhead'] / GIB:.2f} GiB)", flush=True)
    cg = pt.copy_gbps()
    hbm = pt.hbm_gbps()
    flat, t_pin, t_fill = pt.alloc_host(a.host_gib, a.seed)
    print(f"[engine] pinned {a.host_gib} GiB in {t_pin:.1f} s; H2D copy {cg:.1f} GB/s; HBM copy {hbm:.0f} GB/s",
          flush=True)
    hv, _ = pt.host_view(flat, model, 32768, 16)
    gg = pt.gather_gbps(hv)
    print(f"[engine] thin gather (32 blocks) alone: {gg:.1f} GB/s", flush=True)
    rates = dict(copy_h2d_gbps=cg, hbm_copy_gbps=hbm, thin_gather_gbps=gg, pin_s=t_pin, fill_s=t_fill)
    return flat, rates


# What this engine runs, recorded with every run (meta.json's engine) so that its rows are replayed with this
# engine's terms whatever changes later (sim/fit/replay.py engine_version; older runs: traces/fit/engine-versions.json)
ENGINE_VERSION = {"shadowkv_step": "in-place", "cache_fill": "fused"}


def _meta(a, phases, prov, model, out, mem, rates):
    """meta.json's content: the run's identity (a resumed run keeps its run_id), rates and memory."""
    prev = {}
    if a.resume and os.path.exists(os.path.join(out, "meta.json")):   # a resumed run keeps its identity
        with open(os.path.join(out, "meta.json"), encoding="utf-8") as fh:
            prev = json.load(fh)
    import uuid
    return dict(provenance=prov, source_hash=prov.get("source_hash") or source_hash(), engine=ENGINE_VERSION,
                run_id=prev.get("run_id") or uuid.uuid4().hex, phases=list(phases), seed=a.seed,
                copy_h2d_gbps=rates["copy_h2d_gbps"], hbm_copy_gbps=rates["hbm_copy_gbps"],
                thin_gather_gbps=rates["thin_gather_gbps"], host_gib=a.host_gib,
                pin_s=rates["pin_s"], fill_s=rates["fill_s"], model=model.name,
                models=sorted(set(prev.get("models", [])) | {model.name} | {m.name for m in a.cap_models}),
                gpu_mem_cap=a.cap_label,
                gpu_mem_cap_bytes=a.cap, torch_limit_bytes=mem["limit"], runtime_overhead_bytes=mem["overhead"],
                gpu_total_bytes=mem["total"],
                host_kv=("one pinned buffer of host_gib; a point needing more reads aliased layers (l % host_layers),"
                         " then aliased requests (overlapping windows): row host_alias; every chunk still crosses"
                         " the link, only the values repeat"))


def _sweep(a, phases, prov, model, out, t_start, mem):
    from ddbench.core.io import write_json
    from ddbench.kernels.engine.model import Weights
    flat, rates = _start_up(a, prov, model, mem)
    hbm = rates["hbm_copy_gbps"]
    apply_cap(mem)
    # the reuse-fetch record builds no engine step: no weights for a run of that phase alone
    # (the paper phase allocates each of its models' weights itself)
    weights = Weights.random(model, "cuda", seed=a.seed) if set(phases) - {ph.REUSE, ph.PAPER} else None
    torch.cuda.synchronize()
    meta = _meta(a, phases, prov, model, out, mem, rates)
    write_json(os.path.join(out, "meta.json"), meta)
    journal = ph.Journal(out, meta["source_hash"], rates["copy_h2d_gbps"])
    journal.load(a.resume, a.paper_miss)
    gpu_state = dict(poisoned=None)           # set where a failed point left the GPU state unusable
    completed = False
    try:
        ph.run_points(a, phases, model, weights, flat, hbm, mem, journal, t_start, gpu_state)
        if ph.PAPER in phases:
            box, weights = [weights], None    # the paper phase holds the only reference (it swaps models)
            weights = ph.run_paper_points(a, model, box, flat, hbm, mem, journal, t_start, gpu_state)
        completed = True
    finally:
        _write_files(out, journal, meta, t_start, gpu_state, completed)
    if a.profile and "mechanism" in phases and not gpu_state["poisoned"]:
        profile_one(model, weights or Weights.random(model, "cuda", seed=a.seed), flat, out, hbm)
    print(f"[engine] wrote {out} ({len(journal.rows)} points) in {time.perf_counter() - t_start:.0f} s"
          + (f"; the GPU state became unusable after {gpu_state['poisoned']}" if gpu_state["poisoned"] else ""),
          flush=True)
    return 0


def _write_files(out, journal, meta, t_start, gpu_state, completed):
    """engine.csv and summary.json whatever happened (a crash of the sweep itself included); a process
    killed outright leaves rows.jsonl for `rebuild` and current.json for --resume."""
    if completed:
        journal.finish()
    summary = dict(schema=results.SCHEMA, **meta, wall_s=time.perf_counter() - t_start,
                   gpu_state=gpu_state["poisoned"] or "ok", completed=completed)
    try:
        results.write(out, journal.rows, summary)
    except Exception:  # noqa: BLE001 - do not hide the exception that ended the sweep
        if completed:
            raise
        import traceback
        print("[engine] writing engine.csv / summary.json failed:\n" + traceback.format_exc(limit=4), flush=True)


def profile_one(model, weights, flat, out, hbm):
    """Kernel timeline of one graph replay (two steps) at PROFILE_POINT: timeline.json, per stream."""
    from ddbench.kernels.timing import kernel_events
    d, c, B, m = PROFILE_POINT
    row, e = pt.run_point(pt.PointSetup(model, weights, flat, hbm), d, c, B, pt.PointTiming(m, reps=3), keep=True)
    ev = kernel_events(e.replay)
    t0 = min(x["ts"] for x in ev) if ev else 0
    streams = {}
    for x in ev:
        streams.setdefault(x["stream"], []).append([x["name"][:60], round(x["ts"] - t0, 2), round(x["dur"], 2)])
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
