"""The kernels an Engine calls, as one table: the Triton kernels, or (ref) their torch twins."""

from __future__ import annotations

from dataclasses import dataclass

from ddbench.kernels.engine.model import rmsnorm
from ddbench.kernels.engine.transfer import gather_slots, gather_slots_ref


@dataclass
class Ops:
    score: object
    attention: object
    gather: object
    slots: object
    rebuild: object
    rebuild_changed: object     # (U, SV, old ids, new ids, k_out): the keys of the slots whose id changed
    spec_scores: object
    rmsnorm: object
    add_rmsnorm: object     # (x, y, w) -> (x + y, rmsnorm(x + y, w))
    rope_split: object
    swiglu: object
    assemble: object
    select: object          # (q, landmarks, k) -> ids [B, nq, H, k]
    spec_select: object     # (q, quantised keys, chunk, k) -> ids


def engine_ops(ref: bool) -> Ops:
    """The kernels an Engine calls: the Triton kernels, or (ref) their torch twins."""
    from ddbench.kernels import attention, gather, rebuild, select, specache
    from ddbench.kernels.engine import fastselect, fused
    if ref:
        return Ops(select.score_chunks_ref, attention.dual_sparse_attention_ref, gather.gather_ref,
                    gather_slots_ref, rebuild.rebuild_keys_ref, rebuild.rebuild_changed_ref,
                    specache.specache_chunk_scores_ref,
                    rmsnorm, fused.add_rmsnorm_ref, fused.rope_split_ref, fused.swiglu_ref, fused.assemble_ref,
                    fastselect.select_topk_ref, fastselect.specache_select_topk_ref)
    return Ops(select.score_chunks, attention.dual_sparse_attention, gather.gather_uva, gather_slots,
                rebuild.rebuild_keys, rebuild.rebuild_changed, lambda q, qk, chunk: specache.specache_scores_triton(q, qk, chunk=chunk),
                fused.rmsnorm, fused.add_rmsnorm, fused.rope_split, fused.swiglu, fused.assemble,
                fastselect.select_topk, fastselect.specache_select_topk)
