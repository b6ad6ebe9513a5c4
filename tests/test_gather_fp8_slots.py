"""fp8 slots (an fp8 GPU chunk cache): the slot gather copies an fp8 host KV's e4m3 bytes as they are and
its pieces' scales into the slots' scales [B, H, slots]. The kernel (interpreter on the CPU) against its
twin and against the host itself, poisoned outputs, an aliased host view, and the one-line refusals."""

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.engine.transfer import gather_slots, gather_slots_ref, plan_misses
from ddbench.kernels.fp8 import E4M3, layer_scales, quantize_host_kv
from ddbench.kernels.layout import alloc_host_kv
from tests.test_gather_fp8 import aliased_fp8_host

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
POISON = 0x7F           # e4m3 NaN: a slot the gather does not write keeps it


def _host(L, B, H, N, C, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = alloc_host_kv(L, B, H, N, C, d, dtype=torch.bfloat16, pin=False)
    x.copy_((torch.randn(x.shape, generator=g) * torch.rand(x.shape[:5] + (1, 1), generator=g) * 4).to(torch.bfloat16))
    q, s = quantize_host_kv(x)
    return (q.pin_memory(), s.pin_memory()) if GPU else (q, s)


def _slots(B, H, S, C, d):
    """Poisoned e4m3 slots [B, H, S*C, d] and NaN scales [B, H, S]."""
    t = torch.full((B, H, S * C, d), POISON, dtype=torch.uint8, device=DEV).view(E4M3)
    return t, torch.full((B, H, S), float("nan"), device=DEV)


def _plan(B, H, N, k, seed):
    g = torch.Generator().manual_seed(seed)
    pred, true = (torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].int().to(DEV) for _ in range(2))
    true[..., :2] = pred[..., 1:3]                   # some hits: fewer misses than k
    return plan_misses(pred, true)


def _expect(q, s, layer, plan, B, H, C, d, S):
    """What the slots must hold, from the host directly: bytes and scales of every planned (b, h, chunk)."""
    kb, vb = (torch.full((B, H, S * C, d), POISON, dtype=torch.uint8) for _ in range(2))
    ks, vs = (torch.full((B, H, S), float("nan")) for _ in range(2))
    per = layer_scales(q, layer, s)
    n = int(plan.count)
    for bh, ch, sl in zip(plan.bh[:n].tolist(), plan.chunk[:n].tolist(), plan.slot[:n].tolist()):
        b, h = divmod(bh, H)
        piece = q[layer, b, h, ch].view(torch.uint8)                   # [2, C, d]
        kb[b, h, sl * C:(sl + 1) * C], vb[b, h, sl * C:(sl + 1) * C] = piece[0], piece[1]
        at = q[layer, b, h, ch].storage_offset() // (C * d) - q[layer].storage_offset() // (C * d)
        ks[b, h, sl], vs[b, h, sl] = per[at], per[at + 1]
    return kb, vb, ks, vs


def _check(q, s, layer, plan, B, H, C, d, S, programs=5):
    exp = _expect(q, s, layer, plan, B, H, C, d, S)
    for fn in (gather_slots, gather_slots_ref):
        (ko, kso), (vo, vso) = _slots(B, H, S, C, d), _slots(B, H, S, C, d)
        fn(q, layer, plan, ko, vo, scales=s, scale_out=(kso, vso), programs=programs)
        got = (ko.view(torch.uint8).cpu(), vo.view(torch.uint8).cpu(), kso.cpu(), vso.cpu())
        assert torch.equal(got[0], exp[0]) and torch.equal(got[1], exp[1]), fn.__name__
        assert torch.equal(got[2].isnan(), exp[2].isnan()) and torch.equal(got[2].nan_to_num(), exp[2].nan_to_num())
        assert torch.equal(got[3].nan_to_num(), exp[3].nan_to_num()) and int((~got[3].isnan()).sum()) == int(plan.count)


@pytest.mark.parametrize("programs", [3, 64])
def test_raw_slot_gather_copies_bytes_and_scales(programs):
    B, H, N, k, C, d = 2, 3, 24, 6, 8, 16
    q, s = _host(2, B, H, N, C, d, seed=programs)
    _check(q, s, 1, _plan(B, H, N, k, seed=programs), B, H, C, d, S=k + 2, programs=programs)


def test_raw_slot_gather_follows_an_aliased_view():
    """host_kv_view's aliased requests: each piece's scale is found by its storage offset, as the kernel's."""
    L, B, H, N, C, d = 4, 3, 2, 8, 8, 16
    view, _, s = aliased_fp8_host(L, B, H, N, C, d)
    _check(view, s, 0, _plan(B, H, N, 4, seed=3), B, H, C, d, S=5)


@pytest.mark.parametrize("fn", [gather_slots, gather_slots_ref])
def test_raw_slot_gather_refusals(fn):
    B, H, N, k, C, d = 1, 2, 16, 4, 8, 16
    q, s = _host(1, B, H, N, C, d, seed=1)
    plan = _plan(B, H, N, k, seed=2)
    (ko, kso), (vo, vso) = _slots(B, H, k, C, d), _slots(B, H, k, C, d)
    bf = torch.zeros(B, H, k * C, d, dtype=torch.bfloat16, device=DEV)
    host16 = q.float().to(torch.bfloat16)
    host16 = host16.pin_memory() if GPU else host16
    cases = [
        (lambda: fn(q, 0, plan, ko, vo, scales=s, scale_out=(None, vso)), "k_scale_out"),
        (lambda: fn(q, 0, plan, ko, vo, scales=s, scale_out=(kso, vso[..., :2])), "v_scale_out"),
        (lambda: fn(q, 0, plan, bf, bf, scales=s, scale_out=(kso, vso)), "belong to fp8 slots"),
        (lambda: fn(host16, 0, plan, ko, vo, scale_out=(kso, vso)), "fp8 host KV"),
    ]
    for call, words in cases:
        with pytest.raises(DDBenchError) as ei:
            call()
        assert words in str(ei.value) and "\n" not in str(ei.value)
