"""UVA gather from the host KV layout, its reuse mode and the Figure 19 baselines, against the twin."""

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.gather import gather_cpu_staging, gather_per_chunk, gather_ref, gather_uva
from ddbench.kernels.indexsets import index_overlap, reuse_plan
from ddbench.kernels.layout import alloc_host_kv


def _case(B, H, N, n, C, d, dtype, dev, seed):
    g = torch.Generator().manual_seed(seed)
    host = alloc_host_kv(2, B, H, N, C, d, dtype=dtype)
    host.copy_(torch.randn(host.shape, generator=g).to(dtype))
    idx = torch.rand(B, H, N, generator=g).argsort(-1)[..., :n].int().to(dev)
    return host, idx


def _poisoned(B, H, S, d, dtype, dev):
    return torch.full((B, H, S, d), float("nan"), dtype=dtype, device=dev)


def _run(host, idx, S, off, dev, **kw):
    B, H, d, dtype = host.shape[1], host.shape[2], host.shape[6], host.dtype
    k, v, kr, vr = (_poisoned(B, H, S, d, dtype, dev) for _ in range(4))
    gather_uva(host, 1, idx, k, v, slot_offset=off, **kw)
    gather_ref(host, 1, idx, kr, vr, slot_offset=off, **kw)
    return k, v, kr, vr


@pytest.mark.parametrize("programs,items", [(3, 2), (1, 1), (64, 4)])
def test_gather_matches_ref_cpu(programs, items):
    host, idx = _case(2, 3, 16, 5, 8, 16, torch.float16, "cpu", seed=programs)
    k, v, kr, vr = _run(host, idx, 48, 4, "cpu", programs=programs, items=items)
    assert torch.equal(k[:, :, 4:44], kr[:, :, 4:44]) and torch.equal(v[:, :, 4:44], vr[:, :, 4:44])
    assert k[:, :, :4].isnan().all() and k[:, :, 44:].isnan().all()  # nothing outside the slots


def test_gather_values_only_cpu():
    host, idx = _case(2, 2, 12, 4, 8, 16, torch.float32, "cpu", seed=7)
    v, vr = _poisoned(2, 2, 32, 16, torch.float32, "cpu"), _poisoned(2, 2, 32, 16, torch.float32, "cpu")
    gather_uva(host, 0, idx, None, v)
    gather_ref(host, 0, idx, None, vr)
    assert torch.equal(v, vr) and not v.isnan().any()
    assert torch.equal(v[0, 1, 8:16], host[0, 0, 1, idx[0, 1, 1], 1])


def test_gather_reuse_cpu():
    B, H, N, n, C, d = 2, 3, 20, 6, 8, 16
    host, idx = _case(B, H, N, n, C, d, torch.float16, "cpu", seed=3)
    prev_idx = torch.rand(B, H, N, generator=torch.Generator().manual_seed(4)).argsort(-1)[..., :n].int()
    prev_idx[..., :2] = idx[..., 1:3]  # force some hits
    # previous buffers from a real gather of prev_idx: reuse must equal a plain gather
    pk, pv = _poisoned(B, H, n * C, d, torch.float16, "cpu"), _poisoned(B, H, n * C, d, torch.float16, "cpu")
    gather_uva(host, 1, prev_idx, pk, pv)
    k, v, kr, vr = _run(host, idx, n * C, 0, "cpu")
    k2, v2 = _poisoned(B, H, n * C, d, torch.float16, "cpu"), _poisoned(B, H, n * C, d, torch.float16, "cpu")
    src = gather_uva(host, 1, idx, k2, v2, prev=(prev_idx, pk, pv))
    assert (src >= 0).sum() >= B * H * 2
    assert torch.equal(k2, kr) and torch.equal(v2, vr)
    # random previous buffers: hits must come from them, not from the host
    rk, rv = torch.randn_like(pk), torch.randn_like(pv)
    k3, v3, k4, v4 = (_poisoned(B, H, n * C, d, torch.float16, "cpu") for _ in range(4))
    gather_uva(host, 1, idx, k3, v3, prev=(prev_idx, rk, rv))
    gather_ref(host, 1, idx, k4, v4, prev=(prev_idx, rk, rv))
    assert torch.equal(k3, k4) and torch.equal(v3, v4) and not torch.equal(k3, kr)


