"""The simulator-driven paper figures (ddbench/experiments/sim_figures.py, latency_figures.py): their numbers follow
from the simulator and the memory model, never from the paper."""

import math

import pytest

from ddbench.core.catalog import get_gpu, get_model
from ddbench.experiments import latency_figures as lf, sim_figures as sf
from ddbench.core.memory import Workload, max_batch
from ddbench.core.designs import get_design


@pytest.fixture(scope="module")
def f12():
    return sf.fig12()


def test_fig12_oom_follows_the_memory_model(f12):
    df = f12.data
    for r in df.itertuples():
        mb = max_batch(get_design(r.system), get_model(sf.F12_MODEL), get_gpu(sf.GPU), Workload(context=r.context))
        assert r.max_batch == mb and r.oom == (mb == 0)
        assert math.isnan(r.tokens_per_s) == r.oom
        if not r.oom:   # throughput = batch / simulated step, and never above the link ceiling
            assert r.tokens_per_s == pytest.approx(r.max_batch / (r.step_ms / 1e3))
            assert r.tokens_per_s <= r.link_ceiling_tokens_per_s * 1.0001


def test_fig12_ratios_are_computed_from_the_table(f12):
    t = f12.data.set_index(["context", "system"]).tokens_per_s
    got = {c.paper_id: c.ours for c in f12.comparisons}
    assert got["fig12.128k.over_shadowkv"] == round(t[(131072, "dualdecoder")] / t[(131072, "shadowkv")], 2)
    assert got["fig12.64k.dualdecoder.tokens_per_s"] == round(t[(65536, "dualdecoder")], 1)


def test_fig03_stays_within_memory_and_throughput_grows_with_batch():
    res = sf.fig03()
    df = res.data
    for design in sf.F3_SYSTEMS:
        cap = df[(df.system == design) & (df.kind == "capped")].sort_values("batch")
        assert cap.batch.max() == sf.design_max_batch(design, sf.F3_MODEL, sf.F3_CTX)
        assert (cap.tokens_per_s.diff().dropna() > -1e-9).all()  # more requests never lose throughput here


def test_fig18_fifo_never_meaningfully_faster_than_priority():
    """(Priority charges an urgent miss the wait for the chunk in flight, so FIFO can come out a
    hair, 0.01%, ahead where both barely stall.)"""
    df = lf.fig18().data
    sw = df[df.kind == "sweep"].pivot_table(index=["model_size", "batch"], columns="system", values="step_ms")
    assert (sw["dualdecoder-fifo"] >= sw["dualdecoder"] * (1 - 1e-3)).all()
    assert (sw["dualdecoder-fifo"] > sw["dualdecoder"] * 1.01).any()  # and at some batch the order matters


def test_fig12_reaches_512k_and_its_oom_claims_follow_the_table(f12):
    t = f12.data.set_index(["context", "system"])
    assert 512 * 1024 in set(f12.data.context)
    got = {c.paper_id: c.ours for c in f12.comparisons}
    for ctx, design in ((128, "full-kv"), (256, "full-kv"), (256, "specache")):
        assert got[f"fig12.{ctx}k.{design}.max_batch"] == t.max_batch[(ctx * 1024, design)]
    assert got["fig12.context.max_tokens"] == max(f12.data.context)


def test_budget_figure_follows_the_simulator():
    from ddbench.experiments import budget_figure as bf
    res = bf.budget()
    df = res.data
    for r in df.itertuples():   # each point: the memory model's batch at that budget, batch / simulated step
        mb = max_batch(get_design(r.system), get_model(bf.F12_MODEL), get_gpu(bf.GPU),
                       Workload(context=r.context, budget=r.budget))
        assert r.max_batch == mb
        assert r.tokens_per_s == pytest.approx(r.max_batch / (r.step_ms / 1e3))
    dd = df[df.system == "dualdecoder"]
    for ctx, s in dd.groupby("context"):
        s = s.sort_values("budget")
        # DualDecoder moves the whole budget each step: a larger budget never speeds it up against ShadowKV
        assert (s.dd_over_shadowkv.diff().dropna() < 0).all(), ctx
    # at Figure 12's budget the ratio is Figure 12's own
    f12 = sf.fig12().data.set_index(["context", "system"]).tokens_per_s
    at = dd.set_index(["context", "budget"]).dd_over_shadowkv
    assert at[(65536, 2048)] == pytest.approx(f12[(65536, "dualdecoder")] / f12[(65536, "shadowkv")])


def test_fig04_timeline_stays_within_memory_and_fills_it():
    from ddbench.core.memory import CATEGORIES
    from ddbench.experiments import memory_figures as mf
    df = mf.fig04().data
    cap = get_gpu(mf.GPU).hbm_bytes / 1e9
    parts = df[[f"{c}_gb" for c in CATEGORIES]].sum(axis=1)
    assert (parts - df.total_gb).abs().max() < 1e-6
    assert (df.total_gb <= cap + 1e-9).all()
    for design, s in df.groupby("system"):
        mb = max_batch(get_design(design), get_model(mf.F4_MODEL), get_gpu(mf.GPU), Workload(context=mf.CONTEXT))
        assert s.batch.max() == min(mb, mf.F4_N), design      # the arrivals outpace decoding: memory fills
        assert s.batch.iloc[-1] == 0 and s.time_s.is_monotonic_increasing
