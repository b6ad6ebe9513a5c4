"""`ddbench plan`'s serving what-if (--slo, --target-rate, --search): the rate searches per design or knob
setting, the answer as a dict (`serving_plan`), its text (`render_serving`) and its plot (`plot`).

With --prefill elsewhere the answer also sizes the prefill side (ddbench.planner.fleet): prefill GPUs per decode
GPU, GPUs per req/s of the whole fleet, and the fleet's P99 TTFT; the designs are then ranked by the fleet's rate
per GPU. Every answer prints P99 TTFT, completion and TPOT, and the accuracy cost the traces hold for each design
(ddbench.planner.accuracy).
"""

from __future__ import annotations

import math
from dataclasses import replace

from ddbench.commands import cache_note, cost_model_line, kv_note, table as _table
from ddbench.core.units import plural
from ddbench.core import defaults as D
from ddbench.core.catalog import NOT_BOUNDED
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import CATEGORIES
from ddbench.core.units import GB
from ddbench.planner.ratelines import format_rate
from ddbench.planner.scenario import resolve
from ddbench.planner.scenario_args import scenarios_from_args

def wants_serving_plan(args) -> bool:
    """Whether `plan`'s arguments ask a serving question (an SLO, a target rate or a rate search)."""
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


def json_safe(obj):
    """`obj` with every non-finite float replaced by None, so that it writes as strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


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
            f" (at {format_rate(low[0])} req/s, the lightest load tried)")


def _run_searches(args, scenarios, slos, seeds, tol, max_runs) -> list:
    """The rate search of every design (or, with --search, every knob setting of it), in worker processes."""
    from ddbench.planner.executors import run_tasks
    if args.search is not None:
        from ddbench.planner import knobs as K
        tasks = []
        layers = resolve(scenarios[0]).model.num_layers
        for sc in scenarios:
            for s in K.settings(sc, args.search, sc.contexts.low, layers):
                resolve(s).check().check_host()
                tasks.append(s)
    else:
        tasks = list(scenarios)
    results = [None] * len(tasks)

    def keep(i, res):
        results[i] = res
    run_tasks(_search_task, [(sc, slos, seeds, tol, max_runs) for sc in tasks], keep,
              workers=args.workers, desc="rate searches")
    return results


def _head(args, sc0, r0, slos, seeds, tol, max_runs) -> dict:
    """The answer's header: what was asked, on what, priced how."""
    from ddbench.planner.runs import SUSTAINABLE_RULE
    out = {"model": r0.model.name, "gpu": r0.gpu.name, "capacity_gb": r0.gpu.hbm_bytes / GB,
           "link": r0.link.name, "link_gbps_per_gpu": r0.link.achievable_gbps,
           "context": str(sc0.context), "output": str(sc0.output), "prefill": sc0.prefill,
           "slo": [s.text for s in slos], "slo_columns": [s.column for s in slos], "seeds": list(seeds),
           "requests_per_run": sc0.requests, "tolerance": tol, "max_runs": max_runs,
           "sustainable_rule": SUSTAINABLE_RULE,
           "kv_bits": r0.workload.kv_bits, "cache_bits": r0.workload.cache_bits,
           "cache_tokens": r0.workload.cache_tokens, "budget": r0.workload.budget,
           "cost_model": list(r0.cm.notes), "hit_rates": r0.hit_note}
    out["host_memory"] = NOT_BOUNDED if r0.host_mem is None else r0.host_mem.note
    if r0.share is not None:
        out["host"] = {"name": r0.share.host, "fetching": r0.share.fetching, "per_gpu_gbps": r0.share.per_gpu_gbps,
                       "alone_gbps": r0.share.alone_gbps, "limit": r0.share.limit, "note": r0.share.describe()}
    if sc0.prefill == "elsewhere":
        from ddbench.planner.fleet import RULE
        out["fleet_rule"] = RULE
    return out


def _best_per_design(results, elsewhere: bool) -> list:
    """Each design's best setting, the designs ranked: by rate per decode GPU, or (prefill elsewhere) by the
    fleet's rate per GPU (decode and prefill GPUs)."""
    def key(r):
        rate = r.rate
        if elsewhere and r.status == "met":
            from ddbench.planner.fleet import fleet
            rate = fleet(r.scenario, r.rate, None)["fleet_req_per_s_per_gpu"]
        return (r.status == "met", rate, (r.row or {}).get("tokens_per_s") or 0.0)
    by_design: dict = {}
    for res in results:
        by_design.setdefault(res.scenario.design, []).append(res)
    best = [sorted(rs, key=lambda r: (r.status == "met", r.rate, (r.row or {}).get("tokens_per_s") or 0.0),
                   reverse=True)[0] for rs in by_design.values()]
    return sorted(best, key=key, reverse=True)


