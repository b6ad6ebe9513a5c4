"""The registry of serving designs, shared by name by the memory model, the
simulator and the engine. A design's name is the one word for it in code and outputs; the CLI's
`--design` (alias `--system`) and the sweep spec's `design:` (alias `system:`) take these names.

Each design is a frozen set of mechanism switches. The memory model
(`ddbench.core.memory`) and the cost models read these switches; no code branches on
a design's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddbench.core.errors import DDBenchError, unknown


@dataclass(frozen=True)
class DesignSpec:
    name: str
    description: str
    kv_on_gpu: bool = False          # full-kv: the whole context's KV stays in HBM
    landmarks: bool = False          # chunk-mean keys resident for selection
    lowrank_keys: str = "none"       # "none" | "all" | "adaptive" (some layers; see Workload.lowrank_layers)
    outliers: bool = False           # ShadowKV's exact outlier chunks resident in HBM
    quant_bits: int = 0              # SpeCache: resident 1/2-bit KV copy used for scoring
    buffer_layers: str = "all"       # sparse KV buffer per layer ("all") or two-layer ping-pong ("pingpong")
    buffer_sets: int = 1             # budget-sized sets per buffered layer (current + speculative = 2)
    tokens_per_step: int = 1         # 2 = dual-token step (output token + speculative token)
    two_pass: bool = False           # speculative token decoded in a second pass (ablation)
    fetch: str = "kv"                # what crosses the link for a selected chunk: "kv" or "values"
    prefetch: str = "none"           # "none" | "next-step" (SpeCache) | "layer-ahead" (i+2, DualDecoder)
    urgent_priority: bool = False    # misses served before prefetches
    gather: str = "gpu"              # "gpu" (kernel reads pinned host memory) | "cpu" (index_select + copy)
    reuse: bool = False              # keep previous step's chunks, fetch only the misses
    kernels: str = "torch"           # decode kernels: "torch" (SDPA, matmul/top-k selection, gather + matmul
                                     # rebuild) or "triton" (kernels/: selection, sparse attention, rebuild)
    chunk_cache: bool = False        # a per-request GPU cache of chunks per (layer, KV head), Workload.cache_tokens
                                     # each; only predicted chunks it misses are prefetched, only true chunks in
                                     # neither are urgent (dualdecoder-cache)


DESIGNS: dict[str, DesignSpec] = {s.name: s for s in [
    DesignSpec("full-kv", "vLLM-like: the whole KV cache in GPU memory", kv_on_gpu=True, fetch="none"),
    DesignSpec("shadowkv", "ShadowKV: low-rank pre-RoPE K + landmarks + outliers on GPU; values of"
               " missed chunks fetched on the critical path, reusing the previous selection",
               landmarks=True, lowrank_keys="all", outliers=True, fetch="values", reuse=True),
    DesignSpec("specache", "SpeCache: 2-bit KV copy on GPU for scoring; top-k 16-bit KV fetched;"
               " speculative token prefetches the next step", quant_bits=2, buffer_sets=2,
               tokens_per_step=2, prefetch="next-step"),
    DesignSpec("dualdecoder", "DualDecoder: landmarks only; dual-token step; prefetch of layer i+2"
               " after layer i's attention; urgent misses first; two-layer ping-pong; GPU gather",
               landmarks=True, lowrank_keys="adaptive", buffer_layers="pingpong", tokens_per_step=2,
               prefetch="layer-ahead", urgent_priority=True, kernels="triton"),
    DesignSpec("dualdecoder-cache", "Beyond the paper: DualDecoder plus a per-request GPU chunk cache per"
               " (layer, KV head), LRU on the GPU; layer-ahead prefetch of the predicted chunks it misses,"
               " urgent fetch of the true chunks in neither; K and V fetched (no low-rank keys)",
               landmarks=True, tokens_per_step=2, prefetch="layer-ahead", urgent_priority=True, kernels="triton",
               chunk_cache=True),
    DesignSpec("lru-cache", "HiSparse-like cache only: landmarks select on the GPU; the per-request GPU chunk"
               " cache of dualdecoder-cache, LRU; no speculative token and no prefetch: every chunk of the step's"
               " own selection the cache lacks is fetched urgent before that layer's attention (K and V)",
               landmarks=True, kernels="triton", chunk_cache=True),
    DesignSpec("dualdecoder-per-layer", "DualDecoder ablation: per-layer sparse KV buffers instead of ping-pong",
               landmarks=True, lowrank_keys="adaptive", tokens_per_step=2, prefetch="layer-ahead",
               urgent_priority=True, kernels="triton"),
    DesignSpec("dualdecoder-fifo", "DualDecoder ablation: misses queue behind prefetches (no priority)",
               landmarks=True, lowrank_keys="adaptive", buffer_layers="pingpong", tokens_per_step=2,
               prefetch="layer-ahead", kernels="triton"),
    DesignSpec("dualdecoder-cpu-gather", "DualDecoder ablation: CPU index_select into pinned staging + one copy",
               landmarks=True, lowrank_keys="adaptive", buffer_layers="pingpong", tokens_per_step=2,
               prefetch="layer-ahead", urgent_priority=True, gather="cpu", kernels="triton"),
    DesignSpec("dualdecoder-two-pass", "DualDecoder ablation: the speculative token in a second decoding pass",
               landmarks=True, lowrank_keys="adaptive", buffer_layers="pingpong", tokens_per_step=2,
               two_pass=True, prefetch="layer-ahead", urgent_priority=True, kernels="triton"),
    DesignSpec("ideal", "Paper Figure 2's bound: weights, activations and a sparse KV working set;"
               " no context-sized residency at all", fetch="kv"),
]}

# What `--design all` means: the four designs the paper compares.
MAIN_DESIGNS = ("full-kv", "shadowkv", "specache", "dualdecoder")     # the paper's four
ALL_DESIGNS = MAIN_DESIGNS + ("dualdecoder-cache",)                   # `all`: those and ours


def get_design(name: str) -> DesignSpec:
    key = name.strip().lower()
    if key not in DESIGNS:
        raise unknown("design", name, DESIGNS)
    return DESIGNS[key]


def design_names(names: str) -> tuple[str, ...]:
    """A comma list of design names, where 'all' stands for the paper's four designs and dualdecoder-cache
    and 'every' for the whole registry, alone or beside other names ('all,dualdecoder-per-layer'); each
    design once, in the order first named. An empty list, or an empty item, is a DDBenchError."""
    key = str(names).strip().lower()
    parts = [n.strip() for n in key.split(",")]
    if not key or not any(parts):
        raise DDBenchError(f"'{names}' names no design; use all, every or a comma list")
    if not all(parts):
        raise DDBenchError(f"'{names}' has an empty item; use all, every or a comma list")
    out: list[str] = []
    for n in parts:
        for d in (ALL_DESIGNS if n == "all" else tuple(DESIGNS) if n == "every" else (get_design(n).name,)):
            if d not in out:
                out.append(d)
    return tuple(out)
