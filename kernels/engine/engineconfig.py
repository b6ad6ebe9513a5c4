"""An engine point before anything is allocated: EngineConfig (the core Workload and the engine's own
switches), the rows of a sparse design's KV buffers (buffer_rows) and the GPU bytes an Engine will keep,
by the memory model's categories (plan_bytes), so that a point can be refused first."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ddbench.core.defaults import FORCED_MISS
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload

_WORKLOAD_FIELDS = {f.name for f in fields(Workload)}


@dataclass(frozen=True)
class EngineConfig:
    """One engine point: the shared core `Workload` (context, batch, budget, chunk, rank, local chunks,
    generated-token slots, outliers per 1K of budget: ddbench/core/memory.py, defaults there) plus the
    engine-only knobs below. `EngineConfig.of(context=..., batch=..., budget=..., miss_rate=...)` splits
    keyword arguments between the two."""
    workload: Workload
    miss_rate: float | None = FORCED_MISS   # forced miss rate (None: the model's own prediction)
    host_layers: int | None = None    # physical host KV layers; logical layer l reads l % host_layers
    lowrank_layer_ids: tuple = ()     # which layers rebuild keys (Workload only counts them; engine-only)
    prefetch_programs: int = 32
    urgent_programs: int = 64
    transfers: bool = True            # False: compute only, no host reads (exposed-transfer baseline)
    quant_values: bool = False        # SpeCache: also hold its 2-bit value copy (memory only: the step reads keys)
    churn_rate: float | None = None   # chunk cache: forced share of the next prediction new against this one (None:
                                      # the model's own speculative selection)
    fused_fill: bool = True           # chunk cache: its fill in one Triton launch (kernels/cachefill.py); False: the
                                      # torch twin's ~30 kernels (the A/B of devtools/devcheck_cachefill.py)
    yield_prefetch: bool = True       # chunk cache: its prefetch gather yields to the urgent fetches (a device flag,
                                      # kernels/yieldgather.py); False: as before (devtools/devcheck_engine_ab.py's A/B,
                                      # traces/engine/h200-switches: 0.94-0.99x the step)
    rows_two_waves: bool = True       # chunk cache: attention through its rows split for about two waves of (request,
                                      # KV head, split) programs at every batch (False: two below 64 (b, h), else one;
                                      # the same A/B: 0.97-0.99x the step at batch 8 and 16)
    seed: int = 0

    @staticmethod
    def of(**kw) -> "EngineConfig":
        wl = {k: kw.pop(k) for k in list(kw) if k in _WORKLOAD_FIELDS}
        if "lowrank_layers" in wl and not isinstance(wl["lowrank_layers"], int):   # a tuple of layer ids
            kw["lowrank_layer_ids"] = tuple(wl.pop("lowrank_layers"))
            wl["lowrank_layers"] = len(kw["lowrank_layer_ids"])
        return EngineConfig(workload=Workload(**wl), **kw)

    # the workload's fields, as the engine uses them
    context = property(lambda self: self.workload.context)
    batch = property(lambda self: self.workload.batch)
    budget = property(lambda self: self.workload.budget)
    chunk = property(lambda self: self.workload.chunk)
    rank = property(lambda self: self.workload.rank)
    local = property(lambda self: self.workload.local_chunks * self.workload.chunk)
    gen_slots = property(lambda self: self.workload.gen_tokens)
    outlier_chunks = property(lambda self: self.workload.outliers_per_1k * self.workload.budget // 1024)

    @property
    def lowrank_layers(self) -> tuple:
        return self.lowrank_layer_ids or tuple(range(self.workload.lowrank_layers))

    def validate(self, model) -> None:
        """One-line DDBenchError for a configuration the engine cannot run."""
        w = self.workload
        if not isinstance(w.batch, int) or w.batch < 1:
            raise DDBenchError(f"batch must be an integer >= 1, got {w.batch!r}")
        if not isinstance(w.chunk, int) or w.chunk < 1 or w.context % w.chunk:
            raise DDBenchError(f"chunk {w.chunk} does not divide the context {w.context}")
        w.validate(model)
        if w.gen_tokens < 4:
            raise DDBenchError(f"gen_tokens must be >= 4 for the engine, got {w.gen_tokens}")
        if self.miss_rate is not None and not 0.0 <= self.miss_rate <= 1.0:
            raise DDBenchError(f"miss rate must be within 0..1, got {self.miss_rate}")
        if self.churn_rate is not None and not 0.0 <= self.churn_rate <= 1.0:
            raise DDBenchError(f"churn rate must be within 0..1, got {self.churn_rate}")
        if any(not 0 <= i < model.num_layers for i in self.lowrank_layers):
            raise DDBenchError(f"low-rank layer ids {self.lowrank_layers} outside 0..{model.num_layers - 1}")


def buffer_rows(cfg: EngineConfig, system) -> tuple[int, int, int, int]:
    """(outlier rows, resident rows R0, resident capacity Rcap, buffer tokens S) of a sparse design's
    KV buffers: S = the k selected chunks, then Rcap + 2 rows (outliers, the local window, the
    generated-token slots and the new tokens) rounded up to whole chunks."""
    C = cfg.chunk
    out_rows = cfg.outlier_chunks * C if system.outliers else 0
    R0 = out_rows + cfg.local
    Rcap = R0 + cfg.gen_slots
    return out_rows, R0, Rcap, (cfg.budget // C) * C + -(-(Rcap + 2) // C) * C


PLAN_CATEGORIES = ("resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers")


def plan_bytes(model, system, cfg: EngineConfig, dtype_bytes: int = 2) -> dict:
    """GPU bytes an Engine keeps once built and stepped (its own tensors; the shared weights apart:
    ddbench.kernels.engine.model.weight_bytes), by ddbench/core/memory.py's categories, computed from the shapes Engine.__init__
    and step() allocate, so that a point can be refused before anything is allocated:
      resident_kv        full-kv: K and V of every token; sparse: the local window and generated-token slots
      landmarks          chunk-mean keys [L, B, H, N, d]
      aux_residency      ShadowKV's outlier rows, the low-rank key factors (U, SV), SpeCache's 2-bit keys
                         (and with cfg.quant_values its 2-bit values) with their scales and zeros
      sparse_kv_buffers  the selected-KV buffers (ping-pong, or per layer), the selection ids kept across
                         steps (prediction, the chunks each reuse buffer holds), CPU-gather staging
    Transient work (scores, plans, logits, the CUDA graph's pool) is not here: it is measured."""
    s, E = system, dtype_bytes
    L, B, H, d = model.num_layers, cfg.batch, model.num_kv_heads, model.head_dim
    out = dict.fromkeys(PLAN_CATEGORIES, 0)
    if s.kv_on_gpu:
        out["resident_kv"] = 2 * L * B * H * (cfg.context + cfg.gen_slots + 2) * d * E
        return out
    C, N, kc = cfg.chunk, cfg.context // cfg.chunk, cfg.budget // cfg.chunk
    out_rows, R0, Rcap, S = buffer_rows(cfg, s)
    row = 2 * L * B * H * d * E                   # one row of the recent K and V, every layer
    out["resident_kv"] = row * (Rcap - out_rows)
    out["aux_residency"] = row * out_rows
    if s.landmarks:
        out["landmarks"] = L * B * H * N * d * E
    if s.quant_bits:                              # 2-bit keys: 4 tokens a byte, scale and zero per 64 tokens;
        T = cfg.context                           # 2-bit values: 4 channels a byte, scale and zero per 64 channels
        out["aux_residency"] += L * B * H * d * (T // 4 + 2 * (T // 64) * E)
        if cfg.quant_values:
            out["aux_residency"] += L * B * H * T * (d // 4 + 2 * -(-d // 64) * E)
    n_lr = {"all": L, "adaptive": len(set(cfg.lowrank_layers)), "none": 0}[s.lowrank_keys]
    out["aux_residency"] += n_lr * B * (cfg.context * cfg.rank + H * cfg.rank * d) * E
    nbuf = 2 if s.buffer_layers == "pingpong" else L * s.buffer_sets
    ids = 1 + (s.prefetch != "none" and (cfg.transfers or s.tokens_per_step == 2)) + holds_selection(s)
    out["sparse_kv_buffers"] = nbuf * 2 * B * H * S * d * E + ids * L * B * H * kc * 4
    if s.chunk_cache:     # kernels/engine/chunkcache.py: slots (+ scales) and tail rows, the map and its sinks, rows,
        # a plan per fill kind
        slots = cfg.workload.cache_tokens // C
        plans = 1 + (s.prefetch != "none")
        slot_bytes = 2 * L * B * H * slots * (C * d + 4) if cfg.workload.cache_bits == 8 else \
            2 * L * B * H * slots * C * d * E     # fp8: e4m3 slots and an fp32 scale each for K and V
        out["sparse_kv_buffers"] = (slot_bytes + 2 * L * B * H * (S - kc * C) * d * E + L * B * H * (N + 1) * 2
                                    + 2 * L * B * H * (slots + 1) * 4 + B * H * S * 4
                                    + plans * (3 * (B * H * kc + 1) + 1) * 4
                                    + plans * B * H * kc * 4 + ids * L * B * H * kc * 4)
    if s.gather == "cpu":
        out["sparse_kv_buffers"] += 2 * B * H * kc * 2 * C * d * E
    return out


def holds_selection(s) -> bool:
    """Whether the engine keeps each layer's last selection: ShadowKV's reuse (its buffer's chunks), and a
    chunk cache without prefetch (the base of its forced misses: each step's selection is the last one's
    with the miss rate of it new)."""
    return bool(s.reuse or (s.chunk_cache and s.prefetch == "none"))
