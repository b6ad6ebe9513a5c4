"""SimPy resources of the simulator: the full-duplex link (and the host CPU) as fluid servers,
the GPU compute stream, and GPU memory by category.

A `FluidServer` serves jobs measured in seconds of work at its full rate. It has an urgent and a
background class. With priority on, an urgent job arriving while a background job is in service
waits for the chunk in flight, then the two share the rate: urgent gets 1/urgent_slowdown of it
(the slowdown measured on the GPU for an urgent gather beside a background one; 1 means strict
priority) and the background job the rest, so the link stays work-conserving. With priority off
every job joins one FIFO queue. Rates change only at arrivals and completions, so each job costs
one SimPy timeout, and bytes are moved analytically in between.

Two servers coupled as `peer`s form a full-duplex link: when both directions are busy each runs
at `bidir_factor` of its rate (measured: both directions at once over twice one direction).
"""

from __future__ import annotations

from collections import deque

import simpy

from ddbench.errors import DDBenchError

EPS = 1e-15


class _Job:
    __slots__ = ("work", "rem", "nbytes", "urgent", "event", "t_submit", "t_start", "tag")

    def __init__(self, work, nbytes, urgent, event, now, tag):
        self.work = work
        self.rem = work
        self.nbytes = nbytes
        self.urgent = urgent
        self.event = event
        self.t_submit = now
        self.t_start = None
        self.tag = tag


class FluidServer:
    def __init__(self, env: simpy.Environment, name: str, priority: bool = True, urgent_slowdown: float = 1.0,
                 chunk_s: float = 0.0, bidir_factor: float = 1.0, record: list | None = None):
        self.env, self.name = env, name
        self.priority = priority
        self.urgent_share = 1.0 / max(1.0, urgent_slowdown)
        self.chunk_s = chunk_s
        self.bidir_factor = bidir_factor
        self.peer: FluidServer | None = None
        self.qu: deque = deque()   # urgent
        self.qb: deque = deque()   # background (or everything, without priority)
        self.ru = 0.0              # rate of the urgent head (fraction of full rate)
        self.rb = 0.0              # rate of the background head
        self.t_last = 0.0
        self.version = 0
        self.pending_t = -1.0      # time of the wake-up scheduled for the next completion
        self.busy_s = 0.0
        self.bytes_submitted = 0.0
        self.bytes_moved = 0.0
        self.jobs_done = 0
        self.record = record       # optional list of (name, tag, start, end, urgent) for traces

    # -------------------------------------------------------------- public
    @property
    def busy(self) -> bool:
        return bool(self.qu) or bool(self.qb)

    def submit(self, work: float, nbytes: float = 0.0, urgent: bool = False, tag: str = "") -> simpy.Event:
        ev = self.env.event()
        if work <= 0:
            ev.succeed()
            return ev
        was_busy = self.busy
        self._advance()
        job = _Job(work, nbytes, urgent, ev, self.env.now, tag)
        self.bytes_submitted += nbytes
        if urgent and self.priority:
            if self.qb and self.qb[0].t_start is not None and self.chunk_s:
                job.rem += self.chunk_s  # waits for the background chunk in flight
            self.qu.append(job)
        else:
            self.qb.append(job)
        self._reschedule()
        if not was_busy and self.peer is not None:
            self.peer._peer_changed()
        return ev

    def backlog_s(self) -> float:
        """Seconds of work still queued (at full rate)."""
        self._advance()
        return sum(j.rem for j in self.qu) + sum(j.rem for j in self.qb)

    # -------------------------------------------------------------- internals
    def _capacity(self) -> float:
        return self.bidir_factor if (self.peer is not None and (self.peer.qu or self.peer.qb)) else 1.0

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.t_last
        self.t_last = now
        if dt > 0 and (self.ru or self.rb):
            self.busy_s += dt
            if self.ru:
                self.qu[0].rem -= self.ru * dt
            if self.rb:
                self.qb[0].rem -= self.rb * dt

    def _reschedule(self) -> None:
        cap = self._capacity()
        u = self.qu[0] if self.qu else None
        b = self.qb[0] if self.qb else None
        ru = rb = 0.0
        if u is not None:
            ru = cap * self.urgent_share if b is not None else cap
            if u.t_start is None:
                u.t_start = self.env.now
        if b is not None:
            rb = cap - ru
            if rb > 0 and b.t_start is None:
                b.t_start = self.env.now
        self.ru, self.rb = ru, rb
        if ru or rb:
            dt = min(u.rem / ru if ru else float("inf"), b.rem / rb if rb else float("inf"))
            dt = dt if dt > 0 else 0.0
            t_next = self.env.now + dt
            if abs(t_next - self.pending_t) <= 1e-13 * max(1.0, t_next):
                return  # the wake-up already scheduled is still the right one
            self.version += 1
            self.pending_t = t_next
            v = self.version
            self.env.timeout(dt).callbacks.append(lambda _e, v=v: self._fire(v))
        else:
            self.version += 1
            self.pending_t = -1.0

    def _fire(self, version: int) -> None:
        if version != self.version:
            return
        self.pending_t = -1.0
        self._advance()
        done = []
        if self.ru and self.qu[0].rem <= 1e-12 * max(1.0, self.qu[0].work):
            done.append(self.qu.popleft())
        if self.rb and self.qb[0].rem <= 1e-12 * max(1.0, self.qb[0].work):
            done.append(self.qb.popleft())
        if not done:  # rounding: finish the job closest to completion
            tu = self.qu[0].rem / self.ru if self.ru else float("inf")
            tb = self.qb[0].rem / self.rb if self.rb else float("inf")
            done.append(self.qu.popleft() if tu <= tb else self.qb.popleft())
        for job in done:
            self.bytes_moved += job.nbytes
            self.jobs_done += 1
            if self.record is not None:
                self.record.append((self.name, job.tag, job.t_start, self.env.now, job.urgent))
            job.event.succeed()
        self._reschedule()
        if self.peer is not None and not (self.qu or self.qb):
            self.peer._peer_changed()

    def _peer_changed(self) -> None:
        self._advance()
        if self.ru or self.rb:
            self._reschedule()


def duplex_link(env, rates, priority: bool, record=None) -> tuple[FluidServer, FluidServer]:
    """H2D and D2H servers of one link, coupled as peers."""
    chunk_s = rates.chunk_bytes / (rates.h2d_gbps * 1e9)
    h2d = FluidServer(env, "h2d", priority, rates.urgent_slowdown, chunk_s, rates.bidir_factor, record)
    d2h = FluidServer(env, "d2h", True, 1.0, 0.0, rates.bidir_factor, record)
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
