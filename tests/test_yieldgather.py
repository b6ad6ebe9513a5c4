"""The yielding prefetch gather and the sliced prefetch (kernels/yieldgather.py): the same bytes as the plain
gather (gather_uva) and its twin, whatever the flag does; the wait is bounded (a flag that is never lowered
delays a launch by its budget of polls, then the launch ends). In Triton's CPU interpreter a launch runs to
its end before the next operation, so the flag holds still through it; the GPU tests lower it mid-launch."""

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.fp8 import quantize_host_kv
from ddbench.kernels.gather import gather_ref, gather_uva
from ddbench.kernels.layout import alloc_host_kv
from ddbench.kernels.yieldgather import (YieldFlag, gather_sliced, gather_yielding, gather_yielding_ref, lower_flag,
                                         prefetch_slices, raise_flag)

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
SENTINEL = -7


def _host(kind, L, B, H, N, C, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = alloc_host_kv(L, B, H, N, C, d, dtype=torch.bfloat16, pin=False)
    x.copy_((torch.randn(x.shape, generator=g) * (0.5 + torch.rand(x.shape[:5] + (1, 1), generator=g) * 4))
            .to(torch.bfloat16))
    assert (x != 0).float().mean() > 0.99
    if kind == "bf16":
        return (x.pin_memory() if GPU else x), None
    q, s = quantize_host_kv(x)
    return (q.pin_memory(), s.pin_memory()) if GPU else (q, s)


def _ids(B, H, N, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, H, N, generator=g).argsort(-1)[..., :n].int().to(DEV)


def _poison(B, H, S, d):
    return torch.full((B, H, S, d), float("nan"), dtype=torch.bfloat16, device=DEV)


def _same(a, b):
    """The same NaN pattern (the poison) and the same values, bit for bit."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _close(a, b):
    """Against the torch twin: exact on the GPU; within one bf16 ulp in the interpreter (it truncates fp32)."""
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    a, b = a.nan_to_num().float(), b.nan_to_num().float()
    return torch.equal(a, b) if GPU else bool(((a - b).abs() <= b.abs() * 2 ** -7).all())


def _flag(value):
    return torch.full((1,), value, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("kind,programs,items,held,seed", [("fp8", 3, 2, 0, 1), ("fp8", 64, 8, 1, 2),
                                                          ("bf16", 5, 4, 1, 3), ("bf16", 2, 1, 0, 4)])
def test_yielding_gather_writes_the_plain_gathers_bytes(kind, programs, items, held, seed):
    B, H, N, n, C, d, off = 2, 3, 16, 5, 8, 16, 4
    q, s = _host(kind, 2, B, H, N, C, d, seed)
    idx = _ids(B, H, N, n, seed + 10)
    k, v, kp, vp, kr, vr = (_poison(B, H, 48, d) for _ in range(6))
    polls = torch.full((programs + 3,), SENTINEL, dtype=torch.int32, device=DEV)
    want = torch.full_like(polls, SENTINEL)
    flag = _flag(held)
    grid = gather_yielding(q, 1, idx, k, v, YieldFlag(flag, 5, polls), slot_offset=off, programs=programs,
                           items=items, scales=s)
    gather_uva(q, 1, idx, kp, vp, slot_offset=off, programs=programs, items=items, scales=s)
    assert gather_yielding_ref(q, 1, idx, kr, vr, YieldFlag(flag, 5, want), slot_offset=off, programs=programs,
                               items=items, scales=s) == grid
    assert _same(k, kp) and _same(v, vp) and _close(k, kr) and _close(v, vr)
    body = slice(off, off + n * C)
    assert not k[:, :, body].isnan().any() and not v[:, :, body].isnan().any()
    assert k[:, :, :off].isnan().all() and v[:, :, off + n * C:].isnan().all()      # nothing outside the slots
    assert grid == min(programs, -(-B * H * n // items))
    assert torch.equal(polls, want)                  # a held flag: every program spent its 5 polls, then fetched
    assert (polls[:grid] == 5 * held).all() and (polls[grid:] == SENTINEL).all()
    assert int(flag.item()) == held                  # the gather only reads the flag


def test_yielding_gather_values_only_and_no_polls():
    B, H, N, n, C, d = 2, 2, 20, 6, 8, 16
    q, s = _host("fp8", 1, B, H, N, C, d, seed=7)
    idx = _ids(B, H, N, n, 8)
    v, vp = _poison(B, H, n * C, d), _poison(B, H, n * C, d)
    gather_yielding(q, 0, idx, None, v, YieldFlag(_flag(1), spin=3), scales=s)
    gather_uva(q, 0, idx, None, vp, scales=s)
    assert _same(v, vp) and not v.isnan().any()


@pytest.mark.parametrize("kind,n,slices", [("fp8", 8, 4), ("fp8", 7, 3), ("bf16", 5, 5), ("bf16", 6, 1)])
def test_sliced_prefetch_writes_one_launchs_bytes(kind, n, slices):
    B, H, N, C, d, off = 2, 2, 24, 8, 16, 8
    q, s = _host(kind, 2, B, H, N, C, d, seed=20 + n)
    idx = _ids(B, H, N, n, 30 + slices)
    parts = prefetch_slices(idx, slices, C)
    assert len(parts) == slices and torch.equal(torch.cat([p for _, p in parts], dim=2), idx)
    assert [o for o, _ in parts] == [sum(p.shape[2] for _, p in parts[:i]) * C for i in range(slices)]
    assert all(p.is_contiguous() and p.dtype == torch.int32 for _, p in parts)
    S = off + n * C + 8
    k, v, kp, vp, kr, vr = (_poison(B, H, S, d) for _ in range(6))
    gather_sliced(q, 1, parts, k, v, slot_offset=off, scales=s, programs=3, items=2)
    gather_uva(q, 1, idx, kp, vp, slot_offset=off, scales=s, programs=3, items=2)
    gather_ref(q, 1, idx, kr, vr, slot_offset=off, scales=s)
    assert _same(k, kp) and _same(v, vp) and _close(k, kr) and _close(v, vr)
    assert not v[:, :, off:off + n * C].isnan().any() and v[:, :, off + n * C:].isnan().all()


def test_flag_helpers_and_bad_inputs():
    B, H, N, n, C, d = 1, 2, 16, 4, 8, 16
    q, s = _host("fp8", 1, B, H, N, C, d, seed=40)
    idx = _ids(B, H, N, n, 41)
    k, v = _poison(B, H, n * C, d), _poison(B, H, n * C, d)
    flag = _flag(5)
    lower_flag(flag)
    assert int(flag.item()) == 0
    raise_flag(flag)
    assert int(flag.item()) == 1
    bad = [dict(flag=torch.zeros(1, dtype=torch.int64, device=DEV)), dict(flag=torch.zeros(2, dtype=torch.int32, device=DEV)),
           dict(polls=torch.zeros(3, dtype=torch.int32, device=DEV)), dict(spin=-1), dict(spin=2.5), dict(programs=0)]
    for kw in bad:
        args = dict(flag=flag, programs=4, polls=None, spin=4) | kw
        with pytest.raises(DDBenchError):
            yielding = YieldFlag(args.pop("flag"), args.pop("spin"), args.pop("polls"))
            gather_yielding(q, 0, idx, k, v, yielding, scales=s, **args)
    assert k.isnan().all()                           # nothing launched
    for sl in (0, n + 1, 1.5):
        with pytest.raises(DDBenchError, match="slices"):
            prefetch_slices(idx, sl, C)
    with pytest.raises(DDBenchError, match="idx"):
        prefetch_slices(idx[0], 2, C)


def _gpu_case(seed):
    B, H, N, n, C, d = 8, 8, 256, 64, 8, 128
    q, s = _host("fp8", 1, B, H, N, C, d, seed)
    idx = _ids(B, H, N, n, seed + 1)
    bufs = [_poison(B, H, n * C, d) for _ in range(4)]
    gather_ref(q, 0, idx, bufs[2], bufs[3], scales=s)
    gather_yielding(q, 0, idx, bufs[0], bufs[1], YieldFlag(_flag(0)), scales=s)       # compile first
    bufs[0].fill_(float("nan"))
    bufs[1].fill_(float("nan"))
    return q, s, idx, bufs


@pytest.mark.gpu
def test_a_raised_flag_holds_the_prefetch_until_lowered_gpu():
    import time
    q, s, idx, (k, v, kr, vr) = _gpu_case(50)
    flag, polls = _flag(1), torch.full((32,), SENTINEL, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream(priority=0)
    # the check below, once before the launch: its allocations then come from the caching allocator's
    # blocks. A first allocation (cudaMalloc) waited for the whole device, so the check saw the launch's
    # writes after its whole budget of polls (0.7 s on the H200): the test failed so at ce61c94
    assert bool(k.isnan().all())
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        gather_yielding(q, 0, idx, k, v, YieldFlag(flag, 1 << 22, polls), scales=s)   # seconds at most
    time.sleep(0.05)
    held = not side.query()
    still_poisoned = bool(k.isnan().all())           # read on the default stream beside the waiting launch
    lower_flag(flag)
    side.synchronize()
    assert held and still_poisoned
    assert _same(k, kr) and _same(v, vr)
    assert (polls > 0).all()


@pytest.mark.gpu
def test_a_flag_never_lowered_delays_the_prefetch_by_its_budget_only_gpu():
    q, s, idx, (k, v, kr, vr) = _gpu_case(60)
    polls = torch.full((32,), SENTINEL, dtype=torch.int32, device="cuda")
    gather_yielding(q, 0, idx, k, v, YieldFlag(_flag(1), 1000, polls), scales=s)
    torch.cuda.synchronize()                         # ends: the budget is spent, the flag ignored
    assert _same(k, kr) and _same(v, vr)
    assert (polls == 1000).all()


@pytest.mark.parametrize("kind,held,values_only", [("bf16", 0, False), ("bf16", 1, True), ("fp8", 1, False)])
def test_yielding_slot_gather_writes_the_plain_ones_bytes(kind, held, values_only):
    """The chunk cache's prefetch gather with a yield flag (kernels/engine/transfer.gather_slots): whatever
    the flag holds, the same slots as without it and as its twin, and nothing else."""
    from ddbench.kernels.engine.transfer import gather_slots, gather_slots_ref, perturb, plan_misses
    B, H, N, n, C, d = 2, 3, 32, 6, 8, 16
    q, s = _host(kind, 2, B, H, N, C, d, seed=50 + held)
    g = torch.Generator().manual_seed(51)
    pred = torch.rand(B, H, N, generator=g).argsort(-1)[..., :n].sort(-1).values.int()
    plan = plan_misses(pred.to(DEV), perturb(pred, 0.5, N, g).to(DEV))
    outs = []
    for fn, kw in ((gather_slots, dict(yielding=YieldFlag(_flag(held), spin=3))), (gather_slots, {}), (gather_slots_ref, {})):
        k, v = _poison(B, H, n * C, d), _poison(B, H, n * C, d)
        fn(q, 1, plan, None if values_only else k, v, programs=3, items=2, scales=s, **kw)
        outs.append((k, v))
    (k, v), (kp, vp), (kr, vr) = outs
    assert _same(k, kp) and _same(v, vp) and _close(k, kr) and _close(v, vr)
    assert int((~v.isnan()).sum()) == int(plan.count) * C * d and int(plan.count) > 0
    with pytest.raises(DDBenchError, match="flag"):
        gather_slots(q, 1, plan, k, v, scales=s, yielding=YieldFlag(torch.zeros(1, dtype=torch.int64, device=DEV)))