def _design_view(args, res, rank, slos, r0, seeds) -> dict:
    """One ranked design's answer: its row, GPUs (and hosts) for --target-rate, the shared host's peak, the
    prefill fleet, its accuracy cost, its probes."""
    from ddbench.planner.accuracy import accuracy_cost
    from ddbench.planner.runs import capacity
    d = _row_view(res, slos)
    d["rank"] = rank if res.status == "met" else None
    if args.search is not None:
        from ddbench.planner.knobs import knob_label
        d["setting"] = knob_label(res.scenario, args.search)
    tp = res.scenario.tp
    d["tp"] = tp
    d["rate_per_gpu"] = d["max_rate_req_per_s"] / tp      # the rate is one replica's (tp GPUs)
    if args.target_rate is not None:
        # at least one replica: a load far below one replica's rate still needs it
        d["gpus"] = max(1, math.ceil(args.target_rate / res.rate - 1e-9)) * tp if res.status == "met" else None
        if r0.share is not None and d["gpus"] is not None:
            from ddbench.core.catalog import get_host
            d["hosts"] = math.ceil(d["gpus"] / get_host(res.scenario.host).gpus)
    if r0.share is not None:
        # the GPU alone on its link, with the same host memory for its requests
        alone = capacity(replace(res.scenario, host=None, fetching=None,
                                 host_mem_gb=None if r0.host_mem is None else r0.host_mem.gb_per_gpu,
                                 link=get_host_link(res.scenario.host) if res.scenario.link is None
                                 else res.scenario.link), seeds[0])
        d["peak_tokens_per_s_alone"] = alone.get("tokens_per_s")
        d["peak_tokens_per_s_shared"] = res.capacity.get("tokens_per_s")
    d["prefill_here_s"] = res.capacity.get("prefill_s") if res.scenario.prefill == "here" else None
    if res.scenario.prefill == "elsewhere" and res.status == "met":
        from ddbench.planner.fleet import fleet
        d["fleet"] = fleet(res.scenario, res.rate, d.get("ttft_p99_s"), seeds[0], args.target_rate)
    search_fp8 = args.search is not None and "fp8" in args.search
    d["accuracy"] = accuracy_cost(resolve(res.scenario), fp8=True if search_fp8 else None)
    d["probes"] = [{"rate_req_per_s": p[0], "passed": p[1], "why": p[3],
                    **{k: p[2][0].get(k) for k in ("completion_p99_s", "ttft_p99_s", "tpot_p99_s",
                                                   "tokens_per_s", "mean_batch", "backlog_growth")},
                    **{s.column: p[2][0].get(s.column) for s in slos}} for p in sorted(res.probes)]
    return d


def _warnings(out: dict) -> list[str]:
    """Beside the ranking: where the design ranked first has a queue that grows (an unbounded TTFT), or, with no
    TTFT term in the SLO, its P99 request waits in queues (TTFT less its prefill and KV transfer) longer than it
    decodes (completion less TTFT)."""
    from ddbench.planner.runs import STABLE_SLOPE
    from ddbench.planner.slo import fmt_seconds
    first = next((d for d in out["designs"] if d["rank"] == 1), None)
    if first is None:
        return []
    warn = []
    at = [p for p in first["probes"] if p["passed"] and p["rate_req_per_s"] == first["max_rate_req_per_s"]]
    if any((p.get("backlog_growth") or 0) > STABLE_SLOPE for p in at):
        warn.append(f"WARNING: {first['system']}'s queue grows at the rate it is ranked by: its TTFT is unbounded")
    f = first.get("fleet") or {}
    ttft = f.get("fleet_ttft_p99_s") or first.get("ttft_p99_s")
    comp = first.get("completion_p99_s")
    work = (f["prefill_s_p99"] + f["transfer_s_p99"]) if f else (first.get("prefill_here_s") or 0.0)
    if ttft is None or comp is None or any(c.startswith("ttft_") for c in out["slo_columns"]):
        return warn
    wait, decode = ttft - work, comp - (first.get("ttft_p99_s") or 0.0)
    if wait > decode:
        warn.append(f"WARNING: {first['system']}, ranked first, is ranked at a load where its P99 request waits"
                    f" {fmt_seconds(wait)} in queues (P99 TTFT {fmt_seconds(ttft)}, of which prefill and KV transfer"
                    f" {fmt_seconds(work)}), longer than it decodes ({fmt_seconds(decode)}); no SLO term bounds the"
                    " TTFT: add one (e.g. p99-ttft=...)" + (", or --prefill elsewhere" if out["prefill"] == "here"
                                                            else ""))
    return warn


