"""Beyond the paper: how much the verdict rides on the rates. Throughput of dualdecoder-cache, ShadowKV
and DualDecoder at 128K on the H200 (Llama-3-8B, each at its largest batch) as their fetch rates grow:
the cache's prefetched and urgent chunks per step (its churn and urgent share; drawn against the chunks moved,
churn + urgent), ShadowKV's miss rate
(1 - reuse) and DualDecoder's (1 - hit), each scaled by the same factors (Scenario.rate_scale, the
what-if of `plan`'s break-even). Simulated by the cost model every command uses; the engine's measured
points, all from one run of the current engine (traces/engine/h200-rate-grid, median and min-max of 3 builds in
separate processes), are marked at their own forced rates. No paper figure.
"""

from __future__ import annotations

import pandas as pd

from ddbench.core import defaults as D
from ddbench.core.designs import DUALDECODER, SHADOWKV
from ddbench.core.units import fmt_tokens
from ddbench.experiments import FigureResult, register
from ddbench.experiments.cache_figure import CACHE, CACHE_COLOR, GPU, MODEL
from ddbench.experiments.scene import scene
from ddbench.plotting import SYSTEM_COLORS, style_handle

CTX = 128 * 1024
CAPACITY = 4                         # the cache at 4x the budget: the engine's best at 128K
FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
DESIGNS = (CACHE, SHADOWKV, DUALDECODER)


def _point(design: str, factor: float, end: str = "centre") -> dict:
    """One simulated point: the design's matched rates (at `end` of their 95 % interval) times `factor`."""
    from ddbench.experiments.sim_figures import design_max_batch, steady_step_time
    knobs = {"cache_tokens": CAPACITY * D.BUDGET} if design == CACHE else {}
    if end != "centre":
        knobs["rate_end"] = end
    r = scene(MODEL, design, gpu=GPU, rate_scale=factor, **knobs)
    b = design_max_batch(design, MODEL, CTX, gpu=GPU, **knobs)
    tok_s = b / steady_step_time(design, MODEL, CTX, b, gpu=GPU, rate_scale=factor, **knobs)
    if design == CACHE:
        c = r.cache_rates_at(CTX)
        urgent = sum(c.urgent) / len(c.urgent)
        churn = sum(c.prefetched) / len(c.prefetched)
        moved, miss = urgent + churn, None
    else:
        rates = r.hits_at(CTX)[0]
        miss = 1 - sum(rates) / len(rates)
        urgent = churn = moved = None
    return {"source": "simulated", "rate_end": end, "design": design, "factor": factor, "batch": b, "tok_s": tok_s,
            "urgent_per_budget": urgent, "churn_per_budget": churn, "moved_per_budget": moved, "miss_rate": miss}


def _measured() -> list[dict]:
    """The engine's points at 128K from one run of the current engine (traces/engine/h200-rate-grid, builds in
    separate processes), each a median (min-max) over its builds at its own forced rates: the cache at 4x over
    its grid of urgent share and churn, ShadowKV and DualDecoder over their misses."""
    from ddbench.experiments import rate_grid as G
    e = G.grid_rows()
    e = e[(e.context == CTX) & (e.model == MODEL)].copy()
    e["miss"] = e.forced_urgent_or_miss.astype(float)
    e["churn"] = e.forced_churn.astype(float).fillna(0.0)
    rows = []
    for (d, batch, miss, churn), g in e.groupby(["design", "batch", "miss", "churn"]):
        r = {"source": "engine", "design": d, "run": G.RUN, "factor": None, "batch": int(batch),
             "tok_s": g.tok_s.median(), "tok_s_min": g.tok_s.min(), "tok_s_max": g.tok_s.max(), "builds": len(g)}
        if d == CACHE:
            r.update(urgent_per_budget=miss, churn_per_budget=churn, moved_per_budget=miss + churn)
        else:
            r["miss_rate"] = miss
        rows.append(r)
    return rows


