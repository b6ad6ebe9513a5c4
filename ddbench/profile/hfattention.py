"""The registered attention function the profiler runs the model with (transformers 5).

`install(model)` registers an attention function named "ddbench_profile" together with a mask
function for the same name (transformers' `sdpa_mask`: without it, two new tokens over a KV cache
get no causal mask and the output token silently attends to the speculative token; ANCHORS §6),
and switches the model to it. The function reads one `Probe` object, attached as `model._ddb_probe`:

- `probe.capture` (dict or None): when a dict, the post-RoPE query of every layer is stored under
  its layer index as [B, q_len, Hq, d] fp32 (what the selection rule scores);
- `probe.sparse` (None or a `SparsePlan`): when set, every single-token decode query attends only
  to the chunks its own exact top-k selection picks, plus the always-resident tokens (the local
  window and generated tokens, everything at or after `plan.resident_from`). For ShadowKV's
  low-rank keys, `plan.keys[layer]` replaces the keys of the selectable region ([B, H, S, d],
  post-RoPE, rebuilt from the rank-r SVD of the pre-RoPE keys); for fp8 K/V, `plan.keys` and
  `plan.values` are the region's keys and values through e4m3 (ddbench/profile/layersweep.py `_fp8_kv`);
  selection always uses the exact landmarks (ShadowKV builds them from the exact post-RoPE keys at
  prefill; dualdecoder-cache on the GPU at prefill), or with `plan.index` the smaller index built from them
  (issue 47: the index's top-k, ddbench.kernels.indexkernels.index_select_ref).

Otherwise (prefill, `sparse` None, or a sliding-window layer of Gemma 3, whose window is resident in
every design) attention is transformers' own SDPA path (torch's fused scaled_dot_product_attention): exact
and dense, so measuring never changes the generated trajectory. A sliding-window layer attends over its
window's keys only (`window_slice`): the cache holds every token, and scoring all of them to mask all but the
window away made a 32K prefill's 15 local layers cost as much as 15 global ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NAME = "ddbench_profile"


@dataclass
class SparsePlan:
    landmarks: list            # per layer [B, H, N, d] fp32, exact post-RoPE chunk means
    budget_chunks: int
    chunk: int
    resident_from: int         # first token index that is always resident (local window, generated)
    keys: list | None = None   # per layer [B, H, S, d] replacement keys for tokens [0, S) (low-rank), or None
    values: list | None = None  # per layer [B, H, S, d] replacement values for tokens [0, S) (fp8), or None
    index: list | None = None   # per layer the selection index (kernels/indexkernels.py Index; issue 47), or None:
                                # the flat landmarks, today's rule


@dataclass
class Probe:
    capture: dict | None = None
    sparse: SparsePlan | None = None
    selections: list = field(default_factory=list)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    probe = getattr(module, "_ddb_probe", None)
    layer = module.layer_idx
    if probe is not None and probe.capture is not None:
        probe.capture[layer] = query.detach().transpose(1, 2).float()          # [B, q, Hq, d]
    plan = probe.sparse if probe is not None else None
    window = getattr(module, "sliding_window", None)
    if plan is None or query.shape[2] != 1 or window:   # local layers stay dense
        if window:
            key, value, attention_mask = window_slice(key, value, attention_mask, query.shape[2], int(window))
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kw)
    from ddbench.kernels.select import select_chunks_ref

    B, Hq, _, d = query.shape
    H, T = key.shape[1], key.shape[2]
    C, S = plan.chunk, plan.landmarks[layer].shape[2] * plan.chunk
    q = query.transpose(1, 2).float()
    if plan.index is None:
        idx = select_chunks_ref(q, plan.landmarks[layer], plan.budget_chunks)[:, 0]
    else:
        from ddbench.kernels.indexkernels import index_select_ref
        idx = index_select_ref(q.contiguous(), plan.index[layer], plan.budget_chunks)[:, 0]
    probe.selections.append(idx)
    allow = torch.zeros(B, H, T, dtype=torch.bool, device=key.device)
    tok = (idx.long().unsqueeze(-1) * C + torch.arange(C, device=key.device)).flatten(2)     # [B, H, k*C]
    allow.scatter_(2, tok, True)
    allow[:, :, plan.resident_from:] = True
    if plan.keys is not None:
        key = torch.cat([plan.keys[layer].to(key.dtype), key[:, :, S:]], dim=2)
    if plan.values is not None:
        value = torch.cat([plan.values[layer].to(value.dtype), value[:, :, S:]], dim=2)
    mask = allow.repeat_interleave(Hq // H, dim=1).unsqueeze(2)                               # [B, Hq, 1, T]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(Hq // H, 1), value.repeat_interleave(Hq // H, 1),
        attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def window_slice(key, value, mask, q_len: int, window: int):
    """A sliding-window layer's keys, values and mask cut to the columns its queries can see.

    The profiler's cache keeps every layer whole (a dual-token step must drop its speculative token), so a
    local layer of Gemma 3 would otherwise score all T cached keys and mask all but `window` of them away.
    The queries are the last `q_len` cache positions, so the first visible key is T - q_len - window + 1;
    the cut is taken only where the mask says so (its column just before the cut is masked for every query),
    and is exact: the dropped columns carry zero weight."""
    T = key.shape[2]
    lo = T - q_len - window + 1
    if lo <= 0 or mask is None or mask.dtype.is_floating_point or mask.shape[-1] != T or bool(mask[..., lo - 1].any()):
        return key, value, mask
    return key[:, :, lo:], value[:, :, lo:], mask[..., lo:]


def install(model) -> Probe:
    """Register the attention + mask functions, switch `model` to them, attach and return a Probe."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    probe = Probe()
    for m in model.modules():
        if hasattr(m, "layer_idx") and hasattr(m, "o_proj"):
            m._ddb_probe = probe
    return probe
