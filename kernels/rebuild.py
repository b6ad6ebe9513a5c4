"""Low-rank key rebuild (ShadowKV; DualDecoder's adaptive key reconstruction).

    rebuild_keys(U, SV, idx, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0)
        U     [B, T, r]      pre-RoPE key factor, rows = token positions (rank shared by heads)
        SV    [B, H, r, d]   per-head right factor
        idx   [B, H, n]      selected chunk ids; chunk c covers tokens c*C .. c*C+C-1
        k_out [B, H, S, d]   tokens slot_offset + j*C + i receive RoPE(U[c*C+i] @ SV[h], pos=c*C+i)
    rebuild_keys_ref(...)    torch twin (fp32), same arguments
    rope_inv_freq(d, theta)  Llama RoPE frequencies (rotate-half convention), fp32

Fused: one program rebuilds a block of chunks of one (request, head); the product, the
rotation and the store happen in registers, so HBM sees U's rows once and K once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError


def rope_inv_freq(d: int, theta: float, device=None) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.int64).float() / d))


def apply_rope_ref(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [..., T, d] fp32, pos [T]: Llama rotate-half RoPE in fp32."""
    ang = pos.float()[:, None] * rope_inv_freq(x.shape[-1], theta, x.device)[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@triton.jit
def _rebuild_kernel(U, SV, idx, inv_freq, k_out, n_sel, R, H,
                    s_ub, s_ut, s_sb, s_sh, s_sr, s_ob, s_oh, s_ot, slot_offset,
                    C: tl.constexpr, D: tl.constexpr, BC: tl.constexpr, RB: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    HALF: tl.constexpr = D // 2
    BT: tl.constexpr = BC * C
    rr = tl.arange(0, BT)
    j = tl.program_id(1) * BC + rr // C
    jv = j < n_sel
    ch = tl.load(idx + bh.to(tl.int64) * n_sel + j, mask=jv, other=0)
    tok = (ch * C + rr % C).to(tl.int64)
    hd = tl.arange(0, HALF)
    ub = U + b.to(tl.int64) * s_ub
    sb = SV + b.to(tl.int64) * s_sb + h * s_sh
    x1 = tl.zeros([BT, HALF], tl.float32)
    x2 = tl.zeros([BT, HALF], tl.float32)
    for r0 in range(0, R, RB):
        rk = r0 + tl.arange(0, RB)
        rkv = rk < R
        u = tl.load(ub + tok[:, None] * s_ut + rk[None, :], mask=jv[:, None] & rkv[None, :], other=0.0)
        s1 = tl.load(sb + rk[:, None] * s_sr + hd[None, :], mask=rkv[:, None], other=0.0)
        s2 = tl.load(sb + rk[:, None] * s_sr + HALF + hd[None, :], mask=rkv[:, None], other=0.0)
        x1 += tl.dot(u, s1)
        x2 += tl.dot(u, s2)
    ang = tok.to(tl.float32)[:, None] * tl.load(inv_freq + hd)[None, :]
    # Cody-Waite reduction to [-pi, pi] (angles reach ~1e5 rad at long contexts, where cos/sin
    # would take their slow path): 6.28125 has 8 significant bits, so k * 6.28125 is exact.
    kk = tl.floor(ang * 0.15915494309189535 + 0.5)
    ang = (ang - kk * 6.28125) - kk * 1.9353071795864769e-3
    cos = tl.cos(ang)
    sin = tl.sin(ang)
    dst = k_out + b.to(tl.int64) * s_ob + h * s_oh + (slot_offset + j * C + rr % C).to(tl.int64)[:, None] * s_ot + hd[None, :]
    ty = k_out.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=jv[:, None])
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=jv[:, None])


def _check(U, SV, idx, k_out, chunk, slot_offset):
    if U.dim() != 3 or SV.dim() != 4 or idx.dim() != 3 or k_out.dim() != 4:
        raise DDBenchError("need U [B, T, r], SV [B, H, r, d], idx [B, H, n], k_out [B, H, S, d]")
    B, T, R = U.shape
    H, d = SV.shape[1], SV.shape[3]
    if SV.shape != (B, H, R, d) or idx.shape[:2] != (B, H) or k_out.shape[:2] != (B, H) or k_out.shape[3] != d:
        raise DDBenchError(f"shape mismatch: U {tuple(U.shape)} SV {tuple(SV.shape)} idx {tuple(idx.shape)} k_out {tuple(k_out.shape)}")
    if slot_offset + idx.shape[2] * chunk > k_out.shape[2]:
        raise DDBenchError("selected chunks overflow the key buffer")
    if d & (d - 1) or d < 32 or U.stride(2) != 1 or SV.stride(3) != 1 or k_out.stride(3) != 1:
        raise DDBenchError("head_dim must be a power of two >= 32; innermost dims contiguous")
    return B, T, R, H, d


def rebuild_keys(U, SV, idx, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0, block_chunks=4, rank_block=32,
                 num_warps=4):
    B, T, R, H, d = _check(U, SV, idx, k_out, chunk, slot_offset)
    n = idx.shape[2]
    idx = idx.to(device=U.device, dtype=torch.int32).contiguous()
    inv = rope_inv_freq(d, rope_theta, U.device)
    _rebuild_kernel[(B * H, triton.cdiv(n, block_chunks))](
        U, SV, idx, inv, k_out, n, R, H, U.stride(0), U.stride(1), SV.stride(0), SV.stride(1), SV.stride(2),
        *k_out.stride()[:3], slot_offset, C=chunk, D=d, BC=block_chunks, RB=rank_block, num_warps=num_warps)
    return k_out


def rebuild_keys_ref(U, SV, idx, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0, **_):
    B, T, R, H, d = _check(U, SV, idx, k_out, chunk, slot_offset)
    n = idx.shape[2]
    for b in range(B):
        for h in range(H):
            tok = (idx[b, h].long()[:, None] * chunk + torch.arange(chunk, device=idx.device)).view(-1).to(U.device)
            k = U[b, tok].float() @ SV[b, h].float()
            k_out[b, h, slot_offset:slot_offset + n * chunk] = apply_rope_ref(k, tok, rope_theta).to(k_out.dtype)
    return k_out
