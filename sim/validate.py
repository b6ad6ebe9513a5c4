"""Validate the simulator against the decode-step engine measured on the H200.

    python -m sim.validate [--calibration-engine traces/engine/h200] [--engine traces/engine/h200-validation]
                           [--allow-same-run] [--out traces/validation/h200-engine.csv]

    python -m sim.validate --user-path      # the user's path (ddbench simulate --batch) at the validated
                                            # sweep's points with transfers, by design and regime; no files

Two engine sweeps: `--calibration-engine` (its `floor` phase gives the harness term below; the bundle's
engine section, imported from it, is one of the data the compute terms are fitted to) and `--engine`
(its points, outside any `floor` phase, are replayed and compared). They must be separate runs of
kernels/engine/sweep.py (meta.json: run_id, else the provenance's date, git sha and command), and the
validated one must not be the run the bundle's engine section came from; the same run is refused (one
line, exit 2) unless `--allow-same-run`.
Defaults: calibration traces/engine/h200-floor where it exists, else traces/engine/h200; validated
traces/engine/h200-validation where it exists, else traces/engine/h200 (then the same run: only with
--allow-same-run).

Every engine point of `engine.csv` (kernels/engine/sweep.py) is replayed through the code every
command runs: sim.steplayers.step_layers on the cost model of sim/setup.py (the H200 bundle, its decode
compute reconciled with the engine's kernel breakdown: sim/costmodel.py EngineFit), then the per-layer
timeline (sim/timeline.py, as `ddbench simulate --batch N` runs it), with the same design (by its
registry switches), model (llama-3-8b), GPU (h200), link (pcie5), context, batch and miss rate. A user
running `ddbench simulate --design D --context C --batch B --hit-rate (1 - miss)` gets the same plan
and step, less the harness term below (tests/test_one_cost_model.py).

- Miss rate: the engine forces round(rate * k) of the k = budget / chunk predicted chunks of every
  (request, head) to miss, so the replay uses that effective rate on every layer as its hit rate
  (1 - it) and, for ShadowKV, its reuse rate; then the planned link bytes are the engine's to the byte.
- `transfers = 0` rows (compute only, no host reads) are replayed with the plan's link work removed
  (and ShadowKV's fetch with it: the engine skips it).
- Rows whose miss rate is `none` ran the model's own prediction with random weights: its miss rate
  is unknown, so offloading designs' rows are skipped. Designs that keep the KV cache on the GPU
  (full-kv) move nothing and predict nothing; their `none` rows are replayed.
- Rows that did not complete (`status` other than ok, e.g. oom) are skipped.

The engine's steps are CUDA-graph replays, so the GPU, not the host, sets their pace; eager steps
(ablations the engine cannot capture) are skipped. Nothing of the validated sweep calibrates the
simulator: the compute terms are fitted to the engine breakdown (traces/engine/h200/breakdown.json,
batches 1, 16 and 64) and the bundle's engine section (the calibration sweep's floor phase, the same
batches), the ShadowKV fetch to the calibration sweep's reuse-fetch records, the link to the bundle's
link.csv and interference.csv. One term is the engine harness's, not a design's, and is added here only,
stated per point:
- `harness_ms`: the sweep harness draws forced misses on the compute stream (one kernel per layer,
  and the miss plan outside the top-k's merge); the calibration sweep's floor phase measures
  forced-miss compute-only steps beside the own-selection ones, and their difference (piecewise linear
  in the batch, the nearest measured batch outside them) is added to every forced-miss point's
  compute, spread over the layers.
ShadowKV's fetch (`reuse_fetch_ms`, column `reuse_fetch_model`) is the design's cost as the engine
runs it and is in the user's plan too (sim/steplayers.py): FITTED to the bundle's `reuse_fetch`
records where it has them, else BUNDLE-DERIVED (older bundles), and the summary and notes say which.
`compute_scale` is 1 at every point (the compute is the cost model's, unscaled; the column stays for
the CSV's format).
Regime of each point:
  compute-only   the engine ran without host reads (transfers = 0)
  link-bound     engine link bytes per step / engine step >= LINK_BOUND x the thin-gather rate
                 measured in the same engine run (meta.json)
  overlap        the rest: transfers overlap compute and neither saturates
Writes the per-point CSV and `<out stem>-summary.json` (median and worst error in the link-bound
regime, bytes agreement). Imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace

from ddbench.core import defaults as D
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.traces import load_engine
from sim.costmodel import ENGINE_REUSE_IN_FLIGHT as REUSE_IN_FLIGHT, ENGINE_REUSE_PROGRAMS as REUSE_PROGRAMS

MODEL, GPU, LINK = "llama-3-8b", "h200", "pcie5"
ENGINE_REL = "traces/engine/h200"    # under the data root; named so in outputs
CALIBRATION_SWEEP = GPU               # traces/engine/<this>: the default calibration sweep ...
CALIBRATION_FLOOR_SWEEP = GPU + "-floor"   # ... unless a floor-only run (bench --phases floor) exists
VALIDATION_SWEEP = GPU + "-validation"   # traces/engine/<this>: the default validated sweep, where it exists
HELD_OUT_SWEEP = GPU + "-paper"       # traces/engine/<this>: other models' shapes (the held-out validation)
FP8_SWEEP = "h200-fp8"           # dualdecoder-cache and ShadowKV with fp8 host KV beside bf16 (kernels/engine/paper.py)
CACHE_SWEEP = GPU + "-cache"          # traces/engine/<this>: the chunk-cache design against the others
LINK_BOUND = 0.75      # share of the measured gather rate the engine's link must sustain
STEPS, WARMUP = D.STEPS, min(2, D.STEPS - 1)   # the timeline as `ddbench simulate --batch N` runs it
MIB = 2 ** 20

def load_meta(engine_dir: str) -> dict:
    path = os.path.join(engine_dir, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise DDBenchError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise DDBenchError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    for k in ("copy_h2d_gbps", "thin_gather_gbps"):
        if not isinstance(meta.get(k), (int, float)) or meta[k] <= 0:
            raise DDBenchError(f"{path}: {k} missing or not a positive number")
    return meta


def run_identity(meta: dict) -> dict:
    """What names an engine run: its run_id where bench.py wrote one, and its provenance."""
    p = meta.get("provenance", {}) or {}
    return {"run_id": meta.get("run_id"), "gpu": p.get("gpu"), "git_sha": p.get("git_sha"),
            "date_utc": p.get("date_utc"), "command": p.get("command"), "phases": meta.get("phases"),
            "seed": meta.get("seed")}


def same_run(dir_a: str, meta_a: dict, dir_b: str, meta_b: dict) -> bool:
    """True where two sweep folders hold the same run: the same folder, the same run_id, or (a run
    without run_id) the same provenance date, git sha and command."""
    if os.path.realpath(dir_a) == os.path.realpath(dir_b):
        return True
    a, b = run_identity(meta_a), run_identity(meta_b)
    if a["run_id"] and b["run_id"]:
        return a["run_id"] == b["run_id"]
    keys = ("date_utc", "git_sha", "command")
    return all(a[k] is not None for k in keys) and all(a[k] == b[k] for k in keys)


def default_dirs() -> tuple[str, str]:
    """(calibration sweep, validated sweep) folders by default."""
    cal = str(traces_dir("engine", CALIBRATION_FLOOR_SWEEP))
    if not os.path.exists(os.path.join(cal, "engine.csv")):
        cal = str(traces_dir("engine", CALIBRATION_SWEEP))
    val = str(traces_dir("engine", VALIDATION_SWEEP))
    return cal, (val if os.path.exists(os.path.join(val, "engine.csv")) else cal)


def effective_miss(rate: float, budget: int, chunk: int) -> float:
    """The engine's forced miss rate: round(rate * k) of k = budget / chunk chunks per (request, head)."""
    k = budget // chunk
    return round(rate * k) / k


