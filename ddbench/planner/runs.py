"""One seeded serving run of a scenario at a Poisson arrival rate, its closed-form capacity, and
what binds it.

`run_point(scenario, rate, seed)` runs ddbench.sim.serving on the resolved scenario and returns one flat
row (units in the column names). `capacity(scenario)` is the search's first probe; `binding`
names the limiting resource of a run.

Host memory bounds admission through the run's batch cap: min(--max-batch, the requests whose
pinned host KV fits at the longest context drawn; `Resolved.batch_cap`). Where not one request's
host KV fits, nothing runs and every request counts as rejected (`host_does_not_fit`).

Sustainable: no request was rejected, and the latency of the requests does not grow over the
run: the least-squares slope of completion time against arrival time (`backlog_growth`) is at
most STABLE_SLOPE. Overloaded, the queue grows at (rate - served rate) and that slope is
rate / served rate - 1; stable, it is zero up to noise. P99 limits alone do not catch an
overload when the SLO is on TPOT only (TPOT stays flat once the batch is full).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from functools import lru_cache

from ddbench.core.memory import CATEGORIES, max_batch
from ddbench.core.units import GB
from ddbench.planner.fleet import exact_prefill_s
from ddbench.planner.scenario import Scenario, resolve

STABLE_SLOPE = 0.05      # backlog growth above which a run counts as overloaded
SUSTAINABLE_RULE = f"no rejected request and completion-time slope against arrival time <= {STABLE_SLOPE}"
PCTS = (50, 90, 99)      # percentiles every row carries


@lru_cache(maxsize=256)
def workload_means(context: str, output: str, requests: int, seed: int) -> tuple[float, float]:
    """Mean context and output tokens of the requests a run draws (they do not depend on the rate)."""
    from ddbench.sim.serving import draw_requests
    reqs = draw_requests(requests, 1.0, context, output, seed)
    return (sum(r.context for r in reqs) / len(reqs), sum(r.output for r in reqs) / len(reqs))


def _step(sc: Scenario, batch: int, ctx: float):
    from ddbench.sim.run import Point, run
    r = resolve(sc)
    return run(Point(r.design, r.model, r.cm, r.workload, batch, ctx, r.hit, r.reuse, r.lowrank,
                     cache=r.cache_rates), "aggregate")


@lru_cache(maxsize=256)
def capacity(sc: Scenario, seed: int = 0) -> dict:
    """Closed-form upper estimate of the sustainable rate (the search's first probe): the batch
    that fits at the mean context decoding back to back, plus each request's prefill on this GPU:
    rate = 1 / (mean output x step(B) / B + prefill time)."""
    r = resolve(sc)
    ctx, out = workload_means(sc.context, sc.output, sc.requests, seed)
    b = max_batch(r.design, r.model, r.gpu, replace(r.workload, context=max(1, int(round(ctx)))))
    if b < 1 and max_batch(r.design, r.model, r.gpu, r.workload) >= 1:
        b = 1  # the mean request does not fit but the shortest does: the estimate runs one at a time
    b_gpu, host = b, r.host_cap
    if sc.max_batch is not None:
        b = min(b, sc.max_batch)
    if host is not None:
        b = min(b, host)
    bound = ("batch cap" if sc.max_batch is not None and b == sc.max_batch and b < b_gpu else
             "host memory" if host is not None and b == host and host < b_gpu else "gpu memory")
    hb = r.bounds()
    host_info = {"max_batch_gpu": b_gpu, "max_batch_host": host, "bound_by": bound,
                 "host_bytes_per_request": hb.host_bytes_per_request,
                 "host_memory_per_gpu_gb": None if r.host_mem is None else r.host_mem.gb_per_gpu}
    if b < 1:
        return {"max_batch": 0, "rate": 0.0, "ctx": ctx, "out": out, "prefill_s": math.nan, "step_s": math.nan,
                **host_info}
    st = _step(sc, b, ctx + out / 2)
    pre = exact_prefill_s(sc, int(round(ctx))) if sc.prefill == "here" else 0.0
    per_req = out * st.step_s / b + pre
    return {"max_batch": b, "rate": 1.0 / per_req, "ctx": ctx, "out": out, "prefill_s": pre,
            "step_s": st.step_s, "tokens_per_s": b / st.step_s, **host_info}


def binding(sc: Scenario, row: dict, seed: int = 0) -> str:
    """What limits the rate at this run: memory (the batch sits at what fits), compute (prefill)
    (prefill alone keeps the GPU over half busy), else link or compute by the decode step at the
    batch that 90% of the decoding time runs at or below (aggregate model: link seconds against
    compute seconds of one step there; a TPOT limit is set by the larger batches)."""
    cap = capacity(sc, seed)
    if cap["max_batch"] < 1:
        return "host memory" if cap["bound_by"] == "host memory" else "memory"
    if row["mean_batch"] >= 0.85 * cap["max_batch"]:
        if sc.max_batch is not None and sc.max_batch == cap["max_batch"]:
            return "batch cap"
        return "host memory" if cap["bound_by"] == "host memory" else "memory"
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


def backlog_growth(requests) -> float:
    """The least-squares slope of completion time against arrival time over the requests that completed
    (ddbench.sim.serving's requests; rejected ones left out): zero up to noise where the load is sustained,
    rate / served rate - 1 where the queue grows."""
    done = [q for q in requests if not q.rejected]
    return _slope([q.arrival for q in done], [q.latency for q in done])


def queue_grows(growth: float) -> bool:
    """Whether a run's backlog growth says it is overloaded (above STABLE_SLOPE)."""
    return growth > STABLE_SLOPE


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


def weights_do_not_fit(r, n: int) -> dict | None:
    """Where the weights and runtime overhead alone exceed the GPU (no run can start): the serving summary
    of `n` requests, every one rejected, with the reason; else None."""
    static = r.model.weight_bytes + r.gpu.runtime_overhead_bytes
    if static <= r.gpu.hbm_bytes:
        return None
    why = (f"the weights and runtime overhead ({static / GB:.1f} GB) do not fit in the GPU's"
           f" {r.gpu.hbm_bytes / GB:.1f} GB")
    none = ("tokens_per_s", "completion_p50_s", "completion_p99_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
            "tpot_p99_s")
    return {"status": "nothing-fits", "reason": why, "requests": n, "completed": 0, "rejected": n,
            "output_tokens": 0, **{k: None for k in none}, "mean_batch": 0.0, "decode_steps": 0,
            "link_utilisation": 0.0, "h2d_bytes": 0.0, "peak_memory_bytes": static, "capacity_bytes": r.gpu.hbm_bytes,
            "makespan_s": 0.0, "reasons": {k: why for k in none}}


def host_does_not_fit(r, n: int) -> dict | None:
    """Where not one request's host KV fits in the host memory for this GPU: the serving summary of `n`
    requests, every one rejected, with the reason; else None."""
    why = r.host_too_small()
    if why is None:
        return None
    none = ("tokens_per_s", "completion_p50_s", "completion_p99_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
            "tpot_p99_s")
    static = r.model.weight_bytes + r.gpu.runtime_overhead_bytes
    return {"status": "nothing-fits", "reason": why, "requests": n, "completed": 0, "rejected": n,
            "output_tokens": 0, **{k: None for k in none}, "mean_batch": 0.0, "decode_steps": 0,
            "link_utilisation": 0.0, "h2d_bytes": 0.0, "peak_memory_bytes": static, "capacity_bytes": r.gpu.hbm_bytes,
            "makespan_s": 0.0, "reasons": {k: why for k in none}}


def run_point(sc: Scenario, rate: float, seed: int = 0, pcts: tuple = ()) -> dict:
    """One seeded serving run at `rate` requests/s -> a flat row (no NaN: missing values are None).
    Where the weights alone do not fit, or not one request's host KV fits in host memory, nothing runs
    and every request counts as rejected. Admission is capped by `Resolved.batch_cap` (--max-batch and
    host memory)."""
    from ddbench.sim.serving import ServingOptions, draw_requests, run_serving
    from ddbench.core.stats import percentile
    t0, c0 = time.perf_counter(), time.process_time()
    r = resolve(sc)
    reqs = draw_requests(sc.requests, rate, sc.context, sc.output, seed)
    s = weights_do_not_fit(r, len(reqs)) or host_does_not_fit(r, len(reqs))
    if s is None:
        res = run_serving(r.design, r.model, r.gpu, r.cm, r.workload, reqs, r.hit, r.reuse, sc.prefill == "here",
                          ServingOptions(r.batch_cap, r.lowrank, r.cache_rates))
        s, done, segments, peaks = res.summary(), [q for q in res.requests if not q.rejected], res.segments, \
            res.peak_by_category
    else:
        done, segments, peaks = [], [], {}
    # prefill elsewhere: each request's prefill on a prefill GPU and its KV's transfer come before the decode side
    # admits it (ddbench.planner.fleet), in its TTFT and completion
    if sc.prefill == "elsewhere" and done:
        from ddbench.planner.fleet import offsets
        off = offsets(sc, [q.context for q in done])
    else:
        off = [0.0] * len(done)
    series = {"completion": sorted(q.latency + o for q, o in zip(done, off)),
              "ttft": sorted(q.ttft + o for q, o in zip(done, off)),
              "tpot": sorted(q.tpot for q in done if q.output > 1)}
    growth = backlog_growth(done)
    row = {"rate_req_per_s": rate, "seed": seed, "requests": s["requests"], "completed": s["completed"],
           "rejected": s["rejected"], "tokens_per_s": s["tokens_per_s"],
           "req_per_s_served": s["completed"] / s["makespan_s"] if s["makespan_s"] else None}
    for name, xs in series.items():
        for p in sorted(set(PCTS) | set(pcts)):
            pn = str(int(p)) if float(p).is_integer() else str(p).replace(".", "_")
            row[f"{name}_p{pn}_s"] = percentile(xs, p)
    row.update({"mean_batch": s["mean_batch"], "batch_p90": _batch_p90(segments),
                "link_utilisation": s["link_utilisation"],
                "link_gbps_per_gpu": r.link.achievable_gbps, "h2d_gb": s["h2d_bytes"] / GB,
                "peak_memory_gb": s["peak_memory_bytes"] / GB, "capacity_gb": s["capacity_bytes"] / GB,
                **{f"peak_{c}_gb": peaks.get(c, 0.0) / GB for c in CATEGORIES},
                "backlog_growth": growth,
                "sustainable": bool(s["rejected"] == 0 and not queue_grows(growth) and s["completed"] > 0),
                "cost_model": cost_model_kind(r.cm), "sim_wall_s": time.perf_counter() - t0,
                "sim_cpu_s": time.process_time() - c0})
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def cost_model_kind(cm) -> str:
    notes = " ".join(cm.notes)
    if "ROOFLINE: no calibration" in notes:
        return "roofline"
    kind = f"scaled from {cm.source_gpu.name}" if cm.scaled else f"measured {cm.source_gpu.name}"
    return kind + (" + scaled link" if "SCALED link" in notes else "")

