"""The highest sustainable Poisson arrival rate that meets every SLO: a bracketed search.

A probe at rate r runs the simulator once per seed (the same seeds at every rate: with one seed
the arrival times scale exactly with 1 / r and the drawn lengths stay the same, so probes differ
only in the rate). It passes when every seed's run is sustainable (runs.STABLE_SLOPE) and
meets every SLO term.

1. First probe: the closed-form capacity (runs.capacity), an upper estimate.
2. Bracket: passing, double the rate until a probe fails; failing, divide by 4 until one passes.
   Nothing passes down to capacity / FLOOR_DIVISOR (the GPU nearly idle): no rate meets the SLO,
   and the lowest probe's values say by how much.
3. Bisect in log space until hi / lo <= 1 + tol.
At most `max_runs` simulator runs (probes x seeds); the answer is lo (the highest rate that
passed) with the bracket [lo, hi] and the tolerance it reached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddbench.planner.runs import binding, capacity, run_point
from ddbench.planner.scenario import Scenario
from ddbench.planner.slo import SLO, violations

FLOOR_DIVISOR = 1024.0


@dataclass
class SearchResult:
    scenario: Scenario
    slos: list
    seeds: tuple
    tol: float
    max_runs: int
    rate: float = 0.0                 # highest rate that passed (0: none)
    hi: float = math.inf              # lowest rate that failed (inf: none failed)
    row: dict | None = None           # the first seed's run at `rate`
    probes: list = field(default_factory=list)   # (rate, passed, [rows per seed], reasons)
    capacity: dict = field(default_factory=dict)
    status: str = ""                  # "met" | "none" (no rate meets) | "no fit" (not one request fits)
    binding: str = ""
    limit: str = ""                   # what failed at hi: SLO terms or "queue grows"

    @property
    def runs(self) -> int:
        return sum(len(p[2]) for p in self.probes)

    @property
    def reached_tol(self) -> float:
        return self.hi / self.rate - 1 if self.rate > 0 and math.isfinite(self.hi) else math.inf

    def lowest(self) -> tuple:
        return min(self.probes, key=lambda p: p[0]) if self.probes else None


def _reasons(rows: list[dict], slos: list[SLO]) -> list[str]:
    out = []
    for r in rows:
        for v in violations(r, slos):
            if v not in out:
                out.append(v)
        if not r["sustainable"] and "queue grows" not in out:
            out.append("rejected requests" if r["rejected"] else "queue grows")
    return out


def max_rate(sc: Scenario, slos: list[SLO], seeds: tuple = (0,), tol: float = 0.05, max_runs: int = 12,
             runner=run_point) -> SearchResult:
    res = SearchResult(sc, slos, tuple(seeds), tol, max_runs)
    cap = capacity(sc, seeds[0])
    res.capacity = cap
    if cap["max_batch"] < 1:
        host = cap.get("bound_by") == "host memory"
        res.status, res.binding = "no fit", "host memory" if host else "memory"
        res.limit = f"not one request fits in {'host' if host else 'GPU'} memory"
        return res
    pcts = tuple(sorted({s.pct for s in slos}))
    cache: dict = {}

    def probe(rate: float):
        if rate in cache:
            return cache[rate]
        rows = [runner(sc, rate, seed, pcts) for seed in seeds]
        why = _reasons(rows, slos)
        cache[rate] = (not why, rows, why)
        res.probes.append((rate, not why, rows, why))
        return cache[rate]

    def budget_left() -> bool:
        return res.runs + len(seeds) <= max_runs

    r0 = cap["rate"]
    ok, rows, why = probe(r0)
    lo, hi = (r0, math.inf) if ok else (0.0, r0)
    floor = r0 / FLOOR_DIVISOR
    while budget_left():
        if lo == 0.0:
            r = hi / 4
            if r < floor:
                break
        elif math.isinf(hi):
            r = lo * 2
        else:
            if hi / lo <= 1 + tol:
                break
            r = math.sqrt(lo * hi)
        ok, rows, why = probe(r)
        if ok:
            lo = r
        else:
            hi = r
    res.rate, res.hi = lo, hi
    if lo > 0:
        res.status = "met"
        res.row = cache[lo][1][0]
        res.binding = binding(sc, res.row, seeds[0])
        res.limit = ", ".join(cache[hi][2]) if hi in cache else "not reached within the run budget"
    else:
        res.status = "none"
        low = res.lowest()
        res.row = low[2][0]
        res.limit = ", ".join(low[3])
    return res
