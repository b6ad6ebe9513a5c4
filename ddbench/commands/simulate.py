"""`ddbench simulate`: replay a design on a model, GPU and link with the calibrated simulator.

Serving mode (default): Poisson arrivals, continuous batching with admission by GPU memory
(and by host memory with --host or --host-mem: at most the requests whose pinned host KV fits at the
longest context drawn; summary.json's "host_memory" gives both bounds and which binds),
chunked prefill (TTFT) and per-step decode on the calibrated cost model. Writes
requests.csv (TTFT, TPOT, completion per request), steps.csv, memory.csv and summary.json
into --out, and with --trace a Chrome/Perfetto trace.json.

With --prefill elsewhere (disaggregated), prefill runs on other GPUs and a request joins decoding
when it is admitted. A design whose queue grows over the run (the completion-time slope against
arrival time above the planner's threshold, ddbench.planner.runs.queue_grows) is flagged: --rate is more
than it sustains, and its TTFT and completion grow with --requests.

Timeline mode (--batch N): a per-layer timeline of N requests for --steps batch steps:
overlap, stalls, link use, buffer occupancy; writes steps.csv, layers.csv, summary.json.
Batch sweep (--batch over several batches: 1,2,4,8, or 1:64 doubling, or 1:64:8 stepping; HI is
always included): the timeline at each batch, per design tokens/s and step time against batch, a batch
beyond a design's memory marked "does not fit", the best design at each batch and where two designs
cross over; writes sweep.csv (a row per design and batch) and summary.json, and with --plot FILE the
curves.

The cost model uses the GPU's calibration bundle in traces/calibration/, else a measured
bundle scaled by the catalog's HBM and FLOP ratios, else a roofline; every output says which
(summary.json, and --out's provenance.json with the command's arguments, version and git sha; the
CSVs are plain, one header line, for pandas.read_csv).

Hit and reuse rates come from an accuracy profile (the model's traces/accuracy/<model>.csv, or
--hit-rate PATH), else a constant. --profile-init/-temperature/-budget/-context/-task pick the
profile's rows (sim/hitrates.py; the choice is written into the output's note).
--lowrank-layers profile takes an adaptive design's low-rank key layers from the profile's summary
JSON (§5.3's rule, ddbench.sim.hitrates.lowrank_from_summary) and sets the count to match.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from dataclasses import replace

from ddbench.commands.config import add_config_arg
from ddbench.commands import cache_note, cost_model_line, index_note, wrap
from ddbench.commands.plan_tp import context_warning
from ddbench.commands.plan import plot_path, kv_note
from ddbench.core import defaults as D
from ddbench.core import flags
from ddbench.core.catalog import NOT_BOUNDED
from ddbench.core.finite import check_finite
from ddbench.core.io import dumps_json
from ddbench.core.outputs import output_folder
from ddbench.core.memory import CATEGORIES
from ddbench.core.provenance import provenance
from ddbench.core.units import GB, fmt_tokens
from ddbench.core.errors import DDBenchError
from ddbench.planner.batchsweep import parse_batches
from ddbench.planner.runs import STABLE_SLOPE, backlog_growth, queue_grows, weights_do_not_fit
from ddbench.planner.scenario import resolve
from ddbench.planner.scenario_args import (add_profile_row_args, add_rate_args, add_scenario_args, add_workload,
                                           profile_rows, scenarios_from_args, weights_overflow)
from ddbench.planner.scenario_args import fp8_note
from ddbench.progress import bar as progress_bar

EXAMPLE = """examples:
  ddbench simulate --model qwen2.5-32b --gpu h200 --design dualdecoder --context 128k --rate 0.01 --requests 200
  ddbench simulate --model llama-3-8b --gpu h100-80gb --link pcie5 --design all --context uniform:64k:128k \\
      --output exp:256 --rate 0.1 --requests 500 --seed 7 --out sim-out --force --trace
  ddbench simulate --model llama-3-8b --gpu h200 --design dualdecoder --context 128k --batch 32 --steps 20 --trace
  ddbench simulate --model qwen2.5-32b --gpu a100-80gb --design shadowkv,dualdecoder --context 64k --batch 1:16 \\
      --plot batch.png
  ddbench simulate --model llama-3-8b --gpu h100-80gb --design dualdecoder --context 128k --rate 0.3 \\
      --host paper-testbed --prefill elsewhere

