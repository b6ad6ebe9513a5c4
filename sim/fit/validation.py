"""The simulator against the decode-step engine measured on the H200: the computation behind
`python -m ddbench.sim.validate` (sim/validate.py: its command line and its files).

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
command runs (sim/fit/replay.py: ddbench.sim.steplayers.step_layers on the cost model of sim/factory.py, the H200
bundle with its fitted parameters, traces/fit/h200/fitted.json; then the per-layer timeline as
`ddbench simulate --batch N` runs it), with the same design (by its registry switches), model
(llama-3-8b), GPU (h200), link (pcie5), context, batch and miss rate (the engine's effective forced
rate, sim/fit/replay.py). A user running `ddbench simulate --design D --context C --batch B --hit-rate
(1 - miss)` gets the same plan and step, less the harness term below (tests/test_one_cost_model.py).

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
- ShadowKV's step is the one its engine run ran (column `shadowkv_step`; the rule: sim/fit/replay.py
  shadowkv_step, the run's engine version recorded with it: traces/fit/engine-versions.json). The in-place
  step is the user's plan unchanged (sim/steplayers.py). The copy-then-regather step
  (every committed run before it: h200, h200-validation, h200-paper, h200-cache, h200-fp8) is an
  engine term here only (legacy_reuse_fetch): the fetch (`reuse_fetch_ms`, column `reuse_fetch_model`)
  on the compute stream, serial with the key rebuild of every selected slot, FITTED to the bundle's
  `reuse_fetch` records (they measure that old fetch) where it has them, else BUNDLE-DERIVED (older
  bundles), and the summary and notes say which.
validate_runs: several folders as one validation (INPLACE_RUNS: the in-place ShadowKV points of
h200-shadowkv-fast and h200-rates; RATES_RUNS: h200-rates' other designs; ABLATION_RUNS: the
ablation), per point min / median / max
over its builds (per_point).
`compute_scale` is 1 at every point (the compute is the cost model's, unscaled; the column stays for
the CSV's format).
Regime of each point: sim/fit/replay.py classify (compute-only, link-bound, overlap). Imports no torch.
"""

from __future__ import annotations

import copy
import os
import statistics
from dataclasses import replace

from ddbench.core.designs import DUALDECODER_CACHE, SHADOWKV, compute_twin, get_design
from ddbench.core.enginepoint import EnginePoint
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.traces import load_engine
from ddbench.sim.costmodel import ENGINE_REUSE_IN_FLIGHT as REUSE_IN_FLIGHT, ENGINE_REUSE_PROGRAMS as REUSE_PROGRAMS
from ddbench.sim.fit.replay import (COMPLETED, COPY_REGATHER, FUSED, FUSED64, GPU, IN_PLACE, LINK,  # noqa: F401
                            LINK_BOUND, MIB, MODEL, STEPS, WARMUP, cache_fill_kind, classify, effective_miss,
                            engine_cache_rates,
                            legacy_reuse_fetch, load_meta, point_step_s, rel, replay_plan, row_cache, row_git_sha,
                            row_cache_bits, row_kv_bits, row_model, shadowkv_step)

ENGINE_REL = "traces/engine/h200"    # under the data root; named so in outputs
CALIBRATION_SWEEP = GPU               # traces/engine/<this>: the default calibration sweep ...
CALIBRATION_FLOOR_SWEEP = GPU + "-floor"   # ... unless a floor-only run (bench --phases floor) exists
VALIDATION_SWEEP = GPU + "-validation"   # traces/engine/<this>: the default validated sweep, where it exists
HELD_OUT_SWEEP = GPU + "-paper"       # traces/engine/<this>: other models' shapes (the held-out validation)
FP8_SWEEP = "h200-fp8"           # dualdecoder-cache and ShadowKV with fp8 host KV beside bf16 (kernels/engine/paper.py)
CACHE_SWEEP = GPU + "-cache"          # traces/engine/<this>: the chunk-cache design against the others


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


def with_harness(plan, harness_s: float):
    """The plan with the engine harness's forced-miss draw (a sweep-harness term, not a design cost:
    the module doc) added to the compute stream, spread evenly over the layers before their selection
    ends (the draw and the plan run between the top-k and the transfers)."""
    if not harness_s:
        return plan
    h = harness_s / plan.layers
    return replace(plan, pre=[x + h for x in plan.pre])


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


