"""Beyond the paper: dualdecoder-cache (a GPU chunk cache beside the speculative prefetch) against
ShadowKV and DualDecoder on the H200, Llama-3-8B at 32K / 64K / 128K, each at its largest batch.

Measured: the engine run traces/engine/h200-cache (its README), ShadowKV's rows from the in-place
ShadowKV of traces/engine/h200-shadowkv-fast (issue 31, faster than ShadowKV's own code on the same
H200; the same largest batches, 127 at 32K there 126): tokens/s over 3 independently built engines (min / median / max), the batch, the link bytes and urgent bytes per token, the link's
utilisation and the step over its floors. Simulated: the one cost model of `ddbench simulate`
(scene(..., gpu='h200')) at the engine's batch and the cache rates the engine forced (so that each point
is replayed as it ran), and over capacities the engine did not run at the memory model's largest batch
at the profile's rates for 128K; and, memory-tight, the paper's Fig. 12 setting
(Qwen2.5-32B on an 80 GB H100, simulated only: rows `simulated-tight`, not drawn). Not a paper figure:
no paper number.
"""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from ddbench.core import defaults as D
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.units import fmt_tokens
from ddbench.experiments import FigureResult, register
from ddbench.experiments.scene import scene
from ddbench.plotting import SYSTEM_COLORS, style_handle

RUN = "h200-cache"
MODEL, GPU = "llama-3-8b", "h200"
CACHE = "dualdecoder-cache"
DESIGNS = (CACHE, "shadowkv", "dualdecoder")
CONTEXTS = (32 * 1024, 64 * 1024, 128 * 1024)
SIM_CAPACITIES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)     # x the budget
STYLES = {32 * 1024: ":", 64 * 1024: "--", 128 * 1024: "-"}
TIGHT_MODEL, TIGHT_GPU = "qwen2.5-32b", "h100-80gb"     # Fig. 12's setting: where GPU memory binds
TIGHT_CONTEXTS = (64 * 1024, 128 * 1024, 256 * 1024)
CACHE_COLOR = "#9467bd"
MIB = 2 ** 20


SHADOWKV_RUN = "h200-shadowkv-fast"    # the in-place ShadowKV (issue 31): its 3 builds replace h200-cache's rows


def _engine_rows(run: str):
    from ddbench.core.traces import load_engine
    paths = [traces_dir("engine", run, "engine.csv")] if run != SHADOWKV_RUN else \
        sorted(traces_dir("engine", run, "builds").glob("b*/engine.csv"))
    if not paths or not all(p.exists() for p in paths):
        raise DDBenchError(f"{traces_dir('engine', run)}: no engine.csv (its README says how it was run)")
    return pd.concat([load_engine(str(p)) for p in paths], ignore_index=True)   # typed: one-line errors


def engine_largest(run: str = RUN, shadowkv_run: str | None = SHADOWKV_RUN) -> pd.DataFrame:
    """One row per (context, design label) of the engine run `run`: the largest batch's builds, min /
    median / max; ShadowKV's rows from `shadowkv_run` (the in-place ShadowKV, at the same largest
    batches) where given."""
    e = _engine_rows(run)
    if shadowkv_run:
        sk = _engine_rows(shadowkv_run)
        sk = sk[(sk.design == "shadowkv") & (sk.kv_bits.fillna(16).astype(int) == 16) & (sk.batch > 1)]
        e = pd.concat([e[e.design != "shadowkv"], sk], ignore_index=True)
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
        raise DDBenchError(f"{path}: no largest-batch rows")
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
    from ddbench.experiments.sim_figures import _maxb, _plan, _step_s
    knobs = {"cache_tokens": cache_tokens} if cache_tokens else {}
    if miss is not None and not forced:
        knobs["hit_rate"] = round(1.0 - miss, 6)
    if kv_bits != 16:
        knobs["kv_bits"] = kv_bits
    if forced:
        knobs["forced_cache"] = tuple(forced)
    b = batch or _maxb(design, model, ctx, gpu=gpu, **knobs)
    note = scene(model, design, gpu=gpu, **knobs).hit_note
    if not b:
        return {"batch": 0, "tok_s": float("nan"), "link_mib_per_token": float("nan"), "note": note}
    step = _step_s(design, model, ctx, b, gpu=gpu, **knobs)
    plan = _plan(design, model, ctx, b, gpu=gpu, **knobs)
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


def best(df: pd.DataFrame, ctx: int) -> pd.Series:
    """The measured capacity with the most tokens/s at a context."""
    c = df[(df.source == "engine") & (df.design == CACHE) & (df.context == ctx)]
    return c.loc[c.tok_s.idxmax()]


