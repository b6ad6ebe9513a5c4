"""dualdecoder-cache's GPU chunk cache: per request, layer and KV head, `slots` chunks of K and V, LRU,
looked up and filled on the device with no host sync (CUDA-graph safe): fill() below is the torch
twin, kernels/cachefill.py the same fill in one Triton launch (fill_rows picks; the engine fuses off ref).

    cache = ChunkCache(CacheShape(L, B, H, N, slots, C, d, tail, k_max), device, dtype)
    plan, slot = cache.fill(layer, ids, stamp)   # ids [B, H, k] int32; stamp: a device int32 scalar tensor

fill() makes every chunk of `ids` cached: a cached chunk is a hit (its slot is touched with `stamp`);
a chunk not cached takes the least recently touched slot among those not touched with `stamp` (empty
slots first; slots untouched for more than AGE_WINDOW stamps count as equally old, age_key) and is
touched with it. It returns the chunks to fetch as a MissPlan (kernels/engine/
transfer.py: the compacted (b*H + h, chunk, slot) items and their device count, what gather_slots
reads) and the slot of every id [B, H, k]. Victims are distinct because k <= slots.

The engine fills twice per layer and step t: the prefetch fill with the predicted chunks (stamp 2t,
layer-ahead, on the prefetch stream) and the urgent fill with the true chunks (stamp 2t + 1, on the
compute stream): a wrong prediction of this step is evicted only after everything older. This is the
replay of ddbench/profile/cache.py, so the profile's rates are this cache's.

Layout: k, v [L, B, H, slots * C + tail, d]: the slots' rows, then `tail` rows the engine assembles
(the resident window, generated tokens, the new tokens). Attention reads the true selection through
`rows` [B, H, k * C + tail] int32 (kernels/attention.py: logical token -> physical row).
fp8 (cache_bits 8): k, v [L, B, H, slots * C, d] e4m3, the host's fp8 pieces as they are (slot_kw: the slot
gather's k/v_scale_out), k_scale, v_scale [L, B, H, slots] fp32 (one per chunk and KV head), and the tail
in its own 16-bit tk, tv [L, B, H, tail, d]; attention_kw gives the attention both (kernels/attention.py
tail=, kc=), assemble_target where the engine's assemble writes.
Metadata: slot_of [L, B, H, N + 1] int16 (-1: not cached; column N a write sink), chunk_of and age
[L, B, H, slots + 1] int32 (-1: empty; column `slots` a sink). Sizes: ddbench/core/memory.py
chunk_cache_bytes counts the slots and the map (the sinks, `rows` and the plans are a few MB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.engine.transfer import MissPlan
from ddbench.kernels.fp8 import E4M3


@dataclass(frozen=True)
class CacheShape:
    """A chunk cache's sizes: L layers, B requests, H KV heads, N chunks in the context, `slots` chunks
    cached per (layer, request, KV head), C tokens per chunk, d the head dim, `tail` rows after the
    slots (the generated tokens' 16-bit rows), k_max the largest selection a fill takes."""
    L: int
    B: int
    H: int
    N: int
    slots: int
    C: int
    d: int
    tail: int
    k_max: int


class ChunkCache:
    AGE_WINDOW = 0x7FF0     # age_key: ages from stamp - AGE_WINDOW to stamp + 15 keep their order

    @classmethod
    def age_key(cls, age, stamp):
        """The LRU order's key of a slot (least recently touched first): its age relative to the stamp,
        clamped to 15 bits, so that (key, slot) packs into one int32 (kernels/cachefill.py). Slots untouched
        for more than AGE_WINDOW stamps (about 16K decode steps at two fills a step) tie, in slot order."""
        return (age - stamp + cls.AGE_WINDOW).clamp(0, 0x7FFF)

    def __init__(self, shape: CacheShape, device, dtype, fused=False, fp8=False):
        L, B, H, N, slots, C, d, tail, k_max = (shape.L, shape.B, shape.H, shape.N, shape.slots, shape.C, shape.d,
                                                shape.tail, shape.k_max)
        if slots < k_max:
            raise DDBenchError(f"a chunk cache of {slots} chunks cannot hold a selection of {k_max}")
        if slots >= 2 ** 15:
            raise DDBenchError(f"a chunk cache of {slots} chunks per head exceeds the int16 map (32767)")
        self.L, self.B, self.H, self.N, self.S, self.C, self.tail = L, B, H, N, slots, C, tail
        self.fused = fused                # fill_rows: one Triton launch (kernels/cachefill.py), else the twin below
        self.fp8 = fp8
        if fp8:                           # e4m3 slots with their scales; the tail 16-bit, apart
            self.k = torch.zeros(L, B, H, slots * C, d, device=device, dtype=E4M3)
            self.k_scale = torch.ones(L, B, H, slots, device=device, dtype=torch.float32)
            self.v_scale = torch.ones_like(self.k_scale)
            self.tk = torch.zeros(L, B, H, tail, d, device=device, dtype=dtype)
            self.tv = torch.zeros_like(self.tk)
        else:
            self.k = torch.zeros(L, B, H, slots * C + tail, d, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.slot_of = torch.full((L, B, H, N + 1), -1, device=device, dtype=torch.int16)
        self.chunk_of = torch.full((L, B, H, slots + 1), -1, device=device, dtype=torch.int32)
        self.age = torch.full((L, B, H, slots + 1), -1, device=device, dtype=torch.int32)
        n = B * H * k_max
        self.bh_of = torch.arange(B * H, device=device, dtype=torch.int32).repeat_interleave(k_max)
        self.plans = {}                   # kind -> MissPlan buffers (one per stream that fills)
        self.n_items = n
        self.rows = torch.empty(B, H, k_max * C + tail, device=device, dtype=torch.int32)
        self.rows[:, :, k_max * C:] = slots * C + torch.arange(tail, device=device, dtype=torch.int32)
        self.lane = torch.arange(C, device=device, dtype=torch.int32)

    def _plan(self, kind, k):
        if kind not in self.plans:
            dev, n = self.k.device, self.n_items + 1
            e = lambda: torch.zeros(n, device=dev, dtype=torch.int32)    # noqa: E731
            self.plans[kind] = MissPlan(bh=e(), chunk=e(), slot=e(), count=torch.zeros(1, device=dev, dtype=torch.int32),
                                        assembled=torch.zeros(self.B, self.H, k, device=dev, dtype=torch.int32), k=k)
        return self.plans[kind]

    def fill(self, layer: int, ids: torch.Tensor, stamp: torch.Tensor, kind: str = "urgent"):
        """(MissPlan of the chunks to fetch, slot of every id [B, H, k] int64): see the module doc."""
        so, co, ag = self.slot_of[layer], self.chunk_of[layer], self.age[layer]
        S, N = self.S, self.N
        idl = ids.long()
        s = so.gather(2, idl).long()                                     # [B, H, k]
        hit = s >= 0
        miss = ~hit
        st = stamp.reshape(1, 1, 1).to(torch.int32)
        ag.scatter_(2, torch.where(hit, s, S), st.expand(s.shape).contiguous())   # touch the hits
        order = self.age_key(ag[..., :S], st).argsort(dim=2, stable=True)   # least recently touched first
        rank = (miss.to(torch.int32).cumsum(2) - 1).clamp(min=0).long()
        victim = torch.where(miss, order.gather(2, rank), S)             # hits write the sink
        old = torch.where(miss, co.gather(2, victim).long(), -1)
        so.scatter_(2, torch.where(old >= 0, old, N), torch.full_like(victim, -1, dtype=torch.int16))
        so.scatter_(2, torch.where(miss, idl, N), victim.to(torch.int16))
        co.scatter_(2, victim, ids.to(torch.int32))
        ag.scatter_(2, victim, st.expand(s.shape).contiguous())
        slot = torch.where(hit, s, victim)
        plan = self._plan(kind, ids.shape[2])
        flat = miss.reshape(-1)
        n = flat.numel()
        dst = torch.where(flat, flat.to(torch.int32).cumsum(0).long() - 1, n)
        plan.bh.scatter_(0, dst, self.bh_of[:n])
        plan.chunk.scatter_(0, dst, ids.reshape(-1).to(torch.int32))
        plan.slot.scatter_(0, dst, slot.reshape(-1).to(torch.int32))
        plan.count.copy_(flat.sum().to(torch.int32).reshape(1))
        plan.assembled.copy_(ids)
        return plan, slot

    def fill_rows(self, layer: int, ids: torch.Tensor, stamp: torch.Tensor, *, mul: int = 1, add: int = 0,
                  kind: str = "urgent", rows: bool = False):
        """What the engine calls: fill() with the stamp stamp * mul + add (stamp a device int32 tensor of one
        element), and set_rows of its slots when `rows`. -> (MissPlan, rows or None). Fused: one launch
        (kernels/cachefill.py fill_fused; the plan's items in another order), else fill() and set_rows."""
        plan = self._plan(kind, ids.shape[2])
        if self.fused:
            from ddbench.kernels.cachefill import fill_fused
            fill_fused(self, layer, ids, stamp, plan, mul=mul, add=add, rows=self.rows if rows else None)
            return plan, (self.rows if rows else None)
        st = stamp * mul + add if (mul, add) != (1, 0) else stamp
        plan, slot = self.fill(layer, ids, st, kind)
        return plan, (self.set_rows(slot) if rows else None)

    def set_rows(self, slot: torch.Tensor) -> torch.Tensor:
        """rows[:, :, :k*C] = the true selection's physical rows (slot * C + lane), in its order."""
        B, H, k = slot.shape
        self.rows[:, :, :k * self.C].view(B, H, k, self.C).copy_(slot.to(torch.int32)[..., None] * self.C + self.lane)
        return self.rows

    def tail_view(self, t: torch.Tensor, kC: int) -> torch.Tensor:
        """A view of layer buffer t [B, H, S*C + tail, d] whose rows kC.. are its tail: what the engine's
        assemble writes at kC onward lands after the slots."""
        return t[:, :, self.S * self.C - kC:]

    def assemble_target(self, layer: int, kC: int):
        """(k, v, row offset) the engine's assemble writes layer's tail into: the slots' buffers viewed so that
        rows kC.. are the tail, or (fp8) the 16-bit tail buffers from row 0."""
        if self.fp8:
            return self.tk[layer], self.tv[layer], 0
        return self.tail_view(self.k[layer], kC), self.tail_view(self.v[layer], kC), kC

    def attention_kw(self, layer: int, kC: int) -> dict:
        """What the attention needs beside the buffers and rows: fp8, the slots' scales and the tail."""
        if not self.fp8:
            return {}
        return dict(k_scale=self.k_scale[layer], v_scale=self.v_scale[layer], chunk=self.C,
                    tail=(self.tk[layer], self.tv[layer]), kc=kC)

    def slot_kw(self, layer: int) -> dict:
        """What the slot gather needs beside the buffers: fp8, where the pieces' scales go."""
        return dict(scale_out=(self.k_scale[layer], self.v_scale[layer])) if self.fp8 else {}
