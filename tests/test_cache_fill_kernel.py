"""kernels/cachefill.py, the chunk cache's fill in one Triton launch, against its torch twin
(ChunkCache.fill + set_rows) on fresh random states: the maps, the ages, the slots' rows and the plan
(the same set of items; their order is the programs' atomics'). Runs in Triton's interpreter on the
CPU; the GPU suite runs it compiled."""

import random

import pytest
import torch

from ddbench.kernels.engine.chunkcache import CacheShape, ChunkCache

POISON = -7


def _pair(L, B, H, N, slots, C, k, device):
    shape = CacheShape(L, B, H, N, slots, C, 4, 3, k)
    mk = lambda fused: ChunkCache(shape, device, torch.float32, fused=fused)   # noqa: E731
    return mk(False), mk(True)


def _ids(rnd, B, H, N, k, hot, device):
    rows = [[sorted(rnd.sample(hot if rnd.random() < 0.6 else range(N), k)) for _ in range(H)] for _ in range(B)]
    return torch.tensor(rows, dtype=torch.int32, device=device)


def _items(plan):
    n = int(plan.count.item())
    return sorted(zip(plan.bh[:n].tolist(), plan.chunk[:n].tolist(), plan.slot[:n].tolist()))


def _poison(cache, kinds, k):
    for kind in kinds:
        p = cache._plan(kind, k)
        for t in (p.bh, p.chunk, p.slot, p.assembled):
            t.fill_(POISON)
        p.count.fill_(12345)
    cache.rows[:, :, :k * cache.C].fill_(POISON)


@pytest.mark.parametrize("slots,k,C", [(8, 8, 4), (12, 8, 8), (37, 16, 2), (64, 16, 8)])
def test_fused_fill_is_the_twin(slots, k, C, device="cpu"):
    rnd = random.Random(slots * 31 + k)
    L, B, H, N = 2, 2, 3, 3 * slots + 5
    twin, fused = _pair(L, B, H, N, slots, C, k, device)
    hot = rnd.sample(range(N), min(N, slots + k // 2))
    step = torch.zeros(1, dtype=torch.int32, device=device)
    for t in range(5):          # 5 steps x 2 layers x 2 fills: every cache here is full and evicting by step 3
        step.fill_(t)
        for layer in range(L):
            for kind, add, rows in (("prefetch", 0, False), ("urgent", 1, True)):
                ids = _ids(rnd, B, H, N, k, hot, device)
                _poison(fused, (kind,), k)
                p0, r0 = twin.fill_rows(layer, ids, step, mul=2, add=add, kind=kind, rows=rows)
                p1, r1 = fused.fill_rows(layer, ids, step, mul=2, add=add, kind=kind, rows=rows)
                for a, b in ((twin.slot_of, fused.slot_of), (twin.chunk_of, fused.chunk_of), (twin.age, fused.age)):
                    assert torch.equal(a[:, :, :, :-1], b[:, :, :, :-1]), (t, layer, kind)
                assert int(p0.count) == int(p1.count)
                assert _items(p0) == _items(p1)
                assert torch.equal(p0.assembled, p1.assembled)
                if rows:
                    assert torch.equal(r0[:, :, :k * C], r1[:, :, :k * C])
                    assert torch.equal(r0, r1)          # the tail rows stay as set


def test_fused_fill_reads_strided_ids():
    """The engine hands a layer's slice of [L, B, H, k] and top-k outputs: only the last dim is contiguous."""
    rnd = random.Random(5)
    twin, fused = _pair(1, 2, 2, 50, 16, 4, 8, "cpu")
    big = torch.stack([_ids(rnd, 2, 2, 50, 8, list(range(20)), "cpu") for _ in range(3)], 2)   # [B, H, 3, k]
    ids = big[:, :, 1]
    assert not ids.is_contiguous()
    stamp = torch.ones(1, dtype=torch.int32)
    p0, r0 = twin.fill_rows(0, ids, stamp, rows=True)
    p1, r1 = fused.fill_rows(0, ids, stamp, rows=True)
    assert _items(p0) == _items(p1) and torch.equal(r0, r1) and torch.equal(twin.slot_of, fused.slot_of)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fused_fill_ages_saturate_as_the_twin(device):
    """Slots untouched for more than AGE_WINDOW stamps tie and go in slot order, in both fills; within the
    window the least recently touched go first, including an age ahead of the stamp (a layer-ahead prefetch)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rnd = random.Random(11)
    twin, fused = _pair(1, 2, 2, 64, 16, 4, 8, device)
    stamp = torch.zeros(1, dtype=torch.int32, device=device)
    W = twin.AGE_WINDOW
    for st in (3, 1, 2, W + 2, W + 5, W + 9, 2 * W, 2 * W + 7, 2 * W + 6):
        stamp.fill_(st)
        ids = _ids(rnd, 2, 2, 64, 8, list(range(40)), device)
        p0, r0 = twin.fill_rows(0, ids, stamp, rows=True)
        p1, r1 = fused.fill_rows(0, ids, stamp, rows=True)
        for a, b in ((twin.slot_of, fused.slot_of), (twin.chunk_of, fused.chunk_of), (twin.age, fused.age)):
            assert torch.equal(a[..., :-1], b[..., :-1]), st
        assert _items(p0) == _items(p1) and torch.equal(r0, r1)
    age = torch.tensor([0, 5, 2 * W, 2 * W + 3, 2 * W + 20, -1], dtype=torch.int32)
    key = ChunkCache.age_key(age, torch.tensor(2 * W + 10, dtype=torch.int32))
    assert key.tolist() == [0, 0, W - 10, W - 7, W + 10, 0]       # the three oldest tie; the future one last


def test_fused_fill_refuses_int64_ids():
    _, fused = _pair(1, 1, 1, 20, 8, 4, 4, "cpu")
    with pytest.raises(ValueError, match="int32"):
        fused.fill_rows(0, torch.zeros(1, 1, 4, dtype=torch.int64), torch.zeros(1, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("slots,k,C", [(1024, 256, 8), (2048, 256, 8), (300, 64, 8)])
def test_fused_fill_is_the_twin_on_the_gpu(slots, k, C):
    """Compiled, at the engine's shapes (4x and 8x the 2048-token budget's 256 chunks)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rnd = random.Random(slots)
    L, B, H, N = 1, 3, 8, 4 * slots
    twin, fused = _pair(L, B, H, N, slots, C, k, "cuda")
    hot = rnd.sample(range(N), slots + k // 2)
    step = torch.zeros(1, dtype=torch.int32, device="cuda")
    for t in range(8):
        step.fill_(t)
        for kind, add, rows in (("prefetch", 0, False), ("urgent", 1, True)):
            ids = _ids(rnd, B, H, N, k, hot, "cuda")
            _poison(fused, (kind,), k)
            p0, r0 = twin.fill_rows(0, ids, step, mul=2, add=add, kind=kind, rows=rows)
            p1, r1 = fused.fill_rows(0, ids, step, mul=2, add=add, kind=kind, rows=rows)
            for a, b in ((twin.slot_of, fused.slot_of), (twin.chunk_of, fused.chunk_of), (twin.age, fused.age)):
                assert torch.equal(a[..., :-1], b[..., :-1]), (t, kind)
            assert _items(p0) == _items(p1) and torch.equal(p0.assembled, p1.assembled)
            if rows:
                assert torch.equal(r0, r1)
