"""Beyond the paper: dualdecoder-cache (a GPU chunk cache beside the speculative prefetch) against
ShadowKV and DualDecoder on the H200, Llama-3-8B at 32K / 64K / 128K, each at its largest batch.

One engine run, one rate set: the engine's diamonds are the current engine's matched-rate run
(traces/engine/h200-rate-grid, rate_grid.py): each design's grid point nearest the matched rate set's centre,
tokens/s over 3 builds in separate processes (min / median / max; 2 at 64K), the batch and the link bytes per
token. That run holds the cache at 4x the budget at every context and ShadowKV and DualDecoder at 128K only;
everything else is simulated at the matched rates (`ddbench simulate`'s cost model, scene(..., gpu='h200'):
the cache over capacities at the memory model's largest batch, ShadowKV and DualDecoder at 32K / 64K / 128K)
and drawn and labelled as simulated. Each engine point is also replayed at its own grid rates (sim_tok_s, the
simulator's check). Memory-tight, the paper's Fig. 12 setting (Qwen2.5-32B on an 80 GB H100, simulated only:
rows `simulated-tight`, not drawn). Not a paper figure: no paper number.
"""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from ddbench.core import defaults as D
from ddbench.core.designs import DUALDECODER, DUALDECODER_CACHE, SHADOWKV
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.units import fmt_tokens
from ddbench.experiments import FigureResult, register
from ddbench.experiments import rate_grid as G
from ddbench.experiments.scene import scene
from ddbench.plotting import SYSTEM_COLORS, style_handle

MODEL, GPU = "llama-3-8b", "h200"
CACHE = DUALDECODER_CACHE
DESIGNS = (CACHE, SHADOWKV, DUALDECODER)
CONTEXTS = (32 * 1024, 64 * 1024, 128 * 1024)
SIM_CAPACITIES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)     # x the budget
STYLES = {32 * 1024: ":", 64 * 1024: "--", 128 * 1024: "-"}
TIGHT_MODEL, TIGHT_GPU = "qwen2.5-32b", "h100-80gb"     # Fig. 12's setting: where GPU memory binds
TIGHT_CONTEXTS = (64 * 1024, 128 * 1024, 256 * 1024)
CACHE_COLOR = SYSTEM_COLORS[CACHE]
MIB = 2 ** 20


def _engine_rows(run: str):
    from ddbench.core.traces import load_engine
    paths = [traces_dir("engine", run, "engine.csv")]
    if not paths or not all(p.exists() for p in paths):
        raise DDBenchError(f"{traces_dir('engine', run)}: no engine.csv (its README says how it was run)")
    return pd.concat([load_engine(str(p)) for p in paths], ignore_index=True)   # typed: one-line errors


def engine_largest(run: str) -> pd.DataFrame:
    """One row per (context, design label) of the engine run `run`: the largest batch's builds, min /
    median / max."""
    e = _engine_rows(run)
    e = e[e.paper_role.isin(["largest", "repeat"]) & e.status.isin(["ok", "ok-no-twin"])].copy()
    e["label"] = e.design_label.fillna(e.design)
    e["floor_link_ms"] = e.floor_link_ms.fillna(0.0)
    e["kv_bits"] = e.kv_bits.fillna(16).astype(int) if "kv_bits" in e else 16
    rows = []
    for (ctx, label), g in e.groupby(["context", "label"]):
        r0 = g.iloc[0]
        ct = int(r0.cache_tokens) if r0.design == CACHE else None
        rates = (float(g.churn_rate.astype(float).median()), float(g.miss_rate.astype(float).median())) if ct else ()
        rows.append(dict(
            source="engine", context=int(ctx), design=r0.design, label=label, cache_tokens=ct, kv_bits=int(r0.kv_bits),
            forced_prefetched=rates[0] if rates else None, forced_urgent=rates[1] if rates else None,
            forced_miss=_miss(g) if not ct else None,
            capacity=ct / D.BUDGET if ct else None, batch=int(r0.batch), builds=len(g),
            tok_s=g.tok_s.median(), tok_s_min=g.tok_s.min(), tok_s_max=g.tok_s.max(),
            link_mib_per_token=(g.link_mib / g.batch).median(), urgent_mib_per_token=(g.urgent_mib / g.batch).median(),
            link_util=g.link_util.median(), step_over_hbm_floor=(g.step_ms / g.floor_ms).median(),
            step_over_link_floor=(g.step_ms / g.floor_link_ms).median() if (g.floor_link_ms > 0).all() else None))
    if not rows:
        raise DDBenchError(f"traces/engine/{run}: no largest-batch rows")
    return pd.DataFrame(rows)


def _miss(g) -> float | None:
    """The engine rows' forced miss (median), None where they ran at the model's own prediction."""
    v = pd.to_numeric(g.miss_rate, errors="coerce").dropna()
    return float(v.median()) if len(v) else None


