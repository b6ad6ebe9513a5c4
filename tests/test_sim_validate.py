"""The simulator's link burst model, the engine-harness terms of sim/validate.py, its two-sweep rule
(the same run is refused), the bundle's engine import, and kernels/engine/bench.py's phase selection:
all on the CPU, against hand-computed numbers and the committed H200 traces."""

import csv
import json
import os
import shutil
from dataclasses import replace

import pytest

from ddbench.core.paths import traces_dir
from ddbench.sim import validate as cli
from ddbench.sim.fit import validation as v
from ddbench.sim.fit.summary import summarize
from ddbench.sim.resources import FluidGroup, FluidServer
from ddbench.sim.factory import cost_model
from ddbench.sim.aggregate import aggregate_step
from ddbench.sim.timeline import run_timeline

ENGINE = str(traces_dir("engine", "h200"))
MS = 1e-3


# ------------------------------------------------------------------ the link: sim/resources.py's per-burst rule (D2H copy, CPU-gather copy engine); the GPU gather's fixed cost per queued gather

def _server_times(fixed):
    s = FluidServer("h2d")
    g = FluidGroup([s])
    a = g.submit(s, 0.0, 1.0 * MS, fixed=fixed)          # idle link: pays its fixed cost
    b = g.submit(s, 0.5 * MS, 1.0 * MS, fixed=fixed)     # A still moving bytes: B's startup overlaps it
    c = g.submit(s, 3.0 * MS, 1.0 * MS, fixed=fixed)     # idle again (B ended at 1.96 ms): pays it
    return g.finish_time(a), g.finish_time(b), g.finish_time(c), s


def test_fixed_cost_is_paid_once_per_burst_hand_computed():
    ta, tb, tc, s = _server_times(0.04 * MS)
    assert ta == pytest.approx(1.00 * MS)
    assert tb == pytest.approx(1.96 * MS)                # 1.0 + (1.0 - 0.04), not 2.0
    assert tc == pytest.approx(4.00 * MS)                # 3.0 + 1.0: a new burst pays again
    assert s.fixed_saved_s == pytest.approx(0.04 * MS)
    # negative control: without a fixed part every job pays its whole work
    ta, tb, tc, _ = _server_times(0.0)
    assert (ta, tb, tc) == pytest.approx((1.0 * MS, 2.0 * MS, 4.0 * MS))


def test_link_bound_step_pays_one_fixed_cost_per_queued_prefetch():
    """Under priority on a saturated link each prefetch queues behind the previous one on the prefetch
    stream and pays the gather's fixed cost; the misses start on their own (idle) stream and pay bytes
    only: about one fixed cost per layer, as the engine pays (docs/simulator.md), not one per transfer."""
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    p = v.replay_plan("dualdecoder", 131072, 16, v.effective_miss(0.33, 2048, 8), True, cm)
    t0, bytes_s = p.rates.h2d_t0_s, p.h2d_bytes / (p.rates.h2d_gbps * 1e9)
    assert t0 == pytest.approx(39.69e-6, rel=1e-3)        # the bundle's 4 KiB gather fit (link.csv, two sizes)
    n_pf = sum(1 for x in p.pf_work if x > 0)
    assert n_pf == 32 and sum(1 for x in p.ur_work if x > 0) == 32
    tl = run_timeline(p, steps=6, warmup=2)
    assert tl.link_util > 0.99
    extra = tl.steady_step_s - bytes_s
    assert n_pf * t0 - 0.5 * t0 < extra < n_pf * t0 + 2 * t0   # 32 fixed costs (the D2H beside: < 1)
    assert aggregate_step(p).step_s == pytest.approx(tl.steady_step_s, rel=1e-3)
    # negative control: the per-transfer model (the timeline is told of no fixed part): 64 of them
    old = run_timeline(replace(p, rates=replace(p.rates, h2d_t0_s=0.0)), steps=6, warmup=2)
    assert old.steady_step_s - bytes_s > 60 * t0


# ------------------------------------------------------------------ the engine's reuse fetch (ShadowKV)

