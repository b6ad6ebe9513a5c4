"""Fused Triton kernels for the engine's per-layer glue, each with its torch twin in model.py.

Inside a CUDA graph a step costs little host time, but each kernel still costs a few microseconds
of launch gap and tail: the torch versions of RMSNorm (7 kernels), RoPE of q and k (about 16),
SwiGLU (2) and the buffer assembly (about 8) made up most of the ~60 kernels per layer, against
the weights' and KV's HBM time of a few hundred microseconds per layer at small batch.

    rmsnorm(x, w, eps=1e-5) -> like model.rmsnorm                         one program per row
    add_rmsnorm(x, y, w, eps=1e-5) -> (s, rmsnorm(s, w)) with s = x + y (bf16 as torch): the
        residual add and the next norm in one kernel, so that the linear layers need no addmm
        (cuBLAS copies the addend first: one more kernel per residual); twin add_rmsnorm_ref
    rope_split(qkv, cos, sin, Hq, H, d, bias=None) -> q [B, T, Hq, d], k, v [B, T, H, d]
        the QKV bias added where the model has one (rounded as torch's bf16 add), RoPE (rotate-half,
        fp32 math, as model.rope) on the q and k heads of the fused QKV output, v copied out; one launch
    swiglu(gu) -> silu(gu[..., :I]) * gu[..., I:] (bf16 rounding of silu as torch)
    assemble(kb, vb, recent_k, recent_v, k, v, g, kC, R0)
        kb[:, :, kC + r] = recent_k[:, :, r] for r < Rcap, except rows R0+g+t (t < nq) which get the
        new token t; then recent[:, :, R0+g] = token 0 (persist). The count g is read on the device.
    assemble_ref(...)                                                     torch twin
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x, w, out, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    xv = tl.load(x + row * n + offs, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(xv * xv, 0) / n + eps)
    wv = tl.load(w + offs, mask=m, other=0.0).to(tl.float32)
    y = (xv * r).to(out.dtype.element_ty).to(tl.float32) * wv
    tl.store(out + row * n + offs, y.to(out.dtype.element_ty), mask=m)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    n = x.shape[-1]
    xc = x.contiguous()
    out = torch.empty_like(xc)
    _rmsnorm_kernel[(xc.numel() // n,)](xc, w, out, n, eps, BLOCK=triton.next_power_of_2(n), num_warps=8)
    return out


@triton.jit
def _add_rmsnorm_kernel(x, y, w, s_out, out, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    sv = tl.load(x + row * n + offs, mask=m, other=0.0).to(tl.float32) + \
        tl.load(y + row * n + offs, mask=m, other=0.0).to(tl.float32)
    sv = sv.to(out.dtype.element_ty)
    tl.store(s_out + row * n + offs, sv, mask=m)
    sf = sv.to(tl.float32)
    r = tl.rsqrt(tl.sum(sf * sf, 0) / n + eps)
    wv = tl.load(w + offs, mask=m, other=0.0).to(tl.float32)
    yv = (sf * r).to(out.dtype.element_ty).to(tl.float32) * wv
    tl.store(out + row * n + offs, yv.to(out.dtype.element_ty), mask=m)


def add_rmsnorm(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float = 1e-5):
    n = x.shape[-1]
    xc, yc = x.contiguous(), y.contiguous()
    s = torch.empty_like(xc)
    out = torch.empty_like(xc)
    _add_rmsnorm_kernel[(xc.numel() // n,)](xc, yc, w, s, out, n, eps, BLOCK=triton.next_power_of_2(n), num_warps=8)
    return s, out


def add_rmsnorm_ref(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float = 1e-5):
    from ddbench.kernels.engine.model import rmsnorm as rmsnorm_ref
    s = x + y
    return s, rmsnorm_ref(s, w, eps)


@triton.jit
def _rope_split_kernel(qkv, bias, cos, sin, q, k, v, T, Hq, H, D: tl.constexpr, HAS_BIAS: tl.constexpr):
    row = tl.program_id(0)            # b * T + t
    head = tl.program_id(1)           # 0..Hq+2H-1
    t = row % T
    HALF: tl.constexpr = D // 2
    i = tl.arange(0, HALF)
    src = qkv + row.to(tl.int64) * (Hq + 2 * H) * D + head * D
    x1 = tl.load(src + i).to(tl.float32)
    x2 = tl.load(src + HALF + i).to(tl.float32)
    if HAS_BIAS:
        x1 = (x1 + tl.load(bias + head * D + i).to(tl.float32)).to(q.dtype.element_ty).to(tl.float32)
        x2 = (x2 + tl.load(bias + head * D + HALF + i).to(tl.float32)).to(q.dtype.element_ty).to(tl.float32)
    if head < Hq + H:
        c = tl.load(cos + t * HALF + i)
        s = tl.load(sin + t * HALF + i)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
    else:
        y1 = x1
        y2 = x2
    if head < Hq:
        dst = q + (row.to(tl.int64) * Hq + head) * D
    elif head < Hq + H:
        dst = k + (row.to(tl.int64) * H + head - Hq) * D
    else:
        dst = v + (row.to(tl.int64) * H + head - Hq - H) * D
    tl.store(dst + i, y1.to(q.dtype.element_ty))
    tl.store(dst + HALF + i, y2.to(q.dtype.element_ty))


def rope_split(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, Hq: int, H: int, d: int, bias=None):
    B, T, _ = qkv.shape
    qkv = qkv.contiguous()
    q = torch.empty(B, T, Hq, d, device=qkv.device, dtype=qkv.dtype)
    k = torch.empty(B, T, H, d, device=qkv.device, dtype=qkv.dtype)
    v = torch.empty_like(k)
    _rope_split_kernel[(B * T, Hq + 2 * H)](qkv, qkv if bias is None else bias, cos.float().contiguous(),
                                            sin.float().contiguous(), q, k, v, T, Hq, H, D=d,
                                            HAS_BIAS=bias is not None, num_warps=1)
    return q, k, v


def rope_split_ref(qkv, cos, sin, Hq, H, d, bias=None):
    from ddbench.kernels.engine.model import rope
    if bias is not None:
        qkv = qkv + bias
    B, T, _ = qkv.shape
    q = qkv[..., :Hq * d].reshape(B, T, Hq, d)
    k = qkv[..., Hq * d:(Hq + H) * d].reshape(B, T, H, d)
    v = qkv[..., (Hq + H) * d:].reshape(B, T, H, d)
    return rope(q, cos, sin), rope(k, cos, sin), v.contiguous()


@triton.jit
def _swiglu_kernel(gu, out, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    g = tl.load(gu + row * 2 * I + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu + row * 2 * I + I + offs, mask=m, other=0.0).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + row * I + offs, (a * u).to(out.dtype.element_ty), mask=m)


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    I = gu.shape[-1] // 2
    gu = gu.contiguous()
    out = torch.empty(*gu.shape[:-1], I, device=gu.device, dtype=gu.dtype)
    BLOCK = 1024
    _swiglu_kernel[(gu.numel() // (2 * I), triton.cdiv(I, BLOCK))](gu, out, I, BLOCK=BLOCK, num_warps=4)
    return out


def swiglu_ref(gu):
    I = gu.shape[-1] // 2
    return torch.nn.functional.silu(gu[..., :I]) * gu[..., I:]


@triton.jit
def _assemble_kernel(kb, vb, rk, rv, knew, vnew, g_ptr, H, Rcap, kC, R0, NQ,
                     s_bb, s_bh, s_bs, s_rb, s_rh, s_rs, D: tl.constexpr, BLOCK_R: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    rok = r < Rcap
    dd = tl.arange(0, D)
    g = tl.load(g_ptr).to(tl.int32)
    at = R0 + g
    rb = b.to(tl.int64) * s_rb + h.to(tl.int64) * s_rh
    src = rb + r[:, None].to(tl.int64) * s_rs + dd[None, :]
    kx = tl.load(rk + src, mask=rok[:, None], other=0.0)
    vx = tl.load(rv + src, mask=rok[:, None], other=0.0)
    tk = r - at                                    # new token index of this row, if 0 <= tk < NQ
    isnew = (tk >= 0) & (tk < NQ) & rok
    tsafe = tl.where(isnew, tk, 0)
    nsrc = ((b * NQ + tsafe) * H + h).to(tl.int64)[:, None] * D + dd[None, :]
    kn = tl.load(knew + nsrc, mask=isnew[:, None], other=0.0)
    vn = tl.load(vnew + nsrc, mask=isnew[:, None], other=0.0)
    kx = tl.where(isnew[:, None], kn, kx)
    vx = tl.where(isnew[:, None], vn, vx)
    dst = b.to(tl.int64) * s_bb + h.to(tl.int64) * s_bh + (kC + r)[:, None].to(tl.int64) * s_bs + dd[None, :]
    tl.store(kb + dst, kx, mask=rok[:, None])
    tl.store(vb + dst, vx, mask=rok[:, None])
    persist = (r == at) & rok                      # the true token's K/V stay for the next steps
    tl.store(rk + src, kx, mask=persist[:, None])
    tl.store(rv + src, vx, mask=persist[:, None])


def assemble(kb, vb, recent_k, recent_v, k, v, g, kC: int, R0: int):
    """See the module docstring. kb/vb [B, H, S, d]; recent_* [B, H, Rcap, d]; k, v [B, nq, H, d]."""
    B, H, Rcap, d = recent_k.shape
    nq = k.shape[1]
    k, v = k.contiguous(), v.contiguous()
    BLOCK_R = 32
    _assemble_kernel[(B * H, triton.cdiv(Rcap, BLOCK_R))](
        kb, vb, recent_k, recent_v, k, v, g, H, Rcap, kC, R0, nq, *kb.stride()[:3], *recent_k.stride()[:3],
        D=d, BLOCK_R=BLOCK_R, num_warps=4)


def assemble_ref(kb, vb, recent_k, recent_v, k, v, g, kC: int, R0: int):
    Rc = recent_k.shape[2]
    nq = k.shape[1]
    kb[:, :, kC:kC + Rc] = recent_k
    vb[:, :, kC:kC + Rc] = recent_v
    at = g + (kC + R0) + torch.arange(nq, device=g.device)
    kb.index_copy_(2, at, k.transpose(1, 2))
    vb.index_copy_(2, at, v.transpose(1, 2))
    p = g + R0
    recent_k.index_copy_(2, p, k[:, :1].transpose(1, 2))
    recent_v.index_copy_(2, p, v[:, :1].transpose(1, 2))