class CostModels:
    """One cost model per model (sim/factory.py's, as every command builds it), each with the calibration
    sweep's engine rows (harness term: measured for its model only)."""

    def __init__(self, calibration_dir: str, cm=None):
        from ddbench.core.calibration import engine_section_rows
        self.rows = engine_section_rows(os.path.join(calibration_dir, "engine.csv"))
        self.cms = {} if cm is None else {cm.model.name: cm}
        for c in self.cms.values():
            c.set_engine_rows(self.rows)

    def __call__(self, model: str):
        if model not in self.cms:
            from ddbench.sim.factory import cost_model
            self.cms[model] = cost_model(model, GPU, LINK)
            self.cms[model].set_engine_rows(self.rows)
        return self.cms[model]

    def notes(self) -> list[str]:
        out = []
        for name, c in self.cms.items():
            out += [n if len(self.cms) == 1 else f"{name}: {n}" for n in c.notes]
        return out


def validate(engine_dir: str | None = None, calibration_dir: str | None = None, allow_same_run: bool = True,
             held_out: bool | None = False, keep=None, meta_fallback: dict | None = None, allow_empty: bool = False):
    """(table of replayed points, list of (row, reason) skipped, meta, cost-model notes).

    Each point is priced as the user's `ddbench simulate --batch` prices it (replay_plan, point_step_s:
    the cost model of sim/factory.py, compute and link), plus the harness term from the calibration
    sweep's `floor` phase (with_harness). Every point replayed here is outside the validated sweep's
    `floor` phase. `meta` is the validated sweep's meta.json, with
    `sweeps` added (both runs' identities, same_run). allow_same_run=False raises a DDBenchError where
    both folders hold the same run (the CLI's default; this function's default keeps the figures
    working against a single sweep, and `sweeps.same_run` says so).

    held_out: replay the rows of every model but MODEL (None: of every model), the shapes the compute terms were fitted to
    (their rows are skipped); else MODEL's rows only. A held-out model's harness term is the
    calibration sweep's for that model where it measured one, else 0 (stated: `harness_measured`).

    keep: a predicate on the engine rows (others are not replayed); meta_fallback: the meta.json of a
    folder that has none (its thin-gather rate classifies the points; stated in `sweeps`).

    A ShadowKV row is replayed with the step its engine run ran (sim/fit/replay.py shadowkv_step, column
    shadowkv_step): the in-place step by the user's plan unchanged; the copy-then-regather step (runs
    of an older engine) with legacy_reuse_fetch added, an engine term (reuse_fetch_ms)."""
    import pandas as pd
    d_cal, d_val = default_dirs()
    engine_dir = engine_dir or d_val
    calibration_dir = calibration_dir or d_cal
    df = load_engine(os.path.join(engine_dir, "engine.csv"))
    meta_missing = meta_fallback is not None and not os.path.exists(os.path.join(engine_dir, "meta.json"))
    raw_meta = dict(meta_fallback) if meta_missing else load_meta(engine_dir)
    cal_meta = load_meta(calibration_dir)
    same = same_run(calibration_dir, cal_meta, engine_dir, raw_meta)
    if same and not allow_same_run:
        raise DDBenchError(f"{engine_dir} and {calibration_dir} hold the same engine run"
                           f" ({run_identity(raw_meta)['run_id'] or run_identity(raw_meta)['date_utc']}): validate"
                           " against a separate sweep (ddbench.kernels.engine.bench --phases validation) or pass"
                           " --allow-same-run")
    cms = CostModels(calibration_dir)
    cm = cms(MODEL)
    same = _bundle_from_run(cm, raw_meta, engine_dir, allow_same_run) or same
    vi = _identity_from_rows(df, meta_fallback) if meta_missing else run_identity(raw_meta)
    meta = _validation_meta(raw_meta, cm, calibration_dir, run_identity(cal_meta), engine_dir, vi, same, held_out)
    replay = _RowReplay(cms, meta, raw_meta, engine_dir, held_out,
                        calibration=same or os.path.realpath(calibration_dir) == os.path.realpath(engine_dir))
    rows, skipped = [], []
    for r in df.itertuples():
        if keep is not None and not keep(r):
            continue
        row, why = replay(r)
        if row is not None:
            rows.append(row)
        elif why is not None:
            skipped.append(why)
    if not rows and not allow_empty:
        raise DDBenchError(f"{engine_dir}: no engine point to replay ({len(skipped)} skipped, the rest calibration)")
    meta["harness_by_model"] = replay.harness_models
    return pd.DataFrame(rows), skipped, meta, cms.notes()


