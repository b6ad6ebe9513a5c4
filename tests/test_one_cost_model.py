"""One cost model: the simulator users run is the one ddbench.sim.validate checks against the engine.

- `ddbench simulate --batch N` and ddbench.sim.validate price an engine point through the same code
  (ddbench.sim.steplayers.step_layers on ddbench.sim.factory's cost model, then the timeline); ddbench.sim.validate adds only
  the engine harness's forced-miss draw, and says so per point.
- At the committed engine validation points the user's path meets the issue's targets: 10 % median
  and 20 % worst |error|, 5 % median where the link binds; the microbenchmark op model, the negative
  control, does not.
- The decode compute is reconciled with the engine's kernel breakdown (sim/costmodel.py EngineFit):
  its fit against the breakdown and the bundle's engine section, hand-checked terms, and what every
  output says about it; the breakdown loader's one-line errors.
"""

import json
import os
import shutil
import statistics

import pytest

from ddbench.core.calibration import find_breakdown, load_breakdown, load_bundle
from ddbench.core.catalog import get_gpu, get_link, get_model
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.sim.fit import validation as v
from ddbench.sim.fit.summary import summarize
from ddbench.sim.costmodel import ENGINE_TERMS, CostModel
from ddbench.sim.factory import cost_model

M8 = get_model("llama-3-8b")
MAIN = ("dualdecoder", "shadowkv", "specache")


def _simulate(tmp_path, capsys, design, context, batch, hit):
    from ddbench.cli import main
    out = tmp_path / f"{design}-{context}-{batch}"
    rc = main(["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--design", design, "--context", str(context),
               "--batch", str(batch), "--hit-rate", str(hit), "--out", str(out), "--json"])
    assert rc == 0
    return json.loads(capsys.readouterr().out)[design]


# ------------------------------------------------------------------ one code path

@pytest.mark.parametrize("design,context,batch", [("shadowkv", 32768, 8), ("dualdecoder", 131072, 8),
                                                  ("specache", 131072, 2)])
def test_simulate_and_validate_price_a_point_alike(tmp_path, capsys, design, context, batch):
    """The CLI's timeline step at hit rate 0.75 is ddbench.sim.validate's plan of the engine point at 25 %
    forced misses, to the last bit; validate's step is that plus the harness term alone."""
    s = _simulate(tmp_path, capsys, design, context, batch, 0.75)
    miss = v.effective_miss(0.25, 2048, 8)
    assert miss == 0.25
    plan = v.replay_plan(design, context, batch, miss, True)
    user_s, _ = v.point_step_s(plan)
    assert s["step_ms"] == user_s * 1e3                       # the same code, the same number
    assert any("RECONCILED with the engine" in n for n in s["cost_model"])
    t, _, _, _ = v.validate()
    row = t[(t.design == design) & (t.context == context) & (t.batch == batch) & (t.miss_rate == "0.25")
            & (t.transfers == 1)].iloc[0]
    assert row.compute_scale == 1.0 and row.harness_ms > 0     # nothing scaled; the harness stated
    # h200-validation ran the engine before the in-place ShadowKV step (git 0996e93): its ShadowKV rows
    # carry that engine's copy-then-regather fetch, an engine term; the other designs' rows are the user's plan
    assert row.shadowkv_step == ("copy-regather" if design == "shadowkv" else "")
    engine_plan = v.legacy_reuse_fetch(plan, cost_model("llama-3-8b", "h200", "pcie5"), miss) if design == "shadowkv" else plan
    assert (engine_plan is plan) == (design != "shadowkv") and not plan.ur_serial and not plan.ur_min_s
    harnessed, _ = v.point_step_s(v.with_harness(engine_plan, row.harness_ms / 1e3))
    assert row.sim_step_ms == pytest.approx(harnessed * 1e3, rel=1e-12)
    assert row.sim_gpu_compute_ms == pytest.approx((engine_plan.compute_s * 1e3 + row.harness_ms), rel=1e-12)
    assert row.sim_step_ms >= s["step_ms"]                     # on the critical path where compute binds
    if design == "shadowkv":
        assert row.sim_step_ms > s["step_ms"]
    assert row.reuse_fetch_ms == pytest.approx(sum(engine_plan.ur_min_s) * 1e3, rel=1e-12)
    assert (row.reuse_fetch_ms > 0) == (design == "shadowkv") == engine_plan.ur_serial


