"""Beyond the paper: what the speculative prefetch adds once a GPU chunk cache exists (issue 31's ablation).

Four designs on one H200, each at its largest batch, tokens/s over 3 independently built engines (min /
median / max): dualdecoder-cache (the cache + the speculative prefetch), lru-cache (the same cache and
capacity, nothing predicted: the HiSparse mechanism, every miss urgent before its layer's attention),
DualDecoder (no cache) and the in-place ShadowKV (issue 31: faster than ShadowKV's own code on the same
H200). Llama-3-8B at 32K / 64K / 128K and Qwen2.5-14B at 128K; the caches at 4x the budget (8192 tokens per
layer and KV head), at the profile's rates for that capacity and their own prediction
(ddbench.core.rates: the speculative replay for dualdecoder-cache, the replay without prediction for
lru-cache); DualDecoder and ShadowKV at 12 % forced misses.

Measured (traces/engine): h200-ablation (the two caches at all four points, the batch fixed at the largest
that dualdecoder-cache's search found, which the memory model gives lru-cache too: h200-cache-fill's at 32K,
94, and h200-ablation-qwen14b's for Qwen2.5-14B; an engine whose rows record the prefetch bytes they
moved), h200-ablation-qwen14b (DualDecoder and ShadowKV searched), h200-ablation-dualdecoder
(DualDecoder on Llama-3-8B at its largest batches of h200-cache) and h200-shadowkv-fast/builds (ShadowKV). Simulated: `ddbench simulate`'s cost model at each engine point's
batch and forced rates (cache_figure.simulated). Not a paper figure: no paper number.
"""

from __future__ import annotations

import pandas as pd

from ddbench.core.errors import DDBenchError
from ddbench.core.units import fmt_tokens
from ddbench.experiments import FigureResult, register
from ddbench.experiments.cache_figure import SHADOWKV_RUN, _engine_rows, forced_miss, forced_rates, simulated
from ddbench.plotting import SYSTEM_COLORS

DESIGNS = ("dualdecoder-cache", "lru-cache", "dualdecoder", "shadowkv")
POINTS = (("llama-3-8b", 32 * 1024), ("llama-3-8b", 64 * 1024), ("llama-3-8b", 128 * 1024), ("qwen2.5-14b", 128 * 1024))
RUNS = {"h200-ablation": ("dualdecoder-cache", "lru-cache"), "h200-ablation-qwen14b": ("dualdecoder", "shadowkv"),
        "h200-ablation-dualdecoder": ("dualdecoder",), SHADOWKV_RUN: ("shadowkv",)}
CACHE_TOKENS = 8192
COLORS = {"dualdecoder-cache": "#9467bd", "lru-cache": "#8c564b"}


def engine_points() -> pd.DataFrame:
    """One row per (model, context, design): the largest batch's builds, min / median / max."""
    parts = []
    for run, designs in RUNS.items():
        e = _engine_rows(run)
        bits = e.kv_bits.fillna(16).astype(int) if "kv_bits" in e else 16
        e = e[e.design.isin(designs) & e.paper_role.isin(["largest", "repeat"]) & e.status.isin(["ok", "ok-no-twin"])
              & (bits == 16) & (e.batch > 1)]
        parts.append(e.assign(run=run))
    e = pd.concat(parts, ignore_index=True)
    rows = []
    for (model, ctx, design), g in e.groupby(["model", "context", "design"]):
        if (model, int(ctx)) not in POINTS:
            continue
        if g.batch.nunique() != 1:
            raise DDBenchError(f"{g.run.iloc[0]}: {design} at {model} {fmt_tokens(int(ctx))} ran at batches"
                               f" {sorted(g.batch.unique())}, not one largest batch")
        r0 = g.iloc[0]
        cache = design.endswith("-cache")
        urgent = float(g.miss_rate.astype(float).median())
        pref = float(g.churn_rate.astype(float).median()) if design == "dualdecoder-cache" else 0.0
        rows.append(dict(model=model, context=int(ctx), design=design, run=r0.run, batch=int(r0.batch), builds=len(g),
                         tok_s=g.tok_s.median(), tok_s_min=g.tok_s.min(), tok_s_max=g.tok_s.max(),
                         step_ms=g.step_ms.median(), step_over_hbm_floor=(g.step_ms / g.floor_ms).median(),
                         step_over_link_floor=(g.step_ms / g.floor_link_ms).median(),
                         link_util=g.link_util.median(), urgent_mib_per_token=(g.urgent_mib / g.batch).median(),
                         link_mib_per_token=(g.link_mib / g.batch).median(), cache_tokens=CACHE_TOKENS if cache else None,
                         forced_prefetched=pref if cache else None, forced_urgent=urgent if cache else None,
                         miss_rate=None if cache else urgent))
    df = pd.DataFrame(rows)
    missing = [(m, c, d) for m, c in POINTS for d in DESIGNS
               if not ((df.model == m) & (df.context == c) & (df.design == d)).any()]
    if missing:
        raise DDBenchError(f"ablation: no engine rows for {', '.join(f'{d} {m} {fmt_tokens(c)}' for m, c, d in missing)}")
    return df


