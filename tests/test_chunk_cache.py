"""dualdecoder-cache's GPU chunk cache (kernels/engine/chunkcache.py): its device fill against a plain
Python LRU twin, the engine's attention over exactly the true selection with forced and natural
misses, its moved chunks against the twin's replay of the same selections, and its memory."""

import random

import pytest
import torch

from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.designs import DESIGNS
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload, chunk_cache_bytes, host_kv_bytes, max_batch, memory_breakdown
from ddbench.kernels.engine.chunkcache import CacheShape, ChunkCache
from ddbench.kernels.engine.engine import Engine, EngineConfig, plan_bytes
from ddbench.kernels.engine.model import Weights
from ddbench.kernels.layout import alloc_host_kv
from tests.test_engine_pipeline import TINY, reference_output

CACHE = DESIGNS["dualdecoder-cache"]


class TwinLRU:
    """One (layer, request, KV head): `slots` chunk slots, the device fill's rule written plainly."""

    def __init__(self, slots):
        self.age, self.chunk, self.where = [-1] * slots, [-1] * slots, {}

    def fill(self, ids, stamp):
        hits = [c in self.where for c in ids]
        for c, h in zip(ids, hits):
            if h:
                self.age[self.where[c]] = stamp
        order = sorted(range(len(self.age)), key=lambda s: (self.age[s], s))
        r, slots, fetched = 0, [], []
        for c, h in zip(ids, hits):
            if h:
                slots.append(self.where[c])
                continue
            s = order[r]
            r += 1
            if self.chunk[s] >= 0:
                del self.where[self.chunk[s]]
            self.chunk[s], self.age[s], self.where[c] = c, stamp, s
            slots.append(s)
            fetched.append((c, s))
        return slots, fetched


@pytest.mark.parametrize("slots", [8, 12, 32])
def test_fill_matches_the_twin(slots):
    rnd = random.Random(slots)
    B, H, N, k, L = 2, 3, 40, 8, 2
    c = ChunkCache(CacheShape(L, B, H, N, slots, 4, 8, 4, k), "cpu", torch.float32)
    twins = {(l, b, h): TwinLRU(slots) for l in range(L) for b in range(B) for h in range(H)}
    hot = list(range(12))                       # chunks that come back: the cache has something to keep
    for step in range(12):
        for layer in range(L):
            for kind, stamp in (("prefetch", 2 * step), ("urgent", 2 * step + 1)):
                ids = torch.tensor([[rnd.sample(hot if rnd.random() < 0.6 else range(N), k) for _ in range(H)]
                                    for _ in range(B)], dtype=torch.int32)
                plan, slot = c.fill(layer, ids, torch.tensor([stamp], dtype=torch.int32), kind=kind)
                items = set()
                for b in range(B):
                    for h in range(H):
                        want, fetched = twins[layer, b, h].fill(ids[b, h].tolist(), stamp)
                        assert slot[b, h].tolist() == want
                        items |= {(b * H + h, ch, s) for ch, s in fetched}
                n = int(plan.count)
                got = set(zip(plan.bh[:n].tolist(), plan.chunk[:n].tolist(), plan.slot[:n].tolist()))
                assert n == len(items) and got == items
                assert (c.slot_of[layer, :, :, :N] >= 0).sum() <= B * H * slots


def test_a_cache_smaller_than_the_selection_is_refused():
    with pytest.raises(DDBenchError, match="cannot hold"):
        ChunkCache(CacheShape(1, 1, 1, 64, 4, 8, 8, 8, 8), "cpu", torch.float32)


def _engine(cache_tokens, miss_rate, churn, seed=0, design=CACHE, **switches):
    g = torch.Generator().manual_seed(seed)
    host = alloc_host_kv(3, 2, 2, 32, 8, 32, dtype=torch.float32)
    host.copy_(torch.randn(host.shape, generator=g))
    w = Weights.random(TINY, "cpu", seed, dtype=torch.float32)
    cfg = EngineConfig.of(context=256, batch=2, budget=64, local_chunks=1, gen_tokens=8, rank=16,
                          miss_rate=miss_rate, churn_rate=churn, cache_tokens=cache_tokens, seed=seed, **switches)
    return Engine(TINY, design, cfg, w, "cpu", host_kv=host, ref=True, debug=True, log=True), host


