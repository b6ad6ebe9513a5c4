"""Host-memory KV layout for sparse offload.

    host_kv[layer, b, h, chunk, part, i, :]   part 0 = K, 1 = V; i < C tokens of the chunk

One chunk of one KV head holds its K then its V: 2*C*d elements, contiguous
(4 KiB for C=8, d=128, bf16). A gather of one (layer, b, h, chunk) is one run.
Functions: alloc_host_kv(L, B, H, N, chunk, d, dtype, pin) -> tensor; chunk_bytes(chunk, d, dtype);
host_kv_view(flat, L, B, H, N, chunk, d) -> (view, alias): a timing run's host KV on a smaller buffer.

Each (layer, request) block [H, N, 2, C, d] is contiguous; the layer and request strides are free
(whole chunk-heads), so a view may alias layers (layer stride of a shorter buffer, read l % L') or
requests (overlapping request windows): the gather kernels read with the view's request stride.
"""

from __future__ import annotations

import torch

from ddbench.core.errors import DDBenchError


def alloc_host_kv(layers: int, batch: int, kv_heads: int, n_chunks: int, chunk: int, head_dim: int,
                  dtype=torch.bfloat16, pin: bool = True) -> torch.Tensor:
    """Uninitialised host KV tensor [L, B, H, N, 2, C, d]; pinned when `pin` and CUDA is present."""
    if min(layers, batch, kv_heads, n_chunks, chunk, head_dim) < 1:
        raise DDBenchError("host KV dimensions must all be positive")
    pin = pin and torch.cuda.is_available()
    return torch.empty(layers, batch, kv_heads, n_chunks, 2, chunk, head_dim, dtype=dtype, pin_memory=pin)


def chunk_bytes(chunk: int, head_dim: int, dtype=torch.bfloat16, parts: int = 2) -> int:
    """Bytes of one chunk of one KV head (K and V when parts=2)."""
    return parts * chunk * head_dim * torch.empty((), dtype=dtype).element_size()


def host_kv_view(flat: torch.Tensor, layers: int, batch: int, kv_heads: int, n_chunks: int, chunk: int,
                 head_dim: int):
    """A [L', B, H, N, 2, C, d] host KV view of the flat buffer `flat`, for timing runs whose host KV
    would not fit in host memory (only the values repeat; every chunk still crosses the link):
    - all L layers fit: a plain view, alias "none";
    - L' < L layers of all B requests fit: logical layer l reads physical layer l % L', alias "layers";
    - not even one layer of all requests: one physical layer (L' = 1) whose B request windows of
      H * N chunk-heads overlap, each starting a whole number of chunk-heads after the last and
      spread over the buffer, alias "layers+requests".
    Returns (None, None) when one request's layer does not fit."""
    item = 2 * chunk * head_dim
    per_req = kv_heads * n_chunks * item
    n = flat.numel()
    hl = min(layers, n // (batch * per_req))
    if hl >= 1:
        view = flat[:hl * batch * per_req].view(hl, batch, kv_heads, n_chunks, 2, chunk, head_dim)
        return view, ("none" if hl == layers else "layers")
    if n < per_req:
        return None, None
    step = (n - per_req) // (batch - 1) // item * item     # batch >= 2 here: one request's layer fits
    view = flat.as_strided((1, batch, kv_heads, n_chunks, 2, chunk, head_dim),
                           (per_req, step, n_chunks * item, item, chunk * head_dim, head_dim, 1))
    return view, "layers+requests"


def check_host_kv(host_kv: torch.Tensor) -> None:
    if host_kv.dim() != 7 or host_kv.shape[4] != 2 or not host_kv[0, 0].is_contiguous():
        raise DDBenchError(f"host_kv must be a [L, B, H, N, 2, C, d] tensor with contiguous [H, N, 2, C, d] blocks,"
                           f" got {tuple(host_kv.shape)}")
    item = 2 * host_kv.shape[5] * host_kv.shape[6]
    if host_kv.stride(0) % item or host_kv.stride(1) % item:
        raise DDBenchError("host_kv's layer and request strides must be whole chunk-heads (2 * C * d elements)")
    if torch.cuda.is_available() and not host_kv.is_pinned():
        raise DDBenchError("host_kv must be in pinned host memory (pin_memory=True) for a UVA gather")