def _draw(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(9.6, 3.4)
    ax = fig.subplots(1, 1)
    width = 0.2
    for i, (m, c) in enumerate(POINTS):
        for j, d in enumerate(DESIGNS):
            r = df[(df.model == m) & (df.context == c) & (df.design == d)].iloc[0]
            x = i + (j - 1.5) * width
            ax.bar(x, r.tok_s, width, color=COLORS.get(d, SYSTEM_COLORS.get(d)), label=d if i == 0 else None)
            ax.errorbar(x, r.tok_s, yerr=[[r.tok_s - r.tok_s_min], [r.tok_s_max - r.tok_s]], fmt="none", ecolor="black",
                        lw=0.7)
            ax.plot(x, r.sim_tok_s, ls="none", marker="_", ms=9, color="black")
            ax.annotate(f"b{r.batch}", (x, 15), ha="center", va="bottom", fontsize=5, color="white")
    ax.set_xticks(range(len(POINTS)), [f"{m}\n{fmt_tokens(c)}" for m, c in POINTS], fontsize=7)
    ax.set_xlabel("model and context (label in each bar: its largest batch, requests)")
    ax.set_ylabel("decode throughput (tokens/s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=6, ncol=4, loc="upper right")
    ax.set_title("each design at its largest batch on one H200 (bars: engine, median and min-max of 3 builds;"
                 " dashes: simulated at the engine's batch)", fontsize=8)


@register("ablation", "What the prediction adds beside a GPU chunk cache: dualdecoder-cache, lru-cache, DualDecoder,"
                      " ShadowKV (H200)", draw=_draw)
def compute() -> FigureResult:
    df = engine_points()
    df["sim_tok_s"] = [simulated(r.design, int(r.context), int(r.batch), None if pd.isna(r.cache_tokens) else
                                 int(r.cache_tokens), model=r.model, forced=forced_rates(r), miss=forced_miss(r))["tok_s"]
                       for r in df.itertuples()]
    df["sim_over_engine"] = df.sim_tok_s / df.tok_s
    # no engine row is at one matched rate set (ShadowKV and DualDecoder ran at a forced miss): the simulator's
    # number at the matched rates, at the engine's batch, labelled simulated
    df["sim_tok_s_matched"] = [simulated(r.design, int(r.context), int(r.batch), None if pd.isna(r.cache_tokens) else
                                         int(r.cache_tokens), model=r.model)["tok_s"] for r in df.itertuples()]
    from ddbench.experiments.scene import scene
    from ddbench.planner.ratelines import caption
    matched = caption([scene(m, d, gpu="h200", cache_tokens=CACHE_TOKENS) for m in sorted({m for m, _ in POINTS})
                       for d in DESIGNS], tuple(sorted({c for _, c in POINTS})))
    return FigureResult(df, "one H200 over PCIe 5, budget 2048, each design at its largest batch, the caches at 8192"
                            " tokens per layer and KV head; engine (3 builds each, in one process) from runs of"
                            " 2026-12-02 to 2026-12-03 (the caches: h200-ablation; ShadowKV in place: h200-shadowkv-fast;"
                            " DualDecoder: h200-ablation-dualdecoder, -qwen14b), NOT one engine version (the engine of"
                            " the README's results is later); at the rates it forced: the caches at"
                            " the SmolLM2 profile's, ShadowKV and DualDecoder at a forced 12 % miss (NOT one matched"
                            f" set); dashes: simulated at those rates; sim_tok_s_matched (CSV): simulated at {matched}")


def prediction_gain(df: pd.DataFrame) -> pd.DataFrame:
    """dualdecoder-cache over lru-cache per point: median ratio, and the range pairing the extremes."""
    out = []
    for (m, c), g in df.groupby(["model", "context"], sort=False):
        a, b = (g[g.design == d].iloc[0] for d in ("dualdecoder-cache", "lru-cache"))
        out.append(dict(model=m, context=c, gain=a.tok_s / b.tok_s, lo=a.tok_s_min / b.tok_s_max,
                        hi=a.tok_s_max / b.tok_s_min))
    return pd.DataFrame(out)
