"""Chunk landmarks: the mean of the post-RoPE keys of each chunk of C tokens, per KV head.

    build_landmarks(k, chunk=8, out=None) -> lm [B, H, T // C, d]   (k: [B, H, T, d], T % C == 0)
    build_landmarks_ref(k, chunk=8) -> lm                           torch twin (fp32 mean)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError


@triton.jit
def _landmark_kernel(k, out, n_chunks, s_kb, s_kh, s_kt, s_ob, s_oh, s_on, H,
                     C: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
    bh = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    b = bh // H
    h = bh % H
    cv = c < n_chunks
    dd = tl.arange(0, D)
    base = k + b.to(tl.int64) * s_kb + h * s_kh
    acc = tl.zeros([BLOCK, D], tl.float32)
    for i in tl.static_range(C):
        tok = (c * C + i).to(tl.int64)
        acc += tl.load(base + tok[:, None] * s_kt + dd[None, :], mask=cv[:, None], other=0.0).to(tl.float32)
    dst = out + b.to(tl.int64) * s_ob + h * s_oh + c.to(tl.int64)[:, None] * s_on + dd[None, :]
    tl.store(dst, (acc / C).to(out.dtype.element_ty), mask=cv[:, None])


def _check(k, chunk):
    if k.dim() != 4 or k.shape[2] % chunk or k.stride(3) != 1:
        raise DDBenchError(f"keys must be [B, H, T, d] with T a multiple of chunk={chunk}, got {tuple(k.shape)}")
    if k.shape[3] & (k.shape[3] - 1):
        raise DDBenchError("head_dim must be a power of two")


def build_landmarks(k: torch.Tensor, chunk: int = 8, out: torch.Tensor | None = None, block: int = 16):
    _check(k, chunk)
    B, H, T, d = k.shape
    n = T // chunk
    if out is None:
        out = torch.empty(B, H, n, d, device=k.device, dtype=k.dtype)
    if out.shape != (B, H, n, d) or out.stride(3) != 1:
        raise DDBenchError(f"landmark output must be [B, H, {n}, {d}]")
    _landmark_kernel[(B * H, triton.cdiv(n, block))](k, out, n, *k.stride()[:3], *out.stride()[:3], H,
                                                     C=chunk, D=d, BLOCK=block, num_warps=4)
    return out


def build_landmarks_ref(k: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    _check(k, chunk)
    B, H, T, d = k.shape
    return k.float().view(B, H, T // chunk, chunk, d).mean(3).to(k.dtype)
