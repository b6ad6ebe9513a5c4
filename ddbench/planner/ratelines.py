"""The rates an answer ran at, and the ranking they leave decided or not, in short lines.

    rates_doc(resolved) -> dict                 every design's rates (ddbench.core.rates) at the answer's context
    rates_lines(doc) -> [lines]                 where they come from, then one line per design
    interval_searches(best, search) -> dict     each met design's max rate re-searched at both ends of its rates'
                                                95 % interval (Scenario.rate_end): the fewest misses (low), the most
    ranking(designs) -> None                    each design's rank among those it beats at every rate in the intervals
    ranking_lines(out) -> [lines]               the ranking with its intervals; "undecided at these rates" where the
                                                order flips inside them, with the winner's break-even factor

A design ranks above another only where its max rate at its rates' worse end beats the other's at its better end
by more than the rate searches' tolerance; otherwise the two are undecided at these rates (both keep the better
rank, marked "="). Where no profile matches a design's rates, the first lines say so.
"""

from __future__ import annotations

from dataclasses import replace

from ddbench.core import defaults as D


def _fmt(x: float, short: bool = False) -> str:
    """0.013; inside an interval's brackets .013 (the lines stay within 120 characters); 2.1e-04 below 0.0005."""
    if x == 0 or x >= 0.0005:
        t = f"{x:.3f}"
        return t[1:] if short and t.startswith("0.") else t
    return f"{x:.1e}"


def _rate_text(r) -> str:
    if not r.has_interval:
        return f"{r.metric} {_fmt(r.mean())}"
    return f"{r.metric} {_fmt(r.mean())} [{_fmt(r.mean('low'), True)}, {_fmt(r.mean('high'), True)}]"


def _where(dr) -> str:
    from ddbench.core.rates import fmt_k, short_model
    if not dr.measured:
        return short_model(dr.source) if dr.measured == () and "/" not in dr.source else dr.source
    lo, hi = min(dr.measured), max(dr.measured)
    k = (lambda t: f"{round(t / 1024)}K" if t >= 1024 else fmt_k(t))
    span = k(lo) if lo == hi else f"{k(lo)}-{k(hi)}"
    e = dr.extrapolation
    reach = f"extrapolated {e:.0f}x" if e >= 9.5 else f"extrapolated {e:.1f}x" if e > 1.0 else "inside"
    return f"{short_model(dr.source)}, measured {span}, {reach}"


def rates_doc(resolved) -> dict:
    """{"designs": [{design, rates: {metric: [centre, low, high]}, source, measured, extrapolation, line}],
    "sources", "unmatched", "context"} for the resolved scenarios of an answer (one per design)."""
    out, srcs, unmatched, ctx = [], set(), [], None
    for r in resolved:
        if r.design.kv_on_gpu:
            continue
        dr = r.design_rates
        ctx = r.max_context or r.workload.context
        if dr is None or dr.family is None:
            full = r.rates_at(ctx).of(r.scenario.design)
            if dr is None and full is not None and full.family is not None:
                unmatched.append(r.design.name)
                const = r.scenario.hit_rate is None and "constant" in r.hit_note
                how = (f"constant hit rate {D.HIT_RATE}, not measured" if const else f"hit rate: {r.hit_note}") \
                    if full.family in ("reuse", "speculative") else "no cache rates (cannot be priced)"
                out.append({"design": r.design.name, "source": None, "line": f"{r.design.name}: {how}"})
            continue
        line = f"{r.design.name}: {', '.join(_rate_text(x) for x in dr.rates)}; {_where(dr)}"
        srcs.add(dr.source.split(" (")[0])
        out.append({"design": r.design.name, "line": line, "source": dr.source, "measured": list(dr.measured),
                    "extrapolation": dr.extrapolation,
                    "rates": {x.metric: [x.mean(), x.mean("low"), x.mean("high")] for x in dr.rates}})
    return {"context": ctx, "designs": out, "sources": sorted(srcs), "unmatched": unmatched}


def rates_lines(doc: dict) -> list[str]:
    """The first lines of an answer: where its rates come from, then one short line per design."""
    lines = []
    if doc["unmatched"]:
        lines.append(f"NO PROFILE MATCHES {', '.join(doc['unmatched'])} (traces/accuracy has no trend pricing"
                     f" {'them' if len(doc['unmatched']) > 1 else 'it'}); give --rates FILE")
    if not doc["designs"]:
        return lines
    srcs = doc["sources"]
    head = "rates (95 % interval)" + (f", one matched set: {srcs[0]}" if len(srcs) == 1 else
                                      f" from DIFFERENT sources: {', '.join(srcs)}" if srcs else "")
    return lines + [head + ":"] + ["  " + d["line"] for d in doc["designs"]]


def caption(resolved, contexts=()) -> str:
    """One phrase for a figure that compares designs: the matched rate set they are priced at (its source, the
    contexts measured, how far it reaches at the longest context shown), or that they are not at one."""
    from ddbench.core.rates import short_model
    docs, reach = [], 1.0
    for r in resolved:
        if r.design.kv_on_gpu:
            continue
        for c in (contexts or (r.max_context or r.workload.context,)):
            dr = r.rates_at(int(c)).of(r.scenario.design)
            if dr is not None and dr.family is not None:
                docs.append(dr)
                reach = max(reach, dr.extrapolation if dr.matched else 1.0)
    if not docs:
        return "no design here fetches on a prediction: no rates"
    if any(not d.matched for d in docs):
        return f"rates: NO PROFILE MATCHES {', '.join(sorted({d.design for d in docs if not d.matched}))}"
    srcs = sorted({d.source for d in docs})
    if len(srcs) > 1:
        return f"rates from DIFFERENT sources: {', '.join(srcs)}"
    d = docs[0]
    meas = f", measured {min(d.measured) / 1024:.0f}K-{max(d.measured) / 1024:.0f}K" if d.measured else ""
    ext = f", extrapolated up to {reach:.0f}x" if reach > 1 else ""
    return f"every design at one matched rate set: {short_model(srcs[0])}{meas}{ext} (ddbench.core.rates)"


