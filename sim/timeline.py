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

from ddbench.sim.steplayers import StepLayers
from ddbench.sim.resources import FluidGroup, FluidServer, Job, duplex_link


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
    tl = _Timeline(plan, warmup, record)
    tl.env.process(tl.gpu_stream(steps))
    tl.env.run()
    return tl.result(steps)


class _Timeline:
    """One timeline run: the link (H2D, D2H and, for a CPU gather, the host CPU: one FluidGroup), the
    sparse-KV buffer occupancy, the prefetches in flight, and the per-step and per-layer results."""

    def __init__(self, plan: StepLayers, warmup: int, record: bool):
        self.env = simpy.Environment()
        self.plan, self.design, self.L = plan, plan.design, plan.layers
        self.warmup, self.record = warmup, record
        design = plan.design
        self.events: list | None = [] if record else None
        self.link_rec: list | None = [] if record else None
        self._build_link()
        self.planned = 0.0                # H2D bytes planned
        self.occupancy = self.peak_occ = 0.0
        self.filled: set = set()          # (step, layer) whose buffer set holds data
        self.set_bytes = plan.slot_bytes / max(1, design.buffer_sets)
        self.last_on: dict = {}           # stream -> its last gather job
        self.pf_done: dict = {}           # (step, layer) -> its prefetch job
        self.window: list = []            # (end of step, H2D busy seconds so far)
        self.step_s: list = []
        self.stall_s: list = []
        self.layer_stall = [0.0] * self.L
        self.stall_acc = 0.0              # the current step's stall
        self.layer_ahead, self.next_step = design.prefetch == "layer-ahead", design.prefetch == "next-step"
        self.urgent_prio = design.urgent_priority

    def _build_link(self) -> None:
        plan, design = self.plan, self.plan.design
        self.offload = plan.rates is not None
        if self.offload:
            self.h2d, self.d2h = duplex_link(plan.rates, design.urgent_priority, self.link_rec)
            self.cpu = FluidServer("host_cpu", design.urgent_priority, 1.0, 0.0, 1.0, self.link_rec) \
                if any(plan.cpu_pf_work) or any(plan.cpu_ur_work) else None
            self.slow = plan.compute_slowdown if plan.rates.method == "uva_gather" else 1.0
            self.group = FluidGroup([self.h2d, self.d2h, self.cpu])
        else:
            self.h2d = self.d2h = self.cpu = self.group = None
            self.slow = 1.0
        self.t0_h2d = plan.rates.h2d_t0_s if self.offload else 0.0
        self.t0_d2h = plan.rates.d2h_t0_s if self.offload else 0.0

    # -- buffers

    def fill(self, layer_key) -> None:
        if layer_key not in self.filled:
            self.filled.add(layer_key)
            self.occupancy += self.set_bytes
            if self.occupancy > self.peak_occ:
                self.peak_occ = self.occupancy

    def release(self, layer_key) -> None:
        if layer_key in self.filled:
            self.filled.discard(layer_key)
            self.occupancy -= self.set_bytes

    # -- transfers

    def transfer(self, t, nbytes, work, cpu_work, urgent, tag):
        """A gather of `nbytes` issued at t -> its job on the link."""
        self.planned += nbytes
        if self.cpu is None or cpu_work <= 0:
            return self._gpu_gather(t, nbytes, work, urgent, tag)
        return self._cpu_gather(t, nbytes, work, cpu_work, urgent, tag)

    def _gpu_gather(self, t, nbytes, work, urgent, tag):
        # the fixed cost is a kernel boundary on the gather's stream (sim/resources.py is told
        # nothing: the job carries it or not): paid behind a gather of the same stream still in
        # flight, not by a gather that starts on an idle stream
        stream = "urgent" if (urgent and self.urgent_prio) else "prefetch"
        prev = self.last_on.get(stream)
        self.group.advance_to(t)
        behind = prev is not None and prev.t_done is None
        job = self.group.submit(self.h2d, t, work if behind else work - self.t0_h2d, nbytes, urgent, tag)
        self.last_on[stream] = job
        return job

    def _cpu_gather(self, t, nbytes, work, cpu_work, urgent, tag):
        # the host CPU stage (index_select) hands the job to the copy engine when it ends
        h2d = self.h2d
        link_job = Job(work, nbytes, urgent, t, tag, fixed=self.t0_h2d)

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
        self.group.submit(self.cpu, t, cpu_work, 0.0, urgent, tag, then=to_link)
        return link_job

    def prefetch(self, t, step, layer) -> None:
        plan = self.plan
        if plan.pf_bytes[layer] > 0:
            self.fill((step, layer))
            self.pf_done[(step, layer)] = self.transfer(t, plan.pf_bytes[layer], plan.pf_work[layer],
                                                        plan.cpu_pf_work[layer], False, "prefetch")

    def urgent_issue(self, t, s, i):
        """When layer i's misses go on the link: at its true index (t), and not before its own
        prefetch has landed: the misses overwrite that prefetch's wrong slots (the engine's urgent
        gather waits on the prefetch's event, kernels/engine/engine.py _sparse_attention)."""
        job = self.pf_done.get((s, i))
        return t if job is None else max(t, self.group.finish_time(job))

    # -- the GPU stream

    def comp(self, t, dur):
        """Compute of `dur` seconds alone starting at t; it runs at 1/slow speed while the gather backlog lasts."""
        slow = self.slow
        if slow == 1.0:
            return dur
        self.group.advance_to(t)
        if not (self.h2d.qu or self.h2d.qb):
            return dur
        busy = self.h2d.backlog_s()
        return dur * slow if dur * slow <= busy else busy + (dur - busy / slow)

    def seg(self, name, start, end, i) -> None:
        self.events.append(("gpu", name.format(i=i, p=i - 1), start, end))

    def wait(self, t, s, i, job, u_job):
        """The GPU stream at t waits for layer i's prefetch `job` and its urgent fetch `u_job` (either
        None); the wait is counted as a stall. Returns when both are done."""
        t_ready = t
        if job is not None:
            t = max(t, self.group.finish_time(job))
        if u_job is not None:
            t = max(t, self.group.finish_time(u_job))
            if self.plan.ur_min_s:      # a latency-bound fetch kernel: no sooner than its walk
                t = max(t, u_job.t_submit + self.plan.ur_min_s[i])
        if t > t_ready:
            self.stall_acc += t - t_ready
            if s >= self.warmup:
                self.layer_stall[i] += t - t_ready
            if self.record:
                self.events.append(("gpu", f"L{i} stall", t_ready, t))
        return t

    def gpu_stream(self, steps: int):
        """The SimPy process: the pre-decoding step's prefetches, then `steps` batch steps."""
        t = self.env.now
        # the pre-decoding step (paper §5.2) leaves the first prefetches issued
        if self.layer_ahead:
            self.prefetch(t, 0, 0)
            if self.L > 1:
                self.prefetch(t, 0, 1)
        elif self.next_step:
            for i in range(self.L):
                self.prefetch(t, 0, i)
        for s in range(steps):
            t_step = t
            self.stall_acc = 0.0
            t = self._step(t, s)
            yield self.env.timeout(t - self.env.now)
            self._end_step(t, t_step)

    def _step(self, t, s):
        """Batch step s from t, every layer then the LM head -> the time its compute ends."""
        plan = self.plan
        pending = plan.pre[0]
        for i in range(self.L):
            t = self._layer(t, s, i, pending)
            pending = plan.post[i] + (plan.pre[i + 1] if i + 1 < self.L else 0.0)
        t0 = t
        t += self.comp(t, pending + plan.lm_s)
        if self.record:
            self.seg("L{i} post + LM head", t0, t, self.L - 1)
        return t

    def _layer(self, t, s, i, pending):
        """Layer i of step s from t, `pending` the compute before its index is known (the previous
        layer's post and this one's qkv/select) -> the time its attention ends."""
        plan, record = self.plan, self.record
        t0 = t
        t += self.comp(t, pending)
        if record:
            self.seg("L{p} post + L{i} qkv/select" if i else "L{i} qkv/select", t0, t, i)
        u_job = None
        if self.offload and plan.ur_bytes[i] > 0:
            self.fill((s, i))
            u_job = self.transfer(self.urgent_issue(t, s, i), plan.ur_bytes[i], plan.ur_work[i], plan.cpu_ur_work[i],
                                  self.urgent_prio, "urgent")
        serial = u_job is not None and plan.ur_serial
        if serial:                 # the fetch is in the compute stream's order: wait for it first
            t = self.wait(t, s, i, None, u_job)
        if plan.mid[i]:
            t0 = t
            t += self.comp(t, plan.mid[i])
            if record:
                self.seg("L{i} key rebuild", t0, t, i)
        t = self.wait(t, s, i, self.pf_done.pop((s, i), None), None if serial else u_job)
        t0 = t
        t += self.comp(t, plan.att[i])
        if record:
            self.seg("L{i} attention", t0, t, i)
        self.release((s, i))
        if self.layer_ahead:
            j = i + 2
            self.prefetch(t, s + j // self.L, j % self.L)
        elif self.next_step:
            self.prefetch(t, s + 1, i)
        return t

    def _end_step(self, t, t_step) -> None:
        """The step's KV copy to host, its time and stall, and the link's busy time so far."""
        plan = self.plan
        if self.offload and sum(plan.d2h_bytes):
            # the step's new K and V (every layer) go to host memory in one copy at the step's end
            # (one copy: one fixed cost, not one per layer's share of it)
            n_d2h = sum(1 for x in plan.d2h_work if x > 0)
            self.group.submit(self.d2h, t, sum(plan.d2h_work) - (n_d2h - 1) * self.t0_d2h, sum(plan.d2h_bytes),
                              False, "kv out", fixed=self.t0_d2h)
        self.step_s.append(t - t_step)
        self.stall_s.append(self.stall_acc)
        if self.h2d is not None:
            self.group.advance_to(t)
            self.window.append((t, self.h2d.busy_s))

    def result(self, steps: int) -> TimelineResult:
        """The TimelineResult, the link drained; link use over the measured steps (after the warm-up)."""
        end = self.env.now
        h2d, d2h, group, window, warmup = self.h2d, self.d2h, self.group, self.window, self.warmup
        if group is not None:
            group.advance_to(math.inf)  # drain the prefetches issued for the step after the last one
            end = max(end, group.t)
        w0 = warmup - 1 if 0 < warmup <= len(window) else None
        t0, b0 = (window[w0] if w0 is not None else (0.0, 0.0))
        t1, b1 = window[-1] if window else (end, 0.0)
        return TimelineResult(
            step_s=self.step_s, stall_s=self.stall_s, layer_stall_s=self.layer_stall,
            h2d_bytes_planned=self.planned,
            h2d_bytes_moved=h2d.bytes_moved if h2d else 0.0,
            d2h_bytes_moved=d2h.bytes_moved if d2h else 0.0,
            h2d_busy_s=b1 - b0,
            sim_time_s=t1 - t0,
            peak_buffer_bytes=self.peak_occ,
            reserved_buffer_bytes=self.plan.slot_bytes * self.plan.slots,
            events=(self.events or []) + [(tr, tag, a, b) for tr, tag, a, b, _u in (self.link_rec or [])],
            warmup=min(warmup, max(0, steps - 1)),
        )
