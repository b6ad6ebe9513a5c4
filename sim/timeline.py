"""Per-layer timeline mode: one batch step at a time, every layer's compute and transfers as events.

Shows overlap, stalls and buffer occupancy. The schedule follows the design's switches:
- `prefetch="layer-ahead"` (DualDecoder §5.3): the prefetch of layer i+2 is issued when layer
  i's attention ends (wrapping into the next step for the last two layers);
- `prefetch="next-step"` (SpeCache): when layer i's selection ends, the predicted set of layer i
  for the next step is issued;
- misses (urgent) are issued when layer i's true index is known (end of its qkv + selection) and
  are waited for, with the layer's prefetch, before its attention;
- `urgent_priority` puts misses in the urgent class of the link; else one FIFO queue;
- `gather="cpu"` sends each transfer through the host CPU (index_select) before the copy engine;
- a GPU-side gather (UVA kernel) in flight slows compute by the measured factor;
- the new token's K and V of every layer go to host memory in one D2H copy at the step's end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from sim.plan import StepPlan
from sim.resources import FluidServer, duplex_link


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


def run_timeline(plan: StepPlan, steps: int = 8, warmup: int = 2, record: bool = False) -> TimelineResult:
    env = simpy.Environment()
    sysx = plan.system
    L = plan.layers
    events: list = [] if record else None
    link_rec: list | None = [] if record else None
    offload = plan.rates is not None
    if offload:
        h2d, d2h = duplex_link(env, plan.rates, sysx.urgent_priority, link_rec)
        cpu = FluidServer(env, "host_cpu", sysx.urgent_priority, 1.0, 0.0, 1.0, link_rec) \
            if any(plan.cpu_pf_work) or any(plan.cpu_ur_work) else None
        slow = plan.rates.compute_slowdown if plan.rates.method == "uva_gather" else 1.0
    else:
        h2d = d2h = cpu = None
        slow = 1.0
    planned = [0.0]
    occupancy = [0.0]
    peak_occ = [0.0]
    filled: set = set()

    def fill(layer_key):
        if layer_key not in filled:
            filled.add(layer_key)
            occupancy[0] += set_bytes
            peak_occ[0] = max(peak_occ[0], occupancy[0])

    def release(layer_key):
        if layer_key in filled:
            filled.discard(layer_key)
            occupancy[0] -= set_bytes

    def transfer(nbytes, work, cpu_work, urgent, tag):
        planned[0] += nbytes
        if cpu is None or cpu_work <= 0:
            return h2d.submit(work, nbytes, urgent, tag)
        done = env.event()

        def to_link(_e):
            h2d.submit(work, nbytes, urgent, tag).callbacks.append(lambda _x: done.succeed())
        cpu.submit(cpu_work, 0.0, urgent, tag).callbacks.append(to_link)
        return done

    pf_done: dict = {}
    window: list = []
    set_bytes = plan.slot_bytes / max(1, sysx.buffer_sets)
    step_s, stall_s = [], []
    layer_stall = [0.0] * L

    def prefetch(step, layer):
        if plan.pf_bytes[layer] > 0:
            fill((step, layer))
            pf_done[(step, layer)] = transfer(plan.pf_bytes[layer], plan.pf_work[layer], plan.cpu_pf_work[layer],
                                              False, "prefetch")

    def comp(dur):
        """Compute of `dur` seconds alone; it runs at 1/slow speed while the gather backlog lasts."""
        if slow == 1.0 or not h2d.busy:
            return dur
        busy = h2d.backlog_s()
        return dur * slow if dur * slow <= busy else busy + (dur - busy / slow)

    def seg(name, start, i):
        if record:
            events.append(("gpu", name.format(i=i, p=i - 1), start, env.now))

    def proc():
        # the pre-decoding step (paper §5.2) leaves the first prefetches issued
        if sysx.prefetch == "layer-ahead":
            prefetch(0, 0)
            if L > 1:
                prefetch(0, 1)
        elif sysx.prefetch == "next-step":
            for i in range(L):
                prefetch(0, i)
        for s in range(steps):
            t_step = env.now
            stall = 0.0
            pending = plan.pre[0]
            for i in range(L):
                t = env.now
                yield env.timeout(comp(pending))
                seg("L{p} post + L{i} qkv/select" if i else "L{i} qkv/select", t, i)
                u_ev = None
                if offload and plan.ur_bytes[i] > 0:
                    fill((s, i))
                    u_ev = transfer(plan.ur_bytes[i], plan.ur_work[i], plan.cpu_ur_work[i],
                                    sysx.urgent_priority, "urgent")
                if sysx.prefetch == "next-step":
                    prefetch(s + 1, i)
                if plan.mid[i]:
                    t = env.now
                    yield env.timeout(comp(plan.mid[i]))
                    seg("L{i} key rebuild", t, i)
                t_ready = env.now
                ev = pf_done.pop((s, i), None)
                if ev is not None and not ev.processed:
                    yield ev
                if u_ev is not None and not u_ev.processed:
                    yield u_ev
                if env.now > t_ready:
                    stall += env.now - t_ready
                    layer_stall[i] += env.now - t_ready if s >= warmup else 0.0
                    if record:
                        events.append(("gpu", f"L{i} stall", t_ready, env.now))
                t = env.now
                yield env.timeout(comp(plan.att[i]))
                seg("L{i} attention", t, i)
                release((s, i))
                if sysx.prefetch == "layer-ahead":
                    j = i + 2
                    prefetch(s + j // L, j % L)
                pending = plan.post[i] + (plan.pre[i + 1] if i + 1 < L else 0.0)
            t = env.now
            yield env.timeout(comp(pending + plan.lm_s))
            seg("L{i} post + LM head", t, L - 1)
            if offload and sum(plan.d2h_bytes):
                # the step's new K and V (every layer) go to host memory in one copy at the step's end
                d2h.submit(sum(plan.d2h_work), sum(plan.d2h_bytes), False, "kv out")
            step_s.append(env.now - t_step)
            stall_s.append(stall)
            if h2d is not None:
                h2d._advance()
                window.append((env.now, h2d.busy_s))

    env.process(proc())
    env.run()
    # env.run() also drains the prefetches issued for the step after the last one
    w0 = warmup - 1 if 0 < warmup <= len(window) else None
    t0, b0 = (window[w0] if w0 is not None else (0.0, 0.0))
    t1, b1 = window[-1] if window else (env.now, 0.0)
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
