"""Two ways to keep an urgent fetch from queueing behind a prefetch (issue 32, part 3), for bench link's
urgent test (kernels/linkbench.py) to measure. The engine's chunk cache takes the yield (its slot gather,
kernels/engine/transfer.gather_slots, polls the same flag) behind EngineConfig.yield_prefetch.

    gather_yielding(host_kv, layer, idx, k_out, v_out, YieldFlag(flag, spin=SPIN, polls=None), *, slot_offset=0,
                    programs=32, items=None, scales=None) -> programs launched
        gather_uva's contract and bytes (kernels/gather.py, without reuse: bf16, or fp8 dequantised in the
        kernel), plus `flag`, an int32 [1] device tensor. Each program reads the flag with a volatile load
        (flag_now: from L2 every time, never a cached copy) once at its start and once beside each round of `items`
        pieces, after that round's reads are issued, so the read's latency hides behind the pieces. While
        the last read found the flag nonzero, the program issues no new round and polls again. So a raise
        stops each program within two rounds: the one in flight, and the next if its read came first.
        polls: None, or an int32 device tensor with at least `programs` entries. Program p writes there
        how many of its polls found the flag set (spin: its budget is spent, and it ignored the flag
        afterwards). Entries past the launched programs are left as they were.
    gather_yielding_ref(...)   torch twin, same arguments: gather_ref's writes. polls are written as a launch
        sees a flag that holds still through it: spin for every program while it is set, 0 while it is clear.
    raise_flag(flag), lower_flag(flag)
        The urgent side. Each is one tiny fill kernel on the current stream: raise_flag just before the
        urgent gather, lower_flag after it.
    prefetch_slices(idx, slices, C) -> [(slot_offset, idx part)]
        The selection cut along its chunks into `slices` contiguous parts (part s holds chunks
        s*n//slices .. (s+1)*n//slices of every (b, h), at tokens slot_offset ..).
    gather_sliced(host_kv, layer, parts, k_out, v_out, *, slot_offset=0, **gather_uva keywords)
        The sliced prefetch: one gather_uva launch per part, back to back on the current stream. Between
        two launches the scheduler can start a high-priority launch's blocks first. Together the launches
        write exactly what one gather_uva launch of the whole selection writes.

Why the yielding gather waits a bounded number of polls, in one launch. Each program has a budget of
`spin` polls for the whole launch, not one per piece. Once the budget is spent, the program ignores the
flag until it ends. A launch is therefore never longer than its own pieces plus `spin` polls (one L2
round trip each), whatever happens to the flag, so it cannot deadlock. An unbounded wait would hang
whenever the lowering cannot run before the prefetch ends:
  - the urgent stream waits on an event recorded after the prefetch;
  - the urgent work runs on the prefetch's own stream (the engine's FIFO ablation);
  - a CUDA graph orders the two launches;
  - the SMs are all taken, so the urgent launch never starts;
  - Triton's CPU interpreter runs every launch to its end before the next operation.
The other design was to exit early and leave the rest for a follow-up launch queued behind on the prefetch
stream. It is no better. The follow-up starts the moment the first launch ends, while the flag is still
raised, so it must itself wait or exit again. A chain of such launches must end in one that ignores the
flag, which is the same bounded wait, paid for in launches, with a cursor per program kept in device
memory. Without a host sync, nobody knows how many follow-ups to queue. The spin keeps the programs
resident: they resume within one poll of the lowering, and the prefetch stays one launch, as the
engine's is. SPIN (1 << 14 polls, a few ms) outlasts an urgent fetch inside a prefetch (0.2-0.7 ms in
traces/link/h200). The polls output shows whether a run ever spent it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError
from ddbench.kernels.fp8 import E4M3, layer_scales
from ddbench.kernels.gather import check_gather_args, gather_ref, gather_uva, launch_items

SPIN = 1 << 14          # polls per program per launch at most (the wait's bound; see the module docstring)


@triton.jit
def flag_now(flag):
    """The flag as it is now: a volatile load (PTX ld.volatile, read again at every poll)."""
    return tl.load(flag, volatile=True)


@triton.jit(do_not_specialize=["spin"])
def _yield_kernel(host, scales, idx, flag, polls, k_out, v_out, n_items, n_sel, H, N, s_hb,
                  s_ob, s_oh, s_ot, slot_offset, spin,
                  CD: tl.constexpr, C: tl.constexpr, ITEMS: tl.constexpr, FETCH_K: tl.constexpr,
                  FP8: tl.constexpr, COUNT: tl.constexpr):
    p = tl.program_id(0)
    G = tl.num_programs(0)
    e = tl.arange(0, CD)[None, :]
    left = spin
    raised = flag_now(flag)
    for base in range(p * ITEMS, n_items, G * ITEMS):
        # yield the link: no new reads while the urgent side holds the flag, within the launch's budget
        while (left > 0) & (raised != 0):
            left -= 1
            raised = flag_now(flag)
        it = base + tl.arange(0, ITEMS)
        ok = it < n_items
        j = it % n_sel
        bh = it // n_sel
        h = bh % H
        b = bh // H
        ch = tl.load(idx + it, mask=ok, other=0).to(tl.int64)
        row = b.to(tl.int64) * s_hb + (h.to(tl.int64) * N + ch) * (2 * CD)
        dst = (b.to(tl.int64) * s_ob + h * s_oh + (slot_offset + j * C).to(tl.int64) * s_ot)[:, None] + e
        v = tl.load(host + row[:, None] + CD + e, mask=ok[:, None])       # every load before the first store
        if FETCH_K:
            k = tl.load(host + row[:, None] + e, mask=ok[:, None])
        raised = flag_now(flag)                   # for the next round: its wait overlaps this round's pieces
        if FP8:
            sv = tl.load(scales + row // CD + 1, mask=ok, other=0.0)
            v = (v.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sv[:, None]).to(v_out.dtype.element_ty)
            if FETCH_K:
                sk = tl.load(scales + row // CD, mask=ok, other=0.0)
                k = (k.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sk[:, None]).to(k_out.dtype.element_ty)
        tl.store(v_out + dst, v, mask=ok[:, None])
        if FETCH_K:
            tl.store(k_out + dst, k, mask=ok[:, None])
    if COUNT:
        tl.store(polls + p, spin - left)


def check_flag(flag, polls, programs, device):
    if not (isinstance(flag, torch.Tensor) and flag.dtype == torch.int32 and flag.numel() == 1
            and flag.device == device):
        raise DDBenchError(f"the yield flag must be an int32 tensor of one element on {device}")
    if polls is not None and not (isinstance(polls, torch.Tensor) and polls.dtype == torch.int32 and polls.dim() == 1
                                  and polls.numel() >= programs and polls.device == device and polls.is_contiguous()):
        raise DDBenchError(f"polls must be a contiguous int32 vector of at least {programs} entries on {device}")


def _grid(n_items, programs, items):
    if not (isinstance(programs, int) and programs >= 1):
        raise DDBenchError(f"programs must be a positive integer, got {programs!r}")
    return max(1, min(programs, triton.cdiv(n_items, items)))


@dataclass(frozen=True, eq=False)
class YieldFlag:
    """The urgent side's flag as a yielding gather polls it: `flag`, an int32 [1] device tensor (raise_flag,
    lower_flag); `spin`, each program's budget of polls for the launch; `polls`, None or an int32 device
    tensor of at least `programs` entries for how many of each program's polls found it raised."""
    flag: torch.Tensor
    spin: int = SPIN
    polls: torch.Tensor | None = None