def test_reuse_walk_hand_computed():
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    # link.csv: 4 KiB gather 8 MiB in 0.20256 ms, 64 MiB in 1.34262 ms -> t0 = 39.69 us;
    # 2 KiB gather, 32 blocks, 64 MiB (32768 chunks) in 1.87306 ms -> (1.87306 - 0.03969) / 1024 = 1.7904 us a round
    assert cm.gather_round_s(2048) == pytest.approx(1.7904e-6, rel=1e-4)
    # 16 requests x 8 KV heads x 256 slots, 32 programs x 2 in flight: 512 rounds
    assert cm.gather_walk_s(16 * 8 * 256, 2048, 32, 2) == pytest.approx(512 * 1.7904e-6, rel=1e-4)
    assert cm.gather_walk_s(16 * 8 * 256 + 1, 2048, 32, 2) == pytest.approx(513 * 1.7904e-6, rel=1e-4)


def _without_reuse_records(cm):
    """The cost model as an older bundle (no reuse_fetch section) builds it."""
    cm.reuse_fits = {}
    cm.bundle.rows["reuse_fetch"] = []
    return cm


def test_reuse_fetch_bundle_derived_hand_computed():
    """A bundle without reuse_fetch records (older bundles) gets the documented bundle-derived fetch:
    copy of the previous selection's values (read + write at the bundle's HBM copy rate, ceilings.csv
    4154.3 GB/s) + the gather's fixed cost (t0, link.csv) + its walk (512 rounds of 1.7904 us at batch
    16), whatever the miss share; and the notes say so."""
    cm = _without_reuse_records(cost_model("llama-3-8b", "h200", "pcie5"))
    slots = 16 * 8 * 256
    copy = 2 * slots * 2048 / 4154.3185e9                 # 32 MiB copied: 16.2 us
    assert cm.reuse_fetch_model(2048) == "bundle-derived"
    assert cm.reuse_fetch_s(slots, 2048, 32, 2) == pytest.approx(copy + 39.69e-6 + 512 * 1.7904e-6, rel=1e-3)
    assert cm.reuse_fetch_s(slots, 2048, 32, 2, 0.9) == cm.reuse_fetch_s(slots, 2048, 32, 2, 0.1)
    assert any("BUNDLE-DERIVED" in n and "older bundle" in n for n in cm.notes)
    miss = v.effective_miss(0.174, 2048, 8)
    p = v.legacy_reuse_fetch(v.replay_plan("shadowkv", 32768, 16, miss, True, cm), cm, miss)
    fetch = v.reuse_fetch(p, cm, 16)
    assert len(fetch) == 32 and fetch[0] == pytest.approx(cm.reuse_fetch_s(slots, 2048), rel=1e-9)
    assert v.reuse_fetch_model(p, cm) == "bundle-derived"
    # designs with a prefetch have no reuse fetch
    d = v.replay_plan("dualdecoder", 32768, 16, 0.17, True, cm)
    assert v.reuse_fetch(d, cm, 16) == [] and v.reuse_fetch_model(d, cm) == ""


def test_fitted_reuse_fetch_reproduces_the_records():
    """The committed bundle's reuse_fetch records (engine sweep 0996e93, 24 records) are fitted as
    fixed + copy at a fitted rate + rounds x (hit (1 - p) + miss p + mix p (1 - p)); the fit reproduces
    every record within its stated max |relative residual| (14.7 %, batch 4 with no misses: the spare
    in L2), within 8.5 % at every record with misses (batch 1, 25 %: -8.2 %) and within 5.5 % from
    batch 2 up."""
    from ddbench.core.calibration import load_bundle
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    recs = load_bundle(str(traces_dir("calibration", "h200"))).rows["reuse_fetch"]
    assert len(recs) == 24 and cm.reuse_fetch_model(2048, 32, 2) == "fitted"
    fit = cm.reuse_fits[(2048, 32, 2)]
    assert fit.records == 24 and fit.max_rel_residual == pytest.approx(0.1469, abs=5e-4)
    assert fit.fixed_s == pytest.approx(51.62e-6, rel=2e-3) and fit.copy_Bps == pytest.approx(1749e9, rel=2e-3)
    assert (fit.hit_s, fit.miss_s, fit.mix_s) == pytest.approx((0.820e-6, 2.941e-6, 1.449e-6), rel=2e-3)
    worst = 0.0
    for r in recs:
        t = cm.reuse_fetch_s(r["slots"], r["chunk_bytes"], r["programs"], r["items"], r["miss_chunks"] / r["slots"])
        e = abs(t / (r["fetch_ms"] * MS) - 1)
        worst = max(worst, e)
        assert e <= fit.max_rel_residual + 1e-9
        if r["miss_rate"] > 0:
            assert e < 0.085 and (r["batch"] < 2 or e < 0.055)
    assert worst == pytest.approx(fit.max_rel_residual, rel=1e-9)
    # hand-computed at batch 16, 25 % misses: 512 rounds
    p, slots = 0.25, 16 * 8 * 256
    hand = 51.6161e-6 + 2 * slots * 2048 / 1749.16e9 + 512 * (0.82045 * 0.75 + 2.94066 * 0.25 + 1.44870 * 0.1875) * 1e-6
    assert cm.reuse_fetch_s(slots, 2048, 32, 2, p) == pytest.approx(hand, rel=1e-4)
    assert any("FITTED" in n and "14.7%" in n for n in cm.notes)
    with pytest.raises(ValueError):
        cm.reuse_fetch_s(slots, 2048, 32, 2)                 # the fitted fetch needs the miss share
    # another gather shape has no records: the bundle-derived model, and the notes say so
    assert cm.reuse_fetch_model(4096, 32, 2) == "bundle-derived"
    cm.reuse_fetch_s(slots, 4096, 32, 2, p)
    assert any("BUNDLE-DERIVED" in n and "4096 B chunks" in n for n in cm.notes)


