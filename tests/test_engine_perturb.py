"""The one-launch forced-miss draw (kernels/engine/transfer.py `perturb_fast`) against its exact torch
twin `perturb_fast_ref` (same uniforms, same strata): equal outputs on fresh random bases (ascending
top-k rows and unsorted rows), outputs poisoned first; and the contract: exactly round(rate*k) entries
of each (b, h) replaced, by distinct chunks outside the base, the kept entries in place, deterministic
given seed and salt, another seed or salt another draw."""

import pytest
import torch

from ddbench.kernels.engine.transfer import perturb_fast, perturb_fast_ref


def _base(B, H, N, k, g, ascending=True):
    b = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k]
    return (b.sort(-1).values if ascending else b).int().contiguous()


def _contract(base, p, N, m):
    k = base.shape[-1]
    assert p.dtype == torch.int32 and p.shape == base.shape
    assert 0 <= int(p.min()) and int(p.max()) < N
    assert (p.sort(-1).values.diff(dim=-1) > 0).all()                       # distinct
    same = p == base
    assert (same.sum(-1) == k - m).all()                                     # kept in place
    inbase = (p[..., :, None] == base[..., None, :]).any(-1)
    assert (inbase == same).all()                                            # new ones outside base


@pytest.mark.parametrize("B,H,N,k,rate,asc", [
    (3, 4, 64, 16, 0.25, True), (2, 2, 300, 40, 0.33, True), (1, 3, 40, 20, 0.5, True),
    pytest.param(2, 3, 1000, 37, 0.174, True, marks=pytest.mark.slow),   # non-integer strides, k not a power of 2
    (2, 2, 100, 50, 1.0, True),         # every entry replaced
    (1, 2, 21, 20, 0.05, True),         # one miss, a single free chunk
    (2, 2, 500, 64, 0.33, False),       # unsorted base (ShadowKV reuses the previous perturbed set)
    (1, 1, 50, 1, 1.0, False),          # k = 1
])
def test_perturb_fast_matches_twin(B, H, N, k, rate, asc):
    g = torch.Generator().manual_seed(B * N + k)
    base = _base(B, H, N, k, g, asc)
    seed = torch.tensor([int(torch.randint(0, 2**20, (1,), generator=g))], dtype=torch.int32)
    m = round(rate * k)
    out = torch.full_like(base, -7)
    p = perturb_fast(base, rate, N, seed, 3, out=out)
    assert p.data_ptr() == out.data_ptr()
    assert torch.equal(p, perturb_fast_ref(base, rate, N, seed, 3))
    _contract(base, p, N, m)
    assert torch.equal(p, perturb_fast(base, rate, N, seed, 3))              # deterministic
    assert not torch.equal(p, perturb_fast(base, rate, N, seed + 1, 3)) or m == 0 or N - k == m
    assert not torch.equal(p, perturb_fast(base, rate, N, seed, 4)) or m == 0 or N - k == m


def test_perturb_fast_zero_rate_and_errors():
    g = torch.Generator().manual_seed(1)
    base = _base(2, 2, 40, 8, g)
    seed = torch.tensor([3], dtype=torch.int32)
    out = torch.full_like(base, -7)
    assert torch.equal(perturb_fast(base, 0.01, 40, seed, 0, out=out), base)
    with pytest.raises(ValueError):
        perturb_fast(base, 1.0, 12, seed, 0)


def test_perturb_fast_spreads_over_chunks():
    """Over many draws every position can be dropped and the new chunks cover the complement."""
    g = torch.Generator().manual_seed(2)
    N, k = 48, 8
    base = _base(1, 1, N, k, g)
    dropped, new = torch.zeros(k, dtype=torch.bool), set()
    for s in range(40):
        p = perturb_fast(base, 0.25, N, torch.tensor([s], dtype=torch.int32), 0)[0, 0]
        dropped |= p != base[0, 0]
        new |= set(p[p != base[0, 0]].tolist())
    assert dropped.all()
    assert len(new) > (N - k) // 2


@pytest.mark.gpu
@pytest.mark.parametrize("B,k,rate,asc", [(4, 256, 0.33, True), (16, 256, 0.174, True), (4, 256, 0.33, False)])
def test_perturb_fast_gpu(B, k, rate, asc):
    N, H = 16384, 8
    g = torch.Generator().manual_seed(B + k)
    base = _base(B, H, N, k, g, asc).cuda()
    seed = torch.tensor([9], dtype=torch.int32, device="cuda")
    out = torch.full_like(base, -7)
    p = perturb_fast(base, rate, N, seed, 5, out=out)
    assert torch.equal(p, perturb_fast_ref(base, rate, N, seed, 5))
    _contract(base.cpu(), p.cpu(), N, round(rate * k))
