"""The one scenario: what simulate, plan, sweep and the figures run, and the one `resolve()` of it.

`Scenario` names everything but the arrival rate and the seed, as the user gave it: model, GPU,
link, host sharing, the host memory for this GPU's requests, one design and its sparse-KV buffer
layout, the context and output distributions, the Workload knobs that differ from their defaults,
where the hit rates come from, where prefill runs, requests per run, a batch cap, the calibration. Defaults come from
ddbench/core/defaults.py. Flags become scenarios in ddbench/planner/scenario_args.py, a sweep point
in ddbench/planner/spec.py; the figures build theirs directly.

`resolve(scenario)` checks it and builds what a run needs: catalog specs, the design, the Workload
(validated at the smallest context the scenario draws), an adaptive design's low-rank key layers
where they come from the profile, and (on first use, or `.check()`) the cost model and the
per-layer hit and reuse rates. Cost models and hit rates are cached per process, so a worker
running many points builds them once.

Host memory: `host_mem_gb` (GB for this GPU's requests), else the host's capacity / its GPUs, else
none (core.catalog.host_memory). `Resolved.host_cap` is the batch whose pinned host KV fits at the
longest context the scenario draws (HI of uniform:LO:HI): a count cap that never over-commits host
memory, which serving runs apply beside --max-batch (`Resolved.batch_cap`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache

from ddbench.core import defaults as D
from ddbench.core.catalog import fetch_share, get_gpu, get_host, get_link, get_model, host_memory, shared_link
from ddbench.core.designs import get_design
from ddbench.core.errors import DDBenchError
from ddbench.core.tp import check_tp, rank_model
from ddbench.core.distribution import Distribution
from ddbench.core.units import GB, fmt_tokens
from ddbench.core.workload import Workload

BUFFER_LAYOUTS = ("design", "pingpong", "per-layer")   # Scenario.buffers
PREFILLS = ("here", "elsewhere")
# the Workload fields a scenario sets (context and batch follow from the run)
KNOBS = tuple(f.name for f in fields(Workload) if f.name not in ("context", "batch"))
ROWS = ("init", "temperature", "budget", "context", "task")   # ddbench.sim.hitrates.Select's fields


@dataclass(frozen=True)
class Scenario:
    model: str
    gpu: str
    design: str = D.DESIGN
    context: Distribution = D.CONTEXT  # 128k, uniform:LO:HI or exp:MEAN: a Distribution (text is parsed once,
    output: Distribution = D.OUTPUT    # on construction; the CLI hands the Distribution it parsed)
    link: str | None = None           # None: the GPU's usual link (or the host's)
    host: str | None = None           # multi-GPU host sharing switches and DRAM; None: the GPU alone
    fetching: int | None = None       # GPUs of the host fetching at once (None: all of them)
    host_mem_gb: float | None = None  # host memory for this GPU's requests, GB; None: the host's share, or no bound
    knobs: tuple = ()                 # Workload fields that differ from their defaults: ((name, value), ...)
    buffers: str = D.BUFFERS          # sparse-KV buffer layout: the design's own, or pingpong / per-layer
    hit_rate: float | str | None = None   # a number, an accuracy CSV, or None: the model's profile, else 0.88
    rows: tuple = ()                  # profile rows picked ((Select field, value), ...); (): the default rows
    lowrank_from_profile: bool = False    # an adaptive design's low-rank key layers from the profile's summary
    prefill: str = D.PREFILL          # "here" (chunked, beside decode) or "elsewhere" (disaggregated)
    requests: int = D.PLAN_REQUESTS
    max_batch: int | None = None
    calibration: str | None = None    # bundle root; None: the data root's calibration/
    roofline: bool = False
    forced_cache: tuple = ()          # (prefetched, urgent) per budget on every layer: a chunk cache's rates as an
                                      # engine run forced them (replaying that run), instead of the profile's
    tp: int = 1                       # tensor parallelism: GPUs per replica (ddbench.core.tp); every per-GPU
                                      # number is one rank's
    rate_scale: float = 1.0           # the break-even's what-if: the design's misses (1 - hit, 1 - reuse) or, for a
                                      # chunk cache, its prefetched and urgent chunks, times this (capped at 1)
    rates: object = None              # --rates: a ddbench.core.ratefile.RateSource, or None: the matched profile
    rate_overrides: tuple = ()        # --rate: ((design, metric, value), ...)
    rate_end: str = "centre"          # price at the rates' centre or an end of their 95 % interval (low, high)

    @classmethod
    def make(cls, **kw) -> "Scenario":
        """A scenario from keywords, Workload knobs among them (budget=4096, chunk=16, ...)."""
        knobs = dict(kw.pop("knobs", ()))
        knobs.update({k: kw.pop(k) for k in list(kw) if k in KNOBS})
        return cls(**kw, knobs=_knobs(knobs))

    def knob(self, name: str) -> int:
        """The Workload knob's value: the one set, else its default."""
        return dict(self.knobs).get(name, Workload.__dataclass_fields__[name].default)

    def with_knobs(self, **kw) -> "Scenario":
        return replace(self, knobs=_knobs({**dict(self.knobs), **kw}))

    def label(self) -> str:
        """The design's name, with [buffers] where the buffer layout is not the design's own."""
        return design_of(self.design, self.buffers).name

    def __post_init__(self):
        object.__setattr__(self, "context", Distribution.of(self.context, "context"))
        object.__setattr__(self, "output", Distribution.of(self.output, "output"))

    @property
    def contexts(self) -> Distribution:
        """The contexts it draws (.low, .high: the shortest and longest; None for exp:MEAN)."""
        return self.context