def test_replay_uses_the_fitted_reuse_fetch():
    """ddbench.sim.validate costs every ShadowKV point with transfers by the fitted fetch at the replay's miss
    share (column reuse_fetch_model, summary, notes); negative control: the same replay on a bundle
    without the records says BUNDLE-DERIVED everywhere and charges another fetch."""
    t, skipped, meta, notes = v.validate()
    s = summarize(t, skipped, meta)
    sk = t[(t.design == "shadowkv") & (t.transfers == 1)]
    # 6: 128K batch 32 too (replayed since the compute is the cost model's, not scaled to a floor step)
    assert len(sk) == 6 and set(sk.reuse_fetch_model) == {"fitted"}
    assert set(t[t.design != "shadowkv"].reuse_fetch_model) == {""}
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    for r in sk.itertuples():
        slots = r.batch * 8 * 256
        one = cm.reuse_fetch_s(slots, 2048, 32, 2, r.miss_replayed)
        assert r.reuse_fetch_ms == pytest.approx(32 * one / MS, rel=1e-9)
    assert s["reuse_fetch"]["models"] == ["fitted"] and "FITTED" in s["harness"]
    assert s["reuse_fetch"]["fits"]["2048 B chunks, 32 programs x 2"]["records"] == 24
    assert any("FITTED" in n for n in notes)


def test_replay_without_reuse_records_says_bundle_derived(tmp_path, monkeypatch):
    """An older bundle (no reuse_fetch section) is replayed with the bundle-derived fetch, and every
    output says so (column, summary, README line, notes): no silent fallback."""
    from ddbench.sim import factory as sim_factory
    b = tmp_path / "h200"
    shutil.copytree(str(traces_dir("calibration", "h200")), str(b))
    os.remove(b / "reuse_fetch.csv")
    meta = json.loads((b / "bundle.json").read_text())
    del meta["sections"]["reuse_fetch"]
    (b / "bundle.json").write_text(json.dumps(meta))
    orig = sim_factory.cost_model
    monkeypatch.setattr(sim_factory, "cost_model", lambda *a, **k: orig(*a, **dict(k, root=str(tmp_path))))
    t, skipped, meta, notes = v.validate()
    s = summarize(t, skipped, meta)
    sk = t[(t.design == "shadowkv") & (t.transfers == 1)]
    assert len(sk) == 6 and set(sk.reuse_fetch_model) == {"bundle-derived"}
    assert s["reuse_fetch"] == {"models": ["bundle-derived"], "fits": {}} and "BUNDLE-DERIVED" in s["harness"]
    assert any("BUNDLE-DERIVED" in n and "older bundle" in n for n in notes)
    cm = _without_reuse_records(orig("llama-3-8b", "h200", "pcie5"))
    r = sk.iloc[0]
    assert r.reuse_fetch_ms == pytest.approx(32 * cm.reuse_fetch_s(int(r.batch) * 8 * 256, 2048) / MS, rel=1e-9)
    from ddbench.core.outputs import output_folder
    with output_folder(str(tmp_path / "val"), command=cli.COMMAND) as w:
        js = cli.write(w, t, s, notes, "h200-engine.csv")
        readme = cli.write_readme(w, [(s, "h200-engine.csv", js)])
    assert "BUNDLE-DERIVED" in (tmp_path / "val" / readme).read_text()


