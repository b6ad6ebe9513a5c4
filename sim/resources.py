"""Resources of the simulator: the full-duplex link (and the host CPU) as fluid servers, and GPU
memory by category.

A `FluidServer` serves jobs measured in seconds of work at its full rate. It has an urgent and a
background class. With priority on, an urgent job arriving while a background job is in service
waits for the chunk in flight, then the two share the rate: urgent gets 1/urgent_slowdown of it
(the slowdown measured on the GPU for an urgent gather beside a background one; 1 means strict
priority) and the background job the rest, so the link stays work-conserving. With priority off
every job joins one FIFO queue. Rates change only at arrivals and completions, and bytes are
moved analytically in between.

Fixed cost per burst, not per transfer: a job may carry a `fixed` part of its work (the
transfer's startup: launch, first PCIe round trips, ramp of the persistent gather grid; the
bundle's affine fit of one transfer alone, `LinkRates.h2d_t0_s`). A job that arrives while the
server already moves bytes (another job queued or in service) drops that part: its startup
overlaps the transfer in flight, so back-to-back transfers pay the fixed latency once per busy
period (burst). A job that finds the server idle pays it in full.

Two servers coupled as `peer`s form a full-duplex link: when both directions are busy each runs
at `bidir_factor` of its rate (measured: both directions at once over twice one direction).

The servers of one link form a `FluidGroup`, a small discrete-event engine of its own that is
advanced lazily: its internal events (completions, rate changes, a CPU-gather stage handing a
job to the copy engine) are processed in time order only when the GPU process submits a job,
asks how much work is queued, or waits for a job (`finish_time`). The GPU process is the only
source of new jobs, so nothing can be submitted while it waits, and the completion time it gets
is exact. The GPU process itself is a SimPy process (sim/timeline.py): it yields once per layer,
and the link costs no SimPy events at all (about 8 per layer when each completion and re-rate
was a SimPy timeout; same results).
"""

from __future__ import annotations

import math
from collections import deque

from ddbench.core.errors import DDBenchError

EPS = 1e-15
INF = math.inf


class Job:
    __slots__ = ("work", "rem", "nbytes", "urgent", "t_submit", "t_start", "t_done", "tag", "then", "fixed")

    def __init__(self, work, nbytes, urgent, now, tag, then=None, fixed=0.0):
        self.work = work
        self.fixed = fixed         # the part of `work` that is the per-burst fixed cost (see the module doc)
        self.rem = work
        self.nbytes = nbytes
        self.urgent = urgent
        self.t_submit = now
        self.t_start = None
        self.t_done = None
        self.tag = tag
        self.then = then           # called with the completion time (a CPU stage hands on to the link)


class FluidServer:
    def __init__(self, name: str, priority: bool = True, urgent_slowdown: float = 1.0,
                 chunk_s: float = 0.0, bidir_factor: float = 1.0, record: list | None = None):
        self.name = name
        self.priority = priority
        self.urgent_share = 1.0 / max(1.0, urgent_slowdown)
        self.chunk_s = chunk_s
        self.bidir_factor = bidir_factor
        self.peer: FluidServer | None = None
        self.qu: deque = deque()   # urgent
        self.qb: deque = deque()   # background (or everything, without priority)
        self.ru = 0.0              # rate of the urgent head (fraction of full rate)
        self.rb = 0.0              # rate of the background head
        self.t = 0.0               # this server's clock
        self.t_next = INF          # time of its next completion at the current rates
        self.busy_s = 0.0
        self.bytes_submitted = 0.0
        self.bytes_moved = 0.0
        self.jobs_done = 0
        self.fixed_saved_s = 0.0   # fixed costs not paid because a burst was under way
        self.record = record       # optional list of (name, tag, start, end, urgent) for traces

    @property
    def busy(self) -> bool:
        return bool(self.qu) or bool(self.qb)

    def backlog_s(self) -> float:
        """Seconds of work still queued (at full rate), at this server's clock."""
        tot = 0.0
        for j in self.qu:
            tot += j.rem
        for j in self.qb:
            tot += j.rem
        return tot

    # -------------------------------------------------------------- internals (driven by FluidGroup)
    def _advance(self, t: float) -> None:
        dt = t - self.t
        self.t = t
        if dt > 0 and (self.ru or self.rb):
            self.busy_s += dt
            if self.ru:
                self.qu[0].rem -= self.ru * dt
            if self.rb:
                self.qb[0].rem -= self.rb * dt

    def _add(self, job: Job) -> None:
        self.bytes_submitted += job.nbytes
        if job.fixed and (self.qu or self.qb):
            # a burst is under way: this transfer's startup overlaps it (paid once per burst)
            drop = min(job.fixed, job.rem)
            job.rem -= drop
            job.work -= drop
            job.fixed = 0.0
            self.fixed_saved_s += drop
        if job.urgent and self.priority:
            if self.qb and self.qb[0].t_start is not None and self.chunk_s:
                job.rem += self.chunk_s  # waits for the background chunk in flight
            self.qu.append(job)
        else:
            self.qb.append(job)

    def _rerate(self) -> None:
        peer = self.peer
        cap = self.bidir_factor if (peer is not None and (peer.qu or peer.qb)) else 1.0
        u = self.qu[0] if self.qu else None
        b = self.qb[0] if self.qb else None
        ru = rb = 0.0
        if u is not None:
            ru = cap * self.urgent_share if b is not None else cap
            if u.t_start is None:
                u.t_start = self.t
        if b is not None:
            rb = cap - ru
            if rb > 0 and b.t_start is None:
                b.t_start = self.t
        self.ru, self.rb = ru, rb
        if ru or rb:
            tu = u.rem / ru if ru else INF
            tb = b.rem / rb if rb else INF
            dt = tu if tu < tb else tb
            self.t_next = self.t + (dt if dt > 0 else 0.0)
        else:
            self.t_next = INF

    def _complete(self) -> list:
        """Pop the job(s) finishing now (the one closest to completion, and any other within rounding)."""
        tu = self.qu[0].rem / self.ru if self.ru else INF
        tb = self.qb[0].rem / self.rb if self.rb else INF
        done = []
        if tu <= tb:
            done.append(self.qu.popleft())
            if self.rb and self.qb[0].rem <= 1e-12 * max(1.0, self.qb[0].work):
                done.append(self.qb.popleft())
        else:
            done.append(self.qb.popleft())
            if self.ru and self.qu[0].rem <= 1e-12 * max(1.0, self.qu[0].work):
                done.append(self.qu.popleft())
        return done