def _bundle_from_run(cm, meta: dict, engine_dir: str, allow_same_run: bool) -> bool:
    """Whether the validated run is the one the bundle's engine section (which the compute terms are fitted
    to) was imported from; a DDBenchError then unless allow_same_run."""
    src = (cm.bundle.meta.get("sections", {}).get("engine", {}).get("source") or {}) if cm.bundle else {}
    if not (src.get("run_id") and src.get("run_id") == meta.get("run_id")):
        return False
    if not allow_same_run:
        raise DDBenchError(f"{engine_dir} holds the engine run the bundle's engine section was imported from"
                           f" ({src['run_id']}): validate against a separate sweep or pass --allow-same-run")
    return True


def _identity_from_rows(df, meta_fallback: dict) -> dict:
    """A run's identity from its rows, for a folder without meta.json (only the thin-gather rate is another
    run's)."""
    col = lambda k: ", ".join(dict.fromkeys(str(x) for x in df[k].dropna())) if k in df else None  # noqa: E731
    return dict(run_id=None, gpu=col("gpu"), git_sha=col("git_sha"), command=None,
                date_utc=f"{df.date_utc.min()} .. {df.date_utc.max()}" if "date_utc" in df else None,
                phases=col("phase"), seed=None, runs=col("run"),
                meta=meta_fallback.get("why", "no meta.json: another run's thin-gather rate"))


def _validation_meta(meta: dict, cm, calibration_dir: str, ci: dict, engine_dir: str, vi: dict, same: bool,
                     held_out) -> dict:
    """The validated sweep's meta.json with both runs' identities (sweeps), the fitted file and the
    reuse-fetch fits."""
    meta = dict(meta, sweeps={
        "calibration": dict(folder=rel(calibration_dir), **ci), "validated": dict(folder=rel(engine_dir), **vi),
        "same_run": bool(same), "same_code": ci["git_sha"] == vi["git_sha"],
        "harness_measured": bool(cm.engine_forced_tab)}, held_out=bool(held_out), fitted_model=MODEL,
                fitted=cm.fitted.shown)
    fits = getattr(cm, "reuse_fits", {})
    meta["reuse_fetch_fits"] = {f"{k[0]} B chunks, {k[1]} programs x {k[2]}": dict(
        describe=f.describe(), fixed_us=f.fixed_s * 1e6, copy_gbps=f.copy_Bps / 1e9, hit_round_us=f.hit_s * 1e6,
        miss_round_us=f.miss_s * 1e6, mix_round_us=f.mix_s * 1e6, records=f.records,
        max_abs_rel_residual=f.max_rel_residual,
        residuals={f"{c // 1024}K b{b} miss {q:g}": e for c, b, q, e in f.rel_residuals}) for k, f in fits.items()}
    return meta