# ---------------------------------------------------------------- the ranking at the interval's ends
def _has_interval(sc) -> bool:
    from ddbench.planner.scenario import resolve
    dr = resolve(sc).design_rates
    return dr is not None and any(x.has_interval for x in dr.rates)


def interval_searches(best: list, search) -> dict:
    """{label: {"low": SearchResult, "high": SearchResult}} of every met design whose rates have an interval."""
    want = [(res, end) for res in best if res.status == "met" and _has_interval(res.scenario)
            for end in ("low", "high")]
    results = [None] * len(want)

    def keep(i, r):
        results[i] = r
    if want:
        search([replace(res.scenario, rate_end=end) for res, end in want], keep)
    out: dict = {}
    for (res, end), r in zip(want, results):
        out.setdefault(res.scenario.label(), {})[end] = r
    return out


def _per_gpu(res, rate: float) -> float:
    """The rate the ranking compares: per decode GPU, or (prefill elsewhere) the fleet's per GPU."""
    if res.scenario.prefill != "elsewhere" or rate <= 0:
        return rate
    from ddbench.planner.fleet import fleet
    return fleet(res.scenario, rate, None)["fleet_req_per_s_per_gpu"]


def attach_intervals(designs: list[dict], best: list, ends: dict) -> None:
    """Each met design's view gets `rate_interval` [worst, best] of the rate it is ranked by (req/s per decode GPU,
    or per GPU of the fleet with prefill elsewhere) and `tokens_interval` (tokens/s), over its rates' centre and
    the two ends of their interval (the searches' own noise aside: the lowest and highest of the three)."""
    by = {res.scenario.label(): res for res in best}
    for d in designs:
        if d["status"] != "met":
            continue
        res, e = by[d["system"]], ends.get(d["system"]) or {}
        runs = [res] + [r for r in (e.get("high"), e.get("low")) if r is not None]
        rates = [_per_gpu(res, r.rate) if r.status == "met" else 0.0 for r in runs]
        toks = [(r.row or {}).get("tokens_per_s") or 0.0 if r.status == "met" else 0.0 for r in runs]
        d["rank_rate"] = rates[0]
        d["rate_interval"] = [min(rates), max(rates)]
        d["tokens_interval"] = [min(toks), max(toks)]


def _beats(a: dict, b: dict, tol: float) -> bool:
    """a's max rate at its worst rates beats b's at its best by more than the searches' tolerance."""
    return a["rate_interval"][0] > b["rate_interval"][1] * (1.0 + tol)


def ranking(designs: list[dict], tol: float) -> None:
    """`rank`: 1 + the met designs that beat this one at every rate in both intervals (by more than the rate
    searches' tolerance `tol`); `undecided_with`: the designs it neither beats nor loses to."""
    met = [d for d in designs if d["status"] == "met" and "rate_interval" in d]
    for d in met:
        d["rank"] = 1 + sum(_beats(o, d, tol) for o in met if o is not d)
        d["undecided_with"] = [o["system"] for o in met if o is not d
                               and not _beats(o, d, tol) and not _beats(d, o, tol)]


def format_rate(r: float) -> str:
    """A rate in req/s for a table or a sentence: three significant digits, scientific below 0.01."""
    if r <= 0:
        return "0"
    return f"{r:.3g}" if r >= 0.01 else f"{r:.2e}"


def _iv(d: dict) -> str:
    lo, hi = d["rate_interval"]
    t_lo, t_hi = d["tokens_interval"]
    per = " per GPU of the fleet" if d.get("fleet") else ""
    return (f"{format_rate(d['rank_rate'])} [{format_rate(lo)}, {format_rate(hi)}] req/s{per},"
            f" {d['tokens_per_s']:.0f} [{t_lo:.0f}, {t_hi:.0f}] tokens/s")


def ranking_lines(out: dict) -> list[str]:
    """The ranking priced at the rates' centre and the ends of their intervals."""
    met = sorted((d for d in out["designs"] if d["status"] == "met" and "rate_interval" in d),
                 key=lambda d: (d["rank"], -d["rank_rate"]))
    if not met:
        return []
    top = [d for d in met if d["rank"] == 1]
    be = {p["against"]: p["factor"] for p in (out.get("break_even") or {}).get("pairs", [])}
    if len(top) == 1:
        lines = [f"winner at these rates: {top[0]['system']} at {_iv(top[0])} (ahead at every rate in the intervals,"
                 f" by more than the searches' {out['tolerance']:.0%})"]
    else:
        first = top[0]
        fac = [f"{be[o['system']]:.2g}x against {o['system']}" for o in top[1:] if be.get(o["system"]) is not None]
        lines = [f"undecided at these rates: {', '.join(d['system'] for d in top)} (their order flips inside the"
                 f" rates' 95 % intervals, or is within the searches' {out['tolerance']:.0%})"]
        if fac:
            lines.append(f"  break-even: {first['system']}'s rates scaled {', '.join(fac)}")
    lines += [f"  {'=' if d['undecided_with'] else ''}{d['rank']} {d['system']}: {_iv(d)}" for d in met]
    return lines