def test_reuse_plan_and_overlap():
    prev = torch.tensor([[[5, 1, 9, 3]]], dtype=torch.int32)
    cur = torch.tensor([[[1, 2, 3, 7]]], dtype=torch.int32)
    assert reuse_plan(prev, cur).tolist() == [[[1, -1, 3, -1]]]
    assert index_overlap(cur, prev).tolist() == [[0.5]]
    a = torch.rand(3, 4, 50).argsort(-1)[..., :10]
    assert torch.equal(index_overlap(a, a), torch.ones(3, 4))


def test_gather_rejects_bad_buffers():
    host, idx = _case(1, 2, 8, 4, 8, 16, torch.float16, "cpu", seed=0)
    k = _poisoned(1, 2, 16, 16, torch.float16, "cpu")
    with pytest.raises(DDBenchError):
        gather_uva(host, 0, idx, k, k.clone())  # 4 chunks of 8 tokens do not fit in 16 slots
    k, v = _poisoned(1, 2, 32, 16, torch.float16, "cpu"), _poisoned(1, 2, 32, 16, torch.float16, "cpu")
    with pytest.raises(DDBenchError):
        gather_uva(host, 0, idx, k, v, prev=(idx, k, v))  # reuse from the output itself
    with pytest.raises(DDBenchError):
        gather_uva(host, 2, idx, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("reuse", [False, True])
def test_gather_gpu(reuse):
    B, H, N, n, C, d = 4, 8, 512, 256, 8, 128
    host, idx = _case(B, H, N, n, C, d, torch.bfloat16, "cuda", seed=11)
    assert host.is_pinned()
    kw = {}
    if reuse:
        prev_idx = torch.rand(B, H, N, device="cuda").argsort(-1)[..., :n].int()
        prev_idx[..., ::2] = idx[..., ::2]
        kw["prev"] = (prev_idx, torch.randn(B, H, n * C, d, device="cuda", dtype=torch.bfloat16),
                      torch.randn(B, H, n * C, d, device="cuda", dtype=torch.bfloat16))
    k, v, kr, vr = _run(host, idx, n * C + 16, 16, "cuda", **kw)
    torch.cuda.synchronize()
    assert torch.equal(k[:, :, 16:], kr[:, :, 16:]) and torch.equal(v[:, :, 16:], vr[:, :, 16:])
    assert k[:, :, :16].isnan().all()


@pytest.mark.gpu
def test_gather_baselines_gpu():
    B, H, N, n, C, d = 2, 8, 256, 64, 8, 128
    host, idx = _case(B, H, N, n, C, d, torch.bfloat16, "cuda", seed=12)
    kr, vr = _poisoned(B, H, n * C, d, torch.bfloat16, "cuda"), _poisoned(B, H, n * C, d, torch.bfloat16, "cuda")
    gather_ref(host, 1, idx, kr, vr)
    stage = torch.empty(B * H * n, 2 * C * d, dtype=torch.bfloat16, pin_memory=True)
    dev_stage = torch.empty(B * H * n, 2 * C * d, dtype=torch.bfloat16, device="cuda")
    for fn, arg in ((gather_cpu_staging, idx.cpu()), (gather_per_chunk, idx.cpu().tolist())):
        k, v = _poisoned(B, H, n * C, d, torch.bfloat16, "cuda"), _poisoned(B, H, n * C, d, torch.bfloat16, "cuda")
        if fn is gather_cpu_staging:
            fn(host, 1, arg, stage, dev_stage, k, v)
        else:
            fn(host, 1, arg, dev_stage, k, v)
        torch.cuda.synchronize()
        assert torch.equal(k, kr) and torch.equal(v, vr), fn.__name__
