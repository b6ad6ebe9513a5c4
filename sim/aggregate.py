"""Per-step aggregate: the time of one decode step in closed form, from the same StepPlan.

Used by serving mode, where one event stands for one or more batch steps. The step is bound
either by the link or by the compute path:

  T_link    = sum over layers of the H2D work (prefetch + urgent; with prefetch one fixed cost per
              step, the transfers running back to back; without, one per transfer), plus
              the rate lost while the D2H direction is busy beside it (bidir_factor); with a CPU
              gather, the host CPU stage is a second pipeline bound
  T_compute = LM head + sum over layers of
              (pre + max(key rebuild, exposed transfer) + attention + post) * slowdown
              (plan.ur_serial: key rebuild + exposed transfer, the fetch being in the compute
              stream's order)
  exposed transfer of layer i (the wait between its true index and its attention):
    - no prefetch: the urgent fetch itself (nothing else is on the link)
    - with priority: the urgent fetch, stretched by the measured urgent slowdown while the
      prefetch of the next layer is still in flight
    - FIFO: the rest of that prefetch, then the urgent fetch
    plus any part of layer i's own prefetch not done within its window
  T_step = max(T_compute, T_link, T_cpu); where T_link >= the compute alone (link-bound) but the
           compute path with its waits is longer than T_link, the transfers do not run back to
           back: T_link is then taken with one fixed cost per transfer (at most T_compute); FIFO
           (a bubble per layer, see below) pays one fixed cost per layer

In steady state the timeline (sim/timeline.py) and this formula agree wherever one bound
dominates (tests/test_sim_agreement.py); between the two regimes the max() is an underestimate,
of at most the overlap the timeline loses at the transition (reported in sim/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.plan import StepPlan


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


def aggregate_step(plan: StepPlan) -> AggStep:
    L = plan.layers
    sysx = plan.system
    r = plan.rates
    if r is None:
        c = plan.compute_s
        return AggStep(c, c, 0.0, 0.0, 0.0, 0.0)
    # fixed cost once per burst (sim/resources.py): with prefetches in flight the link moves bytes
    # back to back, so a link-bound step pays one fixed cost, not one per transfer; without
    # prefetch every fetch starts on an idle link and pays its own
    t0 = r.h2d_t0_s
    n_x = sum(1 for x in plan.pf_work if x > 0) + sum(1 for x in plan.ur_work if x > 0)
    W = sum(plan.pf_work) + sum(plan.ur_work)
    W_each = W                      # every transfer paying its own fixed cost
    if sysx.prefetch != "none" and n_x > 1:
        W -= (n_x - 1) * t0
    n_d = sum(1 for x in plan.d2h_work if x > 0)
    D = sum(plan.d2h_work) - max(0, n_d - 1) * r.d2h_t0_s   # one D2H copy per step
    beta = r.bidir_factor
    t_link = W + min(D / beta, W) * (1.0 - beta) if W else 0.0
    t_cpu = sum(plan.cpu_pf_work) + sum(plan.cpu_ur_work)
    slow = r.compute_slowdown if r.method == "uva_gather" else 1.0
    s_u = r.urgent_slowdown if sysx.urgent_priority else 1.0
    chunk_s = r.chunk_bytes / (r.h2d_gbps * 1e9)
    # positions on the compute path (no stalls): end of each attention, and each layer's ready time
    t, att_end, ready = 0.0, [0.0] * L, [0.0] * L
    for i in range(L):
        t += plan.pre[i] + plan.mid[i]
        ready[i] = t
        t += plan.att[i]
        att_end[i] = t
        t += plan.post[i]
    cycle = t + plan.lm_s
    c_pure = plan.compute_s
    # share of the step during which a GPU gather is in flight (it slows compute by `slow`)
    # (compute runs at 1/slow speed while a prefetch gather is in flight; transfers of designs
    # without prefetch only overlap the key rebuild, which is charged the full slowdown below)
    overlap = min(t_link, c_pure * slow) if sysx.prefetch != "none" else 0.0
    s_bg = 1.0 + overlap * (1.0 - 1.0 / slow) / c_pure if c_pure else 1.0
    total = plan.lm_s * s_bg
    gaps = 0.0
    for i in range(L):
        u = plan.ur_work[i] + plan.cpu_ur_work[i]
        mid = plan.mid[i] * (slow if u > 0 else s_bg)
        if sysx.prefetch == "layer-ahead":
            nxt = (i + 1) % L
            # the next layer's prefetch was issued when attention i-1 ended
            issued_ago = (ready[i] - plan.mid[i] - att_end[i - 1]) % cycle if L > 1 else 0.0
            rest = max(0.0, plan.pf_work[nxt] + plan.cpu_pf_work[nxt] - issued_ago)
            if u <= 0:
                exposed = 0.0
            elif sysx.urgent_priority:   # on a busy link the urgent fetch's fixed cost overlaps it
                exposed = (max(0.0, u - t0) * s_u + chunk_s) if rest > 0 else u
            else:
                exposed = rest + (max(0.0, u - t0) if rest > 0 else u)
                gaps += plan.att[i] * s_bg  # FIFO: the link idles while attention i runs
            # layer i's own prefetch was issued when attention i-2 ended
            window = (ready[i] - att_end[i - 2]) % cycle if L > 2 else cycle
            own = max(0.0, plan.pf_work[i] + plan.cpu_pf_work[i] - window)
            exposed = max(exposed, own + plan.mid[i]) if own > 0 else exposed
        else:
            exposed = u
        if plan.ur_min_s and u > 0:
            exposed = max(exposed, plan.ur_min_s[i])
        if plan.ur_serial and u > 0:   # the fetch is in the compute stream's order: the rebuild follows it
            total += (plan.pre[i] + plan.mid[i] + plan.att[i] + plan.post[i]) * s_bg + exposed
            continue
        total += (plan.pre[i] + plan.att[i] + plan.post[i]) * s_bg + max(mid, exposed)
    if sysx.prefetch == "none":
        link_bound = t_link  # every transfer is already on the compute path
    else:
        link_bound = t_link + gaps
    if sysx.prefetch != "none" and t_link >= c_pure * s_bg:
        # link-bound: the link idles only in the FIFO gaps, so one fixed cost per step. But where the
        # compute path with its waits (total) is longer than that, the transfers do not run back to
        # back: each then pays its fixed cost, up to the link time with every fixed cost paid
        t_each = W_each + min(D / beta, W_each) * (1.0 - beta)
        if sysx.prefetch == "layer-ahead" and not sysx.urgent_priority:
            # FIFO: the link idles in one bubble per layer (gaps), and each new burst pays the fixed cost
            step = max(link_bound + max(0, L - 1) * t0, t_cpu)
        else:
            step = max(link_bound, min(total, t_each + gaps), t_cpu)
    else:
        step = max(total, link_bound, t_cpu)
    return AggStep(step, total, t_link, t_cpu, plan.h2d_bytes, sum(plan.d2h_bytes))
