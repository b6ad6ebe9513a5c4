"""The engine sweep's files: engine.csv (one row per step point, with its exposed transfer time against
its compute-only twin), reuse_fetch.csv (the reuse-fetch records), summary.json (the ratios, with
min / median / max over repetitions, and the paper phase's summary); `rebuild` writes them again from
rows.jsonl and meta.json (a run cut short). Read by kernels/engine/tables.py and ddbench.core.traces."""

from __future__ import annotations

import csv
import json
import os
import statistics

from ddbench.core.designs import DESIGNS as SYSTEMS
from ddbench.core.designs import (DUALDECODER, DUALDECODER_CPU_GATHER, DUALDECODER_FIFO, DUALDECODER_PER_LAYER,
                                    DUALDECODER_TWO_PASS, compute_twin)
from ddbench.core.enginepoint import EnginePoint
from ddbench.kernels.engine import paper as paper_phase
from ddbench.kernels.engine.phases import DUALDECODER_SINGLE, K32, K128, MECH_POINTS, PAPER, REUSE

SCHEMA = 3    # engine.csv and reuse_fetch.csv; 3: the model column, memory by category, the paper phase's columns
MEM_COLUMNS = ["mem_weights_gib", "mem_resident_kv_gib", "mem_landmarks_gib", "mem_aux_residency_gib",
               "mem_sparse_kv_buffers_gib", "mem_activations_gib", "mem_runtime_overhead_gib"]
COLUMNS = ["phase", "model", "rep", "design", "context", "batch", "miss_rate", "transfers", "graph", "urgent_programs",
           "host_layers", "host_alias", "status", "step_ms", "step_ms_min", "step_ms_max", "tok_s", "tok_s_min",
           "tok_s_max", "peak_gib", "peak_reserved_gib", "planned_gib", *MEM_COLUMNS,
           "floor_ms", "step_over_floor", "weights_gib", "selection_gib", "kv_gib",
           "prefetch_mib", "urgent_mib", "link_mib", "link_gbps", "link_util", "floor_link_ms",
           "model_max_batch", "model_mem_gib", "gpu_mem_cap", "cap_gib", "largest_batch", "largest_basis",
           "next_planned_gib", "paper_role", "steps", "wall_s", "error", "cache_tokens", "churn_rate", "design_label",
           "kv_bits", "cache_bits"]
REUSE_COLUMNS = ["phase", "model", "rep", "design", "context", "batch", "miss_rate", "status", "layers", "host_layers",
                 "slots", "miss_chunks", "chunk_bytes", "programs", "items", "rounds", "link_mib", "copy_ms",
                 "plan_ms", "gather_ms", "fetch_ms", "fetch_ms_min", "fetch_ms_max", "replays", "buffer_tokens",
                 "peak_gib", "wall_s", "error"]


def _csv_row(r):
    """engine.csv names registry designs only: '<design>-single' is written as <design> with tokens=1."""
    p = EnginePoint(r.get("design", ""))
    d = p.base
    return dict(r, design=d, tokens=1 if p.single else (SYSTEMS[d].tokens_per_step if d in SYSTEMS else ""))


