"""Honesty tests of the simulator: bytes, memory, determinism, Little's law, link-bound throughput."""

import math
import sys

import pytest

from ddbench.core.catalog import get_gpu, get_link, get_model
from ddbench.core.memory import Workload
from ddbench.core.designs import DESIGNS
from ddbench.core.distribution import Distribution
from ddbench.core.errors import DDBenchError
from ddbench.sim.aggregate import aggregate_step
from ddbench.sim.costmodel import CostModel
from ddbench.sim.steplayers import step_layers
from ddbench.sim.serving import draw_requests, run_serving
from ddbench.sim.factory import cost_model
from ddbench.sim.timeline import run_timeline

M8 = get_model("llama-3-8b")
W = Workload(context=131072)
HIT = [0.88] * M8.num_layers


def _plan(system, batch, cm=None, hit=HIT, ctx=131072):
    from ddbench.core.rates import forced
    cm = cm or cost_model("llama-3-8b", "h200")
    spec = DESIGNS[system]
    pre = 0.2 if spec.prefetch != "none" else 0.0            # lru-cache prefetches nothing
    cache = forced(pre, 0.05, M8.num_layers, "test rates") if spec.chunk_cache else None
    return step_layers(DESIGNS[system], M8, cm, W, batch, ctx, hit, hit, cache=cache)


