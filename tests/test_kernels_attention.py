"""Dual-token sparse decode attention against its torch twin (poisoned outputs, fresh inputs)."""

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.attention import dual_sparse_attention, dual_sparse_attention_ref


def _relerr(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _inputs(B, nq, Hq, H, S, d, dtype, dev, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nq, Hq, d, generator=g).to(dev, dtype)
    k = torch.randn(B, H, S, d, generator=g).to(dev, dtype)
    v = torch.randn(B, H, S, d, generator=g).to(dev, dtype)
    lengths = torch.randint(1, S - nq + 1, (B,), generator=g, dtype=torch.int32)
    lengths[0] = S - nq
    return q, k, v, lengths.to(dev)


@pytest.mark.parametrize("nq", [1, 2])
@pytest.mark.parametrize("Hq,H", [(8, 2), (10, 2)])  # group of 4, and of 5 (Qwen-like, padded rows)
@pytest.mark.parametrize("splits", [1, 3, None])
def test_attention_matches_ref_cpu(nq, Hq, H, splits):
    q, k, v, lengths = _inputs(3, nq, Hq, H, 150, 32, torch.float16, "cpu", seed=nq * 100 + Hq + (splits or 0))
    out = torch.full_like(q, float("nan"))
    dual_sparse_attention(q, k, v, lengths, out=out, splits=splits, block_n=32)
    assert not out.isnan().any()
    assert _relerr(out, dual_sparse_attention_ref(q, k, v, lengths)) < 2e-3


def test_output_token_never_sees_speculative_token_cpu():
    q, k, v, lengths = _inputs(2, 2, 8, 2, 80, 32, torch.float32, "cpu", seed=5)
    o1 = dual_sparse_attention(q, k, v, lengths, splits=2, block_n=16)
    k2, v2 = k.clone(), v.clone()
    for b in range(2):  # change T' (the last key) only
        k2[b, :, lengths[b] + 1] += 3.0
        v2[b, :, lengths[b] + 1] -= 3.0
    o2 = dual_sparse_attention(q, k2, v2, lengths, splits=2, block_n=16)
    assert torch.allclose(o1[:, 0], o2[:, 0], atol=1e-6)
    assert not torch.allclose(o1[:, 1], o2[:, 1], atol=1e-3)
    # single-token mode on [context, T_i] equals the dual result's T_i row
    o_single = dual_sparse_attention(q[:, :1].contiguous(), k, v, lengths, block_n=16)
    assert torch.allclose(o_single[:, 0], o1[:, 0], atol=1e-5)


def test_attention_rejects_bad_shapes():
    q, k, v, lengths = _inputs(2, 2, 6, 4, 40, 32, torch.float32, "cpu", seed=1)
    with pytest.raises(DDBenchError):
        dual_sparse_attention(q, k, v, lengths)  # 6 query heads over 4 KV heads
    q3 = torch.randn(2, 3, 8, 32)
    with pytest.raises(DDBenchError):
        dual_sparse_attention(q3, k, v, lengths)


@pytest.mark.gpu
@pytest.mark.parametrize("nq", [1, 2])
@pytest.mark.parametrize("splits", [1, 4, None])
def test_attention_gpu_llama3_heads(nq, splits):
    q, k, v, lengths = _inputs(6, nq, 32, 8, 2048 + 64 + nq, 128, torch.bfloat16, "cuda", seed=nq + (splits or 0))
    out = torch.full_like(q, float("nan"))
    dual_sparse_attention(q, k, v, lengths, out=out, splits=splits)
    assert not out.isnan().any()
    assert _relerr(out, dual_sparse_attention_ref(q, k, v, lengths)) < 1e-2
