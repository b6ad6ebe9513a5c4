"""ShadowKV's low-rank keys (ANCHORS §2): SVD of the pre-RoPE keys, rank r shared across KV heads.

    lowrank_keys(model, cache, S, rank) -> per layer [1, H, S, d] post-RoPE keys rebuilt from rank r

The pre-RoPE keys of the selectable region come from the cache's post-RoPE keys by the inverse
rotation (RoPE is a rotation per position; the model's own rotary embedding gives cos and sin).
All KV heads are concatenated, [S, H*d], and truncated to rank min(r, H*d): U_r diag(s_r) V_r^T.
The rebuilt keys get RoPE again. Where r >= H*d (a small model) the rebuild is exact.
"""

from __future__ import annotations


def _rotate_half(x):
    import torch
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _cos_sin(model, S, device, layer_type=None):
    """cos, sin [S, d] and the attention scaling of the model's rotary embedding; `layer_type` for a model
    whose local and global layers rotate differently (Gemma 3: its rotary embedding takes the type)."""
    import torch
    rot = model.model.rotary_emb
    pos = torch.arange(S, device=device).view(1, -1)
    probe = torch.zeros(1, device=device, dtype=torch.float32)
    cos, sin = rot(probe, pos) if layer_type is None else rot(probe, pos, layer_type)
    scale = float(getattr(rot, "attention_scaling", 1.0) or 1.0)
    return cos[0].float() / scale, sin[0].float() / scale, scale          # [S, d]


def lowrank_keys(model, cache, S: int, rank: int) -> list:
    import torch
    out = []
    types = getattr(model.config, "layer_types", None)
    rotations = {}
    for i, layer in enumerate(cache.layers):
        k = layer.keys[0, :, :S].float()                                   # [H, S, d] post-RoPE
        kind = types[i] if types and "layer_type" in _params(model.model.rotary_emb) else None
        if kind not in rotations:
            rotations[kind] = _cos_sin(model, S, k.device, kind)
        cos, sin, scale = rotations[kind]
        pre = (k * cos - _rotate_half(k) * sin) / scale                     # inverse rotation
        H, _, d = pre.shape
        flat = pre.permute(1, 0, 2).reshape(S, H * d)
        r = min(rank, H * d, S)
        U, s, Vh = torch.linalg.svd(flat, full_matrices=False)
        rebuilt = ((U[:, :r] * s[:r]) @ Vh[:r]).view(S, H, d).permute(1, 0, 2)
        out.append(((rebuilt * cos + _rotate_half(rebuilt) * sin) * scale).unsqueeze(0))
    return out


def _params(module) -> tuple:
    import inspect
    return tuple(inspect.signature(module.forward).parameters)
