"""Per-step aggregate: the time of one decode step from the same StepLayers, without events.

Used by serving mode, where one event stands for one or more batch steps. The step is bound
either by the link or by the compute path with its waits:

  fixed cost (sim/timeline.py): a GPU gather pays the bundle's h2d_t0_s only where it is queued
              behind an unfinished gather of its own stream (the prefetch stream; the urgent stream
              under priority; one stream under FIFO); one that starts on an idle stream pays bytes
              only. The CPU-gather ablation's copy engine keeps the per-burst rule (sim/resources.py)
  T_link    = the H2D work (prefetch + urgent) with the fixed costs the schedule pays, plus the rate
              lost while the D2H direction is busy beside it (bidir_factor); FIFO adds the bubble
              (the link idles while each layer's attention runs); with a CPU gather the host CPU
              stage is a second bound
  T_compute = LM head + sum over layers of
              (pre + max(key rebuild, exposed transfer) + attention + post) * s_bg
              (plan.ur_serial: key rebuild + exposed transfer, the fetch being in the compute
              stream's order). s_bg is the mean slowdown of compute beside a GPU gather (the
              plan's compute_slowdown: each kind of kernel's, by its time in the step): it applies
              for the link time not spent stalled (a fixed point, three iterations); within a
              prefetch's window the compute runs at 1/slowdown
  exposed transfer of layer i (the wait between its true index and its attention), on a compute
  path that carries the previous layer's stall into the next window:
    - layer-ahead: the misses wait for layer i's own prefetch (issued when attention i-2 ended,
      sharing the link with layer i-1's misses under priority); a late one puts the next
      prefetch (i+1) behind it, whole
    - next-step (SpeCache): the prefetch on the link is layer i-1's for the next step, issued
      when attention i-1 ended
    - priority: the misses, no fixed cost, sharing the link with the rest r of that prefetch:
      min(u x urgent slowdown, u + r) + one chunk (work-conserving)
    - FIFO: the rest of that prefetch, then the misses behind it (fixed cost paid)
    - no prefetch: the fetch alone, bytes only (the key rebuild beside it slowed while it runs)
  T_step: priority: max(T_compute, T_link (one fixed cost per prefetch), T_cpu); FIFO: T_compute
          where the link with the fixed costs the compute path pays (its queued misses) and the
          bubbles is shorter, else that link bound; CPU gather: also the chain of prefetch copy,
          miss CPU gather and miss copy per layer where the host CPU has the next prefetch ready

In steady state the timeline (sim/timeline.py) and this step agree within 2% at every batch of
the link-bound edge that tests/test_sim_agreement.py and docs/simulator.md report.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddbench.sim.steplayers import StepLayers


@dataclass(frozen=True)
class AggStep:
    step_s: float
    compute_s: float
    link_s: float
    cpu_s: float
    h2d_bytes: float
    d2h_bytes: float

    @property
    def link_util(self) -> float:
        return min(1.0, self.link_s / self.step_s) if self.step_s else 0.0


def aggregate_step(plan: StepLayers) -> AggStep:
    L = plan.layers
    design = plan.design
    r = plan.rates
    if r is None:
        c = plan.compute_s
        return AggStep(c, c, 0.0, 0.0, 0.0, 0.0)
    t0 = r.h2d_t0_s
    n_pf = sum(1 for x in plan.pf_work if x > 0)
    n_ur = sum(1 for x in plan.ur_work if x > 0)
    fifo = not design.urgent_priority
    cpu_gather = any(plan.cpu_pf_work) or any(plan.cpu_ur_work)
    if cpu_gather:      # the copy engine stage keeps the per-burst rule (sim/resources.py)
        free = max(0, n_pf + n_ur - 1) if design.prefetch != "none" else 0
    elif design.prefetch == "none":
        free = n_pf + n_ur
    elif fifo:
        free = n_pf if n_ur else n_ur
    else:
        free = n_ur + n_pf - _prefetches_behind(plan, t0)
    W = sum(plan.pf_work) + sum(plan.ur_work) - free * t0
    n_d = sum(1 for x in plan.d2h_work if x > 0)
    D = sum(plan.d2h_work) - max(0, n_d - 1) * r.d2h_t0_s   # one D2H copy per step
    beta = r.bidir_factor
    t_link = W + min(D / beta, W) * (1.0 - beta) if W else 0.0
    t_cpu = sum(plan.cpu_pf_work) + sum(plan.cpu_ur_work)
    slow = plan.compute_slowdown if r.method == "uva_gather" else 1.0
    s_u = r.urgent_slowdown if design.urgent_priority else 1.0
    chunk_s = r.chunk_bytes / (r.h2d_gbps * 1e9)
    c_pure = plan.compute_s
    pf = design.prefetch != "none"
    # below the link-bound edge every gather starts on an idle stream and pays bytes only
    w_idle = sum(plan.pf_work) + sum(plan.ur_work) - (n_pf + n_ur) * (0.0 if cpu_gather else t0)
    # a GPU gather in flight slows compute by `slow`: it is in flight while the GPU computes for the
    # link time not spent waiting on it (the stalls); a fixed point from the link time
    overlap = min(t_link, c_pure * slow) if pf else 0.0
    exp = [0.0] * L                     # each layer's wait, carried into the next pass (layer 0's window)
    for _ in range((3 if slow != 1.0 else 2) if pf else 1):
        s_bg = 1.0 + overlap * (1.0 - 1.0 / slow) / c_pure if c_pure else 1.0
        total, gaps, stalls, queued, exp = _compute_path(plan, s_bg, slow, s_u, chunk_s, t0, cpu_gather, exp)
        if pf:
            overlap = min(max(0.0, min(w_idle, t_link) - stalls), c_pure * slow)
    link_bound = t_link + gaps if pf else t_link
    step = max(total, link_bound, t_cpu)
    if pf and fifo and not cpu_gather:
        # FIFO: a prefetch is issued after an attention, when the stream has drained (the layer's
        # misses were waited for), so it starts idle; the misses pay the fixed cost where they queue
        # behind the prefetch (counted above). Where the link with only those is longer than the
        # compute path, the link bound holds (the bubbles included)
        w_q = w_idle + queued * t0
        lb_q = (w_q + min(D / beta, w_q) * (1.0 - beta) if w_q else 0.0) + gaps
        if lb_q <= total:
            step, t_link = max(total, t_cpu), lb_q - gaps
    if pf and cpu_gather and n_ur:
        # the misses wait for their own prefetch to land, then pass the host CPU and the copy engine;
        # the next prefetch's copy queues behind them: where the host CPU has the next prefetch ready
        # by then, the layer's chain is prefetch copy + miss gather + miss copy
        chain = sum(plan.pf_work) - n_pf * t0 + sum(plan.cpu_ur_work) + sum(plan.ur_work)
        if all(p - t0 + u >= c + a for p, u, c, a in zip(plan.pf_work, plan.ur_work, plan.cpu_pf_work, plan.att)):
            step = max(step, chain)
    return AggStep(step, total, t_link, t_cpu, plan.h2d_bytes, sum(plan.d2h_bytes))


RAMP = 0.25    # _prefetches_behind: the width, in fixed costs, of the ramp between queued and not


def _prefetches_behind(plan, t0: float) -> float:
    """Priority, GPU gather: how many prefetches of a step queue behind an unfinished prefetch of their
    stream (and so pay the fixed cost) on a saturated link. Layer-ahead: the prefetch of layer i+2 is
    issued when attention i ends; on a saturated link the one of layer i+1 (issued when attention i-1
    ended) ran alone while post i-1 and pre i computed, then beside layer i's misses (at the share the
    misses leave it) until they ended, then alone during attention i: it is still in flight, and the
    next one queued, where its work outlasts all that (once queued, each pays: its own fixed cost
    lengthens the next remainder). One whose predecessor ends within RAMP / 2 fixed costs of its issue
    counts in proportion (the timeline's rule is all or nothing; the ramp keeps the step continuous in
    the context, which serving interpolates). Next-step and no misses: every prefetch queues (the
    saturated stream never drains)."""
    L = plan.layers
    r = plan.rates
    if plan.design.prefetch != "layer-ahead" or L < 3:
        return sum(1 for x in plan.pf_work if x > 0)
    slow = plan.compute_slowdown if r.method == "uva_gather" else 1.0
    s = max(1.0, r.urgent_slowdown)
    n = 0
    for i in range(L):
        nxt = plan.pf_work[(i + 2) % L]
        if nxt <= 0:
            continue
        p = plan.pf_work[(i + 1) % L] - t0                 # started on an idle stream: bytes only
        u = plan.ur_work[i] - t0 if plan.ur_work[i] > 0 else 0.0
        p -= (plan.post[i - 1] + plan.pre[i]) * slow          # alone, before layer i's misses
        if u > 0 and p > 0:
            p = p - u * (s - 1.0) if p > u * (s - 1.0) else 0.0   # beside the misses (their share 1 / s)
        n += min(1.0, max(0.0, 0.5 + (p - plan.att[i] * slow) / (RAMP * t0))) if t0 > 0 else float(p > plan.att[i] * slow)
    return n


def _compute_path(plan, s_bg, slow, s_u, chunk_s, t0, cpu_gather, exp_prev):
    """(compute path with its waits, FIFO bubbles, stalls, gathers queued, each layer's wait) of one step,
    every compute slowed by s_bg; exp_prev: each layer's wait from the previous pass."""
    L = plan.layers
    design = plan.design
    la = design.prefetch == "layer-ahead"
    prio = design.urgent_priority
    t0p = 0.0 if cpu_gather else t0
    u_all = [plan.ur_work[i] + plan.cpu_ur_work[i] for i in range(L)]
    p_all = [plan.pf_work[i] + plan.cpu_pf_work[i] for i in range(L)]
    total = plan.lm_s * s_bg
    gaps = stalls = 0.0
    queued = 0                      # gathers issued behind an unfinished gather of their stream
    exp = [0.0] * L
    for i in range(L):
        u = u_all[i]
        mid = plan.mid[i] * (slow if u > 0 else s_bg)
        own = 0.0
        if design.prefetch != "none" and L > 1:
            # the compute beside a prefetch in flight runs at 1/slow (it is the gather's window)
            pre_i = plan.pre[i] * slow
            post_p = plan.post[i - 1] * slow
            if la and L > 2:
                # layer i's own prefetch was issued when attention i-2 ended; the misses wait for it
                j, k = (i - 1) % L, (i - 2) % L
                window = (plan.post[k] + plan.pre[j] + plan.att[j] + plan.post[j] + plan.pre[i]) * slow \
                    + max(plan.mid[j] * slow, exp_prev[j])
                p_own = p_all[i] - t0p
                # a priority miss gather of layer i-1 inside that window takes the link from it
                ahead = (plan.post[k] + plan.pre[j]) * slow
                if prio and u_all[j] > 0 and p_own > ahead:
                    p_own += u_all[j] - t0p
                own = max(0.0, p_own - window)
                nxt = (i + 1) % L
            else:
                nxt = (i - 1) % L   # next-step: layer i-1's prefetch for the next step
            if own > 0:             # the next prefetch queued behind the late one: all of it ahead
                rest = p_all[nxt]
            else:
                rest = max(0.0, p_all[nxt] - t0p - post_p - pre_i)
            if u <= 0:
                exposed = own
            elif prio:
                # GPU gather: on its own stream, no fixed cost; CPU gather: the copy engine's per-burst
                # rule (sim/resources.py), no fixed cost where it joins the prefetch's copy
                uu = u - (t0p if not cpu_gather else (t0 if rest > plan.cpu_ur_work[i] else 0.0))
                exposed = own + ((min(uu * s_u, uu + rest) + chunk_s) if rest > 0 else uu)
            else:
                exposed = own + (rest + u if rest > 0 else u - t0p)
                queued += rest > 0  # the misses behind the prefetch on the one stream
                gaps += plan.att[i]   # the link idles while attention i runs (no gather beside it)
        else:
            # no prefetch: the fetch starts on an idle stream (bytes only); the key rebuild beside
            # it runs at 1/slow only while the gather is in flight
            exposed = max(0.0, u - t0) if u > 0 else 0.0
            if u > 0 and slow != 1.0:
                d = plan.mid[i]
                mid = d * slow if d * slow <= exposed else exposed + d - exposed / slow
        if plan.ur_min_s and u > 0:
            exposed = max(exposed, plan.ur_min_s[i])
        if plan.ur_serial and u > 0:
            total += (plan.pre[i] + plan.mid[i] + plan.att[i] + plan.post[i]) * s_bg + exposed
            exp[i] = exposed
            stalls += exposed
            continue
        total += (plan.pre[i] + plan.att[i] + plan.post[i]) * s_bg + max(mid, exposed)
        exp[i] = max(mid, exposed)
        stalls += max(0.0, exposed - mid)
    return total, gaps, stalls, queued, exp
