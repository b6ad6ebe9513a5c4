"""`ddbench plan`: what-if capacity planning.

Without an SLO: for each design, the largest batch that fits and the GPU memory breakdown at
that batch (or at --batch). Host memory bounds the batch too where it is given: --host NAME (the
host's memory / its GPUs, all serving) or --host-mem GB (for this GPU's requests); each design's
pinned host KV per request, the largest batch by GPU and by host memory, and which one binds.

With --slo (or --target-rate, or --search): for each design, the highest sustainable Poisson
arrival rate that meets every SLO term, found by a bracketed search over serving runs of the
simulator (at most --max-runs runs per design, rate to within --tol, the same --seeds at every
rate); tokens/s at that rate, the binding resource (memory, link or compute), the max batch and
the memory by category at that rate; the designs ranked by rate. --target-rate R turns the rate
per GPU into a GPU count (and hosts, with --host). --host models N GPUs of a multi-GPU host
fetching at once through shared PCIe switches and host memory. --search runs the rate search over
a grid of knobs per design and prints the best setting and the Pareto fronts.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
from dataclasses import replace

from ddbench.commands.config import add_config_arg
from ddbench.commands import cache_note, index_note, kv_note, table as _table  # noqa: F401 (simulate imports kv_note from here)
from ddbench.commands.plan_serving import json_safe, wants_serving_plan, plot, render_serving, serving_plan  # noqa: F401
from ddbench.core import defaults as D
from ddbench.core import flags
from ddbench.core.catalog import NOT_BOUNDED
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import BOUND_BOTH, BOUND_GPU, CATEGORIES, memory_breakdown
from ddbench.core.units import GB, fmt_tokens
from ddbench.planner.scenario import resolve
from ddbench.planner.scenario_args import (add_rate_args, add_scenario_args, add_workload, fp8_note, given,
                                           scenarios_from_args, weights_overflow)

EXAMPLE = """examples:
  ddbench plan --model llama-3-8b --gpu h100-80gb --context 128k --design all
  ddbench plan --model llama-3-8b --gpu h100-80gb --context 128k --design all --host paper-testbed
  ddbench plan --model llama-3-8b --gpu h200 --context 128k --host-mem 100 --json
  ddbench plan --model qwen2.5-32b --gpu h200 --context 1m --design dualdecoder,shadowkv --json
  ddbench plan --model ./my-model/config.json --gpu a100-80gb --context 65536 --batch 8
  ddbench plan --model qwen2.5-32b --gpu h100-80gb --link pcie5 --context uniform:64k:128k --output exp:256 \\
      --slo p99-completion=60s,p99-tpot=100ms --design all --prefill elsewhere --target-rate 20 --plot p99.png
  ddbench plan --model llama-3-8b --gpu h100-80gb --context 128k --slo p99-tpot=150ms --host paper-testbed \\
      --design shadowkv,dualdecoder
  ddbench plan --model llama-3-8b --gpu h200 --context 128k --slo p99-tpot=200ms --design dualdecoder \\
      --search budget,chunk,lowrank-layers,buffers --plot pareto.png
  ddbench plan --model llama-3-8b --gpu h200 --context 128k --slo p99-tpot=200ms --design all \\
      --rates my-rates.yaml --rate dualdecoder-cache.churn=0.2      # your own rates, one what-if

