"""Knob search: a grid of a design's mechanism knobs, and Pareto fronts over the results.

`--search budget,chunk,lowrank-layers,buffers,cache,fp8,index` (any of them, each optionally `=V1:V2:...`) expands, per
design, into the settings that apply to it:
- budget (sparse tokens fetched per request and layer) and chunk (tokens per chunk): every
  design that keeps KV in host memory; only budgets within the smallest context and divisible
  by the chunk;
- lowrank-layers (layers with low-rank keys): designs with adaptive key reconstruction;
- buffers (the sparse-KV buffer layout, Scenario.buffers): two-layer ping-pong or one per layer
  (`buffers=pingpong:per-layer`, the default); the designs that prefetch layer-ahead, the chunk-cache
  design aside (its per-layer buffers are its cache);
- cache (the GPU chunk cache, and nothing else): a chunk-cache design's (dualdecoder-cache, lru-cache) capacity
  per (layer, KV head), as a multiple of the budget (`2x`) or in tokens (`8k`); `cache=2x:4x:8x` by
  default;
- index (the selection index, Workload.index: flat, fp8, int4, two-level:G[,M[,COARSE[,FINE]]]): every design
  that selects by landmarks; `index=flat:fp8:int4:two-level:8,1,int4` by default;
- fp8 (off; on: the KV on the host and the link in fp8 e4m3, Workload.kv_bits 8; on+cache: that and a
  chunk-cache design's GPU chunk cache in fp8 too, cache_bits 8, tried for those designs only): designs that
  fetch K and V (ShadowKV's 1 KiB fp8 value pieces have no measured gather rate); `fp8=off:on:on+cache`
  by default.
Each setting gets its own rate search; the best setting per design is the one with the highest
rate (ties: tokens/s). Pareto fronts: tokens/s against peak GPU memory, and against the P99 of the
first SLO term, over the settings that meet the SLO.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from ddbench.core.designs import get_design
from ddbench.core.errors import DDBenchError
from ddbench.core.units import parse_tokens

LAYOUTS = ("pingpong", "per-layer")
DEFAULTS = {"budget": (1024, 2048, 4096), "chunk": (8, 16), "lowrank-layers": (0, 4, 8), "buffers": LAYOUTS,
            "cache": ("2x", "4x", "8x"), "fp8": ("off", "on", "on+cache"),
            "index": ("flat", "fp8", "int4", "two-level:8,1,int4")}
# the Workload knob each searched knob sets (buffers is Scenario.buffers; cache sets cache_tokens from the budget;
# fp8 sets kv_bits and cache_bits, FP8_BITS)
FIELD = {"budget": "budget", "chunk": "chunk", "lowrank-layers": "lowrank_layers", "index": "index"}
FP8_BITS = {"off": (16, 16), "on": (8, 16), "on+cache": (8, 8)}     # fp8 value -> (kv_bits, cache_bits)


def parse_search(text: str) -> dict:
    """'budget,chunk=8:16,cache' -> {knob: values}; an empty term or value is an error."""
    out = {}
    terms = _index_terms([t.strip().lower() for t in str(text).split(",")])
    if not any(terms):
        raise DDBenchError("--search names no knob; use e.g. --search budget,chunk,lowrank-layers,buffers,cache")
    for term in terms:
        if not term:
            raise DDBenchError(f"--search '{text}' has an empty term")
        name, eq, vals = term.partition("=")
        name = name.strip().replace("_", "-")
        if name not in DEFAULTS:
            raise DDBenchError(f"--search: unknown knob '{name}'; known: {', '.join(DEFAULTS)}")
        if name in out:
            raise DDBenchError(f"--search: knob '{name}' is given twice")
        if not eq:
            out[name] = DEFAULTS[name]
            continue
        items = [v.strip() for v in vals.split(":")]
        if not all(items):
            raise DDBenchError(f"--search: '{term}' has an empty value; use e.g. {name}=V1:V2")
        if name == "buffers":
            bad = [v for v in items if v not in LAYOUTS]
            if bad:
                raise DDBenchError(f"--search: buffers takes {' and '.join(LAYOUTS)}, got '{bad[0]}'")
            out[name] = tuple(items)
        elif name == "cache":
            layout = [v for v in items if v in LAYOUTS]
            if layout:
                raise DDBenchError(f"--search: cache takes the chunk cache's capacities (2x, 8k); '{layout[0]}' is a"
                                   f" buffer layout: use buffers={layout[0]}")
            out[name] = tuple(_capacity(v) for v in items)
        elif name == "fp8":
            bad = [v for v in items if v not in FP8_BITS]
            if bad:
                raise DDBenchError(f"--search: fp8 takes off, on and on+cache, got '{bad[0]}'")
            out[name] = tuple(items)
        elif name == "index":
            out[name] = tuple(_index_values(items, term))
        elif name == "lowrank-layers":
            try:
                out[name] = tuple(int(v) for v in items)
            except ValueError:
                raise DDBenchError(f"--search: lowrank-layers values must be integers, got '{vals}'") from None
            if min(out[name]) < 0:
                raise DDBenchError(f"--search: lowrank-layers values must be at least 0, got '{vals}'")
        else:
            out[name] = tuple(parse_tokens(v, name) for v in items)
    return out


def _index_terms(terms: list) -> list:
    """The comma-split terms with a two-level index's own commas put back ('index=two-level:8', '2' ->
    'index=two-level:8,2'): a piece that names no knob, after an index term, belongs to it."""
    out = []
    for t in terms:
        if out and out[-1].startswith("index=") and t and "=" not in t and t.replace("_", "-") not in DEFAULTS:
            out[-1] += "," + t
        else:
            out.append(t)
    return out


def _index_values(items: list, term: str) -> list:
    """The indexes of 'index=flat:fp8:two-level:8,2' (a two-level value's own ':' put back), canonical."""
    from ddbench.core.index import index_name
    vals, i = [], 0
    while i < len(items):
        v = items[i]
        if v == "two-level" and i + 1 < len(items):
            v, i = f"{v}:{items[i + 1]}", i + 1
        vals.append(index_name(v))
        i += 1
    return vals


def _capacity(v: str) -> str:
    """A capacity, normalised: '4x' (a multiple of the budget) or '8192' (tokens, from '8k'); else a
    one-line error."""
    try:
        x = float(v[:-1]) if v.endswith("x") else float(parse_tokens(v, "cache"))
    except (ValueError, DDBenchError):
        x = float("nan")
    if not 0 < x < float("inf"):
        raise DDBenchError(f"--search: cache '{v}' is not a capacity (a multiple of the budget such as 4x, or"
                           " tokens such as 8k)")
    if v.endswith("x") and x < 1:
        raise DDBenchError(f"--search: cache '{v}' is smaller than the budget (at least 1x)")
    return f"{x:g}x" if v.endswith("x") else str(int(x))


def cache_tokens(value: str, budget: int) -> int:
    """A capacity value's tokens per (layer, KV head) at a budget."""
    return int(round(float(value[:-1]) * budget)) if value.endswith("x") else int(value)


def settings(base, knobs: dict, min_context: int, num_layers: int) -> list:
    """The scenarios of one design's knob grid (the base scenario's values for knobs that do not apply);
    a DDBenchError where no setting is left (every budget above the smallest context, or none a
    multiple of its chunk)."""
    offload = not get_design(base.design).kv_on_gpu
    axes = {k: v for k, v in knobs.items() if applies(k, base.design)}
    if "lowrank-layers" in axes:
        axes["lowrank-layers"] = tuple(v for v in axes["lowrank-layers"] if 0 <= v <= num_layers)
    names = list(axes)
    out = []
    for combo in itertools.product(*(axes[n] for n in names)) if names else [()]:
        values = dict(zip(names, combo))
        sc = base.with_knobs(**{FIELD[n]: v for n, v in values.items() if n in FIELD})
        if "fp8" in values:
            kv, cache = FP8_BITS[values["fp8"]]
            if cache == 8 and not get_design(base.design).chunk_cache:
                continue        # on+cache: a chunk cache's fp8 slots (the same setting as on elsewhere)
            sc = sc.with_knobs(kv_bits=kv, cache_bits=cache)
        cap = values.get("cache")
        if cap is not None:
            ct = cache_tokens(cap, sc.knob("budget"))
            if ct < sc.knob("budget") or ct % sc.knob("chunk"):
                continue        # below the budget, or not whole chunks
            sc = sc.with_knobs(cache_tokens=ct)
        if "buffers" in values:
            sc = replace(sc, buffers=values["buffers"])
        if offload and (sc.knob("budget") > min_context or sc.knob("budget") % sc.knob("chunk")):
            continue
        if sc.knob("kv_bits") == 8 and sc.knob("lowrank_layers") > 0:
            continue            # fp8 values alone (1 KiB pieces) on the low-rank layers: no measured rate
        out.append(sc)
    if not out:
        raise DDBenchError(f"--search leaves no setting for {base.design}: every budget is above the smallest"
                           f" context ({min_context}) or not a multiple of its chunk, no lowrank-layers value is"
                           f" within 0..{num_layers}, no cache capacity is whole chunks of at least the budget, or"
                           " fp8=on+cache alone on a design without a chunk cache")
    return out


def applies(knob: str, name: str) -> bool:
    """Whether the knob applies to the design `name`."""
    design = get_design(name)
    if knob in ("budget", "chunk"):
        return not design.kv_on_gpu
    if knob == "lowrank-layers":
        return design.lowrank_keys == "adaptive"
    if knob == "fp8":      # K+V pieces (2 KiB in fp8: measured); ShadowKV's 1 KiB value pieces are not
        return not design.kv_on_gpu and not design.quant_bits and design.fetch == "kv"
    if knob == "cache":    # a chunk-cache design's capacity (dualdecoder-cache, lru-cache)
        return bool(design.chunk_cache)
    if knob == "index":    # the selection index of every design that selects by landmarks
        return bool(design.landmarks)
    return design.prefetch == "layer-ahead" and not design.chunk_cache     # buffers: the others


def knob_label(sc, knobs: dict) -> str:
    """The searched knobs that apply to the scenario's design, as 'budget=1024 chunk=16'."""
    def value(k):
        if k == "cache":
            return f"{sc.knob('cache_tokens') / sc.knob('budget'):g}x"
        if k == "buffers":
            return sc.buffers
        if k == "fp8":
            return next(v for v, bits in FP8_BITS.items() if bits == (sc.knob("kv_bits"), sc.knob("cache_bits")))
        return sc.knob(FIELD[k])
    parts = [f"{k}={value(k)}" for k in knobs if applies(k, sc.design)]
    return " ".join(parts) or "(no knob applies)"


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (gain, cost) that no other point beats: more gain at no more cost, or
    less cost at no less gain. Gain is maximised, cost minimised."""
    front = []
    for i, (g, c) in enumerate(points):
        dominated = any((g2 >= g and c2 <= c) and (g2 > g or c2 < c) for j, (g2, c2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return front
