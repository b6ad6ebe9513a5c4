"""The ablation's table: what the speculative prefetch adds once a GPU chunk cache exists, from
figures/ablation.csv (ddbench/experiments/ablation_figure.py: the simulator at one matched rate set, and the
current engine's matched-rate run where it has the point)."""

from __future__ import annotations

from pathlib import Path

from ddbench.core.designs import DUALDECODER, DUALDECODER_CACHE, LRU_CACHE, SHADOWKV
from ddbench.doctables.common import ROOT, read_trace_csv, fmt_context, is_present, md_table

NAMES = {"llama-3-8b": "Llama-3-8B", "qwen2.5-14b": "Qwen2.5-14B"}
ORDER = (DUALDECODER_CACHE, LRU_CACHE, SHADOWKV, DUALDECODER)


def _engine_cell(r, end: str) -> str:
    if not is_present(r.get(f"engine_{end}_tok_s")):
        return "-"
    return (f"{r[f'engine_{end}_tok_s']:,.0f} ({r[f'engine_{end}_tok_s_min']:,.0f}-{r[f'engine_{end}_tok_s_max']:,.0f})"
            f" at {r[f'engine_{end}_point']}")


def ablation(root: Path = ROOT) -> str:
    d = read_trace_csv(root / "figures" / "ablation.csv")
    rows, gains = [], []
    points = list(dict.fromkeys(zip(d["model"], d["context"])))
    for m, c in points:
        at = {r["design"]: r for _, r in d[(d["model"] == m) & (d["context"] == c)].iterrows()}
        gains.append(f"{NAMES.get(m, m)} {fmt_context(int(c))}"
                     f" {at[DUALDECODER_CACHE]['sim_tok_s_matched'] / at[LRU_CACHE]['sim_tok_s_matched']:.2f}x")
        for name in ORDER:
            r = at[name]
            sk = at[SHADOWKV]["sim_tok_s_matched"]
            rows.append([f"{NAMES.get(m, m)} {fmt_context(int(c))}", name, f"{int(r['batch'])}",
                         f"{r['sim_tok_s_matched']:,.0f}", "-" if name == SHADOWKV else
                         f"{r['sim_tok_s_matched'] / sk:.2f}x", _engine_cell(r, "lower"), _engine_cell(r, "higher")])
    return summary(gains) + "\n\n" + md_table(
        ["point", "design", "batch", "simulated tokens/s", "over ShadowKV (simulated)",
         "engine, grid point below the rates", "engine, grid point above"], rows)


def summary(gains) -> str:
    return ("Each design at its largest batch by the memory model on one H200, the caches at 8192 tokens per layer and"
            " KV head (4x the budget); tokens/s SIMULATED by `ddbench simulate`'s cost model at one matched rate set"
            " (the rates `plan` prices each design with). Engine: the current engine's matched-rate run"
            " (`traces/engine/h200-rate-grid`, 3 builds in separate processes, 2 at 64K), tokens/s median (min-max)"
            " at its grid points just below and above the matched rates, where it ran the design (it holds no"
            " lru-cache and no Qwen2.5-14B: '-'). What the prediction adds beside the cache (dualdecoder-cache /"
            " lru-cache, simulated): " + "; ".join(gains) + ".")