def test_in_place_rows_are_the_users_plan_and_old_rows_the_legacy_fetch(tmp_path, capsys):
    """The rule (sim/fit/replay.py engine_version, data in traces/fit/engine-versions.json or the run's
    meta.json): a run of the in-place ShadowKV step is replayed by the user's plan unchanged (plus the
    forced-miss draw alone); a run of an older engine's copy-then-regather step carries its fetch."""
    assert v.shadowkv_step("0f05ef2a41d986c7ce41f965e82ccb7ae3fbec45") == v.IN_PLACE
    assert v.shadowkv_step("8780ebe3b01a9a6ddaa55a7500c514373399c2a9") == v.IN_PLACE
    assert v.shadowkv_step("3e94a2fc35e9b4af1c22fcb700681f681cfc6376") == v.IN_PLACE        # h200-rates
    for old in ("0996e93", "e801c9b8ed9a8240e0e409b83a76317a1bd5feec+dirty", "e8b25b0b1e9a1b708a0a10f521cf30267b5819e9+dirty"):
        assert v.shadowkv_step(old) == v.COPY_REGATHER, old
    own = {"engine": {"shadowkv_step": v.COPY_REGATHER, "cache_fill": v.FUSED}}     # a run's own record wins
    assert v.shadowkv_step("0f05ef2", own) == v.COPY_REGATHER and v.cache_fill_kind(None, own) == v.FUSED
    for bad in ("", None, "0" * 40, "0f05"):
        with pytest.raises(DDBenchError, match="git sha|not in fit/engine-versions.json"):
            v.shadowkv_step(bad)
    t, skipped, meta, _ = v.validate_runs(v.INPLACE_RUNS)
    assert set(t.design) == {"shadowkv"} and set(t.shadowkv_step) == {v.IN_PLACE}
    assert (t.reuse_fetch_ms == 0).all() and set(t.reuse_fetch_model) == {""}
    assert (t.link_bytes_diff == 0).all()
    row = t[(t.source == "traces/engine/h200-shadowkv-fast/builds/b0") & (t.context == 131072) & (t.batch == 46)].iloc[0]
    s = _simulate(tmp_path, capsys, "shadowkv", 131072, 46, 1 - row.miss_replayed)
    plan = v.replay_plan("shadowkv", 131072, 46, row.miss_replayed, True)
    assert s["step_ms"] == v.point_step_s(plan)[0] * 1e3
    assert row.sim_step_ms == pytest.approx(v.point_step_s(v.with_harness(plan, row.harness_ms / 1e3))[0] * 1e3,
                                            rel=1e-12)
    # fp8 ShadowKV (1028 B pieces) is not priced: skipped, and says why
    assert any("fp8" in a and "kv_bits 8" in a and "not priced" in b for a, b in skipped)
    # and every old sweep's ShadowKV rows are copy-regather, none in place
    for d in ("h200-validation", "h200-paper", "h200-cache", "h200-fp8"):
        o, _, _, _ = v.validate(str(traces_dir("engine", d)), held_out=None)
        sk = o[o.design == "shadowkv"]
        assert len(sk) and set(sk.shadowkv_step) == {v.COPY_REGATHER}, d
        assert (sk[sk.transfers == 1].reuse_fetch_ms > 0).all()
        assert set(o[o.design != "shadowkv"].shadowkv_step) == {""}


def test_serving_aggregate_agrees_with_the_timeline_at_the_validation_points():
    """Serving mode prices a step with the aggregate (sim/aggregate.py) on the same plan: within 2 % of
    the timeline at each of the 18 points of the issue."""
    from ddbench.sim.aggregate import aggregate_step
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    for design in MAIN:
        for context in (32768, 131072):
            for batch in (2, 8, 32):
                plan = v.replay_plan(design, context, batch, 0.25, True, cm)
                tl, _ = v.point_step_s(plan)
                assert aggregate_step(plan).step_s == pytest.approx(tl, rel=0.02), (design, context, batch)