def engine_cache_rates(r, model: str):
    """A chunk-cache design's rates at an engine point: the chunks its cache really moved per step (the
    row's prefetch and urgent bytes, its forced churn and misses through its own LRU cache) over the
    budget's; the replay takes the workload's rates from the engine as it takes the forced miss rate."""
    from ddbench.core.cacherates import forced
    from ddbench.core.catalog import get_model
    from ddbench.core.memory import Workload, kv_piece_bytes
    m, w = get_model(model), Workload(context=int(r.context), kv_bits=_kv_bits(r))
    full = int(r.batch) * m.num_layers * m.num_kv_heads * (w.budget // w.chunk) * 2 * kv_piece_bytes(m, w)
    pf, ur = float(r.prefetch_mib) * MIB / full, float(r.urgent_mib) * MIB / full
    return forced(min(pf, 1.0), min(ur, 1.0), m.num_layers,
                  f"the engine's moved chunks: prefetched {pf:.3f}, urgent {ur:.3f} of the budget per step")


def replay_plan(design: str, context: int, batch: int, miss: float, transfers: bool, cm=None, model: str = MODEL,
                cache=None, cache_tokens: int | None = None, kv_bits: int = 16):
    """The simulator's plan of one engine point: exactly the user's (`ddbench simulate --design design
    --context context --batch batch --hit-rate 1-miss`: step_layers at hit = reuse = 1 - miss on every
    layer), with the link work (and ShadowKV's fetch) removed where the engine ran compute only. No
    harness term (with_harness adds it)."""
    from ddbench.core.catalog import get_model
    from ddbench.core.memory import Workload
    from ddbench.core.designs import get_design
    from sim.steplayers import step_layers
    from sim.setup import cost_model
    m = get_model(model)
    cm = cm or cost_model(model, GPU, LINK)
    hit = [1.0 - miss] * m.num_layers
    w = Workload(context=context, batch=batch, kv_bits=kv_bits,
                 **({} if cache_tokens is None else {"cache_tokens": int(cache_tokens)}))
    plan = step_layers(get_design(design), m, cm, w, batch, context, hit, hit, cache=cache)
    if not transfers and plan.rates is not None:   # compute only: no host reads, nothing on the link
        z = [0.0] * m.num_layers
        plan = replace(plan, pf_bytes=z, ur_bytes=z, d2h_bytes=z, pf_work=z, ur_work=z, d2h_work=z,
                       cpu_pf_work=z, cpu_ur_work=z, rates=None, ur_min_s=[], ur_serial=False)
    return plan


def with_harness(plan, harness_s: float):
    """The plan with the engine harness's forced-miss draw (a sweep-harness term, not a design cost:
    the module doc) added to the compute stream, spread evenly over the layers before their selection
    ends (the draw and the plan run between the top-k and the transfers)."""
    if not harness_s:
        return plan
    h = harness_s / plan.layers
    return replace(plan, pre=[x + h for x in plan.pre])


COMPUTE_TWIN = {"dualdecoder-fifo": "dualdecoder", "dualdecoder-per-layer": "dualdecoder",
                "dualdecoder-cpu-gather": "dualdecoder"}


def classify(transfers: int, link_gbps: float, thin_gbps: float) -> str:
    if not transfers:
        return "compute-only"
    if link_gbps >= LINK_BOUND * thin_gbps:
        return "link-bound"
    return "overlap"


def reuse_fetch(plan, cm=None, batch: int | None = None) -> list[float]:
    """Per layer, the engine's reuse fetch the plan charges (step_layers: CostModel.reuse_fetch_s at the
    layer's miss share); [] for designs without a reuse fetch or without transfers."""
    return list(plan.ur_min_s) if plan.ur_serial and plan.rates is not None else []


def reuse_fetch_model(plan, cm) -> str:
    """'fitted' or 'bundle-derived' (CostModel.reuse_fetch_model) for a plan with a reuse fetch, else ''."""
    from ddbench.core.memory import Workload
    design = plan.design
    if not reuse_fetch(plan):
        return ""
    m, w = cm.model, Workload(context=1)
    models = {cm.reuse_fetch_model((1 if design.fetch == "values" or i in plan.lowrank else 2) * w.chunk * m.head_dim * 2,
                                   REUSE_PROGRAMS, REUSE_IN_FLIGHT) for i in range(plan.layers) if plan.ur_bytes[i]}
    return "+".join(sorted(models))


def point_step_s(plan) -> tuple:
    """(steady step seconds, the timeline) of a plan in the timeline mode, as `ddbench simulate --batch`
    runs it (D.STEPS batch steps, 2 warm-up)."""
    from sim.timeline import run_timeline
    tl = run_timeline(plan, steps=STEPS, warmup=WARMUP)
    return tl.steady_step_s, tl


COMPLETED = ("ok", "ok-no-twin")   # measured (ok-no-twin: no compute-only twin to split off the exposure)


def row_model(r) -> str:
    """The row's model (sweeps before the --model flag measured MODEL only)."""
    m = getattr(r, "model", None)
    return m if isinstance(m, str) and m else MODEL


class CostModels:
    """One cost model per model (sim/setup.py's, as every command builds it), each with the calibration
    sweep's engine rows (harness term: measured for its model only)."""

    def __init__(self, calibration_dir: str, cm=None):
        from ddbench.core.calibration import engine_section_rows
        self.rows = engine_section_rows(os.path.join(calibration_dir, "engine.csv"))
        self.cms = {} if cm is None else {cm.model.name: cm}
        for c in self.cms.values():
            c.set_engine_rows(self.rows)

    def __call__(self, model: str):
        if model not in self.cms:
            from sim.setup import cost_model
            self.cms[model] = cost_model(model, GPU, LINK)
            self.cms[model].set_engine_rows(self.rows)
        return self.cms[model]

    def notes(self) -> list[str]:
        out = []
        for name, c in self.cms.items():
            out += [n if len(self.cms) == 1 else f"{name}: {n}" for n in c.notes]
        return out


def validate(engine_dir: str | None = None, calibration_dir: str | None = None, allow_same_run: bool = True,
             held_out: bool = False):
    """(table of replayed points, list of (row, reason) skipped, meta, cost-model notes).

    Each point is priced as the user's `ddbench simulate --batch` prices it (replay_plan, point_step_s:
    the cost model of sim/setup.py, compute and link), plus the harness term from the calibration
    sweep's `floor` phase (with_harness). Every point replayed here is outside the validated sweep's
    `floor` phase. `meta` is the validated sweep's meta.json, with
    `sweeps` added (both runs' identities, same_run). allow_same_run=False raises a DDBenchError where
    both folders hold the same run (the CLI's default; this function's default keeps the figures
    working against a single sweep, and `sweeps.same_run` says so).

    held_out: replay the rows of every model but MODEL, the shapes the compute terms were fitted to
    (their rows are skipped); else MODEL's rows only. A held-out model's harness term is the
    calibration sweep's for that model where it measured one, else 0 (stated: `harness_measured`)."""
    import pandas as pd
    from ddbench.core.memory import Workload
    d_cal, d_val = default_dirs()
    engine_dir = engine_dir or d_val
    calibration_dir = calibration_dir or d_cal
    df = load_engine(os.path.join(engine_dir, "engine.csv"))
    meta = load_meta(engine_dir)
    cal_meta = load_meta(calibration_dir)
    same = same_run(calibration_dir, cal_meta, engine_dir, meta)
    if same and not allow_same_run:
        raise DDBenchError(f"{engine_dir} and {calibration_dir} hold the same engine run"
                           f" ({run_identity(meta)['run_id'] or run_identity(meta)['date_utc']}): validate against"
                           " a separate sweep (kernels.engine.bench --phases validation) or pass --allow-same-run")
    thin = float(meta["thin_gather_gbps"])
    cms = CostModels(calibration_dir)
    cm = cms(MODEL)
    # the bundle's engine section (which the compute terms are fitted to) must not be the validated run
    src = (cm.bundle.meta.get("sections", {}).get("engine", {}).get("source") or {}) if cm.bundle else {}
    if src.get("run_id") and src.get("run_id") == meta.get("run_id"):
        same = True
        if not allow_same_run:
            raise DDBenchError(f"{engine_dir} holds the engine run the bundle's engine section was imported from"
                               f" ({src['run_id']}): validate against a separate sweep or pass --allow-same-run")
    ci, vi = run_identity(cal_meta), run_identity(meta)
    meta = dict(meta, sweeps={
        "calibration": dict(folder=_rel(calibration_dir), **ci), "validated": dict(folder=_rel(engine_dir), **vi),
        "same_run": bool(same), "same_code": ci["git_sha"] == vi["git_sha"],
        "harness_measured": bool(cm.engine_forced_tab)}, held_out=bool(held_out), fitted_model=MODEL)
    fits = getattr(cm, "reuse_fits", {})
    meta["reuse_fetch_fits"] = {f"{k[0]} B chunks, {k[1]} programs x {k[2]}": dict(
        describe=f.describe(), fixed_us=f.fixed_s * 1e6, copy_gbps=f.copy_Bps / 1e9, hit_round_us=f.hit_s * 1e6,
        miss_round_us=f.miss_s * 1e6, mix_round_us=f.mix_s * 1e6, records=f.records,
        max_abs_rel_residual=f.max_rel_residual,
        residuals={f"{c // 1024}K b{b} miss {q:g}": e for c, b, q, e in f.rel_residuals}) for k, f in fits.items()}
    w0 = Workload(context=1)
    rows, skipped = [], []
    same_dir = os.path.realpath(calibration_dir) == os.path.realpath(engine_dir)
    harness_models = {}
    for r in df.itertuples():
        label = f"{r.design} {r.context // 1024}K b{r.batch} miss {r.miss_rate} transfers {r.transfers}"
        phase = getattr(r, "phase", "")
        model = row_model(r)
        if (model == MODEL) == bool(held_out):
            skipped.append((label, f"model {model}" + (" (the fitted shapes)" if held_out else " (held out)")))
            continue
        if r.status not in COMPLETED:
            skipped.append((label, f"status {r.status}"))
            continue
        if phase == "floor" and (same_dir or same):
            continue                      # the calibration itself
        if phase == "floor" and r.miss_rate == "none" and not int(r.transfers):
            skipped.append((label, "another sweep's calibration point (compute only, own selection)"))
            continue
        if not int(getattr(r, "graph", 1)):
            skipped.append((label, "eager step (the host launches inside the step; the simulator has GPU time only)"))
            continue
        cmm = cms(model)
        key = COMPUTE_TWIN.get(r.design, r.design)
        rate = 0.0 if r.miss_rate == "none" else float(r.miss_rate)
        miss = effective_miss(rate, w0.budget, w0.chunk)
        cache, ct = _cache_of(r, model)
        try:
            plan = replay_plan(r.design, r.context, r.batch, miss, bool(r.transfers), cmm, model, cache, ct,
                               _kv_bits(r))
        except DDBenchError as exc:          # e.g. fp8 pieces smaller than any the bundle measured
            skipped.append((label + f" kv_bits {_kv_bits(r)}", f"not priced: {exc}"))
            continue
        fill_fitted = bool(ct) and _fill_fitted(cmm, meta, int(r.context))
        harness = 0.0
        if r.miss_rate != "none" and not plan.design.kv_on_gpu:
            h = cmm.engine_harness_s(key, int(r.batch), int(r.context), clamp=True)
            harness_models[model] = harness_models.get(model, False) or h is not None
            harness = h or 0.0
        plan = with_harness(plan, harness)
        walk = reuse_fetch(plan)
        step_s, tl = point_step_s(plan)
        sim_ms = step_s * 1e3
        sim_bytes = plan.h2d_bytes
        eng_bytes = r.link_mib * MIB
        regime = classify(int(r.transfers), r.link_gbps, thin)
        rows.append(dict(
            phase=phase, rep=getattr(r, "rep", 0), model=model, gpu_mem_cap=getattr(r, "gpu_mem_cap", "none"),
            design=r.design, context=r.context, batch=r.batch, cache_tokens=ct or "", kv_bits=_kv_bits(r),
            cache_fill_fitted=fill_fitted,
            miss_rate=r.miss_rate, miss_replayed=miss, transfers=r.transfers, urgent_programs=r.urgent_programs,
            regime=regime, engine_step_ms=r.step_ms, sim_step_ms=sim_ms, sim_over_engine=sim_ms / r.step_ms,
            sim_gpu_compute_ms=plan.compute_s * 1e3, compute_scale=1.0, harness_ms=harness * 1e3,
            reuse_fetch_ms=sum(walk) * 1e3, reuse_fetch_model=reuse_fetch_model(plan, cmm) if walk else "",
            sim_stall_ms=statistics.fmean(tl.stall_s[tl.warmup:]) * 1e3, engine_exposed_ms=r.exposed_ms,
            engine_link_bytes=eng_bytes, sim_link_bytes=sim_bytes, link_bytes_diff=sim_bytes - eng_bytes,
            engine_link_gbps=r.link_gbps, sim_link_gbps=sim_bytes / (sim_ms * 1e-3) / 1e9 if sim_ms else 0.0,
            sim_link_util=tl.link_util, note=""))
    if not rows:
        raise DDBenchError(f"{engine_dir}: no engine point to replay ({len(skipped)} skipped, the rest calibration)")
    meta["harness_by_model"] = harness_models
    return pd.DataFrame(rows), skipped, meta, cms.notes()


def user_path_errors(engine_dir: str | None = None, phase: str | None = None, cm=None):
    """The user's path at every engine point with transfers of a sweep (default the validated one;
    `phase`: only its rows of that phase, e.g. 'validation' of the calibration sweep): what `ddbench
    simulate --model M --gpu h200 --design D --context C --batch B --hit-rate (1 - miss)` computes
    (replay_plan and the timeline, no harness term), against the engine's measured step, for every
    model the sweep ran (M: the row's); `cm`: another cost model than sim.setup's for MODEL (a test's
    negative control). Returns (table, summary): one row per point (model, design, context, batch,
    miss_rate, regime, engine_step_ms, user_step_ms, user_over_engine, harness_ms: what sim.validate adds
    on top), and per design and regime the points, median and worst |error|."""
    import pandas as pd
    from ddbench.core.memory import Workload
    engine_dir = engine_dir or default_dirs()[1]
    df = load_engine(os.path.join(engine_dir, "engine.csv"))
    meta = load_meta(engine_dir)
    cms = CostModels(default_dirs()[0], cm)     # the calibration sweep's rows: harness_ms only
    w0 = Workload(context=1)
    rows = []
    for r in df.itertuples():
        if r.status not in COMPLETED or not int(r.transfers) or not int(getattr(r, "graph", 1)):
            continue
        if phase is not None and getattr(r, "phase", "") != phase:
            continue
        if r.miss_rate == "none" and r.design != "full-kv":
            continue
        model = row_model(r)
        cmm = cms(model)
        miss = effective_miss(0.0 if r.miss_rate == "none" else float(r.miss_rate), w0.budget, w0.chunk)
        cache, ct = _cache_of(r, model)
        try:
            plan = replay_plan(r.design, r.context, r.batch, miss, True, cmm, model, cache, ct, _kv_bits(r))
        except DDBenchError:                 # not priced (validate() lists why)
            continue
        step, _ = point_step_s(plan)
        key = COMPUTE_TWIN.get(r.design, r.design)
        h = 0.0 if r.miss_rate == "none" else (cmm.engine_harness_s(key, int(r.batch), int(r.context), clamp=True)
                                                or 0.0)
        rows.append(dict(model=model, design=r.design, context=int(r.context), batch=int(r.batch),
                         kv_bits=_kv_bits(r), miss_rate=r.miss_rate, regime=classify(1, r.link_gbps, float(meta["thin_gather_gbps"])),
                         engine_step_ms=float(r.step_ms), user_step_ms=step * 1e3,
                         user_over_engine=step * 1e3 / float(r.step_ms), harness_ms=h * 1e3))
    t = pd.DataFrame(rows)
    summary = {}
    if len(t):
        err = (t.user_over_engine - 1).abs()
        summary["all"] = {"points": int(len(t)), "median_abs_error": float(err.median()),
                          "worst_abs_error": float(err.max())}
        for (d, g), sub in t.assign(err=err).groupby(["design", "regime"]):
            summary[f"{d} {g}"] = {"points": int(len(sub)), "median_abs_error": float(sub.err.median()),
                                   "worst_abs_error": float(sub.err.max())}
        for g, sub in t.assign(err=err).groupby("regime"):
            summary[g] = {"points": int(len(sub)), "median_abs_error": float(sub.err.median()),
                          "worst_abs_error": float(sub.err.max())}
    return t, summary


def _fill_fitted(cm, meta: dict, context: int) -> bool:
    """Whether the cost model's cache-fill term (sim/cachefill.py) was fitted to this run at this context."""
    f = cm.cache_fill or {}
    return bool(f) and f.get("source", {}).get("run_id") == meta.get("run_id") and int(f.get("context", -1)) == context


def _kv_bits(r) -> int:
    """The engine row's kv_bits (rows before the fp8 switch have none: 16)."""
    v = getattr(r, "kv_bits", None)
    return 16 if v is None or v != v or v == "" else int(v)


def _cache_of(r, model):
    """(cache rates, cache tokens) of a chunk-cache design's engine row, else (None, None)."""
    from ddbench.core.designs import get_design
    if not get_design(r.design).chunk_cache:
        return None, None
    return engine_cache_rates(r, model), int(getattr(r, "cache_tokens"))


def _rel(path: str) -> str:
    """A folder under the data root's parent as 'traces/...', else as given."""
    base = os.path.realpath(str(traces_dir().parent))
    full = os.path.realpath(path)
    return os.path.relpath(full, base) if full.startswith(base + os.sep) else path


def fifo_pairs(t) -> list[dict]:
    """FIFO / priority step ratios, engine (median, min, max over repetitions) and simulator."""
    out = []
    key = ["context", "batch", "miss_rate", "transfers", "phase", "rep"]
    t = t[t.transfers == 1]
    p = t[t.design == "dualdecoder"].set_index(key)
    f = t[t.design == "dualdecoder-fifo"].set_index(key)
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
        "calibration": "one cost model, the user's: every point is priced by sim.steplayers.step_layers and the"
                       " timeline as `ddbench simulate --batch N` prices it; compute: the bundle's decode terms"
                       " fitted to the engine's kernel breakdown and engine section (sim/costmodel.py EngineFit; the"
                       " fit is in the cost-model notes), unscaled (compute_scale 1); link: the bundle's link and"
                       " interference sections (the gather's fixed cost per gather queued behind one of its stream);"
                       f" the harness term from the floor phase of {cal.get('folder')}. No replayed point is a"
                       " calibration point; " + ("the validated points come from the SAME RUN as the calibration"
                                                 " points" if sw.get("same_run") else
                                                 f"the validated points come from a separate run ({val.get('folder')})")
                       + ".",
        "harness": "the sweep-harness term, not a design cost, added here only: the forced-miss draw, " + harness
                   + "; the engine's reuse fetch (ShadowKV's design cost as the engine runs it, in the user's plan"
                   " too: on the compute stream, copy of the previous selection into a spare, reuse plan, one"
                   " gather over every slot; the key rebuild follows it; reuse_fetch_ms) " + reuse,
        "reuse_fetch": {"models": used, "fits": fits},
        "rule": f"link-bound: engine link GB/s >= {LINK_BOUND} x the thin-gather rate of the same run"
                f" ({meta['thin_gather_gbps']:.1f} GB/s); compute-only: no transfers; overlap: the rest",
        "regimes": regimes,
        "link_bytes": {"points_with_transfers": int(len(off)), "exact": exact,
                       "max_abs_diff_bytes": float(off.link_bytes_diff.abs().max()) if len(off) else 0.0},
        "fifo_over_priority": fifo_pairs(t),
    }


