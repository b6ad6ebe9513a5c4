"""fp8 (e4m3) KV (kernels/fp8.py): quantise, dequantise and the gather against plain torch, on fresh
random inputs with outliers, within the format's stated tolerance; inf or NaN is a clear error."""

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.fp8 import E4M3_MAX, REL_ERROR, dequantize_chunks, gather_dequant, piece_bytes, quantize_chunks


def _kv(seed, shape=(2, 3, 64, 16)):
    g = torch.Generator().manual_seed(seed)
    mag = torch.rand(*shape[:-2], shape[-2] // 8, 1, generator=g) * 5 + 0.01     # per chunk, 0.01 .. 5
    x = torch.randn(*shape, generator=g) * mag.repeat_interleave(8, -2)
    x[..., 5, 3] = 40.0                                   # an outlier sets its chunk's scale
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roundtrip_within_the_format(seed):
    x = _kv(seed)
    q, s = quantize_chunks(x, 8)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 3, 8)
    c = x.reshape(2, 3, 8, 8, 16)
    assert torch.allclose(s, c.abs().amax(dim=(-1, -2)) / E4M3_MAX)
    y = dequantize_chunks(q, s, 8)
    err = (y - x).abs()
    normal = x.abs() >= s.repeat_interleave(8, -1)[..., None] * 2.0 ** -6
    assert bool((err[normal] <= REL_ERROR * x.abs()[normal] + 1e-7).all())
    assert bool((err[~normal] <= s.repeat_interleave(8, -1)[..., None].expand_as(x)[~normal] * 2.0 ** -9).all())
    assert (y.abs().amax() - x.abs().amax()).abs() <= 1e-5 * x.abs().amax()   # the largest value survives


def test_gather_dequant_is_gather_then_dequant():
    x = _kv(3)
    q, s = quantize_chunks(x, 8)
    ids = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(i))[:5] for i in range(6)]).reshape(2, 3, 5)
    out = torch.full((2, 3, 40, 16), float("nan"))          # poisoned, then written
    out.copy_(gather_dequant(q, s, ids, 8))
    full = dequantize_chunks(q, s, 8).reshape(2, 3, 8, 8, 16)
    want = torch.stack([torch.stack([full[b, h, ids[b, h]] for h in range(3)]) for b in range(2)]).reshape(2, 3, 40, 16)
    assert torch.equal(out, want) and not out.isnan().any()


def test_zero_chunk_and_bad_values():
    x = _kv(4)
    x[0, 0, :8] = 0.0
    q, s = quantize_chunks(x, 8)
    assert s[0, 0, 0] == 1.0 and dequantize_chunks(q, s, 8)[0, 0, :8].abs().sum() == 0
    for bad in (float("inf"), float("nan")):
        y = x.clone()
        y[1, 2, 17, 0] = bad
        with pytest.raises(DDBenchError, match=r"chunk \(1, 2, 2\) holds inf or NaN"):
            quantize_chunks(y, 8)
    with pytest.raises(DDBenchError, match="divisible by the chunk"):
        quantize_chunks(torch.randn(2, 12, 4), 8)


def test_piece_bytes():
    assert piece_bytes(8, 128, 16) == 4096 and piece_bytes(8, 128, 16, values_only=True) == 2048
    assert piece_bytes(8, 128, 8) == 2 * (1024 + 4) and piece_bytes(8, 128, 8, values_only=True) == 1028
