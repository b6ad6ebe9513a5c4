"""The summary of a validation table (sim/fit/validation.py validate / validate_runs): errors by regime and
design, the chunk cache's held-out capacities, FIFO against priority, each point over its builds, and how
every term was priced; `python -m ddbench.sim.validate` writes it as <stem>-summary.json. Imports no torch."""

from __future__ import annotations

import statistics

from ddbench.core.designs import DUALDECODER, DUALDECODER_FIFO
from ddbench.sim.fit.replay import COPY_REGATHER, IN_PLACE, LINK_BOUND, MODEL


POINT_KEY = ["model", "design", "context", "batch", "miss_rate", "churn_rate", "kv_bits", "cache_bits", "gpu_mem_cap",
             "shadowkv_step"]


def per_point(t) -> list[dict]:
    """Per point (POINT_KEY), over its builds (rows): the engine step's and the error's min / median / max."""
    out = []
    t = t.assign(churn_rate=t.churn_rate.astype(str))
    if "cache_bits" not in t:           # validations written before the fp8 GPU cache
        t = t.assign(cache_bits=16)
    for k, sub in t.groupby(POINT_KEY, sort=False):
        err = sub.sim_over_engine - 1
        out.append(dict(zip(POINT_KEY, k), builds=int(len(sub)), regime="/".join(dict.fromkeys(sub.regime)),
                        engine_ms_median=float(sub.engine_step_ms.median()), engine_ms_min=float(sub.engine_step_ms.min()),
                        engine_ms_max=float(sub.engine_step_ms.max()), sim_ms=float(sub.sim_step_ms.median()),
                        error_median=float(err.median()), error_min=float(err.min()), error_max=float(err.max()),
                        sources=", ".join(dict.fromkeys(sub.source))))
    for x in out:
        x["context"], x["batch"], x["kv_bits"] = int(x["context"]), int(x["batch"]), int(x["kv_bits"])
        x["cache_bits"] = int(x["cache_bits"])
    return out


def fifo_pairs(t) -> list[dict]:
    """FIFO / priority step ratios, engine (median, min, max over repetitions) and simulator."""
    out = []
    key = ["context", "batch", "miss_rate", "transfers", "phase", "rep"]
    t = t[t.transfers == 1]
    p = t[t.design == DUALDECODER].set_index(key)
    f = t[t.design == DUALDECODER_FIFO].set_index(key)
    groups: dict = {}
    for k in p.index.intersection(f.index):
        groups.setdefault(k[:3], []).append((float(f.engine_step_ms[k] / p.engine_step_ms[k]),
                                             float(f.sim_step_ms[k] / p.sim_step_ms[k])))
    for k, v in sorted(groups.items()):
        eng = sorted(x for x, _ in v)
        out.append(dict(context=int(k[0]), batch=int(k[1]), miss_rate=k[2], reps=len(v),
                        engine=statistics.median(eng), engine_min=eng[0], engine_max=eng[-1],
                        sim=statistics.median(y for _, y in v)))
    return out


def _errors(sub) -> dict:
    if not len(sub):
        return {"points": 0}
    err = (sub.sim_over_engine - 1.0).abs()
    worst = sub.loc[err.idxmax()]
    return {"points": int(len(sub)), "median_abs_error": float(err.median()), "worst_abs_error": float(err.max()),
            "median_sim_over_engine": float(sub.sim_over_engine.median()),
            "worst_point": f"{worst.model + ' ' if worst.model != MODEL else ''}{worst.design} {worst.context // 1024}K b{worst.batch} miss {worst.miss_rate}"
                           f" transfers {worst.transfers}: engine {worst.engine_step_ms:.2f} ms,"
                           f" sim {worst.sim_step_ms:.2f} ms"}


def _cache_held_out(t) -> dict:
    """A chunk-cache design's points by capacity, outside the context its fill term was fitted to."""
    if "cache_fill_fitted" not in t or not (t.cache_tokens.astype(str) != "").any():
        return {}
    c = t[(t.cache_tokens.astype(str) != "") & ~t.cache_fill_fitted.astype(bool)]
    out = {f"{d}@{int(float(k))} (fill not fitted here)": _errors(sub)
           for (d, k), sub in c.groupby(["design", "cache_tokens"])}
    out["fitted points"] = {"points": int(((t.cache_tokens.astype(str) != "") & t.cache_fill_fitted.astype(bool)).sum())}
    return out


