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
import math
import os
from dataclasses import replace

from ddbench.commands import cost_model_line
from ddbench.core import defaults as D
from ddbench.core import flags
from ddbench.core.catalog import NOT_BOUNDED
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import BOUND_BOTH, BOUND_GPU, CATEGORIES, memory_breakdown
from ddbench.core.units import GB, fmt_tokens, parse_tokens
from ddbench.planner.scenario import resolve
from ddbench.planner.scenario_args import add_scenario_args, add_workload, given, scenarios_from_args

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


def _plot_path(text: str) -> str:
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
    p.add_argument("--batch", type=flags.integer(lo=1, hi=D.MAX_COUNT),
                   help="show the breakdown at this batch instead of the maximum")
    g.add_argument("--slo", type=flags.checked(_slo),
                   help="service-level objectives, e.g. p99-completion=60s,p99-tpot=100ms"
                        " (metrics completion, ttft, tpot; any percentile; units s, ms, us)")
    p.add_argument("--host", type=flags.text(), help="multi-GPU host whose GPUs share PCIe switches and host memory"
                   " (paper-testbed, hgx-h100, hgx-h200, dgx-a100, pcie-8gpu-direct, single-h200); its host memory"
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
                   help="knob search per design: budget,chunk,lowrank-layers,buffers,cache,fp8 (each optionally"
                        " =V1:V2:..., e.g. budget=1k:2k:4k; buffers: the layer-ahead designs' sparse-KV buffer"
                        " layout, pingpong:per-layer; cache: dualdecoder-cache's chunk-cache capacity, 2x:4x or"
                        " tokens; fp8: off:on)")
    g.add_argument("--seeds", type=flags.items(flags.integer(lo=0, hi=2 ** 63 - 1)),
                   help="comma list of seeds; a rate passes only if every seed does"
                        f" (default {','.join(map(str, D.SEEDS))})")
    g.add_argument("--tol", type=flags.number(lo=0, hi=1, lo_open=True, hi_open=True),
                   help=f"relative rate tolerance of the search, in (0, 1) (default {D.TOL})")
    g.add_argument("--max-runs", type=flags.integer(lo=2, hi=D.MAX_COUNT),
                   help=f"simulator runs per design or setting (default {D.MAX_RUNS})")
    g.add_argument("--workers", type=flags.integer(lo=1, hi=4096),
                   help="local processes for the searches (default: the CPUs here)")
    g.add_argument("--plot", metavar="PNG", type=flags.checked(_plot_path),
                   help="draw P99 against rate with the SLO lines (or, with --search, the Pareto fronts) into this"
                        " file (.png, .pdf or .svg)")
    p.add_argument("--force", action="store_true", help="replace an earlier --plot file (ddbench's own only)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verbose", action="store_true", help="print the cost model's notes whole (else one line)")
    p.add_argument("--csv", action="store_true", help="one CSV row per design (or knob setting) on stdout")
    add_workload(p)
    p.set_defaults(func=run)


# ------------------------------------------------------------------ memory answer (no SLO)
def plan(args) -> dict:
    parse_tokens(args.context)   # the memory answer is at one context
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
    out = {"model": model.name, "gpu": gpu.name, "capacity_bytes": gpu.hbm_bytes,
           "context": workload.context, "workload": dict(vars(workload)),
           "host_memory": None if hm is None else {"bytes_per_gpu": hm.bytes_per_gpu, "host": hm.host,
                                                   "note": hm.note},
           "host_memory_note": NOT_BOUNDED if hm is None else hm.note, "systems": rows}
    if not any(r["fits"] for r in rows):
        what = f"batch {args.batch}" if args.batch is not None else "one request"
        host = "" if hm is None else f" and the {hm.gb_per_gpu:.1f} GB of host memory for this GPU"
        out["verdict"] = f"no design fits {what} in the {gpu.hbm_bytes / GB:.1f} GB of GPU memory{host}"
    return out


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def kv_note(kv_bits: int) -> str:
    """A header's word for the host KV's precision: ', KV fp8 (e4m3) on the host and the link' for 8 bits."""
    return ", KV fp8 (e4m3) on the host and the link" if kv_bits == 8 else ""


BOUND_SHORT = {BOUND_GPU: "GPU", "host memory": "host", BOUND_BOTH: "both"}