@lru_cache(maxsize=None)
def simulated(design: str, ctx: int, batch: int | None, cache_tokens: int | None, model: str = MODEL,
              gpu: str = GPU, kv_bits: int = 16, forced: tuple = (), miss: float | None = None) -> dict:
    """The user's simulator at one point (batch None: the memory model's largest); `forced`: a chunk cache's
    (prefetched, urgent) as an engine run forced them, `miss`: another design's forced miss, so that an engine
    point is replayed at its own rates (else: the matched rate set's)."""
    from ddbench.experiments.sim_figures import design_max_batch, step_plan, steady_step_time
    knobs = {"cache_tokens": cache_tokens} if cache_tokens else {}
    if miss is not None and not forced:
        knobs["hit_rate"] = round(1.0 - miss, 6)
    if kv_bits != 16:
        knobs["kv_bits"] = kv_bits
    if forced:
        knobs["forced_cache"] = tuple(forced)
    b = batch or design_max_batch(design, model, ctx, gpu=gpu, **knobs)
    note = scene(model, design, gpu=gpu, **knobs).hit_note
    if not b:
        return {"batch": 0, "tok_s": float("nan"), "link_mib_per_token": float("nan"), "note": note}
    step = steady_step_time(design, model, ctx, b, gpu=gpu, **knobs)
    plan = step_plan(design, model, ctx, b, gpu=gpu, **knobs)
    return {"batch": b, "tok_s": b / step, "link_mib_per_token": plan.h2d_bytes / b / MIB, "note": note}


def forced_miss(r) -> float | None:
    """An engine row's forced miss for a design without a chunk cache, else None."""
    v = getattr(r, "forced_miss", getattr(r, "miss_rate", None))
    return None if v is None or pd.isna(v) or getattr(r, "forced_urgent", None) is not None and \
        not pd.isna(r.forced_urgent) else float(v)


def forced_rates(r) -> tuple:
    """An engine row's forced (prefetched, urgent) for a chunk cache, else ()."""
    v = getattr(r, "forced_urgent", None)
    return () if v is None or pd.isna(v) else (float(r.forced_prefetched), float(v))


def _draw(res: FigureResult, fig) -> None:
    from matplotlib.lines import Line2D
    df = res.data
    fig.set_size_inches(9.6, 3.8)
    axes = fig.subplots(1, 3)
    cols = ("tok_s", "batch", "link_mib_per_token")
    for ctx in CONTEXTS:
        ls = STYLES[ctx]
        at = df[df.context == ctx]
        s = at[(at.source == "simulated") & (at.design == CACHE)].sort_values("capacity")
        m = at[(at.source == "engine") & (at.design == CACHE)].sort_values("capacity")
        for ax, col in zip(axes, cols):
            ax.plot(s.capacity, s[col], ls=ls, color=CACHE_COLOR, lw=1)
            ax.plot(m.capacity, m[col], ls=ls, marker="D", ms=4, color=CACHE_COLOR, lw=0.8)
        axes[0].errorbar(m.capacity, m.tok_s, yerr=[m.tok_s - m.tok_s_min, m.tok_s_max - m.tok_s], fmt="none",
                         ecolor="black", lw=0.7)
        for d in DESIGNS[1:]:
            sim = at[(at.source == "simulated") & (at.design == d)]
            eng = at[(at.source == "engine") & (at.design == d)]
            for ax, col in zip(axes, cols):
                if len(sim):
                    ax.axhline(float(sim[col].iloc[0]), color=SYSTEM_COLORS[d], ls=ls, lw=0.9)
                if len(eng):       # no cache: drawn at capacity 0
                    ax.plot([0] * len(eng), eng[col], ls=ls, marker="D", ms=4, color=SYSTEM_COLORS[d], lw=0.8)
            if len(eng):
                axes[0].errorbar([0] * len(eng), eng.tok_s, yerr=[eng.tok_s - eng.tok_s_min, eng.tok_s_max - eng.tok_s],
                                 fmt="none", ecolor="black", lw=0.7)
    titles = ("(a) tokens/s; engine: median, bars min-max of its builds", "(b) each at its largest batch",
              "(c) what crosses PCIe")
    ylabels = ("decode throughput (tokens/s)", "largest batch (requests)", "link bytes per token (MiB)")
    for ax, t, y in zip(axes, titles, ylabels):
        ax.set_xlabel("GPU cache per layer and KV head\n(ratio to the budget; 0: no cache)", fontsize=7)
        ax.set_ylabel(y)
        ax.set_title(t, fontsize=8)
        ax.set_ylim(bottom=0)
    handles = [style_handle("-", f"{CACHE}, simulated", CACHE_COLOR),
               Line2D([], [], ls="none", marker="D", ms=4, color=CACHE_COLOR, label=f"{CACHE}, engine"),
               style_handle("-", "ShadowKV, simulated", SYSTEM_COLORS[SHADOWKV]),
               Line2D([], [], ls="none", marker="D", ms=4, color=SYSTEM_COLORS[SHADOWKV], label="ShadowKV, engine"),
               style_handle("-", "DualDecoder, simulated", SYSTEM_COLORS[DUALDECODER]),
               Line2D([], [], ls="none", marker="D", ms=4, color=SYSTEM_COLORS[DUALDECODER],
                      label="DualDecoder, engine")]
    handles += [style_handle(STYLES[c], fmt_tokens(c), "gray") for c in CONTEXTS]
    fig.legend(handles, [h.get_label() for h in handles], fontsize=6, ncol=5, loc="outside lower center")
    fig.suptitle(f"{CACHE} against ShadowKV and DualDecoder, Llama-3-8B on one H200 (PCIe 5), each at its largest"
                 f" batch:\nengine run {G.RUN} (diamonds: its grid points just below and above the matched rates) and the"
                 " simulator at the matched rates (lines)",
                 fontsize=8)


