"""Index-set helpers shared by the gather and the accuracy profiler (torch only; tiny tensors).

reuse_plan(prev_idx, idx) -> src_slot: for each chunk of `idx`, its slot in `prev_idx` or -1.
index_overlap(a, b) -> fraction of a's chunks that are also in b, over the last dim.
Both take [..., n] integer tensors with equal leading dims; they need not be sorted.
"""

from __future__ import annotations

import torch

from ddbench.core.errors import DDBenchError


def reuse_plan(prev_idx: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """src_slot[..., j] = s where prev_idx[..., s] == idx[..., j], else -1 (int32, same shape as idx)."""
    if prev_idx.shape[:-1] != idx.shape[:-1]:
        raise DDBenchError(f"index sets differ in leading dims: {tuple(prev_idx.shape)} vs {tuple(idx.shape)}")
    vals, order = prev_idx.to(torch.int64).sort(dim=-1, stable=True)   # repeats: the first slot
    q = idx.to(torch.int64).contiguous()
    pos = torch.searchsorted(vals.contiguous(), q).clamp_(max=vals.shape[-1] - 1)
    found = vals.gather(-1, pos) == q
    return torch.where(found, order.gather(-1, pos), torch.full_like(pos, -1)).to(torch.int32)


def index_overlap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a ∩ b| / |a| per leading index (e.g. per layer and head), as float32."""
    return (reuse_plan(b, a) >= 0).to(torch.float32).mean(dim=-1)
