"""FIFO misses must be able to stall the pipeline: on a saturated link, the misses of layer i+1 queue
behind the whole prefetch of layer i+2, and the prefetch of layer i+3 waits for layer i+1's attention
to release its ping-pong buffer, so the link idles while that attention runs (a bubble per layer).
The prefetch that ends the bubble starts on an idle stream and pays bytes only (a gather pays the
fixed cost only queued behind a gather of its own stream: sim/timeline.py), while under priority
each prefetch queues behind the previous one and pays it: so FIFO - priority is about the attention
per layer, not attention + fixed cost (the engine's measured gap at this point, with its spread over
the repetitions: docs/simulator.md). The engine point of traces/engine/h200 (Llama-3-8B, 128K, batch 16, 33%
misses)."""

from dataclasses import replace

import pytest

from ddbench.sim.fit import validation as v
from ddbench.sim.aggregate import aggregate_step
from ddbench.sim.timeline import run_timeline

MISS = v.effective_miss(0.33, 2048, 8)


def _pair(att_scale=1.0):
    out = {}
    for d in ("dualdecoder", "dualdecoder-fifo"):
        p = v.replay_plan(d, 131072, 16, MISS, True)
        if att_scale != 1.0:
            p = replace(p, att=[a * att_scale for a in p.att])
        out[d] = (p, run_timeline(p, steps=6, warmup=2))
    return out


def test_fifo_stalls_by_one_attention_per_layer_on_a_busy_link():
    r = _pair()
    (pp, pr), (_, ff) = r["dualdecoder"], r["dualdecoder-fifo"]
    assert pr.link_util > 0.95                      # link-busy point, with misses
    bubble = sum(pp.att)                            # the link idles for one attention per layer
    fixed = pp.layers * pp.rates.h2d_t0_s           # what the old per-burst rule added (1.27 ms here)
    assert fixed > 0.5 * bubble                     # large enough to tell the two rules apart
    gap = ff.steady_step_s - pr.steady_step_s
    assert gap == pytest.approx(bubble, rel=0.05)   # FIFO pays the bubble ...
    assert gap < bubble + 0.25 * fixed              # ... and not a fixed cost per bubble on top
    assert ff.link_util < pr.link_util              # the link idles in the bubbles


def test_the_fifo_bubble_grows_with_what_the_link_waits_for():
    """Negative control: a longer attention (what the next prefetch waits for) widens FIFO's gap;
    priority does not care, its next prefetch is already queued."""
    base, slow = _pair(), _pair(att_scale=5.0)
    g0 = base["dualdecoder-fifo"][1].steady_step_s - base["dualdecoder"][1].steady_step_s
    g1 = slow["dualdecoder-fifo"][1].steady_step_s - slow["dualdecoder"][1].steady_step_s
    assert g1 > 4 * g0
    assert g1 == pytest.approx(5 * sum(base["dualdecoder"][0].att), rel=0.05)
    assert slow["dualdecoder"][1].steady_step_s == pytest.approx(base["dualdecoder"][1].steady_step_s, rel=0.01)


def test_aggregate_mode_charges_the_same_bubble():
    r = _pair()
    (pp, pr), (pf, ff) = r["dualdecoder"], r["dualdecoder-fifo"]
    a_gap = aggregate_step(pf).step_s - aggregate_step(pp).step_s
    assert a_gap == pytest.approx(ff.steady_step_s - pr.steady_step_s, rel=0.05)
    assert a_gap == pytest.approx(sum(pp.att), rel=0.05)
