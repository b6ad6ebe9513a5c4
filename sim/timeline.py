"""Per-layer timeline mode: one batch step at a time, every layer's compute and transfers as events.

Shows overlap, stalls and buffer occupancy. The schedule follows the design's switches:
- `prefetch="layer-ahead"` (DualDecoder §5.3): the prefetch of layer i+2 is issued when layer
  i's attention ends (wrapping into the next step for the last two layers);
- `prefetch="next-step"` (SpeCache): when layer i's attention ends, the predicted set of layer i
  for the next step is issued (SpeCache has no urgent priority: one FIFO stream);
- misses (urgent) are issued when layer i's true index is known (end of its qkv + selection), and
  not before layer i's own prefetch has landed (they overwrite its slots: the engine's urgent gather
  waits on the prefetch's event); they are waited for, with the layer's prefetch, before its
  attention (with `plan.ur_serial`, a fetch ordered on the compute stream, before the layer's key
  rebuild);
- `urgent_priority` puts misses in the urgent class of the link; else one FIFO queue;
- `gather="cpu"` sends each transfer through the host CPU (index_select) before the copy engine;
- a GPU-side gather (UVA kernel) in flight slows compute by the measured factor;
- the new token's K and V of every layer go to host memory in one D2H copy at the step's end;
- a GPU gather's fixed cost (plan.rates.h2d_t0_s, part of its planned work) is paid only where it
  is queued behind an unfinished gather of its own stream (the prefetch stream, or the urgent stream
  under priority; without priority one stream): the bundle's fit comes from back-to-back calls on one
  stream, and the engine pays about one per layer (traces/engine/h200); a gather that starts on an
  idle stream pays bytes only. The CPU-gather ablation's copy engine keeps the per-burst rule of
  sim/resources.py (a copy joining a busy link drops its fixed cost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import simpy

from sim.steplayers import StepLayers
from sim.resources import FluidGroup, FluidServer, Job, duplex_link


@dataclass
class TimelineResult:
    step_s: list[float]
    stall_s: list[float]                  # per step: time attention waited for transfers
    layer_stall_s: list[float]            # per layer, summed over measured steps
    h2d_bytes_planned: float
    h2d_bytes_moved: float
    d2h_bytes_moved: float
    h2d_busy_s: float
    sim_time_s: float
    peak_buffer_bytes: float
    reserved_buffer_bytes: float
    events: list = field(default_factory=list)   # (track, name, start, end) when recording
    warmup: int = 0

    @property
    def steady_step_s(self) -> float:
        xs = self.step_s[self.warmup:] or self.step_s
        return sum(xs) / len(xs)

    @property
    def link_util(self) -> float:
        return self.h2d_busy_s / self.sim_time_s if self.sim_time_s else 0.0


def run_timeline(plan: StepLayers, steps: int = 8, warmup: int = 2, record: bool = False) -> TimelineResult:
    """`steps` batch steps of `plan`. The GPU stream is a SimPy process that yields once per step;
    within the step its segments are placed in order in closed form, and the link (a FluidGroup) is
    advanced lazily to each submission and each wait, so queueing on the link is simulated exactly."""
    env = simpy.Environment()
    design = plan.design
    L = plan.layers
    events: list | None = [] if record else None
    link_rec: list | None = [] if record else None
    offload = plan.rates is not None
    if offload:
        h2d, d2h = duplex_link(plan.rates, design.urgent_priority, link_rec)
        cpu = FluidServer("host_cpu", design.urgent_priority, 1.0, 0.0, 1.0, link_rec) \
            if any(plan.cpu_pf_work) or any(plan.cpu_ur_work) else None
        slow = plan.rates.compute_slowdown if plan.rates.method == "uva_gather" else 1.0
        group = FluidGroup([h2d, d2h, cpu])
    else:
        h2d = d2h = cpu = group = None
        slow = 1.0
    planned = [0.0]
    occupancy = [0.0]
    peak_occ = [0.0]
    filled: set = set()
    set_bytes = plan.slot_bytes / max(1, design.buffer_sets)

    def fill(layer_key):
        if layer_key not in filled:
            filled.add(layer_key)
            occupancy[0] += set_bytes
            if occupancy[0] > peak_occ[0]:
                peak_occ[0] = occupancy[0]

    def release(layer_key):
        if layer_key in filled:
            filled.discard(layer_key)
            occupancy[0] -= set_bytes

    t0_h2d = plan.rates.h2d_t0_s if offload else 0.0
    t0_d2h = plan.rates.d2h_t0_s if offload else 0.0

    last_on: dict = {}                    # stream -> its last gather job

    def transfer(t, nbytes, work, cpu_work, urgent, tag):
        planned[0] += nbytes
        if cpu is None or cpu_work <= 0:
            # the fixed cost is a kernel boundary on the gather's stream (sim/resources.py is told
            # nothing: the job carries it or not): paid behind a gather of the same stream still in
            # flight, not by a gather that starts on an idle stream
            stream = "urgent" if (urgent and urgent_prio) else "prefetch"
            prev = last_on.get(stream)
            group.advance_to(t)
            behind = prev is not None and prev.t_done is None
            job = group.submit(h2d, t, work if behind else work - t0_h2d, nbytes, urgent, tag)
            last_on[stream] = job
            return job
        # the host CPU stage (index_select) hands the job to the copy engine when it ends
        link_job = Job(work, nbytes, urgent, t, tag, fixed=t0_h2d)

        def to_link(tc):
            if work <= 0:
                link_job.t_done = tc
                return
            link_job.t_submit = tc
            was_busy = h2d.busy
            h2d._add(link_job)
            h2d._rerate()
            if not was_busy and h2d.peer.busy:
                h2d.peer._rerate()
        group.submit(cpu, t, cpu_work, 0.0, urgent, tag, then=to_link)
        return link_job

    pf_done: dict = {}
    window: list = []
    step_s, stall_s = [], []
    layer_stall = [0.0] * L
    stall_acc = [0.0]                     # the current step's stall
    pre, mid, att, post = plan.pre, plan.mid, plan.att, plan.post
    pf_bytes, pf_work, cpu_pf = plan.pf_bytes, plan.pf_work, plan.cpu_pf_work
    ur_bytes, ur_work, cpu_ur = plan.ur_bytes, plan.ur_work, plan.cpu_ur_work
    layer_ahead, next_step = design.prefetch == "layer-ahead", design.prefetch == "next-step"
    urgent_prio = design.urgent_priority

    def prefetch(t, step, layer):
        if pf_bytes[layer] > 0:
            fill((step, layer))
            pf_done[(step, layer)] = transfer(t, pf_bytes[layer], pf_work[layer], cpu_pf[layer], False, "prefetch")

    def comp(t, dur):
        """Compute of `dur` seconds alone starting at t; it runs at 1/slow speed while the gather backlog lasts."""
        if slow == 1.0:
            return dur
        group.advance_to(t)
        if not (h2d.qu or h2d.qb):
            return dur
        busy = h2d.backlog_s()
        return dur * slow if dur * slow <= busy else busy + (dur - busy / slow)

    def seg(name, start, end, i):
        events.append(("gpu", name.format(i=i, p=i - 1), start, end))

    def wait(t, s, i, job, u_job):
        """The GPU stream at t waits for layer i's prefetch `job` and its urgent fetch `u_job` (either
        None); the wait is counted as a stall. Returns when both are done."""
        t_ready = t
        if job is not None:
            t = max(t, group.finish_time(job))
        if u_job is not None:
            t = max(t, group.finish_time(u_job))
            if plan.ur_min_s:      # a latency-bound fetch kernel: no sooner than its walk
                t = max(t, u_job.t_submit + plan.ur_min_s[i])
        if t > t_ready:
            stall_acc[0] += t - t_ready
            if s >= warmup:
                layer_stall[i] += t - t_ready
            if record:
                events.append(("gpu", f"L{i} stall", t_ready, t))
        return t

    def urgent_issue(t, s, i):
        """When layer i's misses go on the link: at its true index (t), and not before its own
        prefetch has landed: the misses overwrite that prefetch's wrong slots (the engine's urgent
        gather waits on the prefetch's event, kernels/engine/engine.py _sparse_attention)."""
        job = pf_done.get((s, i))
        return t if job is None else max(t, group.finish_time(job))

    def proc():
        t = env.now
        # the pre-decoding step (paper §5.2) leaves the first prefetches issued
        if layer_ahead:
            prefetch(t, 0, 0)
            if L > 1:
                prefetch(t, 0, 1)
        elif next_step:
            for i in range(L):
                prefetch(t, 0, i)
        for s in range(steps):
            t_step = t
            stall_acc[0] = 0.0
            pending = pre[0]
            for i in range(L):
                t0 = t
                t += comp(t, pending)
                if record:
                    seg("L{p} post + L{i} qkv/select" if i else "L{i} qkv/select", t0, t, i)
                u_job = None
                if offload and ur_bytes[i] > 0:
                    fill((s, i))
                    u_job = transfer(urgent_issue(t, s, i), ur_bytes[i], ur_work[i], cpu_ur[i], urgent_prio,
                                     "urgent")
                serial = u_job is not None and plan.ur_serial
                if serial:                 # the fetch is in the compute stream's order: wait for it first
                    t = wait(t, s, i, None, u_job)
                if mid[i]:
                    t0 = t
                    t += comp(t, mid[i])
                    if record:
                        seg("L{i} key rebuild", t0, t, i)
                t = wait(t, s, i, pf_done.pop((s, i), None), None if serial else u_job)
                t0 = t
                t += comp(t, att[i])
                if record:
                    seg("L{i} attention", t0, t, i)
                release((s, i))
                if layer_ahead:
                    j = i + 2
                    prefetch(t, s + j // L, j % L)
                elif next_step:
                    prefetch(t, s + 1, i)
                pending = post[i] + (pre[i + 1] if i + 1 < L else 0.0)
            t0 = t
            t += comp(t, pending + plan.lm_s)
            if record:
                seg("L{i} post + LM head", t0, t, L - 1)
            yield env.timeout(t - env.now)
            if offload and sum(plan.d2h_bytes):
                # the step's new K and V (every layer) go to host memory in one copy at the step's end
                # (one copy: one fixed cost, not one per layer's share of it)
                n_d2h = sum(1 for x in plan.d2h_work if x > 0)
                group.submit(d2h, t, sum(plan.d2h_work) - (n_d2h - 1) * t0_d2h, sum(plan.d2h_bytes), False,
                             "kv out", fixed=t0_d2h)
            step_s.append(t - t_step)
            stall_s.append(stall_acc[0])
            if h2d is not None:
                group.advance_to(t)
                window.append((t, h2d.busy_s))

    env.process(proc())
    env.run()
    end = env.now
    if group is not None:
        group.advance_to(math.inf)  # drain the prefetches issued for the step after the last one
        end = max(end, group.t)
    w0 = warmup - 1 if 0 < warmup <= len(window) else None
    t0, b0 = (window[w0] if w0 is not None else (0.0, 0.0))
    t1, b1 = window[-1] if window else (end, 0.0)
    return TimelineResult(
        step_s=step_s, stall_s=stall_s, layer_stall_s=layer_stall,
        h2d_bytes_planned=planned[0],
        h2d_bytes_moved=h2d.bytes_moved if h2d else 0.0,
        d2h_bytes_moved=d2h.bytes_moved if d2h else 0.0,
        h2d_busy_s=b1 - b0,
        sim_time_s=t1 - t0,
        peak_buffer_bytes=peak_occ[0],
        reserved_buffer_bytes=plan.slot_bytes * plan.slots,
        events=(events or []) + [(tr, tag, a, b) for tr, tag, a, b, _u in (link_rec or [])],
        warmup=min(warmup, max(0, steps - 1)),
    )
