"""The engine's Triton path on the GPU: per-layer attention with prediction + miss correction equals
attention over the true selection (bf16 tolerance), for every offload design and schedule; and
the schedules (priority, FIFO, per-layer buffers) produce bit-identical layer outputs."""

import pytest
import torch

pytestmark = pytest.mark.gpu

SPARSE = ["dualdecoder", "dualdecoder-cache", "dualdecoder-fifo", "dualdecoder-per-layer", "dualdecoder-two-pass",
          "dualdecoder-cpu-gather", "shadowkv", "specache"]


@pytest.mark.parametrize("name,miss_rate", [(n, 0.33) for n in SPARSE] + [("dualdecoder", None)])
def test_engine_matches_true_selection_gpu(name, miss_rate):
    from ddbench.kernels.engine.selfcheck import build, reference_output
    e, host = build(name, miss_rate)
    for _ in range(4):
        e.step()
    torch.cuda.synchronize()
    assert len(e.debug) == 4 * e.L
    for rec in e.debug:
        ref = reference_output(e, rec, host)
        assert not ref.isnan().any() and not rec["out"].isnan().any()
        torch.testing.assert_close(rec["out"].float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert e.step_bytes()[1] > 0


def test_schedules_bit_identical_gpu():
    from ddbench.kernels.engine.selfcheck import build
    outs = {}
    for name in ("dualdecoder", "dualdecoder-fifo", "dualdecoder-per-layer"):
        e, _ = build(name, None)
        toks = [e.step().clone() for _ in range(5)]
        torch.cuda.synchronize()
        outs[name] = ([t[:, 0].tolist() for t in toks], [r["out"] for r in e.debug])
    base = outs["dualdecoder"]
    for name in ("dualdecoder-fifo", "dualdecoder-per-layer"):
        assert outs[name][0] == base[0]
        assert all(torch.equal(a, b) for a, b in zip(outs[name][1], base[1]))


def test_slot_gather_kernel_gpu():
    from ddbench.kernels.engine.transfer import gather_slots, gather_slots_ref, perturb, plan_misses
    from ddbench.kernels.layout import alloc_host_kv
    g = torch.Generator(device="cuda").manual_seed(3)
    host = alloc_host_kv(2, 4, 8, 512, 8, 128)
    host.copy_(torch.randn(host.shape, device="cuda", generator=g).bfloat16())
    pred = torch.rand(4, 8, 512, device="cuda", generator=g).argsort(-1)[..., :64].sort(-1).values.int()
    plan = plan_misses(pred, perturb(pred, 0.33, 512, g))
    outs = []
    for fn in (gather_slots, gather_slots_ref):
        kb = torch.full((4, 8, 64 * 8 + 16, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
        vb = kb.clone()
        fn(host, 1, plan, kb, vb, programs=16)
        outs.append((kb.nan_to_num(7.0), vb.nan_to_num(7.0)))
    torch.cuda.synchronize()
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("name", ["dualdecoder", "dualdecoder-cache", "dualdecoder-fifo", "dualdecoder-per-layer",
                                  "dualdecoder-two-pass",
                                  "shadowkv", "specache", "full-kv"])
def test_engine_graph_matches_true_selection_gpu(name):
    """Two whole steps captured in one CUDA graph and replayed: every captured layer equals attention
    over the true selection of that replay, and successive replays move on."""
    from ddbench.kernels.engine.selfcheck import check_graph
    if name == "full-kv":
        from ddbench.kernels.engine.selfcheck import build
        e, _ = build(name, None, debug=False)
        e.step(); e.step()
        e.capture(2)
        a = e.replay().clone()
        e.replay()
        torch.cuda.synchronize()
        assert e.g_dev.item() == (2 + 4) % (e.cfg.gen_slots - 2)
        return
    worst, e, n, moved = check_graph(name)
    assert n == 2 * e.L and moved
    assert worst < 3e-2


def test_graph_streams_keep_priority_gpu():
    from ddbench.kernels.engine.selfcheck import build
    e, _ = build("dualdecoder", 0.33, debug=False)
    assert e.sched.streams["urgent"].priority < e.sched.streams["prefetch"].priority == 0
    f, _ = build("dualdecoder-fifo", 0.33, debug=False)
    assert f.sched.streams["urgent"] is f.sched.streams["prefetch"]


@pytest.mark.parametrize("cache_tokens,miss_rate,churn", [(512, 0.25, 0.25), (1024, 0.1, 0.3), (1024, None, None)])
def test_chunk_cache_evicts_and_matches_true_selection_gpu(cache_tokens, miss_rate, churn):
    """dualdecoder-cache on the Triton path with a small cache (1-2x the budget: slots are evicted): eager
    steps and a captured graph's replays equal attention over the true selection; the fills move fewer
    chunks than DualDecoder's prefetch of the whole prediction."""
    from ddbench.kernels.engine.selfcheck import build, check_graph, reference_output
    e, host = build("dualdecoder-cache", miss_rate, cache_tokens=cache_tokens, churn_rate=churn)
    for _ in range(6):
        e.step()
    torch.cuda.synchronize()
    for rec in e.debug:
        ref = reference_output(e, rec, host)
        torch.testing.assert_close(rec["out"].float(), ref.float(), rtol=2e-2, atol=2e-2)
    pf, ur = e.step_bytes()
    full = e.B * e.H * e.kc * e.L * e._item_bytes(0, False)
    assert ur > 0 and (pf < full if churn is not None else pf <= full)
    worst, g, n, moved = check_graph("dualdecoder-cache", miss_rate or 0.25, cache_tokens=cache_tokens,
                                     churn_rate=churn if churn is not None else 0.25)
    assert n == 2 * g.L and moved and worst < 3e-2


def test_chunk_cache_switches_match_true_selection_gpu():
    """dualdecoder-cache with the yielding prefetch and the rows path's two-wave split count, at a batch
    where the latter changes the split (16 requests x 8 KV heads): eager steps and graph replays equal
    attention over the true selection. The yield alone moves the same chunks as without it (the split
    count changes the sums' rounding, so the selections that follow)."""
    from ddbench.kernels.engine.selfcheck import build, check_graph, reference_output
    base = dict(cache_tokens=1024, churn_rate=0.3, yield_prefetch=False, rows_two_waves=False)
    moved = []
    for extra in (base, dict(base, yield_prefetch=True), dict(base, yield_prefetch=True, rows_two_waves=True)):
        e, host = build("dualdecoder-cache", 0.25, B=16, **extra)
        for _ in range(4):
            e.step()
        torch.cuda.synchronize()
        for rec in e.debug:
            torch.testing.assert_close(rec["out"].float(), reference_output(e, rec, host).float(), rtol=2e-2, atol=2e-2)
        moved.append(e.step_bytes())
        assert bool(e.yield_kw) == extra["yield_prefetch"] and (not e.yield_kw or int(e.yield_kw["yielding"].flag) == 0)
    assert moved[0] == moved[1] and moved[0][1] > 0
    worst, g, n, changed = check_graph("dualdecoder-cache", 0.25, B=16, **dict(base, yield_prefetch=True, rows_two_waves=True))
    assert n == 2 * g.L and changed and worst < 3e-2
