"""Serving mode: Poisson arrivals, continuous batching with admission by GPU memory, chunked prefill.

One SimPy process serves the GPU. Each of its events stands for a stretch of identical batch
steps: the batch is fixed between an admission, the end of a prefill and a completion, so the
engine computes how many steps fit before the next such change (or the next arrival that could
be admitted) and advances time by that many step times at once. Every step still counts: each
request gets one token per step, and per-request times are exact at step boundaries.

- Admission: FIFO; a request enters only while GPU memory allows. Memory uses ddbench.core.memory:
  weights and runtime overhead once, per-request bytes (resident KV, landmarks, auxiliary
  residency, sparse KV buffers) for each request's own context, and the activations of the
  batch at its largest context. A request that cannot fit even alone is rejected.
- Prefill: admitted requests are prefilled in chunks of `prefill_chunk` tokens, one chunk per
  iteration beside the decode step of the running batch (its GPU time adds to the step; its KV
  copy to host runs on the D2H direction). The first token comes out of the last chunk: TTFT.
- Decode: step time from `ddbench.sim.aggregate` on the same StepLayers as the timeline, evaluated at the
  batch's mean context at the start of each stretch (contexts grow by one token per step).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from ddbench.core.catalog.gpus import GPUSpec
from ddbench.core.catalog.models import ModelSpec
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import CATEGORIES, Workload, activation_bytes, memory_breakdown
from ddbench.core.designs import DesignSpec
from ddbench.core.distribution import Distribution
from ddbench.core.stats import percentile
from ddbench.sim.aggregate import AggStep, aggregate_step
from ddbench.sim.costmodel import CostModel
from ddbench.sim.steplayers import prefill_chunk_s, step_layers
from ddbench.sim.resources import MemoryLedger

PER_REQUEST = ("resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers")
STEP_GRID = 4096  # tokens between exact step evaluations (serving mode interpolates between them)


@dataclass
class Request:
    rid: int
    arrival: float
    context: int
    output: int
    admitted: float = math.nan
    first_token: float = math.nan
    completion: float = math.nan
    generated: int = 0
    prefilled: int = 0
    rejected: bool = False
    mem: dict = field(default_factory=dict)

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        return (self.completion - self.first_token) / (self.output - 1) if self.output > 1 else math.nan

    @property
    def latency(self) -> float:
        return self.completion - self.arrival


def draw_requests(n: int, rate: float, context: Distribution, output: Distribution, seed: int) -> list[Request]:
    """`n` Poisson arrivals at `rate` per second (seeded), their lengths drawn from the two distributions."""
    if n < 1:
        raise DDBenchError(f"--requests must be at least 1, got {n}")
    if not (rate > 0 and math.isfinite(rate)):
        raise DDBenchError(f"--rate must be positive and finite (requests/s), got {rate}")
    ctx, out = context.sample, output.sample
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        reqs.append(Request(i, t, ctx(rng), out(rng)))
    return reqs


@dataclass
class ServingResult:
    requests: list[Request]
    segments: list[dict]          # one row per event: start, steps, batch, step time, link use, memory
    memory: list[dict]            # memory by category whenever it changed
    peak_memory: float
    peak_by_category: dict
    capacity: int
    sim_end: float
    decode_steps: int
    in_system_integral: float     # integral of the number of requests in the system over time
    link_busy_s: float
    h2d_bytes: float
    notes: list[str]

    def summary(self) -> dict:
        """Tokens/s, percentiles of completion, TTFT and TPOT, mean batch, link use, peak memory.
        A number that does not exist (nothing completed, no request with two tokens) is None, and
        `reasons` says why; `status` is "ok", or "nothing-fits" where every request was rejected."""
        done = [r for r in self.requests if not r.rejected]
        tokens = sum(r.output for r in done)
        t0 = min(r.arrival for r in self.requests)
        span = max(r.completion for r in done) - t0 if done else 0.0
        steps = [s for s in self.segments if s["batch"] > 0]
        wsum = sum(s["steps"] for s in steps)
        lat = [r.latency for r in done]
        tp = [r.tpot for r in done if r.output > 1]
        tt = [r.ttft for r in done]
        reasons = {}
        if not done:
            why = "no request fits in GPU memory" if self.requests else "no requests"
            for k in ("tokens_per_s", "completion_p50_s", "completion_p99_s", "ttft_p50_s", "ttft_p99_s",
                      "tpot_p50_s", "tpot_p99_s"):
                reasons[k] = why
        elif not tp:
            reasons["tpot_p50_s"] = reasons["tpot_p99_s"] = "every completed request has one output token"
        return {
            "status": "ok" if done else "nothing-fits",
            "requests": len(self.requests), "completed": len(done),
            "rejected": sum(r.rejected for r in self.requests),
            "output_tokens": tokens,
            "tokens_per_s": tokens / span if span > 0 else None,
            "completion_p50_s": percentile(lat, 50), "completion_p99_s": percentile(lat, 99),
            "ttft_p50_s": percentile(tt, 50), "ttft_p99_s": percentile(tt, 99),
            "tpot_p50_s": percentile(tp, 50), "tpot_p99_s": percentile(tp, 99),
            "mean_batch": sum(s["batch"] * s["steps"] for s in steps) / wsum if wsum else 0.0,
            "decode_steps": self.decode_steps,
            "link_utilisation": self.link_busy_s / self.sim_end if self.sim_end else 0.0,
            "h2d_bytes": self.h2d_bytes,
            "peak_memory_bytes": self.peak_memory,
            "capacity_bytes": self.capacity,
            "makespan_s": span,
            "reasons": reasons,
        }


class _Model:
    """Memoized per-request bytes, activations and step times of one scenario."""

    def __init__(self, design, m, gpu, cm, w, hit, reuse, lowrank=None, cache=None):
        self.design, self.m, self.gpu, self.cm, self.w, self.hit, self.reuse = design, m, gpu, cm, w, hit, reuse
        self.lowrank, self.cache = lowrank, cache
        self._req, self._act, self._step, self._pre = {}, {}, {}, {}

    def per_request(self, ctx: int) -> dict:
        v = self._req.get(ctx)
        if v is None:
            bd = memory_breakdown(self.design, self.m, self.gpu, replace(self.w, context=ctx, batch=1))
            v = {c: getattr(bd, c) for c in PER_REQUEST}
            self._req[ctx] = v
        return v

    def activations(self, batch: int, ctx: int) -> int:
        key = (batch, ctx)
        v = self._act.get(key)
        if v is None:
            v = activation_bytes(self.design, self.m, replace(self.w, context=ctx, batch=batch))
            self._act[key] = v
        return v

    def _grid_step(self, batch: int, ctx: int) -> AggStep:
        key = (batch, ctx)
        v = self._step.get(key)
        if v is None:
            plan = step_layers(self.design, self.m, self.cm, self.w, batch, ctx, self.hit, self.reuse, self.lowrank,
                               cache=self.cache)
            v = aggregate_step(plan)
            self._step[key] = v
        return v

    def step(self, batch: int, ctx: float) -> AggStep:
        """The step at the batch's mean context, interpolated linearly between exact evaluations on a
        grid of STEP_GRID tokens (with drawn contexts no two batches share a mean context, so
        evaluating each one would build a fresh plan per event). The step time is piecewise linear
        in the context with few kinks: the interpolation is within 5e-5 of the exact value for every
        design (tests/test_sim_honesty.py checks it)."""
        g = STEP_GRID
        k = int(ctx // g)
        lo = self._grid_step(batch, k * g)
        f = ctx / g - k
        if f <= 0.0:
            return lo
        hi = self._grid_step(batch, (k + 1) * g)
        return AggStep(lo.step_s + (hi.step_s - lo.step_s) * f, lo.compute_s + (hi.compute_s - lo.compute_s) * f,
                       lo.link_s + (hi.link_s - lo.link_s) * f, lo.cpu_s + (hi.cpu_s - lo.cpu_s) * f,
                       lo.h2d_bytes + (hi.h2d_bytes - lo.h2d_bytes) * f, lo.d2h_bytes + (hi.d2h_bytes - lo.d2h_bytes) * f)

    def prefill(self, tokens: int, prefix: int, last: bool, ctx: int):
        key = (tokens, prefix, last, ctx if last else 0)
        v = self._pre.get(key)
        if v is None:
            v = prefill_chunk_s(self.design, self.m, self.cm, self.w, tokens, prefix, last, ctx)
            self._pre[key] = v
        return v


@dataclass(frozen=True)
class ServingOptions:
    """What a serving run takes beside the design, the hardware, the requests and the hit rates.
    max_batch: the decode batch's cap (None: memory alone bounds it).
    lowrank: an adaptive design's low-rank key layers (ddbench.sim.steplayers.step_layers), else its worst-predicted.
    cache: a chunk-cache design's rates (ddbench.core.rates.CacheRates).
    progress: called with 1 whenever a request completes or is rejected (a progress bar)."""
    max_batch: int | None = None
    lowrank: frozenset | None = None
    cache: object = None
    progress: object = None


def run_serving(design: DesignSpec, m: ModelSpec, gpu: GPUSpec, cm: CostModel, w: Workload,
                requests: list[Request], hit: list[float], reuse: list[float], prefill_here: bool = True,
                options: ServingOptions = ServingOptions()) -> ServingResult:
    """prefill_here=False: prefill runs on other GPUs (disaggregated, as in DistServe): an admitted
    request joins the decode batch at once with its first token, its prompt's KV already in place
    (TTFT is then the wait for memory alone); memory is accounted as before. options: ServingOptions."""
    max_batch = options.max_batch
    _check_inputs(design, w, requests, max_batch)
    mdl = _Model(design, m, gpu, cm, w, hit, reuse, options.lowrank, options.cache)
    ledger = MemoryLedger(gpu.hbm_bytes, {"weights": m.weight_bytes, "runtime_overhead": gpu.runtime_overhead_bytes})
    server = _Server(mdl, ledger, w.prefill_chunk, requests, max_batch, prefill_here,
                     options.progress or (lambda n: None))
    return server.run(list(cm.notes))


def _check_inputs(design: DesignSpec, w: Workload, requests: list[Request], max_batch: int | None) -> None:
    """A one-line DDBenchError for no requests, a bad batch cap, or a context below the sparse budget."""
    if not requests:
        raise DDBenchError("no requests to serve")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise DDBenchError(f"--max-batch must be at least 1, got {max_batch}")
    for r in requests:
        if r.context < w.budget and not design.kv_on_gpu:
            raise DDBenchError(f"request {r.rid}: context {r.context} is smaller than the sparse budget {w.budget}")


class _Server:
    """One serving run: the arrival process and the GPU's engine process (SimPy), the waiting and
    prefill queues, the decode batch, GPU memory, and the counters the ServingResult reports.

    The decode batch is kept incrementally: `G` counts decode steps so far; a request that entered
    decoding with one token when the count was G0 holds generated = G - off (off = G0 - 1) tokens and
    finishes at G = off + output (a heap); `dec_sum` = sum of (context - off) over them."""

    def __init__(self, mdl: _Model, ledger: MemoryLedger, prefill_chunk: int, requests: list[Request],
                 max_batch: int | None, prefill_here: bool, tick):
        self.env = simpy.Environment()
        self.mdl, self.ledger, self.prefill_chunk = mdl, ledger, prefill_chunk
        self.max_batch, self.prefill_here, self.tick = max_batch, prefill_here, tick
        self.reqs = sorted(requests, key=lambda r: r.arrival)
        self.waiting: deque = deque()
        self.prefill: deque = deque()
        self.dec_heap: list = []
        self.dec_n = self.dec_sum = self.G = 0
        self.ctx_count: dict = {}      # contexts of the active requests (prefill + decoding) -> count
        self.cmax = 0                  # their maximum
        self.segments: list[dict] = []
        self.memory_rows: list[dict] = []
        self.wake = None               # the engine's idle event, while it waits for an arrival
        self.act = 0.0                 # activation bytes held now
        self.in_sys, self.last_t, self.integral = 0, 0.0, 0.0
        self.busy, self.h2d, self.steps, self.arrived = 0.0, 0.0, 0, 0

    def run(self, notes: list[str]) -> ServingResult:
        env = self.env
        env.process(self.arrivals())
        proc = env.process(self.engine())
        env.run(until=proc)
        self.count(0)
        ledger = self.ledger
        return ServingResult(self.reqs, self.segments, self.memory_rows, ledger.peak, ledger.peak_by_cat,
                             ledger.capacity, env.now, self.steps, self.integral, self.busy, self.h2d, notes)

    # -- requests in the system, contexts, memory

    def count(self, delta: int) -> None:
        """Requests in the system change by `delta` now (their integral over time is kept)."""
        now = self.env.now
        self.integral += self.in_sys * (now - self.last_t)
        self.last_t = now
        self.in_sys += delta

    def n_active(self) -> int:
        return len(self.prefill) + self.dec_n

    def activate(self, ctx: int) -> None:
        self.ctx_count[ctx] = self.ctx_count.get(ctx, 0) + 1
        if ctx > self.cmax:
            self.cmax = ctx

    def deactivate(self, ctx: int) -> None:
        c = self.ctx_count[ctx] - 1
        if c:
            self.ctx_count[ctx] = c
        else:
            del self.ctx_count[ctx]
            if ctx == self.cmax:
                self.cmax = max(self.ctx_count) if self.ctx_count else 0

    def need(self, extra: Request) -> float:
        """Bytes the batch would hold with `extra` admitted."""
        per = sum(self.mdl.per_request(extra.context).values())
        c = extra.context if extra.context > self.cmax else self.cmax
        return self.ledger.total - self.act + per + self.mdl.activations(self.n_active() + 1, c)

    def set_activations(self) -> None:
        n = self.n_active()
        new = self.mdl.activations(n, self.cmax) if n else 0.0
        if self.act:
            self.ledger.free("activations", self.act)
        self.ledger.alloc("activations", new)
        self.act = new

    def snapshot(self) -> None:
        ledger = self.ledger
        self.memory_rows.append({"time_s": self.env.now, **{c: ledger.by_cat.get(c, 0.0) for c in CATEGORIES},
                                 "total": ledger.total})

    # -- a request's life: arrival, admission, first token, completion

    def arrivals(self):
        env = self.env
        for r in self.reqs:
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            self.waiting.append(r)
            self.arrived += 1
            self.count(+1)
            if self.wake is not None and not self.wake.triggered:
                self.wake.succeed()

    def admit(self) -> None:
        """Admit the queue's head while memory (and the batch cap) allows; reject a request that cannot
        fit even alone."""
        changed = False
        while self.waiting:
            r = self.waiting[0]
            if self.max_batch is not None and self.n_active() >= self.max_batch:
                break
            if self.need(r) <= self.ledger.capacity:
                self.waiting.popleft()
                self._enter(r)
                changed = True
            elif not self.n_active():
                self.waiting.popleft()  # cannot fit even alone
                r.rejected = True
                self.count(-1)
                self.tick(1)
            else:
                break
        if changed:
            self.snapshot()

    def _enter(self, r: Request) -> None:
        """r is admitted now: its memory is held, and it queues for prefill (or, prefilled elsewhere,
        decodes at once)."""
        r.admitted = self.env.now
        r.mem = self.mdl.per_request(r.context)
        for c, v in r.mem.items():
            self.ledger.alloc(c, v)
        self.activate(r.context)
        if self.prefill_here:
            self.prefill.append(r)
        else:
            r.prefilled = r.context
            self.start_decoding(r)
        self.set_activations()

    def start_decoding(self, r: Request) -> None:
        """r has its first token now: it joins the decode batch (or is done)."""
        r.first_token = self.env.now
        r.generated = 1
        if r.generated >= r.output:
            self.finish(r)
            return
        off = self.G - 1
        heapq.heappush(self.dec_heap, (off + r.output, r.rid, r, off))
        self.dec_n += 1
        self.dec_sum += r.context - off

    def finish(self, r: Request) -> None:
        r.completion = self.env.now
        for c, v in r.mem.items():
            self.ledger.free(c, v)
        self.deactivate(r.context)
        self.count(-1)
        self.tick(1)

    # -- the GPU

    def engine(self):
        """The GPU's process: per event, one prefill chunk beside a decode step, or a stretch of
        identical decode steps up to the next change of the batch."""
        self.snapshot()
        while True:
            self.admit()
            b = self.dec_n
            if not self.prefill and not b:
                if self.arrived == len(self.reqs) and not self.waiting:
                    return
                self.wake = self.env.event()
                yield self.wake
                self.wake = None
                continue
            G = self.G
            step = self.mdl.step(b, (self.dec_sum + b * G) / b) if b else None
            t_start = self.env.now
            if self.prefill:
                t, prefill_tokens = yield from self._prefill_chunk(step)
                steps = 1
            else:
                t, steps = yield from self._decode_stretch(step, G)
                prefill_tokens = 0
            self._record(t_start, step, steps, b, t, prefill_tokens)
            if b:
                G = self.G = G + steps
            done = self._retire(G)
            if self.prefill and self.prefill[0].prefilled >= self.prefill[0].context:
                self.start_decoding(self.prefill.popleft())
            if done or not self.dec_n or (prefill_tokens and not self.prefill):
                self.set_activations()
                self.snapshot()

    def _prefill_chunk(self, step: AggStep | None):
        """The prefill queue head's next chunk, beside one decode step of the batch (if any) -> (its
        time, the chunk's tokens)."""
        r = self.prefill[0]
        chunk = min(self.prefill_chunk, r.context - r.prefilled)
        last = r.prefilled + chunk >= r.context
        gpu_s, d2h_s = self.mdl.prefill(chunk, r.prefilled, last, r.context)
        t = max((step.step_s if step else 0.0) + gpu_s, d2h_s)
        yield self.env.timeout(t)
        r.prefilled += chunk
        return t, chunk

    def _decode_stretch(self, step: AggStep, G: int):
        """Identical decode steps until the next completion, or the next arrival that could be
        admitted -> (the step time, the steps)."""
        t = step.step_s
        steps = self.dec_heap[0][0] - G
        nxt = self.reqs[self.arrived] if self.arrived < len(self.reqs) else None
        if self.waiting:
            nxt = None  # the queue head waits for memory: nothing changes before a completion
        if nxt is not None and self.need(nxt) <= self.ledger.capacity and \
                (self.max_batch is None or self.n_active() < self.max_batch):
            steps = max(1, min(steps, math.ceil((nxt.arrival - self.env.now) / t - 1e-12)))
        yield self.env.timeout(steps * t)
        return t, steps

    def _record(self, t_start: float, step: AggStep | None, steps: int, b: int, t: float,
                prefill_tokens: int) -> None:
        """The event's counters (decode steps, link time, H2D bytes) and its segment row."""
        if step:
            self.steps += steps
            self.busy += step.link_s * steps
            self.h2d += step.h2d_bytes * steps
        self.segments.append({"start_s": t_start, "steps": steps, "batch": b, "step_s": t,
                              "prefill_tokens": prefill_tokens,
                              "link_util": (step.link_s / t) if step else 0.0,
                              "memory_bytes": self.ledger.total})

    def _retire(self, G: int) -> bool:
        """Finish every decoding request whose last token is out at step count G; whether any was."""
        done = False
        while self.dec_heap and self.dec_heap[0][0] <= G:
            _, _, x, off = heapq.heappop(self.dec_heap)
            x.generated = G - off
            self.dec_n -= 1
            self.dec_sum -= x.context - off
            self.finish(x)
            done = True
        return done