def _draw(res: FigureResult, fig) -> None:
    from matplotlib.lines import Line2D
    df = res.data
    fig.set_size_inches(9.6, 3.8)
    axes = fig.subplots(1, 3)
    for ctx in CONTEXTS:
        ls = STYLES[ctx]
        s = df[(df.source == "simulated") & (df.context == ctx)]
        m = df[(df.source == "engine") & (df.context == ctx) & (df.design == CACHE)].sort_values("capacity")
        for ax, col in zip(axes, ("tok_s", "batch", "link_mib_per_token")):
            ax.plot(s.capacity, s[col], ls=ls, color=CACHE_COLOR, lw=1)
            ax.plot(m.capacity, m[col], ls="none", marker="D", ms=4, color=CACHE_COLOR)
        axes[0].errorbar(m.capacity, m.tok_s, yerr=[m.tok_s - m.tok_s_min, m.tok_s_max - m.tok_s], fmt="none",
                         ecolor="black", lw=0.7)
        for d in ("shadowkv", "dualdecoder"):
            r = df[(df.source == "engine") & (df.context == ctx) & (df.design == d)]
            if len(r):
                for ax, col in zip(axes, ("tok_s", "batch", "link_mib_per_token")):
                    ax.axhline(float(r[col].iloc[0]), color=SYSTEM_COLORS[d], ls=ls, lw=0.9)
    titles = ("(a) engine: median, bars min-max of 3 builds", "(b) each at its largest batch",
              "(c) what crosses PCIe")
    ylabels = ("decode throughput (tokens/s)", "largest batch (requests)", "link bytes per token (MiB)")
    for ax, t, y in zip(axes, titles, ylabels):
        ax.set_xlabel("GPU cache per layer and KV head (ratio to the budget)")
        ax.set_ylabel(y)
        ax.set_title(t, fontsize=8)
        ax.set_ylim(bottom=0)
    handles = [style_handle("-", "dualdecoder-cache, simulated", CACHE_COLOR),
               Line2D([], [], ls="none", marker="D", ms=4, color=CACHE_COLOR, label="dualdecoder-cache, engine"),
               style_handle("-", "ShadowKV, engine", SYSTEM_COLORS["shadowkv"]),
               style_handle("-", "DualDecoder, engine", SYSTEM_COLORS["dualdecoder"])]
    handles += [style_handle(STYLES[c], fmt_tokens(c), "gray") for c in CONTEXTS]
    fig.legend(handles, [h.get_label() for h in handles], fontsize=6, ncol=4, loc="outside lower center")
    fig.suptitle("dualdecoder-cache against ShadowKV and DualDecoder: Llama-3-8B on one H200 (PCIe 5), each at its"
                 " largest batch", fontsize=9)


@register("cache", "dualdecoder-cache: tokens/s against the GPU cache's capacity (H200, Llama-3-8B)", draw=_draw)
def compute() -> FigureResult:
    eng = engine_largest()
    eng["sim_tok_s"] = [simulated(r.design, int(r.context), int(r.batch),
                                  None if pd.isna(r.cache_tokens) else int(r.cache_tokens), forced=forced_rates(r),
                                  miss=forced_miss(r))["tok_s"]
                        for r in eng.itertuples()]
    eng["sim_over_engine"] = eng.sim_tok_s / eng.tok_s
    sim_rows = []
    for ctx in CONTEXTS:
        for x in SIM_CAPACITIES:
            ct = int(x * D.BUDGET)
            s = simulated(CACHE, ctx, None, ct)
            sim_rows.append(dict(source="simulated", context=ctx, design=CACHE, label=f"{CACHE}@{ct}", cache_tokens=ct,
                                 capacity=x, batch=s["batch"], tok_s=s["tok_s"],
                                 link_mib_per_token=s["link_mib_per_token"]))
    for ctx in TIGHT_CONTEXTS:           # memory-tight: the paper's Fig. 12 setting, simulated
        for d, ct in [(d, None) for d in DESIGNS[1:]] + [(CACHE, int(x * D.BUDGET)) for x in (2, 4, 8)]:
            s = simulated(d, ctx, None, ct, TIGHT_MODEL, TIGHT_GPU)
            sim_rows.append(dict(source="simulated-tight", model=TIGHT_MODEL, gpu=TIGHT_GPU, context=ctx, design=d,
                                 label=f"{d}@{ct}" if ct else d, cache_tokens=ct, capacity=ct / D.BUDGET if ct else None,
                                 batch=s["batch"], tok_s=s["tok_s"], link_mib_per_token=s["link_mib_per_token"]))
    df = pd.concat([eng, pd.DataFrame(sim_rows)], ignore_index=True)
    df["model"] = df["model"].fillna(MODEL)
    df["gpu"] = df["gpu"].fillna(GPU)
    from ddbench.planner.ratelines import caption
    matched = caption([scene(MODEL, d, gpu=GPU) for d in DESIGNS], tuple(CONTEXTS))
    return FigureResult(df, f"{MODEL} on one H200 over PCIe 5, budget {D.BUDGET}, each design at its largest batch;"
                            f" engine {traces_dir('engine', RUN).name} (2026-12-01, the fill as the torch twin; 3 builds in"
                            f" one process), ShadowKV from {SHADOWKV_RUN} (2026-12-02, in place): NOT one engine"
                            " version: the earlier ShadowKV ran 2.4-3.2x slower; at the rates it forced (the caches at"
                            f" their profile's, ShadowKV and DualDecoder at a forced miss, NOT one matched set);"
                            f" simulated at the engine's batches and over capacities: {matched}")
