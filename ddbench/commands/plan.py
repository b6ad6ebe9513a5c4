"""`ddbench plan`: what-if capacity planning.

Without an SLO: for each design, the largest batch that fits and the GPU memory breakdown at
that batch (or at --batch).

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

from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import CATEGORIES, Workload, max_batch, memory_breakdown
from ddbench.core.systems import resolve_systems
from ddbench.core.units import GB, fmt_tokens, parse_tokens

EXAMPLE = """examples:
  ddbench plan --model llama-3-8b --gpu h100-80gb --context 128k --system all
  ddbench plan --model qwen2.5-32b --gpu h200 --context 1m --system dualdecoder,shadowkv --json
  ddbench plan --model ./my-model/config.json --gpu a100-80gb --context 65536 --batch 8
  ddbench plan --model qwen2.5-32b --gpu h100-80gb --link pcie5 --context uniform:64k:128k --output exp:256 \\
      --slo p99-completion=60s,p99-tpot=100ms --system all --prefill elsewhere --target-rate 20 --plot p99.png
  ddbench plan --model llama-3-8b --gpu h100-80gb --context 128k --slo p99-tpot=150ms --host paper-testbed \\
      --system shadowkv,dualdecoder
  ddbench plan --model llama-3-8b --gpu h200 --context 128k --slo p99-tpot=200ms --system dualdecoder \\
      --search budget,chunk,lowrank-layers,cache --plot pareto.png"""


def register(sub) -> None:
    p = sub.add_parser("plan", help="capacity planning: max batch and memory, or max rate under an SLO",
                       description=__doc__, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="catalog name or path to a Hugging Face config.json")
    p.add_argument("--gpu", required=True, help="catalog GPU name, e.g. h100-80gb, h200")
    p.add_argument("--context", required=True,
                   help="prompt tokens per request: 131072, 128k or 1m; with --slo also uniform:LO:HI")
    p.add_argument("--system", default="all",
                   help="'all' (the paper's four designs), 'every' (whole registry) or a comma list")
    p.add_argument("--batch", type=int, help="show the breakdown at this batch instead of the maximum")
    p.add_argument("--budget", default="2048", help="sparse budget in tokens (default 2048)")
    p.add_argument("--chunk", type=int, default=8, help="tokens per chunk (default 8)")
    p.add_argument("--rank", type=int, default=160, help="low-rank key rank (default 160)")
    p.add_argument("--gen-tokens", type=int, default=128, help="generated-token slots on the GPU (default 128)")
    p.add_argument("--lowrank-layers", type=int, default=0,
                   help="DualDecoder layers with low-rank key reconstruction (default 0)")
    g = p.add_argument_group("serving what-if (any of --slo, --target-rate, --search)")
    g.add_argument("--slo", help="service-level objectives, e.g. p99-completion=60s,p99-tpot=100ms"
                                 " (metrics completion, ttft, tpot; any percentile; units s, ms, us)")
    g.add_argument("--output", default="256", help="output tokens per request: 256, uniform:LO:HI or exp:MEAN")
    g.add_argument("--link", help="host link (default: the GPU's usual link, or the host's)")
    g.add_argument("--host", help="multi-GPU host whose GPUs share PCIe switches and host memory"
                                  " (paper-testbed, hgx-h100, hgx-h200, dgx-a100, pcie-8gpu-direct, single-h200)")
    g.add_argument("--fetching", type=int, help="GPUs of --host fetching at once (default: all of them)")
    g.add_argument("--prefill", choices=("here", "elsewhere"), default="here",
                   help="prefill on this GPU beside decode (default) or on other GPUs (disaggregated)")
    g.add_argument("--hit-rate", help="prediction hit rate: a number or an accuracy CSV (default: the model's"
                                      " profile, else 0.88)")
    g.add_argument("--max-batch", type=int, help="cap on concurrent requests (default: memory only)")
    g.add_argument("--target-rate", type=float, help="fleet load in requests/s: GPUs (and hosts) needed per design")
    g.add_argument("--search", help="knob search per design: budget,chunk,lowrank-layers,cache"
                                    " (each optionally =V1:V2:..., e.g. budget=1k:2k:4k)")
    g.add_argument("--requests", type=int, default=1000, help="requests per simulator run (default 1000)")
    g.add_argument("--seeds", default="0", help="comma list of seeds; a rate passes only if every seed does"
                                                " (default 0)")
    g.add_argument("--tol", type=float, default=0.05, help="relative rate tolerance of the search (default 0.05)")
    g.add_argument("--max-runs", type=int, default=12, help="simulator runs per design or setting (default 12)")
    g.add_argument("--workers", type=int, help="local processes for the searches (default: the CPUs here)")
    g.add_argument("--calibration", help="bundle root (default: the data root's calibration/)")
    g.add_argument("--roofline", action="store_true", help="ignore calibration bundles; pure roofline")
    g.add_argument("--plot", metavar="PNG", help="draw P99 against rate with the SLO lines (or, with --search,"
                                                 " the Pareto fronts) into this file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--csv", action="store_true", help="one CSV row per design (or knob setting) on stdout")
    p.set_defaults(func=run)


# ------------------------------------------------------------------ memory answer (no SLO)
def plan(args) -> dict:
    model = get_model(args.model)
    gpu = get_gpu(args.gpu)
    systems = _systems(args.system)
    workload = Workload(context=parse_tokens(args.context), budget=parse_tokens(args.budget, "budget"),
                        chunk=args.chunk, rank=args.rank, gen_tokens=args.gen_tokens,
                        lowrank_layers=args.lowrank_layers)
    workload.validate(model)
    if args.batch is not None and args.batch < 1:
        raise DDBenchError(f"--batch must be at least 1, got {args.batch}")
    rows = []
    for sys in systems:
        best = max_batch(sys, model, gpu, workload)
        shown = args.batch if args.batch is not None else max(best, 1)
        bd = memory_breakdown(sys, model, gpu, replace(workload, batch=shown))
        rows.append({"system": sys.name, "max_batch": best, "breakdown_batch": shown,
                     "fits": bd.fits, "bytes": {c: getattr(bd, c) for c in CATEGORIES} | {"total": bd.total}})
    return {"model": model.name, "gpu": gpu.name, "capacity_bytes": gpu.hbm_bytes,
            "context": workload.context, "workload": dict(vars(workload)), "systems": rows}


def _systems(text: str):
    systems = resolve_systems(text)
    if not systems:
        raise DDBenchError(f"--system names no design (got '{text}'); use all, every or a comma list")
    return systems


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def render(result: dict) -> str:
    cap = result["capacity_bytes"]
    head = (f"{result['model']} on {result['gpu']} ({cap / GB:.1f} GB), context {fmt_tokens(result['context'])}, "
            f"budget {result['workload']['budget']}, chunk {result['workload']['chunk']}  [GB = 1e9 bytes]")
    cols = ["system", "max batch", "at batch"] + [c.replace("_", " ") for c in CATEGORIES] + ["total", "of GPU"]
    table = [cols]
    for r in result["systems"]:
        b = r["bytes"]
        table.append([r["system"], str(r["max_batch"]), str(r["breakdown_batch"])]
                     + [f"{b[c] / GB:.2f}" for c in CATEGORIES]
                     + [f"{b['total'] / GB:.2f}", f"{100 * b['total'] / cap:.0f}%" + ("" if r["fits"] else " OOM")])
    return "\n".join([head] + _table(table))


# ------------------------------------------------------------------ serving what-if
def _serving_mode(args) -> bool:
    return args.slo is not None or args.target_rate is not None or args.search is not None


def _search_task(task):
    """One rate search in a worker process: (scenario, slos, seeds, tol, max_runs) -> SearchResult."""
    from ddbench.planner.search import max_rate
    sc, slos, seeds, tol, max_runs = task
    return max_rate(sc, slos, seeds, tol, max_runs)


def _check_args(args):
    from ddbench.planner.slo import parse_slo
    if args.slo is not None and not args.slo.strip():
        raise DDBenchError("--slo is empty; give terms like p99-tpot=100ms, or leave --slo out for the memory answer")
    slos = parse_slo(args.slo)
    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    except ValueError:
        raise DDBenchError(f"--seeds must be a comma list of integers, got '{args.seeds}'") from None
    if not seeds:
        raise DDBenchError("--seeds names no seed")
    if not 0 < args.tol < 1:
        raise DDBenchError(f"--tol must be within (0, 1), got {args.tol}")
    if args.max_runs < 2 * len(seeds):
        raise DDBenchError(f"--max-runs must allow at least two probes ({2 * len(seeds)} runs with"
                           f" {len(seeds)} seeds), got {args.max_runs}")
    if args.requests < 1:
        raise DDBenchError(f"--requests must be at least 1, got {args.requests}")
    if args.target_rate is not None and not args.target_rate > 0:
        raise DDBenchError(f"--target-rate must be positive (requests/s), got {args.target_rate}")
    if args.batch is not None:
        raise DDBenchError("--batch is for the memory answer; with --slo the batch follows from the load")
    if args.gen_tokens != 128:
        raise DDBenchError("--gen-tokens is for the memory answer only")
    return slos, seeds


def _scenarios(args):
    from ddbench.planner.scenario import Scenario, resolve
    systems = _systems(args.system)
    base = dict(model=args.model, gpu=args.gpu, context=args.context, output=args.output, link=args.link,
                host=args.host, fetching=args.fetching, budget=parse_tokens(args.budget, "budget"),
                chunk=args.chunk, rank=args.rank, lowrank_layers=args.lowrank_layers,
                hit_rate=args.hit_rate, prefill=args.prefill, requests=args.requests, max_batch=args.max_batch,
                calibration=args.calibration, roofline=args.roofline)
    out = []
    for s in systems:
        sc = Scenario(system=s.name, **base)
        resolve(sc)  # validates names, knobs and distributions before any run
        from sim.serving import parse_dist
        parse_dist(args.output, "output")
        out.append(sc)
    return out


def _row_view(res, slos) -> dict:
    """One design's (or setting's) answer as a flat dict (JSON/CSV)."""
    from ddbench.planner.scenario import CATEGORIES as CATS
    sc, row = res.scenario, res.row or {}
    d = {"system": sc.label(), "budget": sc.budget, "chunk": sc.chunk, "lowrank_layers": sc.lowrank_layers,
         "cache": sc.cache, "status": res.status,
         "max_rate_req_per_s": res.rate if res.status == "met" else 0.0,
         "failed_rate_req_per_s": res.hi if math.isfinite(res.hi) else None,
         "tolerance_reached": res.reached_tol if math.isfinite(res.reached_tol) else None,
         "tokens_per_s": row.get("tokens_per_s") if res.status == "met" else None,
         "binding": res.binding or None, "limited_by": res.limit or None,
         "max_batch": res.capacity.get("max_batch"), "mean_batch": row.get("mean_batch"),
         "capacity_estimate_req_per_s": res.capacity.get("rate"),
         "link_gbps_per_gpu": row.get("link_gbps_per_gpu"), "link_utilisation": row.get("link_utilisation"),
         "peak_memory_gb": row.get("peak_memory_gb"), "runs": res.runs}
    for s in slos:
        d[s.column] = row.get(s.column)
    for p in ("completion_p99_s", "ttft_p99_s", "tpot_p99_s"):
        d.setdefault(p, row.get(p))
    for c in CATS:
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
    from ddbench.planner.scenario import capacity, resolve
    slos, seeds = _check_args(args)
    scenarios = _scenarios(args)
    knobs = None
    if args.search is not None:
        from ddbench.planner import knobs as K
        from ddbench.planner.scenario import _min_context
        knobs = K.parse_search(args.search)
        m = get_model(args.model)
        tasks = []
        for sc in scenarios:
            for s in K.settings(sc, knobs, _min_context(args.context), m.num_layers):
                resolve(s)
                tasks.append(s)
    else:
        tasks = list(scenarios)
    results = [None] * len(tasks)

    def keep(i, res):
        results[i] = res
    run_tasks(_search_task, [(sc, slos, seeds, args.tol, args.max_runs) for sc in tasks], keep,
              workers=args.workers, desc="rate searches")
    r0 = resolve(scenarios[0])
    out = {"model": r0.model.name, "gpu": r0.gpu.name, "capacity_gb": r0.gpu.hbm_bytes / GB,
           "link": r0.link.name, "link_gbps_per_gpu": r0.link.achievable_gbps,
           "context": args.context, "output": args.output, "prefill": args.prefill,
           "slo": [s.text for s in slos], "slo_columns": [s.column for s in slos], "seeds": list(seeds), "requests_per_run": args.requests,
           "tolerance": args.tol, "max_runs": args.max_runs,
           "sustainable_rule": "no rejected request and completion-time slope against arrival time <= 0.05",
           "cost_model": list(r0.cm.notes), "hit_rates": r0.hit_note}
    if r0.share is not None:
        out["host"] = {"name": r0.share.host, "fetching": r0.share.fetching, "per_gpu_gbps": r0.share.per_gpu_gbps,
                       "alone_gbps": r0.share.alone_gbps, "limit": r0.share.limit, "note": r0.share.describe()}
    by_design: dict = {}
    for res in results:
        by_design.setdefault(res.scenario.system, []).append(res)
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
            d["gpus"] = math.ceil(args.target_rate / res.rate - 1e-9) if res.status == "met" else None
            if r0.share is not None and d["gpus"] is not None:
                from ddbench.core.catalog import get_host
                d["hosts"] = math.ceil(d["gpus"] / get_host(args.host).gpus)
        if r0.share is not None:
            alone = capacity(replace(res.scenario, host=None, fetching=None,
                                     link=res.scenario.link or get_host_link(args.host)), seeds[0])
            d["peak_tokens_per_s_alone"] = alone.get("tokens_per_s")
            d["peak_tokens_per_s_shared"] = res.capacity.get("tokens_per_s")
        d["probes"] = [{"rate_req_per_s": p[0], "passed": p[1], "why": p[3],
                        **{k: p[2][0].get(k) for k in ("completion_p99_s", "ttft_p99_s", "tpot_p99_s",
                                                       "tokens_per_s", "mean_batch", "backlog_growth")},
                        **{s.column: p[2][0].get(s.column) for s in slos}} for p in sorted(res.probes)]
        designs.append(d)
    out["designs"] = designs
    out["verdict"] = _verdict(best, slos)
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
        rows.append({"system": r.scenario.system, "setting": knob_label(r.scenario, knobs),
                     "max_rate_req_per_s": r.rate, "tokens_per_s": r.row["tokens_per_s"],
                     "peak_memory_gb": r.row["peak_memory_gb"], metric: r.row.get(metric),
                     "binding": r.binding, "pareto_memory": i in mem_front, "pareto_latency": i in lat_front,
                     "runs": r.runs})
    for r in results:
        if r.status != "met":
            rows.append({"system": r.scenario.system, "setting": knob_label(r.scenario, knobs),
                         "max_rate_req_per_s": 0.0, "tokens_per_s": None, "peak_memory_gb": None, metric: None,
                         "binding": r.status, "pareto_memory": False, "pareto_latency": False, "runs": r.runs})
    rows.sort(key=lambda d: (d["system"], -(d["tokens_per_s"] or 0.0)))
    return rows


def render_serving(out: dict) -> str:
    from ddbench.planner.slo import fmt_seconds
    lines = [f"{out['model']} on {out['gpu']} ({out['capacity_gb']:.1f} GB), {out['link']}"
             f" {out['link_gbps_per_gpu']:.1f} GB/s per GPU, context {out['context']}, output {out['output']},"
             f" prefill {out['prefill']}"]
    slo = ", ".join(out["slo"]) or "none (sustainable load only)"
    lines.append(f"SLO {slo}; max rate to within {out['tolerance']:.0%}, seeds {','.join(map(str, out['seeds']))},"
                 f" {out['requests_per_run']} requests per run, at most {out['max_runs']} runs per search")
    if "host" in out:
        lines.append(f"host: {out['host']['note']}")
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
    met = [d for d in out["designs"] if d["status"] == "met"]
    if met:
        cats = [c for c in CATEGORIES if any((d.get(f"{c}_gb") or 0) > 0 for d in met)]
        lines.append("GPU memory at that rate (peak, GB = 1e9 bytes):")
        lines += ["  " + s for s in _table([["system"] + [c.replace("_", " ") for c in cats] + ["total"]] + [
            [d["system"]] + [f"{d[f'{c}_gb']:.2f}" for c in cats] + [f"{d['peak_memory_gb']:.2f}"] for d in met])]
    if "target_rate_req_per_s" in out and met:
        b = met[0]
        lines.append(f"for {out['target_rate_req_per_s']:g} req/s: {b['gpus']} GPUs of {b['system']}"
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
    lines.append("cost model: " + "; ".join(out["cost_model"]))
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


def plot(out: dict, path: str) -> None:
    from ddbench.core.io import atomic_path
    from ddbench.plotting import SYSTEM_COLORS, new_figure
    if "settings" in out:
        fig = new_figure(8.0, 3.4)
        axes = fig.subplots(1, 2)
        met = [s for s in out["settings"] if s["tokens_per_s"] is not None]
        metric = out["settings_metric"]
        for ax, (xkey, flag, xlabel) in zip(axes, [("peak_memory_gb", "pareto_memory", "peak GPU memory (GB)"),
                                                   (metric, "pareto_latency", f"{metric} at that rate (s)")]):
            for sysn in sorted({s["system"] for s in met}):
                pts = [s for s in met if s["system"] == sysn]
                c = SYSTEM_COLORS.get(sysn, None)
                ax.scatter([s[xkey] for s in pts], [s["tokens_per_s"] for s in pts], s=12, color=c, alpha=0.5,
                           label=sysn)
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
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=os.path.splitext(path)[1].lstrip(".") or "png")
    import matplotlib.pyplot as plt
    plt.close(fig)


def run(args) -> int:
    if args.json and args.csv:
        raise DDBenchError("--json and --csv: choose one")
    if not _serving_mode(args):
        for flag, val in (("--plot", args.plot), ("--host", args.host), ("--fetching", args.fetching)):
            if val is not None:
                raise DDBenchError(f"{flag} needs --slo (or --target-rate or --search)")
        result = plan(args)
        if args.csv:
            print(_csv([{"system": r["system"], "max_batch": r["max_batch"], "at_batch": r["breakdown_batch"],
                         **{f"{k}_bytes": v for k, v in r["bytes"].items()}} for r in result["systems"]]), end="")
        else:
            print(json.dumps(result, indent=1) if args.json else render(result))
        return 0
    if args.plot is not None and not os.path.splitext(args.plot)[1].lower() in (".png", ".pdf", ".svg"):
        raise DDBenchError(f"--plot must name a .png, .pdf or .svg file, got '{args.plot}'")
    out = _clean(serving_plan(args))
    if args.plot:
        plot(out, args.plot)
    if args.json:
        print(json.dumps(out, indent=1, allow_nan=False))
    elif args.csv:
        print(_csv(out["settings"] if "settings" in out else out["designs"]), end="")
    else:
        print(render_serving(out))
        if args.plot:
            print(f"wrote {args.plot}")
    return 0
