"""The decode-step engine: one real layer stack, every design's pipeline chosen by its registry
switches (ddbench.core.designs.DesignSpec), never by its name.

    Engine(model, system, cfg, weights, device, host_kv=None, host_scales=None, ref=False)   (host_scales: an
        fp8 host KV's scales, kernels.fp8.quantize_host_kv; cfg.workload.kv_bits 8 needs one)
    engine.step() -> next tokens [B, nq] (the first call of a prediction design is the pre-decoding
        step: one token, every chunk fetched on demand, its selection seeds the prediction and its
        output seeds T'_2 = T_2)
    engine.records   per-layer dicts of the last recorded step (compute_ms, exposed_ms, urgent/prefetch bytes)

Per layer of a sparse design, on the compute stream: RMSNorm, QKV, RoPE; selection (landmark
scores, or 2-bit token scores reduced to chunks) and top-k; the true index of token 0, the
prediction of token 1 (kept for the next step). Transfers (see transfer.py):
  layer-ahead prefetch (dualdecoder): after layer i's attention, the predicted chunks of layer i+2
      (wrapping into the next step) are gathered into the buffer that layer i just released; the
      transfer waits on that buffer's last-reader event.
  urgent misses: true - predicted, planned on the device and fetched into the slots of the wrong
      predictions, on the high-priority stream (or behind the prefetches: FIFO), after the layer's
      own prefetch (same slots) and after the plan.
  next-step prefetch (specache): the speculative token's chunks for the same layer of the next
      step, into that layer's second buffer set.
  reuse (shadowkv): each layer keeps its buffer in place: hits stay in their slots, the values of the
      misses (true - held) are fetched into the slots of the chunks no longer selected, on the
      high-priority stream, on the critical path; meanwhile only the keys of those slots are rebuilt.
Attention waits on the events of all of its layer's transfers; no global synchronisation.
Keys of low-rank layers are rebuilt (U @ SV + RoPE) and only values cross the link.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields

import torch

from ddbench.core.defaults import FORCED_MISS
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload, kv_piece_bytes
from kernels.fp8 import E4M3, check_host_scales
from kernels.engine.model import Weights, nvtx_range, rmsnorm, rope_tables
from kernels.engine.fastselect import fused_plan_fits
from kernels.engine.transfer import (Sched, gather_slots, gather_slots_ref, perturb, perturb_fast, plan_misses,
                                     plan_buffers, plan_misses_fast)


_WORKLOAD_FIELDS = {f.name for f in fields(Workload)}


def _mm(t, w):
    """t [B, T, h] @ w [h, n] as one 2-D GEMM. `t` may be a token slice of [B, 2, h] (two-pass
    ablation): `t @ w` on such a strided view broadcasts w to a batched GEMM that reads the weight
    once per request (B times), so the rows are folded first (a view where the strides allow)."""
    return (t.reshape(-1, t.shape[-1]) @ w).view(*t.shape[:-1], w.shape[-1])


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


@dataclass
class _Ops:
    score: object
    attention: object
    gather: object
    slots: object
    rebuild: object
    rebuild_changed: object     # (U, SV, old ids, new ids, k_out): the keys of the slots whose id changed
    spec_scores: object
    rmsnorm: object
    add_rmsnorm: object     # (x, y, w) -> (x + y, rmsnorm(x + y, w))
    rope_split: object
    swiglu: object
    assemble: object
    select: object          # (q, landmarks, k) -> ids [B, nq, H, k]
    spec_select: object     # (q, quantised keys, chunk, k) -> ids


def _ops(ref: bool) -> _Ops:
    from kernels import attention, gather, rebuild, select, specache
    from kernels.engine import fastselect, fused
    if ref:
        return _Ops(select.score_chunks_ref, attention.dual_sparse_attention_ref, gather.gather_ref,
                    gather_slots_ref, rebuild.rebuild_keys_ref, rebuild.rebuild_changed_ref,
                    specache.specache_chunk_scores_ref,
                    rmsnorm, fused.add_rmsnorm_ref, fused.rope_split_ref, fused.swiglu_ref, fused.assemble_ref,
                    fastselect.select_topk_ref, fastselect.specache_select_topk_ref)
    return _Ops(select.score_chunks, attention.dual_sparse_attention, gather.gather_uva, gather_slots,
                rebuild.rebuild_keys, rebuild.rebuild_changed, lambda q, qk, chunk: specache.specache_scores_triton(q, qk, chunk=chunk),
                fused.rmsnorm, fused.add_rmsnorm, fused.rope_split, fused.swiglu, fused.assemble,
                fastselect.select_topk, fastselect.specache_select_topk)


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
    kernels.engine.model.weight_bytes), by ddbench/core/memory.py's categories, computed from the shapes Engine.__init__
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
    if s.chunk_cache:     # kernels/engine/chunkcache.py: slots + tail rows, the map and its sinks, rows, a plan per fill kind
        slots = cfg.workload.cache_tokens // C
        plans = 1 + (s.prefetch != "none")
        out["sparse_kv_buffers"] = (2 * L * B * H * (slots * C + S - kc * C) * d * E + L * B * H * (N + 1) * 2
                                    + 2 * L * B * H * (slots + 1) * 4 + B * H * S * 4
                                    + plans * (3 * (B * H * kc + 1) + 1) * 4
                                    + plans * B * H * kc * 4 + ids * L * B * H * kc * 4)
    if s.gather == "cpu":
        out["sparse_kv_buffers"] += 2 * B * H * kc * 2 * C * d * E
    return out


# ShadowKV's fetch of one layer as the engine ran it before issue 31 (a copy of the previous selection
# into a spare buffer, then a thin gather of every chunk back: hits from the spare, misses from the
# host); the reuse-fetch record of kernels/engine/sweep.py still measures it. The engine's reuse branch
# now keeps each buffer in place and moves only the misses (Engine._sparse_attention). kb, vb: the
# layer's buffers (kb None: values only); pk, pv: the spare buffer's first kC = k*C tokens (pk None:
# values only); prev_true, true: the previous and this step's selections [B, H, k].

def reuse_copy(kb, vb, pk, pv):
    """The previous selection's rows of the layer's buffer (its first kC tokens) into the spare."""
    kC = pv.shape[2]
    pv.copy_(vb[:, :, :kC])
    if pk is not None:
        pk.copy_(kb[:, :, :kC])


def reuse_gather(gather, host_kv, layer, true, prev_true, kb, vb, pk, pv):
    """`true` into the layer's buffer: hits from the spare, misses from host_kv[layer] (`gather`:
    kernels.gather.gather_uva, its own plan reuse_plan(prev_true, true) included, with its default
    launch, or the torch twin). Returns the gather's src_slot (None from the twin)."""
    return gather(host_kv, layer, true, kb, vb, prev=(prev_true, pk, pv))