def render(result: dict) -> str:
    cap = result["capacity_bytes"]
    hm = result["host_memory"]
    host_head = (f"host memory: {hm['bytes_per_gpu'] / GB:.1f} GB per GPU" if hm is not None
                 else f"host memory: {NOT_BOUNDED}")
    head = (f"{result['model']} on {result['gpu']} ({cap / GB:.1f} GB), context {fmt_tokens(result['context'])}, "
            f"budget {result['workload']['budget']}, chunk {result['workload']['chunk']}"
            f"{kv_note(result['workload']['kv_bits'])}  [GB = 1e9 bytes]; {host_head}")
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
    return "\n".join([head] + _table(table) + tail + ([result["verdict"]] if "verdict" in result else []))


# ------------------------------------------------------------------ serving what-if
def _serving_mode(args) -> bool:
    return args.slo is not None or args.target_rate is not None or args.search is not None


def _search_task(task):
    """One rate search in a worker process: (scenario, slos, seeds, tol, max_runs) -> SearchResult."""
    from ddbench.planner.search import max_rate
    sc, slos, seeds, tol, max_runs = task
    return max_rate(sc, slos, seeds, tol, max_runs)


def _serving_args(args) -> tuple:
    """(slos, seeds, tol, max_runs) of the serving what-if; the cross-flag checks."""
    seeds = args.seeds if args.seeds is not None else D.SEEDS
    tol = args.tol if args.tol is not None else D.TOL
    max_runs = args.max_runs if args.max_runs is not None else D.MAX_RUNS
    if max_runs < 2 * len(seeds):
        raise DDBenchError(f"--max-runs must allow at least two probes ({2 * len(seeds)} runs with"
                           f" {len(seeds)} seeds), got {max_runs}")
    if args.batch is not None:
        raise DDBenchError("--batch is for the memory answer; with --slo the batch follows from the load")
    return args.slo or [], tuple(seeds), tol, max_runs


def _scenarios(args):
    """One checked scenario per design (names, knobs, distributions, profile, bundle) before any run."""
    scenarios = scenarios_from_args(args, D.PLAN_REQUESTS, host=args.host, fetching=args.fetching,
                                    host_mem_gb=args.host_mem, prefill=args.prefill or D.PREFILL)
    for sc in scenarios:
        resolve(sc).check().check_host()
    return scenarios


def _row_view(res, slos) -> dict:
    """One design's (or setting's) answer as a flat dict (JSON/CSV)."""
    sc, row = res.scenario, res.row or {}
    d = {"system": sc.label(), "budget": sc.knob("budget"), "chunk": sc.knob("chunk"),
         "lowrank_layers": sc.knob("lowrank_layers"),
         "buffers": sc.buffers, "status": res.status,
         "max_rate_req_per_s": res.rate if res.status == "met" else 0.0,
         "failed_rate_req_per_s": res.hi if math.isfinite(res.hi) else None,
         "tolerance_reached": res.reached_tol if math.isfinite(res.reached_tol) else None,
         "tokens_per_s": row.get("tokens_per_s") if res.status == "met" else None,
         "binding": res.binding or None, "limited_by": res.limit or None,
         "max_batch": res.capacity.get("max_batch"), "max_batch_gpu": res.capacity.get("max_batch_gpu"),
         "max_batch_host": res.capacity.get("max_batch_host"), "bound_by": res.capacity.get("bound_by"),
         "host_bytes_per_request": res.capacity.get("host_bytes_per_request"), "mean_batch": row.get("mean_batch"),
         "capacity_estimate_req_per_s": res.capacity.get("rate"),
         "link_gbps_per_gpu": row.get("link_gbps_per_gpu"), "link_utilisation": row.get("link_utilisation"),
         "peak_memory_gb": row.get("peak_memory_gb"), "runs": res.runs}
    for s in slos:
        d[s.column] = row.get(s.column)
    for p in ("completion_p99_s", "ttft_p99_s", "tpot_p99_s"):
        d.setdefault(p, row.get(p))
    for c in CATEGORIES:
        d[f"{c}_gb"] = row.get(f"peak_{c}_gb")
    return d


