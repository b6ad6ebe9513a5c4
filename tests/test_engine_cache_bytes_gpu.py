"""dualdecoder-cache's recorded prefetch bytes are the prefetch fills' own counts: the same, layer by layer,
as an engine whose every fill is followed by a full synchronize (so no read of a fill's count can race it).
Before the fix the count was copied on the compute stream while the fill ran on the prefetch stream: the
engine rows recorded another layer's count, or none (prefetch_mib 0 at batch 16 and 32 in
traces/engine/h200-cache-fused-ctx)."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _counts(sync: bool, steps: int = 4):
    from ddbench.kernels.engine.selfcheck import build
    e, _ = build("dualdecoder-cache", 0.25, B=4, cache_tokens=1024, churn_rate=0.3, debug=False)
    if sync:
        fill = e.cache.fill_rows

        def fill_then_sync(*a, **kw):
            out = fill(*a, **kw)
            torch.cuda.synchronize()
            return out
        e.cache.fill_rows = fill_then_sync
    per_step = []
    for _ in range(steps):
        e.step()
        torch.cuda.synchronize()
        per_step.append(([int(n) for n in e.stats.prefetch_items], e.step_bytes()))
    return per_step


def test_prefetch_counts_are_the_fills_own_gpu():
    plain, synced = _counts(False), _counts(True)
    assert any(sum(items) > 0 for items, _ in synced)        # the prediction misses the cache: something moves
    for (items, nbytes), (items_s, nbytes_s) in zip(plain, synced):
        assert items == items_s and nbytes == nbytes_s