def test_sim_imports_no_torch():
    import subprocess
    code = ("import sys, ddbench.sim.serving, ddbench.sim.timeline, ddbench.sim.factory, ddbench.commands.simulate;"
            "bad=[m for m in sys.modules if m.split('.')[0] in ('torch','triton','kernels')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("system", [s for s in DESIGNS if DESIGNS[s].fetch != "none"])
def test_bytes_moved_equal_bytes_planned(system):
    hit = [0.5 + 0.015 * i for i in range(M8.num_layers)]
    plan = _plan(system, 8, hit=hit)
    steps = 5
    tl = run_timeline(plan, steps=steps, warmup=1)
    assert tl.h2d_bytes_planned > 0
    assert tl.h2d_bytes_moved == pytest.approx(tl.h2d_bytes_planned, rel=1e-12)
    # and what was planned is what the design's switches say: per step, prefetch + urgent
    per_step = plan.h2d_bytes
    issued_steps = steps + (1 if DESIGNS[system].prefetch != "none" else 0)
    lo, hi = steps * per_step, issued_steps * per_step
    assert lo - 1 <= tl.h2d_bytes_planned <= hi + 1
    assert tl.d2h_bytes_moved == pytest.approx(steps * sum(plan.d2h_bytes))


def test_fetched_bytes_follow_the_mechanism():
    b, B, kvl = 4, W.budget, M8.kv_bytes_per_token_layer
    dd = _plan("dualdecoder", b)
    assert dd.pf_bytes[0] == b * B * kvl and dd.ur_bytes[0] == pytest.approx(b * B * kvl * 0.12)
    sk = _plan("shadowkv", b)
    assert sk.pf_bytes[0] == 0 and sk.ur_bytes[0] == pytest.approx(b * B * kvl / 2 * 0.12)  # values of misses
    dc = _plan("dualdecoder-cache", b)              # only what the cache misses: its rates, K and V
    assert dc.pf_bytes[0] == pytest.approx(b * B * kvl * 0.2) and dc.ur_bytes[0] == pytest.approx(b * B * kvl * 0.05)
    with pytest.raises(DDBenchError, match="needs its cache rates"):
        step_layers(DESIGNS["dualdecoder-cache"], M8, cost_model("llama-3-8b", "h200"), W, b, 131072, HIT, HIT)
    assert sum(_plan("full-kv", b).pf_bytes + _plan("full-kv", b).ur_bytes) == 0


def test_buffer_occupancy_within_reservation():
    for system in ("dualdecoder", "dualdecoder-per-layer", "specache"):
        tl = run_timeline(_plan(system, 8), steps=4, warmup=1)
        assert 0 < tl.peak_buffer_bytes <= tl.reserved_buffer_bytes
    pp = run_timeline(_plan("dualdecoder", 8), steps=4, warmup=1)
    assert pp.reserved_buffer_bytes == 2 * 8 * W.budget * M8.kv_bytes_per_token_layer


def _serve(system="dualdecoder", n=150, rate=2.0, seed=3, link=None, model="llama-3-8b", ctx="uniform:32k:128k",
           out="exp:128"):
    m = get_model(model)
    cm = cost_model(model, "h200", link)
    reqs = draw_requests(n, rate, Distribution.parse(ctx), Distribution.parse(out, "output"), seed)
    return run_serving(DESIGNS[system], m, get_gpu("h200"), cm, Workload(context=131072), reqs,
                       [0.88] * m.num_layers, [0.88] * m.num_layers)


@pytest.mark.parametrize("system", ["dualdecoder", "shadowkv", "full-kv", "specache"])
def test_memory_never_exceeds_capacity(system):
    res = _serve(system, n=120, rate=5.0)
    assert res.peak_memory <= res.capacity
    assert all(row["total"] <= res.capacity for row in res.memory)
    assert max(s["batch"] for s in res.segments) > 1  # memory, not a trivial load, limited the batch


def test_same_seed_same_result_and_other_seed_differs():
    a, b, c = _serve(seed=11, n=80), _serve(seed=11, n=80), _serve(seed=12, n=80)
    key = lambda r: [(x.arrival, x.context, x.output, x.first_token, x.completion) for x in r.requests]
    assert key(a) == key(b) and a.summary() == b.summary()
    assert key(a) != key(c)


def test_littles_law_long_run():
    res = _serve(n=600, rate=0.4, ctx="32k", out="exp:64", model="qwen2.5-7b")
    done = [r for r in res.requests if not r.rejected]
    assert len(done) == 600
    horizon = res.sim_end
    lam = len(done) / horizon
    mean_w = sum(r.latency for r in done) / len(done)
    mean_l = res.in_system_integral / horizon
    assert mean_l == pytest.approx(lam * mean_w, rel=1e-6)
    assert mean_l > 0.5  # a loaded system, not an empty one


def test_link_bound_throughput_is_bandwidth_over_bytes_per_token():
    cm = cost_model("llama-3-8b", "h200")
    b = 64
    plan = _plan("dualdecoder", b, cm=cm)
    tl = run_timeline(plan, steps=6, warmup=2)
    assert tl.link_util > 0.98                       # link-bound
    r = plan.rates
    bytes_per_token = plan.h2d_bytes / b             # per request per step (one output token)
    fixed = sum(1 for x in plan.pf_work + plan.ur_work if x > 0) * r.h2d_t0_s
    beta = r.bidir_factor
    d2h_loss = min(sum(plan.d2h_work) / beta, 1e9) * (1 - beta)
    expected = b / (plan.h2d_bytes / (r.h2d_gbps * 1e9) + fixed + d2h_loss)
    assert b / tl.steady_step_s == pytest.approx(expected, rel=0.02)
    # the bandwidth over bytes per token, with the fixed per-transfer costs left out, bounds it from above
    assert b / tl.steady_step_s <= r.h2d_gbps * 1e9 / bytes_per_token


def test_halving_link_bandwidth_changes_latency():
    m = get_model("llama-3-8b")
    cm5 = cost_model("llama-3-8b", "h200", "pcie5")
    cm4 = cost_model("llama-3-8b", "h200", "pcie4")
    assert get_link("pcie4").achievable_gbps == pytest.approx(get_link("pcie5").achievable_gbps / 2, rel=0.01)
    t5 = run_timeline(_plan("dualdecoder", 32, cm=cm5), steps=5).steady_step_s
    t4 = run_timeline(_plan("dualdecoder", 32, cm=cm4), steps=5).steady_step_s
    assert t4 / t5 == pytest.approx(2.0, rel=0.05)
    s5 = _serve(n=60, rate=0.5, ctx="32k", out="256", link="pcie5").summary()
    s4 = _serve(n=60, rate=0.5, ctx="32k", out="256", link="pcie4").summary()
    assert s4["tpot_p50_s"] > 1.5 * s5["tpot_p50_s"]
    assert s4["completion_p50_s"] > s5["completion_p50_s"]
    assert m.num_layers == 32


def test_priority_beats_fifo_on_misses():
    hit = [0.67] * M8.num_layers  # the paper's Figure 18: a 33% miss rate
    cm = cost_model("llama-3-8b", "h200")
    pr = run_timeline(step_layers(DESIGNS["dualdecoder"], M8, cm, W, 8, 131072, hit, hit), steps=5)
    ff = run_timeline(step_layers(DESIGNS["dualdecoder-fifo"], M8, cm, W, 8, 131072, hit, hit), steps=5)
    assert sum(ff.stall_s[2:]) > sum(pr.stall_s[2:])


def test_roofline_and_scaled_outputs_say_so():
    m, lk = get_model("llama-3-8b"), get_link("pcie5")
    roof = CostModel(m, get_gpu("h100-80gb"), lk, None)
    assert any(n.startswith("ROOFLINE") for n in roof.notes)
    scaled = cost_model("llama-3-8b", "h100-80gb")
    assert any(n.startswith("SCALED") for n in scaled.notes)
    own = cost_model("llama-3-8b", "h200")
    assert not any(n.startswith(("SCALED", "ROOFLINE")) for n in own.notes)
    # HBM-bound decode attention scales with the HBM ratio (4800 / 3350)
    a_h200 = own.attention_decode_s(32, 1, 131072)
    a_h100 = scaled.attention_decode_s(32, 1, 131072)
    assert a_h100 / a_h200 == pytest.approx(4800 / 3350, rel=1e-6)
    assert math.isfinite(aggregate_step(_plan("dualdecoder", 4, cm=roof)).step_s)


@pytest.mark.parametrize("system", ["dualdecoder", "shadowkv", "specache", "full-kv", "dualdecoder-fifo"])
def test_serving_step_interpolation_matches_exact_step(system):
    """Serving mode interpolates the step between exact evaluations on a context grid; it stays
    within 1e-4 of the exact aggregate at contexts off the grid."""
    import random

    from ddbench.sim.serving import STEP_GRID, _Model
    cm = cost_model("llama-3-8b", "h200")
    hit = [0.5 + 0.4 * i / M8.num_layers for i in range(M8.num_layers)]
    mdl = _Model(DESIGNS[system], M8, get_gpu("h200"), cm, W, hit, hit)
    rng = random.Random(5)
    for _ in range(40):
        b, ctx = rng.randint(1, 96), rng.uniform(4096, 200000)
        assert ctx % STEP_GRID  # off the grid
        exact = aggregate_step(step_layers(DESIGNS[system], M8, cm, W, b, ctx, hit, hit))
        got = mdl.step(b, ctx)
        assert got.step_s == pytest.approx(exact.step_s, rel=1e-4)
        assert got.link_s == pytest.approx(exact.link_s, rel=1e-4, abs=1e-12)


def test_triton_kernels_cost_dualdecoder_designs_only():
    """Reconciled with the engine (the committed bundle has its kernel breakdown), every sparse design
    is costed with the engine's kernels, whatever its `kernels` switch: the engine, the only
    implementation validated, runs its Triton kernels for all of them (the dual-token attention reads
    K/V once for both tokens: the single-token time). Without the breakdown (the microbenchmark op
    model) the switch still picks the rows: DualDecoder's designs the Triton kernels, SpeCache's two
    queries and ShadowKV with torch SDPA."""
    from ddbench.core.calibration import load_bundle
    from ddbench.core.paths import traces_dir
    from ddbench.sim.steplayers import attended_tokens
    cm = cost_model("llama-3-8b", "h200")
    assert cm.engine is not None and any("RECONCILED" in n for n in cm.notes)
    assert cm.attention_decode_s(32, 2, 2100, triton=True) < 1.1 * cm.attention_decode_s(32, 1, 2100, triton=True)
    assert cm.attention_decode_s(32, 2, 2100) == cm.attention_decode_s(32, 2, 2100, triton=True)
    for system in ("dualdecoder", "specache", "shadowkv"):
        p = _plan(system, 32, cm=cm)
        kv = round(attended_tokens(DESIGNS[system], W, 131072))
        assert p.att[0] == cm.attention_decode_s(32, p.q_tokens, kv, triton=True)
    micro = CostModel(M8, get_gpu("h200"), get_link("pcie5"), load_bundle(str(traces_dir("calibration", "h200"))),
                      reconcile=False)
    assert micro.engine is None
    assert micro.attention_decode_s(32, 2, 2100, triton=True) < 1.1 * micro.attention_decode_s(32, 1, 2100, triton=True)
    assert micro.attention_decode_s(32, 2, 2100) > 2 * micro.attention_decode_s(32, 2, 2100, triton=True)
    for system, triton in (("dualdecoder", True), ("specache", False), ("shadowkv", False)):
        p = _plan(system, 32, cm=micro)
        kv = round(attended_tokens(DESIGNS[system], W, 131072))
        assert p.att[0] == micro.attention_decode_s(32, p.q_tokens, kv, triton=triton)


def test_prefill_elsewhere_joins_decode_at_once():
    """Disaggregated prefill: a request that finds memory free has its first token at arrival
    (TTFT 0), one that waits has TTFT = its wait for memory; Little's law and capacity still hold."""
    m = get_model("qwen2.5-32b")
    reqs = draw_requests(80, 0.6, Distribution.parse("128k"), Distribution.parse("64", "output"), 4)
    res = run_serving(DESIGNS["shadowkv"], m, get_gpu("h100-80gb"), cost_model("qwen2.5-32b", "h100-80gb"),
                      Workload(context=131072), reqs, [0.88] * m.num_layers, [0.88] * m.num_layers,
                      prefill_here=False)
    done = [r for r in res.requests if not r.rejected]
    assert len(done) == 80
    assert all(r.ttft == pytest.approx(r.admitted - r.arrival, abs=1e-12) for r in done)
    assert min(r.ttft for r in done) == 0.0 and max(r.ttft for r in done) > 0.0  # some waited for memory
    assert all(row["total"] <= res.capacity for row in res.memory)
    assert all(s["prefill_tokens"] == 0 for s in res.segments)
    lam, mean_w = len(done) / res.sim_end, sum(r.latency for r in done) / len(done)
    assert res.in_system_integral / res.sim_end == pytest.approx(lam * mean_w, rel=1e-6)


def test_serving_percentiles_match_numpy_on_random_runs():
    """Every percentile in the serving summary is numpy's nearest-rank percentile of the per-request
    values, on runs with random seeds, loads and request counts (odd and even, small and large)."""
    import random

    import numpy as np
    rng = random.Random(2024)
    for _ in range(4):
        n = rng.choice([7, 10, 33, 101])
        res = _serve("dualdecoder", n=n, rate=rng.uniform(0.2, 3.0), seed=rng.randrange(10**6), ctx="uniform:16k:64k",
                     out="exp:64")
        s = res.summary()
        done = [r for r in res.requests if not r.rejected]
        values = {"completion": [r.latency for r in done], "ttft": [r.ttft for r in done],
                  "tpot": [r.tpot for r in done if r.output > 1]}
        for key, xs in values.items():
            assert len(set(xs)) > 3
            for p in (50, 99):
                want = float(np.percentile(xs, p, method="inverted_cdf"))
                assert s[f"{key}_p{p}_s"] == want, (key, p, n)
                # nearest rank: a value of the sample with at least p% of the sample at or below it
                assert sum(x <= want for x in xs) >= p / 100 * len(xs) > sum(x < want for x in xs)


def test_percentile_of_nothing_is_none():
    from ddbench.core.stats import percentile
    assert percentile([], 50) is None
    xs = [3.0, 1.0, 2.0, 10.0]
    assert [percentile(xs, p) for p in (1, 25, 26, 50, 51, 75, 76, 100)] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 10.0, 10.0]


