"""The registry of serving designs, shared by name by the memory model, the
simulator and the engine. A design's name is the one word for it in code and outputs; the CLI's
`--design` (alias `--system`) and the sweep spec's `design:` (alias `system:`) take these names.

Each design is a frozen set of mechanism switches. The memory model
(`ddbench.core.memory`) and the cost models read these switches; no code branches on
a design's name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ddbench.core.errors import DDBenchError, unknown


# One constant per design name: code that must name one design (an experiment that reproduces a paper
# figure, a benchmark's point list) imports these instead of writing the name.
FULL_KV = "full-kv"
SHADOWKV = "shadowkv"
SPECACHE = "specache"
DUALDECODER = "dualdecoder"
DUALDECODER_CACHE = "dualdecoder-cache"
LRU_CACHE = "lru-cache"
DUALDECODER_PER_LAYER = "dualdecoder-per-layer"
DUALDECODER_FIFO = "dualdecoder-fifo"
DUALDECODER_CPU_GATHER = "dualdecoder-cpu-gather"
DUALDECODER_TWO_PASS = "dualdecoder-two-pass"
IDEAL = "ideal"

# The values each switch may take (register() checks a new design against them).
SWITCH_VALUES = {
    "lowrank_keys": ("none", "all", "adaptive"), "quant_bits": (0, 1, 2), "buffer_layers": ("all", "pingpong"),
    "buffer_sets": (1, 2), "tokens_per_step": (1, 2), "fetch": ("none", "kv", "values"),
    "prefetch": ("none", "next-step", "layer-ahead"), "gather": ("gpu", "cpu"), "kernels": ("torch", "triton"),
}
# What a design is to the paper: one of its four ("paper"), ours beyond it ("ours"), Figure 2's bound
# ("bound"), or anything else, ablations and other baselines among them ("extra").
ROLES = ("paper", "ours", "bound", "extra")
# The switches that only change how transfers are scheduled and issued, not what the GPU computes: an
# ablation that differs from its base in these alone has its base's compute-only step.
TRANSFER_SWITCHES = ("buffer_layers", "buffer_sets", "urgent_priority", "gather")


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
    label: str = ""                  # short display name in figures and tables (empty: the name)
    color: str | None = None         # its colour in every figure (None: the figure picks a spare one)
    role: str = "extra"              # see ROLES
    ablation_of: str | None = None   # the design this one ablates (one mechanism changed)

    def __post_init__(self):
        if not self.label:
            object.__setattr__(self, "label", self.name)


DESIGNS: dict[str, DesignSpec] = {s.name: s for s in [
    DesignSpec(FULL_KV, "vLLM-like: the whole KV cache in GPU memory", kv_on_gpu=True, fetch="none",
               label="vLLM (full KV)", color="#7f7f7f", role="paper"),
    DesignSpec(SHADOWKV, "ShadowKV: low-rank pre-RoPE K + landmarks + outliers on GPU; values of"
               " missed chunks fetched on the critical path, reusing the previous selection",
               landmarks=True, lowrank_keys="all", outliers=True, fetch="values", reuse=True,
               label="ShadowKV", color="#1f77b4", role="paper"),
    DesignSpec(SPECACHE, "SpeCache: 2-bit KV copy on GPU for scoring; top-k 16-bit KV fetched;"
               " speculative token prefetches the next step", quant_bits=2, buffer_sets=2,
               tokens_per_step=2, prefetch="next-step", label="SpeCache", color="#ff7f0e", role="paper"),
    DesignSpec(DUALDECODER, "DualDecoder: landmarks only; dual-token step; prefetch of layer i+2"
               " after layer i's attention; urgent misses first; two-layer ping-pong; GPU gather",
               landmarks=True, lowrank_keys="adaptive", buffer_layers="pingpong", tokens_per_step=2,
               prefetch="layer-ahead", urgent_priority=True, kernels="triton", label="DualDecoder",
               color="#2ca02c", role="paper"),
    DesignSpec(DUALDECODER_CACHE, "Beyond the paper: DualDecoder plus a per-request GPU chunk cache per"
               " (layer, KV head), LRU on the GPU; layer-ahead prefetch of the predicted chunks it misses,"
               " urgent fetch of the true chunks in neither; K and V fetched (no low-rank keys)",
               landmarks=True, tokens_per_step=2, prefetch="layer-ahead", urgent_priority=True, kernels="triton",
               chunk_cache=True, color="#9467bd", role="ours"),
    DesignSpec(LRU_CACHE, "HiSparse-like cache only: landmarks select on the GPU; the per-request GPU chunk"
               " cache of dualdecoder-cache, LRU; no speculative token and no prefetch: every chunk of the step's"
               " own selection the cache lacks is fetched urgent before that layer's attention (K and V)",
               landmarks=True, kernels="triton", chunk_cache=True, color="#8c564b"),
    DesignSpec(DUALDECODER_PER_LAYER, "DualDecoder ablation: per-layer sparse KV buffers instead of ping-pong",
               landmarks=True, lowrank_keys="adaptive", tokens_per_step=2, prefetch="layer-ahead",
               urgent_priority=True, kernels="triton", ablation_of=DUALDECODER),
    DesignSpec(DUALDECODER_FIFO, "DualDecoder ablation: misses queue behind prefetches (no priority)",
               landmarks=True, lowrank_keys="adaptive", buffer_layers="pingpong", tokens_per_step=2,
               prefetch="layer-ahead", kernels="triton", ablation_of=DUALDECODER),
    DesignSpec(DUALDECODER_CPU_GATHER, "DualDecoder ablation: CPU index_select into pinned staging + one copy",
               landmarks=True, lowrank_keys="adaptive", buffer_layers="pingpong", tokens_per_step=2,
               prefetch="layer-ahead", urgent_priority=True, gather="cpu", kernels="triton",
               ablation_of=DUALDECODER),
    DesignSpec(DUALDECODER_TWO_PASS, "DualDecoder ablation: the speculative token in a second decoding pass",
               landmarks=True, lowrank_keys="adaptive", buffer_layers="pingpong", tokens_per_step=2,
               two_pass=True, prefetch="layer-ahead", urgent_priority=True, kernels="triton",
               ablation_of=DUALDECODER),
    DesignSpec(IDEAL, "Paper Figure 2's bound: weights, activations and a sparse KV working set;"
               " no context-sized residency at all", fetch="kv", color="#d62728", role="bound"),
]}


# Named groups, in registry order, read from the registry each time (a registered design joins them).
def paper_designs() -> tuple[str, ...]:
    """The four designs the paper compares."""
    return tuple(n for n, s in DESIGNS.items() if s.role == "paper")


def our_designs() -> tuple[str, ...]:
    """Ours, beyond the paper."""
    return tuple(n for n, s in DESIGNS.items() if s.role == "ours")


def all_designs() -> tuple[str, ...]:
    """What `--design all` means: the paper's four and ours."""
    return paper_designs() + our_designs()


