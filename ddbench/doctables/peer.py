"""Our kernels against flashinfer's (issue 31 part 4), from traces/kernels/h200/peer-flashinfer.csv
(`ddbench bench kernels --peer flashinfer`, kernels/peerbench.py): each kernel's time and its share of the
HBM floor (the bytes it cannot avoid reading over the run's device-to-device copy rate)."""

from __future__ import annotations

from pathlib import Path

from ddbench.doctables.common import ROOT, DocTablesError, read_trace_csv, md_table

FILE = Path("traces") / "kernels" / "h200" / "peer-flashinfer.csv"
ATTENTION = {"single": ("ours_gathered", "ours_rows", "flashinfer_decode", "flashinfer_decode_tc"),
             "dual": ("ours_gathered", "ours_rows", "flashinfer_prefill_causal")}
TOPK = ("ours_fused_topk", "flashinfer_top_k", "torch_topk", "ours_select", "ours_scores+flashinfer_top_k")


def _cell(r) -> str:
    return f"{r['latency_ms'] * 1e3:.1f} us ({r['pct_of_floor']:.0f} %)"


def _context(shape: str) -> str:
    return shape.split(" ctx")[0]


def _rows(d, kernel, variants, suffix=""):
    """(context, batch) -> {variant: row} for one kernel family."""
    d = d[d["kernel"].isin(kernel)]
    out = {}
    for _, r in d.iterrows():
        v = r["variant"]
        base = v[:len(v) - len(suffix)]
        if v.endswith(suffix) and base in variants:
            out.setdefault((_context(r["shape"]), int(r["batch"])), {})[base] = r
    return out


def peer_flashinfer(root: Path = ROOT) -> str:
    d = read_trace_csv(root / FILE)
    parts = []
    for tok, variants in ATTENTION.items():
        at = _rows(d, ("peer_attention",), variants, f"_{tok}")
        if not at:
            raise DocTablesError(f"{root / FILE}: no {tok}-token attention rows")
        rows = []
        for (ctx, b), r in at.items():
            best = min((r[v] for v in variants if v.startswith("flashinfer") and v in r), key=lambda x: x["latency_ms"])
            rows.append([ctx, str(b)] + [_cell(r[v]) if v in r else "-" for v in variants]
                        + [f"{best['latency_ms'] / r['ours_rows']['latency_ms']:.2f}x"])
        parts.append(f"{'Single' if tok == 'single' else 'Dual'}-token sparse attention over 2,048 selected tokens"
                     " (time, and % of the HBM floor):\n\n"
                     + md_table(["context", "batch"] + list(variants) + ["best flashinfer / ours_rows"], rows))
    at = _rows(d, ("peer_topk", "peer_select"), TOPK)
    rows = [[ctx, str(b)] + [_cell(r[v]) for v in TOPK]
            + [f"{r['flashinfer_top_k']['latency_ms'] / r['ours_fused_topk']['latency_ms']:.2f}x"]
            for (ctx, b), r in at.items()]
    parts.append("Top-k of 256 chunks for 2 query tokens (the floors: ours_fused_topk reads pass 1's fp16 scores of the"
                 " group's 4 heads, flashinfer and torch the fp32 group-max probabilities; the last two columns are the"
                 " whole selection from the landmarks):\n\n"
                 + md_table(["context", "batch"] + list(TOPK) + ["flashinfer_top_k / ours_fused_topk"], rows))
    return "\n\n".join(parts)