def _clean(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _fmt_rate(r: float) -> str:
    if r <= 0:
        return "0"
    return f"{r:.3g}" if r >= 0.01 else f"{r:.2e}"


def _worst_term(res, slos) -> tuple[float, str]:
    """(how far the lowest probe misses, what): the largest value / limit over the terms it misses."""
    from ddbench.planner.slo import fmt_seconds
    row = res.row or {}
    worst, text = 0.0, res.limit
    for s in slos:
        v = row.get(s.column)
        if v is not None and v / s.limit_s > worst:
            worst, text = v / s.limit_s, f"{s.name} {fmt_seconds(v)}"
    if res.status == "no fit":
        return math.inf, "does not fit one request"
    return (worst if worst > 1 else math.inf if "queue grows" in res.limit or "rejected" in res.limit else worst), text


def _verdict(results, slos) -> str | None:
    """'no design meets ...; the best is X at Y' where nothing meets the SLO."""
    if any(r.status == "met" for r in results):
        return None
    what = ",".join(s.text for s in slos) or "a sustainable load"
    ranked = sorted(results, key=lambda r: _worst_term(r, slos)[0])
    best = ranked[0]
    if best.status == "no fit":
        return f"no design meets {what}: none fits one request in GPU memory"
    w, text = _worst_term(best, slos)
    low = best.lowest()
    return (f"no design meets {what}; the best is {best.scenario.label()} at {text}"
            f" (at {_fmt_rate(low[0])} req/s, the lightest load tried)")


def serving_plan(args) -> dict:
    from ddbench.planner.executors import run_tasks
    from ddbench.planner.runs import SUSTAINABLE_RULE, capacity
    slos, seeds, tol, max_runs = _serving_args(args)
    scenarios = _scenarios(args)
    sc0, r0 = scenarios[0], resolve(scenarios[0])
    knobs = args.search
    if knobs is not None:
        from ddbench.planner import knobs as K
        from ddbench.planner.scenario import min_context
        tasks = []
        for sc in scenarios:
            for s in K.settings(sc, knobs, min_context(sc.context), r0.model.num_layers):
                resolve(s).check().check_host()
                tasks.append(s)
    else:
        tasks = list(scenarios)
    results = [None] * len(tasks)

    def keep(i, res):
        results[i] = res
    run_tasks(_search_task, [(sc, slos, seeds, tol, max_runs) for sc in tasks], keep,
              workers=args.workers, desc="rate searches")
    out = {"model": r0.model.name, "gpu": r0.gpu.name, "capacity_gb": r0.gpu.hbm_bytes / GB,
           "link": r0.link.name, "link_gbps_per_gpu": r0.link.achievable_gbps,
           "context": sc0.context, "output": sc0.output, "prefill": sc0.prefill,
           "slo": [s.text for s in slos], "slo_columns": [s.column for s in slos], "seeds": list(seeds),
           "requests_per_run": sc0.requests, "tolerance": tol, "max_runs": max_runs,
           "sustainable_rule": SUSTAINABLE_RULE,
           "kv_bits": r0.workload.kv_bits, "cost_model": list(r0.cm.notes), "hit_rates": r0.hit_note}
    out["host_memory"] = NOT_BOUNDED if r0.host_mem is None else r0.host_mem.note
    if r0.share is not None:
        out["host"] = {"name": r0.share.host, "fetching": r0.share.fetching, "per_gpu_gbps": r0.share.per_gpu_gbps,
                       "alone_gbps": r0.share.alone_gbps, "limit": r0.share.limit, "note": r0.share.describe()}
    by_design: dict = {}
    for res in results:
        by_design.setdefault(res.scenario.design, []).append(res)
    best = []
    for name, rs in by_design.items():
        rs_sorted = sorted(rs, key=lambda r: (r.status == "met", r.rate,
                                              (r.row or {}).get("tokens_per_s") or 0.0), reverse=True)
        best.append(rs_sorted[0])
    best.sort(key=lambda r: (r.status == "met", r.rate, (r.row or {}).get("tokens_per_s") or 0.0), reverse=True)
    designs = []
    for rank, res in enumerate(best, start=1):
        d = _row_view(res, slos)
        d["rank"] = rank if res.status == "met" else None
        if knobs is not None:
            from ddbench.planner.knobs import knob_label
            d["setting"] = knob_label(res.scenario, knobs)
        if args.target_rate is not None:
            # at least one GPU: a load far below one GPU's rate still needs that GPU
            d["gpus"] = max(1, math.ceil(args.target_rate / res.rate - 1e-9)) if res.status == "met" else None
            if r0.share is not None and d["gpus"] is not None:
                from ddbench.core.catalog import get_host
                d["hosts"] = math.ceil(d["gpus"] / get_host(args.host).gpus)
        if r0.share is not None:
            # the GPU alone on its link, with the same host memory for its requests
            alone = capacity(replace(res.scenario, host=None, fetching=None,
                                     host_mem_gb=None if r0.host_mem is None else r0.host_mem.gb_per_gpu,
                                     link=get_host_link(args.host) if res.scenario.link is None
                                     else res.scenario.link), seeds[0])
            d["peak_tokens_per_s_alone"] = alone.get("tokens_per_s")
            d["peak_tokens_per_s_shared"] = res.capacity.get("tokens_per_s")
        d["probes"] = [{"rate_req_per_s": p[0], "passed": p[1], "why": p[3],
                        **{k: p[2][0].get(k) for k in ("completion_p99_s", "ttft_p99_s", "tpot_p99_s",
                                                       "tokens_per_s", "mean_batch", "backlog_growth")},
                        **{s.column: p[2][0].get(s.column) for s in slos}} for p in sorted(res.probes)]
        designs.append(d)
    out["designs"] = designs
    out["verdict"] = _verdict(best, slos)
    if knobs is None:
        from ddbench.planner.breakeven import break_even
        out["break_even"] = break_even(best, lambda tasks, keep: run_tasks(
            _search_task, [(sc, slos, seeds, tol, max_runs) for sc in tasks], keep, workers=args.workers,
            desc="break-even searches"))
    if knobs is not None:
        out["search"] = {k: list(v) for k, v in knobs.items()}
        out["settings"] = _pareto_rows(results, slos, knobs)
        out["settings_metric"] = slos[0].column if slos else "completion_p99_s"
    if args.target_rate is not None:
        out["target_rate_req_per_s"] = args.target_rate
    return out


def get_host_link(name: str) -> str:
    from ddbench.core.catalog import get_host
    return get_host(name).link


def _pareto_rows(results, slos, knobs) -> list[dict]:
    from ddbench.planner.knobs import knob_label, pareto
    met = [r for r in results if r.status == "met"]
    metric = slos[0].column if slos else "completion_p99_s"
    mem_front = set(pareto([(r.row["tokens_per_s"], r.row["peak_memory_gb"]) for r in met]))
    lat_front = set(pareto([(r.row["tokens_per_s"], r.row.get(metric) or math.inf) for r in met]))
    rows = []
    for i, r in enumerate(met):
        rows.append({"system": r.scenario.design, "setting": knob_label(r.scenario, knobs),
                     "max_rate_req_per_s": r.rate, "tokens_per_s": r.row["tokens_per_s"],
                     "peak_memory_gb": r.row["peak_memory_gb"], metric: r.row.get(metric),
                     "binding": r.binding, "pareto_memory": i in mem_front, "pareto_latency": i in lat_front,
                     "runs": r.runs})
    for r in results:
        if r.status != "met":
            rows.append({"system": r.scenario.design, "setting": knob_label(r.scenario, knobs),
                         "max_rate_req_per_s": 0.0, "tokens_per_s": None, "peak_memory_gb": None, metric: None,
                         "binding": r.status, "pareto_memory": False, "pareto_latency": False, "runs": r.runs})
    rows.sort(key=lambda d: (d["system"], -(d["tokens_per_s"] or 0.0)))
    return rows


def render_serving(out: dict, verbose: bool = False) -> str:
    from ddbench.planner.slo import fmt_seconds
    lines = [f"{out['model']} on {out['gpu']} ({out['capacity_gb']:.1f} GB), {out['link']}"
             f" {out['link_gbps_per_gpu']:.1f} GB/s per GPU, context {out['context']}, output {out['output']},"
             f" prefill {out['prefill']}{kv_note(out.get('kv_bits', 16))}"]
    slo = ", ".join(out["slo"]) or "none (sustainable load only)"
    lines.append(f"SLO {slo}; max rate to within {out['tolerance']:.0%}, seeds {','.join(map(str, out['seeds']))},"
                 f" {out['requests_per_run']} requests per run, at most {out['max_runs']} runs per search")
    if "host" in out:
        lines.append(f"host: {out['host']['note']}")
    if "host_memory" in out:
        lines.append(f"host memory: {out['host_memory']}"
                     + ("" if out["host_memory"] == NOT_BOUNDED else
                        "; admission capped at the requests whose host KV fits at the longest context"))
    slo_cols = out["slo_columns"] or ["completion_p99_s", "tpot_p99_s"]
    head = ["rank", "system", "max rate req/s", "tokens/s", "binding", "max batch", "mean batch"] \
        + [c.replace("_s", "").replace("_", " ") for c in slo_cols] + ["peak GB", "runs"]
    if "peak_tokens_per_s_alone" in (out["designs"][0] if out["designs"] else {}):
        head += ["tok/s at max batch: alone", "shared"]
    if "target_rate_req_per_s" in out:
        head += ["GPUs"] + (["hosts"] if "host" in out else [])
    rows = [head]
    for d in out["designs"]:
        met = d["status"] == "met"
        rate = (f"{_fmt_rate(d['max_rate_req_per_s'])}" if met else "none")
        r = [str(d["rank"] or "-"), d["system"], rate, f"{d['tokens_per_s']:.1f}" if met else "-",
             d["binding"] or "-", str(d["max_batch"]), f"{d['mean_batch']:.1f}" if met and d["mean_batch"] else "-"]
        r += [fmt_seconds(d[c]) if met and d[c] is not None else "-" for c in slo_cols]
        r += [f"{d['peak_memory_gb']:.1f}" if met and d["peak_memory_gb"] else "-", str(d["runs"])]
        if "peak_tokens_per_s_alone" in d:
            a, s = d["peak_tokens_per_s_alone"], d["peak_tokens_per_s_shared"]
            r += [f"{a:.0f}" if a else "-", f"{s:.0f}" if s else "-"]
        if "target_rate_req_per_s" in out:
            r += [str(d["gpus"]) if d["gpus"] else "-"] + ([str(d.get("hosts") or "-")] if "host" in out else [])
        rows.append(r)
    lines += _table(rows)
    for d in out["designs"]:
        if d["status"] == "met":
            lines.append(f"  {d['system']}" + (f" (best setting: {d['setting']})" if "setting" in d else "")
                         + f": passes at {_fmt_rate(d['max_rate_req_per_s'])}, fails at "
                         f"{_fmt_rate(d['failed_rate_req_per_s']) if d['failed_rate_req_per_s'] else '-'} req/s"
                         f" ({d['limited_by']})")
        elif d["status"] == "no fit":
            lines.append(f"  {d['system']}: not one request fits in GPU memory")
        else:
            lo = d["probes"][0] if d["probes"] else None
            lines.append(f"  {d['system']}: fails even at {_fmt_rate(lo['rate_req_per_s'])} req/s: {d['limited_by']}"
                         if lo else f"  {d['system']}: no run")
    if out.get("break_even"):
        from ddbench.planner.breakeven import render
        lines += render(out["break_even"], out["tolerance"])
    met = [d for d in out["designs"] if d["status"] == "met"]
    if met:
        cats = [c for c in CATEGORIES if any((d.get(f"{c}_gb") or 0) > 0 for d in met)]
        lines.append("GPU memory at that rate (peak, GB = 1e9 bytes):")
        lines += ["  " + s for s in _table([["system"] + [c.replace("_", " ") for c in cats] + ["total"]] + [
            [d["system"]] + [f"{d[f'{c}_gb']:.2f}" for c in cats] + [f"{d['peak_memory_gb']:.2f}"] for d in met])]
    if "target_rate_req_per_s" in out and met:
        b = met[0]
        lines.append(f"for {out['target_rate_req_per_s']:g} req/s: {b['gpus']} GPU{'' if b['gpus'] == 1 else 's'} of"
                     f" {b['system']}"
                     + (f" ({b['hosts']} hosts of {out['host']['name']})" if "host" in out else "")
                     + f" at {_fmt_rate(b['max_rate_req_per_s'])} req/s per GPU")
    if out.get("verdict"):
        lines.append(out["verdict"])
    if "settings" in out:
        lines.append(f"knob search ({', '.join(out['search'])}): every setting that meets the SLO; * = on the"
                     " Pareto front (M: tokens/s vs peak memory, L: tokens/s vs P99)")
        metric = out["settings_metric"]
        rows = [["system", "setting", "max rate req/s", "tokens/s", "peak GB", metric[:-2].replace("_", " "),
                 "binding", "front"]]
        shown, per = [], {}
        for s in out["settings"]:   # sorted by design, then tokens/s: the front and each design's top 3
            per[s["system"]] = per.get(s["system"], 0) + 1
            if s["pareto_memory"] or s["pareto_latency"] or per[s["system"]] <= 3:
                shown.append(s)
        for s in shown:
            ok = s["tokens_per_s"] is not None
            rows.append([s["system"], s["setting"], _fmt_rate(s["max_rate_req_per_s"]) if ok else "none",
                         f"{s['tokens_per_s']:.1f}" if ok else "-", f"{s['peak_memory_gb']:.1f}" if ok else "-",
                         fmt_seconds(s[metric]) if ok and s[metric] is not None else "-", s["binding"],
                         ("*M" if s["pareto_memory"] else "") + ("*L" if s["pareto_latency"] else "")])
        lines += ["  " + x for x in _table(rows)]
        if len(shown) < len(out["settings"]):
            lines.append(f"  ({len(out['settings']) - len(shown)} more settings in --json / --csv)")
    lines.append(cost_model_line(out["cost_model"], verbose))
    lines.append("hit rates: " + out["hit_rates"])
    return "\n".join(lines)


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


def plot(out: dict, path: str, fmt: str = "png") -> None:
    """Draw the plot into `path` (a staged file of the output guard) as `fmt`."""
    from ddbench.plotting import SYSTEM_COLORS, new_figure
    if "settings" in out:
        fig = new_figure(8.0, 3.4)
        axes = fig.subplots(1, 2)
        met = [s for s in out["settings"] if s["tokens_per_s"] is not None]
        metric = out["settings_metric"]
        for ax, (xkey, flag, xlabel) in zip(axes, [("peak_memory_gb", "pareto_memory", "peak GPU memory (GB)"),
                                                   (metric, "pareto_latency", f"{metric} at that rate (s)")]):
            for name in sorted({s["system"] for s in met}):
                pts = [s for s in met if s["system"] == name]
                c = SYSTEM_COLORS.get(name, None)
                ax.scatter([s[xkey] for s in pts], [s["tokens_per_s"] for s in pts], s=12, color=c, alpha=0.5,
                           label=name)
            front = sorted((s for s in met if s[flag]), key=lambda s: s[xkey])
            ax.plot([s[xkey] for s in front], [s["tokens_per_s"] for s in front], color="black", lw=0.8,
                    marker="o", ms=3, mfc="none", label="Pareto front")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("tokens/s at the max rate")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"knob search: {out['model']} on {out['gpu']}, SLO {', '.join(out['slo']) or 'none'}",
                     fontsize=9)
    else:
        terms = out["slo"] or ["p99-completion"]
        fig = new_figure(3.4 * len(terms) + 0.6, 3.2)
        axes = fig.subplots(1, len(terms), squeeze=False)[0]
        from ddbench.planner.slo import parse_slo
        slos = parse_slo(",".join(out["slo"])) if out["slo"] else []
        for ax, i in zip(axes, range(len(terms))):
            col = slos[i].column if slos else "completion_p99_s"
            for d in out["designs"]:
                pr = [p for p in d["probes"] if p.get(col) is not None]
                if not pr:
                    continue
                c = SYSTEM_COLORS.get(d["system"].split("[")[0])
                ax.plot([p["rate_req_per_s"] for p in pr], [p[col] for p in pr], color=c, lw=0.8, label=d["system"])
                ax.scatter([p["rate_req_per_s"] for p in pr], [p[col] for p in pr], s=14, color=c,
                           facecolors=[c if p["passed"] else "none" for p in pr])
            if slos:
                ax.axhline(slos[i].limit_s, ls="--", lw=0.8, color="black", label=f"SLO {slos[i].text}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("arrival rate (requests/s)")
            ax.set_ylabel(col.replace("_s", "").replace("_", " ") + " (s)")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{out['model']} on {out['gpu']}, {out['link']}: P99 against rate (filled: meets the SLO"
                     " and sustainable)", fontsize=8)
    fig.savefig(path, format=fmt)
    import matplotlib.pyplot as plt
    plt.close(fig)


def run(args) -> int:
    if args.json and args.csv:
        raise DDBenchError("--json and --csv: choose one")
    if args.force and not args.plot:
        raise DDBenchError("--force is for --plot (it replaces an earlier plot ddbench wrote)")
    if not _serving_mode(args):
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
            print(json.dumps(result, indent=1) if args.json else render(result))
        return NO_FIT if "verdict" in result else 0
    if args.plot:
        from ddbench.core.outputs import output_file
        with output_file(args.plot, command="ddbench plan", flag="--plot", force=args.force) as staged:
            out = _clean(serving_plan(args))
            plot(out, staged, fmt=os.path.splitext(args.plot)[1].lstrip(".") or "png")
    else:
        out = _clean(serving_plan(args))
    if args.json:
        print(json.dumps(out, indent=1, allow_nan=False))
    elif args.csv:
        print(_csv(out["settings"] if "settings" in out else out["designs"]), end="")
    else:
        print(render_serving(out, verbose=args.verbose))
        if args.plot:
            print(f"wrote {args.plot}")
    return NO_FIT if all(d["status"] == "no fit" for d in out["designs"]) else 0