exit status: 0 when the run is written (a design that does not fit says so in its line and in
summary.json's "status"), 2 for bad input, 3 when no design fits at all (the folder is still written)."""

NO_FIT = 3


def register(sub) -> None:
    p = sub.add_parser("simulate", help="serving or per-layer timeline simulation of a design",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(p, design=D.DESIGN, context_required=False, requests=D.SIM_REQUESTS)
    add_rate_args(p, arrivals=flags.number(lo=D.MIN_RATE, hi=D.MAX_RATE), default=D.RATE)
    p.add_argument("--seed", type=flags.integer(lo=0, hi=2 ** 63 - 1), default=D.SEED,
                   help=f"random seed for arrivals and drawn lengths (default {D.SEED})")
    p.add_argument("--batch", type=parse_batches, metavar="N|LIST",
                   help="timeline mode: simulate this batch per layer instead of serving; several batches (1,2,4,8;"
                        " LO:HI doubling, 1:64 = 1,2,4,...,64; LO:HI:STEP, 1:64:8 = 1,9,...,57,64) sweep the batch")
    p.add_argument("--steps", type=flags.integer(lo=1, hi=D.MAX_STEPS), default=D.STEPS,
                   help=f"timeline mode: batch steps (default {D.STEPS}; 2 warm-up)")
    p.add_argument("--host", type=flags.text(),
                   help="multi-GPU host (paper-testbed, hgx-h100, ..., or a YAML/JSON file): its GPUs share PCIe switches"
                        " and host DRAM,"
                        " and its host memory / its GPUs bounds the batch")
    p.add_argument("--fetching", type=flags.integer(lo=1, hi=D.MAX_COUNT),
                   help="GPUs of --host fetching at once (default: all of them)")
    p.add_argument("--host-mem", metavar="GB", type=flags.number(lo=0, lo_open=True, hi=D.MAX_HOST_MEM_GB),
                   help="host memory for this GPU's requests, GB (1e9 bytes): admission stops where their pinned"
                        " host KV would not fit (default: --host's memory / its GPUs; without --host, not a bound)")
    p.add_argument("--prefill", choices=("here", "elsewhere"),
                   help=f"serving: prefill on this GPU beside decode ({D.PREFILL}, the default) or on other GPUs"
                        " (disaggregated: a request joins decoding when it is admitted)")
    p.add_argument("--prefill-elsewhere", action="store_true", help=argparse.SUPPRESS)   # the older --prefill elsewhere
    p.add_argument("--plot", metavar="PNG", type=flags.checked(plot_path),
                   help="batch sweep: draw tokens/s and step time against batch into this file (.png, .pdf or .svg)")
    p.add_argument("--out", default="sim-out", type=flags.text(),
                   help="output folder (default sim-out); written whole or not at all")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier run in --out (and an earlier --plot file of ddbench's), or write beside"
                        " files ddbench did not write (kept)")
    p.add_argument("--trace", action="store_true", help="also write a Chrome/Perfetto trace.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--verbose", action="store_true", help="print the cost model's notes whole, lines unwrapped"
                                                         " (else a summary, wrapped at 120 characters)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_config_arg(p)
    add_profile_row_args(p)
    add_workload(p, words={"lowrank_layers": ("profile",)},
                 title="workload (the memory model's knobs; --lowrank-layers profile: the profile summary's"
                       " low-rank key layers)")
    p.set_defaults(func=run)


# ddbench.sim.serving's per-stretch rows, for a steps.csv without rows
STEP_COLUMNS = ("start_s", "steps", "batch", "step_s", "prefill_tokens", "link_util", "memory_bytes")


def _csv(rows: list[dict], columns=None) -> str:
    """Plain CSV: one header line, then the rows (the cost model's notes go to provenance.json)."""
    import pandas as pd

    buf = io.StringIO()
    if rows or columns:
        pd.DataFrame(rows, columns=list(columns) if not rows else None).to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def _prefill(args) -> str:
    """--prefill, or the older --prefill-elsewhere (a hidden alias), or the default."""
    if args.prefill_elsewhere and args.prefill == "here":
        raise DDBenchError("--prefill here and --prefill-elsewhere disagree: give one (--prefill elsewhere)")
    return args.prefill or ("elsewhere" if args.prefill_elsewhere else D.PREFILL)


def _check_modes(args) -> bool:
    """The flags that need a mode; True for a batch sweep (--batch over several batches)."""
    sweep = args.batch is not None and len(args.batch) > 1
    if args.plot is not None and not sweep:
        raise DDBenchError("--plot draws a batch sweep: give --batch several batches (e.g. --batch 1:64)")
    if sweep and args.trace:
        raise DDBenchError("--trace draws one batch's timeline: give --batch one batch, not a sweep")
    if args.plot is not None:
        out, plot = os.path.abspath(args.out), os.path.abspath(os.path.expanduser(args.plot))
        if os.path.commonpath([out, plot]) == out:
            raise DDBenchError(f"--plot {args.plot} lies inside --out {args.out}: name a file outside it"
                               " (the sweep's own table is in --out)")
    return sweep


def run(args) -> int:
    prefill = _prefill(args)
    sweep = _check_modes(args)
    tp_note = weights_overflow(args)
    scenarios = scenarios_from_args(args, D.SIM_REQUESTS, rows=profile_rows(args), host=args.host,
                                    fetching=args.fetching, host_mem_gb=args.host_mem, prefill=prefill)
    resolved = [resolve(sc).check().check_host() for sc in scenarios]
    ctx = args.context.tokens("context") if args.batch is not None else None   # the timeline needs one context
    if sweep:
        return _sweep(args, resolved, ctx)
    r0 = resolved[0]
    multi = len(resolved) > 1
    summaries = {}
    with output_folder(args.out, command="ddbench simulate", force=args.force) as w:
        bar = progress_bar(resolved, desc="designs", unit="design", leave=False, quiet=args.quiet) if multi else None
        for r in (bar if bar is not None else resolved):
            out = r.design.name if multi else ""          # the design's subfolder of --out
            t0 = time.perf_counter()
            if ctx is not None:
                summary = _timeline(args, r, ctx, args.batch[0], w, out)
            else:
                summary = _serving(args, r, w, out)
            _notes(summary, r, t0)
            w.write_json(os.path.join(out, "summary.json"), summary)
            summaries[r.design.name] = summary
        if bar is not None:
            bar.close()
        w.write_json("provenance.json",
                   provenance("simulate", args, cost_model=list(r0.cm.notes), hit_rates=r0.hit_note))
    if args.json:
        print(dumps_json(summaries))
    else:
        from ddbench.planner.ratelines import rates_doc, rates_lines
        lines = []
        for note in (kv_note(r0.workload.kv_bits), index_note(r0.workload.index), cache_note(summaries, r0.workload)):
            if note:
                lines.append(note.lstrip(", "))
        lines += [_render(name, s) for name, s in summaries.items()]
        lines += rates_lines(rates_doc(resolved))        # the rates each answer above ran at, and their source
        grows = [(name, s) for name, s in summaries.items() if s.get("queue_grows")]
        if grows:
            lines.append(_queue_warning(grows, args.rate))
        lines += [n for n in (tp_note, fp8_note(args)) if n] + context_warning(r0)
        print("\n".join(_shown(args, lines + _tail(args, r0, summaries, resolved))))
    return 0 if any(s["status"] == "ok" for s in summaries.values()) else NO_FIT


def _at_ends(args, r, centre: float) -> list[float] | None:
    """[worst, best] tokens/s of the same serving run priced at both ends of the design's rates' 95 % interval
    (ddbench.core.rates); None where its rates have no interval."""
    from ddbench.sim.serving import ServingOptions, draw_requests, run_serving
    dr = r.design_rates
    if dr is None or not any(x.has_interval for x in dr.rates):
        return None
    sc = r.scenario
    out = [centre]
    for end in ("low", "high"):
        e = resolve(replace(sc, rate_end=end))
        reqs = draw_requests(sc.requests, args.rate, sc.context, sc.output, args.seed)
        res = run_serving(e.design, e.model, e.gpu, e.cm, e.workload, reqs, e.hit, e.reuse, sc.prefill == "here",
                          ServingOptions(e.batch_cap, e.lowrank, e.cache_rates))
        out.append(res.summary().get("tokens_per_s") or 0.0)
    return [min(out), max(out)]


def _notes(summary: dict, r, t0: float) -> None:
    """The summary's wall time, hit-rate, low-rank and cost-model notes (checked finite)."""
    summary["wall_s"] = time.perf_counter() - t0
    summary["hit_rates"] = r.hit_note
    if r.lowrank is not None:
        summary["lowrank_layers"] = {"layers": sorted(r.lowrank), "note": r.lowrank_note}
    summary["cost_model"] = list(r.cm.notes)
    if r.tp > 1:
        from ddbench.commands.plan_tp import tp_view
        summary["tp"] = tp_view(r)
    from ddbench.planner.accuracy import accuracy_cost, assumed_hit_rate
    summary["accuracy"] = accuracy_cost(r)
    summary["assumed_hit_rate"] = assumed_hit_rate(r)
    check_finite(summary, f"simulate {r.design.name}")


def _tail(args, r0, summaries, resolved) -> list[str]:
    from ddbench.commands.plan_tp import tp_view
    from ddbench.planner.accuracy import accuracy_lines
    view = tp_view(r0)
    lines = [view["note"], view["allreduce"]] if r0.tp > 1 else []
    lines += [_render_host(summaries, r0), "\n".join(accuracy_lines(resolved)), cost_model_line(r0.cm.notes, args.verbose)]
    if r0.design_rates is None and not r0.design.kv_on_gpu:
        lines.append(f"hit rates: {r0.hit_note}")
    if r0.lowrank_note:
        lines.append(r0.lowrank_note)
    return lines + [f"wrote {args.out}" + (f", {args.plot}" if getattr(args, "plot", None) else "")]


def _shown(args, lines: list[str]) -> list[str]:
    """The default text wrapped at 120 characters (every word kept); --verbose as it is, each note whole."""
    return list(lines) if args.verbose else wrap(lines)


def _queue_warning(grows, rate: float) -> str:
    """One line for the designs whose queue grows over the run."""
    which = ", ".join(f"{name} ({s['backlog_growth']:.2f})" for name, s in grows)
    return (f"WARNING: the queue grows for {which}: completion time rises with arrival time (slope above"
            f" {STABLE_SLOPE}), so --rate {rate:g} is more than {'it sustains' if len(grows) == 1 else 'they sustain'}"
            " and TTFT and completion grow with --requests; `ddbench plan --slo ...` finds the highest sustainable"
            " rate")


SWEEP_COLUMNS = ("design", "batch", "max_batch", "status", "tokens_per_s", "step_ms", "stall_ms_per_step",
                 "link_utilisation", "h2d_bytes_per_step", "peak_buffer_bytes", "memory_gb", "reason")


def _sweep(args, resolved, ctx: int) -> int:
    """--batch over several batches: the timeline of every design at every batch, into sweep.csv and
    summary.json (ddbench.planner.batchsweep), and with --plot the curves."""
    from contextlib import ExitStack

    from ddbench.planner import batchsweep as B
    r0 = resolved[0]
    t0 = time.perf_counter()
    points = {}
    max_batch = {r.design.name: _host_block(r, ctx, None)["max_batch"] for r in resolved}
    # every design's own largest batch too, so that none is judged short of its capacity
    lo, hi = min(args.batch), max(args.batch)
    batches = tuple(sorted(set(args.batch) | {b for b in max_batch.values() if lo <= b <= hi}))
    bar = progress_bar(total=len(resolved) * len(batches), desc="batch sweep", unit="point", leave=False,
                       quiet=args.quiet)
    try:
        for r in resolved:
            pts = []
            for b in batches:
                pts.append(_timeline(args, r, ctx, b, None, ""))
                bar.update()
            points[r.design.name] = pts
    finally:
        bar.close()
    sweep = B.summarize(points, batches, max_batch)
    sweep["largest_batches_added"] = sorted(set(batches) - set(args.batch))
    sweep |= {"model": r0.model.name, "gpu": r0.gpu.name, "link": r0.link.name, "context": ctx,
              "steps": args.steps, "kv_bits": r0.workload.kv_bits,
              "cache_bits": r0.workload.cache_bits}
    _notes(sweep, r0, t0)
    from ddbench.planner.accuracy import accuracy_cost
    sweep["accuracy"] = {r.design.name: accuracy_cost(r) for r in resolved}
    rows = [{"design": name, "max_batch": d["max_batch"], **p} for name, d in sweep["designs"].items()
            for p in d["points"]]
    head = (f"batch sweep: {r0.model.name} on {r0.gpu.name} ({r0.gpu.hbm_bytes / GB:.1f} GB), {r0.link.name},"
            f" context {fmt_tokens(ctx)}, {args.steps} steps per batch ({min(2, args.steps - 1)} warm-up)"
            f"{kv_note(r0.workload.kv_bits)}{index_note(r0.workload.index)}{cache_note([r.design.name for r in resolved], r0.workload)}")
    from ddbench.planner.ratelines import rates_doc, rates_lines
    sweep["rates"] = rates_doc(resolved)
    head = "\n".join([head] + rates_lines(sweep["rates"]))
    with ExitStack() as stack:
        w = stack.enter_context(output_folder(args.out, command="ddbench simulate", force=args.force))
        if args.plot is not None:
            from ddbench.core.outputs import output_file
            staged = stack.enter_context(output_file(args.plot, command="ddbench simulate", flag="--plot",
                                                     force=args.force))
            B.plot(sweep, staged, head.splitlines()[0].removeprefix("batch sweep: "),
                   fmt=os.path.splitext(args.plot)[1].lstrip(".").lower())
        w.write_text("sweep.csv", _csv(rows, SWEEP_COLUMNS))
        w.write_json("summary.json", sweep)
        w.write_json("provenance.json",
                     provenance("simulate", args, cost_model=list(r0.cm.notes), hit_rates=r0.hit_note))
    if args.json:
        print(dumps_json(sweep))
    else:
        by_design = {name: {"host_memory": _host_block(r, ctx, None)} for name, r in
                     zip(sweep["designs"], resolved)}
        added = sweep["largest_batches_added"]
        lines = B.render(sweep, head) + ([f"batches {', '.join(map(str, added))} added: the designs' largest"
                                          " batches"] if added else []) + _tail(args, r0, by_design, resolved)
        print("\n".join(_shown(args, lines)))
    return 0 if any(p["status"] == "ok" for d in sweep["designs"].values() for p in d["points"]) else NO_FIT


def _num(x, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _interval(iv) -> str:
    return "" if not iv else f" [{iv[0]:.2f}, {iv[1]:.2f} at the rates' interval ends]"


def _render(name: str, s: dict) -> str:
    if s["mode"] == "timeline":
        if s["status"] != "ok":
            return f"{name}: {s['reason']}; no throughput reported"
        return (f"{name}: batch {s['batch']} step {s['step_ms']:.2f} ms, {s['tokens_per_s']:.1f} tokens/s,"
                f" stall {s['stall_ms_per_step']:.2f} ms/step, link {100 * s['link_utilisation']:.0f}%,"
                f" buffers peak {s['peak_buffer_bytes'] / GB:.2f} GB")
    if s["status"] != "ok":
        why = s.get("reason") or (f"a single request needs more than the {s['capacity_bytes'] / GB:.1f} GB of GPU"
                                  " memory")
        return f"{name}: NOTHING FITS: {s['rejected']}/{s['requests']} requests rejected ({why}); no throughput reported"
    # two lines, each within WIDTH: the throughput and what it used, then the latencies
    return (f"{name}: {s['completed']}/{s['requests']} done ({s['rejected']} rejected),"
            f" {_num(s['tokens_per_s'], '.2f')}{_interval(s.get('tokens_per_s_interval'))} tokens/s,"
            f" mean batch {s['mean_batch']:.1f}, link {100 * s['link_utilisation']:.0f}%,"
            f" peak memory {s['peak_memory_bytes'] / GB:.1f} of {s['capacity_bytes'] / GB:.1f} GB\n"
            f"    completion P50 {_num(s['completion_p50_s'], '.1f')} s P99 {_num(s['completion_p99_s'], '.1f')} s,"
            f" TTFT P50 {_num(s['ttft_p50_s'], '.2f')} s,"
            f" TPOT P50 {_num(None if s['tpot_p50_s'] is None else 1e3 * s['tpot_p50_s'], '.1f')} ms")


def _render_host(summaries: dict, r0) -> str:
    """One line: host memory not bounded, or per design its bounds and which one binds."""
    if r0.host_mem is None:
        return f"host memory: {NOT_BOUNDED}"
    parts = []
    for name, s in summaries.items():
        h = s["host_memory"]
        by_host = "-" if h["max_batch_host"] is None else h["max_batch_host"]
        parts.append(f"{name} {h['host_bytes_per_request'] / GB:.1f} GB/request, max batch {h['max_batch']}"
                     f" (GPU {h['max_batch_gpu']}, host {by_host}: {h['bound_by']})")
    ctx = next(iter(summaries.values()))["host_memory"]["context"]
    return f"host memory: {r0.host_mem.note}; at context {ctx}: " + "; ".join(parts)


def _host_block(r, ctx: int, cap: int | None) -> dict:
    """summary.json's "host_memory": the batch bounds by GPU and host memory at `ctx`, the --max-batch cap,
    the batch admission allows and what binds it."""
    b = r.bounds(ctx)
    mb = b.max_batch if cap is None else min(b.max_batch, cap)
    bound = "batch cap" if cap is not None and cap < b.max_batch else b.bound_by
    hm = r.host_mem
    return {"bytes_per_gpu": None if hm is None else hm.bytes_per_gpu, "note": NOT_BOUNDED if hm is None else hm.note,
            "context": ctx, "host_bytes_per_request": b.host_bytes_per_request, "max_batch_gpu": b.max_batch_gpu,
            "max_batch_host": b.max_batch_host, "max_batch_cap": cap, "max_batch": mb, "bound_by": bound}


def _request_rows(requests, offsets: dict | None = None) -> list[dict]:
    """One row per request; `offsets` (prefill elsewhere): request id -> its prefill and KV transfer, in its TTFT
    and completion (ddbench.planner.fleet), and a column of its own."""
    off = offsets or {}
    rows = [{"id": q.rid, "arrival_s": q.arrival, "context": q.context, "output_tokens": q.output,
             "rejected": int(q.rejected), "admitted_s": q.admitted, "ttft_s": q.ttft + off.get(q.rid, 0.0),
             "tpot_s": q.tpot, "completion_s": q.latency + off.get(q.rid, 0.0), "finished_at_s": q.completion}
            for q in requests]
    if offsets is not None:
        for row in rows:
            row["prefill_and_transfer_s"] = off.get(row["id"])
    return rows


def _prefill_elsewhere(sc, summary: dict, requests) -> dict:
    """With prefill elsewhere: each completed request's prefill on a prefill GPU and its KV's transfer to the decode
    host (ddbench.planner.fleet) added to its TTFT and completion in `summary`; -> the offsets by request id."""
    from ddbench.core.stats import percentile
    from ddbench.planner.fleet import RULE, offsets, transfer_link
    done = [q for q in requests if not q.rejected]
    off = dict(zip((q.rid for q in done), offsets(sc, [q.context for q in done])))
    for name, xs in (("ttft", [q.ttft + off[q.rid] for q in done]),
                     ("completion", [q.latency + off[q.rid] for q in done])):
        for p in (50, 99):
            summary[f"{name}_p{p}_s"] = percentile(xs, p)
    summary["prefill_elsewhere"] = {"rule": RULE, "transfer_link": transfer_link(sc).name,
                                    "prefill_and_transfer_s_p50": percentile(list(off.values()), 50),
                                    "prefill_and_transfer_s_p99": percentile(list(off.values()), 99)}
    return off


def _serving(args, r, w, out) -> dict:
    from ddbench.sim.serving import ServingOptions, draw_requests, run_serving
    from ddbench.sim.perfetto import counter_events, trace_json

    sc = r.scenario
    reqs = draw_requests(sc.requests, args.rate, sc.context, sc.output, args.seed)
    head = {"mode": "serving", "system": r.design.name, "model": r.model.name, "gpu": r.gpu.name, "link": r.link.name,
            "rate": args.rate, "seed": args.seed, "context": str(sc.context), "output": str(sc.output),
            "prefill": "elsewhere" if sc.prefill == "elsewhere" else "this GPU"}
    # the host bound at the longest context drawn (exp:MEAN: the longest request drawn)
    head["host_memory"] = _host_block(r, r.max_context or max(q.context for q in reqs), sc.max_batch)
    no_fit = weights_do_not_fit(r, len(reqs))
    if no_fit is not None:   # nothing can run: every request is rejected
        for q in reqs:
            q.rejected = True
        static = {"weights": r.model.weight_bytes, "runtime_overhead": r.gpu.runtime_overhead_bytes}
        memory = [{"time_s": 0.0, **{c: float(static.get(c, 0)) for c in CATEGORIES}, "total": float(sum(static.values()))}]
        w.write_text(os.path.join(out, "requests.csv"), _csv(_request_rows(reqs)))
        w.write_text(os.path.join(out, "steps.csv"), _csv([], STEP_COLUMNS))
        w.write_text(os.path.join(out, "memory.csv"), _csv(memory))
        return {**head, **no_fit, "peak_memory_by_category": static}
    bar = progress_bar(total=len(reqs), desc=r.design.name, unit="req", leave=False, quiet=args.quiet or len(reqs) < 200)
    try:
        res = run_serving(r.design, r.model, r.gpu, r.cm, r.workload, reqs, r.hit, r.reuse, sc.prefill == "here",
                          ServingOptions(r.batch_cap, r.lowrank, r.cache_rates, progress=bar.update))
    finally:
        bar.close()
    summary = {**head, **res.summary(), "peak_memory_by_category": res.peak_by_category}
    if summary["status"] == "ok":
        summary["tokens_per_s_interval"] = _at_ends(args, r, summary["tokens_per_s"])
    off = _prefill_elsewhere(sc, summary, res.requests) if sc.prefill == "elsewhere" and summary["status"] == "ok" \
        else None
    w.write_text(os.path.join(out, "requests.csv"), _csv(_request_rows(res.requests, off)))
    w.write_text(os.path.join(out, "steps.csv"), _csv(res.segments, STEP_COLUMNS))
    w.write_text(os.path.join(out, "memory.csv"), _csv(res.memory, ("time_s", *CATEGORIES, "total")))
    growth = backlog_growth(res.requests)     # the planner's rule: ddbench.planner.runs
    summary["backlog_growth"] = growth
    summary["queue_grows"] = summary["status"] == "ok" and queue_grows(growth)
    if args.trace:
        events = []
        notes = ["pid 2: serving counters"]
        if summary["status"] == "ok":
            from ddbench.sim.run import Point, run
            from ddbench.sim.perfetto import timeline_events
            b = max(1, round(summary["mean_batch"]))
            ctx = sum(q.context for q in reqs) / len(reqs)
            tl = run(Point(r.design, r.model, r.cm, r.workload, b, ctx, r.hit, r.reuse, r.lowrank,
                           cache=r.cache_rates), "timeline", steps=3, warmup=0, record=True)
            events = timeline_events(tl.events, pid=1)
            notes = [f"pid 1: per-layer timeline of 3 batch steps at the run's mean batch {b}; pid 2: serving counters"]
        events += counter_events(res.segments, "start_s", ["batch"], "batch", pid=2)
        events += counter_events(res.memory, "time_s", ["total"], "memory GB", pid=2, scale=1e-9)
        w.write_json(os.path.join(out, "trace.json"), trace_json(events, r.cm.notes + notes))
    return summary


def _timeline(args, r, ctx: int, batch: int, w, out) -> dict:
    """The per-layer timeline of `batch` requests at context `ctx`: its summary; with a writer `w`, its
    steps.csv, layers.csv (and trace.json) into `out` (a batch sweep passes None: the summary only)."""
    from ddbench.core.memory import memory_breakdown
    from ddbench.sim.run import Point, run
    from ddbench.sim.perfetto import timeline_events, trace_json

    wl = replace(r.workload, context=ctx)
    bd = memory_breakdown(r.design, r.model, r.gpu, replace(wl, batch=batch))
    host = _host_block(r, ctx, None)
    host_fits = host["max_batch_host"] is None or batch <= host["max_batch_host"]
    head = {"mode": "timeline", "system": r.design.name, "model": r.model.name, "gpu": r.gpu.name,
            "link": r.link.name, "batch": batch, "context": ctx, "steps": args.steps,
            "memory_bytes": bd.as_dict(), "fits": bd.fits and host_fits, "host_memory": host}
    if not bd.fits or not host_fits:
        reason = (f"batch {batch} does not fit: it needs {bd.total / GB:.1f} GB of the GPU's"
                  f" {bd.capacity / GB:.1f} GB" if not bd.fits else
                  f"batch {batch} does not fit: its host KV needs"
                  f" {batch * host['host_bytes_per_request'] / GB:.1f} GB of the"
                  f" {host['bytes_per_gpu'] / GB:.1f} GB of host memory for this GPU")
        return {**head, "status": "does-not-fit", "reason": reason, "step_ms": None, "tokens_per_s": None,
                "reasons": {"step_ms": reason, "tokens_per_s": reason}}
    layers_ = run(Point(r.design, r.model, r.cm, wl, batch, ctx, r.hit, r.reuse, r.lowrank,
                        cache=r.cache_rates_at(ctx)), "plan")
    tl = run(layers_, "timeline", steps=args.steps, warmup=min(2, args.steps - 1), record=args.trace and w is not None)
    agg = run(layers_, "aggregate")
    steps = [{"step": i, "step_s": s, "stall_s": st} for i, (s, st) in enumerate(zip(tl.step_s, tl.stall_s))]
    layers = [{"layer": i, "pre_s": layers_.pre[i], "rebuild_assemble_s": layers_.mid[i], "attention_s": layers_.att[i],
               "post_s": layers_.post[i], "prefetch_bytes": layers_.pf_bytes[i], "urgent_bytes": layers_.ur_bytes[i],
               "stall_s_per_step": tl.layer_stall_s[i] / max(1, len(tl.step_s) - tl.warmup),
               "hit_rate": r.hit[i], "lowrank_keys": int(i in layers_.lowrank)} for i in range(layers_.layers)]
    if w is not None:
        w.write_text(os.path.join(out, "steps.csv"), _csv(steps))
        w.write_text(os.path.join(out, "layers.csv"), _csv(layers))
    if w is not None and args.trace:
        w.write_json(os.path.join(out, "trace.json"), trace_json(timeline_events(tl.events), r.cm.notes))
    step = tl.steady_step_s
    return {**head, "status": "ok", "step_ms": step * 1e3,
            "tokens_per_s": batch / step, "aggregate_step_ms": agg.step_s * 1e3,
            "stall_ms_per_step": sum(tl.stall_s[tl.warmup:]) / max(1, len(tl.stall_s) - tl.warmup) * 1e3,
            "link_utilisation": tl.link_util, "h2d_bytes_per_step": layers_.h2d_bytes,
            "peak_buffer_bytes": tl.peak_buffer_bytes, "reserved_buffer_bytes": tl.reserved_buffer_bytes}
