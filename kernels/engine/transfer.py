"""Transfer engine pieces (DualDecoder §5.3-5.4): miss planning, the slot-addressed miss gather,
forced-miss perturbation, and the stream/event scheduler with its hazard log.

    plan_misses(pred, true) -> MissPlan
        pred, true [B, H, k] int32 chunk ids (k distinct each). The buffer holds `pred` in slots
        0..k-1 (the prefetch wrote slot j = pred[..., j]). Misses (true - pred) go into the slots of
        the wrong predictions (pred - true): after the fill the buffer holds exactly `true`, in slot
        order `assembled`, so attention over the k*C selected tokens is attention over the true set.
        All on the device, no host sync: a stable sort puts the misses (and the free slots) first,
        per (b, h) in flat order, so the r-th miss and the r-th free slot share their (b, h).
    gather_slots(host_kv, layer, plan, k_out, v_out, programs=64, scales=None, yielding=None)   UVA reads
        of the misses only; the item count is read on the device (`plan.count`), so no host sync; an
        fp8 host KV is dequantised in the kernel (kernels/gather.py); with `flag` (a chunk cache's
        prefetch), it yields to the urgent fetches that raise it (kernels/yieldgather.py)
    gather_slots_ref(...)                                            torch twin
    perturb(base, miss_rate, n_chunks, gen)                          forced-miss index: `base` with
        round(miss_rate*k) chunks per (b, h) replaced by random chunks outside `base` (sorted)
    perturb_fast(base, miss_rate, n_chunks, seed, salt, out=None)    the same contract in one launch
        (O(k log^2 k) per (b, h): stratified drops, a sort of the base and a binary search over it;
        seed on the device, capturable); perturb_fast_ref is its exact torch twin (same uniforms)
    Sched                                                            streams + events (CUDA), or an
        in-order stand-in on the CPU; both keep a log of (op, stream, waits) for the hazard tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ddbench.core.errors import DDBenchError
from ddbench.kernels.fp8 import E4M3, check_host_scales, dequantized_layer, layer_scales
from ddbench.kernels.gather import launch_items
from ddbench.kernels.indexsets import reuse_plan
from ddbench.kernels.layout import check_host_kv
from ddbench.kernels.yieldgather import SPIN, YieldFlag, check_flag, flag_now


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


@triton.jit(do_not_specialize=["spin"])
def _slot_gather_kernel(host, scales, bh_ptr, ch_ptr, slot_ptr, count_ptr, flag, k_out, v_out, ks_out, vs_out, H, N,
                        s_hb, s_ob, s_oh, s_ot, s_sb, s_sh, spin, CD: tl.constexpr, C: tl.constexpr,
                        ITEMS: tl.constexpr, FETCH_K: tl.constexpr, FP8: tl.constexpr, YIELD: tl.constexpr,
                        RAW: tl.constexpr):
    p = tl.program_id(0)
    G = tl.num_programs(0)
    n_items = tl.load(count_ptr)
    e = tl.arange(0, CD)[None, :]
    left = spin
    raised = flag_now(flag) if YIELD else 0
    for base in range(p * ITEMS, n_items, G * ITEMS):
        if YIELD:   # kernels/yieldgather.py's bounded yield: no new round while the urgent side holds the flag
            while (left > 0) & (raised != 0):
                left -= 1
                raised = flag_now(flag)
        it = base + tl.arange(0, ITEMS)
        ok = it < n_items
        bh = tl.load(bh_ptr + it, mask=ok, other=0).to(tl.int64)
        ch = tl.load(ch_ptr + it, mask=ok, other=0).to(tl.int64)
        sl = tl.load(slot_ptr + it, mask=ok, other=0).to(tl.int64)
        b = bh // H
        h = bh % H
        row = b * s_hb + (h * N + ch) * (2 * CD)        # s_hb: the host's request stride
        dst = (b * s_ob + h * s_oh + sl * C * s_ot)[:, None] + e
        v = tl.load(host + row[:, None] + CD + e, mask=ok[:, None])
        if FETCH_K:
            k = tl.load(host + row[:, None] + e, mask=ok[:, None])
        if YIELD:     # for the next round: its wait overlaps this round's pieces
            raised = flag_now(flag)
        if RAW:       # fp8 slots: the e4m3 bytes as they are, and their pieces' scales into the slots' scales
            so = b * s_sb + h * s_sh + sl
            tl.store(vs_out + so, tl.load(scales + row // CD + 1, mask=ok, other=0.0), mask=ok)
            if FETCH_K:
                tl.store(ks_out + so, tl.load(scales + row // CD, mask=ok, other=0.0), mask=ok)
        elif FP8:     # e4m3 bytes and their pieces' scales (kernels/gather.py)
            sv = tl.load(scales + row // CD + 1, mask=ok, other=0.0)
            v = (v.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sv[:, None]).to(v_out.dtype.element_ty)
            if FETCH_K:
                sk = tl.load(scales + row // CD, mask=ok, other=0.0)
                k = (k.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sk[:, None]).to(k_out.dtype.element_ty)
        tl.store(v_out + dst, v, mask=ok[:, None])
        if FETCH_K:
            tl.store(k_out + dst, k, mask=ok[:, None])


def check_slot_scales(host_kv, k_out, v_out, k_scale_out, v_scale_out) -> bool:
    """True for fp8 slots (e4m3 k_out / v_out, fed by an fp8 host KV, with their fp32 [B, H, slots] scales);
    one-line DDBenchError where they do not belong together."""
    raw = v_out.dtype == E4M3
    if not raw:
        if k_scale_out is not None or v_scale_out is not None:
            raise DDBenchError(f"slot scales belong to fp8 slots, not {v_out.dtype} ones")
        return False
    if host_kv.dtype != E4M3:
        raise DDBenchError(f"fp8 slots take the pieces of an fp8 host KV as they are, not {host_kv.dtype} ones")
    B, H, rows = v_out.shape[:3]
    C = host_kv.shape[-2]
    for name, out, sc in (("k", k_out, k_scale_out), ("v", v_out, v_scale_out)):
        if out is None:
            continue
        if out.dtype != E4M3 or sc is None or sc.dtype != torch.float32 or sc.shape != (B, H, rows // C) \
                or sc.stride(2) != 1 or sc.device != v_out.device:
            raise DDBenchError(f"fp8 slots need e4m3 {name}_out and an fp32 {name}_scale_out [{B}, {H}, {rows // C}]"
                               f" on {v_out.device}")
    return True


def gather_slots(host_kv, layer, plan: MissPlan, k_out, v_out, *, programs=64, items=None, scales=None,
                 yielding: YieldFlag | None = None, scale_out=(None, None)):
    """Fetch plan's misses from host_kv[layer] into slot plan.slot of (b, h) (k_out None: values only).
    yielding: None, or a YieldFlag (kernels/yieldgather.py; no poll counters): the prefetch then yields to
    an urgent fetch that raises its flag (at most `spin` polls per program, the same writes). e4m3 k_out /
    v_out (an fp8 chunk cache): the fp8 host pieces' bytes as they are, their scales into scale_out =
    (k_scale_out, v_scale_out), each [B, H, slots]."""
    k_scale_out, v_scale_out = scale_out
    check_host_kv(host_kv)
    flag, spin = (None, SPIN) if yielding is None else (yielding.flag, yielding.spin)
    if yielding is not None:
        if yielding.polls is not None:
            raise DDBenchError("the slot gather counts no polls: pass a YieldFlag without polls")
        check_flag(flag, None, programs, v_out.device)
    check_host_scales(host_kv, scales)
    raw = check_slot_scales(host_kv, k_out, v_out, k_scale_out, v_scale_out)
    L, B, H, N, _, C, d = host_kv.shape
    n = plan.bh.numel()
    if n == 0:
        return
    items = launch_items(items, programs, host_kv)
    grid = (max(1, min(programs, triton.cdiv(n, items))),)
    fp8 = host_kv.dtype == E4M3
    src = host_kv[layer].view(torch.uint8) if fp8 else host_kv[layer]
    sc = layer_scales(host_kv, layer, scales) if fp8 else v_out
    ko, vo = (v_out if k_out is None else k_out), v_out
    if raw:
        ko, vo = ko.view(torch.uint8), vo.view(torch.uint8)
    vs = v_scale_out if raw else sc
    ks = k_scale_out if (raw and k_out is not None) else vs
    _slot_gather_kernel[grid](src, sc, plan.bh, plan.chunk, plan.slot, plan.count, plan.count if flag is None else flag,
                              ko, vo, ks, vs, H, N, host_kv.stride(1), *v_out.stride()[:3],
                              *(vs.stride()[:2] if raw else (0, 0)), spin,
                              CD=C * d, C=C, ITEMS=items, FETCH_K=k_out is not None, FP8=fp8, YIELD=flag is not None,
                              RAW=raw, num_warps=4)


def gather_slots_ref(host_kv, layer, plan: MissPlan, k_out, v_out, *, scales=None, scale_out=(None, None), **_):
    k_scale_out, v_scale_out = scale_out
    check_host_scales(host_kv, scales)
    raw = check_slot_scales(host_kv, k_out, v_out, k_scale_out, v_scale_out)
    L, B, H, N, _, C, d = host_kv.shape
    n = int(plan.count.item())
    if n == 0:
        return
    bh = plan.bh[:n].long().cpu()
    ch = plan.chunk[:n].long().cpu()
    sl = plan.slot[:n].long().cpu()
    b, h = (bh // H).to(v_out.device), (bh % H).to(v_out.device)
    if raw:       # the e4m3 bytes as they are, and the pieces' scales
        per = layer_scales(host_kv, layer, scales)
        base = ((bh // H) * host_kv.stride(1) + ((bh % H) * N + ch) * 2 * C * d) // (C * d)   # the K piece's scale
        v_scale_out[b, h, sl.to(v_out.device)] = per[base + 1].to(v_out.device)
        if k_out is not None:
            k_scale_out[b, h, sl.to(v_out.device)] = per[base].to(v_out.device)
        src = host_kv[layer][bh // H, bh % H, ch].to(v_out.device)
    else:
        src = dequantized_layer(host_kv, layer, scales, v_out.dtype)[bh // H, bh % H, ch].to(v_out.device)  # [n, 2, C, d]
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


# ---------------------------------------------------------------------------------------------
# One-launch versions of the miss plan and the forced-miss perturbation (the torch ones above are
# their twins): inside a CUDA graph each of the torch versions costs dozens of tiny kernels per layer.

@triton.jit
def _plan_kernel(pred, true, bits, first, count, bh_out, chunk_out, slot_out, assembled, K, W,
                 KP: tl.constexpr):
    """One (b, h): membership of true in pred and of pred in true through two bitmaps of the chunk
    ids (W int32 words each, zeroed by the caller): set with atomic ORs, read after a barrier from
    L2 (.cg), so the cost is O(k), not the O(k^2) of comparing every pair.
    Repeated predicted ids (a compute-only step's zero prediction) are deduped as in plan_misses: such
    an id, if true, holds its chunk in its first slot only and its other slots are free. The pred OR
    returns the old words, so a slot whose bit was already set knows its id repeats; only then (one
    scalar test per program) the first slot of each predicted id is found in `first` (32 W int32,
    never initialized: the slot that set the id's bit stores its entry, K, then after a barrier every
    slot takes the atomic min with its index), still O(k); without a repeat nothing more is read or
    written. compute-sanitizer's initcheck flagged the atomic exchange this store replaced (it reads the
    uninitialized word it overwrites)."""
    bh = tl.program_id(0)
    j = tl.arange(0, KP)
    jv = j < K
    t = tl.load(true + bh * K + j, mask=jv, other=0)
    p = tl.load(pred + bh * K + j, mask=jv, other=0)
    bp = bits + bh.to(tl.int64) * (2 * W)          # bitmap of pred
    bt = bp + W                                    # bitmap of true
    one = tl.full([KP], 1, tl.int32)
    old = tl.atomic_or(bp + (p >> 5), one << (p & 31), mask=jv)
    tl.atomic_or(bt + (t >> 5), one << (t & 31), mask=jv)
    seen = jv & (((old >> (p & 31)) & 1) != 0)     # another slot set this id's bit first: a repeat
    tl.debug_barrier()
    wp = tl.load(bp + (t >> 5), mask=jv, other=0, cache_modifier=".cg")
    wt = tl.load(bt + (p >> 5), mask=jv, other=0, cache_modifier=".cg")
    miss = jv & (((wp >> (t & 31)) & 1) == 0)      # true chunk not predicted
    free = jv & (((wt >> (p & 31)) & 1) == 0)      # predicted chunk not true: its slot is free
    rep = jv & ((tl.zeros([KP], tl.int32) + tl.max(seen.to(tl.int32), 0)) > 0)   # this (b, h) repeats an id
    fp = first + bh.to(tl.int64) * (32 * W) + p    # first slot of each predicted id
    tl.store(fp, tl.zeros([KP], tl.int32) + K, mask=rep & ~seen)   # a plain store: no read of the uninitialized word
    tl.debug_barrier()
    tl.atomic_min(fp, j, mask=rep)
    tl.debug_barrier()
    f = tl.load(fp, mask=rep, other=0, cache_modifier=".cg")
    free = free | (rep & (f != j))                 # a later copy of a predicted id: free
    _plan_emit(t, p, miss, free, j, jv, bh, count, bh_out, chunk_out, slot_out, assembled, K, KP)


@triton.jit
def _plan_emit(t, p, miss, free, j, jv, bh, count, bh_out, chunk_out, slot_out, assembled, K, KP: tl.constexpr):
    """Write one (b, h)'s misses (true chunks not predicted) into the range it reserves with one atomic
    add on `count`, each paired in order with a free slot (a predicted chunk not true), and the ids
    its slots hold after the fill to `assembled`."""
    m = tl.sum(miss.to(tl.int32), 0)
    base = tl.atomic_add(count, m)
    rm = tl.cumsum(miss.to(tl.int32), 0) - 1
    rf = tl.cumsum(free.to(tl.int32), 0) - 1
    tl.store(chunk_out + base + rm, t, mask=miss)
    tl.store(bh_out + base + rm, tl.zeros([KP], tl.int32) + bh, mask=miss)
    tl.store(slot_out + base + rf, j, mask=free)
    tl.debug_barrier()
    fill = tl.load(chunk_out + base + rf, mask=free, other=0, cache_modifier=".cg")
    tl.store(assembled + bh * K + j, tl.where(free, fill, p), mask=jv)


@triton.jit
def _lower_bound(sv, x, K, KP: tl.constexpr, LOG_KP: tl.constexpr):
    """How many of the first K entries of `sv` (ascending, [KP]) are below each x: LOG_KP + 1 gathers."""
    lo = tl.zeros(x.shape, tl.int32)
    for e in tl.static_range(LOG_KP + 1):
        step = KP >> e
        c = lo + step
        v = tl.gather(sv, tl.minimum(c - 1, KP - 1), 0)
        lo = tl.where((c <= K) & (v < x), c, lo)
    return lo


@triton.jit
def plan_row_sorted(true_row, pred, bh, count, bh_out, chunk_out, slot_out, assembled, K,
                    KP: tl.constexpr, LOG_KP: tl.constexpr):
    """The miss plan of one (b, h) whose true ids `true_row` are ascending and distinct (a top-k's
    output, just written by this program: read back from L2), with no bitmaps, memset or atomics on
    them: the predicted ids, keyed (id * KP + slot), are sorted in registers and each side is searched
    in the other (O(k log k)). A predicted id that repeats (a compute-only step's zero prediction)
    holds a true chunk in its first slot only, as in plan_misses; the others are free."""
    j = tl.arange(0, KP)
    jv = j < K
    tl.debug_barrier()                                # this program's stores of true_row are visible
    t = tl.load(true_row + j, mask=jv, other=2147483647, cache_modifier=".cg")
    p = tl.load(pred + bh * K + j, mask=jv, other=0)
    key = tl.where(jv, p * KP + j, 2147483647)
    sk = tl.sort(key)
    dup = _lower_bound(sk, key, K, KP, LOG_KP) > _lower_bound(sk, p * KP, K, KP, LOG_KP)
    at = _lower_bound(sk, t * KP, K, KP, LOG_KP)
    miss = jv & ((at >= K) | (tl.gather(sk, tl.minimum(at, KP - 1), 0) // KP != t))
    ip = _lower_bound(t, p, K, KP, LOG_KP)
    free = jv & (dup | (ip >= K) | (tl.gather(t, tl.minimum(ip, KP - 1), 0) != p))
    _plan_emit(t, p, miss, free, j, jv, bh, count, bh_out, chunk_out, slot_out, assembled, K, KP)


def plan_buffers(B: int, H: int, k: int, device) -> MissPlan:
    """Outputs of a miss plan written by the fused top-k (fastselect.topk_from_scratch(plan=...)); the
    count is zeroed by the top-k's first kernel, not here."""
    n = B * H * k
    e = lambda *s: torch.empty(*s, device=device, dtype=torch.int32)   # noqa: E731
    return MissPlan(bh=e(n), chunk=e(n), slot=e(n), count=e(1), assembled=e(B, H, k), k=k)


def plan_misses_fast(pred: torch.Tensor, true: torch.Tensor, n_chunks: int | None = None) -> MissPlan:
    """plan_misses in one launch (plus one memset of the count and the bitmaps). The items are grouped
    per (b, h) as in the twin, in the twin's order within a group, but the (b, h) groups come in the
    order the programs reserved their ranges (an atomic counter); `assembled` is the twin's. A predicted
    id that repeats (the zero prediction of a compute-only step) is deduped as in the twin: its first
    slot holds its chunk if that is true, its other slots are free (a scratch of 32 W int32 per (b, h),
    not initialized, is written only where a prediction repeats).
    `n_chunks` (chunk ids are below it) sizes the bitmaps; without it the largest id is read from the
    device (a host sync: not for captured steps)."""
    B, H, k = true.shape
    n = B * H * k
    dev = true.device
    if n_chunks is None:
        n_chunks = int(torch.maximum(pred.max(), true.max())) + 1
    W = -(-int(n_chunks) // 32)
    scratch = torch.zeros(1 + B * H * 2 * W, device=dev, dtype=torch.int32)   # count, then the bitmaps
    count, bits = scratch[:1], scratch[1:]
    first = torch.empty(B * H * 32 * W, device=dev, dtype=torch.int32)         # first slot of a repeated id
    bh = torch.empty(n, device=dev, dtype=torch.int32)
    chunk = torch.empty(n, device=dev, dtype=torch.int32)
    slot = torch.empty(n, device=dev, dtype=torch.int32)
    assembled = torch.empty(B, H, k, device=dev, dtype=torch.int32)
    KP = triton.next_power_of_2(k)
    _plan_kernel[(B * H,)](pred.to(torch.int32).contiguous(), true.to(torch.int32).contiguous(), bits, first, count,
                           bh, chunk, slot, assembled, k, W, KP=KP, num_warps=4)
    return MissPlan(bh=bh, chunk=chunk, slot=slot, count=count, assembled=assembled, k=k)


@triton.jit
def _perturb_kernel(base, out, seed_ptr, salt, K, M, W, KP: tl.constexpr, LOG_KP: tl.constexpr):
    """One program per (b, h); O(k log^2 k), no loop over the data.

    Dropped entries: positions 0..K-1 are cut into M strata [floor(i K / M), floor((i+1) K / M)),
    each non-empty (M <= K); one position is dropped per stratum, uniformly within it (u = rand(seed,
    bh*KP + i)). The dropped entry of stratum i gets the c_i-th chunk, in increasing order, of the
    complement of `base` (W = N - K chunks): c_i uniform in [floor(i W / M), floor((i+1) W / M)),
    disjoint strata, so the M new chunks are distinct (u' = rand(seed + 7919, bh*KP + i)). With s the
    sorted base and d_j = s_j - j (non-decreasing: the number of complement chunks below s_j), the c-th
    complement chunk is c + #{j : d_j <= c}, found by a binary search over d (tl.gather)."""
    bh = tl.program_id(0)
    j = tl.arange(0, KP)
    jv = j < K
    b = tl.load(base + bh * K + j, mask=jv, other=2147483647)
    seed = tl.load(seed_ptr) * 1000003 + salt
    off = bh * KP
    # stratum of position j and the position dropped in it
    i = (((j + 1) * M - 1) // K).to(tl.int32)
    lo = ((i.to(tl.int64) * K) // M).to(tl.int32)
    wid = (((i + 1).to(tl.int64) * K) // M).to(tl.int32) - lo
    u = tl.rand(seed, off + i)
    pick = lo + tl.minimum((u * wid.to(tl.float32)).to(tl.int32), wid - 1)
    drop = jv & (j == pick)
    # the chunk of stratum i in the complement's order
    clo = (i.to(tl.int64) * W) // M
    cw = ((i + 1).to(tl.int64) * W) // M - clo
    u2 = tl.rand(seed + 7919, off + i)
    c = (clo + tl.minimum((u2 * cw.to(tl.float32)).to(tl.int64), cw - 1)).to(tl.int32)
    s = tl.sort(b)                      # padding (int32 max) last
    d = s - j                           # padding stays above every c (c < W <= N)
    cnt = tl.zeros([KP], tl.int32)
    for e in tl.static_range(LOG_KP + 1):
        step = KP >> e
        q = cnt + step - 1
        ok = q < KP
        v = tl.gather(d, tl.minimum(q, KP - 1), 0)
        cnt = tl.where(ok & (v <= c), cnt + step, cnt)
    tl.store(out + bh * K + j, tl.where(drop, c + cnt, b), mask=jv)


@triton.jit
def _perturb_uniforms_kernel(seed_ptr, salt, u_out, KP: tl.constexpr):
    """The two uniforms per stratum that _perturb_kernel draws (for its torch twin)."""
    bh = tl.program_id(0)
    i = tl.arange(0, KP)
    seed = tl.load(seed_ptr) * 1000003 + salt
    tl.store(u_out + (bh * 2) * KP + i, tl.rand(seed, bh * KP + i))
    tl.store(u_out + (bh * 2 + 1) * KP + i, tl.rand(seed + 7919, bh * KP + i))


def perturb_fast(base: torch.Tensor, miss_rate: float, n_chunks: int, seed: torch.Tensor, salt: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """perturb (same contract: round(miss_rate*k) entries of each (b, h) replaced by distinct chunks
    outside `base`) in one launch, deterministic given the device seed and the salt, no host sync
    (capturable). `base` rows must be distinct chunk ids in [0, n_chunks), in any order; the output
    keeps `base`'s order with the new chunks in the dropped places (not sorted). `seed` is a device
    int32 [1] (advanced once per step); `salt` tells the layers of a step apart. Exact draw:
    `_perturb_kernel`; torch twin: `perturb_fast_ref`."""
    B, H, k = base.shape
    m = int(round(miss_rate * k))
    if m == 0:
        return base.clone() if out is None else out.copy_(base)
    if n_chunks - k < m:
        raise ValueError(f"cannot force {m} misses among {n_chunks} chunks with {k} selected")
    if out is None:
        out = torch.empty_like(base, dtype=torch.int32)
    KP = triton.next_power_of_2(k)
    _perturb_kernel[(B * H,)](base.to(torch.int32).contiguous(), out, seed, salt, k, m, n_chunks - k,
                              KP=KP, LOG_KP=KP.bit_length() - 1, num_warps=4 if KP <= 512 else 8)
    return out


def perturb_fast_ref(base: torch.Tensor, miss_rate: float, n_chunks: int, seed: torch.Tensor, salt: int) -> torch.Tensor:
    """Torch twin of perturb_fast: the same strata and the same uniforms (drawn by a Triton helper,
    tl.rand of the same seed and offsets), the complement's c-th chunk by searchsorted."""
    B, H, k = base.shape
    m = int(round(miss_rate * k))
    if m == 0:
        return base.clone()
    KP = triton.next_power_of_2(k)
    u = torch.empty(B * H, 2, KP, device=base.device, dtype=torch.float32)
    _perturb_uniforms_kernel[(B * H,)](seed, salt, u, KP=KP)
    W = n_chunks - k
    j = torch.arange(k, device=base.device)
    i = ((j + 1) * m - 1) // k
    lo, wid = i * k // m, (i + 1) * k // m - i * k // m
    ub, uc = u[:, 0, :][:, i], u[:, 1, :][:, i]                               # [BH, k]
    pick = lo + torch.minimum((ub * wid.float()).long(), wid - 1)
    drop = j == pick
    clo, cw = i * W // m, (i + 1) * W // m - i * W // m
    c = clo + torch.minimum((uc * cw.float()).long(), cw - 1)
    s = base.reshape(B * H, k).long().sort(-1).values
    d = s - j
    cnt = torch.searchsorted(d.contiguous(), c.contiguous(), right=True)       # #{j : d_j <= c}
    out = torch.where(drop, c + cnt, base.reshape(B * H, k).long())
    return out.view(B, H, k).to(torch.int32)
