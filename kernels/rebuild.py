"""Low-rank key rebuild (ShadowKV; DualDecoder's adaptive key reconstruction).

    rebuild_keys(U, SV, idx, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0, launch=RebuildLaunch())
        U     [B, T, r]      pre-RoPE key factor, rows = token positions (rank shared by heads)
        SV    [B, H, r, d]   per-head right factor
        idx   [B, H, n]      selected chunk ids; chunk c covers tokens c*C .. c*C+C-1
        k_out [B, H, S, d]   tokens slot_offset + j*C + i receive RoPE(U[c*C+i] @ SV[h], pos=c*C+i)
    rebuild_keys_ref(...)    torch twin (fp32), same arguments
    rebuild_changed(U, SV, old, new, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0, launch=RebuildLaunch())
        old, new [B, H, n]   the chunk ids each slot held before and holds now (ShadowKV's in-place
                             buffer: hits keep their slots, misses fill the slots of chunks no longer
                             selected); only the slots whose id changed are rebuilt, the others keep
                             their keys untouched
    rebuild_changed_ref(...) torch twin (fp32), same arguments
    rope_inv_freq(d, theta)  Llama RoPE frequencies (rotate-half convention), fp32

Fused: one program rebuilds a block of chunks of one (request, head); the product, the
rotation and the store happen in registers, so HBM sees U's rows once and K once. sin/cos come
from the SFU after a Cody-Waite range reduction (libdevice in the interpreter). Two kernels: "blocks"
(8 chunks = 64 tokens per program, rank blocks of 64: SV[b, h] reloaded from L2 per block) and
"resident" (about four programs per SM, each loads SV[b, h] once and loops over its blocks); "auto"
(the default) takes resident where each program gets several blocks. Launch parameters: LAUNCH, from the H200 sweep of
devtools/devcheck_rebuild.py (traces/engine/h200/devcheck-rebuild.json).
rebuild_changed: one to `programs` programs per (request, head), each loads SV[b, h] once, finds the
changed slots (old != new) and compacts them in order (a cumulative sum; slots and ids to a scratch
row, read back after a barrier), then rebuilds blocks of block_chunks changed chunks (the U rows of
their tokens gathered, the product and the RoPE in registers, K stored into their slots). At 12 %
misses a step rebuilds about an eighth of the keys that rebuild_keys rebuilds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError


def rope_inv_freq(d: int, theta: float, device=None) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.int64).float() / d))


_INV_FREQ: dict = {}


def _inv_freq(d: int, theta: float, device) -> torch.Tensor:
    """rope_inv_freq, kept per (d, theta, device): a launch then adds no small kernels (and none to a
    CUDA graph). Not kept when first asked for during a graph capture (its memory is the graph's)."""
    key = (d, float(theta), str(device))
    inv = _INV_FREQ.get(key)
    if inv is None:
        inv = rope_inv_freq(d, theta, device)
        if not (inv.is_cuda and torch.cuda.is_current_stream_capturing()):
            _INV_FREQ[key] = inv
    return inv


def apply_rope_ref(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [..., T, d] fp32, pos [T]: Llama rotate-half RoPE in fp32."""
    ang = pos.float()[:, None] * rope_inv_freq(x.shape[-1], theta, x.device)[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@triton.jit
def _sincos(ang, FAST: tl.constexpr):
    """sin, cos of fp32 angles. Cody-Waite reduction to [-pi, pi] first (angles reach ~1e5 rad at
    long contexts): 6.28125 has 8 significant bits, so k * 6.28125 is exact. FAST (GPU): the SFU's
    sin.approx / cos.approx (abs error ~1e-6 on [-pi, pi], far below bf16's 4e-3); else libdevice."""
    kk = tl.floor(ang * 0.15915494309189535 + 0.5)
    ang = (ang - kk * 6.28125) - kk * 1.9353071795864769e-3
    if FAST:
        s, c = tl.inline_asm_elementwise("sin.approx.f32 $0, $2;\n\tcos.approx.f32 $1, $2;", "=f,=f,f", [ang],
                                         dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        s = tl.sin(ang)
        c = tl.cos(ang)
    return s, c


@triton.jit
def _rebuild_kernel(U, SV, idx, inv_freq, k_out, n_sel, H,
                    s_ub, s_ut, s_sb, s_sh, s_sr, s_ob, s_oh, s_ot, slot_offset,
                    R: tl.constexpr, C: tl.constexpr, D: tl.constexpr, BC: tl.constexpr, RB: tl.constexpr,
                    EVEN_N: tl.constexpr, FAST: tl.constexpr):
    """Program (request*head, block): BC selected chunks (BC*C tokens) of one (request, head)."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    HALF: tl.constexpr = D // 2
    BT: tl.constexpr = BC * C
    rr = tl.arange(0, BT)
    j = tl.program_id(1) * BC + rr // C
    jv = j < n_sel
    if EVEN_N:
        ch = tl.load(idx + bh.to(tl.int64) * n_sel + j)
    else:
        ch = tl.load(idx + bh.to(tl.int64) * n_sel + j, mask=jv, other=0)
    tok = ch * C + rr % C
    hd = tl.arange(0, HALF)
    urow = U + b.to(tl.int64) * s_ub + tok.to(tl.int64)[:, None] * s_ut
    sb = SV + b.to(tl.int64) * s_sb + h * s_sh
    x1 = tl.zeros([BT, HALF], tl.float32)
    x2 = tl.zeros([BT, HALF], tl.float32)
    for r0 in range(0, R, RB):
        rk = r0 + tl.arange(0, RB)
        if R % RB == 0:       # rank blocks tile the rank exactly: no masks (the rows are in range)
            u = tl.load(urow + rk[None, :])
            s1 = tl.load(sb + rk[:, None] * s_sr + hd[None, :])
            s2 = tl.load(sb + rk[:, None] * s_sr + HALF + hd[None, :])
        else:
            rkv = rk < R
            u = tl.load(urow + rk[None, :], mask=rkv[None, :], other=0.0)
            s1 = tl.load(sb + rk[:, None] * s_sr + hd[None, :], mask=rkv[:, None], other=0.0)
            s2 = tl.load(sb + rk[:, None] * s_sr + HALF + hd[None, :], mask=rkv[:, None], other=0.0)
        x1 += tl.dot(u, s1)
        x2 += tl.dot(u, s2)
    # RoPE at the original positions; the angle is the twin's fp32 product pos * inv_freq
    sin, cos = _sincos(tok.to(tl.float32)[:, None] * tl.load(inv_freq + hd)[None, :], FAST)
    slot = (slot_offset + j * C + rr % C).to(tl.int64)
    dst = k_out + b.to(tl.int64) * s_ob + h.to(tl.int64) * s_oh + slot[:, None] * s_ot + hd[None, :]
    ty = k_out.dtype.element_ty
    if EVEN_N:
        tl.store(dst, (x1 * cos - x2 * sin).to(ty))
        tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty))
    else:
        tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=jv[:, None])
        tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=jv[:, None])


@triton.jit
def _rebuild_resident_kernel(U, SV, idx, inv_freq, k_out, n_sel, H, tiles,
                             s_ub, s_ut, s_sb, s_sh, s_sr, s_ob, s_oh, s_ot, slot_offset,
                             R: tl.constexpr, C: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
                             R1: tl.constexpr, R2: tl.constexpr, FAST: tl.constexpr):
    """Program (request*head, p): `tiles` blocks of BC chunks of one (request, head), p-th run of them;
    SV[b, h] is loaded once per program (rank split R1 + R2: a power of two and a masked rest)."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    HALF: tl.constexpr = D // 2
    BT: tl.constexpr = BC * C
    rr = tl.arange(0, BT)
    hd = tl.arange(0, HALF)
    ra = tl.arange(0, R1)
    sb = SV + b.to(tl.int64) * s_sb + h * s_sh
    sa1 = tl.load(sb + ra[:, None] * s_sr + hd[None, :])
    sa2 = tl.load(sb + ra[:, None] * s_sr + HALF + hd[None, :])
    if R2 > 0:
        rb = R1 + tl.arange(0, R2)
        rbv = rb < R
        sb1 = tl.load(sb + rb[:, None] * s_sr + hd[None, :], mask=rbv[:, None], other=0.0)
        sb2 = tl.load(sb + rb[:, None] * s_sr + HALF + hd[None, :], mask=rbv[:, None], other=0.0)
    inv = tl.load(inv_freq + hd)
    ub = U + b.to(tl.int64) * s_ub
    ob = k_out + b.to(tl.int64) * s_ob + h.to(tl.int64) * s_oh
    ib = idx + bh.to(tl.int64) * n_sel
    ty = k_out.dtype.element_ty
    for t in range(0, tiles):
        j = (tl.program_id(1) * tiles + t) * BC + rr // C
        jv = j < n_sel
        ch = tl.load(ib + j, mask=jv, other=0)
        tok = ch * C + rr % C
        urow = ub + tok.to(tl.int64)[:, None] * s_ut
        ua = tl.load(urow + ra[None, :])
        x1 = tl.dot(ua, sa1)
        x2 = tl.dot(ua, sa2)
        if R2 > 0:
            ubb = tl.load(urow + rb[None, :], mask=rbv[None, :], other=0.0)
            x1 = tl.dot(ubb, sb1, x1)
            x2 = tl.dot(ubb, sb2, x2)
        sin, cos = _sincos(tok.to(tl.float32)[:, None] * inv[None, :], FAST)
        dst = ob + (slot_offset + j * C + rr % C).to(tl.int64)[:, None] * s_ot + hd[None, :]
        tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=jv[:, None])
        tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=jv[:, None])


@triton.jit
def _rebuild_changed_kernel(U, SV, old, new, scratch, inv_freq, k_out, n_sel, H, P,
                            s_ub, s_ut, s_sb, s_sh, s_sr, s_ob, s_oh, s_ot, slot_offset,
                            R: tl.constexpr, C: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
                            R1: tl.constexpr, R2: tl.constexpr, KP: tl.constexpr, FAST: tl.constexpr):
    """Program (request*head, p) of P: the changed slots of one (request, head), blocks p, p + P, ..."""
    bh = tl.program_id(0)
    p = tl.program_id(1)
    b = bh // H
    h = bh % H
    HALF: tl.constexpr = D // 2
    BT: tl.constexpr = BC * C
    j = tl.arange(0, KP)
    jv = j < n_sel
    ib = bh.to(tl.int64) * n_sel
    o = tl.load(old + ib + j, mask=jv, other=0)
    nw = tl.load(new + ib + j, mask=jv, other=0)
    chg = jv & (o != nw)
    m = tl.sum(chg.to(tl.int32), 0)
    pos = tl.cumsum(chg.to(tl.int32), 0) - 1
    # compacted (slot, id) of the changed slots, in slot order; every program of this (b, h) writes the
    # same values to the same scratch row, and reads back only after its own stores (barrier, L2 reads)
    sc = scratch + bh.to(tl.int64) * (2 * KP)
    tl.store(sc + pos, j, mask=chg)
    tl.store(sc + KP + pos, nw, mask=chg)
    tl.debug_barrier()
    rr = tl.arange(0, BT)
    hd = tl.arange(0, HALF)
    ra = tl.arange(0, R1)
    sb = SV + b.to(tl.int64) * s_sb + h * s_sh
    sa1 = tl.load(sb + ra[:, None] * s_sr + hd[None, :])
    sa2 = tl.load(sb + ra[:, None] * s_sr + HALF + hd[None, :])
    if R2 > 0:
        rb = R1 + tl.arange(0, R2)
        rbv = rb < R
        sb1 = tl.load(sb + rb[:, None] * s_sr + hd[None, :], mask=rbv[:, None], other=0.0)
        sb2 = tl.load(sb + rb[:, None] * s_sr + HALF + hd[None, :], mask=rbv[:, None], other=0.0)
    inv = tl.load(inv_freq + hd)
    ub = U + b.to(tl.int64) * s_ub
    ob = k_out + b.to(tl.int64) * s_ob + h.to(tl.int64) * s_oh
    ty = k_out.dtype.element_ty
    for t in range(p, tl.cdiv(m, BC), P):
        jj = t * BC + rr // C
        ok = jj < m
        sl = tl.load(sc + jj, mask=ok, other=0, cache_modifier=".cg")
        ch = tl.load(sc + KP + jj, mask=ok, other=0, cache_modifier=".cg")
        tok = ch * C + rr % C
        urow = ub + tok.to(tl.int64)[:, None] * s_ut
        ua = tl.load(urow + ra[None, :], mask=ok[:, None], other=0.0)
        x1 = tl.dot(ua, sa1)
        x2 = tl.dot(ua, sa2)
        if R2 > 0:
            ubb = tl.load(urow + rb[None, :], mask=ok[:, None] & rbv[None, :], other=0.0)
            x1 = tl.dot(ubb, sb1, x1)
            x2 = tl.dot(ubb, sb2, x2)
        sin, cos = _sincos(tok.to(tl.float32)[:, None] * inv[None, :], FAST)
        dst = ob + (slot_offset + sl * C + rr % C).to(tl.int64)[:, None] * s_ot + hd[None, :]
        tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=ok[:, None])
        tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=ok[:, None])


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


