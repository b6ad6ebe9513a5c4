"""Knob search: a grid of a design's mechanism knobs, and Pareto fronts over the results.

`--search budget,chunk,lowrank-layers[,cache]` (each optionally `=V1:V2:...`) expands, per
design, into the settings that apply to it:
- budget (sparse tokens fetched per request and layer) and chunk (tokens per chunk): every
  design that keeps KV in host memory; only budgets within the smallest context and divisible
  by the chunk;
- lowrank-layers (layers with low-rank keys): designs with adaptive key reconstruction;
- cache (the GPU's sparse-KV buffers): two-layer ping-pong or one per layer, for designs that
  prefetch layer-ahead.
Each setting gets its own rate search; the best setting per design is the one with the highest
rate (ties: tokens/s). Pareto fronts: tokens/s against peak GPU memory, and against the P99 of the
first SLO term, over the settings that meet the SLO.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from ddbench.core.errors import DDBenchError
from ddbench.core.systems import get_system
from ddbench.core.units import parse_tokens

DEFAULTS = {"budget": (1024, 2048, 4096), "chunk": (8, 16), "lowrank-layers": (0, 4, 8),
            "cache": ("pingpong", "per-layer")}
FIELD = {"budget": "budget", "chunk": "chunk", "lowrank-layers": "lowrank_layers", "cache": "cache"}


def parse_search(text: str) -> dict:
    """'budget,chunk=8:16,cache' -> {knob: values}."""
    out = {}
    for raw in str(text).split(","):
        term = raw.strip().lower()
        if not term:
            continue
        name, _, vals = term.partition("=")
        name = name.strip().replace("_", "-")
        if name not in DEFAULTS:
            raise DDBenchError(f"--search: unknown knob '{name}'; known: {', '.join(DEFAULTS)}")
        if name in out:
            raise DDBenchError(f"--search: knob '{name}' is given twice")
        if not vals:
            out[name] = DEFAULTS[name]
            continue
        items = [v.strip() for v in vals.split(":") if v.strip()]
        if not items:
            raise DDBenchError(f"--search: no values for '{name}'")
        if name == "cache":
            bad = [v for v in items if v not in DEFAULTS["cache"]]
            if bad:
                raise DDBenchError(f"--search: unknown cache '{bad[0]}'; known: pingpong, per-layer")
            out[name] = tuple(items)
        elif name == "lowrank-layers":
            try:
                out[name] = tuple(int(v) for v in items)
            except ValueError:
                raise DDBenchError(f"--search: lowrank-layers values must be integers, got '{vals}'") from None
        else:
            out[name] = tuple(parse_tokens(v, name) for v in items)
    if not out:
        raise DDBenchError("--search names no knob; use e.g. --search budget,chunk,lowrank-layers,cache")
    return out


def settings(base, knobs: dict, min_context: int, num_layers: int) -> list:
    """The scenarios of one design's knob grid (the base scenario's values for knobs that do not apply)."""
    sysx = get_system(base.system)
    offload = not sysx.kv_on_gpu
    axes = {k: v for k, v in knobs.items() if applies(k, base.system)}
    if "lowrank-layers" in axes:
        axes["lowrank-layers"] = tuple(v for v in axes["lowrank-layers"] if 0 <= v <= num_layers)
    names = list(axes)
    out = []
    for combo in itertools.product(*(axes[n] for n in names)) if names else [()]:
        sc = replace(base, **{FIELD[n]: v for n, v in zip(names, combo)})
        if offload and (sc.budget > min_context or sc.budget % sc.chunk):
            continue
        out.append(sc)
    return out


def applies(knob: str, system: str) -> bool:
    sysx = get_system(system)
    if knob in ("budget", "chunk"):
        return not sysx.kv_on_gpu
    if knob == "lowrank-layers":
        return sysx.lowrank_keys == "adaptive"
    return sysx.prefetch == "layer-ahead"


def knob_label(sc, knobs: dict) -> str:
    """The searched knobs that apply to the scenario's design, as 'budget=1024 chunk=16'."""
    parts = [f"{k}={getattr(sc, FIELD[k])}" for k in knobs if applies(k, sc.system)]
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