def gather_yielding(host_kv, layer, idx, k_out, v_out, yielding: YieldFlag, *, slot_offset=0, programs=32, items=None,
                    scales=None) -> int:
    """The yielding prefetch gather (module docstring). Returns the number of programs launched."""
    flag, spin, polls = yielding.flag, yielding.spin, yielding.polls
    B, H, N, C, d = check_gather_args(host_kv, layer, idx, k_out, v_out, slot_offset, scales)
    if C * d & (C * d - 1):
        raise DDBenchError(f"chunk * head_dim must be a power of two, got {C}*{d}")
    if not (isinstance(spin, int) and 0 <= spin < 1 << 31):
        raise DDBenchError(f"spin must be an integer within 0..2^31-1, got {spin!r}")
    n_sel = idx.shape[2]
    n_items = B * H * n_sel
    items = launch_items(items, programs, host_kv)
    grid = _grid(n_items, programs, items)
    check_flag(flag, polls, programs, v_out.device)
    if n_items == 0:
        return 0
    idx = idx.to(device=v_out.device, dtype=torch.int32).contiguous()
    fp8 = host_kv.dtype == E4M3
    src = host_kv[layer].view(torch.uint8) if fp8 else host_kv[layer]
    sc = layer_scales(host_kv, layer, scales) if fp8 else v_out
    _yield_kernel[(grid,)](src, sc, idx, flag, flag if polls is None else polls, v_out if k_out is None else k_out,
                           v_out, n_items, n_sel, H, N, host_kv.stride(1), *v_out.stride()[:3], slot_offset, spin,
                           CD=C * d, C=C, ITEMS=items, FETCH_K=k_out is not None, FP8=fp8, COUNT=polls is not None,
                           num_warps=4)
    return grid


