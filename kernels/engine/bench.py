"""Engine measurement sweep on the local CUDA GPU: Llama-3-8B shapes, every design, contexts 32K-128K.

    python -m kernels.engine.bench [--quick] [--host-gib 56] [--budget-s 230] [--out traces/engine]

Writes <out>/<gpu>/engine.csv (one row per point), layers.csv (per-layer record of each point's
last step) and summary.json (the ratios, all from this run, with provenance). Every time is a
median over steps timed with CUDA events after warm-up; next to it stands its floor
(link bytes / copy bandwidth measured in this run).

Host KV: one pinned buffer of --host-gib GiB holds [host_layers, B, H, N, 2, C, d]; logical layer
l reads physical layer l % host_layers (all 32 when they fit). Every layer's chunks still cross
the link, so link bytes and time are those of 32 distinct layers; only the bytes' values repeat.
"""

from __future__ import annotations

import argparse
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
from ddbench.core.paths import traces_dir
from ddbench.core.memory import Workload, max_batch
from ddbench.core.systems import SYSTEMS

GIB = 1 << 30
COLUMNS = ["design", "context", "batch", "miss_rate", "transfers", "urgent_programs", "host_layers", "status",
           "step_ms", "step_ms_min", "step_ms_max", "tok_s", "peak_gib", "prefetch_mib", "urgent_mib", "link_mib",
           "link_gbps", "link_util", "floor_link_ms", "exposed_ms", "exposed_share", "compute_ms",
           "model_max_batch", "steps"]