def _engine_points() -> pd.DataFrame:
    """Each design's two engine points around the matched rates, from the one matched-rate run, with the
    simulator's replay of each at its own grid rates."""
    rows = []
    for ctx in CONTEXTS:
        for d in DESIGNS:
            for r in G.engine_at_matched(d, ctx):
                ct = r["cache_tokens"]
                r.update(label=f"{d}@{ct}" if ct else d, capacity=ct / D.BUDGET if ct else None, kv_bits=16,
                         forced_prefetched=r["forced_churn"], grid_point=G.point_note(r))
                r["sim_tok_s"] = simulated(d, ctx, r["batch"], ct, forced=(r["forced_churn"], r["forced_urgent"])
                                           if ct else (), miss=None if ct else r["forced_miss"])["tok_s"]
                rows.append(r)
    eng = pd.DataFrame(rows)
    eng["sim_over_engine"] = eng.sim_tok_s / eng.tok_s
    return eng


def _sim_row(source: str, d: str, ctx: int, ct: int | None, s: dict, **more) -> dict:
    return dict(source=source, context=ctx, design=d, label=f"{d}@{ct}" if ct else d, cache_tokens=ct,
                capacity=ct / D.BUDGET if ct else None, batch=s["batch"], tok_s=s["tok_s"],
                link_mib_per_token=s["link_mib_per_token"], **more)


@register("cache", "dualdecoder-cache: tokens/s against the GPU cache's capacity (H200, Llama-3-8B)", draw=_draw)
def compute() -> FigureResult:
    eng = _engine_points()
    sim_rows = []
    for ctx in CONTEXTS:       # at the matched rates: the cache over capacities, the others at their largest batch
        sim_rows += [_sim_row("simulated", CACHE, ctx, int(x * D.BUDGET), simulated(CACHE, ctx, None, int(x * D.BUDGET)))
                     for x in SIM_CAPACITIES]
        sim_rows += [_sim_row("simulated", d, ctx, None, simulated(d, ctx, None, None)) for d in DESIGNS[1:]]
    for ctx in TIGHT_CONTEXTS:           # memory-tight: the paper's Fig. 12 setting, simulated
        for d, ct in [(d, None) for d in DESIGNS[1:]] + [(CACHE, int(x * D.BUDGET)) for x in (2, 4, 8)]:
            s = simulated(d, ctx, None, ct, TIGHT_MODEL, TIGHT_GPU)
            sim_rows.append(_sim_row("simulated-tight", d, ctx, ct, s, model=TIGHT_MODEL, gpu=TIGHT_GPU))
    df = pd.concat([eng, pd.DataFrame(sim_rows)], ignore_index=True)
    df["model"] = df["model"].fillna(MODEL)
    df["gpu"] = df["gpu"].fillna(GPU)
    from ddbench.planner.ratelines import caption
    matched = caption([scene(MODEL, d, gpu=GPU, **({"cache_tokens": G.CAPACITY * D.BUDGET} if d == CACHE else {}))
                       for d in DESIGNS], tuple(CONTEXTS))
    points = "; ".join(f"{d} {fmt_tokens(int(c))}: {G.bracket_note(g.to_dict('records'))}"
                       for (c, d), g in eng.groupby(["context", "design"], sort=False))
    return FigureResult(df, f"{MODEL} on one H200 over PCIe 5, budget {D.BUDGET}, each design at its largest batch;"
                            f" {matched}; engine (diamonds): one run of the current engine, traces/engine/{G.RUN}"
                            f" ({G.run_date()}; builds in separate processes), each design at the two grid points around"
                            f" the matched rates ({points}); it holds ShadowKV and DualDecoder at 128K only and the"
                            f" cache at {G.CAPACITY}x only: every line (other capacities and contexts) is SIMULATED"
                            " at the matched rates, at the memory model's largest batch")