def _knobs(values: dict) -> tuple:
    """Sorted (name, value) pairs, the defaults left out, so equal scenarios compare and hash equal."""
    unknown = sorted(set(values) - set(KNOBS))
    if unknown:
        raise TypeError(f"not Workload knobs: {unknown}")
    return tuple(sorted((k, v) for k, v in values.items() if v != Workload.__dataclass_fields__[k].default))


@dataclass
class Resolved:
    """A checked scenario. The cost model and the hit rates are built on first use (`check()` builds
    both): the memory answer needs neither."""
    scenario: Scenario
    model: object
    gpu: object
    link: object                      # the link one GPU sees (shared by the host's GPUs where there is a host)
    share: object                     # the host's sharing (catalog.fetch_share), or None
    design: object                    # the DesignSpec, with the scenario's buffer layout
    workload: Workload                # at the smallest context the scenario draws
    select: object                    # the accuracy profile rows (ddbench.sim.hitrates.Select)
    lowrank: frozenset | None = None  # low-rank key layers from the profile, or None: the design's rule
    lowrank_note: str | None = None
    host_mem: object = None           # core.catalog.HostMemory for this GPU's requests, or None: not a bound
    full_model: object = None         # the whole model (`model` is one TP rank's shard of it; the same at TP 1)

    @property
    def tp(self) -> int:
        return self.scenario.tp

    @property
    def max_context(self) -> int | None:
        """The longest context the scenario draws (None: exp:MEAN, any length)."""
        return self.scenario.contexts.high

    def bounds(self, context: int | None = None):
        """core.memory.BatchBounds (GPU and host) at `context` (default: the longest the scenario draws)."""
        from ddbench.core.memory import batch_bounds
        ctx = context if context is not None else (self.max_context or self.workload.context)
        return batch_bounds(self.design, self.model, self.gpu, replace(self.workload, context=ctx),
                            None if self.host_mem is None else self.host_mem.bytes_per_gpu)

    @cached_property
    def host_cap(self) -> int | None:
        """Requests whose host KV fits in host memory at the longest context drawn; None: not a bound."""
        from ddbench.core.memory import max_batch_host
        if self.host_mem is None:
            return None
        ctx = self.max_context
        if ctx is None:      # exp:MEAN: only a design that keeps its KV on the GPU draws it
            if not self.design.kv_on_gpu:
                raise DDBenchError(f"context '{self.scenario.context}': host memory needs a longest context")
            return None
        return max_batch_host(self.design, self.model, replace(self.workload, context=ctx),
                              self.host_mem.bytes_per_gpu)

    @property
    def batch_cap(self) -> int | None:
        """The serving run's cap on concurrent requests: --max-batch and the host cap, the smaller one."""
        caps = [c for c in (self.scenario.max_batch, self.host_cap) if c is not None]
        return min(caps) if caps else None

    def host_too_small(self) -> str | None:
        """Why not one request's host KV fits in host memory (the one-line error), or None."""
        if self.host_cap is None or self.host_cap >= 1:
            return None
        from ddbench.core.memory import host_kv_bytes
        ctx = self.max_context
        need = host_kv_bytes(self.design, self.model, replace(self.workload, context=ctx))
        src = f"--host-mem {self.scenario.host_mem_gb:g}" if self.scenario.host_mem_gb is not None else \
            f"{self.host_mem.host}'s share"
        return (f"one {self.design.name} request at context {fmt_tokens(ctx)} pins {need / GB:.1f} GB of KV in host"
                f" memory, more than the {self.host_mem.gb_per_gpu:.1f} GB for this GPU ({src}); give a larger"
                " --host-mem, a shorter context or another design")

    def check_host(self) -> "Resolved":
        """A DDBenchError where not one request's host KV fits in host memory (plan, simulate: bad input)."""
        why = self.host_too_small()
        if why:
            raise DDBenchError(why)
        return self

    @cached_property
    def cm(self):
        sc = self.scenario
        return _cost_model(self.model.name if os.sep not in sc.model else sc.model, self.gpu.name, self.link,
                           sc.calibration, sc.roofline, sc.tp)

    def rates_at(self, context: int):
        """The matched rate set (ddbench.core.rates.RateSet) of every design at `context`."""
        from ddbench.core.designs import DESIGNS
        from ddbench.core.paths import traces_dir
        from ddbench.core.rates import rate_set
        sc, w = self.scenario, self.workload
        return rate_set(self.model.name, self.model.num_layers, int(context), w.budget, w.cache_tokens,
                        tuple(DESIGNS), sc.rates, tuple(sc.rate_overrides), str(traces_dir("accuracy")))

    @cached_property
    def design_rates(self):
        """This design's rates (ddbench.core.rates.DesignRates) at the longest context drawn, scaled by
        rate_scale; None where they do not price it (--hit-rate, or no profile: the fallback)."""
        sc = self.scenario
        dr = self.rates_at(self.max_context or self.workload.context).of(get_design(sc.design).name)
        if dr is None or dr.family is None or not dr.matched:
            return None
        mine = sc.rates is not None and (sc.rates.kind != "values" or dr.source.startswith(sc.rates.name))
        if (sc.hit_rate is not None or sc.rows) and dr.family in ("reuse", "speculative") and not mine \
                and not any(o[0] == dr.design for o in sc.rate_overrides):
            return None
        return dr.scaled(sc.rate_scale)

    @cached_property
    def _hits(self) -> tuple:
        dr = self.design_rates
        if dr is not None and dr.family in ("reuse", "speculative"):
            hit = tuple(1.0 - m for m in dr.get("miss").at(self.scenario.rate_end))
            return hit, hit, self.rates_note(dr)
        hit, reuse, note = _hits(self.scenario.hit_rate, self.model.name, self.model.num_layers, self.select)
        return _scaled_hits(hit, self.scenario.rate_scale), _scaled_hits(reuse, self.scenario.rate_scale), note

    def hits_at(self, context: int) -> tuple:
        """(hit, reuse) per layer at `context` from the matched rate set (the figures price each context at its
        own rates); the scenario's own where the rate set does not price this design (--hit-rate, no profile)."""
        if self.design_rates is None or self.design_rates.family not in ("reuse", "speculative"):
            return self.hit, self.reuse
        dr = self.rates_at(int(context)).of(self.design_rates.design).scaled(self.scenario.rate_scale)
        hit = [1.0 - m for m in dr.get("miss").at(self.scenario.rate_end)]
        return hit, list(hit)

    def rates_note(self, dr) -> str:
        end = self.scenario.rate_end
        return dr.line() + ("" if end == "centre" else f"; priced at the interval's {end} end")

    @property
    def hit(self) -> list:
        return list(self._hits[0])

    @property
    def reuse(self) -> list:
        return list(self._hits[1])

    @property
    def hit_note(self) -> str:
        if self.design.chunk_cache:
            try:
                return self.cache_rates.note
            except DDBenchError as exc:
                return f"no cache rates: {exc}"
        return self._hits[2]

    def cache_rates_at(self, context: int):
        """A chunk-cache design's link rates at `context` (ddbench.sim's CacheRates: per layer, churn and urgent
        chunks over the budget) from the matched rate set, None for other designs."""
        if not self.design.chunk_cache:
            return None
        from ddbench.core.rates import CacheRates, forced
        sc = self.scenario
        if sc.forced_cache:
            pre, urg = sc.forced_cache
            return forced(pre, urg, self.model.num_layers, f"cache rates forced as the engine ran them: churn"
                                                           f" {pre:g}, urgent {urg:g} of the budget per step")
        dr = self.rates_at(int(context)).of(get_design(sc.design).name)
        if dr is None or not dr.matched:
            raise DDBenchError(f"{sc.design} needs measured cache rates: {dr.detail if dr else 'none'} (profile"
                               " with `ddbench profile --layer-accuracy --cache-capacity ...`, or give --rates)")
        dr = dr.scaled(sc.rate_scale)
        urgent = dr.get("urgent").at(sc.rate_end)
        churn = dr.get("churn").at(sc.rate_end) if dr.get("churn") else (0.0,) * len(urgent)
        return CacheRates(tuple(churn), tuple(urgent), self.rates_note(dr))

    @cached_property
    def cache_rates(self):
        """cache_rates_at the longest context the scenario draws (its smallest where unbounded)."""
        return self.cache_rates_at(self.max_context or self.workload.context)

    def check(self) -> "Resolved":
        """Build the hit rates and the cost model now, so that a bad profile or bundle fails before any run."""
        self._hits
        self.cm
        self.cache_rates
        return self


