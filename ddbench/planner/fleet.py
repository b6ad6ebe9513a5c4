"""The prefill side of a disaggregated fleet (`--prefill elsewhere`): what a decode GPU's requests cost
the GPUs that prefill them, and the TTFT of the whole path.

    prefill_s(sc, ctx)    GPU seconds to prefill one request of `ctx` tokens on a prefill GPU: the same
                          chunked-prefill pricing as `--prefill here` (ddbench.sim.steplayers.prefill_chunk_s on the
                          scenario's cost model: the same GPU kind, bundle and design, the SVD of the
                          low-rank designs included), without a decode step beside it; exact_prefill_s(sc,
                          ctx) the same at one context, never interpolated (ddbench.planner.runs's too)
    transfer_s(sc, ctx)   seconds to ship that request's KV to the decode host: the bytes the decode side
                          keeps for it (its host KV, ddbench.core.memory.host_kv_bytes, plus its GPU-resident
                          KV, landmarks and auxiliary residency) over one of the scenario's links, unshared
                          (a GPUDirect RDMA NIC on the same PCIe generation), not overlapped with the prefill:
                          an upper bound
    fleet(sc, rate, ...)  prefill GPUs per decode GPU at a prefill utilisation of PREFILL_UTILISATION, GPUs per
                          req/s of the whole fleet, and the P99 wait for a prefill GPU: an M/G/c FCFS queue of
                          the run's drawn requests, c the prefill GPUs of the fleet for --target-rate (else of
                          one decode GPU's load), served at the Poisson rate

A serving run with prefill elsewhere (ddbench.planner.runs.run_point) adds prefill_s + transfer_s to each
request's TTFT and completion, so the SLO terms see them; the fleet's P99 TTFT adds the prefill queue's
P99 wait to that (the sum of two P99s: an upper bound). Under tensor parallelism a replica, decode or prefill,
is sc.tp GPUs: the rates and prefill times are per replica, the GPU counts and rates per GPU are in GPUs.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace
from functools import lru_cache

from ddbench.planner.scenario import Scenario, resolve

PREFILL_UTILISATION = 0.8   # the prefill GPUs' target load (sized so that their queue stays short)
GRID = 17                   # contexts at which a distribution's prefill time is priced (linear in between)


@lru_cache(maxsize=256)
def exact_prefill_s(sc: Scenario, ctx: int) -> float:
    """GPU seconds of one request's chunked prefill of exactly `ctx` tokens (`--prefill here` prices the same)."""
    from ddbench.sim.steplayers import prefill_chunk_s
    r = resolve(sc)
    tot, p = 0.0, 0
    while p < ctx:
        c = min(r.workload.prefill_chunk, ctx - p)
        tot += prefill_chunk_s(r.design, r.model, r.cm, r.workload, c, p, p + c >= ctx, ctx)[0]
        p += c
    return tot


@lru_cache(maxsize=256)
def _grid(sc: Scenario, hi: int) -> tuple:
    lo = sc.contexts.low or 1
    if hi <= lo:
        return ((hi, exact_prefill_s(sc, hi)),)
    xs = sorted({round(lo + (hi - lo) * i / (GRID - 1)) for i in range(GRID)})
    return tuple((x, exact_prefill_s(sc, x)) for x in xs)


def prefill_s(sc: Scenario, ctx: int, hi: int | None = None) -> float:
    """GPU seconds of one request's prefill of `ctx` tokens on a prefill GPU (interpolated on a grid of GRID
    contexts up to `hi` for a distribution, exact for a fixed context)."""
    lo_c, hi_c = sc.contexts.low, sc.contexts.high
    if lo_c is not None and lo_c == hi_c:
        return exact_prefill_s(sc, int(ctx))
    pts = _grid(sc, int(hi or hi_c or ctx))
    if ctx <= pts[0][0] or len(pts) == 1:
        return pts[0][1] * ctx / pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if ctx <= x1:
            return y0 + (y1 - y0) * (ctx - x0) / (x1 - x0)
    return pts[-1][1] * ctx / pts[-1][0]


def transfer_link(sc: Scenario):
    """The link the KV crosses to the decode host: the scenario's (or its host's, or the GPU's usual), unshared."""
    from ddbench.core.catalog import get_host, get_link
    r = resolve(sc)
    name = sc.link or (get_host(sc.host).link if sc.host is not None else r.gpu.default_link)
    return get_link(name)


