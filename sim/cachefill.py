"""dualdecoder-cache's fill: the GPU chunk cache's lookup, LRU eviction and miss plan (kernels/engine/
chunkcache.py ChunkCache.fill: about 30 small kernels and a sort over the slots), twice per layer and
step (the prefetch fill and the urgent fill). The one cost of the design that the op-level terms of
sim/costmodel.py do not price; the cost model adds it per layer (CostModel.cache_fill_s).

    fill_s(batch, slots) = a + b * batch + c * batch * slots          (one fill of one layer, seconds)

FITTED, by non-negative least squares, to the engine's measured steps of dualdecoder-cache at ONE
context of a sweep (default 64K of traces/engine/h200-cache), at its points in the overlap regime (the
link does not bind, so the step is compute plus exposed transfers, both priced): per point, the
residual (engine step - simulated step without the fill) / (2 L). Two rounds: the second has the first
fit in the plan, so that the fill's place among the transfers is priced too. The sweep's other
contexts are held out: `python -m sim.validate --engine traces/engine/h200-cache` replays every point,
and its summary says which were fitted.

    python -m sim.cachefill [--engine DIR] [--context 64k] [--out FILE]

writes FILE (default the H200 bundle's cache_fill.json, where CostModel looks for it); imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from ddbench.core.errors import DDBenchError

FILE = "cache_fill.json"
DESIGN = "dualdecoder-cache"
TERMS = ("fixed_s", "per_request_s", "per_request_slot_s")
DEFAULT_SWEEP, DEFAULT_CONTEXT = "h200-cache", 65536


def features(batch: int, slots: int) -> np.ndarray:
    return np.array([1.0, float(batch), float(batch) * float(slots)])


def fill_s(fit: dict, batch: int, slots: int) -> float:
    return float(features(batch, slots) @ np.array([fit["theta"][t] for t in TERMS]))


def describe(fit: dict) -> str:
    th, src = fit["theta"], fit["source"]
    return (f"cache fill FITTED to {fit['points']} engine points of {DESIGN} at {fit['context'] // 1024}K"
            f" ({src['folder']}, git {str(src.get('git_sha'))[:7]}; other contexts held out):"
            f" {th['fixed_s'] * 1e6:.1f} us + {th['per_request_s'] * 1e9:.0f} ns per request"
            f" + {th['per_request_slot_s'] * 1e12:.2f} ps per request-slot, twice per layer;"
            f" max |residual| {fit['max_abs_residual_us']:.1f} us per fill")


def load(bundle_path: str) -> dict | None:
    path = os.path.join(bundle_path, FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        fit = json.load(fh)
    if set(fit.get("theta", {})) != set(TERMS):
        raise DDBenchError(f"{path}: theta must hold {', '.join(TERMS)}")
    return fit


def _points(engine_dir: str, context: int):
    """The sweep's dualdecoder-cache rows at `context` that ran with transfers in the overlap regime."""
    from ddbench.core.traces import load_engine
    from sim.validate import COMPLETED, classify, load_meta, row_model
    df = load_engine(os.path.join(engine_dir, "engine.csv"))
    thin = float(load_meta(engine_dir)["thin_gather_gbps"])
    return [r for r in df.itertuples() if r.design == DESIGN and r.status in COMPLETED and int(r.context) == context
            and int(r.transfers) and int(getattr(r, "graph", 1))
            and classify(1, r.link_gbps, thin) == "overlap" and row_model(r) == "llama-3-8b"]


def fit(engine_dir: str, context: int = DEFAULT_CONTEXT) -> dict:
    from ddbench.core.memory import Workload
    from sim.setup import cost_model
    from sim.validate import GPU, LINK, MODEL, _cache_of, effective_miss, load_meta, point_step_s, replay_plan
    rows = _points(engine_dir, context)
    if len(rows) < len(TERMS) + 1:
        raise DDBenchError(f"{engine_dir}: {len(rows)} {DESIGN} points in the overlap regime at {context}"
                           f" tokens; the fill fit needs at least {len(TERMS) + 1}")
    cm = cost_model(MODEL, GPU, LINK)
    w0 = Workload(context=1)
    L = cm.model.num_layers
    x = np.array([features(int(r.batch), int(r.cache_tokens) // w0.chunk) for r in rows])
    theta = np.zeros(len(TERMS))
    for _ in range(2):
        cm.cache_fill = {"theta": dict(zip(TERMS, theta.tolist()))} if theta.any() else None
        y = []
        for r, xi in zip(rows, x):
            cache, ct = _cache_of(r, MODEL)
            plan = replay_plan(DESIGN, int(r.context), int(r.batch), effective_miss(float(r.miss_rate), w0.budget,
                               w0.chunk), True, cm, MODEL, cache, ct)
            step, _ = point_step_s(plan)
            y.append((float(r.step_ms) * 1e-3 - step) / (2 * L) + float(xi @ theta))
        y = np.array(y)
        from sim.costmodel import _nonneg_lstsq
        theta = _nonneg_lstsq(x, y)
    res = y - x @ theta
    p = load_meta(engine_dir).get("provenance", {})
    from sim.validate import _rel
    return {"schema": 1, "design": DESIGN, "model": MODEL, "gpu": GPU, "context": context, "points": len(rows),
            "terms": "fill_s = fixed_s + per_request_s * batch + per_request_slot_s * batch * slots (one fill of"
                     " one layer; two per layer and step)",
            "theta": dict(zip(TERMS, theta.tolist())), "max_abs_residual_us": float(np.abs(res).max() * 1e6),
            "residuals_us": {f"b{int(r.batch)} {int(r.cache_tokens)} tokens rep {int(getattr(r, 'rep', 0))}":
                             round(float(e) * 1e6, 2) for r, e in zip(rows, res)},
            "source": {"folder": _rel(engine_dir), "run_id": load_meta(engine_dir).get("run_id"),
                       "git_sha": p.get("git_sha"), "date_utc": p.get("date_utc")},
            "command": " ".join(["python -m sim.cachefill"] + sys.argv[1:]) if __name__ == "__main__" else None}


def main(argv=None) -> int:
    from ddbench.core.calibration import find_bundle
    from ddbench.core.io import write_json
    from ddbench.core.paths import traces_dir
    from ddbench.core.units import parse_tokens
    ap = argparse.ArgumentParser(prog="python -m sim.cachefill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default=None, help=f"the sweep (default the data root's engine/{DEFAULT_SWEEP})")
    ap.add_argument("--context", default="64k", help="the one context whose points are fitted (default 64k)")
    ap.add_argument("--out", default=None, help=f"the fit's JSON (default the H200 bundle's {FILE})")
    a = ap.parse_args(argv)
    try:
        engine_dir = a.engine or str(traces_dir("engine", DEFAULT_SWEEP))
        out = a.out or os.path.join(find_bundle("h200"), FILE)
        f = fit(engine_dir, parse_tokens(a.context))
        write_json(out, f)
    except DDBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(describe(f))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
