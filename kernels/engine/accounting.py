"""What a step moved and what it cannot avoid reading: the link bytes of the last step (step_bytes) and the
HBM floor's bytes (floor_bytes). Mixed into Engine (kernels/engine/engine.py), whose state it uses."""

from __future__ import annotations

from ddbench.core.memory import kv_piece_bytes


class Accounting:
    def _item_bytes(self, i, values_only):
        """Link bytes of one fetched chunk-head: K and V (or V alone), each C*d*2 in bf16, C*d + its fp32
        scale in fp8 (ddbench/core/memory.py kv_piece_bytes)."""
        w = self.cfg.workload
        piece = self.C * self.d * self.dt.itemsize if w.kv_bits == 16 else kv_piece_bytes(self.m, w)
        return piece * (1 if values_only else 2)

    def step_bytes(self, stats=None):
        """(prefetch_bytes, urgent_bytes) of the last step, or of a kept `stats` (syncs on the urgent counts)."""
        stats = self.stats if stats is None else stats
        pf = sum(int(n) * self._item_bytes(l, vo) for n, (l, vo) in zip(stats.prefetch_items, stats.prefetch_layer))
        ur = 0
        for c, (l, vo) in zip(stats.urgent_counts, stats.urgent_layer):
            ur += int(c) * self._item_bytes(l, vo)
        return pf, ur

    def floor_bytes(self) -> dict:
        """HBM bytes one (steady-state) step cannot avoid reading: every layer's weights and the LM
        head, the resident selection state (landmarks; low-rank factor rows of the selected tokens;
        the 2-bit key copy with its scales and zeros) and the attended K and V (each request, KV
        head and token once). The floor of the step is their sum over the HBM copy rate."""
        L, B, H, d, E = self.L, self.B, self.H, self.d, self.dt.itemsize
        w = self.w
        weights = sum(t.numel() for i in range(L) for t in (w.wqkv[i], w.wo[i], w.wgu[i], w.wdown[i]))
        weights += 0 if w.bqkv is None else sum(b.numel() for b in w.bqkv)
        weights = (weights + w.lm_head.numel()) * E
        s, cfg = self.sys, self.cfg
        nq = 1 if s.kv_on_gpu else self.nq
        mean_g = (cfg.gen_slots - 2) / 2
        if s.kv_on_gpu:
            sel = 0
            kv = L * B * H * (cfg.context + mean_g + nq) * d * E * 2
        else:
            sel = 0
            if s.landmarks:
                sel += L * B * H * self.N * d * E
            if s.quant_bits:
                sel += sum(q.codes.numel() + 2 * q.scale.numel() * E for q in self.qk)
            for i in range(L):
                if self.lowrank[i]:
                    sel += (B * self.kc * self.C * cfg.rank + B * H * cfg.rank * d) * E
            kv = L * B * H * (self.kc * self.C + self.R0 + mean_g + nq) * d * E * 2
        return dict(weights=weights, selection=sel, kv=kv, total=weights + sel + kv)