def _scaled_hits(hits, factor: float) -> list:
    """Hit rates whose misses are `factor` times as many (at least 0 hits)."""
    if factor == 1.0:
        return list(hits)
    return [max(0.0, 1.0 - (1.0 - h) * factor) for h in hits]


def design_of(name: str, buffers: str = D.BUFFERS):
    """The design `name` with a sparse-KV buffer layout: its own ("design"), "pingpong" or "per-layer"."""
    design = get_design(name)
    if buffers not in BUFFER_LAYOUTS:
        raise DDBenchError(f"unknown buffers '{buffers}'; known: {', '.join(BUFFER_LAYOUTS)}")
    if buffers == "design" or design.kv_on_gpu:
        return design
    layers = "pingpong" if buffers == "pingpong" else "all"
    if layers == design.buffer_layers:
        return design
    return replace(design, name=f"{design.name}[{buffers}]", buffer_layers=layers)


@lru_cache(maxsize=64)
def _cost_model(model: str, gpu: str, link, calibration, roofline, tp: int = 1):
    from ddbench.sim.factory import cost_model
    return cost_model(model, gpu, link, calibration, roofline, tp)


@lru_cache(maxsize=64)
def _hits(spec, model: str, layers: int, select):
    from ddbench.sim import hitrates
    hit, reuse, note = hitrates.resolve(spec, model, layers, sel=select)
    return tuple(hit), tuple(reuse), note


