"""The engine's fused selection (kernels/engine/fastselect.py) against the torch twins: the chosen
chunks carry the same probabilities as torch.topk's (ties may pick other equal chunks), are distinct
and ascending, and every output slot is written (poisoned output)."""

import pytest
import torch

from kernels.engine import fastselect
from kernels.select import score_chunks_ref
from kernels.specache import quantize_keys_2bit, specache_chunk_scores_ref


def _same_selection(got, probs, k):
    assert got.dtype == torch.int32 and got.shape[-1] == k
    assert (got.diff(dim=-1) > 0).all()                       # distinct, ascending
    assert int(got.min()) >= 0 and int(got.max()) < probs.shape[-1]
    want = probs.topk(k, dim=-1).values.sort(-1).values
    have = probs.gather(-1, got.long()).sort(-1).values
    torch.testing.assert_close(have, want, rtol=0, atol=0)


def _poisoned_out(monkey_shape, dev):
    return torch.full(monkey_shape, -7, dtype=torch.int32, device=dev)


@pytest.mark.parametrize("nq,N,k", [(1, 96, 16), (2, 300, 40), (2, 64, 64)])
def test_select_topk_landmarks(nq, N, k, dev="cpu"):
    g = torch.Generator().manual_seed(N + nq)
    B, Hq, H, d = 2, 8, 2, 32
    q = torch.randn(B, nq, Hq, d, generator=g).to(dev)
    lm = torch.randn(B, H, N, d, generator=g).to(dev)
    got = fastselect.select_topk(q, lm, k, splits=2)
    _same_selection(got, score_chunks_ref(q, lm), k)


def test_topk_ties_and_zeros(dev="cpu"):
    """Scores far apart: most probabilities underflow to exactly 0; k larger than the positive ones."""
    g = torch.Generator().manual_seed(5)
    B, nq, Hq, H, d, N, k = 1, 1, 4, 1, 32, 128, 20
    q = torch.randn(B, nq, Hq, d, generator=g) * 30
    lm = torch.randn(B, H, N, d, generator=g) * 30
    got = fastselect.select_topk(q, lm, k, splits=1)
    _same_selection(got, score_chunks_ref(q, lm), k)


@pytest.mark.parametrize("nq", [1, 2])
def test_specache_select_topk(nq, dev="cpu"):
    g = torch.Generator().manual_seed(30 + nq)
    B, Hq, H, d, T, C, k = 2, 8, 2, 32, 512, 8, 12
    qk = quantize_keys_2bit(torch.randn(B, H, T, d, generator=g))
    q = torch.randn(B, nq, Hq, d, generator=g)
    got = fastselect.specache_select_topk(q, qk, C, k)
    probs = specache_chunk_scores_ref(q, qk, C)
    # the kernel's fp16 dot moves probabilities by ~1e-3 of the largest: compare the chosen
    # probabilities with the true top-k's within that, not bit for bit
    want = probs.topk(k, dim=-1).values.sort(-1).values
    have = probs.gather(-1, got.long()).sort(-1).values
    assert (got.diff(dim=-1) > 0).all()
    assert torch.allclose(have, want, atol=3e-3 * float(probs.max()), rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("nq", [1, 2])
def test_select_topk_gpu(nq):
    g = torch.Generator(device="cuda").manual_seed(7 + nq)
    B, Hq, H, d, N, k = 4, 32, 8, 128, 16384, 256
    q = torch.randn(B, nq, Hq, d, device="cuda", generator=g).bfloat16()
    lm = torch.randn(B, H, N, d, device="cuda", generator=g).bfloat16()
    got = fastselect.select_topk(q, lm, k)
    from kernels.select import score_chunks
    probs = score_chunks(q, lm)          # the same pass 1 and normaliser
    assert (got.diff(dim=-1) > 0).all()
    want = probs.topk(k, dim=-1).values.sort(-1).values
    have = probs.gather(-1, got.long()).sort(-1).values
    torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-9)
