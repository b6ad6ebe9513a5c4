"""The decode-step engine: one real layer stack, every design's pipeline chosen by its registry
switches (ddbench.core.designs.DesignSpec), never by its name.

    Engine(model, system, cfg, weights, device, host_kv=None, host_scales=None, ref=False)   (host_scales: an
        fp8 host KV's scales, ddbench.kernels.fp8.quantize_host_kv; cfg.workload.kv_bits 8 needs one)
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

from dataclasses import dataclass, field

import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.attention import CacheView
from ddbench.kernels.engine.accounting import Accounting
from ddbench.kernels.engine.cachepath import CachePath
from ddbench.kernels.engine.engineconfig import PLAN_CATEGORIES, EngineConfig, buffer_rows, plan_bytes  # noqa: F401
from ddbench.kernels.engine.cpugather import CpuGather
from ddbench.kernels.engine.model import Weights, nvtx_range, rope_tables
from ddbench.core.index import parse_index
from ddbench.kernels.engine.fastselect import fused_plan_fits
from ddbench.kernels.engine.ops import engine_ops
from ddbench.kernels.engine.residency import Residency
from ddbench.kernels.engine.reusefetch import reuse_copy, reuse_fetch, reuse_gather, reuse_launch  # noqa: F401
from ddbench.kernels.engine.transfer import Sched, perturb, perturb_fast, plan_misses, plan_buffers, plan_misses_fast


def _mm(t, w):
    """t [B, T, h] @ w [h, n] as one 2-D GEMM. `t` may be a token slice of [B, 2, h] (two-pass
    ablation): `t @ w` on such a strided view broadcasts w to a batched GEMM that reads the weight
    once per request (B times), so the rows are folded first (a view where the strides allow)."""
    return (t.reshape(-1, t.shape[-1]) @ w).view(*t.shape[:-1], w.shape[-1])


@dataclass
class StepStats:
    prefetch_items: list = field(default_factory=list)   # ints (items of one chunk-head)
    urgent_counts: list = field(default_factory=list)    # device int tensors or ints
    urgent_layer: list = field(default_factory=list)
    prefetch_layer: list = field(default_factory=list)


class Engine(Residency, CachePath, CpuGather, Accounting):
    def __init__(self, model, system, cfg: EngineConfig, weights: Weights, device, *,
                 host_kv: torch.Tensor | None = None, host_scales: torch.Tensor | None = None, ref: bool = False,
                 log: bool = False, debug: bool = False):
        self.m, self.sys, self.cfg, self.w = model, system, cfg, weights
        self.dev = torch.device(device)
        self.ops = engine_ops(ref)
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
        self.index = parse_index(cfg.workload.index)    # the landmark designs' selection index (flat: today's)
        self.fuse_plan = not ref and not s.kv_on_gpu and fused_plan_fits(self.B, self.H, self.N, self.kc) \
            and not self.index.two_level      # two levels: the last top-k ranks candidates, not chunk ids
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
        self._init_host(host_kv, host_scales)
        self._init_selection_state(g0)
        self._init_buffers()

    # ------------------------------------------------------------------ helpers
    def _hl(self, i):
        return i % self.hl

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
        from ddbench.kernels.engine.capture import capture as guarded_capture
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
            if s.landmarks and self.index.name != "flat":
                from ddbench.kernels.indexkernels import index_select, index_select_ref
                pick = index_select_ref if self.ref else index_select
                return self._map(lambda t: pick(t.contiguous(), self.lm[i], self.kc, **kw), q)
            if s.landmarks:
                return self._map(lambda t: self.ops.select(t.contiguous(), self.lm[i], self.kc, **kw), q)
            return self._map(lambda t: self.ops.spec_select(t.contiguous(), self.qk[i], self.C, self.kc, **kw), q)

    def _sparse_attention(self, i, q, k, v, nq, predecode):
        """Layer i of a sparse design: its selection, the fetch of what the buffer lacks, the assembled
        buffer, the attention; then the prefetches this layer's end releases."""
        s, cfg = self.sys, self.cfg
        u = self.use
        have_pred = self.prefetch != "none" and not predecode
        # compute only (no transfers): a prediction design still plans its misses against the
        # prediction kept from the last step (and the forced misses are drawn), so that the
        # compute-only step differs from the full step by the transfers alone
        sim_pred = not cfg.transfers and s.prefetch != "none" and self.pred is not None
        true, fused_plan = self._selection(i, q, nq, predecode, have_pred, sim_pred)
        inplace = s.reuse and self.held_ok[i]
        true = self._forced(i, true, predecode, have_pred, sim_pred, inplace)
        # `plan`: the miss plan a side stream's fetch reads; held to the end of the layer (after the attention
        # has waited for that fetch), so that the compute stream cannot reuse its memory while the fetch reads it
        b, waits, assembled, rows, plan = self._fetch(i, u, true, fused_plan, have_pred, sim_pred, inplace)
        kb, vb = self.kbuf[b], self.vbuf[b]
        R = self._assemble(i, k, v, kb, vb, assembled, rows, inplace)
        o = self._attend(i, u, b, q, kb, vb, waits, rows)
        if self.debug is not None:
            self.debug.append(dict(layer=i, q=q.clone(), k=k.clone(), v=v.clone(), true=true.clone(),
                                   assembled=assembled.clone(), out=o.clone(), R=R, g=self.g_dev.clone(), nq=nq,
                                   recent_k=self.recent_k[i].clone(), recent_v=self.recent_v[i].clone(),
                                   lowrank=self.lowrank[i], step=self.steps, kb=kb.clone(), vb=vb.clone(),
                                   rows=None if rows is None else rows.clone(),
                                   pred=None if self.pred is None or predecode else self.pred[i].clone()))
        self.use += 1
        self._issue_after(u, i, nq, predecode)
        del plan                                  # as before the split: freed when the layer returns
        return o

    def _selection(self, i, q, nq, predecode, have_pred, sim_pred):
        """(this step's true selection [B, H, k], the top-k's own miss plan or None); the next step's
        prediction into pred_new[i]."""
        fused_plan = None
        if nq == 2 and not self.split:
            # the top-k writes token 0's ids (this step's true selection) and token 1's (the next
            # step's prediction) straight into their buffers: no slicing copies; with the model's
            # own selection its merge kernel also plans the misses against the prediction
            true = torch.empty(self.B, self.H, self.kc, device=self.dev, dtype=torch.int32)
            kw = dict(out=(true, self.pred_new[i]))
            if self.fuse_plan and self.cfg.miss_rate is None and (have_pred or sim_pred):
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
        return true, fused_plan

    def _forced(self, i, true, predecode, have_pred, sim_pred, inplace):
        """The forced rates of a timing run: `true` with cfg.miss_rate of it drawn new against its base
        (the prediction, the chunks held, or lru-cache's last selection), and a chunk cache's next
        prediction with cfg.churn_rate of it new. Returns the selection to fetch."""
        s, cfg = self.sys, self.cfg
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
        return true

    def _fetch(self, i, u, true, fused_plan, have_pred, sim_pred, inplace):
        """What layer i's buffer lacks, fetched (or, compute only, planned): (buffer id, the events the
        attention waits on, the chunk ids in the buffer's slot order, a chunk cache's row map or None, the
        miss plan a side-stream fetch reads or None)."""
        b = self._buf_of_use(u)
        if self.cache is not None:
            waits, rows = self._cache_fetch(i, u, true, have_pred)
            return b, waits, true, rows, None          # the cache's plans are its own buffers
        if inplace:
            return self._fetch_in_place(i, u, true)
        if not self.cfg.transfers:
            assembled = true
            if sim_pred:
                with nvtx_range("plan_misses"):
                    assembled = (fused_plan or self._plan(self.pred[i], true)).assembled
            return b, [], assembled, None, None
        if have_pred:
            return self._fetch_misses(i, u, b, true, fused_plan)
        return self._fetch_all(i, u, b, true)

    def _fetch_in_place(self, i, u, true):
        """ShadowKV: the layer's buffer holds self.held[i] (slot order). Hits stay where they are; the
        misses against it go into the slots of the chunks no longer selected: their values (and keys of
        a full-rank layer) on the urgent stream, on the critical path, while the compute stream rebuilds
        the keys of those slots only (_assemble). Compute only: planned, nothing fetched."""
        cfg, vo = self.cfg, self.lowrank[i]
        b = self.layer_buf[i]
        kb, vb = self.kbuf[b], self.vbuf[b]
        with nvtx_range("plan_misses"):
            plan = self._plan(self.held[i], true)
        waits = []
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
        return b, waits, plan.assembled, None, plan

    def _fetch_misses(self, i, u, b, true, fused_plan):
        """A prediction design: the true chunks the prefetch missed, planned on the device and fetched
        into the slots of the wrong predictions on the urgent stream, after this use's prefetches."""
        s, cfg, vo = self.sys, self.cfg, self.lowrank[i]
        kb, vb = self.kbuf[b], self.vbuf[b]
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
        self.stats.urgent_counts.append(plan.count)
        self.stats.urgent_layer.append((i, vo))
        return b, pre_ev + [ev_u], plan.assembled, None, plan

    def _fetch_all(self, i, u, b, true):
        """No prediction yet (pre-decoding) or nothing to reuse: every chunk on demand."""
        s, cfg, vo = self.sys, self.cfg, self.lowrank[i]
        if s.reuse:
            b = self.layer_buf[i]
        kk, vb = (None if vo else self.kbuf[b]), self.vbuf[b]

        def fetch_all():
            with nvtx_range(f"fetch L{i}"):
                if s.gather == "cpu":
                    self._cpu_gather_full(i, true, kk, vb)
                else:
                    self.gather(self.host, self._hl(i), true, kk, vb, programs=cfg.urgent_programs)
        # the side stream must also wait for `true`, computed just now on the compute stream
        ev_sel, _ = self.sched.run("compute", "select", lambda: None, layer=i)
        ev, _ = self.sched.run("urgent", "fetch", fetch_all, waits=[self.free_ev[b], ev_sel], layer=i, buf=b, use=u)
        self.stats.urgent_counts.append(true.numel())
        self.stats.urgent_layer.append((i, vo))
        return b, [ev], true, None, None               # `true` is the caller's, held as long

    def _assemble(self, i, k, v, kb, vb, assembled, rows, inplace):
        """The rebuilt keys of a low-rank layer, the resident window, the generated tokens and the new
        token(s) into the buffer. Returns R, the used resident rows (host mirror)."""
        s, C, kC = self.sys, self.C, self.kc * self.C
        vo = self.lowrank[i]
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
            ka, va, at = (kb, vb, kC) if rows is None else self.cache.assemble_target(i, kC)
            self.ops.assemble(ka, va, self.recent_k[i], self.recent_v[i], k, v, self.g_dev, at, self.R0)
        return R

    def _attend(self, i, u, b, q, kb, vb, waits, rows):
        """The attention over buffer b once its transfers are in; its end frees the buffer."""
        ev_wait, _ = self.sched.run("compute", "wait", lambda: None, waits=waits, layer=i, buf=b, use=u)
        kw = {} if rows is None else {"cache": CacheView(rows, **self.cache.attention_kw(i, self.kc * self.C))}
        if not self.ref and (self.B * self.H < 64 or (rows is not None and self.cfg.rows_two_waves)):
            # small batch (or, with the switch, a chunk cache's rows): about two waves of (request, head, split)
            sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
            kw["splits"] = max(1, min(2 * sms // (self.B * self.H), self.S // 256))
        with nvtx_range("attention"):
            o = self._attn(q, kb, vb, self.lengths, **kw)
        ev_attn, _ = self.sched.run("compute", "attention", lambda: None, layer=i, buf=b, use=u)
        self.free_ev[b] = ev_attn
        self.ready_ev.pop(u, None)
        self.prefetched.pop(u, None)
        return o

    def _issue_after(self, u, i, nq, predecode):
        """The prefetches that layer use u's end releases: layer-ahead (the buffer two uses on) or
        next-step (this layer's other set)."""
        if self.prefetch == "layer-ahead" and not predecode:
            nu = u + 2
            layer2 = nu % self.L
            pred = self.pred[layer2] if layer2 == i + 2 else self.pred_new[layer2]
            self._issue_prefetch(nu, pred)
        elif self.prefetch == "layer-ahead" and predecode and i >= self.L - 2:
            self._issue_prefetch(u + 2, self.pred_new[(u + 2) % self.L])
        if self.prefetch == "next-step" and (nq == 2 or predecode):
            self._issue_prefetch(u + self.L, self.pred_new[i])   # same layer, next step, other set