# launch defaults per kernel: the fastest correct ones of the H200 sweep (devtools/devcheck_rebuild.py,
# traces/engine/h200/devcheck-rebuild.json; r=160, H=8, d=128, C=8, n=256, B 1-64, T 32K-128K)
LAUNCH = {"blocks": dict(block_chunks=8, rank_block=64, num_warps=4, num_stages=3),
          "resident": dict(block_chunks=4, num_warps=4, num_stages=3)}


@dataclass(frozen=True)
class RebuildLaunch:
    """Which rebuild kernel runs and how it is launched; None takes the kernel's default (LAUNCH, LAUNCH_CHANGED).
    impl (rebuild_keys): "auto", "blocks" or "resident" (rebuild_keys' docstring); block_chunks: chunks per
    block; rank_block (blocks): the rank's block; num_warps, num_stages; programs: resident, the programs
    in all (rebuild_keys), or per (request, head) (rebuild_changed); fast_rope (default: on CUDA): sin/cos
    from the SFU after the range reduction."""
    impl: str = "auto"
    block_chunks: int | None = None
    rank_block: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    programs: int | None = None
    fast_rope: bool | None = None


def rebuild_keys(U, SV, idx, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0,
                 launch: RebuildLaunch = RebuildLaunch()):
    """impl "blocks": block_chunks chunks of one (request, head) per program, the rank in blocks of
    rank_block; "resident": at most `programs` programs (default 4 per SM, what fits at once) or
    one per (request, head), each loads SV[b, h] once and runs over blocks of block_chunks chunks;
    "auto": resident where each program gets >= 4 blocks (so SV is reused), else blocks: on the H200
    at n=256, resident from B=4 (it was 10-17% faster at B=16 and 64, 5% slower at B=1). Launch
    parameters (RebuildLaunch) left None take LAUNCH[impl]. fast_rope (default: on CUDA) takes sin/cos
    from the SFU after the range reduction."""
    impl, programs, fast_rope = launch.impl, launch.programs, launch.fast_rope
    B, T, R, H, d = _check(U, SV, idx, k_out, chunk, slot_offset)
    n = idx.shape[2]
    if n == 0 or B * H == 0:
        return k_out
    sms = torch.cuda.get_device_properties(U.device).multi_processor_count if U.is_cuda else 4
    given = dict(block_chunks=launch.block_chunks, rank_block=launch.rank_block, num_warps=launch.num_warps,
                  num_stages=launch.num_stages)

    def launch_of(impl):
        return {k: v if given.get(k) is None else given[k] for k, v in LAUNCH[impl].items()}

    def tiles_of(bc):        # resident: blocks per program; (programs or 4 per SM) // (B*H) programs per (b, h)
        nblk = triton.cdiv(n, bc)
        return triton.cdiv(nblk, max(1, min(nblk, (programs or 4 * sms) // (B * H))))

    if impl == "auto":
        impl = "resident" if R >= 16 and tiles_of(launch_of("resident")["block_chunks"]) >= 4 else "blocks"
    if impl not in LAUNCH:
        raise DDBenchError(f"impl {impl!r}: 'auto', 'blocks' or 'resident'")
    kw = launch_of(impl)
    bc = kw["block_chunks"]
    idx = idx.to(device=U.device, dtype=torch.int32).contiguous()
    inv = _inv_freq(d, rope_theta, U.device)
    fast = U.is_cuda if fast_rope is None else bool(fast_rope)
    strides = (U.stride(0), U.stride(1), SV.stride(0), SV.stride(1), SV.stride(2), *k_out.stride()[:3], slot_offset)
    if impl == "resident":
        if R < 16:
            raise DDBenchError("impl='resident' needs rank >= 16")
        r1 = 1 << (R.bit_length() - 1)
        r2 = 0 if r1 == R else max(16, triton.next_power_of_2(R - r1))
        tiles = tiles_of(bc)
        _rebuild_resident_kernel[(B * H, triton.cdiv(triton.cdiv(n, bc), tiles))](
            U, SV, idx, inv, k_out, n, H, tiles, *strides, R=R, C=chunk, D=d, BC=bc, R1=r1, R2=r2,
            FAST=fast, num_warps=kw["num_warps"], num_stages=kw["num_stages"])
    else:
        _rebuild_kernel[(B * H, triton.cdiv(n, bc))](
            U, SV, idx, inv, k_out, n, H, *strides, R=R, C=chunk, D=d, BC=bc, RB=kw["rank_block"],
            EVEN_N=n % bc == 0, FAST=fast, num_warps=kw["num_warps"], num_stages=kw["num_stages"])
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


# rebuild_changed's launch: block_chunks changed chunks per block (32 tokens at C = 8: one mma tile of
# rows), 4 warps; programs per (request, head): enough for about 4 per SM, at most `max_split`
LAUNCH_CHANGED = dict(block_chunks=4, num_warps=4, num_stages=2, max_split=4)


def _check_changed(U, SV, old, new, k_out, chunk, slot_offset):
    B, T, R, H, d = _check(U, SV, new, k_out, chunk, slot_offset)
    if old.shape != new.shape:
        raise DDBenchError(f"old ids {tuple(old.shape)} and new ids {tuple(new.shape)} differ in shape")
    if R < 16:
        raise DDBenchError("rebuild_changed needs rank >= 16")
    return B, T, R, H, d


def rebuild_changed(U, SV, old, new, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0,
                    launch: RebuildLaunch = RebuildLaunch()):
    """Rebuild the keys of the slots whose chunk id changed (old[b, h, j] != new[b, h, j]): tokens
    slot_offset + j*C + i of k_out receive RoPE(U[c*C+i] @ SV[h], pos=c*C+i) with c = new[b, h, j];
    every other slot is left as it is. launch.programs per (request, head) (default: about 4 per SM in
    all, at most LAUNCH_CHANGED["max_split"]); its impl and rank_block do not apply (one kernel). No host
    sync: the count of changed slots is found on the device (capturable)."""
    if launch.impl != "auto" or launch.rank_block is not None:
        raise DDBenchError("rebuild_changed has one kernel: its launch takes no impl and no rank_block")
    block_chunks, num_warps, num_stages = launch.block_chunks, launch.num_warps, launch.num_stages
    programs, fast_rope = launch.programs, launch.fast_rope
    B, T, R, H, d = _check_changed(U, SV, old, new, k_out, chunk, slot_offset)
    n = new.shape[2]
    if n == 0 or B * H == 0:
        return k_out
    kw = dict(LAUNCH_CHANGED)
    for key, v in (("block_chunks", block_chunks), ("num_warps", num_warps), ("num_stages", num_stages)):
        if v is not None:
            kw[key] = v
    sms = torch.cuda.get_device_properties(U.device).multi_processor_count if U.is_cuda else 4
    P = programs or max(1, min(kw["max_split"], (4 * sms) // (B * H)))
    KP = triton.next_power_of_2(n)
    r1 = 1 << (R.bit_length() - 1)
    r2 = 0 if r1 == R else max(16, triton.next_power_of_2(R - r1))
    dev = U.device
    old = old.to(device=dev, dtype=torch.int32).contiguous()
    new = new.to(device=dev, dtype=torch.int32).contiguous()
    scratch = torch.empty(B * H * 2 * KP, device=dev, dtype=torch.int32)
    inv = _inv_freq(d, rope_theta, dev)
    fast = U.is_cuda if fast_rope is None else bool(fast_rope)
    _rebuild_changed_kernel[(B * H, P)](
        U, SV, old, new, scratch, inv, k_out, n, H, P, U.stride(0), U.stride(1), SV.stride(0), SV.stride(1),
        SV.stride(2), *k_out.stride()[:3], slot_offset, R=R, C=chunk, D=d, BC=kw["block_chunks"], R1=r1, R2=r2,
        KP=KP, FAST=fast, num_warps=kw["num_warps"], num_stages=kw["num_stages"])
    return k_out


def rebuild_changed_ref(U, SV, old, new, k_out, *, chunk=8, rope_theta=500000.0, slot_offset=0, **_):
    B, T, R, H, d = _check_changed(U, SV, old, new, k_out, chunk, slot_offset)
    ar = torch.arange(chunk, device=new.device)
    for b in range(B):
        for h in range(H):
            js = (old[b, h] != new[b, h]).nonzero().view(-1)
            if js.numel() == 0:
                continue
            tok = (new[b, h, js].long()[:, None] * chunk + ar).view(-1).to(U.device)
            k = apply_rope_ref(U[b, tok].float() @ SV[b, h].float(), tok, rope_theta)
            dst = (slot_offset + js.long()[:, None] * chunk + ar).view(-1).to(k_out.device)
            k_out[b, h, dst] = k.to(k_out.dtype)
    return k_out
