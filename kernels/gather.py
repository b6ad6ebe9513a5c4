"""Gather selected KV chunks from pinned host memory into a compact GPU buffer.

    gather_uva(host_kv, layer, idx, k_out, v_out, *, slot_offset=0, prev=None, programs=32, items=None, scales=None)
        host_kv [L, B, H, N, 2, C, d] pinned (ddbench.kernels.layout; request and layer strides free); idx [B, H, n] int32 chunk ids;
        k_out, v_out [B, H, S, d] on the GPU (k_out=None: values only, as ShadowKV fetches).
        fp8: host_kv float8_e4m3fn with `scales` (ddbench.kernels.fp8.quantize_host_kv: one fp32 per K or V piece of
        its storage); the pieces cross the link as e4m3 and are dequantised in the kernel into the
        outputs' dtype (bf16): the GPU buffers, and so attention, stay as in bf16.

        Slot j of (b, h) receives chunk idx[b, h, j] at tokens slot_offset + j*C .. + C.
        prev=(prev_idx, prev_k, prev_v): chunks found in prev_idx are copied from the previous
        GPU buffers (HBM) and only the misses cross PCIe (ShadowKV reuse). prev buffers must not
        alias the outputs.
    gather_ref(...)                       torch twin, same arguments
    gather_cpu_staging(host_kv, layer, idx_cpu, staging, dev_stage, k_out, v_out)   baseline
    gather_per_chunk(host_kv, layer, idx_list, dev_stage, k_out, v_out)             baseline

The Triton kernel reads the host pointer directly (UVA) and is persistent: `programs` blocks
loop over the (b, h, j) items, `items` chunks per iteration in flight per block (launch_items: 2 for
bf16, more for the smaller fp8 pieces). About 32 blocks fill PCIe (ANCHORS.md); more would only crowd
out urgent work on the SMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError
from ddbench.kernels.fp8 import E4M3, check_host_scales, dequantized_layer, layer_scales
from ddbench.kernels.indexsets import reuse_plan
from ddbench.kernels.layout import check_host_kv


@triton.jit
def _gather_kernel(host, scales, idx, src_slot, prev_k, prev_v, k_out, v_out,
                   n_items, n_sel, H, N, s_hb,
                   s_ob, s_oh, s_ot, s_pb, s_ph, s_pt, slot_offset,
                   CD: tl.constexpr, C: tl.constexpr, ITEMS: tl.constexpr,
                   FETCH_K: tl.constexpr, REUSE: tl.constexpr, FP8: tl.constexpr):
    p = tl.program_id(0)
    G = tl.num_programs(0)
    e = tl.arange(0, CD)[None, :]
    for base in range(p * ITEMS, n_items, G * ITEMS):
        it = base + tl.arange(0, ITEMS)
        ok = it < n_items
        j = it % n_sel
        bh = it // n_sel
        h = bh % H
        b = bh // H
        ch = tl.load(idx + it, mask=ok, other=0).to(tl.int64)
        row = b.to(tl.int64) * s_hb + (h.to(tl.int64) * N + ch) * (2 * CD)   # s_hb: the host's request stride
        dst = (b.to(tl.int64) * s_ob + h * s_oh + (slot_offset + j * C).to(tl.int64) * s_ot)[:, None] + e
        fetch = ok
        if REUSE:
            src = tl.load(src_slot + it, mask=ok, other=-1)
            hit = ok & (src >= 0)
            fetch = ok & (src < 0)
            poff = (b.to(tl.int64) * s_pb + h * s_ph + (src * C).to(tl.int64) * s_pt)[:, None] + e
        # issue every load before the first store: more PCIe reads in flight per block
        v = tl.load(host + row[:, None] + CD + e, mask=fetch[:, None])
        if FETCH_K:
            k = tl.load(host + row[:, None] + e, mask=fetch[:, None])
        if FP8:       # e4m3 bytes and the pieces' scales (scale i belongs to the host's CD elements i*CD..)
            sv = tl.load(scales + row // CD + 1, mask=fetch, other=0.0)
            v = (v.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sv[:, None]).to(v_out.dtype.element_ty)
            if FETCH_K:
                sk = tl.load(scales + row // CD, mask=fetch, other=0.0)
                k = (k.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sk[:, None]).to(k_out.dtype.element_ty)
        if REUSE:
            v = tl.where(hit[:, None], tl.load(prev_v + poff, mask=hit[:, None]), v)
            if FETCH_K:
                k = tl.where(hit[:, None], tl.load(prev_k + poff, mask=hit[:, None]), k)
        tl.store(v_out + dst, v, mask=ok[:, None])
        if FETCH_K:
            tl.store(k_out + dst, k, mask=ok[:, None])


def out_dtype_ok(host_kv, t) -> bool:
    """Outputs keep the host's dtype, or (fp8 host) any floating dtype of at least 16 bits."""
    if host_kv.dtype == E4M3:
        return t.dtype in (torch.bfloat16, torch.float16, torch.float32)
    return t.dtype == host_kv.dtype