def reuse_fetch(gather, host_kv, layer, true, prev_true, kb, vb, pk, pv):
    """The whole fetch: reuse_copy, then reuse_gather (on the current stream)."""
    reuse_copy(kb, vb, pk, pv)
    return reuse_gather(gather, host_kv, layer, true, prev_true, kb, vb, pk, pv)


def reuse_launch(gather) -> dict:
    """{'programs', 'items'} of the reuse gather as the engine launches it over a bf16 host: reuse_gather
    passes neither, so `gather`'s defaults (32 persistent programs; items None: kernels.gather.launch_items,
    2 chunks in flight each for bf16 pieces)."""
    import inspect
    p = inspect.signature(gather).parameters
    out = {n: p[n].default for n in ("programs", "items")}
    if out["items"] is None:
        out["items"] = 2
    return out


def holds_selection(s) -> bool:
    """Whether the engine keeps each layer's last selection: ShadowKV's reuse (its buffer's chunks), and a
    chunk cache without prefetch (the base of its forced misses: each step's selection is the last one's
    with the miss rate of it new)."""
    return bool(s.reuse or (s.chunk_cache and s.prefetch == "none"))


@dataclass
class StepStats:
    prefetch_items: list = field(default_factory=list)   # ints (items of one chunk-head)
    urgent_counts: list = field(default_factory=list)    # device int tensors or ints
    urgent_layer: list = field(default_factory=list)
    prefetch_layer: list = field(default_factory=list)


