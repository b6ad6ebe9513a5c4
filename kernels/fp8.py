"""fp8 (e4m3) KV for the host and the link: one scale per (chunk, KV head), torch references.

    q, scale = quantize_chunks(x, chunk)        # x [..., T, d] (T a multiple of chunk) -> e4m3, fp32 [..., T/chunk]
    y = dequantize_chunks(q, scale, chunk)      # -> fp32 [..., T, d]
    y = gather_dequant(q, scale, ids, chunk)    # the chunks `ids` [..., k] of every row, dequantised [..., k*chunk, d]

Host KV (kernels/layout.py [L, B, H, N, 2, C, d]) in fp8: the e4m3 tensor and its `scales`, a flat fp32
tensor with one scale per C*d elements of the host tensor's storage (scale i for elements i*C*d ..),
so every view of the storage (ddbench.kernels.layout.host_kv_view's aliasing) finds its pieces' scales:
    q, scales = quantize_host_kv(x)             # x [..., 2, C, d] contiguous -> e4m3 x.shape, fp32 [x.numel() / (C*d)]
    check_host_scales(host_kv, scales)          # one-line DDBenchError when they do not belong together
    layer_scales(host_kv, layer, scales)        # the scales from host_kv[layer]'s first piece on (kernel pointer)
    dequantized_layer(host_kv, layer, scales, dtype)   # host_kv[layer] dequantised (torch twins), or itself in bf16

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


def _piece(host_kv: torch.Tensor) -> int:
    return host_kv.shape[-1] * host_kv.shape[-2]


def quantize_host_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 of x's shape, flat fp32 scales, one per K or V piece [C, d] in storage order) of a contiguous
    host KV x [..., 2, C, d]; DDBenchError on inf or NaN (quantize_chunks)."""
    if not x.is_contiguous():
        raise DDBenchError("quantize_host_kv needs a contiguous host KV")
    q, scale = quantize_chunks(x, x.shape[-2])
    return q, scale.reshape(-1)


def check_host_scales(host_kv: torch.Tensor, scales) -> None:
    """fp8 host KV needs its scales (flat fp32 covering its storage); a 16-bit one takes none."""
    if host_kv.dtype != E4M3:
        if scales is not None:
            raise DDBenchError(f"scales belong to an fp8 host KV, not a {host_kv.dtype} one")
        return
    if scales is None:
        raise DDBenchError("an fp8 host KV needs its scales (ddbench.kernels.fp8.quantize_host_kv)")
    need = host_kv.untyped_storage().nbytes() // _piece(host_kv)
    if scales.dtype != torch.float32 or scales.dim() != 1 or scales.numel() < need or not scales.is_contiguous():
        raise DDBenchError(f"fp8 host scales must be a contiguous fp32 vector of at least {need} (one per {_piece(host_kv)}"
                           f" elements of the host storage), got {tuple(scales.shape)} {scales.dtype}")
    if torch.cuda.is_available() and scales.device.type == "cpu" and not scales.is_pinned():
        raise DDBenchError("fp8 host scales must be in pinned host memory (pin_memory=True) for a UVA gather")


def layer_scales(host_kv: torch.Tensor, layer: int, scales: torch.Tensor) -> torch.Tensor:
    """scales from host_kv[layer]'s storage offset on: scale r // (C*d) of the kernel's element offset r."""
    return scales[host_kv[layer].storage_offset() // _piece(host_kv):]


def dequantized_layer(host_kv: torch.Tensor, layer: int, scales, dtype) -> torch.Tensor:
    """host_kv[layer] [B, H, N, 2, C, d] dequantised in fp32 and cast to `dtype` (fp8), or as it is."""
    src = host_kv[layer]
    if host_kv.dtype != E4M3:
        return src
    cd = _piece(host_kv)
    s = layer_scales(host_kv, layer, scales)
    per = s.as_strided(src.shape[:4], [st // cd for st in src.stride()[:4]])
    return (src.float() * per[..., None, None]).to(dtype)
