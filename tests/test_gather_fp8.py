"""fp8 host KV: the UVA gathers (kernels/gather.py, the engine's slot gather) dequantise e4m3 pieces with
their per-(chunk, KV head) scales into bf16 buffers. Tolerance: the kernels and their twins agree
exactly on the GPU (the same fp32 product, one round-to-nearest cast); Triton's CPU interpreter casts
fp32 to bf16 by truncation, so there within one bf16 ulp; against the bf16 source the error of a normal value is at
most REL_ERROR (2^-4) of its size plus the bf16 cast, and values far below the chunk's scale may flush."""

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.engine.transfer import gather_slots, gather_slots_ref, plan_misses
from ddbench.kernels.fp8 import E4M3, REL_ERROR, dequantized_layer, quantize_host_kv
from ddbench.kernels.gather import gather_ref, gather_uva
from ddbench.kernels.layout import alloc_host_kv, host_kv_view

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"


def _host(L, B, H, N, C, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = alloc_host_kv(L, B, H, N, C, d, dtype=torch.bfloat16, pin=False)
    x.copy_((torch.randn(x.shape, generator=g) * torch.rand(x.shape[:5] + (1, 1), generator=g) * 4).to(torch.bfloat16))
    q, s = quantize_host_kv(x)
    if GPU:
        q, s = q.pin_memory(), s.pin_memory()
    return x, q, s


def _poison(*shape):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=DEV)


def _same(a, b):
    """Equal NaN pattern (the poison) and values: exactly on the GPU, within one bf16 ulp in the interpreter."""
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    a, b = a.nan_to_num().float(), b.nan_to_num().float()
    return torch.equal(a, b) if GPU else bool(((a - b).abs() <= b.abs() * 2 ** -7).all())


def _ids(B, H, N, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, H, N, generator=g).argsort(-1)[..., :n].int().to(DEV)


@pytest.mark.parametrize("programs,items", [(3, 2), (64, 8)])
def test_fp8_gather_matches_twin_and_source(programs, items):
    B, H, N, n, C, d = 2, 3, 16, 5, 8, 16
    x, q, s = _host(2, B, H, N, C, d, seed=programs)
    idx = _ids(B, H, N, n, seed=1)
    k, v, kr, vr = (_poison(B, H, 48, d) for _ in range(4))
    gather_uva(q, 1, idx, k, v, slot_offset=4, scales=s, programs=programs, items=items)
    gather_ref(q, 1, idx, kr, vr, slot_offset=4, scales=s)
    body = slice(4, 4 + n * C)
    assert _same(k, kr) and _same(v, vr)
    assert k[:, :, :4].isnan().all() and v[:, :, 4 + n * C:].isnan().all()      # nothing outside the slots
    # against the bf16 source: chunk j of (b, h) is chunk idx[b, h, j]
    src = x[1][torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], idx.cpu().long()]   # [B, H, n, 2, C, d]
    ref_k = src[:, :, :, 0].reshape(B, H, n * C, d).float()
    amax = src[:, :, :, 0].abs().amax(dim=(-1, -2), keepdim=True).float().expand(-1, -1, -1, C, d).reshape(B, H, n * C, d)
    err = (k[:, :, body].float().cpu() - ref_k).abs()
    assert (err <= ref_k.abs() * (REL_ERROR + 2 ** -7) + amax * 2 ** -9).all()


def test_fp8_gather_values_only_and_reuse():
    B, H, N, n, C, d = 2, 2, 20, 6, 8, 16
    _, q, s = _host(1, B, H, N, C, d, seed=5)
    idx, prev_idx = _ids(B, H, N, n, 2), _ids(B, H, N, n, 3)
    prev_idx[..., :2] = idx[..., 1:3]
    pk, pv = _poison(B, H, n * C, d), _poison(B, H, n * C, d)
    gather_uva(q, 0, prev_idx, pk, pv, scales=s)
    v, vr = _poison(B, H, n * C, d), _poison(B, H, n * C, d)
    gather_uva(q, 0, idx, None, v, scales=s)
    gather_ref(q, 0, idx, None, vr, scales=s)
    assert _same(v, vr) and not v.isnan().any()
    k2, v2 = _poison(B, H, n * C, d), _poison(B, H, n * C, d)
    src = gather_uva(q, 0, idx, k2, v2, prev=(prev_idx, pk, pv), scales=s)
    assert (src >= 0).sum() >= B * H * 2
    k3, v3 = _poison(B, H, n * C, d), _poison(B, H, n * C, d)
    gather_uva(q, 0, idx, k3, v3, scales=s)
    assert torch.equal(k2, k3) and torch.equal(v2, v3)      # hits from HBM equal what the link brings


