"""Low-rank key rebuild with RoPE at original positions against its torch twin."""

import math

import pytest
import torch

from kernels.rebuild import apply_rope_ref, rebuild_keys, rebuild_keys_ref


def _check(B, T, R, H, d, n, off, dtype, dev, theta, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    U = (torch.randn(B, T, R, generator=g) / math.sqrt(R)).to(dev, dtype)
    SV = torch.randn(B, H, R, d, generator=g).to(dev, dtype)
    idx = torch.rand(B, H, T // 8, generator=g).argsort(-1)[..., :n].int().to(dev)
    out = torch.full((B, H, off + n * 8 + 5, d), float("nan"), dtype=dtype, device=dev)
    ref = out.clone()
    rebuild_keys(U, SV, idx, out, rope_theta=theta, slot_offset=off, **kw)
    rebuild_keys_ref(U, SV, idx, ref, rope_theta=theta, slot_offset=off)
    a, b = out[:, :, off:off + n * 8].float(), ref[:, :, off:off + n * 8].float()
    assert float((a - b).norm() / b.norm()) < 1e-2
    assert out[:, :, :off].isnan().all() and out[:, :, off + n * 8:].isnan().all()


def test_rope_ref_is_a_rotation():
    x = torch.randn(5, 64)
    y = apply_rope_ref(x, torch.arange(5) * 1000, 10000.0)
    assert torch.allclose(x.norm(dim=-1), y.norm(dim=-1), rtol=1e-5)
    assert torch.allclose(apply_rope_ref(x, torch.zeros(5, dtype=torch.long), 10000.0), x)


@pytest.mark.parametrize("R", [40, 48])
def test_rebuild_cpu(R):
    _check(2, 8 * 40, R, 2, 32, 11, 3, torch.float16, "cpu", 10000.0, seed=R, block_chunks=4, rank_block=16)


@pytest.mark.gpu
def test_rebuild_gpu_shadowkv_shapes():
    _check(4, 32768, 160, 8, 128, 256, 32, torch.bfloat16, "cuda", 500000.0, seed=3)
