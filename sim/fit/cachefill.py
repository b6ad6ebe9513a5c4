"""dualdecoder-cache's fill (sim/fitted.py CacheFill): the GPU chunk cache's lookup, LRU eviction and miss
plan (kernels/cachefill.py: one Triton launch; before the fused fill, ChunkCache.fill's twin of about 30
small torch kernels), twice per layer and step (the prefetch fill and the urgent fill). The one cost of the design that the
op-level terms of sim/costmodel.py do not price; the cost model adds it per layer (CostModel.cache_fill_s).

    fill_s(batch, slots) = a + b * slots + c * batch + e * batch * slots   (one fill of one layer, seconds)

FITTED, by non-negative least squares, to the engine's measured steps of dualdecoder-cache in one or more
sweeps at the contexts named (default 32K, 64K and 128K of traces/engine/h200-cache-fill; the torch
fill's at 64K of h200-cache, which prices only that engine's rows in the validation), at their points in
the overlap regime (the link does not bind, so the step is compute plus exposed transfers, both priced):
per point, the residual (engine step - simulated step without the fill) / (2 L). Two rounds: the second
has the first fit in the plan, so that the fill's place among the transfers is priced too. Other sweeps
and contexts are held out: `python -m ddbench.sim.validate` replays every point, and its summary says
which were fitted. Run by `python -m ddbench.sim.fit` (its --cache-sweep, --context), on the cost model
with the engine and reuse-fetch terms fitted just before; imports no torch.
"""

from __future__ import annotations

import os

import numpy as np

from ddbench.core.enginepoint import EnginePoint
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload
from ddbench.core.traces import load_engine
from ddbench.sim.fit.enginefit import nonneg_lstsq
from ddbench.sim.fit.replay import (COMPLETED, FUSED, FUSED64, MODEL, TORCH, cache_fill_kind, classify, effective_miss,
                            load_meta, point_step_s, rel, replay_plan, row_cache, row_cache_bits, row_git_sha,
                            row_kv_bits, row_model)
from ddbench.sim.fitted import CACHE_FILL_DESIGN as DESIGN, CACHE_FILL_TERMS as TERMS, CacheFill, features

DEFAULT_CONTEXTS = {FUSED: (32768, 65536, 131072), FUSED64: (32768, 65536, 131072), TORCH: (65536,)}
# kind -> the default sweeps, <gpu>-<it>. The int32-key fill's: compare (its bf16 labels); the int64 fill's: cache-fill
# (its rows record the prefetch bytes of their own fills; cache-fused and cache-fused-ctx, from an engine that did
# not yet, recorded none at batch 16 and 32)
SWEEPS = {FUSED: ("compare",), FUSED64: ("cache-fill",), TORCH: ("cache",)}


def points(engine_dir: str, contexts: tuple, kind: str = FUSED):
    """The sweep's dualdecoder-cache rows at `contexts` (tokens) that ran with transfers in the overlap
    regime (each replayed with its own host KV and cache bits); a DDBenchError where one of them ran another
    fill (sim/fit/replay.py cache_fill_kind)."""
    df = load_engine(os.path.join(engine_dir, "engine.csv"))
    meta = load_meta(engine_dir)
    thin = float(meta["thin_gather_gbps"])
    rows = [r for r in df.itertuples() if r.design == DESIGN and r.status in COMPLETED and int(r.context) in contexts
            and int(r.transfers) and int(getattr(r, "graph", 1))
            and classify(1, r.link_gbps, thin) == "overlap" and row_model(r) == MODEL]
    other = sorted({str(row_git_sha(r, meta))[:10] for r in rows if cache_fill_kind(row_git_sha(r, meta), meta) != kind})
    if other:
        raise DDBenchError(f"{engine_dir}: points of engine code {', '.join(other)} ran the other fill than the"
                           f" {kind} one being fitted")
    return rows


def _source(engine_dir: str) -> dict:
    meta = load_meta(engine_dir)
    p = meta.get("provenance", {}) or {}
    return {"folder": rel(engine_dir), "run_id": meta.get("run_id"), "git_sha": p.get("git_sha"),
            "date_utc": p.get("date_utc")}


def fit(engine_dirs, cm, contexts=None, kind: str = FUSED) -> CacheFill:
    """The `kind` fill (FUSED: the engine's; FUSED64, TORCH: the engine's earlier ones, replay.py) fitted to the points
    of one sweep or several (`engine_dirs`, a folder or a list) at `contexts` (default DEFAULT_CONTEXTS[kind]),
    priced on the cost model `cm` (MODEL's; its cache_fill is set while fitting and left as it was)."""
    engine_dirs = [engine_dirs] if isinstance(engine_dirs, str) else list(engine_dirs)
    contexts = DEFAULT_CONTEXTS[kind] if contexts is None else (contexts,) if isinstance(contexts, int) else contexts
    contexts = tuple(sorted({int(c) for c in contexts}))
    found = [(d, r) for d in engine_dirs for r in points(d, contexts, kind)]
    missing = sorted(set(contexts) - {int(r.context) for _, r in found})
    if missing:
        raise DDBenchError(f"{', '.join(engine_dirs)}: no {DESIGN} points in the overlap regime at"
                           f" {', '.join(str(c) for c in missing)} tokens")
    rows = [r for _, r in found]
    if len(rows) < len(TERMS) + 1:
        raise DDBenchError(f"{', '.join(engine_dirs)}: {len(rows)} {DESIGN} points in the overlap regime at"
                           f" {', '.join(str(c) for c in contexts)} tokens; the fill fit needs at least {len(TERMS) + 1}")
    w0 = Workload(context=1)
    L = cm.model.num_layers
    x = np.array([features(int(r.batch), int(r.cache_tokens) // w0.chunk) for r in rows])
    theta = np.zeros(len(TERMS))
    before = cm.cache_fill
    try:
        for _ in range(2):
            cm.cache_fill = CacheFill(dict(zip(TERMS, theta.tolist()))) if theta.any() else None
            y = []
            for r, xi in zip(rows, x):
                cache, ct = row_cache(r, MODEL)
                plan = replay_plan(EnginePoint(DESIGN, ct, row_kv_bits(r), row_cache_bits(r)), int(r.context),
                                   int(r.batch), effective_miss(float(r.miss_rate), w0.budget, w0.chunk), True, cm,
                                   MODEL, cache)
                step, _ = point_step_s(plan)
                y.append((float(r.step_ms) * 1e-3 - step) / (2 * L) + float(xi @ theta))
            y = np.array(y)
            theta = nonneg_lstsq(x, y)
    finally:
        cm.cache_fill = before
    res = y - x @ theta
    used = [d for d in engine_dirs if any(fd == d for fd, _ in found)]
    return CacheFill(dict(zip(TERMS, theta.tolist())), contexts, len(rows), float(np.abs(res).max() * 1e6),
                     {f"{int(r.context) // 1024}K b{int(r.batch)} {int(r.cache_tokens)} tokens rep {int(getattr(r, 'rep', 0))}"
                      f" ({os.path.basename(d.rstrip(os.sep))})": round(float(e) * 1e6, 2)
                      for (d, r), e in zip(found, res)},
                     tuple(_source(d) for d in used), MODEL, cm.bundle.gpu if cm.bundle is not None else "")
