"""fp8 (e4m3) KV for the host and the link: one scale per (chunk, KV head), torch references.

    q, scale = quantize_chunks(x, chunk)        # x [..., T, d] (T a multiple of chunk) -> e4m3, fp32 [..., T/chunk]
    y = dequantize_chunks(q, scale, chunk)      # -> fp32 [..., T, d]
    y = gather_dequant(q, scale, ids, chunk)    # the chunks `ids` [..., k] of every row, dequantised [..., k*chunk, d]

The scale of a chunk is its largest |value| over E4M3_MAX (448), so the chunk's largest value maps to
the format's largest finite one; an all-zero chunk gets scale 1. A chunk holding inf or NaN has no
scale: quantize_chunks raises a one-line DDBenchError naming it (never a silent NaN in attention).
Values are rounded to nearest (torch's cast). Relative error per element is at most 2^-4 (3 mantissa
bits, round to nearest) for normal values; values below 2^-6 of the scale are subnormal or flush to 0.
"""

from __future__ import annotations

import torch

from ddbench.core.errors import DDBenchError

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)          # 448
REL_ERROR = 2.0 ** -4                            # max relative error of a normal value (half an ulp of 3 bits)


def _chunked(x: torch.Tensor, chunk: int) -> torch.Tensor:
    if x.dim() < 2 or x.shape[-2] % chunk:
        raise DDBenchError(f"fp8 chunks: {tuple(x.shape)} has no token axis divisible by the chunk {chunk}")
    return x.reshape(*x.shape[:-2], x.shape[-2] // chunk, chunk, x.shape[-1])


def quantize_chunks(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [..., T, d], fp32 scale [..., T/chunk]) of x [..., T, d]; DDBenchError on inf or NaN."""
    c = _chunked(x.float(), chunk)
    amax = c.abs().amax(dim=(-1, -2))
    bad = ~torch.isfinite(amax)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise DDBenchError(f"fp8: chunk {where} holds inf or NaN; it has no finite scale")
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (c / scale[..., None, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.reshape(x.shape), scale


def dequantize_chunks(q: torch.Tensor, scale: torch.Tensor, chunk: int) -> torch.Tensor:
    """fp32 [..., T, d] from e4m3 q [..., T, d] and scale [..., T/chunk]."""
    c = _chunked(q, chunk).float() * scale[..., None, None]
    return c.reshape(q.shape)


def gather_dequant(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, chunk: int) -> torch.Tensor:
    """The chunks `ids` [..., k] (int) of every row of q [..., T, d], dequantised: fp32 [..., k*chunk, d]."""
    c = _chunked(q, chunk)                                     # [..., N, C, d]
    idx = ids.long()
    raw = torch.gather(c.view(torch.uint8), -3, idx[..., None, None].expand(*idx.shape, chunk, c.shape[-1]))
    picked = raw.view(E4M3)                                    # the bytes move as they are (as over the link)
    s = torch.gather(scale, -1, idx)
    return (picked.float() * s[..., None, None]).reshape(*idx.shape[:-1], idx.shape[-1] * chunk, c.shape[-1])


def piece_bytes(chunk: int, head_dim: int, bits: int, values_only: bool = False) -> int:
    """Bytes of one host piece: K and V of a chunk-head laid out contiguously (or V alone), with its
    fp32 scale per tensor where bits is 8."""
    tensors = 1 if values_only else 2
    return tensors * (chunk * head_dim * bits // 8 + (4 if bits == 8 else 0))