def _draw(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(9.0, 3.6)
    axes = fig.subplots(1, 2)
    s, m = df[(df.source == "simulated") & (df.rate_end == "centre")], df[df.source == "engine"]
    c = s[s.design == CACHE]
    for ax, col, label in ((axes[0], "moved_per_budget", "dualdecoder-cache: chunks moved per step, churn + urgent"
                                                         " (share of the budget)"),
                           (axes[1], "miss_rate", "miss rate: ShadowKV 1 - reuse, DualDecoder 1 - hit (share of the budget)")):
        ax.set_xlabel(label, fontsize=7)
        ax.set_ylabel("decode throughput (tokens/s)")
    axes[0].plot(c.moved_per_budget, c.tok_s, color=CACHE_COLOR, lw=1.2, marker=".")
    for r in c.itertuples():
        axes[0].annotate(f"{r.factor:g}x", (r.moved_per_budget, r.tok_s), fontsize=6, xytext=(2, 2),
                         textcoords="offset points")
    for d in DESIGNS[1:]:
        x = s[s.design == d]
        axes[1].plot(x.miss_rate, x.tok_s, color=SYSTEM_COLORS[d], lw=1.2, marker=".")
        at1 = x[x.factor == 1.0].tok_s
        if len(at1):
            axes[0].axhline(float(at1.iloc[0]), color=SYSTEM_COLORS[d], lw=0.8, ls="--")
    for r in m.itertuples():
        ax, x = (axes[0], r.moved_per_budget) if r.design == CACHE else (axes[1], r.miss_rate)
        color = CACHE_COLOR if r.design == CACHE else SYSTEM_COLORS[r.design]
        ax.errorbar([x], [r.tok_s], yerr=[[r.tok_s - r.tok_s_min], [r.tok_s_max - r.tok_s]], fmt="D", ms=4,
                    color=color, ecolor="black", lw=0.7)
    for ax in axes:
        ax.set_ylim(bottom=0)
    axes[0].set_title("(a) the cache's rates scaled 0.5-4x; dashed: the others at their profile's rates", fontsize=7)
    axes[1].set_title("(b) the others' miss rates scaled 0.5-4x", fontsize=7)
    handles = [style_handle("-", f"{CACHE} {CAPACITY}x, simulated", CACHE_COLOR),
               style_handle("-", "ShadowKV, simulated", SYSTEM_COLORS[SHADOWKV]),
               style_handle("-", "DualDecoder, simulated", SYSTEM_COLORS[DUALDECODER])]
    fig.legend(handles, [h.get_label() for h in handles], fontsize=6, ncol=3, loc="outside lower center")
    fig.suptitle(f"Throughput against the rates: {MODEL} at {fmt_tokens(CTX)} on one H200, each at its largest batch"
                 " (diamonds: one engine run, 3 builds)", fontsize=8)


@register("rates", "Throughput against the cache's urgent share and churn and the others' miss rates (H200, 128K)",
          draw=_draw)
def compute() -> FigureResult:
    rows = [_point(d, f) for d in DESIGNS for f in FACTORS] + _measured() \
        + [_point(d, 1.0, end) for d in DESIGNS for end in ("low", "high")]    # the rates' 95 % interval ends
    df = pd.DataFrame(rows)
    from ddbench.planner.ratelines import caption
    knobs = {"cache_tokens": CAPACITY * D.BUDGET}
    lines = "; ".join(scene(MODEL, d, gpu=GPU, **knobs).rates_note(scene(MODEL, d, gpu=GPU, **knobs).design_rates)
                      for d in DESIGNS)
    return FigureResult(df, f"{MODEL} on one H200 over PCIe 5, context {fmt_tokens(CTX)}, budget {D.BUDGET}, each design"
                            f" at its largest batch; {CACHE} at {CAPACITY}x the budget; factors"
                            f" {', '.join(f'{f:g}' for f in FACTORS)} on each design's own rates; "
                            f"{caption([scene(MODEL, d, gpu=GPU, **knobs) for d in DESIGNS], (CTX,))}: {lines};"
                            " the engine's diamonds: one run of the current engine (traces/engine/h200-rate-grid,"
                            " builds in separate processes) at its own forced rates")
