"""ShadowKV's copy-then-regather fetch of one layer, as the engine ran it before issue 31 (measured by the
engine sweep's reuse-fetch records; kernels/engine/points.py)."""

from __future__ import annotations

# ShadowKV's fetch of one layer as the engine ran it before issue 31 (a copy of the previous selection
# into a spare buffer, then a thin gather of every chunk back: hits from the spare, misses from the
# host); the reuse-fetch record of kernels/engine/sweep.py still measures it. The engine's reuse branch
# now keeps each buffer in place and moves only the misses (Engine._sparse_attention). kb, vb: the
# layer's buffers (kb None: values only); pk, pv: the spare buffer's first kC = k*C tokens (pk None:
# values only); prev_true, true: the previous and this step's selections [B, H, k].

def reuse_copy(kb, vb, pk, pv):
    """The previous selection's rows of the layer's buffer (its first kC tokens) into the spare."""
    kC = pv.shape[2]
    pv.copy_(vb[:, :, :kC])
    if pk is not None:
        pk.copy_(kb[:, :, :kC])


def reuse_gather(gather, host_kv, layer, true, prev_true, kb, vb, pk, pv):
    """`true` into the layer's buffer: hits from the spare, misses from host_kv[layer] (`gather`:
    ddbench.kernels.gather.gather_uva, its own plan reuse_plan(prev_true, true) included, with its default
    launch, or the torch twin). Returns the gather's src_slot (None from the twin)."""
    return gather(host_kv, layer, true, kb, vb, prev=(prev_true, pk, pv))


def reuse_fetch(gather, host_kv, layer, true, prev_true, kb, vb, pk, pv):
    """The whole fetch: reuse_copy, then reuse_gather (on the current stream)."""
    reuse_copy(kb, vb, pk, pv)
    return reuse_gather(gather, host_kv, layer, true, prev_true, kb, vb, pk, pv)


def reuse_launch(gather) -> dict:
    """{'programs', 'items'} of the reuse gather as the engine launches it over a bf16 host: reuse_gather
    passes neither, so `gather`'s defaults (32 persistent programs; items None: ddbench.kernels.gather.launch_items,
    2 chunks in flight each for bf16 pieces)."""
    import inspect
    p = inspect.signature(gather).parameters
    out = {n: p[n].default for n in ("programs", "items")}
    if out["items"] is None:
        out["items"] = 2
    return out
