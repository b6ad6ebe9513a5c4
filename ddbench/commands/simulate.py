"""`ddbench simulate`: replay a design on a model, GPU and link with the calibrated simulator.

Serving mode (default): Poisson arrivals, continuous batching with admission by GPU memory,
chunked prefill (TTFT) and per-step decode on the calibrated cost model. Writes
requests.csv (TTFT, TPOT, completion per request), steps.csv, memory.csv and summary.json
into --out, and with --trace a Chrome/Perfetto trace.json.

Timeline mode (--batch N): a per-layer timeline of N requests for --steps batch steps:
overlap, stalls, link use, buffer occupancy; writes steps.csv, layers.csv, summary.json.

The cost model uses the GPU's calibration bundle in traces/calibration/, else a measured
bundle scaled by the catalog's HBM and FLOP ratios, else a roofline; every output says which.

Hit and reuse rates come from an accuracy profile (the model's traces/accuracy/<model>.csv, or
--hit-rate PATH), else a constant. --profile-init/-temperature/-budget/-context/-task pick the
profile's rows (sim/profile.py; the choice is written into the output's note).
--lowrank-layers profile takes an adaptive design's low-rank key layers from the profile's summary
JSON (§5.3's rule, sim.profile.lowrank_from_summary) and sets the count to match.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import time

from ddbench.core.catalog import get_gpu, get_link, get_model
from ddbench.core.errors import DDBenchError
from ddbench.core.io import dumps_json, run_folder, write_json, write_text
from ddbench.core.systems import resolve_systems
from ddbench.core.units import GB, parse_tokens
from ddbench.core.workload import add_workload_args, workload_from_args

EXAMPLE = """examples:
  ddbench simulate --model qwen2.5-32b --gpu h200 --system dualdecoder --context 128k --rate 0.05 --requests 200
  ddbench simulate --model llama-3-8b --gpu h100-80gb --link pcie5 --system all --context uniform:64k:128k \\
      --output exp:256 --rate 0.2 --requests 500 --seed 7 --out sim-out --force --trace
  ddbench simulate --model llama-3-8b --gpu h200 --system dualdecoder --context 128k --batch 32 --steps 20 --trace