def test_compute_only_points_drop_the_link_and_the_fetch():
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    full = v.replay_plan("shadowkv", 32768, 8, 0.25, True, cm)
    bare = v.replay_plan("shadowkv", 32768, 8, 0.25, False, cm)
    assert not full.ur_serial and not full.ur_min_s and full.h2d_bytes > 0
    assert not bare.ur_serial and not bare.ur_min_s and bare.rates is None
    assert bare.compute_s == full.compute_s
    assert v.point_step_s(bare)[0] == pytest.approx(bare.compute_s, rel=1e-12)
    # the old engine's step: its fetch with transfers, none without; the rebuild of every key either way
    old_full, old_bare = v.legacy_reuse_fetch(full, cm, 0.25), v.legacy_reuse_fetch(bare, cm, 0.25)
    assert old_full.ur_serial and old_full.ur_min_s and not old_bare.ur_serial and not old_bare.ur_min_s
    reb = cm.rebuild_s(8, 2048, 160)
    assert old_bare.compute_s == pytest.approx(bare.compute_s + 32 * 0.75 * reb, rel=1e-12)
    assert old_full.compute_s == pytest.approx(old_bare.compute_s, rel=1e-12)


# ------------------------------------------------------------------ the targets, at the committed points

USER_MAIN = ("dualdecoder", "specache")     # the user's path at the old engine's rows (its ShadowKV rows: left out)


def _check_targets(t, per_design=True):
    err = (t.user_over_engine - 1).abs()
    lb = err[t.regime == "link-bound"]
    assert len(t) and len(lb)
    assert err.median() <= 0.10 and err.max() <= 0.20
    assert lb.median() <= 0.05
    assert "shadowkv" not in set(t.design)               # the old engine's copy-then-regather step: not the user's
    for d in USER_MAIN if per_design else ():              # every design on its own
        e = err[t.design == d]
        assert len(e) == 6 and e.median() <= 0.10 and e.max() <= 0.20, d
    return err


def test_user_path_meets_the_targets_at_the_validation_sweep():
    """traces/engine/h200-validation (seed 1; the points of traces/validation/h200-engine.csv): the 18
    points of the issue (DualDecoder, ShadowKV, SpeCache at 32K and 128K, batches 2, 8, 32, 25 % misses)
    and the rest with transfers (full-kv, FIFO, 10 % misses)."""
    t, summ = v.user_path_errors()
    assert len(t) == 18 and summ["left_out"]["points"] == 6       # its 6 ShadowKV rows ran the old step
    main = t[t.design.isin(MAIN) & (t.miss_rate == "0.25")]
    assert len(main) == 12
    err = _check_targets(main)
    _check_targets(t, per_design=False)
    assert summ["all"]["median_abs_error"] <= 0.10 and summ["link-bound"]["median_abs_error"] <= 0.05
    # the worst point, about -9 %: DualDecoder 128K batch 32, the seed-dependent one docs/simulator.md
    # names (230.4 ms measured in seed-1 runs, 210.2 ms in seed 0, the same bytes)
    assert err.max() < 0.10
    worst = main.loc[err.idxmax()]
    assert (worst.design, worst.context, worst.batch) == ("dualdecoder", 131072, 32)


def test_user_path_meets_the_targets_at_the_in_place_engine():
    """The in-place ShadowKV (traces/engine/h200-shadowkv-fast builds and paper-80gb, h200-rates' ShadowKV
    rows): the user's plan within 10 % of every build (the worst, about -10 %: 128K batch 46 at 6 %
    misses, the sim's selection at that batch short of the engine's landmark pass), and h200-rates' other
    designs at batch 1 and its chunk-cache grid within 12.5 % (the grid's worst, about -12 %: batch 60 at
    urgent 8.9 %, churn 12.7 %, the torch fill's engine; the sim is optimistic there since the per-kind
    compute slowdown of compute_interference.csv, 1.21 at that point, replaced the one composite 1.29),
    the median of each point's builds within 10 % (12 % on that grid): issue 31's 10 % is missed there."""
    for runs, worst, point in ((v.INPLACE_RUNS, 0.10, 0.10), (v.RATES_RUNS, 0.125, 0.12)):
        t, _, meta, _ = v.validate_runs(runs)
        err = (t.sim_over_engine - 1).abs()
        assert len(t) and err.max() <= worst and err.median() <= 0.05
        pts = summarize(t, [], meta)["per_point"]
        assert all(abs(x["error_median"]) <= point for x in pts)
    t, _ = v.user_path_errors(str(traces_dir("engine", "h200-shadowkv-fast", "builds", "b0")))
    assert len(t) == 4 and ((t.user_over_engine - 1).abs() <= 0.10).all()


