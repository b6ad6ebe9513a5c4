"""SpeCache 2-bit key quantization and scoring against the dequantize-in-fp32 twin."""

import pytest
import torch

from ddbench.kernels.specache import dequantize_keys, quantize_keys_2bit, specache_scores, specache_scores_ref


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


def _check_triton(B, nq, Hq, H, T, d, chunk, dev, seed, splits=None, **kw):
    """The Triton kernel against the dequantize-in-fp32 twin: fresh random inputs, NaN-poisoned output."""
    from ddbench.kernels.specache import specache_chunk_scores_ref, specache_scores_triton
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(B, H, T, d, generator=g) * (1 + torch.rand(1, H, 1, d, generator=g))).to(dev)
    q = torch.randn(B, nq, Hq, d, generator=g).to(dev)
    qk = quantize_keys_2bit(k, group=64)
    n = T // chunk if chunk else T
    out = torch.full((B, nq, H, n), float("nan"), device=dev)
    got = specache_scores_triton(q, qk, chunk=chunk, out=out, splits=splits, **kw)
    ref = specache_chunk_scores_ref(q, qk, chunk) if chunk else specache_scores_ref(q, qk)
    assert got.data_ptr() == out.data_ptr() and not got.isnan().any()   # every element written
    # fp16 dot operands (q * scale): about 1e-3 of the largest probability
    assert torch.allclose(got, ref, atol=3e-3 * float(ref.max()), rtol=1e-2)
    # the top chunks agree where the scores are not tied within that tolerance
    if chunk:
        top = ref.topk(4, -1).indices
        assert (got.gather(-1, top) >= ref.gather(-1, top) - 3e-3 * float(ref.max())).all()


@pytest.mark.parametrize("nq,chunk,splits", [(1, 0, 1), (2, 0, 3), (2, 8, None), (1, 8, 2), (2, 4, 1), (2, 16, 2)])
def test_specache_triton_cpu(nq, chunk, splits):
    _check_triton(2, nq, 8, 2, 384, 32, chunk, "cpu", seed=11 + nq + chunk, splits=splits)


@pytest.mark.parametrize("gb,nw", [(2, 2), (1, 1)])
def test_specache_triton_cpu_groups_per_iter(gb, nw):
    """fewer groups per iteration than the split has, and a tail iteration with idle group slots"""
    _check_triton(1, 2, 8, 2, 448, 32, 8, "cpu", seed=40 + gb, splits=2, groups_per_iter=gb, num_warps=nw)


@pytest.mark.parametrize("nq,chunk", [(2, 8), (2, 0), (1, 0)])
def test_specache_triton_cpu_dequant(nq, chunk):
    """The dequant kernel: pass 1 with the chunk maxima, and (chunk 0) its own pass 2 per token."""
    _check_triton(2, nq, 8, 2, 384, 32, chunk, "cpu", seed=31 + nq + chunk, impl="dequant")


def test_specache_dequant_rowload_equals_group_load_cpu():
    """The dequant kernel's two loads of the groups' scales and zeros (per byte row, or per group and
    broadcast over its rows) give the same pass 1."""
    from ddbench.kernels.specache import SpecKernel, spec_pass1
    g = torch.Generator().manual_seed(70)
    qk = quantize_keys_2bit(torch.randn(2, 2, 384, 32, generator=g))
    q = torch.randn(2, 2, 8, 32, generator=g)
    (s0, p0), (s1, p1) = (spec_pass1(q, qk, 8, SpecKernel(impl="dequant", rowload=x), splits=2) for x in (False, True))
    rows = 2 * 4                                   # nq x the group's 4 query heads; the rest is padding
    assert torch.equal(s0.view(4, 16, -1)[:, :rows], s1.view(4, 16, -1)[:, :rows]) and torch.equal(p0, p1)


def test_specache_triton_rejects_bad_chunk():
    from ddbench.core.errors import DDBenchError
    from ddbench.kernels.specache import specache_scores_triton
    qk = quantize_keys_2bit(torch.randn(1, 2, 128, 32))
    with pytest.raises(DDBenchError):
        specache_scores_triton(torch.randn(1, 1, 4, 32), qk, chunk=6)


@pytest.mark.parametrize("nq,chunk", [(1, 8), (2, 8), (2, 0)])
def test_specache_rows_8_and_16_agree_cpu(nq, chunk):
    """The codes kernel's default 8 query rows per program (the dot's N) and the previous 16 (padding
    rows) give the same scores and, for the chunk form, the same scratch and normalisers (to fp32
    rounding: the interpreter's matmul may sum in another order for another shape)."""
    from ddbench.kernels.specache import spec_block_m, spec_pass1, specache_scores_triton
    g = torch.Generator().manual_seed(50 + nq + chunk)
    B, Hq, H, T, d = 2, 8, 2, 384, 32
    qk = quantize_keys_2bit(torch.randn(B, H, T, d, generator=g))
    q = torch.randn(B, nq, Hq, d, generator=g)
    assert spec_block_m(nq, Hq // H) == 8 and spec_block_m(nq, Hq // H, rows=16) == 16
    a = specache_scores_triton(q, qk, chunk=chunk, splits=2)
    b = specache_scores_triton(q, qk, chunk=chunk, splits=2, rows=16)
    assert torch.allclose(a, b, rtol=1e-5, atol=0)
    if chunk:
        (s8, p8), (s16, p16) = (spec_pass1(q, qk, chunk, splits=2, rows=r) for r in (8, 16))
        rows = nq * 4
        assert torch.allclose(s8.view(B * H, 8, -1)[:, :rows], s16.view(B * H, 16, -1)[:, :rows], rtol=1e-5, atol=1e-5)
        assert torch.allclose(p8.view(B * H, 2, 8, 2)[:, :, :rows], p16.view(B * H, 2, 16, 2)[:, :, :rows],
                              rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nq", [1, 2])
def test_specache_fp16_scores_are_rounded_fp32(nq):
    """The engine's fp16 stored chunk maxima are the fp32 ones rounded; the normalisers are unchanged."""
    from ddbench.kernels.specache import spec_pass1
    g = torch.Generator().manual_seed(60 + nq)
    B, Hq, H, T, d, chunk = 2, 8, 2, 384, 32, 8
    qk = quantize_keys_2bit(torch.randn(B, H, T, d, generator=g))
    q = torch.randn(B, nq, Hq, d, generator=g)
    s32, p32 = spec_pass1(q, qk, chunk, splits=2)
    s16, p16 = spec_pass1(q, qk, chunk, splits=2, scores=torch.float16)
    rows = nq * 4
    assert s16.dtype == torch.float16 and torch.equal(p16, p32)
    assert torch.equal(s16.view(B * H, 8, -1)[:, :rows], s32.view(B * H, 8, -1)[:, :rows].half())


def test_specache_rows_rejected():
    from ddbench.core.errors import DDBenchError
    from ddbench.kernels.specache import spec_block_m
    with pytest.raises(DDBenchError):
        spec_block_m(2, 4, rows=4)
    assert spec_block_m(2, 8) == 16 and spec_block_m(1, 1, impl="dequant") == 16


@pytest.mark.gpu
@pytest.mark.parametrize("impl,rows", [("codes", None), ("codes", 16), ("dequant", None)])
@pytest.mark.parametrize("chunk", [0, 8])
def test_specache_triton_gpu(chunk, impl, rows):
    _check_triton(3, 2, 32, 8, 8192, 128, chunk, "cuda", seed=21 + chunk, impl=impl, rows=rows)