exit status: 0 when the run is written (a design that does not fit says so in its line and in
summary.json's "status"), 2 for bad input, 3 when no design fits at all (the folder is still written)."""

NO_FIT = 3


def register(sub) -> None:
    p = sub.add_parser("simulate", help="serving or per-layer timeline simulation of a design",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="catalog name or path to a config.json")
    p.add_argument("--gpu", required=True, help="catalog GPU name")
    p.add_argument("--link", help="host link (default: the GPU's usual link)")
    p.add_argument("--system", default="dualdecoder", help="design, comma list, 'all' or 'every'")
    p.add_argument("--context", default="128k", help="prompt tokens: 128k, uniform:64k:128k or exp:MEAN")
    p.add_argument("--output", default="256", help="output tokens per request: 256, uniform:LO:HI or exp:MEAN")
    p.add_argument("--rate", type=float, default=0.05, help="Poisson arrival rate, requests/s (default 0.05)")
    p.add_argument("--requests", type=int, default=100, help="number of requests (default 100)")
    p.add_argument("--seed", type=int, default=0, help="random seed for arrivals and drawn lengths (default 0)")
    p.add_argument("--batch", type=int, help="timeline mode: simulate this batch per layer instead of serving")
    p.add_argument("--steps", type=int, default=12, help="timeline mode: batch steps (default 12; 2 warm-up)")
    p.add_argument("--max-batch", type=int, help="serving: cap on concurrent requests (default: memory only)")
    p.add_argument("--hit-rate", help="prediction hit rate: a number, or an accuracy CSV (default: the model's"
                                      " traces/accuracy/<model>.csv, else 0.88)")
    p.add_argument("--prefill-elsewhere", action="store_true",
                   help="serving: prefill runs on other GPUs (disaggregated); requests join decoding on admission")
    p.add_argument("--calibration", help="bundle root (default: the data root's calibration/)")
    p.add_argument("--roofline", action="store_true", help="ignore calibration bundles; pure roofline")
    p.add_argument("--out", default="sim-out", help="output folder (default sim-out); written whole or not at all")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--trace", action="store_true", help="also write a Chrome/Perfetto trace.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    g = p.add_argument_group("accuracy profile rows (only with a profile; default: T2 start, temperature 0.6,"
                             " the smallest budget measured, every context and task averaged)")
    g.add_argument("--profile-init", metavar="INIT", help="first speculative token: t2, random, or all")
    g.add_argument("--profile-temperature", metavar="T", help="output sampling temperature, or all")
    g.add_argument("--profile-budget", metavar="N", help="budget_tokens: smallest, all, or tokens (1024, 2k)")
    g.add_argument("--profile-context", metavar="N", help="context_tokens (4k), or all")
    g.add_argument("--profile-task", metavar="TASK", help="task name, or all")
    add_workload_args(p, exclude=("context", "batch"), group_title="workload (the memory model's knobs;"
                      " --lowrank-layers profile: the profile summary's low-rank key layers)",
                      words={"lowrank_layers": ("profile",)})
    p.set_defaults(func=run)


PROFILE_FLAGS = ("init", "temperature", "budget", "context", "task")


def _profile_select(args):
    """The profile row choice the --profile-* flags ask for (sim.profile.Select), and whether any was given."""
    from sim.profile import SMALLEST, Select

    given = {k: getattr(args, f"profile_{k}") for k in PROFILE_FLAGS if getattr(args, f"profile_{k}") is not None}
    for k, v in given.items():
        if not v.strip():
            raise DDBenchError(f"--profile-{k} is empty; give a value or 'all'")
    kw = {}
    if "init" in given:
        kw["init"] = None if given["init"] == "all" else given["init"]
    if "temperature" in given:
        v = given["temperature"]
        if v == "all":
            kw["temperature"] = None
        else:
            try:
                t = float(v)
            except ValueError:
                raise DDBenchError(f"--profile-temperature must be a number or 'all', got {v!r}") from None
            if not (math.isfinite(t) and t >= 0):
                raise DDBenchError(f"--profile-temperature must be finite and at least 0, got {v!r}")
            kw["temperature"] = t
    if "budget" in given:
        v = given["budget"]
        kw["budget"] = SMALLEST if v == "smallest" else None if v == "all" else parse_tokens(v, "--profile-budget")
    if "context" in given:
        v = given["context"]
        kw["context"] = None if v == "all" else parse_tokens(v, "--profile-context")
    if "task" in given:
        kw["task"] = None if given["task"] == "all" else given["task"]
    return Select(**kw), sorted(given)


def _profile_path(args, model) -> str | None:
    """The accuracy profile the hit rates come from: --hit-rate PATH, else the model's own if present."""
    from sim import profile
    if args.hit_rate is None:
        path = profile.default_path(model.name)
        return path if os.path.exists(path) else None
    try:
        float(args.hit_rate)
    except ValueError:
        return args.hit_rate
    return None


def _csv(rows: list[dict], notes: list[str]) -> str:
    import pandas as pd

    buf = io.StringIO()
    for n in notes:
        buf.write(f"# cost model: {n}\n")
    if rows:
        pd.DataFrame(rows).to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def _progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr (only where stderr is a terminal), or None."""
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="req", leave=False, disable=None, file=sys.stderr)


def _check(args) -> None:
    """Reject bad numbers before any work: one line each."""
    if args.batch is not None and args.batch < 1:
        raise DDBenchError(f"--batch must be at least 1, got {args.batch}")
    if args.steps < 1:
        raise DDBenchError(f"--steps must be at least 1, got {args.steps}")
    if args.requests < 1:
        raise DDBenchError(f"--requests must be at least 1, got {args.requests}")
    if not (args.rate > 0 and math.isfinite(args.rate)):
        raise DDBenchError(f"--rate must be positive and finite (requests/s), got {args.rate}")
    if args.max_batch is not None and args.max_batch < 1:
        raise DDBenchError(f"--max-batch must be at least 1, got {args.max_batch}")


def run(args) -> int:
    from sim import profile
    from sim.setup import cost_model

    _check(args)
    model, gpu = get_model(args.model), get_gpu(args.gpu)
    link = get_link(args.link or gpu.default_link)
    systems = resolve_systems(args.system)
    if not systems:
        raise DDBenchError(f"--system {args.system!r} names no design")
    sel, given = _profile_select(args)
    prof_path = _profile_path(args, model)
    if given and prof_path is None:
        raise DDBenchError(f"--profile-{given[0]} picks rows of an accuracy profile, but the hit rate here is a"
                           f" constant (no traces/accuracy/{model.name}.csv, or --hit-rate NUMBER); name a profile"
                           f" with --hit-rate PATH")
    hit, reuse, hit_note = profile.resolve(args.hit_rate, model.name, model.num_layers, sel=sel)
    lowrank, lowrank_note = None, None
    if getattr(args, "workload_lowrank_layers", None) == "profile":
        if prof_path is None:
            raise DDBenchError(f"--lowrank-layers profile needs an accuracy profile, but the hit rate here is a"
                               f" constant (no traces/accuracy/{model.name}.csv, or --hit-rate NUMBER); name one"
                               f" with --hit-rate PATH")
        lowrank, lowrank_note = profile.lowrank_from_summary(prof_path, model.num_layers, model.name,
                                                             explicit=args.hit_rate is not None)
        args.workload_lowrank_layers = len(lowrank)
    base_ctx = 131072 if ":" in args.context else parse_tokens(args.context)
    w = workload_from_args(args, model, context=base_ctx)
    cm = cost_model(model.name if os.sep not in args.model else args.model, gpu.name, link.name,
                    args.calibration, args.roofline)
    multi = len(systems) > 1
    summaries = {}
    with run_folder(args.out, args.force) as folder:
        bar = None
        if multi:
            from tqdm import tqdm
            bar = tqdm(systems, desc="designs", unit="design", leave=False, disable=None, file=sys.stderr)
        for sysx in (bar if bar is not None else systems):
            out = os.path.join(folder, sysx.name) if multi else folder
            t0 = time.perf_counter()
            if args.batch is not None:
                summary = _timeline(args, sysx, model, gpu, link, cm, w, hit, reuse, out, lowrank)
            else:
                summary = _serving(args, sysx, model, gpu, link, cm, w, hit, reuse, out, lowrank)
            summary["wall_s"] = time.perf_counter() - t0
            summary["hit_rates"] = hit_note
            if lowrank is not None:
                summary["lowrank_layers"] = {"layers": sorted(lowrank), "note": lowrank_note}
            summary["cost_model"] = list(cm.notes)
            write_json(os.path.join(out, "summary.json"), summary)
            summaries[sysx.name] = summary
        if bar is not None:
            bar.close()
    if args.json:
        print(dumps_json(summaries))
    else:
        for name, s in summaries.items():
            print(_render(name, s))
        print("cost model: " + "; ".join(cm.notes))
        print(f"hit rates: {hit_note}")
        if lowrank_note:
            print(lowrank_note)
        print(f"wrote {args.out}")
    return 0 if any(s["status"] == "ok" for s in summaries.values()) else NO_FIT


def _num(x, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _render(name: str, s: dict) -> str:
    if s["mode"] == "timeline":
        if s["status"] != "ok":
            return f"{name}: {s['reason']}; no throughput reported"
        return (f"{name}: batch {s['batch']} step {s['step_ms']:.2f} ms, {s['tokens_per_s']:.1f} tokens/s,"
                f" stall {s['stall_ms_per_step']:.2f} ms/step, link {100 * s['link_utilisation']:.0f}%,"
                f" buffers peak {s['peak_buffer_bytes'] / GB:.2f} GB")
    if s["status"] != "ok":
        return (f"{name}: NOTHING FITS: {s['rejected']}/{s['requests']} requests rejected"
                f" (a single request needs more than the {s['capacity_bytes'] / GB:.1f} GB of GPU memory);"
                f" no throughput reported")
    return (f"{name}: {s['completed']}/{s['requests']} done ({s['rejected']} rejected),"
            f" {_num(s['tokens_per_s'], '.2f')} tokens/s,"
            f" completion P50 {_num(s['completion_p50_s'], '.1f')} s P99 {_num(s['completion_p99_s'], '.1f')} s,"
            f" TTFT P50 {_num(s['ttft_p50_s'], '.2f')} s,"
            f" TPOT P50 {_num(None if s['tpot_p50_s'] is None else 1e3 * s['tpot_p50_s'], '.1f')} ms,"
            f" mean batch {s['mean_batch']:.1f}, link {100 * s['link_utilisation']:.0f}%,"
            f" peak memory {s['peak_memory_bytes'] / GB:.1f} of {s['capacity_bytes'] / GB:.1f} GB")


def _serving(args, sysx, model, gpu, link, cm, w, hit, reuse, out, lowrank=None) -> dict:
    from sim.serving import draw_requests, run_serving
    from sim.trace import counter_events, trace_json

    reqs = draw_requests(args.requests, args.rate, args.context, args.output, args.seed)
    bar = _progress(len(reqs), sysx.name, len(reqs) >= 200)
    try:
        res = run_serving(sysx, model, gpu, cm, w, reqs, hit, reuse, args.max_batch,
                          prefill_here=not args.prefill_elsewhere, progress=bar.update if bar else None,
                          lowrank=lowrank)
    finally:
        if bar is not None:
            bar.close()
    rows = [{"id": r.rid, "arrival_s": r.arrival, "context": r.context, "output_tokens": r.output,
             "rejected": int(r.rejected), "admitted_s": r.admitted, "ttft_s": r.ttft, "tpot_s": r.tpot,
             "completion_s": r.latency, "finished_at_s": r.completion} for r in res.requests]
    write_text(os.path.join(out, "requests.csv"), _csv(rows, cm.notes))
    write_text(os.path.join(out, "steps.csv"), _csv(res.segments, cm.notes))
    write_text(os.path.join(out, "memory.csv"), _csv(res.memory, cm.notes))
    summary = {"mode": "serving", "system": sysx.name, "model": model.name, "gpu": gpu.name, "link": link.name,
               "rate": args.rate, "seed": args.seed, "context": args.context, "output": args.output,
               "prefill": "elsewhere" if args.prefill_elsewhere else "this GPU",
               **res.summary(), "peak_memory_by_category": res.peak_by_category}
    if args.trace:
        events = []
        notes = ["pid 2: serving counters"]
        if summary["status"] == "ok":
            from sim.plan import step_plan
            from sim.timeline import run_timeline
            from sim.trace import timeline_events
            b = max(1, round(summary["mean_batch"]))
            ctx = sum(r.context for r in reqs) / len(reqs)
            tl = run_timeline(step_plan(sysx, model, cm, w, b, ctx, hit, reuse, lowrank), steps=3, warmup=0,
                              record=True)
            events = timeline_events(tl.events, pid=1)
            notes = [f"pid 1: per-layer timeline of 3 batch steps at the run's mean batch {b}; pid 2: serving counters"]
        events += counter_events(res.segments, "start_s", ["batch"], "batch", pid=2)
        events += counter_events(res.memory, "time_s", ["total"], "memory GB", pid=2, scale=1e-9)
        write_json(os.path.join(out, "trace.json"), trace_json(events, cm.notes + notes))
    return summary


def _timeline(args, sysx, model, gpu, link, cm, w, hit, reuse, out, lowrank=None) -> dict:
    from dataclasses import replace

    from ddbench.core.memory import memory_breakdown
    from sim.aggregate import aggregate_step
    from sim.plan import step_plan
    from sim.timeline import run_timeline
    from sim.trace import timeline_events, trace_json

    ctx = parse_tokens(args.context)
    bd = memory_breakdown(sysx, model, gpu, replace(w, context=ctx, batch=args.batch))
    head = {"mode": "timeline", "system": sysx.name, "model": model.name, "gpu": gpu.name, "link": link.name,
            "batch": args.batch, "context": ctx, "steps": args.steps, "memory_bytes": bd.as_dict(), "fits": bd.fits}
    if not bd.fits:
        reason = (f"batch {args.batch} does not fit: it needs {bd.total / GB:.1f} GB of the GPU's"
                  f" {bd.capacity / GB:.1f} GB")
        os.makedirs(out, exist_ok=True)
        return {**head, "status": "does-not-fit", "reason": reason, "step_ms": None, "tokens_per_s": None,
                "reasons": {"step_ms": reason, "tokens_per_s": reason}}
    plan = step_plan(sysx, model, cm, w, args.batch, ctx, hit, reuse, lowrank)
    tl = run_timeline(plan, steps=args.steps, warmup=min(2, args.steps - 1), record=args.trace)
    agg = aggregate_step(plan)
    steps = [{"step": i, "step_s": s, "stall_s": st} for i, (s, st) in enumerate(zip(tl.step_s, tl.stall_s))]
    layers = [{"layer": i, "pre_s": plan.pre[i], "rebuild_s": plan.mid[i], "attention_s": plan.att[i],
               "post_s": plan.post[i], "prefetch_bytes": plan.pf_bytes[i], "urgent_bytes": plan.ur_bytes[i],
               "stall_s_per_step": tl.layer_stall_s[i] / max(1, len(tl.step_s) - tl.warmup),
               "hit_rate": hit[i], "lowrank_keys": int(i in plan.lowrank)} for i in range(plan.layers)]
    write_text(os.path.join(out, "steps.csv"), _csv(steps, cm.notes))
    write_text(os.path.join(out, "layers.csv"), _csv(layers, cm.notes))
    if args.trace:
        write_json(os.path.join(out, "trace.json"), trace_json(timeline_events(tl.events), cm.notes))
    step = tl.steady_step_s
    return {**head, "status": "ok", "step_ms": step * 1e3,
            "tokens_per_s": args.batch / step, "aggregate_step_ms": agg.step_s * 1e3,
            "stall_ms_per_step": sum(tl.stall_s[tl.warmup:]) / max(1, len(tl.stall_s) - tl.warmup) * 1e3,
            "link_utilisation": tl.link_util, "h2d_bytes_per_step": plan.h2d_bytes,
            "peak_buffer_bytes": tl.peak_buffer_bytes, "reserved_buffer_bytes": tl.reserved_buffer_bytes}
