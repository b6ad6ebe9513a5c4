"""How the sparse budget moves DualDecoder against ShadowKV (no paper figure).

The paper states its sparse budget only for Figure 19 (2048) and Table 1 (1024); every replay
here uses 2048. DualDecoder moves the whole budget's K and V over the link each step, so its
link ceiling scales as 1 / budget, while ShadowKV fetches only the values of the chunks that
changed. This figure replays Figure 12's setting (Qwen2.5-32B on an 80 GB GPU, each design at
its largest batch) across budgets 512 to 4096.
"""

from __future__ import annotations

import math
from functools import lru_cache

import pandas as pd

from ddbench.core import defaults as D
from ddbench.core.designs import DUALDECODER, SHADOWKV, get_design
from ddbench.core.memory import Workload, max_batch
from ddbench.core.units import fmt_tokens
from ddbench.experiments import Comparison, FigureResult, register
from ddbench.experiments.scene import GPU, LINK, scene, workload
from ddbench.experiments.sim_figures import F12_MODEL, paper_value, cost_model_note, rates_caption
from ddbench.plotting import SYSTEM_COLORS, integer_axis, style_handle

BUDGETS = (512, 1024, 2048, 4096)
CONTEXTS = (64 * 1024, 128 * 1024, 256 * 1024)
DESIGNS = (SHADOWKV, DUALDECODER)
STYLES = {64 * 1024: "-", 128 * 1024: "--", 256 * 1024: ":"}
REPLAY_BUDGET = D.BUDGET
PAPER_BUDGETS = {"Fig. 19": "fig19.budget_tokens", "Table 1": "table1.budget_tokens"}
PAPER_RATIOS = {64 * 1024: "fig12.64k.over_shadowkv", 128 * 1024: "fig12.128k.over_shadowkv",
                256 * 1024: "fig12.256k.over_shadowkv"}


@lru_cache(maxsize=None)
def point(system: str, ctx: int, budget: int) -> dict:
    """Largest batch that fits and its steady decode step (per-layer timeline) at one budget."""
    from ddbench.sim.run import Point, run
    r = scene(F12_MODEL, system, budget=budget)
    w = workload(r, ctx)
    mb = max_batch(r.design, r.model, r.gpu, w)
    if not mb:
        return {"max_batch": 0, "step_ms": math.nan, "tokens_per_s": math.nan}
    step = run(Point(r.design, r.model, r.cm, w, mb, ctx, *r.hits_at(ctx)), "timeline", steps=6,
               warmup=2).steady_step_s
    return {"max_batch": mb, "step_ms": step * 1e3, "tokens_per_s": mb / step}