def test_lowrank_layers_fetch_values_only():
    """DualDecoder's adaptive key reconstruction: the --lowrank-layers worst-predicted layers rebuild K
    from the low-rank copy, so only V crosses the link there; the other layers move K and V."""
    from dataclasses import replace
    hit = [0.9 - 0.01 * i for i in range(M8.num_layers)]       # the last layers predict worst
    w = replace(W, lowrank_layers=4)
    plan = step_layers(DESIGNS["dualdecoder"], M8, cost_model("llama-3-8b", "h200"), w, 8, 131072, hit, hit)
    assert plan.lowrank == frozenset({28, 29, 30, 31})
    full = 8 * W.budget * M8.kv_bytes_per_token_layer
    # every sparse layer assembles its attended buffer (mid); the low-rank ones rebuild K before it
    from ddbench.sim.steplayers import resident_rows
    cm = cost_model("llama-3-8b", "h200")
    asm, reb = cm.assemble_s(8, resident_rows(DESIGNS["dualdecoder"], w)), cm.rebuild_s(8, w.budget, w.rank)
    assert asm > 0 and reb > 0
    for i in range(M8.num_layers):
        kv = full / 2 if i in plan.lowrank else full
        assert plan.pf_bytes[i] == kv and plan.ur_bytes[i] == pytest.approx(kv * (1 - hit[i]))
        assert plan.mid[i] == pytest.approx(asm + (reb if i in plan.lowrank else 0.0), rel=1e-12)
    # the new token's K and V are written back to the host whole, every layer
    assert plan.d2h_bytes == [8 * M8.kv_bytes_per_token_layer] * M8.num_layers