def ablations(of: str | None = None) -> tuple[str, ...]:
    """The ablations (of one design, where named)."""
    return tuple(n for n, s in DESIGNS.items() if s.ablation_of and (of is None or s.ablation_of == of))


def landmark_designs() -> tuple[str, ...]:
    """The designs that select chunks by landmarks (chunk-mean keys)."""
    return tuple(n for n, s in DESIGNS.items() if s.landmarks)


def cache_designs() -> tuple[str, ...]:
    """The designs with a per-request GPU chunk cache."""
    return tuple(n for n, s in DESIGNS.items() if s.chunk_cache)


def compute_twin(name: str) -> str:
    """The design whose compute-only step this one has: its base where it is an ablation that changes only
    transfer switches (TRANSFER_SWITCHES), else itself (the two-pass ablation computes a second pass)."""
    s = DESIGNS.get(name)
    base = DESIGNS.get(s.ablation_of) if s is not None and s.ablation_of else None
    if base is None:
        return name
    same = all(getattr(s, f.name) == getattr(base, f.name) for f in fields(DesignSpec)
               if f.name not in TRANSFER_SWITCHES + ("name", "description", "label", "color", "role", "ablation_of"))
    return base.name if same else name


MAIN_DESIGNS = paper_designs()      # the paper's four, as the registry holds them at import
ALL_DESIGNS = all_designs()         # `all`: those and ours


def register(spec: DesignSpec) -> DesignSpec:
    """Add a design at run time: every layer that iterates over DESIGNS finds it. A DDBenchError where its
    name is taken or not one lower-case word, a switch has a value no layer knows, or its role or base is
    unknown."""
    if not isinstance(spec, DesignSpec):
        raise DDBenchError(f"register() takes a DesignSpec, not {type(spec).__name__}")
    name = spec.name
    if not name or name != name.strip().lower() or any(c in name for c in ", @+") or name in ("all", "every"):
        raise DDBenchError(f"design name '{name}' must be one lower-case word without ',', '@', '+' or spaces,"
                           " and not 'all' or 'every'")
    if name in DESIGNS:
        raise DDBenchError(f"design '{name}' is already registered")
    for switch, allowed in SWITCH_VALUES.items():
        if getattr(spec, switch) not in allowed:
            raise DDBenchError(f"design '{name}': {switch}={getattr(spec, switch)!r} is not one of {allowed}")
    if spec.role not in ROLES:
        raise DDBenchError(f"design '{name}': role {spec.role!r} is not one of {ROLES}")
    if spec.ablation_of is not None and spec.ablation_of not in DESIGNS:
        raise DDBenchError(f"design '{name}': ablation_of names no registered design ('{spec.ablation_of}')")
    if spec.kv_on_gpu != (spec.fetch == "none"):
        raise DDBenchError(f"design '{name}': fetch='none' goes with kv_on_gpu=True, and only with it")
    DESIGNS[name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a design register() added (tests); the built-in designs stay."""
    if name in BUILTIN:
        raise DDBenchError(f"design '{name}' is built in and cannot be unregistered")
    if name not in DESIGNS:
        raise unknown("design", name, DESIGNS)
    del DESIGNS[name]


BUILTIN = frozenset(DESIGNS)


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
        for d in (all_designs() if n == "all" else tuple(DESIGNS) if n == "every" else (get_design(n).name,)):
            if d not in out:
                out.append(d)
    return tuple(out)