exit status: 0 with an answer (a design that does not fit says so in its row's status), 2 for bad
input (a host memory too small for one request's host KV, too), 3 when no design fits one request
(or, with --batch, that batch) in GPU memory (and host memory)."""

NO_FIT = 3
# flags only the serving what-if reads (besides those of scenario_args.OPTIONAL and --roofline)
SERVING_ONLY = ("fetching", "prefill", "seeds", "tol", "max_runs", "workers", "plot")


def _slo(text: str):
    from ddbench.planner.slo import parse_slo
    return parse_slo(text)


def _search(text: str):
    from ddbench.planner.knobs import parse_search
    return parse_search(text)


def plot_path(text: str) -> str:
    """--plot's value, checked: an image file name (.png, .pdf or .svg)."""
    if os.path.splitext(text)[1].lower() not in (".png", ".pdf", ".svg"):
        raise DDBenchError(f"--plot must name a .png, .pdf or .svg file, got '{text}'")
    return text


def register(sub) -> None:
    p = sub.add_parser("plan", help="capacity planning: max batch and memory, or max rate under an SLO",
                       description=__doc__, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("serving what-if (any of --slo, --target-rate, --search; the flags of this group"
                             " need one of them)")
    add_scenario_args(p, design=D.DESIGNS, context_required=True, requests=D.PLAN_REQUESTS, serving=g)
    add_rate_args(p)
    p.add_argument("--batch", type=flags.integer(lo=1, hi=D.MAX_COUNT),
                   help="show the breakdown at this batch instead of the maximum")
    g.add_argument("--slo", type=flags.checked(_slo),
                   help="service-level objectives, e.g. p99-completion=60s,p99-tpot=100ms"
                        " (metrics completion, ttft, tpot; any percentile; units s, ms, us)")
    p.add_argument("--host", type=flags.text(), help="multi-GPU host whose GPUs share PCIe switches and host memory"
                   " (paper-testbed, hgx-h100, hgx-h200, dgx-a100, pcie-8gpu-direct, single-h200, or a YAML/JSON file); its host memory"
                   " / its GPUs bounds the batch")
    p.add_argument("--host-mem", metavar="GB", type=flags.number(lo=0, lo_open=True, hi=D.MAX_HOST_MEM_GB),
                   help="host memory for this GPU's requests, GB (1e9 bytes): bounds the batch by pinned host KV"
                        " (default: --host's memory / its GPUs; without --host, not a bound)")
    g.add_argument("--fetching", type=flags.integer(lo=1, hi=D.MAX_COUNT),
                   help="GPUs of --host fetching at once (default: all of them)")
    g.add_argument("--prefill", choices=("here", "elsewhere"),
                   help=f"prefill on this GPU beside decode ({D.PREFILL}, the default) or on other GPUs (disaggregated)")
    g.add_argument("--target-rate", type=flags.number(lo=0, lo_open=True, hi=D.MAX_RATE),
                   help="fleet load in requests/s: GPUs (and hosts) needed per design")
    g.add_argument("--search", type=flags.checked(_search),
                   help="knob search per design: budget,chunk,lowrank-layers,buffers,cache,fp8,index (each optionally"
                        " =V1:V2:..., e.g. budget=1k:2k:4k; buffers: the layer-ahead designs' sparse-KV buffer"
                        " layout, pingpong:per-layer; cache: the chunk cache's capacity (dualdecoder-cache,"
                        " lru-cache), 2x:4x or tokens; fp8: off:on:on+cache, on+cache the chunk cache in fp8 too;"
                        " index: the landmark designs' selection index, flat:fp8:int4:two-level:8,1,int4)")
    g.add_argument("--seeds", type=flags.items(flags.integer(lo=0, hi=2 ** 63 - 1), unique=True),
                   help="comma list of seeds; a rate passes only if every seed does"
                        f" (default {','.join(map(str, D.SEEDS))})")
    g.add_argument("--tol", type=flags.number(lo=0, hi=1, lo_open=True, hi_open=True),
                   help=f"relative rate tolerance of the search, in (0, 1) (default {D.TOL})")
    g.add_argument("--max-runs", type=flags.integer(lo=2, hi=D.MAX_COUNT),
                   help=f"simulator runs per design or setting (default {D.MAX_RUNS})")
    g.add_argument("--workers", type=flags.integer(lo=1, hi=4096),
                   help="local processes for the searches (default: the CPUs here)")
    g.add_argument("--plot", metavar="PNG", type=flags.checked(plot_path),
                   help="draw P99 against rate with the SLO lines (or, with --search, the Pareto fronts) into this"
                        " file (.png, .pdf or .svg)")
    p.add_argument("--force", action="store_true", help="replace an earlier --plot file (ddbench's own only)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_config_arg(p)
    p.add_argument("--verbose", action="store_true", help="print the cost model's notes whole (else one line)")
    p.add_argument("--csv", action="store_true", help="one CSV row per design (or knob setting) on stdout")
    add_workload(p)
    p.set_defaults(func=run)


# ------------------------------------------------------------------ memory answer (no SLO)
def plan(args) -> dict:
    args.context.tokens("context")   # the memory answer is at one context
    notes = [n for n in (weights_overflow(args), fp8_note(args)) if n]
    resolved = [resolve(sc).check_host()
                for sc in scenarios_from_args(args, D.PLAN_REQUESTS, host=args.host, host_mem_gb=args.host_mem)]
    r0 = resolved[0]
    model, gpu, workload = r0.model, r0.gpu, r0.workload
    rows = []
    for r in resolved:
        bounds = r.bounds(workload.context)
        best = bounds.max_batch
        shown = args.batch if args.batch is not None else max(best, 1)
        bd = memory_breakdown(r.design, model, gpu, replace(workload, batch=shown))
        fits = bd.fits and bounds.host_fits(shown)
        rows.append({"system": r.design.name, "max_batch": best, "max_batch_gpu": bounds.max_batch_gpu,
                     "max_batch_host": bounds.max_batch_host, "bound_by": bounds.bound_by,
                     "host_bytes_per_request": bounds.host_bytes_per_request, "breakdown_batch": shown,
                     "fits": fits, "fits_gpu": bd.fits, "fits_host": bounds.host_fits(shown),
                     "status": "ok" if fits else "does-not-fit",
                     "bytes": {c: getattr(bd, c) for c in CATEGORIES} | {"total": bd.total},
                     "host_bytes": shown * bounds.host_bytes_per_request})
    hm = r0.host_mem
    out = {"model": model.name, "gpu": gpu.name, "capacity_bytes": gpu.hbm_bytes, "tp": r0.tp,
           "context": workload.context, "workload": dict(vars(workload)),
           "host_memory": None if hm is None else {"bytes_per_gpu": hm.bytes_per_gpu, "host": hm.host,
                                                   "note": hm.note},
           "host_memory_note": NOT_BOUNDED if hm is None else hm.note, "systems": rows}
    from ddbench.planner.ratelines import rates_doc
    out["rates"] = rates_doc(resolved)
    out |= fleet_notes(resolved, notes, hm)
    from ddbench.commands.plan_answer import memory_text
    out["answer"] = memory_text(out, [])[0]
    if not any(r["fits"] for r in rows):
        what = f"batch {args.batch}" if args.batch is not None else "one request"
        host = "" if hm is None else f" and the {hm.gb_per_gpu:.1f} GB of host memory for this GPU"
        out["verdict"] = f"no design fits {what} in the {gpu.hbm_bytes / GB:.1f} GB of GPU memory{host}"
    return out


BOUND_SHORT = {BOUND_GPU: "GPU", "host memory": "host", BOUND_BOTH: "both"}


def fleet_notes(resolved, notes: list, hm) -> dict:
    """The memory answer's notes: TP's sharding and all-reduce, the host's sharing, the deployable flags."""
    from ddbench.commands.plan_tp import context_warning, deploy_for, tp_view
    r0 = resolved[0]
    view = tp_view(r0)
    per_replica = None if hm is None else hm.gb_per_gpu * r0.tp
    lines = [view["note"], view["allreduce"]] if r0.tp > 1 else []
    if r0.share is not None:
        lines.append(f"link per GPU: {r0.share.describe()}")
    return {"notes": notes + context_warning(r0), "tp_lines": lines,
            "tp_detail": view, "deploy": deploy_for(resolved, per_replica)}


def render(result: dict, verbose: bool = False) -> str:
    if not verbose:
        from ddbench.commands.plan_answer import memory_text
        return "\n".join(memory_text(result, []) + (["no fit: " + result["verdict"]] if "verdict" in result else []))
    from ddbench.commands.plan_answer import category_table
    extra = category_table(result["systems"], result.get("tp", 1)) if result.get("tp", 1) > 1 else []
    return "\n".join([_render_wide(result)] + extra + list(result.get("notes", [])) + list(result.get("tp_lines", []))
                     + list(result.get("deploy", [])))


def _render_wide(result: dict) -> str:
    cap = result["capacity_bytes"]
    hm = result["host_memory"]
    host_head = (f"host memory: {hm['bytes_per_gpu'] / GB:.1f} GB per GPU" if hm is not None
                 else f"host memory: {NOT_BOUNDED}")
    head = (f"{result['model']} on {result['gpu']} ({cap / GB:.1f} GB), context {fmt_tokens(result['context'])}, "
            f"budget {result['workload']['budget']}, chunk {result['workload']['chunk']}"
            f"{kv_note(result['workload']['kv_bits'])}{index_note(result['workload'].get('index'))}{cache_note([r['system'] for r in result['systems']], result['workload'])}"
            f"  [GB = 1e9 bytes]; {host_head}")
    bounded = hm is not None
    cols = ["system", "max batch"] + (["bound by", "by GPU", "by host"] if bounded else []) + ["at batch"] \
        + [c.replace("_", " ") for c in CATEGORIES] + ["total", "of GPU", "host GB/req"]
    table = [cols]
    for r in result["systems"]:
        b = r["bytes"]
        oom = "" if r["fits"] else (" OOM" if not r["fits_gpu"] else " host OOM")
        table.append([r["system"], str(r["max_batch"])]
                     + ([BOUND_SHORT[r["bound_by"]], str(r["max_batch_gpu"]),
                         "-" if r["max_batch_host"] is None else str(r["max_batch_host"])] if bounded else [])
                     + [str(r["breakdown_batch"])]
                     + [f"{b[c] / GB:.2f}" for c in CATEGORIES]
                     + [f"{b['total'] / GB:.2f}", f"{100 * b['total'] / cap:.0f}%" + oom,
                        f"{r['host_bytes_per_request'] / GB:.2f}"])
    tail = [f"host memory: {hm['note']}; bound by: the smaller of the GPU's and host memory's batch"
            " (by host '-': the design keeps no KV on the host)"] if bounded else []
    from ddbench.planner.ratelines import rates_lines
    return "\n".join([head] + _table(table) + tail + rates_lines(result["rates"])
                     + ([result["verdict"]] if "verdict" in result else []))


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    keys = []
    for r in rows:
        for k in r:
            if k != "probes" and k not in keys:
                keys.append(k)
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    return buf.getvalue()

def run(args) -> int:
    if args.json and args.csv:
        raise DDBenchError("--json and --csv: choose one")
    if args.force and not args.plot:
        raise DDBenchError("--force is for --plot (it replaces an earlier plot ddbench wrote)")
    if not wants_serving_plan(args):
        serving_only = given(args) + [f"--{k.replace('_', '-')}" for k in SERVING_ONLY if getattr(args, k) is not None]
        if serving_only:
            raise DDBenchError(f"{serving_only[0]} needs --slo (or --target-rate or --search)")
        result = plan(args)
        if args.csv:
            print(_csv([{"system": r["system"], "max_batch": r["max_batch"], "at_batch": r["breakdown_batch"],
                         **{f"{k}_bytes": v for k, v in r["bytes"].items()},
                         **{k: r[k] for k in ("host_bytes_per_request", "max_batch_gpu", "max_batch_host", "bound_by",
                                              "status")}}
                        for r in result["systems"]]), end="")
        else:
            print(json.dumps(result, indent=1) if args.json else render(result, args.verbose))
        return NO_FIT if "verdict" in result else 0
    if args.plot:
        from ddbench.core.outputs import output_file
        with output_file(args.plot, command="ddbench plan", flag="--plot", force=args.force) as staged:
            out = json_safe(serving_plan(args))
            plot(out, staged, fmt=os.path.splitext(args.plot)[1].lstrip(".") or "png")
    else:
        out = json_safe(serving_plan(args))
    if args.json:
        print(json.dumps(out, indent=1, allow_nan=False))
    elif args.csv:
        print(_csv(out["settings"] if "settings" in out else out["designs"]), end="")
    else:
        print(render_serving(out, verbose=args.verbose))
        if args.plot:
            print(f"wrote {args.plot}")
    return NO_FIT if all(d["status"] == "no fit" for d in out["designs"]) else 0