def header_lines(summary: dict, notes) -> list[str]:
    """What the run replayed and how it was costed: the summary JSON's "header" (the CSV stays plain)."""
    lines = [f"sim vs engine: {', '.join(summary.get('models', [MODEL]))} on {GPU} + {LINK}, timeline mode {STEPS}"
             f" steps ({WARMUP} warm-up)" + (f"; HELD OUT: the compute terms were fitted to {summary['fitted_model']}"
                                            " only" if summary.get("held_out") else "")]
    lines += [f"cost model: {n}" for n in notes]
    lines.append(f"regime rule: {summary['rule']}")
    lines += [_sweep_line(k + " sweep", summary["sweeps"].get(k, {})) for k in ("calibration", "validated")]
    if summary["sweeps"].get("same_run"):
        lines.append("SAME RUN: the validated points come from the calibration run")
    return lines


def write(t, summary, notes, out: str) -> str:
    """The points as a plain CSV at `out` and the summary, with its header lines, beside it; the JSON's path."""
    from ddbench.core.io import atomic_path, write_json
    with atomic_path(out) as tmp:
        t.to_csv(tmp, index=False, float_format="%.6g")
    js = os.path.splitext(out)[0] + "-summary.json"
    write_json(js, {**summary, "header": header_lines(summary, notes)})
    return js


