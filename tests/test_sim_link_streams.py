"""The gather streams of the timeline (sim/timeline.py), from the engine (kernels/engine/engine.py,
traces/engine/h200; docs/simulator.md):
- a layer's misses wait for that layer's own prefetch (they overwrite its slots: the urgent gather
  waits on the prefetch's event), and go on the link no earlier than it lands;
- a GPU gather pays the fixed cost (the bundle's h2d_t0_s, fitted from back-to-back calls on one
  stream) only where it is queued behind an unfinished gather of its own stream; one that starts
  on an idle stream moves bytes only;
- SpeCache issues its next-step prefetch of layer i after layer i's attention."""

import re
import statistics

import pytest

from ddbench.core.catalog import get_model
from ddbench.core.memory import Workload
from ddbench.core.designs import DESIGNS
from ddbench.sim.steplayers import step_layers
from ddbench.sim.factory import cost_model
from ddbench.sim.timeline import run_timeline

STEPS = 5


def _plan(system, batch, hit=0.82):
    m = get_model("llama-3-8b")
    cm = cost_model("llama-3-8b", "h200")
    return step_layers(DESIGNS[system], m, cm, Workload(context=131072), batch, 131072, [hit] * 32, [hit] * 32)


def _run(plan):
    tl = run_timeline(plan, steps=STEPS, warmup=2, record=True)
    link = sorted((e for e in tl.events if e[0] == "h2d"), key=lambda e: e[2])
    gpu = [e for e in tl.events if e[0] == "gpu"]
    return tl, link, gpu


def test_misses_wait_for_their_own_prefetch():
    p = _plan("dualdecoder", 4)       # at the link-bound edge: some prefetches land after their layer is ready
    L = p.layers
    tl, link, gpu = _run(p)
    urgent = [e for e in link if e[1] == "urgent"]
    # prefetches complete in issue order (one background stream): the k-th is (step, layer) = divmod(k, L)
    pf_end = sorted(e[3] for e in link if e[1] == "prefetch")
    ready = [e[3] for e in gpu if re.search(r"L\d+ qkv/select$", e[1])]   # each layer's true index known
    assert len(urgent) == len(ready) == STEPS * L and len(pf_end) >= STEPS * L
    waited = 0
    for k, u in enumerate(urgent):
        assert u[2] == pytest.approx(max(ready[k], pf_end[k]), abs=1e-12)
        waited += pf_end[k] > ready[k] + 1e-9
    assert waited >= L // 2           # the rule binds at this point (not only when the prefetch is early)
    # negative control: with its prefetch landing first, the misses go at the true index (batch 1:
    # every layer but the first one's of the run, whose prefetch the pre-decoding step issued at t = 0
    # beside layer 1's, and which lands after its selection since the compute is the engine's)
    p1 = _plan("dualdecoder", 1)
    _, link1, gpu1 = _run(p1)
    urgent1 = [e for e in link1 if e[1] == "urgent"]
    ready1 = [e[3] for e in gpu1 if re.search(r"L\d+ qkv/select$", e[1])]
    assert len(urgent1) == len(ready1) == STEPS * L
    assert all(u[2] == pytest.approx(r, abs=1e-12) for u, r in zip(urgent1[1:], ready1[1:]))


def test_fixed_cost_only_when_queued_behind_a_gather_of_the_same_stream():
    # priority, below the edge: each prefetch and each miss gather starts on an idle stream: bytes only
    # (batch 1: with the engine's compute, batch 2 at 128K is link-bound)
    p = _plan("dualdecoder", 1)
    t0 = p.rates.h2d_t0_s
    _, link, _ = _run(p)
    dur = {tag: statistics.median(e[3] - e[2] for e in link if e[1] == tag) for tag in ("prefetch", "urgent")}
    assert dur["prefetch"] == pytest.approx(p.pf_work[5] - t0, rel=1e-6)
    assert dur["urgent"] == pytest.approx(p.ur_work[5] - t0, rel=1e-6)
    # FIFO (SpeCache, one stream): the misses queue behind the prefetch in flight and pay it; the
    # prefetch, issued after the layer's misses were waited for, starts idle and does not.
    # Batch 3 at 128K: layer i's prefetch (0.49 ms on the link) still runs when layer i+1's
    # selection ends (about 0.10 ms earlier), and the link is not saturated (each prefetch starts
    # idle). At batch 2 the measured quant scan (62b9f21; about 2x the old roofline) makes the
    # selection end after the 0.33 ms prefetch has landed: the misses start idle there.
    q = _plan("specache", 3)
    _, link, _ = _run(q)
    urgent = [e for e in link if e[1] == "urgent"]
    pf_ends = {round(e[3], 12) for e in link if e[1] == "prefetch"}
    behind = [u for u in urgent if round(u[2], 12) in pf_ends]   # served as the prefetch ahead ends
    alone = [u for u in urgent if round(u[2], 12) not in pf_ends]
    assert len(behind) >= len(urgent) // 2 and alone     # both cases occur (layer 0 follows the LM head)
    for u in behind:                   # the full work, fixed cost included
        assert u[3] - u[2] == pytest.approx(q.ur_work[5], rel=1e-6)
    for u in alone:                    # bytes only
        assert u[3] - u[2] == pytest.approx(q.ur_work[5] - t0, rel=1e-6)
    pf_dur = statistics.median(e[3] - e[2] for e in link if e[1] == "prefetch")
    assert pf_dur == pytest.approx(q.pf_work[5] - t0, rel=1e-6)


def test_specache_prefetches_the_next_step_after_the_attention():
    q = _plan("specache", 8)
    _, link, gpu = _run(q)
    att_end = {round(e[3], 12) for e in gpu if e[1].endswith("attention")}
    sel_end = {round(e[3], 12) for e in gpu if e[1].endswith("qkv/select")}
    first = min(e[3] for e in gpu)     # after the pre-decoding step's prefetches
    starts = [e for e in link if e[1] == "prefetch" and e[2] > first]
    assert len(starts) >= 2 * q.layers
    # each prefetch goes on the link at an attention's end, or later behind the stream; never at a
    # selection's end (where SpeCache's prefetch was issued before 2026-11-30)
    assert any(round(e[2], 12) in att_end for e in starts)
    assert not any(round(e[2], 12) in sel_end for e in starts)
