"""The engine's fused glue kernels (kernels/engine/fused.py) against their torch twins: fresh random
inputs, NaN-poisoned outputs (CPU through the Triton interpreter in fp32/fp16; GPU in bf16)."""

import pytest
import torch

from ddbench.kernels.engine import fused
from ddbench.kernels.engine.model import rmsnorm as rmsnorm_ref
from ddbench.kernels.engine.model import rope_tables


def _dev_dtypes():
    return [("cpu", torch.float32), ("cpu", torch.float16)]


@pytest.mark.parametrize("dev,dt", _dev_dtypes())
def test_rmsnorm(dev, dt, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 2, 96, generator=g).to(dev, dt)
    w = (torch.rand(96, generator=g) + 0.5).to(dev, dt)
    torch.testing.assert_close(fused.rmsnorm(x, w), rmsnorm_ref(x, w), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dev,dt", _dev_dtypes())
def test_add_rmsnorm(dev, dt, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 2, 96, generator=g).to(dev, dt)
    y = torch.randn(3, 2, 96, generator=g).to(dev, dt)
    w = (torch.rand(96, generator=g) + 0.5).to(dev, dt)
    s, h = fused.add_rmsnorm(x, y, w)
    s_ref, h_ref = fused.add_rmsnorm_ref(x, y, w)
    assert torch.equal(s, s_ref)                 # one rounding of the fp32 sum, as torch's add
    torch.testing.assert_close(h, h_ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(h, rmsnorm_ref(x + y, w), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dev,dt", _dev_dtypes())
@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("bias", [False, True])    # Qwen2.5's QKV bias, added in the same kernel
def test_rope_split(dev, dt, T, bias):
    g = torch.Generator().manual_seed(T)
    Hq, H, d = 10, 2, 32                           # a group of 5, as Qwen2.5-14B/32B (40 / 8)
    qkv = torch.randn(3, T, (Hq + 2 * H) * d, generator=g).to(dev, dt)
    b = torch.randn((Hq + 2 * H) * d, generator=g).to(dev, dt) if bias else None
    cos, sin = rope_tables(torch.tensor([1000, 1001][:T], device=dev), d, 5e5)
    got = fused.rope_split(qkv, cos, sin, Hq, H, d, bias=b)
    ref = fused.rope_split_ref(qkv, cos, sin, Hq, H, d, bias=b)
    if bias:                                       # the bias really is in: v is the biased slice, exactly
        torch.testing.assert_close(got[2], (qkv + b)[..., (Hq + H) * d:].reshape(3, T, H, d), rtol=0, atol=0)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dev,dt", _dev_dtypes())
def test_swiglu(dev, dt):
    g = torch.Generator().manual_seed(4)
    gu = torch.randn(2, 2, 2 * 1500, generator=g).to(dev, dt)
    torch.testing.assert_close(fused.swiglu(gu), fused.swiglu_ref(gu), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("nq", [1, 2])
@pytest.mark.parametrize("gval", [0, 5])
def test_assemble(nq, gval, dev="cpu", dt=torch.float32):
    g = torch.Generator().manual_seed(10 * nq + gval)
    B, H, d, kC, R0, gen = 2, 3, 32, 16, 8, 16
    Rcap = R0 + gen
    S = kC + Rcap + 8
    outs = []
    rk0 = torch.randn(B, H, Rcap, d, generator=g).to(dev, dt)
    rv0 = torch.randn(B, H, Rcap, d, generator=g).to(dev, dt)
    k = torch.randn(B, nq, H, d, generator=g).to(dev, dt)
    v = torch.randn(B, nq, H, d, generator=g).to(dev, dt)
    gd = torch.tensor([gval], device=dev)
    for fn in (fused.assemble, fused.assemble_ref):
        kb = torch.full((B, H, S, d), float("nan"), device=dev, dtype=dt)
        vb = kb.clone()
        rk, rv = rk0.clone(), rv0.clone()
        fn(kb, vb, rk, rv, k, v, gd, kC, R0)
        outs.append((kb, vb, rk, rv))
    for a, b in zip(*outs):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    kb = outs[0][0]
    assert not kb[:, :, kC:kC + Rcap].isnan().any() and kb[:, :, :kC].isnan().all()   # exactly its rows
    assert torch.equal(kb[:, :, kC + R0 + gval + nq - 1], k[:, nq - 1])
    assert torch.equal(outs[0][2][:, :, R0 + gval], k[:, 0])                         # persisted


@pytest.mark.gpu
def test_fused_gpu():
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(16, 2, 4096, device="cuda", generator=g).bfloat16()
    w = (torch.rand(4096, device="cuda", generator=g) + 0.5).bfloat16()
    assert torch.equal(fused.rmsnorm(x, w), rmsnorm_ref(x, w)) or torch.allclose(
        fused.rmsnorm(x, w).float(), rmsnorm_ref(x, w).float(), rtol=1e-2, atol=1e-2)
    y = torch.randn(16, 2, 4096, device="cuda", generator=g).bfloat16()
    s, h = fused.add_rmsnorm(x, y, w)
    assert torch.equal(s, x + y)
    torch.testing.assert_close(h.float(), rmsnorm_ref(x + y, w).float(), rtol=1e-2, atol=1e-2)
    qkv = torch.randn(16, 2, 48 * 128, device="cuda", generator=g).bfloat16()
    cos, sin = rope_tables(torch.tensor([131072, 131073], device="cuda"), 128, 5e5)
    for a, b in zip(fused.rope_split(qkv, cos, sin, 32, 8, 128), fused.rope_split_ref(qkv, cos, sin, 32, 8, 128)):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)
    gu = torch.randn(32, 2 * 14336, device="cuda", generator=g).bfloat16()
    torch.testing.assert_close(fused.swiglu(gu).float(), fused.swiglu_ref(gu).float(), rtol=1e-2, atol=1e-2)
