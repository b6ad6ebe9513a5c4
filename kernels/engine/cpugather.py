"""The CPU-gather ablation's transfers (index_select on the host into pinned staging, one copy to the GPU).
Mixed into Engine (kernels/engine/engine.py), whose state it uses."""

from __future__ import annotations

import torch


class CpuGather:
    def _cpu_init(self):
        n = self.B * self.H * self.kc
        row = 2 * self.C * self.d
        self.stage = [torch.empty(n, row, dtype=self.dt, pin_memory=True) for _ in range(2)]
        self.stage_ev = [None, None]
        self.dstage = [torch.empty(n, row, dtype=self.dt, device=self.dev) for _ in range(2)]
        self.idx_host = torch.empty(3, n, dtype=torch.int32, pin_memory=True)
        self.n_host = torch.empty(1, dtype=torch.int32, pin_memory=True)
        self.si = 0

    def _cpu_stage(self):
        j = self.si
        self.si ^= 1
        if self.stage_ev[j] is not None:
            self.stage_ev[j].synchronize()          # the host waits until that staging copy is done
        return j

    def _cpu_gather_full(self, layer, idx, kb, vb):
        """index_select on the CPU into pinned staging, one H2D copy, split on the GPU (this stream)."""
        ih = self.idx_host[0, :idx.numel()].view(idx.shape)
        ih.copy_(idx, non_blocking=True)
        torch.cuda.current_stream().synchronize()   # the host needs the index
        j = self._cpu_stage()
        from ddbench.kernels.gather import gather_cpu_staging
        gather_cpu_staging(self.host, self._hl(layer), ih, self.stage[j], self.dstage[j],
                           kb, vb if kb is not None else vb)
        e = torch.cuda.Event()
        e.record()
        self.stage_ev[j] = e

    def _cpu_gather_misses(self, layer, plan, kb, vb):
        n = plan.bh.numel()
        self.idx_host[0, :n].copy_(plan.bh, non_blocking=True)
        self.idx_host[1, :n].copy_(plan.chunk, non_blocking=True)
        self.idx_host[2, :n].copy_(plan.slot, non_blocking=True)
        self.n_host.copy_(plan.count, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        c = int(self.n_host[0])
        if c == 0:
            return
        bh, ch, sl = (self.idx_host[r, :c].long() for r in range(3))
        j = self._cpu_stage()
        src = self.host[self._hl(layer)].view(self.B * self.H * self.N, -1)
        torch.index_select(src, 0, bh * self.N + ch, out=self.stage[j][:c])
        dst = self.dstage[j][:c]
        dst.copy_(self.stage[j][:c], non_blocking=True)
        dv = dst.view(c, 2, self.C, self.d)
        bhd, sld = bh.to(self.dev, non_blocking=True), sl.to(self.dev, non_blocking=True)
        b, h = bhd // self.H, bhd % self.H
        tok = sld[:, None] * self.C + torch.arange(self.C, device=self.dev)
        vb[b[:, None], h[:, None], tok] = dv[:, 1]
        if kb is not None:
            kb[b[:, None], h[:, None], tok] = dv[:, 0]
        e = torch.cuda.Event()
        e.record()
        self.stage_ev[j] = e