def test_user_path_meets_the_targets_at_the_calibration_sweeps_validation_phase():
    """The same points in the calibration sweep's own validation phase (seed 0; the issue's table):
    none of them was fitted (the compute terms come from its floor phase and the breakdown)."""
    t, _ = v.user_path_errors(str(traces_dir("engine", "h200")), phase="validation")
    main = t[t.design.isin(MAIN) & (t.miss_rate == "0.25")]
    assert len(main) == 12
    err = _check_targets(main)
    assert err.max() <= 0.10


def test_user_path_meets_the_targets_on_held_out_shapes():
    """traces/engine/h200-paper: Qwen2.5-32B (64K/128K/256K) and Qwen2.5-14B (128K) under an 80 GB cap,
    a run separate from the calibration, none of its shapes fitted (the compute terms are fitted to
    Llama-3-8B only): the same targets, for every design on its own. Its Llama-3-8B rows (64K and
    128K up to each design's largest batch, 116 for DualDecoder: past the fitted batches 1-64) too."""
    t, _ = v.user_path_errors(str(traces_dir("engine", v.HELD_OUT_SWEEP)))
    assert set(t.model) == {"qwen2.5-32b", "qwen2.5-14b", v.MODEL}
    for held in (True, False):
        sub = t[(t.model != v.MODEL) == held]
        err = (sub.user_over_engine - 1).abs()
        assert err.median() <= 0.10 and err.max() <= 0.20
        assert err[sub.regime == "link-bound"].median() <= 0.05
        for d in (*USER_MAIN, "full-kv"):
            e = err[sub.design == d]
            assert len(e) >= 3 and e.median() <= 0.10 and e.max() <= 0.20, (held, d)
    assert t[t.model == v.MODEL].batch.max() > 64
    # and ddbench.sim.validate's held-out replay is the same path (no harness term for shapes it did not measure)
    h, skipped, meta, _ = v.validate(str(traces_dir("engine", v.HELD_OUT_SWEEP)), held_out=True)
    assert (h.shadowkv_step[h.design == "shadowkv"] == v.COPY_REGATHER).all()
    assert len(h[h.design != "shadowkv"]) == (t.model != v.MODEL).sum() and (h.harness_ms == 0).all()
    assert not any(meta["harness_by_model"].values())
    s = summarize(h, skipped, meta)
    assert s["held_out"] and "NOT MEASURED for qwen2.5-14b, qwen2.5-32b" in s["harness"]


def test_the_microbenchmark_op_model_misses_the_targets():
    """Negative control: the decode ops from the bundle's microbenchmarks (linear layers timed as eager
    calls, about 1.8x the engine's graph-replayed GEMMs) miss the targets at the same points."""
    micro = CostModel(M8, get_gpu("h200"), get_link("pcie5"), load_bundle(str(traces_dir("calibration", "h200"))),
                      reconcile=False)
    assert any("NOT RECONCILED" in n for n in micro.notes)
    t, _ = v.user_path_errors(cm=micro)
    err = (t.user_over_engine - 1).abs()
    assert err.max() > 0.20 and err[t.design == "full-kv"].median() > 0.10
    t, _ = v.user_path_errors(str(traces_dir("engine", "h200-shadowkv-fast", "builds", "b0")), cm=micro)
    assert ((t.user_over_engine - 1).abs() > 0.10).any()          # the in-place ShadowKV too


def test_validate_regimes_meet_the_targets():
    t, skipped, meta, notes = v.validate()
    s = summarize(t, skipped, meta)
    r = s["regimes"]
    assert r["link-bound"]["median_abs_error"] <= 0.05
    for k in ("link-bound", "overlap", "compute-only"):
        assert r[k]["points"] and r[k]["median_abs_error"] <= 0.10 and r[k]["worst_abs_error"] <= 0.20, k
    assert (t.compute_scale == 1.0).all()
    assert "one cost model, the user's" in s["calibration"] and "added here only" in s["harness"]
    assert any("RECONCILED with the engine" in n for n in notes)