def accuracy_profile_path(sc: Scenario, model_name: str) -> str | None:
    """The accuracy profile the hit rates come from: the CSV named, else the model's own if present."""
    from ddbench.sim import hitrates
    if sc.hit_rate is None:
        path = hitrates.default_path(model_name)
        return path if os.path.exists(path) else None
    if isinstance(sc.hit_rate, str):
        try:
            float(sc.hit_rate)
        except ValueError:
            return sc.hit_rate
    return None


def _link(sc: Scenario, gpu):
    """(link one GPU sees, host sharing or None)."""
    if sc.host is not None:
        host = get_host(sc.host)
        link = get_link(host.link if sc.link is None else sc.link)
        share = fetch_share(host, sc.fetching, link.name)
        return shared_link(link, share), share
    if sc.fetching is not None:
        raise DDBenchError("GPUs fetching at once needs a host (--host)")
    return get_link(gpu.default_link if sc.link is None else sc.link), None


def _check(sc: Scenario) -> None:
    if isinstance(sc.tp, bool) or not isinstance(sc.tp, int) or sc.tp < 1:
        raise DDBenchError(f"tp must be a positive integer, got {sc.tp!r}")
    if sc.rate_end not in ("low", "centre", "high"):
        raise DDBenchError(f"rate end must be low, centre or high, got {sc.rate_end!r}")
    if sc.prefill not in PREFILLS:
        raise DDBenchError(f"prefill must be 'here' or 'elsewhere', got '{sc.prefill}'")
    if not 1 <= sc.requests <= D.MAX_REQUESTS:
        raise DDBenchError(f"requests must be within 1..{D.MAX_REQUESTS}, got {sc.requests}")
    if sc.max_batch is not None and not 1 <= sc.max_batch <= D.MAX_COUNT:
        raise DDBenchError(f"max batch must be at least 1, got {sc.max_batch}")
    if sc.calibration is not None and not str(sc.calibration).strip():
        raise DDBenchError("the calibration root is empty: name a folder, or leave it out for the data root's")


