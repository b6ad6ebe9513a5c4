"""Host-memory KV layout for sparse offload.

    host_kv[layer, b, h, chunk, part, i, :]   part 0 = K, 1 = V; i < C tokens of the chunk

One chunk of one KV head holds its K then its V: 2*C*d elements, contiguous
(4 KiB for C=8, d=128, bf16). A gather of one (layer, b, h, chunk) is one run.
Functions: alloc_host_kv(L, B, H, N, chunk, d, dtype, pin) -> tensor; chunk_bytes(chunk, d, dtype).
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


def check_host_kv(host_kv: torch.Tensor) -> None:
    if host_kv.dim() != 7 or host_kv.shape[4] != 2 or not host_kv.is_contiguous():
        raise DDBenchError(f"host_kv must be a contiguous [L, B, H, N, 2, C, d] tensor, got {tuple(host_kv.shape)}")
    if torch.cuda.is_available() and not host_kv.is_pinned():
        raise DDBenchError("host_kv must be in pinned host memory (pin_memory=True) for a UVA gather")
