"""The engine's result tables, rendered from an engine sweep (no GPU, no torch).

    python -m ddbench.kernels.engine.tables [DIR] [--markdown]     (default DIR: the data root's engine/h200)

Step against its floor per design, context and batch (the floor phase), the dual-token over
single-token step, and every mechanism ratio with its min-max over repetitions and whether the
effect is larger than that spread (summary.json and rows.jsonl of kernels/engine/sweep.py).
Prints aligned plain-text tables; --markdown prints a markdown section (headings, one caption per
table) to paste into or generate docs from. render(DIR) returns the markdown tables.
"""

from __future__ import annotations

import json
import os
import re
import sys

from ddbench.core.designs import DUALDECODER, FULL_KV, SHADOWKV, SPECACHE
from ddbench.core.enginepoint import EnginePoint

DUALDECODER_SINGLE = EnginePoint.named(DUALDECODER, single=True).design
DESIGNS = ((DUALDECODER, DUALDECODER), (DUALDECODER_SINGLE, f"{DUALDECODER}, one query token"),
           (SHADOWKV, SHADOWKV), (SPECACHE, SPECACHE), (FULL_KV, FULL_KV))
BATCHES = (1, 16, 64)
MECHANISM = (   # (summary key prefix, label): this table's and the docs' (ddbench/doctables/engine_tables.py)
    ("fifo_over_priority", "FIFO / priority"),
    ("exposed_share", "exposed-transfer share (1 - compute-only / full step)"),
    ("two_pass_over_dual_b16", "two passes / dual-token, full step"),
    ("two_pass_over_dual_compute_only_b16", "two passes / dual-token, compute only"),
    ("per_layer_over_pingpong_b16", "per-layer buffers / ping-pong"),
    ("cpu_gather_over_gpu_gather_eager_b16", "CPU gather / GPU gather, both eager"),
    ("cpu_gather_over_gpu_gather_graph_b16", "CPU gather (eager) / GPU gather (graph)"),
    ("eager_over_graph_b16", "eager / graph, full step"),
)


