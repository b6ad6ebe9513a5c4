"""fp8 (e4m3) KV against bf16 on the profiler's real activations: the attention-output error.

    variants(k, v, chunk, selectable) -> {"fp32": (k, v), "bf16": (k, v), "fp8": (k, v)}   fp32 tensors
    attend(q, k, v, scaling, allow=None) -> o                  exact softmax attention in fp32, GQA
    allowed(sel, chunk, tokens, resident_from) -> bool mask    a top-k selection plus the resident tokens
    rel_error(o, ref) -> ||o - ref|| / ||ref|| per output vector
    layer_errors(q, k, v, *, chunk, selectable, scaling, sel=None) -> {metric: errors [items]}
    Collector: errors by (layer, context, task, budget, selection, metric) -> CSV rows and the summary

Method. For one layer, q [n, Hq, d] are the output token's captured post-RoPE decode queries and k, v
[H, P, d] the prompt's cached post-RoPE keys and values (fp32 on CPU). Three copies of K/V:
    fp32   as the model computed them (the reference);
    bf16   cast to bf16 (what the GPU holds; the baseline);
    fp8    the bf16 copy's selectable region [0, S) quantised per (chunk, KV head) by kernels/fp8.py
           (one fp32 scale per chunk-head, e4m3 values) and dequantised to fp32; the resident tokens
           [S, P) (the local window) stay bf16, as they stay on the GPU in dualdecoder-cache.
Attention is computed in fp32 from each copy, with the same queries, either dense over all P prompt
tokens or over the true top-k selection (the chunks exact top-k picks for that query, what
dualdecoder-cache attends, plus the resident tokens [S, P), the mask the profiler's sparse attention
uses). Because the scale is per chunk-head, quantising the whole region then masking equals moving
only the selected chunks' bytes and scales (ddbench.kernels.fp8.gather_dequant). Generated tokens are not in
the prompt cache (the profiler drops them after each run) and are left out of both sides.
Metrics per (step, query head) item: fp8_vs_bf16 = ||o_fp8 - o_bf16|| / ||o_bf16||, and the floor
bf16_vs_fp32 = ||o_bf16 - o_fp32|| / ||o_fp32||.
"""

from __future__ import annotations

from collections import defaultdict

METRICS = ("fp8_vs_bf16", "bf16_vs_fp32")
SELECTIONS = ("dense", "topk")
NOTE = ("attention output of the real decode queries over the real prompt K/V, computed in fp32 from three"
        " copies of K/V: fp32 (the model's), bf16 (cast), fp8 (the bf16 copy's selectable region quantised by"
        " kernels/fp8.py, one fp32 scale per (chunk, KV head), dequantised; the local window stays bf16);"
        " dense = all prompt tokens, topk = the exact top-k chunks of each query plus the local window;"
        " error per (step, query head) item = ||o - o_ref|| / ||o_ref||; fp8_vs_bf16 against bf16,"
        " bf16_vs_fp32 (the floor) against fp32")


def variants(k, v, chunk: int, selectable: int) -> dict:
    """The fp32, bf16 and fp8 copies of k, v [H, P, d] (all returned as fp32)."""
    import torch

    from ddbench.kernels.fp8 import dequantize_chunks, quantize_chunks
    k32, v32 = k.float(), v.float()
    kb, vb = k32.to(torch.bfloat16).float(), v32.to(torch.bfloat16).float()
    S = selectable

    def fp8(x):
        if S == 0:
            return x
        q, s = quantize_chunks(x[..., :S, :], chunk)
        return torch.cat([dequantize_chunks(q, s, chunk), x[..., S:, :]], dim=-2)
    return {"fp32": (k32, v32), "bf16": (kb, vb), "fp8": (fp8(kb), fp8(vb))}


def allowed(sel, chunk: int, tokens: int, resident_from: int):
    """bool [n, H, tokens]: the tokens of the chunks sel [n, H, k] and every token from resident_from on."""
    import torch
    n, H, _ = sel.shape
    m = torch.zeros(n, H, tokens, dtype=torch.bool, device=sel.device)
    tok = (sel.long().unsqueeze(-1) * chunk + torch.arange(chunk, device=sel.device)).flatten(-2)
    m.scatter_(-1, tok, True)
    m[..., resident_from:] = True
    return m


