"""Every ranking with its margin: by what factor the winner's rates may grow before it loses its place.

    break_even(ranked, search) -> dict | None     (ranked: SearchResults, best first; search(scenarios, keep))
    render(doc, tolerance) -> [lines]             one line per pair (winner, other design)

The winner's rate search is re-run with its rates scaled (Scenario.rate_scale) over GRID: for a chunk
cache its prefetched and urgent chunks per step (the churn and the urgent share's numerator), for
ShadowKV its miss rate (1 - reuse), for DualDecoder and SpeCache their miss rate (1 - hit). The
break-even against another design is where the winner's max rate falls to that design's, interpolated
linearly between the grid's factors; past the grid's last factor it is reported as beyond it. The other
designs keep their own rates. A design with no fetch rates (full-kv) has no break-even.
"""

from __future__ import annotations

from dataclasses import replace

GRID = (1.5, 2.0, 3.0, 4.0)


def _what(design) -> str | None:
    if design.kv_on_gpu:
        return None
    if design.chunk_cache:
        return "prefetched and urgent chunks per step"
    if design.reuse:
        return "miss rate (1 - reuse)"
    return "miss rate (1 - hit)"


def break_even(ranked: list, search) -> dict | None:
    """The winner's max rate over GRID and the factor at which each other met design overtakes it."""
    from ddbench.planner.scenario import resolve
    met = [r for r in ranked if r.status == "met"]
    if len(met) < 2:
        return None
    win = met[0]
    what = _what(resolve(win.scenario).design)
    doc = {"winner": win.scenario.label(), "scaled": what, "grid": [], "pairs": []}
    if what is None:
        return doc
    results = [None] * len(GRID)

    def keep(i, res):
        results[i] = res
    search([replace(win.scenario, rate_scale=f) for f in GRID], keep)
    points = [(1.0, win.rate)] + [(f, r.rate if r.status == "met" else 0.0) for f, r in zip(GRID, results)]
    doc["grid"] = [{"factor": f, "max_rate_req_per_s": rate} for f, rate in points]
    for other in met[1:]:
        doc["pairs"].append({"against": other.scenario.label(), "against_rate_req_per_s": other.rate,
                             "factor": _crossing(points, other.rate)})
    return doc


def _crossing(points, rate: float) -> float | None:
    """The factor where the grid's rate first falls to `rate` (linear between grid points); None: beyond it."""
    for (f0, r0), (f1, r1) in zip(points, points[1:]):
        if r1 <= rate:
            if r0 <= rate:
                return f0
            return f0 + (f1 - f0) * (r0 - rate) / (r0 - r1)
    return None


def render(doc: dict, tolerance: float) -> list[str]:
    if doc["scaled"] is None:
        return [f"break-even: {doc['winner']} fetches nothing, so no fetch rate can move it down the ranking"]
    last = doc["grid"][-1]
    lines = [f"break-even (the winner's {doc['scaled']} scaled, the others' kept; rate searches to within"
             f" {tolerance:.0%}):"]
    for p in doc["pairs"]:
        if p["factor"] is None:
            lines.append(f"  {doc['winner']} over {p['against']}: holds beyond {last['factor']:g}x"
                         f" ({last['max_rate_req_per_s']:.3g} req/s there, against {p['against_rate_req_per_s']:.3g})")
        else:
            lines.append(f"  {doc['winner']} over {p['against']}: flips at {p['factor']:.2g}x"
                         f" (where it falls to {p['against']}'s {p['against_rate_req_per_s']:.3g} req/s)")
    return lines