# ------------------------------------------------------------------ the engine fit

def test_engine_fit_reproduces_the_breakdown_and_the_engine_section():
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    f = cm.engine
    assert f is not None and f.joint and f.points == 11
    assert f.parameters == sum(len(x) for x in ENGINE_TERMS.values()) == 15
    assert all(x >= 0 for th in f.theta.values() for x in th)
    # each category within 15 % at every breakdown point, whole steps within 3 %, the engine section
    # (26 compute-only steps, batches 1 / 16 / 64 at 32K and 128K) within 4 %, median under 1.5 %
    assert max(abs(r[-1]) for r in f.residuals) < 0.15
    assert max(abs(r[-1]) for r in f.step_residuals) < 0.03
    assert len(f.floor_residuals) == 26 and max(abs(r[-1]) for r in f.floor_residuals) < 0.04
    assert statistics.median(abs(r[-1]) for r in f.floor_residuals) < 0.015
    # physical magnitudes: weights and K/V streamed near the HBM copy rate (4.15-4.25 TB/s measured)
    gemm, att = f.theta["gemm"], f.theta["attention"]
    assert 3.3e12 < 1 / gemm[0] < 4.3e12 and 3.5e12 < 1 / att[1] < 4.5e12
    assert 2e-6 < att[0] < 20e-6                                    # a few microseconds a kernel
    note = next(n for n in cm.notes if "RECONCILED" in n)
    assert "traces/engine/h200/breakdown.json" in note and "15 terms" in note


def test_reconciled_ops_hand_computed():
    """Each op is its category's terms . its features; the decode GEMM is W (a + b M)."""
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    g, a, sl, gl = (cm.engine.theta[k] for k in ("gemm", "attention", "selection", "glue"))
    k, n = M8.hidden, 2 * M8.intermediate
    assert cm.decode_linear_s(k, n, 32) == pytest.approx(k * n * 2 * (g[0] + 32 * g[1]), rel=1e-12)
    kv = 2 * 16 * 8 * 2144 * 128 * 2
    assert cm.attention_decode_s(16, 2, 2144) == pytest.approx(a[0] + kv * a[1], rel=1e-12)
    N = 131072 // 8
    lm = 16 * 8 * N * 128 * 2 + 16 * 32 * 2 * N * 2
    want = sl[0] + 2 * sl[1] + lm * sl[2] + 16 * 2 * 8 * N * sl[4] + N * sl[5]
    assert cm.select_s(16, 2, 131072, 8, triton=True) == pytest.approx(want, rel=1e-12)
    assert cm.glue_s(32) == pytest.approx(gl[0] + 32 * M8.hidden * 2 * gl[1], rel=1e-12)
    # prefill keeps the bundle's (eager, GPU-bound at prefill sizes) linear table
    assert cm.linear_s(k, n, 8192) == CostModel(M8, get_gpu("h200"), get_link("pcie5"), cm.bundle,
                                                reconcile=False).linear_s(k, n, 8192)


def test_scaled_gpu_scales_the_reconciled_ops():
    own, scaled = cost_model("llama-3-8b", "h200"), cost_model("llama-3-8b", "h100-80gb")
    assert scaled.engine is not None and any(n.startswith("SCALED") for n in scaled.notes)
    a0, a1 = own.attention_decode_s(32, 1, 131072), scaled.attention_decode_s(32, 1, 131072)
    assert a1 / a0 == pytest.approx(4800 / 3350, rel=1e-6)     # HBM-bound: the HBM ratio
    assert scaled.glue_s(1) > 0