class Engine:
    def __init__(self, model, system, cfg: EngineConfig, weights: Weights, device, *,
                 host_kv: torch.Tensor | None = None, host_scales: torch.Tensor | None = None, ref: bool = False,
                 log: bool = False, debug: bool = False):
        self.m, self.sys, self.cfg, self.w = model, system, cfg, weights
        self.dev = torch.device(device)
        self.ops = _ops(ref)
        self.ref = ref
        self.debug = [] if debug else None
        self.graph = None                # CUDA graph of `graph_steps` whole steps (capture())
        s = system
        cfg.validate(model)
        if s.gather == "cpu" and ref:
            raise DDBenchError("the CPU-gather ablation needs CUDA (pinned staging + async copies)")
        self.L, self.B, self.Hq, self.H, self.d = model.num_layers, cfg.batch, model.num_heads, model.num_kv_heads, model.head_dim
        self.C, self.N, self.kc = cfg.chunk, cfg.context // cfg.chunk, cfg.budget // cfg.chunk
        self.nq = s.tokens_per_step
        self.split = s.two_pass
        self.prefetch = s.prefetch if (cfg.transfers and not s.kv_on_gpu) else "none"
        # the dual-token top-k plans the misses in its own merge kernel where its "seg" method runs
        self.fuse_plan = not ref and not s.kv_on_gpu and fused_plan_fits(self.B, self.H, self.N, self.kc)
        self.sched = Sched(self.dev, urgent_priority=s.urgent_priority, log=log)
        self.gen = torch.Generator(device=self.dev).manual_seed(cfg.seed + 1)
        self.g = 0                       # generated tokens persisted so far (host mirror, eager only)
        self.g_dev = torch.zeros(1, device=self.dev, dtype=torch.int64)   # the same on the device (graphs)
        self.seed_dev = torch.full((1,), cfg.seed + 1, device=self.dev, dtype=torch.int32)  # forced misses
        self.ar = torch.arange(4, device=self.dev)
        self.steps = 0
        self.cache = None                # a chunk-cache design's ChunkCache (sparse designs, below)
        dt = torch.bfloat16 if self.dev.type == "cuda" else weights.embed.dtype
        self.dt = dt
        L, B, H, d, C = self.L, self.B, self.H, self.d, self.C
        g0 = torch.Generator(device=self.dev).manual_seed(cfg.seed)
        self.tokens = torch.randint(0, model.vocab, (B, 1), device=self.dev, generator=g0)
        self.pending = self.tokens.clone()   # T'_2 before any pre-decoding (compute-only runs)
        if s.kv_on_gpu:
            S = cfg.context + cfg.gen_slots + 2
            self.kv_k = torch.empty(L, B, H, S, d, device=self.dev, dtype=dt).normal_(generator=g0)
            self.kv_v = torch.empty(L, B, H, S, d, device=self.dev, dtype=dt).normal_(generator=g0)
            return
        # ---- sparse designs ----
        self.host = host_kv
        self.gather, self.slots = self.ops.gather, self.ops.slots
        if host_kv is not None:
            if tuple(host_kv.shape[1:]) != (B, H, self.N, 2, C, d):
                raise DDBenchError(f"host_kv shape {tuple(host_kv.shape)} does not match the engine")
            fp8 = host_kv.dtype == E4M3
            if fp8 != (cfg.workload.kv_bits == 8):
                raise DDBenchError(f"kv_bits {cfg.workload.kv_bits} needs a {'float8_e4m3fn' if not fp8 else '16-bit'}"
                                   f" host KV, got {host_kv.dtype}")
            if fp8 and s.gather == "cpu":
                raise DDBenchError("the CPU-gather ablation moves 16-bit KV only (kv_bits 16)")
            check_host_scales(host_kv, host_scales)
            if fp8:     # e4m3 over the link, dequantised by the gathers into the bf16 buffers
                self.gather = functools.partial(self.ops.gather, scales=host_scales)
                self.slots = functools.partial(self.ops.slots, scales=host_scales)
            self.hl = host_kv.shape[0]
            if s.gather == "cpu" and not host_kv.is_contiguous():
                raise DDBenchError("the CPU-gather ablation needs a contiguous host KV (no aliased requests)")
        elif cfg.transfers:
            raise DDBenchError("a sparse design needs host_kv")
        self.out_rows, self.R0, self.Rcap, self.S = buffer_rows(cfg, s)
        self.recent_k = torch.empty(L, B, H, self.Rcap, d, device=self.dev, dtype=dt).normal_(generator=g0)
        self.recent_v = torch.empty(L, B, H, self.Rcap, d, device=self.dev, dtype=dt).normal_(generator=g0)
        if s.landmarks:
            self.lm = torch.empty(L, B, H, self.N, d, device=self.dev, dtype=dt).normal_(generator=g0)
        if s.quant_bits:
            from kernels.specache import QuantKeys
            T = cfg.context
            self.qk = [QuantKeys(torch.randint(0, 256, (B, H, T // 4, d), device=self.dev, dtype=torch.uint8, generator=g0),
                                 torch.rand(B, H, T // 64, d, device=self.dev, generator=g0).to(dt) * 0.5,
                                 torch.randn(B, H, T // 64, d, device=self.dev, generator=g0).to(dt) * 0.5, 64)
                       for _ in range(L)]
            if cfg.quant_values:
                # the 2-bit value copy (KIVI: per token, scale and zero per 64 channels) SpeCache keeps beside
                # the keys: resident as in SpeCache, not read by this step (selection scores keys only)
                self.qv = (torch.empty(L, B, H, T, d // 4, device=self.dev, dtype=torch.uint8),
                           torch.empty(L, B, H, T, 2, -(-d // 64), device=self.dev, dtype=dt))
        self.lowrank = [False] * L
        if s.lowrank_keys == "all":
            self.lowrank = [True] * L
        elif s.lowrank_keys == "adaptive":
            for i in cfg.lowrank_layers:
                self.lowrank[i] = True
        self.U, self.SV = {}, {}
        for i in range(L):
            if self.lowrank[i]:
                self.U[i] = torch.empty(B, cfg.context, cfg.rank, device=self.dev, dtype=dt).normal_(generator=g0)
                self.SV[i] = (torch.randn(B, H, cfg.rank, d, device=self.dev, generator=g0) / math.sqrt(cfg.rank)).to(dt)
        # buffers: ping-pong (2 uses in flight) or per layer (x sets; reuse: one per layer, in place); a chunk
        # cache design's per-layer buffers are its cache (kernels/engine/chunkcache.py)
        if s.buffer_layers == "pingpong":
            nbuf = 2
        else:
            nbuf = L * s.buffer_sets
        self.cache = None
        if s.chunk_cache:
            from kernels.engine.chunkcache import ChunkCache
            self.cache = ChunkCache(L, B, H, self.N, cfg.workload.cache_tokens // C, C, d, self.S - self.kc * C,
                                    self.dev, dt, self.kc, fused=cfg.fused_fill and not ref)
            self.kbuf, self.vbuf = list(self.cache.k.unbind(0)), list(self.cache.v.unbind(0))
            self.step_dev = torch.zeros(1, device=self.dev, dtype=torch.int32)   # decode steps (LRU stamps)
            self.pf_stamp = torch.zeros(L, device=self.dev, dtype=torch.int32)
            self.fill_ev = {}            # use id -> event after its prefetch fill
        else:
            self.kbuf = [torch.zeros(B, H, self.S, d, device=self.dev, dtype=dt) for _ in range(nbuf)]
            self.vbuf = [torch.zeros(B, H, self.S, d, device=self.dev, dtype=dt) for _ in range(nbuf)]
        self.free_ev = [None] * nbuf     # last reader (attention) of each buffer
        self.ready_ev = {}               # use id -> [events] of transfers into that use's buffer
        self.layer_buf = list(range(L))  # reuse: the buffer of each layer (fixed)
        self.pred = None                 # [L, B, H, k] prediction for this step (chunks prefetched)
        self.pred_new = torch.zeros(L, B, H, self.kc, device=self.dev, dtype=torch.int32)
        # reuse: the chunk id each slot of a layer's buffer holds (slot order, not sorted), and whether it does yet
        self.held = torch.zeros(L, B, H, self.kc, device=self.dev, dtype=torch.int32) if holds_selection(s) else None
        self.held_ok = [False] * L
        self.prefetched = {}             # use id -> prediction tensor that was prefetched
        self.use = 0                     # global layer-use counter (ping-pong parity)
        if s.gather == "cpu":
            self._cpu_init()

    # ------------------------------------------------------------------ helpers
    def _hl(self, i):
        return i % self.hl

    def _item_bytes(self, i, values_only):
        """Link bytes of one fetched chunk-head: K and V (or V alone), each C*d*2 in bf16, C*d + its fp32
        scale in fp8 (ddbench/core/memory.py kv_piece_bytes)."""
        w = self.cfg.workload
        piece = self.C * self.d * self.dt.itemsize if w.kv_bits == 16 else kv_piece_bytes(self.m, w)
        return piece * (1 if values_only else 2)

    def _buf_of_use(self, u):
        """Buffer id of a layer use (u = step*L + layer)."""
        s = self.sys
        if s.buffer_layers == "pingpong":
            return u % 2
        layer, step = u % self.L, u // self.L
        if s.reuse:
            return self.layer_buf[layer]
        return layer * s.buffer_sets + (step % s.buffer_sets)

    def _map(self, fn, x):
        """Apply fn per token (two-pass ablation) or to both tokens at once (dual-token)."""
        if self.split and x.shape[1] > 1:
            return torch.cat([fn(x[:, t:t + 1]) for t in range(x.shape[1])], 1)
        return fn(x)

    def _lin(self, x, w):
        return self._map(lambda t: _mm(t, w), x)

    def _addnorm(self, x, y, w):
        """(x + y, rmsnorm(x + y, w)): the residual add fused into the next norm (one kernel; the
        linear layers are plain GEMMs), per token in the two-pass ablation."""
        if self.split and x.shape[1] > 1:
            parts = [self.ops.add_rmsnorm(x[:, t:t + 1], y[:, t:t + 1], w) for t in range(x.shape[1])]
            return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
        return self.ops.add_rmsnorm(x, y, w)

    # ------------------------------------------------------------------ transfers
    def _issue_prefetch(self, u, pred):
        """Gather `pred` [B, H, k] for layer use u into its buffer, after that buffer's last reader."""
        if self.cache is not None:
            return self._issue_cache_prefetch(u, pred)
        layer = u % self.L
        b = self._buf_of_use(u)
        vo = self.lowrank[layer]
        kb = None if vo else self.kbuf[b]

        def go():
            with nvtx_range(f"prefetch L{layer}"):
                if self.sys.gather == "cpu":
                    self._cpu_gather_full(layer, pred, kb, self.vbuf[b])
                else:
                    self.gather(self.host, self._hl(layer), pred, kb, self.vbuf[b],
                                    programs=self.cfg.prefetch_programs)
        ev, _ = self.sched.run("prefetch", "prefetch", go, waits=[self.free_ev[b]], layer=layer, buf=b, use=u)
        self.ready_ev.setdefault(u, []).append(ev)
        self.prefetched[u] = pred
        self.stats.prefetch_items.append(pred.numel())
        self.stats.prefetch_layer.append((layer, vo))

    def _issue_cache_prefetch(self, u, pred):
        """Chunk cache: the prefetch fill of `pred` for layer use u (stamp 2 x its step) and the gather of
        the predicted chunks it missed, on the prefetch stream after the layer's last reader."""
        layer = u % self.L
        off = u // self.L - self.step_u0 // self.L      # 1: a prefetch for the next step's first layers
        torch.mul(self.step_dev + off, 2, out=self.pf_stamp[layer:layer + 1])
        ev_st, _ = self.sched.run("compute", "stamp", lambda: None, layer=layer)
        box = {}

        def fill():
            with nvtx_range(f"prefetch fill L{layer}"):
                box["plan"], _ = self.cache.fill_rows(layer, pred, self.pf_stamp[layer:layer + 1], kind="prefetch")
        ev_fill, _ = self.sched.run("prefetch", "prefetch-fill", fill, waits=[self.free_ev[layer], ev_st], layer=layer,
                                    buf=layer, use=u)
        self.fill_ev[u] = ev_fill

        def go():
            with nvtx_range(f"prefetch L{layer}"):
                self.slots(self.host, self._hl(layer), box["plan"], self.kbuf[layer], self.vbuf[layer],
                               programs=self.cfg.prefetch_programs)
        ev, _ = self.sched.run("prefetch", "prefetch", go, layer=layer, buf=layer, use=u)
        self.ready_ev.setdefault(u, []).append(ev)
        self.prefetched[u] = pred
        self.stats.prefetch_items.append(box["plan"].count.clone())     # the plan buffers are reused: keep its count
        self.stats.prefetch_layer.append((layer, False))

    def _cache_fetch(self, i, u, true, have_pred):
        """Chunk cache, layer i: (events attention waits on, rows). Compute only: both fills on the compute
        stream (the prediction's, then the truth's), nothing fetched. With transfers: the urgent fill
        after this use's prefetch fill, then the true chunks in neither fetched on the urgent stream
        after it and after the layer's prefetch (its victims may be slots the prefetch writes)."""
        cfg, c = self.cfg, self.cache
        if not cfg.transfers:
            if self.pred is not None and self.sys.prefetch != "none":
                with nvtx_range("prefetch fill"):
                    c.fill_rows(i, self.pred[i], self.step_dev, mul=2, kind="prefetch")
            with nvtx_range("urgent fill"):
                return [], c.fill_rows(i, true, self.step_dev, mul=2, add=1, rows=True)[1]
        fill_ev = self.fill_ev.pop(u, None)
        if fill_ev is not None:
            self.sched.run("compute", "wait-fill", lambda: None, waits=[fill_ev], layer=i)
        with nvtx_range("urgent fill"):
            plan, rows = c.fill_rows(i, true, self.step_dev, mul=2, add=1, rows=True)
        ev_plan, _ = self.sched.run("compute", "plan", lambda: None, layer=i)
        pre_ev = self.ready_ev.get(u, [])

        def urgent():
            with nvtx_range(f"urgent L{i}"):
                self.slots(self.host, self._hl(i), plan, self.kbuf[i], self.vbuf[i], programs=cfg.urgent_programs)
        ev_u, _ = self.sched.run("urgent", "urgent", urgent, waits=[ev_plan, self.free_ev[i]] + pre_ev, layer=i, buf=i,
                                 use=u)
        self.stats.urgent_counts.append(plan.count.clone())
        self.stats.urgent_layer.append((i, False))
        return pre_ev + [ev_u], rows

    # ------------------------------------------------------------------ one step
    def step(self):
        s = self.sys
        predecode = (self.prefetch != "none" and self.pred is None) and self.steps == 0
        nq = 1 if (predecode or s.kv_on_gpu) else self.nq
        self.step_u0 = getattr(self, "use", 0)    # the first layer use of this step (sparse designs)
        self.stats = StepStats()
        if nq < self.tokens.shape[1]:
            toks = self.tokens[:, :nq]
        elif nq > self.tokens.shape[1]:  # T'_{i+1} seeded with the pre-decoded T_2
            toks = torch.cat([self.tokens, self.pending], 1)
        else:
            toks = self.tokens
        ctx_pos = self.cfg.context + (0 if s.kv_on_gpu else self.cfg.local)
        pos = self.g_dev + (ctx_pos + self.ar[:nq])                 # device positions: no host value of g
        self.cos, self.sin = rope_tables(pos, self.d, self.m.rope_theta)
        # per step, not per layer: where the new tokens go and how long the attended buffer is
        kv0 = self.cfg.context if s.kv_on_gpu else self.kc * self.C + self.R0
        self.lengths = (self.g_dev + kv0).to(torch.int32).repeat(self.B)
        self.at_new = self.g_dev + (kv0 + self.ar[:nq])
        x = self.w.embed[toks]                                   # [B, nq, h]
        if self.prefetch == "layer-ahead" and not predecode:
            for u in (self.use, self.use + 1):                  # first step after pre-decode
                if u not in self.prefetched and u % self.L < self.L:
                    self._issue_prefetch(u, self.pred[u % self.L])
        pend = None      # each layer's MLP output, added to the residual by the next norm
        for i in range(self.L):
            with nvtx_range(f"layer {i}"):
                x, pend = self._layer(i, x, pend, nq, predecode)
        with nvtx_range("lm_head"):
            x, h = self._addnorm(x, pend, self.w.norm)
            logits = self._map(lambda t: _mm(t, self.w.lm_head.T).float(), h)
            nxt = logits.argmax(-1)                              # [B, nq]
        if predecode:
            self.pending = nxt[:, :1]                            # T_2 -> T'_2; input T_1 kept
            self.pred, self.pred_new = self.pred_new, torch.zeros_like(self.pred_new)
            if self.cache is not None:
                self.step_dev.add_(1)
        else:
            self.g += 1
            if self.g >= self.cfg.gen_slots - 2:
                self.g = 0                                       # reuse the generated-token slots
            self.g_dev.add_(1).remainder_(self.cfg.gen_slots - 2)
            self.seed_dev.add_(1)
            if self.cache is not None:
                self.step_dev.add_(1)
            new = nxt[:, :self.nq] if not s.kv_on_gpu else nxt[:, :1]
            if new.shape == self.tokens.shape:
                self.tokens.copy_(new)                           # static input of a captured step
            else:
                self.tokens = new.clone()
            if self.nq == 2 and s.prefetch != "none":
                if self.pred is None:          # compute only: no pre-decoding step seeded it
                    self.pred = torch.zeros_like(self.pred_new)
                self.pred, self.pred_new = self.pred_new, self.pred
        self.steps += 1
        return nxt

    # ------------------------------------------------------------------ CUDA graphs
    def capture(self, steps: int = 2):
        """Capture `steps` whole steps (both streams, events, selection, gathers, attention) into one
        CUDA graph; replay() then runs them with no host work. Call after the pre-decoding step and
        one warm-up step. `steps` is even so that the prediction buffers' swap and every buffer
        parity come back to where they started. The prefetches that a step issues for the next
        step's first layers are joined at the graph's end: they overlap within the graph, not across
        replays. The CPU-gather ablation needs the host inside a step and cannot be captured."""
        if self.dev.type != "cuda" or self.ref:
            raise DDBenchError("CUDA graphs need the CUDA path")
        if self.sys.gather == "cpu" and self.prefetch != "none":
            raise DDBenchError("the CPU-gather ablation cannot be captured (the host gathers inside the step)")
        if steps % 2:
            raise DDBenchError("capture an even number of steps")
        torch.cuda.synchronize()
        # every earlier event has completed: forget them (a capture may not wait on outside events)
        self.free_ev = [None] * len(getattr(self, "free_ev", []))
        self.ready_ev = {u: [] for u in getattr(self, "ready_ev", {})}
        if getattr(self, "fill_ev", None):
            self.fill_ev = {}
        self.sched.used.clear()          # join only the side streams this capture forks
        g = torch.cuda.CUDAGraph()
        self.out = None
        self.graph = None

        def body():
            for _ in range(steps):
                self.out = self.step()

        # kernels/engine/capture.py: a failure inside the steps (out of memory with prefetches forked)
        # joins the side streams and ends the capture before it propagates, so torch stays usable; the
        # capture stream is none of the side streams (torch's stream pool is round-robin)
        from kernels.engine.capture import capture as guarded_capture
        try:
            guarded_capture(g, body, self.sched.join, avoid=tuple(self.sched.streams.values()))
        except BaseException:
            self.sched.used.clear()
            try:
                g.reset()                # the fragment and its private pool, now rather than at gc
            except Exception:  # noqa: BLE001 - a graph whose capture did not end has nothing to reset
                pass
            raise
        self.graph, self.graph_steps = g, steps
        self.free_ev = [None] * len(getattr(self, "free_ev", []))
        self.ready_ev = {u: [] for u in getattr(self, "ready_ev", {})}
        if getattr(self, "fill_ev", None):
            self.fill_ev = {}
        return g

    def replay(self):
        """Run the captured steps; returns the last step's tokens (a static graph output)."""
        self.graph.replay()
        return self.out

    def _layer(self, i, x, pend, nq, predecode):
        """One layer. `pend` is the previous layer's MLP output (None before layer 0): the residual
        add happens in this layer's first norm. Returns (residual, this layer's MLP output)."""
        s, w = self.sys, self.w
        B, Hq, H, d = self.B, self.Hq, self.H, self.d
        with nvtx_range("qkv"):
            if pend is None:
                hn = self._map(lambda t: self.ops.rmsnorm(t, w.ln1[i]), x)
            else:
                x, hn = self._addnorm(x, pend, w.ln1[i])
            qkv = self._lin(hn, w.wqkv[i])
            q, k, v = self.ops.rope_split(qkv, self.cos, self.sin, Hq, H, d,
                                          bias=None if w.bqkv is None else w.bqkv[i])
        if s.kv_on_gpu:
            o = self._full_attention(i, q, k, v, nq)
        else:
            o = self._sparse_attention(i, q, k, v, nq, predecode)
        with nvtx_range("o_proj+mlp"):
            x, h2 = self._addnorm(x, self._lin(o.reshape(B, nq, Hq * d), w.wo[i]), w.ln2[i])
            gu = self._lin(h2, w.wgu[i].T)
            a = self._map(self.ops.swiglu, gu)
            mlp = self._lin(a, w.wdown[i])
        return x, mlp

    def _plan(self, pred, true):
        return plan_misses(pred, true) if self.ref else plan_misses_fast(pred, true, self.N)

    def _attn(self, q, kb, vb, lengths, **kw):
        if self.split and q.shape[1] > 1:
            o0 = self.ops.attention(q[:, :1].contiguous(), kb, vb, lengths, **kw)
            o1 = self.ops.attention(q[:, 1:].contiguous(), kb, vb, lengths + 1, **kw)
            return torch.cat([o0, o1], 1)
        return self.ops.attention(q, kb, vb, lengths, **kw)

    def _full_attention(self, i, q, k, v, nq):
        kb, vb = self.kv_k[i], self.kv_v[i]
        kb.index_copy_(2, self.at_new, k.transpose(1, 2))     # device positions of the new token(s)
        vb.index_copy_(2, self.at_new, v.transpose(1, 2))
        lengths = self.lengths
        kw = {}
        if not self.ref:   # whole-context attention: about 4 waves of (request, head, split) programs
            sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
            kw["splits"] = max(1, min(4 * sms // (self.B * self.H), kb.shape[2] // 1024))
        with nvtx_range("attention"):
            o = self._attn(q, kb, vb, lengths, **kw)
        return o

    def _select(self, i, q, **kw):
        """ids [B, nq, H, k], ascending (or into kw["out"]); pass 1 stores its scores in fastselect.SCORES."""
        s = self.sys
        with nvtx_range("select"):
            if s.landmarks:
                return self._map(lambda t: self.ops.select(t.contiguous(), self.lm[i], self.kc, **kw), q)
            return self._map(lambda t: self.ops.spec_select(t.contiguous(), self.qk[i], self.C, self.kc, **kw), q)

    def _sparse_attention(self, i, q, k, v, nq, predecode):
        s, cfg = self.sys, self.cfg
        u = self.use
        have_pred = self.prefetch != "none" and not predecode
        # compute only (no transfers): a prediction design still plans its misses against the
        # prediction kept from the last step (and the forced misses are drawn), so that the
        # compute-only step differs from the full step by the transfers alone
        sim_pred = not cfg.transfers and s.prefetch != "none" and self.pred is not None
        fused_plan = None
        if nq == 2 and not self.split:
            # the top-k writes token 0's ids (this step's true selection) and token 1's (the next
            # step's prediction) straight into their buffers: no slicing copies; with the model's
            # own selection its merge kernel also plans the misses against the prediction
            true = torch.empty(self.B, self.H, self.kc, device=self.dev, dtype=torch.int32)
            kw = dict(out=(true, self.pred_new[i]))
            if self.fuse_plan and cfg.miss_rate is None and (have_pred or sim_pred):
                fused_plan = plan_buffers(self.B, self.H, self.kc, self.dev)
                kw["plan"] = (self.pred[i], fused_plan)
            self._select(i, q, **kw)
        else:
            sel = self._select(i, q)
            true = sel[:, 0].contiguous()
            if nq == 2:
                self.pred_new[i] = sel[:, 1]
            elif predecode:
                self.pred_new[i] = true                           # pre-decoding seeds the prediction
        inplace = s.reuse and self.held_ok[i]
        cache_only = self.cache is not None and s.prefetch == "none"     # lru-cache: the last selection is the base
        base = self.pred[i] if (have_pred or sim_pred) else (self.held[i] if (inplace or (cache_only and self.held_ok[i]))
                                                             else None)
        if cfg.miss_rate is not None and base is not None:
            # forced miss rate (timing runs); inside a capture the default generator (graph-safe) draws
            if self.ref:
                true = perturb(base, cfg.miss_rate, self.N, self.gen)
            else:   # one launch; its seed advances on the device once per step (graph replays differ)
                true = perturb_fast(base, cfg.miss_rate, self.N, self.seed_dev, i)
        if self.cache is not None and cfg.churn_rate is not None and self.pred is not None and not predecode:
            # forced prediction churn: the next step's prediction is this one with churn_rate of it new
            if self.ref:
                self.pred_new[i] = perturb(self.pred[i], cfg.churn_rate, self.N, self.gen)
            else:
                perturb_fast(self.pred[i], cfg.churn_rate, self.N, self.seed_dev, self.L + i, out=self.pred_new[i])
        if cache_only:
            self.held[i].copy_(true)
            self.held_ok[i] = True
        b = self._buf_of_use(u)
        kb, vb = self.kbuf[b], self.vbuf[b]
        vo = self.lowrank[i]
        waits = []
        assembled = true
        rows = None
        if self.cache is not None:
            waits, rows = self._cache_fetch(i, u, true, have_pred)
        elif inplace:
            # ShadowKV: the layer's buffer holds self.held[i] (slot order). Hits stay where they are; the
            # misses against it go into the slots of the chunks no longer selected: their values (and keys
            # of a full-rank layer) on the urgent stream, on the critical path, while the compute stream
            # rebuilds the keys of those slots only (below). Compute only: planned, nothing fetched.
            b = self.layer_buf[i]
            kb, vb = self.kbuf[b], self.vbuf[b]
            with nvtx_range("plan_misses"):
                plan = self._plan(self.held[i], true)
            assembled = plan.assembled
            if cfg.transfers:
                ev_plan, _ = self.sched.run("compute", "plan", lambda: None, layer=i)
                kk = None if vo else kb

                def fetch():
                    with nvtx_range(f"fetch L{i}"):
                        self.slots(self.host, self._hl(i), plan, kk, vb, programs=cfg.urgent_programs)
                ev, _ = self.sched.run("urgent", "fetch", fetch, waits=[ev_plan, self.free_ev[b]], layer=i, buf=b, use=u)
                waits = [ev]
                self.stats.urgent_counts.append(plan.count)
                self.stats.urgent_layer.append((i, vo))
        elif not cfg.transfers:
            if sim_pred:
                with nvtx_range("plan_misses"):
                    assembled = (fused_plan or self._plan(self.pred[i], true)).assembled
        elif have_pred:
            if s.prefetch == "next-step" and u not in self.prefetched:
                raise DDBenchError("internal: no prefetch for this layer use")
            with nvtx_range("plan_misses"):
                plan = fused_plan or self._plan(self.pred[i], true)
            ev_plan, _ = self.sched.run("compute", "plan", lambda: None, layer=i)
            pre_ev = self.ready_ev.get(u, [])
            kk = None if vo else kb

            def urgent():
                with nvtx_range(f"urgent L{i}"):
                    if s.gather == "cpu":
                        self._cpu_gather_misses(i, plan, kk, vb)
                    else:
                        self.slots(self.host, self._hl(i), plan, kk, vb, programs=cfg.urgent_programs)
            ev_u, _ = self.sched.run("urgent", "urgent", urgent, waits=[ev_plan] + pre_ev, layer=i, buf=b, use=u)
            waits = pre_ev + [ev_u]
            assembled = plan.assembled
            self.stats.urgent_counts.append(plan.count)
            self.stats.urgent_layer.append((i, vo))
        else:
            # no prediction yet (pre-decoding) or nothing to reuse: every chunk on demand
            kk = None if vo else kb
            if s.reuse:
                nb = self.layer_buf[i]
                b, kb, vb = nb, self.kbuf[nb], self.vbuf[nb]
                kk = None if vo else kb

            def fetch_all():
                with nvtx_range(f"fetch L{i}"):
                    if s.gather == "cpu":
                        self._cpu_gather_full(i, true, kk, vb)
                    else:
                        self.gather(self.host, self._hl(i), true, kk, vb, programs=cfg.urgent_programs)
            # the side stream must also wait for `true`, computed just now on the compute stream
            ev_sel, _ = self.sched.run("compute", "select", lambda: None, layer=i)
            ev, _ = self.sched.run("urgent", "fetch", fetch_all, waits=[self.free_ev[b], ev_sel], layer=i, buf=b,
                                   use=u)
            waits = [ev]
            self.stats.urgent_counts.append(true.numel())
            self.stats.urgent_layer.append((i, vo))
        C, kC = self.C, self.kc * self.C
        with nvtx_range("assemble"):
            if vo and inplace:      # only the slots whose chunk changed (the misses)
                self.ops.rebuild_changed(self.U[i], self.SV[i], self.held[i], assembled, kb, chunk=C,
                                         rope_theta=self.m.rope_theta)
            elif vo:
                self.ops.rebuild(self.U[i], self.SV[i], assembled, kb, chunk=C, rope_theta=self.m.rope_theta)
            if s.reuse:
                self.held[i].copy_(assembled)
                self.held_ok[i] = True
            # the resident window and generated tokens: the whole slot range is copied (its used
            # length R0 + g lives on the device), the new token(s) go right after the used part,
            # and the true token's K/V is persisted at R0 + g for the next steps (one kernel)
            R = self.R0 + self.g
            ka, va = (kb, vb) if rows is None else (self.cache.tail_view(kb, kC), self.cache.tail_view(vb, kC))
            self.ops.assemble(ka, va, self.recent_k[i], self.recent_v[i], k, v, self.g_dev, kC, self.R0)
            lengths = self.lengths
        ev_wait, _ = self.sched.run("compute", "wait", lambda: None, waits=waits, layer=i, buf=b, use=u)
        kw = {} if rows is None else {"rows": rows}
        if not self.ref and self.B * self.H < 64:   # small batch: about two waves of (request, head, split)
            sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
            kw["splits"] = max(1, min(2 * sms // (self.B * self.H), self.S // 256))
        with nvtx_range("attention"):
            o = self._attn(q, kb, vb, lengths, **kw)
        ev_attn, _ = self.sched.run("compute", "attention", lambda: None, layer=i, buf=b, use=u)
        self.free_ev[b] = ev_attn
        self.ready_ev.pop(u, None)
        self.prefetched.pop(u, None)
        if self.debug is not None:
            self.debug.append(dict(layer=i, q=q.clone(), k=k.clone(), v=v.clone(), true=true.clone(),
                                   assembled=assembled.clone(), out=o.clone(), R=R, g=self.g_dev.clone(), nq=nq,
                                   recent_k=self.recent_k[i].clone(), recent_v=self.recent_v[i].clone(),
                                   lowrank=vo, step=self.steps, kb=kb.clone(), vb=vb.clone(),
                                   rows=None if rows is None else rows.clone(),
                                   pred=None if self.pred is None or predecode else self.pred[i].clone()))
        self.use += 1
        if self.prefetch == "layer-ahead" and not predecode:
            nu = u + 2
            layer2 = nu % self.L
            pred = self.pred[layer2] if layer2 == i + 2 else self.pred_new[layer2]
            self._issue_prefetch(nu, pred)
        elif self.prefetch == "layer-ahead" and predecode and i >= self.L - 2:
            self._issue_prefetch(u + 2, self.pred_new[(u + 2) % self.L])
        if self.prefetch == "next-step" and (nq == 2 or predecode):
            self._issue_prefetch(u + self.L, self.pred_new[i])   # same layer, next step, other set
        return o

    # ------------------------------------------------------------------ CPU-gather ablation
    def _cpu_init(self):
        n = self.B * self.H * self.kc
        row = 2 * self.C * self.d
        self.stage = [torch.empty(n, row, dtype=self.dt, pin_memory=True) for _ in range(2)]
        self.stage_ev = [None, None]
        self.dstage = [torch.empty(n, row, dtype=self.dt, device=self.dev) for _ in range(2)]
        self.idx_host = torch.empty(3, n, dtype=torch.int32, pin_memory=True)
        self.n_host = torch.empty(1, dtype=torch.int32, pin_memory=True)
        self.si = 0

    def _cpu_stage(self):
        j = self.si
        self.si ^= 1
        if self.stage_ev[j] is not None:
            self.stage_ev[j].synchronize()          # the host waits until that staging copy is done
        return j

    def _cpu_gather_full(self, layer, idx, kb, vb):
        """index_select on the CPU into pinned staging, one H2D copy, split on the GPU (this stream)."""
        ih = self.idx_host[0, :idx.numel()].view(idx.shape)
        ih.copy_(idx, non_blocking=True)
        torch.cuda.current_stream().synchronize()   # the host needs the index
        j = self._cpu_stage()
        from kernels.gather import gather_cpu_staging
        gather_cpu_staging(self.host, self._hl(layer), ih, self.stage[j], self.dstage[j],
                           kb, vb if kb is not None else vb)
        e = torch.cuda.Event()
        e.record()
        self.stage_ev[j] = e

    def _cpu_gather_misses(self, layer, plan, kb, vb):
        n = plan.bh.numel()
        self.idx_host[0, :n].copy_(plan.bh, non_blocking=True)
        self.idx_host[1, :n].copy_(plan.chunk, non_blocking=True)
        self.idx_host[2, :n].copy_(plan.slot, non_blocking=True)
        self.n_host.copy_(plan.count, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        c = int(self.n_host[0])
        if c == 0:
            return
        bh, ch, sl = (self.idx_host[r, :c].long() for r in range(3))
        j = self._cpu_stage()
        src = self.host[self._hl(layer)].view(self.B * self.H * self.N, -1)
        torch.index_select(src, 0, bh * self.N + ch, out=self.stage[j][:c])
        dst = self.dstage[j][:c]
        dst.copy_(self.stage[j][:c], non_blocking=True)
        dv = dst.view(c, 2, self.C, self.d)
        bhd, sld = bh.to(self.dev, non_blocking=True), sl.to(self.dev, non_blocking=True)
        b, h = bhd // self.H, bhd % self.H
        tok = sld[:, None] * self.C + torch.arange(self.C, device=self.dev)
        vb[b[:, None], h[:, None], tok] = dv[:, 1]
        if kb is not None:
            kb[b[:, None], h[:, None], tok] = dv[:, 0]
        e = torch.cuda.Event()
        e.record()
        self.stage_ev[j] = e

    # ------------------------------------------------------------------ results
    def step_bytes(self, stats=None):
        """(prefetch_bytes, urgent_bytes) of the last step, or of a kept `stats` (syncs on the urgent counts)."""
        stats = self.stats if stats is None else stats
        pf = sum(int(n) * self._item_bytes(l, vo) for n, (l, vo) in zip(stats.prefetch_items, stats.prefetch_layer))
        ur = 0
        for c, (l, vo) in zip(stats.urgent_counts, stats.urgent_layer):
            ur += int(c) * self._item_bytes(l, vo)
        return pf, ur

    def floor_bytes(self) -> dict:
        """HBM bytes one (steady-state) step cannot avoid reading: every layer's weights and the LM
        head, the resident selection state (landmarks; low-rank factor rows of the selected tokens;
        the 2-bit key copy with its scales and zeros) and the attended K and V (each request, KV
        head and token once). The floor of the step is their sum over the HBM copy rate."""
        L, B, H, d, E = self.L, self.B, self.H, self.d, self.dt.itemsize
        w = self.w
        weights = sum(t.numel() for i in range(L) for t in (w.wqkv[i], w.wo[i], w.wgu[i], w.wdown[i]))
        weights += 0 if w.bqkv is None else sum(b.numel() for b in w.bqkv)
        weights = (weights + w.lm_head.numel()) * E
        s, cfg = self.sys, self.cfg
        nq = 1 if s.kv_on_gpu else self.nq
        mean_g = (cfg.gen_slots - 2) / 2
        if s.kv_on_gpu:
            sel = 0
            kv = L * B * H * (cfg.context + mean_g + nq) * d * E * 2
        else:
            sel = 0
            if s.landmarks:
                sel += L * B * H * self.N * d * E
            if s.quant_bits:
                sel += sum(q.codes.numel() + 2 * q.scale.numel() * E for q in self.qk)
            for i in range(L):
                if self.lowrank[i]:
                    sel += (B * self.kc * self.C * cfg.rank + B * H * cfg.rank * d) * E
            kv = L * B * H * (self.kc * self.C + self.R0 + mean_g + nq) * d * E * 2
        return dict(weights=weights, selection=sel, kv=kv, total=weights + sel + kv)