@pytest.mark.parametrize("batch", [2, 16])
def test_reuse_fetch_is_serial_with_the_key_rebuild(batch):
    """The engine runs ShadowKV's fetch on the compute stream, before the layer's key rebuild
    (plan.ur_serial): the whole fetch is exposed, each layer by its full length. Negative control:
    without ur_serial the rebuild overlaps it and the step is shorter by the rebuild of every layer."""
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    user = v.replay_plan("shadowkv", 32768, batch, v.effective_miss(0.25, 2048, 8), True, cm)
    # the user's plan prices the in-place step: no copy-then-regather fetch, no serial order
    assert not user.ur_serial and not user.ur_min_s and v.reuse_fetch(user, cm, batch) == []
    plan = v.legacy_reuse_fetch(user, cm, 0.25)
    fetch = v.reuse_fetch(plan, cm, batch)
    # the old engine's step (legacy_reuse_fetch) charges its fetch, serial; p: the same without it
    assert plan.ur_serial and plan.ur_min_s == fetch and len(fetch) == 32
    p = replace(plan, ur_min_s=[], ur_serial=False)
    base = run_timeline(p, steps=4, warmup=2)
    serial = run_timeline(replace(p, ur_min_s=fetch, ur_serial=True), steps=4, warmup=2)
    overlapped = run_timeline(replace(p, ur_min_s=fetch), steps=4, warmup=2)
    assert 0 < p.mid[0] < fetch[0] and p.ur_work[0] < fetch[0]   # latency-bound: longer than the link and the rebuild
    # serial: every layer stalls for its whole fetch; the step is the compute plus 32 fetches
    assert serial.stall_s[-1] == pytest.approx(sum(fetch), rel=1e-6)
    assert serial.steady_step_s == pytest.approx(p.compute_s + sum(fetch), rel=1e-6)
    # without the fetch model the rebuild hides the link's share of the misses (or part of it); the
    # fetch starts on an idle stream, so it moves bytes only (no fixed cost: sim/timeline.py)
    t0 = p.rates.h2d_t0_s
    base_stall = 32 * max(0.0, p.ur_work[0] - t0 - p.mid[0])
    assert p.ur_work[0] - p.mid[0] > 0                                 # the old rule stalled here
    assert base.steady_step_s < p.compute_s + 32 * (p.ur_work[0] - p.mid[0]) - 16 * t0
    assert base.steady_step_s == pytest.approx(p.compute_s + base_stall, rel=1e-6)
    # overlapped: the rebuild hides under the fetch
    assert overlapped.steady_step_s == pytest.approx(serial.steady_step_s - sum(p.mid), rel=1e-6)
    # the aggregate step charges the same
    for plan, tl in ((replace(p, ur_min_s=fetch, ur_serial=True), serial), (replace(p, ur_min_s=fetch), overlapped)):
        assert aggregate_step(plan).step_s == pytest.approx(tl.steady_step_s, rel=1e-6)


# ------------------------------------------------------------------ two sweeps

