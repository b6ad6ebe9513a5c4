"""The per-layer timeline and the per-step aggregate agree in steady state."""

import pytest

from ddbench.core.catalog import get_model
from ddbench.core.memory import Workload
from ddbench.core.designs import DESIGNS
from ddbench.core.distribution import Distribution
from ddbench.sim.aggregate import aggregate_step
from ddbench.sim.steplayers import step_layers
from ddbench.sim.factory import cost_model
from ddbench.sim.timeline import run_timeline

CASES = [  # (design, batch): compute-bound, critical-path fetch, and link-bound regimes
    ("full-kv", 1), ("full-kv", 4), ("shadowkv", 4), ("shadowkv", 32), ("ideal", 8),
    ("dualdecoder", 32), ("dualdecoder", 64), ("dualdecoder-fifo", 32), ("dualdecoder-cpu-gather", 32),
    ("dualdecoder-two-pass", 32), ("specache", 32), ("dualdecoder-per-layer", 48),
]


@pytest.mark.parametrize("system,batch", CASES)
def test_timeline_and_aggregate_agree(system, batch):
    m = get_model("llama-3-8b")
    cm = cost_model("llama-3-8b", "h200")
    hit = [0.80 + 0.003 * i for i in range(m.num_layers)]
    plan = step_layers(DESIGNS[system], m, cm, Workload(context=131072), batch, 131072, hit, hit)
    tl = run_timeline(plan, steps=7, warmup=3)
    steady = tl.step_s[3:]
    assert max(steady) - min(steady) <= 0.01 * max(steady)  # the timeline reached a steady state
    assert aggregate_step(plan).step_s == pytest.approx(tl.steady_step_s, rel=0.03)


def test_serving_step_times_come_from_the_aggregate():
    from ddbench.core.catalog import get_gpu
    from ddbench.sim.serving import draw_requests, run_serving
    m = get_model("llama-3-8b")
    cm = cost_model("llama-3-8b", "h200")
    w = Workload(context=131072)
    hit = [0.88] * m.num_layers
    reqs = draw_requests(40, 1000.0, Distribution.parse("32k"), Distribution.parse("64", "output"), 5)  # all arrive at once: a steady decode batch
    res = run_serving(DESIGNS["dualdecoder"], m, get_gpu("h200"), cm, w, reqs, hit, hit)
    seg = max((s for s in res.segments if s["prefill_tokens"] == 0), key=lambda s: s["steps"])
    plan = step_layers(DESIGNS["dualdecoder"], m, cm, w, seg["batch"], 32768 + 32, hit, hit)
    tl = run_timeline(plan, steps=6, warmup=2)
    assert seg["step_s"] == pytest.approx(tl.steady_step_s, rel=0.05)


EDGE = [("dualdecoder", 2), ("dualdecoder", 3), ("dualdecoder", 4), ("specache", 2), ("specache", 3),
        ("specache", 4), ("dualdecoder-fifo", 3), ("dualdecoder-fifo", 4), ("dualdecoder-fifo", 16),
        ("dualdecoder-cpu-gather", 1), ("dualdecoder-cpu-gather", 3), ("dualdecoder-cpu-gather", 4),
        ("shadowkv", 1)]


@pytest.mark.parametrize("system,batch", EDGE)
def test_aggregate_near_the_link_bound_edge(system, batch):
    """At the batches where the step turns link-bound, the aggregate follows the timeline's gather
    streams: a fixed cost only for a gather queued behind one of its own stream (every prefetch of a
    saturated priority link, FIFO's misses behind a prefetch), misses no earlier than their own
    prefetch, compute slowed only beside a gather in flight (sim/aggregate.py)."""
    m = get_model("llama-3-8b")
    cm = cost_model("llama-3-8b", "h200")
    hit = [0.82] * m.num_layers
    plan = step_layers(DESIGNS[system], m, cm, Workload(context=131072), batch, 131072, hit, hit)
    tl = run_timeline(plan, steps=6, warmup=2)
    assert aggregate_step(plan).step_s == pytest.approx(tl.steady_step_s, rel=0.02)


def test_cpu_gather_at_its_edge_within_five_percent():
    """The CPU-gather ablation at batch 2 (128K, hit 0.82) sits on its edge since the compute is the
    engine's (about half the microbenchmarks'): in the timeline every other layer's next prefetch is ready
    on the host when the copy engine frees, so the per-layer chain (prefetch copy, miss CPU gather, miss
    copy) the aggregate charges holds for half the layers only; the aggregate is 4.7 % above the timeline
    there (batches 1, 3, 4: within 0.3 %, test_aggregate_near_the_link_bound_edge)."""
    m = get_model("llama-3-8b")
    cm = cost_model("llama-3-8b", "h200")
    hit = [0.82] * m.num_layers
    plan = step_layers(DESIGNS["dualdecoder-cpu-gather"], m, cm, Workload(context=131072), 2, 131072, hit, hit)
    tl = run_timeline(plan, steps=6, warmup=2)
    agg = aggregate_step(plan).step_s
    assert tl.steady_step_s <= agg <= 1.05 * tl.steady_step_s


@pytest.mark.parametrize("system,batch,hit", [("dualdecoder", 3, 0.2), ("dualdecoder", 5, 0.2),
                                              ("shadowkv", 1, 0.88), ("specache", 2, 0.88)])
def test_aggregate_at_32k(system, batch, hit):
    """The worst points of a 32K sweep (batches 1-24, hit 0.2 and 0.88; docs/simulator.md)."""
    m = get_model("llama-3-8b")
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    h = [hit] * m.num_layers
    plan = step_layers(DESIGNS[system], m, cm, Workload(context=32768), batch, 32768, h, h)
    tl = run_timeline(plan, steps=6, warmup=2)
    assert aggregate_step(plan).step_s == pytest.approx(tl.steady_step_s, rel=0.02)


@pytest.mark.parametrize("batch", [2, 8, 32])
def test_agree_on_the_engine_reuse_fetch(batch):
    """sim/validate.py's replay of the old engine's ShadowKV rows (its copy-then-regather fetch on the
    compute stream, before the key rebuild: plan.ur_min_s with plan.ur_serial, legacy_reuse_fetch) is
    charged the same by both modes."""
    from ddbench.sim.fit import validation as v
    cm = cost_model("llama-3-8b", "h200", "pcie5")
    plan = v.replay_plan("shadowkv", 32768, batch, v.effective_miss(0.25, 2048, 8), True, cm)
    plan = v.legacy_reuse_fetch(plan, cm, 0.25)
    assert plan.ur_serial and len(plan.ur_min_s) == 32
    tl = run_timeline(plan, steps=6, warmup=2)
    assert tl.stall_s[-1] == pytest.approx(sum(plan.ur_min_s), rel=1e-6)
    assert aggregate_step(plan).step_s == pytest.approx(tl.steady_step_s, rel=0.005)
