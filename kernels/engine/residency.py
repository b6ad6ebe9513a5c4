"""What a sparse design's Engine allocates and holds once built: the host KV and the gathers that read it,
the selection state (landmarks or 2-bit keys, low-rank key factors, the recent window) and the
selected-KV buffers with their transfer state. Mixed into Engine (kernels/engine/engine.py), whose
__init__ calls these after the shared state."""

from __future__ import annotations

import functools
import math

import torch

from ddbench.core.errors import DDBenchError
from ddbench.core.memory import check_cache_bits, holds_selection
from ddbench.kernels.engine.engineconfig import buffer_rows
from ddbench.kernels.fp8 import E4M3, check_host_scales
from ddbench.kernels.yieldgather import YieldFlag


class Residency:
    def _init_host(self, host_kv, host_scales):
        """The host KV and the gathers that read it (fp8: with its scales)."""
        s, cfg = self.sys, self.cfg
        B, H, d, C = self.B, self.H, self.d, self.C
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
        check_cache_bits(s, cfg.workload)

    def _init_selection_state(self, g0):
        """What selection reads, and the resident rows: the recent window, landmarks or 2-bit keys, the
        low-rank key factors."""
        s, cfg = self.sys, self.cfg
        L, B, H, d, dt = self.L, self.B, self.H, self.d, self.dt
        self.out_rows, self.R0, self.Rcap, self.S = buffer_rows(cfg, s)
        self.recent_k = torch.empty(L, B, H, self.Rcap, d, device=self.dev, dtype=dt).normal_(generator=g0)
        self.recent_v = torch.empty(L, B, H, self.Rcap, d, device=self.dev, dtype=dt).normal_(generator=g0)
        if s.landmarks and self.index.name != "flat":    # a smaller index (issue 47): per layer, in its format
            from ddbench.kernels.indexkernels import random_index     # one request's transients at a time
            self.lm = [random_index(B, H, self.N, d, self.index, dt, g0, self.dev, kernel=not self.ref) for _ in range(L)]
        elif s.landmarks:
            self.lm = torch.empty(L, B, H, self.N, d, device=self.dev, dtype=dt).normal_(generator=g0)
        if s.quant_bits:
            from ddbench.kernels.specache import QuantKeys
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

    def _init_buffers(self):
        """The selected-KV buffers (ping-pong, per layer, or a chunk cache's slots) and the state of their
        transfers."""
        s, cfg = self.sys, self.cfg
        L, B, H, d, C, dt = self.L, self.B, self.H, self.d, self.C, self.dt
        # buffers: ping-pong (2 uses in flight) or per layer (x sets; reuse: one per layer, in place); a chunk
        # cache design's per-layer buffers are its cache (kernels/engine/chunkcache.py)
        if s.buffer_layers == "pingpong":
            nbuf = 2
        else:
            nbuf = L * s.buffer_sets
        self.cache = None
        self.yield_kw = {}               # the prefetch gathers' yield flag, with cfg.yield_prefetch
        if s.chunk_cache:
            from ddbench.kernels.engine.chunkcache import CacheShape, ChunkCache
            shape = CacheShape(L, B, H, self.N, cfg.workload.cache_tokens // C, C, d, self.S - self.kc * C, self.kc)
            self.cache = ChunkCache(shape, self.dev, dt, fused=cfg.fused_fill and not self.ref,
                                    fp8=cfg.workload.cache_bits == 8)
            self.kbuf, self.vbuf = list(self.cache.k.unbind(0)), list(self.cache.v.unbind(0))
            self.step_dev = torch.zeros(1, device=self.dev, dtype=torch.int32)   # decode steps (LRU stamps)
            self.pf_stamp = torch.zeros(L, device=self.dev, dtype=torch.int32)
            # each layer's prefetch count, one row per step parity (a captured graph's two steps keep their own)
            self.pf_count = torch.zeros(2, L, device=self.dev, dtype=torch.int32)
            self.fill_ev = {}            # use id -> event after its prefetch fill
            if cfg.yield_prefetch and s.prefetch != "none" and cfg.transfers:
                # raised by each urgent fetch, polled by the prefetch gathers (kernels/yieldgather.py)
                self.yield_kw = {"yielding": YieldFlag(torch.zeros(1, device=self.dev, dtype=torch.int32))}
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
