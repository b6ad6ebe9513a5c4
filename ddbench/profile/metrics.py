"""Overlap of chunk selections: hit, reuse, union coverage, new-prediction share.

For one (step, layer, KV head), with true = step t+1's selection (from its output token's query),
pred = the prediction made at step t from the speculative token's query, and prev = step t's own
output-token selection, all sets of k chunk ids:

    hit            = |pred ∩ true| / |true|           (DualDecoder's prefetch covers this share)
    reuse          = |prev ∩ true| / |true|           (ShadowKV keeps this share from the last step)
    union          = |(pred ∪ prev) ∩ true| / |true|  (a design that keeps prev and prefetches pred)
    new_pred_share = |pred \\ prev| / |true|           (what that design moves over the link per step)

overlaps(true, pred, prev, n_chunks) takes [..., k] integer tensors with equal shapes and returns
the four as float32 tensors of the leading shape.
"""

from __future__ import annotations


def _mask(idx, n):
    import torch
    m = torch.zeros(*idx.shape[:-1], n, dtype=torch.bool, device=idx.device)
    return m.scatter_(-1, idx.long(), True)


def overlaps(true, pred, prev, n_chunks: int) -> dict:
    t, p, r = _mask(true, n_chunks), _mask(pred, n_chunks), _mask(prev, n_chunks)
    size = t.sum(-1).float()
    return {
        "hit_rate": (p & t).sum(-1).float() / size,
        "reuse_hit_rate": (r & t).sum(-1).float() / size,
        "union_hit_rate": ((p | r) & t).sum(-1).float() / size,
        "new_pred_share": (p & ~r).sum(-1).float() / size,
    }