def _workload(sc: Scenario, design, model, lowrank) -> Workload:
    """The scenario's Workload at the smallest context it draws, validated for `model`."""
    lo = sc.contexts.low
    knobs = dict(sc.knobs)
    if lowrank is not None:
        knobs["lowrank_layers"] = len(lowrank)
    budget = knobs.get("budget", D.BUDGET)
    if lo is None:
        if not design.kv_on_gpu:
            raise DDBenchError(f"context '{sc.context}': an exponential context can fall below the sparse budget;"
                               " use a fixed context or uniform:LO:HI")
        lo = budget
    w = Workload(context=lo, **knobs)
    if sc.tp > 1 and w.rank > model.num_kv_heads * model.head_dim:
        # one rank factorises its own heads' keys [S, H_kv/tp * d]: their rank is at most that width
        w = replace(w, rank=model.num_kv_heads * model.head_dim)
    # a design that keeps all KV on the GPU fetches no budget: only the other designs need it within the context
    (replace(w, context=max(lo, w.budget)) if design.kv_on_gpu else w).validate(model)
    return w


@lru_cache(maxsize=256)
def resolve(sc: Scenario) -> Resolved:
    """Check `sc` and build everything a run of it needs (DDBenchError, one line, on bad input)."""
    from ddbench.sim import hitrates
    full, g = get_model(sc.model), get_gpu(sc.gpu)
    link, share = _link(sc, g)
    design = design_of(sc.design, sc.buffers)
    _check(sc)
    check_tp(full, sc.tp, *((get_host(sc.host).gpus, get_host(sc.host).name) if sc.host is not None else ()))
    m = rank_model(full, sc.tp)
    path = accuracy_profile_path(sc, m.name)
    no_profile = (f"the hit rate here is a constant (no traces/accuracy/{m.name}.csv, or a number given);"
                  " name a profile with --hit-rate PATH")
    if sc.rows and path is None:
        raise DDBenchError(f"--profile-{sc.rows[0][0]} picks rows of an accuracy profile, but {no_profile}")
    select = hitrates.Select(**dict(sc.rows)) if sc.rows else hitrates.Select()
    lowrank = lowrank_note = None
    if sc.lowrank_from_profile:
        if path is None:
            raise DDBenchError(f"--lowrank-layers profile needs an accuracy profile, but {no_profile}")
        lowrank, lowrank_note = hitrates.lowrank_from_summary(path, m.num_layers, m.name,
                                                             explicit=sc.hit_rate is not None)
    w = _workload(sc, design, m, lowrank)
    if sc.host_mem_gb is not None and not (isinstance(sc.host_mem_gb, (int, float))
                                           and not isinstance(sc.host_mem_gb, bool)
                                           and 0 < sc.host_mem_gb <= D.MAX_HOST_MEM_GB):
        raise DDBenchError(f"host memory must be a positive number of GB, at most {D.MAX_HOST_MEM_GB:g},"
                           f" got {sc.host_mem_gb!r}")
    host_mem = host_memory(sc.host, sc.host_mem_gb)
    return Resolved(sc, m, g, link, share, design, w, select, lowrank, lowrank_note, host_mem, full)
