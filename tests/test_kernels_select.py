"""Landmarks, chunk scoring and top-k selection against their torch twins."""

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.landmarks import build_landmarks, build_landmarks_ref
from ddbench.kernels.select import score_chunks, score_chunks_ref, select_chunks


def _randn(*shape, dtype, dev, g):
    return torch.randn(*shape, generator=g).to(dev, dtype)


def _check_landmarks(B, H, T, d, dtype, dev, seed):
    g = torch.Generator().manual_seed(seed)
    k = _randn(B, H, T, d, dtype=dtype, dev=dev, g=g)
    out = torch.full((B, H, T // 8, d), float("nan"), dtype=dtype, device=dev)
    build_landmarks(k, 8, out)
    assert torch.allclose(out.float(), build_landmarks_ref(k, 8).float(), atol=1e-2, rtol=1e-2)


def _check_selection(B, nq, Hq, H, N, d, k, dtype, dev, seed, block_n, splits=None):
    g = torch.Generator().manual_seed(seed)
    q = _randn(B, nq, Hq, d, dtype=dtype, dev=dev, g=g)
    lm = _randn(B, H, N, d, dtype=dtype, dev=dev, g=g)
    out = torch.full((B, nq, H, N), float("nan"), device=dev)
    score_chunks(q, lm, out=out, block_n=block_n, splits=splits)
    ref = score_chunks_ref(q, lm)
    assert torch.allclose(out, ref, atol=1e-3 * float(ref.max()), rtol=1e-2)
    idx = select_chunks(q, lm, k, block_n=block_n, splits=splits)
    assert idx.shape == (B, nq, H, k) and idx.dtype == torch.int32
    assert (idx.diff(dim=-1) > 0).all()  # sorted, distinct
    chosen = torch.zeros_like(ref, dtype=torch.bool).scatter_(-1, idx.long(), True)
    worst_in = ref.masked_fill(~chosen, float("inf")).amin(-1)
    best_out = ref.masked_fill(chosen, float("-inf")).amax(-1)
    assert (worst_in >= best_out - 2e-3 * ref.amax(-1)).all()  # the top-k of the true scores, up to ties
    if nq == 2:  # each token is scored on its own
        single = score_chunks(q[:, 1:].contiguous(), lm, block_n=block_n)
        assert torch.allclose(single[:, 0], out[:, 1], atol=1e-6)


def test_landmarks_cpu():
    _check_landmarks(2, 3, 8 * 37, 32, torch.float32, "cpu", seed=1)


@pytest.mark.parametrize("nq", [1, 2])
@pytest.mark.parametrize("Hq,H", [(8, 2), (10, 2)])
def test_selection_cpu(nq, Hq, H):
    _check_selection(2, nq, Hq, H, 75, 32, 12, torch.float16, "cpu", seed=nq * 10 + Hq, block_n=16, splits=3)


def test_selection_rejects_budget_over_landmarks():
    with pytest.raises(DDBenchError):
        select_chunks(torch.randn(1, 1, 4, 32), torch.randn(1, 2, 10, 32), 11)


@pytest.mark.gpu
def test_landmarks_gpu():
    _check_landmarks(4, 8, 8 * 1024, 128, torch.bfloat16, "cuda", seed=2)


@pytest.mark.gpu
@pytest.mark.parametrize("nq", [1, 2])
def test_selection_gpu(nq):
    for splits in (1, 5, None):
        _check_selection(4, nq, 32, 8, 4096, 128, 256, torch.bfloat16, "cuda", seed=nq, block_n=64, splits=splits)