@pytest.mark.parametrize("cache_tokens", [64, 128, 256])
@pytest.mark.parametrize("miss_rate,churn", [(0.25, 0.25), (0.5, 0.0), (None, None)])
@pytest.mark.parametrize("design", ["dualdecoder-cache", "lru-cache"])
def test_attention_is_over_exactly_the_true_selection(cache_tokens, miss_rate, churn, design):
    """Six steps (the cache fills and evicts): every layer's attention equals attention over its true
    chunks gathered from the host into poisoned buffers; the rows read are the true chunks' slots.
    lru-cache (no prediction): its forced misses are drawn against its own last selection."""
    e, host = _engine(cache_tokens, miss_rate, churn, design=DESIGNS[design])
    for _ in range(6):
        e.step()
    C = e.C
    for rec in e.debug:
        ref = reference_output(e, rec, host)
        assert not ref.isnan().any()
        torch.testing.assert_close(rec["out"], ref, rtol=1e-4, atol=1e-5)
        kC = rec["true"].shape[-1] * C
        phys = rec["rows"][:, :, :kC].long()
        layer = rec["layer"]
        want = host[layer % host.shape[0]][torch.arange(e.B)[:, None, None], torch.arange(e.H)[None, :, None],
                                            rec["true"].long()]                    # [B, H, k, 2, C, d]
        got_k = rec["kb"].gather(2, phys[..., None].expand(-1, -1, -1, e.d))
        assert torch.equal(got_k, want[:, :, :, 0].reshape(e.B, e.H, kC, e.d))


@pytest.mark.parametrize("cache_tokens", [64, 128])
@pytest.mark.parametrize("design", ["dualdecoder-cache", "lru-cache"])
def test_moved_chunks_are_the_twins_replay(cache_tokens, design):
    """The engine's urgent and prefetched chunk counts over a run (the pre-decoding step and 6 steps) are
    the Python twin's replay of the same selections, layer by layer: pre-decoding fills the true chunks
    (stamp 1), decode step j the predicted (2j) then the true ones (2j + 1). Layers 0 and 1 are
    prefetched a step ahead (after the last two layers' attention), so the engine's counts there
    include the next step's too. A larger cache moves fewer chunks. lru-cache prefetches nothing: its
    every miss is urgent."""
    moved = {}
    spec = DESIGNS[design]
    for ct in (cache_tokens, 4 * cache_tokens):
        e, _ = _engine(ct, 0.25, None if spec.prefetch == "none" else 0.25, seed=1, design=spec)
        pf, ur = [0] * e.L, [0] * e.L
        for _ in range(7):
            e.step()
            for n, (layer, _) in zip(e.stats.prefetch_items, e.stats.prefetch_layer):
                pf[layer] += int(n)
            for n, (layer, _) in zip(e.stats.urgent_counts, e.stats.urgent_layer):
                ur[layer] += int(n)
        twins = {}
        tpf, tur = [0] * e.L, [0] * e.L
        for rec in e.debug:
            j, layer = rec["step"], rec["layer"]
            for b in range(e.B):
                for h in range(e.H):
                    tw = twins.setdefault((layer, b, h), TwinLRU(e.cache.S))
                    if rec["pred"] is not None:
                        tpf[layer] += len(tw.fill(rec["pred"][b, h].tolist(), 2 * j)[1])
                    tur[layer] += len(tw.fill(rec["true"][b, h].tolist(), 2 * j + 1)[1])
        assert ur == tur
        assert pf[2:] == tpf[2:] and all(a >= b for a, b in zip(pf, tpf))
        if spec.prefetch == "none":
            assert sum(pf) == 0 and not e.stats.prefetch_items and sum(ur) > 0
        moved[ct] = sum(tpf) + sum(tur)
    assert moved[4 * cache_tokens] < moved[cache_tokens]