def _sweep(tmp_path, name, *, meta_change=None, keep=None, extra_rows=()):
    """A copy of the committed sweep (its rows filtered by keep(row)), with meta.json changed."""
    d = tmp_path / name
    d.mkdir()
    with open(os.path.join(ENGINE, "engine.csv"), newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    cols = list(rows[0])
    rows = [r for r in rows if keep is None or keep(r)] + [dict(rows[0], **x) for x in extra_rows]
    with open(d / "engine.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(ENGINE, "meta.json"), encoding="utf-8") as fh:
        meta = json.load(fh)
    if meta_change:
        meta_change(meta)
    (d / "meta.json").write_text(json.dumps(meta))
    return str(d)


def _own(r):
    """The floor phase's own-selection rows (the calibration rows, not the forced-miss twins)."""
    return r["phase"] == "floor" and r["miss_rate"] == "none"


def _few(r):
    return _own(r) or (r["phase"] == "validation" and r["design"] == "dualdecoder"
                                     and r["context"] == "131072" and r["batch"] == "8")


def test_same_run_is_refused_in_one_line(tmp_path, capsys):
    a = _sweep(tmp_path, "a", keep=_few)
    b = _sweep(tmp_path, "b", keep=_few)                   # another folder, the same run (same provenance)
    out = str(tmp_path / "out" / "v.csv")
    assert cli.main(["--calibration-engine", a, "--engine", b, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "same engine run" in err and "--allow-same-run" in err
    assert not os.path.exists(out)
    assert cli.main(["--calibration-engine", a, "--engine", a, "--out", out]) == 2      # the same folder
    capsys.readouterr()
    assert cli.main(["--calibration-engine", a, "--engine", b, "--out", out, "--allow-same-run"]) == 0
    s = json.load(open(str(tmp_path / "out" / "v-summary.json")))
    assert s["sweeps"]["same_run"] is True and "SAME RUN" in s["calibration"]
    assert "same run as the calibration" in open(str(tmp_path / "out" / "README.md")).read()


def test_separate_run_is_validated_and_named(tmp_path):
    a = _sweep(tmp_path, "cal", keep=_few)

    def other(meta):
        meta["run_id"] = "independent-run"
        meta["provenance"]["date_utc"] = "2026-12-01T00:00:00Z"
    b = _sweep(tmp_path, "val", keep=_few, meta_change=other)
    out = str(tmp_path / "out" / "v.csv")
    assert cli.main(["--calibration-engine", a, "--engine", b, "--out", out]) == 0
    s = json.load(open(str(tmp_path / "out" / "v-summary.json")))
    assert s["sweeps"]["same_run"] is False
    assert s["sweeps"]["validated"]["run_id"] == "independent-run"
    assert s["sweeps"]["calibration"]["folder"].endswith("cal") and s["sweeps"]["validated"]["folder"].endswith("val")
    readme = open(str(tmp_path / "out" / "README.md")).read()
    assert "independent-run" in readme and "same run as the calibration" not in readme
    # the other sweep's own-selection floor points are not replayed (they calibrate, in their own run)
    assert s["points"] == 4 and all("floor" not in x or "calibration point" in x for x in s["skipped"])


def test_same_run_rule():
    m = {"provenance": {"date_utc": "d", "git_sha": "g", "command": "c"}}
    assert v.same_run("/x", m, "/y", json.loads(json.dumps(m)))
    assert not v.same_run("/x", m, "/y", {"provenance": {"date_utc": "e", "git_sha": "g", "command": "c"}})
    assert not v.same_run("/x", dict(m, run_id="1"), "/y", dict(m, run_id="2"))
    assert v.same_run("/x", dict(m, run_id="1"), "/x", dict(m, run_id="2"))        # one folder


def test_harness_cost_from_the_calibration_sweep_is_added(tmp_path):
    """Forced-miss floor points in the calibration sweep (own step + 2.000 ms here) add 2.000 ms of
    compute to a forced-miss compute-only point; without them nothing is added."""
    with open(os.path.join(ENGINE, "engine.csv"), newline="", encoding="utf-8") as fh:
        floor = [r for r in csv.DictReader(fh) if r["phase"] == "floor" and r["design"] == "dualdecoder"
                 and r["tokens"] == "2" and r["context"] == "131072" and r["miss_rate"] == "none"]
    forced = [dict(miss_rate="0.174", step_ms=repr(float(r["step_ms"]) + 2.0), batch=r["batch"], phase="floor",
                   design="dualdecoder", context="131072", transfers="0", graph="1", tokens="2", status="ok")
              for r in floor]
    assert len(forced) == 3
    a = _sweep(tmp_path, "cal", keep=_own, extra_rows=forced)
    def other(m):
        m.update(run_id="v")
        m["provenance"]["date_utc"] = "2026-12-01T00:00:00Z"
    b = _sweep(tmp_path, "val", meta_change=other,
               keep=lambda r: r["phase"] == "validation" and r["design"] == "dualdecoder"
               and r["context"] == "131072" and r["batch"] == "8" and r["transfers"] == "0")
    plain = _sweep(tmp_path, "cal0", keep=_own)
    t, _, meta, _ = v.validate(b, a, allow_same_run=False)
    t0, _, meta0, _ = v.validate(b, plain, allow_same_run=False)
    assert len(t) == 2 and meta["sweeps"]["harness_measured"] and not meta0["sweeps"]["harness_measured"]
    assert list(t.harness_ms) == pytest.approx([2.0, 2.0], abs=1e-9)
    assert list(t0.harness_ms) == [0.0, 0.0]
    assert list(t.sim_step_ms - t0.sim_step_ms) == pytest.approx([2.0, 2.0], abs=1e-6)


def test_engine_import_splits_forced_miss_rows_and_replaces_the_section(tmp_path):
    from ddbench.core.calibration import import_engine_sweep, load_bundle
    bundle = tmp_path / "bundle"
    shutil.copytree(str(traces_dir("calibration", "h200")), str(bundle))
    forced = [dict(miss_rate="0.174", step_ms="9.5", batch="1", phase="floor", design="shadowkv",
                   context="32768", transfers="0", graph="1", tokens="2", status="ok")]
    a = _sweep(tmp_path, "cal", keep=lambda r: r["phase"] == "floor" and r["design"] == "shadowkv" and r["miss_rate"] == "none",
               extra_rows=forced, meta_change=lambda m: m.update(run_id="r1"))
    n = import_engine_sweep(str(bundle), a, "pytest", "2026-12-01")
    b = load_bundle(str(bundle))
    eng = b.rows["engine"]
    assert n == len(eng) == 5 + 1             # shadowkv's 5 ok floor rows (128K b64 is oom) + 1: the old 26 are gone
    assert {r["system"] for r in eng} == {"shadowkv"}
    assert [r["compute_ms"] for r in eng if r["layer"] == "step-forced-miss"] == [9.5]
    assert b.meta["sections"]["engine"]["source"]["run_id"] == "r1"


# ------------------------------------------------------------------ kernels/engine/bench.py phase selection

def test_bench_phase_selection_and_folders():
    bench = pytest.importorskip("ddbench.kernels.engine.sweep")
    from ddbench.core.errors import DDBenchError
    allp = bench.plan_points(False, 2)
    val = bench.plan_points(False, 2, ("validation",))
    floor = bench.plan_points(False, 2, ("floor",))
    assert {p[0] for p in val} == {"validation"} and {p[0] for p in floor} == {"floor"}
    assert [p for p in allp if p[0] == "validation"] == val and [p for p in allp if p[0] == "floor"] == floor
    assert len({json.dumps(p) for p in allp}) == len(allp)                  # resume keys are unique
    # validation points are not calibration points: other batches and miss rates than the floor's
    fb = {(p[2], p[3], p[4]) for p in floor}
    assert not any((p[2].replace("-fifo", ""), p[3], p[4]) in fb for p in val)
    assert {p[5] for p in val} <= {0.25, 0.1, None}
    # every forced-miss validation point with transfers has its compute-only twin
    twins = {(p[2], p[3], p[4], p[5]) for p in val if not p[6]}
    assert all((p[2], p[3], p[4], p[5]) in twins for p in val if p[6] and p[5] and p[2] != "dualdecoder-fifo")
    # the floor phase measures the harness: forced-miss compute-only twins of the own-selection points
    assert {(p[2], p[3], p[4]) for p in floor if p[5] is not None} == \
        {(p[2], p[3], p[4]) for p in floor if p[5] is None and p[2] in ("dualdecoder", "shadowkv", "specache")}
    assert bench.parse_phases("validation,floor") == ("floor", "validation")
    with pytest.raises(DDBenchError, match="--phases"):
        bench.parse_phases("valdation")
    assert bench.out_folder("h200", bench.PHASES) == "h200"
    assert bench.out_folder("h200", ("validation",)) == "h200-validation"
    assert bench.out_folder("h200", ("validation",), "x") == "x"


def test_bench_cli_rejects_unknown_phase_before_any_gpu_work(capsys):
    bench = pytest.importorskip("ddbench.kernels.engine.sweep")
    assert bench.main(["--phases", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--phases" in err and "bogus" in err


def test_nothing_to_replay_is_one_line(tmp_path, capsys):
    a = _sweep(tmp_path, "cal", keep=_own)
    b = _sweep(tmp_path, "val", keep=_own,
               meta_change=lambda m: m.update(run_id="another-run"))
    out = str(tmp_path / "out" / "v.csv")
    assert cli.main(["--calibration-engine", a, "--engine", b, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no engine point to replay" in err and not os.path.exists(out)
