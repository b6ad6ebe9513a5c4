"""GPU and host memory model of every design in the registry.

For a model, a GPU, a design and a workload (context, batch, sparse budget,
chunk size, rank...) it gives GPU bytes by category and the largest batch that
fits; and the pinned host bytes each request keeps (`host_kv_bytes`), which bound
the batch too where host memory is given (`batch_bounds`). Every term follows from
the mechanism; its formula is in the docstring of the function that computes it. Notation: L layers, H query heads, H_kv KV
heads, d head dim, h hidden, I intermediate, V vocab, e = 2 bytes (bf16),
S context tokens, b batch, B sparse budget in tokens, C chunk size, r rank.

The four kept categories (resident KV, landmarks, auxiliary residency, sparse KV buffers) are what
the engine allocates, tensor for tensor (kernels/engine: its allocation plan, plan_bytes, is these
functions; tests/test_memory_engine.py checks them against every committed engine row's recorded
memory). Weights, activations and the runtime's own memory are the model's. The shapes follow
ShadowKV's public implementation where it fixes them: per-layer K and V buffers of the selected chunks
plus the (outlier + local + generated) rows, U [L, b, S, r], SV [L, b, H_kv, d, r], landmarks
[L, b, H_kv, S/C, d] bf16 (our selection keeps no int64 chunk index beside them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from ddbench.core.catalog.gpus import GPUSpec
from ddbench.core.catalog.models import ModelSpec
from ddbench.core.designs import DesignSpec
from ddbench.core.errors import DDBenchError
from ddbench.core.index import FLAT, parse_index, resident_bytes as index_resident_bytes, scored_chunks
from ddbench.core.workload import Workload  # noqa: F401  (the one Workload; re-exported here)

CATEGORIES = ("weights", "resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers",
              "activations", "runtime_overhead")
FP32 = 4
INT32 = 4            # selection ids, cache slots' chunk ids and stamps, row and plan entries
MAX_BATCH_SEARCH = 1 << 20


@dataclass(frozen=True)
class MemoryBreakdown:
    system: str
    model: str
    gpu: str
    context: int
    batch: int
    weights: int
    resident_kv: int
    landmarks: int
    aux_residency: int
    sparse_kv_buffers: int
    activations: int
    runtime_overhead: int
    capacity: int

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in CATEGORIES)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d


def weights_bytes(model: ModelSpec) -> int:
    """All parameters in bf16: e * (V*h [embedding] + L*layer + h + V*h [untied head])."""
    return model.weight_bytes


def buffer_rows(design: DesignSpec, w: Workload) -> tuple[int, int, int, int]:
    """(outlier rows, resident rows R0, resident capacity Rcap, buffer tokens S) of a sparse design's KV
    buffers: S = the k selected chunks, then Rcap + 2 rows (outliers, the local window, the
    generated-token slots and the two new tokens of a step) rounded up to whole chunks."""
    C = w.chunk
    out_rows = w.outlier_chunks * C if design.outliers else 0
    R0 = out_rows + w.local_chunks * C
    Rcap = R0 + w.gen_tokens
    return out_rows, R0, Rcap, (w.budget // C) * C + -(-(Rcap + 2) // C) * C


def selects(design: DesignSpec) -> bool:
    """A sparse design with a selection of its own (landmarks or a quantized copy) and the buffers that
    serve it; a design with neither (ideal: Figure 2's bound) keeps only a budget-sized working set."""
    return not design.kv_on_gpu and bool(design.landmarks or design.quant_bits)


def resident_kv_bytes(design: DesignSpec, m: ModelSpec, w: Workload) -> int:
    """Exact 16-bit KV kept in HBM for all layers.

    full-kv:          b * (S + gen + 2) * L * 2 * H_kv * d * e   (the context, generated slots, a step's new tokens)
    sparse designs:   b * (local_chunks * C + gen) * L * 2 * H_kv * d * e  (recent window + generated tokens)
    """
    if design.kv_on_gpu:
        tokens = w.context + w.gen_tokens + 2
    elif selects(design):
        tokens = w.local_chunks * w.chunk + w.gen_tokens
    else:
        tokens = 0
    return w.batch * tokens * m.kv_bytes_per_token


def landmark_bytes(design: DesignSpec, m: ModelSpec, w: Workload) -> int:
    """Chunk-mean post-RoPE keys, every layer and KV head: b * L * H_kv * ceil(S / C) * d * e for the flat
    index; another index (Workload.index): its levels' bytes with their scales (ddbench.core.index.resident_bytes)
    in place of d * e per chunk."""
    if not design.landmarks:
        return 0
    chunks = math.ceil(w.context / w.chunk)
    spec = parse_index(w.index)
    if spec == FLAT:
        return w.batch * m.num_layers * m.num_kv_heads * chunks * m.head_dim * m.dtype_bytes
    return w.batch * m.num_layers * m.num_kv_heads * index_resident_bytes(spec, chunks, m.head_dim)


def lowrank_layer_count(design: DesignSpec, m: ModelSpec, w: Workload) -> int:
    return {"none": 0, "all": m.num_layers, "adaptive": w.lowrank_layers}[design.lowrank_keys]


def aux_residency_bytes(design: DesignSpec, m: ModelSpec, w: Workload, quant_values: bool = True) -> int:
    """KV-cache-auxiliary residency: state kept only to make sparse retrieval fast.

    low-rank K (per low-rank layer): U = b * S * r * e  plus  SV = b * H_kv * d * r * e
    outliers:  b * L * (outliers_per_1k * B / 1024) * C * 2 * H_kv * d * e
    quantized copy of the prompt (q bits, group g, per layer and KV head, KIVI layout; generated tokens
    stay 16-bit in resident_kv_bytes):
        K: S * d * q / 8 packed, a scale and zero per channel per g tokens: 2 * floor(S / g) * d * e
        V (quant_values; the engine's step reads only the keys, so it may leave them out):
           S * d * q / 8 packed, a scale and zero per token per g channels: 2 * S * ceil(d / g) * e
    """
    total = 0
    n_lr = lowrank_layer_count(design, m, w)
    total += w.batch * n_lr * (w.context * w.rank + m.num_kv_heads * m.head_dim * w.rank) * m.dtype_bytes
    if design.outliers:
        total += w.batch * w.outlier_chunks * w.chunk * m.kv_bytes_per_token
    if design.quant_bits:
        S, d, g, e, q = w.context, m.head_dim, w.quant_group, m.dtype_bytes, design.quant_bits
        per_head = d * (S * q // 8 + 2 * (S // g) * e)
        if quant_values:
            per_head += S * (d * q // 8 + 2 * math.ceil(d / g) * e)
        total += w.batch * m.num_layers * m.num_kv_heads * per_head
    return total


CACHE_MAP_BYTES = 2     # int16 slot of every chunk (-1: not cached), and of a sink
CACHE_SLOT_BYTES = 8    # int32 chunk id and int32 last-use stamp of every slot, and of a sink


def kv_piece_bytes(m: ModelSpec, w: Workload) -> int:
    """K or V of one chunk and KV head as kept on the host and moved: C * d * kv_bits / 8, plus its fp32
    scale where kv_bits is 8 (fp8 e4m3, kernels/fp8.py)."""
    return w.chunk * m.head_dim * w.kv_bits // 8 + (FP32 if w.kv_bits == 8 else 0)


def keeps_kv_on_host(design: DesignSpec) -> bool:
    """A design whose 16-bit KV lives on the host and crosses the link: what fp8 (kv_bits 8) applies to."""
    return not (design.kv_on_gpu or design.fetch == "none" or design.quant_bits)


def check_kv_bits(design: DesignSpec, gpu: GPUSpec, w: Workload) -> None:
    """One-line DDBenchError for fp8 KV on a design that keeps no KV on the host, or a GPU without fp8."""
    if w.kv_bits == 16:
        return
    if not keeps_kv_on_host(design):
        raise DDBenchError(f"{design.name}: fp8 KV (kv_bits 8) applies to designs that keep their KV on the host"
                           " (dualdecoder, dualdecoder-cache, shadowkv's values)")
    if not gpu.fp8:
        raise DDBenchError(f"fp8 KV (kv_bits 8) needs a GPU with fp8 support; {gpu.name} has none")


def cache_slot_bytes(m: ModelSpec, w: Workload) -> int:
    """K and V of one chunk-cache slot (one chunk, layer and KV head): 2 * C * d * e where cache_bits is 16
    (the model's dtype), or 2 * C * d plus their two fp32 scales (one for K, one for V) where cache_bits is 8
    (fp8 e4m3 slots, copied from the fp8 host KV as they are)."""
    if w.cache_bits == 8:
        return 2 * w.chunk * m.head_dim + 2 * FP32
    return 2 * w.chunk * m.head_dim * m.dtype_bytes


def check_cache_bits(design: DesignSpec, w: Workload) -> None:
    """One-line DDBenchError for an fp8 chunk cache (cache_bits 8) on a design that keeps none."""
    if w.cache_bits != 16 and not design.chunk_cache:
        raise DDBenchError(f"{design.name}: an fp8 chunk cache (cache_bits 8) applies to the chunk-cache designs"
                           " (dualdecoder-cache, lru-cache)")


def chunk_cache_bytes(design: DesignSpec, m: ModelSpec, w: Workload) -> int:
    """A chunk-cache design's GPU chunk cache proper (dualdecoder-cache, lru-cache: the same bytes), every
    layer and KV head: its K and V slots, its map and its slots' chunk ids and stamps, each with a sink entry,
    b * L * H_kv * (cache_tokens / C * slot + (ceil(S / C) + 1) * 2 + (cache_tokens / C + 1) * 8), where a
    slot (cache_slot_bytes) is 2 * C * d * e in bf16 (cache_bits 16, whatever kv_bits: the gathers
    dequantise fp8 into it) or 2 * C * d + 2 * 4 in fp8 with its K and V scales (cache_bits 8).
    kernels/engine/chunkcache.py allocates exactly this; its tail rows, row map and fill plans are in
    sparse_buffer_bytes. 0 for other designs."""
    if not design.chunk_cache:
        return 0
    slots = w.cache_tokens // w.chunk
    per_head = slots * cache_slot_bytes(m, w) + (math.ceil(w.context / w.chunk) + 1) * CACHE_MAP_BYTES \
        + (slots + 1) * CACHE_SLOT_BYTES
    return w.batch * m.num_layers * m.num_kv_heads * per_head


def check_chunk_cache(design: DesignSpec, m: ModelSpec, gpu: GPUSpec, w: Workload) -> None:
    """One-line DDBenchError for a chunk cache smaller than the budget, or one whose single request leaves
    no room beside the weights on `gpu` (where the weights alone do not fit, that is the answer, not an error)."""
    if not design.chunk_cache:
        return
    if w.cache_tokens < w.budget:
        raise DDBenchError(f"{design.name}: the chunk cache ({w.cache_tokens} tokens per layer and KV head) must hold"
                           f" at least the budget ({w.budget} tokens)")
    one = chunk_cache_bytes(design, m, replace(w, batch=1))
    if gpu.hbm_bytes > m.weight_bytes and one > gpu.hbm_bytes - m.weight_bytes:   # weights too big: "does not fit"
        raise DDBenchError(f"{design.name}: the chunk cache of one request ({one / 1e9:.1f} GB) leaves no room beside"
                           f" {m.name}'s weights on {gpu.name} ({(gpu.hbm_bytes - m.weight_bytes) / 1e9:.1f} GB free)")


def holds_selection(design: DesignSpec) -> bool:
    """Whether each layer's last selection is kept: ShadowKV's reuse (its buffer's chunks), and a chunk
    cache without prefetch (the base of the engine's forced misses: each step's selection is the last one's
    with the miss rate of it new)."""
    return bool(design.reuse or (design.chunk_cache and design.prefetch == "none"))


def selection_id_sets(design: DesignSpec, transfers: bool = True) -> int:
    """int32 selections [L, b, H_kv, k] kept across steps: this step's, the prediction's (a prefetching
    design; without transfers only a dual-token step still predicts) and the last one held."""
    predicts = design.prefetch != "none" and (transfers or design.tokens_per_step == 2)
    return 1 + predicts + holds_selection(design)


def sparse_buffer_bytes(design: DesignSpec, m: ModelSpec, w: Workload, transfers: bool = True) -> int:
    """GPU buffers that receive the selected KV, 16-bit whatever kv_bits (the gathers dequantise fp8 pieces
    into them, kernels/gather.py), and the selections kept across steps. With S buffer tokens (buffer_rows)
    and k = B / C selected chunks, n = 2 buffers (ping-pong) or L * sets:
        n * 2 * b * H_kv * S * d * e  +  ids * L * b * H_kv * k * 4   (selection_id_sets)
      + CPU-gather staging 2 * b * H_kv * k * 2 * C * d * e
    A chunk-cache design instead: its cache (chunk_cache_bytes), the tail rows 2 * L * b * H_kv * (S - k C) * d * e,
    the row map b * H_kv * S * 4, and per fill kind (the urgent one, and the prefetch's) a plan
    (3 * (b H_kv k + 1) + 1) * 4 and its chunks b * H_kv * k * 4. A design without a selection of its own
    (ideal) keeps a working set of the budget: b * L * sets * B * 2 * H_kv * d * e."""
    if design.kv_on_gpu:
        return 0
    L, b, H, d, e = m.num_layers, w.batch, m.num_kv_heads, m.head_dim, m.dtype_bytes
    if not selects(design):
        return b * L * design.buffer_sets * w.budget * m.kv_bytes_per_token_layer
    C, kc, S = w.chunk, w.budget // w.chunk, buffer_rows(design, w)[3]
    ids = selection_id_sets(design, transfers) * L * b * H * kc * INT32
    if design.chunk_cache:
        plans = 1 + (design.prefetch != "none")
        return (chunk_cache_bytes(design, m, w) + 2 * L * b * H * (S - kc * C) * d * e + b * H * S * INT32
                + plans * ((3 * (b * H * kc + 1) + 1) * INT32 + b * H * kc * INT32) + ids)
    nbuf = 2 if design.buffer_layers == "pingpong" else L * design.buffer_sets
    total = nbuf * 2 * b * H * S * d * e + ids
    if design.gather == "cpu":
        total += 2 * b * H * kc * 2 * C * d * e
    return total


def _token_live_bytes(m: ModelSpec) -> int:
    """Largest live set of one token inside a layer: residual stream plus the widest stage,
    attention (q, k, v, output) or MLP (gate, up, activation)."""
    e = m.dtype_bytes
    attn = (2 * m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    mlp = 3 * m.intermediate
    return e * (m.hidden + max(attn, mlp))


def decode_activation_bytes(design: DesignSpec, m: ModelSpec, w: Workload) -> int:
    """Transient memory of one decode step, T = b * tokens_per_step (b for a two-pass design, which runs one
    token at a time):
        T * (token live set + V * (e + 4))       [bf16 and fp32 logits]
      + T * H * ceil(S / C) * 2 * e              [landmark scores + softmax, bf16]
      + T * H * (S + gen) * 2 * e                [token-level scores against a quantized copy]
    """
    e = m.dtype_bytes
    t = w.batch * (1 if design.two_pass else design.tokens_per_step)
    decode = t * (_token_live_bytes(m) + m.vocab * (e + FP32))
    if design.landmarks:
        decode += t * m.num_heads * scored_chunks(parse_index(w.index), math.ceil(w.context / w.chunk),
                                                  w.budget // w.chunk) * 2 * e
    if design.quant_bits:
        decode += t * m.num_heads * (w.context + w.gen_tokens) * 2 * e
    return decode


def prefill_activation_bytes(design: DesignSpec, m: ModelSpec, w: Workload) -> int:
    """Transient memory of one chunked prefill beside the decode step, P = min(prefill_chunk, S) tokens of one
    request: P * token live set + V * (e + 4), plus S * H_kv * d * 4 * 2 where keys are factorised (fp32 key
    matrix and U of the SVD). A decode-only engine run holds none of it."""
    prefill = min(w.prefill_chunk, w.context) * _token_live_bytes(m) + m.vocab * (m.dtype_bytes + FP32)
    if lowrank_layer_count(design, m, w):
        prefill += w.context * m.num_kv_heads * m.head_dim * FP32 * 2
    return prefill


def activation_bytes(design: DesignSpec, m: ModelSpec, w: Workload) -> int:
    """Transient memory of one decode step plus one chunked prefill beside it (serving admits while a
    prefill runs): decode_activation_bytes + prefill_activation_bytes."""
    return decode_activation_bytes(design, m, w) + prefill_activation_bytes(design, m, w)


def memory_breakdown(design: DesignSpec, m: ModelSpec, gpu: GPUSpec, w: Workload) -> MemoryBreakdown:
    """GPU bytes by category for `w.batch` requests of `w.context` tokens."""
    w.validate(m)
    check_chunk_cache(design, m, gpu, w)
    check_kv_bits(design, gpu, w)
    check_cache_bits(design, w)
    return MemoryBreakdown(
        system=design.name, model=m.name, gpu=gpu.name, context=w.context, batch=w.batch,
        weights=weights_bytes(m),
        resident_kv=resident_kv_bytes(design, m, w),
        landmarks=landmark_bytes(design, m, w),
        aux_residency=aux_residency_bytes(design, m, w),
        sparse_kv_buffers=sparse_buffer_bytes(design, m, w),
        activations=activation_bytes(design, m, w),
        runtime_overhead=gpu.runtime_overhead_bytes,
        capacity=gpu.hbm_bytes,
    )


def max_batch(design: DesignSpec, m: ModelSpec, gpu: GPUSpec, w: Workload) -> int:
    """Largest batch whose breakdown fits in the GPU (0 if not even one request fits)."""
    def fits(b: int) -> bool:
        return memory_breakdown(design, m, gpu, replace(w, batch=b)).fits

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi < MAX_BATCH_SEARCH and fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# ---------------------------------------------------------------- host memory
def host_kv_bytes(design: DesignSpec, m: ModelSpec, w: Workload) -> int:
    """Pinned host bytes one request keeps: its prompt's 16-bit KV, whatever a selected chunk may need
    to fetch (generated tokens stay on the GPU, `resident_kv_bytes`):

        K+V (fetch "kv": dualdecoder and its ablations, specache, ideal):
            S * ((L - n_lr) * 2 + n_lr) * H_kv * d * e
            where n_lr low-rank key layers rebuild keys on the GPU and keep only values on the host
            (adaptive key reconstruction; 0 by default, so S * L * 2 * H_kv * d * e)
        values only (fetch "values": shadowkv, whose keys are low-rank on the GPU):  S * L * H_kv * d * e
        nothing (full-kv: the KV stays on the GPU)

    SpeCache's 1-2 bit copy lives on the GPU (aux residency), its 16-bit KV on the host. With kv_bits 8
    (fp8 e4m3) every K or V piece of a chunk and KV head is C * d bytes plus a 4-byte scale
    (kv_piece_bytes). For Llama-3-8B at 128K: 16 GiB (K+V) and 8 GiB (values) in bf16, 8.03 and
    4.02 GiB in fp8."""
    w.validate(m)
    if design.kv_on_gpu or design.fetch == "none":
        return 0
    if design.fetch == "values":
        tensors = m.num_layers
    else:
        n_lr = lowrank_layer_count(design, m, w)
        tensors = (m.num_layers - n_lr) * 2 + n_lr            # K and V per layer, V alone where keys are low-rank
    if w.kv_bits == 8:     # fp8: whole chunks, each K or V piece with its scale
        return math.ceil(w.context / w.chunk) * tensors * m.num_kv_heads * kv_piece_bytes(m, w)
    return w.context * tensors * m.num_kv_heads * m.head_dim * m.dtype_bytes


BOUND_GPU, BOUND_HOST, BOUND_BOTH = "gpu memory", "host memory", "gpu and host memory"


@dataclass(frozen=True)
class BatchBounds:
    """The largest batch by GPU memory and by host memory, and which one binds."""
    max_batch_gpu: int
    host_bytes_per_request: int
    host_bytes_available: int | None      # per GPU; None: host memory is not a bound
    max_batch_host: int | None            # None: not bounded (no host memory given, or nothing kept there)

    @property
    def max_batch(self) -> int:
        return self.max_batch_gpu if self.max_batch_host is None else min(self.max_batch_gpu, self.max_batch_host)

    @property
    def bound_by(self) -> str:
        h = self.max_batch_host
        if h is None or h > self.max_batch_gpu:
            return BOUND_GPU
        return BOUND_HOST if h < self.max_batch_gpu else BOUND_BOTH

    def host_fits(self, batch: int) -> bool:
        return self.max_batch_host is None or batch <= self.max_batch_host

    def as_dict(self) -> dict:
        return {"host_bytes_per_request": self.host_bytes_per_request,
                "host_bytes_available": self.host_bytes_available, "max_batch_gpu": self.max_batch_gpu,
                "max_batch_host": self.max_batch_host, "max_batch": self.max_batch, "bound_by": self.bound_by}


def max_batch_host(design: DesignSpec, m: ModelSpec, w: Workload, host_bytes: int | None) -> int | None:
    """Requests whose host KV fits in `host_bytes`: floor(host_bytes / host_kv_bytes); None where
    host memory is not a bound (no `host_bytes`, or a design that keeps nothing on the host)."""
    per = host_kv_bytes(design, m, w)
    if host_bytes is None or per == 0:
        return None
    return int(host_bytes // per)


def batch_bounds(design: DesignSpec, m: ModelSpec, gpu: GPUSpec, w: Workload,
                 host_bytes: int | None = None) -> BatchBounds:
    """The largest batch by GPU memory (`max_batch`) and by `host_bytes` of host memory for this GPU's
    requests (None: not a bound), at `w.context`."""
    return BatchBounds(max_batch(design, m, gpu, w), host_kv_bytes(design, m, w), host_bytes,
                       max_batch_host(design, m, w, host_bytes))