def test_memory_model_counts_the_cache():
    m, g = get_model("llama-3-8b"), get_gpu("h200")
    dd, dc = DESIGNS["dualdecoder"], CACHE
    w = Workload(context=131072, batch=4, cache_tokens=4096)
    assert host_kv_bytes(dc, m, w) == host_kv_bytes(dd, m, Workload(context=131072, lowrank_layers=0)) == 16 * 2 ** 30
    per = chunk_cache_bytes(dc, m, w)
    assert per == 4 * 32 * 8 * (4096 * 2 * 128 * 2 + 16385 * 2 + 513 * 8)     # map and slots with a sink each
    bd = memory_breakdown(dc, m, g, w)
    assert bd.landmarks == memory_breakdown(dd, m, g, w).landmarks
    assert max_batch(dc, m, g, w) < max_batch(dd, m, g, w)
    assert max_batch(dc, m, g, Workload(context=131072, cache_tokens=8192)) < max_batch(dc, m, g, w)
    # beside the cache, as for every design's buffers, the attended resident rows (168 tokens, bf16), and
    # the selections (this step's and the prediction), the row map and two fill plans: the engine's plan
    tail = 2 * 32 * 4 * 8 * (168 * 128 * 2)
    ids, rows, plans = 2 * 32 * 4 * 8 * 256 * 4, 4 * 8 * 2216 * 4, 2 * ((3 * (4 * 8 * 256 + 1) + 1) * 4 + 4 * 8 * 256 * 4)
    assert bd.sparse_kv_buffers == per + tail + ids + rows + plans
    cfg = EngineConfig.of(context=131072, batch=4, cache_tokens=4096)
    assert plan_bytes(m, dc, cfg)["sparse_kv_buffers"] == bd.sparse_kv_buffers


@pytest.mark.parametrize("tokens,word", [(1024, "at least the budget"), (4100, "multiple of the chunk"),
                                         (2 ** 24, "leaves no room")])
def test_bad_cache_is_one_line(tokens, word):
    with pytest.raises(DDBenchError, match=word):
        memory_breakdown(CACHE, get_model("llama-3-8b"), get_gpu("h100-80gb"),
                         Workload(context=131072, cache_tokens=tokens))


def test_cache_only_misses_are_the_forced_rate():
    """lru-cache at a forced miss rate m: each step's selection is the last one's with round(m*k) chunks new;
    the new ones the cache lacks (most of them: drawn from the whole context) are urgent, nothing else."""
    e, _ = _engine(128, 0.25, None, seed=2, design=DESIGNS["lru-cache"])
    m = round(0.25 * e.kc) * e.B * e.H
    for step in range(6):
        e.step()
        counts = [int(n) for n in e.stats.urgent_counts]
        assert len(counts) == e.L
        if step >= 1:
            assert all(m // 2 <= n <= m for n in counts), (step, counts, m)


def test_the_yield_and_split_switches_change_no_result():
    """The twins' engine with yield_prefetch and rows_two_waves on (the defaults) and off: the yield (each
    urgent fetch raises a flag that the prefetch gathers poll) changes when work runs, never what, and the
    split count is the Triton attention's alone (tests/test_engine_gpu.py checks both there). So the same
    tokens, moved chunks and attention outputs; the flag is down after every step."""
    runs = []
    for switches in (dict(yield_prefetch=False, rows_two_waves=False), {}):      # off, and the defaults (on)
        e, _ = _engine(128, 0.25, 0.25, seed=3, **switches)
        toks = [e.step().clone() for _ in range(4)]
        runs.append((e, toks, [int(n) for n in e.stats.prefetch_items], [int(n) for n in e.stats.urgent_counts]))
    (plain, t0, pf0, ur0), (sw, t1, pf1, ur1) = runs
    assert not plain.yield_kw and int(sw.yield_kw["yielding"].flag) == 0
    assert all(torch.equal(a, b) for a, b in zip(t0, t1)) and pf0 == pf1 and ur0 == ur1 and sum(pf0) > 0
    assert all(torch.equal(a["out"], b["out"]) for a, b in zip(plain.debug, sw.debug))