def add_exposed(rows):
    """exposed_ms = step with transfers - the compute-only step of the same design (an ablation that changes
    only transfer switches, the FIFO, per-layer and CPU-gather ones, computes exactly what its base computes:
    designs.compute_twin), context and batch, from the same repetition where there is one; 0 for compute-only
    rows and a design with its KV on the GPU (full-kv: no transfers)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("step_ms")]
    for r in ok:
        spec = SYSTEMS.get(EnginePoint(r["design"]).base)
        if not r["transfers"] or (spec is not None and spec.kv_on_gpu):
            r["exposed_ms"], r["exposed_share"] = 0.0, 0.0
            continue
        d = compute_twin(r["design"])
        twin = [t for t in ok if not t["transfers"] and t["design"] == d and t["context"] == r["context"]
                and t["batch"] == r["batch"] and t.get("model") == r.get("model")]
        same = [t for t in twin if t.get("rep") == r.get("rep") and t.get("phase") == r.get("phase")]
        t = (same or twin or [None])[0]
        if t is None:
            r["exposed_ms"] = r["exposed_share"] = None
            continue
        r["exposed_ms"] = max(0.0, r["step_ms"] - t["step_ms"])
        r["exposed_share"] = r["exposed_ms"] / r["step_ms"]
        r["compute_ms"] = t["step_ms"]


def write(out, rows, summary):
    from ddbench.core.io import atomic_path, write_json
    prov = summary["provenance"]
    pcols = list(prov)
    reuse = [r for r in rows if r.get("phase") == REUSE]     # no step: neither engine.csv nor the ratios
    rows = [r for r in rows if r.get("phase") != REUSE]
    add_exposed(rows)
    os.makedirs(out, exist_ok=True)
    if reuse:
        with atomic_path(os.path.join(out, "reuse_fetch.csv")) as tmp:
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                w = csv.DictWriter(fh, fieldnames=["schema"] + REUSE_COLUMNS + pcols, extrasaction="ignore")
                w.writeheader()
                for r in reuse:
                    w.writerow({"schema": SCHEMA, **r, **prov})
        summary["reuse_fetch"] = [{c: r.get(c) for c in REUSE_COLUMNS if c not in ("phase", "rep", "error")}
                                  for r in reuse]
    cols = ["schema"] + COLUMNS + ["tokens", "exposed_ms", "exposed_share", "compute_ms"] + pcols
    with atomic_path(os.path.join(out, "engine.csv")) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                rr = _csv_row(r)
                if rr.get("status") == "ok" and rr.get("exposed_ms") is None:
                    rr["status"] = "ok-no-twin"   # measured, but no compute-only twin to split off exposure
                w.writerow({"schema": SCHEMA, **rr, **prov,
                            **({"source_hash": rr["source_hash"]} if rr.get("source_hash") else {})})
    summary["schema"] = SCHEMA
    summary["ratios"] = ratios(rows)
    if any(r.get("phase") == PAPER for r in rows):
        summary["paper"] = paper_phase.summarize(rows)
    write_json(os.path.join(out, "summary.json"), summary)


def _spread(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return dict(n=len(xs), min=xs[0], median=statistics.median(xs), max=xs[-1])


def ratios(rows):
    """Step/floor per point, dual/single, and every mechanism ratio per repetition with min/median/max.
    `clear` says whether the effect (|median - 1|) exceeds the spread (max - min) of the ratio."""
    ok = [r for r in rows if str(r.get("status", "")).startswith("ok") and r.get("step_ms")]

    def pick(phase=None, **kw):
        return [r for r in ok if (phase is None or r.get("phase") == phase) and all(r.get(k) == v for k, v in kw.items())]

    res = {}
    floor = {}
    for r in pick("floor", miss_rate="none"):     # the model's own selection (not the forced-miss twins)
        floor[f"{r['design']}|{r['context']}|{r['batch']}"] = dict(step_ms=r["step_ms"], floor_ms=r["floor_ms"],
                                                                  step_over_floor=r["step_over_floor"])
    res["step_over_floor"] = floor
    ds = {}
    for c in (K32, K128):
        for B in (1, 16, 64):
            a = pick("floor", design=DUALDECODER, context=c, batch=B, miss_rate="none")
            b = pick("floor", design=DUALDECODER_SINGLE, context=c, batch=B, miss_rate="none")
            if a and b:
                ds[f"{c}|{B}"] = a[0]["step_ms"] / b[0]["step_ms"]
    res["dual_over_single"] = ds

    def per_rep(num, den):
        out = []
        for rep in sorted({r["rep"] for r in pick("mechanism")}):
            n = pick("mechanism", rep=rep, **num)
            d = pick("mechanism", rep=rep, **den)
            if n and d:
                out.append(n[0]["step_ms"] / d[0]["step_ms"])
        sp = _spread(out)
        if sp:
            sp["values"] = out
            sp["clear"] = abs(sp["median"] - 1) > (sp["max"] - sp["min"])
        return sp

    mech = {}
    for B, mr in MECH_POINTS:
        tag = f"b{B}_m{mr}"
        mech[f"fifo_over_priority_{tag}"] = per_rep(
            dict(design=DUALDECODER_FIFO, context=K128, batch=B, miss_rate=mr, transfers=1),
            dict(design=DUALDECODER, context=K128, batch=B, miss_rate=mr, transfers=1, graph=1))
        sh, lu = [], []
        for rep in sorted({r["rep"] for r in pick("mechanism")}):
            x = pick("mechanism", rep=rep, design=DUALDECODER, context=K128, batch=B, miss_rate=mr, transfers=1, graph=1)
            c = pick("mechanism", rep=rep, design=DUALDECODER, context=K128, batch=B, miss_rate=mr, transfers=0)
            if x and c:
                sh.append((x[0]["step_ms"] - c[0]["step_ms"]) / x[0]["step_ms"])
                lu.append(x[0].get("link_util"))
        mech[f"exposed_share_{tag}"] = _spread(sh)
        if mech[f"exposed_share_{tag}"]:
            mech[f"exposed_share_{tag}"]["values"] = sh
            mech[f"exposed_share_{tag}"]["link_util"] = _spread(lu)
    base = dict(design=DUALDECODER, context=K128, batch=16, miss_rate=0.33, transfers=1, graph=1)
    mech["two_pass_over_dual_b16"] = per_rep(dict(design=DUALDECODER_TWO_PASS, context=K128, batch=16, transfers=1), base)
    mech["two_pass_over_dual_compute_only_b16"] = per_rep(
        dict(design=DUALDECODER_TWO_PASS, context=K128, batch=16, transfers=0),
        dict(design=DUALDECODER, context=K128, batch=16, miss_rate=0.33, transfers=0))
    mech["per_layer_over_pingpong_b16"] = per_rep(dict(design=DUALDECODER_PER_LAYER, context=K128, batch=16), base)
    mech["cpu_gather_over_gpu_gather_eager_b16"] = per_rep(
        dict(design=DUALDECODER_CPU_GATHER, context=K128, batch=16),
        dict(design=DUALDECODER, context=K128, batch=16, miss_rate=0.33, transfers=1, graph=0))
    mech["cpu_gather_over_gpu_gather_graph_b16"] = per_rep(dict(design=DUALDECODER_CPU_GATHER, context=K128, batch=16), base)
    mech["eager_over_graph_b16"] = per_rep(dict(design=DUALDECODER, context=K128, batch=16, miss_rate=0.33,
                                                transfers=1, graph=0), base)
    res["mechanism"] = mech
    pk = {}
    for d in (DUALDECODER, DUALDECODER_PER_LAYER):
        x = pick("mechanism", design=d, context=K128, batch=16, transfers=1, graph=1)
        if x:
            pk[d] = _spread([r["peak_gib"] for r in x])
    res["peak_gib_b16"] = pk
    res["link_util"] = {f"{r['design']}|{r['context']}|{r['batch']}|{r['miss_rate']}|rep{r.get('rep', 0)}": r["link_util"]
                        for r in ok if r["transfers"] and r.get("link_util")}
    return res


def rebuild(folder):
    """Write engine.csv, layers.csv and summary.json from rows.jsonl + meta.json (a run cut short)."""
    with open(os.path.join(folder, "meta.json"), encoding="utf-8") as fh:
        meta = json.load(fh)
    rows, seen = [], {}
    with open(os.path.join(folder, "rows.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            seen[r["key"]] = r
    for r in seen.values():
        if r.get("row"):              # not the paper phase's done markers
            rows.append(r["row"])
    meta["schema"] = SCHEMA
    write(folder, rows, meta)
    return rows