def _sweep_line(name: str, x: dict) -> str:
    return (f"{name}: {x.get('folder')} (run {x.get('run_id') or 'without run_id'}, git {x.get('git_sha')},"
            f" {x.get('date_utc')}, phases {x.get('phases') or 'all'}, seed {x.get('seed', 0) if x.get('seed') is not None else 0})")


def report(summary: dict) -> str:
    sw = summary.get("sweeps", {})
    lines = [_sweep_line("calibration sweep", sw.get("calibration", {})),
             _sweep_line("validated sweep", sw.get("validated", {}))]
    if sw.get("same_run"):
        lines.append("SAME RUN: the validated points come from the calibration run (other points, same run)")
    if sw and not sw.get("same_code"):
        lines.append("the two sweeps ran different engine code (git shas differ)")
    lines.append(f"{summary['points']} engine points replayed (none used for calibration)")
    for s in summary["skipped"]:
        lines.append(f"  skipped {s}")
    for k, v in summary["regimes"].items():
        if v["points"]:
            lines.append(f"{k} ({v['points']} points): median |error| {v['median_abs_error']:.1%}, worst"
                         f" {v['worst_abs_error']:.1%} ({v['worst_point']}); sim / engine median"
                         f" {v['median_sim_over_engine']:.3f}")
    b = summary["link_bytes"]
    lines.append(f"link bytes per step: {b['exact']} of {b['points_with_transfers']} points with transfers equal"
                 f" to the byte (largest difference {b['max_abs_diff_bytes']:.0f} B)")
    for p in summary["fifo_over_priority"]:
        lines.append(f"FIFO / priority {p['context'] // 1024}K b{p['batch']} miss {p['miss_rate']} ({p['reps']} reps):"
                     f" engine {p['engine']:.3f} ({p['engine_min']:.3f}-{p['engine_max']:.3f}), sim {p['sim']:.3f}")
    return "\n".join(lines)