def test_fp8_slot_gather_matches_twin():
    B, H, N, k, C, d = 2, 3, 24, 6, 8, 16
    _, q, s = _host(2, B, H, N, C, d, seed=9)
    pred, true = _ids(B, H, N, k, 4), _ids(B, H, N, k, 5)
    true[..., :3] = pred[..., 2:5]
    plan = plan_misses(pred, true)
    ko, vo, kr, vr = (_poison(B, H, k * C + 8, d) for _ in range(4))
    gather_slots(q, 1, plan, ko, vo, scales=s, programs=5)
    gather_slots_ref(q, 1, plan, kr, vr, scales=s)
    assert _same(ko, kr) and _same(vo, vr) and (~vo.isnan()).sum() > 0


def aliased_fp8_host(L, B, H, N, C, d):
    """(view, flat e4m3, scales): an fp8 host KV with room for 2 requests' layer, not B = 3, so host_kv_view
    aliases its layers and requests (pinned on a GPU)."""
    x = torch.randn(2 * H * N * 2 * C * d).to(torch.bfloat16)
    q, s = quantize_host_kv(x.view(-1, 2, C, d))
    q = q.view(-1)
    if GPU:
        q, s = q.pin_memory(), s.pin_memory()
    view, alias = host_kv_view(q, L, B, H, N, C, d)
    assert alias == "layers+requests" and view.dtype == E4M3
    return view, q, s


def test_fp8_scales_follow_an_aliased_view():
    """host_kv_view's aliased requests: each view piece finds its own scale (one per C*d of storage)."""
    L, B, H, N, C, d = 4, 3, 2, 8, 8, 16
    view, q, s = aliased_fp8_host(L, B, H, N, C, d)
    deq = dequantized_layer(view, 0, s, torch.float32)
    plain = (q.float().view(-1, C, d) * s[:, None, None]).view(-1)
    for b in range(B):
        off = view[0, b].storage_offset()
        assert torch.equal(deq[b].reshape(-1), plain[off:off + H * N * 2 * C * d])
    idx = _ids(B, H, N, 3, 6)
    k, v, kr, vr = (_poison(B, H, 24, d) for _ in range(4))
    gather_uva(view, 0, idx, k, v, scales=s)
    gather_ref(view, 0, idx, kr, vr, scales=s)
    assert _same(k, kr) and _same(v, vr) and not k.isnan().any()


def test_fp8_gather_rejects_bad_inputs():
    B, H, N, C, d = 1, 2, 8, 8, 16
    x, q, s = _host(1, B, H, N, C, d, seed=2)
    idx = _ids(B, H, N, 2, 1)
    k, v = _poison(B, H, 16, d), _poison(B, H, 16, d)
    with pytest.raises(DDBenchError, match="needs its scales"):
        gather_uva(q, 0, idx, k, v)
    with pytest.raises(DDBenchError, match="at least"):
        gather_uva(q, 0, idx, k, v, scales=s[:3])
    with pytest.raises(DDBenchError, match="belong to an fp8"):
        gather_ref(x if not GPU else x.pin_memory(), 0, idx, k, v, scales=s)
    with pytest.raises(DDBenchError, match="bf16/fp16/fp32"):
        gather_uva(q, 0, idx, k.to(torch.int16), v.to(torch.int16), scales=s)
    bad = x.clone()
    bad[0, 0, 1, 3, 1, 2, 5] = float("inf")
    with pytest.raises(DDBenchError, match="inf or NaN"):
        quantize_host_kv(bad)


def test_launch_items_keep_fp8_pieces_in_flight():
    from ddbench.kernels.gather import launch_items
    q = torch.empty(1, dtype=E4M3)
    b = torch.empty(1, dtype=torch.bfloat16)
    assert [launch_items(None, p, q) for p in (32, 64, 132, 5)] == [8, 4, 2, 32]
    assert launch_items(None, 32, b) == 2 and launch_items(4, 32, q) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA")
def test_fp8_kernels_on_the_gpu():
    """The fp8 cases above with the compiled kernels (they run through the interpreter on a CPU)."""
    test_fp8_gather_matches_twin_and_source(32, 8)
    test_fp8_gather_values_only_and_reuse()
    test_fp8_slot_gather_matches_twin()
    test_fp8_scales_follow_an_aliased_view()