def serving_plan(args) -> dict:
    """The serving answer: at the TP asked (--tp auto: each that fits, the best kept; a model whose weights exceed
    one GPU: auto), with prefill where asked (not asked: both placements, the one needing fewer GPUs kept)."""
    from ddbench.commands.plan_tp import auto_tp_serving, prefill_default, tp_is_auto
    from ddbench.planner.scenario_args import weights_overflow
    note = weights_overflow(args)

    def one(a):
        return _serving_core(a) if a.prefill is not None else prefill_default(a, _serving_core)
    out = auto_tp_serving(args, one) if tp_is_auto(args) else one(args)
    if note:
        out.setdefault("notes", []).insert(0, note)
    from ddbench.commands.plan_answer import answer_line
    first = next((d for d in out["designs"] if d["rank"] == 1), out["designs"][0] if out["designs"] else None)
    out["answer"] = answer_line(out, first) if first else None
    return out


def _serving_core(args) -> dict:
    from ddbench.commands.plan_tp import context_warning, deploy_for, tp_view
    from ddbench.core.tp import DEFAULT_HOSTS
    from ddbench.planner.scenario_args import fp8_note
    slos, seeds, tol, max_runs = _serving_args(args)
    scenarios = _scenarios(args)
    sc0, r0 = scenarios[0], resolve(scenarios[0])
    results = _run_searches(args, scenarios, slos, seeds, tol, max_runs)
    out = _head(args, sc0, r0, slos, seeds, tol, max_runs)
    out |= {"tp": tp_view(r0), "host_name": sc0.host or DEFAULT_HOSTS.get(r0.gpu.name),
            "notes": context_warning(r0) + [n for n in (fp8_note(args),) if n],
            "deploy": deploy_for([resolve(sc) for sc in scenarios],
                                 None if r0.host_mem is None else r0.host_mem.gb_per_gpu * r0.tp)}
    best = _best_per_design(results, sc0.prefill == "elsewhere")
    out["designs"] = [_design_view(args, res, rank, slos, r0, seeds) for rank, res in enumerate(best, start=1)]
    out["verdict"] = _verdict(best, slos)
    out["warnings"] = _warnings(out)
    from ddbench.planner.accuracy import assumed_hit_rate
    out["assumed"] = sorted({assumed_hit_rate(resolve(res.scenario)) for res in best} - {None})
    from ddbench.planner.ratelines import rates_doc
    out["rates"] = rates_doc([resolve(res.scenario) for res in best])
    from ddbench.planner import ratelines as RL
    from ddbench.planner.executors import run_tasks

    def search(desc):
        return lambda tasks, keep: run_tasks(_search_task, [(sc, slos, seeds, tol, max_runs) for sc in tasks],
                                             keep, workers=args.workers, desc=desc)
    # every design's (best setting's) rate at both ends of its rates' interval, and the ranking they leave
    RL.attach_intervals(out["designs"], best, RL.interval_searches(best, search("rate searches at the rates' ends")))
    RL.ranking(out["designs"], tol)
    if args.search is None:
        from ddbench.planner.breakeven import break_even
        out["break_even"] = break_even(best, search("break-even searches"))
    else:
        out["search"] = {k: list(v) for k, v in args.search.items()}
        out["settings"] = _pareto_rows(results, slos, args.search)
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


LATENCY_COLUMNS = ("ttft_p99_s", "completion_p99_s", "tpot_p99_s")   # every answer prints these


def _cache_head(out: dict) -> str:
    """The header's chunk cache, where a design keeps one at one capacity (not when --search sizes it)."""
    if "cache_tokens" not in out or any(str(k).startswith("cache") for k in out.get("search") or ()):
        return ""
    return cache_note([d["system"] for d in out.get("designs", [])], out)


def _render_head(out: dict) -> list[str]:
    lines = [f"{out['model']} on {out['gpu']} ({out['capacity_gb']:.1f} GB), {out['link']}"
             f" {out['link_gbps_per_gpu']:.1f} GB/s per GPU, context {out['context']}, output {out['output']},"
             f" prefill {out['prefill']}{kv_note(out.get('kv_bits', 16))}{_cache_head(out)}"]
    slo = ", ".join(out["slo"]) or "none (sustainable load only)"
    lines.append(f"SLO {slo}; max rate to within {out['tolerance']:.0%}, seeds {','.join(map(str, out['seeds']))},"
                 f" {out['requests_per_run']} requests per run, at most {out['max_runs']} runs per search")
    if "host" in out:
        lines.append(f"host: {out['host']['note']}")
    if "host_memory" in out:
        lines.append(f"host memory: {out['host_memory']}"
                     + ("" if out["host_memory"] == NOT_BOUNDED else
                        "; admission capped at the requests whose host KV fits at the longest context"))
    return lines


