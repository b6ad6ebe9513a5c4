"""One kernel for a chunk-cache fill (kernels/engine/chunkcache.py): lookup, LRU touch, victims, map
update, the compacted miss plan and the attention's row map, one program per (request, KV head).

    fill_fused(cache, layer, ids, stamp, plan, mul=1, add=0, rows=None)

does what ChunkCache.fill (its torch twin: ~30 small kernels) does for layer `layer`, with the stamp
load(stamp) * mul + add read on the device (CUDA-graph safe, no host sync), and, when `rows` is given,
ChunkCache.set_rows of the resulting slots. The plan's items are the same set as the twin's, in an
order set by the programs' atomics (the slot gather reads them in any order); plan.count must be zero
on entry (fill_fused zeroes it on the current stream first).

Per program: the ids' slots (slot_of), hits touched with the stamp, then the S slots sorted by (age key,
slot) in registers (one packed int32 key, ChunkCache.age_key << 16 | slot, ChunkCache's slots < 2**15:
the twin's stable argsort; int32 keys with 8 warps fill 1.8-2.3x faster than the int64 (age, slot) keys
they replaced, traces/kernels/h200-fill-keys), the i-th miss
takes the i-th least recently touched slot (tl.gather), the maps are written and the program's misses
reserved in the plan with one atomic add.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _fill_kernel(ids_ptr, so_ptr, co_ptr, ag_ptr, stamp_ptr, bh_ptr, chunk_ptr, slot_ptr, count_ptr, asm_ptr,
                 rows_ptr, s_ib, s_ih, s_rb, s_rh, H, K, S, NP1,
                 MUL: tl.constexpr, ADD: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
                 C: tl.constexpr, WRITE_ROWS: tl.constexpr, AGE_BIAS: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    so = so_ptr + pid.to(tl.int64) * NP1
    co = co_ptr + pid.to(tl.int64) * (S + 1)
    ag = ag_ptr + pid.to(tl.int64) * (S + 1)
    jk = tl.arange(0, BLOCK_K)
    mk = jk < K
    ids = tl.load(ids_ptr + b * s_ib + h * s_ih + jk, mask=mk, other=0)
    s = tl.load(so + ids, mask=mk, other=-1).to(tl.int32)
    hit = mk & (s >= 0)
    miss = mk & (s < 0)
    stamp = tl.load(stamp_ptr) * MUL + ADD
    tl.store(ag + s, tl.zeros_like(s) + stamp, mask=hit)                 # touch the hits
    tl.debug_barrier()                                                    # ... before the ages are read
    js = tl.arange(0, BLOCK_S)
    age = tl.load(ag + js, mask=js < S, other=0)
    rel = tl.minimum(tl.maximum(age - stamp + AGE_BIAS, 0), 0x7FFF)     # ChunkCache.age_key
    order = tl.sort(tl.where(js < S, (rel << 16) | js, 0x7FFFFFFF)) & 0xFFFF     # least recently touched first
    rank = tl.cumsum(miss.to(tl.int32), 0) - 1
    victim = tl.gather(order, tl.maximum(rank, 0), 0)
    old = tl.load(co + victim, mask=miss, other=-1)
    tl.store(so + old, tl.full([BLOCK_K], -1, tl.int16), mask=miss & (old >= 0))
    tl.store(so + ids, victim.to(tl.int16), mask=miss)
    tl.store(co + victim, ids, mask=miss)
    tl.store(ag + victim, tl.zeros_like(victim) + stamp, mask=miss)
    slot = tl.where(hit, s, victim)
    base = tl.atomic_add(count_ptr, tl.sum(miss.to(tl.int32), 0))
    dst = base + rank
    tl.store(bh_ptr + dst, tl.zeros_like(victim) + pid, mask=miss)
    tl.store(chunk_ptr + dst, ids, mask=miss)
    tl.store(slot_ptr + dst, victim, mask=miss)
    tl.store(asm_ptr + pid.to(tl.int64) * K + jk, ids, mask=mk)
    if WRITE_ROWS:
        lane = tl.arange(0, C)
        r = rows_ptr + b * s_rb + h * s_rh + jk[:, None] * C + lane[None, :]
        tl.store(r, slot[:, None] * C + lane[None, :], mask=mk[:, None])


def fill_fused(cache, layer: int, ids, stamp, plan, *, mul: int = 1, add: int = 0, rows=None):
    """ChunkCache.fill + set_rows in one launch (module doc). ids [B, H, k] int32 (last dim contiguous);
    stamp an int32 device tensor of one element; plan a MissPlan of cache's; rows [B, H, k*C + tail] int32
    or None."""
    B, H, k = ids.shape
    if ids.dtype.itemsize != 4 or ids.stride(2) != 1:
        raise ValueError("fill_fused needs int32 ids with a contiguous last dimension")
    plan.count.zero_()
    so, co, ag = cache.slot_of[layer], cache.chunk_of[layer], cache.age[layer]
    r = rows if rows is not None else plan.assembled
    _fill_kernel[(B * H,)](ids, so, co, ag, stamp, plan.bh, plan.chunk, plan.slot, plan.count, plan.assembled, r,
                           ids.stride(0), ids.stride(1), r.stride(0), r.stride(1), H, k, cache.S, cache.N + 1,
                           MUL=mul, ADD=add, BLOCK_K=triton.next_power_of_2(k),
                           BLOCK_S=triton.next_power_of_2(cache.S), C=cache.C, WRITE_ROWS=rows is not None,
                           AGE_BIAS=cache.AGE_WINDOW,
                           num_warps=8)      # traces/kernels/h200-fill-keys: 8 warps fastest at 1024 and 2048 slots