class FluidGroup:
    """The servers of one link (and the host CPU stage), advanced together in time order."""

    def __init__(self, servers: list[FluidServer]):
        self.servers = [s for s in servers if s is not None]
        self.t = 0.0

    def _step(self) -> bool:
        """Process the earliest internal event; False when none is pending."""
        s, tn = None, INF
        for x in self.servers:
            if x.t_next < tn:
                s, tn = x, x.t_next
        if s is None:
            return False
        for x in self.servers:
            if x.t != tn:
                x._advance(tn)
        self.t = tn
        done = s._complete()
        s._rerate()
        p = s.peer
        if p is not None and not (s.qu or s.qb) and (p.qu or p.qb):
            p._rerate()
        for job in done:
            job.rem = 0.0
            job.t_done = tn
            s.bytes_moved += job.nbytes
            s.jobs_done += 1
            if s.record is not None:
                s.record.append((s.name, job.tag, job.t_start, tn, job.urgent))
            if job.then is not None:
                job.then(tn)
        return True

    def advance_to(self, t: float) -> None:
        servers = self.servers
        while True:
            tn = INF
            for x in servers:
                if x.t_next < tn:
                    tn = x.t_next
            if tn > t or not self._step():
                break
        if t > self.t and t != INF:
            for x in servers:
                x._advance(t)
            self.t = t

    def submit(self, server: FluidServer, t: float, work: float, nbytes: float = 0.0, urgent: bool = False,
               tag: str = "", then=None, fixed: float = 0.0) -> Job:
        """A job of `work` seconds at full rate, submitted at time t (>= the group's clock); `fixed` of
        those seconds is its per-burst fixed cost, dropped where the server is busy at t."""
        self.advance_to(t)
        job = Job(work, nbytes, urgent, t, tag, then, fixed if work > 0 else 0.0)
        if work <= 0:
            job.t_done = t
            if then is not None:
                then(t)
            return job
        was_busy = bool(server.qu or server.qb)
        server._add(job)
        server._rerate()
        p = server.peer
        if not was_busy and p is not None and (p.qu or p.qb):
            p._rerate()
        return job

    def finish_time(self, job: Job) -> float:
        """When `job` completes (nothing else is submitted meanwhile: the caller waits for it)."""
        while job.t_done is None:
            if not self._step():
                raise RuntimeError(f"job {job.tag} can never complete")
        return job.t_done


def duplex_link(rates, priority: bool, record=None) -> tuple[FluidServer, FluidServer]:
    """H2D and D2H servers of one link, coupled as peers."""
    chunk_s = rates.chunk_bytes / (rates.h2d_gbps * 1e9)
    h2d = FluidServer("h2d", priority, rates.urgent_slowdown, chunk_s, rates.bidir_factor, record)
    d2h = FluidServer("d2h", True, 1.0, 0.0, rates.bidir_factor, record)
    h2d.peer, d2h.peer = d2h, h2d
    return h2d, d2h


class MemoryLedger:
    """GPU memory by category; raises if an allocation would exceed capacity, and keeps the peak."""

    def __init__(self, capacity: int, static: dict[str, float]):
        self.capacity = capacity
        self.by_cat: dict[str, float] = dict(static)
        self.total = sum(static.values())
        self.peak = self.total
        self.peak_by_cat = dict(self.by_cat)
        if self.total > capacity:
            raise DDBenchError(f"the static GPU memory ({self.total / 1e9:.1f} GB) exceeds the capacity"
                               f" ({capacity / 1e9:.1f} GB)")

    def fits(self, nbytes: float) -> bool:
        return self.total + nbytes <= self.capacity

    def alloc(self, cat: str, nbytes: float) -> None:
        if self.total + nbytes > self.capacity + 1e-6:
            raise RuntimeError(f"memory over capacity: {cat} +{nbytes:.0f} B on {self.total:.0f} of {self.capacity}")
        self.by_cat[cat] = self.by_cat.get(cat, 0.0) + nbytes
        self.total += nbytes
        if self.total > self.peak:
            self.peak = self.total
            self.peak_by_cat = dict(self.by_cat)

    def free(self, cat: str, nbytes: float) -> None:
        self.by_cat[cat] -= nbytes
        self.total -= nbytes
