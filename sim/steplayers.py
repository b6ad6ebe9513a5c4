"""What one decode step of a design does, layer by layer: the shared input of both simulator modes.

`step_layers(...)` reads only the design's switches (never its name) and the cost model, and
returns per-layer compute times and link work. Both the per-layer timeline (sim/timeline.py)
and the per-step aggregate (sim/aggregate.py) are built on it.

Per layer i of a step, for a batch of b requests:
  pre[i]   qkv projection (M = b * q tokens) + selection (landmark scoring, or a scan of the
           quantized key copy) + half the layer's glue (norm, RoPE); the true index of layer i is
           known at its end
  mid[i]   on the compute stream between the true index and attention: the low-rank key rebuild
           where layer i keeps low-rank keys, and assembling the attended buffer from the resident
           window (overlaps the urgent fetch, unless plan.ur_serial: then it follows it)
  att[i]   attention over the sparse working set (or the whole context where KV stays on the GPU)
  post[i]  output projection and gated MLP + the other half of the glue (norm, SwiGLU); under tensor
           parallelism (CostModel.set_tensor_parallel) the two all-reduces of the hidden state, after the
           output projection and after the MLP (0 at TP 1)
  link     prefetch bytes (the predicted selection, budget B per request) and urgent bytes
           (misses = (1 - hit rate) * B, or with reuse and no prefetch (1 - reuse rate) * B) of
           K+V, or of V alone where keys are rebuilt from the low-rank copy; D2H of the new
           token's KV for designs that offload it
  reuse    a design that reuses the previous step's selection and fetches its misses on demand
           (ShadowKV) is priced as the engine runs it in place (kernels/engine/engine.py, the reuse
           branch; traces/engine/h200-shadowkv-fast): per layer, its misses' values cross the link as
           urgent pieces once its selection is known, and the keys of those slots alone are rebuilt
           on the compute stream beside the fetch; hits stay in the buffer

Every command (simulate in both modes, plan, sweep, the figures) and sim/validate.py price a step
here, on one cost model (sim/factory.py); sim/validate.py adds only the engine's own terms: the harness's
forced-miss draw, and for rows of the engine before the in-place ShadowKV that
engine's copy-then-regather fetch (sim/fit/replay.py shadowkv_step, legacy_reuse_fetch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddbench.core.catalog.models import ModelSpec
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload, cache_slot_bytes, kv_piece_bytes, lowrank_layer_count
from ddbench.core.designs import DesignSpec
from ddbench.sim.costmodel import E, CostModel, LinkRates
from ddbench.sim.indexcost import select_index_s


@dataclass
class StepLayers:
    design: DesignSpec
    batch: int
    context: float                    # mean context per request
    q_tokens: int                     # query rows per request per pass
    passes: int                       # 2 for the two-pass ablation
    pre: list[float]
    mid: list[float]
    att: list[float]
    post: list[float]
    lm_s: float
    pf_bytes: list[float]
    ur_bytes: list[float]
    d2h_bytes: list[float]
    pf_work: list[float]              # link seconds at full rate (fixed cost included)
    ur_work: list[float]
    d2h_work: list[float]
    cpu_pf_work: list[float]          # host CPU gather seconds (CPU-gather ablation), else 0
    cpu_ur_work: list[float]
    slot_bytes: float                 # one layer's sparse KV buffer for the batch
    slots: int                        # 2 (ping-pong) or L
    rates: LinkRates | None
    lowrank: frozenset = field(default_factory=frozenset)
    # per layer, the shortest time from issuing the urgent fetch to its end, whatever the link does
    # (a latency-bound gather kernel; empty = none). step_layers sets none: the validation sets it for
    # the engine's old copy-then-regather ShadowKV rows (sim/fit/replay.py legacy_reuse_fetch,
    # CostModel.reuse_fetch_s)
    ur_min_s: list = field(default_factory=list)
    # the urgent fetch runs in the compute stream's order (its kernels on the compute stream, not a
    # side stream): the key rebuild (mid) starts when the fetch ends instead of overlapping it; set
    # only by the validation, for those same old-engine rows
    ur_serial: bool = False
    # compute beside a GPU gather runs this much slower: each kind's slowdown (LinkRates.slowdown_of)
    # weighted by the step's time in that kind (step_layers); 1 without a gather
    compute_slowdown: float = 1.0

    @property
    def layers(self) -> int:
        return len(self.pre)

    @property
    def compute_s(self) -> float:
        return sum(self.pre) + sum(self.mid) + sum(self.att) + sum(self.post) + self.lm_s

    @property
    def h2d_bytes(self) -> float:
        return sum(self.pf_bytes) + sum(self.ur_bytes)


def lowrank_layers(design: DesignSpec, m: ModelSpec, w: Workload, hit: list[float]) -> frozenset:
    """Layers with low-rank keys: all, none, or (adaptive) the w.lowrank_layers layers that predict worst
    (step_layers's `lowrank` replaces this last choice with a given set)."""
    if design.lowrank_keys == "all":
        return frozenset(range(m.num_layers))
    if design.lowrank_keys == "adaptive" and w.lowrank_layers:
        order = sorted(range(m.num_layers), key=lambda i: (hit[i], i))
        return frozenset(order[:w.lowrank_layers])
    return frozenset()


def attended_tokens(design: DesignSpec, w: Workload, context: float) -> float:
    """Tokens each new query attends over."""
    if design.kv_on_gpu:
        return context + w.gen_tokens / 2
    extra = w.quant_residual if design.quant_bits else w.local_chunks * w.chunk + w.gen_tokens // 2
    if design.outliers:
        extra += w.outlier_chunks * w.chunk
    return w.budget + extra


def resident_rows(design: DesignSpec, w: Workload) -> int:
    """Tokens of K/V the engine copies into a layer's attended buffer each step: ShadowKV's outlier
    chunks, the local window and the generated-token slots (kernels/engine/engine.py buffer_rows)."""
    return (w.outlier_chunks * w.chunk if design.outliers else 0) + w.local_chunks * w.chunk + w.gen_tokens


def step_layers(design: DesignSpec, m: ModelSpec, cm: CostModel, w: Workload, batch: int, context: float,
              hit: list[float], reuse: list[float], lowrank: frozenset | None = None, cache=None) -> StepLayers:
    """One decode step of `design`. `lowrank`: for an adaptive design, the layers with low-rank keys
    (e.g. the set an accuracy profile's summary picked, ddbench.sim.hitrates.lowrank_from_summary) instead of
    the w.lowrank_layers worst-predicted layers; it must hold w.lowrank_layers layers of the model, so
    that the memory model (which counts them) and the plan agree. Ignored by other designs.
    `cache` (ddbench.core.rates.CacheRates): a chunk-cache design's per-layer prefetched and urgent chunks
    over the budget (required for one; `hit` and `reuse` are not used for its link bytes; a design that
    prefetches nothing, lru-cache, must have none prefetched)."""
    L = m.num_layers
    passes = 2 if design.two_pass else 1
    q = 1 if design.two_pass else design.tokens_per_step
    c = _compute_terms(design, m, cm, w, batch, context, q)
    lr = _lowrank_set(design, m, w, hit, lowrank)
    reb = cm.rebuild_s(batch, w.budget, w.rank, triton=c["triton"]) if lr else 0.0
    _check_cache(design, cache, L)
    link = _link_work(design, m, cm, w, batch, hit, reuse, lr, cache)
    ur_min, serial = [], False      # the engine's ShadowKV fetches its misses in place (module doc)
    fill = cache_fills(design) * cm.cache_fill_s(batch, w.cache_tokens // w.chunk) if design.chunk_cache else 0.0
    pre = [passes * (c["lin_pre"] + c["sel"] + c["glue"] / 2) + fill] * L   # the fill plans the misses first
    # a reuse design rebuilds only the keys of the chunks that changed (its misses), beside their fetch
    mid = [passes * ((reb * ((1.0 - reuse[i]) if design.reuse else 1.0) if i in lr else 0.0) + c["asm"])
           for i in range(L)]
    lm = passes * cm.decode_linear_s(m.hidden, m.vocab, batch * q)
    slots = 2 if design.buffer_layers == "pingpong" else L
    slot_bytes = 0.0 if design.kv_on_gpu else batch * design.buffer_sets * (   # the cache's slots, or 16-bit buffers
        w.cache_tokens // w.chunk * m.num_kv_heads * cache_slot_bytes(m, w) if design.chunk_cache
        else w.budget * m.kv_bytes_per_token_layer)
    kinds = {"gemm": (L * passes * (c["lin_pre"] + c["lin_post"]) + lm + sum(mid) - L * passes * c["asm"], batch * q),
             "selection": (L * passes * c["sel"], batch * context / w.chunk),
             "attention": (L * passes * c["att"], batch),
             "elementwise": (L * (passes * (c["glue"] + c["asm"]) + fill), batch * q)}
    ar = 2 * cm.allreduce_s(batch * q * m.hidden * E)     # TP: after the output projection and the MLP
    return StepLayers(design, batch, context, q, passes, pre, mid, [passes * c["att"]] * L,
                      [passes * (c["lin_post"] + c["glue"] / 2 + ar)] * L, lm, link["pf_b"], link["ur_b"], link["d2h_b"],
                      link["pf_w"], link["ur_w"], link["d2h_w"], link["cpu_pf"], link["cpu_ur"],
                      slot_bytes, slots, link["rates"], lr, ur_min, serial, compute_slowdown(link["rates"], kinds))


def compute_slowdown(rates: LinkRates | None, kinds: dict) -> float:
    """The step's compute slowdown beside a GPU gather: each kind of kernel's at its size (gemm: the linear
    layers, the LM head and the key rebuild, in tokens; selection, in landmarks read; attention, in
    requests; elementwise: the glue, assembling the buffer and the chunk cache's fill) weighted by its time
    in the step. kinds: kind -> (seconds, size)."""
    if rates is None or rates.method != "uva_gather":
        return 1.0
    total = sum(t for t, _ in kinds.values())
    if total <= 0:
        return rates.compute_slowdown
    return sum(t * rates.slowdown_of(k, x) for k, (t, x) in kinds.items()) / total


def cache_fills(design: DesignSpec) -> int:
    """Chunk-cache fills per layer and step: the prefetch fill and the urgent fill (dualdecoder-cache),
    or the urgent fill alone where nothing is prefetched (lru-cache)."""
    return 1 + (design.prefetch != "none")


def _check_cache(design: DesignSpec, cache, layers: int) -> None:
    if not design.chunk_cache:
        return
    if cache is None or len(cache.prefetched) != layers:
        raise DDBenchError(f"{design.name} needs its cache rates for {layers} layers (ddbench.core.rates)")
    if design.prefetch == "none" and any(x > 0 for x in cache.prefetched):
        raise DDBenchError(f"{design.name} prefetches nothing, but its cache rates prefetch"
                           f" {max(cache.prefetched):g} of the budget per step: give it the replay's rates"
                           " without prediction (prefetched 0)")


def _compute_terms(design: DesignSpec, m: ModelSpec, cm: CostModel, w: Workload, batch: int, context: float,
                   q: int) -> dict:
    """One pass's per-layer compute pieces: the linear layers, the glue, assembling the attended buffer,
    the selection and the attention."""
    mt = batch * q
    qd, kvd = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    out = {"lin_pre": cm.decode_linear_s(m.hidden, qd + 2 * kvd, mt),
           "lin_post": cm.decode_linear_s(qd, m.hidden, mt) + cm.decode_linear_s(m.hidden, 2 * m.intermediate, mt)
           + cm.decode_linear_s(m.intermediate, m.hidden, mt),
           "glue": cm.glue_s(mt),
           "asm": 0.0 if design.kv_on_gpu else cm.assemble_s(batch, resident_rows(design, w))}
    ctx_i = max(1, int(round(context)))
    # the design's `kernels` switch picks microbenchmark rows where the cost model is NOT RECONCILED
    # with the engine: "triton" the Triton kernels of kernels/ (selection, dual-token or single-token
    # sparse attention, key rebuild), "torch" torch ops (SDPA decode, matmul/softmax/topk selection,
    # gather + matmul rebuild) standing in for a design's own implementation. Reconciled (the bundle has
    # the engine's kernel breakdown), every sparse design is costed with the engine's kernels, the only
    # implementation measured in whole steps (kernels/engine/engine.py runs Triton kernels for all)
    tri = out["triton"] = design.kernels == "triton"
    if design.landmarks:
        out["sel"] = select_index_s(cm, batch, q, ctx_i, w, triton=tri)
    elif design.quant_bits:
        out["sel"] = cm.quant_scan_s(batch, q, ctx_i, design.quant_bits, w.quant_group, w.chunk)
    else:
        out["sel"] = 0.0
    # an fp8 chunk cache (cache_bits 8) is priced as the bf16 attention at the same tokens: the Triton fp8
    # attention measured on the H200 took the same time (batch 64: 0.268 ms fp8, 0.260 ms bf16;
    # traces/kernels/h200-attention-fp8/); its gain is the memory (a larger max batch, ddbench/core/memory.py)
    if design.chunk_cache and w.cache_bits == 8:
        cm._note("fp8 chunk cache (cache_bits 8): attention priced as the bf16 kernel at the same tokens, as"
                 " measured (traces/kernels/h200-attention-fp8: 0.268 ms fp8, 0.260 ms bf16 at batch 64)")
    out["att"] = cm.attention_decode_s(batch, q, max(1, int(round(attended_tokens(design, w, context)))),
                                       triton=tri and not design.kv_on_gpu)
    return out


def _lowrank_set(design: DesignSpec, m: ModelSpec, w: Workload, hit: list[float], lowrank) -> frozenset:
    """The layers with low-rank keys: a given set (checked against the model and the workload) or the
    design's own choice (lowrank_layers)."""
    if lowrank is None or design.lowrank_keys != "adaptive":
        return lowrank_layers(design, m, w, hit)
    lr = frozenset(int(i) for i in lowrank)
    if any(not 0 <= i < m.num_layers for i in lr):
        raise DDBenchError(f"low-rank key layers {sorted(lr)} are outside the model's 0..{m.num_layers - 1}")
    if len(lr) != w.lowrank_layers:
        raise DDBenchError(f"low-rank key layer set has {len(lr)} layers but the workload counts"
                           f" {w.lowrank_layers} (--lowrank-layers); the memory model would disagree")
    return lr


def _link_work(design: DesignSpec, m: ModelSpec, cm: CostModel, w: Workload, batch: int, hit: list[float],
               reuse: list[float], lr: frozenset, cache) -> dict:
    """Per layer, the H2D bytes prefetched and urgent, the D2H bytes, and their link (and host CPU) work."""
    L = m.num_layers
    out = {k: [0.0] * L for k in ("pf_b", "ur_b", "d2h_b", "pf_w", "ur_w", "d2h_w", "cpu_pf", "cpu_ur")}
    out["rates"] = None
    if design.kv_on_gpu or design.fetch == "none":
        return out
    piece = kv_piece_bytes(m, w)     # K or V of a chunk-head as it crosses the link (bf16, or fp8 + scale)
    values_only_all = design.fetch == "values"
    chunk_bytes = (1 if values_only_all else 2) * piece
    rates = cm.link_rates(design.gather, chunk_bytes, fp8=w.kv_bits != 16)
    rates_v = cm.link_rates(design.gather, piece, fp8=w.kv_bits != 16) \
        if lr and not values_only_all else rates
    if design.reuse and design.prefetch == "none" and design.gather == "gpu" and w.kv_bits == 16:
        rates = rates_v = cm.slot_gather_rates(chunk_bytes)     # the in-place fetch's own launch (module doc)
    if w.kv_bits != 16:
        cm._note("fp8 KV: link and host bytes in e4m3 with a scale per chunk-head, gathered at the rate measured"
                 " for the engine's fp8 launch and that piece size; " + ("the chunk cache keeps them in fp8 (cache_bits 8)"
                 if design.chunk_cache and w.cache_bits == 8 else "the gathers dequantise into bf16 buffers, so"
                 " attention is the bf16 kernel"))
    out["rates"] = rates
    for i in range(L):
        values_only = values_only_all or i in lr
        f = (1 if values_only else 2) * m.num_kv_heads * piece / w.chunk     # bytes per token and layer
        r = rates_v if values_only else rates
        full = batch * w.budget * f
        if design.chunk_cache:          # only what the cache misses crosses the link
            pf, ur = full * cache.prefetched[i], full * cache.urgent[i]
        elif design.prefetch == "none":
            pf, ur = 0.0, full * ((1.0 - reuse[i]) if design.reuse else 1.0)
        else:
            pf, ur = full, full * (1.0 - hit[i])
        out["pf_b"][i], out["ur_b"][i] = pf, ur
        for b_, wl, cl in ((pf, out["pf_w"], out["cpu_pf"]), (ur, out["ur_w"], out["cpu_ur"])):
            if b_ > 0:
                wl[i] = r.h2d_t0_s + b_ / (r.h2d_gbps * 1e9)
                if r.cpu_gather_gbps:
                    cl[i] = b_ / (r.cpu_gather_gbps * 1e9)
        out["d2h_b"][i] = batch * m.kv_bytes_per_token_layer * w.kv_bits / 16  # the output token's K and V to host
        out["d2h_w"][i] = rates.d2h_t0_s + out["d2h_b"][i] / (rates.d2h_gbps * 1e9)
    return out


def prefill_chunk_s(design: DesignSpec, m: ModelSpec, cm: CostModel, w: Workload, tokens: int, prefix: int,
                    last: bool, context: int) -> tuple[float, float]:
    """(GPU seconds, D2H seconds) of one chunked-prefill pass of `tokens` after `prefix` tokens.

    GPU: the four linear layers at M = tokens and causal attention for every layer, the LM head
    on the last chunk, and the low-rank SVD of every low-rank layer on the last chunk.
    D2H: the chunk's K and V of all layers copied to host memory (offloading designs)."""
    qd, kvd = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    lin = (cm.linear_s(m.hidden, qd + 2 * kvd, tokens) + cm.linear_s(qd, m.hidden, tokens)
           + cm.linear_s(m.hidden, 2 * m.intermediate, tokens) + cm.linear_s(m.intermediate, m.hidden, tokens))
    gpu = m.num_layers * (lin + cm.prefill_attention_s(tokens, prefix) + 2 * cm.allreduce_s(tokens * m.hidden * E))
    if last:
        gpu += cm.linear_s(m.hidden, m.vocab, 1)
        n_lr = lowrank_layer_count(design, m, w)
        if n_lr:
            gpu += n_lr * cm.svd_s(context, w.rank)
    d2h = 0.0
    if not design.kv_on_gpu and design.fetch != "none":
        r = cm.link_rates(design.gather, 2 * w.chunk * m.head_dim * E)
        d2h = r.d2h_t0_s + tokens * m.kv_bytes_per_token / (r.d2h_gbps * 1e9)
    return gpu, d2h