def summarize(t, skipped, meta) -> dict:
    off = t[t.transfers == 1]
    exact = int((off.link_bytes_diff == 0).sum())
    regimes = {k: _errors(t[t.regime == k]) for k in ("link-bound", "overlap", "compute-only")}
    lb = t[t.regime == "link-bound"]
    if len(lb):
        regimes["link-bound"]["median_link_gbps_engine"] = float(lb.engine_link_gbps.median())
        regimes["link-bound"]["median_link_gbps_sim"] = float(lb.sim_link_gbps.median())
    sw = meta.get("sweeps", {})
    cal, val = sw.get("calibration", {}), sw.get("validated", {})
    used = sorted({x for x in t.get("reuse_fetch_model", []) if isinstance(x, str) and x})
    fits = meta.get("reuse_fetch_fits", {})
    if "fitted" in used and "bundle-derived" not in used:
        reuse = ("FITTED to the bundle's reuse_fetch records (the engine's fetch measured alone): "
                 + "; ".join(f"{k}: {v['describe']}" for k, v in fits.items()))
    elif used:
        reuse = ("BUNDLE-DERIVED at some or all points (the bundle has no reuse_fetch records of their gather shape:"
                 " copy at the HBM copy rate, then one gather's fixed cost and latency-bound walk over every slot,"
                 " 32 programs x 2 chunks in flight, round trip from the bundle's 32-block gather; not measured);"
                 " per point: column reuse_fetch_model")
    else:
        reuse = "no replayed point has a reuse fetch"
    unmeasured = sorted(m for m, ok in meta.get("harness_by_model", {}).items() if not ok)
    harness = ("the calibration sweep's forced-miss compute-only steps minus its own-selection ones, added to every"
               " forced-miss point (harness_ms)" + (f"; NOT MEASURED for {', '.join(unmeasured)} (the calibration"
                                                   " sweep ran other shapes): 0 there, as in the user's path"
                                                   if unmeasured else "") if sw.get("harness_measured") else
               "not measured by the calibration sweep (no forced-miss floor points): forced-miss points carry the"
               " harness's draw and the simulator does not add it")
    return {
        "points": int(len(t)), "skipped": [f"{a}: {b}" for a, b in skipped],
        "models": sorted(set(t.model)), "held_out": bool(meta.get("held_out")),
        "fitted_model": meta.get("fitted_model", MODEL),
        "by_design": {f"{d} {g}": _errors(sub) for (d, g), sub in t.groupby(["design", "regime"])},
        "cache_held_out": _cache_held_out(t),
        "sweeps": sw,
        "calibration": "one cost model, the user's: every point is priced by ddbench.sim.steplayers.step_layers and the"
                       " timeline as `ddbench simulate --batch N` prices it; compute: the bundle's decode terms"
                       " fitted to the engine's kernel breakdown and engine section (sim/fit/enginefit.py, fitted once"
                       f" into {meta.get('fitted', 'the fitted-parameters file')}; the fit is in the cost-model notes), unscaled (compute_scale 1); link: the bundle's link and"
                       " interference sections (the gather's fixed cost per gather queued behind one of its stream);"
                       f" the harness term from the floor phase of {cal.get('folder')}. No replayed point is a"
                       " calibration point; " + ("the validated points come from the SAME RUN as the calibration"
                                                 " points" if sw.get("same_run") else
                                                 f"the validated points come from a separate run ({val.get('folder')})")
                       + ".",
        "harness": "the engine's own terms, not a design cost, added here only: the forced-miss draw, " + harness
                   + "; ShadowKV rows of the engine before its in-place step (column shadowkv_step "
                   + COPY_REGATHER + ", the run's engine version: sim/fit/replay.py engine_version) with that engine's"
                   " copy-then-regather fetch (on the compute stream, copy of the previous selection into a spare,"
                   " reuse plan, one gather over every slot; the key rebuild of every selected slot after it;"
                   " reuse_fetch_ms) " + reuse + "; ShadowKV rows of the in-place engine (" + IN_PLACE + ") by the"
                   " user's plan unchanged",
        "reuse_fetch": {"models": used, "fits": fits},
        "rule": f"link-bound: engine link GB/s >= {LINK_BOUND} x the thin-gather rate of the same run"
                f" ({meta['thin_gather_gbps']:.1f} GB/s); compute-only: no transfers; overlap: the rest",
        "regimes": regimes,
        "link_bytes": {"points_with_transfers": int(len(off)), "exact": exact,
                       "max_abs_diff_bytes": float(off.link_bytes_diff.abs().max()) if len(off) else 0.0},
        "fifo_over_priority": fifo_pairs(t),
        **({"per_point": per_point(t)} if meta.get("per_point") else {}),
        "shadowkv_steps": {k: int((t.shadowkv_step == k).sum()) for k in (IN_PLACE, COPY_REGATHER)}
        if "shadowkv_step" in t else {},
    }