def _latency_columns(out: dict) -> list[str]:
    return list(dict.fromkeys(list(out["slo_columns"]) + list(LATENCY_COLUMNS)))


def _render_table(out: dict) -> list[str]:
    from ddbench.planner.slo import fmt_seconds
    cols = _latency_columns(out)
    fleet = out["prefill"] == "elsewhere"
    head = ["rank", "system", "max rate req/s" + (" per decode GPU" if fleet else ""), "tokens/s", "binding",
            "max batch", "mean batch"] + [c.replace("_s", "").replace("_", " ") for c in cols] + ["peak GB", "runs"]
    if fleet:
        head += ["prefill GPUs/decode GPU", "fleet req/s per GPU", "fleet ttft p99"]
    if "peak_tokens_per_s_alone" in (out["designs"][0] if out["designs"] else {}):
        head += ["tok/s at max batch: alone", "shared"]
    if "target_rate_req_per_s" in out:
        head += ["GPUs"] + (["hosts"] if "host" in out else [])
    rows = [head]
    for d in out["designs"]:
        met = d["status"] == "met"
        r = [("=" if d.get("undecided_with") else "") + str(d["rank"] or "-"), d["system"], format_rate(d["max_rate_req_per_s"]) if met else "none",
             f"{d['tokens_per_s']:.1f}" if met else "-", d["binding"] or "-", str(d["max_batch"]),
             f"{d['mean_batch']:.1f}" if met and d["mean_batch"] else "-"]
        r += [fmt_seconds(d[c]) if met and d.get(c) is not None else "-" for c in cols]
        r += [f"{d['peak_memory_gb']:.1f}" if met and d["peak_memory_gb"] else "-", str(d["runs"])]
        if fleet:
            f = d.get("fleet")
            r += [f"{f['prefill_gpus_per_decode_gpu']:.2f}", format_rate(f["fleet_req_per_s_per_gpu"]),
                  fmt_seconds(f["fleet_ttft_p99_s"]) if f["fleet_ttft_p99_s"] is not None else "-"] if f \
                else ["-", "-", "-"]
        if "peak_tokens_per_s_alone" in d:
            a, s = d["peak_tokens_per_s_alone"], d["peak_tokens_per_s_shared"]
            r += [f"{a:.0f}" if a else "-", f"{s:.0f}" if s else "-"]
        if "target_rate_req_per_s" in out:
            gpus = d["gpus"] if not d.get("fleet") or "fleet_gpus" not in d["fleet"] else d["fleet"]["fleet_gpus"]
            r += [str(gpus) if gpus else "-"] + ([str(d.get("hosts") or "-")] if "host" in out else [])
        rows.append(r)
    return _table(rows)


def _render_outcomes(out: dict) -> list[str]:
    lines = []
    for d in out["designs"]:
        if d["status"] == "met":
            lines.append(f"  {d['system']}" + (f" (best setting: {d['setting']})" if "setting" in d else "")
                         + f": passes at {format_rate(d['max_rate_req_per_s'])}, fails at "
                         f"{format_rate(d['failed_rate_req_per_s']) if d['failed_rate_req_per_s'] else '-'} req/s"
                         f" ({d['limited_by']})")
        elif d["status"] == "no fit":
            lines.append(f"  {d['system']}: not one request fits in GPU memory")
        else:
            lo = d["probes"][0] if d["probes"] else None
            lines.append(f"  {d['system']}: fails even at {format_rate(lo['rate_req_per_s'])} req/s: {d['limited_by']}"
                         if lo else f"  {d['system']}: no run")
    return lines


def _render_memory(met: list[dict]) -> list[str]:
    cats = [c for c in CATEGORIES if any((d.get(f"{c}_gb") or 0) > 0 for d in met)]
    return ["GPU memory at that rate (peak, GB = 1e9 bytes):"] + ["  " + s for s in _table(
        [["system"] + [c.replace("_", " ") for c in cats] + ["total"]]
        + [[d["system"]] + [f"{d[f'{c}_gb']:.2f}" for c in cats] + [f"{d['peak_memory_gb']:.2f}"] for d in met])]