def write_readme(sections, out: str) -> str:
    """<out folder>/README.md: per validation (the fitted shapes, then the held-out ones): which sweeps
    were used, the rule and the errors by regime and design. sections: [(summary, csv path, json path)]."""
    path = os.path.join(os.path.dirname(out) or ".", "README.md")
    files = ", ".join(f"`{os.path.basename(c)}` and `{os.path.basename(j)}`" for _, c, j in sections)
    lines = ["# Simulator against the decode-step engine (`python -m sim.validate`)", "",
             f"Written by `python -m sim.validate`: {files} (one row per replayed point, and its summary)."
             " Do not edit; rerun it.", ""]
    for summary, csv, _ in sections:
        title = (f"Held out: {', '.join(summary['models'])} (the compute terms were fitted to"
                 f" {summary['fitted_model']} only)" if summary.get("held_out")
                 else f"The chunk-cache sweep {summary['sweeps'].get('validated', {}).get('folder')}:"
                      f" {', '.join(summary['models'])}" if summary.get("cache_held_out")
                 else f"Fitted shapes: {', '.join(summary['models'])}")
        lines += [f"## {title} (`{os.path.basename(csv)}`)", "", "Sweeps (kernels/engine/sweep.py runs):", "",
                  f"- {_sweep_line('calibration', summary['sweeps'].get('calibration', {}))}: its floor phase gives"
                  " the harness term (its forced-miss steps against its own-selection ones)",
                  f"- {_sweep_line('validated', summary['sweeps'].get('validated', {}))}: its points are replayed", ""]
        if summary["sweeps"].get("same_run"):
            lines += ["**The validated points come from the same run as the calibration points** (other points of"
                      " that run; `--allow-same-run`): not an independent validation.", ""]
        lines += [summary["calibration"], "", summary["harness"] + ".", "", f"Regimes: {summary['rule']}.", "",
                  "| regime | points | median \\|error\\| | worst | sim / engine, median |",
                  "| --- | --- | --- | --- | --- |"]
        for k, v in (list(summary["regimes"].items()) + list(summary.get("by_design", {}).items())
                     + [(k, v) for k, v in summary.get("cache_held_out", {}).items() if k != "fitted points"]):
            if v["points"]:
                lines.append(f"| {k} | {v['points']} | {v['median_abs_error']:.1%} | {v['worst_abs_error']:.1%}"
                             f" ({v['worst_point']}) | {v['median_sim_over_engine']:.3f} |")
            elif k in summary["regimes"]:
                lines.append(f"| {k} | 0 | | | |")
        if summary.get("cache_held_out"):
            lines += ["", "dualdecoder-cache's fill term (sim/cachefill.py) was fitted to this run at one context"
                      f" (its points in the overlap regime); the {summary['cache_held_out']['fitted points']['points']}"
                      " points at that context are marked in column cache_fill_fitted, and the rows '(fill not"
                      " fitted here)' are the other contexts."]
        b = summary["link_bytes"]
        lines += ["", f"Link bytes per step equal to the byte at {b['exact']} of {b['points_with_transfers']} points"
                  f" with transfers. Skipped: {len(summary['skipped'])} rows (listed in the summary).", ""]
    write_text_atomic(path, "\n".join(lines))
    return path