class _RowReplay:
    """One engine row -> (its replayed point, None), or (None, (label, why it is skipped)), or (None, None)
    for a row of the calibration itself. harness_models: per model, whether a harness term was measured."""

    def __init__(self, cms, meta: dict, raw_meta: dict, engine_dir: str, held_out, calibration: bool):
        from ddbench.core.memory import Workload
        self.cms, self.meta, self.raw_meta, self.engine_dir = cms, meta, raw_meta, engine_dir
        self.held_out, self.calibration = held_out, calibration
        self.thin = float(raw_meta["thin_gather_gbps"])
        self.w0 = Workload(context=1)
        self.harness_models = {}
        self._fill_cms = {}           # (id(cost model), fill kind) -> (it, its copy with that fill)

    def __call__(self, r):
        label = f"{r.design} {r.context // 1024}K b{r.batch} miss {r.miss_rate} transfers {r.transfers}"
        model = row_model(r)
        why = self._not_replayed(r, model)
        if why is not None:
            return None, (None if why == "calibration" else (label, why))
        cmm = self.cms(model)
        if get_design(r.design).chunk_cache:
            try:
                cmm = self._fill_cm(cmm, cache_fill_kind(row_git_sha(r, self.raw_meta), self.raw_meta))
            except DDBenchError as exc:
                return None, (label, f"not priced: {exc}")
        miss = effective_miss(0.0 if r.miss_rate == "none" else float(r.miss_rate), self.w0.budget, self.w0.chunk)
        cache, ct = row_cache(r, model)
        try:
            point = EnginePoint(r.design, ct, row_kv_bits(r), row_cache_bits(r))
            plan = replay_plan(point, r.context, r.batch, miss, bool(r.transfers), cmm, model, cache)
        except DDBenchError as exc:          # e.g. fp8 pieces smaller than any the bundle measured
            return None, (label + f" kv_bits {row_kv_bits(r)}", f"not priced: {exc}")
        step = ""
        if plan.design.reuse:
            try:
                step = shadowkv_step(row_git_sha(r, self.raw_meta), self.raw_meta)
            except DDBenchError as exc:
                return None, (label, f"not priced: {exc}")
            if step == COPY_REGATHER:     # the engine's old step: its fetch and full rebuild, an engine term
                plan = legacy_reuse_fetch(plan, cmm, miss, row_kv_bits(r))
        harness = self._harness(r, plan, cmm, model)
        plan = with_harness(plan, harness)
        return self._point(r, model, plan, cmm, miss, ct, step, harness), None

    def _fill_cm(self, cm, kind: str):
        """The cost model with the chunk-cache fill the row's engine ran: the user's (FUSED), or an earlier
        engine's (FUSED64: Fitted.cache_fill_int64; TORCH: Fitted.cache_fill_torch), priced for such rows only."""
        if kind == FUSED:
            return cm
        key = (id(cm), kind)
        if key not in self._fill_cms:
            c = copy.copy(cm)
            field = "cache_fill_int64" if kind == FUSED64 else "cache_fill_torch"
            c.cache_fill = getattr(cm.fitted, field)
            if c.cache_fill is None:
                raise DDBenchError(f"{cm.fitted.shown} has no {kind} fill ({field}) for that engine's rows")
            self._fill_cms[key] = (cm, c)
        return self._fill_cms[key][1]

    def _not_replayed(self, r, model: str) -> str | None:
        """Why a row is not replayed ("calibration": the calibration itself, not listed), or None."""
        phase = getattr(r, "phase", "")
        if self.held_out is not None and (model == MODEL) == bool(self.held_out):
            return f"model {model}" + (" (the fitted shapes)" if self.held_out else " (held out)")
        if r.status not in COMPLETED:
            return f"status {r.status}"
        if phase == "floor" and self.calibration:
            return "calibration"
        if phase == "floor" and r.miss_rate == "none" and not int(r.transfers):
            return "another sweep's calibration point (compute only, own selection)"
        if not int(getattr(r, "graph", 1)):
            return "eager step (the host launches inside the step; the simulator has GPU time only)"
        return None

    def _harness(self, r, plan, cmm, model: str) -> float:
        """The engine harness's forced-miss compute (s), from the calibration sweep's floor phase."""
        if r.miss_rate == "none" or plan.design.kv_on_gpu:
            return 0.0
        h = cmm.engine_harness_s(compute_twin(r.design), int(r.batch), int(r.context), clamp=True)
        self.harness_models[model] = self.harness_models.get(model, False) or h is not None
        return h or 0.0

    def _point(self, r, model: str, plan, cmm, miss: float, ct, step: str, harness: float) -> dict:
        """The replayed point beside the engine's measurement."""
        walk = reuse_fetch(plan)
        step_s, tl = point_step_s(plan)
        sim_ms = step_s * 1e3
        sim_bytes = plan.h2d_bytes
        eng_bytes = r.link_mib * MIB
        return dict(
            phase=getattr(r, "phase", ""), rep=getattr(r, "rep", 0), model=model,
            gpu_mem_cap=getattr(r, "gpu_mem_cap", "none"),
            design=r.design, context=r.context, batch=r.batch, cache_tokens=ct or "", kv_bits=row_kv_bits(r),
            cache_bits=row_cache_bits(r),
            cache_fill_fitted=bool(ct) and _fill_fitted(cmm, self.meta, int(r.context)), shadowkv_step=step,
            run=str(getattr(r, "run", "") or ""), churn_rate=_num(getattr(r, "churn_rate", None)),
            miss_rate=r.miss_rate, miss_replayed=miss, transfers=r.transfers, urgent_programs=r.urgent_programs,
            regime=classify(int(r.transfers), r.link_gbps, self.thin), engine_step_ms=r.step_ms, sim_step_ms=sim_ms,
            sim_over_engine=sim_ms / r.step_ms,
            sim_gpu_compute_ms=plan.compute_s * 1e3, compute_scale=1.0, harness_ms=harness * 1e3,
            reuse_fetch_ms=sum(walk) * 1e3, reuse_fetch_model=reuse_fetch_model(plan, cmm) if walk else "",
            sim_stall_ms=statistics.fmean(tl.stall_s[tl.warmup:]) * 1e3, engine_exposed_ms=r.exposed_ms,
            engine_link_bytes=eng_bytes, sim_link_bytes=sim_bytes, link_bytes_diff=sim_bytes - eng_bytes,
            engine_link_gbps=r.link_gbps, sim_link_gbps=sim_bytes / (sim_ms * 1e-3) / 1e9 if sim_ms else 0.0,
            sim_link_util=tl.link_util, source=rel(self.engine_dir), note="")


