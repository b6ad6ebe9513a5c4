"""The decode-step engine's measurements at the paper's points, for the figures that replay them.

Two committed runs of `python -m ddbench.kernels.engine.sweep --phases paper` on one H200 (their READMEs
say how):
  traces/engine/h200-paper   each design's largest batch under an 80 GB cap (h100-80gb's memory),
                             the batches its search measured, 3 builds in one process at the largest:
                             Figs. 2, 3 and 12. A figure compares designs from this one run only: its
                             tokens/s are given only for designs whose step the engine still runs
                             (ShadowKV ran the copy-then-regather step there, traces/fit/engine-versions.json,
                             so its tokens/s are not; its largest batch, which the step does not change, is)
  traces/engine/h200-fig14   Fig. 14's batches (12 / 6 / 4 for 8B / 14B / 32B at 128K), no cap: the
                             GPU memory at its peak by category
The in-place ShadowKV under the same cap (h200-shadowkv-fast/paper-80gb, h200-rates at 256K) is a later
engine version: `inplace_shadowkv` reads it for the tables that say so, never for a figure's diamonds.

The engine's GPU is an H200 (its compute and HBM), the figures' an H100 80GB: the engine's batches
and memory compare directly, its tokens/s only as the same design on a faster GPU (every figure
says so). A missing run is an error naming it, never a figure without its points.
"""

from __future__ import annotations

from functools import lru_cache

from ddbench.core.designs import SHADOWKV
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.units import GB

CAPPED = "h200-paper"
INPLACE = "h200-shadowkv-fast/paper-80gb"     # ShadowKV in place under the cap (its 256K point: h200-rates)
FIG14 = "h200-fig14"
GIB = 1 << 30
ENGINE_LABEL = "engine (H200, 80 GB cap)"


@lru_cache(maxsize=None)
def _summary(run: str) -> dict:
    path = traces_dir("engine", run, "summary.json")
    out = {(p["model"], int(p["context"]), p["design"]): p for p in _paper_points(
        path, "the engine's paper points; run `python -m ddbench.kernels.engine.sweep --phases paper` on a GPU, see its README")}
    return out


@lru_cache(maxsize=None)
def current_step(design: str, run: str = CAPPED) -> bool:
    """Whether the run's step of `design` is the one the engine runs now: a design that reuses the previous
    step's chunks (ShadowKV) ran the copy-then-regather step in runs before the in-place one."""
    from ddbench.core.designs import get_design
    from ddbench.core.io import read_json_object
    from ddbench.sim.fit.replay import IN_PLACE, row_git_sha, shadowkv_step
    if not get_design(design).reuse:
        return True
    meta = read_json_object(traces_dir("engine", run, "meta.json"), "engine run meta", f"traces/engine/{run}")
    return shadowkv_step(row_git_sha(None, meta), meta) == IN_PLACE


def _paper_points(path, missing: str) -> list:
    """An engine summary's "paper" points (records of model, context, design), typed: one-line errors."""
    from ddbench.core.io import read_json_object, records
    what = "engine summary"
    points = records(read_json_object(path, what, missing), "paper", ("model", "context", "design"), path, what)
    for i, p in enumerate(points):
        if isinstance(p["context"], bool) or not isinstance(p["context"], int):
            raise DDBenchError(f"malformed {what} {path}: paper[{i}].context is not a token count")
    return points


def inplace_shadowkv(traces) -> dict:
    """{(model, context, 'shadowkv'): point} of the in-place ShadowKV under the 80 GB cap, from the traces
    folder `traces`: INPLACE's summary, and the 256K points of h200-rates (batch 1, 3 builds)."""
    from ddbench.core.traces import load_engine
    path = traces / "engine" / INPLACE / "summary.json"
    out = {(p["model"], int(p["context"]), p["design"]): {**p, "inplace": True}
           for p in _paper_points(path, "the in-place ShadowKV's paper points; its README says how they were run")
           if p["design"] == SHADOWKV}
    e = load_engine(str(traces / "engine" / "h200-rates" / "engine.csv"))   # typed: one-line errors
    e = e[e.gpu_mem_cap.notna() & (e.design == SHADOWKV) & (e.context == 262144)
          & e.status.isin(["ok", "ok-no-twin"])]
    for (m, c, b), g in e.groupby(["model", "context", "batch"]):
        t = list(g.tok_s)
        med = float(g.tok_s.median())
        out[(m, int(c), SHADOWKV)] = {"largest_batch": int(b), "inplace": True,
                                       "series": [{"batch": int(b), "tok_s": med}],
                                       "builds_tok_s": {"n": len(t), "min": min(t), "median": med, "max": max(t)}}
    return out


def point(model: str, context: int, design: str, run: str = CAPPED) -> dict | None:
    """The run's entry for a point (largest_batch, series, builds_tok_s, largest), or None."""
    return _summary(run).get((model, int(context), design))


def largest(model: str, context: int, design: str) -> dict | None:
    """{batch, tok_s, tok_s_min, tok_s_max, builds} at the largest batch under the cap (tokens/s over the
    builds), {batch: 0} where not even one request fits, None where not measured; {batch} alone where the run's
    step of the design is not the engine's now (current_step)."""
    p = point(model, context, design)
    if p is None:
        return None
    b = p.get("builds_tok_s")
    if not p.get("largest_batch") or not b:
        return {"batch": 0}
    if not current_step(design):
        return {"batch": int(p["largest_batch"])}
    return {"batch": int(p["largest_batch"]), "tok_s": b["median"], "tok_s_min": b["min"], "tok_s_max": b["max"],
            "builds": b["n"]}


def series(model: str, context: int, design: str) -> list[tuple[int, float]]:
    """(batch, tokens/s) of every batch the search measured under the cap, ascending ([] where the run's step
    of the design is not the engine's now)."""
    p = point(model, context, design) if current_step(design) else None
    return [(int(s["batch"]), float(s["tok_s"])) for s in (p or {}).get("series", [])]


def memory_gb(model: str, context: int, design: str) -> dict | None:
    """Fig. 14's run: GB (1e9 B) by memory-model category at the peak of the fixed batch, and `total`
    (the allocated peak + the CUDA context and cuBLAS outside torch); {} where the batch did not fit."""
    p = point(model, context, design, FIG14)
    if p is None:
        return None
    big = p.get("largest")
    if not big:
        return {}
    from ddbench.core.memory import CATEGORIES
    out = {c: float(big.get(f"mem_{c}_gib") or 0.0) * GIB / GB for c in CATEGORIES}
    out["total"] = (float(big["peak_gib"]) + float(big.get("mem_runtime_overhead_gib") or 0.0)) * GIB / GB
    out["batch"] = int(p["largest_batch"])
    return out