def write_text_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.validate", description=__doc__.splitlines()[0])
    ap.add_argument("--engine", help="the validated sweep's folder (engine.csv, meta.json; default the data root's"
                                     f" engine/{VALIDATION_SWEEP} where it exists, else engine/{CALIBRATION_SWEEP})")
    ap.add_argument("--calibration-engine", help="the sweep whose compute-only floor steps calibrate the simulator's"
                                                 f" compute (default the data root's engine/{CALIBRATION_FLOOR_SWEEP}"
                                                 f" where it exists, else engine/{CALIBRATION_SWEEP})")
    ap.add_argument("--allow-same-run", action="store_true",
                    help="validate points of the calibration run itself (other points, same run)")
    ap.add_argument("--out", help="output CSV (default the data root's validation/h200-engine.csv)")
    ap.add_argument("--user-path", action="store_true",
                    help="print the user's path (ddbench simulate --batch, no harness term) against the validated"
                         " sweep's points with transfers, by design and regime; writes nothing")
    ap.add_argument("--held-out", metavar="DIR",
                    help="a sweep of other models' shapes (the engine's --model), replayed with the same fitted"
                         f" cost model: written as <out stem>-heldout.csv (default the data root's engine/{HELD_OUT_SWEEP}"
                         " where it exists; 'none' skips it)")
    ap.add_argument("--cache", metavar="DIR",
                    help="a sweep of the chunk-cache design (its paper phase with --designs dualdecoder-cache,...),"
                         f" replayed too: written as <out stem>-cache.csv (default the data root's engine/{CACHE_SWEEP}"
                         " where it exists; 'none' skips it)")
    ap.add_argument("--fp8", metavar="DIR",
                    help="a sweep with fp8 host KV (its paper phase with --kv-bits 8,16), replayed too: written as"
                         f" <out stem>-fp8.csv (default the data root's engine/{FP8_SWEEP} where it exists; 'none'"
                         " skips it)")
    a = ap.parse_args(argv)
    held = a.held_out
    cache_dir, fp8_dir = a.cache, a.fp8
    if cache_dir is None:
        d = str(traces_dir("engine", CACHE_SWEEP))
        cache_dir = d if os.path.exists(os.path.join(d, "engine.csv")) else "none"
    if fp8_dir is None:
        d = str(traces_dir("engine", FP8_SWEEP))
        fp8_dir = d if os.path.exists(os.path.join(d, "engine.csv")) else "none"
    if held is None:
        d = str(traces_dir("engine", HELD_OUT_SWEEP))
        held = d if os.path.exists(os.path.join(d, "engine.csv")) else "none"
    try:
        if a.user_path:
            for d in [a.engine] + ([] if held == "none" else [held]):
                t, summ = user_path_errors(d)
                for r in t.itertuples():
                    print(f"{r.model:12s} {r.design:18s} {r.context // 1024:4d}K b{r.batch:<3d} miss {r.miss_rate:5s}"
                          f" {r.regime:12s} engine {r.engine_step_ms:8.2f} ms  simulate {r.user_step_ms:8.2f} ms"
                          f"  {r.user_over_engine - 1:+.1%}")
                for k, x in summ.items():
                    print(f"{k}: {x['points']} points, median |error| {x['median_abs_error']:.1%}, worst"
                          f" {x['worst_abs_error']:.1%}")
            return 0
        a.out = a.out or str(traces_dir("validation", "h200-engine.csv"))
        runs = [(a.engine, a.out, False)]
        if held != "none":
            runs.append((held, os.path.splitext(a.out)[0] + "-heldout.csv", True))
        if cache_dir != "none":
            runs.append((cache_dir, os.path.splitext(a.out)[0] + "-cache.csv", False))
        if fp8_dir != "none":
            runs.append((fp8_dir, os.path.splitext(a.out)[0] + "-fp8.csv", False))
        results = [(validate(d, a.calibration_engine, allow_same_run=a.allow_same_run, held_out=h), out)
                   for d, out, h in runs]
    except DDBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sections = []
    for (t, skipped, meta, notes), out in results:
        summary = summarize(t, skipped, meta)
        js = write(t, summary, notes, out)
        sections.append((summary, out, js))
        print(("HELD OUT\n" if summary["held_out"] else "") + report(summary))
        print(f"wrote {out} and {js}")
    print(f"wrote {write_readme(sections, a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