def _draw(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(7.2, 3.4)
    ax_a, ax_b = fig.subplots(1, 2)
    for ctx in CONTEXTS:
        for design in DESIGNS:
            s = df[(df.context == ctx) & (df.system == design)]
            ax_a.plot(s.budget, s.tokens_per_s, ls=STYLES[ctx], marker="o", ms=3, color=SYSTEM_COLORS[design])
        r = df[(df.context == ctx) & (df.system == DUALDECODER)]
        ax_b.plot(r.budget, r.dd_over_shadowkv, ls=STYLES[ctx], marker="o", ms=3, color="black")
        lvl = paper_value(PAPER_RATIOS[ctx])
        ax_b.axhline(lvl, color="#d62728", lw=0.8, ls=STYLES[ctx])
        ax_b.text(BUDGETS[0], lvl, f"paper {fmt_tokens(ctx)} {lvl:g}", color="#d62728", fontsize=6, ha="left",
                  va="top")
    ax_b.axhline(1.0, color="gray", lw=0.6)
    for ax in (ax_a, ax_b):
        ax.set_xscale("log", base=2)
        integer_axis(ax.xaxis, log=True, ticks=BUDGETS)
        ax.set_xlabel("sparse budget (tokens per request)")
        ax.axvline(REPLAY_BUDGET, color="gray", lw=3, alpha=0.25)
        for name, pid in PAPER_BUDGETS.items():
            ax.axvline(paper_value(pid), color="gray", lw=0.8, ls="-.")
            ax.text(paper_value(pid), 0.98, f" {name}", transform=ax.get_xaxis_transform(), fontsize=6, rotation=90,
                    va="top", ha="right")
    ax_a.set_ylim(bottom=0)
    ax_b.set_ylim(bottom=0)
    ax_a.set_ylabel("decode throughput (tokens/s)")
    ax_a.set_title("(a) each design at its largest batch", fontsize=8)
    ax_b.set_ylabel("DualDecoder / ShadowKV (ratio)")
    ax_b.set_title("(b) ratio; red: paper's Fig. 12 (budget unstated)", fontsize=8)
    handles = [style_handle("-", get_design(d).label, SYSTEM_COLORS[d]) for d in (SHADOWKV, DUALDECODER)]
    handles += [style_handle(STYLES[c], f"{fmt_tokens(c)} context") for c in CONTEXTS]
    handles.append(style_handle((0, (6, 2, 1, 2)), "budget the paper states (Fig. 19, Table 1)", "gray"))
    from matplotlib.lines import Line2D
    handles.append(Line2D([], [], color="gray", lw=3, alpha=0.25, label=f"budget of every replay ({REPLAY_BUDGET})"))
    fig.legend(handles, [h.get_label() for h in handles], fontsize=6, ncol=4, loc="outside lower center")
    fig.suptitle(f"Sparse budget: DualDecoder against ShadowKV at Figure 12's setting ({F12_MODEL}, {GPU})",
                 fontsize=9)


@register("budget", "DualDecoder against ShadowKV across sparse budgets at Figure 12's setting (no paper figure)",
          _draw)
def budget() -> FigureResult:
    rows = []
    for ctx in CONTEXTS:
        for b in BUDGETS:
            pts = {s: point(s, ctx, b) for s in DESIGNS}
            sk, dd = pts[SHADOWKV]["tokens_per_s"], pts[DUALDECODER]["tokens_per_s"]
            for s in DESIGNS:
                rows.append({"context": ctx, "budget": b, "system": s, **pts[s],
                             "dd_over_shadowkv": dd / sk if sk and math.isfinite(sk) else math.nan})
    df = pd.DataFrame(rows)
    ratio = df[df.system == DUALDECODER].set_index(["context", "budget"]).dd_over_shadowkv
    c64 = CONTEXTS[0]
    parts = "; ".join(f"{fmt_tokens(c)}: " + ", ".join(f"{b} {ratio[c, b]:.2f}" for b in BUDGETS) for c in CONTEXTS)
    cmp = [Comparison("fig19.budget_tokens", REPLAY_BUDGET,
                      f"every replay here uses budget {REPLAY_BUDGET}, the budget the paper states for Figure 19 (the only"
                      f" figure that states one); Figures 2-18 and 20 do not state theirs and Table 1 uses "
                      f"{paper_value('table1.budget_tokens'):.0f}. DualDecoder / ShadowKV at Figure 12's setting, by budget: "
                      f"{parts} (at {fmt_tokens(c64)}, {ratio[c64, 2048]:.2f} at 2048 against {ratio[c64, 1024]:.2f} at"
                      f" 1024)")]
    setup = (f"{F12_MODEL} on {GPU} + {LINK} ({cost_model_note(F12_MODEL)}), contexts "
             f"{'/'.join(fmt_tokens(c) for c in CONTEXTS)}, budgets {', '.join(map(str, BUDGETS))}, chunk "
             f"{Workload(context=c64).chunk}; {rates_caption(F12_MODEL, (SHADOWKV, DUALDECODER), tuple(CONTEXTS))}; each design at its largest batch at that budget "
             "(memory model), decode-only steady state from the per-layer timeline")
    return FigureResult(df, setup, cmp)