INPLACE_RUNS = (("h200-shadowkv-fast/builds/b0", None), ("h200-shadowkv-fast/builds/b1", None),
                ("h200-shadowkv-fast/builds/b2", None), ("h200-shadowkv-fast/paper-80gb", None),
                ("h200-shadowkv-fast/fp8", None), ("h200-rates", SHADOWKV))
RATES_RUNS = (("h200-rates", "!" + SHADOWKV),)      # its chunk-cache grid and the other designs at batch 1
# the ablation (ddbench/experiments/ablation_figure.py): the two caches (fused fill) at their largest
# batches, Qwen2.5-14B's searches, and DualDecoder at its largest batches
# h200-ablation: the two caches at all four points (the prefetch bytes each row moved recorded);
# h200-ablation-qwen14b's dualdecoder-cache rows recorded too few of them (an earlier engine), its others stand
ABLATION_RUNS = (("h200-ablation", None), ("h200-ablation-qwen14b", "!" + DUALDECODER_CACHE),
                 ("h200-ablation-dualdecoder", None))
# the fp8 GPU chunk cache beside the bf16 one and ShadowKV (bf16 and fp8 values) at the largest batches
FP8_CACHE_RUNS = (("h200-cache-fp8", None), ("h200-cache-fp8-qwen", None))
COMPARE_RUNS = (("h200-compare", None), ("h200-compare-qwen", None))   # the comparison on the current engine
# the engine over a grid of forced rates (urgent x churn, ShadowKV's and DualDecoder's misses), 3 separate-process
# builds, fitted to nothing
RATE_GRID_RUNS = (("h200-rate-grid", None),)
FILL_RUNS = (("h200-cache-fill", None),)   # the fused fill's sweep (32K/64K/128K): its fitted points, and the link-bound ones
META_FALLBACK = "h200-shadowkv-fast/builds/b0"   # h200-rates has no meta.json: the thin-gather rate of this run


def validate_runs(runs, calibration_dir: str | None = None, root: str | None = None):
    """validate() over several engine folders as one validation: (table, skipped, meta, notes). runs:
    (folder under the data root's engine/, design filter: None every row, "D" design D's only, "!D" the
    others). Every model's rows (held-out shapes included: no harness term where the calibration sweep
    did not measure one); a folder without meta.json takes META_FALLBACK's (named in the sweeps). The
    table's `source` column names each row's folder; meta["per_point"] asks summarize() for the builds'
    min / median / max per point."""
    import pandas as pd
    root = root or str(traces_dir("engine"))
    tabs, skipped, metas, notes = [], [], [], []
    fallback = dict(load_meta(os.path.join(root, META_FALLBACK)),
                    why=f"no meta.json: the thin-gather rate of {META_FALLBACK}")
    for folder, flt in runs:
        keep = None
        if flt:
            want, neg = flt.lstrip("!"), flt.startswith("!")
            keep = (lambda r, want=want, neg=neg: (r.design == want) != neg)
        t, sk, meta, nt = validate(os.path.join(root, folder), calibration_dir, held_out=None, keep=keep,
                                   meta_fallback=fallback, allow_empty=True)
        tabs.append(t)
        skipped += [(f"{folder}: {a}", b) for a, b in sk]
        metas.append(meta)
        notes += [n for n in nt if n not in notes]
    t = pd.concat([x for x in tabs if len(x)], ignore_index=True)
    if not len(t):
        raise DDBenchError(f"{', '.join(f for f, _ in runs)}: no engine point to replay")
    meta = dict(metas[0])
    vals = [m["sweeps"]["validated"] for m in metas]
    join = lambda k: ", ".join(dict.fromkeys(str(x.get(k)) for x in vals))   # noqa: E731
    meta["sweeps"] = dict(metas[0]["sweeps"], validated=dict(
        folder=", ".join(dict.fromkeys(x["folder"] for x in vals)), run_id=join("run_id"), git_sha=join("git_sha"),
        date_utc=join("date_utc"), phases=join("phases"), seed=join("seed")),
        same_run=any(m["sweeps"]["same_run"] for m in metas), same_code=False)
    meta["thin_gather_gbps"] = statistics.median(float(m["thin_gather_gbps"]) for m in metas)
    meta["harness_by_model"] = {k: any(m.get("harness_by_model", {}).get(k) for m in metas)
                                for m0 in metas for k in m0.get("harness_by_model", {})}
    meta["held_out"] = False
    meta["per_point"] = True
    return t, skipped, meta, notes


