"""The chunk cache's path through a layer (kernels/engine/chunkcache.py): the prefetch fill and the gather
of its misses on the prefetch stream, then the urgent fill and fetch before the attention. Mixed into
Engine (kernels/engine/engine.py), whose state it uses."""

from __future__ import annotations

import torch

from ddbench.kernels.engine.model import nvtx_range
from ddbench.kernels.yieldgather import lower_flag, raise_flag


class CachePath:
    def _issue_cache_prefetch(self, u, pred):
        """Chunk cache: the prefetch fill of `pred` for layer use u (stamp 2 x its step) and the gather of
        the predicted chunks it missed, on the prefetch stream after the layer's last reader."""
        layer = u % self.L
        off = u // self.L - self.step_u0 // self.L      # 1: a prefetch for the next step's first layers
        count = self.pf_count[(self.step_u0 // self.L) % 2, layer:layer + 1]   # this (issuing) step's row
        torch.mul(self.step_dev + off, 2, out=self.pf_stamp[layer:layer + 1])
        ev_st, _ = self.sched.run("compute", "stamp", lambda: None, layer=layer)
        box = {}

        def fill():
            with nvtx_range(f"prefetch fill L{layer}"):
                box["plan"], _ = self.cache.fill_rows(layer, pred, self.pf_stamp[layer:layer + 1], kind="prefetch")
                # the plan buffers are reused: keep its count, copied on this stream after the fill (a copy on
                # the compute stream raced the fill and recorded another fill's count, or none); an add, a
                # kernel, not a memcpy node (a copy engine's) between the fill and the gather
                torch.add(box["plan"].count, 0, out=count)
        ev_fill, _ = self.sched.run("prefetch", "prefetch-fill", fill, waits=[self.free_ev[layer], ev_st], layer=layer,
                                    buf=layer, use=u)
        self.fill_ev[u] = ev_fill

        def go():
            with nvtx_range(f"prefetch L{layer}"):
                self.slots(self.host, self._hl(layer), box["plan"], self.kbuf[layer], self.vbuf[layer],
                           programs=self.cfg.prefetch_programs, **self.yield_kw, **self.cache.slot_kw(layer))
        ev, _ = self.sched.run("prefetch", "prefetch", go, layer=layer, buf=layer, use=u)
        self.ready_ev.setdefault(u, []).append(ev)
        self.prefetched[u] = pred
        self.stats.prefetch_items.append(count)
        self.stats.prefetch_layer.append((layer, False))

    def _cache_fetch(self, i, u, true, have_pred):
        """Chunk cache, layer i: (events attention waits on, rows). Compute only: both fills on the compute
        stream (the prediction's, then the truth's), nothing fetched. With transfers: the urgent fill
        after this use's prefetch fill, then the true chunks in neither fetched on the urgent stream
        after it and after the layer's prefetch (its victims may be slots the prefetch writes)."""
        cfg, c = self.cfg, self.cache
        if not cfg.transfers:
            if self.pred is not None and self.sys.prefetch != "none":
                with nvtx_range("prefetch fill"):
                    c.fill_rows(i, self.pred[i], self.step_dev, mul=2, kind="prefetch")
            with nvtx_range("urgent fill"):
                return [], c.fill_rows(i, true, self.step_dev, mul=2, add=1, rows=True)[1]
        fill_ev = self.fill_ev.pop(u, None)
        if fill_ev is not None:
            self.sched.run("compute", "wait-fill", lambda: None, waits=[fill_ev], layer=i)
        with nvtx_range("urgent fill"):
            plan, rows = c.fill_rows(i, true, self.step_dev, mul=2, add=1, rows=True)
        ev_plan, _ = self.sched.run("compute", "plan", lambda: None, layer=i)
        pre_ev = self.ready_ev.get(u, [])

        def urgent():
            with nvtx_range(f"urgent L{i}"):
                if self.yield_kw:       # the prefetch gathers issue no new reads meanwhile
                    raise_flag(self.yield_kw["yielding"].flag)
                self.slots(self.host, self._hl(i), plan, self.kbuf[i], self.vbuf[i], programs=cfg.urgent_programs,
                           **c.slot_kw(i))
                if self.yield_kw:
                    lower_flag(self.yield_kw["yielding"].flag)
        ev_u, _ = self.sched.run("urgent", "urgent", urgent, waits=[ev_plan, self.free_ev[i]] + pre_ev, layer=i, buf=i,
                                 use=u)
        self.stats.urgent_counts.append(plan.count.clone())
        self.stats.urgent_layer.append((i, False))
        return pre_ev + [ev_u], rows
