"""SpeCache 2-bit key quantization and scoring against the dequantize-in-fp32 twin."""

import pytest
import torch

from kernels.specache import dequantize_keys, quantize_keys_2bit, specache_scores, specache_scores_ref


def _check(B, nq, Hq, H, T, d, dev, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, T, d, generator=g).to(dev)
    q = torch.randn(B, nq, Hq, d, generator=g).to(dev)
    qk = quantize_keys_2bit(k, group=64)
    assert qk.codes.dtype == torch.uint8 and qk.codes.shape == (B, H, T // 4, d)
    err = (dequantize_keys(qk) - k).abs().view(B, H, T // 64, 64, d)
    assert (err <= qk.scale.float()[:, :, :, None] / 2 + 1e-5).all()  # round to nearest of 4 levels
    ref = specache_scores_ref(q, qk)
    got = specache_scores(q, qk)
    assert got.shape == (B, nq, H, T)
    assert torch.allclose(got, ref, atol=1e-4 * float(ref.max()), rtol=1e-3)


@pytest.mark.parametrize("nq", [1, 2])
def test_specache_cpu(nq):
    _check(2, nq, 8, 2, 256, 32, "cpu", seed=nq)


@pytest.mark.gpu
def test_specache_gpu():
    _check(2, 2, 32, 8, 8192, 128, "cuda", seed=9)
