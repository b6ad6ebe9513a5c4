"""Beyond the paper: what the speculative prefetch adds once a GPU chunk cache exists (the ablation).

Four designs on one H200, each at its largest batch by the memory model: dualdecoder-cache (the cache + the
speculative prefetch), lru-cache (the same cache and capacity, nothing predicted: the HiSparse mechanism,
every miss urgent before its layer's attention), DualDecoder (no cache) and ShadowKV. Llama-3-8B at 32K /
64K / 128K and Qwen2.5-14B at 128K; the caches at 4x the budget (8192 tokens per layer and KV head).

One rate set, one engine: every bar is SIMULATED (`ddbench simulate`'s cost model) at one matched rate set
(ddbench.core.rates: the speculative replay for dualdecoder-cache, the replay without prediction for
lru-cache, the hit and reuse rates for the others). The engine's diamonds come from one run of the current
engine, traces/engine/h200-rate-grid (rate_grid.py): the two grid points around the matched rates, 3 builds
in separate processes; that run holds dualdecoder-cache at every Llama-3-8B context and ShadowKV and
DualDecoder at 128K, no lru-cache and no Qwen2.5-14B, so those are simulated only. (An older engine measured
all four designs at forced rates: traces/engine/h200-ablation and its README; docs/results.md.) Not a paper
figure: no paper number.
"""

from __future__ import annotations

import pandas as pd

from ddbench.core import defaults as D
from ddbench.core.designs import DUALDECODER, DUALDECODER_CACHE, LRU_CACHE, SHADOWKV
from ddbench.core.units import fmt_tokens
from ddbench.experiments import FigureResult, register
from ddbench.experiments import rate_grid as G
from ddbench.experiments.cache_figure import simulated
from ddbench.plotting import SYSTEM_COLORS

DESIGNS = (DUALDECODER_CACHE, LRU_CACHE, DUALDECODER, SHADOWKV)
POINTS = (("llama-3-8b", 32 * 1024), ("llama-3-8b", 64 * 1024), ("llama-3-8b", 128 * 1024), ("qwen2.5-14b", 128 * 1024))
CACHE_TOKENS = G.CAPACITY * D.BUDGET
COLORS = {d: SYSTEM_COLORS[d] for d in (DUALDECODER_CACHE, LRU_CACHE)}   # the registry's colours


def _engine_columns(model: str, ctx: int, design: str) -> dict:
    """The engine's two grid points around the matched rates (empty where the run lacks the point)."""
    ends = G.engine_at_matched(design, ctx) if model == G.MODEL else []
    out = {"engine_points": G.bracket_note(ends)} if ends else {}
    for r in ends:
        e = r["rates_end"]
        out.update({f"engine_{e}_tok_s": r["tok_s"], f"engine_{e}_tok_s_min": r["tok_s_min"],
                    f"engine_{e}_tok_s_max": r["tok_s_max"], f"engine_{e}_point": G.point_note(r),
                    "engine_batch": r["batch"], "engine_builds": r["builds"]})
    return out


def points() -> pd.DataFrame:
    """One row per (model, context, design): simulated at the matched rates at the memory model's largest batch,
    and the engine's grid points around those rates where the matched-rate run has them."""
    rows = []
    for model, ctx in POINTS:
        for d in DESIGNS:
            ct = CACHE_TOKENS if d.endswith("-cache") else None
            s = simulated(d, ctx, None, ct, model=model)
            rows.append(dict(model=model, context=ctx, design=d, cache_tokens=ct, batch=s["batch"],
                             sim_tok_s_matched=s["tok_s"], link_mib_per_token=s["link_mib_per_token"],
                             **_engine_columns(model, ctx, d)))
    return pd.DataFrame(rows)


def _draw(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(9.6, 3.4)
    ax = fig.subplots(1, 1)
    width = 0.2
    for i, (m, c) in enumerate(POINTS):
        for j, d in enumerate(DESIGNS):
            r = df[(df.model == m) & (df.context == c) & (df.design == d)].iloc[0]
            x = i + (j - 1.5) * width
            ax.bar(x, r.sim_tok_s_matched, width, color=COLORS.get(d, SYSTEM_COLORS.get(d)), label=d if i == 0 else None)
            ax.annotate(f"b{r.batch}", (x, 15), ha="center", va="bottom", fontsize=5, color="white")
            if pd.notna(r.get("engine_lower_tok_s")):
                ys = [r.engine_lower_tok_s, r.engine_higher_tok_s]
                ax.plot([x, x], ys, ls="-", lw=0.8, marker="D", ms=3.5, color="black")
    ax.plot([], [], ls="-", lw=0.8, marker="D", ms=3.5, color="black",
            label=f"engine ({G.RUN}): grid points around the rates")
    ax.set_xticks(range(len(POINTS)), [f"{m}\n{fmt_tokens(c)}" for m, c in POINTS], fontsize=7)
    ax.set_xlabel("model and context (label in each bar: its largest batch by the memory model, requests)")
    ax.set_ylabel("decode throughput (tokens/s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=6, ncol=5, loc="upper right")
    ax.set_title(f"one H200, one matched rate set: bars SIMULATED; diamonds: the current engine ({G.RUN})"
                 " where it ran the point", fontsize=8)


@register("ablation", "What the prediction adds beside a GPU chunk cache: dualdecoder-cache, lru-cache, DualDecoder,"
                      " ShadowKV (H200)", draw=_draw)
def compute() -> FigureResult:
    df = points()
    from ddbench.experiments.scene import scene
    from ddbench.planner.ratelines import caption
    matched = caption([scene(m, d, gpu="h200", cache_tokens=CACHE_TOKENS) for m in sorted({m for m, _ in POINTS})
                       for d in DESIGNS], tuple(sorted({c for _, c in POINTS})))
    eng = df.dropna(subset=["engine_lower_tok_s"])
    where = "; ".join(f"{r.design} {fmt_tokens(int(r.context))}: {r.engine_points}" for r in eng.itertuples())
    return FigureResult(df, f"one H200 over PCIe 5, budget {D.BUDGET}, each design at its largest batch by the memory"
                            f" model, the caches at {CACHE_TOKENS} tokens per layer and KV head; bars SIMULATED at"
                            f" {matched}; diamonds: one run of the current engine, traces/engine/{G.RUN}"
                            f" ({G.run_date()}, builds in separate processes), at the grid points around the matched"
                            f" rates ({where}); no engine row of lru-cache or Qwen2.5-14B in that run")


def prediction_gain(df: pd.DataFrame) -> pd.DataFrame:
    """dualdecoder-cache over lru-cache per point, simulated at the matched rates."""
    out = []
    for (m, c), g in df.groupby(["model", "context"], sort=False):
        a, b = (g[g.design == d].iloc[0] for d in (DUALDECODER_CACHE, LRU_CACHE))
        out.append(dict(model=m, context=c, gain=a.sim_tok_s_matched / b.sim_tok_s_matched))
    return pd.DataFrame(out)
