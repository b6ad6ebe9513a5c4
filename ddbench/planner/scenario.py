"""One serving configuration, and one seeded simulator run of it at a Poisson arrival rate.

`Scenario` names everything but the rate and the seed: model, GPU, link, host sharing, design,
the sparse-KV buffer layout, workload distributions, knobs, hit rate, where prefill runs.
`run_point(scenario, rate, seed)` runs sim.serving on it and returns one flat row (units in the
column names). Cost models, hit rates and memory are cached per process, so a worker that runs
many points of the same hardware builds them once.

Sustainable: no request was rejected, and the latency of the requests does not grow over the
run: the least-squares slope of completion time against arrival time (`backlog_growth`) is at
most STABLE_SLOPE. Overloaded, the queue grows at (rate - served rate) and that slope is
rate / served rate - 1; stable, it is zero up to noise. P99 limits alone do not catch an
overload when the SLO is on TPOT only (TPOT stays flat once the batch is full).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

from ddbench.core.catalog import fetch_share, get_gpu, get_host, get_link, get_model, shared_link
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import CATEGORIES, Workload, max_batch
from ddbench.core.systems import get_system
from ddbench.core.units import GB, parse_tokens

STABLE_SLOPE = 0.05      # backlog growth above which a run counts as overloaded
PCTS = (50, 90, 99)      # percentiles every row carries
CACHES = ("design", "pingpong", "per-layer")


@dataclass(frozen=True)
class Scenario:
    model: str
    gpu: str
    system: str
    context: str = "128k"
    output: str = "256"
    link: str | None = None           # None: the GPU's usual link (or the host's)
    host: str | None = None           # multi-GPU host sharing switches and DRAM; None: the GPU alone
    fetching: int | None = None       # GPUs of the host fetching at once (None: all of them)
    budget: int = 2048
    chunk: int = 8
    rank: int = 160
    lowrank_layers: int = 0
    cache: str = "design"             # sparse-KV buffers: the design's own, or pingpong / per-layer
    hit_rate: float | str | None = None
    prefill: str = "here"             # "here" (chunked, beside decode) or "elsewhere" (disaggregated)
    requests: int = 1000
    max_batch: int | None = None
    calibration: str | None = None
    roofline: bool = False

    def label(self) -> str:
        """The design's name, with [cache] where the buffer layout is not the design's own."""
        return _system(self.system, self.cache).name


@dataclass
class Resolved:
    model: object
    gpu: object
    link: object
    share: object
    system: object
    workload: Workload
    cm: object
    hit: list
    reuse: list
    hit_note: str


def _system(name: str, cache: str):
    sysx = get_system(name)
    if cache not in CACHES:
        raise DDBenchError(f"unknown cache '{cache}'; known: {', '.join(CACHES)}")
    if cache == "design" or sysx.kv_on_gpu:
        return sysx
    layers = "pingpong" if cache == "pingpong" else "all"
    return sysx if layers == sysx.buffer_layers else replace(sysx, name=f"{sysx.name}[{cache}]", buffer_layers=layers)


@lru_cache(maxsize=64)
def _cost_model(model: str, gpu: str, link, calibration, roofline):
    from sim.setup import cost_model
    return cost_model(model, gpu, link, calibration, roofline)


@lru_cache(maxsize=64)
def _hits(spec, model: str, layers: int):
    from sim import profile
    hit, reuse, note = profile.resolve(spec, model, layers)
    return tuple(hit), tuple(reuse), note


@lru_cache(maxsize=256)
def resolve(sc: Scenario) -> Resolved:
    m, g = get_model(sc.model), get_gpu(sc.gpu)
    share = None
    if sc.host is not None:
        host = get_host(sc.host)
        link = get_link(sc.link or host.link)
        share = fetch_share(host, sc.fetching, link.name)
        link = shared_link(link, share)
    else:
        if sc.fetching is not None:
            raise DDBenchError("GPUs fetching at once needs a host (--host)")
        link = get_link(sc.link or g.default_link)
    sysx = _system(sc.system, sc.cache)
    if sc.prefill not in ("here", "elsewhere"):
        raise DDBenchError(f"prefill must be 'here' or 'elsewhere', got '{sc.prefill}'")
    if sc.requests < 1:
        raise DDBenchError(f"requests must be at least 1, got {sc.requests}")
    if sc.max_batch is not None and sc.max_batch < 1:
        raise DDBenchError(f"max batch must be at least 1, got {sc.max_batch}")
    lo_ctx = _min_context(sc.context)
    w = Workload(context=max(lo_ctx, sc.budget) if sysx.kv_on_gpu else lo_ctx, budget=sc.budget, chunk=sc.chunk,
                 rank=sc.rank, lowrank_layers=sc.lowrank_layers)
    w.validate(m)
    cm = _cost_model(m.name if os.sep not in sc.model else sc.model, g.name, link, sc.calibration, sc.roofline)
    hit, reuse, note = _hits(sc.hit_rate, m.name, m.num_layers)
    return Resolved(m, g, link, share, sysx, w, cm, list(hit), list(reuse), note)


def _min_context(spec: str) -> int:
    """Smallest context a distribution can draw (for the budget check): LO of uniform, 1 for exp."""
    s = str(spec).strip().lower()
    if s.startswith("uniform:"):
        parts = s.split(":")
        if len(parts) != 3:
            raise DDBenchError(f"cannot parse context '{spec}': use uniform:LO:HI")
        return parse_tokens(parts[1], "context")
    if s.startswith("exp:"):
        raise DDBenchError(f"context '{spec}': an exponential context can fall below the sparse budget;"
                           " use a fixed context or uniform:LO:HI")
    return parse_tokens(s, "context")


@lru_cache(maxsize=256)
def workload_means(context: str, output: str, requests: int, seed: int) -> tuple[float, float]:
    """Mean context and output tokens of the requests a run draws (they do not depend on the rate)."""
    from sim.serving import draw_requests
    reqs = draw_requests(requests, 1.0, context, output, seed)
    return (sum(r.context for r in reqs) / len(reqs), sum(r.output for r in reqs) / len(reqs))


@lru_cache(maxsize=256)
def _prefill_s(sc: Scenario, ctx: int) -> float:
    from sim.plan import prefill_chunk_s
    r = resolve(sc)
    tot, p = 0.0, 0
    while p < ctx:
        c = min(r.workload.prefill_chunk, ctx - p)
        tot += prefill_chunk_s(r.system, r.model, r.cm, r.workload, c, p, p + c >= ctx, ctx)[0]
        p += c
    return tot


def _step(sc: Scenario, batch: int, ctx: float):
    from sim.aggregate import aggregate_step
    from sim.plan import step_plan
    r = resolve(sc)
    return aggregate_step(step_plan(r.system, r.model, r.cm, r.workload, batch, ctx, r.hit, r.reuse))


@lru_cache(maxsize=256)
def capacity(sc: Scenario, seed: int = 0) -> dict:
    """Closed-form upper estimate of the sustainable rate (the search's first probe): the batch
    that fits at the mean context decoding back to back, plus each request's prefill on this GPU:
    rate = 1 / (mean output x step(B) / B + prefill time)."""
    r = resolve(sc)
    ctx, out = workload_means(sc.context, sc.output, sc.requests, seed)
    b = max_batch(r.system, r.model, r.gpu, replace(r.workload, context=max(1, int(round(ctx)))))
    if b < 1 and max_batch(r.system, r.model, r.gpu, r.workload) >= 1:
        b = 1  # the mean request does not fit but the shortest does: the estimate runs one at a time
    if sc.max_batch is not None:
        b = min(b, sc.max_batch)
    if b < 1:
        return {"max_batch": 0, "rate": 0.0, "ctx": ctx, "out": out, "prefill_s": math.nan, "step_s": math.nan}
    st = _step(sc, b, ctx + out / 2)
    pre = _prefill_s(sc, int(round(ctx))) if sc.prefill == "here" else 0.0
    per_req = out * st.step_s / b + pre
    return {"max_batch": b, "rate": 1.0 / per_req, "ctx": ctx, "out": out, "prefill_s": pre,
            "step_s": st.step_s, "tokens_per_s": b / st.step_s}


def binding(sc: Scenario, row: dict, seed: int = 0) -> str:
    """What limits the rate at this run: memory (the batch sits at what fits), compute (prefill)
    (prefill alone keeps the GPU over half busy), else link or compute by the decode step at the
    batch that 90% of the decoding time runs at or below (aggregate model: link seconds against
    compute seconds of one step there; a TPOT limit is set by the larger batches)."""
    cap = capacity(sc, seed)
    if cap["max_batch"] < 1:
        return "memory"
    if row["mean_batch"] >= 0.85 * cap["max_batch"]:
        return "batch cap" if sc.max_batch is not None and sc.max_batch == cap["max_batch"] else "memory"
    if sc.prefill == "here" and row["rate_req_per_s"] * cap["prefill_s"] >= 0.5:
        return "compute (prefill)"
    st = _step(sc, max(1, int(round(row.get("batch_p90") or row["mean_batch"]))), cap["ctx"] + cap["out"] / 2)
    return "link" if st.link_s >= st.compute_s else "compute"


def _slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 3:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def _batch_p90(segments: list[dict]) -> float:
    """The decode batch that 90% of the decoding time runs at or below (time-weighted)."""
    pts = sorted((seg["batch"], seg["steps"] * seg["step_s"]) for seg in segments if seg["batch"] > 0)
    total = sum(t for _, t in pts)
    acc = 0.0
    for b, t in pts:
        acc += t
        if acc >= 0.9 * total:
            return float(b)
    return 0.0


def run_point(sc: Scenario, rate: float, seed: int = 0, pcts: tuple = ()) -> dict:
    """One seeded serving run at `rate` requests/s -> a flat row (no NaN: missing values are None)."""
    from sim.serving import draw_requests, run_serving
    from ddbench.planner.slo import percentile
    t0, c0 = time.perf_counter(), time.process_time()
    r = resolve(sc)
    reqs = draw_requests(sc.requests, rate, sc.context, sc.output, seed)
    res = run_serving(r.system, r.model, r.gpu, r.cm, r.workload, reqs, r.hit, r.reuse, sc.max_batch,
                      prefill_here=sc.prefill == "here")
    s = res.summary()
    done = [q for q in res.requests if not q.rejected]
    series = {"completion": sorted(q.latency for q in done), "ttft": sorted(q.ttft for q in done),
              "tpot": sorted(q.tpot for q in done if q.output > 1)}
    growth = _slope([q.arrival for q in done], [q.latency for q in done])
    row = {"rate_req_per_s": rate, "seed": seed, "requests": s["requests"], "completed": s["completed"],
           "rejected": s["rejected"], "tokens_per_s": s["tokens_per_s"],
           "req_per_s_served": s["completed"] / s["makespan_s"] if s["makespan_s"] else None}
    for name, xs in series.items():
        for p in sorted(set(PCTS) | set(pcts)):
            pn = str(int(p)) if float(p).is_integer() else str(p).replace(".", "_")
            row[f"{name}_p{pn}_s"] = percentile(xs, p)
    row.update({"mean_batch": s["mean_batch"], "batch_p90": _batch_p90(res.segments), "link_utilisation": s["link_utilisation"],
                "link_gbps_per_gpu": r.link.achievable_gbps, "h2d_gb": s["h2d_bytes"] / GB,
                "peak_memory_gb": s["peak_memory_bytes"] / GB, "capacity_gb": s["capacity_bytes"] / GB,
                **{f"peak_{c}_gb": res.peak_by_category.get(c, 0.0) / GB for c in CATEGORIES},
                "backlog_growth": growth,
                "sustainable": bool(s["rejected"] == 0 and growth <= STABLE_SLOPE and s["completed"] > 0),
                "cost_model": cost_model_kind(r.cm), "sim_wall_s": time.perf_counter() - t0,
                "sim_cpu_s": time.process_time() - c0})
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def cost_model_kind(cm) -> str:
    notes = " ".join(cm.notes)
    if "ROOFLINE: no calibration" in notes:
        return "roofline"
    kind = f"scaled from {cm.source_gpu.name}" if cm.scaled else f"measured {cm.source_gpu.name}"
    return kind + (" + scaled link" if "SCALED link" in notes else "")


def scenario_dict(sc: Scenario) -> dict:
    return asdict(sc)
