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

from ddbench.core.designs import get_design
from ddbench.core.errors import DDBenchError
from ddbench.core.units import parse_tokens

DEFAULTS = {"budget": (1024, 2048, 4096), "chunk": (8, 16), "lowrank-layers": (0, 4, 8),
            "cache": ("pingpong", "per-layer")}
FIELD = {"budget": "budget", "chunk": "chunk", "lowrank-layers": "lowrank_layers", "cache": "cache"}


def parse_search(text: str) -> dict:
    """'budget,chunk=8:16,cache' -> {knob: values}; an empty term or value is an error."""
    out = {}
    terms = [t.strip().lower() for t in str(text).split(",")]
    if not any(terms):
        raise DDBenchError("--search names no knob; use e.g. --search budget,chunk,lowrank-layers,cache")
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
            if min(out[name]) < 0:
                raise DDBenchError(f"--search: lowrank-layers values must be at least 0, got '{vals}'")
        else:
            out[name] = tuple(parse_tokens(v, name) for v in items)
    return out


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
        sc = base.with_knobs(**{FIELD[n]: v for n, v in values.items() if n != "cache"})
        if "cache" in values:
            sc = replace(sc, cache=values["cache"])
        if offload and (sc.knob("budget") > min_context or sc.knob("budget") % sc.knob("chunk")):
            continue
        out.append(sc)
    if not out:
        raise DDBenchError(f"--search leaves no setting for {base.design}: every budget is above the smallest"
                           f" context ({min_context}) or not a multiple of its chunk, or no lowrank-layers value is"
                           f" within 0..{num_layers}")
    return out


def applies(knob: str, name: str) -> bool:
    """Whether the knob applies to the design `name`."""
    design = get_design(name)
    if knob in ("budget", "chunk"):
        return not design.kv_on_gpu
    if knob == "lowrank-layers":
        return design.lowrank_keys == "adaptive"
    return design.prefetch == "layer-ahead"


def knob_label(sc, knobs: dict) -> str:
    """The searched knobs that apply to the scenario's design, as 'budget=1024 chunk=16'."""
    parts = [f"{k}={sc.cache if k == 'cache' else sc.knob(FIELD[k])}" for k in knobs if applies(k, sc.design)]
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