def _render_fleet(out: dict, met: list[dict]) -> list[str]:
    """The prefill side of each design (prefill elsewhere), and the fleet for --target-rate."""
    from ddbench.planner.slo import fmt_seconds
    lines = [f"prefill fleet ({out['fleet_rule']}):"]
    for d in met:
        f = d["fleet"]
        lines.append(f"  {d['system']}: prefill {fmt_seconds(f['prefill_s_mean'])} per request (P99"
                     f" {fmt_seconds(f['prefill_s_p99'])}), KV transfer {f['transfer_gb_mean']:.1f} GB over"
                     f" {f['transfer_link']} (P99 {fmt_seconds(f['transfer_s_p99'])}); {f['prefill_gpus_per_decode_gpu']:.2f}"
                     f" prefill GPUs per decode GPU, {f['gpus_per_req_per_s']:.2f} GPUs per req/s of the whole fleet;"
                     f" prefill queue P99 wait {fmt_seconds(f['prefill_wait_p99_s'])} on {f['prefill_pool_gpus']}"
                     f" prefill GPU{'' if f['prefill_pool_gpus'] == 1 else 's'} at"
                     f" {format_rate(f['prefill_pool_load_req_per_s'])} req/s")
    return lines


def _render_target(out: dict, b: dict) -> str:
    f = b.get("fleet")
    if f and "fleet_gpus" in f:
        return (f"for {out['target_rate_req_per_s']:g} req/s: {plural(f['fleet_gpus'], 'GPU')} of {b['system']}:"
                f" {plural(f['decode_gpus'], 'decode GPU')} at {format_rate(b['max_rate_req_per_s'])} req/s each"
                + (f" ({plural(b['hosts'], 'host')} of {out['host']['name']})" if "host" in out else "")
                + f" and {plural(f['prefill_gpus'], 'prefill GPU')}")
    return (f"for {out['target_rate_req_per_s']:g} req/s: {plural(b['gpus'], 'GPU')} of"
            f" {b['system']}" + (f" ({plural(b['hosts'], 'host')} of {out['host']['name']})" if "host" in out else "")
            + f" at {format_rate(b['max_rate_req_per_s'])} req/s per GPU")


def _render_settings(out: dict) -> list[str]:
    from ddbench.planner.slo import fmt_seconds
    lines = [f"knob search ({', '.join(out['search'])}): every setting that meets the SLO; * = on the"
             " Pareto front (M: tokens/s vs peak memory, L: tokens/s vs P99)"]
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
        rows.append([s["system"], s["setting"], format_rate(s["max_rate_req_per_s"]) if ok else "none",
                     f"{s['tokens_per_s']:.1f}" if ok else "-", f"{s['peak_memory_gb']:.1f}" if ok else "-",
                     fmt_seconds(s[metric]) if ok and s[metric] is not None else "-", s["binding"],
                     ("*M" if s["pareto_memory"] else "") + ("*L" if s["pareto_latency"] else "")])
    lines += ["  " + x for x in _table(rows)]
    if len(shown) < len(out["settings"]):
        lines.append(f"  ({len(out['settings']) - len(shown)} more settings in --json / --csv)")
    return lines


def render_serving(out: dict, verbose: bool = False) -> str:
    if not verbose and "settings" not in out:
        from ddbench.commands.plan_answer import serving_text
        return "\n".join(serving_text(out))
    from ddbench.planner.ratelines import ranking_lines, rates_lines
    no_rates = {"unmatched": [], "designs": [], "sources": []}
    lines = _render_head(out) + rates_lines(out.get("rates") or no_rates) + _render_table(out) + ranking_lines(out) \
        + out.get("warnings", []) + _render_outcomes(out)
    if out.get("break_even"):
        from ddbench.planner.breakeven import render
        lines += render(out["break_even"], out["tolerance"])
    met = [d for d in out["designs"] if d["status"] == "met"]
    if met:
        lines += _render_memory(met)
    if out["prefill"] == "elsewhere" and met:
        lines += _render_fleet(out, met)
    if "target_rate_req_per_s" in out and met:
        lines.append(_render_target(out, met[0]))
    if out.get("verdict"):
        lines.append(out["verdict"])
    if "settings" in out:
        lines += _render_settings(out)
    lines += [d["accuracy"]["line"] for d in out["designs"] if "accuracy" in d] + out.get("assumed", [])
    lines.append(cost_model_line(out["cost_model"], verbose))
    if (out.get("rates") or {}).get("unmatched", True):
        lines.append("hit rates: " + out["hit_rates"])
    return "\n".join(lines)


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