FP8_IN_FLIGHT = 256     # fp8 pieces (2 KiB) in flight per launch: 90-91 % of the big copy from 32 programs x 8
                        # (bench link, traces/link/h200); bf16 pieces (4 KiB) keep 2 per program (92-93 % at 32)


def launch_items(items, programs: int, host_kv) -> int:
    """Chunks in flight per program: `items`, or by default 2 (bf16) and FP8_IN_FLIGHT / programs rounded
    down to a power of two (fp8)."""
    if items is not None:
        return int(items)
    if host_kv.dtype != E4M3:
        return 2
    return max(2, 1 << (max(1, FP8_IN_FLIGHT // max(1, programs)).bit_length() - 1))


def check_gather_args(host_kv, layer, idx, k_out, v_out, slot_offset, scales=None):
    """(B, H, N, C, d) of a gather's host KV, ids and outputs, checked against each other, or DDBenchError."""
    check_host_kv(host_kv)
    check_host_scales(host_kv, scales)
    L, B, H, N, _, C, d = host_kv.shape
    if not 0 <= layer < L:
        raise DDBenchError(f"layer {layer} out of range 0..{L - 1}")
    if idx.dim() != 3 or idx.shape[:2] != (B, H):
        raise DDBenchError(f"idx must be [B={B}, H={H}, n], got {tuple(idx.shape)}")
    for t in (k_out, v_out):
        if t is None:
            continue
        if t.dim() != 4 or t.shape[:2] != (B, H) or t.shape[3] != d or not out_dtype_ok(host_kv, t):
            want = "bf16/fp16/fp32" if host_kv.dtype == E4M3 else host_kv.dtype
            raise DDBenchError(f"output buffers must be [B, H, S, {d}] {want}, got {tuple(t.shape)} {t.dtype}")
        if t.stride(3) != 1 or t.stride(2) != d:
            raise DDBenchError("output buffers need contiguous token rows (stride(2) == head_dim)")
        if slot_offset + idx.shape[2] * C > t.shape[2]:
            raise DDBenchError(f"{idx.shape[2]} chunks of {C} tokens at offset {slot_offset} overflow a buffer of {t.shape[2]} tokens")
    if k_out is not None and k_out.stride() != v_out.stride():
        raise DDBenchError("k_out and v_out must have the same strides")
    return B, H, N, C, d


def gather_uva(host_kv, layer, idx, k_out, v_out, *, slot_offset=0, prev=None, programs=32, items=None, scales=None):
    """Persistent UVA gather (see module docstring). Returns the launch's src_slot (None without prev)."""
    B, H, N, C, d = check_gather_args(host_kv, layer, idx, k_out, v_out, slot_offset, scales)
    n_sel = idx.shape[2]
    n_items = B * H * n_sel
    if C * d & (C * d - 1):
        raise DDBenchError(f"chunk * head_dim must be a power of two, got {C}*{d}")
    idx = idx.to(device=v_out.device, dtype=torch.int32).contiguous()
    src_slot, pk, pv, ps = idx, v_out, v_out, v_out.stride()
    if prev is not None:
        prev_idx, pk, pv = prev
        pk = pv if pk is None else pk
        if pv.data_ptr() == v_out.data_ptr() or (k_out is not None and pk.data_ptr() == k_out.data_ptr()):
            raise DDBenchError("reuse gather: previous buffers must not alias the outputs")
        if pv.stride(3) != 1 or pv.stride(2) != d or pk.stride() != pv.stride():
            raise DDBenchError("previous buffers need the same row layout as the outputs")
        src_slot = reuse_plan(prev_idx.to(v_out.device), idx).contiguous()
        ps = pv.stride()
    if n_items == 0:
        return None
    items = launch_items(items, programs, host_kv)
    grid = (max(1, min(programs, triton.cdiv(n_items, items))),)
    fp8 = host_kv.dtype == E4M3
    src = host_kv[layer].view(torch.uint8) if fp8 else host_kv[layer]
    sc = layer_scales(host_kv, layer, scales) if fp8 else v_out
    _gather_kernel[grid](src, sc, idx, src_slot, pk, pv, v_out if k_out is None else k_out, v_out,
                         n_items, n_sel, H, N, host_kv.stride(1), *v_out.stride()[:3], *ps[:3], slot_offset,
                         CD=C * d, C=C, ITEMS=items, FETCH_K=k_out is not None, REUSE=prev is not None,
                         FP8=fp8, num_warps=4)
    return src_slot if prev is not None else None


def gather_ref(host_kv, layer, idx, k_out, v_out, *, slot_offset=0, prev=None, scales=None, **_):
    """Torch twin of gather_uva: the same writes, by advanced indexing (fp8: dequantised in fp32, then
    cast to the outputs' dtype, as the kernel rounds)."""
    B, H, N, C, d = check_gather_args(host_kv, layer, idx, k_out, v_out, slot_offset, scales)
    n = idx.shape[2]
    src = dequantized_layer(host_kv, layer, scales, v_out.dtype).to(v_out.device)
    bi = torch.arange(B, device=v_out.device)[:, None, None]
    hi = torch.arange(H, device=v_out.device)[None, :, None]
    ix = idx.to(v_out.device).long()
    sel = src[bi, hi, ix]  # [B, H, n, 2, C, d]
    if prev is not None:
        prev_idx, pk, pv = prev
        slot = reuse_plan(prev_idx.to(v_out.device), ix).long()
        hit = slot >= 0
        s = slot.clamp(min=0)
        for part, pbuf in ((0, pk), (1, pv)):
            if pbuf is None:
                continue
            old = pbuf.view(B, H, -1, C, d)[bi, hi, s]  # [B, H, n, C, d]
            sel[:, :, :, part] = torch.where(hit[..., None, None], old, sel[:, :, :, part])
    rows = slice(slot_offset, slot_offset + n * C)
    v_out[:, :, rows] = sel[:, :, :, 1].reshape(B, H, n * C, d)
    if k_out is not None:
        k_out[:, :, rows] = sel[:, :, :, 0].reshape(B, H, n * C, d)


def _split(dev_stage, B, H, n, C, d, k_out, v_out, slot_offset):
    kv = dev_stage[:B * H * n].view(B, H, n, 2, C, d)
    rows = slice(slot_offset, slot_offset + n * C)
    if k_out is not None:
        k_out[:, :, rows] = kv[:, :, :, 0].reshape(B, H, n * C, d)
    v_out[:, :, rows] = kv[:, :, :, 1].reshape(B, H, n * C, d)


def gather_cpu_staging(host_kv, layer, idx_cpu, staging, dev_stage, k_out, v_out, slot_offset=0):
    """Baseline (paper Fig. 19 'CPU gather'): index_select on the CPU into pinned staging, one H2D copy.

    staging: pinned [>= B*H*n, 2*C*d]; dev_stage: GPU tensor of the same shape.
    """
    L, B, H, N, _, C, d = host_kv.shape
    n = idx_cpu.shape[2]
    flat = (torch.arange(B * H).view(B, H, 1) * N + idx_cpu.long()).view(-1)
    torch.index_select(host_kv[layer].view(B * H * N, 2 * C * d), 0, flat, out=staging[:B * H * n])
    dev_stage[:B * H * n].copy_(staging[:B * H * n], non_blocking=True)
    _split(dev_stage, B, H, n, C, d, k_out, v_out, slot_offset)


def gather_per_chunk(host_kv, layer, idx_list, dev_stage, k_out, v_out, slot_offset=0):
    """Baseline: one cudaMemcpyAsync per chunk (idx_list: nested python lists [B][H][n])."""
    L, B, H, N, _, C, d = host_kv.shape
    src = host_kv[layer].view(B, H, N, 2 * C * d)
    n = len(idx_list[0][0])
    r = 0
    for b in range(B):
        for h in range(H):
            for c in idx_list[b][h]:
                dev_stage[r].copy_(src[b, h, c], non_blocking=True)
                r += 1
    _split(dev_stage, B, H, n, C, d, k_out, v_out, slot_offset)
