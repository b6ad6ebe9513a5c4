"""Transfer engine pieces (DualDecoder §5.3-5.4): miss planning, the slot-addressed miss gather,
forced-miss perturbation, and the stream/event scheduler with its hazard log.

    plan_misses(pred, true) -> MissPlan
        pred, true [B, H, k] int32 chunk ids (k distinct each). The buffer holds `pred` in slots
        0..k-1 (the prefetch wrote slot j = pred[..., j]). Misses (true - pred) go into the slots of
        the wrong predictions (pred - true): after the fill the buffer holds exactly `true`, in slot
        order `assembled`, so attention over the k*C selected tokens is attention over the true set.
        All on the device, no host sync: a stable sort puts the misses (and the free slots) first,
        per (b, h) in flat order, so the r-th miss and the r-th free slot share their (b, h).
    gather_slots(host_kv, layer, plan, k_out, v_out, programs=64)   urgent path: UVA reads of the
        misses only; the item count is read on the device (`plan.count`), so no host sync.
    gather_slots_ref(...)                                            torch twin
    perturb(base, miss_rate, n_chunks, gen)                          forced-miss index: `base` with
        round(miss_rate*k) chunks per (b, h) replaced by random chunks outside `base` (sorted)
    Sched                                                            streams + events (CUDA), or an
        in-order stand-in on the CPU; both keep a log of (op, stream, waits) for the hazard tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.indexsets import reuse_plan
from kernels.layout import check_host_kv


@dataclass
class MissPlan:
    bh: torch.Tensor         # int32 [B*H*k]: (b*H + h) of item r (valid for r < count)
    chunk: torch.Tensor      # int32 [B*H*k]: chunk id to fetch
    slot: torch.Tensor       # int32 [B*H*k]: destination slot within (b, h)
    count: torch.Tensor      # int32 [1]: number of misses (device)
    assembled: torch.Tensor  # int32 [B, H, k]: chunk id held by each slot after the fill
    k: int


def plan_misses(pred: torch.Tensor, true: torch.Tensor) -> MissPlan:
    B, H, k = true.shape
    src = reuse_plan(pred, true).long()                      # slot in pred of each true chunk, or -1
    miss = src < 0                                           # [B, H, k] over true's positions
    used = _used_slots(src, miss, k)                        # pred slots that hold a true chunk
    order_m = torch.sort((~miss).view(-1).to(torch.uint8), stable=True).indices
    order_f = torch.sort(used.view(-1).to(torch.uint8), stable=True).indices
    count = miss.sum().to(torch.int32).view(1)
    n = B * H * k
    r = torch.arange(n, device=true.device)
    chunk = true.reshape(-1)[order_m].to(torch.int32)
    valid = r < count
    flat = pred.reshape(-1).to(torch.int32).clone()
    flat.scatter_(0, order_f, torch.where(valid, chunk, flat[order_f]))
    return MissPlan(bh=(order_m // k).to(torch.int32), chunk=chunk, slot=(order_f % k).to(torch.int32),
                    count=count, assembled=flat.view(B, H, k), k=k)


def _used_slots(src: torch.Tensor, miss: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean [B, H, k]: pred slot s holds some true chunk (scatter-add of hit counts)."""
    cnt = torch.zeros(src.shape, dtype=torch.int32, device=src.device)
    cnt.scatter_add_(-1, src.clamp(min=0), (~miss).to(torch.int32))
    return cnt > 0


@triton.jit
def _slot_gather_kernel(host, bh_ptr, ch_ptr, slot_ptr, count_ptr, k_out, v_out, H, N,
                        s_ob, s_oh, s_ot, CD: tl.constexpr, C: tl.constexpr, ITEMS: tl.constexpr,
                        FETCH_K: tl.constexpr):
    p = tl.program_id(0)
    G = tl.num_programs(0)
    n_items = tl.load(count_ptr)
    e = tl.arange(0, CD)[None, :]
    for base in range(p * ITEMS, n_items, G * ITEMS):
        it = base + tl.arange(0, ITEMS)
        ok = it < n_items
        bh = tl.load(bh_ptr + it, mask=ok, other=0).to(tl.int64)
        ch = tl.load(ch_ptr + it, mask=ok, other=0).to(tl.int64)
        sl = tl.load(slot_ptr + it, mask=ok, other=0).to(tl.int64)
        b = bh // H
        h = bh % H
        row = (bh * N + ch) * (2 * CD)
        dst = (b * s_ob + h * s_oh + sl * C * s_ot)[:, None] + e
        v = tl.load(host + row[:, None] + CD + e, mask=ok[:, None])
        if FETCH_K:
            k = tl.load(host + row[:, None] + e, mask=ok[:, None])
        tl.store(v_out + dst, v, mask=ok[:, None])
        if FETCH_K:
            tl.store(k_out + dst, k, mask=ok[:, None])


def gather_slots(host_kv, layer, plan: MissPlan, k_out, v_out, *, programs=64, items=2):
    """Fetch plan's misses from host_kv[layer] into slot plan.slot of (b, h) (k_out None: values only)."""
    check_host_kv(host_kv)
    L, B, H, N, _, C, d = host_kv.shape
    n = plan.bh.numel()
    if n == 0:
        return
    grid = (max(1, min(programs, triton.cdiv(n, items))),)
    _slot_gather_kernel[grid](host_kv[layer], plan.bh, plan.chunk, plan.slot, plan.count,
                              v_out if k_out is None else k_out, v_out, H, N, *v_out.stride()[:3],
                              CD=C * d, C=C, ITEMS=items, FETCH_K=k_out is not None, num_warps=4)