def test_a_bundle_without_a_breakdown_says_not_reconciled(tmp_path, capsys):
    root = tmp_path / "cal"
    shutil.copytree(str(traces_dir("calibration", "h200")), str(root / "h200"))
    cm = cost_model("llama-3-8b", "h200", "pcie5", root=str(root))
    assert cm.engine is None and cm.bundle.breakdown is None
    assert any(n.startswith("NOT RECONCILED") for n in cm.notes)
    # the breakdown beside the bundle (its own folder) is found and used
    shutil.copy(str(traces_dir("engine", "h200", "breakdown.json")), str(root / "h200" / "breakdown.json"))
    cm2 = cost_model("llama-3-8b", "h200", "pcie5", root=str(root))
    assert cm2.engine is not None
    assert cm2.decode_linear_s(4096, 4096, 8) == cost_model("llama-3-8b", "h200", "pcie5").decode_linear_s(4096, 4096, 8)


# ------------------------------------------------------------------ the breakdown loader

def test_breakdown_is_found_beside_the_bundle_and_loaded():
    b = load_bundle(str(traces_dir("calibration", "h200")))
    assert b.breakdown is not None and len(b.breakdown["points"]) == 11     # the 4 oom points dropped
    assert os.path.samefile(find_breakdown(b.path, "h200"), str(traces_dir("engine", "h200", "breakdown.json")))
    p = b.breakdown["points"][0]
    assert set(p) == {"design", "context", "batch", "step_ms", "categories"}
    assert p["categories"]["gemm"]["ms"] > 0


@pytest.mark.parametrize("change,match", [
    (lambda d: d["points"][0]["categories"]["gemm"].update(ms=-1.0), r"point 0, field categories\.gemm\.ms"),
    (lambda d: d["points"][1].update(batch="16"), r"point 1, field batch"),
    (lambda d: d["points"][0]["categories"].update(bogus={"ms": 1.0, "kernels": 1}), "category 'bogus'"),
    (lambda d: d.pop("points"), "no 'points' list"),
])
def test_malformed_breakdown_is_one_line(tmp_path, change, match):
    with open(str(traces_dir("engine", "h200", "breakdown.json")), encoding="utf-8") as fh:
        doc = json.load(fh)
    change(doc)
    path = tmp_path / "breakdown.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DDBenchError, match=match) as e:
        load_breakdown(str(path))
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    path.write_text("{not json")
    with pytest.raises(DDBenchError, match="not valid JSON"):
        load_breakdown(str(path))


def test_another_gpus_breakdown_is_not_used(tmp_path):
    root = tmp_path / "traces"
    shutil.copytree(str(traces_dir("calibration", "h200")), str(root / "calibration" / "h200"))
    (root / "engine" / "h200").mkdir(parents=True)
    with open(str(traces_dir("engine", "h200", "breakdown.json")), encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["provenance"]["gpu"] = "NVIDIA H100 80GB HBM3"
    (root / "engine" / "h200" / "breakdown.json").write_text(json.dumps(doc))
    assert load_bundle(str(root / "calibration" / "h200")).breakdown is None
    doc["provenance"]["gpu"] = "NVIDIA H200"
    (root / "engine" / "h200" / "breakdown.json").write_text(json.dumps(doc))
    assert load_bundle(str(root / "calibration" / "h200")).breakdown is not None


def test_user_path_meets_the_targets_over_the_rate_grid():
    """traces/engine/h200-rate-grid, fitted to nothing: the cache's urgent 0.01-0.2 x churn 0.05-0.5 at its
    largest batch (32K, 64K, 128K), ShadowKV at 6-45 % misses and DualDecoder at 6-25 % (128K), 3
    separate-process builds (64K: 2). The median of each point's builds within 10 % (the worst, +9.9 %: 32K
    batch 95 at urgent 0.01, churn 0.05, where the sim prices the fill above the engine's), every build
    within 11 %, and the link bytes the engine's to the byte."""
    t, _, meta, _ = v.validate_runs(v.RATE_GRID_RUNS)
    err = (t.sim_over_engine - 1).abs()
    assert len(t) == 153 and err.max() <= 0.11 and err.median() <= 0.03
    assert set(t.design) == {"dualdecoder-cache", "shadowkv", "dualdecoder"}
    pts = summarize(t, [], meta)["per_point"]
    assert len(pts) == 54 and all(abs(x["error_median"]) <= 0.10 for x in pts)
    assert (t.link_bytes_diff.abs() <= 1).all()      # to the byte (MiB-rounded counters)