def _num(x):
    """A number of an engine row, '' where it has none."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return ""
    return "" if f != f else f


def user_path_errors(engine_dir: str | None = None, phase: str | None = None, cm=None):
    """The user's path at every engine point with transfers of a sweep (default the validated one;
    `phase`: only its rows of that phase, e.g. 'validation' of the calibration sweep): what `ddbench
    simulate --model M --gpu h200 --design D --context C --batch B --hit-rate (1 - miss)` computes
    (replay_plan and the timeline, no harness term), against the engine's measured step, for every
    model the sweep ran (M: the row's); `cm`: another cost model than ddbench.sim.factory's for MODEL (a test's
    negative control). Returns (table, summary): one row per point (model, design, context, batch,
    miss_rate, regime, engine_step_ms, user_step_ms, user_over_engine, harness_ms: what ddbench.sim.validate adds
    on top), and per design and regime the points, median and worst |error|. ShadowKV rows of an engine
    that ran the copy-then-regather step (shadowkv_step) are left out: the user's plan prices the
    in-place step only (ddbench.sim.validate replays them with that engine's fetch); summary["left_out"] counts
    them."""
    import pandas as pd
    from ddbench.core.memory import Workload
    engine_dir = engine_dir or default_dirs()[1]
    df = load_engine(os.path.join(engine_dir, "engine.csv"))
    meta = load_meta(engine_dir)
    cms = CostModels(default_dirs()[0], cm)     # the calibration sweep's rows: harness_ms only
    from ddbench.core.designs import get_design
    w0 = Workload(context=1)
    rows, left_out = [], 0
    for r in df.itertuples():
        if r.status not in COMPLETED or not int(r.transfers) or not int(getattr(r, "graph", 1)):
            continue
        if phase is not None and getattr(r, "phase", "") != phase:
            continue
        if r.miss_rate == "none" and not get_design(r.design).kv_on_gpu:
            continue
        if get_design(r.design).reuse and shadowkv_step(row_git_sha(r, meta), meta) != IN_PLACE:
            left_out += 1
            continue
        model = row_model(r)
        cmm = cms(model)
        miss = effective_miss(0.0 if r.miss_rate == "none" else float(r.miss_rate), w0.budget, w0.chunk)
        cache, ct = row_cache(r, model)
        try:
            point = EnginePoint(r.design, ct, row_kv_bits(r), row_cache_bits(r))
            plan = replay_plan(point, r.context, r.batch, miss, True, cmm, model, cache)
        except DDBenchError:                 # not priced (validate() lists why)
            continue
        step, _ = point_step_s(plan)
        key = compute_twin(r.design)
        h = 0.0 if r.miss_rate == "none" else (cmm.engine_harness_s(key, int(r.batch), int(r.context), clamp=True)
                                                or 0.0)
        rows.append(dict(model=model, design=r.design, context=int(r.context), batch=int(r.batch),
                         kv_bits=row_kv_bits(r), miss_rate=r.miss_rate, regime=classify(1, r.link_gbps, float(meta["thin_gather_gbps"])),
                         engine_step_ms=float(r.step_ms), user_step_ms=step * 1e3,
                         user_over_engine=step * 1e3 / float(r.step_ms), harness_ms=h * 1e3))
    t = pd.DataFrame(rows)
    summary = {"left_out": {"points": left_out, "why": "ShadowKV rows of the copy-then-regather engine (before"
                            " its in-place step): not the user's plan"}} if left_out else {}
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
    """Whether the cost model's cache-fill term (sim/fit/cachefill.py) was fitted to this run at this context."""
    f = cm.cache_fill
    return (f is not None and any(s.get("run_id") == meta.get("run_id") for s in f.sources)
            and context in f.contexts)