def attend(q, k, v, scaling: float, allow=None):
    """o [n, Hq, d] = softmax(q k^T * scaling) v per query head; query head h reads KV head h // (Hq / H)
    (transformers' repeat_interleave); allow [n, H, T] masks keys (None: all)."""
    import torch
    n, Hq, d = q.shape
    H = k.shape[0]
    g = Hq // H
    qg = q.float().reshape(n, H, g, d)
    s = torch.einsum("nhgd,htd->nhgt", qg, k.float()) * scaling
    if allow is not None:
        s = s.masked_fill(~allow[:, :, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("nhgt,htd->nhgd", p, v.float()).reshape(n, Hq, d)


def rel_error(o, ref):
    """||o - ref|| / ||ref|| over the last axis, flattened to [items]."""
    return ((o - ref).norm(dim=-1) / ref.norm(dim=-1)).flatten()


def layer_errors(q, k, v, *, chunk: int, selectable: int, scaling: float, sel=None, kv=None) -> dict:
    """{metric: errors [n * Hq]} of one layer; sel [n, H, k] chunk ids for the top-k selection, None for
    dense. `kv`: variants(k, v, ...) already made (k, v are then unused)."""
    kv = kv or variants(k, v, chunk, selectable)
    T = kv["fp32"][0].shape[-2]
    allow = None if sel is None else allowed(sel, chunk, T, selectable)
    o = {name: attend(q, kk, vv, scaling, allow) for name, (kk, vv) in kv.items()}
    return {"fp8_vs_bf16": rel_error(o["fp8"], o["bf16"]), "bf16_vs_fp32": rel_error(o["bf16"], o["fp32"])}


def stats(x) -> dict:
    import torch
    x = x.double()
    return {"median": float(torch.quantile(x, 0.5)), "p95": float(torch.quantile(x, 0.95)),
            "max": float(x.max()), "n": int(x.numel())}


class Collector:
    """Errors by (layer, context_tokens, task, budget_tokens or None, selection, metric)."""

    def __init__(self):
        self.groups = defaultdict(list)

    def add(self, layer, context, task, budget, selection, errors: dict) -> None:
        for metric, e in errors.items():
            self.groups[(layer, context, task, budget, selection, metric)].append(e.detach().cpu().flatten())

    def rows(self, chunk: int) -> list:
        import torch
        out = []
        order = sorted(self.groups, key=lambda k: (k[1], k[2], SELECTIONS.index(k[4]), k[3] or 0,
                                                   METRICS.index(k[5]), k[0]))
        for key in order:
            layer, c, task, b, selection, metric = key
            out.append({"layer": layer, "context_tokens": c, "task": task,
                        "budget_tokens": "" if b is None else b, "chunk_tokens": chunk, "selection": selection,
                        "metric": metric, **stats(torch.cat(self.groups[key]))})
        return out

    def summary(self, model: str, provenance: dict, chunk: int) -> dict:
        """By (selection, budget, metric), pooled over layers, contexts and tasks; and the worst layer."""
        import torch
        from ddbench.profile.trace import SCHEMA
        pooled, per_layer = defaultdict(list), defaultdict(list)
        for (layer, _c, _t, b, selection, metric), es in self.groups.items():
            pooled[(selection, b, metric)] += es
            per_layer[(selection, b, metric, layer)] += es
        by = []
        for key in sorted(pooled, key=lambda k: (SELECTIONS.index(k[0]), k[1] or 0, METRICS.index(k[2]))):
            selection, b, metric = key
            layers = {lay: stats(torch.cat(es)) for (s_, b_, m_, lay), es in per_layer.items()
                      if (s_, b_, m_) == key}
            worst = max(layers, key=lambda lay: layers[lay]["median"])
            by.append({"selection": selection, "budget_tokens": b, "metric": metric,
                       **{k: (round(v, 8) if isinstance(v, float) else v) for k, v in
                          stats(torch.cat(pooled[key])).items()},
                       "worst_layer": {"layer": worst, "median": round(layers[worst]["median"], 8),
                                       "p95": round(layers[worst]["p95"], 8)}})
        return {"schema": SCHEMA, "model": model, "provenance": provenance, "chunk_tokens": chunk,
                "note": NOTE, "by_selection": by}
