"""An engine point before anything is allocated: EngineConfig (the core Workload and the engine's own
switches), the rows of a sparse design's KV buffers (buffer_rows) and the GPU bytes an Engine will keep,
by the memory model (plan_bytes: ddbench.core.memory), so that a point can be refused first."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ddbench.core.defaults import FORCED_MISS
from ddbench.core.errors import DDBenchError
from ddbench.core import memory
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
    KV buffers at this point: ddbench.core.memory.buffer_rows."""
    return memory.buffer_rows(system, cfg.workload)


PLAN_CATEGORIES = ("resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers")


def plan_bytes(model, system, cfg: EngineConfig, dtype_bytes: int = 2) -> dict:
    """GPU bytes an Engine keeps once built and stepped (its own tensors; the shared weights apart:
    ddbench.kernels.engine.model.weight_bytes), by category: the memory model's (ddbench/core/memory.py,
    whose formulas are the shapes Engine.__init__ and step() allocate), at this point's workload with
    its low-rank layers, its transfers switch (selection ids kept) and its quant_values switch (SpeCache's
    2-bit values), in `dtype_bytes` (4: the CPU tests' float32), so that a point can be refused before
    anything is allocated. Transient work (scores, plans, logits, the CUDA graph's pool) is not here: it
    is measured."""
    w = replace(cfg.workload, lowrank_layers=len(set(cfg.lowrank_layers)))
    m = replace(model, dtype_bytes=dtype_bytes)
    return {"resident_kv": memory.resident_kv_bytes(system, m, w),
            "landmarks": memory.landmark_bytes(system, m, w),
            "aux_residency": memory.aux_residency_bytes(system, m, w, quant_values=cfg.quant_values),
            "sparse_kv_buffers": memory.sparse_buffer_bytes(system, m, w, transfers=cfg.transfers)}