def gather_yielding_ref(host_kv, layer, idx, k_out, v_out, yielding: YieldFlag, *, slot_offset=0, programs=32,
                        items=None, scales=None) -> int:
    """Torch twin of gather_yielding (module docstring): the same writes, polls for a flag held still."""
    flag, spin, polls = yielding.flag, yielding.spin, yielding.polls
    B, H, N, C, d = check_gather_args(host_kv, layer, idx, k_out, v_out, slot_offset, scales)
    n_items = B * H * idx.shape[2]
    grid = _grid(n_items, programs, launch_items(items, programs, host_kv))
    check_flag(flag, polls, programs, v_out.device)
    if n_items == 0:
        return 0
    gather_ref(host_kv, layer, idx, k_out, v_out, slot_offset=slot_offset, scales=scales)
    if polls is not None:
        polls[:grid] = spin if int(flag.item()) != 0 else 0
    return grid


def raise_flag(flag: torch.Tensor) -> None:
    """The urgent side's start: a yielding prefetch issues no new reads from here (the current stream)."""
    flag.fill_(1)


def lower_flag(flag: torch.Tensor) -> None:
    """The urgent side's end: a waiting yielding prefetch resumes."""
    flag.fill_(0)


def prefetch_slices(idx: torch.Tensor, slices: int, C: int):
    """[(slot_offset, idx part)]: `idx` [B, H, n] cut along its chunks into `slices` contiguous int32 parts."""
    if idx.dim() != 3:
        raise DDBenchError(f"idx must be [B, H, n], got {tuple(idx.shape)}")
    n = idx.shape[2]
    if not (isinstance(slices, int) and 1 <= slices <= max(1, n)):
        raise DDBenchError(f"slices must be within 1..{max(1, n)} (the chunks per (b, h)), got {slices!r}")
    cut = [s * n // slices for s in range(slices + 1)]
    return [(a * C, idx[:, :, a:b].to(torch.int32).contiguous()) for a, b in zip(cut, cut[1:])]


def gather_sliced(host_kv, layer, parts, k_out, v_out, *, slot_offset=0, **kw) -> None:
    """One gather_uva launch per part of prefetch_slices, back to back on the current stream."""
    for off, part in parts:
        gather_uva(host_kv, layer, part, k_out, v_out, slot_offset=slot_offset + off, **kw)
