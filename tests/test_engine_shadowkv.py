"""ShadowKV's in-place reuse buffer in the engine (issue 31): each layer's buffer keeps its hits where
they are, only the misses cross the link (into the slots of the chunks no longer selected) and only
their keys are rebuilt. CPU: the torch reference path on a tiny model; GPU: the Triton path, eager and
as a captured graph, against the twin's rebuild of what each buffer holds."""

import pytest
import torch

from ddbench.core.catalog.models import ModelSpec
from ddbench.core.designs import DESIGNS
from ddbench.kernels.engine.engine import Engine, EngineConfig
from ddbench.kernels.engine.model import Weights
from ddbench.kernels.indexsets import reuse_plan
from ddbench.kernels.layout import alloc_host_kv
from ddbench.kernels.rebuild import rebuild_keys_ref

TINY = ModelSpec("tiny", 3, 4, 2, 32, 64, 96, 101)


def _engine(miss_rate, seed=0):
    g = torch.Generator().manual_seed(seed)
    host = alloc_host_kv(3, 2, 2, 32, 8, 32, dtype=torch.float32)
    host.copy_(torch.randn(host.shape, generator=g))
    w = Weights.random(TINY, "cpu", seed, dtype=torch.float32)
    cfg = EngineConfig.of(context=256, batch=2, budget=64, local_chunks=1, gen_tokens=8, rank=16, outliers_per_1k=32,
                          miss_rate=miss_rate, seed=seed)
    return Engine(TINY, DESIGNS["shadowkv"], cfg, w, "cpu", host_kv=host, ref=True, debug=True)


@pytest.mark.parametrize("miss_rate", [0.25, None])
def test_only_misses_move_and_hits_stay_in_place(miss_rate):
    e, L, k, C = None, TINY.num_layers, 64 // 8, 8
    e = _engine(miss_rate)
    e.step()
    first = {r["layer"]: r for r in e.debug}
    assert e.step_bytes()[1] == L * e.B * e.H * k * C * e.d * 4          # the first step fetches every chunk
    for step in range(3):
        held = e.held.clone()
        e.debug.clear()
        e.step()
        want = 0
        for rec in e.debug:
            i = rec["layer"]
            old, new = held[i], rec["assembled"]
            assert torch.equal(new, e.held[i])                               # the buffer's ids, kept for the next step
            assert torch.equal(new.sort(-1).values, rec["true"].sort(-1).values)
            miss = reuse_plan(old, rec["true"]) < 0
            if miss_rate is not None:                                        # forced: round(rate k) per (b, h)
                assert (miss.sum(-1) == round(miss_rate * k)).all()
            kept = (old == new).repeat_interleave(C, -1)                     # [B, H, k*C] tokens of the hits
            assert int((~kept).sum()) == int(miss.sum()) * C                 # a miss fills exactly one freed slot
            prev = first[i]
            for buf in ("kb", "vb"):
                a, b = rec[buf][:, :, :k * C], prev[buf][:, :, :k * C]
                assert torch.equal(a[kept], b[kept])                         # hits untouched
            # the keys of every slot are the rebuild of the chunk it now holds (misses rebuilt, hits kept)
            ref = torch.full_like(rec["kb"], float("nan"))
            rebuild_keys_ref(e.U[i], e.SV[i], new, ref, chunk=C, rope_theta=TINY.rope_theta)
            torch.testing.assert_close(rec["kb"][:, :, :k * C], ref[:, :, :k * C], rtol=1e-5, atol=1e-5)
            want += int(miss.sum())
            first[i] = rec
        assert e.step_bytes()[1] == want * C * e.d * 4 and want > 0          # values only, misses only


def test_compute_only_plans_in_place_and_moves_nothing():
    w = Weights.random(TINY, "cpu", 0, dtype=torch.float32)
    cfg = EngineConfig.of(context=256, batch=2, budget=64, local_chunks=1, gen_tokens=8, rank=16, outliers_per_1k=32,
                          miss_rate=0.25, transfers=False)
    e = Engine(TINY, DESIGNS["shadowkv"], cfg, w, "cpu", ref=True, debug=True)
    e.step()
    held = e.held.clone()
    e.debug.clear()
    e.step()
    assert e.step_bytes() == (0, 0)
    for rec in e.debug:
        changed = (held[rec["layer"]] != rec["assembled"]).sum(-1)
        assert (changed == round(0.25 * 8)).all()                            # planned against the held ids


@pytest.mark.gpu
def test_inplace_keys_and_fetch_gpu():
    """Triton path: after eager steps and two graph replays, every layer's keys are the twin's rebuild
    of the chunks its buffer holds (so the miss-only rebuild left no stale slot), and the attention of
    each captured layer equals attention over the true selection."""
    from ddbench.kernels.engine.selfcheck import build, check_graph
    e, _ = build("shadowkv", 0.12, B=4, lowrank=(0, 1, 2), debug=False)
    for _ in range(3):
        e.step()
    e.capture(2)
    e.replay()
    e.replay()
    torch.cuda.synchronize()
    kC = e.kc * e.C
    for i in range(e.L):
        ref = torch.full((e.B, e.H, kC, e.d), float("nan"), device="cuda", dtype=e.dt)
        rebuild_keys_ref(e.U[i], e.SV[i], e.held[i], ref, chunk=e.C, rope_theta=e.m.rope_theta)
        got = e.kbuf[e.layer_buf[i]][:, :, :kC].float()
        err = float((got - ref.float()).norm() / ref.float().norm())
        assert err < 1e-2, (i, err)
    worst, e2, n, moved = check_graph("shadowkv")
    assert n == 2 * e2.L and moved and worst < 3e-2