def gather_slots_ref(host_kv, layer, plan: MissPlan, k_out, v_out, **_):
    L, B, H, N, _, C, d = host_kv.shape
    n = int(plan.count.item())
    if n == 0:
        return
    bh = plan.bh[:n].long().cpu()
    ch = plan.chunk[:n].long().cpu()
    sl = plan.slot[:n].long().cpu()
    src = host_kv[layer].view(B * H, N, 2, C, d)[bh, ch].to(v_out.device)  # [n, 2, C, d]
    b, h = (bh // H).to(v_out.device), (bh % H).to(v_out.device)
    tok = (sl[:, None] * C + torch.arange(C)).to(v_out.device)             # [n, C]
    v_out[b[:, None], h[:, None], tok] = src[:, 1]
    if k_out is not None:
        k_out[b[:, None], h[:, None], tok] = src[:, 0]


def perturb(base: torch.Tensor, miss_rate: float, n_chunks: int, gen: torch.Generator | None) -> torch.Tensor:
    """`base` [B, H, k] with m = round(miss_rate*k) entries per (b, h) swapped for chunks outside it."""
    B, H, k = base.shape
    m = int(round(miss_rate * k))
    if m == 0:
        return base.clone()
    dev = base.device
    r = torch.rand(B, H, n_chunks, device=dev, generator=gen)
    r.scatter_(-1, base.long(), -1.0)                       # never pick a chunk already in base
    new = r.topk(m, dim=-1).indices                          # m fresh chunks per (b, h)
    drop = torch.rand(B, H, k, device=dev, generator=gen).topk(k - m, dim=-1).indices
    keep = base.gather(-1, drop).long()
    return torch.cat([keep, new], -1).sort(-1).values.to(torch.int32)


class Sched:
    """CUDA streams and events, or an in-order CPU stand-in; records a hazard log when `log` is set.

    Streams: 'compute' (whatever stream is current: the capture stream inside a CUDA graph),
    'prefetch' (low priority), 'urgent' (high priority, or the prefetch stream itself when
    `urgent_priority` is off: FIFO behind the prefetches). The side streams are created with their
    priority, so kernels captured from them keep it as their graph nodes' priority.

    Every side-stream op first waits on an event recorded on the compute stream at its issue (a
    fork): it never runs ahead of the compute work issued before it (the indices it reads), and
    inside a capture every side stream joins the graph this way. `join()` makes the compute stream
    wait for every side stream used since the last join (a capture must end joined).
    """

    def __init__(self, device, urgent_priority: bool = True, log: bool = False):
        self.cuda = torch.device(device).type == "cuda"
        self.log = [] if log else None
        if self.cuda:
            lo, hi = 0, -10  # torch clamps to the device's range (0 .. -5 on Hopper)
            self.streams = {"compute": None, "prefetch": torch.cuda.Stream(priority=lo)}
            self.streams["urgent"] = torch.cuda.Stream(priority=hi) if urgent_priority else self.streams["prefetch"]
        else:
            self.streams = {"compute": None, "prefetch": None, "urgent": None}
        self.alias = {"urgent": "urgent" if urgent_priority else "prefetch"}
        self._n = 0
        self.capturing = False
        self.used = set()

    def stream(self, sname):
        st = self.streams[sname]
        return torch.cuda.current_stream() if st is None else st

    def join(self):
        """The compute stream waits for every side stream used since the last join."""
        if not self.cuda:
            return
        cur = torch.cuda.current_stream()
        for sname in sorted(self.used):
            e = torch.cuda.Event()
            e.record(self.streams[sname])
            cur.wait_event(e)
        self.used.clear()

    def name(self, s):
        return self.alias.get(s, s)

    def run(self, stream, op, fn, waits=(), record=None, **info):
        """Run `fn` on `stream` after `waits` (events); return an event recorded after it."""
        sname = self.name(stream)
        if self.log is not None:
            self.log.append(dict(op=op, stream=sname, waits=[w.tag for w in waits if w is not None], **info))
        ev = _Ev(f"{op}#{self._n}")
        self._n += 1
        if self.cuda:
            st = self.stream(sname)
            if sname != "compute":
                fork = torch.cuda.Event()
                fork.record(torch.cuda.current_stream())
                st.wait_event(fork)
                self.used.add(sname)
            for w in waits:
                if w is not None:
                    st.wait_event(w.ev)
            with torch.cuda.stream(st):
                out = fn()
                ev.ev = torch.cuda.Event()
                ev.ev.record(st)
        else:
            out = fn()
        if self.log is not None:
            self.log[-1]["event"] = ev.tag
        return ev, out

    def timing_event(self, stream="compute"):
        if not self.cuda:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record(self.stream(self.name(stream)))
        return e


class _Ev:
    __slots__ = ("tag", "ev")

    def __init__(self, tag):
        self.tag = tag
        self.ev = None