def copy_gbps(nbytes=GIB, reps=5):
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ts = []
    for _ in range(reps + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    del src, dst
    return nbytes / (statistics.median(ts[1:]) * 1e-3) / 1e9


def gather_gbps(host, programs=32, reps=5):
    """The persistent UVA gather alone on this host buffer (one layer, every chunk of a 256-chunk budget)."""
    from kernels.gather import gather_uva
    L, B, H, N, _, C, d = host.shape
    k = min(256, N)
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = torch.rand(B, H, N, device="cuda", generator=g).argsort(-1)[..., :k].sort(-1).values.int()
    kb = torch.empty(B, H, k * C, d, device="cuda", dtype=host.dtype)
    vb = torch.empty_like(kb)
    ts = []
    for _ in range(reps + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        gather_uva(host, 0, idx, kb, vb, programs=programs)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return idx.numel() * 2 * C * d * host.element_size() / (statistics.median(ts[1:]) * 1e-3) / 1e9


def alloc_host(gib):
    t0 = time.perf_counter()
    n = int(gib * GIB) // 2
    flat = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    t1 = time.perf_counter()
    g = torch.Generator(device="cuda").manual_seed(2)
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


def run_point(model, weights, flat, design, ctx, batch, *, miss_rate=0.174, transfers=True, steps=3,
              urgent_programs=64, log=print, record_layers=None):
    from kernels.engine.engine import Engine, EngineConfig
    sys_ = SYSTEMS[design]
    row = dict(design=design, context=ctx, batch=batch, miss_rate="none" if miss_rate is None else miss_rate,
               transfers=int(transfers), urgent_programs=urgent_programs, host_layers=0, status="ok", steps=steps,
               model_max_batch=max_batch(sys_, model, get_gpu("h200"), Workload(context=ctx)))
    host = None
    if not sys_.kv_on_gpu and transfers:
        host = host_view(flat, model, ctx, batch)
        if host is None:
            row["status"] = "host-limit"
            return row
        row["host_layers"] = host.shape[0]
    e = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    try:
        cfg = EngineConfig(context=ctx, batch=batch, miss_rate=miss_rate, transfers=transfers,
                           urgent_programs=urgent_programs, seed=0)
        e = Engine(model, sys_, cfg, weights, "cuda", host_kv=host, timing=False)
        e.step()                                  # pre-decoding step (prediction designs) or warm-up
        e.step()                                  # warm-up
        e.timing = True
        ends, kept = [], []
        e.step()
        ends.append(e.ev_step1)
        for _ in range(steps):                   # back to back: no host sync inside the timed steps
            e.step()
            ends.append(e.ev_step1)
            kept.append(e.stats)
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in zip(ends[:-1], ends[1:])]
        pfs, urs = zip(*(e.step_bytes(st) for st in kept))   # miss counts read after the timed steps
        layers = e.layer_records()
        peak = torch.cuda.max_memory_allocated()
    except torch.cuda.OutOfMemoryError:
        row["status"] = "oom"
    if row["status"] == "oom":
        e = None
        gc.collect()
        torch.cuda.empty_cache()
        return row
    step = statistics.median(times)
    pf, ur = statistics.median(pfs), statistics.median(urs)
    exposed = sum(r["exposed_ms"] for r in layers)
    row.update(step_ms=step, step_ms_min=min(times), step_ms_max=max(times), tok_s=batch / step * 1e3,
               peak_gib=peak / GIB, prefetch_mib=pf / 2**20, urgent_mib=ur / 2**20, link_mib=(pf + ur) / 2**20,
               link_gbps=(pf + ur) / (step * 1e-3) / 1e9, exposed_ms=exposed, exposed_share=exposed / step,
               compute_ms=sum(r["compute_ms"] for r in layers))
    if record_layers is not None:
        for r in layers:
            record_layers.append(dict(design=design, context=ctx, batch=batch, miss_rate=row["miss_rate"],
                                      transfers=int(transfers), urgent_programs=urgent_programs, **r))
    del e
    gc.collect()
    torch.cuda.empty_cache()
    log(f"  {design:24s} ctx={ctx:6d} B={batch:4d} miss={row['miss_rate']} xfer={int(transfers)} "
        f"step={step:8.2f} ms  tok/s={row['tok_s']:8.1f}  link={row['link_gbps']:5.1f} GB/s  "
        f"exposed={exposed:7.2f} ms  peak={row['peak_gib']:6.1f} GiB")
    return row


def plan_points(model, quick, host_gib):
    gpu = get_gpu("h200")
    mb = {(n, c): max_batch(SYSTEMS[n], model, gpu, Workload(context=c)) for n in SYSTEMS for c in (32768, 65536, 131072)}

    def host_cap(c):  # largest batch whose one host layer fits
        return int(host_gib * GIB) // (c * model.kv_bytes_per_token_layer)

    K = 131072
    pts = []
    if quick:
        return [("dualdecoder", 32768, 4, 0.174, True, 64), ("dualdecoder", 32768, 4, 0.174, False, 64),
                ("dualdecoder-fifo", 32768, 4, 0.33, True, 64), ("dualdecoder", 32768, 4, 0.33, True, 64),
                ("shadowkv", 32768, 4, 0.174, True, 64), ("full-kv", 32768, 4, None, True, 64),
                ("specache", 32768, 2, 0.174, True, 64), ("dualdecoder-cpu-gather", 32768, 2, 0.33, True, 64)]
    # Fig 18: priority vs FIFO at 33% misses (and the urgent gather's width), plus compute-only
    for B in (4, 16):
        for d in ("dualdecoder", "dualdecoder-fifo"):
            pts.append((d, K, B, 0.33, True, 64))
        pts.append(("dualdecoder", K, B, 0.33, False, 64))
    pts.append(("dualdecoder", K, 16, 0.33, True, 32))
    # ablations at 128K, batch 16
    for d in ("dualdecoder-per-layer", "dualdecoder-two-pass", "dualdecoder-cpu-gather"):
        pts.append((d, K, 16, 0.33, True, 64))
    pts.append(("dualdecoder-two-pass", K, 16, 0.33, False, 64))
    # main designs across contexts, batches up to each design's max (or the host's)
    for c in (131072, 65536, 32768):
        for n in ("dualdecoder", "shadowkv", "full-kv", "specache"):
            top = mb[(n, c)]
            if not SYSTEMS[n].kv_on_gpu:
                top = min(top, host_cap(c))
            bs = sorted({b for b in (1, 4, 16, 64) if b < top} | {top})
            if c != K:
                bs = sorted({b for b in (16,) if b < top} | {top})
            for B in bs:
                pts.append((n, c, B, None if SYSTEMS[n].kv_on_gpu else 0.174, True, 64))
                if n == "dualdecoder" and c == K and B in (1, 16, 64):
                    pts.append((n, c, B, 0.174, False, 64))
    pts.append(("dualdecoder", 32768, 16, None, True, 64))   # the model's own prediction (random weights)
    return pts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--host-gib", type=float, default=56.0)
    ap.add_argument("--budget-s", type=float, default=230.0, help="stop starting new points after this many seconds")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", help="output root (default: the data root's engine/)")
    ap.add_argument("--resume", action="store_true", help="skip points already in <out>/<gpu>/rows.jsonl")
    ap.add_argument("--profile", action="store_true", help="also write a torch.profiler trace of one step")
    a = ap.parse_args(argv)
    return run(a)


def _append(path, obj):
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(obj) + "\n")


def run(a):
    from kernels.engine.model import Weights
    from kernels.timing import provenance
    t_start = time.perf_counter()
    prov = provenance("python -m kernels.engine.bench " + " ".join(sys.argv[1:]))
    model = get_model("llama-3-8b")
    out = os.path.join(a.out or str(traces_dir("engine")),
                       catalog_gpu_name(prov["gpu"], torch.cuda.get_device_properties(0).total_memory))
    os.makedirs(out, exist_ok=True)
    print(f"[engine] {prov['gpu']}  torch {prov['torch']}  triton {prov['triton']}", flush=True)
    cg = copy_gbps()
    flat, t_pin, t_fill = alloc_host(a.host_gib)
    print(f"[engine] pinned {a.host_gib} GiB in {t_pin:.1f} s, filled in {t_fill:.1f} s; copy {cg:.1f} GB/s", flush=True)
    hv = host_view(flat, model, 32768, 16)
    gg = gather_gbps(hv)
    print(f"[engine] thin gather (32 blocks) alone: {gg:.1f} GB/s", flush=True)
    weights = Weights.random(model, "cuda", seed=0)
    torch.cuda.synchronize()
    from ddbench.core.io import write_json
    write_json(os.path.join(out, "meta.json"), dict(provenance=prov, copy_h2d_gbps=cg, thin_gather_gbps=gg,
                                                    host_gib=a.host_gib, pin_s=t_pin, fill_s=t_fill))
    rows, layers = [], []
    done = {}
    jl = os.path.join(out, "rows.jsonl")
    cur = os.path.join(out, "current.json")
    os.makedirs(out, exist_ok=True)
    if a.resume and os.path.exists(jl):
        with open(jl, encoding="utf-8") as fh:
            for line in fh:
                r = json.loads(line)
                done[r["key"]] = r
        if os.path.exists(cur):   # the point that was running when the last process died
            with open(cur, encoding="utf-8") as fh:
                k = json.load(fh)["key"]
            if k not in done:
                d0 = json.loads(k)
                done[k] = dict(key=k, row=dict(design=d0[0], context=d0[1], batch=d0[2], miss_rate=d0[3],
                                               transfers=int(d0[4]), urgent_programs=d0[5], status="crashed"), layers=[])
                _append(jl, done[k])
    pts = plan_points(model, a.quick, a.host_gib)
    for j, (d, c, B, m, x, up) in enumerate(pts):
        key = json.dumps([d, c, B, m, x, up])
        if key in done:
            rows.append(done[key]["row"])
            layers.extend(done[key]["layers"])
            continue
        if time.perf_counter() - t_start > a.budget_s:
            rows.append(dict(design=d, context=c, batch=B, miss_rate=m, transfers=int(x), urgent_programs=up,
                             status="skipped-time"))
            continue
        with open(cur, "w", encoding="utf-8") as fh:
            json.dump(dict(key=key), fh)
        b = B
        for _ in range(4):   # a batch that does not fit in this engine's real allocations: step down
            lay = []
            try:
                r = run_point(model, weights, flat, d, c, b, miss_rate=m, transfers=x,
                              steps=a.steps if b <= 64 else max(2, a.steps - 1),
                              urgent_programs=up, record_layers=lay, log=lambda t: print(t, flush=True))
            except Exception:  # noqa: BLE001 - reported in the row and the log, then the process goes on or dies
                import traceback
                print(f"  {d} ctx={c} B={b}: ERROR\n" + traceback.format_exc(limit=6), flush=True)
                r = dict(design=d, context=c, batch=b, miss_rate=m, transfers=int(x), urgent_programs=up, status="error")
                torch.cuda.synchronize()
            if r["status"] != "oom" or b <= 1:
                break
            print(f"  {d} ctx={c} B={b}: oom in this engine, stepping down", flush=True)
            rows.append(r)
            _append(jl, dict(key=key + f"#oom{b}", row=r, layers=[]))
            b = max(1, int(b * 0.8))
        if r["status"] not in ("ok", "oom"):
            print(f"  {d} ctx={c} B={b}: {r['status']}", flush=True)
        if r.get("step_ms"):
            r["floor_link_ms"] = r["link_mib"] * 2**20 / (cg * 1e9) * 1e3
            r["link_util"] = r["link_gbps"] / cg
        rows.append(r)
        layers.extend(lay)
        _append(jl, dict(key=key, row=r, layers=lay))
    summary = dict(schema=1, provenance=prov, copy_h2d_gbps=cg, thin_gather_gbps=gg, host_gib=a.host_gib,
                   pin_s=t_pin, fill_s=t_fill, wall_s=time.perf_counter() - t_start)
    write(out, rows, layers, summary)
    if a.profile:
        profile_one(model, weights, flat, out)
    print(f"[engine] wrote {out} ({len(rows)} points) in {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


def profile_one(model, weights, flat, out):
    from torch.profiler import ProfilerActivity, profile
    from kernels.engine.engine import Engine, EngineConfig
    host = host_view(flat, model, 32768, 4)
    e = Engine(model, SYSTEMS["dualdecoder"], EngineConfig(context=32768, batch=4, miss_rate=0.33), weights, "cuda", host_kv=host)
    e.step(); e.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        e.step()
        torch.cuda.synchronize()
    p.export_chrome_trace(os.path.join(out, "dualdecoder_step_trace.json"))


def write(out, rows, layers, summary):
    from ddbench.core.io import atomic_path, write_json
    prov = summary["provenance"]
    pcols = list(prov)
    os.makedirs(out, exist_ok=True)
    with atomic_path(os.path.join(out, "engine.csv")) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=["schema"] + COLUMNS + pcols, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({"schema": 1, **r, **prov})
    if layers:
        with atomic_path(os.path.join(out, "layers.csv")) as tmp:
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                w = csv.DictWriter(fh, fieldnames=list(layers[0]))
                w.writeheader()
                w.writerows(layers)
    summary["ratios"] = ratios(rows, summary["copy_h2d_gbps"])
    write_json(os.path.join(out, "summary.json"), summary)


def ratios(rows, cg):
    ok = [r for r in rows if r.get("status") == "ok" and r.get("step_ms")]

    def find(**kw):
        for r in ok:
            if all(r.get(k) == v for k, v in kw.items()):
                return r
        return None

    res = {}
    for B in (4, 16):
        p = find(design="dualdecoder", context=131072, batch=B, miss_rate=0.33, transfers=1, urgent_programs=64)
        f = find(design="dualdecoder-fifo", context=131072, batch=B, miss_rate=0.33, transfers=1)
        c = find(design="dualdecoder", context=131072, batch=B, miss_rate=0.33, transfers=0)
        if p and f:
            res[f"fig18_b{B}"] = dict(priority_step_ms=p["step_ms"], fifo_step_ms=f["step_ms"],
                                      priority_exposed_ms=p["exposed_ms"], fifo_exposed_ms=f["exposed_ms"],
                                      compute_only_step_ms=c["step_ms"] if c else None,
                                      fifo_over_priority=f["step_ms"] / p["step_ms"])
    bound = [r for r in ok if r["design"] == "dualdecoder" and r["transfers"] == 1 and r["batch"] >= 16]
    if bound:
        res["link_util_link_bound"] = {f"{r['context']}x{r['batch']}@{r['miss_rate']}": r["link_util"] for r in bound}
    share = {}
    for r in ok:
        if r["transfers"] == 1 and r["design"] == "dualdecoder":
            c = find(design="dualdecoder", context=r["context"], batch=r["batch"], miss_rate=r["miss_rate"], transfers=0)
            share[f"{r['context']}x{r['batch']}@{r['miss_rate']}"] = dict(
                exposed_share_events=r["exposed_share"],
                exposed_share_vs_compute_only=(r["step_ms"] - c["step_ms"]) / r["step_ms"] if c else None)
    res["exposed_transfer_share"] = share
    own = {}
    for c in (32768, 65536, 131072):
        best = {}
        for n in ("dualdecoder", "shadowkv", "full-kv", "specache"):
            cand = [r for r in ok if r["design"] == n and r["context"] == c and r["transfers"] == 1
                    and r["miss_rate"] in (0.174, None, "none")]
            if cand:
                top = max(cand, key=lambda r: r["batch"])
                best[n] = dict(batch=top["batch"], tok_s=top["tok_s"], step_ms=top["step_ms"], peak_gib=top["peak_gib"],
                               model_max_batch=top["model_max_batch"])
        if "dualdecoder" in best:
            for n in ("shadowkv", "full-kv", "specache"):
                if n in best:
                    best[f"dualdecoder_over_{n}"] = best["dualdecoder"]["tok_s"] / best[n]["tok_s"]
        own[str(c)] = best
    res["own_max_batch"] = own
    return res


def rebuild(folder):
    """Write engine.csv, layers.csv and summary.json from rows.jsonl + meta.json (a run cut short)."""
    with open(os.path.join(folder, "meta.json"), encoding="utf-8") as fh:
        meta = json.load(fh)
    rows, layers, seen = [], [], {}
    with open(os.path.join(folder, "rows.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            seen[r["key"]] = r
    for r in seen.values():
        rows.append(r["row"])
        layers.extend(r["layers"])
    meta["schema"] = 1
    write(folder, rows, layers, meta)
    return rows


if __name__ == "__main__":
    sys.exit(main())