@lru_cache(maxsize=1024)
def transfer_bytes(sc: Scenario, ctx: int) -> int:
    """What the decode side keeps for one request of `ctx` prompt tokens: host KV plus per-request GPU bytes."""
    from ddbench.core.memory import host_kv_bytes, memory_breakdown
    r = resolve(sc)
    w = replace(r.workload, context=max(int(ctx), r.workload.budget if not r.design.kv_on_gpu else 1))
    one, none = (memory_breakdown(r.design, r.model, r.gpu, replace(w, batch=b)) for b in (1, 0))
    per_req = sum(getattr(one, c) - getattr(none, c) for c in ("resident_kv", "landmarks", "aux_residency"))
    return int(host_kv_bytes(r.design, r.model, w) + max(0, per_req))


def transfer_s(sc: Scenario, ctx: int) -> float:
    return transfer_bytes(sc, int(ctx)) / (transfer_link(sc).achievable_gbps * 1e9)


def offsets(sc: Scenario, contexts) -> list[float]:
    """Per request: prefill_s + transfer_s, what a prefill elsewhere adds to its TTFT and completion."""
    hi = max(contexts) if contexts else None
    return [prefill_s(sc, c, hi) + transfer_s(sc, c) for c in contexts]


def pool_waits(arrivals, services, gpus: int) -> list[float]:
    """Waits of an FCFS queue with `gpus` servers (M/G/c where the arrivals are Poisson)."""
    free = [0.0] * max(1, gpus)
    heapq.heapify(free)
    out = []
    for a, s in zip(arrivals, services):
        t = heapq.heappop(free)
        start = max(a, t)
        out.append(start - a)
        heapq.heappush(free, start + s)
    return out


def fleet(sc: Scenario, rate: float, ttft_p99_s: float | None, seed: int = 0,
          target_rate: float | None = None) -> dict:
    """The prefill side of a decode GPU serving `rate` req/s (see the module's text); `ttft_p99_s`: the run's P99
    TTFT (decode wait + prefill + transfer)."""
    from ddbench.core.stats import percentile
    from ddbench.sim.serving import draw_requests
    load = target_rate if target_rate is not None else rate
    reqs = draw_requests(sc.requests, load, sc.context, sc.output, seed)
    hi = max(q.context for q in reqs)
    pre = [prefill_s(sc, q.context, hi) for q in reqs]
    xfer = [transfer_s(sc, q.context) for q in reqs]
    mean_pre = sum(pre) / len(pre)
    tp = sc.tp     # a replica (decode or prefill) is tp GPUs: `rate` and the prefill times are per replica
    per_decode = rate * mean_pre / PREFILL_UTILISATION
    pool = max(1, math.ceil(load * mean_pre / PREFILL_UTILISATION - 1e-9))
    waits = pool_waits([q.arrival for q in reqs], pre, pool)
    out = {"prefill_s_mean": mean_pre, "prefill_s_p99": percentile(pre, 99),
           "transfer_s_p99": percentile(xfer, 99), "transfer_gb_mean": sum(transfer_bytes(sc, q.context)
                                                                            for q in reqs) / len(reqs) / 1e9,
           "transfer_link": transfer_link(sc).name, "transfer_gbps": transfer_link(sc).achievable_gbps,
           "prefill_utilisation": PREFILL_UTILISATION, "prefill_gpus_per_decode_gpu": per_decode,
           "gpus_per_req_per_s": tp * (1.0 + per_decode) / rate,
           "fleet_req_per_s_per_gpu": rate / (1.0 + per_decode) / tp,
           "prefill_pool_gpus": pool * tp, "prefill_pool_load_req_per_s": load,
           "prefill_wait_p99_s": percentile(waits, 99),
           "fleet_ttft_p99_s": None if ttft_p99_s is None else ttft_p99_s + percentile(waits, 99)}
    if target_rate is not None:
        decode = max(1, math.ceil(target_rate / rate - 1e-9)) * tp
        out |= {"decode_gpus": decode, "prefill_gpus": pool * tp, "fleet_gpus": decode + pool * tp}
    return out


RULE = (f"prefill GPUs: the same GPU and cost model, sized to {PREFILL_UTILISATION:.0%} load; TTFT = the decode"
        " side's wait + prefill + the KV's transfer to the decode host (not overlapped) + the prefill queue's P99"
        " wait")