def load(folder: str) -> tuple[dict, list[dict]]:
    with open(os.path.join(folder, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    rows = []
    path = os.path.join(folder, "rows.jsonl")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            entries = [json.loads(line) for line in fh if line.strip()]
        rows = [e["row"] for e in entries if e.get("row")]      # the rest: a search's done markers
    return summary, rows


def _ctx(c: int) -> str:
    return f"{c // 1024}K"


def step_floor_table(summary: dict, rows: list[dict]) -> str:
    sof = summary["ratios"]["step_over_floor"]
    status = {(r["design"], r["context"], r["batch"]): r.get("status") for r in rows if r.get("phase") == "floor"
              and r.get("miss_rate") in ("none", None)}
    out = ["| design | context | " + " | ".join(f"batch {b}: step / floor (x)" for b in BATCHES) + " |",
           "| --- | --- | " + " | ".join("---" for _ in BATCHES) + " |"]
    contexts = sorted({int(k.split("|")[1]) for k in sof})
    for d, label in DESIGNS:
        for c in contexts:
            cells = []
            for b in BATCHES:
                v = sof.get(f"{d}|{c}|{b}")
                if v:
                    cells.append(f"{v['step_ms']:.2f} / {v['floor_ms']:.2f} ms (**{v['step_over_floor']:.2f}**)")
                else:
                    cells.append(status.get((d, c, b)) or "not run")
            if any(x != "not run" for x in cells):
                out.append(f"| {label} | {_ctx(c)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def dual_single_line(summary: dict) -> str:
    ds = summary["ratios"]["dual_over_single"]
    parts = []
    for c in sorted({int(k.split("|")[0]) for k in ds}):
        vals = [ds.get(f"{c}|{b}") for b in BATCHES]
        parts.append(f"{' / '.join('-' if v is None else f'{v:.2f}' for v in vals)} at {_ctx(c)}")
    return "dual / single step (batch " + " / ".join(map(str, BATCHES)) + "): " + "; ".join(parts)


def _point_order(key: str) -> tuple:
    """b<batch>_m<miss> keys in numeric order (batch, then miss rate)."""
    m = re.search(r"_b(\d+)(?:_m([0-9.]+))?$", key)
    return (int(m.group(1)), float(m.group(2) or 0)) if m else (0, 0.0)


def mechanism_table(summary: dict) -> str:
    mech = summary["ratios"]["mechanism"]
    out = ["| ratio | point | median (min-max) | n | effect larger than spread? |", "| --- | --- | --- | --- | --- |"]
    for prefix, label in MECHANISM:
        for key in sorted((k for k in mech if k.startswith(prefix)), key=_point_order):
            if prefix == "two_pass_over_dual_b16" and key != prefix:
                continue
            v = mech[key]
            if not v:
                continue
            point = key[len(prefix):].strip("_") or "b16"
            b, _, miss = point.partition("_m")
            point = b.replace("b", "batch ", 1) + (f", {100 * float(miss):.1f} % misses" if miss else "")
            if prefix == "exposed_share":
                clear = f"spread {v['max'] - v['min']:.3f}"
                lu = v.get("link_util")
                if lu:
                    clear += f"; link {100 * lu['median']:.0f} % busy"
            else:
                clear = "yes" if v.get("clear") else "no"
            out.append(f"| {label} | {point} | {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f}) | {v['n']} | {clear} |")
    return "\n".join(out)


def paper_table(summary: dict) -> str:
    """The paper phase (kernels/engine/paper.py): each design's largest batch under the cap, measured
    and modelled, its tokens/s there, the series, and DualDecoder's tokens/s over ShadowKV's."""
    out = ["| model | cap | context | design | largest batch (why not one more) | memory model | tokens/s at"
           " largest: median (min-max) | peak GiB | series (batch: tokens/s) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    best = {}
    for e in summary.get("paper", []):
        big = e.get("largest") or {}
        b = e.get("builds_tok_s")
        if b and b["n"] > 1:           # over independently built engines
            tok = f"{b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f}, {b['n']} builds)"
        else:                          # over one engine's replays
            tok = (f"{big['tok_s']:.1f} ({big['tok_s_min']:.1f}-{big['tok_s_max']:.1f})" if big.get("tok_s") else "-")
        peak = f"{big['peak_gib']:.1f}" if big.get("peak_gib") else "-"
        series = ", ".join(f"{s['batch']}: {s['tok_s']:.0f}" for s in e["series"]) or "-"
        out.append(f"| {e['model']} | {e['gpu_mem_cap']} | {_ctx(e['context'])} | {e['design']} | {e['largest_batch']}"
                   f" ({e['largest_basis']}) | {e['model_max_batch']} | {tok} | {peak} | {series} |")
        best[(e["model"], e["gpu_mem_cap"], e["context"], e["design"])] = big.get("tok_s")
    ratios = []
    for (m, cap, c, d), v in best.items():
        sk = best.get((m, cap, c, SHADOWKV))
        if d == DUALDECODER and v and sk:
            ratios.append(f"{m} {_ctx(c)} cap {cap}: {v / sk:.2f}")
    if ratios:
        out.append("\nDualDecoder / ShadowKV tokens/s, each at its largest batch: " + "; ".join(ratios))
    return "\n".join(out)


def _head(folder: str, summary: dict) -> str:
    prov = summary.get("provenance", {})
    return (f"From {folder}: {prov.get('gpu')}, git {prov.get('git_sha')}, {prov.get('date_utc')}, "
            f"`{prov.get('command')}`; HBM copy {summary.get('hbm_copy_gbps', 0):.0f} GB/s.")


def render(folder: str) -> str:
    summary, rows = load(folder)
    parts = [_head(folder, summary), step_floor_table(summary, rows), dual_single_line(summary),
             mechanism_table(summary)]
    return "\n\n".join(parts + ([paper_table(summary)] if summary.get("paper") else []))


def render_markdown(folder: str) -> str:
    """A markdown section: the provenance line, then each table under its heading with a caption."""
    summary, rows = load(folder)
    return "\n\n".join([
        "## Engine sweep results", _head(folder, summary),
        "### Step against its floor",
        "Compute only (no host reads), CUDA graph, the model's own selection; floor = weights + resident "
        "selection state + attended K/V, read once at the HBM copy rate of the same run.",
        step_floor_table(summary, rows),
        "### Dual-token against single-token step", dual_single_line(summary) + ".",
        "### Mechanism ratios",
        "Median (min-max) of the per-repetition ratios; an effect is claimed only where |median - 1| "
        "exceeds max - min.",
        mechanism_table(summary)] + ([
            "### The paper's points: largest batch under the memory cap",
            "Each design's largest batch (transfers on, forced misses), the memory model's for the same"
            " point, tokens/s at it over the timed replays, and the batches the search measured.",
            paper_table(summary)] if summary.get("paper") else []))


def plain(text: str) -> str:
    """Markdown tables of `text` as aligned plain-text columns (bold and code marks dropped)."""
    out, block = [], []

    def flush():
        if block:
            cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in block
                     if not re.fullmatch(r"\|[\s\-|]+\|", ln.strip())]
            widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(max(map(len, cells)))]
            out.extend("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
            block.clear()
    for line in text.replace("**", "").replace("`", "").splitlines():
        if line.startswith("|"):
            block.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


def main(argv=None) -> int:
    from ddbench.core.flags import OneLineParser
    ap = OneLineParser(prog="python -m ddbench.kernels.engine.tables", description=__doc__.split("\n")[0])
    ap.add_argument("folder", nargs="?", help="an engine sweep folder (default: the data root's engine/h200)")
    ap.add_argument("--markdown", action="store_true", help="a markdown section instead of plain-text tables")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    folder = a.folder
    if folder is None:
        from ddbench.core.paths import traces_dir
        folder = os.path.join(str(traces_dir("engine")), "h200")
    try:
        print(render_markdown(folder) if a.markdown else plain(render(folder)))
    except (OSError, KeyError, ValueError) as exc:
        print(f"error: {folder}: not an engine sweep summary ({exc})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
